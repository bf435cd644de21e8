"""``python -m pymq.admin``: every subcommand against a running broker, and its error exits."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import trio

from pymq.client import ConsumeFromWhere, Message, MessageExt, Producer, PushConsumer
from pymq.embedded import Cluster
from tests.helpers import end_minute_window, pymq_admin, start_minute_window, wait_until

admin = pymq_admin


async def admin_process(*args: str) -> tuple[int, str, str]:
    result = await trio.run_process(
        [sys.executable, "-m", "pymq.admin", *args],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    return result.returncode, result.stdout.decode(), result.stderr.decode()


async def ok(*args: str) -> str:
    code, out, err = await admin(*args)
    assert code == 0, (args, err)
    return out


async def ok_json(*args: str) -> object:
    return json.loads(await ok(*args, "--json"))


async def fails(*args: str) -> str:
    code, out, err = await admin(*args)
    assert code == 1, (args, code, out, err)
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


async def wait_route(cluster: Cluster, topic: str) -> None:
    async def routed() -> bool:
        return (await admin("topicRoute", "-n", cluster.namesrv_addr, "-t", topic))[0] == 0

    await wait_until(routed, timeout=10, interval=0.05)


async def wait_dispatched(cluster: Cluster, topic: str, total: int) -> None:
    store = cluster.broker.store
    await wait_until(
        lambda: sum(store.get_max_offset_in_queue(topic, q) for q in range(4)) >= total,
        timeout=10,
        interval=0.02,
    )


async def test_cluster_broker_and_config_subcommands(pymq_cluster):
    ns, addr = pymq_cluster.namesrv_addr, pymq_cluster.broker_addr
    out = await ok("clusterList", "-n", ns)
    assert "DefaultCluster" in out and "broker-a" in out and addr in out
    rows = await ok_json("clusterList", "-n", ns)
    assert rows[0]["brokerRole"] == "ASYNC_MASTER" and rows[0]["online"]
    await fails("clusterList", "-n", ns, "-c", "NoSuchCluster")

    out = await ok("brokerStatus", "-n", ns, "-b", addr)
    assert "putTps" in out and "brokerVersionDesc" in out
    status = await ok_json("brokerStatus", "-n", ns, "-c", "DefaultCluster")
    assert status[addr]["brokerRole"] == "ASYNC_MASTER"

    out = await ok("getBrokerConfig", "-b", addr)
    assert "brokerName" in out and "broker-a" in out
    await ok("updateBrokerConfig", "-b", addr, "-k", "maxDelayTime", "-v", "42")
    assert pymq_cluster.broker.broker_config.max_delay_time == 42
    config = await ok_json("getBrokerConfig", "-n", ns, "-c", "DefaultCluster")
    assert config[addr]["maxDelayTime"] == "42"
    err = await fails("updateBrokerConfig", "-b", addr, "-k", "brokerName", "-v", "x")
    assert "NO_PERMISSION" in err and "restart" in err
    err = await fails("updateBrokerConfig", "-b", addr, "-k", "serverTaskOrder", "-v", "trio")
    assert "NO_PERMISSION" in err and "serverTaskOrder" in err
    err = await fails("updateBrokerConfig", "-b", addr, "-k", "noSuchKey", "-v", "1")
    assert "noSuchKey" in err


async def test_topic_subcommands(pymq_cluster):
    ns, addr = pymq_cluster.namesrv_addr, pymq_cluster.broker_addr
    out = await ok(
        "updateTopic", "-n", ns, "-c", "DefaultCluster", "-t", "CliT", "-r", "4", "-w", "4"
    )
    assert f"create topic to {addr} success." in out
    await wait_route(pymq_cluster, "CliT")
    assert "CliT" in (await ok("topicList", "-n", ns)).split()
    assert "CliT" in await ok_json("topicList", "-n", ns, "-c", "DefaultCluster")
    out = await ok("topicRoute", "-n", ns, "-t", "CliT")
    assert "broker-a" in out and "RW" in out
    route = await ok_json("topicRoute", "-n", ns, "-t", "CliT")
    assert route["queueDatas"][0]["readQueueNums"] == 4

    async with Producer("cli-producer", ns) as producer:
        sent = [
            await producer.send(Message("CliT", f"hello-{i}".encode(), keys=f"order-{i}"))
            for i in range(8)
        ]
    await wait_dispatched(pymq_cluster, "CliT", 8)
    status = await ok_json("topicStatus", "-n", ns, "-t", "CliT")
    assert sum(q["maxOffset"] for q in status) == 8
    out = await ok("topicStatus", "-n", ns, "-t", "CliT")
    assert "#Max Offset" in out and "broker-a" in out

    out = await ok("queryMsgById", "-n", ns, "-i", sent[3].offset_msg_id)
    assert "hello-3" in out and "order-3" in out
    view = await ok_json("queryMsgById", "-n", ns, "-i", sent[3].msg_id, "-t", "CliT")
    assert view["bodyPreview"] == "hello-3"
    found = await ok_json("queryMsgByKey", "-n", ns, "-t", "CliT", "-k", "order-5")
    assert [m["bodyPreview"] for m in found] == ["hello-5"]
    out = await ok("queryMsgByKey", "-n", ns, "-t", "CliT", "-k", "order-5")
    assert sent[5].offset_msg_id in out
    first = sent[0]
    out = await ok(
        "queryMsgByOffset",
        "-n",
        ns,
        "-t",
        "CliT",
        "-b",
        "broker-a",
        "-i",
        str(first.queue.queue_id),
        "-o",
        str(first.queue_offset),
    )
    assert "hello-0" in out

    await fails("queryMsgById", "-n", ns, "-i", "nonsense")
    await fails("queryMsgByKey", "-n", ns, "-t", "CliT", "-k", "no-such-key")
    await fails("queryMsgByOffset", "-n", ns, "-t", "CliT", "-b", "broker-a", "-i", "0", "-o", "99")
    await fails("queryMsgByOffset", "-n", ns, "-t", "CliT", "-b", "broker-z", "-i", "0", "-o", "0")
    await fails("topicStatus", "-n", ns, "-t", "NoSuchTopic")
    await fails("updateTopic", "-b", addr, "-t", "bad topic!")

    out = await ok("deleteTopic", "-n", ns, "-c", "DefaultCluster", "-t", "CliT")
    assert "success" in out
    assert "CliT" not in (await ok("topicList", "-n", ns)).split()
    await fails("topicRoute", "-n", ns, "-t", "CliT")


async def test_consumer_subcommands(pymq_cluster):
    ns, addr = pymq_cluster.namesrv_addr, pymq_cluster.broker_addr
    await ok("updateTopic", "-b", addr, "-t", "CliC", "-r", "2", "-w", "2")
    await wait_route(pymq_cluster, "CliC")
    out = await ok("updateSubGroup", "-b", addr, "-g", "cli-group", "-r", "5")
    assert "success" in out
    assert pymq_cluster.broker.subscription_group_manager.table["cli-group"].retry_max_times == 5
    async with Producer("cli-producer", ns) as producer:
        for i in range(10):
            await producer.send(Message("CliC", f"m{i}".encode()))
    await wait_dispatched(pymq_cluster, "CliC", 10)

    reset = await ok_json("resetOffsetByTime", "-n", ns, "-g", "cli-group", "-t", "CliC", "-s", "0")
    assert sorted(r["offset"] for r in reset) == [0, 0]
    progress = await ok_json("consumerProgress", "-n", ns, "-g", "cli-group")
    assert progress["diffTotal"] == 10
    out = await ok("consumerProgress", "-n", ns, "-g", "cli-group")
    assert "Diff Total: 10" in out
    groups = await ok_json("consumerProgress", "-n", ns)
    assert {"group": "cli-group", "count": 0, "diffTotal": 10} in groups
    await ok("resetOffsetByTime", "-n", ns, "-g", "cli-group", "-t", "CliC", "-s", "now")
    assert (await ok_json("consumerProgress", "-n", ns, "-g", "cli-group"))["diffTotal"] == 0
    await ok(
        "resetOffsetByTime",
        "-n",
        ns,
        "-g",
        "cli-group",
        "-t",
        "CliC",
        "-s",
        "2000-01-01#00:00:00:000",
    )
    assert (await ok_json("consumerProgress", "-n", ns, "-g", "cli-group"))["diffTotal"] == 10
    err = await fails("resetOffsetByTime", "-n", ns, "-g", "cli-group", "-t", "CliC", "-s", "soon")
    assert "bad timestamp" in err
    await fails("consumerProgress", "-n", ns, "-g", "never-seen")
    await fails("consumerConnection", "-n", ns, "-g", "cli-group")

    async def handler(msgs: list[MessageExt]) -> bool:
        return True

    first = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    async with PushConsumer("cli-live", ns, handler, consume_from=first) as consumer:
        await consumer.subscribe("CliC")

        async def connected() -> bool:
            return (await admin("consumerConnection", "-n", ns, "-g", "cli-live"))[0] == 0

        await wait_until(connected, timeout=15, interval=0.1)
        out = await ok("consumerConnection", "-n", ns, "-g", "cli-live")
        assert "CliC" in out and "CLUSTERING" in out
        data = await ok_json("consumerConnection", "-n", ns, "-g", "cli-live")
        assert len(data["connectionSet"]) == 1


async def test_error_exits(pymq_cluster, tmp_path):
    err = await fails("clusterList", "-n", "127.0.0.1:1")
    assert "127.0.0.1:1" in err
    err = await fails("topicList", "-n", "")
    assert "name server" in err
    await fails("brokerStatus", "-b", "not-an-address")
    await fails("updateTopic", "-n", pymq_cluster.namesrv_addr, "-c", "Nope", "-t", "X")
    code, _, err = await admin("updateTopic", "-t", "X")
    assert code == 2 and "-b" in err
    code, _, _ = await admin("noSuchSubcommand")
    assert code == 2
    # The command itself, as a process: main's exit statuses and its one error line.
    code, out, err = await admin_process("brokerStatus", "-b", "not-an-address")
    assert code == 1 and not out and err.startswith("error: ") and err.count("\n") == 1
    code, _, err = await admin_process("updateTopic", "-t", "X")
    assert code == 2 and "-b" in err
    code, out, _ = await admin_process("topicList", "-n", pymq_cluster.namesrv_addr, "--json")
    assert isinstance(json.loads(out), list)


async def test_installed_console_script():
    script = Path(sys.executable).with_name("pymq-admin")
    result = await trio.run_process([str(script), "--help"], capture_stdout=True)
    help_text = result.stdout.decode()
    for name in ("clusterList", "queryMsgByOffset", "resetOffsetByTime", "updateBrokerConfig"):
        assert name in help_text


async def test_operator_subcommands_read_javas_bodies(pymq_cluster, monkeypatch):
    """producerConnection, consumerStatus and statsAll read the bodies Java's tools read."""
    ns = pymq_cluster.namesrv_addr
    await ok("updateTopic", "-b", pymq_cluster.broker_addr, "-t", "CliOps", "-r", "2", "-w", "2")
    await wait_route(pymq_cluster, "CliOps")
    received: list[MessageExt] = []

    async def handler(msgs: list[MessageExt]) -> bool:
        received.extend(msgs)
        return True

    first = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    async with (
        Producer("cli-ops-producer", ns) as producer,
        PushConsumer("cli-ops", ns, handler, consume_from=first) as consumer,
    ):
        await consumer.subscribe("CliOps")
        await producer.send(Message("CliOps", b"one"))
        await wait_until(lambda: received, timeout=30)
        stats = pymq_cluster.broker.stats
        # A window of exactly one minute, whatever the sends take (3 messages: 0.05/s).
        now = int(time.time() * 1000)
        start_minute_window(stats, now - 60_000)
        for i in range(3):
            await producer.send(Message("CliOps", f"m{i}".encode()))
        await wait_until(lambda: len(received) >= 4, timeout=30)
        end_minute_window(stats, now)
        # The broker's own 10 s snapshots from here on would stretch the window too.
        monkeypatch.setattr(stats, "snapshot", lambda window, wall_ms: None)

        producers = await ok_json(
            "producerConnection", "-n", ns, "-g", "cli-ops-producer", "-t", "CliOps"
        )
        assert [p["clientId"] for p in producers] == [producer.client.client_id]
        await fails("producerConnection", "-n", ns, "-g", "nobody", "-t", "CliOps")

        status = await ok_json("consumerStatus", "-n", ns, "-g", "cli-ops")
        assert status[0]["clientId"] == consumer.client.client_id
        assert {q["topic"] for q in status[0]["queues"]} == {"CliOps", "%RETRY%cli-ops"}
        assert status[0]["properties"]["consumerGroup"] == "cli-ops"

        rows = await ok_json("statsAll", "-n", ns, "-t", "CliOps")
        assert [(r["topic"], r["group"]) for r in rows] == [("CliOps", "cli-ops")]
        assert (rows[0]["inMsgLastMinute"], rows[0]["outMsgLastMinute"]) == (3, 3)
        assert rows[0]["inTps"] == pytest.approx(0.05, rel=0.05)
        assert rows[0]["outTps"] == pytest.approx(0.05, rel=0.05)
        assert "CliOps" in await ok("statsAll", "-n", ns)
