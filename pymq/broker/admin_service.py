"""AdminService: the admin operations on one running broker, as plain data in and out.

Both doors into administration use it: the broker's remoting admin processor
(:mod:`pymq.broker.processors.admin`) calls it for the requests mqadmin-style tools send (topics,
consume stats, offset reset, config updates), and the websocket admin channel's sessions
(:mod:`pymq.admin.session`) call it directly.  It is broker code: the broker never imports
:mod:`pymq.admin`, the admin package builds on the broker.  Results are JSON-ready dicts with
RocketMQ's camelCase names; failures raise :class:`AdminError` carrying a RocketMQ response code,
which each door turns into its own error shape.
"""

from __future__ import annotations

import heapq
import time
from typing import TYPE_CHECKING, Any

import attrs
import trio

import pymq
from pymq.broker.config import UNSUPPORTED_KEYS
from pymq.broker.runtime_info import BROKER_VERSION_DESC
from pymq.broker.stats import GROUP_GET_NUMS
from pymq.broker.subscription_group_manager import SubscriptionGroupConfig
from pymq.common.config import (
    ConfigError,
    RestartOnlyKeyError,
    masked,
    to_properties,
)
from pymq.common.consumer import MessageQueue
from pymq.common.message_ext import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
    MessageExt,
)
from pymq.common.message_id import decode_offset_msg_id
from pymq.common.record import RecordError, decode_record
from pymq.common.serde import error_reasons, from_plain, to_plain
from pymq.common.topic import (
    PERM_READ,
    PERM_WRITE,
    TopicConfig,
    TopicFilterType,
    alter_topic_attributes,
    dlq_topic,
    queue_nums_problem,
    retry_topic,
    validate_topic,
)
from pymq.remoting import headers as H
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import CURRENT_VERSION, RequestCode, ResponseCode
from pymq.remoting.protocol import fastjson
from pymq.remoting.protocol.body import (
    Connection,
    ConsumerConnection,
    ConsumeStats,
    ConsumeStatsList,
    GroupList,
    OffsetWrapper,
    ProducerConnection,
    QueryConsumeTimeSpanBody,
    QueueTimeSpan,
    ResetOffsetBody,
    TopicOffset,
    TopicStatsTable,
)
from pymq.remoting.tls import TLS_KEYS
from pymq.trace.data import TRACE_TOPIC, trace_views

if TYPE_CHECKING:
    from pymq.broker.controller import BrokerController
    from pymq.common.topic import DataVersion

# Keys an operator may change on a running broker.  Paths, ports, names and roles need a
# restart, and are refused with a message saying so.
RESTART_ONLY_KEYS = frozenset(
    {
        "brokerName",
        "brokerClusterName",
        "brokerId",
        "brokerIP1",
        "brokerIP2",
        "listenPort",
        "bindAddress",
        "serverTaskOrder",
        "storePathRootDir",
        "storePathCommitLog",
        "brokerRole",
        "mappedFileSizeCommitLog",
        "mappedFileSizeConsumeQueue",
        "commitLogWriteAdvice",
        "haListenPort",
        "haSlaveAllowList",
        "haSecret",
        "adminListenPort",
        "adminBindAddress",
        "adminToken",
        "adminAllowedHosts",
        "adminAllowedOrigins",
        "adminAuthTimeoutMillis",
        "adminAuthFailuresBeforeDelay",
        "adminAuthDelayMillis",
        "adminAuthMaxDelayMillis",
        "adminAuthThrottleMaxAddresses",
        "adminMaxConnections",
        "adminMaxUnauthenticatedConnections",
        "adminMaxMessageBytes",
        "adminMaxRequestHeadBytes",
        "rocketmqHome",
        "aclEnable",
        "accessKey",
        "secretKey",
        *TLS_KEYS,
        "metricsExporterType",
        "metricsPromExporterHost",
        "metricsPromExporterPort",
        "enableDLegerCommitLog",
        "dLegerGroup",
        "dLegerPeers",
        "dLegerSelfId",
        "storePathDLedgerCommitLog",
        "preferredLeaderId",
        *UNSUPPORTED_KEYS,
    }
)
# Config values never shown: the broker's own ACL secret, TLS key passwords, the admin
# token and haSecret (with ACL, any signed account may read GET_BROKER_CONFIG, as in
# RocketMQ).
SECRET_KEYS = frozenset(
    {"secretKey", "tls.server.keyPassword", "tls.client.keyPassword", "adminToken", "haSecret"}
)


# A body preview is this many bytes of the body, decoded as UTF-8 with replacement.
BODY_PREVIEW_BYTES = 1024
# Most messages a key search returns (RocketMQ's queryMsgByKey default is 64).
DEFAULT_KEY_QUERY_MAX = 64
# Most dead letters one page of the console's DLQ view holds.
DLQ_PAGE_MAX = 256
# The broker's version text, as GET_BROKER_RUNTIME_INFO reports it.
# The transactions view reads at most this many waiting half messages per refresh.
TRANSACTION_SCAN_LIMIT = 5000
# The timers view lists the topics with the most pending timers, at most this many.
TIMER_TOPICS_LISTED = 1000
# It looks for the next slot holding timers at most this many slots ahead (an hour at the
# default timerPrecisionMs of 1 s), in a worker thread.
NEXT_DUE_SCAN_SLOTS = 3600


class AdminError(Exception):
    """A refused or failed admin operation: a RocketMQ response code and a one-line reason."""

    def __init__(self, code: ResponseCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def perm_text(perm: int) -> str:
    return ("R" if perm & PERM_READ else "-") + ("W" if perm & PERM_WRITE else "-")


def message_view(msg: MessageExt, *, with_body: bool = True) -> dict[str, Any]:
    """One message as the channel and the CLI show it, with a body preview."""
    view: dict[str, Any] = {
        "msgId": msg.msg_id,
        "uniqKey": msg.unique_key,
        "topic": msg.topic,
        "queueId": msg.queue_id,
        "queueOffset": msg.queue_offset,
        "commitLogOffset": msg.commitlog_offset,
        "tags": msg.tags,
        "keys": msg.keys,
        "bornTimestamp": msg.born_timestamp,
        "bornHost": f"{msg.born_host[0]}:{msg.born_host[1]}",
        "storeTimestamp": msg.store_timestamp,
        "storeHost": f"{msg.store_host[0]}:{msg.store_host[1]}",
        "reconsumeTimes": msg.reconsume_times,
        "sysFlag": msg.sys_flag,
        "storeSize": msg.store_size,
        "properties": dict(msg.properties),
    }
    if with_body:
        view["bodyLength"] = len(msg.body)
        view["bodyPreview"] = bytes(msg.body[:BODY_PREVIEW_BYTES]).decode("utf-8", "replace")
        view["bodyTruncated"] = len(msg.body) > BODY_PREVIEW_BYTES
    return view


class AdminService:
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker

    # -- broker -------------------------------------------------------------------------------

    def broker_status(self) -> dict[str, Any]:
        """Role, versions, put/get TPS, totals, disk use and slave lag of this broker."""
        ha = getattr(self.broker, "ha_service", None)
        slaves = ha.status() if ha is not None else []
        b = self.broker
        stats = b.stats
        store_info = b.store.runtime_info()
        role = b.store_config.broker_role.value
        return {
            "brokerName": b.broker_config.broker_name,
            "clusterName": b.broker_config.broker_cluster_name,
            "brokerId": b.broker_config.broker_id,
            "brokerAddr": b.broker_addr,
            "brokerRole": role,
            "brokerVersionDesc": BROKER_VERSION_DESC,
            "brokerVersion": CURRENT_VERSION,
            "pymqVersion": pymq.__version__,
            "bootTimestamp": stats.boot_timestamp,
            "timestamp": int(time.time() * 1000),
            # Rates over the last second (live charts) and RocketMQ's 10 s / 1 min / 10 min text.
            "putTps": round(stats.rate(1, 1), 2),
            "getTps": round(stats.rate(1, 3), 2),
            "putTpsText": stats.tps_text(1),
            "getTransferedTpsText": stats.tps_text(3),
            "msgPutTotal": stats.put_msgs,
            "msgGetTotal": stats.get_msgs,
            "commitLogDiskRatio": float(store_info.get("commitLogDiskRatio", "0") or 0),
            "diskFull": store_info.get("diskFull") == "true",
            "commitLogMinOffset": b.store.min_phy_offset,
            "commitLogMaxOffset": b.store.max_phy_offset,
            "dispatchBehindBytes": b.store.dispatch_behind_bytes,
            # A master: the bytes its furthest-behind slave still lacks (None without slaves),
            # and each slave's acknowledged offset; a slave: how far it is behind what it saw.
            "slaveLag": max((s["lagBytes"] for s in slaves), default=None),
            "slaves": slaves,
            "masterAddr": b.master_addr if role == "SLAVE" else None,
        }

    def runtime_info(self) -> dict[str, str]:
        return self.broker.runtime_info()

    # -- transactions ---------------------------------------------------------------------------

    def transaction_status(self, scan_limit: int = TRANSACTION_SCAN_LIMIT) -> dict[str, Any]:
        """Half and op progress of the check service, its counters, and the half messages
        still waiting for an outcome by real topic (the first ``scan_limit`` after the
        progress offset: ``pendingTruncated`` says whether there were more)."""
        b = self.broker
        service = b.transactions
        bc = b.broker_config
        pending, truncated = service.pending_by_topic(scan_limit)
        return {
            **service.progress(),
            **{_camel(k): v for k, v in attrs.asdict(service.stats).items()},
            "pendingByTopic": dict(sorted(pending.items())),
            "pendingTotal": sum(pending.values()),
            "pendingTruncated": truncated,
            "checkService": b.store_config.broker_role.value != "SLAVE",
            "transactionCheckInterval": bc.transaction_check_interval,
            "transactionTimeOut": bc.transaction_time_out,
            "transactionCheckMax": bc.transaction_check_max,
            "rejectTransactionMessage": bc.reject_transaction_message,
        }

    # -- timers -------------------------------------------------------------------------------

    def timer_checkpoint(self) -> tuple[bytes, int]:
        """GET_TIMER_CHECK_POINT: RocketMQ 5's checkpoint body, and the commit-log offset
        that holds the deliveries up to its delivery point (see TimerMessageService)."""
        timer = self.broker.timer
        body = timer.checkpoint_body()
        if body is None:  # RocketMQ 5's answer without a timer store
            raise AdminError(ResponseCode.SYSTEM_ERROR, "The checkpoint is null")
        return body, timer.delivered_phy_offset

    async def timer_status(self, limit: int = TIMER_TOPICS_LISTED) -> dict[str, Any]:
        """Pending timers per real topic (RocketMQ 5's GET_TIMER_METRICS body: ``timingCount``,
        the ``limit`` topics with most, at most :data:`TIMER_TOPICS_LISTED`), their totals, and
        when the next slot holding timers is delivered (``nextDueMs``; None when no slot
        within :data:`NEXT_DUE_SCAN_SLOTS` of the wheel's position holds any)."""
        timer = self.broker.timer
        timers = timer.timers
        if timers is None:  # timerWheelEnable=false (RocketMQ 5's answer)
            raise AdminError(ResponseCode.SYSTEM_ERROR, "The timer message store is null")
        limit = max(1, min(limit, TIMER_TOPICS_LISTED))
        counts = dict(timers.counts)  # one moment's counts: timers are enqueued during the scan
        top = heapq.nlargest(limit, counts.items(), key=lambda item: (item[1], item[0]))
        start = timers.read_ms
        slot = await trio.to_thread.run_sync(timers.next_pending_slot, NEXT_DUE_SCAN_SLOTS)
        return {
            "timingCount": {topic: {"count": count} for topic, count in top},
            "topicsWithTimers": len(counts),
            "pendingTotal": sum(counts.values()),
            "nextDueMs": None if slot is None else slot + timers.precision_ms,
            "scannedUntilMs": start + NEXT_DUE_SCAN_SLOTS * timers.precision_ms,
            "precisionMs": timers.precision_ms,
            "enqueued": sum(timer.enqueue_total.values()),
            "delivered": timer.delivered,
            "dropped": timer.dropped,
            "recalled": timer.recalled,
        }

    # -- topics -------------------------------------------------------------------------------

    def grpc_status(self, group: str | None = None, topic: str | None = None) -> dict[str, Any]:
        """The broker's 5.x gRPC clients (client id, address, language, version, type,
        group, topics, connection and last heartbeat times) and the messages its POP
        consumers hold in flight per group, topic and queue (count, still invisible, the
        oldest's offset, attempts and remaining invisible ms), of ``group`` / ``topic`` when
        given.  ``grpcEnabled`` is false (and both lists empty) without ``grpcServerPort``."""
        service = self.broker.grpc_service
        if service is None:
            return {"grpcEnabled": False, "clients": [], "inflight": []}
        clients = service.clients_view(group)
        if topic:
            clients = [c for c in clients if topic in c["topics"]]
        return {
            "grpcEnabled": True,
            "clients": clients,
            "inflight": service.pop.inflight_view(group, topic),
        }

    def topic_list(self) -> list[dict[str, Any]]:
        tcm = self.broker.topic_config_manager
        system = tcm.system_topics
        return [
            {
                "topic": name,
                "readQueueNums": c.read_queue_nums,
                "writeQueueNums": c.write_queue_nums,
                "perm": c.perm,
                "permText": perm_text(c.perm),
                "order": c.order,
                "topicSysFlag": c.topic_sys_flag,
                "system": name in system or name.startswith("RMQ_SYS_"),
            }
            for name, c in sorted(tcm.table.items())
        ]

    def require_topic(self, topic: str) -> TopicConfig:
        config = self.broker.topic_config_manager.select(topic)
        if config is None:
            raise AdminError(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        return config

    def topic_status(self, topic: str) -> dict[str, Any]:
        """Min/max offset and last store time of every queue of ``topic``."""
        config = self.require_topic(topic)
        store = self.broker.store
        queues = []
        for queue_id in range(max(config.read_queue_nums, config.write_queue_nums)):
            max_offset = store.get_max_offset_in_queue(topic, queue_id)
            min_offset = max(store.get_min_offset_in_queue(topic, queue_id), 0)
            last = (
                store.get_message_store_timestamp(topic, queue_id, max_offset - 1)
                if max_offset > 0
                else 0
            )
            queues.append(
                {
                    "brokerName": self.broker.broker_config.broker_name,
                    "queueId": queue_id,
                    "minOffset": min_offset,
                    "maxOffset": max_offset,
                    "lastUpdateTimestamp": max(last, 0),
                }
            )
        return {"topic": topic, "queues": queues}

    def build_topic_config(
        self,
        topic: str,
        *,
        read_queue_nums: int = 8,
        write_queue_nums: int = 8,
        perm: int = PERM_READ | PERM_WRITE,
        topic_filter_type: str = "SINGLE_TAG",
        topic_sys_flag: int = 0,
        order: bool = False,
        attributes: str | None = None,
    ) -> TopicConfig:
        """A validated topic config, or AdminError saying what is wrong.  ``attributes``:
        RocketMQ 5's changes to the topic's attributes (:func:`alter_topic_attributes`),
        applied to those the topic has."""
        if topic == self.broker.broker_config.broker_cluster_name:
            raise AdminError(
                ResponseCode.SYSTEM_ERROR,
                f"The topic[{topic}] is conflict with system reserved words (the cluster name).",
            )
        problem = validate_topic(topic)
        if problem:
            raise AdminError(ResponseCode.SYSTEM_ERROR, problem)
        try:
            filter_type = TopicFilterType(topic_filter_type)
        except ValueError:
            raise AdminError(
                ResponseCode.SYSTEM_ERROR, "topicFilterType must be SINGLE_TAG or MULTI_TAG"
            ) from None
        for name, nums in (
            ("readQueueNums", read_queue_nums),
            ("writeQueueNums", write_queue_nums),
        ):
            problem = queue_nums_problem(name, nums, least=1)
            if problem:
                raise AdminError(ResponseCode.SYSTEM_ERROR, problem)
        if perm & ~(PERM_READ | PERM_WRITE | 1) or perm < 0:
            raise AdminError(ResponseCode.SYSTEM_ERROR, f"perm must be 2, 4 or 6, not {perm}")
        current = self.broker.topic_config_manager.select(topic)
        try:
            altered = alter_topic_attributes(
                current.attributes if current is not None else None, attributes
            )
        except ValueError as exc:
            raise AdminError(ResponseCode.SYSTEM_ERROR, str(exc)) from None
        return TopicConfig(
            topic,
            read_queue_nums,
            write_queue_nums,
            perm,
            filter_type,
            topic_sys_flag,
            order,
            altered,
        )

    async def update_topic(self, config: TopicConfig) -> dict[str, Any]:
        await self.broker.topic_config_manager.update(config)
        return {"topic": config.topic_name, **_topic_plain(config)}

    async def delete_topic(self, topic: str) -> None:
        await self.broker.topic_config_manager.delete(topic)
        self.broker.consumer_offset_manager.remove_topic(topic)
        self.broker.stats.on_topic_deleted(topic)
        await self.broker.store.delete_topics([topic])
        await self.broker.timer.on_topic_deleted(topic)

    # -- consumer groups ----------------------------------------------------------------------

    def _group_names(self) -> list[str]:
        b = self.broker
        names = set(b.subscription_group_manager.table) | set(b.consumer_manager.groups)
        for key in b.consumer_offset_manager.offset_table:
            names.add(key.rsplit("@", 1)[-1])
        return sorted(names)

    def _group_topics(self, group: str) -> list[str]:
        topics = set(self.broker.consumer_offset_manager.topics_of_group(group))
        info = self.broker.consumer_manager.get(group)
        if info is not None:
            topics |= set(info.subscriptions)
        return sorted(t for t in topics if self.broker.topic_config_manager.select(t))

    def consume_stats(self, group: str, topic: str | None = None) -> dict[str, Any]:
        """Per queue: broker max offset, committed offset, lag and last stored message time."""
        b = self.broker
        topics = [topic] if topic else self._group_topics(group)
        if topic:
            self.require_topic(topic)
        elif not topics and group not in self._group_names():
            raise AdminError(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"consumer group[{group}] not exist"
            )
        queues = []
        for name in topics:
            config = self.require_topic(name)
            committed = b.consumer_offset_manager.query_offsets(group, name)
            for queue_id in range(config.read_queue_nums):
                broker_offset = b.store.get_max_offset_in_queue(name, queue_id)
                consumer_offset = committed.get(queue_id, -1)
                lag = broker_offset - max(consumer_offset, 0) if consumer_offset >= 0 else 0
                last = (
                    b.store.get_message_store_timestamp(name, queue_id, consumer_offset - 1)
                    if consumer_offset > 0
                    else 0
                )
                queues.append(
                    {
                        "topic": name,
                        "brokerName": b.broker_config.broker_name,
                        "queueId": queue_id,
                        "brokerOffset": broker_offset,
                        "consumerOffset": consumer_offset,
                        "lag": lag,
                        "lastTimestamp": max(last, 0),
                    }
                )
        stats = self.broker.stats
        return {
            "group": group,
            "queues": queues,
            "diffTotal": sum(q["lag"] for q in queues),
            "consumeTps": sum(stats.minute_tps(GROUP_GET_NUMS, f"{t}@{group}") for t in topics),
        }

    def consumer_connection(self, group: str) -> dict[str, Any]:
        info = self.broker.consumer_manager.get(group)
        if info is None:
            raise AdminError(
                ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online"
            )
        return {
            "connectionSet": [
                {
                    "clientId": c.client_id,
                    "clientAddr": c.remote_address,
                    "language": c.language,
                    "version": c.version,
                }
                for c in info.channels.values()
            ],
            "subscriptionTable": {t: to_plain(s) for t, s in info.subscriptions.items()},
            "consumeType": info.consume_type.value,
            "messageModel": info.message_model.value,
            "consumeFromWhere": info.consume_from_where.value,
        }

    def group_list(self) -> list[dict[str, Any]]:
        """Every known group with its members, rebalance state and total lag."""
        rows = []
        for group in self._group_names():
            info = self.broker.consumer_manager.get(group)
            stats = self.consume_stats(group)
            subs = sorted(info.subscriptions) if info else []
            rows.append(
                {
                    "group": group,
                    "online": info is not None,
                    "members": sorted(c.client_id for c in info.channels.values()) if info else [],
                    "consumeType": info.consume_type.value if info else None,
                    "messageModel": info.message_model.value if info else None,
                    "subscriptions": subs,
                    "rebalance": _rebalance_state(info, stats),
                    "topics": sorted({q["topic"] for q in stats["queues"]}),
                    "diffTotal": stats["diffTotal"],
                }
            )
        return rows

    async def update_subscription_group(self, fields: dict[str, Any]) -> dict[str, Any]:
        if not fields.get("groupName"):
            raise AdminError(ResponseCode.SYSTEM_ERROR, "groupName is required")
        try:
            config = from_plain(fields, SubscriptionGroupConfig)
        except Exception as exc:  # cattrs raises several kinds of errors
            problem = error_reasons(exc)
            raise AdminError(
                ResponseCode.SYSTEM_ERROR, f"bad subscription group: {problem}"
            ) from None
        await self.broker.subscription_group_manager.update(config)
        return to_plain(config)

    def reset_offset_by_time(
        self, group: str, topic: str, timestamp: int, force: bool = True
    ) -> dict[str, Any]:
        """:meth:`reset_offset`'s result as plain data (the channel's and the CLI's view)."""
        return self.reset_offset(group, topic, timestamp, force)[0]

    def reset_offset(
        self, group: str, topic: str, timestamp: int, force: bool = True
    ) -> tuple[dict[str, Any], bytes]:
        """Move the group's offsets on every queue of ``topic`` to the first message stored at
        or after ``timestamp`` (-1: the end of each queue), and tell its online consumers.

        As Java's broker, each online client of the group is sent RESET_CONSUMER_CLIENT_OFFSET
        (220, oneway, ``isForce`` false) with the new offsets, which a client applies and pulls
        from.  Unlike Java's (which answers CONSUMER_NOT_ONLINE for an offline group and leaves
        the offsets to the clients), pymq also commits the new offsets itself, so a reset works
        for a group with no consumer running.  Without ``force`` a queue only moves back: an
        offset already before the target is kept, as in Java.  The 5.x consumers' POP reads
        from the new offsets at once, what they had in flight forgotten
        (:meth:`pymq.proxy.pop.PopService.reset`).  Returns the result as plain data
        and the ResetOffsetBody (fastjson) that the clients were sent.
        """
        config = self.require_topic(topic)
        store = self.broker.store
        broker_name = self.broker.broker_config.broker_name
        offsets: dict[int, int] = {}
        table: dict[MessageQueue, int] = {}
        for queue_id in range(config.read_queue_nums):
            max_offset = store.get_max_offset_in_queue(topic, queue_id)
            if timestamp < 0:
                offset = max_offset
            else:
                offset = store.get_offset_in_queue_by_time(topic, queue_id, timestamp)
                last = (
                    store.get_message_store_timestamp(topic, queue_id, max_offset - 1)
                    if max_offset > 0
                    else -1
                )
                if last < timestamp:
                    offset = max_offset
            offset = max(offset, 0)
            committed = self.broker.consumer_offset_manager.query_offset(group, topic, queue_id)
            if not force and 0 <= committed <= offset:
                offset = committed
            offsets[queue_id] = offset
            table[MessageQueue(topic, broker_name, queue_id)] = offset
        for queue_id, offset in offsets.items():
            self.broker.consumer_offset_manager.commit_offset(
                "admin", group, topic, queue_id, offset
            )
        if self.broker.grpc_service is not None:  # the 5.x consumers' POP reads from them too
            self.broker.grpc_service.pop.reset(group, topic, list(offsets))
        body = fastjson.dumps(ResetOffsetBody(table))
        notified = self._notify_reset(group, topic, timestamp, body)
        result = {
            "group": group,
            "topic": topic,
            "timestamp": timestamp,
            "offsets": [{"queueId": q, "offset": o} for q, o in sorted(offsets.items())],
            "online": notified > 0,
            "notified": notified,
        }
        return result, body

    def _notify_reset(self, group: str, topic: str, timestamp: int, body: bytes) -> int:
        """RESET_CONSUMER_CLIENT_OFFSET to each online client of ``group``; how many."""
        info = self.broker.consumer_manager.get(group)
        if info is None:
            return 0
        header = H.encode(H.ResetOffsetRequestHeader(topic, group, timestamp, False))
        count = 0
        for channel in list(info.channels):
            request = RemotingCommand.request(
                RequestCode.RESET_CONSUMER_CLIENT_OFFSET, header, body, oneway=True
            )
            if self.broker.post_oneway(channel, request):
                count += 1
        return count

    # -- Java's admin bodies (pymq.remoting.protocol.body) ----------------------------------

    def topic_stats_table(self, topic: str) -> TopicStatsTable:
        """GET_TOPIC_STATS_INFO: every queue's min/max offset and last store time."""
        status = self.topic_status(topic)
        return TopicStatsTable(
            {
                MessageQueue(topic, q["brokerName"], q["queueId"]): TopicOffset(
                    q["minOffset"], q["maxOffset"], q["lastUpdateTimestamp"]
                )
                for q in status["queues"]
            }
        )

    def _offset_wrappers(
        self, group: str, topic: str, queue_nums: int
    ) -> dict[MessageQueue, OffsetWrapper]:
        b = self.broker
        store = b.store
        broker_name = b.broker_config.broker_name
        table: dict[MessageQueue, OffsetWrapper] = {}
        for queue_id in range(queue_nums):
            broker_offset = max(store.get_max_offset_in_queue(topic, queue_id), 0)
            consumer_offset = max(b.consumer_offset_manager.query_offset(group, topic, queue_id), 0)
            last = 0
            if consumer_offset > 0:
                last = store.get_message_store_timestamp(topic, queue_id, consumer_offset - 1)
            table[MessageQueue(topic, broker_name, queue_id)] = OffsetWrapper(
                broker_offset, consumer_offset, last
            )
        return table

    def _stats_topics(self, group: str) -> list[str]:
        """The topics a group's consume stats cover, as Java's: those it has offsets for, less
        those its online members no longer subscribe to."""
        b = self.broker
        info = b.consumer_manager.get(group)
        topics = []
        for topic in sorted(b.consumer_offset_manager.topics_of_group(group)):
            if info is not None and info.subscriptions and topic not in info.subscriptions:
                continue
            topics.append(topic)
        return topics

    def java_consume_stats(self, group: str, topic: str | None = None) -> ConsumeStats:
        """GET_CONSUME_STATS as Java's broker answers it: one entry per readable queue of each
        topic (offsets below zero shown as 0), and the group's minute TPS."""
        b = self.broker
        stats = ConsumeStats()
        for name in [topic] if topic else self._stats_topics(group):
            config = b.topic_config_manager.select(name)
            if config is None:
                continue
            stats.offset_table.update(self._offset_wrappers(group, name, config.read_queue_nums))
            stats.consume_tps += b.stats.minute_tps(GROUP_GET_NUMS, f"{name}@{group}")
        return stats

    def broker_consume_stats(self, is_order: bool) -> ConsumeStatsList:
        """GET_BROKER_CONSUME_STATS: every subscription group's ConsumeStats per topic."""
        b = self.broker
        result = ConsumeStatsList(broker_addr=b.broker_addr)
        for group in list(b.subscription_group_manager.table):
            per_topic: list[ConsumeStats] = []
            for topic in self._stats_topics(group):
                config = b.topic_config_manager.select(topic)
                if config is None or (is_order and not config.order):
                    continue
                stats = ConsumeStats(
                    self._offset_wrappers(group, topic, config.write_queue_nums),
                    b.stats.minute_tps(GROUP_GET_NUMS, f"{topic}@{group}"),
                )
                result.total_diff += stats.total_diff()
                per_topic.append(stats)
            result.consume_stats_list.append({group: per_topic})
        return result

    def java_consumer_connection(self, group: str) -> ConsumerConnection:
        info = self.broker.consumer_manager.get(group)
        if info is None or not info.channels:
            raise AdminError(
                ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online"
            )
        return ConsumerConnection(
            connection_set=[
                Connection(c.client_id, c.remote_address, c.language, c.version)
                for c in info.channels.values()
            ],
            subscription_table=dict(info.subscriptions),
            consume_type=info.consume_type,
            message_model=info.message_model,
            consume_from_where=info.consume_from_where,
        )

    def producer_connection(self, group: str) -> ProducerConnection:
        channels = self.broker.producer_manager.groups.get(group)
        if not channels:
            raise AdminError(ResponseCode.SYSTEM_ERROR, f"the producer group[{group}] not exist")
        return ProducerConnection(
            [
                Connection(c.client_id, c.remote_address, c.language, c.version)
                for c in channels.values()
            ]
        )

    def topic_consumed_by(self, topic: str) -> GroupList:
        """QUERY_TOPIC_CONSUME_BY_WHO: online groups subscribing to it and groups with offsets."""
        b = self.broker
        groups = set(b.consumer_manager.groups_of_topic(topic))
        groups |= set(b.consumer_offset_manager.groups_of_topic(topic))
        return GroupList(sorted(groups))

    def consume_time_span(self, topic: str, group: str) -> QueryConsumeTimeSpanBody:
        """QUERY_CONSUME_TIME_SPAN: per queue the first/last store time, the time of the last
        consumed message and how long the next one has waited (0 when all are consumed)."""
        config = self.require_topic(topic)
        store = self.broker.store
        broker_name = self.broker.broker_config.broker_name
        spans = []
        now = int(time.time() * 1000)
        for queue_id in range(config.write_queue_nums):
            min_time = store.get_earliest_message_time(topic, queue_id)
            max_offset = store.get_max_offset_in_queue(topic, queue_id)
            max_time = store.get_message_store_timestamp(topic, queue_id, max_offset - 1)
            consumer_offset = self.broker.consumer_offset_manager.query_offset(
                group, topic, queue_id
            )
            if consumer_offset > 0:
                consume_time = store.get_message_store_timestamp(
                    topic, queue_id, consumer_offset - 1
                )
            else:
                consume_time = min_time
            delay = 0
            if consumer_offset < max_offset:
                next_time = store.get_message_store_timestamp(
                    topic, queue_id, max(consumer_offset, 0)
                )
                delay = now - next_time if next_time > 0 else 0
            spans.append(
                QueueTimeSpan(
                    MessageQueue(topic, broker_name, queue_id),
                    min_time,
                    max_time,
                    consume_time,
                    delay,
                ).with_texts()
            )
        return QueryConsumeTimeSpanBody(spans)

    # -- messages -----------------------------------------------------------------------------

    def message_by_id(self, msg_id: str, topic: str | None = None) -> dict[str, Any]:
        """By offset message id (store host + commit-log offset), else by unique key."""
        try:
            _ip, _port, offset = decode_offset_msg_id(msg_id)
        except ValueError:
            offset = -1
        if offset >= 0:
            msg = self.broker.store.look_message_by_offset(offset)
            if msg is not None and msg.msg_id == msg_id.upper() and topic in (None, msg.topic):
                return message_view(msg)
        if topic:
            for msg in self._query(topic, msg_id, DEFAULT_KEY_QUERY_MAX):
                if msg.unique_key == msg_id:
                    full = self.broker.store.look_message_by_offset(msg.commitlog_offset)
                    return message_view(full or msg)
        raise AdminError(ResponseCode.QUERY_NOT_FOUND, f"no message with id {msg_id}")

    def _query(self, topic: str, key: str, max_num: int) -> list[MessageExt]:
        result = self.broker.store.query_message(topic, key, max_num, 0, 2**62)
        return [decode_record(raw, read_body=False, check_crc=False) for raw in result.messages]

    def messages_by_key(
        self, topic: str, key: str, max_num: int = DEFAULT_KEY_QUERY_MAX
    ) -> list[dict[str, Any]]:
        self.require_topic(topic)
        found = []
        for head in self._query(topic, key, max_num):
            msg = self.broker.store.look_message_by_offset(head.commitlog_offset)
            found.append(message_view(msg or head, with_body=msg is not None))
        return sorted(found, key=lambda m: m["storeTimestamp"])

    def message_trace(self, msg_id: str, trace_topic: str | None = None) -> list[dict[str, Any]]:
        """A message's trace from this broker's trace topic (``msgTraceTopicName`` unless
        given): the steps recorded by trace messages whose keys name ``msg_id``, oldest first
        (as ``pymq-admin queryMsgTraceById``)."""
        topic = trace_topic or self.broker.broker_config.msg_trace_topic_name or TRACE_TOPIC
        self.require_topic(topic)
        result = self.broker.store.query_message(topic, msg_id, DEFAULT_KEY_QUERY_MAX, 0, 2**62)
        steps: list[tuple[int, dict[str, Any]]] = []
        for raw in result.messages:
            try:
                msg = decode_record(raw, check_crc=False)
            except RecordError:
                continue
            for view in trace_views(msg_id, msg.body, msg.born_host[0]):
                steps.append((msg.store_timestamp, view.to_json()))
        if not steps:
            raise AdminError(
                ResponseCode.QUERY_NOT_FOUND, f"no trace of message {msg_id} in topic {topic}"
            )
        return [step for _, step in sorted(steps, key=lambda pair: pair[0])]

    def message_by_offset(self, topic: str, queue_id: int, offset: int) -> dict[str, Any]:
        config = self.require_topic(topic)
        if not 0 <= queue_id < max(config.read_queue_nums, config.write_queue_nums):
            raise AdminError(ResponseCode.SYSTEM_ERROR, f"topic {topic} has no queue {queue_id}")
        store = self.broker.store
        cq = store.consume_queues.find(topic, queue_id)
        entry = cq.get_entry(offset) if cq else None
        msg = store.look_message_by_offset(entry[0], entry[1]) if entry else None
        if msg is None:
            raise AdminError(
                ResponseCode.QUERY_NOT_FOUND,
                f"no message at {topic} queue {queue_id} offset {offset}",
            )
        return message_view(msg)

    def clone_group_offset(
        self, src_group: str, dest_group: str, topic: str | None, offline: bool
    ) -> list[str]:
        """CLONE_GROUP_OFFSET: copy ``src_group``'s committed offsets (of ``topic``, or of every
        topic it has offsets for) to ``dest_group``; unless ``offline``, a topic its online
        members no longer subscribe to is skipped, as in Java.  Returns the topics cloned."""
        b = self.broker
        topics = [topic] if topic else sorted(b.consumer_offset_manager.topics_of_group(src_group))
        info = b.consumer_manager.get(src_group)
        cloned = []
        offsets = b.consumer_offset_manager
        for name in topics:
            if b.topic_config_manager.select(name) is None:
                continue
            dropped = info is not None and info.subscriptions and name not in info.subscriptions
            if dropped and not offline:
                continue
            for queue_id, offset in offsets.query_offsets(src_group, name).items():
                offsets.commit_offset("clone", dest_group, name, queue_id, offset)
            cloned.append(name)
        return cloned

    # -- the dashboard's other views: producers, dead letters, message tracks ------------------

    def producer_groups(self) -> list[dict[str, Any]]:
        """Every producer group with a live connection, and its connections."""
        return [
            {
                "group": group,
                "connectionSet": to_plain(self.producer_connection(group))["connectionSet"],
            }
            for group in sorted(self.broker.producer_manager.groups)
        ]

    def producer_connections(self, group: str) -> dict[str, Any]:
        plain: dict[str, Any] = to_plain(self.producer_connection(group))
        return {"group": group, **plain}

    def dlq_messages(self, group: str, offset: int = 0, max_num: int = 32) -> dict[str, Any]:
        """A page of the group's dead-letter queue (``%DLQ%group``), from ``offset`` on."""
        topic = dlq_topic(group)
        store = self.broker.store
        if self.broker.topic_config_manager.select(topic) is None:
            return {"topic": topic, "minOffset": 0, "maxOffset": 0, "messages": []}
        max_num = max(1, min(max_num, DLQ_PAGE_MAX))
        min_offset = max(store.get_min_offset_in_queue(topic, 0), 0)
        max_offset = store.get_max_offset_in_queue(topic, 0)
        messages = []
        for queue_offset in range(max(offset, min_offset), min(max_offset, offset + max_num)):
            try:
                messages.append(self.message_by_offset(topic, 0, queue_offset))
            except AdminError:
                continue
        return {
            "topic": topic,
            "minOffset": min_offset,
            "maxOffset": max_offset,
            "messages": messages,
        }

    async def dlq_resend(self, group: str, offset: int) -> dict[str, Any]:
        """Send the dead letter at ``offset`` to the group's retry topic, to be consumed again
        (by every online member: unlike CONSUME_MESSAGE_DIRECTLY it needs no chosen client).
        Its original topic is kept in RETRY_TOPIC, so consumers see it under that topic."""
        view = self.message_by_offset(dlq_topic(group), 0, offset)
        original = self.broker.store.look_message_by_offset(view["commitLogOffset"])
        if original is None:
            raise AdminError(ResponseCode.QUERY_NOT_FOUND, f"dead letter {offset} is gone")
        group_config = await self.broker.subscription_group_manager.find_or_create(group)
        queue_nums = group_config.retry_queue_nums if group_config is not None else 1
        retry = retry_topic(group)
        await self.broker.topic_config_manager.create_in_send_back(
            retry, max(queue_nums, 1), PERM_READ | PERM_WRITE, 0
        )
        props = dict(original.properties)
        props.setdefault(PROPERTY_RETRY_TOPIC, original.topic)
        props.pop(PROPERTY_DELAY_TIME_LEVEL, None)
        props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, original.msg_id)
        msg = MessageExt(
            topic=retry,
            body=original.body,
            flag=original.flag,
            properties=props,
            queue_id=0,
            sys_flag=original.sys_flag,
            born_timestamp=original.born_timestamp,
            born_host=original.born_host,
            store_host=self.broker.store_host,
            reconsume_times=0,
        )
        result = await self.broker.store.put(msg)
        if not result.is_ok:
            raise AdminError(ResponseCode.SYSTEM_ERROR, result.reason or result.status.value)
        return {"group": group, "topic": retry, "msgId": result.msg_id, "from": view["msgId"]}

    def message_track(self, msg_id: str, topic: str | None = None) -> dict[str, Any]:
        """Whether each group consuming the message's topic has consumed it (the dashboard's
        message track): CONSUMED, CONSUMED_BUT_FILTERED (its subscription's tags exclude
        it), NOT_CONSUME_YET, NOT_ONLINE (not consumed, no member online), or
        CONSUME_BROADCASTING (broadcast offsets are kept by the clients, not the broker)."""
        view = self.message_by_id(msg_id, topic)
        b = self.broker
        topic_name, queue_id, queue_offset = view["topic"], view["queueId"], view["queueOffset"]
        tracks = []
        for group in self.topic_consumed_by(topic_name).group_list:
            info = b.consumer_manager.get(group)
            committed = b.consumer_offset_manager.query_offset(group, topic_name, queue_id)
            online = info is not None and bool(info.channels)
            if info is not None and info.message_model.value == "BROADCASTING":
                track = "CONSUME_BROADCASTING"
            elif committed > queue_offset:
                track = "CONSUMED"
                sub = info.subscriptions.get(topic_name) if info is not None else None
                if sub is not None and not sub.matches_all and view["tags"] not in sub.tags_set:
                    track = "CONSUMED_BUT_FILTERED"
            elif online:
                track = "NOT_CONSUME_YET"
            else:
                track = "NOT_ONLINE"
            tracks.append(
                {"group": group, "trackType": track, "consumerOffset": committed, "online": online}
            )
        return {"message": view, "tracks": tracks}

    # -- configs ------------------------------------------------------------------------------

    def config_properties(self) -> tuple[dict[str, str], DataVersion]:
        """The live configs as RocketMQ properties, in their declared order, and their version,
        secrets masked.

        As Java's GET_BROKER_CONFIG: a key whose value is null is left out (``haMasterAddress``
        unless set), and ``storePathCommitLog`` shows the path in use.
        """
        props = to_properties(self.broker.configs(), skip_none=True)
        props["storePathCommitLog"] = self.broker.store_config.store_path_commitlog
        return masked(props, SECRET_KEYS), self.broker.config_version

    def broker_config(self) -> dict[str, Any]:
        props = masked(to_properties(self.broker.configs()), SECRET_KEYS)
        return {
            "config": dict(sorted(props.items())),
            "restartOnly": sorted(RESTART_ONLY_KEYS & props.keys()),
            "version": to_plain(self.broker.config_version),
        }

    async def update_broker_config(self, props: dict[str, str]) -> dict[str, str]:
        """Apply ``props`` (RocketMQ keys) to the live configs, all or nothing, once they are
        saved to the broker's config file (so that a restart keeps them)."""
        config_file = self.broker.config_file
        try:
            applied = await config_file.apply(
                self.broker.configs(), props, RESTART_ONLY_KEYS, "broker"
            )
        except RestartOnlyKeyError as exc:
            raise AdminError(ResponseCode.NO_PERMISSION, str(exc)) from None
        except ConfigError as exc:
            raise AdminError(ResponseCode.SYSTEM_ERROR, str(exc)) from None
        self.broker.config_version.next_version()
        return applied


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _topic_plain(config: TopicConfig) -> dict[str, Any]:
    return {
        "readQueueNums": config.read_queue_nums,
        "writeQueueNums": config.write_queue_nums,
        "perm": config.perm,
        "order": config.order,
    }


def _rebalance_state(info: object, stats: dict[str, Any]) -> str:
    """What the broker can tell of a group's rebalance: offline, idle, or members agreeing."""
    if info is None:
        return "OFFLINE"
    channels = getattr(info, "channels", {})
    if not channels:
        return "NO_MEMBERS"
    return "BALANCED" if stats["queues"] or getattr(info, "subscriptions", None) else "IDLE"
