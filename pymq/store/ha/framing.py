"""Sans-IO framing of RocketMQ 4.x's HA connection.

Slave to master: a stream of big-endian int64 offsets (the slave's max commit-log offset); only
the newest complete one matters.  Master to slave: frames of ``int64 phyOffset | int32 size`` then
``size`` bytes of raw commit log (size 0 is a heartbeat).
"""

from __future__ import annotations

import struct

_OFFSET = struct.Struct(">q")
_HEADER = struct.Struct(">qi")
HEADER_SIZE = _HEADER.size  # 12


class HAProtocolError(ValueError):
    """The peer sent bytes that are not HA framing."""


def encode_report(offset: int) -> bytes:
    return _OFFSET.pack(offset)


def encode_transfer(offset: int, data: bytes | memoryview = b"") -> bytes:
    return _HEADER.pack(offset, len(data)) + bytes(data)


class ReportDecoder:
    """Master side: feed bytes, get the newest complete offset the slave reported (or None)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes | bytearray) -> int | None:
        self._buf += data
        whole = len(self._buf) - len(self._buf) % 8
        if whole == 0:
            return None
        (offset,) = _OFFSET.unpack_from(self._buf, whole - 8)
        del self._buf[:whole]
        if offset < 0:
            raise HAProtocolError(f"negative offset report {offset}")
        return offset


class TransferDecoder:
    """Slave side: feed bytes, get the complete ``(offset, body)`` frames so far.

    A master sends at most ``haTransferBatchSize`` bytes a frame, so a header announcing more
    than ``max_body`` (the slave's ``haTransferBatchSize``: a slave's must be at least its
    master's, as both default to 32 KiB) is refused before anything of it is buffered: what
    is held is at most one frame and one read."""

    def __init__(self, max_body: int) -> None:
        self.max_body = max_body
        self._buf = bytearray()

    def feed(self, data: bytes | bytearray) -> list[tuple[int, bytes]]:
        self._buf += data
        frames: list[tuple[int, bytes]] = []
        pos = 0
        while len(self._buf) - pos >= HEADER_SIZE:
            offset, size = _HEADER.unpack_from(self._buf, pos)
            if size < 0 or offset < 0:
                raise HAProtocolError(f"bad transfer header: offset {offset}, size {size}")
            if size > self.max_body:
                raise HAProtocolError(
                    f"a frame of {size} bytes, more than haTransferBatchSize {self.max_body} "
                    "(a slave's haTransferBatchSize must be at least its master's)"
                )
            end = pos + HEADER_SIZE + size
            if end > len(self._buf):
                break
            frames.append((offset, bytes(self._buf[pos + HEADER_SIZE : end])))
            pos = end
        del self._buf[:pos]
        return frames
