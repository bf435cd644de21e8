"""POP consumption over gRPC (issue #40) with the official SimpleConsumer: receive, ack,
change_invisible_duration, redelivery with the attempt counted, the DLQ after the group's max
attempts, a 4.x producer's message received by a 5.x consumer, and unacked messages received
again after a broker restart."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from rocketmq.v5.client import ClientConfiguration, Credentials
from rocketmq.v5.consumer import ConsumeResult, MessageListener, SimpleConsumer
from rocketmq.v5.consumer import PushConsumer as PushConsumer5
from rocketmq.v5.model import FilterExpression

from pymq.broker.controller import PERSIST_OFFSETS_INITIAL_DELAY
from pymq.broker.subscription_group_manager import SubscriptionGroupConfig
from pymq.client import Message, Producer, topics
from pymq.common.topic import TopicConfig, dlq_topic
from pymq.embedded import Cluster, open_cluster
from pymq.proxy.pop import HandleError
from pymq.testing import TEST_PROPERTIES
from tests.helpers import free_port


def props(port: int) -> dict[str, str]:
    return dict(TEST_PROPERTIES, grpcServerPort=str(port))


async def start(tmp_path, port: int):  # type: ignore[no-untyped-def]
    return open_cluster(
        str(tmp_path), namesrv_port=0, broker_port=0, bind_address="127.0.0.1",
        properties=props(port),
    )  # fmt: skip


def with_consumer(
    port: int, group: str, topic: str, work: Callable[[SimpleConsumer], Any], *, tags: str = "*"
) -> Any:
    consumer = SimpleConsumer(
        ClientConfiguration(f"127.0.0.1:{port}", Credentials()),
        group,
        {topic: FilterExpression(tags)},
        await_duration=1,
    )
    consumer.startup()
    try:
        return work(consumer)
    finally:
        consumer.shutdown()


async def produce_4x(cluster: Cluster, topic: str, bodies: list[bytes], tag: str = "T") -> None:
    async with Producer("P4", cluster.namesrv_addr) as producer:
        for body in bodies:
            await producer.send(Message(topic, body, tags=tag, keys=["k-" + body.decode()]))
    await cluster.broker.store.reput.do_reput()


def receive_until(consumer: SimpleConsumer, count: int, invisible: int = 10) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + 20
    while len(got) < count and time.monotonic() < deadline:
        got += consumer.receive(count - len(got), invisible)
    return got


@pytest.mark.slow
async def test_receive_ack_and_a_4x_message_intact(tmp_path) -> None:
    port = free_port()
    async with await start(tmp_path, port) as cluster:
        await cluster.broker.topic_config_manager.update(TopicConfig("Pop", 2, 2))
        bodies = [f"m{i}".encode() for i in range(6)]
        await produce_4x(cluster, "Pop", bodies)

        def work(consumer: SimpleConsumer) -> tuple[list[Any], list[Any]]:
            got = receive_until(consumer, 6)
            for msg in got:
                consumer.ack(msg)
            again = consumer.receive(6, 10)  # all acked: nothing comes back
            return got, again

        got, again = await trio.to_thread.run_sync(with_consumer, port, "G5", "Pop", work)
        assert sorted(m.body for m in got) == bodies
        assert again == []
        for msg in got:
            assert msg.tag == "T"
            assert msg.keys == {"k-" + msg.body.decode()}
            assert msg.delivery_attempt == 1
            assert not msg.corrupted  # the body's CRC32 digest checked by the client
            assert msg.message_id  # the 4.x producer's UNIQ_KEY
        # Every message acked: the group's offsets are at the queues' ends.
        offsets = cluster.broker.consumer_offset_manager.query_offsets("G5", "Pop")
        store = cluster.broker.store
        assert offsets == {q: store.get_max_offset_in_queue("Pop", q) for q in (0, 1)}


async def test_one_receive_reads_every_queue_whichever_the_client_names(tmp_path) -> None:
    """The SimpleConsumer names one of the route's queues in each ReceiveMessage; the broker
    pops from all of them (the 5.x proxy's queue -1), so one receive gets what every queue has
    rather than one queue's share, and no receive waits out its long polling on an empty queue
    while another has messages."""
    port = free_port()
    async with await start(tmp_path, port) as cluster:
        await cluster.broker.topic_config_manager.update(TopicConfig("Spread", 4, 4))
        bodies = [f"s{i}".encode() for i in range(8)]
        await produce_4x(cluster, "Spread", bodies)
        store = cluster.broker.store
        assert all(store.get_max_offset_in_queue("Spread", q) > 0 for q in range(4))

        def work(consumer: SimpleConsumer) -> list[list[bytes]]:
            return [[m.body for m in consumer.receive(32, 10)] for _ in range(2)]

        first, second = await trio.to_thread.run_sync(with_consumer, port, "GS", "Spread", work)
        assert sorted(first) == bodies
        assert second == []


def _tasks() -> int:
    def count(task: trio.lowlevel.Task) -> int:
        return 1 + sum(count(t) for n in task.child_nurseries for t in n.child_tasks)

    return count(trio.lowlevel.current_root_task())


async def test_a_waiting_receive_costs_no_task_per_queue(tmp_path) -> None:
    """A receive long-polls every queue of the topic (up to 1,024) with one wait for an
    arrival in any of them, not a task and an event per queue, and passes over the queues
    with nothing to read without work per queue; an arrival in any queue ends it."""
    port = free_port()
    async with await start(tmp_path, port) as cluster:
        await cluster.broker.topic_config_manager.update(TopicConfig("Wide", 1024, 1024))
        assert cluster.broker.grpc_service is not None
        pop = cluster.broker.grpc_service.pop
        before = _tasks()
        got: list[Any] = []

        async def receive() -> None:
            got.extend(await pop.receive(
                "GW", "Wide", list(range(1024)), batch=4, invisible_ms=60_000,
                long_polling_ms=15_000, expression="*", max_attempts=17,
            ))  # fmt: skip

        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive)
            await trio.testing.wait_all_tasks_blocked()
            assert _tasks() - before < 10
            # The empty queues were passed over: no state, no offset committed for them
            # (a pass over 1,024 queues held the loop about 10 ms when each was settled).
            offsets = cluster.broker.consumer_offset_manager
            assert offsets.query_offsets("GW", "Wide") == {} and pop.states == {}
            await produce_4x(cluster, "Wide", [b"w"])
        assert [r.message.body for r in got] == [b"w"]
        assert list(offsets.query_offsets("GW", "Wide").values()) == [0]  # in flight


@pytest.mark.slow
async def test_unacked_comes_back_then_goes_to_the_dlq(tmp_path) -> None:
    port = free_port()
    async with await start(tmp_path, port) as cluster:
        await cluster.broker.topic_config_manager.update(TopicConfig("Retry5", 1, 1))
        # Two delivery attempts for this group.
        await cluster.broker.subscription_group_manager.update(
            SubscriptionGroupConfig("G2", retry_max_times=1)
        )
        await produce_4x(cluster, "Retry5", [b"flaky"])

        def work(consumer: SimpleConsumer) -> list[Any]:
            [first] = receive_until(consumer, 1)
            # Shortened to one second: it comes back, its attempt counted.
            consumer.change_invisible_duration(first, 1)
            [second] = receive_until(consumer, 1)
            consumer.change_invisible_duration(second, 1)
            time.sleep(1.5)
            # Past two attempts: moved to the DLQ, not received again.
            third = consumer.receive(1, 10)
            return [first, second, third]

        first, second, third = await trio.to_thread.run_sync(
            with_consumer, port, "G2", "Retry5", work
        )
        assert (first.body, first.delivery_attempt) == (b"flaky", 1)
        assert (second.body, second.delivery_attempt) == (b"flaky", 2)
        assert third == []
        store = cluster.broker.store
        await store.reput.do_reput()
        dlq = dlq_topic("G2")
        assert store.get_max_offset_in_queue(dlq, 0) == 1
        result = store.get_message("check", dlq, 0, 0, 1)
        assert b"flaky" in result.messages[0]
        offsets = cluster.broker.consumer_offset_manager.query_offsets("G2", "Retry5")
        assert offsets == {0: 1}


async def test_a_stale_receipt_handle_is_refused(tmp_path) -> None:
    port = free_port()
    async with await start(tmp_path, port) as cluster:
        await cluster.broker.topic_config_manager.update(TopicConfig("Stale", 1, 1))
        await produce_4x(cluster, "Stale", [b"one"])

        def work(consumer: SimpleConsumer) -> str:
            [msg] = receive_until(consumer, 1)
            old = msg.receipt_handle
            consumer.change_invisible_duration(msg, 10)  # a new handle replaces the old one
            assert msg.receipt_handle != old
            msg.receipt_handle = old
            try:
                consumer.ack(msg)
            except Exception as exc:  # the client raises the status it got
                return str(exc)
            return "acked"

        outcome = await trio.to_thread.run_sync(with_consumer, port, "GS", "Stale", work)
        assert "INVALID_RECEIPT_HANDLE" in outcome


async def reset_by_time(cluster: Cluster, group: str, topic: str, timestamp: str) -> None:
    """``pymq-admin resetOffsetByTime`` (INVOKE_BROKER_TO_RESET_OFFSET on the broker)."""
    result = await trio.run_process(
        [sys.executable, "-m", "pymq.admin", "resetOffsetByTime", "-n", cluster.namesrv_addr,
         "-g", group, "-t", topic, "-s", timestamp],
        capture_stdout=True, capture_stderr=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
async def test_a_reset_wins_over_the_messages_in_flight(tmp_path) -> None:
    # RocketMQ 5's resetPopOffset: the queue's next receive reads from the reset offset, what
    # was in flight is forgotten; an ack of its stale handle answers OK and changes nothing.
    port = free_port()
    async with await start(tmp_path, port) as cluster:
        await cluster.broker.topic_config_manager.update(TopicConfig("Reset5", 1, 1))
        await produce_4x(cluster, "Reset5", [b"a", b"b"])
        assert cluster.broker.grpc_service is not None
        pop = cluster.broker.grpc_service.pop
        got = await pop.receive(
            "GR", "Reset5", [0], batch=1, invisible_ms=60_000, long_polling_ms=0,
            expression="*", max_attempts=17,
        )  # fmt: skip
        assert [r.message.body for r in got] == [b"a"]  # a in flight, the read point at b
        stale = got[0].handle
        offsets = cluster.broker.consumer_offset_manager

        # Forward, past everything (now): nothing is received, and the offset stays there.
        await reset_by_time(cluster, "GR", "Reset5", "now")
        assert offsets.query_offset("GR", "Reset5", 0) == 2
        nothing = await pop.receive(
            "GR", "Reset5", [0], batch=4, invisible_ms=60_000, long_polling_ms=0,
            expression="*", max_attempts=17,
        )  # fmt: skip
        assert nothing == []
        pop.ack("GR", "Reset5", stale)  # harmless: no error, no state
        assert offsets.query_offset("GR", "Reset5", 0) == 2
        with pytest.raises(HandleError):
            pop.change_invisible("GR", "Reset5", stale, 10_000)
        with pytest.raises(HandleError):  # a handle no reset made stale is still refused
            pop.ack("GR", "Reset5", stale.rsplit("_", 1)[0] + "_999999")
        assert pop.inflight_view() == [] and pop.inflight_total == 0

        # Back to the start (a time before a): both again, as first deliveries.
        await reset_by_time(cluster, "GR", "Reset5", "0")
        assert offsets.query_offset("GR", "Reset5", 0) == 0
        again = await pop.receive(
            "GR", "Reset5", [0], batch=4, invisible_ms=60_000, long_polling_ms=0,
            expression="*", max_attempts=17,
        )  # fmt: skip
        assert [(r.message.body, r.attempt) for r in again] == [(b"a", 1), (b"b", 1)]
        pop.ack("GR", "Reset5", stale)  # the old handle of a, while a is in flight anew
        assert [r["inFlight"] for r in pop.inflight_view()] == [2]
        for r in again:
            pop.ack("GR", "Reset5", r.handle)
        assert offsets.query_offset("GR", "Reset5", 0) == 2


async def test_unacked_messages_come_back_after_a_restart(tmp_path) -> None:
    port = free_port()
    async with await start(tmp_path, port) as cluster:
        await cluster.broker.topic_config_manager.update(TopicConfig("Durable", 1, 1))
        await produce_4x(cluster, "Durable", [b"a", b"b", b"c", b"d"])

        def work(consumer: SimpleConsumer) -> list[Any]:
            got = sorted(receive_until(consumer, 4, invisible=600), key=lambda m: m.body)
            consumer.ack(got[0])  # a acked; b unacked; c acked; d unacked
            consumer.ack(got[2])
            return got

        await trio.to_thread.run_sync(with_consumer, port, "GR", "Durable", work)
    port = free_port()
    async with await start(tmp_path, port) as cluster:

        def again(consumer: SimpleConsumer) -> list[bytes]:
            got = receive_until(consumer, 2)
            more = consumer.receive(4, 10)
            return sorted(m.body for m in got + more)

        bodies = await trio.to_thread.run_sync(with_consumer, port, "GR", "Durable", again)
    # Every unacked message again (at least once); a is not; c, acked above the unacked b,
    # may come again too.
    assert {b"b", b"d"} <= set(bodies) <= {b"b", b"c", b"d"}


def _start_pymq(data: str, grpc_port: int) -> tuple[subprocess.Popen[str], str, str]:
    """``python -m pymq`` on ``data`` serving gRPC on ``grpc_port``, its consumer offsets
    persisted every 200 ms; the process, its name server's and its broker's address."""
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "pymq", "--data", data, "--bind", "127.0.0.1",
            "--namesrv-port", "0", "--broker-port", "0", "--admin-port", "0",
            "--metrics-port", "0", "--grpc-port", str(grpc_port),
            "--mappedFileSizeCommitLog", str(1 << 20),
            "--flushConsumerOffsetInterval", "200",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    banner = proc.stdout.readline()
    found = re.search(r"name server (127\.0\.0\.1:\d+), broker (127\.0\.0\.1:\d+)", banner)
    if found is None:
        proc.kill()
        proc.wait()
        raise AssertionError(f"no banner: {banner!r}")
    return proc, found.group(1), found.group(2)


@pytest.mark.slow
async def test_kill_9_redelivers_every_unacked_message_and_no_persisted_ack(tmp_path) -> None:
    data = str(tmp_path / "data")
    port = free_port()
    proc, ns, broker = _start_pymq(data, port)
    try:
        await topics.create_topic(ns, "Killed", queues=1, brokers=[broker])
        async with Producer("P4", ns) as producer:
            for body in (b"a", b"b", b"c", b"d"):
                await producer.send(Message("Killed", body))

        def work(consumer: SimpleConsumer) -> None:
            got = sorted(receive_until(consumer, 4, invisible=600), key=lambda m: m.body)
            assert [m.body for m in got] == [b"a", b"b", b"c", b"d"]
            consumer.ack(got[0])  # a acked; b unacked; c acked; d unacked
            consumer.ack(got[2])

        await trio.to_thread.run_sync(with_consumer, port, "GK", "Killed", work)
        # The offsets persisted since the acks: the broker persists them from 10 s after its
        # start (PERSIST_OFFSETS_INITIAL_DELAY), then every 200 ms here.
        saved = Path(data) / "store" / "config" / "consumerOffset.json"
        with trio.fail_after(PERSIST_OFFSETS_INITIAL_DELAY + 10):
            while not saved.exists() or '"Killed@GK"' not in saved.read_text():
                await trio.sleep(0.1)
        await trio.sleep(0.5)
    finally:
        proc.kill()  # SIGKILL: no shutdown, nothing flushed on the way out
        proc.wait()
    port = free_port()
    proc, ns, broker = _start_pymq(data, port)
    try:

        def again(consumer: SimpleConsumer) -> list[bytes]:
            got = receive_until(consumer, 2)
            more = consumer.receive(4, 10)
            return sorted(m.body for m in got + more)

        bodies = await trio.to_thread.run_sync(with_consumer, port, "GK", "Killed", again)
    finally:
        proc.kill()
        proc.wait()
    # b and d again; a (acked below every unacked one) never; c (acked above b) may.
    assert {b"b", b"d"} <= set(bodies) <= {b"b", b"c", b"d"}


class Listener(MessageListener):
    """Fails each body in ``fail_once`` on its first delivery."""

    def __init__(self, fail_once: set[bytes]) -> None:
        self.got: list[tuple[bytes, int]] = []
        self.fail_once = set(fail_once)

    def consume(self, message: Any) -> ConsumeResult:
        self.got.append((message.body, message.delivery_attempt))
        if message.body in self.fail_once:
            self.fail_once.discard(message.body)
            return ConsumeResult.FAILURE
        return ConsumeResult.SUCCESS


@pytest.mark.slow
async def test_push_consumer_success_and_failure(tmp_path) -> None:
    port = free_port()
    async with await start(tmp_path, port) as cluster:
        await cluster.broker.topic_config_manager.update(TopicConfig("Push5", 2, 2))
        await produce_4x(cluster, "Push5", [b"a", b"b", b"c"])
        listener = Listener({b"b"})

        def work() -> None:
            consumer = PushConsumer5(
                ClientConfiguration(f"127.0.0.1:{port}", Credentials()),
                "GP",
                listener,
                {"Push5": FilterExpression()},
            )
            consumer.startup()
            try:
                deadline = time.monotonic() + 20
                while len(listener.got) < 4 and time.monotonic() < deadline:
                    time.sleep(0.05)
            finally:
                consumer.shutdown()

        await trio.to_thread.run_sync(work)
        # b failed once: received again, its attempt counted (after the 1 s backoff).
        assert sorted(listener.got) == [(b"a", 1), (b"b", 1), (b"b", 2), (b"c", 1)]
        offsets = cluster.broker.consumer_offset_manager.query_offsets("GP", "Push5")
        store = cluster.broker.store
        assert offsets == {q: store.get_max_offset_in_queue("Push5", q) for q in (0, 1)}


async def test_forward_to_the_dlq(tmp_path) -> None:
    import grpc
    from rocketmq.grpc_protocol import definition_pb2, service_pb2

    port = free_port()
    async with await start(tmp_path, port) as cluster:
        await cluster.broker.topic_config_manager.update(TopicConfig("Poison", 1, 1))
        await produce_4x(cluster, "Poison", [b"poison"])

        def forward(handle: str) -> tuple[Any, Any]:
            request = service_pb2.ForwardMessageToDeadLetterQueueRequest(receipt_handle=handle)
            request.group.name = "GF"
            request.topic.name = "Poison"
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = channel.unary_unary(
                    "/apache.rocketmq.v2.MessagingService/ForwardMessageToDeadLetterQueue",
                    request_serializer=service_pb2.ForwardMessageToDeadLetterQueueRequest.SerializeToString,
                    response_deserializer=service_pb2.ForwardMessageToDeadLetterQueueResponse.FromString,
                )
                return call(request, timeout=10), call(request, timeout=10)

        def work(consumer: SimpleConsumer) -> tuple[Any, Any, list[Any]]:
            [msg] = receive_until(consumer, 1)
            first, again = forward(msg.receipt_handle)
            return first, again, consumer.receive(1, 10)

        first, again, after = await trio.to_thread.run_sync(
            with_consumer, port, "GF", "Poison", work
        )
        assert first.status.code == definition_pb2.Code.OK
        assert again.status.code == definition_pb2.Code.INVALID_RECEIPT_HANDLE  # acked by it
        assert after == []
        store = cluster.broker.store
        await store.reput.do_reput()
        assert store.get_max_offset_in_queue(dlq_topic("GF"), 0) == 1


@pytest.mark.slow
async def test_fifo_group_receives_in_order_one_batch_in_flight(tmp_path) -> None:
    port = free_port()
    async with await start(tmp_path, port) as cluster:
        await cluster.broker.topic_config_manager.update(
            TopicConfig("Ordered", 1, 1, attributes={"message.type": "FIFO"})
        )
        # The group made orderly as an operator does it (mqadmin updateSubGroup -o true).
        cli = [
            sys.executable, "-m", "pymq.admin", "updateSubGroup", "-n", cluster.namesrv_addr,
            "-b", cluster.broker_addr, "-g", "GO", "-o", "true",
        ]  # fmt: skip
        done = await trio.run_process(cli, capture_stdout=True, capture_stderr=True)
        assert done.returncode == 0, done.stderr
        group = cluster.broker.subscription_group_manager.table["GO"]
        assert group.consume_message_orderly is True
        async with Producer("P4", cluster.namesrv_addr) as producer:
            for i in range(6):  # one queue: the order it is stored in
                await producer.send(
                    Message("Ordered", str(i).encode(), properties={"__SHARDINGKEY": "g"})
                )
        await cluster.broker.store.reput.do_reput()

        def bodies(msgs: list[Any]) -> list[tuple[str, int]]:
            return [(m.body.decode(), m.delivery_attempt) for m in msgs]

        def work(consumer: SimpleConsumer) -> list[list[tuple[str, int]]]:
            steps = []
            first = consumer.receive(3, 10)
            steps.append(bodies(first))
            steps.append(bodies(consumer.receive(3, 10)))  # the queue's batch is in flight
            consumer.ack(first[0])
            consumer.ack(first[1])
            consumer.change_invisible_duration(first[2], 1)  # comes back first, alone
            time.sleep(1.2)
            again = consumer.receive(3, 10)
            steps.append(bodies(again))
            consumer.ack(again[0])
            rest = consumer.receive(3, 10)
            steps.append(bodies(rest))
            return steps

        steps = await trio.to_thread.run_sync(with_consumer, port, "GO", "Ordered", work)
        assert steps == [
            [("0", 1), ("1", 1), ("2", 1)],
            [],
            [("2", 2)],
            [("3", 1), ("4", 1), ("5", 1)],
        ]

        # A group that is not orderly is not held back by what it has in flight.
        def unordered(consumer: SimpleConsumer) -> list[list[tuple[str, int]]]:
            return [bodies(consumer.receive(3, 10)), bodies(consumer.receive(3, 10))]

        loose = await trio.to_thread.run_sync(with_consumer, port, "GU", "Ordered", unordered)
        assert loose == [[("0", 1), ("1", 1), ("2", 1)], [("3", 1), ("4", 1), ("5", 1)]]


async def test_pull_and_offset_rpcs(tmp_path) -> None:
    import grpc
    from rocketmq.grpc_protocol import definition_pb2, service_pb2

    code = definition_pb2.Code
    port = free_port()
    async with await start(tmp_path, port) as cluster:
        await cluster.broker.topic_config_manager.update(TopicConfig("Pulled", 1, 1))
        await produce_4x(cluster, "Pulled", [b"p0", b"p1", b"p2"])

        def queue(request: Any) -> None:
            request.message_queue.topic.name = "Pulled"
            request.message_queue.id = 0

        def rpcs() -> dict[str, Any]:
            out: dict[str, Any] = {}
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:

                def unary(name: str, request: Any, response: Any) -> Any:
                    return channel.unary_unary(
                        f"/apache.rocketmq.v2.MessagingService/{name}",
                        request_serializer=type(request).SerializeToString,
                        response_deserializer=response.FromString,
                    )(request, timeout=10)

                pull = channel.unary_stream(
                    "/apache.rocketmq.v2.MessagingService/PullMessage",
                    request_serializer=service_pb2.PullMessageRequest.SerializeToString,
                    response_deserializer=service_pb2.PullMessageResponse.FromString,
                )
                for policy in ("BEGINNING", "END"):
                    request = service_pb2.QueryOffsetRequest(
                        query_offset_policy=definition_pb2.QueryOffsetPolicy.Value(policy)
                    )
                    queue(request)
                    out[policy] = unary("QueryOffset", request, service_pb2.QueryOffsetResponse)
                get = service_pb2.GetOffsetRequest()
                get.group.name = "GPull"
                queue(get)
                out["before"] = unary("GetOffset", get, service_pb2.GetOffsetResponse)
                request = service_pb2.PullMessageRequest(offset=1, batch_size=10)
                request.group.name = "GPull"
                queue(request)
                out["pull"] = list(pull(request, timeout=10))
                request.offset = 3
                request.long_polling_timeout.FromMilliseconds(300)
                out["empty"] = list(pull(request, timeout=10))
                request.offset = 99
                out["beyond"] = list(pull(request, timeout=10))
                update = service_pb2.UpdateOffsetRequest(offset=2)
                update.group.name = "GPull"
                queue(update)
                out["update"] = unary("UpdateOffset", update, service_pb2.UpdateOffsetResponse)
                out["after"] = unary("GetOffset", get, service_pb2.GetOffsetResponse)
            return out

        out = await trio.to_thread.run_sync(rpcs)
        assert (out["BEGINNING"].offset, out["END"].offset) == (0, 3)
        assert out["before"].status.code == code.OFFSET_NOT_FOUND
        pulled = out["pull"]
        assert pulled[0].status.code == code.OK
        assert [r.message.body for r in pulled[1:-1]] == [b"p1", b"p2"]
        assert [r.message.system_properties.queue_offset for r in pulled[1:-1]] == [1, 2]
        assert pulled[-1].next_offset == 3
        empty = out["empty"]
        assert empty[0].status.code == code.MESSAGE_NOT_FOUND and empty[-1].next_offset == 3
        beyond = out["beyond"]
        assert beyond[0].status.code == code.ILLEGAL_OFFSET and beyond[-1].next_offset == 3
        assert out["update"].status.code == code.OK
        assert (out["after"].status.code, out["after"].offset) == (code.OK, 2)
        assert cluster.broker.consumer_offset_manager.query_offset("GPull", "Pulled", 0) == 2
