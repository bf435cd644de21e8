"""Reading a store's commit log for export: the plan (which files, which bounds) and the scan.

Pure Python over files, no Spark.  :func:`plan_store` runs on the driver: it checks that the
path is a store, lists the commit-log files and turns the options into one :class:`Segment` per
file that may hold wanted records.  :class:`SegmentScan` runs in a Spark task (or a plain loop):
it decodes one file's records with the one record codec (:func:`pymq.common.record.
decode_record`, CRC checked), yields the wanted ones and keeps a :class:`SegmentReport`.

Files are independent: a record never spans two, a BLANK record fills a file's tail and zeros
follow the newest file's last record.  Anything else is a bad range: the scan reports it, looks
for the next record that decodes and sits at its own physical offset, and goes on from there
(``failfast`` mode raises :class:`CorruptRecordError` instead).  A file that vanishes while it is
read (a broker's clean service deleted it) is reported as a bad range too.

Bounds: ``fromOffset`` and ``fromTime`` filter, while ``toOffset``, ``toTime`` and the checkpoint
stop a scan.  Store timestamps are taken to grow with offsets (the broker assigns them in append
order), as RocketMQ's own lookups by time assume; planning skips whole files on that basis.
"""

from __future__ import annotations

import collections
import functools
import itertools
import json
import logging
import mmap
import os
import struct
import zlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

import attrs

from pymq.common.checkpoint_layout import CHECKPOINT_FILE, CHECKPOINT_LAYOUT, unpack_checkpoint
from pymq.common.files import drop_cached_from
from pymq.common.message_ext import MessageExt, MessageSysFlag
from pymq.common.record import (
    BLANK_MAGIC_CODE,
    MESSAGE_MAGIC_CODE,
    BlankRecord,
    RecordError,
    decode_record,
    read_record_header,
    store_timestamp_position,
)
from pymq.common.topic import is_system_topic
from pymq.export.columns import ColumnRun, column_batch, decode_run
from pymq.export.options import CheckpointBound, ExportOptions, Mode

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

COMMITLOG_DIR = "commitlog"
ABORT_FILE = "abort"
_NAME_DIGITS = 20
_MESSAGE_MAGIC = struct.pack(">I", MESSAGE_MAGIC_CODE)
_BLANK_MAGIC = struct.pack(">I", BLANK_MAGIC_CODE)
_HEAD = struct.Struct(">iIiiiqqi")  # up to SYSFLAG: enough to find STORETIMESTAMP
_LONG = struct.Struct(">q")
_ZERO_PROBE = 8
"""Bytes that must all be zero at a position for it to count as the end of written data."""
_CHUNK = 1 << 20
_TS_LIMIT = ((1 << 63) - 1) // 1000
"""The largest timestamp (ms, either sign) Spark's microsecond timestamps hold: a record
beyond it is corrupt (its header, which no CRC covers); fromTime is clamped to it."""


class StoreError(Exception):
    """The path is not a readable RocketMQ store; the message says what was expected."""


class CorruptRecordError(RecordError):
    """A corrupt range met in ``failfast`` mode."""


@attrs.frozen
class Segment:
    """One commit-log file and the absolute offsets [start, end) an export may read from it."""

    index: int
    path: str
    file_offset: int
    file_size: int
    start: int
    end: int
    newest: bool
    stop_timestamp: int | None
    """Stop before the first record stored after this (checkpoint) or at/after toTime + 1."""


@attrs.frozen
class BadRange:
    """Bytes [start, end) of the commit log that hold no valid record, and why."""

    path: str
    start: int
    end: int
    reason: str

    def describe(self) -> str:
        return (
            f"{os.path.basename(self.path)}: bytes {self.start}..{self.end} "
            f"({self.end - self.start} bytes) skipped: {self.reason}"
        )


@attrs.frozen
class StorePlan:
    """What :func:`plan_store` found: the segments to read and facts for the summary."""

    root: str
    commitlog_dir: str
    segments: list[Segment]
    files: int
    min_offset: int
    max_offset: int
    checkpoint_timestamp: int | None
    notes: list[str]


@attrs.define
class SegmentReport:
    """What one segment's scan exported and skipped; JSON-able for the job's summary."""

    index: int
    path: str
    start: int
    resume_offset: int = 0
    """Where a later incremental export must start: everything before it was considered."""
    messages: int = 0
    record_bytes: int = 0
    body_bytes: int = 0
    topics: dict[str, int] = attrs.field(factory=dict)
    bad_ranges: list[BadRange] = attrs.field(factory=list)

    def to_json(self) -> dict[str, object]:
        return attrs.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> SegmentReport:
        bad = [BadRange(**b) for b in data.pop("bad_ranges", [])]
        return cls(**data, bad_ranges=bad)

    def write(self, directory: str) -> None:
        """Write ``segment-<index>.json`` atomically (a retried task overwrites its own)."""
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"segment-{self.index:06d}.json")
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f)
        os.replace(tmp, path)


def read_reports(directory: str) -> list[SegmentReport]:
    """Every segment report in ``directory``, by segment index."""
    reports = []
    for name in sorted(os.listdir(directory)):
        if name.startswith("segment-") and name.endswith(".json"):
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                reports.append(SegmentReport.from_json(json.load(f)))
    return reports


# --- planning (driver) ----------------------------------------------------------------------------


def _is_commitlog_name(name: str) -> bool:
    return len(name) == _NAME_DIGITS and name.isdigit()


def locate_store(path: str) -> tuple[str, str]:
    """(store root, commit-log directory) for ``path``: a store root or its ``commitlog/``.

    Raises :class:`StoreError` when ``path`` is neither.
    """
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.exists(path):
        raise StoreError(f"{path} does not exist")
    if not os.path.isdir(path):
        raise StoreError(f"{path} is not a directory (expected a RocketMQ store root)")
    candidate = os.path.join(path, COMMITLOG_DIR)
    if os.path.isdir(candidate):
        return path, candidate
    if any(_is_commitlog_name(n) for n in os.listdir(path)):
        return os.path.dirname(path), path
    raise StoreError(
        f"{path} is not a RocketMQ store: it has no {COMMITLOG_DIR}/ directory of commit-log "
        f"files named by their 20-digit start offset (give storePathRootDir, e.g. ~/store)"
    )


def read_checkpoint_timestamp(root: str) -> int | None:
    """physicMsgTimestamp of ``root/checkpoint`` (what the broker has flushed), or None."""
    try:
        with open(os.path.join(root, CHECKPOINT_FILE), "rb") as f:
            raw = f.read(CHECKPOINT_LAYOUT.size)
    except FileNotFoundError:
        return None
    if len(raw) < CHECKPOINT_LAYOUT.size:
        return None
    return unpack_checkpoint(raw).physic_msg_timestamp


def first_store_timestamp(path: str) -> int | None:
    """STORETIMESTAMP of a file's first record, or None when it does not start with one."""
    try:
        with open(path, "rb") as f:
            head = f.read(80)
    except OSError:
        return None
    if len(head) < _HEAD.size + 20:
        return None
    fields = _HEAD.unpack_from(head, 0)
    if fields[1] != MESSAGE_MAGIC_CODE:
        return None
    return _LONG.unpack_from(head, store_timestamp_position(fields[7]))[0]


def _starts_empty(path: str) -> bool:
    """Whether a file's first bytes are zeros (or missing): no record was ever written there."""
    try:
        with open(path, "rb") as f:
            head = f.read(_ZERO_PROBE)
    except OSError:
        return False
    return not head.strip(b"\0")


def _checkpoint_bound(opts: ExportOptions, root: str, notes: list[str]) -> int | None:
    want = opts.until_checkpoint
    if want is CheckpointBound.NO:
        return None
    stamp = read_checkpoint_timestamp(root)
    if want is CheckpointBound.AUTO:
        if not os.path.exists(os.path.join(root, ABORT_FILE)):
            return None
        if stamp is None:
            notes.append("abort file present but no checkpoint: reading every valid record")
            return None
        notes.append(
            "abort file present (broker running, or not shut down cleanly): reading only up to "
            f"the checkpoint, records stored at or before {stamp} ms"
        )
        return stamp
    if stamp is None:
        raise StoreError(f"untilCheckpoint=true but {root} has no readable checkpoint file")
    return stamp


def plan_store(opts: ExportOptions) -> StorePlan:
    """Check the store and split it into segments, one per commit-log file that may matter.

    Raises :class:`StoreError` for a path that is not a store, and for files whose names or
    sizes make no sense (a file longer than the gap to the next one).
    """
    root, directory = locate_store(opts.path)
    names = sorted(n for n in os.listdir(directory) if _is_commitlog_name(n))
    notes: list[str] = []
    others = [n for n in os.listdir(directory) if not _is_commitlog_name(n)]
    if others:
        notes.append(
            f"ignored {len(others)} file(s) in {directory} not named like commit-log files"
        )
    files = []
    for name in names:
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            continue
        files.append((int(name), path, os.path.getsize(path)))
    for (offset, path, size), (next_offset, _, _) in itertools.pairwise(files):
        if offset + size > next_offset:
            raise StoreError(
                f"{path} ({size} bytes) overlaps the next file at offset {next_offset}"
            )
        if offset + size < next_offset:
            notes.append(f"gap in the commit log after {os.path.basename(path)}")
    stop_ts = _checkpoint_bound(opts, root, notes)
    checkpoint_ts = stop_ts
    if opts.to_time is not None:
        stop_ts = opts.to_time - 1 if stop_ts is None else min(stop_ts, opts.to_time - 1)
    segments: list[Segment] = []
    firsts = [first_store_timestamp(path) for _, path, _ in files]
    # The broker creates the next file ahead of need: trailing files that start with zeros hold
    # nothing yet, and the one before them is the file being written.
    used = len(files)
    while used > 0 and _starts_empty(files[used - 1][1]):
        used -= 1
    if used < len(files):
        notes.append(f"{len(files) - used} empty pre-allocated commit-log file(s) not read")
    for i, (offset, path, size) in enumerate(files[:used]):
        start = max(offset, opts.from_offset or 0)
        end = offset + size if opts.to_offset is None else min(offset + size, opts.to_offset)
        if start >= end:
            continue
        first_ts = firsts[i]
        if stop_ts is not None and first_ts is not None and first_ts > stop_ts:
            continue  # every record here was stored after the bound (and so are later files')
        next_first = firsts[i + 1] if i + 1 < len(firsts) else None
        if opts.from_time is not None and next_first is not None and next_first < opts.from_time:
            continue  # every record here was stored before the next file's first one
        segments.append(
            Segment(len(segments), path, offset, size, start, end, i == used - 1, stop_ts)
        )
    return StorePlan(
        root=root,
        commitlog_dir=directory,
        segments=segments,
        files=len(files),
        min_offset=files[0][0] if files else 0,
        max_offset=files[-1][0] + files[-1][2] if files else 0,
        checkpoint_timestamp=checkpoint_ts,
        notes=notes,
    )


# --- scanning (task) ------------------------------------------------------------------------------


class TopicFilter:
    """Which topics an export keeps: the named ones, else all but system topics (cached)."""

    def __init__(self, opts: ExportOptions) -> None:
        self._topics = opts.topics
        self._system = opts.include_system_topics
        self._cache: dict[str, bool] = {}

    def __call__(self, topic: str) -> bool:
        keep = self._cache.get(topic)
        if keep is None:
            if self._topics is not None:
                keep = topic in self._topics
            else:
                keep = self._system or not is_system_topic(topic)
            self._cache[topic] = keep
        return keep


def _all_zero(buf: mmap.mmap, pos: int, end: int) -> bool:
    probe = buf[pos : min(end, pos + _ZERO_PROBE)]
    return not probe.strip(b"\0")


def _end_of_data(buf: mmap.mmap, pos: int, end: int) -> int:
    """The offset just after the last non-zero byte in [pos, end) (pos when all are zero)."""
    hi = end
    while hi > pos:
        lo = max(pos, hi - _CHUNK)
        kept = len(buf[lo:hi].rstrip(b"\0"))
        if kept:
            return lo + kept
        hi = lo
    return pos


def _inflate(body: bytes, offset: int, path: str) -> bytes:
    """The body a producer sent (clients zlib-compress large bodies); the stored bytes if they
    do not inflate, with a warning: the record itself is valid, so it is still exported."""
    try:
        return zlib.decompress(body)
    except zlib.error as exc:
        log.warning(
            "%s: record at %d is flagged compressed but does not inflate (%s); exported as stored",
            os.path.basename(path),
            offset,
            exc,
        )
        return body


class SegmentScan:
    """Iterate the wanted records of one segment; :attr:`report` is final once iteration ends.

    Owns the file and its read-only mapping for the life of the iteration (closed in
    ``finally``, also when the consumer stops early).  Raises :class:`CorruptRecordError` on a
    bad range in ``failfast`` mode; otherwise never raises for bad bytes.
    """

    def __init__(self, segment: Segment, opts: ExportOptions) -> None:
        self.segment = segment
        self.opts = opts
        self.keep_topic = TopicFilter(opts)
        self.report = SegmentReport(segment.index, segment.path, segment.start, segment.start)
        self._topics: collections.Counter[str] = collections.Counter()
        # Where the walk found the newest file's data to end (zeros, or a torn tail), relative
        # to the file; None while it has not (it stopped before, or raised).
        self._data_end: int | None = None

    def __iter__(self) -> Iterator[MessageExt]:
        # Without a decoder no ColumnRun is made: the walk yields messages only.
        return cast(Iterator[MessageExt], self._walk(None, 0, 0))

    def arrow_batches(
        self,
        schema: pa.Schema,
        to_batch: Callable[[list[MessageExt]], pa.RecordBatch],
        max_rows: int,
        max_body_bytes: int,
        decoder: Callable[..., Any] | None,
    ) -> Iterator[pa.RecordBatch]:
        """The wanted records as Arrow batches of ``schema``, in commit-log order.

        With ``decoder`` (:func:`pymq.export.columns.export_columns`; None: the per-record path
        alone, the reference tests compare it with) runs of ordinary records become batches
        straight from the column decoder's buffers; every other record (and all of them
        without it) is decoded as a :class:`MessageExt` and goes through ``to_batch``.  Batches
        hold up to ``max_rows`` rows, and stop growing once their bodies reach
        ``max_body_bytes``.  The report is kept as :meth:`__iter__` keeps it.
        """
        pending: list[MessageExt] = []
        pending_bytes = 0
        for item in self._walk(decoder, max_rows, max_body_bytes):
            if isinstance(item, MessageExt):
                pending.append(item)
                pending_bytes += len(item.body)
                if len(pending) >= max_rows or pending_bytes >= max_body_bytes:
                    yield to_batch(pending)
                    pending, pending_bytes = [], 0
                continue
            if pending:
                yield to_batch(pending)
                pending, pending_bytes = [], 0
            batch = self._take_run(item, column_batch(item, schema))
            if batch.num_rows:
                yield batch
        if pending:
            yield to_batch(pending)

    def _take_run(self, run: ColumnRun, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The rows of a decoded run the options want (topics, fromTime), counted in the
        report as the per-message path counts them."""
        import pyarrow as pa
        import pyarrow.compute as pc

        topics = batch.column("topic")
        names = pc.unique(topics).to_pylist()
        mask = None
        if not all(self.keep_topic(t) for t in names):
            kept = pa.array([t for t in names if self.keep_topic(t)], pa.string())
            mask = pc.is_in(topics, value_set=kept)
        from_time = self.opts.from_time
        if from_time is not None:
            bound = max(-_TS_LIMIT, min(from_time, _TS_LIMIT)) * 1000
            recent = pc.greater_equal(batch.column("store_timestamp").cast(pa.int64()), bound)
            mask = recent if mask is None else pc.and_(mask, recent)
        report = self.report
        if mask is None:
            report.record_bytes += run.record_bytes
            report.body_bytes += run.body_bytes
        else:
            sizes = pa.Array.from_buffers(
                pa.int32(), run.rows, [None, pa.py_buffer(run.buffers["record_sizes"])]
            )
            batch = batch.filter(mask)
            report.record_bytes += pc.sum(sizes.filter(mask), min_count=0).as_py()
            report.body_bytes += pc.sum(pc.binary_length(batch.column("body")), min_count=0).as_py()
        report.messages += batch.num_rows
        if batch.num_rows:
            for entry in pc.value_counts(batch.column("topic")).to_pylist():
                self._topics[entry["values"]] += entry["counts"]
        return batch

    def _walk(
        self, decoder: Callable[..., Any] | None, max_rows: int, max_body_bytes: int
    ) -> Iterator[MessageExt | ColumnRun]:
        seg = self.segment
        try:
            f = open(seg.path, "rb")  # noqa: SIM115 (closed in finally below)
        except FileNotFoundError:
            self._bad(seg.start, seg.end, "file was deleted before it could be read")
            self.report.resume_offset = seg.file_offset + seg.file_size
            return
        size = 0
        try:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                self.report.resume_offset = seg.file_offset
                return
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                yield from self._scan(buf, size, decoder, max_rows, max_body_bytes)
        finally:
            if seg.newest and self._data_end is not None:
                # The scan's readahead past the data (and any search for a record there) cached
                # the zeros a live broker writes next as large folios: dropped, or a SYNC_FLUSH
                # broker would sync whole folios again there (MappedFile.advise_writes).  Only
                # from the data end the walk reached: a walk that stopped before it (toOffset,
                # the checkpoint's bound on a running broker, a consumer that stopped reading)
                # would otherwise evict the clean cached records after its stop, the newest
                # and most read ones.
                drop_cached_from(f.fileno(), self._data_end, size)
            f.close()

    def _bad(self, start: int, end: int, reason: str) -> None:
        bad = BadRange(self.segment.path, start, end, reason)
        if self.opts.mode is Mode.FAILFAST:
            raise CorruptRecordError(bad.describe())
        log.warning("%s", bad.describe())
        self.report.bad_ranges.append(bad)

    def _resync(self, buf: mmap.mmap, pos: int, size: int) -> int | None:
        """The next position after ``pos`` holding a valid record at its own physical offset,
        or a blank record that closes the file; None when there is none."""
        base = self.segment.file_offset
        search = pos + 1
        while True:
            hit = buf.find(_MESSAGE_MAGIC, search + 4, size)
            blank = buf.find(_BLANK_MAGIC, search + 4, size)
            candidates = [h - 4 for h in (hit, blank) if h >= 0]
            if not candidates:
                return None
            cand = min(candidates)
            try:
                msg = decode_record(buf, cand, read_body=False, tears=True)
                if msg.commitlog_offset == base + cand:
                    return cand
            except BlankRecord as blank_record:
                if blank_record.size == size - cand:
                    return cand
            except RecordError:
                pass
            search = cand + 1

    def _skip_bad(self, buf: mmap.mmap, pos: int, size: int, exc: RecordError) -> tuple[int, bool]:
        """After a bad record at ``pos``: (where the walk goes on, whether the file ends)."""
        seg = self.segment
        base = seg.file_offset
        if _all_zero(buf, pos, size):
            if seg.newest:
                self._data_end = pos
                return pos, True
            self._bad(base + pos, base + size, "file ends early, without a blank")
            return size, True
        nxt = self._resync(buf, pos, size)
        if nxt is None:
            if seg.newest:
                self._data_end = pos  # (the search read the rest of the file)
            self._bad(base + pos, base + _end_of_data(buf, pos, size), str(exc))
            # The newest file's tail may still be being written: a later run reads it again.
            # A closed file's torn tail never heals.
            return (pos if seg.newest else size), True
        self._bad(base + pos, base + nxt, str(exc))
        return nxt, False

    def _scan(
        self,
        buf: mmap.mmap,
        size: int,
        decoder: Callable[..., Any] | None,
        max_rows: int,
        max_body_bytes: int,
    ) -> Iterator[MessageExt | ColumnRun]:
        """The walk over one mapped file: messages, and with ``decoder`` runs of columns
        (yielded before the consumer filters and counts them: see :meth:`_take_run`)."""
        seg, report = self.segment, self.report
        base = seg.file_offset
        start_rel = seg.start - base
        end_rel = min(size, seg.end - base)
        stop_ts = seg.stop_timestamp
        from_time = self.opts.from_time
        keep_topic = self.keep_topic
        topics = self._topics
        inflate = functools.partial(_inflate, path=seg.path)
        pos = 0
        try:
            while pos < end_rel:
                if pos < start_rel:  # hop over records before fromOffset without decoding them
                    try:
                        total, magic = read_record_header(buf, pos)
                    except RecordError:
                        total, magic = 0, 0
                    if magic == MESSAGE_MAGIC_CODE and total > 0 and pos + total <= start_rel:
                        pos += total
                        continue
                elif decoder is not None:
                    run = decode_run(
                        decoder, buf, pos, end_rel, base, stop_ts, max_rows, max_body_bytes, inflate
                    )
                    if run.rows:
                        yield run
                        pos = run.end
                        continue
                    # Not a record the column decoder takes: judged below, one record.
                try:
                    msg = decode_record(buf, pos, tears=True)
                    if msg.commitlog_offset != base + pos:
                        raise RecordError(
                            f"record at {pos} says it is at offset {msg.commitlog_offset}"
                        )
                    if not (
                        -_TS_LIMIT <= msg.store_timestamp <= _TS_LIMIT
                        and -_TS_LIMIT <= msg.born_timestamp <= _TS_LIMIT
                    ):
                        raise RecordError(f"record at {pos}: timestamp out of range")
                except BlankRecord:
                    pos = size
                    break
                except RecordError as exc:
                    pos, ended = self._skip_bad(buf, pos, size, exc)
                    if ended:
                        break
                    continue
                if stop_ts is not None and msg.store_timestamp > stop_ts:
                    break
                if (
                    pos >= start_rel
                    and keep_topic(msg.topic)
                    and (from_time is None or msg.store_timestamp >= from_time)
                ):
                    if msg.sys_flag & MessageSysFlag.COMPRESSED_FLAG:
                        msg.body = _inflate(msg.body, msg.commitlog_offset, seg.path)
                    report.messages += 1
                    report.record_bytes += msg.store_size
                    report.body_bytes += len(msg.body)
                    topics[msg.topic] += 1
                    yield msg
                pos += msg.store_size
        finally:
            report.resume_offset = base + min(pos, size)
            report.topics = dict(topics)
