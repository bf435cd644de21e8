"""Properties files, config classes keyed by RocketMQ's names, and fastjson-style JSON."""

from __future__ import annotations

import json

import attrs
import pytest

from pymq.common.config import ConfigError, apply_properties, to_properties
from pymq.common.properties import parse_properties
from pymq.common.route import BrokerData, RegisterBrokerBody, TopicRouteData
from pymq.common.serde import converter, from_json, loads_lenient, to_json
from pymq.common.topic import DataVersion, TopicConfig, TopicConfigSerializeWrapper
from pymq.namesrv.config import NamesrvConfig
from pymq.remoting.config import NettyServerConfig
from pymq.store.config import BrokerRole, FlushDiskType, MessageStoreConfig


def test_properties_file_forms() -> None:
    text = (
        "# comment\n"
        "! another comment\n"
        "brokerClusterName = DefaultCluster\n"
        "brokerName:broker-a\n"
        "namesrvAddr 127.0.0.1:9876;127.0.0.2:9876\n"
        "long = one \\\n"
        "       two\n"
        "escaped=a\\tb\\u0041\n"
        "empty=\n"
    )
    props = parse_properties(text)
    assert props == {
        "brokerClusterName": "DefaultCluster",
        "brokerName": "broker-a",
        "namesrvAddr": "127.0.0.1:9876;127.0.0.2:9876",
        "long": "one two",
        "escaped": "a\tbA",
        "empty": "",
    }


def test_apply_properties_types_and_unknown_keys() -> None:
    namesrv, server = NamesrvConfig(), NettyServerConfig()
    unknown = apply_properties(
        [namesrv, server],
        {
            "listenPort": "9999",
            "orderMessageEnable": "TRUE",
            "serverPooledByteBufAllocatorEnable": "false",
            "kvConfigPath": "/tmp/kv.json",
            "noSuchKey": "1",
        },
    )
    assert unknown == ["noSuchKey"]
    assert server.listen_port == 9999
    assert namesrv.order_message_enable is True
    assert server.server_pooled_byte_buf_allocator_enable is False
    assert namesrv.kv_config_path == "/tmp/kv.json"
    with pytest.raises(ConfigError, match="listenPort"):
        apply_properties([server], {"listenPort": "ninety"})


def test_enum_keys_take_names_values_and_ordinals_in_range_only() -> None:
    store = MessageStoreConfig()
    for given, want in [
        ("SYNC_FLUSH", FlushDiskType.SYNC_FLUSH),
        ("0", FlushDiskType.ASYNC_FLUSH),  # an ordinal, as the C++ client sends enums
        ("1", FlushDiskType.SYNC_FLUSH),
    ]:
        apply_properties([store], {"flushDiskType": given})
        assert store.flush_disk_type is want
    for bad in ["-1", "2", "-0x1", "sync", "\u00b2", "\u0661"]:
        with pytest.raises(ConfigError) as refused:
            apply_properties([store], {"flushDiskType": bad})
        assert str(refused.value) == (
            f"bad value for flushDiskType: {bad!r} (one of ASYNC_FLUSH, SYNC_FLUSH)"
        )
    assert store.flush_disk_type is FlushDiskType.SYNC_FLUSH  # refused: nothing changed
    with pytest.raises(ValueError, match="not a valid BrokerRole"):
        converter.structure(-1, BrokerRole)


def test_to_properties_uses_java_names_and_values() -> None:
    props = to_properties([NettyServerConfig(listen_port=9876)])
    assert props["listenPort"] == "9876"
    assert props["serverPooledByteBufAllocatorEnable"] == "true"
    assert props["serverChannelMaxIdleTimeSeconds"] == "120"


def test_lenient_json_accepts_fastjson_numeric_keys() -> None:
    data = b'{"brokerAddrs":{0:"127.0.0.1:10911",1:"a:1"},"s":"{0:x}","n":[1, 2]}\n'
    assert loads_lenient(data) == {
        "brokerAddrs": {"0": "127.0.0.1:10911", "1": "a:1"},
        "s": "{0:x}",
        "n": [1, 2],
    }
    with pytest.raises(ValueError):
        loads_lenient(b"{not json")


def test_lenient_json_walks_only_for_a_numeric_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The numeric-key pass (a walk in Python) runs only when json's first error is such a key:
    a body that is not JSON is refused after one json.loads however long it is; nesting too
    deep for json is a ValueError too; keys after non-ASCII text are still found."""
    import pymq.common.serde as serde

    walks: list[int] = []
    real = serde._quote_numeric_keys

    def counted(data: bytes) -> bytes:
        walks.append(len(data))
        return real(data)

    monkeypatch.setattr(serde, "_quote_numeric_keys", counted)
    for bad in (
        b'{"a":[' + b'"x",' * 100_000 + b"!",
        b'{"a":1,}',
        b'{"a":1} {0:1}',
        b'"0:1"x',
        b"[" * 100_000,
        b"\xff",
    ):
        with pytest.raises(ValueError):
            loads_lenient(bad)
    assert walks == []
    assert loads_lenient('{"é":{ 7 :"ü"}, -1:[]}'.encode()) == {"é": {"7": "ü"}, "-1": []}
    assert len(walks) == 1


async def test_request_json_bodies_are_bounded_and_big_ones_read_off_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import trio

    from pymq.common.consumer import HeartbeatData
    from pymq.common.serde import JSON_BODY_INLINE_MAX, JSON_BODY_MAX, from_json_body

    threads: list[object] = []
    real = trio.to_thread.run_sync

    async def counted(*args: object, **kwargs: object) -> object:
        threads.append(args[0])
        return await real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(trio.to_thread, "run_sync", counted)
    small = to_json(HeartbeatData("c"))
    assert (await from_json_body(small, HeartbeatData)).client_id == "c"
    assert threads == []
    padded = small[:-1] + b',"x":"' + b"y" * JSON_BODY_INLINE_MAX + b'"}'
    assert (await from_json_body(padded, HeartbeatData)).client_id == "c"
    assert len(threads) == 1
    with pytest.raises(ValueError, match=f"over the {JSON_BODY_MAX}-byte limit"):
        await from_json_body(b" " * (JSON_BODY_MAX + 1), HeartbeatData)
    assert len(threads) == 1  # refused unread
    with pytest.raises(ValueError, match="groupName"):
        await from_json_body(b'{"consumerDataSet":[' + b"{}," * 50_000 + b"{}]}", HeartbeatData)


def test_route_json_is_written_as_java_writes_it() -> None:
    route = TopicRouteData(
        broker_datas=[BrokerData("DefaultCluster", "broker-a", {0: "127.0.0.1:10911"})]
    )
    # fastjson: keys sorted, null fields left out.
    assert to_json(route) == (
        b'{"brokerDatas":[{"brokerAddrs":{"0":"127.0.0.1:10911"},"brokerName":"broker-a",'
        b'"cluster":"DefaultCluster"}],"filterServerTable":{},"queueDatas":[]}'
    )
    back = from_json(
        b'{"brokerDatas":[{"brokerAddrs":{0:"h:1"},"brokerName":"b","cluster":"c"}]}',
        TopicRouteData,
    )
    assert back.broker_datas[0].broker_addrs == {0: "h:1"}


def test_register_body_round_trips_plain_and_compressed() -> None:
    body = RegisterBrokerBody(
        TopicConfigSerializeWrapper(
            {"TopicTest": TopicConfig("TopicTest", 4, 4), "TBW102": TopicConfig("TBW102", perm=7)},
            DataVersion(timestamp=1700000000000, counter=3),
        ),
        ["10.0.0.1:30000"],
    )
    for compressed in (False, True):
        assert RegisterBrokerBody.decode(body.encode(compressed), compressed) == body
    plain = json.loads(body.encode())
    assert plain["topicConfigSerializeWrapper"]["topicConfigTable"]["TopicTest"] == {
        "order": False,
        "perm": 6,
        "readQueueNums": 4,
        "topicFilterType": "SINGLE_TAG",
        "topicName": "TopicTest",
        "topicSysFlag": 0,
        "writeQueueNums": 4,
    }
    with pytest.raises(ValueError):
        RegisterBrokerBody.decode(b"\x78\x9cgarbage", True)


def test_data_version_equality_and_next() -> None:
    a = DataVersion(timestamp=1, counter=1)
    assert a == attrs.evolve(a)
    b = attrs.evolve(a)
    b.next_version()
    assert b != a and b.counter == 2
