"""TimerMessageService: delivery of timer messages (RocketMQ 5's TimerMessageStore service).

The put path (pymq/store/timer/rewrite.py) stores a timer message in ``rmq_sys_wheel_timer``
queue 0 with its due time in TIMER_OUT_MS.  Three tasks, in the broker's nursery (a slave's
differ: see "Master/slave" below):

- enqueue: reads that queue in order (from the checkpoint's offset) and enters each message in
  the wheel (:class:`pymq.store.timer.store.TimerStore`), or delivers it at once when due;
- dequeue: takes each slot as it begins and puts each of its messages, at its due time (never
  before), to its real topic and queue, as the schedule service does for delay levels: the original
  properties, less REAL_TOPIC/REAL_QID, plus RocketMQ 5's TIMER_ENQUEUE_MS (when the message
  reached the timer topic) and TIMER_DEQUEUE_MS (when it was delivered).  A timer further out
  than the roll window is put to the timer topic again when its window's last slot comes
  round, with TIMER_ROLL_TIMES counting how often (as RocketMQ 5), and entered afresh;
- flush: every ``timerFlushIntervalMs`` makes the timer log, checkpoint and wheel durable.

``timerStopEnqueue`` / ``timerStopDequeue`` pause the first two.  A put that fails is retried
every FAILED_PUT_RETRY_SECONDS, so nothing due is dropped while the store refuses writes.

A timer that is already due when the enqueue task reads it (the task fell behind, was paused,
or the due time passed between the send and the read) is never entered in the wheel: it is put
at once, with
TIMER_ENQUEUE_MS set to Java's ``Long.MAX_VALUE`` (RocketMQ 5's mark for "never enqueued"), and
it is not counted as pending.

Deleted topics: a timer whose real topic no longer exists, or was deleted after the timer was
stored (and created again since), is dropped when read, at enqueue or at dequeue or roll time
(``dropped`` counts them; logged at debug).  The deletion times are kept in
``config/timerdeletedtopics`` under the timer directory, written when a topic is deleted, at
most :data:`MAX_DELETED_TOPICS` of them; one is forgotten once the wheel is
``timerMaxDelaySec`` past it (every timer stored before it is handled by then).

Recall (RocketMQ 5's RECALL_MESSAGE, pymq/broker/processors/recall.py): a recall stores a
*marker*, a timer message with TIMER_DEL_UNIQKEY ``{topic}+{uniqId}`` and the due time of the
message it cancels, so both are entered in the same slot.  When the slot is delivered its
markers are read first and the messages they name are not delivered (``recalled`` counts
them); a marker is never delivered itself, and one already due when read cancels nothing
(``recalls_late``).  Markers roll with their messages, and are not pending timers in the
counts.  Being stored messages, markers survive a crash as the timers do.

Master/slave (``replica=True`` on a slave, RocketMQ 5's shape): the slave replicates the commit
log, timer-topic messages included, and its enqueue task enters them in its own wheel; it
delivers nothing.  Its "now" is its master's delivery point instead of the clock: every
second (TIMER_CHECKPOINT_SYNC_PERIOD) it asks GET_TIMER_CHECK_POINT, whose answer carries the
master's ``delivered_ms`` and the commit-log offset at which the deliveries up to it were
stored, and it follows that point (passing the slots before it without putting anything) once
its own commit log reaches that offset, so a slot is passed only when the slave holds its
deliveries.  A timer read when its slot is behind that point was delivered by the master and is
not entered.  The slave keeps all replicated timers, whatever its (lagging) topic table says.
Its timer store is flushed and checkpointed as a master's.  Promoted (restarted on its store as
a master, RocketMQ 4.x's way; a DLedger member at its role change), it delivers from the point
it had followed: every pending timer is delivered, late ones at once; delivered twice can be
only what the old master delivered, or rolled, after the last point the slave followed (at most
TIMER_CHECKPOINT_SYNC_PERIOD plus the replication lag before the master stopped), which
at-least-once allows.  A slave that starts with no timer checkpoint begins at its clock's slot.

Counters for the metrics (RocketMQ 5's ``rocketmq_timer_*``): timer-topic messages read
(``enqueue_total``) and put out of the wheel (``dequeue_total``: delivered, or put back to the
timer topic by a roll, both counted as RocketMQ 5 counts them) per real topic since start, and
the pending count per topic that the timer store keeps durable (pymq/store/timer/counts.py).
"""

from __future__ import annotations

import collections
import json
import logging
import os
import struct
from collections.abc import Callable

import trio

from pymq.common.message_ext import (
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_DEL_UNIQKEY,
    PROPERTY_TIMER_DEQUEUE_MS,
    PROPERTY_TIMER_ENQUEUE_MS,
    PROPERTY_TIMER_OUT_MS,
    PROPERTY_TIMER_ROLL_TIMES,
    MessageExt,
    moved_to,
)
from pymq.common.recall_handle import delete_key
from pymq.common.topic import TIMER_TOPIC
from pymq.store.consume_queue import ENTRY as CQ_ENTRY
from pymq.store.message_store import DefaultMessageStore
from pymq.store.timer.counts import add
from pymq.store.timer.log import TimerEntry
from pymq.store.timer.store import DueSlot, TimerStore

log = logging.getLogger(__name__)

IDLE_WAIT_SECONDS = 1.0
"""The enqueue task looks at the timer topic at least this often without an arrival."""
PAUSED_RECHECK_SECONDS = 0.1
"""How often a paused task (timerStopEnqueue / timerStopDequeue) looks whether to resume."""
MAX_SLEEP_SECONDS = 0.5
"""The dequeue task's longest sleep, so that a wall clock set forward is noticed soon."""
FAILED_PUT_RETRY_SECONDS = 1.0
YIELD_EVERY = 64
"""Entries (or empty slots) handled between two yields to the other tasks."""
NEVER_ENQUEUED_MS = str(2**63 - 1)
"""TIMER_ENQUEUE_MS of a timer put at once without entering the wheel (RocketMQ 5)."""
MAX_DELETED_TOPICS = 10_000
"""Deleted topics whose deletion time is kept (the oldest is forgotten beyond it)."""
TIMER_DELETED_FILE = os.path.join("config", "timerdeletedtopics")
REPLICA_RECHECK_SECONDS = 0.1
"""How often a replica's dequeue task looks whether its master's delivery point moved."""
MAX_MASTER_MARKS = 64
"""A replica keeps at most this many of its master's delivery points not yet replicated."""
CHECKPOINT_BODY = struct.Struct(">qqqqqqq")
"""RocketMQ 5's TimerCheckpoint.encode: seven longs, 56 bytes."""
DELIVERED_PHY_OFFSET = "deliveredPhyOffset"
"""GET_TIMER_CHECK_POINT's answer: pymq's extField with :attr:`delivered_phy_offset`."""
ENQUEUE_LATENCY_WINDOW_SECONDS = 2.0
"""rocketmq_timer_enqueue_latency is 0 when nothing was entered for this long (RocketMQ 5)."""


def is_marker(msg: MessageExt) -> bool:
    """A recall marker (RocketMQ 5's delete message): it cancels the timer its
    TIMER_DEL_UNIQKEY names in its slot, and is never delivered itself."""
    return PROPERTY_TIMER_DEL_UNIQKEY in msg.properties


class TimerMessageService:
    def __init__(
        self,
        store: DefaultMessageStore,
        topic_exists: Callable[[str], bool] | None = None,
        *,
        replica: bool = False,
    ) -> None:
        """``replica``: a slave's service (see the module docstring), fixed for each
        :meth:`run` (a DLedger member's broker stops the service and runs it again in the
        other mode when its role changes, as a restart in the new role would)."""
        self.store = store
        self.config = store.config
        self.topic_exists = topic_exists
        self.replica = replica
        self.horizon = 0
        """A replica: the master's delivery point it has followed (every slot before it was
        delivered by the master, and its deliveries are in this store)."""
        self._master_marks: collections.deque[tuple[int, int]] = collections.deque(
            maxlen=MAX_MASTER_MARKS
        )
        self.delivered_phy_offset = 0
        """A master: the commit log's end when the last slot's deliveries were done (what
        GET_TIMER_CHECK_POINT tells a slave with the delivery point)."""
        self.timers: TimerStore | None = None
        self._arrival = trio.Event()
        self.delivered = 0
        self.dropped = 0
        """Timers dropped because their real topic was deleted."""
        self.recalled = 0
        """Timers not delivered because a recall marker named them."""
        self.recalls_late = 0
        """Recall markers read when already due (their message was delivered)."""
        self.enqueue_total: dict[str, int] = {}
        self.dequeue_total: dict[str, int] = {}
        self.last_enqueue_at = -1.0
        """trio.current_time() when the enqueue task last read a timer (-1: never)."""
        self.last_enqueue_store_ms = 0
        self.deleted_path = os.path.join(self.config.timer_dir, TIMER_DELETED_FILE)
        self.deleted: dict[str, int] = {}
        """Real topic -> when it was last deleted (store clock, epoch ms)."""

    def notify_arrival(self, topic: str, queue_id: int) -> None:
        if topic == TIMER_TOPIC:
            self._arrival.set()

    def open(self) -> TimerStore:
        """Recover the timer store (blocking: a scan of the log since the last checkpoint)."""
        config = self.config
        timers = TimerStore(
            config.timer_dir,
            precision_ms=config.timer_precision_ms,
            roll_window_slots=config.timer_roll_window_slot,
            log_file_size=config.mapped_file_size_timer_log,
        )
        timers.open(self.store.clock_ms())
        self.deleted = self._load_deleted()
        if not timers.counts_known:
            # A store written before the counts file: count the pending entries once.
            for entry in timers.pending_entries():
                msg = self.store.look_message_by_offset(entry.phy_offset, entry.phy_size)
                if msg is not None and not is_marker(msg):
                    add(timers.counts, self.real_topic(msg), 1)
            timers.counts_known = True
        return timers

    # --- deleted topics ------------------------------------------------------------------

    def _load_deleted(self) -> dict[str, int]:
        try:
            with open(self.deleted_path, "rb") as f:
                data = json.loads(f.read())
            return {str(k): int(v) for k, v in data.items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.error(
                "%s is unreadable (%s): deleted topics are not remembered", self.deleted_path, exc
            )
            return {}

    def _save_deleted(self, deleted: dict[str, int]) -> None:
        os.makedirs(os.path.dirname(self.deleted_path), exist_ok=True)
        tmp = self.deleted_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(deleted, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.deleted_path)

    async def on_topic_deleted(self, topic: str) -> None:
        """DELETE_TOPIC_IN_BROKER: its pending timers are dropped as they come round (see the
        module docstring), its counts go (RocketMQ 5's removeTimingCount)."""
        deleted = self.deleted
        deleted.pop(topic, None)
        deleted[topic] = self.store.clock_ms()
        timers = self.timers
        if timers is not None:
            timers.counts.pop(topic, None)
            horizon = timers.delivered_ms - self.config.timer_max_delay_sec * 1000
            horizon -= 2 * timers.precision_ms
            for name, at in list(deleted.items()):
                if at < horizon:
                    del deleted[name]
        while len(deleted) > MAX_DELETED_TOPICS:
            del deleted[next(iter(deleted))]
        self.enqueue_total.pop(topic, None)
        self.dequeue_total.pop(topic, None)
        await trio.to_thread.run_sync(self._save_deleted, dict(deleted))

    def _stale(self, msg: MessageExt, topic: str) -> bool:
        """Whether the timer was stored before its topic's last deletion (its count is gone
        with the topic's)."""
        at = self.deleted.get(topic)
        return at is not None and msg.store_timestamp <= at

    def _drop(self, msg: MessageExt, topic: str) -> bool:
        """Whether the timer is to be dropped (its real topic deleted); counted, logged."""
        if self._stale(msg, topic) or (
            self.topic_exists is not None and not self.topic_exists(topic)
        ):
            self.dropped += 1
            log.debug("timer message %s dropped: topic %s was deleted", msg.msg_id, topic)
            return True
        return False

    @staticmethod
    def real_topic(msg: MessageExt) -> str:
        return msg.properties.get(PROPERTY_REAL_TOPIC, msg.topic)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        timers = self.timers = await trio.to_thread.run_sync(self.open)
        self.horizon = timers.read_ms
        self.delivered_phy_offset = self.store.max_phy_offset
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._enqueue_loop, timers)
                nursery.start_soon(self._dequeue_loop, timers)
                nursery.start_soon(self._flush_loop, timers)
                task_status.started()
        finally:
            with trio.CancelScope(shield=True):
                try:
                    await self._flush(timers)
                finally:
                    timers.close()

    async def _flush(self, timers: TimerStore) -> None:
        cp, slots = timers.snapshot()
        await trio.to_thread.run_sync(timers.flush_blocking, cp, slots)
        timers.flushed(cp, slots)

    async def _flush_loop(self, timers: TimerStore) -> None:
        while True:
            await trio.sleep(self.config.timer_flush_interval_ms / 1000)
            await self._flush(timers)

    async def _wait_arrival(self, seconds: float) -> None:
        if self._arrival.is_set():
            self._arrival = trio.Event()
            return
        with trio.move_on_after(seconds):
            await self._arrival.wait()
        self._arrival = trio.Event()

    async def _enqueue_loop(self, timers: TimerStore) -> None:
        store = self.store
        while True:
            if self.config.timer_stop_enqueue:
                await trio.sleep(PAUSED_RECHECK_SECONDS)
                continue
            cq = store.consume_queues.find(TIMER_TOPIC, 0)
            offset = timers.enqueue_offset
            if cq is None or offset >= cq.max_offset_in_queue:
                await self._wait_arrival(IDLE_WAIT_SECONDS)
                continue
            if offset < cq.min_offset_in_queue:
                log.error(
                    "timer topic entries %d..%d were cleaned before being entered",
                    offset,
                    cq.min_offset_in_queue,
                )
                offset = timers.enqueue_offset = cq.min_offset_in_queue
            # Up to YIELD_EVERY entries read in one go (at most to the end of their file).
            raw = cq.entries_from(offset, YIELD_EVERY)
            if not raw:
                await self._wait_arrival(PAUSED_RECHECK_SECONDS)
                continue
            self.last_enqueue_at = trio.current_time()
            for phy_offset, size, _tags_code in CQ_ENTRY.iter_unpack(raw):
                msg = store.look_message_by_offset(phy_offset, size)
                if msg is None:
                    log.error("timer message at %d is gone, skipping offset %d", phy_offset, offset)
                else:
                    await self._enqueue(timers, msg, phy_offset, size)
                offset += 1
                timers.enqueue_offset = offset
            await trio.lowlevel.checkpoint()

    async def _enqueue(
        self, timers: TimerStore, msg: MessageExt, phy_offset: int, size: int
    ) -> None:
        """Enter one timer-topic message in the wheel, or deliver it now (see the module
        docstring)."""
        # A replica's "now" is the master's delivery point: what is due before it the master
        # has delivered (or will have, by the time the slave passes it).
        now = timers.read_ms if self.replica else self.store.clock_ms()
        props = msg.properties
        try:
            deliver_ms = int(props.get(PROPERTY_TIMER_OUT_MS, now))
        except ValueError:
            deliver_ms = now  # not one the put path wrote: delivered at once
        topic = props.get(PROPERTY_REAL_TOPIC, msg.topic)
        self.last_enqueue_store_ms = msg.store_timestamp
        add(self.enqueue_total, topic, 1)
        marker = PROPERTY_TIMER_DEL_UNIQKEY in props
        if not self.replica and self._drop(msg, topic):
            pass  # a replica keeps them all: its topics may lag the master's
        elif timers.enter(deliver_ms, phy_offset, size, now):
            if not marker:
                add(timers.counts, topic, 1)
        elif self.replica:
            pass  # delivered by the master
        elif marker:  # its message's slot is delivered already: nothing to cancel
            self.recalls_late += 1
            log.debug("recall of %s came after its due time", msg.unique_key)
        else:
            await self._deliver(msg, never_entered=True)

    async def _dequeue_loop(self, timers: TimerStore) -> None:
        store = self.store
        slots = 0
        while True:
            if self.config.timer_stop_dequeue:
                await trio.sleep(PAUSED_RECHECK_SECONDS)
                continue
            now = self.follow_horizon() if self.replica else store.clock_ms()
            # A master takes a slot as it begins and puts each timer at its due time; a
            # replica passes a slot only once its master has delivered all of it.
            ahead = 0 if self.replica else timers.precision_ms
            slot = timers.take_due(now, ahead)
            if slot is None:
                wait = (timers.next_due_ms() - ahead - now) / 1000
                if self.replica:
                    wait = REPLICA_RECHECK_SECONDS
                await trio.sleep(min(max(wait, 0.001), MAX_SLEEP_SECONDS))
                continue
            # The counts change with delivered_ms, not before: a checkpoint taken while this
            # slot is half delivered has the counts of before it (see counts.py).
            started = store.clock_ms()
            if self.replica:
                left = self._pass_slot(slot)
            else:
                left = await self._handle_slot(slot)
            timers.delivered_ms = timers.read_ms
            if not self.replica:
                self.delivered_phy_offset = store.max_phy_offset
            for topic, n in left.items():
                if self.deleted.get(topic, -1) < started:  # else its count went meanwhile
                    add(timers.counts, topic, -n)
            slots += 1
            if slots % YIELD_EVERY == 0 or slot.due or slot.rolled:
                await trio.lowlevel.checkpoint()

    # --- master/slave ----------------------------------------------------------------------

    def checkpoint_body(self) -> bytes | None:
        """GET_TIMER_CHECK_POINT's body: RocketMQ 5's TimerCheckpoint encoding (lastReadTimeMs,
        lastTimerLogFlushPos, lastTimerQueueOffset, masterTimerQueueOffset, and the data
        version's stateVersion, timestamp, counter), with this service's live delivery point;
        None without a timer store."""
        timers = self.timers
        if timers is None:
            return None
        return CHECKPOINT_BODY.pack(
            timers.delivered_ms,
            timers.log.end,
            timers.enqueue_offset,
            timers.enqueue_offset,
            0,
            self.store.clock_ms(),
            0,
        )

    def follow_master(self, read_ms: int, phy_offset: int) -> None:
        """A replica: the master has delivered every slot before ``read_ms``, and its commit
        log held those deliveries at ``phy_offset``.  Followed once this store has
        replicated that far (:meth:`follow_horizon`)."""
        marks = self._master_marks
        if not marks or marks[-1] != (read_ms, phy_offset):
            marks.append((read_ms, phy_offset))

    def follow_horizon(self) -> int:
        """A replica's delivery point: the latest master mark whose deliveries it holds."""
        marks = self._master_marks
        replicated = self.store.max_phy_offset
        while marks and marks[0][1] <= replicated:
            read_ms, _ = marks.popleft()
            self.horizon = max(self.horizon, read_ms)
        return self.horizon

    def _pass_slot(self, slot: DueSlot) -> dict[str, int]:
        """A replica passes a slot its master has delivered: nothing is put; the pending
        timers it held per real topic."""
        left: dict[str, int] = {}
        for _, msg in self._messages(slot.due + slot.rolled, "passed"):
            topic = self.real_topic(msg)
            if not is_marker(msg) and not self._stale(msg, topic):
                add(left, topic, 1)
        return left

    def _messages(self, entries: list[TimerEntry], what: str) -> list[tuple[int, MessageExt]]:
        """The stored messages of ``entries``, each with its due time (epoch ms)."""
        out = []
        for entry in entries:
            msg = self.store.look_message_by_offset(entry.phy_offset, entry.phy_size)
            if msg is None:
                log.error("timer message at %d is gone: not %s", entry.phy_offset, what)
                continue
            out.append((entry.deliver_ms, msg))
        return out

    async def _handle_slot(self, slot: DueSlot) -> dict[str, int]:
        """Deliver (or drop, or roll) the timers of ``slot``; the pending timers it held per
        real topic."""
        left: dict[str, int] = {}
        due = self._messages(slot.due, "delivered")
        # Recall markers of the slot first (RocketMQ 5's delete list): neither they nor the
        # messages they name are delivered.
        recalled = {m.properties[PROPERTY_TIMER_DEL_UNIQKEY] for _, m in due if is_marker(m)}
        for due_ms, msg in due:
            if recalled and is_marker(msg):
                continue
            topic = self.real_topic(msg)
            if not self._stale(msg, topic):
                add(left, topic, 1)
            if recalled and delete_key(topic, msg.unique_key or "") in recalled:
                self.recalled += 1
                log.debug("timer message %s recalled: not delivered", msg.unique_key)
            elif not self._drop(msg, topic):
                await self._until(due_ms)
                await self._deliver(msg)
        for _, msg in self._messages(slot.rolled, "rolled"):
            topic = self.real_topic(msg)
            marker = is_marker(msg)  # rolled as well, to meet its message in their slot
            if not marker and not self._stale(msg, topic):
                add(left, topic, 1)
            if not self._drop(msg, topic):
                await self._put(self.rolled_message(msg))
                if not marker:
                    add(self.dequeue_total, topic, 1)  # RocketMQ 5 counts a roll's put too
        return left

    async def _until(self, due_ms: int) -> None:
        """Sleep until the clock reaches ``due_ms`` (a slot is taken as it begins; the clock is
        read again at least every MAX_SLEEP_SECONDS, so that a jump is seen)."""
        clock = self.store.clock_ms
        while (left := due_ms - clock()) > 0:
            await trio.sleep(min(left / 1000, MAX_SLEEP_SECONDS))

    async def _deliver(self, msg: MessageExt, *, never_entered: bool = False) -> None:
        """Put ``msg`` (a timer-topic message) to its real topic and queue; retried until it is
        stored."""
        enqueue_ms = NEVER_ENQUEUED_MS if never_entered else None
        real = self.real_message(msg, self.store.clock_ms(), enqueue_ms)
        await self._put(real)
        self.delivered += 1
        add(self.dequeue_total, real.topic, 1)

    async def _put(self, msg: MessageExt) -> None:
        """Put ``msg``, retrying until it is stored."""
        while True:
            result = await self.store.put(msg)
            if result.appended:
                return
            log.error(
                "putting a timer message to %s failed: %s %s, retrying in %.0f s",
                msg.topic,
                result.status.value,
                result.reason,
                FAILED_PUT_RETRY_SECONDS,
            )
            await trio.sleep(FAILED_PUT_RETRY_SECONDS)

    @staticmethod
    def rolled_message(msg: MessageExt) -> MessageExt:
        """A timer not due when its slot came round (further out than the roll window), as a
        fresh timer-topic message (RocketMQ 5 re-puts it the same way): so a message waiting
        days is never left in a commit-log file old enough to be cleaned."""
        props = dict(msg.properties)
        try:
            rolled = int(props.get(PROPERTY_TIMER_ROLL_TIMES, "0"))
        except ValueError:
            rolled = 0
        props[PROPERTY_TIMER_ROLL_TIMES] = str(rolled + 1)
        return MessageExt(
            topic=TIMER_TOPIC,
            body=msg.body,
            flag=msg.flag,
            properties=props,
            queue_id=0,
            sys_flag=msg.sys_flag,
            born_timestamp=msg.born_timestamp,
            born_host=msg.born_host,
            store_host=msg.store_host,
            reconsume_times=msg.reconsume_times,
        )

    @staticmethod
    def real_message(msg: MessageExt, now_ms: int, enqueue_ms: str | None = None) -> MessageExt:
        props = dict(msg.properties)
        topic = props.pop(PROPERTY_REAL_TOPIC, msg.topic)
        queue_id = int(props.pop(PROPERTY_REAL_QUEUE_ID, "0") or 0)
        props[PROPERTY_TIMER_ENQUEUE_MS] = enqueue_ms or str(msg.store_timestamp)
        props[PROPERTY_TIMER_DEQUEUE_MS] = str(now_ms)
        return moved_to(msg, topic, queue_id, props)
