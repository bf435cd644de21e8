"""AdminChannel: the broker's admin websocket (``/ws``) and the console's static files (``/``).

One TCP listener on ``adminBindAddress:adminListenPort`` (127.0.0.1 by default), run as a task in
the broker's nursery: :func:`attach_admin_channel` hands it to the broker as a front-end (the
broker itself never imports this package).  Each connection gets a task that reads the HTTP
request head; a websocket upgrade is handed to trio-websocket (the head is replayed to it),
anything else is answered from ``static/`` and closed.

Authentication: the token comes as ``/ws?token=...`` (a wrong one is rejected with 403 before the
upgrade) or as the first message ``{"type": "auth", "params": {"token": ...}}``; until then every
other request is answered with an UNAUTHORIZED error, and three wrong tokens close the socket
with code 1008.

Hardening (every limit is an ``admin*`` key of BrokerConfig, read at start into AdminLimits):

- Host and Origin are checked on the request head, before any upgrade and for the static pages
  too.  Host must name this console: localhost, 127.0.0.1 or [::1], the bind address, or the IP
  address the connection arrived on, each with the console's port (a DNS name pointing at us,
  as in DNS rebinding, is not one of them), or an entry of ``adminAllowedHosts``.  An Origin
  header, when present (browsers always send one; the CLI and scripts need not), must be
  http(s) on such a host, or be listed in ``adminAllowedOrigins``.  Anything else is answered
  403 and logged once per distinct value.
- A connection that has not authenticated ``adminAuthTimeoutMillis`` after it was accepted is
  closed, whatever it is stuck in: the request head, the handshake, a websocket frame.
- Wrong tokens are counted per client address (:class:`~pymq.admin.auth.AuthThrottle`): the
  ``adminAuthFailuresBeforeDelay``-th locks the address out for a delay that doubles with each
  further wrong token, and a locked-out address is refused even the right token.
- At most ``adminMaxConnections`` connections, of which ``adminMaxUnauthenticatedConnections``
  unauthenticated; one more is answered 503 and closed.  Request heads are bounded by
  ``adminMaxRequestHeadBytes``, websocket messages by ``adminMaxMessageBytes``.
- Anything raised while serving one connection closes that connection with one log line; it
  never reaches the broker's nursery.

Ownership: the connection task owns its stream and its websocket; on return or cancellation it
closes the websocket with a close handshake (shielded, bounded by ``CLOSE_TIMEOUT``) and then the
stream.  Outgoing messages pass through a bounded memory channel of ``SEND_QUEUE_SIZE`` into one
writer task, which is the backpressure: when a client stops reading, subscriptions block.  Once
authenticated, up to ``MAX_IN_FLIGHT`` requests of a connection run concurrently.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import mimetypes
import os
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

import attrs
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, wrap_server_stream

from pymq.admin.auth import AuthThrottle, load_or_create_token, token_matches
from pymq.admin.session import AdminSession
from pymq.common.config import ConfigError

if TYPE_CHECKING:
    from pymq.broker.config import BrokerConfig
    from pymq.broker.controller import BrokerController

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).with_name("static")
WEBSOCKET_PATH = "/ws"
# trio-websocket's inbound queue, and our outbound one (messages, not bytes).
RECEIVE_QUEUE_SIZE = 16
SEND_QUEUE_SIZE = 64
CLOSE_TIMEOUT = 2.0
# Requests of one connection handled at once; beyond that the reader stops reading.
MAX_IN_FLIGHT = 8
POLICY_VIOLATION = 1008
# The names that always mean this machine; with the console's port they are always accepted.
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
# Refused Host/Origin values logged at WARNING (once each); later new ones go to DEBUG.
MAX_LOGGED_REFUSALS = 256

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


@attrs.frozen
class AdminLimits:
    """The channel's limits, read from BrokerConfig's ``admin*`` keys at start (and checked)."""

    auth_timeout: float
    failures_before_delay: int
    auth_delay: float
    auth_max_delay: float
    throttle_max_addresses: int
    max_connections: int
    max_unauthenticated: int
    max_message_bytes: int
    max_head_bytes: int
    # (host, port or None for any port), and (scheme, host, port) of listed origins.
    allowed_hosts: frozenset[tuple[str, int | None]]
    allowed_origins: frozenset[tuple[str, str, int]]

    @classmethod
    def from_config(cls, config: BrokerConfig) -> AdminLimits:
        def positive(key: str, value: int) -> int:
            if value <= 0:
                raise ConfigError(f"{key} must be > 0, not {value}")
            return value

        hosts = set()
        for entry in _comma_list(config.admin_allowed_hosts):
            parsed = _parse_authority(entry)
            if parsed is None:
                raise ConfigError(f"adminAllowedHosts: {entry!r} is not a host or host:port")
            hosts.add(parsed)
        origins = set()
        for entry in _comma_list(config.admin_allowed_origins):
            origin = _parse_origin(entry)
            if origin is None:
                raise ConfigError(
                    f"adminAllowedOrigins: {entry!r} is not an origin (http[s]://host[:port])"
                )
            origins.add(origin)
        return cls(
            auth_timeout=positive("adminAuthTimeoutMillis", config.admin_auth_timeout_millis)
            / 1000,
            failures_before_delay=positive(
                "adminAuthFailuresBeforeDelay", config.admin_auth_failures_before_delay
            ),
            auth_delay=positive("adminAuthDelayMillis", config.admin_auth_delay_millis) / 1000,
            auth_max_delay=positive("adminAuthMaxDelayMillis", config.admin_auth_max_delay_millis)
            / 1000,
            throttle_max_addresses=positive(
                "adminAuthThrottleMaxAddresses", config.admin_auth_throttle_max_addresses
            ),
            max_connections=positive("adminMaxConnections", config.admin_max_connections),
            max_unauthenticated=positive(
                "adminMaxUnauthenticatedConnections", config.admin_max_unauthenticated_connections
            ),
            max_message_bytes=positive("adminMaxMessageBytes", config.admin_max_message_bytes),
            max_head_bytes=positive(
                "adminMaxRequestHeadBytes", config.admin_max_request_head_bytes
            ),
            allowed_hosts=frozenset(hosts),
            allowed_origins=frozenset(origins),
        )


def _comma_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _parse_authority(text: str) -> tuple[str, int | None] | None:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port`` as (lowercase host, port or None)."""
    if not text or any(c in text for c in "/?#@\\ \t") or text != text.strip():
        return None
    host, port_text = text, ""
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            return None
        host, rest = text[1:close], text[close + 1 :]
        if rest and not rest.startswith(":"):
            return None
        port_text = rest[1:] if rest else ""
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return None
        if rest and not port_text:
            return None
    elif ":" in text:
        host, _, port_text = text.rpartition(":")
        if not port_text or ":" in host:
            return None
    if not host:
        return None
    if not port_text:
        return host.lower(), None
    if not port_text.isascii() or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return None
    return host.lower(), int(port_text)


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _parse_origin(text: str) -> tuple[str, str, int] | None:
    """An Origin value ``scheme://host[:port]`` as (scheme, host, port); None if it is not one."""
    scheme, sep, authority = text.strip().rstrip("/").partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in _DEFAULT_PORTS:
        return None
    parsed = _parse_authority(authority)
    if parsed is None:
        return None
    host, port = parsed
    return scheme, host, _DEFAULT_PORTS[scheme] if port is None else port


def _same_ip(name: str, address: str) -> bool:
    """Whether ``name`` is an IP literal for ``address`` (IPv4-mapped IPv6 counts as IPv4)."""

    def norm(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
        try:
            ip = ipaddress.ip_address(text.split("%", 1)[0])
        except ValueError:
            return None
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        return ip

    a, b = norm(name), norm(address)
    return a is not None and a == b


class _RefusalLog:
    """Logs each distinct refused value once, remembering at most MAX_LOGGED_REFUSALS of them."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, str]] = set()

    def refused(self, what: str, value: str, peer: str) -> None:
        key = (what, value[:200])
        if key in self._seen:
            return
        if len(self._seen) >= MAX_LOGGED_REFUSALS:
            log.debug("admin channel refused %s %r from %s", what, value[:200], peer)
            return
        self._seen.add(key)
        log.warning(
            "admin channel refused %s %r from %s with 403 (logged once per value)",
            what,
            value[:200],
            peer,
        )


@attrs.define
class _Connection:
    """One admin connection's bookkeeping: who, where, and until when it may stay anonymous."""

    peer: str
    local: str
    deadline: float
    authenticated: bool = False


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
        self.limits = AdminLimits.from_config(config)
        self.throttle = AuthThrottle(
            failures_before_delay=self.limits.failures_before_delay,
            base_delay=self.limits.auth_delay,
            max_delay=self.limits.auth_max_delay,
            max_addresses=self.limits.throttle_max_addresses,
            clock=trio.current_time,
        )
        self.connections = 0
        self.unauthenticated = 0
        self._refusals = _RefusalLog()
        # The console's files, read once at start: name -> (body, content type).
        self._static: dict[str, tuple[bytes, str]] = {}

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
        self._static = await trio.to_thread.run_sync(_load_static)
        listeners = await trio.open_tcp_listeners(self.requested_port, host=self.host)
        self.port = listeners[0].socket.getsockname()[1]
        log.info("admin console at %s", self.url)
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._handle_connection, listeners)
            task_status.started(self.port)

    # -- connections --------------------------------------------------------------------------

    async def _handle_connection(self, stream: trio.SocketStream) -> None:
        # The boundary: nothing raised while serving this connection leaves this method.
        try:
            peer = _address(stream, peer=True)
            if (
                self.connections >= self.limits.max_connections
                or self.unauthenticated >= self.limits.max_unauthenticated
            ):
                with trio.move_on_after(CLOSE_TIMEOUT):
                    await _respond(stream, 503, b"too many admin connections\n", "text/plain")
                return
            conn = _Connection(
                peer, _address(stream, peer=False), trio.current_time() + self.limits.auth_timeout
            )
            self.connections += 1
            self.unauthenticated += 1
            try:
                await self._serve(stream, conn)
            finally:
                self.connections -= 1
                if not conn.authenticated:
                    self.unauthenticated -= 1
        except* (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionClosed):
            pass  # the client went away: nothing to report
        except* Exception:
            log.exception("admin connection failed")
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()

    def _authenticated(self, conn: _Connection) -> None:
        if not conn.authenticated:
            conn.authenticated = True
            self.unauthenticated -= 1

    async def _serve(self, stream: trio.SocketStream, conn: _Connection) -> None:
        with trio.move_on_at(conn.deadline) as scope:
            head = await _read_head(stream, self.limits.max_head_bytes)
        if scope.cancelled_caught:
            log.debug("admin connection from %s: no request head in time", conn.peer)
            return
        if head is None:
            return
        method, target, headers, raw = head
        refusal = self._refusal(headers, conn)
        if refusal is not None:
            with trio.move_on_at(conn.deadline):
                await _respond(stream, *refusal, "text/plain")
            return
        path = urlsplit(target).path
        if headers.get("upgrade", "").lower() == "websocket":
            if path != WEBSOCKET_PATH:
                with trio.move_on_at(conn.deadline):
                    await _respond(stream, 404, b"not found\n", "text/plain")
                return
            await self._serve_websocket(_ReplayStream(stream, raw), target, conn)
        else:
            with trio.move_on_at(conn.deadline):
                await self._serve_static(stream, method, path)

    def _refusal(self, headers: dict[str, str], conn: _Connection) -> tuple[int, bytes] | None:
        """Why this request head is refused (status, body), or None if Host and Origin pass."""
        host = headers.get("host")
        if host is None:
            return 400, b"missing Host header\n"
        parsed = _parse_authority(host)
        if parsed is None or not self._host_allowed(parsed[0], parsed[1] or 80, conn.local):
            self._refusals.refused("Host", host, conn.peer)
            return 403, b"Host not allowed\n"
        origin = headers.get("origin")
        if origin is not None and not self._origin_allowed(origin, conn.local):
            self._refusals.refused("Origin", origin, conn.peer)
            return 403, b"Origin not allowed\n"
        return None

    def _host_allowed(self, host: str, port: int, local: str) -> bool:
        """Whether ``host:port`` names this console (see the module's docstring)."""
        for name, allowed_port in self.limits.allowed_hosts:
            if host == name and (allowed_port is None or allowed_port == port):
                return True
        if port != self.port:
            return False
        bind = self.host.strip("[]").lower()
        return host in LOOPBACK_NAMES or host == bind or _same_ip(host, local)

    def _origin_allowed(self, origin: str, local: str) -> bool:
        parsed = _parse_origin(origin)
        if parsed is None:
            return False
        return parsed in self.limits.allowed_origins or self._host_allowed(
            parsed[1], parsed[2], local
        )

    # -- static files -------------------------------------------------------------------------

    async def _serve_static(self, stream: trio.SocketStream, method: str, path: str) -> None:
        if method not in ("GET", "HEAD"):
            await _respond(stream, 405, b"method not allowed\n", "text/plain")
            return
        name = "index.html" if path in ("/", "") else path.lstrip("/")
        found = self._static.get(name)
        if found is None:
            await _respond(stream, 404, b"not found\n", "text/plain")
            return
        body, kind = found
        await _respond(stream, 200, body, kind, head_only=method == "HEAD")

    # -- websocket ----------------------------------------------------------------------------

    async def _serve_websocket(
        self, stream: trio.abc.Stream, target: str, conn: _Connection
    ) -> None:
        presented = parse_qs(urlsplit(target).query).get("token", [None])[0]
        async with trio.open_nursery() as nursery:
            with trio.move_on_at(conn.deadline) as scope:
                request = await wrap_server_stream(
                    nursery,
                    stream,
                    message_queue_size=RECEIVE_QUEUE_SIZE,
                    max_message_size=self.limits.max_message_bytes,
                )
                if presented is not None:
                    refusal = self._check_url_token(presented, conn)
                    if refusal is not None:
                        status, headers, body = refusal
                        await request.reject(status, extra_headers=headers, body=body)
                        nursery.cancel_scope.cancel()
                        return
                    self._authenticated(conn)
                ws = await request.accept()
            if scope.cancelled_caught:
                log.debug("admin connection from %s: no websocket handshake in time", conn.peer)
                nursery.cancel_scope.cancel()
                return
            try:
                await self._converse(ws, conn)
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT):
                    await ws.aclose()
                nursery.cancel_scope.cancel()

    def _check_url_token(
        self, presented: str, conn: _Connection
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes] | None:
        """The rejection of a ``?token=`` (status, headers, body), or None when it is right."""
        wait = self.throttle.retry_after(conn.peer)
        if wait > 0:
            retry = str(math.ceil(wait))
            body = f"too many wrong admin tokens from this address; retry in {retry} s\n"
            return 429, [(b"Retry-After", retry.encode())], body.encode()
        if not token_matches(self.token, presented):
            self.throttle.failed(conn.peer)
            return 403, [], b"wrong admin token\n"
        self.throttle.succeeded(conn.peer)
        return None

    async def _converse(self, ws: WebSocketConnection, conn: _Connection) -> None:
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
                self.broker,
                self.token,
                outgoing.send,
                nursery,
                authenticated=conn.authenticated,
                throttle=self.throttle,
                peer=conn.peer,
            )
            in_flight = trio.Semaphore(MAX_IN_FLIGHT)

            async def handle(message: str | bytes) -> None:
                try:
                    await session.handle_message(message)
                finally:
                    in_flight.release()

            try:
                # Until it authenticates, the connection lives until its deadline at most,
                # whatever it is doing (a frame that never ends, a reply it does not read).
                deadline = math.inf if conn.authenticated else conn.deadline
                with trio.CancelScope(deadline=deadline) as anonymous:
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
                        if session.authenticated:
                            self._authenticated(conn)
                            anonymous.deadline = math.inf
                        elif session.too_many_auth_failures:
                            # The writer sends the last error, then closes (None is its cue).
                            await outgoing.send(None)
                            with trio.move_on_after(CLOSE_TIMEOUT):
                                await writer_done.wait()
                            break
                if anonymous.cancelled_caught:
                    log.debug("admin connection from %s: not authenticated in time", conn.peer)
                    with trio.move_on_after(CLOSE_TIMEOUT):
                        await ws.aclose(POLICY_VIOLATION, "not authenticated in time")
            finally:
                session.close()
                nursery.cancel_scope.cancel()


def attach_admin_channel(
    broker: BrokerController, *, port: int | None = None
) -> AdminChannel | None:
    """The admin channel of ``broker``, added to its front-ends, when adminListenPort is set,
    or on ``port`` when given (0: any free port).

    Call before ``broker.run()``; the broker starts it once its own servers are up.
    """
    if port is None and not broker.broker_config.admin_listen_port:
        return None
    channel = AdminChannel(broker, port=port)
    broker.front_ends.append(channel)
    return channel


def _load_static() -> dict[str, tuple[bytes, str]]:
    """Blocking: the console's files (a flat directory) with their content types."""
    files: dict[str, tuple[bytes, str]] = {}
    for file in sorted(STATIC_DIR.iterdir()):
        if file.is_file():
            kind = mimetypes.guess_type(file.name)[0] or "application/octet-stream"
            if kind.startswith("text/") or kind.endswith("javascript"):
                kind += "; charset=utf-8"
            files[file.name] = (file.read_bytes(), kind)
    return files


def _address(stream: trio.SocketStream, *, peer: bool) -> str:
    """The peer's (or our own) IP address of a TCP stream, as text."""
    try:
        address = stream.socket.getpeername() if peer else stream.socket.getsockname()
    except OSError:
        return "?"
    return str(address[0]) if isinstance(address, tuple) else str(address)


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


async def _read_head(
    stream: trio.SocketStream, max_bytes: int
) -> tuple[str, str, dict[str, str], bytes] | None:
    """The request line, headers and raw bytes of one HTTP request head, or None.

    A head over ``max_bytes`` is answered 431, a malformed one (or one naming Host, Origin or
    Upgrade twice) 400; None then, and when the client closes first.
    """
    raw = b""
    while (end := raw.find(b"\r\n\r\n")) < 0:
        if len(raw) > max_bytes:
            await _respond(stream, 431, b"request head too large\n", "text/plain")
            return None
        chunk = await stream.receive_some(4096)
        if not chunk:
            return None
        raw += chunk
    if end > max_bytes:
        await _respond(stream, 431, b"request head too large\n", "text/plain")
        return None
    head = raw[:end].decode("latin-1")
    lines = head.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        await _respond(stream, 400, b"bad request\n", "text/plain")
        return None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        name = name.strip().lower()
        if not colon or (name in _SINGLE_HEADERS and name in headers):
            await _respond(stream, 400, b"bad request header\n", "text/plain")
            return None
        headers[name] = value.strip()
    return parts[0], parts[1], headers, raw


# Headers the checks rely on: a request naming one twice is refused, not guessed at.
_SINGLE_HEADERS = frozenset({"host", "origin", "upgrade"})

_REASONS = {
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


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
