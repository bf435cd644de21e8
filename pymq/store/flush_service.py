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

import logging
from collections.abc import Callable

import trio

from pymq.common.periodic import every
from pymq.store.checkpoint import StoreCheckpoint
from pymq.store.commitlog import CommitLog
from pymq.store.config import MessageStoreConfig
from pymq.store.consume_queue_table import ConsumeQueueTable
from pymq.store.index_service import IndexService

log = logging.getLogger(__name__)


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
        self._waiters: list[tuple[int, trio.Event]] = []
        self._wake = trio.Event()
        self._last_thorough = 0

    @property
    def flushed_where(self) -> int:
        return self.commitlog.queue.flushed_where

    async def wait_flushed(self, offset: int, timeout_s: float) -> bool:
        """Group commit: wait until bytes before ``offset`` are durable; False on timeout."""
        if self.commitlog.queue.flushed_where >= offset:
            return True
        done = trio.Event()
        self._waiters.append((offset, done))
        self._wake.set()
        with trio.move_on_after(timeout_s):
            await done.wait()
            return True
        return False

    async def _flush(self, least_pages: int) -> None:
        queue = self.commitlog.queue
        await queue.flush(least_pages)
        if queue.store_timestamp:
            self.checkpoint.physic_msg_timestamp = queue.store_timestamp

    async def run_group_commit(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            while self._waiters:
                batch, self._waiters = self._waiters, []
                try:
                    await self._flush(0)
                except OSError:
                    # Not acknowledging is the honest answer: waiters time out (FLUSH_DISK_TIMEOUT)
                    log.exception("commit log sync failed")
                    await trio.sleep(0.01)
                flushed = self.commitlog.queue.flushed_where
                for offset, done in batch:
                    if flushed >= offset:
                        done.set()
                    else:
                        self._waiters.append((offset, done))

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
        flushed = self.commitlog.queue.flushed_where
        waiting, self._waiters = self._waiters, []
        for offset, done in waiting:
            if flushed >= offset:
                done.set()
            else:
                self._waiters.append((offset, done))


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
