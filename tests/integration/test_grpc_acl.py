"""aclEnable=true on the gRPC port (issue #40): the 5.x clients' signed ``authorization`` header
checked against the plain_acl.yml accounts, with the permissions the 4.x requests need (PUB
on the topic to send; SUB on the topic and the group to receive and ack)."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
import trio
from rocketmq.grpc_protocol import definition_pb2, service_pb2
from rocketmq.v5.client import ClientConfiguration, Credentials
from rocketmq.v5.consumer import SimpleConsumer
from rocketmq.v5.model import FilterExpression, Message
from rocketmq.v5.producer import Producer
from rocketmq.v5.util.signature import Signature

from pymq.common.topic import TopicConfig
from pymq.embedded import Cluster, open_cluster
from pymq.testing import TEST_PROPERTIES
from tests.helpers import free_port

ACL = """\
globalWhiteRemoteAddresses: []
accounts:
  - accessKey: producerUser
    secretKey: producerSecret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms: [Allowed=PUB]
  - accessKey: consumerUser
    secretKey: consumerSecret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms: [Allowed=SUB]
    groupPerms: [Readers=SUB]
"""
Code = definition_pb2.Code


@pytest.fixture
async def cluster(tmp_path: pathlib.Path) -> AsyncIterator[Cluster]:
    home = tmp_path / "home"
    (home / "conf").mkdir(parents=True)
    (home / "conf" / "plain_acl.yml").write_text(ACL)
    properties = dict(
        TEST_PROPERTIES, aclEnable="true", rocketmqHome=str(home), grpcServerPort=str(free_port())
    )
    async with open_cluster(
        str(tmp_path / "data"),
        namesrv_port=0,
        broker_port=0,
        bind_address="127.0.0.1",
        properties=properties,
    ) as cluster:
        for topic in ("Allowed", "Denied"):
            await cluster.broker.topic_config_manager.update(TopicConfig(topic, 1, 1))
        yield cluster


def endpoint(cluster: Cluster) -> str:
    assert cluster.broker.grpc_server is not None
    return f"127.0.0.1:{cluster.broker.grpc_server.port}"


def send(
    cluster: Cluster,
    topic: str,
    ak: str,
    sk: str,
    edit: Callable[[dict[str, str]], None] = lambda metadata: None,
) -> Any:
    """A SendMessage signed by the official client's own Signature code (blocking), its
    metadata changed by ``edit`` before it goes."""
    config = ClientConfiguration(endpoint(cluster), Credentials(ak, sk))
    metadata = dict(Signature.metadata(config, "acl-test"))
    edit(metadata)
    request = service_pb2.SendMessageRequest()
    msg = request.messages.add()
    msg.topic.name = topic
    msg.body = b"signed"
    msg.system_properties.message_id = "01AABBCCDDEEFF00112233445566778899"
    msg.system_properties.message_type = definition_pb2.MessageType.NORMAL
    with grpc.insecure_channel(endpoint(cluster)) as channel:
        call = channel.unary_unary(
            "/apache.rocketmq.v2.MessagingService/SendMessage",
            request_serializer=service_pb2.SendMessageRequest.SerializeToString,
            response_deserializer=service_pb2.SendMessageResponse.FromString,
        )
        return call(request, timeout=10, metadata=list(metadata.items()))


async def test_sends_are_checked_by_account_and_topic(cluster: Cluster) -> None:
    async def code(topic: str, ak: str, sk: str) -> int:
        response = await trio.to_thread.run_sync(send, cluster, topic, ak, sk)
        return response.status.code

    assert await code("Allowed", "producerUser", "producerSecret") == Code.OK
    assert await code("Denied", "producerUser", "producerSecret") == Code.FORBIDDEN
    assert await code("Allowed", "producerUser", "wrongSecret") == Code.UNAUTHORIZED
    assert await code("Allowed", "nobody", "x") == Code.UNAUTHORIZED
    assert await code("Allowed", "", "") == Code.UNAUTHORIZED
    assert await code("Allowed", "consumerUser", "consumerSecret") == Code.FORBIDDEN
    store = cluster.broker.store
    await store.reput.do_reput()
    assert store.get_max_offset_in_queue("Allowed", 0) == 1  # only the one allowed
    assert store.get_max_offset_in_queue("Denied", 0) == 0


async def test_the_official_clients_with_credentials(cluster: Cluster) -> None:
    def work() -> tuple[list[bytes], str]:
        producer = Producer(
            ClientConfiguration(endpoint(cluster), Credentials("producerUser", "producerSecret")),
            ("Allowed",),
        )
        producer.startup()
        try:
            msg = Message()
            msg.topic = "Allowed"
            msg.body = b"with credentials"
            producer.send(msg)
        finally:
            producer.shutdown()
        bodies: list[bytes] = []
        refused = ""
        for group in ("Readers", "Strangers"):
            consumer = SimpleConsumer(
                ClientConfiguration(
                    endpoint(cluster), Credentials("consumerUser", "consumerSecret")
                ),
                group,
                {"Allowed": FilterExpression()},
                await_duration=1,
            )
            consumer.startup()
            try:
                for msg in consumer.receive(1, 10):
                    bodies.append(msg.body)
                    consumer.ack(msg)
            except Exception as exc:  # the client raises the status it was answered
                refused = str(exc)
            finally:
                consumer.shutdown()
        return bodies, refused

    bodies, refused = await trio.to_thread.run_sync(work)
    assert bodies == [b"with credentials"]
    # FORBIDDEN (40300): no SUB on the group Strangers.
    assert refused.startswith(f"{Code.FORBIDDEN},") and "group:Strangers" in refused


async def test_the_signed_date_is_not_bounded_but_must_be_the_signed_one(cluster: Cluster) -> None:
    """As RocketMQ 5's proxy: the signature covers x-mq-date-time and nothing compares it
    with the clock (a stale date signed by the account passes); a date that is not the one
    signed, or none at all, is refused UNAUTHORIZED."""
    stale = "20000101T000000Z"

    def signed_stale(metadata: dict[str, str]) -> None:
        metadata["x-mq-date-time"] = stale
        signature = Signature.sign("producerSecret", stale)
        head, _, _ = metadata["authorization"].rpartition("Signature=")
        metadata["authorization"] = head + "Signature=" + signature

    def forged(metadata: dict[str, str]) -> None:
        metadata["x-mq-date-time"] = stale  # the signature is still the real date's

    def undated(metadata: dict[str, str]) -> None:
        del metadata["x-mq-date-time"]

    async def answer(edit: Callable[[dict[str, str]], None]) -> Any:
        return await trio.to_thread.run_sync(
            send, cluster, "Allowed", "producerUser", "producerSecret", edit
        )

    assert (await answer(signed_stale)).status.code == Code.OK
    assert (await answer(forged)).status.code == Code.UNAUTHORIZED
    refused = await answer(undated)
    assert refused.status.code == Code.UNAUTHORIZED
    assert refused.status.message == "datetime is null"
    store = cluster.broker.store
    await store.reput.do_reput()
    assert store.get_max_offset_in_queue("Allowed", 0) == 1  # only the signed stale one
