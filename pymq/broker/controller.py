"""BrokerController: wires the broker's services into one nursery (docs/design.md, section 3).

::

    BrokerController.run()
    └─ nursery
       ├─ store.run()              (recovered before anything listens; its own nursery:
       │                            allocator, reput, flush, clean, trim_resident)
       ├─ remoting servers         listenPort and the fast port listenPort - 2
       ├─ gRPC server              grpcServerPort: RocketMQ 5's messaging service (pymq.proxy)
       ├─ HA                       master: accept + per-slave read/write | slave: HA client
       ├─ register_timer           at start, on topic changes, then every 30 s
       ├─ persist_consumer_offsets every flushConsumerOffsetInterval (5 s)
       ├─ client_housekeeping      every 10 s (120 s channel expiry)
       ├─ schedule persist         every 10 s
       ├─ stats sampler            every 1 s
       ├─ ACL files watch          aclEnable: every 500 ms (reloaded on change)
       ├─ protect_broker           every 3 min (disableConsumeIfConsumerReadSlowly)
       ├─ print_water_mark         every 1 s after 10 s
       ├─ role services            one task, switched with the role (DLedger mode: at each
       │  │                         role change; _switch_role_services)
       │  ├─ schedule delivery     masters: one task per delay level
       │  ├─ transaction check     masters: every transactionCheckInterval (60 s)
       │  └─ timer service         masters: enqueue, deliver, flush | slaves: enqueue and
       │                            flush, following the master's delivery point (every 1 s)
       ├─ slave_sync               slaves: every 10 s
       ├─ metrics                  Prometheus /metrics when metricsExporterType=PROM
       └─ front-ends               handed in by the caller: the admin channel (websocket +
                                   console) when adminListenPort is set

Start order: configs -> managers loaded -> store recovered -> servers listening -> registered
with every name server -> front-ends listening -> ``task_status.started(port)``.

Front-ends are servers that build on the broker without being part of it: the caller
(``python -m pymq.broker``, :mod:`pymq.embedded`) creates them over the controller and appends
them to :attr:`BrokerController.front_ends` before :meth:`~BrokerController.run`, so that the
broker package imports nothing of :mod:`pymq.admin`.  On cancellation the shutdown work
(unregister, persist the managers) runs shielded with a deadline; the store does its own final
flush, checkpoint and abort-file removal.  The logic lives in the services; this module wires.
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import trio

from pymq.acl.plain import AclConfigError
from pymq.acl.rpc_hook import AclSigner
from pymq.broker.acl import WATCH_PERIOD, AclManager
from pymq.broker.admin_service import AdminService
from pymq.broker.client_manager import (
    ConsumerManager,
    ProducerManager,
    RebalanceLockManager,
)
from pymq.broker.config import OWN_CONFIG_FILE, UNSUPPORTED_KEYS, BrokerConfig
from pymq.broker.consumer_filter_manager import ConsumerFilterManager
from pymq.broker.consumer_offset_manager import ConsumerOffsetManager
from pymq.broker.context import BrokerContext
from pymq.broker.fast_failure import (
    PROTECT_BROKER_PERIOD,
    WATER_MARK_INITIAL_DELAY,
    WATER_MARK_PERIOD,
    BrokerFastFailure,
    ConsumerFallBehind,
    protect_broker,
    water_mark_log,
)
from pymq.broker.long_polling import PullRequestHoldService
from pymq.broker.metrics import EXPORTER_PROM, MetricsServer, exporter_type
from pymq.broker.outer_api import BrokerIdentity, BrokerOuterAPI
from pymq.broker.processors.acl import AclProcessor
from pymq.broker.processors.admin import AdminProcessor
from pymq.broker.processors.consumer import ConsumerProcessor
from pymq.broker.processors.pull import PullProcessor
from pymq.broker.processors.recall import RecallProcessor
from pymq.broker.processors.reply import ReplyProcessor
from pymq.broker.processors.send import SendProcessor
from pymq.broker.runtime_info import runtime_info
from pymq.broker.schedule import ScheduleMessageService
from pymq.broker.slave_sync import (
    SLAVE_SYNC_INITIAL_DELAY,
    SLAVE_SYNC_PERIOD,
    TIMER_CHECKPOINT_SYNC_PERIOD,
    SlaveSynchronize,
)
from pymq.broker.stats import BrokerStats
from pymq.broker.subscription_group_manager import SubscriptionGroupManager
from pymq.broker.timer import TimerMessageService
from pymq.broker.topic_config_manager import TopicConfigManager
from pymq.broker.transaction import TransactionService
from pymq.common.config import ConfigError, refuse_unsupported
from pymq.common.files import PropertiesFile
from pymq.common.periodic import every
from pymq.common.topic import (
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
    DataVersion,
    TopicConfigSerializeWrapper,
    is_readable,
    is_writeable,
)
from pymq.dledger.config import rocketmq_broker_id
from pymq.dledger.raft import Role, RoleChange
from pymq.remoting import headers as H
from pymq.remoting.channel import Channel
from pymq.remoting.client import RemotingClient
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode
from pymq.remoting.config import NettyClientConfig, NettyServerConfig
from pymq.remoting.errors import RemotingError
from pymq.remoting.server import RemotingServer, Route
from pymq.store.config import BrokerRole, MessageStoreConfig
from pymq.store.ha.auth import HAGuard, parse_allow_list
from pymq.store.ha.master import HAService
from pymq.store.ha.slave import HAClient
from pymq.store.message_store import DefaultMessageStore

if TYPE_CHECKING:
    from pymq.proxy.http2 import GrpcServer
    from pymq.proxy.service import MessagingService

log = logging.getLogger(__name__)

DLEDGER_ROLE_POLL = 0.1
"""Seconds between a new DLedger leader's checks that its log is committed and dispatched
(DLedgerRoleChangeHandler sleeps 100 ms)."""
# BrokerController.start(): the register timer's first run and the bounds of its period.
REGISTER_INITIAL_DELAY = 10.0
REGISTER_PERIOD_MIN, REGISTER_PERIOD_MAX = 10.0, 60.0
PERSIST_OFFSETS_INITIAL_DELAY = 10.0
CLIENT_HOUSEKEEPING_PERIOD = 10.0
# Allocations between young-generation collections once the broker runs (CPython: 700).
GC_THRESHOLD = 10_000
SCHEDULE_PERSIST_PERIOD = 10.0
# ConsumerFilterManager.persist: every 10 s, after 10 s (as Java).
FILTER_PERSIST_PERIOD = 10.0
# StoreStatsService: the put-latency percentiles cover the previous minute.
PUT_STATS_ROLL_PERIOD = 60.0
# Shutdown work gets this long even when the broker is being torn down.
SHUTDOWN_DEADLINE = 10.0


@attrs.frozen
class RoleServices:
    """The running services of a role (:meth:`BrokerController._switch_role_services`): its
    cancel scope, and the event set once every one of them has stopped."""

    master: bool
    scope: trio.CancelScope
    done: trio.Event


class FrontEnd(Protocol):
    """A server added by the broker's caller (the admin channel), run in the broker's nursery.

    Started once the broker's own servers listen and it has registered, before the broker
    reports started; a failure to start fails the broker's start.  Cancelled with the broker.
    """

    async def run(
        self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED
    ) -> None: ...


def metrics_server(broker: BrokerController) -> MetricsServer | None:
    """The Prometheus endpoint metricsExporterType asks for (None when DISABLE)."""
    bc = broker.broker_config
    try:
        wanted = exporter_type(bc.metrics_exporter_type)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if wanted != EXPORTER_PROM:
        return None
    host = bc.metrics_prom_exporter_host.strip() or bc.broker_ip1
    return MetricsServer(broker, host, bc.metrics_prom_exporter_port)


class BrokerController:
    def __init__(
        self,
        broker_config: BrokerConfig,
        server_config: NettyServerConfig,
        client_config: NettyClientConfig,
        store_config: MessageStoreConfig,
        *,
        store: DefaultMessageStore | None = None,
        config_path: str | None = None,
    ) -> None:
        """``config_path``: the file runtime config changes are saved to (the ``-c`` file the
        broker was started with; by default ``broker.properties`` in the store's config
        directory)."""
        refuse_unsupported((broker_config, store_config), UNSUPPORTED_KEYS)
        self.broker_config = broker_config
        self.server_config = server_config
        self.client_config = client_config
        self.store_config = store_config
        self.config_version = DataVersion()
        self.config_file = PropertiesFile(
            config_path or os.path.join(store_config.config_dir, OWN_CONFIG_FILE)
        )
        self.store = store or DefaultMessageStore(store_config)
        # DLedger mode: a member starts as a slave with RocketMQ's follower id (selfId's number
        # + 1), and the role changes of its DLedger member make it master or slave again.
        self._dledger_role: RoleChange | None = None
        self._dledger_role_wanted = trio.Event()
        if self.store.dledger is not None:
            assert store_config.d_leger_self_id is not None  # checked by from_store_config
            broker_config.broker_id = rocketmq_broker_id(store_config.d_leger_self_id)
            self.store.dledger.server.on_role_change = self._on_dledger_role
            # its peers' port listens where the broker's ports do (bindAddress)
            self.store.dledger.server.host = server_config.bind_address
        config_dir = store_config.config_dir
        self.topic_config_manager = TopicConfigManager(config_dir, broker_config)
        self.consumer_offset_manager = ConsumerOffsetManager(config_dir)
        self.subscription_group_manager = SubscriptionGroupManager(
            config_dir, broker_config.auto_create_subscription_group
        )
        self.consumer_filter_manager = ConsumerFilterManager(
            config_dir,
            broker_config.filter_data_clean_time_span,
            enabled=lambda: broker_config.enable_property_filter,
        )
        self.schedule = ScheduleMessageService(config_dir, self.store)
        self.timer = TimerMessageService(
            self.store,
            lambda topic: self.topic_config_manager.select(topic) is not None,
            replica=store_config.broker_role is BrokerRole.SLAVE,
        )
        self.producer_manager = ProducerManager()
        self.consumer_manager = ConsumerManager(
            self._notify_consumer_ids_changed,
            on_group_removed=self.consumer_filter_manager.unregister_group,
        )
        self.rebalance_lock_manager = RebalanceLockManager()
        # The schedule service waits on its own topic's arrivals: always reported.
        self.pull_hold = PullRequestHoldService(pinned=(SCHEDULE_TOPIC, TIMER_TOPIC))
        self.stats = BrokerStats(broker_config.broker_cluster_name)
        # The main and fast ports share one budget of buffered output and partial frames.
        budget = server_config.shared_budget()
        self.server = RemotingServer(
            host=server_config.bind_address,
            port=server_config.listen_port,
            name="broker",
            on_channel_closed=self._on_channel_closed,
            budget=budget,
            **server_config.server_limits(),
        )
        self.fast_server = RemotingServer(
            host=server_config.bind_address,
            port=server_config.listen_port - 2 if server_config.listen_port > 2 else 0,
            name="broker-fast",
            on_channel_closed=self._on_channel_closed,
            budget=budget,
            **server_config.server_limits(),
        )
        # BrokerFastFailure: requests that waited too long are answered SYSTEM_BUSY.
        self.fast_failure = BrokerFastFailure(broker_config, self.store)
        self.server.admission = self.fast_failure
        self.fast_server.admission = self.fast_failure
        # Dispatch of what a run of sends appended happens at the run's end, in the reader,
        # instead of a reput task switch per run (a sync sender's run is one message).
        self.server.run_hooks = self.fast_server.run_hooks = (
            self.store.begin_run,
            self.store.end_run,
        )
        self.fall_behind = ConsumerFallBehind()
        # aclEnable: every request checked before its processor (pymq/broker/acl.py); a broken
        # ACL file stops the start, as RocketMQ's does.  Off: nothing on the request path.
        self.acl: AclManager | None = None
        # tls.enable: the broker's own connections (name servers, a slave's master) use TLS.
        self.client_ssl = client_config.ssl_context()
        if bool(broker_config.access_key) != bool(broker_config.secret_key):
            raise ConfigError("accessKey and secretKey go together: set both, or neither")
        if broker_config.acl_enable:
            try:
                self.acl = AclManager(broker_config.rocketmq_home)
            except AclConfigError as exc:
                raise ConfigError(
                    f"aclEnable=true but the ACL configuration is not usable: {exc}"
                ) from None
            self.server.access_check = self.acl.check
            self.fast_server.access_check = self.acl.check
        # A master's HA port: who may replicate (a bad haSlaveAllowList stops the start).
        self.ha_guard = None if self.is_slave else self._ha_guard()
        # What the processors may use; they never see the controller.
        self.context = BrokerContext(
            broker_config=broker_config,
            store=self.store,
            topic_config_manager=self.topic_config_manager,
            subscription_group_manager=self.subscription_group_manager,
            consumer_offset_manager=self.consumer_offset_manager,
            consumer_filter_manager=self.consumer_filter_manager,
            consumer_manager=self.consumer_manager,
            producer_manager=self.producer_manager,
            rebalance_lock_manager=self.rebalance_lock_manager,
            pull_hold=self.pull_hold,
            stats=self.stats,
            fall_behind=self.fall_behind,
            schedule=self.schedule,
            admin=AdminService(self),
            store_host=self.store_host,
            acl=self.acl,
        )
        self.send_processor = SendProcessor(self.context)
        self.reply_processor = ReplyProcessor(self.context, self.send_processor)
        self.pull_processor = PullProcessor(self.context)
        self.recall_processor = RecallProcessor(self.context)
        self.consumer_processor = ConsumerProcessor(self.context)
        self.admin_processor = AdminProcessor(self.context)
        # END_TRANSACTION and the transaction check-back service (masters).
        self.transactions = TransactionService(self.context)
        self.acl_processor = AclProcessor(self.acl, self._acl_identity)
        self._register_processors()
        self.outer_api: BrokerOuterAPI | None = None
        self.client: RemotingClient | None = None
        self.master_addr: str | None = None
        self.master_ha_addr: str | None = None
        self.ha_service: HAService | None = None
        self.ha_client: HAClient | None = None
        self.slave_sync = SlaveSynchronize(self)
        self._nursery: trio.Nursery | None = None
        # the services of the broker's role (see _switch_role_services)
        self._services: RoleServices | None = None
        self._services_lock = trio.Lock()
        self._register_wanted = trio.Event()
        self._register_lock = trio.Lock()
        self.topic_config_manager.on_change = self._register_wanted.set
        self.registered = trio.Event()
        # Servers the caller adds before run(); see FrontEnd.
        self.front_ends: list[FrontEnd] = []
        # Prometheus /metrics (metricsExporterType=PROM), started with the other servers.
        self.metrics: MetricsServer | None = metrics_server(self)
        # RocketMQ 5's gRPC messaging service (grpcServerPort; pymq.proxy, imported only then),
        # within the remoting ports' shared budget of buffered bytes.
        self.grpc_server: GrpcServer | None = None
        self.grpc_service: MessagingService | None = None  # set with grpc_server
        if broker_config.grpc_server_port:
            from pymq.proxy import grpc_server

            self.grpc_server = grpc_server(self, budget)

    # -- wiring -------------------------------------------------------------------------------

    def _register_processors(self) -> None:
        send, pull = self.send_processor, self.pull_processor
        consumer, admin, acl = self.consumer_processor, self.admin_processor, self.acl_processor
        table: dict[int, Route] = {
            # Sends are served in the reader from their bytes, a run at a time; a task only
            # for what must wait (auto-create, retry topics, SYNC_MASTER).
            RequestCode.SEND_MESSAGE: Route(
                send.send_message, run=send.send_run, inline=send._serve_decoded
            ),
            RequestCode.SEND_MESSAGE_V2: Route(
                send.send_message, run=send.send_run, inline=send._serve_decoded
            ),
            RequestCode.SEND_BATCH_MESSAGE: Route(
                send.send_message, run=send.send_run, inline=send._serve_decoded
            ),
            RequestCode.SEND_REPLY_MESSAGE: Route(self.reply_processor.send_reply_message),
            RequestCode.SEND_REPLY_MESSAGE_V2: Route(self.reply_processor.send_reply_message),
            RequestCode.CONSUMER_SEND_MSG_BACK: Route(send.consumer_send_msg_back),
            RequestCode.RECALL_MESSAGE: Route(self.recall_processor.recall_message),
            RequestCode.END_TRANSACTION: Route(
                self.transactions.end_transaction,
                inline=self.transactions.end_transaction_inline,
            ),
            RequestCode.RESUME_CHECK_HALF_MESSAGE: Route(
                self.transactions.resume_check_half_message
            ),
            RequestCode.PULL_MESSAGE: Route(pull.pull_message),
            RequestCode.HEART_BEAT: Route(consumer.heart_beat),
            RequestCode.UNREGISTER_CLIENT: Route(consumer.unregister_client),
            RequestCode.CHECK_CLIENT_CONFIG: Route(consumer.check_client_config),
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: Route(consumer.get_consumer_list_by_group),
            RequestCode.QUERY_CONSUMER_OFFSET: Route(consumer.query_consumer_offset),
            RequestCode.UPDATE_CONSUMER_OFFSET: Route(consumer.update_consumer_offset),
            RequestCode.LOCK_BATCH_MQ: Route(consumer.lock_batch_mq),
            RequestCode.UNLOCK_BATCH_MQ: Route(consumer.unlock_batch_mq),
            RequestCode.UPDATE_AND_CREATE_TOPIC: Route(admin.update_and_create_topic),
            RequestCode.DELETE_TOPIC_IN_BROKER: Route(admin.delete_topic_in_broker),
            RequestCode.GET_ALL_TOPIC_CONFIG: Route(admin.get_all_topic_config),
            RequestCode.UPDATE_BROKER_CONFIG: Route(admin.update_broker_config),
            RequestCode.GET_BROKER_CONFIG: Route(admin.get_broker_config),
            RequestCode.GET_BROKER_RUNTIME_INFO: Route(admin.get_broker_runtime_info),
            RequestCode.GET_TIMER_METRICS: Route(admin.get_timer_metrics),
            RequestCode.GET_TIMER_CHECK_POINT: Route(admin.get_timer_check_point),
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: Route(admin.search_offset_by_timestamp),
            RequestCode.GET_MAX_OFFSET: Route(admin.get_max_offset),
            RequestCode.GET_MIN_OFFSET: Route(admin.get_min_offset),
            RequestCode.GET_EARLIEST_MSG_STORETIME: Route(admin.get_earliest_msg_storetime),
            RequestCode.VIEW_MESSAGE_BY_ID: Route(admin.view_message_by_id),
            RequestCode.QUERY_MESSAGE: Route(admin.query_message),
            RequestCode.GET_ALL_CONSUMER_OFFSET: Route(admin.get_all_consumer_offset),
            RequestCode.GET_ALL_DELAY_OFFSET: Route(admin.get_all_delay_offset),
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: Route(
                admin.update_and_create_subscription_group
            ),
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: Route(
                admin.get_all_subscription_group_config
            ),
            RequestCode.DELETE_SUBSCRIPTIONGROUP: Route(admin.delete_subscription_group),
            RequestCode.GET_CONSUMER_CONNECTION_LIST: Route(admin.get_consumer_connection_list),
            RequestCode.GET_GRPC_STATUS: Route(admin.get_grpc_status),
            RequestCode.GET_TOPIC_STATS_INFO: Route(admin.get_topic_stats_info),
            RequestCode.GET_CONSUME_STATS: Route(admin.get_consume_stats),
            RequestCode.INVOKE_BROKER_TO_RESET_OFFSET: Route(admin.invoke_broker_to_reset_offset),
            RequestCode.UPDATE_AND_CREATE_ACL_CONFIG: Route(acl.update_and_create_acl_config),
            RequestCode.DELETE_ACL_CONFIG: Route(acl.delete_acl_config),
            RequestCode.GET_BROKER_CLUSTER_ACL_INFO: Route(acl.get_broker_cluster_acl_info),
            RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG: Route(
                acl.update_global_white_addrs_config
            ),
            RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG: Route(acl.get_broker_cluster_acl_config),
            RequestCode.GET_PRODUCER_CONNECTION_LIST: Route(admin.get_producer_connection_list),
            RequestCode.QUERY_TOPIC_CONSUME_BY_WHO: Route(admin.query_topic_consume_by_who),
            RequestCode.QUERY_CONSUME_TIME_SPAN: Route(admin.query_consume_time_span),
            RequestCode.VIEW_BROKER_STATS_DATA: Route(admin.view_broker_stats_data),
            RequestCode.GET_BROKER_CONSUME_STATS: Route(admin.get_broker_consume_stats),
            RequestCode.GET_CONSUMER_RUNNING_INFO: Route(admin.get_consumer_running_info),
            RequestCode.CONSUME_MESSAGE_DIRECTLY: Route(admin.consume_message_directly),
            RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS: Route(
                admin.invoke_broker_to_get_consumer_status
            ),
            RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_BROKER: Route(
                admin.get_system_topic_list_from_broker
            ),
            RequestCode.CLONE_GROUP_OFFSET: Route(admin.clone_group_offset),
            RequestCode.QUERY_CONSUME_QUEUE: Route(admin.query_consume_queue),
            RequestCode.QUERY_CORRECTION_OFFSET: Route(admin.query_correction_offset),
            RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE: Route(admin.clean_expired_consume_queue),
            RequestCode.CLEAN_UNUSED_TOPIC: Route(admin.clean_unused_topic),
            RequestCode.GET_ALL_PRODUCER_INFO: Route(admin.get_all_producer_info),
            RequestCode.DELETE_EXPIRED_COMMITLOG: Route(admin.delete_expired_commit_log),
        }
        for server in (self.server, self.fast_server):
            server.add_routes(table)

    def _signer(self) -> AclSigner | None:
        """The broker's own requests are signed when it has an account (accessKey/secretKey)."""
        bc = self.broker_config
        if bc.access_key and bc.secret_key:
            return AclSigner(bc.access_key, bc.secret_key)
        return None

    def _acl_identity(self) -> tuple[str, str, str]:
        bc = self.broker_config
        return bc.broker_name, self.broker_addr, bc.broker_cluster_name

    async def _watch_acl(self) -> None:
        assert self.acl is not None
        await trio.to_thread.run_sync(self.acl.reload_if_changed)

    def configs(self) -> list[object]:
        return [self.broker_config, self.server_config, self.client_config, self.store_config]

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def broker_addr(self) -> str:
        return f"{self.broker_config.broker_ip1}:{self.server.port}"

    @property
    def store_host(self) -> tuple[str, int]:
        return (self.broker_config.broker_ip1, self.server.port)

    def identity(self) -> BrokerIdentity:
        bc = self.broker_config
        return BrokerIdentity(
            cluster_name=bc.broker_cluster_name,
            broker_addr=self.broker_addr,
            broker_name=bc.broker_name,
            broker_id=bc.broker_id,
            ha_server_addr=f"{bc.broker_ip2}:{self.ha_port}",
        )

    def _load_managers(self) -> None:
        for manager in (
            self.topic_config_manager,
            self.consumer_offset_manager,
            self.subscription_group_manager,
            self.consumer_filter_manager,
            self.schedule,
        ):
            manager.load()

    def _persist_managers_blocking(self) -> None:
        for manager in (
            self.consumer_offset_manager,
            self.schedule,
            self.topic_config_manager,
            self.subscription_group_manager,
            self.consumer_filter_manager,
        ):
            try:
                manager.persist_blocking()
            except OSError as exc:
                log.error("persisting %s failed: %s", manager.path, exc)

    def _on_arrival(
        self, topic: str, queue_id: int, logic_offset: int, tags_code: int, store_ts: int
    ) -> None:
        # Called for the dispatched records of the topics _arrival_topics names (every record
        # while a slave is connected): the calls that would return at once are skipped.
        self.pull_hold.notify_message_arriving(topic, queue_id, logic_offset, tags_code, store_ts)
        if topic == SCHEDULE_TOPIC:  # the schedule service waits on its own topic only
            self.schedule.notify_arrival(topic, queue_id)
        elif topic == TIMER_TOPIC:
            self.timer.notify_arrival(topic, queue_id)
        ha = self.ha_service
        if ha is not None and ha.connections:  # without a slave nobody waits for new data
            ha.notify_new_data()

    def _arrival_topics(self) -> dict[str, int] | None:
        """The topics whose arrivals :meth:`_on_arrival` acts on (held pulls' and the schedule
        topic), or None (every topic) while a slave is connected, which waits for all data."""
        ha = self.ha_service
        if ha is not None and ha.connections:
            return None
        return self.pull_hold.topics

    # -- the service --------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        await trio.to_thread.run_sync(self._load_managers)
        self.store.set_arrival_listener(self._on_arrival, self._arrival_topics)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                # Bind first (the store must know its address, and a port in use should fail
                # before recovery), recover the store, and only then serve requests.
                await self.server.bind()
                await self.fast_server.bind()
                if self.grpc_server is not None:
                    await self.grpc_server.bind()
                self.store.store_host = self.context.store_host = self.store_host
                await nursery.start(self.store.run)
                port = await nursery.start(self.server.run)
                await nursery.start(self.fast_server.run)
                if self.grpc_server is not None:
                    await nursery.start(self.grpc_server.run)
                client = RemotingClient(
                    nursery,
                    connect_timeout=self.client_config.connect_timeout_millis / 1000,
                    signer=self._signer(),
                    ssl_context=self.client_ssl,
                )
                self.client = client
                self.outer_api = BrokerOuterAPI(client, self.broker_config.namesrv_list())
                if self.store.dledger is None:
                    await self._start_ha(nursery)
                else:
                    nursery.start_soon(self._dledger_roles)
                await self.register_broker_all(force=True)
                self.registered.set()
                period = min(
                    max(self.broker_config.register_name_server_period / 1000, REGISTER_PERIOD_MIN),
                    REGISTER_PERIOD_MAX,
                )
                nursery.start_soon(self._register_on_change)
                self._every(nursery, period, self._periodic_register, REGISTER_INITIAL_DELAY)
                self._every(
                    nursery,
                    self.broker_config.flush_consumer_offset_interval / 1000,
                    self.consumer_offset_manager.persist,
                    PERSIST_OFFSETS_INITIAL_DELAY,
                )
                self._every(nursery, CLIENT_HOUSEKEEPING_PERIOD, self._client_housekeeping)
                self._every(nursery, SCHEDULE_PERSIST_PERIOD, self.schedule.persist)
                self._every(
                    nursery,
                    FILTER_PERSIST_PERIOD,
                    self.consumer_filter_manager.persist,
                    FILTER_PERSIST_PERIOD,
                )
                self._every(nursery, 1.0, self.stats.sample, 0.0)
                if self.acl is not None:
                    self._every(nursery, WATCH_PERIOD, self._watch_acl, WATCH_PERIOD)
                self._every(nursery, PUT_STATS_ROLL_PERIOD, self.store.put_stats.roll)
                self._every(
                    nursery, PROTECT_BROKER_PERIOD, self.protect_broker, PROTECT_BROKER_PERIOD
                )
                self._every(
                    nursery, WATER_MARK_PERIOD, self.print_water_mark, WATER_MARK_INITIAL_DELAY
                )
                if self.store.dledger is not None:
                    # A member's role changes while it runs: it copies the master's metadata
                    # while a slave; the services of its role follow each change.
                    self._every(
                        nursery, SLAVE_SYNC_PERIOD, self._dledger_slave_sync, SLAVE_SYNC_PERIOD
                    )
                elif self.is_slave:
                    self._every(
                        nursery,
                        SLAVE_SYNC_PERIOD,
                        self.slave_sync.sync_all,
                        SLAVE_SYNC_INITIAL_DELAY,
                    )
                await self._switch_role_services()
                if self.metrics is not None:
                    await nursery.start(self.metrics.run)
                for front_end in self.front_ends:
                    await nursery.start(front_end.run)
                log.info(
                    "The broker[%s, %s] boot success. serializeType=JSON and name server is %s",
                    self.broker_config.broker_name,
                    self.broker_addr,
                    self.broker_config.namesrv_addr,
                )
                # What start-up built (configs, tables, modules) lives as long as the broker:
                # moved out of the collector's way, and young-generation collections made rarer,
                # so that the garbage of each request costs less to collect (a send leaves a
                # few dozen objects; the default threshold collects every 700 allocations).
                gc.freeze()
                gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])
                task_status.started(port)
        finally:
            with trio.move_on_after(SHUTDOWN_DEADLINE) as scope:
                scope.shield = True
                await self._shutdown()

    @property
    def ha_port(self) -> int:
        if self.ha_service is not None and self.ha_service.port:
            return self.ha_service.port
        return self.store_config.ha_listen_port

    @property
    def is_slave(self) -> bool:
        return self.store_config.broker_role is BrokerRole.SLAVE

    def _ha_credential(self) -> tuple[str, bytes] | None:
        """What a slave proves to its master: haSecret, else the broker's ACL account, else
        nothing (RocketMQ's plain protocol)."""
        if self.store_config.ha_secret:
            return "", self.store_config.ha_secret.encode()
        bc = self.broker_config
        if bc.access_key and bc.secret_key:
            return bc.access_key, bc.secret_key.encode()
        return None

    def _ha_guard(self) -> HAGuard:
        """What the master's HA port admits (pymq.store.ha.auth): haSlaveAllowList, the
        remoting ports' TLS, haSecret, and the ACL's admin accounts and global white list."""
        acl = self.acl
        account_secret = white_host = None
        if acl is not None:

            def account_secret(access_key: str) -> bytes | None:
                account = acl.state.accounts.get(access_key)
                return account.secret if account is not None and account.admin else None

            def white_host(host: str) -> bool:
                return any(p.matches(host) for p in acl.state.global_white)

        secret = self.store_config.ha_secret
        return HAGuard(
            allow=parse_allow_list(self.store_config.ha_slave_allow_list),
            tls=self.server_config.tls_server(),
            secret=secret.encode() if secret else None,
            account_secret=account_secret,
            white_host=white_host,
        )

    async def _start_ha(self, nursery: trio.Nursery) -> None:
        if self.is_slave:
            self.ha_client = HAClient(
                self.store,
                self.store_config,
                lambda: self.store_config.ha_master_address or self.master_ha_addr,
                ssl_context=self.client_ssl,
                credential=self._ha_credential(),
            )
            await nursery.start(self.ha_client.run)
            return
        self.ha_service = HAService(
            self.store, self.store_config, self.server_config.bind_address, self.ha_guard
        )
        await nursery.start(self.ha_service.run)
        if self.store_config.broker_role is BrokerRole.SYNC_MASTER:
            self.store.replica_waiter = self.ha_service.wait_for_replica

    # -- DLedger mode ---------------------------------------------------------------------------

    def _on_dledger_role(self, change: RoleChange) -> None:
        """The DLedger member's role changes (from its state maintainer): the latest is acted
        on by :meth:`_dledger_roles` (an earlier one not yet acted on is superseded)."""
        self._dledger_role = change
        self._dledger_role_wanted.set()

    async def _dledger_roles(self) -> None:
        """RocketMQ 4.9.4's DLedgerRoleChangeHandler: a leader becomes the group's master
        (brokerId 0, SYNC_MASTER) once its log is all committed and dispatched, its topic
        queue table rebuilt from the consume queues; a follower or candidate becomes a slave
        (brokerId selfId + 1).  Either registers with the name servers at once."""
        while True:
            await self._dledger_role_wanted.wait()
            self._dledger_role_wanted = trio.Event()
            change = self._dledger_role
            assert change is not None
            if change.role is Role.LEADER:
                # no writes until the queue offsets are rebuilt (a master that led again in a
                # new term, its step down superseded, takes none meanwhile either)
                self.store.read_only = True
                if not await self._dledger_caught_up(change):
                    continue
                store = self.store
                store.commitlog.topic_queue_table = store.consume_queues.rebuild_topic_queue_table(
                    store.commitlog.min_offset
                )
                self.broker_config.broker_id = 0
                self.store_config.broker_role = BrokerRole.SYNC_MASTER
                store.read_only = False
                self.master_addr = None
            elif self.store_config.broker_role is BrokerRole.SLAVE:
                continue  # a candidate's next round, or a follower again: nothing changes
            else:
                assert self.store_config.d_leger_self_id is not None
                self.broker_config.broker_id = rocketmq_broker_id(self.store_config.d_leger_self_id)
                self.store_config.broker_role = BrokerRole.SLAVE
                self.store.read_only = True
            log.info(
                "DLedger %s in term %d: the broker is now %s (brokerId %d)",
                change.role.value,
                change.term,
                self.store_config.broker_role.name,
                self.broker_config.broker_id,
            )
            await self._switch_role_services()
            await self.register_broker_all(force=True)

    async def _dledger_caught_up(self, change: RoleChange) -> bool:
        """Wait until the leader's log is committed to its end and dispatched (True), or until
        it no longer leads in ``change``'s term or a newer change came (False)."""
        dledger = self.store.dledger
        assert dledger is not None
        while self._dledger_role is change:
            node = dledger.server.node
            if node is None or node.role is not Role.LEADER or node.term != change.term:
                return False
            log_store = dledger.dledger
            if log_store.ledger_end_index == -1 or (
                log_store.ledger_end_index == log_store.committed_index
                and self.store.reput.behind_bytes == 0
            ):
                return True
            self.store.reput.wakeup()
            await trio.sleep(DLEDGER_ROLE_POLL)
        return False

    async def _switch_role_services(self) -> None:
        """RocketMQ 4.9.4's changeToMaster / changeToSlave for the services that follow the
        role (handleScheduleMessageService, startProcessorByHa / shutdownProcessorByHa): a
        master runs the schedule (delay-level) delivery, the timer delivery and the
        transaction check-back; a slave none of them, only its replica of the timer wheel
        (timerWheelEnable), which follows the master's delivery point.  The running set is
        one task of the broker's nursery (:meth:`_role_services`); on a role change it is
        cancelled and waited for before the other role's starts, so no service outlives its
        role and repeated changes leave nothing behind.  Does nothing when the set running
        is already the role's."""
        master = not self.is_slave
        async with self._services_lock:
            running = self._services
            if running is not None:
                if running.master == master:
                    return
                running.scope.cancel()
                await running.done.wait()
                self._services = None
            assert self._nursery is not None
            self._services = await self._nursery.start(self._role_services, master)
            log.info("%s services started", "master" if master else "slave")

    async def _role_services(
        self, master: bool, *, task_status: trio.TaskStatus[RoleServices]
    ) -> None:
        done = trio.Event()
        try:
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    timer = self.store.config.timer_wheel_enable
                    # the timer store is reopened in the role's mode (see pymq.broker.timer)
                    self.timer.replica = not master
                    if master:
                        await nursery.start(self.schedule.run)
                        if timer:
                            await nursery.start(self.timer.run)
                        await nursery.start(self.transactions.run)
                    elif timer:
                        # the slave's own wheel of the replicated timers, never delivered
                        # while it is a slave: it follows the master's delivery point
                        await nursery.start(self.timer.run)
                        self._every(
                            nursery,
                            TIMER_CHECKPOINT_SYNC_PERIOD,
                            self.slave_sync.sync_timer_checkpoint,
                            TIMER_CHECKPOINT_SYNC_PERIOD,
                        )
                    task_status.started(RoleServices(master, scope, done))
        finally:
            done.set()

    async def _dledger_slave_sync(self) -> None:
        if self.is_slave and self.master_addr:
            await self.slave_sync.sync_all()

    @staticmethod
    def _every(
        nursery: trio.Nursery,
        period: float,
        work: Callable[[], Awaitable[object] | object],
        delay: float | None = None,
    ) -> None:
        nursery.start_soon(
            lambda: every(period, work, initial_delay=delay, name=getattr(work, "__name__", None))
        )

    async def _shutdown(self) -> None:
        if self.outer_api is not None and self.registered.is_set():
            async with trio.open_nursery() as nursery:
                client = RemotingClient(
                    nursery, connect_timeout=2.0, signer=self._signer(), ssl_context=self.client_ssl
                )
                api = BrokerOuterAPI(client, self.outer_api.namesrv_addrs)
                await api.unregister_broker_all(self.identity(), timeout=3.0)
                client.close()
        await trio.to_thread.run_sync(self._persist_managers_blocking)
        log.info("broker %s shut down", self.broker_config.broker_name)

    # -- protection -----------------------------------------------------------------------

    async def protect_broker(self) -> None:
        await protect_broker(self.broker_config, self.fall_behind, self.subscription_group_manager)

    def print_water_mark(self) -> None:
        if not water_mark_log.isEnabledFor(logging.INFO):
            return  # the lines would be dropped: no walk of every connection each second
        self.fast_failure.print_water_mark([*self.server.channels, *self.fast_server.channels])

    # -- name-server registration -------------------------------------------------------------

    def _topics_for_registration(self) -> TopicConfigSerializeWrapper:
        wrapper = self.topic_config_manager.serialize_wrapper()
        perm = self.broker_config.broker_permission
        if not (is_writeable(perm) and is_readable(perm)):
            wrapper.topic_config_table = {
                name: type(c)(name, c.read_queue_nums, c.write_queue_nums, perm)
                for name, c in wrapper.topic_config_table.items()
            }
        return wrapper

    async def register_broker_all(self, *, force: bool) -> None:
        # One registration at a time, each with the identity of when it starts: a DLedger
        # role change's registration never overtaken by an older one (a periodic one made
        # as a slave arriving after the one as master would drop the group's master).
        async with self._register_lock:
            await self._register_broker_all(force=force)

    async def _register_broker_all(self, *, force: bool) -> None:
        if self.outer_api is None or not self.outer_api.namesrv_addrs:
            return
        timeout = self.broker_config.register_broker_timeout_mills / 1000
        if not force:
            version = self.topic_config_manager.data_version
            if not await self.outer_api.need_register(self.identity(), version, timeout):
                return
        results = await self.outer_api.register_broker_all(
            self.identity(),
            self._topics_for_registration(),
            timeout=timeout,
            compressed=self.broker_config.compressed_register,
        )
        if results:
            self.master_addr = results[0].master_addr
            self.master_ha_addr = results[0].ha_server_addr

    async def _periodic_register(self) -> None:
        await self.register_broker_all(force=self.broker_config.force_register)

    async def _register_on_change(self) -> None:
        while True:
            await self._register_wanted.wait()
            self._register_wanted = trio.Event()
            self.topic_config_manager.on_change = self._register_wanted.set
            await self.register_broker_all(force=True)

    # -- clients ------------------------------------------------------------------------------

    def _on_channel_closed(self, channel: Channel) -> None:
        self.producer_manager.channel_closed(channel)
        self.consumer_manager.channel_closed(channel)

    async def _client_housekeeping(self) -> None:
        now = trio.current_time()
        for channel in self.producer_manager.scan_expired(now) + self.consumer_manager.scan_expired(
            now
        ):
            if isinstance(channel, Channel):
                channel.close("client channel expired")

    def post_oneway(self, channel: object, request: RemotingCommand) -> bool:
        """Send a oneway request to a client's connection from a task of the broker's nursery;
        False when the broker is not running or the connection has closed."""
        if self._nursery is None or not isinstance(channel, Channel) or channel.closed:
            return False
        self._nursery.start_soon(_send_oneway, channel, request)
        return True

    def _notify_consumer_ids_changed(self, group: str, channels: list[object]) -> None:
        ext = H.encode(H.NotifyConsumerIdsChangedRequestHeader(group))
        for channel in channels:
            # A request each: its opaque is set as it is sent.
            self.post_oneway(
                channel, RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, ext)
            )

    # -- runtime info -------------------------------------------------------------------------

    def runtime_info(self) -> dict[str, str]:
        info = runtime_info(self)
        if self.ha_service is not None:
            slaves = self.ha_service.status()
            info["haConnections"] = str(len(slaves))
            info["haSlaves"] = ";".join(
                f"{s['address']} ack={s['ackOffset']} lag={s['lagBytes']}" for s in slaves
            )
            info["haPushToSlaveMaxOffset"] = str(self.ha_service.push_to_slave_max_offset)
        if self.ha_client is not None:
            info["haMasterAddress"] = self.ha_client.connected_to or ""
            info["haSlaveMaxOffset"] = str(self.store.max_phy_offset)
        return info


async def _send_oneway(channel: Channel, request: RemotingCommand) -> None:
    try:
        await channel.invoke_oneway(request)
    except RemotingError as exc:
        log.debug("notify %s failed: %s", channel, exc)
