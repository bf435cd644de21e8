"""``ReputMessageService``: feeds new commit-log records to the consume queues and the index.

A task in the store's nursery.  A put (or an HA append) calls :meth:`wakeup`; the task then
dispatches every record between ``reput_from_offset`` and the commit log's end, calling the
arrival listener for each new consume-queue entry (long polling hangs on it), and yields to the
loop every :data:`YIELD_EVERY` records so a backlog never stalls the broker.  Records are
validated structurally (no CRC: they were written by this process or checked by recovery); a
record cut short at the end of the data (an HA chunk boundary) just waits for more bytes.

A record whose consume-queue or index file cannot be created (a full disk) is not skipped:
dispatch stops at it, :attr:`ReputMessageService.blocked` says why (the store refuses puts
meanwhile), and the task tries again every ``retry_interval`` seconds until it goes through.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import mmap
import operator
import struct
import sys
from collections.abc import AsyncIterator, Callable, Container
from typing import Any

import trio

from pymq.common.message_ext import tags_code
from pymq.common.native import load_native
from pymq.common.record import (
    MESSAGE_MAGIC_CODE,
    BlankRecord,
    RecordError,
    _scan_plain,
    read_record_header,
    read_record_info,
)
from pymq.common.topic import SCHEDULE_TOPIC
from pymq.store import consume_queue, index_file
from pymq.store.commitlog import (
    DISPATCH_HINTS_MAX,
    CommitLog,
    DispatchHint,
    _arg_int,
    _hint_type,
)
from pymq.store.consume_queue_table import ArrivalListener, ConsumeQueueTable
from pymq.store.mapped_file import MappedFile

native_extension: Any = load_native("pymq.store._dispatchc")

log = logging.getLogger(__name__)

_RECORD_HEADER = struct.Struct(">iI")  # TOTALSIZE, MAGICCODE (read_record_header, unchecked)


class _StopAt(Exception):
    """record_hints_py's walk ends at ``pos``."""

    def __init__(self, pos: int) -> None:
        self.pos = pos


_HINT_NAMES = (b"TAGS", b"KEYS", b"UNIQ_KEY")
_HINT_FIELDS = struct.Struct(">i4xq28xq")  # QUEUEID at 12, QUEUEOFFSET at 20, STORETIMESTAMP at 56


def _strict_hint_names(props: bytes) -> dict[bytes, str] | None:
    """The TAGS, KEYS and UNIQ_KEY values of properties that are strictly formed (each item
    name\x01value\x02, the last \x02 optional, names and values non-empty and without \x01,
    none of the three named twice); None for anything else, which the Python loop judges."""
    parts = props.split(b"\x02") if props else []
    if props.endswith(b"\x02"):
        parts.pop()
    found: dict[bytes, str] = {}
    for part in parts:
        name, sep, value = part.partition(b"\x01")
        if not name or not sep or not value or b"\x01" in value:
            return None
        if name in _HINT_NAMES:
            if name in found:
                return None
            found[name] = value.decode("ascii")
    return found


def record_hints_py(
    buf: Any, pos: Any, end: Any, file_from_offset: Any, max_rows: Any, skip_topic: Any,
    hint_type: Any,
) -> tuple[list[Any], int]:  # fmt: skip
    """Python twin of ``pymq.store._dispatchc.record_hints``: the dispatch hints the put path
    leaves for the records at buf[pos:end] (a commit-log file from file_from_offset), read back
    for records appended without one, each what reput's Python loop reads of its record, as
    hint_type (DispatchHint).  Returns (rows, stop): at most max_rows rows, and end or the first
    record the Python loop must judge (not a plain record at its own physical offset, a blank, a
    record of skip_topic, properties not strictly formed)."""
    pos = _arg_int(pos, "pos", 0, sys.maxsize)
    end = _arg_int(end, "end", 0, sys.maxsize)
    file_from = _arg_int(file_from_offset, "file_from_offset", 0, (2**63 - 1) // 2)
    max_rows = _arg_int(max_rows, "max_rows", 0, sys.maxsize)
    if not isinstance(skip_topic, bytes):
        raise TypeError("skip_topic must be bytes")
    hint_type = _hint_type(hint_type)
    if not isinstance(buf, (bytes, bytearray, mmap.mmap)):  # the walk reads bytes slices
        buf = bytes(memoryview(buf))
    end = min(end, len(buf))
    rows: list[Any] = []
    if pos >= end or not max_rows:
        return rows, pos

    def take(topic: bytes, queue_id: int, phy: int, total: int) -> bool:
        at = phy - file_from
        body_len = int.from_bytes(buf[at + 84 : at + 88], "big", signed=True)
        props_at = at + 88 + body_len + 1 + len(topic) + 2
        names = (
            None if topic == skip_topic else _strict_hint_names(bytes(buf[props_at : at + total]))
        )
        if names is None:
            raise _StopAt(at)
        queue_id, queue_offset, store_ts = _HINT_FIELDS.unpack_from(buf, at + 12)
        sys_flag = int.from_bytes(buf[at + 36 : at + 40], "big", signed=True)
        row = (
            phy, total, topic.decode("ascii"), queue_id, queue_offset, names.get(b"TAGS"),
            store_ts, sys_flag, names.get(b"KEYS"), names.get(b"UNIQ_KEY"),
        )  # fmt: skip
        rows.append(row if hint_type is None else tuple.__new__(hint_type, row))
        if len(rows) >= max_rows:
            raise _StopAt(at + total)
        return False

    try:
        stop = _scan_plain(buf, pos, end, False, file_from, take, [])
    except _StopAt as at:
        stop = at.pos
    return rows, stop


_record_hints: Callable[..., tuple[list[Any], int]] = getattr(
    native_extension, "record_hints", record_hints_py
)
"""The hints of records appended without one, read back: C when built, else its twin."""

_I64_MAX = 2**63 - 1
_DISPATCH_MAX_KEYS = 32  # keys (UNIQ_KEY included) of a record the hinted dispatch indexes
_INDEX_HEADER = struct.Struct(">QQQQII")  # IndexFile's header, written as the C module does


def _as_ll(value: Any) -> int:
    """A number as the C module reads it (PyLong_AsLongLong)."""
    x = operator.index(value)
    if not -(2**63) <= x <= _I64_MAX:
        raise OverflowError("Python int too large to convert to C long long")
    return x


def _odd_text(value: Any) -> bool:
    """A hint's tags, keys or UNIQ_KEY that leaves its record to the Python loop: neither None
    nor a str, or holding a property separator (the record says something else)."""
    if value is None:
        return False
    return not isinstance(value, str) or "\x01" in value or "\x02" in value


def _last_file(owner: Any) -> Any:
    """The last of ``owner.files`` (a list), or None."""
    files = owner.files
    if not isinstance(files, list):
        raise TypeError("expected a list")
    return files[-1] if files else None


def _queue_slot(
    queues: Any, topic: str, queue_id: Any, phy: int, size: int, queue_offset: int
) -> tuple[Any, Any, int] | None:
    """Where the hinted record's consume-queue entry goes, as ConsumeQueue.put's first case
    (the next entry of the last file, its blocks allocated): (queue, file, position); (None,
    None, 0) when the queue has it already; None when the Python loop must judge it."""
    by_id = queues.get(topic)
    if not isinstance(by_id, dict):
        return None
    cq = by_id.get(queue_id)
    if cq is None:
        return None
    if phy + size <= _as_ll(cq.max_physic_offset):
        return None, None, 0
    mf = _last_file(cq.queue)
    if mf is None:
        return None
    wrote, start = _as_ll(mf.wrote_position), _as_ll(mf.file_from_offset)
    room = min(_as_ll(mf.allocated), _as_ll(mf.file_size))
    if start + wrote != queue_offset * consume_queue.CQ_STORE_UNIT_SIZE or wrote + 20 > room:
        return None
    return cq, mf, wrote


def _index_plan(
    index: Any, topic: str, keys: str | None, uniq: str | None, phy: int, sys_flag: int,
    prefixes: list[Any],
) -> tuple[Any, ...] | None:  # fmt: skip
    """How the hinted record goes into the index, as IndexService.build_index's first case
    (the newest file, room and blocks for its keys): () when it needs nothing (indexed
    already, rolled back, no key), (file, keys, prefix hash, count, slots, begin, begin phy,
    entries at, slot count, index num) to index, None when the Python loop must judge it.
    ``prefixes`` holds the index's prefix-hash cache once read (read once a call)."""
    file = _last_file(index)
    if file is not None:
        end_phy, count, num = (
            _as_ll(file.end_phy_offset), _as_ll(file.index_count), _as_ll(file.index_num)
        )  # fmt: skip
    todo = [uniq] if uniq else []
    if keys:
        todo += [key for key in keys.split(" ") if key]
    if (file is not None and phy < end_phy) or sys_flag & 0xC == 0xC:
        return ()
    if file is None or count >= num or len(todo) > _DISPATCH_MAX_KEYS or (not todo and keys):
        return None  # no file, a full one, very many keys, or KEYS of spaces only
    if not todo:
        return ()
    if not prefixes:
        prefixes.append(index._prefix_hashes)
    if not isinstance(prefixes[0], dict) or (prefix := prefixes[0].get(topic)) is None:
        return None
    prefix = (_as_ll(prefix) + 2**31) % 2**32 - 2**31  # as the C module's int32_t
    if count + len(todo) > num:
        return None
    mf = file.mf
    allocated, file_size = _as_ll(mf.allocated), _as_ll(mf.file_size)
    entries_at, slot_num = _as_ll(file._entries_at), _as_ll(file.hash_slot_num)
    slots, begin = _as_ll(file.hash_slot_count), _as_ll(file.begin_timestamp)
    begin_phy = _as_ll(file.begin_phy_offset)
    _as_ll(file.end_timestamp)
    need = min(entries_at + (count + len(todo)) * index_file.ENTRY_SIZE, file_size)
    if need > allocated or slot_num < 1:
        return None
    return file, todo, prefix, count, slots, begin, begin_phy, entries_at, slot_num, num


def _index_write(
    buf: Any, plan: tuple[Any, ...], phy: int, store_ts: int
) -> tuple[int, int, int, int]:
    """The plan's keys written into the index file's buffer as IndexFile.put_keys (index_put's
    twin), then its header as write_header: (count, slots, begin timestamp, begin phy) after."""
    _, todo, prefix, first, slots, begin, begin_phy, entries_at, slot_num, num = plan
    count, slots, begin, _ = index_file.index_put_py(
        buf, slot_num, num, entries_at, first, slots, begin, prefix, todo, phy, store_ts
    )
    if first <= 1:
        begin_phy = phy
    m64, m32 = 2**64 - 1, 2**32 - 1
    values = (begin & m64, store_ts & m64, begin_phy & m64, phy & m64, slots & m32, count & m32)
    _INDEX_HEADER.pack_into(buf, 0, *values)
    return count, slots, begin, begin_phy


def _judged_hint(hint: Any, offset: int, pos: int, end: int, log: Any) -> tuple[int, ...] | None:
    """The hint's numbers (size, queue id, queue offset, store timestamp, sys flag) when the
    record at ``pos`` is the hinted one, whole below ``end``, and the hint plain; else None."""
    size, queue_id, queue_offset, store_ts, sys_flag = (
        _as_ll(hint[1]), _as_ll(hint[3]), _as_ll(hint[4]), _as_ll(hint[6]), _as_ll(hint[7])
    )  # fmt: skip
    if size < 8 or size > 0x7FFFFFFF or pos + size > end:
        return None
    if _RECORD_HEADER.unpack_from(log, pos) != (size, MESSAGE_MAGIC_CODE):
        return None
    if (
        not isinstance(hint[2], str)
        or _odd_text(hint[5])
        or _odd_text(hint[8])
        or _odd_text(hint[9])
        or not 0 <= queue_id <= 0x7FFFFFFF
        or not 0 <= queue_offset <= _I64_MAX // 20 - 1
        or offset > _I64_MAX - size
    ):
        return None
    return size, queue_id, queue_offset, store_ts, sys_flag


def _writable(obj: Any) -> memoryview:
    """A writable view of ``obj.mm`` (released by the caller)."""
    view = memoryview(obj.mm)
    if view.readonly:
        view.release()
        raise BufferError("Object is not writable.")
    return view


def dispatch_hinted_py(
    hints: Any, log: Any, pos: Any, end: Any, offset: Any, limit: Any, queues: Any,
    listener: Any, index: Any, wanted: Any = None,
) -> tuple[int, int, int, int, BaseException | None]:  # fmt: skip
    """Python twin of ``pymq.store._dispatchc.dispatch_hinted``: the run of hinted records at
    ``log[pos:end]`` (``offset`` the commit-log offset at ``pos``) dispatched to their consume
    queues (``queues``: ConsumeQueueTable.queues) and the index (``index``: the IndexService
    or None), at most ``limit`` of them, as ``_hint_for`` then ``dispatch_fields`` dispatch
    them, each judged whole before anything of it is written.  Stale hints are dropped; the
    run stops, with nothing of that record done, at the first record the Python loop must
    judge: no hint for it, not the hinted record, a separator in a value, its queue missing
    or not taking it as ConsumeQueue.put's first case, the index not taking its keys as
    build_index's first case (see :func:`_queue_slot` and :func:`_index_plan`).  ``listener``
    (or None) hears of each queue entry whose topic is in ``wanted`` (None: every topic),
    after both are written.  Returns (done, pos, offset, the last store timestamp given a
    queue entry or -1, and the exception that stopped the run or None): the records done
    before an exception are counted, not undone."""
    pos = _arg_int(pos, "pos", 0, sys.maxsize)
    end = _arg_int(end, "end", 0, sys.maxsize)
    offset = _arg_int(offset, "offset", 0, _I64_MAX)
    limit = _arg_int(limit, "limit", 0, _I64_MAX)
    if not isinstance(queues, dict):
        raise TypeError("queues must be a dict")
    with memoryview(log) as view:
        end = min(end, view.nbytes)
    done, last_ts = 0, -1
    prefixes: list[Any] = []
    try:
        while done < limit and pos < end and hints:
            hint = hints[0]
            if not isinstance(hint, tuple) or len(hint) != 10:
                break
            phy = _as_ll(hint[0])
            if phy < offset:  # stale: dropped, as _hint_for drops it
                hints.popleft()
                continue
            fields = _judged_hint(hint, offset, pos, end, log) if phy == offset else None
            if fields is None:
                break
            size, _, queue_offset, store_ts, sys_flag = fields
            topic = hint[2]
            slot = (
                (None, None, 0)
                if sys_flag & 0x4  # PREPARED (0x4) or ROLLBACK (0xC): no queue entry
                else _queue_slot(queues, topic, hint[3], phy, size, queue_offset)
            )
            if slot is None:
                break
            plan = (
                ()
                if index is None
                else _index_plan(index, topic, hint[8], hint[9], phy, sys_flag, prefixes)
            )
            if plan is None or not _write_hinted(
                slot, plan, phy, size, store_ts, tags_code(hint[5])
            ):
                break
            if slot[0] is not None:
                last_ts = store_ts
            hints.popleft()
            pos += size
            offset += size
            done += 1
            if slot[0] is not None and listener is not None and (wanted is None or topic in wanted):
                listener(topic, hint[3], queue_offset + 1, tags_code(hint[5]), hint[6])
    except BaseException as exc:  # returned, as the C module returns it
        return done, pos, offset, last_ts, exc
    return done, pos, offset, last_ts, None


def _write_hinted(
    slot: tuple[Any, Any, int], plan: tuple[Any, ...], phy: int, size: int, store_ts: int,
    code: int,
) -> bool:  # fmt: skip
    """The hinted record's queue entry and index keys written (False, nothing written, when a
    file's buffer is smaller than its attributes say: the Python loop judges it)."""
    cq, mf, wrote = slot
    with contextlib.ExitStack() as stack:
        cq_buf = stack.enter_context(_writable(mf)) if cq is not None else None
        ix_buf = stack.enter_context(_writable(plan[0].mf)) if plan else None
        if cq_buf is not None and wrote + 20 > cq_buf.nbytes:
            return False
        if ix_buf is not None:
            slot_num, num, entries_at = plan[8], plan[9], plan[7]
            if not (
                index_file.HEADER_SIZE + slot_num * 4 <= ix_buf.nbytes
                and entries_at + num * index_file.ENTRY_SIZE <= ix_buf.nbytes
            ):
                return False
        if cq_buf is not None:
            consume_queue.ENTRY.pack_into(cq_buf, wrote, phy, size, code)
            mf.wrote_position = wrote + consume_queue.CQ_STORE_UNIT_SIZE
            cq.max_physic_offset = phy + size
        if ix_buf is not None:
            file = plan[0]
            count, slots, begin, begin_phy = _index_write(ix_buf, plan, phy, store_ts)
            file.begin_timestamp, file.index_count, file.hash_slot_count = begin, count, slots
            file.end_phy_offset, file.end_timestamp, file.begin_phy_offset = (
                phy,
                store_ts,
                begin_phy,
            )
    return True


_dispatch_hinted: Callable[..., tuple[int, int, int, int, BaseException | None]] = getattr(
    native_extension, "dispatch_hinted", dispatch_hinted_py
)
"""Runs of hinted records dispatched in one call: the C module's when built, else its twin."""

HINTS_READ_MAX = 1024
"""Hints read back from the records at a time (a slave's, recovery's, or past the put path's
DISPATCH_HINTS_MAX): a bound on the rows held, not on the work."""

_SCHEDULE_TOPIC_B = SCHEDULE_TOPIC.encode()

YIELD_EVERY = 128
"""Records parsed and dispatched between checkpoints (a record without a hint is parsed back
whole), so that each stall of the loop is a few milliseconds while a backlog drains."""

HINTED_PER_PARSED = 16
"""Hinted records dispatched in the budget of one parsed record (a hinted record costs a small
fraction of a parsed one, in C: ``dispatch_hinted``), so a run of YIELD_EVERY parsed records'
budget dispatches 2,048 hinted ones, a few milliseconds.  Dispatch must keep up with the puts
of a run (SERVE_BATCH requests, 1,024 records in batches of 32): at 128 hinted records a turn it
fell behind, its hints overflowed (DISPATCH_HINTS_MAX) and every later record was parsed, which
halved a batch publish within seconds.  The Python loop's hinted records (no C extension) cost
more, a stall of some ten milliseconds a turn at most."""

TURN_BUDGET = YIELD_EVERY * HINTED_PER_PARSED
"""A turn's dispatch, in hinted records (see :meth:`ReputMessageService._dispatch_some`)."""


class ReputMessageService:
    def __init__(
        self, commitlog: CommitLog, table: ConsumeQueueTable, retry_interval: float = 1.0
    ) -> None:
        self.commitlog = commitlog
        self.retry_interval = retry_interval
        self.blocked: str | None = None
        """Why dispatch is stuck at ``reput_from_offset`` (a file it cannot create), or None."""
        self.table = table
        self.reput_from_offset = 0
        self.listener: ArrivalListener | None = None
        self.listener_topics: Callable[[], Container[str] | None] | None = None
        """Asked once a run of records: the topics whose arrivals the listener acts on (None:
        all); see DefaultMessageStore.set_arrival_listener."""
        self._wanted: Container[str] | None = None  # listener_topics' answer for this run
        self._wake = trio.Event()
        self.woken = False
        """True from a wakeup until the task takes it: puts test this before calling wakeup."""
        self._reported_bad: int | None = None
        self._reported_block: str | None = None
        # do_reput yields (index file creation, fairness); callers other than the task (tests,
        # shutdown) must not interleave with it, or records could be dispatched twice at once.
        self._lock = trio.Lock()
        self._owed = 0
        """Records of runs left to the reput task (end_run while it was busy or woken): added
        to its next turn's budget, so that it keeps up with runs bigger than a turn."""
        # (topic, queue id, start) of the consume-queue file the next record needs, made in a
        # worker thread before that record is dispatched (see _dispatch_some).
        self._file_wanted: tuple[str, int, int] | None = None

    def _safe_listener(
        self, topic: str, queue_id: int, offset: int, tags_code: int, store_ts: int
    ) -> None:
        # Only the run's wanted topics (the C dispatch has tested them already, the Python
        # loop has not).
        wanted = self._wanted
        if wanted is not None and topic not in wanted:
            return
        # A failing listener (long polling) must not stop dispatch for every other consumer.
        try:
            self.listener(topic, queue_id, offset, tags_code, store_ts)  # type: ignore[misc]
        except Exception:
            log.exception("message arrival listener failed for %s-%d", topic, queue_id)

    def wakeup(self) -> None:
        self.woken = True
        self._wake.set()

    @property
    def behind_bytes(self) -> int:
        return max(0, self.commitlog.max_offset - self.reput_from_offset)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            if self.blocked is not None:
                await trio.sleep(self.retry_interval)  # puts are refused meanwhile
            else:
                await self._wake.wait()
            self._wake = trio.Event()
            self.woken = False
            await self.do_reput()

    async def do_reput(self) -> None:
        """Dispatch up to the commit log's current end (or until a partial record)."""
        async with self._lock:
            await self._do_reput_locked()

    @contextlib.asynccontextmanager
    async def caught_up(self) -> AsyncIterator[None]:
        """Dispatch everything appended so far and hold dispatch off for the body: what the
        body changes in the consume queues (a topic's deletion) is not undone by records
        dispatched late (a send answered before the reput task reached it)."""
        async with self._lock:
            await self._do_reput_locked()
            yield

    async def _do_reput_locked(self) -> None:
        was_blocked = self.blocked
        self.blocked = None
        try:
            while True:
                if self.table.index is not None and self.table.index.needs_new_file():
                    try:
                        await self.table.index.prepare()
                    except OSError as exc:
                        self._block(exc)
                        return
                # A turn's budget, and the records runs left to this task since its last turn:
                # else runs of more records than a turn (or several connections' runs) outpace
                # it turn after turn while it holds the lock, until the hints overflow.
                owed, self._owed = self._owed, 0
                progressed, more = self._dispatch_some(TURN_BUDGET + owed)
                if self._file_wanted is not None:
                    # A queue's next file (a new queue's first): made in a worker thread.
                    try:
                        await self.table.prepare_file(*self._file_wanted)
                    except OSError as exc:
                        self._block(exc)
                        return
                    continue
                if not more:
                    return
                if progressed:
                    await trio.lowlevel.checkpoint()
        finally:
            if was_blocked is not None and self.blocked is None:
                self._reported_block = None
                log.warning("dispatch resumed at offset %d", self.reput_from_offset)

    def _block(self, exc: OSError) -> None:
        """Dispatch cannot go past ``reput_from_offset`` now: say why (logged once a run)."""
        why = f"dispatch stopped at commit-log offset {self.reput_from_offset}: {exc}"
        if self._reported_block != why:
            self._reported_block = why
            log.error("%s; retrying every %.1f s, puts are refused meanwhile", why,
                      self.retry_interval)  # fmt: skip
        self.blocked = why

    def dispatch_now_or_wake(self, records: int = 0) -> None:
        """Dispatch what is appended now, in the calling task, when nothing else is: not while
        the reput task is in a dispatch (it holds the lock across its yields), not while
        blocked, not when the index needs its next file (created off the loop); then, or
        when more than a turn's budget waits (see _dispatch_some, or ``records`` hinted
        records when more), the reput task is woken to do it."""
        if (
            self.woken
            or self._lock.locked()
            or self.blocked is not None
            or (self.table.index is not None and self.table.index.needs_new_file())
        ):
            # Its records are the reput task's next turn's, on top of that turn's budget
            # (bounded: past DISPATCH_HINTS_MAX records were parsed, not hinted, anyway).
            self._owed = min(self._owed + records, DISPATCH_HINTS_MAX)
            if not self.woken:
                self.wakeup()
            return
        try:
            _progressed, more = self._dispatch_some(max(TURN_BUDGET, records))
        except Exception:  # never the caller's failure: the reput task tries again
            log.exception("dispatch at the end of a run failed; the reput service retries")
            more = True
        if more or self.blocked is not None:
            self.wakeup()

    def _note_file_wanted(
        self, topic: str, queue_id: int, phy_offset: int, size: int, cq_offset: int, flag: int
    ) -> bool:
        start = self.table.file_wanted(topic, queue_id, phy_offset, size, cq_offset, flag)
        if start is None:
            return False
        self._file_wanted = (topic, queue_id, start)
        return True

    def dispatch_all_now(self) -> None:
        """Synchronously dispatch everything (recovery thread and shutdown)."""
        while True:
            _progressed, more = self._dispatch_some(1 << 30, create_files=True)
            if not more:
                return

    def _file_to_dispatch(self) -> MappedFile | None:
        """The commit-log file holding ``reput_from_offset`` (moved up to the log's first
        offset if it fell behind it), or None when nothing is there to dispatch."""
        cl = self.commitlog
        if self.reput_from_offset < cl.min_offset:
            self.reput_from_offset = cl.min_offset
        if self.reput_from_offset >= cl.max_offset:
            return None
        return cl.queue.find_by_offset(self.reput_from_offset)

    def _stop_at_unreadable(
        self, exc: BlankRecord | RecordError, view: memoryview, pos: int, end: int,
        progressed: bool,
    ) -> tuple[bool, bool]:  # fmt: skip
        """:meth:`_dispatch_some`'s answer at a record it cannot parse: the blank end of a file
        (go on in the next file), a record cut short (wait for the rest), or a bad one (stop
        there, logged once per offset)."""
        if isinstance(exc, BlankRecord):
            self.reput_from_offset = self.commitlog.roll_next_file(self.reput_from_offset)
            return True, True
        if pos + 8 > end or pos + read_record_header(view, pos)[0] > end:
            return progressed, False  # a partial record: wait for the rest
        if self._reported_bad != self.reput_from_offset:
            self._reported_bad = self.reput_from_offset
            log.error("reput stopped at %d: %s", self.reput_from_offset, str(exc))
        return progressed, False

    @staticmethod
    def _hint_for(
        hints: collections.deque[DispatchHint], offset: int, view: memoryview, pos: int, end: int
    ) -> DispatchHint | None:
        """The put path's hint for the record at ``offset``, if it has one and the record there
        is whole and has the hinted size and a message magic; stale hints are dropped."""
        while hints and hints[0].physical_offset < offset:
            hints.popleft()
        if not hints or hints[0].physical_offset != offset:
            return None
        hint = hints.popleft()
        # One unpacking in DispatchHint's field order (see _dispatch_some).
        _, size, _, _, _, tags, _, _, keys, uniq_key = hint
        if pos + size > end or pos + 8 > end:
            hints.appendleft(hint)  # not all written yet: the next pass
            return None
        total, magic = _RECORD_HEADER.unpack_from(view, pos)  # pos + 8 <= end: checked above
        if total != size or magic != MESSAGE_MAGIC_CODE:
            hints.clear()  # the log is not what the hints describe: parse from here on
            return None
        # A separator in a value: the record says something else than the dict did: parse it.
        if (
            (tags and ("\x01" in tags or "\x02" in tags))
            or (keys and ("\x01" in keys or "\x02" in keys))
            or (uniq_key and ("\x01" in uniq_key or "\x02" in uniq_key))
        ):
            return None
        return hint

    def _dispatch_native(
        self,
        hints: collections.deque[DispatchHint],
        view: memoryview,
        pos: int,
        end: int,
        limit: int,
        listener: ArrivalListener | None,
        wanted: Container[str] | None,
    ) -> tuple[int, int]:
        """The common records of a run of hints dispatched in one call of dispatch_hinted (C, or
        its twin), exactly as ``_hint_for`` then ``dispatch_fields`` dispatch them
        (tests/store/test_dispatch_hinted_diff.py compares the files); it stops, with nothing of
        that record done, at the first one those must judge.  Returns (records dispatched,
        position after them).  An exception that stopped the run is raised after the records
        done before it are counted, as the loop counts them."""
        table = self.table
        n, pos, self.reput_from_offset, last_ts, exc = _dispatch_hinted(
            hints, view, pos, end, self.reput_from_offset, limit, table.queues, listener,
            table.index, wanted,
        )  # fmt: skip
        if last_ts >= 0:
            table.logics_msg_timestamp = last_ts
        if exc is not None:
            try:
                raise exc
            finally:
                del exc
        return n, pos

    @staticmethod
    def _read_hints(
        hints: collections.deque[DispatchHint],
        view: memoryview,
        pos: int,
        end: int,
        file_from: int,
        budget: int,
    ) -> None:
        """Put before ``hints`` the hints of the records from ``pos`` on (up to the first hint's
        record, or ``end``), read back from the records; at most HINTS_READ_MAX of them, and
        none past the first record the Python loop must judge."""
        if hints:
            end = min(end, hints[0].physical_offset - file_from)
        rows, _ = _record_hints(
            view, pos, end, file_from, min(budget, HINTS_READ_MAX), _SCHEDULE_TOPIC_B,
            DispatchHint,
        )  # fmt: skip
        if rows:
            hints.extendleft(reversed(rows))

    def _dispatch_some(self, budget: int, *, create_files: bool = False) -> tuple[bool, bool]:
        """Dispatch at most ``budget`` hinted records, a record parsed without a hint counting
        as HINTED_PER_PARSED of them: (made progress, may be more to do).

        Unless ``create_files`` (recovery's and shutdown's dispatch, in a thread or past
        serving), it stops before a record whose consume queue lacks the file its entry goes
        to, and names it in ``_file_wanted`` (made off the loop: see _do_reput_locked)."""
        self._file_wanted = None
        cl = self.commitlog
        if cl.min_offset <= self.reput_from_offset < cl.max_offset:
            mf = cl.queue.find_by_offset(self.reput_from_offset)
        else:  # behind the log's first offset, or nothing to do: see _file_to_dispatch
            mf = self._file_to_dispatch()
        if mf is None:
            return False, False
        pos = self.reput_from_offset - mf.file_from_offset
        end = mf.wrote_position
        view = memoryview(mf.mm)[:end]
        dispatch = self.table.dispatch
        dispatch_fields = self.table.dispatch_fields
        listener = self._safe_listener if self.listener is not None else None
        wanted = self._wanted = (
            self.listener_topics()
            if listener is not None and self.listener_topics is not None
            else None
        )
        hints = cl.dispatch_hints
        done = 0
        try:
            while pos < end and done < budget:
                if not hints or hints[0].physical_offset > self.reput_from_offset:
                    # Records without hints (a slave's, recovery's, or past the put path's
                    # DISPATCH_HINTS_MAX): their hints read back, for dispatch_hinted, where
                    # the loop below would parse each record.
                    self._read_hints(hints, view, pos, end, mf.file_from_offset, budget - done)
                if hints:
                    n, pos = self._dispatch_native(
                        hints, view, pos, end, budget - done, listener, wanted
                    )
                    done += n
                    if n and (pos >= end or done >= budget or not hints):
                        continue
                    # The record dispatch_hinted leaves (a file to create or roll, blocks to
                    # allocate, a separator in a value...): its hint, else parsed.
                    hint = self._hint_for(hints, self.reput_from_offset, view, pos, end)
                    if hint is not None:
                        # One unpacking in DispatchHint's field order: cheaper than a read per
                        # attribute on this loop (the test of the hint's field order guards it).
                        (
                            physical_offset, size, topic, queue_id, queue_offset, tags,
                            store_timestamp, sys_flag, keys, uniq_key,
                        ) = hint  # fmt: skip
                        if not create_files and self._note_file_wanted(
                            topic, queue_id, physical_offset, size, queue_offset, sys_flag
                        ):
                            hints.appendleft(hint)  # this record's, once its file is made
                            return done > 0, True
                        try:
                            dispatch_fields(
                                topic, queue_id, physical_offset, size, tags_code(tags),
                                queue_offset, store_timestamp, sys_flag, keys or None,
                                uniq_key or None, listener,
                            )  # fmt: skip
                        except OSError as exc:  # a file that cannot be created: retry later
                            self._block(exc)
                            return done > 0, False
                        pos += size
                        self.reput_from_offset += size
                        done += 1
                        continue
                try:
                    info = read_record_info(view, pos, check_crc=False)
                except (BlankRecord, RecordError) as exc:
                    return self._stop_at_unreadable(exc, view, pos, end, done > 0)
                if not create_files and self._note_file_wanted(
                    info.topic, info.queue_id, info.physical_offset, info.size,
                    info.queue_offset, info.sys_flag,
                ):  # fmt: skip
                    return done > 0, True
                try:
                    dispatch(info, listener)
                except OSError as exc:  # a file that cannot be created: retry later
                    self._block(exc)
                    return done > 0, False
                pos += info.size
                self.reput_from_offset += info.size
                done += HINTED_PER_PARSED
        finally:
            view.release()
        at_file_end = pos >= mf.file_size  # (True, True): the next file is the next turn's
        return done > 0 or at_file_end, at_file_end or self.reput_from_offset < cl.max_offset
