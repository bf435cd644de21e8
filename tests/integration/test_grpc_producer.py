"""RocketMQ 5's official Python client (rocketmq-python-client) producing through the broker's
gRPC port (issue #40), and pymq's own 4.x PushConsumer receiving what it sent: sync and async
sends with tag, keys and properties; FIFO message groups kept on one queue in order; delay by
delivery timestamp; a message of the wrong type refused as the proxy refuses it."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import trio
from rocketmq.grpc_protocol import definition_pb2, service_pb2
from rocketmq.v5.client import ClientConfiguration, Credentials
from rocketmq.v5.model import Message
from rocketmq.v5.producer import Producer

from pymq.client import ConsumeFromWhere, MessageExt, PushConsumer
from pymq.common.topic import PERM_READ, PERM_WRITE, TopicConfig
from pymq.embedded import Cluster, open_cluster
from pymq.testing import TEST_PROPERTIES
from tests.helpers import free_port

FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET


@pytest.fixture
async def grpc_cluster(tmp_path) -> AsyncIterator[Cluster]:
    props = dict(TEST_PROPERTIES, grpcServerPort=str(free_port()))
    async with open_cluster(
        str(tmp_path),
        namesrv_port=0,
        broker_port=0,
        bind_address="127.0.0.1",
        properties=props,
    ) as cluster:
        yield cluster


def endpoint(cluster: Cluster) -> str:
    assert cluster.broker.grpc_server is not None
    return f"127.0.0.1:{cluster.broker.grpc_server.port}"


async def make_topic(cluster: Cluster, name: str, kind: str | None = None, queues: int = 4) -> None:
    attributes = {"message.type": kind} if kind else None
    await cluster.broker.topic_config_manager.update(
        TopicConfig(name, queues, queues, attributes=attributes)
    )


def with_producer(cluster: Cluster, topic: str, work: Callable[[Producer], Any]) -> Any:
    """Run ``work`` with a started official Producer (blocking: call in a thread)."""
    producer = Producer(ClientConfiguration(endpoint(cluster), Credentials()), (topic,))
    producer.startup()
    try:
        return work(producer)
    finally:
        producer.shutdown()


def message(topic: str, body: bytes, **fields: Any) -> Message:
    msg = Message()
    msg.topic = topic
    msg.body = body
    for name, value in fields.items():
        if name == "properties":
            for key, prop in value.items():
                msg.add_property(key, prop)
        elif name == "keys":
            msg.keys = value
        else:
            setattr(msg, name, value)
    return msg


class Receiver:
    def __init__(self) -> None:
        self.got: list[tuple[int, MessageExt]] = []
        self.changed = trio.Event()

    async def __call__(self, msgs: list[MessageExt]) -> bool:
        now = int(time.time() * 1000)
        self.got.extend((now, m) for m in msgs)
        self.changed.set()
        self.changed = trio.Event()
        return True

    async def wait_for(self, count: int, timeout: float = 30) -> None:
        with trio.fail_after(timeout):
            while len(self.got) < count:
                await self.changed.wait()


async def receive_all(cluster: Cluster, topic: str, count: int) -> list[tuple[int, MessageExt]]:
    receiver = Receiver()
    async with PushConsumer("G4", cluster.namesrv_addr, receiver, consume_from=FIRST) as c:
        await c.subscribe(topic)
        await receiver.wait_for(count)
    return receiver.got


async def test_sync_and_async_sends_reach_a_4x_consumer_intact(grpc_cluster: Cluster) -> None:
    await make_topic(grpc_cluster, "Grpc5")

    def produce(producer: Producer) -> list[str]:
        ids = []
        for i in range(5):
            msg = message(
                "Grpc5",
                f"sync-{i}".encode(),
                tag="TagA",
                keys=f"key-{i}",
                properties={"color": "blue", "n": str(i)},
            )
            ids.append(producer.send(msg).message_id)
        futures = [
            producer.send_async(message("Grpc5", f"async-{i}".encode(), tag="TagB"))
            for i in range(5)
        ]
        ids += [future.result(timeout=10).message_id for future in futures]
        return ids

    ids = await trio.to_thread.run_sync(with_producer, grpc_cluster, "Grpc5", produce)
    assert len(set(ids)) == 10
    got = {m.body: m for _, m in await receive_all(grpc_cluster, "Grpc5", 10)}
    assert set(got) == {f"sync-{i}".encode() for i in range(5)} | {
        f"async-{i}".encode() for i in range(5)
    }
    for i in range(5):
        msg = got[f"sync-{i}".encode()]
        assert msg.tags == "TagA"
        assert msg.properties["KEYS"] == f"key-{i}"
        assert msg.properties["color"] == "blue" and msg.properties["n"] == str(i)
        # The 5.x message id is the message's UNIQ_KEY, as a 4.x producer's id is.
        assert msg.properties["UNIQ_KEY"] == ids[i]
        assert msg.properties["__BORNHOST"]  # the client's address, as the proxy stores it
        assert int(msg.properties["BORN_TIMESTAMP"]) > 0
        assert msg.properties["PGROUP"] == "Grpc5"
        assert "__SHARDINGKEY" not in msg.properties
    assert {got[f"async-{i}".encode()].tags for i in range(5)} == {"TagB"}


async def test_fifo_groups_stay_on_one_queue_in_order(grpc_cluster: Cluster) -> None:
    await make_topic(grpc_cluster, "Fifo5", "FIFO", queues=8)
    groups = ["order-1", "order-2", "order-3", "order-4"]

    def produce(producer: Producer) -> None:
        for i in range(6):
            for group in groups:
                producer.send(message("Fifo5", f"{group}:{i}".encode(), message_group=group))

    await trio.to_thread.run_sync(with_producer, grpc_cluster, "Fifo5", produce)
    got = await receive_all(grpc_cluster, "Fifo5", 24)
    by_group: dict[str, list[MessageExt]] = {}
    for _, msg in got:
        group = msg.properties["__SHARDINGKEY"]
        assert msg.body.decode().startswith(group + ":")
        by_group.setdefault(group, []).append(msg)
    assert sorted(by_group) == groups
    for msgs in by_group.values():
        assert len({m.queue_id for m in msgs}) == 1  # one queue per message group
        in_queue = sorted(msgs, key=lambda m: m.queue_offset)
        assert [m.body.decode().split(":")[1] for m in in_queue] == [str(i) for i in range(6)]


@pytest.mark.slow
async def test_delivery_timestamp_delays_the_message(grpc_cluster: Cluster) -> None:
    await make_topic(grpc_cluster, "Delay5", "DELAY")
    due: list[int] = []

    def produce(producer: Producer) -> None:
        # The client sends whole seconds: due at least 2 s from now.
        at = int(time.time()) + 3
        due.append(at * 1000)
        producer.send(message("Delay5", b"later", delivery_timestamp=at))

    await trio.to_thread.run_sync(with_producer, grpc_cluster, "Delay5", produce)
    [(arrived, msg)] = await receive_all(grpc_cluster, "Delay5", 1)
    assert msg.body == b"later"
    assert msg.properties["TIMER_DELIVER_MS"] == str(due[0])
    assert arrived >= due[0]


def raw_send(cluster: Cluster, request: Any) -> Any:
    """A SendMessage through grpcio's own stub: what a client that skips its own type check
    sends (blocking)."""
    import grpc

    with grpc.insecure_channel(endpoint(cluster)) as channel:
        call = channel.unary_unary(
            "/apache.rocketmq.v2.MessagingService/SendMessage",
            request_serializer=service_pb2.SendMessageRequest.SerializeToString,
            response_deserializer=service_pb2.SendMessageResponse.FromString,
        )
        return call(request, timeout=10, metadata=[("x-mq-client-id", "raw-test")])


def send_request(topic: str, kind: int, group: str = "") -> Any:
    request = service_pb2.SendMessageRequest()
    msg = request.messages.add()
    msg.topic.name = topic
    msg.body = b"typed"
    msg.system_properties.message_id = "01AABBCCDDEEFF00112233445566778899"
    msg.system_properties.message_type = kind
    if group:
        msg.system_properties.message_group = group
    return request


async def test_a_message_of_the_wrong_type_is_refused(grpc_cluster: Cluster) -> None:
    await make_topic(grpc_cluster, "FifoOnly", "FIFO")
    await make_topic(grpc_cluster, "Mixed", "MIXED")
    await make_topic(grpc_cluster, "Plain")
    code = definition_pb2.Code
    normal, fifo = definition_pb2.MessageType.NORMAL, definition_pb2.MessageType.FIFO
    store = grpc_cluster.broker.store
    cases = [
        ("FifoOnly", normal, "", code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        ("Plain", fifo, "g", code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        ("FifoOnly", fifo, "g", code.OK),
        ("Mixed", fifo, "g", code.OK),
        ("Mixed", normal, "", code.OK),
        ("Plain", normal, "", code.OK),
    ]
    for topic, kind, group, want in cases:
        response = await trio.to_thread.run_sync(
            raw_send, grpc_cluster, send_request(topic, kind, group)
        )
        assert response.status.code == want, (topic, kind, response.status)
        if want != code.OK:
            assert "TopicMessageType validate failed" in response.status.message
            assert not response.entries
    await store.reput.do_reput()
    stored = {
        topic: sum(store.get_max_offset_in_queue(topic, q) for q in range(4))
        for topic in ("FifoOnly", "Mixed", "Plain")
    }
    assert stored == {"FifoOnly": 1, "Mixed": 2, "Plain": 1}  # the refused ones wrote nothing


async def test_route_names_the_grpc_endpoint_and_unknown_topics_are_not_found(
    grpc_cluster: Cluster,
) -> None:
    await make_topic(grpc_cluster, "Routed", "FIFO", queues=3)
    import grpc

    def query(topic: str) -> Any:
        with grpc.insecure_channel(endpoint(grpc_cluster)) as channel:
            call = channel.unary_unary(
                "/apache.rocketmq.v2.MessagingService/QueryRoute",
                request_serializer=service_pb2.QueryRouteRequest.SerializeToString,
                response_deserializer=service_pb2.QueryRouteResponse.FromString,
            )
            request = service_pb2.QueryRouteRequest()
            request.topic.name = topic
            return call(request, timeout=10)

    route = await trio.to_thread.run_sync(query, "Routed")
    assert route.status.code == definition_pb2.Code.OK
    assert [q.id for q in route.message_queues] == [0, 1, 2]
    port = grpc_cluster.broker.grpc_server.port  # type: ignore[union-attr]
    for queue in route.message_queues:
        assert queue.permission == definition_pb2.Permission.READ_WRITE
        assert queue.broker.name == "broker-a"
        assert [(a.host, a.port) for a in queue.broker.endpoints.addresses] == [("127.0.0.1", port)]
        assert list(queue.accept_message_types) == [definition_pb2.MessageType.FIFO]
    missing = await trio.to_thread.run_sync(query, "NoSuchTopic")
    assert missing.status.code == definition_pb2.Code.TOPIC_NOT_FOUND
    assert not missing.message_queues


async def test_telemetry_answers_settings_and_assignment_and_heartbeat(
    grpc_cluster: Cluster,
) -> None:
    await make_topic(grpc_cluster, "Assigned")
    import grpc

    def talk() -> tuple[Any, Any, Any, Any]:
        with grpc.insecure_channel(endpoint(grpc_cluster)) as channel:
            meta = [("x-mq-client-id", "raw-test")]
            telemetry = channel.stream_stream(
                "/apache.rocketmq.v2.MessagingService/Telemetry",
                request_serializer=service_pb2.TelemetryCommand.SerializeToString,
                response_deserializer=service_pb2.TelemetryCommand.FromString,
            )
            command = service_pb2.TelemetryCommand()
            command.settings.client_type = definition_pb2.ClientType.PRODUCER
            command.settings.publishing.max_body_size = 128 << 20
            release = threading.Event()

            def commands() -> Iterator[Any]:
                yield command
                release.wait(10)  # the stream stays open, the settings registered

            replies = telemetry(commands(), timeout=10, metadata=meta)
            settings = next(replies)
            assignment = channel.unary_unary(
                "/apache.rocketmq.v2.MessagingService/QueryAssignment",
                request_serializer=service_pb2.QueryAssignmentRequest.SerializeToString,
                response_deserializer=service_pb2.QueryAssignmentResponse.FromString,
            )
            request = service_pb2.QueryAssignmentRequest()
            request.topic.name = "Assigned"
            request.group.name = "G5"
            assigned = assignment(request, timeout=10, metadata=meta)
            heartbeat = channel.unary_unary(
                "/apache.rocketmq.v2.MessagingService/Heartbeat",
                request_serializer=service_pb2.HeartbeatRequest.SerializeToString,
                response_deserializer=service_pb2.HeartbeatResponse.FromString,
            )
            beat = service_pb2.HeartbeatRequest(client_type=definition_pb2.ClientType.PRODUCER)
            ok = heartbeat(beat, timeout=10, metadata=meta)
            anonymous = heartbeat(beat, timeout=10)
            release.set()
            replies.cancel()
            return settings, assigned, ok, anonymous

    settings, assigned, ok, anonymous = await trio.to_thread.run_sync(talk)
    assert settings.status.code == definition_pb2.Code.OK
    # The broker's limit, not the client's wish, and the proxy's producer backoff.
    assert settings.settings.publishing.max_body_size == 4 * 1024 * 1024
    assert settings.settings.publishing.validate_message_type
    policy = settings.settings.backoff_policy
    assert policy.max_attempts == 3
    assert policy.exponential_backoff.initial.ToMilliseconds() == 10
    assert assigned.status.code == definition_pb2.Code.OK
    [assignment] = assigned.assignments
    assert assignment.message_queue.id == -1
    assert assignment.message_queue.broker.name == "broker-a"
    assert ok.status.code == definition_pb2.Code.OK
    assert anonymous.status.code == definition_pb2.Code.CLIENT_ID_REQUIRED


@pytest.mark.parametrize(
    ("kind", "pub_sub", "message"),
    [
        ("PRODUCER", None, "there is no publishing or subscription data in settings"),
        ("SIMPLE_CONSUMER", None, "there is no publishing or subscription data in settings"),
        ("CLIENT_TYPE_UNSPECIFIED", None, "there is no publishing or subscription data"),
        ("SIMPLE_CONSUMER", "publishing", "publishing settings require PRODUCER client type, "
         "actual: SIMPLE_CONSUMER"),
        ("PRODUCER", "subscription", "subscription settings require consumer client type, "
         "actual: PRODUCER"),
    ],
)  # fmt: skip
async def test_settings_without_or_against_their_kind_end_the_stream(
    grpc_cluster: Cluster, kind: str, pub_sub: str | None, message: str
) -> None:
    # The proxy's ClientActivity: INVALID_ARGUMENT, nothing registered, and a heartbeat of the
    # client afterwards finds no settings (UNRECOGNIZED_CLIENT_TYPE).
    import grpc

    await make_topic(grpc_cluster, "Kinds")

    def talk() -> tuple[Any, Any]:
        with grpc.insecure_channel(endpoint(grpc_cluster)) as channel:
            meta = [("x-mq-client-id", "kinds-test")]
            telemetry = channel.stream_stream(
                "/apache.rocketmq.v2.MessagingService/Telemetry",
                request_serializer=service_pb2.TelemetryCommand.SerializeToString,
                response_deserializer=service_pb2.TelemetryCommand.FromString,
            )
            command = service_pb2.TelemetryCommand()
            command.settings.client_type = definition_pb2.ClientType.Value(kind)
            command.settings.request_timeout.FromMilliseconds(3000)
            if pub_sub == "publishing":
                command.settings.publishing.topics.add(name="Kinds")
            elif pub_sub == "subscription":
                command.settings.subscription.group.name = "GK"
                command.settings.subscription.subscriptions.add().topic.name = "Kinds"
            try:
                replies = list(telemetry(iter([command]), timeout=10, metadata=meta))
            except grpc.RpcError as exc:
                refused: Any = exc
            else:
                raise AssertionError(f"settings accepted: {replies}")
            heartbeat = channel.unary_unary(
                "/apache.rocketmq.v2.MessagingService/Heartbeat",
                request_serializer=service_pb2.HeartbeatRequest.SerializeToString,
                response_deserializer=service_pb2.HeartbeatResponse.FromString,
            )
            beat = service_pb2.HeartbeatRequest(client_type=definition_pb2.ClientType.PRODUCER)
            beat.group.name = "GK"
            return refused, heartbeat(beat, timeout=10, metadata=meta)

    refused, beat = await trio.to_thread.run_sync(talk)
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in refused.details()
    assert beat.status.code == definition_pb2.Code.UNRECOGNIZED_CLIENT_TYPE
    assert beat.status.message == "cannot find client settings for this client"
    broker = grpc_cluster.broker
    assert broker.grpc_service is not None and not broker.grpc_service.telemetry_channels
    assert "Kinds" not in broker.producer_manager.groups
    assert "GK" not in broker.consumer_manager.groups


async def test_prometheus_counts_grpc_calls_by_method_and_status(tmp_path) -> None:
    from tests.integration.test_metrics import scrape, value

    props = dict(
        TEST_PROPERTIES,
        grpcServerPort=str(free_port()),
        metricsExporterType="PROM",
        metricsPromExporterHost="127.0.0.1",
        metricsPromExporterPort="0",
    )
    async with open_cluster(
        str(tmp_path), namesrv_port=0, broker_port=0, bind_address="127.0.0.1", properties=props
    ) as cluster:
        await make_topic(cluster, "Counted")
        normal = definition_pb2.MessageType.NORMAL
        for _ in range(3):
            await trio.to_thread.run_sync(raw_send, cluster, send_request("Counted", normal))
        import grpc

        def unknown() -> grpc.StatusCode:
            with grpc.insecure_channel(endpoint(cluster)) as channel:
                try:
                    channel.unary_unary("/apache.rocketmq.v2.MessagingService/Nope")(b"", timeout=5)
                except grpc.RpcError as exc:
                    return exc.code()
            return grpc.StatusCode.OK

        assert await trio.to_thread.run_sync(unknown) == grpc.StatusCode.UNIMPLEMENTED
        assert cluster.broker.metrics is not None
        samples = await scrape(cluster.broker.metrics.port)
        name = "rocketmq_rpc_latency_count"
        sent = value(samples, name, request_code="SendMessage", response_code="0")
        assert sent == 3
        assert value(samples, name, request_code="unknown", response_code="12") == 1
        labels = {"request_code": "SendMessage", "response_code": "0", "le": "+Inf"}
        assert value(samples, "rocketmq_rpc_latency_bucket", **labels) == 3
        assert value(samples, "rocketmq_rpc_latency_sum", request_code="SendMessage") > 0


async def test_update_topic_sets_the_message_type_attribute(grpc_cluster: Cluster) -> None:
    from pymq.client import MQClientError, topics

    ns, broker = grpc_cluster.namesrv_addr, grpc_cluster.broker_addr
    await topics.create_topic(ns, "Typed", brokers=[broker], attributes="+message.type=FIFO")
    config = grpc_cluster.broker.topic_config_manager.select("Typed")
    assert config is not None and config.attributes == {"message.type": "FIFO"}
    # An update without attributes keeps them; "-message.type" removes it (NORMAL again).
    await topics.create_topic(ns, "Typed", brokers=[broker], queues=2)
    config = grpc_cluster.broker.topic_config_manager.select("Typed")
    assert config is not None and config.attributes == {"message.type": "FIFO"}
    assert config.read_queue_nums == 2
    await topics.create_topic(ns, "Typed", brokers=[broker], attributes="-message.type")
    config = grpc_cluster.broker.topic_config_manager.select("Typed")
    assert config is not None and config.attributes is None
    for bad, why in (
        ("+message.type=SOMETIMES", "the value is not in"),
        ("+queue.type=X", "is not supported"),
        ("message.type=FIFO", "is not +key=value or -key"),
    ):
        refused: list[MQClientError] = []
        try:
            await topics.create_topic(ns, "Typed", brokers=[broker], attributes=bad)
        except* MQClientError as group:
            refused += [e for e in group.exceptions if isinstance(e, MQClientError)]
        assert len(refused) == 1 and why in (refused[0].remark or ""), bad
    # The refusals changed nothing.
    config = grpc_cluster.broker.topic_config_manager.select("Typed")
    assert config is not None and config.attributes is None and config.read_queue_nums == 4


async def test_route_lists_every_group_of_the_cluster(grpc_cluster: Cluster, tmp_path) -> None:
    """A second broker group (broker-b) registered with the same name server: QueryRoute on
    broker-a lists both groups' queues, broker-b's at its master's host and the gRPC port."""
    import grpc

    from pymq.broker.config import BrokerConfig
    from pymq.broker.controller import BrokerController
    from pymq.client import topics
    from pymq.remoting.config import NettyClientConfig, NettyServerConfig
    from pymq.store.config import MessageStoreConfig

    other = BrokerController(
        BrokerConfig(
            broker_name="broker-b", broker_ip1="127.0.0.1", namesrv_addr=grpc_cluster.namesrv_addr
        ),
        NettyServerConfig(listen_port=0, bind_address="127.0.0.1"),
        NettyClientConfig(),
        MessageStoreConfig(
            store_path_root_dir=str(tmp_path / "b"), mapped_file_size_commit_log=1 << 20
        ),
    )

    def query(topic: str) -> Any:
        with grpc.insecure_channel(endpoint(grpc_cluster)) as channel:
            call = channel.unary_unary(
                "/apache.rocketmq.v2.MessagingService/QueryRoute",
                request_serializer=service_pb2.QueryRouteRequest.SerializeToString,
                response_deserializer=service_pb2.QueryRouteResponse.FromString,
            )
            request = service_pb2.QueryRouteRequest()
            request.topic.name = topic
            return call(request, timeout=10)

    async with trio.open_nursery() as nursery:
        await nursery.start(other.run)
        ns = grpc_cluster.namesrv_addr
        await topics.create_topic(ns, "Wide", queues=2, brokers=[grpc_cluster.broker_addr])
        await topics.create_topic(ns, "Wide", queues=3, brokers=[other.broker_addr])
        await topics.create_topic(ns, "OnlyB", queues=1, brokers=[other.broker_addr])
        table = grpc_cluster.namesrv.routes.topic_queue_table
        with trio.fail_after(10):  # broker-b registered its topics (after a topic change)
            while "broker-b" not in table.get("Wide", {}) or "OnlyB" not in table:
                await trio.sleep(0.01)
        wide = await trio.to_thread.run_sync(query, "Wide")
        only_b = await trio.to_thread.run_sync(query, "OnlyB")
        nursery.cancel_scope.cancel()
    port = grpc_cluster.broker.grpc_server.port  # type: ignore[union-attr]
    for route in (wide, only_b):
        assert route.status.code == definition_pb2.Code.OK
        for queue in route.message_queues:
            assert [(a.host, a.port) for a in queue.broker.endpoints.addresses] == [
                ("127.0.0.1", port)
            ]
    assert [(q.broker.name, q.id) for q in wide.message_queues] == [
        ("broker-a", 0), ("broker-a", 1), ("broker-b", 0), ("broker-b", 1), ("broker-b", 2)
    ]  # fmt: skip
    assert [(q.broker.name, q.id) for q in only_b.message_queues] == [("broker-b", 0)]


class AwaitedSends:
    """Counts the sends that take the broker's awaited path (SendProcessor.send_message)."""

    def __init__(self, cluster: Cluster) -> None:
        self.count = 0
        processor = cluster.broker.send_processor
        awaited = processor.send_message

        async def counted(channel: Any, request: Any) -> Any:
            self.count += 1
            return await awaited(channel, request)

        processor.send_message = counted  # type: ignore[method-assign,assignment]


async def test_sends_are_put_without_a_wait_and_refusals_keep_their_status(
    grpc_cluster: Cluster,
) -> None:
    """A send to a topic that exists, on a store that waits for nothing, is put by the
    broker's synchronous put (send_now), never the awaited path; its refusals (the broker or
    the topic not writable, a store that takes no writes, a transactional message on a
    broker that rejects them) answer the status the awaited path answered, and write
    nothing; a topic still to be auto-created takes the awaited path."""
    await make_topic(grpc_cluster, "Inline", "MIXED", queues=1)
    broker = grpc_cluster.broker
    store = broker.store
    awaited = AwaitedSends(grpc_cluster)
    code = definition_pb2.Code
    normal = definition_pb2.MessageType.NORMAL

    async def send(topic: str = "Inline", kind: int = normal) -> Any:
        return await trio.to_thread.run_sync(raw_send, grpc_cluster, send_request(topic, kind))

    response = await send()
    assert response.status.code == code.OK, response.status
    assert response.entries[0].offset == 0
    response = await send()
    assert response.entries[0].offset == 1  # its queue's next offset
    assert awaited.count == 0

    bc = broker.broker_config
    bc.broker_permission = PERM_READ
    response = await send()
    assert response.status.code == code.INTERNAL_SERVER_ERROR
    assert "sending message is forbidden" in response.status.message
    bc.broker_permission = PERM_READ | PERM_WRITE

    await broker.topic_config_manager.update(
        TopicConfig("Inline", 1, 1, perm=PERM_READ, attributes={"message.type": "MIXED"})
    )
    response = await send()
    assert response.status.code == code.INTERNAL_SERVER_ERROR
    assert "topic[Inline] sending message is forbidden" in response.status.message
    await make_topic(grpc_cluster, "Inline", "MIXED", queues=1)

    store.read_only = True  # as a slave: the store takes no writes
    try:
        response = await send()
    finally:
        store.read_only = False
    assert response.status.code == code.INTERNAL_SERVER_ERROR
    assert "messages are put to the slave" in response.status.message  # Java's remark

    bc.reject_transaction_message = True
    try:
        response = await send(kind=definition_pb2.MessageType.TRANSACTION)
    finally:
        bc.reject_transaction_message = False
    assert response.status.code == code.INTERNAL_SERVER_ERROR
    assert "sending transaction message is forbidden" in response.status.message
    assert not response.entries

    assert awaited.count == 0
    await store.reput.do_reput()
    assert sum(store.get_max_offset_in_queue("Inline", q) for q in range(4)) == 2

    response = await send("NotYetThere")  # auto-created on the awaited path
    assert response.status.code == code.OK, response.status
    assert awaited.count == 1


async def test_a_sync_flush_send_waits_for_the_disk(tmp_path) -> None:
    """SYNC_FLUSH: a send is answered once its bytes are on disk, by the awaited path."""
    props = dict(TEST_PROPERTIES, grpcServerPort=str(free_port()), flushDiskType="SYNC_FLUSH")
    async with open_cluster(
        str(tmp_path), namesrv_port=0, broker_port=0, bind_address="127.0.0.1", properties=props
    ) as cluster:
        await make_topic(cluster, "Durable")
        awaited = AwaitedSends(cluster)
        response = await trio.to_thread.run_sync(
            raw_send, cluster, send_request("Durable", definition_pb2.MessageType.NORMAL)
        )
        assert response.status.code == definition_pb2.Code.OK, response.status
        assert awaited.count == 1
        store = cluster.broker.store
        assert store.flush_commitlog is not None
        assert store.commitlog.queue.flushed_where >= store.commitlog.max_offset > 0


async def test_a_send_is_put_from_its_fields_as_its_request_would_be(
    grpc_cluster: Cluster,
) -> None:
    """A SendMessage to a topic the broker has judged is put from its fields
    (SendProcessor.send_fields_now: send_raw's checks and put, no request command) and
    stores the very record the request's usual way (send_now) stores: the same properties in
    the same order (user properties, tag, keys, id, group, trace context, born host and
    time), body, flags, born host and attempt."""
    await make_topic(grpc_cluster, "Fields", "MIXED", queues=1)
    processor = grpc_cluster.broker.send_processor
    store = grpc_cluster.broker.store
    usual = processor.send_now
    fields_now = processor.send_fields_now
    counts = {"usual": 0, "fields": 0}

    def counted_usual(channel: Any, request: Any) -> Any:
        counts["usual"] += 1
        return usual(channel, request)

    def counted_fields(*args: Any) -> Any:
        put = fields_now(*args)
        counts["fields"] += put is not None
        return put

    processor.send_now = counted_usual  # type: ignore[method-assign]
    processor.send_fields_now = counted_fields  # type: ignore[method-assign]

    def request() -> Any:
        req = send_request("Fields", definition_pb2.MessageType.FIFO, group="g-1")
        msg = req.messages[0]
        msg.user_properties["color"] = "blue"
        msg.user_properties["n"] = "7"
        system = msg.system_properties
        system.tag = "TagF"
        system.keys.extend(["k1", "k2"])
        system.trace_context = "00-trace-01"
        system.born_host = "10.1.2.3"
        system.born_timestamp.FromMilliseconds(1_700_000_000_123)
        system.delivery_attempt = 2
        return req

    offsets = []
    for forced_usual in (False, False, True):  # the first validates the topic (usual way)
        if forced_usual:
            processor.send_fields_now = lambda *args: None  # type: ignore[method-assign]
        response = await trio.to_thread.run_sync(raw_send, grpc_cluster, request())
        assert response.status.code == definition_pb2.Code.OK, response.status
        offsets.append(response.entries[0].offset)
    assert offsets == [0, 1, 2]
    assert counts == {"usual": 2, "fields": 1}

    records = []
    phy = 0
    for _ in range(3):
        ext = store.look_message_by_offset(phy)
        assert ext is not None
        records.append(ext)
        phy += ext.store_size
    fast, slow = records[1], records[2]
    assert list(fast.properties.items()) == list(slow.properties.items())
    assert fast.properties["__SHARDINGKEY"] == "g-1"
    assert fast.properties["TRACE_CONTEXT"] == "00-trace-01"
    assert fast.properties["__BORNHOST"] == "10.1.2.3"
    assert fast.properties["KEYS"] == "k1 k2" and fast.properties["TAGS"] == "TagF"
    for name in ("topic", "body", "flag", "sys_flag", "born_timestamp", "reconsume_times",
                 "queue_id"):  # fmt: skip
        assert getattr(fast, name) == getattr(slow, name), name
    assert fast.born_host[0] == slow.born_host[0] == "127.0.0.1"  # each call its own port
    assert fast.born_timestamp == 1_700_000_000_123 and fast.reconsume_times == 2
