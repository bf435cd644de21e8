"""The admin bodies RocketMQ's broker answers with, as the Java classes it encodes them from.

Each class is a bean written by :func:`pymq.remoting.protocol.fastjson.dumps` (fields
alphabetical, maps keyed by :class:`~pymq.common.consumer.MessageQueue` written with the queue
object as the key), so that mqadmin, the dashboard and the exporter parse them as they parse the
Java broker's (java-wire-samples.md, section 2).  Field names follow Java's getters, including
its spelling (``droped``).
"""

from __future__ import annotations

import time

import attrs

from pymq.common.consumer import ConsumeFromWhere, ConsumeType, MessageModel, MessageQueue
from pymq.common.consumer import SubscriptionData as SubscriptionData

# QueueTimeSpan's human-readable times: UtilAll.timeMillisToHumanString3, local time.
HUMAN_TIME_FORMAT = "%Y-%m-%d#%H:%M:%S"


def human_time(ms: int) -> str:
    """``yyyy-MM-dd#HH:mm:ss:SSS`` in local time, as Java's QueueTimeSpan writes it."""
    seconds, millis = divmod(ms, 1000)
    return time.strftime(HUMAN_TIME_FORMAT, time.localtime(seconds)) + f":{millis:03d}"


@attrs.define
class TopicOffset:
    min_offset: int = 0
    max_offset: int = 0
    last_update_timestamp: int = 0


@attrs.define
class TopicStatsTable:
    """GET_TOPIC_STATS_INFO (202)."""

    offset_table: dict[MessageQueue, TopicOffset] = attrs.Factory(dict)


@attrs.define
class OffsetWrapper:
    broker_offset: int = 0
    consumer_offset: int = 0
    last_timestamp: int = 0


@attrs.define
class ConsumeStats:
    """GET_CONSUME_STATS (208), and each entry of GET_BROKER_CONSUME_STATS (317)."""

    offset_table: dict[MessageQueue, OffsetWrapper] = attrs.Factory(dict)
    consume_tps: float = 0.0

    def total_diff(self) -> int:
        return sum(w.broker_offset - w.consumer_offset for w in self.offset_table.values())


@attrs.define
class ConsumeStatsList:
    """GET_BROKER_CONSUME_STATS (317): one single-key map per subscription group."""

    broker_addr: str = ""
    consume_stats_list: list[dict[str, list[ConsumeStats]]] = attrs.Factory(list)
    total_diff: int = 0


@attrs.define
class ResetOffsetBody:
    """INVOKE_BROKER_TO_RESET_OFFSET (222) answer and RESET_CONSUMER_CLIENT_OFFSET (220) body."""

    offset_table: dict[MessageQueue, int] = attrs.Factory(dict)


@attrs.define
class GetConsumerStatusBody:
    """GET_CONSUMER_STATUS_FROM_CLIENT (221, a client's offsets) and
    INVOKE_BROKER_TO_GET_CONSUMER_STATUS (223, every client's, by client id)."""

    message_queue_table: dict[MessageQueue, int] = attrs.Factory(dict)
    consumer_table: dict[str, dict[MessageQueue, int]] = attrs.Factory(dict)


@attrs.define
class TopicListBody:
    """GET_SYSTEM_TOPIC_LIST_FROM_BROKER (305)."""

    topic_list: list[str] = attrs.Factory(list)
    broker_addr: str | None = None


@attrs.define
class ConsumeQueueData:
    physic_offset: int = 0
    physic_size: int = 0
    tags_code: int = 0
    extend_data_json: str | None = None
    bit_map: str | None = None
    eval: bool = False
    msg: str | None = None


@attrs.define
class QueryCorrectionOffsetBody:
    """QUERY_CORRECTION_OFFSET (308): a correction offset per queue id."""

    correction_offsets: dict[int, int] = attrs.Factory(dict)


@attrs.define
class QueryConsumeQueueResponseBody:
    """QUERY_CONSUME_QUEUE (321): entries of one consume queue from an index on."""

    subscription_data: SubscriptionData | None = None
    filter_data: str | None = None
    queue_data: list[ConsumeQueueData] | None = None
    max_queue_index: int = 0
    min_queue_index: int = 0


@attrs.define
class ProducerInfo:
    client_id: str = ""
    remote_ip: str = attrs.field(default="", metadata={"key": "remoteIP"})
    language: str = "JAVA"
    version: int = 0
    last_update_timestamp: int = 0


@attrs.define
class ProducerTableInfo:
    """GET_ALL_PRODUCER_INFO (328): every producer group's clients."""

    data: dict[str, list[ProducerInfo]] = attrs.Factory(dict)


@attrs.define
class Connection:
    client_id: str = ""
    client_addr: str = ""
    language: str = "JAVA"
    version: int = 0


@attrs.define
class ConsumerConnection:
    """GET_CONSUMER_CONNECTION_LIST (203)."""

    connection_set: list[Connection] = attrs.Factory(list)
    subscription_table: dict[str, SubscriptionData] = attrs.Factory(dict)
    consume_type: ConsumeType | None = None
    message_model: MessageModel | None = None
    consume_from_where: ConsumeFromWhere | None = None


@attrs.define
class ProducerConnection:
    """GET_PRODUCER_CONNECTION_LIST (204)."""

    connection_set: list[Connection] = attrs.Factory(list)


@attrs.define
class GroupList:
    """QUERY_TOPIC_CONSUME_BY_WHO (300)."""

    group_list: list[str] = attrs.Factory(list)


@attrs.define
class QueueTimeSpan:
    message_queue: MessageQueue
    min_time_stamp: int = 0
    max_time_stamp: int = 0
    consume_time_stamp: int = 0
    delay_time: int = 0
    # Java's getters *Str: written from the times above by :meth:`with_texts`.
    min_time_stamp_str: str = ""
    max_time_stamp_str: str = ""
    consume_time_stamp_str: str = ""

    def with_texts(self) -> QueueTimeSpan:
        self.min_time_stamp_str = human_time(self.min_time_stamp)
        self.max_time_stamp_str = human_time(self.max_time_stamp)
        self.consume_time_stamp_str = human_time(self.consume_time_stamp)
        return self


@attrs.define
class QueryConsumeTimeSpanBody:
    """QUERY_CONSUME_TIME_SPAN (303)."""

    consume_time_span_set: list[QueueTimeSpan] = attrs.Factory(list)


@attrs.define
class BrokerStatsItem:
    sum: int = 0
    tps: float = 0.0
    avgpt: float = 0.0


@attrs.define
class BrokerStatsData:
    """VIEW_BROKER_STATS_DATA (315)."""

    stats_minute: BrokerStatsItem = attrs.Factory(BrokerStatsItem)
    stats_hour: BrokerStatsItem = attrs.Factory(BrokerStatsItem)
    stats_day: BrokerStatsItem = attrs.Factory(BrokerStatsItem)


@attrs.define
class ProcessQueueInfo:
    """One queue of GET_CONSUMER_RUNNING_INFO's ``mqTable`` (Java's field names, ``droped``)."""

    commit_offset: int = 0
    cached_msg_min_offset: int = 0
    cached_msg_max_offset: int = 0
    cached_msg_count: int = 0
    cached_msg_size_in_mi_b: int = attrs.field(default=0, metadata={"key": "cachedMsgSizeInMiB"})
    transaction_msg_min_offset: int = 0
    transaction_msg_max_offset: int = 0
    transaction_msg_count: int = 0
    locked: bool = False
    try_unlock_times: int = 0
    last_lock_timestamp: int = 0
    droped: bool = False
    last_pull_timestamp: int = 0
    last_consume_timestamp: int = 0


@attrs.define
class ConsumeStatus:
    pull_rt: float = attrs.field(default=0.0, metadata={"key": "pullRT"})
    pull_tps: float = attrs.field(default=0.0, metadata={"key": "pullTPS"})
    consume_rt: float = attrs.field(default=0.0, metadata={"key": "consumeRT"})
    consume_ok_tps: float = attrs.field(default=0.0, metadata={"key": "consumeOKTPS"})
    consume_failed_tps: float = attrs.field(default=0.0, metadata={"key": "consumeFailedTPS"})
    consume_failed_msgs: int = 0


@attrs.define
class ConsumerRunningInfo:
    """GET_CONSUMER_RUNNING_INFO (307), as a client answers it."""

    properties: dict[str, str] = attrs.Factory(dict)
    subscription_set: list[SubscriptionData] = attrs.Factory(list)
    mq_table: dict[MessageQueue, ProcessQueueInfo] = attrs.Factory(dict)
    status_table: dict[str, ConsumeStatus] = attrs.Factory(dict)
    jstack: str | None = None


@attrs.define
class ConsumeMessageDirectlyResult:
    """CONSUME_MESSAGE_DIRECTLY (309), as a client answers it."""

    order: bool = False
    auto_commit: bool = True
    consume_result: str = "CR_SUCCESS"
    remark: str | None = None
    spent_time_mills: int = 0
