"""Trio server shell: accepts connections and dispatches requests by code to processors.

A processor is ``async def (channel, request) -> RemotingCommand | None``.  An unknown code gets
``REQUEST_CODE_NOT_SUPPORTED`` with a remark, as RocketMQ answers.  Before a processor runs, the
request's header is decoded into its typed class and validated
(:func:`pymq.remoting.headers.decode_request`); a header Java would refuse is answered
``SYSTEM_ERROR`` and never reaches the processor.  Each connection is a
:class:`~pymq.remoting.channel.Channel` task in the server's nursery, within the server's
:class:`~pymq.remoting.limits.ConnectionLimits` and one :class:`~pymq.remoting.limits.SharedBudget`;
past ``max_connections`` a new connection is closed at once.  When a connection ends,
``on_channel_closed`` is called (the name server drops a broker whose connection closed); an
error in there, or anywhere in one connection's handling, ends that connection only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from pymq.remoting.channel import (
    Admission,
    Channel,
    InlineHandler,
    RequestHandler,
    RunHooks,
)
from pymq.remoting.codec import RPC_TYPE_RESPONSE, RemotingCommand, decode_frame_at
from pymq.remoting.codes import ResponseCode
from pymq.remoting.errors import ProtocolError
from pymq.remoting.headers import decode_request
from pymq.remoting.limits import ConnectionLimits, SharedBudget
from pymq.remoting.tls import TlsServer

log = logging.getLogger(__name__)

# (channel, buffer, frame bounds, first, stop) -> (the answers of frames first..i-1 joined, i):
# answers from the frames' bytes (RemotingServer.raw_run_handler).
RawAnswers = Callable[[Channel, bytes, list[int], int, int], tuple[bytes, int]]

# The access check: (channel, request) -> None to serve it, or the answer refusing it.
AccessCheck = Callable[[Channel, RemotingCommand], RemotingCommand | None]


class RemotingServer:
    def __init__(
        self,
        *,
        host: str = "0.0.0.0",
        port: int = 0,
        name: str = "remoting",
        on_channel_closed: Callable[[Channel], None] | None = None,
        idle_timeout: float | None = None,
        limits: ConnectionLimits | None = None,
        budget: SharedBudget | None = None,
        max_connections: int = 10000,
        tls: TlsServer | None = None,
    ) -> None:
        self.idle_timeout = idle_timeout
        self.limits = limits or ConnectionLimits()
        self.budget = budget or SharedBudget()
        self.max_connections = max_connections
        # TLS (tls.server.mode permissive or enforcing); None: plain TCP, nothing on the path.
        self.tls = tls
        self.refused_connections = 0
        self._listeners: list[trio.SocketListener] | None = None
        self.host = host
        self.port = port
        self.name = name
        self.processors: dict[int, RequestHandler] = {}
        self.inline_processors: dict[int, InlineHandler] = {}
        self.default_processor: RequestHandler | None = None
        self.channels: set[Channel] = set()
        self._handshaking = 0  # connections in their TLS handshake, not yet channels
        self.on_channel_closed = on_channel_closed
        # Checked before a request is served (the broker's fast failure); None: no check.
        self.admission: Admission | None = None
        # Called before the processor of every served code (the broker's ACL); it returns None
        # to serve the request, or the answer that refuses it.  None (the default): no check,
        # and connections dispatch without looking for one.
        self.access_check: AccessCheck | None = None
        # Answers the leading frames of a run from their bytes (the broker's sends, the name
        # server's route lookups), tried first by serve_run; None: none.  Never where there
        # is an access check (it would skip it).
        self.raw_run_handler: RawAnswers | None = None
        # Called around each run of frames a connection serves (Channel.run_hooks); None: none.
        self.run_hooks: RunHooks | None = None

    def register(
        self, code: int, processor: RequestHandler, inline: InlineHandler | None = None
    ) -> None:
        """Serve ``code`` with ``processor`` in a task of its own; if ``inline`` is given it is
        tried first, in the connection's reader, and answers at once unless it returns None
        (the common send needs no wait, and a task per request costs more than the send)."""
        self.processors[int(code)] = processor
        if inline is not None:
            self.inline_processors[int(code)] = inline
        else:
            self.inline_processors.pop(int(code), None)

    def serve_run(
        self, channel: Channel, buf: bytes, bounds: list[int], first: int, stop: int
    ) -> tuple[bytes, int, RemotingCommand | None]:
        """The synchronous way in (``Channel.raw_run_handler``): frames ``first..stop-1`` of a
        run served in the connection's reader while they can be: the leading ones the raw
        handler answers from their bytes (never where there is an access check), then each
        frame it leaves decoded and served by its code's inline handler, if it has one and
        it answers now; then the raw handler is offered the rest.  Returns where it stopped
        (the frame a task must serve, or the response to route), with that frame decoded;
        the answers are queued in the requests' order as they are made."""
        checked = self.access_check is not None
        raw = None if checked else self.raw_run_handler
        inline = self._dispatch_inline_checked if checked else self.dispatch_inline
        inline_codes = self.inline_processors
        i = first
        while i < stop:
            if raw is not None:
                try:
                    joined, left = raw(channel, buf, bounds, i, stop)
                    if not i <= left <= stop:
                        raise ValueError(f"stopped at frame {left} of {stop}")
                except Exception:  # a bug there: the frames are decoded and served below
                    log.exception("%s: raw answers failed; frames decoded", self.name)
                    raw = None
                else:
                    if joined:
                        channel.answer_frames([joined])
                    i = left
                    if i >= stop:
                        break
            try:
                cmd = decode_frame_at(buf, bounds[2 * i], bounds[2 * i + 1])
            except ProtocolError:  # the channel decodes it again and closes
                return b"", i, None
            if cmd.flag & RPC_TYPE_RESPONSE or cmd.header_error is not None:
                return b"", i, cmd
            if cmd.code not in inline_codes or not channel.serve_inline(inline, cmd):
                return b"", i, cmd
            i += 1
        return b"", i, None

    def dispatch_inline(
        self, channel: Channel, request: RemotingCommand
    ) -> RemotingCommand | bytes | None:
        processor = self.inline_processors.get(request.code)
        if processor is None:
            return None
        decode_request(request)
        return processor(channel, request)

    async def dispatch(self, channel: Channel, request: RemotingCommand) -> RemotingCommand | None:
        processor = self.processors.get(request.code, self.default_processor)
        if processor is None:
            return request.response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                f"request type {request.code} not supported",
            )
        decode_request(request)
        return await processor(channel, request)

    def _dispatch_inline_checked(
        self, channel: Channel, request: RemotingCommand
    ) -> RemotingCommand | bytes | None:
        processor = self.inline_processors.get(request.code)
        if processor is None:
            return None
        assert self.access_check is not None
        refusal = self.access_check(channel, request)
        if refusal is not None:
            return refusal
        decode_request(request)
        response = processor(channel, request)
        if response is None:
            request.access_checked = True  # served by a task next: checked once is enough
        return response

    async def _dispatch_checked(
        self, channel: Channel, request: RemotingCommand
    ) -> RemotingCommand | None:
        if request.code in self.processors or self.default_processor is not None:
            assert self.access_check is not None
            if not request.access_checked:
                refusal = self.access_check(channel, request)
                if refusal is not None:
                    return refusal
        return await self.dispatch(channel, request)

    async def bind(self) -> int:
        """Bind and listen now (connections wait in the backlog until :meth:`run` serves them),
        so that the port is known, and a port in use fails, before anything else starts."""
        if self._listeners is None:
            self._listeners = await trio.open_tcp_listeners(self.port, host=self.host)
            self.port = self._listeners[0].socket.getsockname()[1]
        return self.port

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen and serve until cancelled; ``task_status.started`` gets the bound port."""
        await self.bind()
        assert self._listeners is not None
        log.info("%s server listening on %s:%d", self.name, self.host, self.port)
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._serve_connection, self._listeners)
            task_status.started(self.port)

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        # Connections still in their TLS handshake count too (up to its timeout each).
        if len(self.channels) + self._handshaking >= self.max_connections:
            self.refused_connections += 1
            if self.refused_connections % 1000 == 1:  # one line per thousand, not a flood
                log.warning(
                    "%s: %d connections open (the most allowed); closing new ones (%d so far)",
                    self.name,
                    len(self.channels),
                    self.refused_connections,
                )
            await trio.aclose_forcefully(stream)
            return
        served: trio.abc.Stream = stream
        if self.tls is not None:
            self._handshaking += 1
            try:
                wrapped = await self.tls.wrap(stream)
            finally:
                self._handshaking -= 1
            if wrapped is None:  # closed, timed out, or not TLS where TLS is enforced
                await trio.aclose_forcefully(stream)
                return
            served = wrapped
        try:
            checked = self.access_check is not None
            channel = Channel(
                served,
                self._dispatch_checked if checked else self.dispatch,
                idle_timeout=self.idle_timeout,
                limits=self.limits,
                budget=self.budget,
                admission=self.admission,
                raw_run_handler=self.serve_run,
                run_hooks=self.run_hooks,
            )
        except Exception:  # e.g. the socket died before its peer address could be read
            log.exception("%s: cannot serve a new connection", self.name)
            await trio.aclose_forcefully(served)
            return
        self.channels.add(channel)
        log.debug("%s: connection from %s", self.name, channel.remote_address)
        try:
            await channel.run()
        finally:
            self.channels.discard(channel)
            log.debug(
                "%s: connection from %s ended: %s",
                self.name,
                channel.remote_address,
                channel.close_reason,
            )
            if self.on_channel_closed is not None:
                try:
                    self.on_channel_closed(channel)
                except Exception:
                    log.exception("%s: error cleaning up after %s", self.name, channel)
