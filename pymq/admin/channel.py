"""AdminChannel: the broker's admin websocket (``/ws``) and the console's static files (``/``).

One TCP listener on ``adminBindAddress:adminListenPort`` (127.0.0.1 by default), run as a task in
the broker's nursery.  Each connection gets a task that reads the HTTP request head; a websocket
upgrade is handed to trio-websocket (the head is replayed to it), anything else is answered from
``static/`` and closed.

Authentication: the token comes as ``/ws?token=...`` (a wrong one is rejected with 403 before the
upgrade) or as the first message ``{"type": "auth", "params": {"token": ...}}``; until then every
other request is answered with an UNAUTHORIZED error, and three wrong tokens close the socket
with code 1008.

Ownership: the connection task owns its stream and its websocket; on return or cancellation it
closes the websocket with a close handshake (shielded, bounded by ``CLOSE_TIMEOUT``) and then the
stream.  Outgoing messages pass through a bounded memory channel of ``SEND_QUEUE_SIZE`` into one
writer task, which is the backpressure: when a client stops reading, subscriptions block.  Once
authenticated, up to ``MAX_IN_FLIGHT`` requests of a connection run concurrently.
"""

from __future__ import annotations

import logging
import mimetypes
import os
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, wrap_server_stream

from pymq.admin.auth import load_or_create_token, token_matches
from pymq.admin.session import AdminSession

if TYPE_CHECKING:
    from pymq.broker.controller import BrokerController

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).with_name("static")
WEBSOCKET_PATH = "/ws"
# An HTTP request head larger than this, or slower than HEAD_TIMEOUT, is dropped.
MAX_HEAD_BYTES = 16 * 1024
HEAD_TIMEOUT = 10.0
# trio-websocket's inbound queue, and our outbound one (messages, not bytes).
RECEIVE_QUEUE_SIZE = 16
SEND_QUEUE_SIZE = 64
# Requests are small; a console never sends more than a config update.
MAX_MESSAGE_SIZE = 1024 * 1024
CLOSE_TIMEOUT = 2.0
# Requests of one connection handled at once; beyond that the reader stops reading.
MAX_IN_FLIGHT = 8
POLICY_VIOLATION = 1008

_SECURITY_HEADERS = (
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-cache"),
    (
        "Content-Security-Policy",
        "default-src 'self'; connect-src 'self' ws: wss:; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:",
    ),
)


class _ReplayStream(trio.abc.Stream):
    """A stream that first yields bytes already read from ``inner`` (the request head)."""

    def __init__(self, inner: trio.SocketStream, prefix: bytes) -> None:
        self.inner = inner
        self._prefix = prefix

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._prefix:
            size = len(self._prefix) if max_bytes is None else max_bytes
            data, self._prefix = self._prefix[:size], self._prefix[size:]
            return data
        return await self.inner.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def aclose(self) -> None:
        await self.inner.aclose()


class AdminChannel:
    def __init__(
        self, broker: BrokerController, *, port: int | None = None, host: str | None = None
    ) -> None:
        config = broker.broker_config
        self.broker = broker
        self.host = host or config.admin_bind_address
        self.requested_port = config.admin_listen_port if port is None else port
        self.port = 0
        self.token = ""

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "", "::") else self.host
        return f"http://{host}:{self.port}/"

    @property
    def console_url(self) -> str:
        """The console's address with the token in the fragment (never sent to the server)."""
        return f"{self.url}#token={self.token}"

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        self.token = await trio.to_thread.run_sync(
            load_or_create_token,
            self.broker.broker_config.admin_token,
            self.broker.store_config.config_dir,
        )
        listeners = await trio.open_tcp_listeners(self.requested_port, host=self.host)
        self.port = listeners[0].socket.getsockname()[1]
        log.info("admin console at %s", self.url)
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._handle_connection, listeners)
            task_status.started(self.port)

    async def _handle_connection(self, stream: trio.SocketStream) -> None:
        try:
            with trio.move_on_after(HEAD_TIMEOUT):
                head = await _read_head(stream)
            if head is None:
                return
            method, target, headers, raw = head
            path = urlsplit(target).path
            if headers.get("upgrade", "").lower() == "websocket":
                if path != WEBSOCKET_PATH:
                    await _respond(stream, 404, b"not found\n", "text/plain")
                    return
                await self._serve_websocket(_ReplayStream(stream, raw), target)
            else:
                await self._serve_static(stream, method, path)
        except* (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionClosed):
            pass  # the client went away: nothing to report
        except* Exception:
            log.exception("admin connection failed")
        finally:
            await stream.aclose()

    # -- static files -------------------------------------------------------------------------

    async def _serve_static(self, stream: trio.SocketStream, method: str, path: str) -> None:
        if method not in ("GET", "HEAD"):
            await _respond(stream, 405, b"method not allowed\n", "text/plain")
            return
        name = "index.html" if path in ("/", "") else path.lstrip("/")
        file = (STATIC_DIR / name).resolve()
        if STATIC_DIR.resolve() not in file.parents or not file.is_file():
            await _respond(stream, 404, b"not found\n", "text/plain")
            return
        body = await trio.to_thread.run_sync(file.read_bytes)
        kind = mimetypes.guess_type(file.name)[0] or "application/octet-stream"
        if kind.startswith("text/") or kind.endswith("javascript"):
            kind += "; charset=utf-8"
        await _respond(stream, 200, body, kind, head_only=method == "HEAD")

    # -- websocket ----------------------------------------------------------------------------

    async def _serve_websocket(self, stream: trio.abc.Stream, target: str) -> None:
        presented = parse_qs(urlsplit(target).query).get("token", [None])[0]
        async with trio.open_nursery() as nursery:
            request = await wrap_server_stream(
                nursery,
                stream,
                message_queue_size=RECEIVE_QUEUE_SIZE,
                max_message_size=MAX_MESSAGE_SIZE,
            )
            if presented is not None and not token_matches(self.token, presented):
                await request.reject(403, body=b"wrong admin token\n")
                nursery.cancel_scope.cancel()
                return
            ws = await request.accept()
            try:
                await self._converse(ws, authenticated=presented is not None)
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT):
                    await ws.aclose()
                nursery.cancel_scope.cancel()

    async def _converse(self, ws: WebSocketConnection, *, authenticated: bool) -> None:
        outgoing, queued = trio.open_memory_channel[str | None](SEND_QUEUE_SIZE)
        writer_done = trio.Event()
        async with trio.open_nursery() as nursery:

            async def write_then_stop() -> None:
                # A client that went away stops the whole conversation, readers included.
                await _write_messages(ws, queued)
                writer_done.set()
                nursery.cancel_scope.cancel()

            nursery.start_soon(write_then_stop)
            session = AdminSession(
                self.broker, self.token, outgoing.send, nursery, authenticated=authenticated
            )
            in_flight = trio.Semaphore(MAX_IN_FLIGHT)

            async def handle(message: str | bytes) -> None:
                try:
                    await session.handle_message(message)
                finally:
                    in_flight.release()

            try:
                while True:
                    try:
                        message = await ws.get_message()
                    except ConnectionClosed:
                        break
                    await in_flight.acquire()  # the reader waits while too many are running
                    if session.authenticated:
                        # Concurrent, so that a slow request (a remote broker that does not
                        # answer) does not hold up the others; answers carry their ids.
                        nursery.start_soon(handle, message)
                        continue
                    await handle(message)  # in order until authenticated
                    if session.too_many_auth_failures:
                        # The writer sends the last error, then closes (None is its cue).
                        await outgoing.send(None)
                        with trio.move_on_after(CLOSE_TIMEOUT):
                            await writer_done.wait()
                        break
            finally:
                session.close()
                nursery.cancel_scope.cancel()


async def _write_messages(
    ws: WebSocketConnection, queued: trio.MemoryReceiveChannel[str | None]
) -> None:
    """Send queued messages in order; None closes the socket as a policy violation."""
    async with queued:
        async for message in queued:
            try:
                if message is None:
                    await ws.aclose(POLICY_VIOLATION, "too many wrong tokens")
                    return
                await ws.send_message(message)
            except ConnectionClosed:
                return


async def _read_head(stream: trio.SocketStream) -> tuple[str, str, dict[str, str], bytes] | None:
    """The request line, headers and raw bytes of one HTTP request head, or None."""
    raw = b""
    while b"\r\n\r\n" not in raw:
        if len(raw) > MAX_HEAD_BYTES:
            await _respond(stream, 431, b"request head too large\n", "text/plain")
            return None
        chunk = await stream.receive_some(4096)
        if not chunk:
            return None
        raw += chunk
    head = raw.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    lines = head.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        await _respond(stream, 400, b"bad request\n", "text/plain")
        return None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return parts[0], parts[1], headers, raw


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}


async def _respond(
    stream: trio.SocketStream, status: int, body: bytes, kind: str, *, head_only: bool = False
) -> None:
    lines = [
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}",
        f"Content-Type: {kind}",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *(f"{k}: {v}" for k, v in _SECURITY_HEADERS),
    ]
    data = ("\r\n".join(lines) + "\r\n\r\n").encode()
    await stream.send_all(data if head_only else data + body)


def console_files() -> list[str]:
    """The console's files (for packaging checks)."""
    return sorted(os.listdir(STATIC_DIR))
