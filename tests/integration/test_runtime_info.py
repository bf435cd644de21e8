"""GET_BROKER_RUNTIME_INFO and GET_BROKER_CONFIG against the Java 4.9.4 broker's captured ones:
every key Java reports, in Java's value forms."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pymq.broker.metrics import BrokerCollector
from pymq.broker.runtime_info import runtime_info
from pymq.client import Message, Producer, topics
from pymq.embedded import Cluster
from pymq.remoting.client import RemotingClient
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode
from tests.store.test_disk_ratio import fake_statvfs

SAMPLES = Path(__file__).parent.parent / "data" / "java_wire_samples"

FORMS = {
    "runtime": r"\[ \d+ days, \d+ hours, \d+ minutes, \d+ seconds \]",
    "commitLogDirCapacity": r"Total : \d+(\.\d)? [KMGTPE]?i?B, Free : \d+(\.\d)? [KMGTPE]?i?B\.",
    "putLatency99": r"\d+\.\d\d",
    "putLatency999": r"\d+\.\d\d",
    "putMessageDistributeTime": r"(\[[^\]]+\]:\d+ ){13}",
    "putMessageAverageSize": r"\d+\.\d+(E\d+)?",
    "commitLogDiskRatio": r"-?\d+\.\d+(E-?\d+)?",
    "remainHowManyDataToFlush": r"\d+(\.\d)? [KMGTPE]?i?B",
    "getTotalTps": r"\S+ \S+ \S+",
    "brokerVersionDesc": r"V4_9_4",
    "brokerVersion": r"401",
    "remainTransientStoreBufferNumbs": r"2147483647",
}


def java_keys(table: dict[str, str]) -> set[str]:
    return {
        k if not k.startswith("commitLogDiskRatio_") else "commitLogDiskRatio_<dir>" for k in table
    }


async def test_runtime_info_has_every_java_key(
    pymq_cluster: Cluster, client: RemotingClient
) -> None:
    await topics.create_topic(pymq_cluster.namesrv_addr, "RtTopic", queues=1)
    async with Producer("rt-producer", pymq_cluster.namesrv_addr) as producer:
        for i in range(3):
            await producer.send(Message("RtTopic", f"m{i}".encode()))
    reply = await client.invoke(
        pymq_cluster.broker_addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO)
    )
    table = json.loads(reply.body)["table"]
    captured = json.loads((SAMPLES / "GET_BROKER_RUNTIME_INFO-28.body.json").read_bytes())["table"]
    assert java_keys(captured) <= java_keys(table)
    assert all(isinstance(v, str) for v in table.values())
    for key, form in FORMS.items():
        assert re.fullmatch(form, table[key]), (key, table[key])
    assert int(table["putMessageTimesTotal"]) == 3
    assert int(table["msgPutTotalTodayNow"]) == 3
    distribution = [int(n) for n in re.findall(r":(\d+)", table["putMessageDistributeTime"])]
    assert sum(distribution) == 3
    assert float(table["putMessageAverageSize"]) > 0
    assert int(table["earliestMessageTimeStamp"]) > 0
    commitlog = pymq_cluster.broker.store.config.store_path_commitlog
    assert f"commitLogDiskRatio_{commitlog}" in table


async def test_broker_config_has_every_java_key(
    pymq_cluster: Cluster, client: RemotingClient
) -> None:
    reply = await client.invoke(
        pymq_cluster.broker_addr, RemotingCommand.request(RequestCode.GET_BROKER_CONFIG)
    )
    lines = reply.body.decode().splitlines()
    ours = dict(line.split("=", 1) for line in lines)
    captured = dict(
        line.split("=", 1)
        for line in (SAMPLES / "GET_BROKER_CONFIG-26.body.txt").read_text().splitlines()
        if line
    )
    assert set(captured) <= set(ours)
    assert "haMasterAddress" not in ours  # null, left out as Java does
    assert ours["storePathCommitLog"].endswith("commitlog")
    assert reply.body.endswith(b"\n")
    assert json.loads(reply.ext_fields["version"]).keys() == {"counter", "timestamp"}


async def test_disk_figures_are_javas_on_a_disk_with_reserved_blocks(
    pymq_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every disk figure (the runtime-info keys, the metrics, the console's status) reads the
    one measure: used / (used + available), where free and available differ (issue #37)."""
    broker = pymq_cluster.broker
    store = broker.store
    # 4 KiB blocks: 1000 in all, 600 free, 550 available: 400 / 950 = 42.1 %, up to 43 %.
    fake_statvfs(monkeypatch, store.config.store_path_root_dir, 1000, 600, 550)
    table = runtime_info(broker)
    commitlog = store.config.store_path_commitlog
    assert table["commitLogDiskRatio"] == "0.43"
    assert table[f"commitLogDiskRatio_{commitlog}"] == "0.43"
    assert table["consumeQueueDiskRatio"] == "0.43"
    # Java's "Free" is File.getUsableSpace: 550 blocks, not 600.
    assert table["commitLogDirCapacity"] == "Total : 3.9 MiB, Free : 2.1 MiB."
    gauges = {family.name: family.samples[0].value for family in BrokerCollector(broker)._runtime()}
    assert gauges["rocketmq_brokeruntime_commitlog_disk_ratio"] == 0.43
    assert gauges["rocketmq_brokeruntime_consumequeue_disk_ratio"] == 0.43
    assert gauges["rocketmq_brokeruntime_commitlogdir_capacity_total"] == 1000 * 4096
    assert gauges["rocketmq_brokeruntime_commitlogdir_capacity_free"] == 550 * 4096
    await store.clean_files_once()  # the clean service's measure, which the console shows
    assert broker.context.admin.broker_status()["commitLogDiskRatio"] == 0.43
