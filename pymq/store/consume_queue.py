"""``ConsumeQueue``: the per-(topic, queueId) index of a topic's messages in the commit log.

Files live at ``consumequeue/{topic}/{queueId}/{20-digit start}`` and hold 20-byte entries
(commit-log offset int64, record size int32, tags code int64, big-endian); entry *i* is logical
queue offset *i* at global byte position ``i * 20``.  The queue owns its ``MappedFileQueue``.
Entries are appended by the reput service on the loop; recovery and truncation are blocking and
run before the store serves anything (or in a worker thread).
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
from collections.abc import Callable

from pymq.store import mapped_file
from pymq.store.mapped_file import MappedFile
from pymq.store.mapped_file_queue import MappedFileQueue

log = logging.getLogger(__name__)

CQ_STORE_UNIT_SIZE = 20
ENTRY = struct.Struct(">qiq")
# A filler entry (Java's fillPreBlank): a queue that starts above offset 0 has its first file
# padded with these up to the first real entry.  Size MAX_INT makes recovery treat it as valid.
_BLANK_SIZE = 0x7FFFFFFF
_BLANK_ENTRY = ENTRY.pack(0, _BLANK_SIZE, 0)
RECOVER_FROM_LAST_FILES = 3
"""Recovery rescans the last three files, as RocketMQ does; older ones are trusted."""


_NON_NEGATIVE = bytes(0 if b & 0x80 else 1 for b in range(256))
_NON_ZERO = bytes(1 if b else 0 for b in range(256))


def valid_entries(buf: bytes | mmap.mmap, capacity: int) -> int:
    """How many leading entries are valid (offset >= 0 and size > 0), checked in bulk.

    A per-entry Python loop would make recovery of a full 300,000-entry file take most of a
    second.  Instead the sign bytes and the size bytes of all entries are picked
    out with strided slices, mapped to 0/1 with ``bytes.translate`` and combined as big ints, so
    the first invalid entry is one ``find`` away.
    """
    if capacity <= 0:
        return 0
    view = memoryview(buf)
    try:
        area = view[: capacity * CQ_STORE_UNIT_SIZE]
        offset_ok = int.from_bytes(area[0::CQ_STORE_UNIT_SIZE].tobytes().translate(_NON_NEGATIVE))
        size_sign_ok = int.from_bytes(
            area[8::CQ_STORE_UNIT_SIZE].tobytes().translate(_NON_NEGATIVE)
        )
        size_nonzero = 0
        for k in range(8, 12):
            size_nonzero |= int.from_bytes(area[k::CQ_STORE_UNIT_SIZE].tobytes())
        size_nonzero_bytes = size_nonzero.to_bytes(capacity).translate(_NON_ZERO)
        ok = offset_ok & size_sign_ok & int.from_bytes(size_nonzero_bytes)
        first_bad = ok.to_bytes(capacity).find(b"\0")
        del area
    finally:
        view.release()
    return capacity if first_bad < 0 else first_bad


_ZERO_ENTRY = bytes(CQ_STORE_UNIT_SIZE)


def _entries_before_zero_tail(mf: MappedFile) -> int:
    """Entries before the file's all-zero tail: where scanning can stop.

    Files are written front to back, so the written entries are followed by zeros; a binary
    search finds the boundary and a memcmp of the rest confirms it (a file with stale bytes
    after its end, as Java may leave, is scanned whole instead).
    """
    capacity = mf.file_size // CQ_STORE_UNIT_SIZE
    mm = mf.mm
    lo, hi = 0, capacity
    while lo < hi:
        mid = (lo + hi) // 2
        at = mid * CQ_STORE_UNIT_SIZE
        if mm[at : at + CQ_STORE_UNIT_SIZE] == _ZERO_ENTRY:
            hi = mid
        else:
            lo = mid + 1
    rest = mm[lo * CQ_STORE_UNIT_SIZE : capacity * CQ_STORE_UNIT_SIZE]
    return lo if rest == bytes(len(rest)) else capacity


class ConsumeQueue:
    """One logical queue.  Offsets in the public API are logical (entry numbers)."""

    def __init__(self, topic: str, queue_id: int, root_dir: str, file_size: int) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.file_size = file_size - file_size % CQ_STORE_UNIT_SIZE
        self.queue = MappedFileQueue(
            os.path.join(root_dir, topic, str(queue_id)),
            self.file_size,
            lazy_directory_sync=True,
            chunk=mapped_file.CQ_ALLOCATE_CHUNK,
        )
        # Commit-log offset just past the newest entry's record; -1 when empty.
        self.max_physic_offset = -1
        # Byte position of the first valid entry (moved up as the commit log is cleaned).
        self.min_logic_offset = 0

    # --- load and recovery (blocking) ----------------------------------------------------------

    def load(self) -> None:
        self.queue.load()

    def recover(self) -> None:
        """Blocking: find the end of the valid entries and drop the dirty tail."""
        files = self.queue.files
        if not files:
            return
        start = max(0, len(files) - RECOVER_FROM_LAST_FILES)
        end_offset = files[start].file_from_offset
        for mf in files[start:]:
            count = valid_entries(mf.mm, _entries_before_zero_tail(mf))
            valid_to = count * CQ_STORE_UNIT_SIZE
            if count:
                self._reload_max_physic_offset_in(mf, valid_to)
            end_offset = mf.file_from_offset + valid_to
            if valid_to < mf.file_size:
                break
        self.queue.flushed_where = end_offset
        self.queue.truncate_dirty_files(end_offset)
        self.min_logic_offset = self.queue.min_offset

    def truncate_dirty(self, phy_offset: int) -> None:
        """Blocking: drop entries for records at or beyond ``phy_offset`` (the commit log's end).

        Entries are in commit-log order (fillers, offset 0, only lead the first file), so the
        cut is found by binary search in each file, newest first.
        """
        cut: int | None = None
        for mf in reversed(self.queue.files):
            lo, hi = 0, mf.wrote_position // CQ_STORE_UNIT_SIZE
            while lo < hi:
                mid = (lo + hi) // 2
                offset, size, _ = ENTRY.unpack_from(mf.mm, mid * CQ_STORE_UNIT_SIZE)
                if size != _BLANK_SIZE and offset >= phy_offset:
                    hi = mid
                else:
                    lo = mid + 1
            if lo * CQ_STORE_UNIT_SIZE >= mf.wrote_position:
                break  # nothing to cut here; newer files were handled
            cut = mf.file_from_offset + lo * CQ_STORE_UNIT_SIZE
            if lo > 0:
                break
        if cut is None:
            return
        self.queue.truncate_dirty_files(cut)
        self._reload_max_physic_offset()
        self.min_logic_offset = min(self.min_logic_offset, self.queue.max_offset)

    def _reload_max_physic_offset(self) -> None:
        self.max_physic_offset = -1
        for mf in reversed(self.queue.files):
            if self._reload_max_physic_offset_in(mf, mf.wrote_position):
                return

    def _reload_max_physic_offset_in(self, mf: MappedFile, end: int) -> bool:
        pos = end - CQ_STORE_UNIT_SIZE
        while pos >= 0:
            offset, size, _ = ENTRY.unpack_from(mf.mm, pos)
            if size != _BLANK_SIZE:
                self.max_physic_offset = offset + size
                return True
            pos -= CQ_STORE_UNIT_SIZE
        return False

    def correct_min_offset(self, min_phy_offset: int) -> None:
        """Move the queue's min offset to its first entry still inside the commit log."""
        mf = self.queue.first_file
        if mf is None:
            return
        pos = max(0, self.min_logic_offset - mf.file_from_offset)
        while pos < mf.wrote_position:
            offset, size, _ = ENTRY.unpack_from(mf.mm, pos)
            if size != _BLANK_SIZE and offset >= min_phy_offset:
                self.min_logic_offset = mf.file_from_offset + pos
                return
            pos += CQ_STORE_UNIT_SIZE
        self.min_logic_offset = mf.file_from_offset + mf.wrote_position

    # --- offsets -------------------------------------------------------------------------------

    @property
    def max_offset_in_queue(self) -> int:
        return self.queue.max_offset // CQ_STORE_UNIT_SIZE

    @property
    def min_offset_in_queue(self) -> int:
        return self.min_logic_offset // CQ_STORE_UNIT_SIZE

    # --- dispatch ------------------------------------------------------------------------------

    def needs(self, phy_offset: int, size: int) -> bool:
        """False when the record is already indexed here (re-dispatch after recovery)."""
        return phy_offset + size > self.max_physic_offset

    def file_wanted(self, phy_offset: int, size: int, cq_offset: int) -> int | None:
        """Where the file the entry at ``cq_offset`` needs starts, when the queue lacks it (its
        first file, or the next past a full one), else None: the reput service creates it in
        a worker thread (:meth:`ConsumeQueueTable.prepare_file`) before it dispatches the
        entry, so that a new queue's first entry does not create a file on the event loop."""
        if not self.needs(phy_offset, size):
            return None
        expect = cq_offset * CQ_STORE_UNIT_SIZE
        start = self.queue.next_file_start(expect)
        return start if start is not None and expect >= start else None

    def put(self, phy_offset: int, size: int, tags_code: int, cq_offset: int) -> bool:
        """Append the entry for logical offset ``cq_offset``; a duplicate is skipped.

        Raises :class:`~pymq.store.mapped_file_queue.CreateFileError` (nothing changed) when the
        file cannot be created, or ``OSError`` when its next chunk of blocks cannot be
        allocated (see MappedFile): the reput service stops at this record and tries it again
        later, so no entry is ever skipped.
        """
        if phy_offset + size <= self.max_physic_offset:
            return True
        expect = cq_offset * CQ_STORE_UNIT_SIZE
        files = self.queue.files
        if files:
            # The common case first: the next entry of the last file, its blocks allocated.
            mf = files[-1]
            pos = mf.wrote_position
            if mf.file_from_offset + pos == expect and pos + CQ_STORE_UNIT_SIZE <= min(
                mf.allocated, mf.file_size
            ):
                ENTRY.pack_into(mf.mm, pos, phy_offset, size, tags_code)
                mf.wrote_position = pos + CQ_STORE_UNIT_SIZE
                self.max_physic_offset = phy_offset + size
                return True
        mf = self.queue.get_last_mapped_file(expect)
        if mf.wrote_position == 0 and self.queue.files[0] is mf and expect > mf.file_from_offset:
            # A queue whose first entry is not at offset 0 (e.g. after its files were deleted).
            # Blocks for the fillers and the entry first: a failure then leaves no filler.
            mf.allocate_to(expect - mf.file_from_offset + CQ_STORE_UNIT_SIZE)
            while mf.file_from_offset + mf.wrote_position < expect:
                mf.append(_BLANK_ENTRY)
            self.min_logic_offset = expect
            self.queue.flushed_where = mf.file_from_offset
        current = mf.file_from_offset + mf.wrote_position
        if expect < current:
            return True
        if expect > current:
            log.error(
                "consume queue %s-%d order is wrong: expected position %d, writing at %d",
                self.topic,
                self.queue_id,
                expect,
                current,
            )
        mf.append(ENTRY.pack(phy_offset, size, tags_code))
        self.max_physic_offset = phy_offset + size
        return True

    # --- reads ---------------------------------------------------------------------------------

    def get_entry(self, index: int) -> tuple[int, int, int] | None:
        """(commit-log offset, size, tags code) of logical offset ``index``, or None."""
        pos = index * CQ_STORE_UNIT_SIZE
        if pos < self.min_logic_offset:
            return None
        mf = self.queue.find_by_offset(pos)
        if mf is None:
            return None
        rel = pos - mf.file_from_offset
        if rel + CQ_STORE_UNIT_SIZE > mf.wrote_position:
            return None
        return ENTRY.unpack_from(mf.mm, rel)

    def entries_from(self, index: int, limit: int | None = None) -> bytes | None:
        """The raw entries from logical ``index`` to the end of its file's written part (at
        most ``limit`` of them), or None.

        Never more than one file, like Java's ``getIndexBuffer``: the caller continues from the
        next begin offset on its next call.
        """
        pos = index * CQ_STORE_UNIT_SIZE
        if pos < self.min_logic_offset:
            return None
        mf = self.queue.find_by_offset(pos)
        if mf is None:
            return None
        rel = pos - mf.file_from_offset
        if limit is None:
            return mf.read_from(rel)
        count = min(limit, (mf.wrote_position - rel) // CQ_STORE_UNIT_SIZE)
        return mf.read(rel, max(0, count) * CQ_STORE_UNIT_SIZE)

    def roll_next_file(self, index: int) -> int:
        """The first logical offset of the file after the one holding ``index``."""
        per_file = self.file_size // CQ_STORE_UNIT_SIZE
        return index + per_file - index % per_file

    def offset_by_time(
        self, timestamp: int, store_time_of: Callable[[int, int], int], min_phy_offset: int
    ) -> int:
        """The first logical offset whose message was stored at or after ``timestamp``.

        Binary search over the queue; entries whose records were already cleaned count as older.
        Returns the max offset when every message is older (Java picks the nearest message
        instead; the lower bound is what CONSUME_FROM_TIMESTAMP wants and what 5.x does).
        """
        lo, hi = self.min_offset_in_queue, self.max_offset_in_queue
        while lo < hi:
            mid = (lo + hi) // 2
            entry = self.get_entry(mid)
            if entry is None:
                lo = mid + 1
                continue
            phy, size, _ = entry
            stamp = store_time_of(phy, size) if phy >= min_phy_offset else -1
            if stamp < timestamp:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # --- cleaning ------------------------------------------------------------------------------

    def expired_files(self, min_phy_offset: int) -> list:
        """Files (never the last) whose every entry points below the commit log's min offset."""
        out = []
        for mf in self.queue.files[:-1]:
            if mf.wrote_position < CQ_STORE_UNIT_SIZE:
                break
            last_offset, _, _ = ENTRY.unpack_from(mf.mm, mf.wrote_position - CQ_STORE_UNIT_SIZE)
            if last_offset < min_phy_offset:
                out.append(mf)
            else:
                break
        return out

    def destroy(self) -> None:
        """Blocking: delete all files of this queue."""
        self.queue.destroy_all()
        self.max_physic_offset = -1
        self.min_logic_offset = 0
