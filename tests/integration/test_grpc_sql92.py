"""SQL92 subscriptions of 5.x consumers (issue #40): FilterExpression(..., FilterType.SQL) on
the official client's SimpleConsumer and PushConsumer, and on PullMessage, filtered by the
broker's SQL92 engine as a 4.x SQL92 subscription is (``enablePropertyFilter``); refused as
the broker refuses it when the key is off or the expression does not compile."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
import trio
from rocketmq.grpc_protocol import FilterType, definition_pb2, service_pb2
from rocketmq.v5.client import ClientConfiguration, Credentials
from rocketmq.v5.consumer import ConsumeResult, MessageListener, PushConsumer, SimpleConsumer
from rocketmq.v5.model import FilterExpression

from pymq.client import Message, Producer
from pymq.common.topic import TopicConfig
from pymq.embedded import Cluster, open_cluster
from pymq.testing import TEST_PROPERTIES
from tests.helpers import free_port

Code = definition_pb2.Code


def cluster_with(tmp_path, enabled: bool):  # type: ignore[no-untyped-def]
    properties = dict(
        TEST_PROPERTIES,
        grpcServerPort=str(free_port()),
        enablePropertyFilter="true" if enabled else "false",
    )
    return open_cluster(
        str(tmp_path), namesrv_port=0, broker_port=0, bind_address="127.0.0.1",
        properties=properties,
    )  # fmt: skip


@pytest.fixture
async def sql_cluster(tmp_path) -> AsyncIterator[Cluster]:
    async with cluster_with(tmp_path, True) as cluster:
        await cluster.broker.topic_config_manager.update(TopicConfig("Sql5", 2, 2))
        await produce(cluster, "Sql5")
        yield cluster


async def produce(cluster: Cluster, topic: str) -> None:
    """Six 4.x messages, property ``a`` = 1..6, tag ``odd``/``even``."""
    async with Producer("P4", cluster.namesrv_addr) as producer:
        for a in range(1, 7):
            tag = "odd" if a % 2 else "even"
            await producer.send(
                Message(topic, f"m{a}".encode(), tags=tag, properties={"a": str(a)})
            )
    await cluster.broker.store.reput.do_reput()


def endpoint(cluster: Cluster) -> str:
    assert cluster.broker.grpc_server is not None
    return f"127.0.0.1:{cluster.broker.grpc_server.port}"


def simple_receive(
    cluster: Cluster,
    group: str,
    sql: str,
    want: int,
    settled: Callable[[], bool] = lambda: True,
) -> list[bytes]:
    """Receive ``want`` messages and ack them, then receive (finding nothing else) until
    ``settled()`` (a receive reads one queue: the queue it reads passes its filtered records
    over), for at most 20 s in all."""
    consumer = SimpleConsumer(
        ClientConfiguration(endpoint(cluster), Credentials()),
        group,
        {"Sql5": FilterExpression(sql, FilterType.SQL)},
        await_duration=1,
    )
    consumer.startup()
    try:
        got: list[Any] = []
        deadline = time.monotonic() + 20
        while len(got) < want and time.monotonic() < deadline:
            got += consumer.receive(want, 10)
        for msg in got:
            consumer.ack(msg)
        got += consumer.receive(want, 10)  # nothing else passes the filter
        while not settled() and time.monotonic() < deadline:
            got += consumer.receive(want, 10)
        return sorted(m.body for m in got)
    finally:
        consumer.shutdown()


@pytest.mark.slow
async def test_simple_consumer_by_sql92(sql_cluster: Cluster) -> None:
    broker = sql_cluster.broker
    store = broker.store
    ends = {q: store.get_max_offset_in_queue("Sql5", q) for q in (0, 1)}

    def offsets() -> dict[int, int]:
        return broker.consumer_offset_manager.query_offsets("GSql", "Sql5")

    bodies = await trio.to_thread.run_sync(
        simple_receive, sql_cluster, "GSql", "a > 3 AND TAGS <> 'odd'", 2,
        lambda: offsets() == ends,
    )  # fmt: skip
    assert bodies == [b"m4", b"m6"]
    # The messages the filter passed over count as consumed, as for a 4.x SQL92 pull, once a
    # receive has read their queue.
    assert offsets() == ends
    # The group is registered with its SQL92 subscription, compiled as a heartbeat's is.
    assert broker.consumer_filter_manager.get("Sql5", "GSql") is not None


class Listener(MessageListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.got: list[bytes] = []

    def consume(self, message: Any) -> ConsumeResult:
        self.got.append(message.body)
        return ConsumeResult.SUCCESS


@pytest.mark.slow
async def test_push_consumer_by_sql92(sql_cluster: Cluster) -> None:
    listener = Listener()

    def work() -> None:
        consumer = PushConsumer(
            ClientConfiguration(endpoint(sql_cluster), Credentials()),
            "GSqlPush",
            listener,
            {"Sql5": FilterExpression("a BETWEEN 2 AND 3", FilterType.SQL)},
        )
        consumer.startup()
        try:
            deadline = time.monotonic() + 20
            while len(listener.got) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1)  # and nothing more comes
        finally:
            consumer.shutdown()

    await trio.to_thread.run_sync(work)
    assert sorted(listener.got) == [b"m2", b"m3"]


def pull(cluster: Cluster, sql: str, queue_id: int) -> list[Any]:
    request = service_pb2.PullMessageRequest(offset=0, batch_size=32)
    request.group.name = "GSqlPull"
    request.message_queue.topic.name = "Sql5"
    request.message_queue.id = queue_id
    request.filter_expression.type = definition_pb2.FilterType.SQL
    request.filter_expression.expression = sql
    with grpc.insecure_channel(endpoint(cluster)) as channel:
        call = channel.unary_stream(
            "/apache.rocketmq.v2.MessagingService/PullMessage",
            request_serializer=service_pb2.PullMessageRequest.SerializeToString,
            response_deserializer=service_pb2.PullMessageResponse.FromString,
        )
        return list(call(request, timeout=10))


async def test_pull_message_by_sql92_and_what_is_refused(sql_cluster: Cluster) -> None:
    store = sql_cluster.broker.store
    bodies = []
    for queue_id in (0, 1):
        answer = await trio.to_thread.run_sync(pull, sql_cluster, "a = 1 OR a >= 5", queue_id)
        bodies += [r.message.body for r in answer if r.HasField("message")]
        assert answer[-1].next_offset == store.get_max_offset_in_queue("Sql5", queue_id)
    assert sorted(bodies) == [b"m1", b"m5", b"m6"]
    bad = await trio.to_thread.run_sync(pull, sql_cluster, "a >>> 1", 0)
    assert bad[0].status.code == Code.ILLEGAL_FILTER_EXPRESSION
    assert bad[0].status.message.startswith("parse the consumer's subscription failed")
    empty = await trio.to_thread.run_sync(pull, sql_cluster, " ", 0)
    assert empty[0].status.code == Code.ILLEGAL_FILTER_EXPRESSION


def receive_error(cluster: Cluster, sql: str) -> str:
    consumer = SimpleConsumer(
        ClientConfiguration(endpoint(cluster), Credentials()),
        "GRefused",
        {"Sql5": FilterExpression(sql, FilterType.SQL)},
        await_duration=1,
    )
    consumer.startup()
    try:
        consumer.receive(1, 10)
    except Exception as exc:  # the client raises the status it was answered
        return str(exc)
    finally:
        consumer.shutdown()
    raise AssertionError("the receive was served")


async def test_bad_sql92_receive_is_refused(sql_cluster: Cluster) -> None:
    refused = await trio.to_thread.run_sync(receive_error, sql_cluster, "a >>> 1")
    assert refused.startswith(f"{Code.ILLEGAL_FILTER_EXPRESSION},"), refused
    # Nothing was received nor moved.
    assert sql_cluster.broker.grpc_service.pop.states == {}  # type: ignore[union-attr]


async def test_sql92_without_enable_property_filter_is_refused(tmp_path) -> None:
    async with cluster_with(tmp_path, False) as cluster:
        await cluster.broker.topic_config_manager.update(TopicConfig("Sql5", 1, 1))
        await produce(cluster, "Sql5")
        refused = await trio.to_thread.run_sync(receive_error, cluster, "a > 1")
        assert refused.startswith(f"{Code.INTERNAL_SERVER_ERROR},"), refused
        assert "does not support consumer to filter message by SQL92" in refused
        answer = await trio.to_thread.run_sync(pull, cluster, "a > 1", 0)
        assert answer[0].status.code == Code.INTERNAL_SERVER_ERROR
        assert cluster.broker.consumer_offset_manager.query_offsets("GRefused", "Sql5") == {}
