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
from collections.abc import Awaitable, Callable
from typing import Protocol

import attrs
import trio

from pymq.remoting.codec import (
    RPC_ONEWAY,
    RPC_TYPE_RESPONSE,
    FrameDecoder,
    RemotingCommand,
    encode,
    next_opaque,
)
from pymq.remoting.codes import ResponseCode, request_name
from pymq.remoting.errors import (
    ProtocolError,
    RemotingCommandError,
    RemotingConnectError,
    RemotingSendError,
    RemotingTimeoutError,
)
from pymq.remoting.limits import (
    ConnectionLimits,
    OutputBuffer,
    PartialFrameTracker,
    SharedBudget,
)

log = logging.getLogger(__name__)

RequestHandler = Callable[["Channel", RemotingCommand], Awaitable[RemotingCommand | None]]
# Answers a request at once, inside the reader, or returns None to have it served by a task,
# or ANSWER_LATER when it has arranged to call Channel.answer itself (a group commit).
InlineHandler = Callable[["Channel", RemotingCommand], RemotingCommand | None]
ANSWER_LATER = RemotingCommand(code=-1)


class Admission(Protocol):
    """A check made before a request is served (the broker's fast failure).

    The channel stamps each receive with ``clock()``; a request's wait is the time from then to
    when it is started.  ``shed`` is called only for requests that waited longer than
    ``min_wait`` s or were received at or before ``busy_mark``; it returns the answer to give
    instead of serving the request, or None."""

    clock: Callable[[], float]

    @property
    def min_wait(self) -> float: ...

    @property
    def busy_mark(self) -> float: ...

    def shed(
        self,
        channel: Channel,
        request: RemotingCommand,
        received: float,
        waited: float,
        queued: int,
    ) -> RemotingCommand | None: ...


# Answer to a callback-style call: (response, None) or (None, error).
ResponseCallback = Callable[[RemotingCommand | None, Exception | None], None]

# How often calls made with a callback are checked for an expired deadline (Java's
# NettyRemotingAbstract.scanResponseTable runs once a second; callers here expect finer).
CALLBACK_SWEEP_INTERVAL = 0.05

# Bytes asked of the socket per receive: large enough to take many small frames in one call.
RECEIVE_SIZE = 256 * 1024
# A call is written at once from the calling task while fewer than this many calls are
# pending (lowest latency); with more in flight it is left to the writer task, which joins
# every frame queued meanwhile into one write (fewer syscalls when throughput matters).
DIRECT_WRITE_MAX_PENDING = 4

# Commands served from one receive before the reader lets other tasks run.
SERVE_BATCH = 32

# Bytes joined into one write at most; bounds the size of one write under heavy load.
MAX_WRITE_BYTES = 1 << 20

# While reading is stopped for another connection's sake (the server's totals over their caps),
# how often this one looks again.
BUDGET_POLL_INTERVAL = 0.05

# RocketMQ's answer when a request cannot be queued for its executor (NettyRemotingAbstract).
OVERLOAD_REMARK = "[OVERLOAD]system busy, start flow control for a while"

DEFAULT_LIMITS = ConnectionLimits()


@attrs.define(slots=True)
class _Pending:
    event: trio.Event | None = None
    response: RemotingCommand | None = None
    error: Exception | None = None
    callback: ResponseCallback | None = None
    deadline: float = math.inf
    code: int = 0

    def finish(self, response: RemotingCommand | None, error: Exception | None) -> None:
        if self.callback is not None:
            try:
                self.callback(response, error)
            except Exception:
                log.exception("a response callback raised")
            return
        self.response, self.error = response, error
        assert self.event is not None
        self.event.set()


def _describe_error(exc: BaseException) -> str:
    """One line naming an exception (the first of a group), bounded in length."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 300 else text[:300] + "..."


def _peer_address(stream: trio.SocketStream) -> str:
    try:
        host, port = stream.socket.getpeername()[:2]
    except OSError:
        return "unknown:0"
    if ":" in host:
        return f"[{host}]:{port}"
    return f"{host}:{port}"


class Channel:
    def __init__(
        self,
        stream: trio.SocketStream,
        handler: RequestHandler | None = None,
        *,
        max_frame_length: int | None = None,
        idle_timeout: float | None = None,
        inline_handler: InlineHandler | None = None,
        limits: ConnectionLimits = DEFAULT_LIMITS,
        budget: SharedBudget | None = None,
        admission: Admission | None = None,
    ) -> None:
        self.stream = stream
        self.admission = admission
        # Requests received and not yet started (for the water mark): the rest of the run being
        # served and its receive stamp, and those waiting for their task (code, stamp).
        self.backlog = 0
        self.backlog_since = 0.0
        self.waiting_tasks: dict[int, tuple[int, float]] = {}
        self.inline_handler = inline_handler
        self.idle_timeout = idle_timeout or None
        self._last_write = trio.current_time()
        self.handler = handler
        self.remote_address = _peer_address(stream)
        self.closed = False
        self.close_reason: str | None = None
        self.limits = limits
        self._decoder = FrameDecoder(max_frame_length or limits.max_frame_length)
        self._partial = PartialFrameTracker(budget)
        self._tasks = 0  # requests being served by a task of their own
        self._pending: dict[int, _Pending] = {}
        self._callbacks = 0  # pending calls that answer through a callback
        self._sweep_wanted = trio.Event()
        # Frames waiting to be written, in order.  They are written straight from the task that
        # queued them when the socket takes them at once (a call, or the answers to one batch
        # of received requests), and by the writer task otherwise.
        self._out = OutputBuffer(limits, budget)
        self._drained = trio.Event()  # set when the output falls to the low-water mark
        self._writer_wake = trio.Event()
        self._writer_busy = False
        self._batching = False  # the reader is serving a received batch: flush once at its end
        # The non-blocking stdlib socket under trio's, for those direct writes (None: writer only).
        self._raw = getattr(getattr(stream, "socket", None), "_sock", None)
        self._cancel_scope = trio.CancelScope()
        self._finished = trio.Event()

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
        self._out.clear()
        self._partial.release()
        self._drained.set()
        self._writer_wake.set()
        error = RemotingConnectError(f"connection to {self.remote_address} closed: {reason}")
        pendings = list(self._pending.values())
        self._pending.clear()
        self._callbacks = 0
        for pending in pendings:
            pending.finish(None, error)

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
        instead (its output stalled past the deadline, or a frame in progress timed out)."""
        out = self._out
        if out.should_pause():
            out.paused_since = trio.current_time()
            deadline = out.paused_since + self.limits.write_stall_timeout
            while not out.may_resume():
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

    async def _reader(self, nursery: trio.Nursery) -> None:
        idle = self.idle_timeout
        while True:
            if not await self._wait_until_readable():
                return
            data = None
            try:
                with trio.move_on_at(self._receive_deadline()):
                    data = await self.stream.receive_some(RECEIVE_SIZE)
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
                commands = self._decoder.feed(data)
            except ProtocolError as exc:
                self.close_reason = f"protocol error: {exc}"
                log.warning("closing connection from %s: %s", self.remote_address, exc)
                return
            self._partial.update(self._decoder.buffered, trio.current_time())
            if not await self._dispatch(nursery, commands):
                return

    async def _dispatch(self, nursery: trio.Nursery, commands: list[RemotingCommand]) -> bool:
        """Serve what one receive brought; False when the connection must close."""
        inline = self.inline_handler
        admission = self.admission
        received = admission.clock() if admission is not None else 0.0
        waited = 0.0
        for start in range(0, len(commands), SERVE_BATCH):
            if start:
                # A long run of inline work yields now and then, so that the rest of the
                # broker (the group commit waiting on its sync, dispatch, other
                # connections) is not held up behind one big receive.
                await trio.lowlevel.checkpoint()
                if self._out.should_pause() and not await self._wait_until_readable():
                    return False
            shed = None
            if admission is not None:  # fast failure: one check per run, not per request
                waited = admission.clock() - received if start else 0.0
                self.backlog, self.backlog_since = len(commands) - start, received
                if waited > admission.min_wait or received <= admission.busy_mark:
                    shed = admission.shed
            self._batching = True
            try:
                for i, cmd in enumerate(commands[start : start + SERVE_BATCH], start):
                    if cmd.flag & RPC_TYPE_RESPONSE:
                        self._on_response(cmd)
                    elif cmd.header_error is not None:
                        self._refuse(cmd, ResponseCode.SYSTEM_ERROR, cmd.header_error)
                    elif shed is not None and (
                        refusal := shed(self, cmd, received, waited, len(commands) - i)
                    ):
                        self.answer(cmd, refusal)
                    elif inline is None or not self._serve_inline(inline, cmd):
                        if self._tasks >= self.limits.max_pending_requests:
                            self._refuse(cmd, ResponseCode.SYSTEM_BUSY, OVERLOAD_REMARK)
                            continue
                        self._tasks += 1
                        if admission is not None:
                            self.waiting_tasks[id(cmd)] = (cmd.code, received)
                        nursery.start_soon(self._serve, cmd, received)
            finally:
                self._batching = False
            if self._out:
                self._flush_direct()  # the inline answers of this run in one write
        self.backlog = 0
        return True

    def _refuse(self, request: RemotingCommand, code: int, remark: str) -> None:
        log.debug(
            "refusing %s from %s: %s", request_name(request.code), self.remote_address, remark
        )
        self.answer(request, request.response(code, remark))

    def _on_response(self, cmd: RemotingCommand) -> None:
        pending = self._pending.pop(cmd.opaque, None)
        if pending is None:
            log.debug("response for unknown opaque %d from %s", cmd.opaque, self.remote_address)
            return
        if pending.callback is not None:
            self._callbacks -= 1
        pending.finish(cmd, None)

    async def _sweeper(self) -> None:
        """Fail callback-style calls whose deadline passed (awaited calls time out by
        themselves)."""
        while True:
            if not self._callbacks:  # sleep for good while no such call is pending
                await self._sweep_wanted.wait()
                self._sweep_wanted = trio.Event()
            await trio.sleep(CALLBACK_SWEEP_INTERVAL)
            now = trio.current_time()
            expired = [
                (opaque, p)
                for opaque, p in self._pending.items()
                if p.callback is not None and p.deadline <= now
            ]
            for opaque, pending in expired:
                if self._pending.pop(opaque, None) is None:
                    continue  # an earlier callback closed the channel: already answered
                self._callbacks -= 1
                pending.finish(
                    None,
                    RemotingTimeoutError(
                        f"{request_name(pending.code)} to {self.remote_address}: no response "
                        "in time"
                    ),
                )

    def _serve_inline(self, inline: InlineHandler, request: RemotingCommand) -> bool:
        """Serve ``request`` now if the inline handler can (no task, no wait); else False."""
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
            self._tasks -= 1

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

    def answer(self, request: RemotingCommand, response: RemotingCommand | None) -> None:
        """Answer ``request`` (nothing for a oneway one); dropped if the channel has closed."""
        if response is None or request.flag & RPC_ONEWAY:
            return
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
        pending = _Pending(trio.Event())
        self._pending[request.opaque] = pending
        try:
            self._write(encode(request), now=len(self._pending) <= DIRECT_WRITE_MAX_PENDING)
            with trio.move_on_after(timeout):
                await pending.event.wait()  # type: ignore[union-attr]
            if pending.error is not None:
                raise pending.error
            if pending.response is None:
                raise RemotingTimeoutError(
                    f"{request_name(request.code)} to {self.remote_address}: "
                    f"no response within {timeout * 1000:.0f} ms"
                )
            return pending.response
        finally:
            self._pending.pop(request.opaque, None)

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
        self._write(encode(request), now=len(self._pending) < DIRECT_WRITE_MAX_PENDING)
        self._pending[opaque] = _Pending(
            callback=callback, deadline=trio.current_time() + timeout, code=request.code
        )
        self._callbacks += 1
        if self._callbacks == 1:
            self._sweep_wanted.set()

    async def invoke_oneway(self, request: RemotingCommand) -> None:
        """Send ``request`` with the oneway flag; no answer is expected or awaited."""
        request.opaque = next_opaque()
        request.flag = (request.flag & ~RPC_TYPE_RESPONSE) | RPC_ONEWAY
        self._write(encode(request))
