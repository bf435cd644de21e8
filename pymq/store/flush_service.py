"""Flush services: the commit log's (group commit or timed) and the consume queues' (timed).

``CommitLogFlushService`` makes appended bytes durable.  With SYNC_FLUSH it is a group commit:
each put waits (:meth:`wait_flushed`) until the sync covering its bytes is done; the task syncs
everything appended so far in one worker-thread call, so concurrent puts share one ``fdatasync``.
With ASYNC_FLUSH it syncs every ``flushIntervalCommitLog`` ms once ``flushCommitLogLeastPages``
pages are dirty, and everything every ``flushCommitLogThoroughInterval`` ms.

``ConsumeQueueFlushService`` syncs the consume queues every ``flushIntervalConsumeQueue`` ms
(``flushConsumeQueueLeastPages`` pages) and, every ``flushConsumeQueueThoroughInterval`` ms, all of
them plus the full index files and then the checkpoint, whose timestamps are taken *before* the
files are synced so that they never claim more than is durable.
"""

from __future__ import annotations

import collections
import itertools
import logging
from collections.abc import Callable
from typing import Protocol

import trio

from pymq.common.periodic import every
from pymq.store.checkpoint import StoreCheckpoint
from pymq.store.commitlog import CommitLog
from pymq.store.config import MessageStoreConfig
from pymq.store.consume_queue_table import ConsumeQueueTable
from pymq.store.index_service import IndexService
from pymq.store.mapped_file_queue import FlushJob, NativeSyncThread, SyncThread, sync_thread

log = logging.getLogger(__name__)

# How often group-commit waiters are checked for an expired syncFlushTimeout.
EXPIRY_CHECK_INTERVAL = 0.05


class AnswerSink(Protocol):
    """Where :meth:`CommitLogFlushService.hold_answer` writes the answers it held (a
    connection): all those a sync released to it, in one call (an item may hold several
    answers' frames back to back)."""

    def answer_frames(self, frames: list[bytes]) -> None: ...


# A held answer: (offset, deadline, frame, late): ``frame`` once the bytes before ``offset``
# are durable, ``late()``'s frame once ``deadline`` (trio time) passes first.
_Held = tuple[int, float, bytes, Callable[[], bytes]]


def _late_frame(late: Callable[[], bytes], frames: list[bytes]) -> None:
    """Add ``late()``'s frame to ``frames``; if it raises, that request goes unanswered and
    the others do not."""
    try:
        frames.append(late())
    except Exception:
        log.exception("a held answer's timeout frame raised")


class CommitLogFlushService:
    def __init__(
        self,
        commitlog: CommitLog,
        config: MessageStoreConfig,
        checkpoint: StoreCheckpoint,
        clock_ms: Callable[[], int],
    ) -> None:
        self.commitlog = commitlog
        self.config = config
        self.checkpoint = checkpoint
        self.clock_ms = clock_ms
        # (offset, deadline, callback): callback(True) once bytes before offset are durable,
        # callback(False) when the deadline (trio time) passes first.
        self._waiters: list[tuple[int, float, Callable[[bool], None]]] = []
        # Answer frames held until their bytes are durable, per connection, oldest first; the
        # connections whose deadlines are out of order (syncFlushTimeout lowered meanwhile).
        self._held: dict[AnswerSink, collections.deque[_Held]] = {}
        self._unordered: set[AnswerSink] = set()
        self._wake = trio.Event()
        self._expiry_wanted = trio.Event()
        self._last_thorough = 0
        # The group commit's sync in flight (begun by on_flushed or the task), and whether the
        # group-commit task runs (jobs are begun only then).
        self._job: FlushJob | None = None
        self._begin_failures = 0  # on_flushed could not begin the sync (see there)
        self._sync_thread: SyncThread | NativeSyncThread | None = None
        # The run's clock read directly (trio.current_time's lookups cost every put);
        # trio.current_time until the group commit runs.
        self._now: Callable[[], float] = trio.current_time

    @property
    def flushed_where(self) -> int:
        return self.commitlog.queue.flushed_where

    async def wait_flushed(self, offset: int, timeout_s: float) -> bool:
        """Group commit: wait until bytes before ``offset`` are durable; False on timeout."""
        if self.commitlog.queue.flushed_where >= offset:
            return True
        outcome: list[bool] = []
        done = trio.Event()

        def finished(ok: bool) -> None:
            outcome.append(ok)
            done.set()

        self.on_flushed(offset, timeout_s, finished)
        with trio.move_on_after(timeout_s):  # on time even while a sync hangs
            await done.wait()
        return bool(outcome and outcome[0])

    def on_flushed(self, offset: int, timeout_s: float, callback: Callable[[bool], None]) -> None:
        """Group commit without a waiting task: ``callback(True)`` once bytes before ``offset``
        are durable (at once if they are), ``callback(False)`` once ``timeout_s`` seconds have
        passed first (within ``EXPIRY_CHECK_INTERVAL``, even while a sync hangs).  Callbacks run
        in the flush service's tasks and must not block."""
        if self.commitlog.queue.flushed_where >= offset:
            callback(True)
            return
        self._waiters.append((offset, trio.current_time() + timeout_s, callback))
        self._wanted()

    def hold_answer(
        self,
        offset: int,
        timeout_s: float,
        sink: AnswerSink,
        frame: bytes,
        late: Callable[[], bytes],
    ) -> bool:
        """Group commit for a request whose answer is written whole: ``frame`` (or the
        frames of several requests, back to back) goes to ``sink`` once bytes before
        ``offset`` are durable, ``late()``'s frame once ``timeout_s`` seconds have passed
        first (as :meth:`on_flushed`).  A sync answers
        each sink's requests in one call, oldest first.  False, holding nothing, when the
        bytes are durable already: the caller answers ``frame`` itself.

        A sink's durable answers are released in order; one whose timeout is shorter than an
        older one's (``syncFlushTimeout`` lowered meanwhile) times out on its own deadline,
        ahead of the older one.  Answers of the other ways to wait (:meth:`on_flushed`) may
        be written before or after them."""
        if self.commitlog.queue.flushed_where >= offset:
            return False
        deadline = self._now() + timeout_s
        held = self._held.get(sink)
        if held is None:
            held = self._held[sink] = collections.deque()
        elif deadline < held[-1][1]:
            self._unordered.add(sink)
        held.append((offset, deadline, frame, late))
        self._wanted()
        return True

    def _wanted(self) -> None:
        """A waiter or a held answer was added: wake the task, and begin the sync if none is
        in flight."""
        self._wake.set()
        self._expiry_wanted.set()
        if self._job is None and self._sync_thread is not None:
            # Started here, in the put's own step, not when the task is next scheduled: a busy
            # loop's scheduling round costs about as much as the fdatasync.  The waiter is
            # queued now, so whatever this raises is the task's to meet again, never the
            # put's: its caller would answer the request at once, and the callback again.
            try:
                self._job = self.commitlog.queue.begin_flush(self._sync_thread)
            except Exception:
                self._begin_failures += 1  # logged once, then every 1,000th: one per put
                if self._begin_failures % 1000 == 1:
                    log.exception(
                        "the group commit's sync could not start with the put (%d times)",
                        self._begin_failures,
                    )

    def _settle(self) -> None:
        """Answer the waiters that are durable or out of time; keep the rest."""
        flushed = self.commitlog.queue.flushed_where
        now = trio.current_time()
        waiting, self._waiters = self._waiters, []
        for waiter in waiting:
            offset, deadline, callback = waiter
            if flushed >= offset or deadline <= now:
                try:
                    callback(flushed >= offset)
                except Exception:
                    log.exception("a flush callback raised")
            else:
                self._waiters.append(waiter)
        if self._held:
            self._release_held(flushed, now)

    def _release_held(self, flushed: int, now: float) -> None:
        """Write each sink's held answers that are durable or out of time, in one call per
        sink."""
        for sink, held in list(self._held.items()):
            frames: list[bytes] = []
            while held:
                offset, deadline, frame, late = held[0]
                if flushed >= offset:
                    frames.append(frame)
                elif deadline <= now:
                    _late_frame(late, frames)
                else:
                    break
                held.popleft()
            if held and sink in self._unordered:
                # A later answer may be due before the oldest: its own deadline.
                keep: collections.deque[_Held] = collections.deque()
                for entry in held:
                    if entry[1] <= now:
                        _late_frame(entry[3], frames)
                    else:
                        keep.append(entry)
                held = self._held[sink] = keep
                if all(a[1] <= b[1] for a, b in itertools.pairwise(keep)):
                    self._unordered.discard(sink)  # in order again: the head decides
            if not held:
                del self._held[sink]
                self._unordered.discard(sink)
            if frames:
                try:
                    sink.answer_frames(frames)
                except Exception:
                    log.exception("writing held answers raised")

    async def _flush(self, least_pages: int) -> None:
        queue = self.commitlog.queue
        await queue.flush(least_pages)
        if queue.store_timestamp:
            self.checkpoint.physic_msg_timestamp = queue.store_timestamp

    async def run_group_commit(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._expire_late_waiters)
            self._now = trio.lowlevel.current_clock().current_time
            self._sync_thread = thread = sync_thread("pymq-group-commit")
            task_status.started()
            failures = 0
            try:
                while True:
                    await self._wake.wait()
                    self._wake = trio.Event()
                    while self._waiters or self._held:
                        try:
                            await self._sync_for_waiters()
                            failures = 0
                        except OSError:
                            # Not acknowledging is the honest answer: waiters time out
                            # (FLUSH_DISK_TIMEOUT).  The pages are written again by the next
                            # try (MappedFileQueue._sync_failed), 10 ms later, then backing
                            # off to a try a second while the disk keeps failing.
                            failures += 1
                            if failures == 1 or failures % 60 == 0:
                                log.exception("commit log sync failed (%d in a row)", failures)
                            await trio.sleep(min(1.0, 0.01 * 2 ** min(failures - 1, 7)))
                        self._settle()
            finally:
                self._sync_thread = None
                self._now = trio.current_time  # this run's clock is gone with it
                thread.stop()  # after the sync in flight, which then releases the lock
                self._job = None

    async def _sync_for_waiters(self) -> None:
        """One group-commit sync: the one in flight, or one begun now without a checkpoint
        (:meth:`MappedFileQueue.begin_flush`); when the queue's lock is busy, an awaited flush."""
        if self._job is None and self._sync_thread is not None:
            self._job = self.commitlog.queue.begin_flush(self._sync_thread)
        job = self._job
        if job is None:
            await self._flush(0)
            return
        try:
            await job.wait()
        finally:
            self._job = None
        queue = self.commitlog.queue
        if queue.store_timestamp:
            self.checkpoint.physic_msg_timestamp = queue.store_timestamp

    async def _expire_late_waiters(self) -> None:
        """Answer False to waiters past their deadline while a sync is slow or hangs (Java's
        put thread stops waiting on its own timeout, whatever the flush thread does)."""
        while True:
            if not self._waiters and not self._held:
                await self._expiry_wanted.wait()
                self._expiry_wanted = trio.Event()
                continue
            await trio.sleep(EXPIRY_CHECK_INTERVAL)
            now = trio.current_time()
            if (
                any(deadline <= now for _, deadline, _ in self._waiters)
                or any(held[0][1] <= now for held in self._held.values())
                or any(e[1] <= now for sink in self._unordered for e in self._held[sink])
            ):
                self._settle()

    async def flush_timed(self) -> None:
        """One round of ASYNC_FLUSH."""
        now = self.clock_ms()
        least = self.config.flush_commit_log_least_pages
        if now >= self._last_thorough + self.config.flush_commit_log_thorough_interval:
            self._last_thorough = now
            least = 0
        await self._flush(least)

    async def run_timed(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        await every(
            self.config.flush_interval_commit_log / 1000,
            self.flush_timed,
            name="flush commitlog",
            task_status=task_status,
        )

    async def flush_all(self) -> None:
        await self._flush(0)

    def release_waiters(self) -> None:
        """Wake the puts whose bytes are durable (at shutdown, after the final flush)."""
        self._settle()


class ConsumeQueueFlushService:
    def __init__(
        self,
        table: ConsumeQueueTable,
        index: IndexService | None,
        config: MessageStoreConfig,
        checkpoint: StoreCheckpoint,
        clock_ms: Callable[[], int],
    ) -> None:
        self.table = table
        self.index = index
        self.config = config
        self.checkpoint = checkpoint
        self.clock_ms = clock_ms
        self._last_thorough = clock_ms()

    async def flush_once(self, thorough: bool | None = None) -> None:
        now = self.clock_ms()
        if thorough is None:
            thorough = (
                now >= self._last_thorough + self.config.flush_consume_queue_thorough_interval
            )
        if thorough:
            self._last_thorough = now
        least = 0 if thorough else self.config.flush_consume_queue_least_pages
        logics_ts = self.table.logics_msg_timestamp
        for cq in list(self.table):
            await cq.queue.flush(least)
        if thorough:
            if self.index is not None:
                self.checkpoint.index_msg_timestamp = await self.index.flush()
            if logics_ts > 0:
                self.checkpoint.logics_msg_timestamp = logics_ts
            await trio.to_thread.run_sync(self.checkpoint.flush)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await every(
            self.config.flush_interval_consume_queue / 1000,
            self.flush_once,
            name="flush consume queues",
            task_status=task_status,
        )
