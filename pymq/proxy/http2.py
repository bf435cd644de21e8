"""A gRPC server on Trio: HTTP/2 by pymq's sans-IO :class:`~pymq.proxy.h2server.H2Server`,
gRPC's message framing here.

One :class:`GrpcServer` listens; each connection is a task in its nursery, and its calls (HTTP/2
streams) are served in the connection's nursery, so that the whole server lives in the broker's
nursery tree and stops with it.  A call is served by the handler its ``:path`` names
(``/package.Service/Method``); a path without one is answered ``UNIMPLEMENTED`` at once, in
the response headers alone (gRPC's trailers-only form), never left waiting.

A call costs no task of its own unless it waits.  The connection's reader starts the calls a
read brought once that read's frames are taken in (a unary request has usually arrived whole
by then), one after the other, in the reader itself; a call that completes without waiting
(a send to a topic that exists, an ack: nearly all) has only queued its answer, and the
reader writes the answers of all those calls in one send.  The first call that waits (a long
poll, a request not yet whole, a flow-control window, a durable put) keeps the reader's task,
which goes on serving that call alone, and a new reader task takes over the connection where
it stopped.  So the one handler of each method is the path, whether it waits or not.  (The
calls a reader serves share its context: pymq sets no context variables in them.)

Bounds (:class:`GrpcLimits`; the broker fills them from its remoting keys, see
:func:`pymq.proxy.limits_for`):

- connections: ``max_connections``; past it a new connection is closed at once;
- streams per connection: ``max_concurrent_streams``, advertised in SETTINGS
  (``SETTINGS_MAX_CONCURRENT_STREAMS``); a client opening more breaks the protocol and its
  connection is closed with GOAWAY (reset ``REFUSED_STREAM`` while it has not acknowledged
  the server's SETTINGS); and calls in progress across all connections:
  ``max_calls``, past which a new stream is reset ``REFUSED_STREAM`` (a client may retry it);
- one request message: ``max_message_size`` bytes (the gRPC length prefix is checked before the
  bytes arrive); a bigger one fails its call with ``RESOURCE_EXHAUSTED`` and resets the stream;
- request bytes received and not yet served, across every connection sharing the ``budget``
  (the remoting servers' :class:`~pymq.remoting.limits.SharedBudget`): past the cap a call that
  is still receiving fails with ``RESOURCE_EXHAUSTED``;
- messages queued on a streaming call and not yet read by its handler: ``max_queued_messages``;
- a unary or server-streaming call's request: one message (:meth:`Call.receive`'s ``last``);
  what the client sends after it is dropped as it arrives, not held until the call ends;
- a request's header block: ``max_header_list_size`` (SETTINGS_MAX_HEADER_LIST_SIZE, counted
  as HPACK counts it) decoded, ``4 * max_header_list_size + 1024`` bytes compressed; past
  either the connection is closed (GOAWAY ENHANCE_YOUR_CALM: its HPACK state is lost);
- a TLS handshake (``tls.server.mode`` permissive or enforcing, as on the remoting ports):
  its timeout, and the connections in one count against ``max_connections``;
- time: a unary request must arrive whole within ``receive_timeout`` and a streamed message
  once begun likewise (``DEADLINE_EXCEEDED``); output the peer does not read within
  ``write_stall_timeout`` (its flow-control window stays shut, or the socket does not drain)
  closes the connection; a connection without streams that sends nothing for ``idle_timeout``
  is closed.

Output is never queued beyond what HTTP/2 flow control lets the peer have: a call's task waits
for the window, and the socket is written by one task at a time, so a peer that stops reading
holds at most one response per call, then loses its connection.  Malformed HTTP/2 closes that
connection (GOAWAY with the error's code) or, where the error is one stream's (a malformed
request header block, RFC 9113 8.1.1), resets that stream; a malformed message fails that call
only.  Compressed
messages (``grpc-encoding``) are refused with ``UNIMPLEMENTED``: the 5.x clients send none; a
message flagged compressed in a call without ``grpc-encoding`` fails it ``INTERNAL`` (as
grpc-java and grpc-go answer it).
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import math
import operator
import struct
import types
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping
from typing import Any, cast

import attrs
import hpack
import trio

from pymq.proxy.h2server import (
    ConnectionTerminated,
    DataReceived,
    ErrorCode,
    H2ConnectionError,
    H2Server,
    RequestReceived,
    StreamClosedError,
    StreamReset,
    WindowOpened,
)
from pymq.remoting.channel import own_socket
from pymq.remoting.limits import SharedBudget
from pymq.remoting.listener import ListeningServer
from pymq.remoting.tls import TlsServer

log = logging.getLogger(__name__)

# gRPC status codes (grpc/doc/statuscodes.md).
OK = 0
CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
RESOURCE_EXHAUSTED = 8
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14

_PREFIX = struct.Struct(">BI")  # gRPC message prefix: compressed flag, length
READ_SIZE = 65536
MIB = 1 << 20


@attrs.frozen
class GrpcLimits:
    """The bounds of one gRPC server (see the module docstring); the defaults are documented."""

    max_connections: int = 10000
    max_concurrent_streams: int = 100
    # Calls being served across every connection; past it a new stream is reset
    # REFUSED_STREAM (which a client may retry).
    max_calls: int = 10000
    max_message_size: int = 4 * MIB + 64 * 1024
    max_queued_messages: int = 16
    receive_timeout: float = 60.0
    write_stall_timeout: float = 30.0
    idle_timeout: float = 120.0
    # HTTP/2 SETTINGS: the header block a request may carry, and the flow-control window
    # granted per stream (the connection's is raised to match).
    max_header_list_size: int = 16 * 1024
    initial_window_size: int = 1 * MIB


class GrpcError(Exception):
    """Ends a call with gRPC ``status`` and ``message`` (raised by handlers)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def encode_grpc_message(text: str) -> str:
    """``grpc-message`` percent-encoded as the gRPC HTTP/2 spec asks (printable ASCII but %)."""
    out = []
    for byte in text.encode("utf-8"):
        if 0x20 <= byte <= 0x7E and byte != 0x25:
            out.append(chr(byte))
        else:
            out.append(f"%{byte:02X}")
    return "".join(out)


class Call:
    """One gRPC call (an HTTP/2 stream): its metadata, its request messages, its responses."""

    def __init__(self, conn: _Connection, stream_id: int, path: str, metadata: dict[str, str]):
        self._conn = conn
        self.stream_id = stream_id
        self.path = path
        self.metadata = metadata
        self.peer = conn.peer
        self._partial = bytearray()
        self._partial_since: float | None = None
        self._inbox: deque[bytes] = deque()
        # Set when a message, the end or a failure arrives; made only when a handler waits
        # (most calls find their request whole and never do).
        self._arrived: trio.Event | None = None
        self.ended = False  # the client half-closed (END_STREAM)
        # The handler took the call's one request message (receive's ``last``): whatever
        # more the client sends is not held (see _take_data).
        self.taken = False
        self.reset = False  # the stream was reset (by either side)
        self.headers_sent = False
        self.failure: GrpcError | None = None  # a framing error found by the reader
        self.buffered = 0  # bytes held in _partial and _inbox, counted in the budget
        # Cancelled when the stream is reset under a call that waits: the cancel scope of the
        # task that serves it from then on (see _Connection._read); a call served without
        # waiting needs none (no reset is read while it runs).
        self.cancel_scope: trio.CancelScope | None = None
        self.status = OK  # the gRPC status the call ended with (counted in the server's stats)
        # Served by the connection's reader (until it waits): what it sends is written by the
        # reader's next flush, with the other calls' answers.
        self.in_reader = True

    # -- the reader's side ---------------------------------------------------------------

    def _wake(self) -> None:
        arrived = self._arrived
        if arrived is not None:
            self._arrived = None
            arrived.set()

    def _take_data(self, data: bytes, limits: GrpcLimits, budget: SharedBudget) -> None:
        """Frame ``data`` into messages; a framing problem is kept in :attr:`failure`."""
        if self.failure is not None or self.reset:
            return
        if self.taken:  # a unary request's second message: never read, so not held
            self.failure = GrpcError(INTERNAL, "too many request messages")
            return
        if budget.partial_frames_over:
            self.failure = GrpcError(
                RESOURCE_EXHAUSTED, "the server holds too many request bytes; try again"
            )
            self._wake()
            return
        n = len(data)
        if not self._partial and n >= _PREFIX.size:
            # The usual DATA frame: one whole message, queued without being copied twice.
            compressed, length = _PREFIX.unpack_from(data)
            if (
                n == _PREFIX.size + length
                and not compressed
                and length <= limits.max_message_size
                and len(self._inbox) < limits.max_queued_messages
            ):
                self._inbox.append(data[_PREFIX.size :])
                self._count(length, budget)
                self._wake()
                return
        if not self._partial:
            self._partial_since = self._conn.now()
        self._partial += data
        self._count(len(data), budget)
        while len(self._partial) >= _PREFIX.size:
            compressed, length = _PREFIX.unpack_from(self._partial)
            if compressed:  # no grpc-encoding (any other is refused): INTERNAL, as grpc-java
                self.failure = GrpcError(INTERNAL, "a compressed message without grpc-encoding")
                break
            if length > limits.max_message_size:
                self.failure = GrpcError(
                    RESOURCE_EXHAUSTED,
                    f"request message of {length} bytes is larger than the server's limit "
                    f"of {limits.max_message_size} bytes",
                )
                break
            end = _PREFIX.size + length
            if len(self._partial) < end:
                break
            message = bytes(self._partial[_PREFIX.size : end])
            del self._partial[:end]
            self._count(-_PREFIX.size, budget)
            self._partial_since = self._conn.now() if self._partial else None
            if len(self._inbox) >= limits.max_queued_messages:
                self.failure = GrpcError(
                    RESOURCE_EXHAUSTED,
                    f"more than {limits.max_queued_messages} request messages are waiting",
                )
                break
            self._inbox.append(message)
        if self.failure is not None:
            self._drop(budget)
        self._wake()

    def _count(self, delta: int, budget: SharedBudget) -> None:
        self.buffered += delta
        budget.partial_frame_total += delta

    def _drop(self, budget: SharedBudget) -> None:
        """Release every request byte held (the call failed, ended or was reset)."""
        self._partial.clear()
        self._inbox.clear()
        budget.partial_frame_total -= self.buffered
        self.buffered = 0

    def _end(self) -> None:
        self.ended = True
        self._wake()

    # -- the handler's side --------------------------------------------------------------

    async def receive(self, *, timeout: float | None = None, last: bool = False) -> bytes | None:
        """The next request message, or None once the client ended its side.  ``last``: the
        call's one request message (a unary or server-streaming method's): one more already
        here is an error, and what the client sends after it is dropped, not held until the
        call ends (a long poll holds it 20 s), and fails the call's next receive if any.

        Raises :class:`GrpcError` for a framing problem, a message begun and not finished
        within the receive timeout, or (with ``timeout``) none arriving within it."""
        deadline: float | None = None  # taken at the first wait (most calls find their message)
        while True:
            if self.failure is not None:
                raise self.failure
            if self._inbox:
                message = self._inbox.popleft()
                self._count(-len(message), self._conn.budget)
                if last:
                    self.taken = True
                    if self._inbox or self._partial:
                        self._drop(self._conn.budget)
                        self.failure = GrpcError(INTERNAL, "too many request messages")
                        raise self.failure
                return message
            if self.ended or self.reset:
                if self._partial:
                    raise GrpcError(INTERNAL, "the request ended inside a message")
                return None
            if deadline is None:
                deadline = math.inf if timeout is None else self._conn.now() + timeout
            wait_until = deadline
            if self._partial_since is not None:
                wait_until = min(
                    wait_until, self._partial_since + self._conn.limits.receive_timeout
                )
            if self._arrived is None:
                self._arrived = trio.Event()
            with trio.move_on_at(wait_until):
                await self._arrived.wait()
                continue
            raise GrpcError(DEADLINE_EXCEEDED, "the request message did not arrive in time")

    async def send(self, message: bytes, *, last: bool = False, more: bool = False) -> None:
        """Send one response message (the response headers first, once).  ``last``: the call
        sends nothing more, so what fits the window is written with the trailers, in one
        write, rather than now.  ``more``: the caller sends more messages at once (a
        stream's batch), so what fits the window is written with them, by the send that is
        not ``more`` (or the trailers'): one write and one yield for the batch, not one per
        message.  Either way a send that must wait for the peer's window first writes what
        is queued (the peer opens its window as it reads)."""
        if not self.headers_sent:
            if self.reset or self._conn.closed:
                raise _ConnectionGone
            self.headers_sent = True
            self._conn.h2.send_headers(self.stream_id, _RESPONSE_HEADERS)
        await self._conn.send_data(
            self, _PREFIX.pack(0, len(message)) + message, flush=not (last or more)
        )


Handler = Callable[[Call], Awaitable[None]]


class _Connection:
    def __init__(self, server: GrpcServer, stream: trio.abc.Stream, peer: str) -> None:
        self.server = server
        self.limits = server.limits
        self.budget = server.budget
        # A plain socket is also held as a stdlib socket (own_socket, as the remoting
        # channels do): read after a wait for readability, written by one non-blocking send
        # (no Trio checkpoint) whenever the socket takes it all; a TLS stream has none.
        self.stream, self._raw = own_socket(stream)
        self.peer = peer
        # HTTP/2 by pymq's sans-IO layer (its SETTINGS and connection window queued), HPACK
        # by hpack: the 5.x clients' metadata read without hpack's general decoder (see
        # _Decoder), the constant response headers kept encoded (_Encoder).
        self.h2 = H2Server(
            max_concurrent_streams=self.limits.max_concurrent_streams,
            initial_window_size=self.limits.initial_window_size,
            max_header_list_size=self.limits.max_header_list_size,
            decoder=_Decoder(),
            encoder=_Encoder(),
        )
        self.calls: dict[int, Call] = {}
        # Calls a read brought, to be started once its frames are taken in (see the module
        # docstring), with their handlers.
        self._starting: deque[tuple[Handler, Call]] = deque()
        self._send_lock = trio.Lock()
        # Set when a send window opens; made only when a call waits for one (a WINDOW_UPDATE
        # comes with nearly every response, and seldom finds a call waiting).
        self._window_opened: trio.Event | None = None
        # Trio's clock read without trio.current_time()'s two calls around it.
        self.now: Callable[[], float] = trio.lowlevel.current_clock().current_time
        self._last_read = self.now()  # when the last read returned (_watch)
        # When the send in progress began (None: none is), and the scope _watch sleeps in
        # (None while it is awake): a send brings its deadline nearer (see flush).
        self._send_began: float | None = None
        self._watch_scope: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        self.closed = False

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._watch)  # first: it bounds every send, this one's too
                try:
                    await self.flush()
                except _ConnectionGone:
                    nursery.cancel_scope.cancel()
                else:
                    await self._read()
        finally:
            self.closed = True
            for call in self.calls.values():
                call._drop(self.budget)
            self.calls.clear()
            for _, call in self._starting:  # never started: counted back here
                self.server.open_calls -= 1
                self.server.stats.record(call.path, CANCELLED, 0.0)
            self._starting.clear()
            await trio.aclose_forcefully(self.stream)

    async def _read(self) -> None:
        """Read the connection until it ends, then cancel what is left on it; or, when a call
        this task started waits, serve that call to its end (a new reader goes on).  The task's
        cancel scope becomes that call's: one scope per task, none per call."""
        with trio.CancelScope() as scope:
            try:
                if await self._read_loop(scope):
                    return
            except _ConnectionGone:
                pass
            assert self._nursery is not None
            self._nursery.cancel_scope.cancel()

    async def _read_loop(self, scope: trio.CancelScope) -> bool:
        """The reader; True when it ended serving a call that waited (see _start_calls)."""
        while True:
            if await self._start_calls(scope):
                return True
            await self.flush()
            if self.closed:
                return False
            data = await self._receive()
            self._last_read = self.now()
            if not data:
                return False
            try:
                events = self.h2.receive(data)
            except H2ConnectionError as exc:
                log.info("grpc: closing connection from %s: %s", self.peer, exc)
                await self.flush()  # its GOAWAY
                return False
            for event in events:
                self._on_event(event)

    async def _receive(self) -> bytes | bytearray:
        """The next bytes read (empty at the end, or when the connection broke)."""
        raw = self._raw
        if raw is None:
            try:
                return await self.stream.receive_some(READ_SIZE)
            except trio.BrokenResourceError:
                return b""
        while True:  # wait first: a request-and-answer finds nothing on reading at once
            await trio.lowlevel.wait_readable(raw)
            try:
                return raw.recv(READ_SIZE)
            except BlockingIOError:
                continue
            except OSError:
                return b""

    async def _watch(self) -> None:
        """Close the connection once one send has not been taken by the peer within
        write_stall_timeout, or (GOAWAY) once nothing has been read from it for idle_timeout
        while it has no call in progress.  Neither arms a timer per read or per send: a read
        notes its time, a send its start, and a send brings this task's deadline nearer only
        when it is further than that send's stall deadline (about once a stall timeout while
        the connection is busy: a send that began earlier has a deadline at least as near)."""
        idle = self.limits.idle_timeout
        stall = self.limits.write_stall_timeout
        while True:
            deadline = self._last_read + idle
            if self._send_began is not None:
                deadline = min(deadline, self._send_began + stall)
            with trio.CancelScope(deadline=deadline) as self._watch_scope:
                await trio.sleep_forever()
            self._watch_scope = None
            now = trio.current_time()
            began = self._send_began
            if began is not None:  # a send in progress: not idle
                if now < began + stall:
                    continue
                log.info("grpc: %s does not read; closing its connection", self.peer)
                self._abort()
                return
            if now < self._last_read + idle:
                continue  # read since: watch on
            if self.calls or self._starting:
                self._last_read = now  # busy, not idle: as long again from now
                continue
            log.info("grpc: closing idle connection from %s", self.peer)
            self.h2.close_connection(ErrorCode.NO_ERROR)
            # No send is in progress (the lock is free); this one is bounded here.
            with trio.move_on_after(stall), contextlib.suppress(_ConnectionGone):
                await self.flush()
            self._abort()
            return

    async def _start_calls(self, scope: trio.CancelScope) -> bool:
        """Start the calls the last read brought, in this task, in order; True when one
        waited: this task then serves that call to its end, and a new reader task (spawned
        before the wait) starts the rest and goes on reading.  ``scope`` (this task's) is then
        the call's: a reset cancels it, and nothing else is left in this task to cancel."""
        while self._starting:
            handler, call = self._starting.popleft()
            if call.reset:  # reset before it started: counted back here
                self.server.open_calls -= 1
                self.server.stats.record(call.path, CANCELLED, 0.0)
                continue
            serving = self._serve_call(handler, call)
            try:
                trap = serving.send(None)
            except StopIteration:
                continue  # served without waiting: its answer is queued for the next flush
            call.in_reader = False  # its own flushes from now on
            call.cancel_scope = scope
            assert self._nursery is not None
            self._nursery.start_soon(self._read)
            await _go_on(serving, trap)
            return True
        return False

    def _on_event(self, event: object) -> None:
        if type(event) is DataReceived:
            call = self.calls.get(event.stream_id)
            if call is not None:
                if event.data:
                    call._take_data(event.data, self.limits, self.budget)
                if event.ended:
                    call._end()
        elif type(event) is RequestReceived:
            self._on_request(event)
        elif type(event) is StreamReset:
            call = self.calls.pop(event.stream_id, None)
            if call is not None:
                call.reset = True
                call._drop(self.budget)
                if call.cancel_scope is not None:  # it waits (else it has not started)
                    call.cancel_scope.cancel()
            if not event.remote:  # a protocol error of the client's, on this stream only
                log.info("grpc: reset a stream from %s: %s", self.peer, event.reason)
        elif type(event) is WindowOpened:
            opened = self._window_opened
            if opened is not None:
                self._window_opened = None
                opened.set()
        elif type(event) is ConnectionTerminated:
            self.closed = True

    def _on_request(self, event: RequestReceived) -> None:
        sid = event.stream_id
        headers = event.headers
        path = headers.get(":path", "")
        content_type = headers.get("content-type", "")
        if headers.get(":method") != "POST" or not content_type.startswith("application/grpc"):
            http_status = "415" if headers.get(":method") == "POST" else "405"
            self._answer_now(sid, [(":status", http_status)], event.ended)
            return
        encoding = headers.get("grpc-encoding", "identity")
        handler = self.server.handlers.get(path)
        if handler is None or encoding != "identity":
            status, text = (
                (UNIMPLEMENTED, f"Method not found: {path.lstrip('/')}")
                if handler is None
                else (UNIMPLEMENTED, f"grpc-encoding {encoding} is not supported")
            )
            self._answer_now(sid, _trailers_only(status, text), event.ended)
            self.server.stats.record(path, status, 0.0)
            return
        if self.server.open_calls >= self.limits.max_calls:
            # Past the server's calls in progress: refused, and the client may retry it.
            self.server.refused_calls += 1
            self.h2.reset_stream(sid, ErrorCode.REFUSED_STREAM)
            return
        call = Call(self, sid, path, headers)
        self.calls[sid] = call
        self.server.open_calls += 1
        if event.ended:
            call._end()
        self._starting.append((handler, call))

    def _answer_now(self, sid: int, headers: list[tuple[str, str]], ended: bool) -> None:
        """A request answered in its response headers alone, before its handler (there is
        none): and the rest of it refused, as _finish does.  Nothing if a later frame of the
        same read closed the stream (the client reset it: its events come after this one)."""
        if sid not in self.h2.streams:
            return
        self.h2.send_headers(sid, headers, end_stream=True)
        if not ended:  # the client need not send the rest
            self.h2.reset_stream(sid, ErrorCode.NO_ERROR)

    async def _serve_call(self, handler: Handler, call: Call) -> None:
        begin = self.now()
        call.status = CANCELLED  # unless the call ends with a status of its own
        status, message = OK, ""
        try:
            # A reset while the handler waits cancels the scope of the task serving it (the
            # Cancelled ends this coroutine, see _read), so the status stays CANCELLED.
            try:
                await handler(call)
            except GrpcError as exc:
                status, message = exc.status, exc.message
            except _ConnectionGone:
                return
            except Exception:
                log.exception("grpc: %s from %s failed", call.path, call.peer)
                status, message = INTERNAL, "internal error serving the call"
            call.cancel_scope = None  # a reset from now on does not cancel writing its end
            if call.reset or self.closed:
                return
            call.status = status
            try:
                self._finish(call, status, message)
                if not call.in_reader:  # the reader writes what its calls queued, in one send
                    await self.flush()
            except (_ConnectionGone, StreamClosedError):
                pass
            finally:
                if self.calls.pop(call.stream_id, None) is not None:
                    call._drop(self.budget)
        finally:
            self.server.open_calls -= 1
            self.server.stats.record(call.path, call.status, self.now() - begin)

    def _finish(self, call: Call, status: int, message: str) -> None:
        """The call's trailers (or its trailers-only response); a call that did not read its
        whole request is reset, as gRPC servers do, so the client stops sending."""
        if call.headers_sent:
            if status == OK and not message:
                trailers = _OK_TRAILERS
            else:
                trailers = [("grpc-status", str(status))]
                if message:
                    trailers.append(("grpc-message", encode_grpc_message(message)))
            self.h2.send_headers(call.stream_id, trailers, end_stream=True)
        else:
            self.h2.send_headers(call.stream_id, _trailers_only(status, message), end_stream=True)
        if not call.ended:
            self.h2.reset_stream(call.stream_id, ErrorCode.NO_ERROR)

    async def send_data(self, call: Call, data: bytes, *, flush: bool = True) -> None:
        view = memoryview(data)
        limits = self.limits
        while view:
            if call.reset or self.closed:
                raise _ConnectionGone
            size = self.h2.send_data(call.stream_id, view)
            if size <= 0:
                # What was queued (a batch's messages sent ``more``) is written first: the
                # peer opens its window as it reads them.
                await self.flush()
                if call.reset or self.closed:
                    raise _ConnectionGone
                size = self.h2.send_data(call.stream_id, view)  # a window opened meanwhile
            if size <= 0:
                opened = self._window_opened
                if opened is None:
                    opened = self._window_opened = trio.Event()
                with trio.move_on_after(limits.write_stall_timeout):
                    await opened.wait()
                    continue
                log.info("grpc: %s does not read its responses; closing", self.peer)
                self._abort()
                raise _ConnectionGone
            view = view[size:]
            if view or (flush and not call.in_reader):
                await self.flush()
                if not view:  # a yield per message sent, as Trio's send_all would make
                    await trio.lowlevel.checkpoint()

    async def flush(self) -> None:
        """Write what h2 queued; a peer that does not take it within the stall timeout loses
        its connection (_watch cancels the connection's nursery, the send with it)."""
        # Nothing queued (most of a reader's flushes), or all taken by the socket at once
        # while no other writer waits: no lock, no checkpoint.  Else the lock
        # is taken before anything yields, so writers take it in the order they took their
        # bytes (Trio's lock is handed on first come, first served); the wait for it is
        # shielded, as bytes taken from h2 must be written (they carry HPACK state), and
        # bounded by the holder's write_stall_timeout.
        data = self.h2.data_to_send()
        if not data:
            return
        lock = self._send_lock
        raw = self._raw
        if raw is not None and not lock.locked():  # no writer: one send that does not wait
            try:
                sent = raw.send(data)
            except BlockingIOError:
                sent = 0
            except OSError:
                self._abort()
                raise _ConnectionGone from None
            if sent == len(data):
                return
            data = data[sent:]  # rare: the socket's buffer is full
        if lock.locked():
            with trio.CancelScope(shield=True):
                await lock.acquire()
        else:
            lock.acquire_nowait()
        began = trio.current_time()
        self._send_began = began
        watch = self._watch_scope
        if watch is not None and watch.deadline > began + self.limits.write_stall_timeout:
            watch.deadline = began + self.limits.write_stall_timeout
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._abort()
            raise _ConnectionGone from None
        finally:
            self._send_began = None
            lock.release()

    def _abort(self) -> None:
        self.closed = True
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()


class _Decoder(hpack.Decoder):
    """hpack's decoder, reading itself the plain literals a header block ends with.

    A gRPC client repeats its metadata on every call as literals that the dynamic table
    neither holds nor changes (the official clients' ``x-mq-*`` and ``authorization``: "literal
    without indexing", the name literal too, no Huffman coding), after a few indexed fields.
    Such a tail means the same whatever the table holds, and reading it is slicing: hpack's
    general decoder is given only the head before it (and every block it cannot split so),
    and the size limit (``max_header_list_size``) counts both.

    The head too is the same from call to call (the same indexed fields), and means the same
    while the dynamic table is unchanged: a head of fields that only read the table is kept,
    decoded, until a block that may change the table (a literal with indexing, a size update,
    one hpack reads whole) is decoded; at most ``HEADS`` of them.  Half of a call's HPACK
    decoding, before these two."""

    HEADS = 16
    LAYOUTS = 4

    def __init__(self) -> None:
        super().__init__()
        self._generation = 0  # counts the blocks that may have changed the table
        # The last blocks split (at most LAYOUTS, the newest first), as _Layouts: a block of
        # the same layout is split without a walk, one that begins with the newest's head
        # walked from the head's end.
        self._layouts: list[_Layout] = []
        # A kept head: the generation it was decoded in, its fields, their size as counted
        # against max_header_list_size.
        self._heads: dict[tuple[bytes, bool], tuple[int, list[Any], int]] = {}

    def decode(self, data: bytes, raw: bool = False) -> list[Any]:
        split = self._split(data)
        if split is None:
            self._generation += 1
            return cast(list[Any], super().decode(data, raw))
        head, reads_only, pieces = split
        key = (head, raw)
        kept = self._heads.get(key) if reads_only else None
        if kept is not None and kept[0] == self._generation:
            if self.header_table_size > self.max_allowed_table_size:  # as hpack checks it
                raise hpack.InvalidTableSizeError(
                    "Encoder did not shrink table size to within the max"
                )
            headers = list(kept[1])
            size = kept[2]
        else:
            if not reads_only:
                self._generation += 1
            headers = cast(list[Any], super().decode(head, raw))
            size = sum(len(name) + len(value) + 32 for name, value in headers)
            if reads_only:
                if len(self._heads) >= self.HEADS:
                    self._heads.clear()
                self._heads[key] = (self._generation, list(headers), size)
        # A plain literal is its name and value and 3 bytes (0x00, two lengths): HPACK counts
        # each field as its name and value and 32.
        size += len(data) - len(head) + 29 * (len(pieces) // 2)
        if size > self.max_header_list_size:
            raise hpack.OversizedHeaderListError(
                f"A header list larger than {self.max_header_list_size} has been received"
            )
        pairs = zip(pieces[::2], pieces[1::2], strict=True)
        if raw:  # hpack's HeaderTuple is a tuple: no need of one
            headers += pairs
            return headers
        for name, value in pairs:
            try:
                headers.append(hpack.HeaderTuple(name.decode(), value.decode()))
            except UnicodeDecodeError as err:
                raise hpack.HPACKDecodingError("Unable to decode headers as UTF-8") from err
        return headers

    def _split(self, data: bytes) -> tuple[bytes, bool, tuple[bytes, ...]] | None:
        """The head of ``data``, whether it only reads the table, and its plain tail's names
        and values in turn; None when it has no plain tail (see :func:`_plain_tail`).

        A block of the layout of one split before (its length, its head's bytes, and the
        bytes the walk read in its tail: each literal's 0x00 and two lengths) would be walked
        to the same bounds (the walk is a function of those bytes), so it is sliced at the
        kept ones (a client alternates a few: its grpc-timeout takes a few values); one that
        begins with the newest's head is walked from the head's end."""
        layouts = self._layouts
        n = len(data)
        for layout in layouts:
            if (
                n == layout.length
                and data.startswith(layout.head)
                and layout.marks(data) == layout.marked
            ):
                return layout.head, layout.reads_only, layout.pieces(data)
        if layouts and layouts[0].head and data.startswith(layouts[0].head):
            walked = _plain_tail(data, len(layouts[0].head), layouts[0].reads_only)
        else:
            walked = _plain_tail(data)
        if walked is None:
            return None
        bounds, reads_only = walked
        layout = _Layout(data, bounds, reads_only)
        layouts.insert(0, layout)
        del layouts[self.LAYOUTS :]
        return layout.head, reads_only, layout.pieces(data)


class _Layout:
    """Where a block split by :func:`_plain_tail` has its head, the bytes its walk read in the
    tail (``marks`` takes them from a block) and its tail's names and values (``pieces``
    slices them, in turn)."""

    __slots__ = ("head", "length", "marked", "marks", "pieces", "reads_only")

    def __init__(self, data: bytes, bounds: list[int], reads_only: bool) -> None:
        self.length = len(data)
        self.head = data[: bounds[0]]
        self.reads_only = reads_only
        positions: list[int] = []
        slices: list[slice] = []
        for k in range(0, len(bounds) - 1, 4):  # a literal: its 0x00 and its two lengths
            positions += [bounds[k], bounds[k] + 1, bounds[k + 2]]
            slices += [slice(bounds[k + 1], bounds[k + 2]), slice(bounds[k + 3], bounds[k + 4])]
        # Three positions and two slices at least: itemgetter gives tuples.
        self.marks: Callable[[bytes], tuple[int, ...]] = operator.itemgetter(*positions)
        self.marked = self.marks(data)
        self.pieces: Callable[[bytes], tuple[bytes, ...]] = operator.itemgetter(*slices)


class _Encoder(hpack.Encoder):
    """hpack's encoder, keeping the blocks of the header lists a server sends again and again
    (the response headers, ``grpc-status: 0``) once they encode as indexed fields alone.

    Such a block names table entries and changes nothing, so it is what hpack would write
    again until the table changes: a block that is not indexed fields alone (it may have
    added an entry or resized the table) or a new table size.  At most ``KEPT`` kept; a list
    with a never-indexed (sensitive) field is always encoded."""

    KEPT = 8

    def __init__(self) -> None:
        self._generation = 0  # counts what may have changed the table
        self._kept: dict[tuple[Any, bool], tuple[int, bytes]] = {}
        super().__init__()

    @property
    def header_table_size(self) -> int:
        return cast(int, hpack.Encoder.header_table_size.fget(self))  # type: ignore[attr-defined]

    @header_table_size.setter
    def header_table_size(self, value: int) -> None:
        self._generation += 1
        hpack.Encoder.header_table_size.fset(self, value)  # type: ignore[attr-defined]

    def encode(self, headers: Any, huffman: bool = True) -> bytes:
        key = None
        # Pairs alone, none of them sensitive (a NeverIndexedHeaderTuple equals the plain pair
        # of its values: told by its type), checked without a Python loop.
        if (
            isinstance(headers, list)
            and _PAIR_TYPES.issuperset(map(type, headers))
            and _TWO.issuperset(map(len, headers))
        ):
            key = (tuple(headers), huffman)
            kept = self._kept.get(key)
            if kept is not None and kept[0] == self._generation:
                return kept[1]
        block = super().encode(headers, huffman)
        if block.translate(None, _INDEXED_ONE_BYTE):  # not indexed fields alone
            self._generation += 1
        elif key is not None:
            if len(self._kept) >= self.KEPT:
                self._kept.clear()
            self._kept[key] = (self._generation, block)
        return block


# What a header list's fields may be for its block to be kept: a tuple (or hpack's
# HeaderTuple) of a name and a value.
_PAIR_TYPES = frozenset((tuple, hpack.HeaderTuple))
_TWO = frozenset((2,))

# The bytes of an indexed field of index 1 to 126, written in one byte.
_INDEXED_ONE_BYTE = bytes(range(0x81, 0xFF))


def _plain_tail(
    data: bytes, begin: int = 0, reads_only: bool = True
) -> tuple[list[int], bool] | None:
    """Where the run of plain literals (``0x00``, then the name and the value each with a
    one-byte length, no Huffman) that ends ``data`` begins, and each one's bounds:
    ``[start, name, name end, value, value end, name, ...]`` (a literal's start is the last
    one's value end), and whether the head before it only reads the dynamic table (no literal
    with indexing, no size update); None when the block does not end so, or cannot be walked
    (hpack reads it whole then, and says what is wrong).

    ``begin``: walk from there, a field's start, with ``reads_only`` what the bytes before
    it were found to be (a block that begins with the head of one split before: the walk is
    a function of the bytes, so it would have reached the same point in the same state)."""
    n = len(data)
    i = begin
    start = -1  # where the current run of plain literals began
    bounds: list[int] = []
    try:
        while i < n:
            first = data[i]
            if first == 0:  # literal without indexing, new name: plain if short and not Huffman
                name_len = data[i + 1]
                value_at = i + 2 + name_len
                value_len = data[value_at] if name_len < 0x7F else 0x80
                if name_len < 0x7F and value_len < 0x7F:
                    if start < 0:
                        start, bounds = i, [i]
                    end = value_at + 1 + value_len
                    if end > n:
                        return None
                    bounds += [i + 2, value_at, value_at + 1, end]
                    i = end
                    continue
            start = -1
            if first & 0x80:
                i = _skip_int(data, i, 7)
                continue
            if first & 0x40:
                prefix = 6
                reads_only = False
            elif first & 0x20:
                i = _skip_int(data, i, 5)
                reads_only = False
                continue
            else:
                prefix = 4
            named = first & ((1 << prefix) - 1)
            i = _skip_int(data, i, prefix)
            if not named:
                i = _skip_string(data, i)
            i = _skip_string(data, i)
    except IndexError:
        return None
    if start < 0 or i != n:
        return None
    return bounds, reads_only


def _skip_int(data: bytes, i: int, prefix: int) -> int:
    """The index after the HPACK integer at ``i`` (``prefix`` bits in its first byte)."""
    mask = (1 << prefix) - 1
    if data[i] & mask != mask:
        return i + 1
    i += 1
    while data[i] & 0x80:
        i += 1
    return i + 1


def _skip_string(data: bytes, i: int) -> int:
    """The index after the HPACK string literal at ``i``."""
    length = data[i] & 0x7F
    end = i + 1
    if length == 0x7F:
        length, shift = 0x7F, 0
        while True:
            byte = data[end]
            end += 1
            length += (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
    return end + length


@types.coroutine
def _go_on(coroutine: Coroutine[Any, Any, Any], trap: Any) -> Generator[Any, Any, None]:
    """Await ``coroutine`` from where it stopped, having yielded ``trap`` to Trio (as
    ``await coroutine`` would have: what Trio sends or throws in is passed on).  The
    coroutine stays in the task that began it, whose Trio traps it yields."""
    while True:
        try:
            value = yield trap
        except BaseException as exc:  # a Cancelled, say: passed on
            try:
                trap = coroutine.throw(exc)
            except StopIteration:
                return
        else:
            try:
                trap = coroutine.send(value)
            except StopIteration:
                return


class _ConnectionGone(Exception):
    """The connection closed under a call (its output cannot be written)."""


# A response's headers and a call's OK trailers: the same lists each time (_Encoder keeps
# their blocks by these values).
_RESPONSE_HEADERS = [(":status", "200"), ("content-type", "application/grpc")]
_OK_TRAILERS = [("grpc-status", "0")]


def _trailers_only(status: int, message: str) -> list[tuple[str, str]]:
    headers = [
        (":status", "200"),
        ("content-type", "application/grpc"),
        ("grpc-status", str(status)),
    ]
    if message:
        headers.append(("grpc-message", encode_grpc_message(message)))
    return headers


# Latency buckets (ms) of RocketMQ 5's rocketmq_rpc_latency histogram.
LATENCY_BUCKETS_MS = (1, 3, 5, 10, 50, 100, 1000, 3000, 10000)


class CallStats:
    """Calls served, by method and gRPC status, with their latencies (for Prometheus).

    Keys are bounded: a path the server does not serve is counted as ``unknown``."""

    def __init__(self, handlers: Mapping[str, Handler]) -> None:
        self.handlers = handlers
        # Served paths' method names (what the table is keyed by), as they are first seen:
        # at most one per handler.
        self._methods: dict[str, str] = {}
        # The buckets' upper bounds as Prometheus names them (the last: +Inf).
        self.bounds = [str(float(b)) for b in LATENCY_BUCKETS_MS] + ["+Inf"]
        # (method, status) -> [count, total ms, count per bucket (not cumulative)].
        self.table: dict[tuple[str, int], list[Any]] = {}

    def record(self, path: str, status: int, seconds: float) -> None:
        method = self._methods.get(path)
        if method is None:
            if path not in self.handlers:
                method = "unknown"
            else:
                method = self._methods[path] = path.rsplit("/", 1)[-1]
        row = self.table.get((method, status))
        if row is None:
            row = self.table[(method, status)] = [0, 0.0, [0] * (len(LATENCY_BUCKETS_MS) + 1)]
        millis = seconds * 1000
        row[0] += 1
        row[1] += millis
        row[2][bisect.bisect_left(LATENCY_BUCKETS_MS, millis)] += 1


class GrpcServer(ListeningServer):
    """Serves gRPC calls by ``handlers`` (``{"/pkg.Service/Method": handler}``)."""

    def __init__(
        self,
        handlers: Mapping[str, Handler],
        *,
        host: str = "0.0.0.0",
        port: int = 0,
        limits: GrpcLimits | None = None,
        budget: SharedBudget | None = None,
        name: str = "grpc",
        tls: TlsServer | None = None,
    ) -> None:
        super().__init__()
        self.handlers = dict(handlers)
        # TLS by the remoting ports' tls.* keys (its context offering ALPN h2); None: plain.
        self.tls = tls
        self.host = host
        self.port = port
        self.limits = limits or GrpcLimits()
        self.budget = budget or SharedBudget()
        self.name = name
        self.connections: set[_Connection] = set()
        self.open_calls = 0  # calls being served, across connections (max_calls)
        self.refused_calls = 0
        self.stats = CallStats(self.handlers)

    async def _serve_stream(self, stream: trio.SocketStream) -> None:
        served = await self._admit(stream, len(self.connections), self.limits.max_connections)
        if served is None:
            return
        try:
            host, port = stream.socket.getpeername()[:2]
            peer = f"{host}:{port}"
        except OSError:
            await trio.aclose_forcefully(served)
            return
        conn = _Connection(self, served, peer)
        self.connections.add(conn)
        try:
            await conn.run()
        except _ConnectionGone:
            pass
        except Exception:  # a bug in one connection's handling ends that connection only
            log.exception("%s: connection from %s failed", self.name, peer)
        finally:
            self.connections.discard(conn)
