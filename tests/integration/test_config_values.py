"""UPDATE_BROKER_CONFIG / UPDATE_NAMESRV_CONFIG with values a config body cannot carry: refused
with SYSTEM_ERROR and a remark naming the key and the reason, nothing changed, and
GET_*_CONFIG still answered (issue #37, item 11); and a config file with one at start."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pymq.common.properties import parse_properties
from pymq.embedded import Cluster
from pymq.remoting.client import RemotingClient
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode

BODIES = [
    (b"msgTraceTopicName=\\uD800\n", "lone surrogate"),
    (b"maxDelayTime=41\nmsgTraceTopicName=a\\u0000b\n", "U+0000"),
    (b"msgTraceTopicName=a\\nb\n", "U+000A"),
    (b"maxDelayTime=41\nbrokerPermission=1_0\n", "not an integer"),
]


@pytest.mark.parametrize(("body", "why"), BODIES)
async def test_update_broker_config_refuses_and_get_still_answers(
    pymq_cluster: Cluster, client: RemotingClient, body: bytes, why: str
) -> None:
    addr = pymq_cluster.broker_addr
    get = RemotingCommand.request(RequestCode.GET_BROKER_CONFIG)
    before = (await client.invoke(addr, get)).body
    update = RemotingCommand.request(RequestCode.UPDATE_BROKER_CONFIG, body=body)
    answer = await client.invoke(addr, update)
    assert answer.code == ResponseCode.SYSTEM_ERROR
    assert answer.remark is not None and why in answer.remark
    after = await client.invoke(addr, RemotingCommand.request(RequestCode.GET_BROKER_CONFIG))
    assert after.code == ResponseCode.SUCCESS
    assert after.body == before  # maxDelayTime=41 of the same body was not applied either
    assert pymq_cluster.broker.broker_config.max_delay_time != 41


async def test_a_backslash_value_reads_back_through_get_broker_config(
    pymq_cluster: Cluster, client: RemotingClient
) -> None:
    addr = pymq_cluster.broker_addr
    update = RemotingCommand.request(
        RequestCode.UPDATE_BROKER_CONFIG, body=b"msgTraceTopicName=a\\\\b\\tc\n"
    )
    assert (await client.invoke(addr, update)).code == ResponseCode.SUCCESS
    assert pymq_cluster.broker.broker_config.msg_trace_topic_name == "a\\b\tc"
    got = await client.invoke(addr, RemotingCommand.request(RequestCode.GET_BROKER_CONFIG))
    assert parse_properties(got.body.decode())["msgTraceTopicName"] == "a\\b\tc"


async def test_update_namesrv_config_refuses_and_get_still_answers(
    pymq_cluster: Cluster, client: RemotingClient
) -> None:
    addr = pymq_cluster.namesrv_addr
    get = RemotingCommand.request(RequestCode.GET_NAMESRV_CONFIG)
    before = (await client.invoke(addr, get)).body
    for body, why in (
        (b"orderMessageEnable=true\nproductEnvName=\\uDBFF\n", "lone surrogate"),
        (b"productEnvName=x\\ry\n", "U+000D"),
    ):
        update = RemotingCommand.request(RequestCode.UPDATE_NAMESRV_CONFIG, body=body)
        answer = await client.invoke(addr, update)
        assert answer.code == ResponseCode.SYSTEM_ERROR
        assert answer.remark is not None and "productEnvName" in answer.remark
        assert why in answer.remark
        after = await client.invoke(addr, RemotingCommand.request(RequestCode.GET_NAMESRV_CONFIG))
        assert after.code == ResponseCode.SUCCESS and after.body == before


def test_a_config_file_with_a_lone_surrogate_stops_the_broker_in_one_line(tmp_path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text("brokerName=broker-a\nmsgTraceTopicName=\\uD800\n")
    result = subprocess.run(
        [sys.executable, "-m", "pymq.broker", "-c", str(conf), "-p"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert str(conf) in lines[0] and "msgTraceTopicName" in lines[0]
    assert "lone surrogate" in lines[0]
