"""Transactional messages: half messages, END_TRANSACTION (37) and the check-back service.

RocketMQ 4.x's two-phase send, as the 4.9.4 broker does it on the wire and in the store
(``docs/design.md``; the captured run is in the shared reference, section 5 of
``java-wire-samples.md``):

1. **Half message.**  A send whose properties carry ``TRAN_MSG=true`` is stored in
   ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0 with its SYSFLAG transaction bits cleared and the real
   topic and queue kept in ``REAL_TOPIC`` / ``REAL_QID`` (:func:`half_properties`), so that no
   consumer of the real topic sees it.  The send answer names the real queue, the half record's
   offset message id and its half-queue offset.
2. **END_TRANSACTION** (oneway).  COMMIT (8) looks the half record up by ``commitLogOffset``,
   checks producer group, ``tranStateTableOffset`` and commit-log offset, stores the message
   again under its real topic and queue (SYSFLAG commit type, ``preparedTransactionOffset`` = the
   half record's offset, the half's property string unchanged) and then an *op* record;
   ROLLBACK (12) writes only the op; UNKNOW (0) writes nothing.  An op record is
   ``RMQ_SYS_TRANS_OP_HALF_TOPIC`` queue 0, tag ``d``, body the half record's queue offset in
   decimal.
3. **Check-back** (:meth:`TransactionService.run`, masters only).  Every
   ``transactionCheckInterval`` ms it walks the half queue from its progress offset: a record
   with an op is done; one checked ``transactionCheckMax`` times (or older than
   ``fileReservedTime``) is moved to ``TRANS_CHECK_MAX_TIME_TOPIC``; one stored after the walk
   began, or younger than ``transactionTimeOut`` (or its ``CHECK_IMMUNITY_TIME_IN_SECONDS``),
   ends the walk; any other is stored again with ``TRANSACTION_CHECK_TIMES`` + 1 and the new
   record is sent to a live producer of its group as CHECK_TRANSACTION_STATE (39, oneway).  The
   progress is kept as the consumer offsets of ``CID_RMQ_SYS_TRANS`` on the half and op topics
   (persisted after every round that moved them), so a restart resumes where it stopped.

Beyond Java: a transaction ended (committed or rolled back) is remembered by the commit-log
offset of its first half record (the last :data:`ENDED_MEMORY` of them), so a second COMMIT of
the same transaction (a late answer to a check racing a late END) writes only an op and never a
second message, and the check service does not ask about a transaction already ended.  That
offset is what only the broker knows: the broker links each half record it stores again (for a
check, for immunity, to TRANS_CHECK_MAX_TIME_TOPIC, on RESUME_CHECK_HALF_MESSAGE) to the first
one, and nothing a producer chooses (UNIQ_KEY, born time, group) names a transaction, so no
producer can end another's.  Both tables hold fixed-size integers only (:data:`ENDED_MEMORY`
entries each, a few MiB), whatever the messages carry; they are kept in memory, so a restart
forgets them (the op records still end each half record).  A failed write
stops the round (the same record is tried at the next one) instead of dropping the message.
"""

from __future__ import annotations

import enum
import logging
from array import array
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import trio

from pymq.common.clock import now_ms
from pymq.common.message_ext import (
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    PROPERTY_WAIT_STORE_MSG_OK,
    MessageExt,
    MessageSysFlag,
    java_hashmap_order,
)
from pymq.common.message_id import decode_offset_msg_id
from pymq.common.record import RecordError
from pymq.common.topic import (
    CID_RMQ_SYS_TRANS,
    PERM_READ,
    PERM_WRITE,
    RMQ_SYS_TRANS_HALF_TOPIC,
    RMQ_SYS_TRANS_OP_HALF_TOPIC,
    TRANS_CHECK_MAX_TIME_TOPIC,
)
from pymq.remoting import headers as H
from pymq.remoting.channel import ANSWER_LATER
from pymq.remoting.codec import RPC_ONEWAY, RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.remoting.headers import EndTransactionRequestHeader, decode_request
from pymq.store.commitlog import encode_record
from pymq.store.config import BrokerRole
from pymq.store.results import PutMessageResult, PutMessageStatus

if TYPE_CHECKING:
    from pymq.broker.context import BrokerContext

log = logging.getLogger(__name__)

HALF_QUEUE_ID = 0
# TransactionalMessageUtil.REMOVETAG: the tag of an op record.
REMOVE_TAG = "d"
# DefaultTransactionalMessageCheckListener.TCMT_QUEUE_NUMS
TCMT_QUEUE_NUMS = 1
# TransactionalMessageServiceImpl.MAX_QUEUE_PROCESS_TIME: a round walks one queue this long.
MAX_QUEUE_PROCESS_TIME_MS = 60_000
# Ended transactions remembered against double commits, and re-put half records linked to their
# first one: at most this many of each, integers only (under 10 MiB for both).
ENDED_MEMORY = 65_536
# The walk lets the broker serve requests after this many records.
YIELD_EVERY = 256
# The check interval is at least this long (a 0 would spin the loop).
MIN_CHECK_INTERVAL_MS = 50
# What pending_by_topic() scans at most (the admin view's bound).
PENDING_SCAN_MAX = 200_000
# Who moves the progress offsets, in the offset manager's logs.
CHECK_CLIENT = "TransactionalMessageCheckService"

# An op record's properties: Message(topic, "d", body) sets TAGS, then WAIT=true; the
# HashMap gives WAIT first.
_OP_PROPERTIES = java_hashmap_order({PROPERTY_TAGS: REMOVE_TAG, PROPERTY_WAIT_STORE_MSG_OK: "true"})
_COMMIT = H.TRANSACTION_COMMIT_TYPE
# SYSFLAG's transaction type bits (MessageSysFlag.TRANSACTION_ROLLBACK_TYPE covers both).
_TRANSACTION_BITS = MessageSysFlag.TRANSACTION_ROLLBACK_TYPE
# Compared by identity first: a frozenset lookup hashes the enum member in Python.
_PUT_OK = PutMessageStatus.PUT_OK
# Read per END_TRANSACTION: an enum member read through its class is a slow lookup.
_SLAVE = BrokerRole.SLAVE
_ROLLBACK = H.TRANSACTION_ROLLBACK_TYPE
_NOT = H.TRANSACTION_NOT_TYPE
_STORED = frozenset(
    {
        PutMessageStatus.PUT_OK,
        PutMessageStatus.FLUSH_DISK_TIMEOUT,
        PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
        PutMessageStatus.SLAVE_NOT_AVAILABLE,
    }
)
# EndTransactionProcessor.sendFinalMessage's answers to a failed put.
_FINAL_PUT_FAILURES: dict[PutMessageStatus, tuple[int, str]] = {
    PutMessageStatus.CREATE_MAPEDFILE_FAILED: (
        ResponseCode.SYSTEM_ERROR,
        "Create mapped file failed.",
    ),
    PutMessageStatus.MESSAGE_ILLEGAL: (
        ResponseCode.MESSAGE_ILLEGAL,
        "The message is illegal, maybe msg body or properties length not matched. "
        "msg body length limit 128k, msg properties length limit 32k.",
    ),
    PutMessageStatus.PROPERTIES_SIZE_EXCEEDED: (
        ResponseCode.MESSAGE_ILLEGAL,
        "The message is illegal, maybe msg body or properties length not matched. "
        "msg body length limit 128k, msg properties length limit 32k.",
    ),
    PutMessageStatus.SERVICE_NOT_AVAILABLE: (
        ResponseCode.SERVICE_NOT_AVAILABLE,
        "Service not available now.",
    ),
    PutMessageStatus.OS_PAGECACHE_BUSY: (
        ResponseCode.SYSTEM_ERROR,
        "OS page cache busy, please try another machine",
    ),
    PutMessageStatus.UNKNOWN_ERROR: (ResponseCode.SYSTEM_ERROR, "UNKNOWN_ERROR"),
}


def half_properties(props: dict[str, str], real_topic: str, real_queue_id: int) -> dict[str, str]:
    """The properties of the half record of a message whose properties, as Java's send path
    leaves them, are ``props``: the producer's, then ``CLUSTER`` and ``WAIT`` (the send path
    takes WAIT out and puts it back after CLUSTER).

    As ``parseHalfMessageInner`` builds them: ``REAL_TOPIC`` and ``REAL_QID`` added, all in
    the iteration order of Java's ``HashMap``.
    """
    props[PROPERTY_REAL_TOPIC] = real_topic
    props[PROPERTY_REAL_QUEUE_ID] = str(real_queue_id)
    return java_hashmap_order(props)


def to_half_message(msg: MessageExt, props: dict[str, str]) -> None:
    """Turn ``msg``, a transactional message as the send path built it with properties
    ``props`` (see :func:`half_properties`; taken over), into its half record in place: half
    topic, queue 0, transaction bits of SYSFLAG cleared."""
    msg.properties = half_properties(props, msg.topic, msg.queue_id)
    msg.sys_flag = MessageSysFlag.reset_transaction_value(
        msg.sys_flag, MessageSysFlag.TRANSACTION_NOT_TYPE
    )
    msg.topic = RMQ_SYS_TRANS_HALF_TOPIC
    msg.queue_id = HALF_QUEUE_ID


def _java_long(text: str | None, default: int = -1) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


class CheckChannel(Protocol):
    """What the check service needs of a producer's connection."""

    closed: bool

    async def invoke_oneway(self, request: RemotingCommand) -> None: ...


@attrs.define
class TransactionStats:
    """Counters since start-up, and the last check round (the console and pymq-admin)."""

    committed: int = 0
    rolled_back: int = 0
    unknown: int = 0
    duplicate_ends: int = 0
    end_failures: int = 0
    checks: int = 0
    checks_without_producer: int = 0
    discarded: int = 0
    rounds: int = 0
    last_round_ms: int = 0
    last_round_duration_ms: float = 0.0
    last_round_walked: int = 0
    last_round_checked: int = 0


class _Step(enum.Enum):
    NEXT = "next"
    CHECKED = "checked"
    STOP = "stop"


class _OpWindow:
    """The op records read from the op progress offset on, kept compactly: which half offsets
    in ``[base, end)`` have an op (one byte each), and every op's half offset in op-queue order
    (8 bytes each; -1 for an op that names none or is gone), from which the op progress
    follows.  A round holds about a byte per half message it may walk and 8 bytes per op."""

    def __init__(self, op_offset: int, base: int, end: int) -> None:
        self.first = op_offset  # the op offset of halves[0]
        self.next_offset = op_offset
        self.base = base
        self.marks = bytearray(max(0, end - base))
        self.halves = array("q")
        # Ops of half messages before ``base`` (ended after the check service passed them): a
        # message put back during its CHECK_IMMUNITY_TIME_IN_SECONDS is done when its first
        # offset has one.  Few: an END that came after its message was put back.
        self.early: set[int] = set()

    def add(self, half_offset: int) -> None:
        self.halves.append(half_offset)
        k = half_offset - self.base
        if 0 <= k < len(self.marks):
            self.marks[k] = 1
        elif 0 <= half_offset < self.base:
            self.early.add(half_offset)

    def has_op(self, half_offset: int) -> bool:
        k = half_offset - self.base
        if 0 <= k < len(self.marks):
            return self.marks[k] == 1
        return half_offset in self.early

    def op_progress(self, walked_to: int) -> int:
        """The first op whose half message the walk has not passed (all read ones: the next)."""
        for n, half_offset in enumerate(self.halves):
            if half_offset >= walked_to:
                return self.first + n
        return self.first + len(self.halves)


class TransactionService:
    """END_TRANSACTION's processor and the check-back service over a :class:`BrokerContext`."""

    def __init__(self, ctx: BrokerContext, *, clock_ms: Callable[[], int] = now_ms) -> None:
        self.ctx = ctx
        self.clock_ms = clock_ms
        self.stats = TransactionStats()
        # The first half records' commit-log offsets of ended transactions, and each half record
        # this broker stored again -> the first one's offset.
        self._ended: OrderedDict[int, None] = OrderedDict()
        self._first_of: OrderedDict[int, int] = OrderedDict()

    # -- END_TRANSACTION ------------------------------------------------------------------------

    def end_transaction_inline(self, channel: Any, req: RemotingCommand) -> RemotingCommand | None:
        """END_TRANSACTION served in the connection's reader: always when the store need not
        wait for the disk or a slave, and for oneway requests (nobody waits for their answer,
        and the op record, appended after the commit, is never durable before it).  None hands
        an answered request on a SYNC_FLUSH / SYNC_MASTER store to :meth:`end_transaction`."""
        if req.flag & RPC_ONEWAY:
            self._end(channel, req, False)  # nobody reads an answer: none is built
            return ANSWER_LATER
        if self.ctx.store.must_wait:
            return None
        response, _ = self._end(channel, req)
        return ANSWER_LATER if response is None else response

    async def end_transaction(self, channel: Any, req: RemotingCommand) -> RemotingCommand | None:
        """END_TRANSACTION (37): commit, roll back or leave pending the half message named by
        the header.  Producers send it oneway, so the answer only reaches a peer that asked;
        one that asked is answered once what was written is durable (SYNC_FLUSH, SYNC_MASTER)."""
        response, last = self._end(channel, req)
        if response is not None and last is not None and response.code == ResponseCode.SUCCESS:
            durable = await self.ctx.store.wait_durable(last)
            if durable.status is not PutMessageStatus.PUT_OK:
                code, remark = _FINAL_PUT_FAILURES.get(
                    durable.status, (ResponseCode.SYSTEM_ERROR, durable.status.value)
                )
                if durable.status in _STORED:  # flush or slave timeouts: stored, say so
                    code, remark = ResponseCode.SUCCESS, None
                return req.response(code, remark)
        return response

    def _end(
        self, channel: Any, req: RemotingCommand, reply: bool = True
    ) -> tuple[RemotingCommand | None, PutMessageResult | None]:
        """Commit, roll back or leave pending: (the answer, the last record written).  Without
        ``reply`` (a oneway request) a success is not answered (None)."""
        head: EndTransactionRequestHeader = decode_request(req)
        ctx = self.ctx
        if ctx.store.config.broker_role is _SLAVE:
            log.warning("Message store is slave mode, so end transaction is forbidden.")
            return req.response(ResponseCode.SLAVE_NOT_AVAILABLE), None
        kind = head.commit_or_rollback
        if head.from_transaction_check:
            what = {
                _NOT: "but it's pending status",
                _COMMIT: "the producer commit the message",
                _ROLLBACK: "the producer rollback the message",
            }[kind]
            log.warning(
                "Check producer[%s] transaction state, %s. RequestHeader: %s Remark: %s",
                getattr(channel, "remote_address", "?"),
                what,
                head,
                req.remark,
            )
        elif kind != _COMMIT:
            what = "and it's pending status" if kind == _NOT else "rollback the message"
            log.warning(
                "The producer[%s] end transaction in sending message, %s. "
                "RequestHeader: %s Remark: %s",
                getattr(channel, "remote_address", "?"),
                what,
                head,
                req.remark,
            )
        if kind == _NOT:
            self.stats.unknown += 1
            return None, None
        half = ctx.store.look_message_by_offset(head.commit_log_offset)
        refused = self._check_prepare_message(req, half, head)
        if refused is not None:
            self.stats.end_failures += 1
            return refused, None
        assert half is not None
        key = self._ended_key(half)
        if key in self._ended:
            # Already committed or rolled back: mark this half record done, write nothing else.
            log.warning(
                "The transaction of message %s (half offset %d) was already ended; "
                "a second %s writes only its op",
                head.msg_id,
                half.queue_offset,
                "commit" if kind == _COMMIT else "rollback",
            )
            self.stats.duplicate_ends += 1
            last = self._put_op(half)
            return req.response() if reply else None, last
        if kind == _COMMIT:
            refused = self._commit(req, half, head)
            if refused is not None:
                self.stats.end_failures += 1
                return refused, None
            self.stats.committed += 1
        else:
            self.stats.rolled_back += 1
        self._remember_ended(key)
        last = self._put_op(half)
        return req.response() if reply else None, last

    @staticmethod
    def _check_prepare_message(
        req: RemotingCommand, half: MessageExt | None, head: EndTransactionRequestHeader
    ) -> RemotingCommand | None:
        """EndTransactionProcessor.checkPrepareMessage: the refusal, or None."""
        if half is None or half.topic != RMQ_SYS_TRANS_HALF_TOPIC:
            return req.response(
                ResponseCode.SYSTEM_ERROR, "Find prepared transaction message failed"
            )
        if half.properties.get(PROPERTY_PRODUCER_GROUP) != head.producer_group:
            return req.response(ResponseCode.SYSTEM_ERROR, "The producer group wrong")
        if half.queue_offset != head.tran_state_table_offset:
            return req.response(
                ResponseCode.SYSTEM_ERROR, "The transaction state table offset wrong"
            )
        if half.commitlog_offset != head.commit_log_offset:
            return req.response(ResponseCode.SYSTEM_ERROR, "The commit log offset wrong")
        return None

    def _commit(
        self, req: RemotingCommand, half: MessageExt, head: EndTransactionRequestHeader
    ) -> RemotingCommand | None:
        """Store the committed message under its real topic and queue (endMessageTransaction):
        None once stored, else the refusal."""
        real_topic = half.properties.get(PROPERTY_REAL_TOPIC)
        real_queue = _java_long(half.properties.get(PROPERTY_REAL_QUEUE_ID))
        if not real_topic or real_queue < 0:
            return req.response(
                ResponseCode.SYSTEM_ERROR,
                f"the half message at {head.commit_log_offset} has no REAL_TOPIC/REAL_QID",
            )
        # In MessageExt's field order (positional: this runs once per transaction).  The
        # half's property string as it is (REAL_TOPIC, REAL_QID, TRAN_MSG included); SYSFLAG's
        # transaction bits set to COMMIT (MessageSysFlag.reset_transaction_value).
        msg = MessageExt(
            real_topic, half.body, half.flag, dict(half.properties), real_queue, 0, 0,
            (half.sys_flag & ~_TRANSACTION_BITS) | _COMMIT, half.born_timestamp, half.born_host,
            0, self.ctx.store_host, half.reconsume_times, head.commit_log_offset,
        )  # fmt: skip
        result = self.ctx.store.put_now(msg)
        if result.status is _PUT_OK or result.status in _STORED:
            return None
        code, remark = _FINAL_PUT_FAILURES.get(
            result.status, (ResponseCode.SYSTEM_ERROR, "UNKNOWN_ERROR DEFAULT")
        )
        log.error(
            "committing the half message at %d failed: %s %s",
            head.commit_log_offset,
            result.status.value,
            result.reason,
        )
        return req.response(code, remark)

    def _put_op(self, half: MessageExt) -> PutMessageResult:
        """The op record that marks ``half`` done (tag ``d``, body its half-queue offset)."""
        store_host = self.ctx.store_host
        # Positional, in MessageExt's field order: topic, body, flag, properties, queue id,
        # queue and commit-log offsets, sys flag, born time and host, store time and host.
        op = MessageExt(
            RMQ_SYS_TRANS_OP_HALF_TOPIC, str(half.queue_offset).encode(), 0, dict(_OP_PROPERTIES),
            half.queue_id, 0, 0, 0, self.clock_ms(), store_host, 0, store_host,
        )  # fmt: skip
        result = self.ctx.store.put_now(op)
        if result.status is not _PUT_OK and result.status not in _STORED:
            log.error(
                "writing the op of half offset %d failed: %s %s (it will be checked again)",
                half.queue_offset,
                result.status.value,
                result.reason,
            )
        return result

    def _ended_key(self, half: MessageExt) -> int:
        """What names a transaction across its half record's re-puts: the commit-log offset of
        its first half record (only the broker knows it: a producer cannot name another's)."""
        offset = half.commitlog_offset
        return self._first_of.get(offset, offset)

    def _remember_ended(self, key: int) -> None:
        self._ended[key] = None
        if len(self._ended) > ENDED_MEMORY:
            self._ended.popitem(last=False)

    def _link(self, half: MessageExt, result: PutMessageResult) -> None:
        """``half`` stored again at ``result``'s offset: the new record is the same transaction."""
        self._first_of[result.wrote_offset] = self._ended_key(half)
        if len(self._first_of) > ENDED_MEMORY:
            self._first_of.popitem(last=False)

    # -- progress ---------------------------------------------------------------------------

    def _progress(self, topic: str) -> int:
        """The check service's offset in ``topic`` queue 0 (fetchConsumeOffset): the queue's
        minimum offset when none is recorded yet."""
        ctx = self.ctx
        offset = ctx.consumer_offset_manager.query_offset(CID_RMQ_SYS_TRANS, topic, HALF_QUEUE_ID)
        if offset < 0:
            offset = ctx.store.get_min_offset_in_queue(topic, HALF_QUEUE_ID)
            ctx.consumer_offset_manager.commit_offset(
                CHECK_CLIENT, CID_RMQ_SYS_TRANS, topic, HALF_QUEUE_ID, offset
            )
        return offset

    def _read_ops(self, window: _OpWindow, limit: int | None = None) -> bool:
        """Add the op records written since the window last read (at most ``limit`` of them);
        True when it has read up to the end of the op queue."""
        store = self.ctx.store
        end = store.get_max_offset_in_queue(RMQ_SYS_TRANS_OP_HALF_TOPIC, HALF_QUEUE_ID)
        start = max(
            window.next_offset,
            store.get_min_offset_in_queue(RMQ_SYS_TRANS_OP_HALF_TOPIC, HALF_QUEUE_ID),
        )
        if start > window.next_offset:  # removed files: their ops are done with
            if not window.halves:
                window.first = start
            else:
                window.halves.extend([-1] * (start - window.next_offset))
        stop = end if limit is None else min(end, start + limit)
        for op_offset in range(start, stop):
            op = store.message_at(RMQ_SYS_TRANS_OP_HALF_TOPIC, HALF_QUEUE_ID, op_offset)
            half_offset = -1
            if op is None:
                log.warning("no op message at offset %d: skipped", op_offset)
            elif op.tags != REMOVE_TAG:
                log.error("Found a illegal tag in op message %d: %s", op_offset, op.tags)
            else:
                half_offset = _java_long(op.body.decode("ascii", "replace"))
                if half_offset < 0:
                    log.error("op message %d names no half offset: %r", op_offset, op.body[:40])
                    half_offset = -1
            window.add(half_offset)
        window.next_offset = max(window.next_offset, stop)
        return stop >= end

    async def _read_ops_async(self, window: _OpWindow) -> None:
        """:meth:`_read_ops` to the end of the op queue, letting requests in between chunks."""
        while not self._read_ops(window, YIELD_EVERY):
            await trio.sleep(0)

    def progress(self) -> dict[str, int]:
        """Where the check service stands: half and op queues' ends and progress offsets."""
        store = self.ctx.store
        offsets = self.ctx.consumer_offset_manager
        half_max = store.get_max_offset_in_queue(RMQ_SYS_TRANS_HALF_TOPIC, HALF_QUEUE_ID)
        op_max = store.get_max_offset_in_queue(RMQ_SYS_TRANS_OP_HALF_TOPIC, HALF_QUEUE_ID)
        return {
            "halfMaxOffset": half_max,
            "halfCheckOffset": offsets.query_offset(
                CID_RMQ_SYS_TRANS, RMQ_SYS_TRANS_HALF_TOPIC, HALF_QUEUE_ID
            ),
            "opMaxOffset": op_max,
            "opCheckOffset": offsets.query_offset(
                CID_RMQ_SYS_TRANS, RMQ_SYS_TRANS_OP_HALF_TOPIC, HALF_QUEUE_ID
            ),
            "discardedTotal": store.get_max_offset_in_queue(TRANS_CHECK_MAX_TIME_TOPIC, 0),
        }

    def pending_by_topic(self, limit: int = PENDING_SCAN_MAX) -> tuple[dict[str, int], bool]:
        """Half messages after the check progress that have no op yet, counted by real topic,
        and whether the scan stopped short (more than ``limit`` half or op records to read:
        then some counted ones may have ended since)."""
        store = self.ctx.store
        start = self._progress(RMQ_SYS_TRANS_HALF_TOPIC)
        end = store.get_max_offset_in_queue(RMQ_SYS_TRANS_HALF_TOPIC, HALF_QUEUE_ID)
        stop = min(end, start + limit)
        window = _OpWindow(self._progress(RMQ_SYS_TRANS_OP_HALF_TOPIC), start, stop)
        all_ops = self._read_ops(window, limit)
        counts: dict[str, int] = {}
        for offset in range(start, stop):
            if window.has_op(offset):
                continue
            half = store.message_at(RMQ_SYS_TRANS_HALF_TOPIC, HALF_QUEUE_ID, offset)
            if half is None or self._ended_key(half) in self._ended:
                continue
            topic = half.properties.get(PROPERTY_REAL_TOPIC, "?")
            counts[topic] = counts.get(topic, 0) + 1
        return counts, stop < end or not all_ops

    # -- the check-back service ---------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Check every ``transactionCheckInterval`` ms (read each time: it may be changed at
        run time) until cancelled.  A failing round is logged; the next one runs."""
        task_status.started()
        while True:
            interval = max(self.ctx.broker_config.transaction_check_interval, MIN_CHECK_INTERVAL_MS)
            await trio.sleep(interval / 1000)
            try:
                await self.check()
            except Exception:
                log.exception("Check error")

    async def check(self) -> None:
        """One round over the half queue (TransactionalMessageServiceImpl.check)."""
        store = self.ctx.store
        started = self.clock_ms()
        wall = trio.current_time()
        half_off = self._progress(RMQ_SYS_TRANS_HALF_TOPIC)
        op_off = self._progress(RMQ_SYS_TRANS_OP_HALF_TOPIC)
        i = max(half_off, store.get_min_offset_in_queue(RMQ_SYS_TRANS_HALF_TOPIC, HALF_QUEUE_ID))
        # Records appended during the round (its own re-puts among them) wait for the next one,
        # whatever their store time says.
        end = store.get_max_offset_in_queue(RMQ_SYS_TRANS_HALF_TOPIC, HALF_QUEUE_ID)
        window = _OpWindow(op_off, i, end)
        await self._read_ops_async(window)
        walked = checked = 0
        while i < end:
            if walked and walked % YIELD_EVERY == 0:
                await trio.sleep(0)
                self._read_ops(window)
            walked += 1
            if self.clock_ms() - started > MAX_QUEUE_PROCESS_TIME_MS:
                log.info("Queue half process time reach max=%d", MAX_QUEUE_PROCESS_TIME_MS)
                break
            step = await self._check_one(i, window, started)
            if step is _Step.STOP:
                break
            if step is _Step.CHECKED:
                checked += 1
            i += 1
        await self._save_progress(half_off, i, op_off, window)
        stats = self.stats
        stats.rounds += 1
        stats.last_round_ms = started
        stats.last_round_duration_ms = (trio.current_time() - wall) * 1000
        stats.last_round_walked = walked
        stats.last_round_checked = checked

    async def _check_one(self, i: int, window: _OpWindow, started: int) -> _Step:
        """What a round does with the half record at offset ``i``."""
        if window.has_op(i):
            return _Step.NEXT
        store = self.ctx.store
        half = store.message_at(RMQ_SYS_TRANS_HALF_TOPIC, HALF_QUEUE_ID, i)
        if half is None:
            log.info("no half message at offset %d (a gap or a removed file): skipped", i)
            return _Step.NEXT
        if self._ended_key(half) in self._ended:
            return _Step.NEXT
        bc = self.ctx.broker_config
        times_text = half.properties.get(PROPERTY_TRANSACTION_CHECK_TIMES)
        times = _java_long(times_text, 0) if times_text is not None else None
        now = self.clock_ms()
        reserved_ms = store.config.file_reserved_time * 3600 * 1000
        if (times is not None and times >= bc.transaction_check_max) or (
            now - half.born_timestamp > reserved_ms
        ):
            return _Step.NEXT if await self._discard(half) else _Step.STOP
        if half.store_timestamp >= started:
            return _Step.STOP  # stored after the round began: the next round
        age = now - half.born_timestamp
        timeout = bc.transaction_time_out
        immunity_text = half.properties.get(PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS)
        if immunity_text is not None:
            immunity = _java_long(immunity_text)
            immunity = timeout if immunity == -1 else immunity * 1000
            if age < immunity:
                return _Step.NEXT if self._immunity_put_back(half, window) else _Step.STOP
        elif 0 <= age < timeout:
            return _Step.STOP  # young: everything after it is younger
        # No await between this last look at the ops and the re-put: an END served while the
        # round ran is seen here.
        self._read_ops(window)
        if window.has_op(i):
            return _Step.NEXT
        result, renewed = self._put_back_for_check(half, (times or 0) + 1)
        if result is None:
            return _Step.STOP
        await self._send_check(half, renewed, result)
        return _Step.CHECKED

    async def _save_progress(
        self, half_off: int, new_half_off: int, op_off: int, window: _OpWindow
    ) -> None:
        offsets = self.ctx.consumer_offset_manager
        new_op_off = window.op_progress(new_half_off)
        changed = False
        if new_half_off != half_off:
            offsets.commit_offset(
                CHECK_CLIENT, CID_RMQ_SYS_TRANS, RMQ_SYS_TRANS_HALF_TOPIC, 0, new_half_off
            )
            changed = True
        if new_op_off != op_off:
            offsets.commit_offset(
                CHECK_CLIENT, CID_RMQ_SYS_TRANS, RMQ_SYS_TRANS_OP_HALF_TOPIC, 0, new_op_off
            )
            changed = True
        if changed:
            # At once, not at the next periodic persist: a restart must not walk again what
            # this round re-put and asked about.
            await offsets.persist()

    def _renewed(
        self,
        half: MessageExt,
        props: dict[str, str],
        topic: str = RMQ_SYS_TRANS_HALF_TOPIC,
        queue_id: int | None = None,
    ) -> MessageExt:
        """``half`` to be stored again (in the half topic, or ``topic``/``queue_id``), with
        ``props``, stored by this broker."""
        return MessageExt(
            topic=topic,
            body=half.body,
            flag=half.flag,
            properties=props,
            queue_id=half.queue_id if queue_id is None else queue_id,
            sys_flag=half.sys_flag,
            born_timestamp=half.born_timestamp,
            born_host=half.born_host,
            store_host=self.ctx.store_host,
            reconsume_times=half.reconsume_times,
        )

    # -- RESUME_CHECK_HALF_MESSAGE ------------------------------------------------------------

    RESUME_FAILED = "Put message back to RMQ_SYS_TRANS_HALF_TOPIC failed."
    RESUME_ERROR = "Exception was thrown when putting message back to RMQ_SYS_TRANS_HALF_TOPIC."

    async def resume_check_half_message(
        self, channel: Any, req: RemotingCommand
    ) -> RemotingCommand:
        """RESUME_CHECK_HALF_MESSAGE (323, AdminBrokerProcessor.resumeCheckHalfMessage): store
        the message ``msgId`` names again in the half queue (queue 0) with
        TRANSACTION_CHECK_TIMES 0, so that the check service asks its producer again.  Beyond
        Java, only a message the check service gave up (in TRANS_CHECK_MAX_TIME_TOPIC) is taken:
        Java copies any message it is named into the half queue."""
        head: H.ResumeCheckHalfMessageRequestHeader = decode_request(req)
        ctx = self.ctx
        if ctx.store.config.broker_role is _SLAVE:
            return req.response(ResponseCode.SLAVE_NOT_AVAILABLE, "the broker is a slave")
        try:
            _, _, offset = decode_offset_msg_id(head.msg_id)
        except ValueError:
            return req.response(ResponseCode.SYSTEM_ERROR, self.RESUME_ERROR)
        given_up = ctx.store.look_message_by_offset(offset)
        if given_up is None or given_up.topic != TRANS_CHECK_MAX_TIME_TOPIC:
            return req.response(ResponseCode.SYSTEM_ERROR, self.RESUME_ERROR)
        props = dict(given_up.properties)
        props[PROPERTY_TRANSACTION_CHECK_TIMES] = "0"
        resumed = self._renewed(given_up, java_hashmap_order(props), queue_id=HALF_QUEUE_ID)
        result = ctx.store.put_now(resumed)
        if result.status is not PutMessageStatus.PUT_OK:
            log.error("%s %s %s", self.RESUME_FAILED, result.status.value, result.reason)
            return req.response(ResponseCode.SYSTEM_ERROR, self.RESUME_FAILED)
        self._link(given_up, result)
        log.info(
            "Put message back to RMQ_SYS_TRANS_HALF_TOPIC. real topic=%s",
            props.get(PROPERTY_REAL_TOPIC),
        )
        return req.response()

    def _put_back_for_check(
        self, half: MessageExt, times: int
    ) -> tuple[PutMessageResult | None, MessageExt]:
        """Store ``half`` again with TRANSACTION_CHECK_TIMES = ``times`` (putBackHalfMsgQueue)."""
        props = dict(half.properties)
        props[PROPERTY_TRANSACTION_CHECK_TIMES] = str(times)
        renewed = self._renewed(half, java_hashmap_order(props))
        result = self.ctx.store.put_now(renewed)
        if result.status is PutMessageStatus.PUT_OK:
            self._link(half, result)
        else:
            log.error(
                "PutBackToHalfQueueReturnResult write failed, half offset %d: %s %s",
                half.queue_offset,
                result.status.value,
                result.reason,
            )
            return None, renewed
        log.info(
            "Send check message, the offset=%d restored in queueOffset=%d commitLogOffset=%d "
            "newMsgId=%s realMsgId=%s",
            half.queue_offset,
            result.logic_offset,
            result.wrote_offset,
            result.msg_id,
            half.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX),
        )
        return result, renewed

    def _immunity_put_back(self, half: MessageExt, window: _OpWindow) -> bool:
        """A message still inside its CHECK_IMMUNITY_TIME_IN_SECONDS (checkPrepareQueueOffset):
        done if its first half offset has an op, else stored again carrying that offset in
        TRAN_PREPARED_QUEUE_OFFSET.  False if the write failed."""
        first = half.properties.get(PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET)
        if first is not None:
            first_offset = _java_long(first)
            if first_offset == -1:
                return False
            if window.has_op(first_offset):
                return True
        props = dict(half.properties)
        if first is None:
            props[PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET] = str(half.queue_offset)
        result = self.ctx.store.put_now(self._renewed(half, java_hashmap_order(props)))
        if result.status is not PutMessageStatus.PUT_OK:
            return False
        self._link(half, result)
        return True

    async def _send_check(
        self, half: MessageExt, renewed: MessageExt, result: PutMessageResult
    ) -> None:
        """CHECK_TRANSACTION_STATE to a producer of the message's group (sendCheckMessage)."""
        stats = self.stats
        stats.checks += 1
        group = renewed.properties.get(PROPERTY_PRODUCER_GROUP, "")
        uniq = renewed.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
        channel: CheckChannel | None = self.ctx.producer_manager.available_channel(group)  # type: ignore[assignment]
        if channel is None:
            stats.checks_without_producer += 1
            log.warning("Check transaction failed, channel is null. groupId=%s", group)
            return
        # The message as Java's listener encodes it: real topic and queue, the new record's
        # offsets, the old record's store time, WAIT=false.
        props = dict(renewed.properties)
        props[PROPERTY_WAIT_STORE_MSG_OK] = "false"
        body_msg = MessageExt(
            topic=renewed.properties.get(PROPERTY_REAL_TOPIC, ""),
            body=half.body,
            flag=half.flag,
            properties=java_hashmap_order(props),
            queue_id=_java_long(renewed.properties.get(PROPERTY_REAL_QUEUE_ID), 0),
            queue_offset=result.logic_offset,
            commitlog_offset=result.wrote_offset,
            sys_flag=half.sys_flag,
            born_timestamp=half.born_timestamp,
            born_host=half.born_host,
            store_timestamp=half.store_timestamp,
            store_host=half.store_host,
            reconsume_times=half.reconsume_times,
            prepared_transaction_offset=half.prepared_transaction_offset,
        )
        try:
            body = encode_record(body_msg)
        except RecordError as exc:
            log.error("cannot encode the check of half offset %d: %s", result.logic_offset, exc)
            return
        header = H.CheckTransactionStateRequestHeader(
            tran_state_table_offset=result.logic_offset,
            commit_log_offset=result.wrote_offset,
            msg_id=uniq,
            transaction_id=uniq,
            offset_msg_id=result.msg_id,
        )
        request = RemotingCommand.request(
            RequestCode.CHECK_TRANSACTION_STATE, H.encode(header), body, oneway=True
        )
        try:
            await channel.invoke_oneway(request)
        except Exception as exc:  # a connection that died meanwhile: the next round asks again
            log.warning("Check transaction of group %s failed: %s", group, exc)

    async def _discard(self, half: MessageExt) -> bool:
        """Move a message checked transactionCheckMax times to TRANS_CHECK_MAX_TIME_TOPIC
        (resolveDiscardMsg); False if the write failed (tried again next round)."""
        ctx = self.ctx
        await ctx.topic_config_manager.create_in_send_back(
            TRANS_CHECK_MAX_TIME_TOPIC, TCMT_QUEUE_NUMS, PERM_READ | PERM_WRITE, 0
        )
        msg = self._renewed(half, dict(half.properties), TRANS_CHECK_MAX_TIME_TOPIC, 0)
        result = ctx.store.put_now(msg)
        if result.status is PutMessageStatus.PUT_OK:
            self._link(half, result)  # so that a resumed check is still this transaction
        else:
            log.error(
                "moving half offset %d to %s failed: %s %s",
                half.queue_offset,
                TRANS_CHECK_MAX_TIME_TOPIC,
                result.status.value,
                result.reason,
            )
            return False
        self.stats.discarded += 1
        log.info(
            "The transaction of message %s was checked %s times: moved to %s and not delivered",
            half.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX),
            half.properties.get(PROPERTY_TRANSACTION_CHECK_TIMES),
            TRANS_CHECK_MAX_TIME_TOPIC,
        )
        return True
