"""Timer messages (issue #41, open points): a timer already due when the enqueue reads it is
put at once with RocketMQ 5's "never enqueued" mark; deleting a topic drops its pending timers
(also across a restart, and not delivered to a topic created again with the same name); the
pending count per topic is right after a restart."""

from __future__ import annotations

import time
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
import trio

from pymq.broker.admin_service import AdminService
from pymq.broker.controller import BrokerController
from pymq.client import ConsumeFromWhere, Message, MessageExt, Producer, PushConsumer, topics
from pymq.common.topic import TIMER_TOPIC
from pymq.embedded import Cluster, open_cluster
from pymq.testing import TEST_PROPERTIES
from tests.helpers import wait_until

FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
LONG_MAX = 2**63 - 1


def now_ms() -> int:
    return int(time.time() * 1000)


def cluster_at(data: str, **props: str) -> AbstractAsyncContextManager[Cluster]:
    return open_cluster(
        data, namesrv_port=0, broker_port=0, bind_address="127.0.0.1",
        properties=dict(TEST_PROPERTIES, **props),
    )  # fmt: skip


async def entered(broker: BrokerController, count: int) -> None:
    timer = broker.timer
    await wait_until(
        lambda: timer.timers is not None and timer.timers.enqueue_offset >= count,
        timeout=30,
        interval=0.05,
    )


async def queued(broker: BrokerController, topic: str) -> int:
    await broker.store.reput.do_reput()
    return max(broker.store.get_max_offset_in_queue(topic, 0), 0)


async def consume(ns: str, topic: str, count: int) -> list[MessageExt]:
    got: list[MessageExt] = []
    done = trio.Event()

    async def handler(msgs: list[MessageExt]) -> bool:
        got.extend(msgs)
        if len(got) >= count:
            done.set()
        return True

    async with PushConsumer("G", ns, handler, consume_from=FIRST) as consumer:
        await consumer.subscribe(topic)
        with trio.fail_after(30):
            await done.wait()
    return got


async def test_a_timer_due_when_entered_is_put_at_once_marked_never_enqueued(
    tmp_path: Path,
) -> None:
    async with cluster_at(str(tmp_path)) as cluster:
        ns, broker = cluster.namesrv_addr, cluster.broker
        await topics.create_topic(ns, "Late", brokers=[cluster.broker_addr], queues=1)
        broker.store.config.timer_stop_enqueue = True  # the enqueue falls behind
        due = now_ms() + 600
        async with Producer("P", ns) as producer:
            await producer.send(Message("Late", b"late", properties={"TIMER_DELIVER_MS": str(due)}))
            await producer.send(Message("Late", b"wait", properties={"TIMER_DELAY_SEC": "60"}))
        assert await queued(broker, TIMER_TOPIC) == 2
        await trio.sleep(max(due - now_ms(), 0) / 1000 + 0.2)
        broker.store.config.timer_stop_enqueue = False
        [msg] = await consume(ns, "Late", 1)
        assert msg.body == b"late"
        props = msg.properties
        assert props["TIMER_ENQUEUE_MS"] == str(LONG_MAX)  # RocketMQ 5: never enqueued
        assert int(props["TIMER_DEQUEUE_MS"]) >= due
        assert props["TIMER_OUT_MS"] == str(due)
        assert "REAL_TOPIC" not in props and "REAL_QID" not in props
        # Only the one entered in the wheel is pending.
        await entered(broker, 2)
        assert broker.timer.timers is not None
        assert broker.timer.timers.counts == {"Late": 1}
        assert broker.timer.enqueue_total == {"Late": 2}
        assert broker.timer.dequeue_total == {"Late": 1}


@pytest.mark.slow
async def test_deleting_a_topic_drops_its_timers_across_a_restart_and_a_recreation(
    tmp_path: Path,
) -> None:
    data = str(tmp_path / "data")
    async with cluster_at(data) as cluster:
        ns, broker = cluster.namesrv_addr, cluster.broker
        for topic in ("Gone", "Stay"):
            await topics.create_topic(ns, topic, brokers=[cluster.broker_addr], queues=1)
        due = now_ms() + 3000
        async with Producer("P", ns) as producer:
            for i in range(3):
                await producer.send(
                    Message("Gone", b"old%d" % i, properties={"TIMER_DELIVER_MS": str(due)})
                )
            await producer.send(Message("Stay", b"stay", properties={"TIMER_DELIVER_MS": str(due)}))
        await entered(broker, 4)
        assert broker.timer.timers is not None
        assert broker.timer.timers.counts == {"Gone": 3, "Stay": 1}
        await AdminService(broker).delete_topic("Gone")
        assert broker.timer.timers.counts == {"Stay": 1}
        # Created again under the same name, with a timer of its own.
        await topics.create_topic(ns, "Gone", brokers=[cluster.broker_addr], queues=1)
        async with Producer("P", ns) as producer:
            await producer.send(Message("Gone", b"new", properties={"TIMER_DELIVER_MS": str(due)}))
        await entered(broker, 5)
        assert broker.timer.timers.counts == {"Gone": 1, "Stay": 1}
    # Restarted before any of them is due: the counts come back as they were.
    async with cluster_at(data) as cluster:
        ns, broker = cluster.namesrv_addr, cluster.broker
        timers = broker.timer.timers
        assert timers is not None and timers.counts == {"Gone": 1, "Stay": 1}
        assert now_ms() < due
        got = await consume(ns, "Gone", 1)
        await wait_until(lambda: broker.timer.dropped == 3, timeout=10, interval=0.05)
        await trio.sleep(0.5)  # room for an old one wrongly delivered after the new
        assert await queued(broker, "Gone") == 1
        assert [m.body for m in got] == [b"new"]
        assert await queued(broker, "Stay") == 1
        assert timers.counts == {}


async def test_timer_stop_dequeue_holds_due_timers_until_resumed(tmp_path: Path) -> None:
    """timerStopDequeue pauses delivery: a timer due meanwhile is entered and stays pending,
    delivered (late, not lost) once dequeue resumes."""
    async with cluster_at(str(tmp_path), timerPrecisionMs="200") as cluster:
        ns, broker = cluster.namesrv_addr, cluster.broker
        await topics.create_topic(ns, "Held", brokers=[cluster.broker_addr], queues=1)
        broker.store.config.timer_stop_dequeue = True
        due = now_ms() + 400
        async with Producer("P", ns) as producer:
            await producer.send(Message("Held", b"held", properties={"TIMER_DELIVER_MS": str(due)}))
        await entered(broker, 1)
        await trio.sleep(max(due - now_ms(), 0) / 1000 + 0.6)  # due, and 3 slots over
        assert await queued(broker, "Held") == 0  # not delivered while paused
        assert broker.timer.timers is not None and broker.timer.timers.counts == {"Held": 1}
        broker.store.config.timer_stop_dequeue = False
        [msg] = await consume(ns, "Held", 1)
        assert msg.body == b"held" and int(msg.properties["TIMER_DEQUEUE_MS"]) >= due
        await wait_until(lambda: broker.timer.timers.counts.get("Held", 0) == 0, timeout=10)  # type: ignore[union-attr]
