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
from functools import partial
from typing import Protocol

import attrs
import trio

from pymq.remoting.channel import (
    Admission,
    Channel,
    InlineHandler,
    RawRunHandler,
    RequestHandler,
    RunHooks,
)
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import ResponseCode
from pymq.remoting.headers import REQUEST_HEADERS, decode_request
from pymq.remoting.limits import ConnectionLimits, SharedBudget
from pymq.remoting.listener import ListeningServer
from pymq.remoting.tls import TlsServer

log = logging.getLogger(__name__)

# The access check: (channel, request) -> None to serve it, or the answer refusing it.
AccessCheck = Callable[[Channel, RemotingCommand], RemotingCommand | None]


# A run handler: (channel, buffer, frame bounds, first, stop, the access check or None) ->
# (the answers of frames first..i-1 joined, i, frame i decoded or None).  It serves, in the
# connection's reader and from their bytes, the leading frames of a run that are requests of
# its codes and need no wait, the access check applied to each when there is one; it stops at
# the first frame it does not serve (any other code, or one that must wait).
class RunHandler(Protocol):
    def __call__(
        self,
        channel: Channel,
        buf: bytes,
        bounds: list[int],
        first: int,
        stop: int,
        /,
        check: AccessCheck | None = None,
    ) -> tuple[bytes, int, RemotingCommand | None]: ...


@attrs.frozen
class Route:
    """How a server serves one request code: its row of the registration table.

    ``header`` is the class its header is decoded into (and validated) before a handler sees
    it.  ``handler`` serves it in a task of its own.  The synchronous ways in, tried first in
    the connection's reader (Channel.raw_run_handler): ``run``, which serves runs of such
    frames from their bytes (the sends, the route lookups), and ``inline``, which is given a
    frame ``run`` leaves (or, without one, the request) decoded; either leaves to ``handler``
    what must wait."""

    handler: RequestHandler
    header: type | None = None
    inline: InlineHandler | None = None
    run: RunHandler | None = None


class RemotingServer(ListeningServer):
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
        super().__init__()
        self.idle_timeout = idle_timeout
        self.limits = limits or ConnectionLimits()
        self.budget = budget or SharedBudget()
        self.max_connections = max_connections
        # TLS (tls.server.mode permissive or enforcing); None: plain TCP, nothing on the path.
        self.tls = tls
        self.host = host
        self.port = port
        self.name = name
        # The registration table: how each request code is served (see :meth:`register`).
        self.routes: dict[int, Route] = {}
        self._run_handler: RunHandler | None = None
        self.default_processor: RequestHandler | None = None
        self.channels: set[Channel] = set()
        self.on_channel_closed = on_channel_closed
        # Checked before a request is served (the broker's fast failure); None: no check.
        self.admission: Admission | None = None
        # Called before the processor of every served code (the broker's ACL); it returns None
        # to serve the request, or the answer that refuses it.  None (the default): no check,
        # and connections dispatch without looking for one.
        self.access_check: AccessCheck | None = None
        # Called around each run of frames a connection serves (Channel.run_hooks); None: none.
        self.run_hooks: RunHooks | None = None

    def register(
        self,
        code: int,
        handler: RequestHandler,
        *,
        inline: InlineHandler | None = None,
        run: RunHandler | None = None,
        header: type | None = None,
    ) -> None:
        """Serve ``code`` as ``Route(handler, header, inline, run)`` says: :meth:`add_routes`
        of one row."""
        self.add_routes({code: Route(handler, header, inline, run)})

    def add_routes(self, table: dict[int, Route]) -> None:
        """Add rows to the registration table (a route without a header class takes the one
        :data:`REQUEST_HEADERS` names for its code).  A server has one run handler at most:
        every code that names one names the same (it reads each frame and stops at any code
        it does not serve)."""
        routes = dict(self.routes)
        for code, route in table.items():
            if route.header is None and int(code) in REQUEST_HEADERS:
                route = attrs.evolve(route, header=REQUEST_HEADERS[int(code)])
            routes[int(code)] = route
        runs: list[RunHandler] = []
        for route in routes.values():
            if route.run is not None and route.run not in runs:
                runs.append(route.run)
        if len(runs) > 1:
            raise ValueError(f"a server has one run handler at most, not {runs}")
        self.routes = routes
        self._run_handler = runs[0] if runs else None

    def _channel_run_handler(self) -> RawRunHandler | None:
        """The run handler a new connection offers its runs (``Channel.raw_run_handler``):
        the routes' one, the access check (if any) passed to it."""
        run, check = self._run_handler, self.access_check
        if run is None or check is None:
            return run  # its check defaults to None
        return partial(run, check=check)

    def dispatch_inline(
        self, channel: Channel, request: RemotingCommand
    ) -> RemotingCommand | bytes | None:
        route = self.routes.get(request.code)
        if route is None or route.inline is None:
            return None
        decode_request(request, route.header)
        return route.inline(channel, request)

    async def dispatch(self, channel: Channel, request: RemotingCommand) -> RemotingCommand | None:
        route = self.routes.get(request.code)
        if route is None:
            if self.default_processor is None:
                return request.response(
                    ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                    f"request type {request.code} not supported",
                )
            decode_request(request)
            return await self.default_processor(channel, request)
        decode_request(request, route.header)
        return await route.handler(channel, request)

    def _dispatch_inline_checked(
        self, channel: Channel, request: RemotingCommand
    ) -> RemotingCommand | bytes | None:
        route = self.routes.get(request.code)
        if route is None or route.inline is None:
            return None
        assert self.access_check is not None
        if not request.access_checked:  # a run handler may have checked it
            refusal = self.access_check(channel, request)
            if refusal is not None:
                return refusal
        decode_request(request, route.header)
        response = route.inline(channel, request)
        if response is None:
            request.access_checked = True  # served by a task next: checked once is enough
        return response

    async def _dispatch_checked(
        self, channel: Channel, request: RemotingCommand
    ) -> RemotingCommand | None:
        if request.code in self.routes or self.default_processor is not None:
            assert self.access_check is not None
            if not request.access_checked:
                refusal = self.access_check(channel, request)
                if refusal is not None:
                    return refusal
        return await self.dispatch(channel, request)

    async def _serve_stream(self, stream: trio.SocketStream) -> None:
        served = await self._admit(stream, len(self.channels), self.max_connections)
        if served is None:
            return
        try:
            checked = self.access_check is not None
            channel = Channel(
                served,
                self._dispatch_checked if checked else self.dispatch,
                idle_timeout=self.idle_timeout,
                limits=self.limits,
                budget=self.budget,
                admission=self.admission,
                raw_run_handler=self._channel_run_handler(),
                inline_handler=self._dispatch_inline_checked if checked else self.dispatch_inline,
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
