"""4.x and 5.x consumers in one group (issue #40): pymq's 4.x PushConsumer and the official 5.x
SimpleConsumer share the group's queues, each message consumed by one of them (none lost, none
twice while the members stay), and a queue the 4.x member stops pulling goes to the 5.x one
from the group's offset."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import trio
from rocketmq.v5.client import ClientConfiguration, Credentials
from rocketmq.v5.consumer import SimpleConsumer
from rocketmq.v5.model import FilterExpression

from pymq.broker.client_manager import QueuePullers
from pymq.client import ConsumeFromWhere, Message, MessageExt, Producer, PushConsumer, topics
from pymq.common.topic import retry_topic
from pymq.embedded import Cluster, open_cluster
from pymq.testing import TEST_PROPERTIES
from tests.helpers import free_port, wait_until

GROUP = "GMix"
TOPIC = "Mix"


class Collector:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, msgs: list[MessageExt]) -> bool:
        self.bodies += [m.body for m in msgs]
        return True


class Popper:
    """The 5.x SimpleConsumer of the group, receiving and acking in its own thread."""

    def __init__(self, endpoint: str) -> None:
        self.bodies: list[bytes] = []
        self.stop = threading.Event()
        self.consumer = SimpleConsumer(
            ClientConfiguration(endpoint, Credentials()),
            GROUP,
            {TOPIC: FilterExpression()},
            await_duration=1,
        )

    def run(self) -> None:
        self.consumer.startup()
        try:
            while not self.stop.is_set():
                for msg in self.consumer.receive(16, 20):
                    self.bodies.append(msg.body)
                    self.consumer.ack(msg)
        finally:
            self.consumer.shutdown()


async def produce(cluster: Cluster, bodies: list[bytes]) -> None:
    async with Producer("P4", cluster.namesrv_addr) as producer:
        for body in bodies:
            await producer.send(Message(TOPIC, body))
    await cluster.broker.store.reput.do_reput()


def pulled_queues(cluster: Cluster) -> set[int]:
    pullers = cluster.broker.context.queue_pullers
    now = trio.current_time()
    return {q for q in range(4) if pullers.puller(GROUP, TOPIC, q, now) is not None}


def test_a_held_pull_keeps_its_queue_then_the_grace() -> None:
    pullers = QueuePullers(grace=2.0)
    a, b = object(), object()
    pullers.pulled("G", "T", 0, now=100.0, hold=15.0, channel=a)
    assert pullers.puller("G", "T", 0, 116.9) is a  # held 15 s, then 2 s to pull again
    assert pullers.puller("G", "T", 0, 117.1) is None
    assert pullers.puller("G", "T", 1, 100.0) is None and pullers.puller("H", "T", 0, 100.0) is None
    pullers.pulled("G", "T", 0, now=101.0, channel=a)  # a shorter pull does not shorten it
    assert pullers.puller("G", "T", 0, 116.9) is a
    pullers.pulled("G", "T", 0, now=102.0, channel=b)  # another client's pull: its own time
    assert pullers.puller("G", "T", 0, 103.9) is b and pullers.puller("G", "T", 0, 104.1) is None


@pytest.mark.slow
async def test_4x_push_and_5x_simple_consumers_share_a_group(tmp_path) -> None:
    properties = dict(TEST_PROPERTIES, grpcServerPort=str(free_port()))
    async with open_cluster(
        str(tmp_path), namesrv_port=0, broker_port=0, bind_address="127.0.0.1",
        properties=properties,
    ) as cluster:  # fmt: skip
        broker = cluster.broker
        # Created as an operator does (mqadmin updateTopic): the name server knows its route.
        await topics.create_topic(cluster.namesrv_addr, TOPIC, brokers=[cluster.broker_addr])
        assert broker.grpc_server is not None
        popper = Popper(f"127.0.0.1:{broker.grpc_server.port}")
        collector = Collector()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, popper.run)
            try:
                await mixed(cluster, popper, collector)
            finally:
                popper.stop.set()
        offsets: dict[int, Any] = broker.consumer_offset_manager.query_offsets(GROUP, TOPIC)
        store = broker.store
        assert offsets == {q: store.get_max_offset_in_queue(TOPIC, q) for q in range(4)}


async def mixed(cluster: Cluster, popper: Popper, collector: Collector) -> None:
    broker = cluster.broker
    await wait_until(lambda: broker.consumer_manager.get(GROUP) is not None, timeout=20)
    push = PushConsumer(
        GROUP,
        cluster.namesrv_addr,
        collector,
        consume_from=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        rebalance_interval=1,
    )
    async with push:
        await push.subscribe(TOPIC)
        # The 4.x rebalance counts the 5.x member: it pulls two of the four queues.
        await wait_until(lambda: len(pulled_queues(cluster)) == 2, timeout=20)
        mine = pulled_queues(cluster)
        first = [f"a{i}".encode() for i in range(40)]
        await produce(cluster, first)

        def both() -> list[bytes]:
            return collector.bodies + popper.bodies

        await wait_until(lambda: len(both()) >= len(first), timeout=30)
        await trio.sleep(1)  # and nothing comes twice
        assert sorted(both()) == sorted(first)
        assert pulled_queues(cluster) == mine
        assert collector.bodies and popper.bodies  # each had its share
        # A 5.x member's heartbeat keeps the 4.x member's subscriptions (its retry topic,
        # which its pulls are checked against).
        service = broker.grpc_service
        assert service is not None
        [channel] = service.telemetry_channels.values()
        service._refresh(channel)
        subscribed = broker.consumer_manager.get(GROUP).subscriptions  # type: ignore[union-attr]
        assert set(subscribed) == {TOPIC, retry_topic(GROUP)}
    # The 4.x member left (unregistered): its queues go to the 5.x one at once, from the
    # group's offset (the 4.x consumer committed what it consumed as it shut down).
    second = [f"b{i}".encode() for i in range(20)]
    await produce(cluster, second)
    await wait_until(lambda: set(second) <= set(popper.bodies), timeout=30)
    every = collector.bodies + popper.bodies
    assert set(every) == set(first) | set(second)  # none lost
    assert sorted(popper.bodies[-len(second) :]) == sorted(second)
