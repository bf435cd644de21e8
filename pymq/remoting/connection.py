"""One remoting connection's state, without a socket or a clock of its own (h11's shape).

:class:`Connection` is fed the bytes a socket read, and answers what the Trio shell
(:class:`~pymq.remoting.channel.Channel`) should do next: which frames to serve, in runs, oldest
first (:meth:`Connection.next_run`); whether a request may have a task of its own
(:meth:`Connection.start_task`); which calls made to the peer its responses complete, and which
have run out of time (:class:`CallTable`); and, through its
:class:`~pymq.remoting.limits.OutputBuffer` and
:class:`~pymq.remoting.limits.PartialFrameTracker`, when to stop reading.  Every edge case is a
unit test (``tests/unit/test_connection.py``); the shell only moves bytes and time.
"""

from __future__ import annotations

import collections
import logging
import math
from collections.abc import Callable
from typing import NamedTuple

import attrs

from pymq.remoting.codec import FrameDecoder, RemotingCommand
from pymq.remoting.limits import ConnectionLimits, OutputBuffer, PartialFrameTracker, SharedBudget

log = logging.getLogger(__name__)

# Answer to a callback-style call: (response, None) or (None, error).
ResponseCallback = Callable[[RemotingCommand | None, Exception | None], None]


@attrs.define(slots=True)
class Call:
    """A request sent to the peer, waiting for the response with its opaque.  Either a task
    waits for it (``wake`` is called when it is done) or ``callback`` gets the outcome.

    A call with a finite ``deadline`` is failed by the channel's sweep once it passes (a
    callback call, or an awaited one that has no cancel scope of its own); an awaited call
    with none times out in its task."""

    wake: Callable[[], None] | None = None
    response: RemotingCommand | None = None
    error: Exception | None = None
    callback: ResponseCallback | None = None
    deadline: float = math.inf
    code: int = 0
    # Given the fields of a plain successful answer read from its frame (the client's raw
    # answer path: channel.raw_send_answers), instead of ``callback`` with the response.
    on_fields: Callable[[tuple], None] | None = None
    # An awaited call that takes those fields (kept in ``fields`` by keep_fields; a flag, not
    # on_fields = keep_fields, which would make every such call a reference cycle).
    awaits_fields: bool = False
    fields: tuple | None = None

    def finish(self, response: RemotingCommand | None, error: Exception | None) -> None:
        if self.callback is not None:
            try:
                self.callback(response, error)
            except Exception:
                log.exception("a response callback raised")
            return
        self.response, self.error = response, error
        if self.wake is not None:
            self.wake()

    def keep_fields(self, fields: tuple) -> None:
        """An awaited call's answer fields (``awaits_fields``): keep them, wake the task."""
        self.fields = fields
        if self.wake is not None:
            self.wake()


class CallTable:
    """Calls in flight by opaque, and how many have a deadline the channel's sweep keeps
    (``Call.deadline``; the other awaited calls keep theirs in the waiting task)."""

    __slots__ = ("calls", "timed")

    def __init__(self) -> None:
        self.calls: dict[int, Call] = {}
        self.timed = 0  # calls with a finite deadline: the sweep runs while any

    def __len__(self) -> int:
        return len(self.calls)

    def add(self, opaque: int, call: Call) -> None:
        self.calls[opaque] = call
        if call.deadline != math.inf:
            self.timed += 1

    def drop(self, opaque: int) -> None:
        """Forget an awaited call (it finished, or its task gave up)."""
        call = self.calls.pop(opaque, None)
        if call is not None and call.deadline != math.inf:
            self.timed -= 1

    def answer(self, response: RemotingCommand) -> bool:
        """Complete the call ``response`` answers; False when none waits for it."""
        call = self.calls.pop(response.opaque, None)
        if call is None:
            return False
        if call.deadline != math.inf:
            self.timed -= 1
        call.finish(response, None)
        return True

    def take_for_fields(self, opaque: int) -> Call | None:
        """Take the call with ``opaque`` if it accepts its answer's fields (``on_fields`` or
        ``awaits_fields``); None, taking nothing, otherwise."""
        call = self.calls.get(opaque)
        if call is None or (call.on_fields is None and not call.awaits_fields):
            return None
        del self.calls[opaque]
        if call.deadline != math.inf:
            self.timed -= 1
        return call

    def expire(self, now: float, error: Callable[[Call], Exception]) -> int:
        """Fail the calls whose deadline has passed with ``error(call)``; how many."""
        expired = [(opaque, call) for opaque, call in self.calls.items() if call.deadline <= now]
        failed = 0
        for opaque, call in expired:
            if self.calls.pop(opaque, None) is None:
                continue  # an earlier callback closed the connection: already failed
            self.timed -= 1
            call.finish(None, error(call))
            failed += 1
        return failed

    def fail_all(self, error: Exception) -> None:
        calls = list(self.calls.values())
        self.calls.clear()
        self.timed = 0
        for call in calls:
            call.finish(None, error)


class Run(NamedTuple):
    """Up to a run's worth of frames to serve: ``bounds[2*first:2*stop]`` into ``buf``;
    ``total`` frames came with that read in all, received at ``received``."""

    buf: bytes
    bounds: list[int]
    first: int
    stop: int
    total: int
    received: float


_new_run = tuple.__new__  # a Run without NamedTuple's own __new__ frame (once per run)


class Connection:
    """The state of one connection (see the module's docstring)."""

    def __init__(self, limits: ConnectionLimits, budget: SharedBudget | None = None) -> None:
        self.limits = limits
        self.decoder = FrameDecoder(limits.max_frame_length)
        self.partial = PartialFrameTracker(budget)
        self.out = OutputBuffer(limits, budget)
        self.calls = CallTable()
        self.tasks = 0  # requests being served by a task of their own
        # Frames received and not yet served: [buffer, bounds, next index, received at].
        self._inbox: collections.deque[list] = collections.deque()
        self.inbox_bytes = 0

    # -- input ------------------------------------------------------------------------------

    def receive(self, data: bytes, received: float, now: float) -> None:
        """Take what a read returned (received at ``received``); raises ProtocolError when the
        stream stops making sense before any whole frame."""
        buf, bounds = self.decoder.feed_frames(data)
        if bounds:
            self._inbox.append([buf, bounds, 0, received])
            self.inbox_bytes += len(buf)
            self.partial.budget_add(len(buf))
        # A read that completes a frame ends the one in progress: what it leaves buffered is
        # the next frame's, whose deadline starts now (a peer streaming frames back to back,
        # each read ending inside the next frame, never leaves the decoder empty).
        self.partial.update(self.decoder.buffered, now, bool(bounds))

    @property
    def has_input(self) -> bool:
        return bool(self._inbox)

    @property
    def queued_reads(self) -> int:
        """Reads whose frames are not all served yet."""
        return len(self._inbox)

    def next_run(self, size: int) -> Run | None:
        """The next up to ``size`` frames to serve, oldest first (None: none waits)."""
        if not self._inbox:
            return None
        entry = self._inbox[0]
        buf, bounds, first, received = entry
        count = len(bounds) >> 1
        stop = min(first + size, count)
        if stop == count:
            self._inbox.popleft()
            self.inbox_bytes -= len(buf)
            self.partial.budget_add(-len(buf))
        else:
            entry[2] = stop
        return _new_run(Run, (buf, bounds, first, stop, count, received))

    def may_read_ahead(self) -> bool:
        """Whether to take more input before what is queued is served: not past a frame's
        worth per connection, nor while the server's total is over its cap."""
        budget = self.partial.budget
        if self.inbox_bytes >= self.limits.max_frame_length:
            return False
        return budget is None or not budget.partial_frames_over

    # -- requests served by a task ----------------------------------------------------------

    def start_task(self) -> bool:
        """Admit one more request to be served by a task; False past the connection's cap (the
        request is then answered SYSTEM_BUSY)."""
        if self.tasks >= self.limits.max_pending_requests:
            return False
        self.tasks += 1
        return True

    def task_done(self) -> None:
        self.tasks -= 1

    # -- the end ----------------------------------------------------------------------------

    def close(self, error: Exception) -> None:
        """Release everything held and fail every call in flight with ``error``."""
        self.out.clear()
        self.partial.budget_add(-self.inbox_bytes)
        self._inbox.clear()
        self.inbox_bytes = 0
        self.partial.release()
        self.calls.fail_all(error)
