"""RecallMessage over gRPC (issue #41; RocketMQ 5's MessagingService.RecallMessage) with the
official 5.x client: a timer message's SendMessage answer carries its recall handle, a recall
with it stops the message while its sibling is delivered, and each bad recall gets the status
RocketMQ 5's proxy gives it and stores nothing."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
from rocketmq.grpc_protocol import definition_pb2, service_pb2
from rocketmq.v5.producer import Producer

from pymq.common.recall_handle import RecallHandle
from pymq.embedded import Cluster, open_cluster
from pymq.testing import TEST_PROPERTIES
from tests.helpers import free_port, wait_until
from tests.integration.test_grpc_producer import endpoint, make_topic, message, with_producer
from tests.integration.test_timer_recall import Bodies, forged, timer_entries

Code = definition_pb2.Code


@pytest.fixture
async def recall_cluster(tmp_path) -> AsyncIterator[Cluster]:
    props = dict(TEST_PROPERTIES, grpcServerPort=str(free_port()), recallMessageEnable="true")
    async with open_cluster(
        str(tmp_path), namesrv_port=0, broker_port=0, bind_address="127.0.0.1", properties=props
    ) as cluster:
        yield cluster


def raw_recall(cluster: Cluster, topic: str, handle: str) -> Any:
    """A RecallMessage through grpcio's own stub (blocking)."""
    import grpc

    with grpc.insecure_channel(endpoint(cluster)) as channel:
        call = channel.unary_unary(
            "/apache.rocketmq.v2.MessagingService/RecallMessage",
            request_serializer=service_pb2.RecallMessageRequest.SerializeToString,
            response_deserializer=service_pb2.RecallMessageResponse.FromString,
        )
        request = service_pb2.RecallMessageRequest(recall_handle=handle)
        request.topic.name = topic
        return call(request, timeout=10, metadata=[("x-mq-client-id", "raw-recall")])


@pytest.mark.slow
async def test_a_recalled_timer_is_never_delivered_and_its_sibling_is(
    recall_cluster: Cluster,
) -> None:
    cluster = recall_cluster
    await make_topic(cluster, "Recall5", "DELAY")
    from pymq.client import ConsumeFromWhere, PushConsumer

    def produce(producer: Producer) -> tuple[Any, Any, str]:
        at = int(time.time()) + 3  # whole seconds, as the client sends them
        gone = producer.send(message("Recall5", b"gone", delivery_timestamp=at))
        kept = producer.send(message("Recall5", b"kept", delivery_timestamp=at))
        return gone, kept, producer.recall_message("Recall5", gone.recall_handle)

    gone, kept, recalled_id = await trio.to_thread.run_sync(
        with_producer, cluster, "Recall5", produce
    )
    assert gone.recall_handle and kept.recall_handle and gone.recall_handle != kept.recall_handle
    handle = RecallHandle.decode(gone.recall_handle)
    assert (handle.topic, handle.message_id) == ("Recall5", gone.message_id)
    assert recalled_id == gone.message_id
    receiver = Bodies()
    first = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    async with PushConsumer("G5", cluster.namesrv_addr, receiver, consume_from=first) as c:
        await c.subscribe("Recall5")
        await receiver.wait_for(b"kept")
        await wait_until(lambda: cluster.broker.timer.recalled == 1, timeout=10)
        await trio.sleep(0.5)  # anything else due in that slot has been put by now
    assert receiver.bodies() == [b"kept"]


async def test_bad_recalls_get_the_proxy_s_status_and_store_nothing(
    recall_cluster: Cluster,
) -> None:
    cluster = recall_cluster
    await make_topic(cluster, "Due5", "DELAY")
    await make_topic(cluster, "Other5", "DELAY")
    await make_topic(cluster, "Plain5")
    name = cluster.broker.broker_config.broker_name
    due = int(time.time() * 1000) + 60_000
    good = RecallHandle("Due5", name, str(due), "01AABBCC").encode()
    internal = Code.INTERNAL_SERVER_ERROR
    cases = [
        ("Due5", "!!not base64!!", internal, "recall handle is invalid"),
        ("Other5", good, internal, "recall failed, topic not match"),
        ("Due5", forged(f"v1 Due5 elsewhere {due} 01AABBCC"), internal,
         "recall failed, broker service not available"),
        ("Due5", forged(f"v1 Due5 {name} {due - 120_000} 01AABBCC"), internal,
         "recall failed, timestamp invalid"),  # late: its due time has passed
        ("Nowhere5", good, Code.TOPIC_NOT_FOUND, "recall failed, the topic[Nowhere5] not exist"),
        ("Plain5", good, Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
         "TopicMessageType validate failed, topic type is NORMAL, message type is DELAY"),
        ("bad topic!", good, Code.ILLEGAL_TOPIC, None),
    ]  # fmt: skip
    before = await timer_entries(cluster)
    for topic, handle, code, remark in cases:
        response = await trio.to_thread.run_sync(raw_recall, cluster, topic, handle)
        assert response.status.code == code, (topic, response.status)
        if remark is not None:
            assert response.status.message == remark
        assert response.message_id == ""
    cluster.broker.broker_config.recall_message_enable = False
    response = await trio.to_thread.run_sync(raw_recall, cluster, "Due5", good)
    assert (response.status.code, response.status.message) == (
        internal,
        "recall failed, operation is forbidden",
    )
    assert await timer_entries(cluster) == before  # no marker stored by any of them
    # A well-formed handle with a made-up id is accepted, as RocketMQ 5 accepts it (the
    # broker cannot tell): its marker is stored and cancels nothing.
    cluster.broker.broker_config.recall_message_enable = True
    response = await trio.to_thread.run_sync(raw_recall, cluster, "Due5", good)
    assert (response.status.code, response.message_id) == (Code.OK, "01AABBCC")
    assert await timer_entries(cluster) == before + 1
