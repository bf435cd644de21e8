"""``DefaultMessageStore``: wires the commit log, consume queues, index and services together.

Ownership: the store owns every file under ``storePathRootDir`` for as long as :meth:`run` runs.
``run`` takes the ``lock`` file (a second store on the same root fails with
:class:`~pymq.store.checkpoint.StoreLockedError`), loads and recovers in a worker thread, starts
its services as tasks in one nursery and then reports ``started``.  When cancelled it stops
accepting puts and, shielded, dispatches what is left, syncs everything, writes the checkpoint
and removes ``abort`` (kept after a crash of one of its services, so the next start recovers
abnormally).  The logic lives in the classes it wires; this module only validates puts and routes
calls.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Collection, Container, Iterable, Sequence
from functools import partial
from typing import Any, overload

import trio

from pymq.common.clock import now_ms
from pymq.common.files import LARGE_READAHEAD_KB, readahead_kb
from pymq.common.message_ext import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_WAIT_STORE_MSG_OK,
    MessageExt,
    MessageSysFlag,
    properties_bytes,
)
from pymq.common.message_id import offset_msg_id
from pymq.common.periodic import every
from pymq.common.record import (
    MAX_PROPERTIES_LENGTH,
    MAX_TOPIC_LENGTH,
    RecordError,
    decode_record,
    has_nul,
    record_length,
    tear_safe_properties,
)
from pymq.common.topic import SCHEDULE_TOPIC
from pymq.dledger.config import DLedgerConfig, from_store_config
from pymq.store import checkpoint as ckpt
from pymq.store.clean_service import (
    CleanCommitLogService,
    CleanConsumeQueueService,
    disk_used_ratio,
)
from pymq.store.commitlog import CommitLog, DispatchHint
from pymq.store.config import BrokerRole, FlushDiskType, MessageStoreConfig, WriteAdvice
from pymq.store.consume_queue_table import ArrivalListener, ConsumeQueueTable
from pymq.store.dledger_commitlog import (
    CleanDLedgerCommitLogService,
    DLedgerCommitLog,
    DLedgerReputMessageService,
)
from pymq.store.flush_service import (
    AnswerSink,
    CommitLogFlushService,
    ConsumeQueueFlushService,
)
from pymq.store.get_message import get_message
from pymq.store.index_service import IndexService
from pymq.store.mapped_file_queue import MappedFileAllocator
from pymq.store.put_stats import PutStats
from pymq.store.reput import ReputMessageService
from pymq.store.results import (
    PUT_OK,
    BatchBody,
    GetMessageResult,
    PutMessageResult,
    PutMessageStatus,
    QueryMessageResult,
    SendRun,
    SingleSend,
)
from pymq.store.timer.rewrite import TIMER_KEYS, rewrite_timer

log = logging.getLogger(__name__)

CLEAN_INITIAL_DELAY_S = 60
"""Java starts cleaning a minute after start, so a restart never deletes before it settles."""
DISK_CHECK_INITIAL_DELAY_S = 1
DISK_CHECK_INTERVAL_S = 10
"""Java checks for a full disk 1 s after start and every 10 s, apart from the cleaning rounds."""
COMMITLOG_DATA_MAX_BYTES = 1024 * 1024
"""get_commitlog_data copies; Java hands out a view of the rest of a file (up to 1 GiB)."""
SHUTDOWN_DEADLINE_S = 30
"""The final dispatch + flush gets this long even when the caller is cancelled."""
# trim_resident keeps this much of the commit log's written tail mapped (what consumers read
# next), and this much of each consume queue's.
COMMITLOG_RESIDENT_TAIL = 8 * 1024 * 1024
CQ_RESIDENT_TAIL = 64 * 1024
# ... and trims as soon as the commit log has grown by this much, whatever the interval; the
# growth is looked at this often (seconds).
RESIDENT_TRIM_BYTES = 32 * 1024 * 1024
RESIDENT_TRIM_POLL_S = 0.25

_TRAN_MASK = 0xC
_TIMER_SEC, _TIMER_MS, _TIMER_AT = TIMER_KEYS


def _has_timer(props: dict[str, str]) -> bool:
    """Whether ``props`` names a timer (three lookups: a set's isdisjoint walks every key)."""
    return _TIMER_SEC in props or _TIMER_MS in props or _TIMER_AT in props


_MIN_OVERHEAD = 91 + 24 + MAX_TOPIC_LENGTH  # IPv4 record + IPv6 host widening + topic
"""Puts whose body + properties + this stay within maxMessageSize skip the detailed check."""
_TOPIC_CACHE_MAX = 100_000
"""Encoded topic names are cached; the cache is dropped if a client invents topics forever."""
_HOST_V6 = MessageSysFlag.BORNHOST_V6_FLAG | MessageSysFlag.STOREHOSTADDRESS_V6_FLAG

ReplicaWaiter = Callable[[int], Awaitable[PutMessageStatus]]


def _only_cancelled(exc: BaseException) -> bool:
    if isinstance(exc, trio.Cancelled):
        return True
    if isinstance(exc, BaseExceptionGroup):
        _match, rest = exc.split(trio.Cancelled)
        return rest is None
    return False


def _waits(wait: str | None) -> bool:
    """Whether a put with this WAIT property waits for its bytes to be durable (absent, or
    "true" in any case and spacing, as Java's Boolean.parseBoolean after trim)."""
    return wait is None or wait == "true" or wait.strip().lower() == "true"


def _flush_timed_out(result: PutMessageResult) -> None:
    """The put's bytes did not reach the disk within syncFlushTimeout: FLUSH_DISK_TIMEOUT."""
    log.warning("sync flush of offset %d timed out", result.wrote_offset + result.wrote_bytes)
    result.status = PutMessageStatus.FLUSH_DISK_TIMEOUT


def _durable(
    result: PutMessageResult, callback: Callable[[PutMessageResult], None], ok: bool
) -> None:
    """defer_durable's waiter: ``callback(result)``, its status FLUSH_DISK_TIMEOUT when the
    bytes did not reach the disk in time."""
    if not ok:
        _flush_timed_out(result)
    callback(result)


def _quorum(
    result: PutMessageResult,
    callback: Callable[[PutMessageResult], None],
    status: PutMessageStatus,
) -> None:
    """defer_durable's waiter in DLedger mode: ``callback(result)``, its status the entry's
    outcome's unless PUT_OK."""
    if status is not PutMessageStatus.PUT_OK:
        result.status = status
    callback(result)


def _answer_held(
    sink: AnswerSink,
    frame: bytes,
    late: Callable[[PutMessageResult], bytes],
    result: PutMessageResult,
) -> None:
    """hold_answer's waiter in DLedger mode: ``frame`` to ``sink`` once a majority has the
    entry, else ``late(result)``, its status the entry's outcome."""
    sink.answer_frames([frame if result.status is PUT_OK else late(result)])


def _late_answer(result: PutMessageResult, late: Callable[[PutMessageResult], bytes]) -> bytes:
    """hold_answer's timeout: ``late(result)``, its status FLUSH_DISK_TIMEOUT."""
    _flush_timed_out(result)
    return late(result)


class DefaultMessageStore:
    """The message store service.  Create it, ``await nursery.start(store.run)``, then call the
    API from any task of the same Trio run."""

    def __init__(
        self,
        config: MessageStoreConfig | None = None,
        *,
        clock_ms: Callable[[], int] = now_ms,
        disk_ratio: Callable[[str], float] = disk_used_ratio,
        mtime: Callable[[str], float] = os.path.getmtime,
        readahead: Callable[[str], int | None] = readahead_kb,
        dledger_config: DLedgerConfig | None = None,
    ) -> None:
        """``dledger_config``: with ``enableDLegerCommitLog``, the DLedger member's settings
        (default: :func:`pymq.dledger.config.from_store_config` of ``config``; tests give
        shorter timings)."""
        self.config = config = config or MessageStoreConfig()
        self.clock_ms = clock_ms
        retry_s = config.mapped_file_create_retry_interval / 1000
        warm = config.warm_maped_file_enable
        # The commit log's pages ahead of its writer faulted a page at a time (MADV_RANDOM,
        # MappedFile.advise_writes): always under SYNC_FLUSH; under ASYNC_FLUSH as
        # commitLogWriteAdvice says (auto: on a device that reads ahead LARGE_READAHEAD_KB or
        # more); otherwise the advice follows the writes (CommitLog._weigh_advice).
        advise_writes = self._advises_writes(config, readahead)
        self.allocator = MappedFileAllocator(retry_s, warm=warm, advise_writes=advise_writes)
        self.commitlog: CommitLog
        self.dledger: DLedgerCommitLog | None = None
        """The DLedger commit log (also :attr:`commitlog`) in DLedger mode, else None."""
        if config.enable_d_leger_commit_log:
            self.commitlog = self.dledger = DLedgerCommitLog(
                config.store_path_commitlog,
                dledger_config or from_store_config(config),
                self.allocator,
                clock_ms,
                config.mapped_file_size_commit_log,
            )
            # every put waits for a majority (the leader is a SYNC_MASTER; until a role
            # change makes it one, a member is a slave and takes no writes)
            config.broker_role = BrokerRole.SLAVE
        else:
            self.commitlog = CommitLog(
                config.store_path_commitlog,
                config.mapped_file_size_commit_log,
                self.allocator,
                clock_ms,
                warm=warm,
                advise_writes=advise_writes,
            )
        self.index: IndexService | None = (
            IndexService(config.index_dir, config.max_hash_slot_num, config.max_index_num, clock_ms)
            if config.message_index_enable
            else None
        )
        self.consume_queues = ConsumeQueueTable(
            config.consume_queue_dir,
            config.consume_queue_file_size,
            self.index,
            config.delay_levels_ms(),
        )
        self.reput = (ReputMessageService if self.dledger is None else DLedgerReputMessageService)(
            self.commitlog, self.consume_queues, retry_s
        )
        # Between begin_run and end_run, puts leave their dispatch to end_run.
        self._in_run = False
        self._run_puts_from = 0  # put_message_times_total when the run began
        self.lock = ckpt.StoreLock(config.lock_path)
        self.checkpoint: ckpt.StoreCheckpoint | None = None
        self.flush_commitlog: CommitLogFlushService | None = None
        self.flush_consume_queue: ConsumeQueueFlushService | None = None
        self.clean_commitlog = (
            CleanCommitLogService(self.commitlog, config, clock_ms, disk_ratio, mtime)
            if self.dledger is None
            else CleanDLedgerCommitLogService(
                self.dledger, config, clock_ms, self._dispatched, disk_ratio, mtime
            )
        )
        self.replica_waiter: ReplicaWaiter | None = None
        self.clean_consume_queue = CleanConsumeQueueService(
            self.commitlog, self.consume_queues, self.index, config
        )
        self._topic_bytes: dict[str, bytes] = {}
        self._cluster_bytes: tuple[str | None, bytes] = (None, b"")  # the one-call puts'
        self._disk_rechecked = float("-inf")
        # Role and flush type are fixed for a run (DLedger mode: read_only follows the member's
        # role, see BrokerController._dledger_roles); the put path reads these flags only.
        self.read_only = config.broker_role is BrokerRole.SLAVE
        self.must_wait = (
            config.flush_disk_type is FlushDiskType.SYNC_FLUSH
            or config.broker_role is BrokerRole.SYNC_MASTER
            or self.dledger is not None
        )
        if self.dledger is not None:
            self.replica_waiter = self.dledger.wait_quorum
            self.dledger.server.on_commit = self.reput.wakeup
        self.last_exit_ok = True
        self.running = False
        self.start_time_ms = 0
        self.put_message_times_total = 0
        # Java's isOSPageCacheBusy, on one loop: a put that held the commit log longer than
        # osPageCacheBusyTimeOutMills marks when it ended (by lock_clock); requests received
        # before the mark waited behind it (the broker's fast failure refuses them).
        self.lock_clock: Callable[[], float] = time.monotonic
        self.os_page_cache_busy_mark = -math.inf
        self.put_message_size_total = 0
        self.get_message_times_total = 0
        self.put_stats = PutStats()

    # --- configuration by the broker -----------------------------------------------------------

    @staticmethod
    def _advises_writes(config: MessageStoreConfig, readahead: Callable[[str], int | None]) -> bool:
        """Whether the commit log's writes are faulted a page at a time from the start."""
        if config.flush_disk_type is FlushDiskType.SYNC_FLUSH:
            return True
        advice = config.commit_log_write_advice
        if advice is WriteAdvice.AUTO:
            device = readahead(config.store_path_commitlog)
            if device is None or device < LARGE_READAHEAD_KB:
                return False
            log.info(
                "commit log writes faulted a page at a time: its device reads ahead %d KiB",
                device,
            )
            return True
        return advice is WriteAdvice.RANDOM

    @property
    def store_host(self) -> tuple[str, int]:
        return self.commitlog.store_host

    @store_host.setter
    def store_host(self, host: tuple[str, int]) -> None:
        self.commitlog.set_store_host(host[0], host[1])

    def set_arrival_listener(
        self,
        listener: ArrivalListener | None,
        topics: Callable[[], Container[str] | None] | None = None,
    ) -> None:
        """``listener(topic, queue_id, max_offset_after, tags_code, store_timestamp)`` is called
        on the loop for every record dispatched to a consume queue (not on a slave); with
        ``topics``, only for the records whose topic is in what it returns when reput starts a
        run of records (None: every record), the topics whose arrivals the listener acts on.
        (A call per record would cost every put.)"""
        if self.config.broker_role is BrokerRole.SLAVE and self.dledger is None:
            listener = None  # (a DLedger member's role changes while it runs: it keeps it)
        self.reput.listener = listener
        self.reput.listener_topics = topics if listener is not None else None

    # --- lifecycle -----------------------------------------------------------------------------

    def _open(self) -> None:
        """Blocking: lock, load and recover (Java's load() + recover() + start() prologue)."""
        config = self.config
        os.makedirs(config.store_path_root_dir, exist_ok=True)
        self.lock.acquire()
        try:
            self.last_exit_ok = not ckpt.abort_file_exists(config.abort_path)
            self.checkpoint = ckpt.StoreCheckpoint(config.checkpoint_path)
            self.commitlog.load()
            self.consume_queues.load()
            if self.index is not None:
                self.index.load(self.last_exit_ok, self.checkpoint.index_msg_timestamp)
            self._recover()
            if self.index is not None:
                self.index.ensure_writable_file()
            ckpt.create_abort_file(config.abort_path)
        except BaseException:
            self._close_files()
            raise

    def _recover(self) -> None:
        config = self.config
        started = time.monotonic()
        max_phy_of_cq = self.consume_queues.recover()
        check_crc = config.check_crc_on_recover
        if self.last_exit_ok:
            end = self.commitlog.recover_normally(check_crc)
        else:
            assert self.checkpoint is not None
            bound = (
                self.checkpoint.min_timestamp_index
                if config.message_index_enable and config.message_index_safe
                else self.checkpoint.min_timestamp
            )
            log.warning("the last exit was not clean: recovering the commit log abnormally")
            end = self.commitlog.recover_abnormally(check_crc, bound, self.consume_queues)
        if self.commitlog.holds_no_data():
            self.consume_queues.destroy_all()
            if self.index is not None:
                self.index.destroy()
        elif max_phy_of_cq >= end:
            self.consume_queues.truncate_dirty(end)
        self.reput.reput_from_offset = max(
            self.commitlog.min_offset, min(end, max(0, self.consume_queues.max_physic_offset()))
        )
        self.reput.dispatch_all_now()
        self.commitlog.topic_queue_table = self.consume_queues.rebuild_topic_queue_table(
            self.commitlog.min_offset
        )
        log.info(
            "store recovered (%s) to offset %d in %.3f s",
            "normal" if self.last_exit_ok else "abnormal",
            end,
            time.monotonic() - started,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Load, recover, serve until cancelled, then shut down cleanly (see module docstring)."""
        await trio.to_thread.run_sync(self._open)
        assert self.checkpoint is not None
        config = self.config
        self.flush_commitlog = CommitLogFlushService(
            self.commitlog, config, self.checkpoint, self.clock_ms
        )
        self.flush_consume_queue = ConsumeQueueFlushService(
            self.consume_queues, self.index, config, self.checkpoint, self.clock_ms
        )
        clean_exit = False
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.allocator.run)
                await nursery.start(self.reput.run)
                if self.dledger is not None:
                    await nursery.start(self.dledger.server.run)
                if config.flush_disk_type is FlushDiskType.SYNC_FLUSH:
                    await nursery.start(self.flush_commitlog.run_group_commit)
                else:
                    await nursery.start(self.flush_commitlog.run_timed)
                await nursery.start(self.flush_consume_queue.run)
                nursery.start_soon(
                    partial(
                        every,
                        config.clean_resource_interval / 1000,
                        self.clean_files_once,
                        initial_delay=CLEAN_INITIAL_DELAY_S,
                        name="clean files",
                    )
                )
                nursery.start_soon(
                    partial(
                        every,
                        DISK_CHECK_INTERVAL_S,
                        self.clean_commitlog.check_space,
                        initial_delay=DISK_CHECK_INITIAL_DELAY_S,
                        name="disk space check",
                    )
                )
                if config.resident_trim_interval > 0:
                    nursery.start_soon(self._trim_resident_loop)
                self.start_time_ms = self.clock_ms()
                self.running = True
                task_status.started()
        except BaseException as exc:
            clean_exit = _only_cancelled(exc)
            raise
        finally:
            self.running = False
            with trio.CancelScope(shield=True, deadline=trio.current_time() + SHUTDOWN_DEADLINE_S):
                await self._shutdown(clean_exit)

    async def _trim_resident_loop(self) -> None:
        """Trim the resident set every ``resident_trim_interval`` ms, and sooner whenever the
        commit log has grown by ``RESIDENT_TRIM_BYTES`` since the last trim: a fast publish
        would otherwise map in a second's worth of pages per second between rounds."""
        interval = self.config.resident_trim_interval / 1000
        last_time, last_offset = trio.current_time(), self.commitlog.max_offset
        while True:
            await trio.sleep(min(interval, RESIDENT_TRIM_POLL_S))
            offset = self.commitlog.max_offset
            if (
                trio.current_time() - last_time >= interval
                or offset - last_offset >= RESIDENT_TRIM_BYTES
            ):
                try:
                    await self.trim_resident()
                except Exception:  # never the end of the broker: logged, tried next round
                    log.exception("trimming the resident pages failed")
                last_time, last_offset = trio.current_time(), offset

    async def trim_resident(self) -> None:
        """Keep the broker's resident set small however large the store: unmap the pages of the
        mapped files it is done with, keeping the tail being written and read most (the last
        ``COMMITLOG_RESIDENT_TAIL`` bytes of the commit log, the last page or so of each consume
        queue).  Reads of older data map their pages in again until the next round."""
        files = self.commitlog.queue.files
        for mf in files[:-1]:
            mf.release_resident(mf.file_size)
            await trio.lowlevel.checkpoint()
        if files:
            files[-1].release_resident(files[-1].wrote_position - COMMITLOG_RESIDENT_TAIL)
        for n, cq in enumerate(list(self.consume_queues)):
            cq_files = cq.queue.files
            for mf in cq_files[:-1]:
                mf.release_resident(mf.file_size)
            if cq_files:
                cq_files[-1].release_resident(cq_files[-1].wrote_position - CQ_RESIDENT_TAIL)
            if n % 256 == 255:
                await trio.lowlevel.checkpoint()
        if self.index is not None:
            for f in list(self.index.files):
                f.mf.release_resident(f.mf.file_size)
                await trio.lowlevel.checkpoint()

    async def _shutdown(self, clean_exit: bool) -> None:
        try:
            self.reput.dispatch_all_now()
            if self.flush_commitlog is not None:
                await self.flush_commitlog.flush_all()
                self.flush_commitlog.release_waiters()
            if self.flush_consume_queue is not None:
                await self.flush_consume_queue.flush_once(thorough=True)
            if self.index is not None:
                await self.index.flush_all()
                assert self.checkpoint is not None
                self.checkpoint.index_msg_timestamp = self.index.flushed_index_timestamp
                await trio.to_thread.run_sync(self.checkpoint.flush)
            if clean_exit and self.reput.behind_bytes == 0 and not self.clean_commitlog.disk_full:
                ckpt.remove_abort_file(self.config.abort_path)
            else:
                log.warning("store stopped uncleanly; the next start recovers abnormally")
        finally:
            self._close_files()

    def _close_files(self) -> None:
        self.commitlog.close()
        self.consume_queues.close()
        if self.index is not None:
            self.index.close()
        if self.checkpoint is not None:
            self.checkpoint.close()
        self.lock.release()

    # --- puts ----------------------------------------------------------------------------------

    def _refusal(self) -> PutMessageResult | None:
        """Why the store takes no writes now (stopped, slave, disk full), or None."""
        if not self.running:
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, reason="store stopped")
        if self.read_only:  # a slave (DLedger mode: also a leader not yet made master)
            return PutMessageResult(
                PutMessageStatus.SERVICE_NOT_AVAILABLE, reason="a slave does not accept writes"
            )
        if self.clean_commitlog.disk_full and self._recheck_disk():
            return PutMessageResult(
                PutMessageStatus.SERVICE_NOT_AVAILABLE,
                reason=f"disk full ({self.clean_commitlog.last_ratio:.0%} used): writes refused",
            )
        if self.reput.blocked is not None:
            return PutMessageResult(
                PutMessageStatus.SERVICE_NOT_AVAILABLE,
                reason="message store is not writeable: a consume-queue or index file cannot be "
                "created (disk full?)",
            )
        return None

    def _recheck_disk(self) -> bool:
        """Whether the disk is still full: refused puts look again (a statvfs) at most every
        mappedFileCreateRetryInterval ms, so writes resume as soon as space is back rather than
        at the next periodic check (every 10 s)."""
        now = trio.current_time()
        if now - self._disk_rechecked >= self.config.mapped_file_create_retry_interval / 1000:
            self._disk_rechecked = now
            self.clean_commitlog.check_space()
        return self.clean_commitlog.disk_full

    def _check(self, msg: MessageExt) -> tuple[PutMessageResult | None, tuple[bytes, bytes]]:
        """The detailed put checks: (refusal or None, (topic bytes, properties bytes))."""
        topic_b = msg.topic.encode()
        if len(topic_b) > MAX_TOPIC_LENGTH:
            return PutMessageResult(
                PutMessageStatus.MESSAGE_ILLEGAL,
                reason=f"topic is {len(topic_b)} bytes, the limit is {MAX_TOPIC_LENGTH}",
            ), (b"", b"")
        props_b = properties_bytes(msg.properties)
        if len(props_b) > MAX_PROPERTIES_LENGTH:
            return PutMessageResult(
                PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
                reason=f"properties are {len(props_b)} bytes, the limit is {MAX_PROPERTIES_LENGTH}",
            ), (b"", b"")
        if has_nul(topic_b):
            return PutMessageResult(
                PutMessageStatus.MESSAGE_ILLEGAL, reason="a topic may not contain NUL characters"
            ), (b"", b"")
        if props_b and (props_b[0] == 0 or props_b[-1] == 0):
            # Where recovery would take it for a torn write, wherever the record lands: the
            # properties in another order, if one avoids it (the commit log does the same for
            # the rare NUL at a sector boundary: see nul_where_torn).
            safe = tear_safe_properties(msg.properties)
            if safe is None:
                return PutMessageResult(
                    PutMessageStatus.MESSAGE_ILLEGAL,
                    reason="properties may not begin or end with a NUL character",
                ), (b"", b"")
            props_b = safe
        size = record_length(msg.sys_flag & ~_HOST_V6, len(msg.body), len(topic_b), len(props_b))
        if size > self.config.max_message_size:
            return PutMessageResult(
                PutMessageStatus.MESSAGE_ILLEGAL,
                reason=f"a record of {size} bytes exceeds maxMessageSize "
                f"{self.config.max_message_size}",
            ), (b"", b"")
        return None, (topic_b, props_b)

    def _apply_delay(self, msg: MessageExt) -> PutMessageResult | None:
        """RocketMQ 5's rewrite of a timer message into rmq_sys_wheel_timer (or its refusal:
        see pymq/store/timer/rewrite.py), then Java's of a delayed message into
        SCHEDULE_TOPIC_XXXX."""
        tran = msg.sys_flag & _TRAN_MASK
        if tran not in (
            MessageSysFlag.TRANSACTION_NOT_TYPE,
            MessageSysFlag.TRANSACTION_COMMIT_TYPE,
        ):
            return None
        config = self.config
        refused = rewrite_timer(
            msg,
            now_ms=self.clock_ms(),
            enabled=config.timer_wheel_enable,
            max_delay_sec=config.timer_max_delay_sec,
        )
        if refused is not None:
            return refused
        level = msg.delay_level
        if level <= 0:
            return None
        max_level = len(self.consume_queues.delay_levels_ms)
        if level > max_level:
            level = max_level
            msg.properties[PROPERTY_DELAY_TIME_LEVEL] = str(level)
        msg.properties[PROPERTY_REAL_TOPIC] = msg.topic
        msg.properties[PROPERTY_REAL_QUEUE_ID] = str(msg.queue_id)
        msg.topic = SCHEDULE_TOPIC
        msg.queue_id = level - 1
        return None

    async def put(self, request: MessageExt | Iterable[MessageExt]) -> PutMessageResult:
        """Append a message, or a batch (an iterable of messages of one topic and queue, as
        SEND_BATCH_MESSAGE: all or nothing); with SYNC_FLUSH (or as SYNC_MASTER) return once
        it is durable.  :meth:`put_now` without the wait.

        A message needs topic, queue_id, body, flag, properties, sys_flag, born_timestamp,
        born_host, reconsume_times and prepared_transaction_offset; the store fills in
        offsets, store timestamp and store host.  Refusals carry a status and a ``reason``,
        and write nothing.  Delayed and transactional messages are refused in a batch, as in
        Java.
        """
        if isinstance(request, MessageExt):
            result = self._put_message(request)
            wait = request.properties.get(PROPERTY_WAIT_STORE_MSG_OK)
        else:
            batch = list(request)
            result = self._put_messages(batch)
            if result.status is not PUT_OK:
                return result
            wait = batch[0].properties.get(PROPERTY_WAIT_STORE_MSG_OK)
        if not self.must_wait:
            return result
        return await self._durable(result, wait)

    @overload
    def put_now(self, request: MessageExt | Iterable[MessageExt]) -> PutMessageResult: ...

    @overload
    def put_now(
        self, request: SingleSend | BatchBody
    ) -> tuple[PutMessageResult, str | None] | None: ...

    @overload
    def put_now(self, request: SendRun) -> tuple[list[DispatchHint], list[str | None]]: ...

    def put_now(
        self, request: MessageExt | Iterable[MessageExt] | SingleSend | SendRun | BatchBody
    ) -> (
        PutMessageResult
        | tuple[PutMessageResult, str | None]
        | tuple[list[DispatchHint], list[str | None]]
        | None
    ):
        """Append without waiting for the disk or a slave (all of :meth:`put` when
        :attr:`must_wait` is false; else the caller waits: :meth:`wait_durable`,
        :meth:`defer_durable`, :meth:`hold_answer`).  The one synchronous way in; what it
        gives depends on the request:

        - a message, or a batch of messages: the PutMessageResult;
        - a :class:`SingleSend` or :class:`BatchBody` (a send from its request's fields): the
          result and the stored WAIT property, or None, with nothing changed, whenever the
          general path must decide (a store that refuses puts, a topic not yet checked, a
          transactional flag, or what the C encoder leaves to Python: the broker then builds
          the message(s));
        - a :class:`SendRun`: the dispatch hints and stored WAIT properties of the leading
          entries put (those a SingleSend of each would put), the first ``len(hints)``.
        """
        if type(request) is SingleSend:
            # A run of one (:meth:`_put_run`, inline here: this is the lone send's path), its
            # PutMessageResult made from its hint (CommitLog.put_result's single case).
            (topic, queue_id, body, properties, flag, cluster, sys_flag, born_timestamp,
             born_host, reconsume_times) = request  # fmt: skip
            cluster_b = self._fast_put_cluster(cluster)
            if cluster_b is None:
                return None
            begin = self.lock_clock()
            commitlog = self.commitlog
            hints, waits, size = commitlog.append_run(
                [(topic, queue_id, body, properties, flag, sys_flag, born_timestamp,
                  reconsume_times)],
                self._topic_bytes, cluster_b, born_host,
                max(0, self.config.max_message_size - _MIN_OVERHEAD), _TRAN_MASK,
            )  # fmt: skip
            if not hints:
                return None
            self._count_fast_puts(begin, 1, 1, size)
            hint = hints[0]
            phy = hint[0]
            result = PutMessageResult(
                PUT_OK, phy, size, offset_msg_id(commitlog.msg_id_prefix, phy), hint[6], hint[4]
            )
            return result, waits[0]
        kind = type(request)
        if kind is MessageExt:  # the broker's own puts (a transaction's records, say)
            return self._put_message(request)  # type: ignore[arg-type]
        if kind is SendRun:
            return self._put_singles(request)  # type: ignore[arg-type]
        if kind is BatchBody:
            return self._put_batch_body(request)  # type: ignore[arg-type]
        if isinstance(request, MessageExt):
            return self._put_message(request)
        return self._put_messages(request)  # type: ignore[arg-type]

    def _put_message(self, msg: MessageExt) -> PutMessageResult:
        """put_now of a message."""
        if (
            not self.running
            or self.read_only
            or self.clean_commitlog.disk_full
            or self.reput.blocked is not None
        ):
            refused = self._refusal()
            if refused is not None:
                return refused
        props = msg.properties
        if (  # a delay level or a timer (_has_timer, inline: a call a record on this path)
            PROPERTY_DELAY_TIME_LEVEL in props
            or _TIMER_SEC in props
            or _TIMER_MS in props
            or _TIMER_AT in props
        ):
            refused = self._apply_delay(msg)
            if refused is not None:
                return refused
        topic_b = self._topic_bytes.get(msg.topic)  # only topics already known to be valid
        props_b = properties_bytes(props)
        if (
            topic_b is None
            or len(props_b) > MAX_PROPERTIES_LENGTH
            or 0 in props_b  # NUL byte; an int test skips a subsequence search
            or len(msg.body) + len(props_b) + _MIN_OVERHEAD > self.config.max_message_size
        ):
            refused, (topic_b, props_b) = self._check(msg)
            if refused is not None:
                return refused
            self._remember_topic(msg.topic, topic_b)
        clock = self.lock_clock
        begin = clock()
        result = self.commitlog.append_stored((msg,), ((topic_b, props_b),))
        end = clock()
        if end - begin < 0.001 and self.config.os_page_cache_busy_time_out_mills >= 1:
            # _held_lock's common case inline: a put under a millisecond, not busy.
            self.put_stats.record_quick()
        else:
            self._held_lock(begin, end)
        if result.status is PUT_OK:  # _count_appended, inline on this hottest path
            self.put_message_times_total += 1
            self.put_message_size_total += result.wrote_bytes
            if not self.reput.woken:
                self._dispatch_appended()
        elif result.status is PutMessageStatus.CREATE_MAPEDFILE_FAILED:
            self.clean_commitlog.check_space()  # the disk-full flag now, not in up to 10 s
        return result

    def _dispatch_appended(self) -> None:
        """What was just appended is to be dispatched: at the end of the run in progress
        (:meth:`end_run`, which counts the run's puts), or by the reput task, woken now."""
        if not self._in_run:
            self.reput.wakeup()

    def begin_run(self) -> None:
        """A connection starts serving a run of requests (RemotingServer.run_hooks): puts made
        until :meth:`end_run` leave their dispatch to it instead of waking the reput task.
        Nothing awaits between the two calls, so only that run's puts are deferred."""
        self._in_run = True
        self._run_puts_from = self.put_message_times_total

    def end_run(self) -> None:
        """The run is served (its answers written): dispatch what its puts appended, here,
        unless the reput service is busy or blocked (then it is woken as usual).  A sync send
        at a time saved a task switch per message this way.  At least as many records as the
        run appended are dispatched (oldest first), so that dispatch keeps up with any run,
        however many messages its batches hold."""
        self._in_run = False
        # Every put counts its records before it would ask for dispatch; records of puts that
        # found the reput task woken are its too: dispatch_now_or_wake adds them to its next
        # turn (else runs outpace it, turn after turn).
        records = self.put_message_times_total - self._run_puts_from
        if records:
            self.reput.dispatch_now_or_wake(records)

    def _held_lock(self, begin: float, end: float) -> None:
        """Time a put (StoreStatsService), and mark one that held the commit log past
        osPageCacheBusyTimeOutMills."""
        self.put_stats.record(int((end - begin) * 1000))
        if end - begin > self.config.os_page_cache_busy_time_out_mills / 1000:
            self.os_page_cache_busy_mark = end
            log.warning(
                "a put held the commit log for %.0f ms (osPageCacheBusyTimeOutMills %d)",
                (end - begin) * 1000,
                self.config.os_page_cache_busy_time_out_mills,
            )

    def _remember_topic(self, topic: str, topic_b: bytes) -> None:
        """Cache a checked topic's bytes (the cache is dropped if topics grow without end)."""
        if len(self._topic_bytes) >= _TOPIC_CACHE_MAX:
            self._topic_bytes.clear()
        self._topic_bytes[topic] = topic_b

    def _put_messages(self, msgs: Iterable[MessageExt]) -> PutMessageResult:
        """put_now of a batch of messages."""
        batch = list(msgs)
        refused = self._refusal()
        if refused is not None:
            return refused
        if not batch:
            return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, reason="empty batch")
        first = batch[0]
        topic, queue_id = first.topic, first.queue_id
        topic_b = self._topic_bytes.get(topic)
        max_size = self.config.max_message_size
        encoded = []
        if any(_has_timer(msg.properties) for msg in batch):
            # A batch of timer messages goes to the timer topic whole (each with its own due
            # time); a batch mixing timers with other messages fails the one-queue check.
            for msg in batch:
                refused = self._apply_delay(msg)
                if refused is not None:
                    return refused
            topic, queue_id = first.topic, first.queue_id
            if any(msg.topic != topic for msg in batch):
                return PutMessageResult(
                    PutMessageStatus.MESSAGE_ILLEGAL,
                    reason="a batch may not mix timer messages with others",
                )
            topic_b = self._topic_bytes.get(topic)
        for msg in batch:
            if msg.sys_flag & _TRAN_MASK or PROPERTY_DELAY_TIME_LEVEL in msg.properties:
                if msg.sys_flag & _TRAN_MASK:
                    reason = "transactional messages cannot be batched"
                    return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, reason=reason)
                if msg.delay_level > 0:
                    reason = "delayed messages cannot be batched"
                    return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, reason=reason)
            if msg.queue_id != queue_id or msg.topic != topic:
                return PutMessageResult(
                    PutMessageStatus.MESSAGE_ILLEGAL, reason="a batch must target one queue"
                )
            props_b = properties_bytes(msg.properties)
            if (
                topic_b is None
                or len(props_b) > MAX_PROPERTIES_LENGTH
                or 0 in props_b  # NUL byte; an int test skips a subsequence search
                or len(msg.body) + len(props_b) + _MIN_OVERHEAD > max_size
            ):
                refused, (topic_b, props_b) = self._check(msg)
                if refused is not None:
                    return refused
                self._remember_topic(topic, topic_b)
            encoded.append((topic_b, props_b))
        clock = self.lock_clock
        begin = clock()
        result = self.commitlog.append_stored(batch, encoded)
        self._held_lock(begin, clock())
        self._count_appended(result)
        if result.status is PutMessageStatus.CREATE_MAPEDFILE_FAILED:
            self.clean_commitlog.check_space()
        return result

    def _fast_put_cluster(self, cluster: str) -> bytes | None:
        """The one-call puts' gate (SingleSend, SendRun, BatchBody): None
        while the store refuses puts (stopped, a slave, disk full, dispatch blocked), else the
        cluster name's bytes, kept per name (b"" when not ASCII, which the C code leaves to
        the general path)."""
        if (
            not self.running
            or self.read_only
            or self.clean_commitlog.disk_full
            or self.reput.blocked is not None
        ):
            return None
        cluster_b = self._cluster_bytes
        if cluster_b[0] != cluster:
            cluster_b = self._cluster_bytes = (
                cluster,
                cluster.encode() if cluster.isascii() else b"",
            )
        return cluster_b[1]

    def _put_batch_body(self, request: BatchBody) -> tuple[PutMessageResult, str | None] | None:
        """put_now of a BatchBody: a run of one entry whose records are the body's items, put
        as a batch of its decoded items is (the broker's stored properties: WAIT=true left out,
        CLUSTER added); the result and the first item's stored WAIT.  None, with nothing
        changed, whenever the general path must decide (see :meth:`put_now`; the caller then
        decodes the items)."""
        (topic, queue_id, body, cluster, sys_flag, born_timestamp, born_host,
         reconsume_times) = request  # fmt: skip
        entry = (topic, queue_id, body, None, 0, sys_flag, born_timestamp, reconsume_times)
        hints, waits = self._put_run([entry], cluster, born_host)
        if not hints:
            return None
        return self.commitlog.put_result(hints), waits[0]

    def _put_singles(self, request: SendRun) -> tuple[list[DispatchHint], list[str | None]]:
        """put_now of a SendRun: a SingleSend of each of ``entries`` in turn, (topic, queue id,
        body, properties, flag, sys flag, born timestamp, reconsume times), all from one peer
        (:meth:`_put_run`).  Stops at the first entry a SingleSend's put would leave to the
        general path; returns the dispatch hints (offsets, sizes, queue offsets and store
        times) and stored WAIT properties of those put, the first ``len(hints)``."""
        entries, cluster, born_host = request
        return self._put_run(entries, cluster, born_host)

    def _put_run(
        self,
        entries: Sequence[tuple[str, int, Any, str | None, int, int, int, int]],
        cluster: str,
        born_host: tuple[str, int],
    ) -> tuple[list[DispatchHint], list[str | None]]:
        """The one-call puts (SingleSend, SendRun, BatchBody): ``entries`` appended through
        the one record encoder (CommitLog.append_run), their bookkeeping done once; the
        dispatch hints (one per record) and stored WAIT values (one per entry) of the leading
        entries put.  Nothing while the store refuses puts; an entry of a topic not yet
        checked, with a transactional flag, or that the encoder leaves to Python stops the
        run (the broker then builds the message(s))."""
        cluster_b = self._fast_put_cluster(cluster)
        if cluster_b is None:
            return [], []
        begin = self.lock_clock()
        hints, waits, size = self.commitlog.append_run(
            entries, self._topic_bytes, cluster_b, born_host,
            max(0, self.config.max_message_size - _MIN_OVERHEAD), _TRAN_MASK,
        )  # fmt: skip
        if hints:
            self._count_fast_puts(begin, len(waits), len(hints), size)
        return hints, waits

    def _count_fast_puts(self, begin: float, puts: int, records: int, size: int) -> None:
        """The one-call puts' bookkeeping of ``puts`` puts (a single send or a batch each) of
        ``records`` records of ``size`` bytes appended since ``begin`` (``lock_clock``): their
        put times, the totals, and
        dispatch asked for.  A stall is one put's (as a lone put would time it), the others
        quick.  Never raises: the caller must learn what was put (a defect is logged; the
        requests would otherwise be served, and stored, again)."""
        try:
            end = self.lock_clock()
            if end - begin < 0.001 and self.config.os_page_cache_busy_time_out_mills >= 1:
                self.put_stats.record_quick(puts)  # _held_lock's common case, as _put_message
            else:
                self.put_stats.record_quick(puts - 1)
                self._held_lock(begin, end)
            self.put_message_times_total += records
            self.put_message_size_total += size
        except Exception:
            log.exception("counting %d puts", puts)
        if not self.reput.woken:
            self._dispatch_appended()

    def _count_appended(self, result: PutMessageResult) -> None:
        """Statistics, and dispatch woken, for what an append wrote (nothing if refused)."""
        if result.status is PUT_OK:
            self.put_message_times_total += result.msg_num
            self.put_message_size_total += result.wrote_bytes
            if not self.reput.woken:
                self._dispatch_appended()

    async def wait_durable(self, result: PutMessageResult) -> PutMessageResult:
        """``result`` of :meth:`put_now` once its bytes are durable, when this store
        must wait for that (SYNC_FLUSH: on disk; SYNC_MASTER: on the slave too); the status
        becomes FLUSH_DISK_TIMEOUT / FLUSH_SLAVE_TIMEOUT / SLAVE_NOT_AVAILABLE if not."""
        return await self._durable(result, None)

    async def _durable(self, result: PutMessageResult, wait: str | None) -> PutMessageResult:
        """``result`` once its bytes are durable, when this store must wait for that."""
        if self.must_wait and result.status is PUT_OK:
            return await self._wait_durable(result, wait)
        return result

    def defer_durable(
        self,
        result: PutMessageResult,
        wait: str | None,
        callback: Callable[[PutMessageResult], None],
    ) -> bool:
        """SYNC_FLUSH without a waiting task: True if ``callback(result)`` will be called once
        the appended bytes are on disk (status FLUSH_DISK_TIMEOUT after syncFlushTimeout);
        False if there is nothing to wait for (answer now).  In DLedger mode, once a majority
        of the group has the entry, whatever WAIT says (:meth:`_wait_durable`'s rule; the
        status as ``wait_quorum`` gives it).  Not for a SYNC_MASTER master/slave pair (the
        slave wait needs a task: use :meth:`put`)."""
        if self.dledger is not None:
            if result.status is not PUT_OK:
                return False
            self.dledger.on_quorum(
                result.wrote_offset + result.wrote_bytes, partial(_quorum, result, callback)
            )
            return True
        end = self._sync_flush_end(result, wait)
        if end is None:
            return False
        assert self.flush_commitlog is not None
        self.flush_commitlog.on_flushed(
            end, self.config.sync_flush_timeout / 1000, partial(_durable, result, callback)
        )
        return True

    def hold_answer(
        self,
        result: PutMessageResult,
        wait: str | None,
        sink: AnswerSink,
        frame: bytes,
        late: Callable[[PutMessageResult], bytes],
    ) -> bool:
        """SYNC_FLUSH for a request answered by a whole frame (:meth:`defer_durable` without a
        callback per put): True if the group commit will write ``frame`` to ``sink`` once the
        appended bytes are on disk, or ``late(result)`` (its status FLUSH_DISK_TIMEOUT) after
        syncFlushTimeout; False if there is nothing to wait for (answer ``frame`` now).  Not
        for SYNC_MASTER.  In DLedger mode (whatever WAIT says, as :meth:`defer_durable`):
        ``frame`` once a majority of the group has the entry, else ``late(result)``, its status
        the entry's outcome."""
        if self.dledger is not None:
            return self.defer_durable(result, wait, partial(_answer_held, sink, frame, late))
        end = self._sync_flush_end(result, wait)
        if end is None:
            return False
        return self.hold_answers(end, sink, frame, partial(_late_answer, result, late))

    def waits_for_disk(self, wait: str | None) -> bool:
        """Whether a put stored with this WAIT property is answered by the group commit
        (SYNC_FLUSH, not SYNC_MASTER): :meth:`hold_answer`'s test of a stored put."""
        return self.must_wait and (wait is None or wait == "true" or _waits(wait))

    def hold_answers(
        self, end: int, sink: AnswerSink, frames: bytes, late: Callable[[], bytes]
    ) -> bool:
        """:meth:`hold_answer` for the answers of puts appended together, ``frames`` joined:
        written to ``sink`` once the bytes before ``end`` (where the last of them ends) are on
        disk, or ``late()``'s frames (their status FLUSH_DISK_TIMEOUT) after
        syncFlushTimeout; False, holding nothing, when those bytes are durable already."""
        assert self.flush_commitlog is not None
        return self.flush_commitlog.hold_answer(
            end, self.config.sync_flush_timeout / 1000, sink, frames, late
        )

    def _sync_flush_end(self, result: PutMessageResult, wait: str | None) -> int | None:
        """Where ``result``'s bytes end when the put must wait for the group commit without a
        task (stored, SYNC_FLUSH, WAIT not false); None when it answers now."""
        if result.status is not PUT_OK or not self.waits_for_disk(wait):
            return None
        assert self.config.broker_role is not BrokerRole.SYNC_MASTER
        return result.wrote_offset + result.wrote_bytes

    async def _wait_durable(self, result: PutMessageResult, wait: str | None) -> PutMessageResult:
        """SYNC_FLUSH and SYNC_MASTER: wait for the disk and the slave unless WAIT=false."""
        end = result.wrote_offset + result.wrote_bytes
        if self.dledger is not None:  # always (Java's DLedgerCommitLog ignores WAIT)
            status = await self.dledger.wait_quorum(end)
            if status is not PutMessageStatus.PUT_OK:
                result.status = status
            return result
        if not _waits(wait):
            return result
        if self.config.flush_disk_type is FlushDiskType.SYNC_FLUSH:
            assert self.flush_commitlog is not None
            if not await self.flush_commitlog.wait_flushed(
                end, self.config.sync_flush_timeout / 1000
            ):
                _flush_timed_out(result)
        if self.config.broker_role is BrokerRole.SYNC_MASTER:
            if self.replica_waiter is None:
                result.status = PutMessageStatus.SLAVE_NOT_AVAILABLE
            else:
                status = await self.replica_waiter(end)
                if status is not PutMessageStatus.PUT_OK:
                    result.status = status
        return result

    # --- reads ---------------------------------------------------------------------------------

    def get_message(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_nums: int,
        message_filter: Collection[int] | None = None,
        record_filter: Callable[[bytes], bool] | None = None,
    ) -> GetMessageResult:
        """Java's getMessage: whole records from ``offset`` on, statuses and next offsets.
        ``message_filter`` is a set of tags codes (matched in the consume queue),
        ``record_filter`` a test of each whole record read (the SQL92 filter)."""
        self.get_message_times_total += 1
        cq = self.consume_queues.find(topic, queue_id)
        begin = time.monotonic()
        result = get_message(
            self.config, self.commitlog, cq, offset, max_nums, message_filter, record_filter
        )
        self.put_stats.record_get(int((time.monotonic() - begin) * 1000))
        return result

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.consume_queues.find(topic, queue_id)
        return cq.max_offset_in_queue if cq else 0

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        # Java's findConsumeQueue creates a missing queue, so callers see 0 for one, not -1.
        cq = self.consume_queues.find(topic, queue_id)
        return cq.min_offset_in_queue if cq else 0

    def _cq_entry(self, topic: str, queue_id: int, cq_offset: int) -> tuple[int, int, int] | None:
        """The consume-queue entry (commit-log offset, size, tags code) at ``cq_offset``."""
        cq = self.consume_queues.find(topic, queue_id)
        return cq.get_entry(cq_offset) if cq else None

    def get_commitlog_offset_in_queue(self, topic: str, queue_id: int, cq_offset: int) -> int:
        entry = self._cq_entry(topic, queue_id, cq_offset)
        return entry[0] if entry else 0

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp: int) -> int:
        cq = self.consume_queues.find(topic, queue_id)
        if cq is None:
            return 0
        return cq.offset_by_time(
            timestamp, self.commitlog.pickup_store_timestamp, self.commitlog.min_offset
        )

    def get_message_store_timestamp(self, topic: str, queue_id: int, cq_offset: int) -> int:
        entry = self._cq_entry(topic, queue_id, cq_offset)
        if entry is None:
            return -1
        return self.commitlog.pickup_store_timestamp(entry[0], entry[1])

    def get_earliest_message_time(self, topic: str, queue_id: int) -> int:
        cq = self.consume_queues.find(topic, queue_id)
        if cq is None:
            return -1
        return self.get_message_store_timestamp(topic, queue_id, cq.min_offset_in_queue)

    def get_earliest_message_time_store(self) -> int:
        """Store time of the oldest record in the commit log (-1 when empty)."""
        first = self.commitlog.queue.first_file
        if first is None or first.wrote_position == 0:
            return -1
        return self.commitlog.pickup_store_timestamp(first.file_from_offset, 76)

    def get_message_total_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.consume_queues.find(topic, queue_id)
        return cq.max_offset_in_queue - cq.min_offset_in_queue if cq else -1

    def select_one_message_by_offset(
        self, phy_offset: int, size: int | None = None
    ) -> bytes | None:
        """The raw record at ``phy_offset`` (its size read from the record when not given)."""
        if size is None:
            return self.commitlog.get_record(phy_offset)
        return self.commitlog.get_message(phy_offset, size)

    def message_at(self, topic: str, queue_id: int, cq_offset: int) -> MessageExt | None:
        """The decoded message at consume-queue offset ``cq_offset`` of ``topic``/``queue_id``;
        None when the queue has no such entry or its record is gone or invalid."""
        entry = self._cq_entry(topic, queue_id, cq_offset)
        if entry is None:
            return None
        return self.look_message_by_offset(entry[0], entry[1])

    def look_message_by_offset(self, phy_offset: int, size: int | None = None) -> MessageExt | None:
        """The decoded message at ``phy_offset``; None when absent or failing its checks."""
        raw = self.select_one_message_by_offset(phy_offset, size)
        if raw is None:
            return None
        try:
            return decode_record(raw)
        except RecordError:
            log.warning("no valid record at offset %d", phy_offset)
            return None

    def query_message(
        self, topic: str, key: str, max_num: int, begin: int, end: int
    ) -> QueryMessageResult:
        """Records whose KEYS or UNIQ_KEY is ``key``, stored within [begin, end] (ms)."""
        result = QueryMessageResult()
        if self.index is None:
            return result
        max_num = min(max_num, self.config.max_msgs_num_batch)
        offsets, last_ts, last_phy = self.index.query(topic, key, max_num, begin, end)
        # Re-dispatch after a crash can index a record twice (as in Java): report it once.
        offsets = list(dict.fromkeys(offsets))
        result.index_last_update_timestamp = last_ts
        result.index_last_update_phyoffset = last_phy
        for phy in offsets:
            raw = self.select_one_message_by_offset(phy)
            if raw is None:
                continue
            try:
                msg = decode_record(raw, read_body=False, check_crc=False)
            except RecordError:
                continue
            # The index keeps only a hash: confirm the key really matches.
            if msg.topic == topic and (key == msg.unique_key or key in msg.keys):
                result.messages.append(raw)
        return result

    # --- HA ------------------------------------------------------------------------------------

    def get_commitlog_data(
        self, offset: int, max_size: int = COMMITLOG_DATA_MAX_BYTES
    ) -> bytes | None:
        """Raw commit-log bytes from ``offset``, at most ``max_size`` and never past the end of
        its file (HA sends what it gets and asks again from where it stopped)."""
        return self.commitlog.get_data(offset, max_size)

    def start_replica_at(self, offset: int) -> None:
        """HA slave: an empty commit log starts where the master's data does (the file holding
        ``offset``), so that the first frame from a master whose oldest files are gone lands at
        this store's max offset.  Nothing changes once the log has data."""
        if self.commitlog.max_offset == 0 and offset > 0:
            self.commitlog.queue.get_last_mapped_file(offset)

    def append_to_commitlog(self, start_offset: int, data: bytes | memoryview) -> bool:
        """HA slave: append replicated bytes at exactly the current max offset."""
        if not data:
            return True
        ok = self.commitlog.append_data(start_offset, data)
        if ok:
            self.reput.wakeup()
        return ok

    @property
    def max_phy_offset(self) -> int:
        return self.commitlog.max_offset

    @property
    def min_phy_offset(self) -> int:
        return self.commitlog.min_offset

    @property
    def dispatch_behind_bytes(self) -> int:
        return self.reput.behind_bytes

    # --- admin ---------------------------------------------------------------------------------

    async def delete_topics(self, topics: Iterable[str]) -> int:
        """Drop the consume queues (and offset-table entries) of ``topics``; commit-log records
        stay until they expire.  Returns the number of queues deleted."""
        deleted = 0
        # Records of these topics appended before now (a send already answered) are
        # dispatched first, else the reput task would bring their queues back afterwards.
        async with self.reput.caught_up():
            for topic in topics:
                by_id = self.consume_queues.queues.pop(topic, None)
                if not by_id:
                    continue
                for cq in by_id.values():
                    async with cq.queue.io_lock:
                        await trio.to_thread.run_sync(cq.destroy)
                    self.commitlog.topic_queue_table.pop((topic, cq.queue_id), None)
                    deleted += 1
                topic_dir = os.path.join(self.config.consume_queue_dir, topic)
                await trio.to_thread.run_sync(_remove_empty_tree, topic_dir)
        return deleted

    def _dispatched(self) -> int:
        """The commit-log offset dispatch has reached (DLedger expiry stays below it)."""
        return self.reput.reput_from_offset

    async def clean_files_once(self) -> None:
        """One round of both clean services (what the periodic task runs)."""
        await self.clean_commitlog.run_once()
        await self.clean_consume_queue.run_once()

    def execute_delete_files_manually(self) -> None:
        self.clean_commitlog.execute_delete_files_manually()

    def runtime_info(self) -> dict[str, str]:
        """Figures for the broker's runtime-info command (Java key names where they exist)."""
        cl = self.commitlog
        return {
            "commitLogMinOffset": str(cl.min_offset),
            "commitLogMaxOffset": str(cl.max_offset),
            "commitLogDiskRatio": f"{self.clean_commitlog.last_ratio:.4f}",
            "dispatchBehindBytes": str(self.reput.behind_bytes),
            "putMessageTimesTotal": str(self.put_message_times_total),
            "putMessageSizeTotal": str(self.put_message_size_total),
            "getMessageTimesTotal": str(self.get_message_times_total),
            "bootTimestamp": str(self.start_time_ms),
            "flushDiskType": self.config.flush_disk_type.value,
            "brokerRole": self.config.broker_role.value,
            "consumeQueueCount": str(sum(1 for _ in self.consume_queues)),
            "indexFileCount": str(len(self.index.files) if self.index else 0),
            "diskFull": str(self.clean_commitlog.disk_full).lower(),
            "lastExitOk": str(self.last_exit_ok).lower(),
        }


def _remove_empty_tree(path: str) -> None:
    for root, dirs, _files in os.walk(path, topdown=False):
        for d in dirs:
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(root, d))
    with contextlib.suppress(OSError):
        os.rmdir(path)
