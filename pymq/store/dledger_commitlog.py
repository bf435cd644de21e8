"""``DLedgerCommitLog``: the commit log of a broker in DLedger mode (``enableDLegerCommitLog``),
kept by a Raft group of brokers (pymq.dledger), as RocketMQ 4.9.4's ``DLedgerCommitLog``
extends its ``CommitLog``.

- **Records**: each message's record, encoded as the plain commit log encodes it (the one
  record encoder, :data:`~pymq.store.commitlog.encode_run`), is the body of one DLedger entry;
  a batch is an entry per message, appended together.  A record's physical offset is its
  entry's position plus the entry header
  (:data:`~pymq.dledger.store.BODY_OFFSET`, 48 bytes), as Java computes ``wroteOffset`` and
  its append hook stamps PHYSICALOFFSET: consume queues and message ids point into the DLedger
  data files, byte-compatible with a Java member's.
- **Acknowledgement**: a put answers once a majority of the group has its entry
  (:meth:`DLedgerCommitLog.wait_quorum`, the store's ``replica_waiter``); DLedger's outcomes map
  to Java's put statuses (:data:`PUT_STATUS`): WAIT_QUORUM_ACK_TIMEOUT after
  ``maxWaitAckTimeMs`` (2.5 s) and an entry that could not be appended (not the leader, too
  many waiting) are OS_PAGECACHE_BUSY, a lost leadership UNKNOWN_ERROR.  As in DLedger 0.2.6,
  a member has an entry once it is written to its files (its page cache); the files are
  fsynced every ``flushFileInterval`` (10 ms), whatever ``flushDiskType`` says.
- **Dispatch**: :attr:`max_offset` is the committed position, so the reput service
  (:class:`DLedgerReputMessageService`) builds consume queues and the index only from
  committed entries, which no member ever truncates.
- **Reads** (pulls, queries) go to the DLedger data files through the store's reads.

- **Expiry** (:class:`CleanDLedgerCommitLogService`, the store's clean commit-log round in
  DLedger mode): DLedger 0.2.6's CleanSpaceService with the keys RocketMQ 4.9.4 maps onto it
  -- at the ``deleteWhen`` hour, or while the disk (the store's root or the data directory)
  is over ``diskMaxUsedSpaceRatio``, data files last written ``fileReservedTime`` + 1 hours
  ago are deleted from the oldest on (any age above 85 % with ``cleanFileForciblyEnable``),
  never the last file and, unlike 0.2.6, never a file holding an entry that is not committed
  and dispatched to the consume queues; at most 10 a round, ``deleteCommitLogFilesInterval``
  ms apart.  The begin index moves to the first entry left; consume queues and index files
  below the new minimum offset go in the consume-queue round that follows, as for a plain
  commit log.  ``deleteExpiredCommitLog`` (a manual request) does not apply, as in Java.

Not carried over: a plain commit log written before DLedger mode was turned on (RocketMQ
reads it as the part before its ``dividedCommitlogOffset``) -- the broker refuses to start
with DLedger mode over one.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import struct
from collections.abc import Callable, Sequence
from typing import Any

import trio

from pymq.common.config import ConfigError
from pymq.common.message_ext import MessageExt, MessageSysFlag
from pymq.common.message_id import offset_msg_id
from pymq.common.record import (
    BlankRecord,
    RecordError,
    read_record_info,
)
from pymq.dledger.config import DLedgerConfig
from pymq.dledger.errors import DLedgerError, ResponseCode
from pymq.dledger.server import DLedgerServer
from pymq.dledger.store import BLANK_MAGIC_CODE, BODY_OFFSET, DLedgerFileStore, delete_files
from pymq.store.clean_service import CleanCommitLogService, disk_used_ratio
from pymq.store.commitlog import CommitLog, encode_run
from pymq.store.config import MessageStoreConfig
from pymq.store.mapped_file import MappedFile
from pymq.store.mapped_file_queue import DELETE_FILES_BATCH_MAX, MappedFileAllocator
from pymq.store.reput import ReputMessageService
from pymq.store.results import PUT_OK, PutMessageResult, PutMessageStatus

log = logging.getLogger(__name__)

_ENTRY_START = struct.Struct(">ii")  # an entry's MAGIC and SIZE (a blank's too)
_HOST_FLAGS = MessageSysFlag.BORNHOST_V6_FLAG | MessageSysFlag.STOREHOSTADDRESS_V6_FLAG
_PREPARED = MessageSysFlag.TRANSACTION_PREPARED_TYPE

PUT_STATUS: dict[ResponseCode, PutMessageStatus] = {
    ResponseCode.SUCCESS: PutMessageStatus.PUT_OK,
    ResponseCode.INCONSISTENT_LEADER: PutMessageStatus.SERVICE_NOT_AVAILABLE,
    ResponseCode.NOT_LEADER: PutMessageStatus.SERVICE_NOT_AVAILABLE,
    ResponseCode.LEADER_NOT_READY: PutMessageStatus.SERVICE_NOT_AVAILABLE,
    ResponseCode.DISK_FULL: PutMessageStatus.SERVICE_NOT_AVAILABLE,
    ResponseCode.WAIT_QUORUM_ACK_TIMEOUT: PutMessageStatus.OS_PAGECACHE_BUSY,
    ResponseCode.LEADER_PENDING_FULL: PutMessageStatus.OS_PAGECACHE_BUSY,
}
"""RocketMQ 4.9.4's DLedgerCommitLog.asyncPutMessage: a put's status by its entry's outcome
(any other outcome, TERM_CHANGED included, is UNKNOWN_ERROR)."""


class DLedgerCommitLog(CommitLog):
    """The commit log over a DLedger member's store.  ``directory``/``file_size``: the plain
    commit log's (``storePathCommitLog``), which must hold no data.  :attr:`server` is the
    member; the store runs it (``run_member``) once recovered."""

    def __init__(
        self,
        directory: str,
        dledger_config: DLedgerConfig,
        allocator: MappedFileAllocator | None = None,
        clock_ms: Any = None,
    ) -> None:
        kwargs = {} if clock_ms is None else {"clock_ms": clock_ms}
        super().__init__(
            directory, dledger_config.mapped_file_size_for_entry_data, allocator, **kwargs
        )
        self.dledger_config = dledger_config
        self.dledger = DLedgerFileStore(dledger_config)
        self.server = DLedgerServer(dledger_config, store=self.dledger)
        # A put's end offset (PutMessageResult.wrote_offset + wrote_bytes) -> its last entry's
        # index, until wait_quorum takes it (bounded: see _remember).
        self._pending: dict[int, collections.deque[int]] = {}
        self._pending_count = 0

    # --- offsets -------------------------------------------------------------------------------

    @property
    def max_offset(self) -> int:
        """The committed position (Java's getMaxOffset: else the first data offset, else 0)."""
        committed = self.dledger.committed_pos
        if committed > 0:
            return committed
        return self.dledger.data.min_offset

    @property
    def min_offset(self) -> int:
        return self.dledger.data.min_offset

    def holds_no_data(self) -> bool:
        return not self.dledger.data.files

    # --- lifecycle (blocking, in the store's recovery thread) ---------------------------------

    def load(self) -> None:
        super().load()
        if self.queue.files:
            super().close()
            raise ConfigError(
                f"enableDLegerCommitLog=true: {self.queue.directory} holds a commit log "
                "written without DLedger mode, which pymq cannot carry over into a DLedger "
                "group (move it away, or start without DLedger mode)"
            )
        self.dledger.open()

    def recover_normally(self, check_crc: bool) -> int:
        """The DLedger store recovered itself when it opened (cut at the first entry that is
        not whole); consume queues are rebuilt from its committed position."""
        return self.max_offset

    def recover_abnormally(self, check_crc: bool, min_timestamp: int, dispatcher: Any) -> int:
        return self.max_offset

    def close(self) -> None:
        super().close()
        self.dledger.close()

    # --- appends ---------------------------------------------------------------------------------

    def _refused(self, exc: DLedgerError) -> PutMessageResult:
        """Java: an entry that could not be appended (its position -1) is OS_PAGECACHE_BUSY,
        answered with Java's remark (the reason is logged, at debug level)."""
        log.debug("an append was refused: %s: %s", exc.code.name, exc)
        return PutMessageResult(PutMessageStatus.OS_PAGECACHE_BUSY)

    def _append_one(
        self, msg: MessageExt, encoded: tuple[bytes, bytes], now: int
    ) -> tuple[int, int, int, int] | PutMessageResult:
        """Append ``msg``'s record (``encoded``: its topic and properties bytes) as an entry:
        (physical offset, size, queue offset, entry index), or the refusal (nothing
        appended).  The record is the plain commit log's, by the one record encoder."""
        table = self.topic_queue_table
        key = (msg.topic, msg.queue_id)
        pending = {key: table[key]} if key in table else {}  # committed once appended
        try:
            (entry,), size, topics, _ = self.stored_entries((msg,), (encoded,))
            pos = self.dledger.next_pos(BODY_OFFSET + size)
            record = bytearray(size)
            _, hints, _, _, _ = encode_run(
                record, 0, size, pos + BODY_OFFSET, [entry], topics, pending,
                itertools.repeat(now).__next__, b"", b"", 0, self._store_ip, self._store_port,
                0, 0, "", None,
            )  # fmt: skip
            if not hints:
                raise ValueError("the record does not fit its layout")
        except DLedgerError as exc:
            return self._refused(exc)
        except Exception as exc:
            return self._encode_failed([msg], exc)
        try:
            appended = self.server.append_nowait(bytes(record))
        except DLedgerError as exc:
            return self._refused(exc)
        assert appended.pos == pos, (appended.pos, pos)
        table.update(pending)
        hint = hints[0]
        msg.sys_flag = hint[7]
        msg.queue_offset = hint[4]
        msg.commitlog_offset = pos + BODY_OFFSET
        msg.store_timestamp = now
        msg.store_size = size
        return pos + BODY_OFFSET, size, hint[4], appended.index

    def append_stored(
        self, msgs: Sequence[MessageExt], encoded: Sequence[tuple[bytes, bytes]]
    ) -> PutMessageResult:
        """An entry per message (a batch's appended together: Java's BatchAppendEntryRequest),
        acknowledged with the last.  Refused whole when the leader cannot take them all now."""
        if len(msgs) > 1:
            node = self.server.node
            try:
                if node is None:
                    raise DLedgerError(ResponseCode.LEADER_NOT_READY, "not started")
                node.check_appendable(len(msgs), self.server.now())
            except DLedgerError as exc:
                return self._refused(exc)
        now = self.clock_ms()
        placed: list[tuple[int, int, int, int]] = []
        for msg, enc in zip(msgs, encoded, strict=True):
            one = self._append_one(msg, enc, now)
            if isinstance(one, PutMessageResult):
                if placed:  # the earlier ones are in the log: they are acknowledged or not
                    log.error("a batch was cut after %d of %d messages: %s", len(placed),
                              len(msgs), one.reason)  # fmt: skip
                return one
            placed.append(one)
        total = sum(p[1] for p in placed)
        first_phy = placed[0][0]
        self._remember(first_phy + total, placed[-1][3])
        ids = [offset_msg_id(self._msg_id_prefix, p[0]) for p in placed]
        return PutMessageResult(
            PUT_OK,
            wrote_offset=first_phy,
            wrote_bytes=total,
            msg_id=ids[0] if len(ids) == 1 else ",".join(ids),
            store_timestamp=now,
            logic_offset=placed[0][2],
            msg_num=len(placed),
        )

    # The one-call path writes into the mapped files: never taken in DLedger mode (the store
    # routes every put here; a leader is a SYNC_MASTER, which it leaves to the general path).
    def append_run(self, *args: Any) -> tuple[list[Any], list[str | None], int]:
        return [], [], 0

    def append_data(self, start_offset: int, data: bytes | memoryview) -> bool:
        return False  # HA replication has no place in DLedger mode

    def _remember(self, end: int, index: int) -> None:
        """Note the entry a put ending at ``end`` waits for.  At most maxPendingRequestsNum x 2
        are kept: beyond, the oldest (long decided: the node answers every entry within
        maxWaitAckTimeMs) are dropped, and a late wait_quorum for one is UNKNOWN_ERROR."""
        self._pending.setdefault(end, collections.deque()).append(index)
        self._pending_count += 1
        limit = 2 * self.dledger_config.max_pending_requests_num
        while self._pending_count > limit:
            oldest = next(iter(self._pending))
            self._pending[oldest].popleft()
            self._pending_count -= 1
            if not self._pending[oldest]:
                del self._pending[oldest]

    async def wait_quorum(self, end: int) -> PutMessageStatus:
        """The store's ``replica_waiter``: PUT_OK once a majority has the entry of the put
        ending at ``end``, else the status :data:`PUT_STATUS` gives its outcome."""
        indexes = self._pending.get(end)
        if not indexes:
            return PutMessageStatus.UNKNOWN_ERROR
        index = indexes.popleft()
        self._pending_count -= 1
        if not indexes:
            del self._pending[end]
        ack = await self.server.wait_ack(index)
        return PUT_STATUS.get(ack.code, PutMessageStatus.UNKNOWN_ERROR)

    # --- reads -----------------------------------------------------------------------------------

    def get_message(self, offset: int, size: int) -> bytes | None:
        if size <= 0:
            return None
        return self.dledger.data.read(offset, size)

    def get_record(self, offset: int) -> bytes | None:
        head = self.dledger.data.read(offset, 4)
        if head is None:
            return None
        size = struct.unpack(">i", head)[0]
        if size <= 0:
            return None
        return self.dledger.data.read(offset, size)

    def get_data(self, offset: int, max_size: int | None = None) -> bytes | None:
        """Committed bytes from ``offset`` to the end of its file (Java's getData)."""
        end = self.max_offset
        if offset >= end:
            return None
        f = self.dledger.data.find(offset)
        if f is None:
            return None
        stop = min(end, f.offset + f.wrote)
        if max_size is not None:
            stop = min(stop, offset + max_size)
        return self.dledger.data.read(offset, stop - offset)

    def pickup_store_timestamp(self, offset: int, size: int) -> int:
        record = self.get_message(offset, size)
        if record is None:
            return -1
        try:
            return read_record_info(record, 0, check_crc=False).store_timestamp
        except (BlankRecord, RecordError):
            return -1


class DLedgerReputMessageService(ReputMessageService):
    """Reput over the DLedger log: entry by entry up to the committed position, each body's
    record dispatched (its PHYSICALOFFSET is the entry's position + 48); a blank moves on to
    the next file.  An entry whose body is no record stops dispatch there (logged once),
    as the plain reput stops at a bad record."""

    commitlog: DLedgerCommitLog

    def _file_to_dispatch(self) -> MappedFile | None:  # not used: no mapped files here
        return None

    def _dispatch_some(self, budget: int, *, create_files: bool = False) -> tuple[bool, bool]:
        self._file_wanted = None
        cl = self.commitlog
        data = cl.dledger.data
        if self.reput_from_offset < cl.min_offset:
            self.reput_from_offset = cl.min_offset
        end = cl.max_offset
        listener = self._safe_listener if self.listener is not None else None
        self._wanted = (
            self.listener_topics()
            if listener is not None and self.listener_topics is not None
            else None
        )
        done = 0
        while self.reput_from_offset < end and done < budget:
            offset = self.reput_from_offset
            head = data.read(offset, _ENTRY_START.size)
            if head is None:
                return done > 0, False
            magic, size = _ENTRY_START.unpack(head)
            if magic == BLANK_MAGIC_CODE:
                self.reput_from_offset = cl.roll_next_file(offset)
                continue
            raw = data.read(offset, size) if size > BODY_OFFSET else None
            try:
                if raw is None:
                    raise RecordError(f"entry of size {size}")
                info = read_record_info(raw, BODY_OFFSET, check_crc=False)
            except (BlankRecord, RecordError) as exc:
                if self._reported_bad != offset:
                    self._reported_bad = offset
                    log.error("reput stopped at DLedger entry %d: %s", offset, exc)
                return done > 0, False
            if not create_files and self._note_file_wanted(
                info.topic, info.queue_id, info.physical_offset, info.size,
                info.queue_offset, info.sys_flag,
            ):  # fmt: skip
                return done > 0, True
            try:
                self.table.dispatch(info, listener)
            except OSError as exc:
                self._block(exc)
                return done > 0, False
            self.reput_from_offset = offset + size
            done += 1
        return done > 0, self.reput_from_offset < end and done >= budget


HOUR_MS = 3600 * 1000


class CleanDLedgerCommitLogService(CleanCommitLogService):
    """The clean commit-log round of a store in DLedger mode: expires the DLedger data files
    (see the module's docstring).  ``dispatched``: the offset the broker's dispatch has
    reached (its reput); no file at or past it, nor past the committed position, goes."""

    commitlog: DLedgerCommitLog

    def __init__(
        self,
        commitlog: DLedgerCommitLog,
        config: MessageStoreConfig,
        clock_ms: Callable[[], int],
        dispatched: Callable[[], int],
        disk_ratio: Callable[[str], float] = disk_used_ratio,
        mtime: Callable[[str], float] = os.path.getmtime,
    ) -> None:
        super().__init__(commitlog, config, clock_ms, disk_ratio, mtime)
        self.dispatched = dispatched

    def used_ratio(self) -> float:
        """0.2.6 watches the store's root and the data directory: the fuller of the two."""
        dc = self.commitlog.dledger_config
        return max(self.disk_ratio(dc.store_base_dir), self.disk_ratio(dc.data_path))

    async def run_once(self) -> int:
        """One round; the number of data files deleted."""
        dc = self.commitlog.dledger_config
        time_up = self.is_time_to_delete(dc.delete_when)
        space = self.check_space()
        if not (time_up or space):
            return 0
        at_once = dc.enable_disk_force_clean and self.clean_immediately
        expired_ms = max(1, dc.file_reserved_hours) * HOUR_MS  # 0.2.6: at least an hour
        store = self.commitlog.dledger
        below = min(store.committed_pos, self.dispatched())
        count = store.expired_files(
            expired_ms, self.clock_ms(), at_once, below, self.mtime, DELETE_FILES_BATCH_MAX
        )
        dropped = store.drop_first_files(count)
        if not dropped:
            return 0
        log.info(
            "deleting %d DLedger data files below %d, begin index now %d (time up %s, "
            "space %s, at once %s)", len(dropped), store.data.min_offset,
            store.ledger_begin_index, time_up, space, at_once,
        )  # fmt: skip
        interval = self.config.delete_commit_log_files_interval / 1000
        for i, f in enumerate(dropped):
            await trio.to_thread.run_sync(delete_files, [f])
            if interval and i + 1 < len(dropped):
                await trio.sleep(interval)
        return len(dropped)
