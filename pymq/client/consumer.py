"""The pymq consumers: PushConsumer (clustering or broadcasting) and PullConsumer.

::

    async def handle(msgs: list[MessageExt]) -> bool:   # False or an exception: retry later
        ...

    async with PushConsumer("my-group", "127.0.0.1:9876", handle) as consumer:
        await consumer.subscribe("TopicTest", "TagA || TagB")
        await consumer.subscribe("Orders", MessageSelector.by_sql("amount > 100"))
        await trio.sleep_forever()

A push consumer allocates queues among the group's members averagely (rebalancing every 20 s and
at once when the broker says the group changed), long-polls each queue it owns, hands messages
to the handler in order, commits offsets every 5 s and when it gives a queue up, and sends a
failed message back to the broker (retry topic, delay levels, DLQ after the maximum).

``PushConsumer(..., orderly=True)`` consumes each queue in order, as Java's
``MessageListenerOrderly``: in clustering mode a queue is locked at its broker (LOCK_BATCH_MQ)
before it is pulled and relocked every ``lock_interval``, so that no other member of the group
consumes it meanwhile; the handler gets one batch of a queue at a time (different queues run
concurrently); a batch that fails suspends its queue for ``suspend_current_queue_ms`` and is
handed over again, the same messages with ``reconsume_times`` counted up, until it succeeds or
a message has been retried ``max_reconsume_times`` times (unbounded by default): that message
goes to ``%DLQ%<group>`` and the queue moves on.  The queue's offset advances only past batches
that succeeded (or went to the DLQ).  A queue given up in a rebalance, or at shutdown, is
committed and then unlocked (UNLOCK_BATCH_MQ), after its running batch ends.

A broadcasting consumer keeps its offsets in a local file (pymq.client.offset_store, Java's
LocalFileOffsetStore), read at start and written every ``persist_interval`` and at shutdown.

A :class:`MessageSelector` chooses messages by tag or by an SQL92 expression over their
properties, which the broker evaluates (it needs ``enablePropertyFilter=true``; a consumer
subscribing by SQL92 asks each broker of the topic first, CHECK_CLIENT_CONFIG, and fails with
the broker's answer, as Java's ``consumer.start()`` does).

It answers the broker's calls as Java's client does: RESET_CONSUMER_CLIENT_OFFSET (an operator
reset the group's offsets: the queues named are pulled again from the new offsets),
GET_CONSUMER_RUNNING_INFO (its settings, subscriptions and queues, for ``mqadmin
consumerStatus``) and CONSUME_MESSAGE_DIRECTLY (one message handed to the handler, for
``mqadmin consumeMessage`` and the console's resend).
"""

from __future__ import annotations

import contextlib
import logging
import math
import ssl
import time
from collections.abc import Awaitable, Callable

import attrs
import trio

from pymq.client.instance import (
    ClientService,
    Credentials,
    MQClientError,
    decode_answer,
    inflate_body,
)
from pymq.client.offset_store import DEFAULT_DIR as DEFAULT_OFFSET_STORE_DIR
from pymq.client.offset_store import LocalFileOffsetStore, check_path_name
from pymq.common.consumer import (
    EXPRESSION_TYPE_SQL92,
    EXPRESSION_TYPE_TAG,
    CheckClientRequestBody,
    ConsumeFromWhere,
    ConsumerData,
    ConsumerList,
    ConsumeType,
    HeartbeatData,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageModel,
    MessageQueue,
    SubscriptionData,
    UnlockBatchRequestBody,
)
from pymq.common.message_ext import PROPERTY_RETRY_TOPIC, MessageExt, MessageSysFlag
from pymq.common.record import RecordError, decode_record, decode_records
from pymq.common.serde import to_json
from pymq.common.topic import RETRY_GROUP_TOPIC_PREFIX, retry_topic
from pymq.remoting import headers as H
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.remoting.errors import RemotingError
from pymq.remoting.protocol import fastjson
from pymq.remoting.protocol.body import (
    ConsumeMessageDirectlyResult,
    ConsumerRunningInfo,
    ConsumeStatus,
    GetConsumerStatusBody,
    ProcessQueueInfo,
)

log = logging.getLogger(__name__)

Handler = Callable[[list[MessageExt]], Awaitable[bool | None]]

# DefaultMQPushConsumer defaults.
REBALANCE_PERIOD = 20.0
PERSIST_OFFSET_PERIOD = 5.0
HEARTBEAT_PERIOD = 30.0
PULL_BATCH_SIZE = 32
# A pulled message's compressed body inflates to at most this (Java checks maxMessageSize,
# 4 MiB by default, before compressing; this leaves room for producers set higher).
MAX_INFLATED_BODY = 64 * 1024 * 1024
BROKER_SUSPEND_MAX_MS = 15000
PULL_TIMEOUT = 30.0
PULL_RETRY_DELAY = 3.0  # after an error, as PULL_TIME_DELAY_MILLS_WHEN_EXCEPTION
LOCAL_RETRY_DELAY = 5.0  # a failed message that could not be sent back is consumed again
# maxReconsumeTimes -1 means 16 for a concurrent consumer, Integer.MAX_VALUE for an orderly one.
MAX_RECONSUME_TIMES_CONCURRENTLY = 16
MAX_RECONSUME_TIMES_ORDERLY = 2**31 - 1

# Orderly consumption (ProcessQueue, ConsumeMessageOrderlyService, RebalancePushImpl).
REBALANCE_LOCK_INTERVAL = 20.0  # every queue's lock renewed (lockMQPeriodically)
REBALANCE_LOCK_MAX_LIVE = 30.0  # a lock not renewed for this long is not trusted to consume
LOCK_FIRST_DELAY = 1.0  # the first renewal, after start
LOCK_TIMEOUT = 1.0  # LOCK_BATCH_MQ / UNLOCK_BATCH_MQ round trip
LOCK_RETRY_DELAY = 3.0  # a queue whose lock was refused is tried again after this
SUSPEND_CURRENT_QUEUE_MS = 1000  # suspendCurrentQueueTimeMillis: a failed batch's pause
SUSPEND_MIN_MS, SUSPEND_MAX_MS = 10, 30000  # the pause is kept within these
RELEASE_WAIT = 1.0  # how long a rebalance waits for a queue's handler before trying later

# The remark Java's client leaves on its answers to the broker's calls.
NOT_SET_REMARK = "not set any response code"
CLIENT_VERSION_DESC = "V4_9_4"

# PullSysFlag bits.
FLAG_COMMIT_OFFSET = 0x1
FLAG_SUSPEND = 0x2
FLAG_SUBSCRIPTION = 0x4


@attrs.frozen
class MessageSelector:
    """How a consumer selects messages: by tag (``"TagA || TagB"``, ``"*"``) or by an SQL92
    expression over message properties (``"a > 5 AND region = 'eu'"``), as Java's
    ``MessageSelector.byTag`` / ``bySql``."""

    expression_type: str
    expression: str

    @classmethod
    def by_sql(cls, sql: str) -> MessageSelector:
        return cls(EXPRESSION_TYPE_SQL92, sql)

    @classmethod
    def by_tag(cls, tag: str = "*") -> MessageSelector:
        return cls(EXPRESSION_TYPE_TAG, tag or "*")

    @property
    def is_tag(self) -> bool:
        return self.expression_type == EXPRESSION_TYPE_TAG

    def subscription(self, topic: str, version: int = 0) -> SubscriptionData:
        if self.is_tag:
            return SubscriptionData.build(topic, self.expression, version)
        return SubscriptionData.build(topic, self.expression, version, self.expression_type)


Selector = str | MessageSelector | None


def as_selector(expression: Selector) -> MessageSelector:
    if isinstance(expression, MessageSelector):
        return expression
    return MessageSelector.by_tag(expression or "*")


@attrs.define
class PullResult:
    status: str  # FOUND, NO_NEW_MSG, NO_MATCHED_MSG, OFFSET_ILLEGAL
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageExt]
    suggest_broker_id: int = 0


_PULL_STATUS: dict[int, str] = {
    ResponseCode.SUCCESS: "FOUND",
    ResponseCode.PULL_NOT_FOUND: "NO_NEW_MSG",
    ResponseCode.PULL_RETRY_IMMEDIATELY: "NO_MATCHED_MSG",
    ResponseCode.PULL_OFFSET_MOVED: "OFFSET_ILLEGAL",
}


def allocate_averagely(mqs: list[MessageQueue], cids: list[str], me: str) -> list[MessageQueue]:
    """AllocateMessageQueueAveragely: contiguous, nearly equal shares in sorted order."""
    mqs, cids = sorted(mqs), sorted(cids)
    if me not in cids or not mqs:
        return []
    index, n_mq, n_c = cids.index(me), len(mqs), len(cids)
    mod = n_mq % n_c
    if n_mq <= n_c:
        average = 1
    elif mod > 0 and index < mod:
        average = n_mq // n_c + 1
    else:
        average = n_mq // n_c
    start = index * average if mod > 0 and index < mod else index * average + mod
    return [mqs[(start + i) % n_mq] for i in range(min(average, n_mq - start))]


class _Base(ClientService):
    """Name-server and broker plumbing shared by both consumers."""

    def __init__(
        self,
        group: str,
        namesrv_addr: str,
        *,
        credentials: Credentials | None = None,
        tls: bool | ssl.SSLContext = False,
        instance_name: str | None = None,
    ) -> None:
        super().__init__(
            group, namesrv_addr, credentials=credentials, tls=tls, instance_name=instance_name
        )
        # Which broker of a group to pull each queue from next (the broker's suggestWhichBrokerId).
        self.pull_from: dict[MessageQueue, int] = {}

    async def _broker(self, mq: MessageQueue, broker_id: int = 0) -> str:
        """The address to use for ``mq``: the wanted broker of its group, else the master, else
        any slave (a consumer keeps reading from a slave while the master is down)."""
        assert self.client is not None
        addr = self.client.broker_addr(mq.broker_name, broker_id)
        if addr is None:
            await self.client.fetch_route(mq.topic)
            addr = self.client.broker_addr(mq.broker_name, broker_id)
        if addr is None:
            raise MQClientError(-1, f"no address for broker {mq.broker_name}")
        return addr

    async def _call(
        self, mq: MessageQueue, request: RemotingCommand, timeout: float = 5.0, broker_id: int = 0
    ) -> RemotingCommand:
        """Call the broker of ``mq``; after a connection failure, refresh the route (the broker
        may have gone, and a slave may serve) and try once more."""
        assert self.client is not None
        try:
            return await self.client.invoke(await self._broker(mq, broker_id), request, timeout)
        except RemotingError:
            with contextlib.suppress(MQClientError, RemotingError):
                await self.client.fetch_route(mq.topic)
            return await self.client.invoke(await self._broker(mq, broker_id), request, timeout)

    async def fetch_subscribe_message_queues(self, topic: str) -> list[MessageQueue]:
        assert self.client is not None
        route = await self.client.fetch_route(topic)
        if route is None:
            raise MQClientError(ResponseCode.TOPIC_NOT_EXIST, f"no route for topic {topic}")
        return [MessageQueue(topic, n, q) for n, q in self.client.readable_queues(route)]

    async def pull(
        self,
        mq: MessageQueue,
        expression: Selector,
        offset: int,
        max_nums: int = PULL_BATCH_SIZE,
        *,
        suspend_ms: int = 0,
        commit_offset: int = -1,
        timeout: float = 10.0,
        registered_version: int | None = None,
    ) -> PullResult:
        """One PULL_MESSAGE; with ``suspend_ms`` the broker holds it until a message arrives.

        ``expression`` is a tag expression or a :class:`MessageSelector`; it travels in the
        request, unless ``registered_version`` is given: then the broker filters by the
        subscription of that version the group's heartbeat registered (as Java's push
        consumer pulls)."""
        selector = as_selector(expression)
        sys_flag = 0 if registered_version is not None else FLAG_SUBSCRIPTION
        if suspend_ms:
            sys_flag |= FLAG_SUSPEND
        if commit_offset > 0:
            sys_flag |= FLAG_COMMIT_OFFSET
        request = RemotingCommand.request(
            RequestCode.PULL_MESSAGE,
            H.encode(
                H.PullMessageRequestHeader(
                    consumer_group=self.group,
                    topic=mq.topic,
                    queue_id=mq.queue_id,
                    queue_offset=offset,
                    max_msg_nums=max_nums,
                    sys_flag=sys_flag,
                    commit_offset=max(commit_offset, 0),
                    suspend_timeout_millis=suspend_ms,
                    subscription=None if registered_version is not None else selector.expression,
                    sub_version=registered_version or 0,
                    expression_type=selector.expression_type,
                )
            ),
        )
        response = await self._call(mq, request, timeout, self.pull_from.get(mq, 0))
        status = _PULL_STATUS.get(response.code)
        if status is None:
            raise MQClientError(response.code, response.remark, f"pull {mq}")
        try:
            head = H.decode(H.PullMessageResponseHeader, response.ext_fields)
        except H.HeaderError as exc:
            raise MQClientError(response.code, str(exc), f"pull {mq}") from None
        suggest = head.suggest_which_broker_id
        self.pull_from[mq] = suggest
        messages: list[MessageExt] = []
        if status == "FOUND":
            # Tags are checked again here (the broker matched hash codes); an SQL92 selection
            # is the broker's alone.
            subscription = selector.subscription(mq.topic)
            for msg in decode_records(response.body):
                if msg.sys_flag & MessageSysFlag.COMPRESSED_FLAG:
                    try:
                        msg.body = inflate_body(msg.body, MAX_INFLATED_BODY)
                    except ValueError as exc:
                        # Java's decoder drops such a message (and the rest of the batch):
                        # this one only, said.
                        log.error("%s offset %d skipped: %s", mq, msg.queue_offset, exc)
                        continue
                tags = msg.tags
                if (
                    not subscription.is_tag_type
                    or subscription.matches_all
                    or (tags is not None and tags in subscription.tags_set)
                ):
                    messages.append(msg)
        return PullResult(
            status, head.next_begin_offset, head.min_offset, head.max_offset, messages, suggest
        )

    async def check_client_config(self, subscription: SubscriptionData) -> None:
        """CHECK_CLIENT_CONFIG to the master of each broker that hosts the topic: can it filter
        by this subscription?  Raises MQClientError with the broker's refusal."""
        assert self.client is not None
        route = await self.client.fetch_route(subscription.topic)
        if route is None:
            return  # Java checks only brokers the route names
        body = to_json(CheckClientRequestBody(self.client.client_id, self.group, subscription))
        for data in route.broker_datas:
            addr = self.client.master_addr(data.broker_name)
            if addr is None:
                continue
            request = RemotingCommand.request(RequestCode.CHECK_CLIENT_CONFIG, body=body)
            response = await self.client.invoke(addr, request, 3.0)
            if response.code != ResponseCode.SUCCESS:
                raise MQClientError(
                    response.code,
                    f"Check client in broker error, maybe because you use "
                    f"{subscription.expression_type} to filter message, but server has not "
                    f"been upgraded to support!{response.remark}",
                    f"check client config on {data.broker_name}",
                )

    async def query_offset(self, mq: MessageQueue) -> int:
        """The group's committed offset for ``mq``, or -1 when it has none."""
        request = RemotingCommand.request(
            RequestCode.QUERY_CONSUMER_OFFSET,
            H.encode(H.QueryConsumerOffsetRequestHeader(self.group, mq.topic, mq.queue_id)),
        )
        response = await self._call(mq, request)
        if response.code == ResponseCode.QUERY_NOT_FOUND:
            return -1
        if response.code != ResponseCode.SUCCESS:
            raise MQClientError(response.code, response.remark, f"query offset {mq}")
        return _offset_of(response, f"query offset {mq}")

    async def update_offset(self, mq: MessageQueue, offset: int) -> None:
        request = RemotingCommand.request(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            H.encode(
                H.UpdateConsumerOffsetRequestHeader(self.group, mq.topic, mq.queue_id, offset)
            ),
        )
        response = await self._call(mq, request)
        if response.code != ResponseCode.SUCCESS:
            raise MQClientError(response.code, response.remark, f"update offset {mq}")

    async def max_offset(self, mq: MessageQueue) -> int:
        request = RemotingCommand.request(
            RequestCode.GET_MAX_OFFSET, H.encode(H.TopicQueueHeader(mq.topic, mq.queue_id))
        )
        response = await self._call(mq, request)
        if response.code != ResponseCode.SUCCESS:
            raise MQClientError(response.code, response.remark, f"max offset {mq}")
        return _offset_of(response, f"max offset {mq}")

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        request = RemotingCommand.request(
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
            H.encode(H.SearchOffsetRequestHeader(mq.topic, mq.queue_id, timestamp_ms)),
        )
        response = await self._call(mq, request)
        if response.code != ResponseCode.SUCCESS:
            raise MQClientError(response.code, response.remark, f"search offset {mq}")
        return _offset_of(response, f"search offset {mq}")


class PullConsumer(_Base):
    """Pull messages from queues you choose; offsets are yours to keep (or commit).

    ``pull(mq, selector, offset)`` selects by the selector it is given; ``subscribe(topic,
    selector)`` sets the one used when ``pull`` is given None for that topic."""

    def __init__(
        self,
        group: str,
        namesrv_addr: str,
        *,
        credentials: Credentials | None = None,
        tls: bool | ssl.SSLContext = False,
    ) -> None:
        super().__init__(group, namesrv_addr, credentials=credentials, tls=tls)
        self.selectors: dict[str, MessageSelector] = {}

    async def subscribe(self, topic: str, expression: Selector = "*") -> None:
        self.selectors[topic] = as_selector(expression)

    async def pull(
        self,
        mq: MessageQueue,
        expression: Selector,
        offset: int,
        max_nums: int = PULL_BATCH_SIZE,
        *,
        suspend_ms: int = 0,
        commit_offset: int = -1,
        timeout: float = 10.0,
        registered_version: int | None = None,
    ) -> PullResult:
        if expression is None:
            expression = self.selectors.get(mq.topic)
        return await super().pull(
            mq,
            expression,
            offset,
            max_nums,
            suspend_ms=suspend_ms,
            commit_offset=commit_offset,
            timeout=timeout,
            registered_version=registered_version,
        )

    async def _started(self) -> None:
        assert self.client is not None
        await self.client.send_heartbeat(
            HeartbeatData(
                self.client.client_id,
                [],
                [ConsumerData(self.group, ConsumeType.CONSUME_ACTIVELY)],
            ),
            all_brokers=True,
        )


@attrs.define
class _TopicCounters:
    """What ConsumerStatsManager counts for one topic: found pulls and their round trips,
    messages pulled, consumed and failed, handler calls and their time."""

    pulls: int = 0
    pull_rt_ms: float = 0.0
    pulled: int = 0
    ok: int = 0
    failed: int = 0
    calls: int = 0
    consume_rt_ms: float = 0.0

    def copy(self) -> _TopicCounters:
        return attrs.evolve(self)


def _offset_of(response: RemotingCommand, what: str) -> int:
    """A SUCCESS answer's ``offset`` header; MQClientError when it has none that is a number
    (a failed call, which the caller's loop retries, not an error that ends the consumer)."""
    try:
        return int(response.ext_fields["offset"])
    except (KeyError, ValueError):
        raise MQClientError(
            response.code, f"no offset in the answer: {response.ext_fields!r}", what
        ) from None


@attrs.define(eq=False)
class _OrderlyQueue:
    """What an orderly consumer keeps of a queue it owns (Java's ProcessQueue's lock state):
    whether the broker granted it the queue and when, whether it was given up, and the lock
    held while its handler runs (a rebalance or shutdown waits on it, so that it never gives
    a queue up in the middle of a batch)."""

    locked: bool = False
    last_lock: float = -math.inf  # trio.current_time() of the last grant
    last_lock_ms: int = 0  # the wall-clock time of that grant, for GET_CONSUMER_RUNNING_INFO
    dropped: bool = False
    try_unlock_times: int = 0
    consuming: trio.Lock = attrs.Factory(trio.Lock)

    def granted(self) -> None:
        self.locked = True
        self.last_lock = trio.current_time()
        self.last_lock_ms = int(time.time() * 1000)


class PushConsumer(_Base):
    """A consumer the broker pushes to (long polling): ``handler`` gets each batch and answers
    False (or raises) for a failure.

    ``message_model``: CLUSTERING (the group's members share the queues, offsets on the
    broker) or BROADCASTING (every member reads every queue, offsets in a local file under
    ``local_offset_store_dir``, default ``~/.rocketmq_offsets``, in ``<clientId>/<group>/``:
    give a fixed ``instance_name`` for a restarted consumer to find them).
    ``batch_size`` is consumeMessageBatchMaxSize, ``pull_batch_size`` pullBatchSize.
    ``max_reconsume_times``: -1 (the default) means 16 concurrently, unbounded when orderly.

    ``orderly=True``: each queue consumed in order, one batch at a time, a failed batch retried
    in place (see the module's documentation); ``suspend_current_queue_ms`` (10 to 30000,
    default 1000) is the pause before a failed batch is handed over again, ``lock_interval``
    (20 s) how often the queues' broker locks are renewed, ``lock_max_live`` (30 s) how old a
    lock may be for its queue to be consumed.  ``rebalance_interval`` (20 s) and
    ``persist_interval`` (5 s) are the periods of rebalancing and of committing offsets.
    """

    def __init__(
        self,
        group: str,
        namesrv_addr: str,
        handler: Handler,
        *,
        message_model: MessageModel = MessageModel.CLUSTERING,
        consume_from: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
        consume_timestamp_ms: int = 0,
        batch_size: int = 1,
        pull_batch_size: int = PULL_BATCH_SIZE,
        max_reconsume_times: int = -1,
        orderly: bool = False,
        suspend_current_queue_ms: int = SUSPEND_CURRENT_QUEUE_MS,
        lock_interval: float = REBALANCE_LOCK_INTERVAL,
        lock_max_live: float = REBALANCE_LOCK_MAX_LIVE,
        rebalance_interval: float = REBALANCE_PERIOD,
        persist_interval: float = PERSIST_OFFSET_PERIOD,
        local_offset_store_dir: str | None = None,
        instance_name: str | None = None,
        credentials: Credentials | None = None,
        tls: bool | ssl.SSLContext = False,
    ) -> None:
        super().__init__(
            group, namesrv_addr, credentials=credentials, tls=tls, instance_name=instance_name
        )
        for name, period in (
            ("lock_interval", lock_interval),
            ("lock_max_live", lock_max_live),
            ("rebalance_interval", rebalance_interval),
            ("persist_interval", persist_interval),
        ):
            if not period > 0:
                raise ValueError(f"{name} must be positive, not {period}")
        if max_reconsume_times < -1:
            raise ValueError(f"max_reconsume_times must be -1 or more, not {max_reconsume_times}")
        if message_model is MessageModel.BROADCASTING:
            # Both name directories of the local offsets store.
            check_path_name("consumer group", group)
            if instance_name is not None:
                check_path_name("instance name", instance_name)
        self.handler = handler
        self.message_model = message_model
        self.consume_from = consume_from
        self.consume_timestamp_ms = consume_timestamp_ms or int(time.time() * 1000) - 30 * 60_000
        self.batch_size = batch_size
        self.pull_batch_size = pull_batch_size
        self.max_reconsume_times = max_reconsume_times
        self.orderly = orderly
        self.suspend_current_queue_ms = suspend_current_queue_ms
        self.lock_interval = lock_interval
        self.lock_max_live = lock_max_live
        self.rebalance_interval = rebalance_interval
        self.persist_interval = persist_interval
        self.local_offset_store_dir = local_offset_store_dir or DEFAULT_OFFSET_STORE_DIR
        # A broadcasting consumer's offsets file, opened at start (it needs the client id).
        self.local_offsets: LocalFileOffsetStore | None = None
        # An orderly consumer's queues (all it owns); locked at the broker when clustering.
        self.orderly_queues: dict[MessageQueue, _OrderlyQueue] = {}
        self.subscriptions: dict[str, SubscriptionData] = {}
        self.assigned: dict[MessageQueue, trio.CancelScope] = {}
        self.offsets: dict[MessageQueue, int] = {}
        self._committed: dict[MessageQueue, int] = {}
        self._rebalance_now = trio.Event()
        self.rebalanced = trio.Event()
        # Rebalances, lock renewals and stopping take turns; once stopping, neither runs again
        # (an unlocked queue must not be locked again on the way out).
        self._queues_lock = trio.Lock()
        self._closing = False
        self.start_timestamp = 0
        # Per topic counters for GET_CONSUMER_RUNNING_INFO's statusTable, and what they were
        # (with when) at the previous such request: the rates cover the time between.
        self._counters: dict[str, _TopicCounters] = {}
        self._counted_at: tuple[float, dict[str, _TopicCounters]] = (time.monotonic(), {})

    @property
    def clustering(self) -> bool:
        return self.message_model is MessageModel.CLUSTERING

    @property
    def locks_queues(self) -> bool:
        """An orderly clustering consumer locks its queues at the brokers."""
        return self.orderly and self.clustering

    @property
    def effective_max_reconsume_times(self) -> int:
        """getMaxReconsumeTimes(): -1 is 16 concurrently, Integer.MAX_VALUE when orderly."""
        if self.max_reconsume_times != -1:
            return self.max_reconsume_times
        if self.orderly:
            return MAX_RECONSUME_TIMES_ORDERLY
        return MAX_RECONSUME_TIMES_CONCURRENTLY

    async def subscribe(self, topic: str, expression: Selector = "*") -> None:
        """Consume ``topic``, by tag (``"TagA || TagB"``) or by a :class:`MessageSelector`.
        An SQL92 subscription is checked with the topic's brokers when the consumer is running
        (else at start): MQClientError if one refuses it."""
        subscription = as_selector(expression).subscription(topic, int(time.time() * 1000))
        if self.client is not None and not subscription.is_tag_type:
            await self.check_client_config(subscription)
        self.subscriptions[topic] = subscription
        if self.clustering:
            retry = retry_topic(self.group)
            self.subscriptions.setdefault(retry, SubscriptionData.build(retry, "*"))
        if self.client is not None:
            await self._refresh_routes()
            await self._heartbeat()
            self._rebalance_now.set()

    async def _started(self) -> None:
        assert self._nursery is not None and self.client is not None
        for subscription in list(self.subscriptions.values()):
            if not subscription.is_tag_type:
                await self.check_client_config(subscription)
        self.start_timestamp = int(time.time() * 1000)
        if not self.clustering:
            store = LocalFileOffsetStore(
                self.local_offset_store_dir, self.client.client_id, self.group
            )
            await trio.to_thread.run_sync(store.load)
            self.local_offsets = store
        self.client.on_ids_changed = lambda group: self._rebalance_now.set()
        handlers = self.client.request_handlers
        handlers[RequestCode.RESET_CONSUMER_CLIENT_OFFSET] = self._reset_offset_request
        handlers[RequestCode.GET_CONSUMER_RUNNING_INFO] = self._running_info_request
        handlers[RequestCode.CONSUME_MESSAGE_DIRECTLY] = self._consume_directly_request
        handlers[RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT] = self._status_request
        self._nursery.start_soon(self._rebalance_loop)
        self._nursery.start_soon(self._persist_loop)
        self._nursery.start_soon(self._heartbeat_loop)
        if self.locks_queues:
            self._nursery.start_soon(self._lock_loop)

    async def _stopping(self) -> None:
        # An orderly consumer lets each queue's running batch end (for at most half the stop
        # deadline), so that what was consumed is committed, and then unlocks its queues.
        with trio.move_on_after(self.STOP_DEADLINE / 2):
            await self._queues_lock.acquire()
        self._closing = True
        with trio.move_on_after(self.STOP_DEADLINE / 2):
            for state in self.orderly_queues.values():
                state.dropped = True
            for mq, state in list(self.orderly_queues.items()):
                async with state.consuming:
                    scope = self.assigned.get(mq)
                    if scope is not None:
                        scope.cancel()
        for scope in self.assigned.values():
            scope.cancel()
        await self.persist_offsets()
        if self.locks_queues:
            await self.unlock_all()

    def _consumer_data(self) -> ConsumerData:
        return ConsumerData(
            self.group,
            ConsumeType.CONSUME_PASSIVELY,
            self.message_model,
            self.consume_from,
            list(self.subscriptions.values()),
        )

    async def _heartbeat(self) -> None:
        assert self.client is not None
        await self.client.send_heartbeat(
            HeartbeatData(self.client.client_id, [], [self._consumer_data()]), all_brokers=True
        )

    async def _refresh_routes(self) -> None:
        assert self.client is not None
        for topic in self.subscriptions:
            try:
                await self.client.fetch_route(topic)
            except MQClientError as exc:
                log.warning("route of %s: %s", topic, exc)

    async def _heartbeat_loop(self) -> None:
        while True:
            await trio.sleep(HEARTBEAT_PERIOD)
            await self._refresh_routes()
            await self._heartbeat()

    async def _persist_loop(self) -> None:
        while True:
            await trio.sleep(self.persist_interval)
            await self.persist_offsets()

    async def persist_offsets(self) -> None:
        """Commit the owned queues' offsets: to the brokers, or (broadcasting) to the local
        offsets file."""
        if self.local_offsets is not None:
            try:
                await self.local_offsets.persist(dict(self.offsets))
            except OSError as exc:
                log.warning("persisting offsets to %s failed: %s", self.local_offsets.path, exc)
            return
        if not self.clustering:
            return
        for mq, offset in list(self.offsets.items()):
            if self._committed.get(mq) == offset:
                continue
            try:
                await self.update_offset(mq, offset)
                self._committed[mq] = offset
            except (MQClientError, RemotingError) as exc:
                log.warning("persisting offset of %s failed: %s", mq, exc)

    # -- the broker's calls ---------------------------------------------------------------

    async def _reset_offset_request(self, req: RemotingCommand) -> RemotingCommand | None:
        """RESET_CONSUMER_CLIENT_OFFSET (oneway): move the named queues' offsets."""
        if req.ext_fields.get("group") != self.group:
            return None
        try:
            table = fastjson.loads(req.body).get("offsetTable", {})
            offsets = {
                MessageQueue(k["topic"], k["brokerName"], int(k["queueId"])): int(v)
                for k, v in table.items()
            }
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("bad reset-offset request from the broker: %s", exc)
            return None
        await self.reset_offsets(offsets)
        return None

    async def reset_offsets(self, offsets: dict[MessageQueue, int]) -> None:
        """Pull each queue of ``offsets`` this consumer owns again from its new offset (the
        queue's pull is restarted, messages in flight are dropped; an orderly queue's running
        batch is let end first), and commit it."""
        assert self._nursery is not None
        for mq, offset in offsets.items():
            scope = self.assigned.get(mq)
            if scope is None:
                continue
            state = self.orderly_queues.get(mq)
            if state is not None:
                async with state.consuming:
                    scope.cancel()
            scope.cancel()
            self.offsets[mq] = offset
            if self.clustering:
                try:
                    await self.update_offset(mq, offset)
                    self._committed[mq] = offset
                except (MQClientError, RemotingError) as exc:
                    log.warning("committing reset offset of %s failed: %s", mq, exc)
            if self.assigned.get(mq) is not scope:
                continue  # given up meanwhile
            new_scope = trio.CancelScope()
            self.assigned[mq] = new_scope
            self._nursery.start_soon(self._pull_loop, mq, new_scope)
            log.info("%s reset %s to offset %d", self.group, mq, offset)

    async def _status_request(self, req: RemotingCommand) -> RemotingCommand:
        """GET_CONSUMER_STATUS_FROM_CLIENT: this consumer's offsets of the topic."""
        topic = req.ext_fields.get("topic", "")
        body = GetConsumerStatusBody(
            {mq: offset for mq, offset in sorted(self.offsets.items()) if mq.topic == topic}
        )
        return req.response(remark=NOT_SET_REMARK, body=fastjson.dumps(body))

    def _topic_counters(self, topic: str) -> _TopicCounters:
        counters = self._counters.get(topic)
        if counters is None:
            counters = self._counters[topic] = _TopicCounters()
        return counters

    def consume_status(self) -> dict[str, ConsumeStatus]:
        """Each topic's ConsumeStatus since the previous call (at least a second): messages
        pulled and consumed per second, the average pull and handler times (ms), and the
        messages that failed since the consumer started."""
        now = time.monotonic()
        then, before = self._counted_at
        elapsed = max(now - then, 1.0)
        status = {}
        for topic, c in self._counters.items():
            p = before.get(topic, _TopicCounters())
            pulls, calls = c.pulls - p.pulls, c.calls - p.calls
            status[topic] = ConsumeStatus(
                pull_rt=(c.pull_rt_ms - p.pull_rt_ms) / pulls if pulls else 0.0,
                pull_tps=(c.pulled - p.pulled) / elapsed,
                consume_rt=(c.consume_rt_ms - p.consume_rt_ms) / calls if calls else 0.0,
                consume_ok_tps=(c.ok - p.ok) / elapsed,
                consume_failed_tps=(c.failed - p.failed) / elapsed,
                consume_failed_msgs=c.failed,
            )
        self._counted_at = (now, {t: c.copy() for t, c in self._counters.items()})
        return status

    async def _running_info_request(self, req: RemotingCommand) -> RemotingCommand:
        """GET_CONSUMER_RUNNING_INFO: settings, subscriptions and owned queues."""
        assert self.client is not None
        now = int(time.time() * 1000)
        info = ConsumerRunningInfo(
            properties={
                "consumerGroup": self.group,
                "messageModel": self.message_model.value,
                "consumeFromWhere": self.consume_from.value,
                "consumeMessageBatchMaxSize": str(self.batch_size),
                "pullBatchSize": str(self.pull_batch_size),
                "maxReconsumeTimes": str(self.max_reconsume_times),
                "PROP_CONSUME_TYPE": "CONSUME_PASSIVELY",
                "PROP_CONSUMEORDERLY": "true" if self.orderly else "false",
                "suspendCurrentQueueTimeMillis": str(self.suspend_current_queue_ms),
                "PROP_CLIENT_VERSION": CLIENT_VERSION_DESC,
                "PROP_CONSUMER_START_TIMESTAMP": str(self.start_timestamp),
                "PROP_NAMESERVER_ADDR": self.namesrv_addr,
                "PROP_THREADPOOL_CORE_SIZE": "1",
            },
            subscription_set=list(self.subscriptions.values()),
            mq_table={mq: self._process_queue_info(mq, now) for mq in sorted(self.assigned)},
            status_table=self.consume_status(),
        )
        return req.response(remark=NOT_SET_REMARK, body=fastjson.dumps(info))

    def _process_queue_info(self, mq: MessageQueue, now: int) -> ProcessQueueInfo:
        info = ProcessQueueInfo(
            commit_offset=self._committed.get(mq, self.offsets.get(mq, 0)),
            last_pull_timestamp=now,
            last_consume_timestamp=now,
        )
        state = self.orderly_queues.get(mq)
        if state is not None:
            info.locked = state.locked
            info.last_lock_timestamp = state.last_lock_ms
            info.try_unlock_times = state.try_unlock_times
            info.droped = state.dropped
        return info

    async def _consume_directly_request(self, req: RemotingCommand) -> RemotingCommand:
        """CONSUME_MESSAGE_DIRECTLY: hand the message in the body to the handler once."""
        try:
            msg = decode_record(req.body)
        except (RecordError, ValueError, IndexError) as exc:
            return req.response(ResponseCode.SYSTEM_ERROR, f"bad message: {exc}")
        begin = time.monotonic()
        result = ConsumeMessageDirectlyResult(order=self.orderly)
        try:
            ok = await self.handler([msg])
            result.consume_result = "CR_LATER" if ok is False else "CR_SUCCESS"
        except Exception as exc:  # the handler's failure is the answer
            result.consume_result = "CR_THROW_EXCEPTION"
            result.remark = f"{type(exc).__name__}: {exc}"
        result.spent_time_mills = int((time.monotonic() - begin) * 1000)
        return req.response(remark=NOT_SET_REMARK, body=fastjson.dumps(result))

    # -- rebalance ------------------------------------------------------------------------

    async def _rebalance_loop(self) -> None:
        while True:
            with trio.move_on_after(self.rebalance_interval):
                await self._rebalance_now.wait()
            self._rebalance_now = trio.Event()
            try:
                await self.rebalance()
            except (MQClientError, RemotingError) as exc:
                log.warning("rebalance of %s failed: %s", self.group, exc)

    async def _consumer_ids(self, topic: str) -> list[str]:
        assert self.client is not None
        route = self.client.routes.get(topic) or await self.client.fetch_route(topic)
        if route is None:
            return []
        for data in route.broker_datas:
            addr = data.select_broker_addr()
            if addr is None:
                continue
            request = RemotingCommand.request(
                RequestCode.GET_CONSUMER_LIST_BY_GROUP, H.encode(H.ConsumerGroupHeader(self.group))
            )
            response = await self.client.invoke(addr, request, 5.0)
            if response.code == ResponseCode.SUCCESS and response.body:
                return decode_answer(response.body, ConsumerList, "consumer list").consumer_id_list
        return []

    async def rebalance(self) -> None:
        async with self._queues_lock:
            if not self._closing:
                await self._rebalance()

    async def _rebalance(self) -> None:
        assert self.client is not None and self._nursery is not None
        wanted: set[MessageQueue] = set()
        for topic in self.subscriptions:
            try:
                mqs = await self.fetch_subscribe_message_queues(topic)
            except MQClientError:
                continue
            if self.clustering:
                cids = await self._consumer_ids(topic)
                wanted.update(allocate_averagely(mqs, cids, self.client.client_id))
            else:
                wanted.update(mqs)
        # A queue no longer ours is given up; so is an orderly queue given up before whose
        # handler was still running then (taken again below if it is still ours).
        for mq in [
            m
            for m in self.assigned
            if m not in wanted or (m in self.orderly_queues and self.orderly_queues[m].dropped)
        ]:
            await self._release(mq)
        for mq in sorted(wanted - set(self.assigned)):
            if self.orderly:
                state = self.orderly_queues[mq] = _OrderlyQueue()
                # RebalanceImpl: an orderly consumer takes a queue only once the broker has
                # locked it for this client (another member may still be consuming it).
                if self.locks_queues and not await self._lock_one(mq, state):
                    log.info("%s could not lock %s yet", self.client.client_id, mq)
                    del self.orderly_queues[mq]
                    continue
            try:
                offset = await self._start_offset(mq)
            except (MQClientError, RemotingError) as exc:
                log.warning("start offset of %s: %s", mq, exc)
                if self.orderly:
                    del self.orderly_queues[mq]
                    if self.locks_queues:
                        await self._unlock_batch(mq.broker_name, [mq])
                continue
            scope = trio.CancelScope()
            self.assigned[mq] = scope
            self.offsets[mq] = offset
            self._nursery.start_soon(self._pull_loop, mq, scope)
            log.info("%s took %s from offset %d", self.client.client_id, mq, offset)
        self.rebalanced.set()

    async def _release(self, mq: MessageQueue) -> None:
        """Give ``mq`` up: stop pulling it, commit its offset and (orderly) unlock it.

        An orderly queue's running batch is let end first (RebalancePushImpl's
        removeUnnecessaryMessageQueue): its handler is waited for at most RELEASE_WAIT; if it
        is still running, the queue stays, marked dropped (no further batch starts), and the
        next rebalance tries again."""
        assert self.client is not None
        state = self.orderly_queues.get(mq)
        if state is None:
            self._drop(mq)
            await self._commit_released(mq, self.offsets.pop(mq, None))
            return
        state.dropped = True
        with trio.move_on_after(RELEASE_WAIT):
            async with state.consuming:
                # No batch of the queue runs now, and none will start (dropped).
                self._drop(mq)
                await self._commit_released(mq, self.offsets.pop(mq, None))
                del self.orderly_queues[mq]
                if self.locks_queues:
                    await self._unlock_batch(mq.broker_name, [mq])
                return
        state.try_unlock_times += 1
        log.warning(
            "%s is consuming, so cannot unlock it yet (%d tries)", mq, state.try_unlock_times
        )

    def _drop(self, mq: MessageQueue) -> None:
        assert self.client is not None
        self.assigned.pop(mq).cancel()
        log.info("%s gave up %s", self.client.client_id, mq)

    async def _commit_released(self, mq: MessageQueue, offset: int | None) -> None:
        self._committed.pop(mq, None)
        if offset is None:
            return
        if self.local_offsets is not None:
            self.local_offsets.table[mq] = offset
        elif self.clustering:
            try:
                await self.update_offset(mq, offset)
            except (MQClientError, RemotingError) as exc:
                log.warning("committing %s on release failed: %s", mq, exc)

    # -- orderly: the brokers' queue locks --------------------------------------------------

    async def _master(self, mq: MessageQueue) -> str | None:
        """The master of ``mq``'s broker (locks are only the master's), or None."""
        assert self.client is not None
        addr = self.client.master_addr(mq.broker_name)
        if addr is None:
            with contextlib.suppress(MQClientError, RemotingError):
                await self.client.fetch_route(mq.topic)
            addr = self.client.master_addr(mq.broker_name)
        return addr

    async def _lock_batch(self, mqs: list[MessageQueue]) -> set[MessageQueue]:
        """LOCK_BATCH_MQ for ``mqs`` (all of one broker): the queues the broker granted."""
        assert self.client is not None
        addr = await self._master(mqs[0])
        if addr is None:
            raise MQClientError(-1, f"no master for broker {mqs[0].broker_name}")
        body = to_json(LockBatchRequestBody(self.group, self.client.client_id, mqs))
        request = RemotingCommand.request(RequestCode.LOCK_BATCH_MQ, body=body)
        response = await self.client.invoke(addr, request, LOCK_TIMEOUT)
        if response.code != ResponseCode.SUCCESS:
            raise MQClientError(response.code, response.remark, "lock batch mq")
        return set(
            decode_answer(response.body, LockBatchResponseBody, "lock batch mq").lock_ok_mq_set
        )

    async def _unlock_batch(self, broker_name: str, mqs: list[MessageQueue]) -> None:
        assert self.client is not None
        addr = await self._master(mqs[0])
        if addr is None:
            return
        body = to_json(UnlockBatchRequestBody(self.group, self.client.client_id, mqs))
        request = RemotingCommand.request(RequestCode.UNLOCK_BATCH_MQ, body=body)
        try:
            response = await self.client.invoke(addr, request, LOCK_TIMEOUT)
        except RemotingError as exc:
            log.warning("unlocking %s failed: %s", mqs, exc)
            return
        if response.code != ResponseCode.SUCCESS:
            log.warning("unlocking %s refused: %s %s", mqs, response.code, response.remark)
            return
        for mq in mqs:
            state = self.orderly_queues.get(mq)
            if state is not None:
                state.locked = False
        log.info("%s unlocked %s", broker_name, mqs)

    async def _lock_one(self, mq: MessageQueue, state: _OrderlyQueue) -> bool:
        try:
            granted = mq in await self._lock_batch([mq])
        except (MQClientError, RemotingError) as exc:
            log.warning("locking %s failed: %s", mq, exc)
            return False
        if granted:
            state.granted()
        return granted

    def _by_broker(self) -> dict[str, list[MessageQueue]]:
        brokers: dict[str, list[MessageQueue]] = {}
        for mq in sorted(self.orderly_queues):
            brokers.setdefault(mq.broker_name, []).append(mq)
        return brokers

    async def lock_all(self) -> None:
        """lockMQPeriodically: renew the lock of every queue this consumer owns; a queue the
        broker refused is not consumed until it is locked again."""
        async with self._queues_lock:
            if not self._closing:
                await self._lock_all()

    async def _lock_all(self) -> None:
        for mqs in self._by_broker().values():
            try:
                granted = await self._lock_batch(mqs)
            except (MQClientError, RemotingError) as exc:
                log.warning("locking %s failed: %s", mqs, exc)
                continue
            for mq in mqs:
                state = self.orderly_queues.get(mq)
                if state is None:
                    continue
                if mq in granted:
                    state.granted()
                elif state.locked:
                    state.locked = False
                    log.warning("the broker refused the lock of %s", mq)

    async def unlock_all(self) -> None:
        for broker_name, mqs in self._by_broker().items():
            await self._unlock_batch(broker_name, mqs)

    async def _lock_loop(self) -> None:
        await trio.sleep(min(LOCK_FIRST_DELAY, self.lock_interval))
        while True:
            await self.lock_all()
            await trio.sleep(self.lock_interval)

    def _lock_valid(self, state: _OrderlyQueue) -> bool:
        """May the queue be consumed: broadcasting, or locked and the lock not too old."""
        if not self.locks_queues:
            return True
        return state.locked and trio.current_time() - state.last_lock <= self.lock_max_live

    async def _ensure_locked(self, mq: MessageQueue, state: _OrderlyQueue) -> bool:
        """Wait until the queue may be consumed (tryLockLaterAndReconsume: lock it again,
        every LOCK_RETRY_DELAY while the broker refuses); False once it is dropped.

        A queue locked again after its lock lapsed may have been consumed meanwhile by the
        member that held it: its offset moves up to the group's committed one, so that what
        that member consumed is not consumed again here."""
        relocked = False
        while not state.dropped and not self._lock_valid(state):
            relocked = True
            if not await self._lock_one(mq, state):
                await trio.sleep(LOCK_RETRY_DELAY)
        if relocked and not state.dropped:
            try:
                committed = await self.query_offset(mq)
            except (MQClientError, RemotingError) as exc:
                log.warning("offset of %s after relocking it: %s", mq, exc)
            else:
                if committed > self.offsets.get(mq, committed):
                    log.info("%s was consumed up to %d meanwhile", mq, committed)
                    self.offsets[mq] = committed
        return not state.dropped

    async def _start_offset(self, mq: MessageQueue) -> int:
        if self.local_offsets is not None:
            committed = self.local_offsets.read(mq)
        elif self.clustering:
            committed = await self.query_offset(mq)
        else:
            committed = -1
        if committed >= 0:
            return committed
        where = self.consume_from
        if mq.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return 0
        if where in (
            ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            ConsumeFromWhere.CONSUME_FROM_MIN_OFFSET,
        ):
            return 0
        if where is ConsumeFromWhere.CONSUME_FROM_TIMESTAMP:
            return await self.search_offset(mq, self.consume_timestamp_ms)
        return await self.max_offset(mq)

    # -- consuming ------------------------------------------------------------------------

    async def _pull_loop(self, mq: MessageQueue, scope: trio.CancelScope) -> None:
        state = self.orderly_queues.get(mq)
        with scope:
            while True:
                # An orderly queue is pulled only while this consumer holds its lock.
                if state is not None and not await self._ensure_locked(mq, state):
                    return
                sub = self.subscriptions.get(mq.topic)
                selector: Selector = "*"
                registered = None
                if sub is not None:
                    selector = MessageSelector(sub.expression_type, sub.sub_string)
                    if not sub.is_tag_type:
                        # As Java's push consumer: the broker filters by the subscription this
                        # consumer's heartbeat registered, named by its version.
                        registered = sub.sub_version
                offset = self.offsets[mq]
                begin = time.monotonic()
                try:
                    result = await self.pull(
                        mq,
                        selector,
                        offset,
                        self.pull_batch_size,
                        suspend_ms=BROKER_SUSPEND_MAX_MS,
                        commit_offset=self._committed.get(mq, -1) if self.clustering else -1,
                        timeout=PULL_TIMEOUT,
                        registered_version=registered,
                    )
                except (MQClientError, RemotingError) as exc:
                    log.warning("pull %s failed: %s", mq, exc)
                    await trio.sleep(PULL_RETRY_DELAY)
                    continue
                if result.messages:
                    counters = self._topic_counters(mq.topic)
                    counters.pulls += 1
                    counters.pull_rt_ms += (time.monotonic() - begin) * 1000
                    counters.pulled += len(result.messages)
                    if state is None:
                        await self._consume(mq, result.messages)
                    elif not await self._consume_orderly(mq, state, result.messages):
                        return  # given up meanwhile
                if state is not None and state.dropped:
                    return
                if state is not None and result.messages:
                    # Never back below what a relock found consumed (_ensure_locked).
                    self.offsets[mq] = max(self.offsets[mq], result.next_begin_offset)
                else:
                    self.offsets[mq] = result.next_begin_offset

    @staticmethod
    def _restore_topics(messages: list[MessageExt]) -> None:
        """A message from the group's retry topic is handed over with its original topic."""
        for msg in messages:
            retry_of = msg.properties.get(PROPERTY_RETRY_TOPIC)
            if retry_of and msg.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                msg.topic = retry_of

    async def _consume_orderly(
        self, mq: MessageQueue, state: _OrderlyQueue, messages: list[MessageExt]
    ) -> bool:
        """ConsumeMessageOrderlyService: hand ``messages`` over a batch at a time, each batch
        only while the queue's lock is held and nothing else of the queue runs; a failed batch
        suspends the queue and is handed over again (reconsume times counted) until it
        succeeds or its messages past ``max_reconsume_times`` went to the DLQ.  The offset
        advances past each batch done.  False when the queue was given up meanwhile."""
        self._restore_topics(messages)
        counters = self._topic_counters(mq.topic)
        for start in range(0, len(messages), self.batch_size):
            batch = messages[start : start + self.batch_size]
            next_offset = batch[-1].queue_offset + 1
            while True:
                if not await self._ensure_locked(mq, state):
                    return False
                # Consumed by another member while this consumer had lost the lock: skipped.
                batch = [msg for msg in batch if msg.queue_offset >= self.offsets[mq]]
                if not batch:
                    self.offsets[mq] = max(self.offsets[mq], next_offset)
                    break
                async with state.consuming:
                    if state.dropped:
                        return False
                    if await self._handle(list(batch), counters):
                        counters.ok += len(batch)
                        self.offsets[mq] = next_offset
                        break
                    counters.failed += len(batch)
                    batch = await self._check_reconsume_times(mq, batch)
                    if not batch:
                        self.offsets[mq] = next_offset
                        break
                await trio.sleep(self._suspend_seconds())
        return True

    async def _handle(self, batch: list[MessageExt], counters: _TopicCounters) -> bool:
        """The handler's verdict on ``batch`` (False or an exception, logged, is a failure),
        counted in ``counters``."""
        begin = time.monotonic()
        try:
            ok = await self.handler(batch)
        except Exception:
            log.exception("consumer handler of %s failed", self.group)
            ok = False
        counters.calls += 1
        counters.consume_rt_ms += (time.monotonic() - begin) * 1000
        return ok is not False

    def _suspend_seconds(self) -> float:
        return min(max(self.suspend_current_queue_ms, SUSPEND_MIN_MS), SUSPEND_MAX_MS) / 1000

    async def _check_reconsume_times(
        self, mq: MessageQueue, batch: list[MessageExt]
    ) -> list[MessageExt]:
        """checkReconsumeTimes: the messages of a failed batch to hand over again, each with
        its reconsume times counted up; one already retried ``max_reconsume_times`` times goes
        to the group's DLQ instead (sent back with delay level -1), unless that fails."""
        limit = self.effective_max_reconsume_times
        again: list[MessageExt] = []
        for msg in batch:
            if msg.reconsume_times >= limit and await self._send_back(mq, [msg], -1):
                log.warning("%s went to the DLQ after %d retries", msg.msg_id, limit)
                continue
            msg.reconsume_times += 1
            again.append(msg)
        return again

    async def _consume(self, mq: MessageQueue, messages: list[MessageExt]) -> None:
        self._restore_topics(messages)
        for start in range(0, len(messages), self.batch_size):
            batch = messages[start : start + self.batch_size]
            counters = self._topic_counters(mq.topic)
            while True:
                if await self._handle(batch, counters):
                    counters.ok += len(batch)
                    break
                counters.failed += len(batch)
                if not self.clustering:
                    log.warning("broadcast consume failed, dropping %d messages", len(batch))
                    break
                if await self._send_back(mq, batch):
                    break
                await trio.sleep(LOCAL_RETRY_DELAY)

    async def _send_back(
        self, mq: MessageQueue, batch: list[MessageExt], delay_level: int = 0
    ) -> bool:
        """CONSUMER_SEND_MSG_BACK each message: to the retry topic (delay level 0: the broker
        chooses), or straight to the DLQ (-1)."""
        assert self.client is not None
        for msg in batch:
            addr = f"{msg.store_host[0]}:{msg.store_host[1]}"
            request = RemotingCommand.request(
                RequestCode.CONSUMER_SEND_MSG_BACK,
                H.encode(
                    H.ConsumerSendMsgBackRequestHeader(
                        offset=msg.commitlog_offset,
                        group=self.group,
                        delay_level=delay_level,
                        origin_msg_id=msg.msg_id,
                        origin_topic=msg.topic,
                        unit_mode=False,
                        max_reconsume_times=self.effective_max_reconsume_times,
                    )
                ),
            )
            try:
                response = await self.client.invoke(addr, request, 5.0)
            except RemotingError as exc:
                log.warning("send back to %s failed: %s", addr, exc)
                return False
            if response.code != ResponseCode.SUCCESS:
                log.warning("send back refused: %s %s", response.code, response.remark)
                return False
        return True
