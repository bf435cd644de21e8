"""pymq.remoting.protocol.fastjson against the bodies the Java 4.9.4 broker wrote
(java-wire-samples/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pymq.broker.subscription_group_manager import SubscriptionGroupConfig
from pymq.common.consumer import (
    ConsumeFromWhere,
    ConsumeType,
    MessageModel,
    MessageQueue,
    SubscriptionData,
)
from pymq.common.route import BrokerData, ClusterInfo, QueueData, TopicRouteData
from pymq.common.topic import DataVersion, TopicConfig
from pymq.remoting.protocol import fastjson
from pymq.remoting.protocol.body import (
    BrokerStatsData,
    BrokerStatsItem,
    Connection,
    ConsumerConnection,
    ConsumeStats,
    ConsumeStatsList,
    GroupList,
    OffsetWrapper,
    ProducerConnection,
    QueryConsumeTimeSpanBody,
    QueueTimeSpan,
    ResetOffsetBody,
    TopicOffset,
    TopicStatsTable,
)
from tests.fastjson_reader import Obj, compatible, read, shape

SAMPLES = Path(__file__).parent.parent / "data" / "java_wire_samples"


def sample(name: str) -> bytes:
    return (SAMPLES / name).read_bytes().rstrip(b"\n")


def mq(key: dict[str, Any]) -> MessageQueue:
    return MessageQueue(key["topic"], key["brokerName"], key["queueId"])


def consume_stats(data: dict[str, Any]) -> ConsumeStats:
    return ConsumeStats(
        {mq(k): OffsetWrapper(**_snake(v)) for k, v in data["offsetTable"].items()},
        data["consumeTps"],
    )


def _snake(d: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in d.items():
        out["".join("_" + c.lower() if c.isupper() else c for c in key)] = value
    return out


def stats_item(d: dict[str, Any]) -> BrokerStatsItem:
    return BrokerStatsItem(d["sum"], d["tps"], d["avgpt"])


def sub(d: dict[str, Any]) -> SubscriptionData:
    return SubscriptionData(**_snake(d))


def time_span(d: dict[str, Any]) -> QueueTimeSpan:
    fields = _snake({k: v for k, v in d.items() if k != "messageQueue"})
    return QueueTimeSpan(mq(d["messageQueue"]), **fields)


def broker_data(d: dict[str, Any]) -> BrokerData:
    return BrokerData(d["cluster"], d["brokerName"], dict(d["brokerAddrs"]))


def route(d: dict[str, Any]) -> TopicRouteData:
    return TopicRouteData(
        queue_datas=[QueueData(**_snake(q)) for q in d["queueDatas"]],
        broker_datas=[broker_data(b) for b in d["brokerDatas"]],
        filter_server_table=d["filterServerTable"],
    )


def topic_configs(d: dict[str, Any]) -> dict[str, Any]:
    return {
        "dataVersion": DataVersion(**d["dataVersion"]),
        "topicConfigTable": {n: TopicConfig(**_snake(c)) for n, c in d["topicConfigTable"].items()},
    }


def group_configs(d: dict[str, Any]) -> dict[str, Any]:
    return {
        "dataVersion": DataVersion(**d["dataVersion"]),
        "subscriptionGroupTable": {
            n: SubscriptionGroupConfig(**_snake(c)) for n, c in d["subscriptionGroupTable"].items()
        },
    }


# Each captured body, rebuilt as pymq's classes from what pymq's reader read.
REBUILD = {
    "GET_ALL_TOPIC_CONFIG-21.body.json": topic_configs,
    "GET_ALL_SUBSCRIPTIONGROUP_CONFIG-201.body.json": group_configs,
    "GET_ALL_CONSUMER_OFFSET-43.body.json": lambda d: d,
    "GET_ALL_DELAY_OFFSET-45.body.json": lambda d: d,
    "NS-GET_BROKER_CLUSTER_INFO-106.body.json": lambda d: ClusterInfo(
        {n: broker_data(b) for n, b in d["brokerAddrTable"].items()},
        dict(d["clusterAddrTable"]),
    ),
    "NS-GET_ROUTEINFO_BY_TOPIC-105-req-version-399.body.json": route,
    "GET_TOPIC_STATS_INFO-202.body.json": lambda d: TopicStatsTable(
        {mq(k): TopicOffset(**_snake(v)) for k, v in d["offsetTable"].items()}
    ),
    "GET_TOPIC_STATS_INFO-202-TopicTx.body.json": lambda d: TopicStatsTable(
        {mq(k): TopicOffset(**_snake(v)) for k, v in d["offsetTable"].items()}
    ),
    "GET_CONSUME_STATS-208-no-topic.body.json": consume_stats,
    "GET_CONSUME_STATS-208-with-topic.body.json": consume_stats,
    "INVOKE_BROKER_TO_RESET_OFFSET-222.body.json": lambda d: ResetOffsetBody(
        {mq(k): v for k, v in d["offsetTable"].items()}
    ),
    "RESET_CONSUMER_CLIENT_OFFSET-220-broker-to-client-oneway.request-body.json": lambda d: (
        ResetOffsetBody({mq(k): v for k, v in d["offsetTable"].items()})
    ),
    "GET_CONSUMER_CONNECTION_LIST-203.body.json": lambda d: ConsumerConnection(
        [Connection(**_snake(c)) for c in d["connectionSet"]],
        {t: sub(s) for t, s in d["subscriptionTable"].items()},
        ConsumeType(d["consumeType"]),
        MessageModel(d["messageModel"]),
        ConsumeFromWhere(d["consumeFromWhere"]),
    ),
    "GET_PRODUCER_CONNECTION_LIST-204.body.json": lambda d: ProducerConnection(
        [Connection(**_snake(c)) for c in d["connectionSet"]]
    ),
    "QUERY_TOPIC_CONSUME_BY_WHO-300.body.json": lambda d: GroupList(d["groupList"]),
    "QUERY_CONSUME_TIME_SPAN-303.body.json": lambda d: QueryConsumeTimeSpanBody(
        [time_span(s) for s in d["consumeTimeSpanSet"]]
    ),
    "VIEW_BROKER_STATS_DATA-315-TOPIC_PUT_NUMS-TopicA.body.json": lambda d: BrokerStatsData(
        stats_item(d["statsMinute"]), stats_item(d["statsHour"]), stats_item(d["statsDay"])
    ),
    "VIEW_BROKER_STATS_DATA-315-BROKER_PUT_NUMS-CapCluster.body.json": lambda d: BrokerStatsData(
        stats_item(d["statsMinute"]), stats_item(d["statsHour"]), stats_item(d["statsDay"])
    ),
    "GET_BROKER_CONSUME_STATS-317.body.json": lambda d: ConsumeStatsList(
        d["brokerAddr"],
        [{g: [consume_stats(s) for s in v] for g, v in m.items()} for m in d["consumeStatsList"]],
        d["totalDiff"],
    ),
}


@pytest.mark.parametrize("name", sorted(REBUILD))
def test_bodies_written_byte_for_byte_as_java(name: str) -> None:
    """Read a captured body, rebuild it as pymq's classes, write it: the same bytes."""
    captured = sample(name)
    rebuilt = REBUILD[name](fastjson.loads(captured))
    assert fastjson.dumps(rebuilt) == captured


def test_object_keys_are_written_as_the_object() -> None:
    body = fastjson.dumps(
        ConsumeStats({MessageQueue("T", "b", 1): OffsetWrapper(3, 2, 7)}, consume_tps=0.0)
    )
    assert body == (
        b'{"consumeTps":0.0,"offsetTable":{{"brokerName":"b","queueId":1,"topic":"T"}:'
        b'{"brokerOffset":3,"consumerOffset":2,"lastTimestamp":7}}}'
    )
    parsed = read(body)  # the independent reader sees an object as the key
    ((key, value),) = parsed.get("offsetTable").entries
    assert isinstance(key, Obj) and key.keys() == ["brokerName", "queueId", "topic"]
    assert value.get("consumerOffset") == 2


def test_int_keys_bare_nulls_left_out_doubles_with_a_point() -> None:
    body = fastjson.dumps({"a": {0: "x", 12: None}, "n": None, "d": 2.0, "e": 1e7, "s": 'ü"'})
    assert body == '{"a":{0:"x"},"d":2.0,"e":1.0E7,"s":"ü\\""}'.encode()
    assert read(body).get("a").entries == [(0, "x")]


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.0, "0.0"),
        (0.3, "0.3"),
        (0.13333333333333333, "0.13333333333333333"),
        (3.3333333333333335, "3.3333333333333335"),
        (100.0, "100.0"),
        (1e7, "1.0E7"),
        (1.5e20, "1.5E20"),
        (1e-4, "1.0E-4"),
        (-2.5e-7, "-2.5E-7"),
        (float("nan"), None),
    ],
)
def test_java_double(value: float, text: str | None) -> None:
    assert fastjson.java_double(value) == text


def test_reader_refuses_bad_input() -> None:
    for bad in (b"{", b'{"a":1}x', b"[1,]", b"{[1]:2}", b"nope"):
        with pytest.raises(ValueError):
            fastjson.loads(bad)
    deep = b"[" * (fastjson.MAX_DEPTH + 2) + b"]" * (fastjson.MAX_DEPTH + 2)
    with pytest.raises(ValueError):
        fastjson.loads(deep)


@pytest.mark.parametrize("name", sorted(REBUILD))
def test_independent_reader_agrees_on_captured_bodies(name: str) -> None:
    """The test reader and pymq's read the captured bodies alike (shape of both)."""
    captured = sample(name)
    theirs = shape(read(captured))
    ours = shape(read(fastjson.dumps(REBUILD[name](fastjson.loads(captured)))))
    assert compatible(ours, theirs)
