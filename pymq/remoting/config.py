"""NettyServerConfig and NettyClientConfig: RocketMQ's keys and defaults for the remoting layer.

Thread-pool and buffer keys are accepted so that RocketMQ config files load unchanged; pymq runs
on one Trio loop and has no thread pools to size, so they are reported by ``-p`` but not used.
"""

from __future__ import annotations

import attrs


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
    use_epoll_native_selector: bool = False


@attrs.define
class NettyClientConfig:
    client_worker_threads: int = 4
    client_oneway_semaphore_value: int = 65535
    client_async_semaphore_value: int = 65535
    connect_timeout_millis: int = 3000
    channel_not_active_interval: int = 60000
    client_channel_max_idle_time_seconds: int = 120
    client_close_socket_if_timeout: bool = True
