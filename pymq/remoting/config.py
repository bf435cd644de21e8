"""NettyServerConfig and NettyClientConfig: RocketMQ's keys and defaults for the remoting layer.

Thread-pool and buffer keys are accepted so that RocketMQ config files load unchanged; pymq runs
on one Trio loop and has no thread pools to size, so they are reported by ``-p`` but not used.
"""

from __future__ import annotations

import os
from typing import Any

import attrs

from pymq.remoting.codec import FRAME_MAX_LENGTH
from pymq.remoting.limits import MIB, ConnectionLimits, SharedBudget


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
        """The keyword arguments that bound a RemotingServer."""
        return {
            "idle_timeout": self.server_channel_max_idle_time_seconds,
            "limits": self.connection_limits(),
            "max_connections": self.server_max_connections,
        }


@attrs.define
class NettyClientConfig:
    client_worker_threads: int = 4
    client_oneway_semaphore_value: int = 65535
    client_async_semaphore_value: int = 65535
    connect_timeout_millis: int = 3000
    channel_not_active_interval: int = 60000
    client_channel_max_idle_time_seconds: int = 120
    client_close_socket_if_timeout: bool = True
    # Accepted, not used (pymq's client side is one Trio loop, without TLS yet).
    client_callback_executor_threads: int = attrs.Factory(lambda: os.cpu_count() or 1)
    client_socket_snd_buf_size: int = 0
    client_socket_rcv_buf_size: int = 0
    client_pooled_byte_buf_allocator_enable: bool = False
    use_tls: bool = attrs.field(default=False, metadata={"key": "useTLS"})
