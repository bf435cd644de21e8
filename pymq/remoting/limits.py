"""The bounds a remoting connection lives within, and the socket-free state that enforces them.

Every resource a peer can make a server hold is bounded here:

- output waiting for a peer that does not read: :class:`OutputBuffer`, with Netty's write-buffer
  water marks (above ``high`` the connection stops reading requests until its output drains to
  ``low``), a deadline after which a connection that stays above the mark is closed, and a total
  across all connections of a server (:class:`SharedBudget`);
- frames received in part: a deadline for a frame in progress and a total across connections;
- requests in progress on one connection (each a task: a held long poll, a group commit);
- connections.

These classes move no bytes and read no clock of their own; the Trio shell
(:mod:`pymq.remoting.channel`) feeds them and asks them what to do, and the unit tests drive them
directly.
"""

from __future__ import annotations

import attrs

from pymq.remoting.codec import FRAME_MAX_LENGTH

MIB = 1 << 20


@attrs.frozen
class ConnectionLimits:
    """Per-connection bounds (from NettyServerConfig; the defaults are the documented ones)."""

    max_frame_length: int = FRAME_MAX_LENGTH
    # Output queued above this stops the reading of requests; reading resumes at ``low``.
    write_high_water_mark: int = 4 * MIB
    write_low_water_mark: int = 1 * MIB
    # A connection whose output stays above the high-water mark this long is closed.
    write_stall_timeout: float = 30.0
    # A frame whose first bytes arrived this long ago and that is still not complete closes the
    # connection.
    frame_receive_timeout: float = 60.0
    # Requests in progress (served by a task) on one connection; more are answered SYSTEM_BUSY.
    max_pending_requests: int = 4096


@attrs.define
class SharedBudget:
    """Totals across the connections of one server (or of several sharing it)."""

    write_total_max: int = 256 * MIB
    partial_frame_total_max: int = 128 * MIB
    write_total: int = 0
    partial_frame_total: int = 0

    @property
    def writes_over(self) -> bool:
        return self.write_total >= self.write_total_max

    @property
    def partial_frames_over(self) -> bool:
        return self.partial_frame_total >= self.partial_frame_total_max


class OutputBuffer:
    """Frames waiting to be written to one connection, counted against its water marks and the
    server's total."""

    __slots__ = ("budget", "frames", "high", "low", "paused_since", "size")

    def __init__(self, limits: ConnectionLimits, budget: SharedBudget | None = None) -> None:
        self.frames: list[bytes] = []
        self.size = 0
        self.high = limits.write_high_water_mark
        self.low = min(limits.write_low_water_mark, limits.write_high_water_mark)
        self.budget = budget
        # When reading stopped for this buffer's sake (None: reading).
        self.paused_since: float | None = None

    def __bool__(self) -> bool:
        return bool(self.frames)

    def append(self, frame: bytes) -> None:
        # _grow inlined: this runs for every answer a connection writes.
        self.frames.append(frame)
        size = len(frame)
        self.size += size
        budget = self.budget
        if budget is not None:
            budget.write_total += size

    def push_front(self, data: bytes) -> None:
        """Put back what the socket did not take."""
        self.frames.insert(0, data)
        self._grow(len(data))

    def take(self, max_bytes: int | None = None) -> bytes:
        """Remove and return queued frames joined: all of them, or whole frames up to about
        ``max_bytes`` (at least one)."""
        taken = self.frames
        if max_bytes is None or self.size <= max_bytes:
            self.frames = []  # all of them (the list itself is not changed)
        else:
            count = size = 0
            while count < len(taken) and size < max_bytes:
                size += len(taken[count])
                count += 1
            taken, self.frames = taken[:count], taken[count:]
        data = taken[0] if len(taken) == 1 else b"".join(taken)
        # _grow inlined, as in append: this runs for every write.
        size = len(data)
        self.size -= size
        budget = self.budget
        if budget is not None:
            budget.write_total -= size
        return data

    def clear(self) -> None:
        self.frames = []
        self._grow(-self.size)

    def _grow(self, delta: int) -> None:
        self.size += delta
        if self.budget is not None:
            self.budget.write_total += delta

    def should_pause(self) -> bool:
        """Stop reading requests: this connection's output is above its high-water mark, or the
        server's total is over its cap and this connection adds to it."""
        if self.size >= self.high:
            return True
        return self.size > 0 and self.budget is not None and self.budget.writes_over

    def may_resume(self) -> bool:
        if self.size > self.low:
            return False
        return self.size == 0 or self.budget is None or not self.budget.writes_over


class PartialFrameTracker:
    """Counts the bytes of a frame received in part against the server's total, and when the
    frame began."""

    __slots__ = ("accounted", "budget", "started")

    def __init__(self, budget: SharedBudget | None = None) -> None:
        self.budget = budget
        self.accounted = 0
        self.started: float | None = None

    def update(self, buffered: int, now: float, frame_ended: bool = False) -> None:
        """The decoder now holds ``buffered`` bytes of an unfinished frame; ``frame_ended``:
        the read completed a frame, so those bytes (if any) are a new frame's, begun now."""
        if buffered and (self.started is None or frame_ended):
            self.started = now
        elif not buffered:
            self.started = None
        if self.budget is not None:
            self.budget.partial_frame_total += buffered - self.accounted
        self.accounted = buffered

    def release(self) -> None:
        self.update(0, 0.0)

    def budget_add(self, size: int) -> None:
        """Count ``size`` more (or fewer) bytes received and not yet served: whole frames
        waiting their turn count against the same total as partial ones."""
        if self.budget is not None:
            self.budget.partial_frame_total += size

    def must_wait(self) -> bool:
        """Read no more of an unfinished frame while the server's total is over its cap."""
        return self.accounted > 0 and self.budget is not None and self.budget.partial_frames_over
