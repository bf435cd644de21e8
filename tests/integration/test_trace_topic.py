"""Message trace: with traceTopicEnable the trace topic exists and is routed; the Java client's
trace messages (captured bytes, sent as the Java client sent them) are stored, indexed by the
traced message ids and consumable; ``pymq-admin queryMsgTraceById`` shows a message's trace."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from pymq.client import PullConsumer
from pymq.common.consumer import MessageQueue
from pymq.embedded import Cluster, open_cluster
from pymq.remoting.client import RemotingClient
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.testing import TEST_PROPERTIES
from tests.helpers import pymq_admin

SAMPLES = "/work/shared/reference/java-wire-samples"
PUB = f"{SAMPLES}/TRACE-SEND_MESSAGE_V2-310-RMQ_SYS_TRACE_TOPIC-Pub"
SUB = f"{SAMPLES}/TRACE-SEND_MESSAGE_V2-310-RMQ_SYS_TRACE_TOPIC-SubBefore-SubAfter"
PUBLISHED = "FD0000000000000000000000000000022B755FFD2B27744084B80000"
CONSUMED = "FD0000000000000000000000000000020BAB5FFD2B27743A2E150003"


@pytest.fixture
async def trace_cluster(tmp_path) -> AsyncIterator[Cluster]:
    async with open_cluster(
        str(tmp_path),
        namesrv_port=0,
        broker_port=0,
        bind_address="127.0.0.1",
        properties=dict(TEST_PROPERTIES, traceTopicEnable="true"),
    ) as cluster:
        yield cluster


async def send_captured(client: RemotingClient, addr: str, sample: str) -> RemotingCommand:
    with open(f"{sample}.request-header.json") as f:
        head = json.load(f)
    with open(f"{sample}.request-body.txt", "rb") as f:
        body = f.read()
    request = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, head["extFields"], body)
    return await client.invoke(addr, request, 5.0)


admin = pymq_admin


async def route(client: RemotingClient, cluster: Cluster, topic: str) -> RemotingCommand:
    request = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    return await client.invoke(cluster.namesrv_addr, request, 5.0)


async def test_trace_topic_traces_and_query(trace_cluster: Cluster, client: RemotingClient) -> None:
    cluster = trace_cluster
    answer = await route(client, cluster, "RMQ_SYS_TRACE_TOPIC")
    assert answer.code == ResponseCode.SUCCESS
    queues = json.loads(answer.body)["queueDatas"]
    assert [(q["readQueueNums"], q["writeQueueNums"], q["perm"]) for q in queues] == [(1, 1, 6)]

    for sample in (PUB, SUB):
        response = await send_captured(client, cluster.broker_addr, sample)
        assert response.code == ResponseCode.SUCCESS, response.remark
        assert response.ext_fields["TRACE_ON"] == "true"
        assert response.ext_fields["MSG_REGION"] == "DefaultRegion"
    await cluster.broker.store.reput.do_reput()

    # Stored and consumable like any message.
    async with PullConsumer("TRACE_READER", cluster.namesrv_addr) as puller:
        result = await puller.pull(MessageQueue("RMQ_SYS_TRACE_TOPIC", "broker-a", 0), "*", 0)
    with open(f"{PUB}.request-body.txt", "rb") as f:
        assert result.messages[0].body == f.read()
    assert len(result.messages) == 2 and PUBLISHED in result.messages[0].keys

    ns = cluster.namesrv_addr
    code, out, err = await admin("queryMsgTraceById", "-n", ns, "-i", PUBLISHED)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["#Type", "#ProducerGroup"]
    assert lines[1].split()[:3] == ["Pub", "PG_TRACE", "127.0.0.1"]
    assert lines[1].split()[-2:] == ["20ms", "success"]
    assert "TagT" in lines[2] and "127.0.0.1:49911" in lines[2]

    code, out, err = await admin("queryMsgTraceById", "-n", ns, "-i", CONSUMED, "--json")
    assert code == 0, err
    steps = json.loads(out)
    assert [(s["type"], s["group"], s["costTime"], s["status"]) for s in steps] == [
        ("SubBefore", "CG_TRACE", 0, "success"),
        ("SubAfter", "CG_TRACE", 2, "success"),
    ]
    assert steps[0]["clientHost"] == "127.0.0.1" and steps[0]["timestamp"] == 1795441594776

    code, out, err = await admin("queryMsgTraceById", "-n", ns, "-i", "NO_SUCH_ID")
    assert code == 1 and "no trace of message NO_SUCH_ID in topic RMQ_SYS_TRACE_TOPIC" in err


async def test_no_trace_topic_without_trace_topic_enable(
    pymq_cluster: Cluster, client: RemotingClient
) -> None:
    answer = await route(client, pymq_cluster, "RMQ_SYS_TRACE_TOPIC")
    assert answer.code == ResponseCode.TOPIC_NOT_EXIST
