"""What every listening server of pymq shares: binding, serving its listeners in a nursery, and
admitting a new connection (the cap on open connections, which counts those still in their TLS
handshake, one warning per thousand refusals, and the TLS handshake).  The remoting servers
(RemotingServer) and the gRPC server (pymq.proxy) are built on it."""

from __future__ import annotations

import logging

import trio

from pymq.remoting.tls import TlsServer

log = logging.getLogger(__name__)


class ListeningServer:
    """A server's listening side.  A subclass sets ``host``, ``port``, ``name`` and ``tls``
    (None: plain TCP) and serves each connection in :meth:`_serve_stream`."""

    host: str
    port: int
    name: str
    tls: TlsServer | None

    def __init__(self) -> None:
        self.refused_connections = 0
        self._handshaking = 0  # connections in their TLS handshake, not yet served
        self._listeners: list[trio.SocketListener] | None = None

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
            await nursery.start(trio.serve_listeners, self._serve_stream, self._listeners)
            task_status.started(self.port)

    async def _serve_stream(self, stream: trio.SocketStream) -> None:
        raise NotImplementedError

    async def _admit(
        self, stream: trio.SocketStream, open_count: int, max_connections: int
    ) -> trio.abc.Stream | None:
        """``stream`` to serve (TLS-wrapped where TLS is on), or None, closed: past
        ``max_connections`` (connections still in their TLS handshake count too, up to its
        timeout each), or a handshake that failed, timed out, or was not TLS where TLS is
        enforced."""
        if open_count + self._handshaking >= max_connections:
            self.refused_connections += 1
            if self.refused_connections % 1000 == 1:  # one line per thousand, not a flood
                log.warning(
                    "%s: %d connections open (the most allowed); closing new ones (%d so far)",
                    self.name,
                    open_count,
                    self.refused_connections,
                )
            await trio.aclose_forcefully(stream)
            return None
        if self.tls is None:
            return stream
        self._handshaking += 1
        try:
            wrapped = await self.tls.wrap(stream)
        finally:
            self._handshaking -= 1
        if wrapped is None:
            await trio.aclose_forcefully(stream)
        return wrapped
