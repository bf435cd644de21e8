"""The time wheel: a fixed-size file of slots, ``timerwheel``, one per precision step.

Slot ``(slot_ms // precision_ms) % slots_total`` holds, big-endian, 32 bytes::

    0  i64 slot_ms   the time the slot is for (a slot whose time differs is empty: stale)
    8  i64 first_pos the oldest timer-log entry of the slot
   16  i64 last_pos  the newest one; entries chain back through their prev_pos
   24  i32 num       entries in the chain
   28  i32 reserved

The file's size is fixed (``slots_total * 32``; 7 days of slots as RocketMQ's, 19 MB at the
default precision), read and written with ``pread``/``pwrite``.  Changes are kept in a dirty
table until :meth:`TimerWheel.write_slots` (the service's flush), so that what is on disk never
points past the part of the timer log the checkpoint vouches for; the dirty table holds only
the slots touched since the last flush.
"""

from __future__ import annotations

import os
import struct

import attrs

SLOT_SIZE = 32
_SLOT = struct.Struct(">qqqii")
TIMER_WHEEL_TTL_DAYS = 7
"""RocketMQ's wheel spans 7 days of slots (TIMER_WHEEL_TTL_DAY * DAY_SECS slots)."""


@attrs.frozen
class Slot:
    slot_ms: int
    first_pos: int = -1
    last_pos: int = -1
    num: int = 0

    @property
    def empty(self) -> bool:
        return self.last_pos < 0


class TimerWheel:
    def __init__(self, path: str, slots_total: int, precision_ms: int) -> None:
        if precision_ms <= 0 or slots_total <= 0:
            raise ValueError("the wheel needs a positive precision and slot count")
        self.path = path
        self.slots_total = slots_total
        self.precision_ms = precision_ms
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        size = slots_total * SLOT_SIZE
        if os.fstat(self._fd).st_size != size:
            # A new file (the slot count is fixed: TIMER_WHEEL_TTL_DAYS of slots).
            os.ftruncate(self._fd, 0)
            os.ftruncate(self._fd, size)
        self.dirty: dict[int, Slot] = {}

    def clear(self) -> None:
        """Every slot empty (a sparse file again)."""
        os.ftruncate(self._fd, 0)
        os.ftruncate(self._fd, self.slots_total * SLOT_SIZE)
        self.dirty.clear()

    def slot_time(self, ms: int) -> int:
        """The start of the slot ``ms`` falls in."""
        return ms - ms % self.precision_ms

    def index(self, slot_ms: int) -> int:
        return (slot_ms // self.precision_ms) % self.slots_total

    def get(self, slot_ms: int) -> Slot:
        """The slot for ``slot_ms`` (an empty one when the stored slot is another time's)."""
        slot = self.dirty.get(self.index(slot_ms))
        if slot is None:
            data = os.pread(self._fd, SLOT_SIZE, self.index(slot_ms) * SLOT_SIZE)
            if len(data) == SLOT_SIZE:
                t, first, last, num, _ = _SLOT.unpack(data)
                slot = Slot(t, first, last, num)
        if slot is None or slot.slot_ms != slot_ms:
            return Slot(slot_ms)
        return slot

    def link(self, slot_ms: int, pos: int, slot: Slot | None = None) -> int:
        """Chain the entry at ``pos`` as the newest of the slot; its prev_pos (-1: first).
        ``slot``: the slot as :meth:`get` just gave it, not read again."""
        if slot is None:
            slot = self.get(slot_ms)
        first = pos if slot.empty else slot.first_pos
        self.dirty[self.index(slot_ms)] = Slot(slot_ms, first, pos, slot.num + 1)
        return slot.last_pos

    def relink(self, slot_ms: int, pos: int, prev_pos: int) -> None:
        """Recovery: make sure the entry at ``pos`` (whose prev is ``prev_pos``) is chained;
        nothing when the slot already reaches it."""
        slot = self.get(slot_ms)
        if slot.last_pos >= pos:
            return
        first = pos if prev_pos < 0 or slot.empty else slot.first_pos
        self.dirty[self.index(slot_ms)] = Slot(slot_ms, first, pos, slot.num + 1)

    def write_slots(self, slots: dict[int, Slot]) -> None:
        """Write ``slots`` (index → slot) to the file (blocking; may run in a thread)."""
        for index, slot in slots.items():
            os.pwrite(
                self._fd,
                _SLOT.pack(slot.slot_ms, slot.first_pos, slot.last_pos, slot.num, 0),
                index * SLOT_SIZE,
            )

    def forget(self, slots: dict[int, Slot]) -> None:
        """Drop from the dirty table the written ``slots`` not changed since."""
        for index, slot in slots.items():
            if self.dirty.get(index) is slot:
                del self.dirty[index]

    def flush(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        os.close(self._fd)
