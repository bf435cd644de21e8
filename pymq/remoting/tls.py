"""TLS on the remoting ports, with RocketMQ's ``tls.*`` settings (``TlsSystemConfig``).

Server side (broker and name server), ``tls.server.mode``:

* ``disabled`` (pymq's default): plain TCP only, and nothing of this module on the path;
* ``permissive``: one port takes both; the first byte of a connection decides, as RocketMQ's
  ``HandshakeHandler`` does: ``0x16`` (a TLS handshake record) is TLS, anything else plain;
* ``enforcing``: TLS only; a plain connection fails its handshake and is closed.

The certificate and key are ``tls.server.certPath`` / ``tls.server.keyPath`` (PEM; the key may be
encrypted with ``tls.server.keyPassword``); ``tls.server.need.client.auth`` (none, optional,
require) asks clients for a certificate signed by ``tls.server.trustCertPath``.  A handshake must
finish within :data:`HANDSHAKE_TIMEOUT`; a failed one closes that connection only.

Client side (the broker's requests to name servers and masters; pymq's own tools):
``tls.enable`` connects with TLS; ``tls.client.authServer`` verifies the server's certificate
against ``tls.client.trustCertPath`` (RocketMQ's default, false, does not); a client certificate
is ``tls.client.certPath`` / ``tls.client.keyPath`` / ``tls.client.keyPassword``.

RocketMQ reads these from JVM properties and from ``tls.config.file`` (default
``/etc/rocketmq/tls.properties``); pymq from its config files and flags, and then from
``tls.config.file`` when that file exists (its values win, as in RocketMQ).  Unlike RocketMQ, pymq
never makes a self-signed test certificate: ``tls.test.mode.enable=true`` is refused.
"""

from __future__ import annotations

import enum
import logging
import os
import socket
import ssl
from typing import Any

import attrs
import trio

from pymq.common.config import ConfigError
from pymq.common.properties import parse_properties

log = logging.getLogger(__name__)

# A TLS handshake (and, in permissive mode, the wait for a connection's first byte) must be done
# within this many seconds, or the connection is closed.
HANDSHAKE_TIMEOUT = 10.0
# The first byte of a TLS connection: a handshake record (RFC 8446, ContentType 22).
TLS_HANDSHAKE_RECORD = 0x16
DEFAULT_TLS_CONFIG_FILE = "/etc/rocketmq/tls.properties"


class TlsMode(enum.Enum):
    DISABLED = "disabled"
    PERMISSIVE = "permissive"
    ENFORCING = "enforcing"


_CLIENT_AUTH = {
    "none": ssl.CERT_NONE,
    "optional": ssl.CERT_OPTIONAL,
    "require": ssl.CERT_REQUIRED,
}


def _tls_field(key: str, default: Any) -> Any:
    return attrs.field(default=default, metadata={"key": key})


@attrs.define
class TlsSettings:
    """The ``tls.*`` keys, as RocketMQ names them (held by the Netty server and client configs)."""

    server_mode: str = _tls_field("tls.server.mode", "disabled")
    server_need_client_auth: str = _tls_field("tls.server.need.client.auth", "none")
    server_key_path: str = _tls_field("tls.server.keyPath", "")
    server_key_password: str = _tls_field("tls.server.keyPassword", "")
    server_cert_path: str = _tls_field("tls.server.certPath", "")
    server_trust_cert_path: str = _tls_field("tls.server.trustCertPath", "")
    client_enable: bool = _tls_field("tls.enable", False)
    client_key_path: str = _tls_field("tls.client.keyPath", "")
    client_key_password: str = _tls_field("tls.client.keyPassword", "")
    client_cert_path: str = _tls_field("tls.client.certPath", "")
    client_trust_cert_path: str = _tls_field("tls.client.trustCertPath", "")
    client_auth_server: bool = _tls_field("tls.client.authServer", False)
    test_mode_enable: bool = _tls_field("tls.test.mode.enable", False)
    config_file: str = _tls_field("tls.config.file", DEFAULT_TLS_CONFIG_FILE)


_KEY_TO_ATTR = {f.metadata["key"]: f.name for f in attrs.fields(TlsSettings)}
# Every tls.* key: read at start (a restart applies a change).
TLS_KEYS = frozenset(_KEY_TO_ATTR)


def resolved(settings: TlsSettings) -> TlsSettings:
    """``settings`` with the values of ``tls.config.file`` applied when that file exists."""
    path = settings.config_file
    if not path or not os.path.isfile(path):
        return settings
    try:
        with open(path, encoding="utf-8") as f:
            props = parse_properties(f.read())
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"tls.config.file {path}: cannot read: {exc}") from None
    changes: dict[str, Any] = {}
    for key, value in props.items():
        name = _KEY_TO_ATTR.get(key)
        if name is None or name == "config_file":
            continue
        if name in ("client_enable", "client_auth_server", "test_mode_enable"):
            changes[name] = value.strip().lower() == "true"
        else:
            changes[name] = value.strip()
    return attrs.evolve(settings, **changes)


def server_mode(settings: TlsSettings) -> TlsMode:
    try:
        return TlsMode(settings.server_mode.strip().lower())
    except ValueError:
        raise ConfigError(
            f"tls.server.mode must be disabled, permissive or enforcing, not "
            f"{settings.server_mode!r}"
        ) from None


def server_context(settings: TlsSettings) -> ssl.SSLContext | None:
    """The server's SSL context, or None when ``tls.server.mode`` is disabled; ConfigError when
    the settings cannot make one (no certificate, unreadable files, a wrong password)."""
    settings = resolved(settings)
    if server_mode(settings) is TlsMode.DISABLED:
        return None
    if settings.test_mode_enable:
        raise ConfigError(
            "tls.test.mode.enable=true: pymq makes no self-signed test certificate; give "
            "tls.server.certPath and tls.server.keyPath (and set tls.test.mode.enable=false)"
        )
    if not settings.server_cert_path or not settings.server_key_path:
        raise ConfigError(
            f"tls.server.mode={settings.server_mode} needs tls.server.certPath and "
            "tls.server.keyPath"
        )
    auth = _CLIENT_AUTH.get(settings.server_need_client_auth.strip().lower())
    if auth is None:
        raise ConfigError(
            "tls.server.need.client.auth must be none, optional or require, not "
            f"{settings.server_need_client_auth!r}"
        )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(
        ctx,
        settings.server_cert_path,
        settings.server_key_path,
        settings.server_key_password,
        "tls.server",
    )
    if auth is not ssl.CERT_NONE:
        if not settings.server_trust_cert_path:
            raise ConfigError(
                "tls.server.need.client.auth needs tls.server.trustCertPath (the CA that "
                "signs client certificates)"
            )
        _load_trust(ctx, settings.server_trust_cert_path, "tls.server.trustCertPath")
    ctx.verify_mode = auth
    return ctx


def client_context(settings: TlsSettings) -> ssl.SSLContext | None:
    """The client's SSL context when ``tls.enable`` is true, else None."""
    settings = resolved(settings)
    if not settings.client_enable:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if settings.client_auth_server:
        if settings.client_trust_cert_path:
            _load_trust(ctx, settings.client_trust_cert_path, "tls.client.trustCertPath")
        else:
            ctx.load_default_certs()
    else:
        # RocketMQ's default (tls.client.authServer=false): encrypted, server not verified.
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if settings.client_cert_path or settings.client_key_path:
        _load_chain(
            ctx,
            settings.client_cert_path,
            settings.client_key_path,
            settings.client_key_password,
            "tls.client",
        )
    return ctx


def _load_chain(ctx: ssl.SSLContext, cert: str, key: str, password: str, prefix: str) -> None:
    try:
        ctx.load_cert_chain(cert, key or None, password=password or None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"{prefix}.certPath {cert} / {prefix}.keyPath {key}: cannot load: {exc}"
        ) from None


def _load_trust(ctx: ssl.SSLContext, path: str, key: str) -> None:
    try:
        ctx.load_verify_locations(path)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{key} {path}: cannot load: {exc}") from None


# -- the Trio side -----------------------------------------------------------------------------


class TlsServer:
    """Wraps the streams a server accepts, by mode (permissive: by the first byte)."""

    def __init__(self, ctx: ssl.SSLContext, mode: TlsMode) -> None:
        assert mode is not TlsMode.DISABLED
        self.ctx = ctx
        self.mode = mode
        self.plain_connections = 0
        self.tls_connections = 0
        self.failed_handshakes = 0

    async def wrap(self, stream: trio.SocketStream) -> trio.abc.Stream | None:
        """The stream to serve (TLS or, permissive, plain), or None when the connection ended
        or its handshake failed (the caller closes it)."""
        with trio.move_on_after(HANDSHAKE_TIMEOUT):
            if self.mode is TlsMode.PERMISSIVE:
                try:
                    first = await stream.socket.recv(1, socket.MSG_PEEK)
                except OSError:
                    return None
                if not first:
                    return None
                if first[0] != TLS_HANDSHAKE_RECORD:
                    self.plain_connections += 1
                    return stream
            tls = trio.SSLStream(stream, self.ctx, server_side=True)
            try:
                await tls.do_handshake()
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self.failed_handshakes += 1
                log.debug("TLS handshake failed: %s", exc)
                return None
            self.tls_connections += 1
            return tls
        self.failed_handshakes += 1
        return None


async def client_handshake(
    stream: trio.SocketStream, ctx: ssl.SSLContext, host: str
) -> trio.SSLStream[trio.SocketStream]:
    """``stream`` with a finished TLS handshake (the caller bounds the time)."""
    server_hostname = host if ctx.check_hostname else None
    tls = trio.SSLStream(stream, ctx, server_hostname=server_hostname)
    await tls.do_handshake()
    return tls
