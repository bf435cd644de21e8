"""``IndexFile``: one on-disk hash index from message keys to commit-log offsets.

Layout (big-endian), as RocketMQ 4.x writes ``index/{yyyyMMddHHmmssSSS}``:

* header, 40 bytes: beginTimestamp i8 | endTimestamp i8 | beginPhyOffset i8 | endPhyOffset i8 |
  hashSlotCount i4 | indexCount i4 (starts at 1: index number 0 means "none");
* ``hash_slot_num`` slots of i4, each the number of the newest entry whose key hashes there;
* ``index_num`` entries of 20 bytes: keyHash i4 | phyOffset i8 | timeDiff i4 (seconds since
  beginTimestamp) | prevIndex i4 (the previous entry of the same slot: a chain).

The file owns its ``MappedFile``.  Puts and queries are memory operations on the loop; creation,
sync and deletion are blocking.  Disk blocks (see :mod:`pymq.store.mapped_file`): the header and
the slot table, written anywhere, get theirs when the file is created (20 MB at the default
5,000,000 slots); the entries, written front to back, get theirs a chunk at a time before a put
writes into them, so a put on a full disk raises ``OSError`` with nothing written.
"""

from __future__ import annotations

import operator
import struct
import sys
from collections.abc import Callable
from typing import Any

from pymq.common.message_ext import java_string_hash, java_string_hash_after
from pymq.common.native import load_native
from pymq.store import mapped_file
from pymq.store.mapped_file import MappedFile

HEADER = struct.Struct(">qqqqii")
HEADER_SIZE = HEADER.size  # 40
SLOT = struct.Struct(">i")
SLOT_SIZE = 4
ENTRY = struct.Struct(">iqii")
ENTRY_SIZE = ENTRY.size  # 20
INVALID_INDEX = 0
_MAX_INT = 0x7FFFFFFF


def index_file_size(hash_slot_num: int, index_num: int) -> int:
    return HEADER_SIZE + hash_slot_num * SLOT_SIZE + index_num * ENTRY_SIZE


def key_hash(key: str) -> int:
    """Java's ``indexKeyHashMethod``: ``abs(hashCode)``, 0 for ``Integer.MIN_VALUE``."""
    return positive_hash(java_string_hash(key))


def positive_hash(h: int) -> int:
    return 0 if h == -(2**31) else abs(h)


def _arg_int(value: Any, name: str, lo: int, hi: int) -> int:
    x = operator.index(value)
    if not lo <= x <= hi:
        raise OverflowError(f"{name} = {x} does not fit its record field")
    return x


def index_put_py(
    buf: Any,
    slot_num: Any,
    index_num: Any,
    entries_at: Any,
    count: Any,
    slot_count: Any,
    begin_timestamp: Any,
    prefix_hash: Any,
    keys: Any,
    phy_offset: Any,
    store_timestamp: Any,
) -> tuple[int, int, int, int]:
    """Python twin of ``pymq.store._dispatchc.index_put``: index each of ``keys`` (hashed as
    prefix + key from the prefix's Java hash) into the index file laid out in ``buf`` (its
    slot_num slots, entries from entries_at, count entries so far, room for index_num), each
    entry chained into its slot as Java's IndexFile.putKey writes it; stops when the file is
    full.  Returns (count, slot_count, begin_timestamp, keys done), the header fields after."""
    slot_num = _arg_int(slot_num, "slot_num", 1, _MAX_INT)
    index_num = _arg_int(index_num, "index_num", 0, _MAX_INT)
    entries_at = _arg_int(entries_at, "entries_at", 0, sys.maxsize)
    count = _arg_int(count, "count", 0, _MAX_INT)
    slot_count = _arg_int(slot_count, "slot_count", -_MAX_INT - 1, _MAX_INT)
    begin = _arg_int(begin_timestamp, "begin_timestamp", -(2**63), 2**63 - 1)
    prefix = _arg_int(prefix_hash, "prefix_hash", -_MAX_INT - 1, 0xFFFFFFFF) & 0xFFFFFFFF
    phy = _arg_int(phy_offset, "phy_offset", -(2**63), 2**63 - 1)
    store_ts = _arg_int(store_timestamp, "store_timestamp", -(2**63), 2**63 - 1)
    keys = list(keys)
    with memoryview(buf) as view:  # let go at once: a map with a view left cannot close
        readonly, size = view.readonly, view.nbytes
    if readonly:
        raise BufferError("Object is not writable.")
    if HEADER_SIZE + slot_num * SLOT_SIZE > size or entries_at + index_num * ENTRY_SIZE > size:
        raise ValueError("index layout does not fit the buffer")
    done = 0
    for key in keys:
        if count >= index_num:
            break
        if not isinstance(key, str):
            raise TypeError("java_hash needs a str")
        h = positive_hash(java_string_hash_after(prefix, key))
        abs_slot = HEADER_SIZE + (h % slot_num) * SLOT_SIZE
        slot_value = SLOT.unpack_from(buf, abs_slot)[0]
        if slot_value <= INVALID_INDEX or slot_value > count:
            slot_value = INVALID_INDEX
            slot_count += 1
        diff = 0 if begin <= 0 else min(_MAX_INT, max(0, (store_ts - begin) // 1000))
        ENTRY.pack_into(buf, entries_at + count * ENTRY_SIZE, h, phy, diff, slot_value)
        SLOT.pack_into(buf, abs_slot, count)
        if count <= 1:
            begin = store_ts
        count += 1
        done += 1
    return count, slot_count, begin, done


_index_put: Callable[..., tuple[int, int, int, int]] = getattr(
    load_native("pymq.store._dispatchc"), "index_put", index_put_py
)
"""Index_put of the C module when built, else its twin."""


class IndexFile:
    """One index file; ``put_key`` returns False once the file is full."""

    def __init__(self, path: str, hash_slot_num: int, index_num: int) -> None:
        """Blocking: open or create ``path`` and read its header."""
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        entries_at = HEADER_SIZE + hash_slot_num * SLOT_SIZE
        self.mf = MappedFile.create(
            path,
            index_file_size(hash_slot_num, index_num),
            allocate=entries_at + mapped_file.ALLOCATE_CHUNK,
        )
        self.path = path
        (
            self.begin_timestamp,
            self.end_timestamp,
            self.begin_phy_offset,
            self.end_phy_offset,
            self.hash_slot_count,
            self.index_count,
        ) = HEADER.unpack_from(self.mf.mm, 0)
        if self.index_count <= 0:
            self.index_count = 1
        self.mf.wrote_position = self.mf.file_size
        self._entries_at = entries_at

    @property
    def is_full(self) -> bool:
        return self.index_count >= self.index_num

    @property
    def data_end(self) -> int:
        """File position just past the last entry: everything written lies below it."""
        return self._entries_at + self.index_count * ENTRY_SIZE

    def ensure_allocated(self) -> None:
        """Blocking (load): the blocks of the header, the slot table and the entries so far
        (plus the next chunk), for a file found on disk (sparse if Java or an older pymq wrote
        it).  On a full disk a warning; puts allocate then (see MappedFile.ensure_allocated)."""
        self.mf.ensure_allocated(self.data_end)

    def _allocate_for(self, count: int) -> None:
        """Blocks for ``count`` more entries (and the slot table) before a put writes them;
        raises ``OSError`` with nothing written."""
        mf = self.mf
        need = min(mf.file_size, self._entries_at + (self.index_count + count) * ENTRY_SIZE)
        if need > mf.allocated:
            mf.allocate_to(need)

    def write_header(self) -> None:
        if self.mf.allocated < HEADER_SIZE:  # a file found on disk and never put into
            self.mf.allocate_to(HEADER_SIZE)
        HEADER.pack_into(
            self.mf.mm,
            0,
            self.begin_timestamp,
            self.end_timestamp,
            self.begin_phy_offset,
            self.end_phy_offset,
            self.hash_slot_count,
            self.index_count,
        )

    def put_keys(
        self, prefix_hash: int, keys: list[str], phy_offset: int, store_timestamp: int
    ) -> int:
        """Index each of ``keys`` (hashed as prefix + key from the prefix's Java hash) for one
        record, without rewriting the header; returns how many fitted (all unless the file
        filled up), through :func:`index_put_py` or its C twin.  Raises ``OSError`` (nothing
        written) when the entries' blocks cannot be allocated."""
        self._allocate_for(len(keys))
        first = self.index_count
        count, slots, begin, done = _index_put(
            self.mf.mm, self.hash_slot_num, self.index_num, self._entries_at, first,
            self.hash_slot_count, self.begin_timestamp, prefix_hash, keys, phy_offset,
            store_timestamp,
        )  # fmt: skip
        if done:
            if first <= 1:
                self.begin_phy_offset = phy_offset
            self.begin_timestamp = begin
            self.index_count = count
            self.hash_slot_count = slots
            self.end_phy_offset = phy_offset
            self.end_timestamp = store_timestamp
        return done

    def is_time_matched(self, begin: int, end: int) -> bool:
        return (
            (begin < self.begin_timestamp and end > self.end_timestamp)
            or self.begin_timestamp <= begin <= self.end_timestamp
            or self.begin_timestamp <= end <= self.end_timestamp
        )

    def select_phy_offsets(
        self, out: list[int], key: str, max_num: int, begin: int, end: int
    ) -> None:
        """Append to ``out`` the offsets of entries for ``key`` stored within [begin, end]."""
        mm = self.mf.mm
        h = key_hash(key)
        abs_slot = HEADER_SIZE + (h % self.hash_slot_num) * SLOT_SIZE
        slot_value = SLOT.unpack_from(mm, abs_slot)[0]
        if slot_value <= INVALID_INDEX or slot_value > self.index_count or self.index_count <= 1:
            return
        base = HEADER_SIZE + self.hash_slot_num * SLOT_SIZE
        current = slot_value
        while len(out) < max_num:
            h_read, phy, time_diff, prev = ENTRY.unpack_from(mm, base + current * ENTRY_SIZE)
            if time_diff < 0:
                break
            time_read = self.begin_timestamp + time_diff * 1000
            if h_read == h and begin <= time_read <= end:
                out.append(phy)
            if (
                prev <= INVALID_INDEX
                or prev > self.index_count
                or prev == current
                or time_read < begin
            ):
                break
            current = prev

    def sync(self) -> None:
        """Blocking."""
        self.write_header()
        self.mf.sync()

    def close(self) -> None:
        self.mf.close()

    def destroy(self) -> None:
        """Blocking."""
        self.mf.destroy()
