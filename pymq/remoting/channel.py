"""One TCP connection speaking the remoting protocol, used by servers and clients alike.

A :class:`Channel` owns its stream.  :meth:`Channel.run` reads frames until the peer closes, the
bytes stop making sense, or the channel is closed; then it closes the stream and fails every call
still waiting for an answer, at once.  Requests that arrive are served concurrently, each in its own
task (clients multiplex everything over one socket, and a held long-poll pull must not delay a
heartbeat), and every request is answered unless it carries the oneway flag.  Writes go through
one writer task that joins whatever frames are queued into a single ``send_all``.

Errors stay at this boundary: a malformed frame or a broken socket ends this channel (logged with
the reason), never the server around it.  A handler that raises answers ``SYSTEM_ERROR`` with the
exception's description, as RocketMQ's ``processRequestCommand`` does.
"""

from __future__ import annotations

import logging
import math
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import trio

from pymq.remoting.codec import (
    RPC_ONEWAY,
    RPC_TYPE_RESPONSE,
    RemotingCommand,
    decode_frame_at,
    encode,
    next_opaque,
    send_answer_fields,
)
from pymq.remoting.codes import ResponseCode, request_name
from pymq.remoting.connection import (
    TASK,
    Admission,
    Call,
    Connection,
    ResponseCallback,
    Run,
    Shedding,
)
from pymq.remoting.errors import (
    ProtocolError,
    RemotingCommandError,
    RemotingConnectError,
    RemotingSendError,
    RemotingTimeoutError,
)
from pymq.remoting.limits import ConnectionLimits, SharedBudget

log = logging.getLogger(__name__)

RequestHandler = Callable[["Channel", RemotingCommand], Awaitable[RemotingCommand | None]]
# Answers a request at once, inside the reader, or returns None to have it served by a task,
# or ANSWER_LATER when it has arranged to call Channel.answer itself (a group commit).
InlineHandler = Callable[["Channel", RemotingCommand], RemotingCommand | bytes | None]
# (channel, buffer, frame bounds, first, stop) -> (the answers of frames first..i-1 joined, i,
# frame i decoded or None): see Channel.raw_run_handler.
RawRunHandler = Callable[
    ["Channel", bytes, list[int], int, int], tuple[bytes, int, "RemotingCommand | None"]
]
# Called before and after each run of frames a connection serves together: Channel.run_hooks.
RunHooks = tuple[Callable[[], None], Callable[[], None]]
ANSWER_LATER = RemotingCommand(code=-1)
# A raw answer's "served, and answered later through Channel.answer_frames" (a group commit).
RAW_ANSWER_LATER = b""


# How often calls made with a callback are checked for an expired deadline (Java's
# NettyRemotingAbstract.scanResponseTable runs once a second; callers here expect finer).
CALLBACK_SWEEP_INTERVAL = 0.05

# Bytes asked of the socket per receive: large enough to take many small frames in one call.
RECEIVE_SIZE = 256 * 1024
# A call is written at once from the calling task while fewer than this many calls are
# pending (lowest latency); with more in flight it is left to the writer task, which joins
# every frame queued meanwhile into one write (fewer syscalls when throughput matters).
DIRECT_WRITE_MAX_PENDING = 4

# A read of at least this many bytes suggests more is waiting: the next read is tried before
# waiting for the socket (after smaller ones the reader waits first).
SPECULATE_BYTES = 64 * 1024
# How often a plain socket's frame deadline is checked at least (seconds; see _watch_deadlines).
WATCH_INTERVAL_MAX = 5.0
WATCH_INTERVAL_MIN = 0.05

# Commands served from one receive before the reader lets other tasks run.
SERVE_BATCH = 32
# Frames of a run the run handler leaves one after another before the rest of the run is
# decoded without it (see Channel._serve_with_run_handler).
LEFT_IN_ROW_MAX = 2
# Answers of a long run of received requests are written once this many bytes have gathered
# (and at the end of the run).
FLUSH_BYTES = 64 * 1024

# Bytes joined into one write at most; bounds the size of one write under heavy load.
MAX_WRITE_BYTES = 1 << 20

# While reading is stopped for another connection's sake (the server's totals over their caps),
# how often this one looks again.
BUDGET_POLL_INTERVAL = 0.05

DEFAULT_LIMITS = ConnectionLimits()

# Linux's receive timestamps (socket(7)): each read's newest segment's arrival, CLOCK_REALTIME.
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_TIMESPEC = struct.Struct("@qq")
_TIMESTAMP_SPACE = socket.CMSG_SPACE(_TIMESPEC.size)


def _describe_error(exc: BaseException) -> str:
    """One line naming an exception (the first of a group), bounded in length."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 300 else text[:300] + "..."


_send_answer_fields = send_answer_fields  # the C module's, or its Python twin


def raw_send_answers(
    channel: Channel, buf: bytes, bounds: list[int], first: int, stop: int
) -> tuple[bytes, int, RemotingCommand | None]:
    """A client connection's run handler (``Channel.raw_run_handler``): the leading frames
    that are a send's plain successful answer (``send_answer_fields``) to a call that takes
    its fields (``on_fields``, a producer's send_async; or ``awaits_fields``,
    Channel.call_frame) are given to their calls without a response command; it stops at the
    first other frame, which the usual path decodes.  Nothing to write: ``(b"", stop at,
    None)``."""
    read = _send_answer_fields
    take = channel.state.calls.take_for_fields
    i = first
    while i < stop:
        fields = read(buf, bounds[2 * i], bounds[2 * i + 1])
        if fields is None:
            break
        call = take(fields[0])
        if call is None:
            break
        i += 1
        if call.on_fields is None:  # a task awaits it (Channel.call_frame)
            call.keep_fields(fields)
            continue
        try:
            call.on_fields(fields)
        except Exception:  # as Call.finish: the reader goes on
            log.exception("a response callback raised")
    return b"", i, None


def own_socket(stream: trio.abc.Stream) -> tuple[trio.abc.Stream, socket.socket | None]:
    """``stream`` re-made around a stdlib socket the caller then holds, for the writes and
    reads that must not wait (a non-blocking ``send`` of answers, a read-ahead), through public
    Trio only: a plain socket stream's socket is detached from its Trio wrapper and wrapped
    again with ``trio.socket.from_stdlib_socket``, keeping the stdlib object.  ``stream`` must
    not be used afterwards.  Any other stream (TLS) is returned as it is, with no socket."""
    if not isinstance(stream, trio.SocketStream):
        return stream, None
    wrapped = stream.socket
    raw = socket.socket(wrapped.family, wrapped.type, wrapped.proto, fileno=wrapped.detach())
    try:
        return trio.SocketStream(trio.socket.from_stdlib_socket(raw)), raw
    except BaseException:
        raw.close()
        raise


def _enable_timestamps(stream: trio.abc.Stream) -> bool:
    """Ask the kernel to stamp what this socket receives (False where it cannot: a TLS stream
    has no socket of its own)."""
    if not isinstance(stream, trio.SocketStream):
        return False
    try:
        stream.socket.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
    except (OSError, AttributeError):
        return False
    return True


def _peer_address(stream: trio.abc.Stream) -> str:
    transport: Any = getattr(stream, "transport_stream", stream)  # a TLS stream's socket one
    try:
        host, port = transport.socket.getpeername()[:2]
    except (OSError, AttributeError):
        return "unknown:0"
    if ":" in host:
        return f"[{host}]:{port}"
    return f"{host}:{port}"


class Channel:
    def __init__(
        self,
        stream: trio.abc.Stream,
        handler: RequestHandler | None = None,
        *,
        idle_timeout: float | None = None,
        limits: ConnectionLimits = DEFAULT_LIMITS,
        budget: SharedBudget | None = None,
        admission: Admission | None = None,
        raw_run_handler: RawRunHandler | None = None,
        inline_handler: InlineHandler | None = None,
        run_hooks: RunHooks | None = None,
    ) -> None:
        self.stream = stream
        # (begin, end) called around each run of frames served together (the broker defers
        # dispatch to the end of a run: see MessageStore.begin_run); None: no hooks.
        self.run_hooks = run_hooks
        # The synchronous ways in, tried in the reader (see _serve_with_run_handler).  The
        # run handler is offered each run of frames: it serves the leading frames it can,
        # from their bytes or decoded (a server's route's ``run``: the sends, the route
        # lookups), their answers joined in the order of the requests (or queued with
        # answer_frames in that order), and returns where it stopped, with that frame
        # decoded if it decoded it.  That frame goes to the inline handler (a server's
        # dispatch_inline: its code's ``inline``), else to a task of its own (or to the
        # call it answers); then the handler is offered the rest.  When it raises (or stops
        # outside the run), the rest of the run is decoded and served from where that call
        # began, so it must change nothing a second serving would not.  Neither: every
        # frame is decoded and served by a task.
        self.raw_run_handler = raw_run_handler
        self.inline_handler = inline_handler
        self.admission = admission
        self._timestamps = admission is not None and _enable_timestamps(stream)
        self._read_at = 0.0  # the admission clock when the last read returned
        # Requests waiting for their task (code, receive stamp), for the water mark (with the
        # rest of the run being served: Connection.backlog).
        self.waiting_tasks: dict[int, tuple[int, float]] = {}
        self.idle_timeout = idle_timeout or None
        self._last_write = trio.current_time()
        self.handler = handler
        # Called on each request this side sends, just before it is encoded (the client's ACL
        # signature, pymq.acl.rpc_hook.AclSigner); None: requests go as they are.
        self.signer: Callable[[RemotingCommand], None] | None = None
        self.remote_address = _peer_address(stream)
        self.closed = False
        self.close_reason: str | None = None
        self.limits = limits
        # The socket-free state: frames in, calls in flight, tasks, output and its marks.
        self.state = Connection(limits, budget)
        self._decoder = self.state.decoder
        self._partial = self.state.partial
        self._sweep_wanted = trio.Event()
        # Frames waiting to be written, in order.  They are written straight from the task that
        # queued them when the socket takes them at once (a call, or the answers to one batch
        # of received requests), and by the writer task otherwise.
        self._out = self.state.out
        self._drained = trio.Event()  # set when the output falls to the low-water mark
        self._writer_wake = trio.Event()
        self._writer_busy = False
        self._batching = False  # the reader is serving a received batch: flush once at its end
        self._cancel_scope = trio.CancelScope()
        self._finished = trio.Event()
        # The plain-socket reader's deadlines (see _reader_raw and _watch_deadlines).
        self._last_read = self._last_write
        self._read_scope = trio.CancelScope()
        self._read_waiting = False
        self._expired = False
        # Last, when nothing else can fail: the non-blocking stdlib socket under a plain
        # stream, for direct writes and the read-ahead (None: a TLS stream, served by the
        # writer task and Trio's receive only).
        self.stream, self._raw = own_socket(stream)

    @property
    def backlog(self) -> int:
        """Requests of the run being served not yet started (Connection.backlog)."""
        return self.state.backlog

    @property
    def backlog_since(self) -> float:
        """When they were received."""
        return self.state.backlog_since

    def __repr__(self) -> str:
        return f"<Channel {self.remote_address}{' closed' if self.closed else ''}>"

    # -- lifecycle ------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve this connection until it ends; always closes the stream.

        This is the connection's boundary: whatever is raised while reading, decoding or serving
        its input (a bug included) ends this connection, with one log line, and nothing else.
        """
        try:
            with self._cancel_scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._writer)
                    nursery.start_soon(self._sweeper)
                    await self._reader(nursery)
                    nursery.cancel_scope.cancel()
        except Exception as exc:
            problem = _describe_error(exc)
            self.close_reason = self.close_reason or f"internal error: {problem}"
            log.error(
                "closing connection from %s after an error: %s",
                self.remote_address,
                problem,
                exc_info=log.isEnabledFor(logging.DEBUG),
            )
        finally:
            self._shutdown(self.close_reason or "closed")
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(self.stream)
            self._finished.set()

    def close(self, reason: str = "closed locally") -> None:
        """Stop this channel; safe to call at any time, from any task."""
        if self.close_reason is None:
            self.close_reason = reason
        self._shutdown(self.close_reason)
        self._cancel_scope.cancel()

    async def wait_closed(self) -> None:
        await self._finished.wait()

    def _shutdown(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self._drained.set()
        self._writer_wake.set()
        self.state.close(
            RemotingConnectError(f"connection to {self.remote_address} closed: {reason}")
        )

    # -- reading --------------------------------------------------------------------------

    def _receive_deadline(self) -> float:
        """When the next receive gives up: the idle timeout, or the deadline of a frame in
        progress, whichever is first."""
        deadline = math.inf
        if self.idle_timeout:
            deadline = trio.current_time() + self.idle_timeout
        if self._partial.started is not None:
            deadline = min(deadline, self._partial.started + self.limits.frame_receive_timeout)
        return deadline

    async def _wait_until_readable(self) -> bool:
        """Hold the reading of requests while this connection's output is above its high-water
        mark (or the server's totals are over their caps); False when the connection must close
        instead (its output stalled past the deadline, or a frame in progress timed out, or
        _watch_deadlines has ended it meanwhile: it has said why)."""
        out = self._out
        if out.should_pause():
            out.paused_since = trio.current_time()
            deadline = out.paused_since + self.limits.write_stall_timeout
            while not out.may_resume():
                if self._expired:
                    return False
                if trio.current_time() >= deadline:
                    self.close_reason = (
                        f"peer not reading: {out.size} bytes of output queued for "
                        f"{self.limits.write_stall_timeout:.0f} s"
                    )
                    log.warning(
                        "closing connection from %s: %s", self.remote_address, self.close_reason
                    )
                    return False
                self._drained = trio.Event()
                with trio.move_on_at(min(deadline, trio.current_time() + BUDGET_POLL_INTERVAL)):
                    await self._drained.wait()
            out.paused_since = None
        partial = self._partial
        while partial.must_wait():
            assert partial.started is not None
            if self._expired:
                return False
            if trio.current_time() >= partial.started + self.limits.frame_receive_timeout:
                return self._frame_timed_out()
            await trio.sleep(BUDGET_POLL_INTERVAL)
        return True

    def _frame_timed_out(self) -> bool:
        self.close_reason = (
            f"frame not completed within {self.limits.frame_receive_timeout:.0f} s "
            f"({self._decoder.buffered} bytes received)"
        )
        log.warning("closing connection from %s: %s", self.remote_address, self.close_reason)
        return False

    async def _receive(self) -> tuple[bytes, float]:
        """Some bytes, and when they were received by the admission check's clock (0.0 without
        one): the time of the read, less the age of its newest segment as the kernel reports
        it, so that bytes that waited in the socket's buffer count their wait."""
        admission = self.admission
        if admission is None or not self._timestamps:
            data = cast(bytes, await self.stream.receive_some(RECEIVE_SIZE))
            if admission is None:
                return data, 0.0
            self._read_at = admission.clock()
            return data, self._read_at
        # Timestamps are only enabled on a plain socket stream (see _enable_timestamps).
        sock = cast(trio.SocketStream, self.stream).socket
        try:
            data, ancillary, _flags, _addr = await sock.recvmsg(RECEIVE_SIZE, _TIMESTAMP_SPACE)
        except OSError as exc:
            raise trio.BrokenResourceError(str(exc)) from exc
        return data, self._stamp(admission, ancillary)

    def _stamp(self, admission: Admission, ancillary: list[tuple[int, int, bytes]]) -> float:
        """When a read's bytes were received: now, less their age in the socket's buffer."""
        received = self._read_at = admission.clock()
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(payload) >= 16:
                seconds, nanoseconds = _TIMESPEC.unpack_from(payload)
                age = time.time() - (seconds + nanoseconds * 1e-9)
                if age > 0:
                    received -= age
        return received

    async def _reader(self, nursery: trio.Nursery) -> None:
        if self._raw is not None:
            nursery.start_soon(self._watch_deadlines)
            await self._reader_raw(nursery, self._raw)
            return
        idle = self.idle_timeout
        out, partial = self._out, self._partial
        while True:
            # The checks first, without a coroutine: reading is held only under pressure.
            if (out.should_pause() or partial.must_wait()) and not (
                await self._wait_until_readable()
            ):
                return
            data = None
            try:
                with trio.move_on_at(self._receive_deadline()):
                    data, received = await self._receive()
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self.close_reason = self.close_reason or f"connection lost: {exc}"
                return
            if data is None:  # nothing read for `idle` seconds, or a frame took too long
                started = self._partial.started
                now = trio.current_time()
                if started is not None and now >= started + self.limits.frame_receive_timeout:
                    self._frame_timed_out()
                    return
                if idle is None or now - self._last_write < idle:
                    continue
                self.close_reason = f"idle for {idle:.0f} s"
                log.info("closing idle connection from %s", self.remote_address)
                return
            if not data:
                self.close_reason = self.close_reason or "peer closed the connection"
                return
            try:
                self.state.receive(data, received, trio.current_time())
                if not await self._serve_inbox(nursery):
                    return
            except ProtocolError as exc:
                self._protocol_error(exc)
                return

    async def _reader_raw(self, nursery: trio.Nursery, raw: socket.socket) -> None:
        """The reader of a plain socket: reads it directly, and waits with no timeout of its
        own (``_watch_deadlines`` ends the wait at the idle or frame deadline), because a
        cancel scope per read cost a sync request a tenth of the broker's time.

        It reads first and waits only when nothing was there (what Trio's receive does) while
        reads come back large, a sign of a backlog; after small reads, the usual
        request-and-answer, it waits first, saving a read that would find nothing."""
        out, partial, state = self._out, self._partial, self.state
        speculate = True
        with self._read_scope:
            while True:
                if (out.should_pause() or partial.must_wait()) and not (
                    await self._wait_until_readable()
                ):
                    return
                if self._expired:
                    return
                try:
                    got = self._recv_raw(raw) if speculate else None
                    if got is not None:  # read without a wait: yield, as Trio's receive does
                        await trio.lowlevel.checkpoint()
                    else:
                        self._read_waiting = True
                        try:
                            await trio.lowlevel.wait_readable(raw)
                        finally:
                            self._read_waiting = False
                        if not self._expired:
                            got = self._recv_raw(raw)
                except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    self.close_reason = self.close_reason or f"connection lost: {exc}"
                    return
                if self._expired:  # the deadline passed while this task was away
                    return
                if got is None:  # woken with nothing to read: wait again
                    speculate = False
                    continue
                data, received = got
                if not data:
                    self.close_reason = self.close_reason or "peer closed the connection"
                    return
                speculate = len(data) >= SPECULATE_BYTES
                now = self._last_read = trio.current_time()
                try:
                    state.receive(data, received, now)
                    if not await self._serve_inbox(nursery):
                        return
                except ProtocolError as exc:
                    self._protocol_error(exc)
                    return

    def _recv_raw(self, raw: socket.socket) -> tuple[bytes, float] | None:
        """One read that does not wait: the bytes and when they were received (as ``_receive``
        gives them), or None when nothing is there; raises OSError when the connection broke."""
        admission = self.admission
        try:
            if self._timestamps:
                assert admission is not None
                data, ancillary, _flags, _addr = raw.recvmsg(RECEIVE_SIZE, _TIMESTAMP_SPACE)
                return data, self._stamp(admission, ancillary)
            data = raw.recv(RECEIVE_SIZE)
        except BlockingIOError:
            return None
        if admission is None:
            return data, 0.0
        self._read_at = admission.clock()
        return data, self._read_at

    async def _watch_deadlines(self) -> None:
        """End a plain socket's connection at its idle deadline (nothing read or written for
        ``idle_timeout``) or when a frame in progress has taken ``frame_receive_timeout``:
        checked when the idle deadline comes and at least every ``WATCH_INTERVAL_MAX`` seconds
        (an eighth of the shorter timeout when that is less, but no more often than
        ``WATCH_INTERVAL_MIN``), so a frame's deadline is noticed that much late at most.
        Only a reader waiting for input is cancelled; a busy one finds ``_expired`` set
        before it reads again."""
        idle = self.idle_timeout
        limit = self.limits.frame_receive_timeout
        interval = min(limit, idle or math.inf) / 8
        interval = min(max(interval, WATCH_INTERVAL_MIN), WATCH_INTERVAL_MAX)
        partial = self._partial
        while True:
            now = trio.current_time()
            started = partial.started
            if started is not None and now >= started + limit:
                self._frame_timed_out()
                break
            wake = now + interval
            if idle is not None:
                idle_deadline = max(self._last_read, self._last_write) + idle
                if now >= idle_deadline:
                    self.close_reason = f"idle for {idle:.0f} s"
                    log.info("closing idle connection from %s", self.remote_address)
                    break
                wake = min(wake, idle_deadline)
            if started is not None:
                wake = min(wake, started + limit)
            await trio.sleep_until(wake)
        self._expired = True
        if self._read_waiting:
            self._read_scope.cancel()

    def _protocol_error(self, exc: ProtocolError) -> None:
        self.close_reason = f"protocol error: {exc}"
        log.warning("closing connection from %s: %s", self.remote_address, exc)

    def _read_ahead(self) -> bool:
        """While serving a long run, take what else has arrived, without waiting (broker
        only): under overload the backlog then waits here, where its age is known and the
        requests too old to serve are refused cheaply, instead of in socket buffers, where
        the broker cannot see it.  False when the peer closed or the connection broke."""
        if self._raw is None or not self.state.may_read_ahead():
            return True
        admission = self.admission
        assert admission is not None
        try:
            data, ancillary, _flags, _addr = self._raw.recvmsg(RECEIVE_SIZE, _TIMESTAMP_SPACE)
        except BlockingIOError:
            return True
        except OSError as exc:
            self.close_reason = self.close_reason or f"connection lost: {exc}"
            return False
        if not data:
            self.close_reason = self.close_reason or "peer closed the connection"
            return False
        # A read like the reader's: it moves the idle deadline on (_watch_deadlines), or a
        # connection read ahead of for longer than the idle timeout would close as idle.
        now = self._last_read = trio.current_time()
        self.state.receive(data, self._stamp(admission, ancillary), now)
        return True

    async def _serve_inbox(self, nursery: trio.Nursery) -> bool:
        """Serve the queued frames, oldest first, in runs of up to SERVE_BATCH, decoding each
        as its turn comes; False when the connection must close.  Raises ProtocolError for a
        frame that does not decode (those before it are served)."""
        state, admission = self.state, self.admission
        first = True
        served = False  # the last run served (decoded) something
        behind = False  # the last run waited long enough to read ahead
        while state.inbox:
            if served:
                # A long run of inline work yields now and then, so that the rest of the
                # broker (the group commit waiting on its sync, dispatch, other
                # connections) is not held up behind one big receive.  Runs refused whole
                # by fast failure cost next to nothing and go on without a pause: under
                # overload a yield and a read per 32 refusals cost more than the refusals.
                await trio.lowlevel.checkpoint()
                if self._out.should_pause() and not await self._wait_until_readable():
                    return False
                if behind and not self._read_ahead():
                    return False
            run = state.next_run(SERVE_BATCH)
            assert run is not None
            shed = None
            if admission is not None:  # Connection.judge of the run, its wait off the clock:
                # the first run starts as the read ends; later ones read the clock again.
                waited = (self._read_at if first else admission.clock()) - run.received
                shed, behind = state.judge(run, waited, admission)
            first = False
            served = self._serve_run(run, shed, nursery)
        state.backlog = 0
        if self._decoder.broken is not None:
            raise self._decoder.broken
        return True

    def _serve_run(self, run: Run, shed: Shedding | None, nursery: trio.Nursery) -> bool:
        """Serve one run of frames between the run hooks: refused by fast failure, answered
        by the run handler, or decoded and dispatched; whether any was served (not refused).
        Its answers go out in one write.  Raises ProtocolError for a frame that does not
        decode, after serving the ones before it."""
        hooks = self.run_hooks
        if hooks is not None:
            hooks[0]()
        try:
            self._batching = True
            try:
                first_served = run.first
                if shed is not None:
                    first_served = shed.refuse_run(
                        run.buf, run.bounds, run.first, run.stop, self._out
                    )
                served = first_served < run.stop
                if self.raw_run_handler is not None or self.inline_handler is not None:
                    broken = self._serve_with_run_handler(run, first_served, shed, nursery)
                else:
                    cmds, broken = self._decode_run(run, first_served, shed)
                    self._dispatch(cmds, run.received, nursery)
            finally:
                self._batching = False
                if shed is not None:
                    shed.report()
            if self._out and (
                served or broken or not self.state.inbox or self._out.size >= FLUSH_BYTES
            ):
                # The answers of a run served in one write, so that a pipelining client keeps
                # its window moving; the refusals of runs refused whole gather until there are
                # many or the input ends (a write per 32 refusals made the writes a tenth of an
                # overloaded broker's time).
                self._flush_direct()
            if broken is not None:
                raise broken
            return served
        finally:
            if hooks is not None:
                hooks[1]()

    def _serve_with_run_handler(
        self, run: Run, first: int, shed: Shedding | None, nursery: trio.Nursery
    ) -> ProtocolError | None:
        """The run from frame ``first`` served in the reader where it can be: offered to the
        run handler, which serves the leading frames it can; a frame it leaves is decoded
        (unless it decoded it), given to the inline handler, and else dispatched (a response
        to its call, a request to a task).  Then the handler is offered the next frame alone,
        the rest once it serves one; after LEFT_IN_ROW_MAX frames in a row it leaves, the
        rest of the run is decoded and served without it (answers keep the requests'
        order).  While fast failure judges the run, each frame
        after ``first`` (judged already) is judged first, and one it does not refuse is
        offered alone.  When the handler fails (a bug there), the rest of the run is decoded
        and served as usual from where that call began.  The error of a frame that does not
        decode, or None."""
        buf, bounds, stop = run.buf, run.bounds, run.stop
        handler, inline = self.raw_run_handler, self.inline_handler
        i = first
        # After a frame the handler left, the next is offered alone, the rest once the
        # handler serves one: frames it leaves one after another are not read again to the
        # run's end (the sends' run reader reads the leading sends before the store judges
        # them).  After LEFT_IN_ROW_MAX in a row (a transaction's half and its
        # END_TRANSACTION, say) the rest of the run is decoded without offering each frame.
        alone = shed is not None
        left_in_row = 0
        while i < stop:
            if (
                shed is not None
                and i != first
                and shed.refuse(buf, bounds[2 * i], bounds[2 * i + 1], i, self._out)
            ):
                i += 1
                continue
            cmd = None
            if handler is not None and left_in_row < LEFT_IN_ROW_MAX:
                end = i + 1 if alone else stop
                try:
                    joined, left, cmd = handler(self, buf, bounds, i, end)
                    if not i <= left <= end or (cmd is not None and left == end):
                        raise ValueError(f"stopped at frame {left} of {end}")
                except Exception:  # the frames are served as usual, which it must allow
                    log.exception("raw run handler failed; frames decoded instead")
                    handler = cmd = None
                else:
                    if joined and not self.closed:
                        self._out.append(joined)
                    left_in_row = left_in_row + 1 if left == i else 0
                    i = left
                    if i >= end:  # it served every frame offered: the rest, next
                        alone = shed is not None
                        continue
            alone = True
            if cmd is None:
                try:
                    cmd = decode_frame_at(buf, bounds[2 * i], bounds[2 * i + 1])
                except ProtocolError as exc:
                    return exc
            if (
                inline is None
                or cmd.flag & RPC_TYPE_RESPONSE
                or cmd.header_error is not None
                or not self.serve_inline(inline, cmd)
            ):
                self._dispatch((cmd,), run.received, nursery)
            i += 1
        return None

    def _decode_run(
        self, run: Run, start_at: int, shed: Shedding | None
    ) -> tuple[list[RemotingCommand], ProtocolError | None]:
        """The run's frames from ``start_at`` decoded together, while the read's bytes are
        still in the CPU's caches (serving each in between evicted them: decoding frame by
        frame cost a tenth of a send), less those fast failure refuses (but ``start_at``,
        which it has judged already); and the error of a frame that does not decode (it ends
        the connection after the ones before it are served)."""
        buf, bounds = run.buf, run.bounds
        out = self._out
        cmds: list[RemotingCommand] = []
        try:
            for i in range(start_at, run.stop):
                start, end = bounds[2 * i], bounds[2 * i + 1]
                if shed is not None and i != start_at and shed.refuse(buf, start, end, i, out):
                    continue
                cmds.append(decode_frame_at(buf, start, end))
        except ProtocolError as exc:
            return cmds, exc
        return cmds, None

    def _dispatch(
        self, cmds: Sequence[RemotingCommand], received: float, nursery: trio.Nursery
    ) -> None:
        """Each decoded command where Connection.place puts it: a response to the call
        awaiting it, a request refused (a bad header, or OVERLOAD past the connection's cap),
        the rest to a task each."""
        place = self.state.place
        for cmd in cmds:
            refusal = place(cmd)
            if refusal is TASK:
                if self.admission is not None:
                    self.waiting_tasks[id(cmd)] = (cmd.code, received)
                nursery.start_soon(self._serve, cmd, received)
            elif refusal is not None:
                self._refuse(cmd, *refusal)

    def _refuse(self, request: RemotingCommand, code: int, remark: str) -> None:
        log.debug(
            "refusing %s from %s: %s", request_name(request.code), self.remote_address, remark
        )
        self.answer(request, request.response(code, remark))

    async def _sweeper(self) -> None:
        """Fail callback-style calls whose deadline passed (awaited calls time out by
        themselves)."""
        calls = self.state.calls
        while True:
            if not calls.timed:  # sleep for good while no such call is pending
                await self._sweep_wanted.wait()
                self._sweep_wanted = trio.Event()
            await trio.sleep(CALLBACK_SWEEP_INTERVAL)
            calls.expire(trio.current_time(), self._no_answer)

    def _no_answer(self, call: Call) -> Exception:
        return RemotingTimeoutError(
            f"{request_name(call.code)} to {self.remote_address}: no response in time"
        )

    def serve_inline(self, inline: InlineHandler, request: RemotingCommand) -> bool:
        """Serve ``request`` now, in the reader, if ``inline`` can (no task, no wait): its
        answer written in turn with the run's; else False (nothing answered)."""
        try:
            response = inline(self, request)
        except RemotingCommandError as exc:
            response = request.response(ResponseCode.SYSTEM_ERROR, str(exc))
        except Exception as exc:
            name = request_name(request.code)
            log.exception("error serving %s from %s", name, self.remote_address)
            problem = f"{type(exc).__name__}: {exc}"
            response = request.response(ResponseCode.SYSTEM_ERROR, problem)
        else:
            if response is None:
                return False
            if response is ANSWER_LATER:
                return True
        self.answer(request, response)
        return True

    async def _serve(self, request: RemotingCommand, received: float = 0.0) -> None:
        try:
            await self._serve_task(request, received)
        finally:
            self.state.task_done()

    async def _serve_task(self, request: RemotingCommand, received: float) -> None:
        admission = self.admission
        if admission is not None:
            self.waiting_tasks.pop(id(request), None)  # its turn came: the wait is over
            waited = admission.clock() - received
            if waited > admission.min_wait or received <= admission.busy_mark:
                refusal = admission.shed(
                    self, request, received, waited, len(self.waiting_tasks) + 1
                )
                if refusal is not None:
                    self.answer(request, refusal)
                    return
        if self.handler is None:
            response: RemotingCommand | None = request.response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                f"request type {request.code} not supported",
            )
        else:
            try:
                response = await self.handler(self, request)
            except RemotingCommandError as exc:
                response = request.response(ResponseCode.SYSTEM_ERROR, str(exc))
            except Exception as exc:
                log.exception(
                    "error serving %s from %s", request_name(request.code), self.remote_address
                )
                response = request.response(
                    ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}"
                )
        self.answer(request, response)

    def answer(self, request: RemotingCommand, response: RemotingCommand | bytes | None) -> None:
        """Answer ``request`` (nothing for a oneway one); dropped if the channel has closed.
        ``response`` is a command, or the whole answer frame already encoded for this request
        (its opaque and serialize type; see codec.json_response_frame)."""
        if response is None or request.flag & RPC_ONEWAY:
            return
        if type(response) is bytes:
            try:
                self._write(response)
            except RemotingSendError:
                log.debug("dropping the answer to %s: %s closed", request.opaque, self)
            return
        assert isinstance(response, RemotingCommand)
        response.opaque = request.opaque
        response.flag |= RPC_TYPE_RESPONSE
        response.serialize_type = request.serialize_type
        try:
            frame = encode(response)
        except Exception as exc:  # a processor built an answer that cannot be written
            log.exception("cannot encode the answer to %s", request_name(request.code))
            frame = encode(request.response(ResponseCode.SYSTEM_ERROR, _describe_error(exc)))
        try:
            self._write(frame)
        except RemotingSendError:
            log.debug("dropping the answer to %s: %s closed", request.opaque, self)

    def answer_frames(self, frames: list[bytes]) -> None:
        """Write whole answer frames to requests a raw handler took (RAW_ANSWER_LATER; the
        group commit's answers to this connection; an item may hold several frames back to
        back), with one wake of the writer; dropped if the channel has closed (its output is
        gone, and counting them would hold the server's write budget for good)."""
        if self.closed:
            log.debug("dropping %d writes of held answers: %s closed", len(frames), self)
            return
        out = self._out
        for frame in frames:
            out.append(frame)
        if not self._batching:
            self._writer_wake.set()

    # -- writing --------------------------------------------------------------------------

    def _write(self, frame: bytes, *, now: bool = False) -> None:
        """Queue ``frame``; ``now`` tries to write it from this task at once."""
        if self.closed:
            raise RemotingSendError(f"connection to {self.remote_address} is closed")
        self._out.append(frame)
        if self._batching:
            return  # the reader writes the batch's answers together when it is done
        if now:
            self._flush_direct()
        else:
            self._writer_wake.set()

    def _flush_direct(self) -> None:
        """Write what is queued with one non-blocking send if the writer is idle; whatever the
        socket does not take at once (or any error) is left to the writer task."""
        raw = self._raw
        if raw is None or self._writer_busy or self.closed:
            self._writer_wake.set()
            return
        data = self._out.take()
        try:
            sent = raw.send(data)
        except OSError:  # would block, or broken: the writer retries and reports
            sent = 0
        if sent < len(data):
            self._out.push_front(data[sent:])
            self._writer_wake.set()
        else:
            self._last_write = trio.current_time()
            self._drained.set()

    async def _writer(self) -> None:
        try:
            while True:
                if not self._out:
                    await self._writer_wake.wait()
                    self._writer_wake = trio.Event()
                    if self.closed:
                        return
                    continue
                data = self._out.take(MAX_WRITE_BYTES)
                self._writer_busy = True
                try:
                    await self.stream.send_all(data)
                finally:
                    self._writer_busy = False
                self._last_write = trio.current_time()
                if self._out.size <= self._out.low:
                    self._drained.set()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.close_reason = self.close_reason or f"write failed: {exc}"
            self._cancel_scope.cancel()

    async def send(self, cmd: RemotingCommand) -> None:
        """Queue one command (request or response) for writing as it is."""
        self._write(encode(cmd))

    # -- calling the peer -----------------------------------------------------------------

    async def invoke(self, request: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send ``request`` and wait for its response (matched by opaque) up to ``timeout`` s."""
        if self.closed:
            raise RemotingConnectError(f"connection to {self.remote_address} is closed")
        request.opaque = next_opaque()
        request.flag &= ~(RPC_TYPE_RESPONSE | RPC_ONEWAY)
        if self.signer is not None:
            self.signer(request)
        done = trio.Event()
        call = Call(wake=done.set)
        calls = self.state.calls
        calls.add(request.opaque, call)
        try:
            self._write(encode(request), now=len(calls) <= DIRECT_WRITE_MAX_PENDING)
            with trio.move_on_after(timeout):
                await done.wait()
            if call.error is not None:
                raise call.error
            if call.response is None:
                raise RemotingTimeoutError(
                    f"{request_name(request.code)} to {self.remote_address}: "
                    f"no response within {timeout * 1000:.0f} ms"
                )
            return call.response
        finally:
            calls.drop(request.opaque)

    def invoke_callback(
        self, request: RemotingCommand, timeout: float, callback: ResponseCallback
    ) -> None:
        """Send ``request`` now and return; ``callback`` gets the response, or the error (closed
        connection, or no answer within ``timeout`` s, checked every
        ``CALLBACK_SWEEP_INTERVAL``).  It runs in this channel's reader: it must not block.

        No task waits per call, so many calls in flight cost little (an async send).
        """
        if self.closed:
            raise RemotingConnectError(f"connection to {self.remote_address} is closed")
        request.opaque = opaque = next_opaque()
        request.flag &= ~(RPC_TYPE_RESPONSE | RPC_ONEWAY)
        if self.signer is not None:
            self.signer(request)
        self._call_with_frame(opaque, encode(request), request.code, timeout, callback)

    def invoke_callback_frame(
        self,
        opaque: int,
        frame: bytes,
        code: int,
        timeout: float,
        callback: ResponseCallback,
        on_fields: Callable[[tuple], None] | None = None,
    ) -> None:
        """:meth:`invoke_callback` for a request already written as its whole ``frame``, with
        ``opaque`` (from ``codec.next_opaque``) in it: a producer's common send, without the
        request command.  On a channel that signs (``signer``), the frame must be signed as it
        signs (Producer._v2_frame with its AclSigner).  With
        ``on_fields``, a plain successful send answer is given to it as
        ``_recordc.send_answer_fields`` reads it (when the channel's raw handler is
        :func:`raw_send_answers`), anything else to ``callback``."""
        if self.closed:
            raise RemotingConnectError(f"connection to {self.remote_address} is closed")
        self._call_with_frame(opaque, frame, code, timeout, callback, on_fields)

    async def call_frame(
        self, opaque: int, frame: bytes, code: int, timeout: float
    ) -> RemotingCommand | tuple:
        """Write a request already made as its whole ``frame`` (with ``opaque`` from
        ``codec.next_opaque`` in it) and wait for the answer: a plain successful send answer's
        fields as ``_recordc.send_answer_fields`` reads them (when the channel's raw handler is
        :func:`raw_send_answers`), or the response command.  A producer's awaited send, without
        the request command, the response command or a cancel scope per call: the channel's
        sweep fails it once ``timeout`` has passed (within ``CALLBACK_SWEEP_INTERVAL``), with
        RemotingTimeoutError.  On a channel that signs, the frame must be signed as it signs."""
        if self.closed:
            raise RemotingConnectError(f"connection to {self.remote_address} is closed")
        done = trio.Event()
        call = Call(
            wake=done.set, deadline=trio.current_time() + timeout, code=code, awaits_fields=True
        )
        calls = self.state.calls
        calls.add(opaque, call)
        if calls.timed == 1:
            self._sweep_wanted.set()
        try:
            self._write(frame, now=len(calls) <= DIRECT_WRITE_MAX_PENDING)
            await done.wait()
        finally:
            calls.drop(opaque)  # answered, failed or cancelled: no longer waited for
        if call.fields is not None:
            return call.fields
        if call.error is not None:
            raise call.error
        assert call.response is not None
        return call.response

    def _call_with_frame(
        self,
        opaque: int,
        frame: bytes,
        code: int,
        timeout: float,
        callback: ResponseCallback,
        on_fields: Callable[[tuple], None] | None = None,
    ) -> None:
        """Write a request's frame and wait for its answer through ``callback``."""
        calls = self.state.calls
        self._write(frame, now=len(calls) < DIRECT_WRITE_MAX_PENDING)
        calls.add(
            opaque,
            Call(
                callback=callback,
                deadline=trio.current_time() + timeout,
                code=code,
                on_fields=on_fields,
            ),
        )
        if calls.timed == 1:
            self._sweep_wanted.set()

    async def invoke_oneway(self, request: RemotingCommand) -> None:
        """Send ``request`` with the oneway flag; no answer is expected or awaited."""
        request.opaque = next_opaque()
        request.flag = (request.flag & ~RPC_TYPE_RESPONSE) | RPC_ONEWAY
        if self.signer is not None:
            self.signer(request)
        self._write(encode(request))
