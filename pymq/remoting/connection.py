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
from typing import Any, NamedTuple, Protocol

import attrs

from pymq.remoting.codec import (
    BUSY_JSON_HEAD_PREFIX,
    RPC_ONEWAY,
    RPC_TYPE_RESPONSE,
    FrameDecoder,
    RemotingCommand,
    busy_answer,
    busy_answers,
    busy_json_answer,
    busy_json_tail,
    peek_request,
)
from pymq.remoting.codes import ResponseCode
from pymq.remoting.limits import ConnectionLimits, OutputBuffer, PartialFrameTracker, SharedBudget

log = logging.getLogger(__name__)

# Fast failure reads ahead once a run has waited this fraction of the smallest limit.
READ_AHEAD_FROM = 0.25

# RocketMQ's answer when a request cannot be queued for its executor (NettyRemotingAbstract).
OVERLOAD_REMARK = "[OVERLOAD]system busy, start flow control for a while"

# Connection.place's "serve it in a task of its own".
TASK: Any = ("task",)

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


class Admission(Protocol):
    """A check made before a request is served (the broker's fast failure).

    The channel stamps each receive with ``clock()``, less the age of the received bytes as the
    kernel reports it (SO_TIMESTAMPNS: the bytes may have waited in the socket's buffer); a
    request's wait is the time from then to when it is started.  ``shed_remark`` (before the
    request is decoded, by its code) and ``shed`` (a decoded request waiting for its task) are
    called only for requests that waited longer than ``min_wait`` s or were received at or
    before ``busy_mark``; they return the SYSTEM_BUSY remark, or answer, to give instead of
    serving the request, or None."""

    clock: Callable[[], float]

    @property
    def min_wait(self) -> float: ...

    @property
    def busy_mark(self) -> float: ...

    def shed(
        self,
        channel: Any,
        request: RemotingCommand,
        received: float,
        waited: float,
        queued: int,
    ) -> RemotingCommand | None: ...

    def shed_remark(self, code: int, received: float, waited: float, queued: int) -> str | None: ...

    def note_shed(self, code: int, count: int, remark: str) -> None: ...


_NOT_YET: Any = object()


class Shedding:
    """Fast failure over one run of frames that waited too long: each request past its limit is
    answered SYSTEM_BUSY without being decoded.  A refusal must cost a small fraction of a send,
    or refusing would itself take the broker's time: the answer of each request code is worked
    out once per run, and each frame costs a peek at its header and one formatted answer."""

    __slots__ = ("admission", "count", "received", "refused", "remarks", "tails", "waited")

    def __init__(self, admission: Admission, received: float, waited: float, count: int) -> None:
        self.admission = admission
        self.received = received
        self.waited = waited
        self.count = count
        self.remarks: dict[int, tuple[str, bytes] | None] = {}
        self.tails: dict[int, bytes | None] = {}  # the JSON answer after the opaque, by code
        self.refused: dict[int, int] = {}  # by code

    def refuse(self, buf: bytes, start: int, end: int, index: int, out: OutputBuffer) -> bool:
        """Answer the request in ``buf[start:end]`` SYSTEM_BUSY if it waited past its limit;
        False to serve it (or to decode it and let the checks decide)."""
        peeked = peek_request(buf, start, end)
        if peeked is None:
            return False
        code, opaque, flag, serialize_type = peeked
        if flag & RPC_TYPE_RESPONSE:
            return False
        remark = self.remarks.get(code, _NOT_YET)
        if remark is _NOT_YET:
            remark = self._remark(code, index)
        if remark is None:
            return False
        if not flag & RPC_ONEWAY:
            if serialize_type == 0:
                out.append(busy_json_answer(opaque, remark[1]))
            else:
                out.append(busy_answer(serialize_type, opaque, remark[0]))
        self.refused[code] = self.refused.get(code, 0) + 1
        return True

    def refuse_run(
        self, buf: bytes, bounds: list[int], first: int, stop: int, out: OutputBuffer
    ) -> int:
        """Refuse frames from ``first`` on while each can be (the common case under overload:
        a run of sends that all waited too long); the index of the first one not refused, which
        has been judged and is to be served.  The
        usual JSON headers (pymq's and the C++ client's key order) are answered by
        ``busy_answers`` (C when built) with no Python work per frame; others by
        :meth:`refuse`."""
        tails = self.tails
        i = first
        while i < stop:
            answers, i = busy_answers(
                buf, bounds, i, stop, BUSY_JSON_HEAD_PREFIX, tails, self.refused
            )
            if answers:
                out.append(answers)
            if i >= stop:
                break
            # Stopped at a frame: a code seen for the first time (work out its answer and go
            # on), or one to serve, or a header the fast loop does not read (peek at it).
            peeked = peek_request(buf, bounds[2 * i], bounds[2 * i + 1])
            if peeked is not None and peeked[0] not in tails and peeked[3] == 0:
                self._remark(peeked[0], i)
                if tails[peeked[0]] is not None:
                    continue
            if not self.refuse(buf, bounds[2 * i], bounds[2 * i + 1], i, out):
                break
            i += 1
        return i

    def _remark(self, code: int, index: int) -> tuple[str, bytes] | None:
        text = self.admission.shed_remark(code, self.received, self.waited, self.count - index)
        remark = self.remarks[code] = None if text is None else (text, busy_json_tail(text))
        self.tails[code] = None if remark is None else remark[1]
        return remark

    def report(self) -> None:
        for code, count in self.refused.items():
            remark = self.remarks[code]
            assert remark is not None
            self.admission.note_shed(code, count, remark[0])


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
        # Requests of the run being served not yet started, and when they were received (the
        # broker's water mark reads them): set by judge, cleared when the inbox is served.
        self.backlog = 0
        self.backlog_since = 0.0
        # Frames received and not yet served, [buffer, bounds, next index, received at] a read:
        # empty (false) when there is no input to serve (the channel's loop tests it).
        self.inbox: collections.deque[list] = collections.deque()
        self.inbox_bytes = 0

    # -- input ------------------------------------------------------------------------------

    def receive(self, data: bytes, received: float, now: float) -> None:
        """Take what a read returned (received at ``received``); raises ProtocolError when the
        stream stops making sense before any whole frame."""
        buf, bounds = self.decoder.feed_frames(data)
        if bounds:
            self.inbox.append([buf, bounds, 0, received])
            self.inbox_bytes += len(buf)
            self.partial.budget_add(len(buf))
        # A read that completes a frame ends the one in progress: what it leaves buffered is
        # the next frame's, whose deadline starts now (a peer streaming frames back to back,
        # each read ending inside the next frame, never leaves the decoder empty).
        self.partial.update(self.decoder.buffered, now, bool(bounds))

    @property
    def queued_reads(self) -> int:
        """Reads whose frames are not all served yet."""
        return len(self.inbox)

    def next_run(self, size: int) -> Run | None:
        """The next up to ``size`` frames to serve, oldest first (None: none waits)."""
        if not self.inbox:
            return None
        entry = self.inbox[0]
        buf, bounds, first, received = entry
        count = len(bounds) >> 1
        stop = min(first + size, count)
        if stop == count:
            self.inbox.popleft()
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

    # -- decisions ------------------------------------------------------------------------

    def judge(self, run: Run, waited: float, admission: Admission) -> tuple[Shedding | None, bool]:
        """Fast failure's one check per run (not per request), whose frames have ``waited``
        since they were received: the shedding of a run that waited past a limit (or arrived
        while the server was marked busy), and whether the connection is falling behind (then
        it reads ahead between runs, so that the backlog waits in the inbox, where its age is
        known, rather than in the peer's socket buffer, where it is not; not before: a read
        per run costs a fifth of a send's time)."""
        received = run.received
        self.backlog, self.backlog_since = run.total - run.first, received
        limit = admission.min_wait
        shed = None
        if waited > limit or received <= admission.busy_mark:
            shed = Shedding(admission, received, waited, run.total)
        return shed, waited > limit * READ_AHEAD_FROM

    def place(self, cmd: RemotingCommand) -> tuple[int, str] | None:
        """Where a decoded frame goes: a response completes the call awaiting it (None); a
        request with a bad header is refused SYSTEM_ERROR, one past the connection's cap of
        requests in tasks SYSTEM_BUSY (the refusal's code and remark); any other request is
        admitted to a task (:data:`TASK`; :meth:`task_done` when it ends)."""
        if cmd.flag & RPC_TYPE_RESPONSE:
            if not self.calls.answer(cmd):
                log.debug("response for unknown opaque %d", cmd.opaque)
            return None
        if cmd.header_error is not None:
            return ResponseCode.SYSTEM_ERROR, cmd.header_error
        if not self.start_task():
            return ResponseCode.SYSTEM_BUSY, OVERLOAD_REMARK
        return TASK

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
        self.inbox.clear()
        self.inbox_bytes = 0
        self.partial.release()
        self.calls.fail_all(error)
