"""BrokerContext: what the broker's request processors may use, and nothing else.

The controller builds one context after it has built its services and hands it to each
processor (:mod:`pymq.broker.processors`); no processor holds the controller.  A processor is a
function of this context and a decoded request: ``(channel, request) -> response``, ``None``
(inline handlers: "serve me in a task instead") or ``ANSWER_LATER``.  Tests build a context over a
real store and fresh managers and call the processors without a socket
(``tests/unit/test_processors.py``).

What needs the controller's own behaviour reaches it through a narrow object: ``admin`` (the
:class:`~pymq.broker.admin_service.AdminService` the websocket channel also uses) for runtime
info, config updates and the admin operations.  The register-on-change notifier is not here: the
topic config manager calls it itself (``TopicConfigManager.on_change``) when a processor creates
or changes a topic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from pymq.broker.client_manager import QueuePullers

if TYPE_CHECKING:
    from pymq.broker.acl import AclManager
    from pymq.broker.admin_service import AdminService
    from pymq.broker.client_manager import ConsumerManager, ProducerManager, RebalanceLockManager
    from pymq.broker.config import BrokerConfig
    from pymq.broker.consumer_filter_manager import ConsumerFilterManager
    from pymq.broker.consumer_offset_manager import ConsumerOffsetManager
    from pymq.broker.fast_failure import ConsumerFallBehind
    from pymq.broker.long_polling import PullRequestHoldService
    from pymq.broker.schedule import ScheduleMessageService
    from pymq.broker.stats import BrokerStats
    from pymq.broker.subscription_group_manager import SubscriptionGroupManager
    from pymq.broker.topic_config_manager import TopicConfigManager
    from pymq.store.message_store import DefaultMessageStore


@attrs.define(slots=True, eq=False)
class BrokerContext:
    broker_config: BrokerConfig
    store: DefaultMessageStore
    topic_config_manager: TopicConfigManager
    subscription_group_manager: SubscriptionGroupManager
    consumer_offset_manager: ConsumerOffsetManager
    # The groups' compiled SQL92 filters (registered by heartbeats, used by pulls).
    consumer_filter_manager: ConsumerFilterManager
    consumer_manager: ConsumerManager
    producer_manager: ProducerManager
    rebalance_lock_manager: RebalanceLockManager
    # Held pulls wait on its events; the store's arrival listener sets them.
    pull_hold: PullRequestHoldService
    stats: BrokerStats
    # protectBroker's record of the bytes each group's last pull left behind.
    fall_behind: ConsumerFallBehind
    # GET_ALL_DELAY_OFFSET reads the delay levels' offsets.
    schedule: ScheduleMessageService
    # Admin operations that need the controller (runtime info, configs, name-server reach).
    admin: AdminService
    # The address stored in each message: brokerIP1 and the listen port, which is known once
    # the server has bound (the controller sets it then; brokerIP1 needs a restart to change).
    store_host: tuple[str, int] = ("0.0.0.0", 0)
    # aclEnable: the ACL, for the permissions a processor learns only by reading (a heartbeat's
    # groups and topics, the stored message a send-back or view names); None: no ACL.
    acl: AclManager | None = None
    # The queues each group's 4.x clients pull (its POP consumers leave them to them).
    queue_pullers: QueuePullers = attrs.Factory(QueuePullers)
