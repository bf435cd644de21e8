"""TLS on the gRPC port (issue #40) by the remoting ports' tls.* keys: enforcing refuses a plain
HTTP/2 client and serves gRPC over TLS (ALPN h2); permissive serves both."""

from __future__ import annotations

import pathlib
from typing import Any

import grpc
import pytest
import trio
import trustme
from rocketmq.grpc_protocol import definition_pb2, service_pb2

from pymq.common.topic import TopicConfig
from pymq.embedded import open_cluster
from pymq.testing import TEST_PROPERTIES
from tests.helpers import free_port


def query_route(port: int, ca_pem: bytes | None) -> Any:
    """QueryRoute over TLS trusting ``ca_pem``, or plain when None (blocking)."""
    target = f"127.0.0.1:{port}"
    if ca_pem is None:
        channel = grpc.insecure_channel(target)
    else:
        channel = grpc.secure_channel(
            target, grpc.ssl_channel_credentials(root_certificates=ca_pem)
        )
    with channel:
        call = channel.unary_unary(
            "/apache.rocketmq.v2.MessagingService/QueryRoute",
            request_serializer=service_pb2.QueryRouteRequest.SerializeToString,
            response_deserializer=service_pb2.QueryRouteResponse.FromString,
        )
        request = service_pb2.QueryRouteRequest()
        request.topic.name = "Secure"
        try:
            return call(request, timeout=5)
        except grpc.RpcError as exc:
            return exc.code()


@pytest.mark.parametrize("mode", ["enforcing", "permissive"])
async def test_grpc_over_tls(tmp_path: pathlib.Path, mode: str) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    port = free_port()
    properties = dict(
        TEST_PROPERTIES,
        grpcServerPort=str(port),
        **{
            "tls.server.mode": mode,
            "tls.server.certPath": str(cert_path),
            "tls.server.keyPath": str(key_path),
            "tls.config.file": "",
        },
    )
    async with open_cluster(
        str(tmp_path / "data"),
        namesrv_port=0,
        broker_port=0,
        bind_address="127.0.0.1",
        properties=properties,
    ) as cluster:
        await cluster.broker.topic_config_manager.update(TopicConfig("Secure", 1, 1))
        secure = await trio.to_thread.run_sync(query_route, port, ca.cert_pem.bytes())
        assert secure.status.code == definition_pb2.Code.OK
        plain = await trio.to_thread.run_sync(query_route, port, None)
        if mode == "enforcing":
            assert plain == grpc.StatusCode.UNAVAILABLE
        else:
            assert plain.status.code == definition_pb2.Code.OK
