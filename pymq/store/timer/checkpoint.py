"""The timer checkpoint, ``config/timercheck``: where recovery of the timer store starts.

Layout, big-endian, 48 bytes::

    0  u32 magic            CHECK_MAGIC
    4  u32 crc32            of bytes 8..40
    8  i64 log_end          the timer log is good (fsynced) up to here; the rest is cut
   16  i64 relink_from      entries in [relink_from, log_end) may not be in the wheel file yet
   24  i64 enqueue_offset   the timer topic's consume-queue offset entered up to log_end
   32  i64 read_ms          the next wheel slot to deliver; every earlier slot is delivered
   40  i64 precision_ms     the wheel's slot length the log's slots were computed with

It is written whole to a temporary file, fsynced and renamed over the old one, so a crash leaves
the old or the new checkpoint, never a torn one.
"""

from __future__ import annotations

import os
import struct
import zlib

import attrs

CHECK_MAGIC = 0x71C3EC0D
_BODY = struct.Struct(">qqqqq")
_HEAD = struct.Struct(">II")


@attrs.frozen
class TimerCheckpoint:
    log_end: int = 0
    relink_from: int = 0
    enqueue_offset: int = 0
    read_ms: int = 0
    precision_ms: int = 0

    def encode(self) -> bytes:
        body = _BODY.pack(
            self.log_end, self.relink_from, self.enqueue_offset, self.read_ms, self.precision_ms
        )
        return _HEAD.pack(CHECK_MAGIC, zlib.crc32(body)) + body

    @classmethod
    def decode(cls, data: bytes) -> TimerCheckpoint:
        if len(data) != _HEAD.size + _BODY.size:
            raise ValueError(f"timer checkpoint is {len(data)} bytes")
        magic, crc = _HEAD.unpack_from(data)
        body = data[_HEAD.size :]
        if magic != CHECK_MAGIC or zlib.crc32(body) != crc:
            raise ValueError("timer checkpoint is corrupt (magic or CRC)")
        return cls(*_BODY.unpack(body))

    @classmethod
    def load(cls, path: str) -> TimerCheckpoint | None:
        """The checkpoint in ``path``; None when there is none (a new store).  A corrupt one
        raises: starting from nothing would deliver every pending timer again."""
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        return cls.decode(data)

    def save(self, path: str) -> None:
        """Write atomically and durably (blocking: call it from a thread)."""
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(self.encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
