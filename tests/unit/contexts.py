"""One BrokerContext for processor tests that run without a socket or a controller."""

from __future__ import annotations

from pymq.broker.client_manager import ConsumerManager, ProducerManager, RebalanceLockManager
from pymq.broker.config import BrokerConfig
from pymq.broker.consumer_filter_manager import ConsumerFilterManager
from pymq.broker.consumer_offset_manager import ConsumerOffsetManager
from pymq.broker.context import BrokerContext
from pymq.broker.fast_failure import ConsumerFallBehind
from pymq.broker.long_polling import PullRequestHoldService
from pymq.broker.schedule import ScheduleMessageService
from pymq.broker.stats import BrokerStats
from pymq.broker.subscription_group_manager import SubscriptionGroupManager
from pymq.broker.topic_config_manager import TopicConfigManager
from pymq.store import DefaultMessageStore


def make_broker_context(store: DefaultMessageStore, broker_config: BrokerConfig) -> BrokerContext:
    """Every manager fresh under the store's config dir; long polling hears the store."""
    config_dir = store.config.config_dir
    pull_hold = PullRequestHoldService()
    store.set_arrival_listener(pull_hold.notify_message_arriving)
    return BrokerContext(
        broker_config=broker_config,
        store=store,
        topic_config_manager=TopicConfigManager(config_dir, broker_config),
        subscription_group_manager=SubscriptionGroupManager(config_dir),
        consumer_offset_manager=ConsumerOffsetManager(config_dir),
        consumer_filter_manager=ConsumerFilterManager(config_dir),
        consumer_manager=ConsumerManager(),
        producer_manager=ProducerManager(),
        rebalance_lock_manager=RebalanceLockManager(),
        pull_hold=pull_hold,
        stats=BrokerStats(),
        fall_behind=ConsumerFallBehind(),
        schedule=ScheduleMessageService(config_dir, store),
        admin=None,  # type: ignore[arg-type]  # processor tests send no admin request
        store_host=store.store_host,
    )
