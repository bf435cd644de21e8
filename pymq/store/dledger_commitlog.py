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
  (:meth:`DLedgerCommitLog.wait_quorum`, the store's ``replica_waiter``; for a send served in
  the connection's reader, :meth:`DLedgerCommitLog.on_quorum` through the store's
  ``defer_durable``, its answer written by the callback); DLedger's outcomes map
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
  An expired file is unlinked at once and its descriptor closed at its last release: a reader
  holding it (reference counted, as DLedger's MmapFile) finishes its read.

- **Carry-over** (RocketMQ 4.9.4's ``dividedCommitlogOffset``): a plain commit log written
  before DLedger mode was turned on stays, read-only, as the part of the log below
  :attr:`DLedgerCommitLog.divided_offset`.  At the first start in DLedger mode (no DLedger
  data file yet) it is recovered as a plain commit log, its last file is closed with a blank
  (as Java writes it), and the DLedger log starts at the end of that file, rounded up to a
  multiple of the DLedger data file size (``mappedFileSizeForEntryData``: DLedger's files
  start at such offsets); later starts take the first DLedger file's offset.  Offsets below
  it are read from the old files (pulls, queries, dispatch of old records not yet in the
  consume queues, which are kept as they are); entries and their offsets go on after it.
  While old files remain, the clean round expires them by the plain commit log's rule
  (``fileReservedTime`` hours, the last file too once expired) and no DLedger file (Java
  disables DLedger's expiry meanwhile).  Every member of a group must start from the same
  old log, or none, as in Java: the offsets of its entries are the group's.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import struct
from collections.abc import Callable, Container, Sequence
from typing import Any

import trio

from pymq.common.clock import now_ms
from pymq.common.message_ext import MessageExt, MessageSysFlag
from pymq.common.message_id import offset_msg_ids, pack_ip
from pymq.common.record import BLANK_MAGIC_CODE as COMMITLOG_BLANK_MAGIC
from pymq.common.record import (
    END_FILE_MIN_BLANK_LENGTH,
    MAX_TOPIC_LENGTH,
    BlankRecord,
    RecordError,
    read_record_info,
)
from pymq.common.topic import SCHEDULE_TOPIC
from pymq.dledger.config import DLedgerConfig
from pymq.dledger.errors import DLedgerError, ResponseCode
from pymq.dledger.server import DLedgerServer
from pymq.dledger.store import (
    BLANK_MAGIC_CODE,
    BODY_OFFSET,
    MAX_ENTRY_SIZE,
    DLedgerEntry,
    DLedgerFileStore,
    delete_files,
)
from pymq.store.clean_service import CleanCommitLogService, disk_used_ratio
from pymq.store.commitlog import (
    _HEADER_SIZES,
    SCRATCH_KEPT_MAX,
    CommitLog,
    DispatchHint,
    encode_run,
    stored_entries,
)
from pymq.store.config import MessageStoreConfig
from pymq.store.mapped_file import MappedFile
from pymq.store.mapped_file_queue import DELETE_FILES_BATCH_MAX, MappedFileAllocator
from pymq.store.reput import (
    _SCHEDULE_TOPIC_B,
    ReputMessageService,
    _dispatch_hinted,
    _record_hints,
)
from pymq.store.results import PUT_OK, PutMessageResult, PutMessageStatus

log = logging.getLogger(__name__)

_ENTRY_START = struct.Struct(">ii")  # an entry's MAGIC and SIZE (a blank's too)
_HOST_FLAGS = MessageSysFlag.BORNHOST_V6_FLAG | MessageSysFlag.STOREHOSTADDRESS_V6_FLAG
_PREPARED = MessageSysFlag.TRANSACTION_PREPARED_TYPE
_BLANK = struct.Struct(">iI")  # a plain commit log's blank record: its size and magic

_ENTRY_OVERHEAD = BODY_OFFSET + 91 + 24 + 1 + 2 + 9
"""An entry's bytes beside its record's body, topic, properties and cluster name (at most)."""
_MAX_ENTRY_BODY_PROPERTIES = MAX_ENTRY_SIZE - BODY_OFFSET - (91 + 24 + MAX_TOPIC_LENGTH)
"""The sends' bound on a record's body and properties in DLedger mode (with the
store's maxMessageSize): its entry must not exceed DLedger's MAX_ENTRY_SIZE (4 MiB)."""

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
    commit log's (``storePathCommitLog``, ``mappedFileSizeCommitLog``; default: the DLedger
    data file size), carried over when it holds data (see the module's docstring).
    :attr:`server` is the member; the store runs it once recovered."""

    def __init__(
        self,
        directory: str,
        dledger_config: DLedgerConfig,
        allocator: MappedFileAllocator | None = None,
        clock_ms: Any = None,
        file_size: int | None = None,
    ) -> None:
        kwargs = {} if clock_ms is None else {"clock_ms": clock_ms}
        super().__init__(
            directory,
            file_size or dledger_config.mapped_file_size_for_entry_data,
            allocator,
            **kwargs,
        )
        self.dledger_config = dledger_config
        self.dledger = DLedgerFileStore(dledger_config)
        self.divided_offset = 0
        """Java's dividedCommitlogOffset: below it the plain commit log written before DLedger
        mode (its files, read-only), from it on the DLedger log."""
        self.server = DLedgerServer(dledger_config, store=self.dledger)
        # A put's end offset (PutMessageResult.wrote_offset + wrote_bytes) -> its last entry's
        # index, until wait_quorum takes it (bounded: see _remember).
        self._pending: dict[int, collections.deque[int]] = {}
        self._pending_count = 0

    # --- offsets -------------------------------------------------------------------------------

    @property
    def max_offset(self) -> int:
        """The committed position (Java's getMaxOffset: else the first data offset, else
        where the DLedger log is to start: 0, or after a plain log carried over)."""
        committed = self.dledger.committed_pos
        if committed > 0:
            return committed
        if self.dledger.data.files:
            return self.dledger.data.min_offset
        return self.divided_offset

    @property
    def min_offset(self) -> int:
        """The old commit log's first offset while it has files, else the DLedger log's."""
        first = self.queue.first_file
        if first is not None:
            return first.file_from_offset
        return self.dledger.data.min_offset

    def holds_no_data(self) -> bool:
        return not self.dledger.data.files and not self.queue.files

    # --- lifecycle (blocking, in the store's recovery thread) ---------------------------------

    def load(self) -> None:
        super().load()  # a plain commit log written before DLedger mode: carried over
        try:
            self.dledger.open()
        except BaseException:
            super().close()
            raise

    def recover_normally(self, check_crc: bool) -> int:
        """The DLedger store recovered itself when it opened (cut at the first entry that is
        not whole); consume queues are rebuilt from its committed position.  A plain commit
        log carried over is recovered here (see :meth:`_divide`)."""
        self._divide(check_crc)
        return self.max_offset

    def recover_abnormally(self, check_crc: bool, min_timestamp: int, dispatcher: Any) -> int:
        self._divide(check_crc)
        return self.max_offset

    def _divide(self, check_crc: bool) -> None:
        """Set :attr:`divided_offset`.  With DLedger data files, it is the first one's offset
        (the old files, if any, are whole up to their ends, as they were loaded).  Else, with
        an old commit log, this is the first start over it: recovered as a plain log, its
        last file closed with a blank, and the DLedger log to start after it."""
        data = self.dledger.data
        if data.files:
            self.divided_offset = data.min_offset if self.queue.files else 0
            return
        if not self.queue.files:
            return
        end = super().recover_normally(check_crc)
        last = self.queue.files[-1]
        rest = last.file_size - last.wrote_position
        if rest >= END_FILE_MIN_BLANK_LENGTH:
            if last.wrote_position + END_FILE_MIN_BLANK_LENGTH > last.allocated:
                last.allocate_to(last.wrote_position + END_FILE_MIN_BLANK_LENGTH)
            _BLANK.pack_into(last.mm, last.wrote_position, rest, COMMITLOG_BLANK_MAGIC)
            last.sync()
        last.wrote_position = last.flushed_position = last.file_size
        self.queue.flushed_where = last.file_from_offset + last.file_size
        size = data.file_size
        divided = -(-(last.file_from_offset + last.file_size) // size) * size
        self.divided_offset = self.dledger.first_data_offset = divided
        log.info(
            "a plain commit log carried over: its data ends at %d, the DLedger log starts at %d",
            end,
            divided,
        )

    def close(self) -> None:
        super().close()
        self.dledger.close()

    # --- appends ---------------------------------------------------------------------------------

    def _refused(self, exc: DLedgerError) -> PutMessageResult:
        """Java: an entry that could not be appended (its position -1) is OS_PAGECACHE_BUSY,
        answered with Java's remark (the reason is logged, at debug level)."""
        log.debug("an append was refused: %s: %s", exc.code.name, exc)
        return PutMessageResult(PutMessageStatus.OS_PAGECACHE_BUSY)

    def _encode_entries(
        self, entries: list[tuple[Any, ...]], topic_bytes: dict[str, bytes],
        table: dict[tuple[str, int], int], clock: Callable[[], int] | None, cluster_b: bytes,
        born_ip: bytes, born_port: int, max_body_properties: int, stop_flags: int,
        stop_topic: str, room: int, size: int,
    ) -> tuple[int, list[Any], list[str | None], list[DLedgerEntry]]:  # fmt: skip
        """``entries`` (encode_run's: sends, or a run of stored messages) encoded by the one
        record encoder as DLedger entries of the leader's next indexes and term at the data
        file's tail, at most ``room`` bytes (``size``: an upper bound of what they take),
        each record the body of an entry of its own: (end, hint rows, stored WAIT values,
        the entries), queue offsets taken from and committed to ``table``.  Nothing is
        written to the log.  DLedgerError when the leader cannot append now."""
        node = self.server.node
        if node is None:
            raise DLedgerError(ResponseCode.LEADER_NOT_READY, "not started")
        index, term = node.next_entry(self.server.now())
        pos, _ = self.dledger.leader_room()
        scratch = self._scratch
        if len(scratch) < min(size, room):
            scratch = bytearray(min(size, room))
            if len(scratch) <= SCRATCH_KEPT_MAX:
                self._scratch = scratch
        end, hints, waits, _, error = encode_run(
            scratch, 0, min(room, len(scratch)), pos, entries, topic_bytes, table, clock,
            cluster_b, born_ip, born_port, self._store_ip, self._store_port,
            max_body_properties, stop_flags, stop_topic, DispatchHint, (index, term),
        )  # fmt: skip
        if error is not None:  # a defect after entries were encoded: those stand
            if not isinstance(error, Exception):
                raise error
            log.error("encoding a run of sends failed after %d", len(waits), exc_info=error)
        with memoryview(scratch) as view:
            appended = [
                DLedgerEntry(index + k, term, bytes(view[h[0] - pos : h[0] - pos + h[1]]),
                             h[0] - BODY_OFFSET)
                for k, h in enumerate(hints)
            ]  # fmt: skip
        return end, hints, waits, appended

    def _write_entries(self, end: int, appended: list[DLedgerEntry], watched: list[int]) -> None:
        """Append the entries :meth:`_encode_entries` encoded (the first ``end`` bytes of the
        scratch buffer) on the leader, together (DLedgerError: none)."""
        with memoryview(self._scratch) as view, view[:end] as data:
            self.server.append_encoded(data, appended, watched)

    def append_stored(
        self, msgs: Sequence[MessageExt], encoded: Sequence[tuple[bytes, bytes]]
    ) -> PutMessageResult:
        """An entry per message (a batch's appended together: Java's BatchAppendEntryRequest),
        acknowledged with the last, through the one record encoder as the sends are
        (:meth:`append_run`); a batch that does not fit in the data file goes on in the next
        one.  Refused whole when the leader cannot take them all now or an entry would
        exceed DLedger's MAX_ENTRY_SIZE."""
        node = self.server.node
        now = self.clock_ms()
        try:
            if node is None:
                raise DLedgerError(ResponseCode.LEADER_NOT_READY, "not started")
            node.check_appendable(len(msgs), self.server.now())
        except DLedgerError as exc:
            return self._refused(exc)
        try:
            entries, _, topics, _ = stored_entries(
                msgs, encoded, self._record_fixed, pack_ip, self._born_ips
            )
        except Exception as exc:  # a born host that is no address, a body that is no bytes
            return self._encode_failed(msgs, exc)
        store_v6 = 2 if len(self._store_ip) == 16 else 0
        sizes = [
            BODY_OFFSET + _HEADER_SIZES[store_v6 | (1 if len(e[8]) == 16 else 0)] + len(e[2])
            + 3 + len(topics[e[0]]) + len(e[3])
            for e in entries
        ]  # fmt: skip
        for size in sizes:
            if size > MAX_ENTRY_SIZE:
                return self._refused(DLedgerError(
                    ResponseCode.UNEXPECTED_ARGUMENT,
                    f"an entry of {size} bytes exceeds {MAX_ENTRY_SIZE}",
                ))  # fmt: skip
        table = self.topic_queue_table
        pending = {k: table[k] for k in {(m.topic, m.queue_id) for m in msgs} if k in table}
        clock = itertools.repeat(now).__next__
        hints: list[Any] = []
        last_index = -1
        i = 0
        while i < len(entries):
            # the messages that fit in the data file's room, or the next file for the first
            try:
                _, room = self.dledger.leader_room()
                j, need = i, 0
                while j < len(entries) and need + sizes[j] <= room:
                    need += sizes[j]
                    j += 1
                if j == i:
                    self.dledger.next_pos(sizes[i])  # the file closed with its blank
                    continue
                end, got, _, appended = self._encode_entries(
                    entries[i:j], topics, pending, clock, b"", b"", 0, 0, 0, "", need, need
                )
                if len(got) != j - i:
                    raise ValueError("the records do not fit their layout")
                self._write_entries(end, appended, [] if j < len(entries) else [appended[-1].index])
            except Exception as exc:
                if hints:  # the earlier ones are in the log: they are acknowledged or not
                    log.error("a batch was cut after %d of %d messages: %s", len(hints),
                              len(msgs), exc)  # fmt: skip
                if isinstance(exc, DLedgerError):
                    return self._refused(exc)
                return self._encode_failed(msgs, exc)
            table.update(pending)
            hints += got
            last_index = appended[-1].index
            i = j
        for msg, hint in zip(msgs, hints, strict=True):
            msg.sys_flag = hint[7]
            msg.queue_offset = hint[4]
            msg.commitlog_offset = hint[0]
            msg.store_timestamp = now
            msg.store_size = hint[1]
        result = self.put_result(hints)
        self._remember(result.wrote_offset + result.wrote_bytes, last_index)
        return result

    def append_run(
        self,
        entries: Sequence[tuple[str, int, Any, str | None, int, int, int, int]],
        topic_bytes: dict[str, bytes],
        cluster_b: bytes,
        born_host: tuple[str, int],
        max_body_properties: int,
        stop_flags: int,
    ) -> tuple[list[DispatchHint], list[str | None], int]:
        """The plain commit log's :meth:`~CommitLog.append_run` on the DLedger log: each
        record encoded by the one record encoder as the body of a DLedger entry of its own
        (a batch body's items each one), the entries of a run of single sends (or of one
        batch body) appended together; what the general path (:meth:`append_stored` of the
        messages the send path builds) appends for them.  Stops where the leader cannot
        append now (the general path then refuses with the reason), at the data file's end
        (the general path goes on in the next file), at a body and properties that would
        make an entry over DLedger's MAX_ENTRY_SIZE, and wherever the plain one stops.
        Returns the hints and stored WAIT values of the entries appended and the bytes their
        records take (their entries' headers left out, as Java counts them)."""
        if not entries or self.server.node is None:
            return [], [], 0
        if type(entries) is not list:
            entries = list(entries)
        born_ip = self._born_ip(born_host[0])
        if born_ip is None:
            return [], [], 0
        max_bp = min(max_body_properties, _MAX_ENTRY_BODY_PROPERTIES)
        clock = None if self.clock_ms is now_ms else self.clock_ms
        table = self.topic_queue_table
        hints: list[DispatchHint] = []
        waits: list[str | None] = []
        size = 0
        i = 0
        while i < len(entries):
            # a run of single sends, or a batch body alone (its last entry is its put's)
            batch = entries[i][3] is None
            j = i + 1
            while not batch and j < len(entries) and entries[j][3] is not None:
                j += 1
            run = entries if i == 0 and j == len(entries) else entries[i:j]
            # what their entries may take: per record, its entry header, the record's header
            # and topic, a separator and CLUSTER added to the properties (a batch item, of 22
            # bytes at least, has 22 of its own)
            extra = _ENTRY_OVERHEAD + len(cluster_b)
            bound = 0
            for entry in run:
                over = extra + len(topic_bytes.get(entry[0], b""))
                body_size = len(entry[2])
                if batch:
                    bound += body_size + body_size // 22 * over
                else:
                    bound += body_size + len(entry[3] or "") + over
            pending = {k: table[k] for k in {(e[0], e[1]) for e in run} if k in table}
            try:
                _, room = self.dledger.leader_room()
                end, got, got_waits, appended = self._encode_entries(
                    run, topic_bytes, pending, clock, cluster_b, born_ip, born_host[1], max_bp,
                    stop_flags, SCHEDULE_TOPIC, room, bound,
                )  # fmt: skip
                if not got:
                    break
                watched = [appended[-1].index] if batch else [e.index for e in appended]
                self._write_entries(end, appended, watched)
            except DLedgerError as exc:
                log.debug("a run of sends was left to the general path: %s", exc)
                break
            except Exception:  # a defect before anything was appended: the general path's
                log.exception("appending a run of sends failed")
                break
            table.update(pending)
            if batch:
                self._remember(got[0][0] + sum(h[1] for h in got), appended[-1].index)
            else:
                for h, e in zip(got, appended, strict=True):
                    self._remember(h[0] + h[1], e.index)
            for h in got:
                size += h[1]
            hints += got
            waits += got_waits
            i += len(got_waits)
            if len(got_waits) < len(run):
                break
        return hints, waits, size

    def put_result(self, hints: list[DispatchHint]) -> PutMessageResult:
        """:meth:`CommitLog.put_result`, its bytes the records' (Java's DLedgerCommitLog
        counts no entry header): a batch's end, which :meth:`wait_quorum` and
        :meth:`on_quorum` are asked about, is its first record's offset plus that."""
        if len(hints) == 1:
            return super().put_result(hints)
        first = hints[0]
        return PutMessageResult(
            PUT_OK,
            wrote_offset=first.physical_offset,
            wrote_bytes=sum(h.size for h in hints),
            msg_id=offset_msg_ids(self.msg_id_prefix, hints),  # type: ignore[arg-type]
            store_timestamp=first.store_timestamp,
            logic_offset=first.queue_offset,
            msg_num=len(hints),
        )

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

    def _take_pending(self, end: int) -> int | None:
        """The entry index the put ending at ``end`` waits for (taken: asked for once)."""
        indexes = self._pending.get(end)
        if not indexes:
            return None
        index = indexes.popleft()
        self._pending_count -= 1
        if not indexes:
            del self._pending[end]
        return index

    async def wait_quorum(self, end: int) -> PutMessageStatus:
        """The store's ``replica_waiter``: PUT_OK once a majority has the entry of the put
        ending at ``end``, else the status :data:`PUT_STATUS` gives its outcome."""
        index = self._take_pending(end)
        if index is None:
            return PutMessageStatus.UNKNOWN_ERROR
        ack = await self.server.wait_ack(index)
        return PUT_STATUS.get(ack.code, PutMessageStatus.UNKNOWN_ERROR)

    def on_quorum(self, end: int, callback: Callable[[PutMessageStatus], None]) -> None:
        """:meth:`wait_quorum` without a waiting task: ``callback(status)`` once the entry
        of the put ending at ``end`` is decided (the inline sends' way: their answers are
        written by the callback)."""
        index = self._take_pending(end)
        if index is None:
            callback(PutMessageStatus.UNKNOWN_ERROR)
            return
        self.server.on_ack(
            index, lambda ack: callback(PUT_STATUS.get(ack.code, PutMessageStatus.UNKNOWN_ERROR))
        )

    # --- reads -----------------------------------------------------------------------------------

    def get_message(self, offset: int, size: int) -> bytes | None:
        if offset < self.divided_offset:
            return super().get_message(offset, size)
        if size <= 0:
            return None
        return self.dledger.data.read(offset, size)

    def get_record(self, offset: int) -> bytes | None:
        if offset < self.divided_offset:
            return super().get_record(offset)
        head = self.dledger.data.read(offset, 4)
        if head is None:
            return None
        size = struct.unpack(">i", head)[0]
        if size <= 0:
            return None
        return self.dledger.data.read(offset, size)

    def get_data(self, offset: int, max_size: int | None = None) -> bytes | None:
        """Committed bytes from ``offset`` to the end of its file (Java's getData)."""
        if offset < self.divided_offset:
            return super().get_data(offset, max_size)
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
        if offset < self.divided_offset:
            return super().pickup_store_timestamp(offset, size)
        record = self.get_message(offset, size)
        if record is None:
            return -1
        try:
            return read_record_info(record, 0, check_crc=False).store_timestamp
        except (BlankRecord, RecordError):
            return -1


READ_WINDOW = 256 * 1024
"""Bytes of a data file the DLedger reput reads at a time (a larger entry is read alone)."""


class DLedgerReputMessageService(ReputMessageService):
    """Reput over the DLedger log: entry by entry up to the committed position, each body's
    record dispatched (its PHYSICALOFFSET is the entry's position + 48); a blank moves on to
    the next file.  An entry whose body is no record stops dispatch there (logged once),
    as the plain reput stops at a bad record.

    The data is read :data:`READ_WINDOW` bytes at a time; each record goes through the plain
    reput's C dispatch (``record_hints`` then ``dispatch_hinted``, one record a call: entries
    are not contiguous records), and a record that leaves (a consume-queue or index file to
    make or roll, properties not strictly formed, a delayed message's topic) is parsed and
    dispatched by the Python loop, as the plain reput does."""

    commitlog: DLedgerCommitLog

    def _file_to_dispatch(self) -> MappedFile | None:
        """The old commit log's file to dispatch from (below the divided offset), else None:
        the DLedger log has no mapped files."""
        if self.reput_from_offset < self.commitlog.divided_offset:
            return super()._file_to_dispatch()
        return None

    def _dispatch_some(self, budget: int, *, create_files: bool = False) -> tuple[bool, bool]:
        cl = self.commitlog
        if self.reput_from_offset < cl.divided_offset:
            if cl.queue.find_by_offset(max(self.reput_from_offset, cl.min_offset)) is not None:
                # the old commit log's records, as a plain reput dispatches them
                return super()._dispatch_some(budget, create_files=create_files)
            self.reput_from_offset = cl.divided_offset
        self._file_wanted = None
        data = cl.dledger.data
        if self.reput_from_offset < cl.min_offset:
            self.reput_from_offset = cl.min_offset
        end = cl.max_offset
        listener = self._safe_listener if self.listener is not None else None
        wanted = self._wanted = (
            self.listener_topics()
            if listener is not None and self.listener_topics is not None
            else None
        )
        buf, base = b"", 0  # the data file's bytes from the absolute offset base on
        done = 0
        while self.reput_from_offset < end and done < budget:
            offset = self.reput_from_offset
            at = offset - base
            if at < 0 or at + _ENTRY_START.size > len(buf):
                buf, base, at = _read_window(data, offset, end, READ_WINDOW), offset, 0
                if len(buf) < _ENTRY_START.size:
                    return done > 0, False
            magic, size = _ENTRY_START.unpack_from(buf, at)
            if magic == BLANK_MAGIC_CODE:
                self.reput_from_offset = offset + data.file_size - offset % data.file_size
                continue
            if size > BODY_OFFSET and at + size > len(buf):  # past the window: read it alone
                buf, base, at = _read_window(data, offset, end, size), offset, 0
            record_end = at + size
            if size > BODY_OFFSET and record_end <= len(buf):
                try:
                    if self._dispatch_hinted(buf, base, at, size, listener, wanted):
                        done += 1
                        continue
                except OSError as exc:  # a file that cannot be created: retry later
                    self._block(exc)
                    return done > 0, False
            stopped = self._dispatch_parsed(buf, at, size, listener, create_files=create_files)
            if stopped is not None:
                return done > 0, stopped
            done += 1
        return done > 0, self.reput_from_offset < end and done >= budget

    def _dispatch_parsed(
        self, buf: bytes, at: int, size: int, listener: Any, *, create_files: bool
    ) -> bool | None:
        """The entry of ``size`` bytes at ``buf[at:]`` (at reput_from_offset) parsed and
        dispatched by the Python loop: None once done (reput_from_offset past it), else the
        reput must stop here, True if it should come back at once (a queue file to make)."""
        offset = self.reput_from_offset
        try:
            if size <= BODY_OFFSET or at + size > len(buf):
                raise RecordError(f"entry of size {size}")
            entry = memoryview(buf)[at : at + size]
            info = read_record_info(entry, BODY_OFFSET, check_crc=False)
        except (BlankRecord, RecordError) as exc:
            if self._reported_bad != offset:
                self._reported_bad = offset
                log.error("reput stopped at DLedger entry %d: %s", offset, exc)
            return False
        if not create_files and self._note_file_wanted(
            info.topic, info.queue_id, info.physical_offset, info.size,
            info.queue_offset, info.sys_flag,
        ):  # fmt: skip
            return True
        try:
            self.table.dispatch(info, listener)
        except OSError as exc:
            self._block(exc)
            return False
        self.reput_from_offset = offset + size
        return None

    def _dispatch_hinted(
        self,
        buf: bytes,
        base: int,
        at: int,
        size: int,
        listener: Any,
        wanted: Container[str] | None,
    ) -> bool:
        """The entry of ``size`` bytes at ``buf[at:]`` (``buf`` read from offset ``base``)
        dispatched by the plain reput's C calls: True once done (reput_from_offset past it);
        False, nothing of it done, when the Python loop must judge it.  What stopped the C
        dispatch (an OSError: a file it could not write) is raised."""
        record_at, record_end = at + BODY_OFFSET, at + size
        rows, _ = _record_hints(
            buf, record_at, record_end, base, 1, _SCHEDULE_TOPIC_B, DispatchHint
        )
        if not rows:
            return False
        table = self.table
        n, _, _, last_ts, exc = _dispatch_hinted(
            collections.deque(rows), buf, record_at, record_end, base + record_at, 1,
            table.queues, listener, table.index, wanted,
        )  # fmt: skip
        if last_ts >= 0:
            table.logics_msg_timestamp = last_ts
        if n:
            self.reput_from_offset = base + record_end
        if exc is not None:
            try:
                raise exc
            finally:
                del exc
        return n > 0


def _read_window(data: Any, offset: int, end: int, size: int) -> bytes:
    """Up to ``size`` bytes of the data files from ``offset``, within its file, its written
    bytes and ``end``; empty when no file holds ``offset``."""
    f = data.find(offset)
    if f is None:
        return b""
    rel = offset - f.offset
    want = min(size, f.wrote - rel, end - offset)
    return os.pread(f.fd, want, rel) if want > 0 else b""


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
        if self.commitlog.queue.files:
            return await self._expire_old_files()
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

    async def _expire_old_files(self) -> int:
        """A plain commit log carried over: its files expire by the plain rule, and its last
        one too once as old (4.9.4's DLedgerCommitLog.deleteExpiredFile); no DLedger file
        goes meanwhile."""
        count = await super().run_once()
        queue = self.commitlog.queue
        if count or len(queue.files) != 1 or not (self.is_time_to_delete() or self.check_space()):
            return count
        last = queue.files[0]
        expired_ms = self.config.file_reserved_time * HOUR_MS
        at_once = self.config.clean_file_forcibly_enable and self.clean_immediately
        try:
            modified_ms = int(self.mtime(last.path) * 1000)
        except FileNotFoundError:
            modified_ms = 0
        if not at_once and self.clock_ms() < modified_ms + expired_ms:
            return 0
        log.info("deleting the last file of the plain commit log carried over: %s", last.path)
        return await queue.delete_files([last])
