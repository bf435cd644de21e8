"""RocketMQ 5's timer metrics on /metrics (issue #41): enqueue/dequeue totals and pending
timers per topic, enqueue and dequeue lag, read through a scrape."""

from __future__ import annotations

import time
from pathlib import Path

import trio

from pymq.client import Message, Producer, topics
from pymq.common.topic import TIMER_TOPIC
from pymq.embedded import open_cluster
from pymq.testing import TEST_PROPERTIES
from tests.helpers import wait_until
from tests.integration.test_metrics import scrape, value


async def test_timer_metrics_through_a_scrape(tmp_path: Path) -> None:
    props = dict(
        TEST_PROPERTIES,
        metricsExporterType="PROM",
        metricsPromExporterHost="127.0.0.1",
        metricsPromExporterPort="0",
    )
    async with open_cluster(
        str(tmp_path), namesrv_port=0, broker_port=0, bind_address="127.0.0.1", properties=props
    ) as cluster:
        broker, ns = cluster.broker, cluster.namesrv_addr
        assert broker.metrics is not None
        port = broker.metrics.port
        for topic in ("TimedA", "TimedB"):
            await topics.create_topic(ns, topic, brokers=[cluster.broker_addr], queues=1)
        broker.store.config.timer_stop_enqueue = True
        soon = int(time.time() * 1000) + 300
        async with Producer("P", ns) as producer:
            await producer.send(
                Message("TimedA", b"soon", properties={"TIMER_DELIVER_MS": str(soon)})
            )
            for topic in ("TimedA", "TimedA", "TimedB"):
                await producer.send(Message(topic, b"later", properties={"TIMER_DELAY_SEC": "600"}))
        await broker.store.reput.do_reput()
        assert broker.store.get_max_offset_in_queue(TIMER_TOPIC, 0) == 4
        labels = {"cluster": "DefaultCluster", "node_type": "broker", "storage_type": "local"}
        samples = await scrape(port)
        assert value(samples, "rocketmq_timer_enqueue_lag", **labels) == 4
        assert value(samples, "rocketmq_timer_dequeue_lag", **labels) == 0
        await trio.sleep(0.5)  # "soon" is due before the enqueue reads it
        broker.store.config.timer_stop_enqueue = False
        timer = broker.timer
        await wait_until(lambda: timer.dequeue_total.get("TimedA") == 1, timeout=10)
        wheel, clock = timer.timers, broker.store.clock_ms
        assert wheel is not None
        before, read_before = clock(), wheel.read_ms
        samples = await scrape(port)
        after, read_after = clock(), wheel.read_ms
        assert value(samples, "rocketmq_timer_enqueue_lag", **labels) == 0
        assert value(samples, "rocketmq_timer_enqueue_total", topic="TimedA", **labels) == 3
        assert value(samples, "rocketmq_timer_enqueue_total", topic="TimedB", **labels) == 1
        assert value(samples, "rocketmq_timer_dequeue_total", topic="TimedA", **labels) == 1
        # The one put at once is not pending; the three due in ten minutes are.
        assert value(samples, "rocketmq_timing_messages", topic="TimedA", **labels) == 2
        assert value(samples, "rocketmq_timing_messages", topic="TimedB", **labels) == 1
        assert value(samples, "rocketmq_timer_dequeue_lag", **labels) == 3
        # How far the wheel's reading is behind the clock, in whole seconds, at the scrape
        # (bounds from both clocks around it: no wall-clock limit, a loaded machine passes).
        latency = value(samples, "rocketmq_timer_dequeue_latency", **labels)
        low, high = max(before - read_after, 0) // 1000, max(after - read_before, 0) // 1000
        assert low <= latency <= high
        # Read within the last 2 s: the latency is how old the last message read was (ms).
        stored = timer.last_enqueue_store_ms
        assert before - stored <= value(samples, "rocketmq_timer_enqueue_latency", **labels)
        assert value(samples, "rocketmq_timer_enqueue_latency", **labels) <= after - stored
