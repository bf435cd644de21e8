"""The tools and RocketMQ 5 (gRPC) clients (issue #40): the console's ``grpc.status``,
``pymq-admin grpcClients`` / ``popStatus`` / ``consumerConnection`` / ``consumerStatus -s`` /
``queryMsgById -g -d``, and ``/metrics``' in-flight gauge; the broker's calls to a 5.x client
(PrintThreadStackTraceCommand, VerifyMessageCommand) on its Telemetry stream, answered."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest
import trio
from rocketmq.grpc_protocol import definition_pb2, service_pb2
from rocketmq.v5.client import ClientConfiguration, Credentials
from rocketmq.v5.consumer import SimpleConsumer
from rocketmq.v5.model import FilterExpression
from rocketmq.v5.producer import Producer as Producer5
from trio_websocket import open_websocket_url

from pymq.broker.metrics import BrokerCollector
from pymq.client import Message, Producer
from pymq.common.topic import TopicConfig
from pymq.embedded import ADMIN_ANY_PORT, Cluster, open_cluster
from pymq.remoting import headers as H
from pymq.remoting.client import open_remoting_client
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.remoting.protocol import fastjson
from pymq.testing import TEST_PROPERTIES
from tests.admin.helpers import AdminClient, ws_url
from tests.helpers import free_port, pymq_admin, wait_until

Code = definition_pb2.Code
TELEMETRY = "/apache.rocketmq.v2.MessagingService/Telemetry"


@pytest.fixture
async def cluster(tmp_path) -> AsyncIterator[Cluster]:
    async with open_cluster(
        str(tmp_path),
        namesrv_port=0,
        broker_port=0,
        bind_address="127.0.0.1",
        properties=dict(TEST_PROPERTIES, grpcServerPort=str(free_port())),
        admin_port=ADMIN_ANY_PORT,
    ) as cluster:
        yield cluster


@pytest.fixture
async def admin(cluster: Cluster) -> AsyncIterator[AdminClient]:
    channel = cluster.admin_channel
    assert channel is not None
    async with open_websocket_url(ws_url(cluster)) as ws:
        client = AdminClient(ws)
        await client.call("auth", token=channel.token)
        yield client


def endpoint(cluster: Cluster) -> str:
    assert cluster.broker.grpc_server is not None
    return f"127.0.0.1:{cluster.broker.grpc_server.port}"


async def admin_cli(*args: str, ok: bool = True) -> str:
    code, out, err = await pymq_admin(*args)
    assert (code == 0) == ok, err
    return out if ok else err


async def produce(cluster: Cluster, topic: str, bodies: list[bytes]) -> list[Any]:
    async with Producer("P4", cluster.namesrv_addr) as producer:
        sent = [await producer.send(Message(topic, body, tags="T")) for body in bodies]
    await cluster.broker.store.reput.do_reput()
    return sent


@pytest.mark.slow
async def test_5x_clients_and_their_inflight_messages_on_every_tool(
    cluster: Cluster, admin: AdminClient
) -> None:
    await cluster.broker.topic_config_manager.update(TopicConfig("Tools", 2, 2))
    await produce(cluster, "Tools", [b"a", b"b", b"c"])
    config = ClientConfiguration(endpoint(cluster), Credentials())
    producer = Producer5(config, ("Tools",))
    consumer = SimpleConsumer(config, "G5", {"Tools": FilterExpression()}, await_duration=1)
    await trio.to_thread.run_sync(producer.startup)
    await trio.to_thread.run_sync(consumer.startup)
    try:
        got: list[Any] = []
        deadline = time.monotonic() + 20
        while len(got) < 3 and time.monotonic() < deadline:
            got += await trio.to_thread.run_sync(consumer.receive, 3 - len(got), 30)
        assert len(got) == 3
        await trio.to_thread.run_sync(consumer.ack, got[0])
        # The unacked two, by (queue, offset): pymq's receipt handle names them.
        held = sorted(tuple(int(x) for x in m.receipt_handle.split("_")[1:3]) for m in got[1:])
        oldest: dict[int, int] = {}
        for queue_id, offset in held:
            oldest.setdefault(queue_id, offset)

        # The console's data: both clients, and the two messages still in flight.
        status = await admin.call("grpc.status")
        assert status["grpcEnabled"] is True
        kinds = {c["clientType"]: c for c in status["clients"]}
        assert set(kinds) == {"PRODUCER", "SIMPLE_CONSUMER"}
        for client in kinds.values():
            assert client["language"] == "PYTHON" and client["version"] == "5.1.2"
            assert client["topics"] == ["Tools"]
            assert abs(client["lastHeartbeat"] - time.time() * 1000) < 60_000
        assert kinds["SIMPLE_CONSUMER"]["group"] == "G5"
        assert kinds["PRODUCER"]["producerGroups"] == ["Tools"]
        rows = status["inflight"]
        assert sorted((r["queueId"], r["oldestOffset"]) for r in rows) == sorted(oldest.items())
        assert sum(r["inFlight"] for r in rows) == 2
        assert sum(r["invisible"] for r in rows) == 2
        for row in rows:
            assert row["group"] == "G5" and row["topic"] == "Tools"
            assert 10_000 < row["oldestInvisibleMs"] <= 30_000
            assert row["oldestAttempts"] == 1
        only = await admin.call("grpc.status", group="G5")
        assert [c["clientType"] for c in only["clients"]] == ["SIMPLE_CONSUMER"]
        assert await admin.call("grpc.status", group="Nobody") == {
            "grpcEnabled": True,
            "clients": [],
            "inflight": [],
        }

        # pymq-admin: the same, through the broker's remoting port.
        ns = cluster.namesrv_addr
        addr = cluster.broker_addr
        clients = json.loads(await admin_cli("grpcClients", "-n", ns, "--json"))[addr]
        # A client's heartbeat (each 10 s, the first 1 s after its start) may come in between.
        for before, after in zip(status["clients"], clients, strict=True):
            assert before.pop("lastHeartbeat") <= after.pop("lastHeartbeat")
        assert clients == status["clients"]
        table = await admin_cli("grpcClients", "-n", ns, "-b", addr)
        assert "PYTHON 5.1.2" in table and "SIMPLE_CONSUMER" in table and "G5" in table
        inflight = json.loads(await admin_cli("popStatus", "-n", ns, "-g", "G5", "--json"))
        assert [(r["queueId"], r["inFlight"]) for r in inflight[addr]] == [
            (r["queueId"], r["inFlight"]) for r in rows
        ]
        assert "#Oldest Invisible For" in await admin_cli("popStatus", "-n", ns)
        # As RocketMQ 5's proxy registers them: a member of its group for 4.x's tools too.
        members = json.loads(await admin_cli("consumerConnection", "-n", ns, "-g", "G5", "--json"))
        assert [(m["language"], m["clientId"]) for m in members["connectionSet"]] == [
            ("PYTHON", kinds["SIMPLE_CONSUMER"]["clientId"])
        ]

        # /metrics: RocketMQ 5's in-flight gauge.
        samples = {
            (tuple(sorted(s.labels.items())), s.value)
            for family in BrokerCollector(cluster.broker).collect()
            if family.name == "rocketmq_consumer_inflight_messages"
            for s in family.samples
        }
        [(labels, value)] = samples
        assert dict(labels)["consumer_group"] == "G5" and dict(labels)["topic"] == "Tools"
        assert value == 2
    finally:
        await trio.to_thread.run_sync(consumer.shutdown)
        await trio.to_thread.run_sync(producer.shutdown)
    # Gone when their streams end (the registry holds open streams only).
    await wait_until(lambda: not cluster.broker.grpc_service.telemetry_channels)  # type: ignore[union-attr]
    assert (await admin.call("grpc.status"))["clients"] == []
    assert cluster.broker.consumer_manager.get("G5") is None


async def test_grpc_status_without_a_grpc_port(tmp_path) -> None:
    async with open_cluster(
        str(tmp_path),
        namesrv_port=0,
        broker_port=0,
        bind_address="127.0.0.1",
        properties=dict(TEST_PROPERTIES),
    ) as cluster:
        async with open_remoting_client() as client:
            request = RemotingCommand.request(RequestCode.GET_GRPC_STATUS)
            reply = await client.invoke(cluster.broker_addr, request, 5)
        assert reply.code == ResponseCode.SUCCESS
        assert fastjson.loads(reply.body) == {"grpcEnabled": False, "clients": [], "inflight": []}


class RawClient:
    """A 5.x consumer's Telemetry stream by hand (the official Python client does not answer
    the broker's thread-stack and verify commands): it answers a PrintThreadStackTraceCommand
    with ``stack`` and a VerifyMessageCommand with ``verify_code``, or nothing when they are
    None."""

    def __init__(
        self,
        target: str,
        group: str,
        topic: str,
        stack: str | None,
        verify_code: int | None,
        delay: float = 0.0,
    ) -> None:
        self.client_id = f"raw-{group}"
        self.stack = stack
        self.delay = delay  # seconds before each answer
        self.verify_code = verify_code
        self.verified: list[Any] = []
        self.requests: queue.Queue[Any] = queue.Queue()
        self.settled = threading.Event()
        self.channel = grpc.insecure_channel(target)
        call = self.channel.stream_stream(
            TELEMETRY,
            request_serializer=service_pb2.TelemetryCommand.SerializeToString,
            response_deserializer=service_pb2.TelemetryCommand.FromString,
        )
        settings = definition_pb2.Settings(client_type=definition_pb2.ClientType.SIMPLE_CONSUMER)
        settings.subscription.group.name = group
        entry = settings.subscription.subscriptions.add()
        entry.topic.name = topic
        entry.expression.type = definition_pb2.FilterType.TAG
        entry.expression.expression = "*"
        self.requests.put(service_pb2.TelemetryCommand(settings=settings))
        metadata = [
            ("x-mq-client-id", self.client_id),
            ("x-mq-language", "JAVA"),
            ("x-mq-client-version", "5.0.7"),
        ]
        self.responses = call(iter(self.requests.get, None), metadata=metadata)
        self.thread = threading.Thread(target=self._answer, daemon=True)
        self.thread.start()

    def _answer(self) -> None:
        try:
            for command in self.responses:
                if command.HasField("settings"):
                    self.settled.set()
                elif command.HasField("print_thread_stack_trace_command") and self.stack:
                    time.sleep(self.delay)
                    nonce = command.print_thread_stack_trace_command.nonce
                    trace = service_pb2.ThreadStackTrace(nonce=nonce, thread_stack_trace=self.stack)
                    self.requests.put(
                        service_pb2.TelemetryCommand(
                            status=definition_pb2.Status(code=Code.OK), thread_stack_trace=trace
                        )
                    )
                elif command.HasField("verify_message_command"):
                    self.verified.append(command.verify_message_command.message)
                    if self.verify_code is not None:
                        time.sleep(self.delay)
                        nonce = command.verify_message_command.nonce
                        self.requests.put(
                            service_pb2.TelemetryCommand(
                                status=definition_pb2.Status(code=self.verify_code),
                                verify_message_result=service_pb2.VerifyMessageResult(nonce=nonce),
                            )
                        )
        except grpc.RpcError:
            pass

    def close(self) -> None:
        self.requests.put(None)
        self.channel.close()


@pytest.fixture
def raw_clients() -> Iterator[list[RawClient]]:
    made: list[RawClient] = []
    yield made
    for client in made:
        client.close()


async def test_the_brokers_calls_answered_on_the_telemetry_stream(
    cluster: Cluster, raw_clients: list[RawClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pymq.broker.processors import admin as admin_processor

    # Shorter than pymq-admin's wait (15 s), so that a silent client is the broker's timeout,
    # and long enough for an answering client on a loaded machine (1 s failed in CI).
    monkeypatch.setattr(admin_processor, "CALL_CLIENT_TIMEOUT", 3.0)
    await cluster.broker.topic_config_manager.update(TopicConfig("Calls", 1, 1))
    [sent] = await produce(cluster, "Calls", [b"verify me"])
    target = endpoint(cluster)
    answering = RawClient(
        target, "Answering", "Calls", "main: parked", Code.FAILED_TO_CONSUME_MESSAGE
    )
    silent = RawClient(target, "Silent", "Calls", None, None)
    raw_clients += [answering, silent]
    for client in raw_clients:
        assert await trio.to_thread.run_sync(client.settled.wait, 10)
    ns, addr = cluster.namesrv_addr, cluster.broker_addr

    # consumerStatus -s: the thread stack the client answered, as the proxy relays it.
    status = json.loads(
        await admin_cli("consumerStatus", "-n", ns, "-g", "Answering", "-s", "--json")
    )
    assert [(s["clientId"], s["jstack"]) for s in status] == [(answering.client_id, "main: parked")]
    out = await admin_cli("consumerStatus", "-n", ns, "-g", "Answering", "-s")
    assert "main: parked" in out and "JAVA" in out

    # queryMsgById -g -d: the message verified by that client; its status is the result.
    result = json.loads(
        await admin_cli(
            "queryMsgById", "-n", ns, "-i", sent.offset_msg_id,
            "-g", "Answering", "-d", answering.client_id, "--json",
        )
    )  # fmt: skip
    assert result["consumeResult"] == "CR_LATER"
    assert result["remark"] == "from gRPC client"
    [verified] = answering.verified
    assert verified.body == b"verify me" and verified.topic.name == "Calls"

    # A client that does not answer: the caller's timeout, never a hang.
    async with open_remoting_client() as remoting:
        header = H.GetConsumerRunningInfoRequestHeader("Silent", silent.client_id, True)
        request = RemotingCommand.request(RequestCode.GET_CONSUMER_RUNNING_INFO, H.encode(header))
        with trio.fail_after(10):
            reply = await remoting.invoke(addr, request, 10)
        assert reply.code == ResponseCode.CONSUME_MSG_TIMEOUT
        header2 = H.ConsumeMessageDirectlyResultRequestHeader(
            "Silent", silent.client_id, sent.offset_msg_id, None
        )
        request = RemotingCommand.request(RequestCode.CONSUME_MESSAGE_DIRECTLY, H.encode(header2))
        reply = await remoting.invoke(addr, request, 10)
        assert reply.code == ResponseCode.CONSUME_MSG_TIMEOUT
    channel = cluster.broker.grpc_service.telemetry_channels[silent.client_id]  # type: ignore[union-attr]
    assert not channel._calls  # the unanswered calls are forgotten


@pytest.mark.slow
async def test_pymq_admin_waits_as_long_as_the_broker_for_a_5x_client(
    cluster: Cluster, raw_clients: list[RawClient]
) -> None:
    # A client answering after 6 s: past mqadmin's usual 5 s, within the broker's 10 s wait
    # for it (CALL_CLIENT_TIMEOUT); the tool waits for the broker's answer.
    await cluster.broker.topic_config_manager.update(TopicConfig("Slow", 1, 1))
    [sent] = await produce(cluster, "Slow", [b"late"])
    slow = RawClient(endpoint(cluster), "Slow", "Slow", "main: slow", Code.OK, delay=6.0)
    raw_clients.append(slow)
    assert await trio.to_thread.run_sync(slow.settled.wait, 10)
    ns = cluster.namesrv_addr
    status = json.loads(await admin_cli("consumerStatus", "-n", ns, "-g", "Slow", "-s", "--json"))
    assert [s["jstack"] for s in status] == ["main: slow"]
    result = json.loads(
        await admin_cli(
            "queryMsgById", "-n", ns, "-i", sent.offset_msg_id,
            "-g", "Slow", "-d", slow.client_id, "--json",
        )
    )  # fmt: skip
    assert result["consumeResult"] == "CR_SUCCESS"
