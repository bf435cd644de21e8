"""NettyServerConfig and NettyClientConfig: RocketMQ's keys and defaults for the remoting layer.

Thread-pool and buffer keys are accepted so that RocketMQ config files load unchanged; pymq runs
on one Trio loop and has no thread pools to size, so they are reported by ``-p`` but not used.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from typing import Any

import attrs

from pymq.common.config import set_key
from pymq.common.scheduling import TaskOrder
from pymq.remoting.codec import FRAME_MAX_LENGTH
from pymq.remoting.limits import MIB, ConnectionLimits, SharedBudget
from pymq.remoting.tls import (
    DEFAULT_TLS_CONFIG_FILE,
    TlsServer,
    TlsSettings,
    client_context,
    resolved,
    server_context,
    server_mode,
)

# The key of NettyServerConfig.server_task_order.
TASK_ORDER_KEY = "serverTaskOrder"


def _key(key: str, default: Any) -> Any:
    return attrs.field(default=default, metadata={"key": key})


def _tls_settings(config: object) -> TlsSettings:
    names = {f.name for f in attrs.fields(TlsSettings)}
    return TlsSettings(**{n: getattr(config, n) for n in names if hasattr(config, n)})


@attrs.define
class NettyServerConfig:
    listen_port: int = 8888
    bind_address: str = "0.0.0.0"
    server_worker_threads: int = 8
    server_callback_executor_threads: int = 0
    server_selector_threads: int = 3
    server_oneway_semaphore_value: int = 256
    server_async_semaphore_value: int = 64
    server_channel_max_idle_time_seconds: int = 120
    server_socket_snd_buf_size: int = 0
    server_socket_rcv_buf_size: int = 0
    server_pooled_byte_buf_allocator_enable: bool = True
    server_socket_backlog: int = 1024
    use_epoll_native_selector: bool = False
    # The bounds of what one peer, or all of them, can make the server hold (see
    # pymq.remoting.limits and README's "Operations: limits").  Netty's water-mark keys keep
    # RocketMQ's names; 0 there means the default, as RocketMQ's 0 means Netty's.
    write_buffer_high_water_mark: int = 4 * MIB
    write_buffer_low_water_mark: int = 1 * MIB
    write_stall_timeout_millis: int = 30_000
    server_total_write_buffer_max_bytes: int = 256 * MIB
    frame_max_length: int = FRAME_MAX_LENGTH
    frame_receive_timeout_millis: int = 60_000
    server_partial_frame_total_max_bytes: int = 128 * MIB
    server_max_pending_requests_per_connection: int = 4096
    server_max_connections: int = 10_000
    # The order the server process runs Trio's ready tasks in (pymq.common.scheduling): trio,
    # Trio's own randomised order (the default), or fifo, first-ready-first, an EXPERIMENTAL
    # opt-in that relies on Trio's private scheduling state (lower tail latency under load on
    # one benchmark).  Read by pymq's entry points before the loop starts; one value for the
    # whole process.
    server_task_order: TaskOrder = TaskOrder.TRIO
    # TLS on this server's port (RocketMQ's TlsSystemConfig keys; see pymq.remoting.tls).
    server_mode: str = _key("tls.server.mode", "disabled")
    server_need_client_auth: str = _key("tls.server.need.client.auth", "none")
    server_key_path: str = _key("tls.server.keyPath", "")
    server_key_password: str = _key("tls.server.keyPassword", "")
    server_cert_path: str = _key("tls.server.certPath", "")
    server_trust_cert_path: str = _key("tls.server.trustCertPath", "")
    test_mode_enable: bool = _key("tls.test.mode.enable", False)
    config_file: str = _key("tls.config.file", DEFAULT_TLS_CONFIG_FILE)

    def tls_settings(self) -> TlsSettings:
        return _tls_settings(self)

    def connection_limits(self) -> ConnectionLimits:
        default = ConnectionLimits()
        high = self.write_buffer_high_water_mark or default.write_high_water_mark
        low = self.write_buffer_low_water_mark or default.write_low_water_mark
        return ConnectionLimits(
            max_frame_length=self.frame_max_length or default.max_frame_length,
            write_high_water_mark=high,
            write_low_water_mark=min(low, high),
            write_stall_timeout=self.write_stall_timeout_millis / 1000,
            frame_receive_timeout=self.frame_receive_timeout_millis / 1000,
            max_pending_requests=self.server_max_pending_requests_per_connection,
        )

    def shared_budget(self) -> SharedBudget:
        return SharedBudget(
            write_total_max=self.server_total_write_buffer_max_bytes,
            partial_frame_total_max=self.server_partial_frame_total_max_bytes,
        )

    def server_limits(self) -> dict[str, Any]:
        """The keyword arguments that bound a RemotingServer (and secure it: its TLS, built
        from the ``tls.*`` keys; ConfigError when they cannot make a server context)."""
        return {
            "idle_timeout": self.server_channel_max_idle_time_seconds,
            "limits": self.connection_limits(),
            "max_connections": self.server_max_connections,
            "tls": self.tls_server(),
        }

    def tls_server(self) -> TlsServer | None:
        """The TLS wrapper of this server's connections; None when tls.server.mode=disabled."""
        settings = resolved(self.tls_settings())
        ctx = server_context(settings)
        return None if ctx is None else TlsServer(ctx, server_mode(settings))


def task_order_of(properties: Mapping[str, str]) -> TaskOrder:
    """The ``serverTaskOrder`` that ``properties`` give (its default when they give none);
    ConfigError, naming the values it may take, when the value is not one."""
    server = NettyServerConfig()
    if TASK_ORDER_KEY in properties:
        set_key(server, TASK_ORDER_KEY, properties[TASK_ORDER_KEY])
    return server.server_task_order


@attrs.define
class NettyClientConfig:
    client_worker_threads: int = 4
    client_oneway_semaphore_value: int = 65535
    client_async_semaphore_value: int = 65535
    connect_timeout_millis: int = 3000
    channel_not_active_interval: int = 60000
    client_channel_max_idle_time_seconds: int = 120
    client_close_socket_if_timeout: bool = True
    # TLS to the peers (RocketMQ's TlsSystemConfig keys; see pymq.remoting.tls).
    client_enable: bool = _key("tls.enable", False)
    client_key_path: str = _key("tls.client.keyPath", "")
    client_key_password: str = _key("tls.client.keyPassword", "")
    client_cert_path: str = _key("tls.client.certPath", "")
    client_trust_cert_path: str = _key("tls.client.trustCertPath", "")
    client_auth_server: bool = _key("tls.client.authServer", False)
    config_file: str = _key("tls.config.file", DEFAULT_TLS_CONFIG_FILE)

    def tls_settings(self) -> TlsSettings:
        return _tls_settings(self)

    def ssl_context(self) -> ssl.SSLContext | None:
        """The context to connect with when tls.enable is true, else None."""
        return client_context(self.tls_settings())

    # Accepted, not used: pymq's client side is one Trio loop (no executor threads or socket
    # buffer sizes of its own), and its TLS is switched on by tls.enable above (Java derives
    # useTLS from it too).
    client_callback_executor_threads: int = attrs.Factory(lambda: os.cpu_count() or 1)
    client_socket_snd_buf_size: int = 0
    client_socket_rcv_buf_size: int = 0
    client_pooled_byte_buf_allocator_enable: bool = False
    use_tls: bool = attrs.field(default=False, metadata={"key": "useTLS"})
