"""Message ids: offset message ids (store host + commit-log offset) and UNIQ_KEY ids.

Also the packed host addresses both kinds are made of.  Pure functions, no I/O.
"""

from __future__ import annotations

import datetime
import ipaddress
import itertools
import os
import random
import struct
import time
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from pymq.common.clock import now_ms as _clock_ms
from pymq.common.native import load_native

native_extension: Any = load_native("pymq.common._recordc")


@lru_cache(maxsize=4096)
def pack_ip(ip: str) -> bytes:
    """4 bytes for an IPv4 address, 16 for IPv6."""
    return ipaddress.ip_address(ip).packed


@lru_cache(maxsize=4096)
def unpack_ip(raw: bytes) -> str:
    return str(ipaddress.ip_address(raw))


Host = tuple[str, int]
"""An (ip, port) pair."""

# --- message ids ----------------------------------------------------------------------------------

_PORT_OFFSET = struct.Struct(">iq")


def _offset_msg_id_py(prefix: str, offset: int) -> str:
    """Pure-Python twin of ``_recordc.offset_msg_id``; use :func:`offset_msg_id`.  An offset
    outside 0..2**63-1 (no commit-log offset) raises OverflowError, as in C."""
    if not 0 <= offset <= _MAX_OFFSET:
        raise OverflowError(f"offset = {offset} does not fit its record field")
    return f"{prefix}{offset:016X}"


_MAX_OFFSET = 2**63 - 1


def _offset_msg_ids_py(prefix: str, rows: list[tuple]) -> str:
    """Pure-Python twin of ``_recordc.offset_msg_ids``; use :func:`offset_msg_ids`."""
    return ",".join([_offset_msg_id_py(prefix, row[0]) for row in rows])


def create_offset_msg_id(ip: str, port: int, phy_offset: int) -> str:
    """The broker's message id: uppercase hex of store IP, port (int32) and commit-log offset."""
    return (pack_ip(ip) + _PORT_OFFSET.pack(port, phy_offset)).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple[str, int, int]:
    """(ip, port, commit-log offset) of an offset message id; raises ValueError if malformed."""
    raw = bytes.fromhex(msg_id)
    if len(raw) == 16:
        ip_raw = raw[:4]
    elif len(raw) == 28:
        ip_raw = raw[:16]
    else:
        raise ValueError(f"not an offset message id: {msg_id!r}")
    port, offset = _PORT_OFFSET.unpack_from(raw, len(ip_raw))
    return unpack_ip(ip_raw), port, offset


_HEX_BYTE = [f"{i:02X}" for i in range(256)]


class UniqueIdGenerator:
    """UNIQ_KEY ids in the layout of Java's ``MessageClientIDSetter``.

    16 bytes as 32 uppercase hex digits (IPv4): ip(4) | pid(2) | random "class loader" int(4) |
    milliseconds since the start of the current month, 32 bits | counter, int16.

    The milliseconds outgrow a signed int32 on the 25th day of a month: Java casts them to int
    (``(int) (now - startTime)``) and reads them back unsigned (``getNearlyTimeFromID``), so they
    are written modulo 2**32 here too.
    """

    def __init__(self, ip: str = "127.0.0.1", pid: int | None = None) -> None:
        prefix = pack_ip(ip) + struct.pack(
            ">hi", (os.getpid() if pid is None else pid) & 0x7FFF, random.getrandbits(31)
        )
        self._prefix = prefix.hex().upper()
        self._counter = itertools.count(random.getrandbits(15))
        self._month_start = 0
        self._next_month = 0
        self._last_ms = -1  # the millisecond whose ids start with _head
        self._head = ""

    def _roll_month(self, now_ms: int) -> None:
        now = datetime.datetime.fromtimestamp(now_ms / 1000)
        start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        nxt = (start + datetime.timedelta(days=32)).replace(day=1)
        self._month_start = int(start.timestamp() * 1000)
        self._next_month = int(nxt.timestamp() * 1000)

    def _head_at(self, now_ms: int | None) -> str:
        """The ids' head (all but the counter) at ``now_ms`` (now when None), made once per
        millisecond."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        if now != self._last_ms:
            if now >= self._next_month or now < self._month_start:
                self._roll_month(now)
            self._head = f"{self._prefix}{(now - self._month_start) & 0xFFFFFFFF:08X}"
            self._last_ms = now
        return self._head

    def create(self, now_ms: int | None = None) -> str:
        # _head_at's common case (the millisecond of the last id) read here, without its call;
        # the counter written from the byte table rather than formatted.
        now = _clock_ms() if now_ms is None else now_ms
        head = self._head if now == self._last_ms else self._head_at(now)
        count = next(self._counter)
        return head + _HEX_BYTE[(count >> 8) & 0xFF] + _HEX_BYTE[count & 0xFF]

    def create_many(self, count: int, now_ms: int | None = None) -> list[str]:
        """``count`` ids, as ``count`` calls of :meth:`create` at one moment make them (a
        batch's): the time read and written once."""
        head = self._head_at(now_ms)
        if count <= 0:
            return []
        # The counter's next ``count`` values in one step (consecutive: no other thread's
        # call comes between), written a byte of hex at a time, a run per high byte.
        value = next(itertools.islice(self._counter, count - 1, None)) - (count - 1)
        ids: list[str] = []
        while count:
            high, low = (value >> 8) & 0xFF, value & 0xFF
            run = min(count, 256 - low)
            start = head + _HEX_BYTE[high]
            ids += [start + tail for tail in _HEX_BYTE[low : low + run]]
            count -= run
            value += run
        return ids

    @property
    def begin_of_month_ms(self) -> int:
        return self._month_start


def unique_id_ip(uniq_id: str) -> str:
    """The IP encoded at the start of a UNIQ_KEY (IPv4 layout)."""
    return unpack_ip(bytes.fromhex(uniq_id[:8]))


offset_msg_id: Callable[[str, int], str] = (
    native_extension.offset_msg_id if native_extension is not None else _offset_msg_id_py
)
"""A record's message id from its store host's hex prefix (see :func:`create_offset_msg_id`):
the prefix + the commit-log offset as 16 uppercase hex digits."""

offset_msg_ids: Callable[[str, list[tuple]], str] = getattr(
    native_extension, "offset_msg_ids", _offset_msg_ids_py
)
"""The comma-joined message ids of records given as rows whose first item is the physical
offset (a batch's msgId): :func:`offset_msg_id` of each."""
