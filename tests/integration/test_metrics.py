"""Prometheus /metrics (metricsExporterType=PROM): rocketmq-exporter's names and labels, after
sends and consumes, parsed with prometheus_client's own parser."""

from __future__ import annotations

import time

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from pymq.broker.admin_service import AdminError
from pymq.broker.controller import BrokerController
from pymq.broker.metrics import MAX_HEAD_BYTES
from pymq.client import Message, Producer, PushConsumer, topics
from pymq.common.config import ConfigError
from pymq.common.consumer import ConsumeFromWhere
from pymq.common.message_ext import MessageExt
from pymq.embedded import build_cluster, open_cluster
from pymq.testing import TEST_PROPERTIES
from tests.helpers import start_minute_window, wait_until

TOPIC, GROUP = "MetricsTopic", "metrics-group"


async def http(port: int, request: bytes) -> tuple[int, bytes]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


async def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    status, body = await http(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 200
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    found = [
        v for lab, v in samples.get(name, []) if all(lab.get(k) == w for k, w in labels.items())
    ]
    assert len(found) == 1, (name, labels, samples.get(name))
    return found[0]


async def test_metrics_after_sends_and_consumes(tmp_path) -> None:
    props = dict(TEST_PROPERTIES)
    props.update(
        metricsExporterType="PROM",
        metricsPromExporterHost="127.0.0.1",
        metricsPromExporterPort="0",
    )
    async with open_cluster(
        str(tmp_path), namesrv_port=0, broker_port=0, bind_address="127.0.0.1", properties=props
    ) as cluster:
        metrics = cluster.broker.metrics
        assert metrics is not None and metrics.port
        port = metrics.port
        ns = cluster.namesrv_addr
        await topics.create_topic(ns, TOPIC, queues=2)
        received: list[MessageExt] = []

        async def handler(msgs: list[MessageExt]) -> bool:
            received.extend(msgs)
            return True

        first = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
        stats = cluster.broker.stats
        async with Producer("metrics-producer", ns) as producer:
            async with PushConsumer(GROUP, ns, handler, consume_from=first) as consumer:
                await consumer.subscribe(TOPIC)
                await producer.send(Message(TOPIC, b"m0"))
                await wait_until(lambda: len(received) >= 1, timeout=30, interval=0.05)
                # A minute snapshot once the stats items exist (StatsItem takes one every 10 s).
                start_minute_window(stats, int(time.time() * 1000) - 10_000)
                for i in range(1, 6):
                    await producer.send(Message(TOPIC, f"m{i}".encode()))
                await wait_until(lambda: len(received) >= 6, timeout=30, interval=0.05)
                await consumer.persist_offsets()
                stats.snapshot("minute", int(time.time() * 1000))
                # The rocketmq_client_* gauges: the consumers' own figures, asked for (every
                # 30 s by the server; here at once).
                assert await metrics.collector.refresh_client_status() == 1
                client_samples = await scrape(port)
                cid = consumer.client.client_id  # type: ignore[union-attr]
                mine = {"clientId": cid, "group": GROUP, "topic": TOPIC}
                assert value(client_samples, "rocketmq_client_consume_ok_msg_tps", **mine) > 0
                assert value(client_samples, "rocketmq_client_consumer_pull_tps", **mine) > 0
                assert value(client_samples, "rocketmq_client_consume_fail_msg_count", **mine) == 0
                assert value(client_samples, "rocketmq_client_consume_rt", **mine) >= 0
            samples = await scrape(port)
            where = {"cluster": "DefaultCluster", "broker": "broker-a", "topic": TOPIC}
            assert value(samples, "rocketmq_producer_offset", **where) == 6
            assert value(samples, "rocketmq_producer_tps", **where) > 0
            assert value(samples, "rocketmq_producer_message_size", **where) > 0
            assert value(samples, "rocketmq_consumer_offset", group=GROUP, **where) == 6
            assert value(samples, "rocketmq_message_accumulation", group=GROUP, **where) == 0
            assert value(samples, "rocketmq_consumer_tps", group=GROUP, **where) > 0
            assert (
                value(samples, "rocketmq_group_get_latency_by_storetime", group=GROUP, **where) == 0
            )
            assert value(samples, "rocketmq_broker_tps", cluster="DefaultCluster") > 0
            assert value(samples, "rocketmq_group_diff", group=GROUP, topic=TOPIC) == 0
            retry = f"%RETRY%{GROUP}"
            assert value(samples, "rocketmq_group_retrydiff", group=GROUP, topic=retry) == 0
            runtime = value(samples, "rocketmq_brokeruntime_putmessage_times_total")
            assert runtime == 6
            ((labels, _),) = samples["rocketmq_brokeruntime_put_tps10"]
            assert set(labels) == {
                "cluster",
                "brokerIP",
                "brokerHost",
                "des",
                "boottime",
                "broker_version",
            }
            assert labels["des"] == "V4_9_4" and labels["broker_version"] == "401"
            assert value(samples, "rocketmq_brokeruntime_commitlogdir_capacity_total") > 0

            # Sent while nobody consumes: the accumulation and the store-time lag grow.
            for i in range(4):
                await producer.send(Message(TOPIC, f"late{i}".encode()))
        await trio.sleep(0.05)
        samples = await scrape(port)
        assert value(samples, "rocketmq_producer_offset", **where) == 10
        assert value(samples, "rocketmq_message_accumulation", group=GROUP, **where) == 4
        lag = value(samples, "rocketmq_group_get_latency_by_storetime", group=GROUP, **where)
        assert lag >= 0

        # Where the endpoint listens is fixed at start.
        with pytest.raises(AdminError, match="metricsPromExporterPort"):
            admin = cluster.broker.context.admin
            await admin.update_broker_config({"metricsPromExporterPort": "1"})
        assert (await http(port, b"GET /other HTTP/1.1\r\n\r\n"))[0] == 404
        assert (await http(port, b"POST /metrics HTTP/1.1\r\n\r\n"))[0] == 405
        assert (await http(port, b"nonsense\r\n\r\n"))[0] == 400
        huge = b"GET /metrics HTTP/1.1\r\nX: " + b"a" * (MAX_HEAD_BYTES + 10) + b"\r\n\r\n"
        assert (await http(port, huge))[0] == 431
        head_only = await http(port, b"HEAD /metrics HTTP/1.1\r\n\r\n")
        assert head_only == (200, b"")
    # Stopped with the broker: nothing listens any more.
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    except OSError:
        pass
    else:
        await stream.aclose()
        raise AssertionError("the metrics server still listens after the broker stopped")


def test_unsupported_exporter_type_refused(tmp_path) -> None:
    for wanted, message in (
        ("OTLP_GRPC", "OTLP_GRPC is not supported"),
        ("SOMETIMES", "metricsExporterType must be one of"),
    ):
        props = dict(TEST_PROPERTIES, metricsExporterType=wanted)
        _, configs = build_cluster(str(tmp_path), properties=props)
        with pytest.raises(ConfigError, match=message):
            BrokerController(*configs)  # type: ignore[arg-type]


def _messages(exc: BaseException) -> list[str]:
    if isinstance(exc, BaseExceptionGroup):
        return [m for sub in exc.exceptions for m in _messages(sub)]
    return [str(exc)]


async def test_port_in_use_fails_the_start_with_a_clear_error(tmp_path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        props = dict(
            TEST_PROPERTIES,
            metricsExporterType="PROM",
            metricsPromExporterHost="127.0.0.1",
            metricsPromExporterPort=str(port),
        )
        with pytest.raises(BaseException) as caught:
            async with open_cluster(
                str(tmp_path),
                namesrv_port=0,
                broker_port=0,
                bind_address="127.0.0.1",
                properties=props,
            ):
                pass
    assert any(
        f"Prometheus endpoint cannot listen on 127.0.0.1:{port}" in m
        for m in _messages(caught.value)
    )


async def test_reset_scrapers_and_a_failing_collector_close_one_connection_only() -> None:
    """Peers that reset their connection while every slot is taken (the 503 path), and a
    collector that raises (answered 500), end their connection, never the server."""
    import socket
    import struct

    from pymq.broker.metrics import MAX_CONNECTIONS, MetricsServer

    server = MetricsServer(None, "127.0.0.1", 0)  # type: ignore[arg-type]  # no collect here
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.run)
        holders = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(MAX_CONNECTIONS)]
        await trio.sleep(0.2)  # every slot taken
        for _ in range(20):
            sock = socket.socket()
            sock.connect(("127.0.0.1", port))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()  # a reset before the 503 is written
        await trio.sleep(0.5)
        for holder in holders:
            await holder.aclose()
        await trio.sleep(0.2)

        def broken() -> list:
            raise RuntimeError("a collector bug")

        server.collector.passes = broken  # type: ignore[method-assign]
        status, _ = await http(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 500
        status, _ = await http(port, b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 404  # still serving
        nursery.cancel_scope.cancel()


async def test_a_scrape_reads_the_broker_in_slices_and_survives_changes_between_them(
    tmp_path, monkeypatch
) -> None:
    """#37: one scrape read 3,000 topics in one 58 ms step of the event loop.  Now it gives the
    loop back every SLICE topics (or groups, or stats rows); the tables may change meanwhile."""
    from pymq.broker import metrics as m
    from pymq.common.topic import TopicConfig

    monkeypatch.setattr(m, "SLICE", 3)
    props = dict(TEST_PROPERTIES)
    props.update(
        metricsExporterType="PROM",
        metricsPromExporterHost="127.0.0.1",
        metricsPromExporterPort="0",
    )
    async with open_cluster(
        str(tmp_path), namesrv_port=0, broker_port=0, bind_address="127.0.0.1", properties=props
    ) as cluster:
        broker = cluster.broker
        server = broker.metrics
        assert server is not None
        names = [f"Sliced{i}" for i in range(12)]
        for name in names:
            await broker.topic_config_manager.update(TopicConfig(name, 2, 2))
            broker.consumer_offset_manager.commit_offset("c", "g", name, 0, 0)
        collector = server.collector
        items = list(collector.passes())
        pauses = sum(1 for item in items if isinstance(item, m._Pause))
        # Topics (12 of ours and the system ones) and the 12 offset rows: four pauses or more.
        assert pauses >= 8, pauses
        plain = [item for item in items if not isinstance(item, m._Pause)]
        assert [f.name for f in plain] == [f.name for f in collector.collect()]

        # Tables changed at every pause: topics and offset rows deleted, new ones added.
        walk = collector.passes()
        changed = 0
        for item in walk:
            if isinstance(item, m._Pause) and changed < len(names):
                await broker.topic_config_manager.delete(names[changed])
                broker.consumer_offset_manager.remove_topic(names[changed])
                await broker.topic_config_manager.update(TopicConfig(f"New{changed}", 1, 1))
                changed += 1
        assert changed >= 8

        # render_async yields at each pause: a task that counts its turns runs meanwhile.
        turns = 0
        read_at: list[int] = []

        async def count_turns() -> None:
            nonlocal turns
            while True:
                await trio.lowlevel.checkpoint()
                turns += 1

        class Snapshot(m._Snapshot):
            def __init__(self, metrics: list) -> None:
                read_at.append(turns)  # on the loop, once the state is read
                super().__init__(metrics)

        monkeypatch.setattr(m, "_Snapshot", Snapshot)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(count_turns)
            await trio.lowlevel.checkpoint()
            before = turns
            text = await server.render_async()
            nursery.cancel_scope.cancel()
        pauses_now = sum(1 for item in collector.passes() if isinstance(item, m._Pause))
        assert read_at[0] - before >= pauses_now, (read_at, before, pauses_now)
        assert (
            b'rocketmq_producer_offset{broker="broker-a",cluster="DefaultCluster",topic="New0"}'
            in text
        )
