"""RocketMQ 5's gRPC messaging service, served by the broker itself (``grpcServerPort``).

RocketMQ 5's clients (the official Python client, PyPI ``rocketmq-python-client``, among them)
speak ``apache.rocketmq.v2.MessagingService`` over gRPC to a proxy.  pymq serves it from the
broker, in its nursery tree, on the broker's own services: :mod:`pymq.proxy.http2` is the
transport (HTTP/2 by pymq's sans-IO :mod:`pymq.proxy.h2server` on Trio, HPACK by ``hpack``),
:mod:`pymq.proxy.service` the RPCs and :mod:`pymq.proxy.convert` the mapping of 5.x messages
onto what 4.x stores.  The protobuf messages are pymq's own (:mod:`pymq.proxy.schema`, on
``protobuf``): no client package is imported.  The ``grpc`` extra installs what this package
needs (protobuf, hpack); nothing here is imported unless ``grpcServerPort`` is set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pymq.common.config import ConfigError

if TYPE_CHECKING:
    from pymq.broker.controller import BrokerController
    from pymq.proxy.http2 import GrpcLimits, GrpcServer
    from pymq.remoting.tls import TlsServer

# What a gRPC request message may add to the largest message body (maxMessageSize): the
# message's other fields (properties up to 32 KiB, ids, timestamps) and the request's framing.
REQUEST_OVERHEAD = 64 * 1024


def limits_for(broker: BrokerController) -> GrpcLimits:
    """The gRPC server's bounds from the broker's keys (the remoting ports' where they apply)."""
    from pymq.proxy.http2 import GrpcLimits

    server = broker.server_config
    return GrpcLimits(
        max_connections=server.server_max_connections,
        max_concurrent_streams=broker.broker_config.grpc_max_concurrent_streams,
        max_message_size=broker.store_config.max_message_size + REQUEST_OVERHEAD,
        receive_timeout=server.frame_receive_timeout_millis / 1000,
        write_stall_timeout=server.write_stall_timeout_millis / 1000,
        idle_timeout=server.server_channel_max_idle_time_seconds,
    )


def grpc_server(broker: BrokerController, budget: object) -> GrpcServer | None:
    """The broker's gRPC server when ``grpcServerPort`` is set (None when it is 0)."""
    port = broker.broker_config.grpc_server_port
    if not port:
        return None
    if port < 0 or port > 65535 or broker.broker_config.grpc_max_concurrent_streams < 1:
        raise ConfigError(
            f"grpcServerPort must be 0 (off) or a port (got {port}), and "
            "grpcMaxConcurrentStreams at least 1"
        )
    try:
        from pymq.proxy.http2 import GrpcServer
        from pymq.proxy.service import MessagingService
    except ImportError as exc:
        raise ConfigError(
            f"grpcServerPort={port} needs the grpc extra (pip install 'pymq[grpc]'): {exc}"
        ) from None
    from pymq.remoting.limits import SharedBudget

    assert isinstance(budget, SharedBudget)
    limits = limits_for(broker)
    server = GrpcServer(
        {},
        host=broker.server_config.bind_address,
        port=port,
        limits=limits,
        budget=budget,
        name="grpc",
        tls=grpc_tls(broker),
    )
    service = MessagingService(broker, limits, lambda: server.port)
    server.handlers.update(service.handlers())
    broker.grpc_service = service  # what the tools show of the 5.x clients and POP
    return server


def grpc_tls(broker: BrokerController) -> TlsServer | None:
    """TLS for the gRPC port by the remoting ports' ``tls.*`` keys (same mode, certificates
    and client authentication), in a context of its own that offers ALPN ``h2``, as gRPC
    clients require; None when ``tls.server.mode`` is disabled."""
    from pymq.remoting.tls import TlsServer, resolved, server_context, server_mode

    settings = resolved(broker.server_config.tls_settings())
    ctx = server_context(settings)
    if ctx is None:
        return None
    ctx.set_alpn_protocols(["h2"])
    return TlsServer(ctx, server_mode(settings))


def grpc_available() -> bool:
    """Whether the ``grpc`` extra (protobuf and hpack) is installed."""
    try:
        import hpack  # noqa: F401
        from google.protobuf import message_factory  # noqa: F401
    except ImportError:
        return False
    return True
