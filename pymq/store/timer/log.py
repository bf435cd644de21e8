"""The timer log: append-only fixed-size entries in fixed-size files under ``timerlog/``.

Each entry is one timer in one wheel slot, chained to the slot's previous entry (a linked list
per slot, newest first, as RocketMQ's timerlog).  Layout of an entry, big-endian, 48 bytes::

    0  u32 magic      ENTRY_MAGIC
    4  u32 crc32      of bytes 8..48
    8  i64 prev_pos   the slot's previous entry (-1: none)
   16  i64 slot_ms    the wheel slot (epoch ms, a multiple of the precision) it was entered in
   24  i64 deliver_ms when the message is due
   32  i64 phy_offset the timer-topic message in the commit log
   40  i32 phy_size
   44  i32 roll_times how often it was re-entered (due beyond the wheel's window)

A file holds ``file_size // 48`` entries (``mappedFileSizeTimerLog`` rounded down) and is named
by the global position of its first byte (20 digits), as commit-log files are.  Positions are
global byte offsets.  Reads and writes are ``pread``/``pwrite``: memory does not grow with the
number of entries.  Appends are written behind, :data:`WRITE_BEHIND_BYTES` at a time (one
``pwrite`` for many entries), and whenever :meth:`TimerLog.write_pending` is called (the timer
store calls it before it takes a checkpoint, so a checkpoint never names an entry not written;
entries lost with the process after it are entered again from the timer topic); reads see
them before.  :meth:`TimerLog.recover` finds the end of the valid entries (magic and CRC)
from a known-good position and cuts a torn tail.
"""

from __future__ import annotations

import os
import struct
import zlib

import attrs

ENTRY_SIZE = 48
ENTRY_MAGIC = 0x7E1A3E11
_BODY = struct.Struct(">qqqqii")
_HEAD = struct.Struct(">II")
WRITE_BEHIND_BYTES = 1024 * ENTRY_SIZE
"""Appended entries kept before they are written (48 KiB)."""


@attrs.frozen
class TimerEntry:
    prev_pos: int
    slot_ms: int
    deliver_ms: int
    phy_offset: int
    phy_size: int
    roll_times: int = 0

    def encode(self) -> bytes:
        body = _BODY.pack(
            self.prev_pos,
            self.slot_ms,
            self.deliver_ms,
            self.phy_offset,
            self.phy_size,
            self.roll_times,
        )
        return _HEAD.pack(ENTRY_MAGIC, zlib.crc32(body)) + body

    @classmethod
    def decode(cls, data: bytes) -> TimerEntry | None:
        """The entry in ``data`` (ENTRY_SIZE bytes), or None when it is not a whole one."""
        if len(data) != ENTRY_SIZE:
            return None
        magic, crc = _HEAD.unpack_from(data)
        body = data[_HEAD.size :]
        if magic != ENTRY_MAGIC or zlib.crc32(body) != crc:
            return None
        return cls(*_BODY.unpack(body))


class TimerLog:
    """Fixed-size files of :class:`TimerEntry`; ``end`` is the position of the next append."""

    def __init__(self, directory: str, file_size: int) -> None:
        if file_size < ENTRY_SIZE:
            raise ValueError(f"mappedFileSizeTimerLog {file_size} is below one entry")
        self.directory = directory
        self.file_size = file_size - file_size % ENTRY_SIZE
        os.makedirs(directory, exist_ok=True)
        self._fds: dict[int, int] = {}
        self.end = 0
        starts = self.file_starts()
        if starts:
            last = starts[-1]
            self.end = last + os.path.getsize(self._path(last))
        self._pending: tuple[int, bytearray] = (self.end, bytearray())
        """The position of the first entry not written yet, and the entries from there (one
        attribute, replaced whole once written: a reader in another thread sees either)."""

    def _path(self, start: int) -> str:
        return os.path.join(self.directory, f"{start:020d}")

    def file_starts(self) -> list[int]:
        return sorted(int(name) for name in os.listdir(self.directory) if name.isdigit())

    def _fd(self, start: int, *, create: bool = False) -> int:
        """The file starting at ``start``, opened once (FileNotFoundError when it is gone and
        not to be created)."""
        fd = self._fds.get(start)
        if fd is None:
            flags = os.O_RDWR | (os.O_CREAT if create else 0)
            fd = self._fds[start] = os.open(self._path(start), flags, 0o644)
        return fd

    def append(self, entry: TimerEntry) -> int:
        """Add ``entry`` at the end (written behind: see the module docstring); its position."""
        pos = self.end
        buf = self._pending[1]
        buf += entry.encode()
        self.end = pos + ENTRY_SIZE
        if len(buf) >= WRITE_BEHIND_BYTES:
            self.write_pending()
        return pos

    def write_pending(self) -> None:
        """Write the appended entries not written yet (a ``pwrite`` per file they fall in)."""
        pos, buf = self._pending
        done = 0
        while done < len(buf):
            start = pos - pos % self.file_size
            chunk = bytes(buf[done : done + start + self.file_size - pos])
            written = os.pwrite(self._fd(start, create=True), chunk, pos - start)
            if written != len(chunk):
                raise OSError(f"short write to the timer log at {pos}: {written} bytes")
            pos += written
            done += written
        self._pending = (pos, bytearray())

    def read(self, pos: int) -> TimerEntry | None:
        """The entry at ``pos``, or None when there is no valid one."""
        if pos < 0 or pos + ENTRY_SIZE > self.end or pos % ENTRY_SIZE:
            return None
        first, buf = self._pending
        if pos >= first:
            return TimerEntry.decode(bytes(buf[pos - first : pos - first + ENTRY_SIZE]))
        start = pos - pos % self.file_size
        try:
            fd = self._fd(start)
        except FileNotFoundError:  # a spent file, deleted
            return None
        return TimerEntry.decode(os.pread(fd, ENTRY_SIZE, pos - start))

    def recover(self, valid_from: int, limit: int | None = None) -> int:
        """Scan from ``valid_from`` (a position known to be good) up to ``limit`` (default:
        the data on disk) and cut the log after the last valid entry; the new end."""
        pos = max(0, valid_from - valid_from % ENTRY_SIZE)
        stop = self.end if limit is None else min(self.end, limit)
        while pos + ENTRY_SIZE <= stop and self.read(pos) is not None:
            pos += ENTRY_SIZE
        self.truncate(pos)
        return pos

    def truncate(self, end: int) -> None:
        """Drop everything at and after ``end``."""
        self.write_pending()
        for start in self.file_starts():
            if start >= end:
                self._close(start)
                os.unlink(self._path(start))
            elif end < start + self.file_size:
                os.truncate(self._path(start), end - start)
        self.end = end
        self._pending = (end, bytearray())

    def entries(self, start: int, end: int) -> list[tuple[int, TimerEntry]]:
        """The valid entries in [start, end), with their positions."""
        out = []
        for pos in range(start, end, ENTRY_SIZE):
            entry = self.read(pos)
            if entry is not None:
                out.append((pos, entry))
        return out

    def flush(self) -> None:
        """fsync every open file (blocking: call it from a thread); what :meth:`write_pending`
        wrote is made durable, not what was appended since."""
        for fd in list(self._fds.values()):
            os.fsync(fd)

    def delete_files_before(self, pos: int) -> int:
        """Delete whole files that end at or before ``pos`` (never the last); how many."""
        removed = 0
        starts = self.file_starts()
        for start in starts[:-1]:
            if start + self.file_size <= pos:
                self._close(start)
                os.unlink(self._path(start))
                removed += 1
        return removed

    def _close(self, start: int) -> None:
        fd = self._fds.pop(start, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        self.write_pending()
        for start in list(self._fds):
            self._close(start)
