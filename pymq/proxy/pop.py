"""POP consumption for the 5.x SimpleConsumer: receive with an invisible time, ack, change it.

A message a consumer of a group receives is *in flight* for that group: no other consumer of
the group receives it until it is acked or its invisible time ends; then it is received again,
its delivery attempt counted, and past the group's maximum attempts (``retryMaxTimes`` + 1,
the attempts the server's settings announce) it goes to the group's DLQ (``%DLQ%group``)
through the broker's send path, instead of being received again.

State, per (group, topic, queue): the read point (the next offset nobody has received) and the
offsets in flight, each with its deadline, attempts and a token naming the receipt handle last
given for it (a handle whose token is not the current one is refused INVALID_RECEIPT_HANDLE: an
earlier delivery's, or one from before a restart, as every handle also names the broker's run).

Crash safety without a log of its own: the group's consumer offset of the queue
(ConsumerOffsetManager, persisted as 4.x offsets are: every ``flushConsumerOffsetInterval`` and
at shutdown) is kept at the lowest offset still in flight, or the read point when none is.  So
every message at or above it may not have been acked, and a broker that restarts (or is killed)
starts reading the queue there again: every unacked message is received again after a restart
(at least once), and no acked message is lost; messages acked above an unacked one, or acked
since the last persist, may be received once more.  State with nothing in flight is dropped
(it equals the offset), so memory holds only messages in flight.

Bounds: at most ``MAX_INFLIGHT_PER_QUEUE`` messages in flight per (group, queue) and
``MAX_INFLIGHT`` in all; past them a receive gets only messages whose invisible time ended.
A receive returns at most ``MAX_BATCH`` messages; the tools are shown at most
``MAX_VIEW_ROWS`` queues with messages in flight.  Invisible times: 10 s to 12 h on receive and
0 to 12 h on ChangeInvisibleDuration (the proxy's defaults); a receive waits at most its long
polling timeout (at most ``MAX_LONG_POLLING_MS``).

4.x and 5.x consumers in one group: the broker records which queues the group's 4.x clients
pull (PULL_MESSAGE, :class:`pymq.broker.client_manager.QueuePullers`), and a queue pulled in
the last ``PULLED_QUEUE_SECONDS`` (30 s, counted from the end of the longest a long-polling
pull may be held) is left to them: a receive passes it over, and state
this service had for it is dropped (its in-flight messages are at or above the offset the 4.x
client started from, so that client delivers them; their receipt handles are refused).  The 4.x
clients' rebalance counts the 5.x clients among the group's members (they are registered as
the proxy registers them), so it leaves them a share of the queues, which nobody pulls and the
5.x consumers receive.  A queue changing hands starts from the group's committed offset, so a
message may be delivered once more across the change (at least once), none is lost.  A queue a
4.x client stops pulling because the rebalance gave it away waits out the 30 s before the 5.x
consumers receive it; one whose client left the group (unregistered, or its connection
closed) goes to them at once.  RocketMQ 5 does not coordinate the two: its POP reads
every queue beside the pulls of the group's 4.x clients, both from the group's offset.

An operator's reset of the group's offsets (RESET_CONSUMER_OFFSET, ``pymq-admin
resetOffsetByTime``) wins over this state, as RocketMQ 5's POP takes the reset offset
(resetPopOffset: it clears the queue's FIFO block and its in-flight offset tracking, and commits
the reset offset): :meth:`PopService.reset` drops each reset queue's state, so its next receive
reads from the new offset, and the messages that were in flight are not received again unless
the new offset is at or below them.  Their receipt handles are stale: an ack of one answers OK
and changes nothing (the broker acks a POP handle without looking it up), ChangeInvisibleDuration
and ForwardMessageToDeadLetterQueue refuse it INVALID_RECEIPT_HANDLE.  Telling a stale handle
from a forged one takes one mark per reset queue that had messages in flight (the token count
at the reset), kept until the last of those messages' invisible times ends (12 h at most).

FIFO: a group with ``consumeMessageOrderly`` receiving a FIFO topic gets each queue's messages
in order (the proxy puts a message group's messages on one queue), and nothing more of a queue
while a message of it is invisible; when they come back they come first, in order.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

import attrs
import trio

from pymq.broker.long_polling import ANY_QUEUE
from pymq.broker.message_filter import RecordFilter
from pymq.common.consumer import SubscriptionData
from pymq.common.message_ext import (
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    MessageExt,
    encode_properties,
)
from pymq.common.record import RecordError, decode_record
from pymq.common.topic import PERM_WRITE, dlq_topic
from pymq.remoting.codes import ResponseCode
from pymq.remoting.headers import SendMessageRequestHeader

if TYPE_CHECKING:
    from pymq.broker.controller import BrokerController

log = logging.getLogger(__name__)

MAX_INFLIGHT_PER_QUEUE = 2000
MAX_INFLIGHT = 100_000
MAX_BATCH = 32
MIN_INVISIBLE_MS = 10_000
MAX_INVISIBLE_MS = 12 * 3600 * 1000
MAX_LONG_POLLING_MS = 30_000
# The most queues the tools are shown in one answer (:meth:`PopService.inflight_view`).
MAX_VIEW_ROWS = 1000
POP_CLIENT = "pymq-pop"


def now_ms() -> int:
    return int(time.time() * 1000)


@attrs.define
class InFlight:
    deadline: int  # ms since the epoch
    attempts: int
    token: int


@attrs.define
class QueueState:
    next: int
    inflight: dict[int, InFlight] = attrs.Factory(dict)

    def committed(self) -> int:
        return min(self.inflight) if self.inflight else self.next


@attrs.frozen
class ResetMark:
    """A queue's reset (see the module doc): the handles it made stale are those of this
    queue with a token at most ``token``, until ``until`` (ms since the epoch)."""

    token: int
    until: int


@attrs.frozen
class Received:
    message: MessageExt
    handle: str
    attempt: int
    invisible_ms: int


class HandleError(Exception):
    pass


class PopService:
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker
        self.states: dict[tuple[str, str, int], QueueState] = {}
        self.inflight_total = 0
        self._token = 0
        self._run = os.urandom(4).hex()  # this run's mark on every receipt handle
        self._changed = trio.Event()  # a deadline moved earlier, or a message came back
        self.reset_marks: dict[tuple[str, str, int], ResetMark] = {}

    # -- receipt handles ----------------------------------------------------------------------

    def _handle(self, queue_id: int, offset: int, token: int) -> str:
        return f"{self._run}_{queue_id}_{offset}_{token}"

    def _parse(self, handle: str) -> tuple[int, int, int]:
        parts = handle.split("_")
        if len(parts) != 4 or parts[0] != self._run:
            raise HandleError(
                "the receipt handle is not this broker's, or is from before a restart"
            )
        try:
            return int(parts[1]), int(parts[2]), int(parts[3])
        except ValueError:
            raise HandleError("the receipt handle is malformed") from None

    # -- state --------------------------------------------------------------------------------

    def _state(self, group: str, topic: str, queue_id: int) -> QueueState:
        key = (group, topic, queue_id)
        state = self.states.get(key)
        if state is None:
            offset = self.broker.consumer_offset_manager.query_offset(group, topic, queue_id)
            store = self.broker.store
            if offset < 0:  # a new group starts at the queue's first message
                offset = store.get_min_offset_in_queue(topic, queue_id)
            offset = max(offset, store.get_min_offset_in_queue(topic, queue_id))
            state = self.states[key] = QueueState(offset)
        return state

    def _settle(self, group: str, topic: str, queue_id: int, state: QueueState) -> None:
        """Keep the group's offset at the lowest unacked one; drop state with nothing in
        flight.  A queue a 4.x member of the group pulls is left to it: its offset is its."""
        if self._pulled(group, topic, queue_id):
            self._release(group, topic, queue_id)
            return
        self.broker.consumer_offset_manager.commit_offset(
            POP_CLIENT, group, topic, queue_id, state.committed()
        )
        if not state.inflight:
            self.states.pop((group, topic, queue_id), None)

    def _pulled(self, group: str, topic: str, queue_id: int) -> bool:
        """Whether a 4.x client of ``group`` pulls the queue and is still a member of the
        group (see the module's text)."""
        pullers = self.broker.context.queue_pullers
        channel = pullers.puller(group, topic, queue_id, trio.current_time())
        if channel is None:
            return False
        members = self.broker.consumer_manager.get(group)
        return members is not None and channel in members.channels

    def _release(self, group: str, topic: str, queue_id: int) -> None:
        """The queue's state dropped, what it had in flight too: the 4.x client that pulls
        it started at or below the lowest of them (the offset this service kept), so it
        delivers them again; their receipt handles are refused from now on."""
        state = self.states.pop((group, topic, queue_id), None)
        if state is not None:
            self.inflight_total -= len(state.inflight)

    def _take(self, state: QueueState, offset: int, invisible_ms: int, attempts: int) -> int:
        self._token += 1
        entry = state.inflight.get(offset)
        if entry is None:
            self.inflight_total += 1
            state.inflight[offset] = InFlight(now_ms() + invisible_ms, attempts, self._token)
        else:
            entry.deadline, entry.attempts, entry.token = (
                now_ms() + invisible_ms,
                attempts,
                self._token,
            )
        return self._token

    def _drop(self, state: QueueState, offset: int) -> None:
        if state.inflight.pop(offset, None) is not None:
            self.inflight_total -= 1

    # -- receive ------------------------------------------------------------------------------

    def _read(self, group: str, topic: str, queue_id: int, offset: int) -> MessageExt | None:
        result = self.broker.store.get_message(group, topic, queue_id, offset, 1)
        if not result.messages or result.queue_offsets[0] != offset:
            return None
        try:
            msg = decode_record(result.messages[0])
        except RecordError:
            return None
        msg.queue_offset = offset
        return msg

    async def _expired(
        self,
        group: str,
        topic: str,
        queue_id: int,
        state: QueueState,
        want: int,
        invisible_ms: int,
        max_attempts: int,
    ) -> list[Received]:
        out: list[Received] = []
        now = now_ms()
        for offset in sorted(o for o, e in state.inflight.items() if e.deadline <= now):
            if len(out) >= want:
                break
            entry = state.inflight[offset]
            msg = self._read(group, topic, queue_id, offset)
            if msg is None:  # cleaned away by the store: nothing left to deliver
                self._drop(state, offset)
                continue
            if entry.attempts >= max_attempts:
                if await self._to_dlq(group, msg):
                    self._drop(state, offset)
                else:  # try again after another invisible time
                    entry.deadline = now + invisible_ms
                continue
            attempt = entry.attempts + 1
            token = self._take(state, offset, invisible_ms, attempt)
            out.append(Received(msg, self._handle(queue_id, offset, token), attempt, invisible_ms))
        return out

    def _fresh(
        self,
        group: str,
        topic: str,
        queue_id: int,
        state: QueueState,
        want: int,
        invisible_ms: int,
        codes: list[int] | None,
        record_filter: RecordFilter | None,
    ) -> list[Received]:
        out: list[Received] = []
        store = self.broker.store
        while len(out) < want:
            room = min(
                want - len(out),
                MAX_INFLIGHT_PER_QUEUE - len(state.inflight),
                MAX_INFLIGHT - self.inflight_total,
            )
            if room <= 0 or state.next >= store.get_max_offset_in_queue(topic, queue_id):
                break
            result = store.get_message(
                group, topic, queue_id, state.next, room, codes, record_filter
            )
            for record, offset in zip(result.messages, result.queue_offsets, strict=True):
                try:
                    msg = decode_record(record)
                except RecordError:
                    log.warning("pop: undecodable record at %s/%d/%d", topic, queue_id, offset)
                    continue
                msg.queue_offset = offset
                token = self._take(state, offset, invisible_ms, 1)
                out.append(Received(msg, self._handle(queue_id, offset, token), 1, invisible_ms))
            if result.next_begin_offset <= state.next:
                break
            state.next = result.next_begin_offset
        return out

    async def _pop_now(
        self,
        group: str,
        topic: str,
        queue_ids: list[int],
        want: int,
        invisible_ms: int,
        codes: list[int] | None,
        max_attempts: int,
        fifo: bool,
        record_filter: RecordFilter | None,
    ) -> list[Received]:
        out: list[Received] = []
        now = now_ms()
        states = self.states
        store = self.broker.store
        committed = self.broker.consumer_offset_manager.query_offsets(group, topic)
        for queue_id in queue_ids:
            if len(out) >= want:
                break
            if (group, topic, queue_id) not in states:
                # Nothing in flight and nothing past the group's offset (most queues of a
                # wide topic, most of the time): passed over without a state, an offset
                # commit or a look at who pulls it, a receive reading every queue.
                end = store.get_max_offset_in_queue(topic, queue_id)
                start = committed.get(queue_id, -1)
                if start >= end or (
                    start < 0 and store.get_min_offset_in_queue(topic, queue_id) >= end
                ):
                    continue
            if self._pulled(group, topic, queue_id):  # a 4.x member's: left to it
                self._release(group, topic, queue_id)
                continue
            state = self._state(group, topic, queue_id)
            # FIFO: nothing of a queue while a message of it is still invisible; then the
            # ones that came back, in order, before anything new.
            if not fifo or all(e.deadline <= now for e in state.inflight.values()):
                out += await self._expired(
                    group, topic, queue_id, state, want - len(out), invisible_ms, max_attempts
                )
                if not fifo or not state.inflight:
                    out += self._fresh(
                        group,
                        topic,
                        queue_id,
                        state,
                        want - len(out),
                        invisible_ms,
                        codes,
                        record_filter,
                    )
            self._settle(group, topic, queue_id, state)
        return out

    def _next_deadline(self, group: str, topic: str) -> int | None:
        deadlines = [
            entry.deadline
            for (g, t, _), state in self.states.items()
            if g == group and t == topic
            for entry in state.inflight.values()
        ]
        return min(deadlines) if deadlines else None

    async def receive(
        self,
        group: str,
        topic: str,
        queue_ids: list[int],
        *,
        batch: int,
        invisible_ms: int,
        long_polling_ms: int,
        expression: str,
        max_attempts: int,
        fifo: bool = False,
        record_filter: RecordFilter | None = None,
    ) -> list[Received]:
        """Messages for ``group`` from ``queue_ids`` (tried in turn), waiting up to
        ``long_polling_ms`` for one to arrive or come back; ``fifo``: each queue's in order,
        one batch of it in flight at a time.  ``expression`` is a tag expression;
        ``record_filter`` a SQL92 subscription's test of each record (a record it refuses is
        passed over, as a 4.x SQL92 pull passes over it: the group's offset moves past it)."""
        sub = SubscriptionData.build(topic, expression)
        codes = None if sub.matches_all else list(sub.code_set)
        wanted = set(sub.tags_set)
        until = trio.current_time() + min(long_polling_ms, MAX_LONG_POLLING_MS) / 1000
        batch = max(1, min(batch, MAX_BATCH))
        hold = self.broker.pull_hold
        while True:
            got = await self._pop_now(
                group,
                topic,
                queue_ids,
                batch,
                invisible_ms,
                codes,
                max_attempts,
                fifo,
                record_filter,
            )
            if wanted:  # the consume queue matched hash codes: check the tags themselves
                got = self._only_tags(group, topic, got, wanted)
            if got or trio.current_time() >= until:
                return got
            wake_at = until
            deadline = self._next_deadline(group, topic)
            if deadline is not None:
                wake_at = min(wake_at, trio.current_time() + max(0, deadline - now_ms()) / 1000)
            # An arrival in any queue of the topic, or a state change (an ack, a reset): one
            # event each, whatever the number of queues.
            arrival = hold.waiter(topic, ANY_QUEUE)
            changed = self._changed
            try:
                with trio.move_on_at(wake_at):
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(_wait_then_cancel, arrival, nursery.cancel_scope)
                        nursery.start_soon(_wait_then_cancel, changed, nursery.cancel_scope)
            finally:
                hold.release(topic, ANY_QUEUE, arrival)

    def _only_tags(
        self, group: str, topic: str, got: list[Received], wanted: set[str]
    ) -> list[Received]:
        kept = []
        for item in got:
            if item.message.tags in wanted:
                kept.append(item)
            else:  # a hash collision: not this group's, acked at once
                self.ack(group, topic, item.handle)
        return kept

    # -- what the tools show -------------------------------------------------------------------

    def inflight_view(self, group: str | None = None, topic: str | None = None) -> list[dict]:
        """Per (group, topic, queue) with messages in flight (received, not acked): how many,
        how many of them are still invisible, the read point, and the oldest one (the lowest
        offset: what holds the group's offset back) with its remaining invisible time (0 once
        it can be received again).  At most :data:`MAX_VIEW_ROWS` queues, by group, topic and
        queue id."""
        now = now_ms()
        rows: list[dict] = []
        for (g, t, queue_id), state in sorted(self.states.items()):
            if len(rows) >= MAX_VIEW_ROWS:
                break
            if not state.inflight or (group and g != group) or (topic and t != topic):
                continue
            oldest = min(state.inflight)
            rows.append(
                {
                    "group": g,
                    "topic": t,
                    "queueId": queue_id,
                    "inFlight": len(state.inflight),
                    "invisible": sum(1 for e in state.inflight.values() if e.deadline > now),
                    "readOffset": state.next,
                    "oldestOffset": oldest,
                    "oldestAttempts": state.inflight[oldest].attempts,
                    "oldestInvisibleMs": max(0, state.inflight[oldest].deadline - now),
                }
            )
        return rows

    def inflight_counts(self) -> dict[tuple[str, str], int]:
        """Messages in flight per (group, topic)."""
        counts: dict[tuple[str, str], int] = {}
        for (g, t, _), state in list(self.states.items()):
            if state.inflight:
                counts[g, t] = counts.get((g, t), 0) + len(state.inflight)
        return counts

    # -- ack and change -----------------------------------------------------------------------

    def _entry(self, group: str, topic: str, handle: str) -> tuple[int, int, QueueState]:
        queue_id, offset, token = self._parse(handle)
        state = self.states.get((group, topic, queue_id))
        entry = state.inflight.get(offset) if state is not None else None
        if state is None or entry is None or entry.token != token:
            raise HandleError("the receipt handle is expired or was replaced by a newer one")
        return queue_id, offset, state

    def ack(self, group: str, topic: str, handle: str) -> None:
        """The message ``handle`` names acked; a handle a reset made stale is acked without
        effect (see the module doc); HandleError for any other unknown handle."""
        try:
            queue_id, offset, state = self._entry(group, topic, handle)
        except HandleError:
            if self._stale_by_reset(group, topic, handle):
                return
            raise
        self._drop(state, offset)
        self._settle(group, topic, queue_id, state)

    def reset(self, group: str, topic: str, queue_ids: list[int]) -> None:
        """The group's offsets of these queues were reset (and committed): each queue's state
        goes, what it had in flight too, so the next receive reads from the reset offset (see
        the module doc); a receive waiting for a deadline looks again."""
        now = now_ms()
        for key, mark in list(self.reset_marks.items()):
            if mark.until <= now:
                del self.reset_marks[key]
        for queue_id in queue_ids:
            key = (group, topic, queue_id)
            state = self.states.pop(key, None)
            if state is None or not state.inflight:
                continue
            self.inflight_total -= len(state.inflight)
            until = max(entry.deadline for entry in state.inflight.values())
            old = self.reset_marks.get(key)
            if old is not None:
                until = max(until, old.until)
            self.reset_marks[key] = ResetMark(self._token, until)
        self._changed.set()
        self._changed = trio.Event()

    def _stale_by_reset(self, group: str, topic: str, handle: str) -> bool:
        queue_id, _, token = self._parse(handle)
        mark = self.reset_marks.get((group, topic, queue_id))
        return mark is not None and token <= mark.token and now_ms() < mark.until

    def change_invisible(self, group: str, topic: str, handle: str, invisible_ms: int) -> str:
        queue_id, offset, state = self._entry(group, topic, handle)
        attempts = state.inflight[offset].attempts
        token = self._take(state, offset, invisible_ms, attempts)
        self._changed.set()  # a receive waiting for a deadline recomputes it
        self._changed = trio.Event()
        return self._handle(queue_id, offset, token)

    async def forward_to_dlq(self, group: str, topic: str, handle: str) -> bool:
        """The in-flight message ``handle`` names into the group's DLQ, and acked (False when
        the DLQ refused it: it stays in flight)."""
        queue_id, offset, state = self._entry(group, topic, handle)
        msg = self._read(group, topic, queue_id, offset)
        if msg is not None and not await self._to_dlq(group, msg):
            return False
        self._drop(state, offset)
        self._settle(group, topic, queue_id, state)
        return True

    # -- dead letters -------------------------------------------------------------------------

    async def _to_dlq(self, group: str, msg: MessageExt) -> bool:
        """``msg`` into the group's DLQ through the send path; False when it was refused."""
        from pymq.proxy.service import send_via_broker

        dlq = dlq_topic(group)
        topics = self.broker.topic_config_manager
        if topics.select(dlq) is None:
            await topics.create_in_send_back(dlq, 1, PERM_WRITE, 0)
        props = dict(msg.properties)
        props.setdefault(
            PROPERTY_ORIGIN_MESSAGE_ID, props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, "")
        )
        header = SendMessageRequestHeader(
            producer_group=group,
            topic=dlq,
            default_topic="TBW102",
            default_topic_queue_nums=1,
            queue_id=0,
            sys_flag=msg.sys_flag,
            born_timestamp=msg.born_timestamp,
            flag=msg.flag,
            properties=encode_properties(props),
            reconsume_times=msg.reconsume_times,
        )
        answer = await send_via_broker(self.broker, POP_CLIENT, header, msg.body)
        if answer.code != ResponseCode.SUCCESS:
            log.warning("pop: moving a message of %s to %s failed: %s", group, dlq, answer.remark)
            return False
        return True


async def _wait_then_cancel(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()
