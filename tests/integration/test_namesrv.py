"""The name server over real loopback sockets, driven as brokers and clients drive it."""

from __future__ import annotations

import json
import struct

import trio
import trio.testing

from pymq.common.record import body_crc32
from pymq.common.route import RegisterBrokerBody
from pymq.common.topic import DataVersion, TopicConfig, TopicConfigSerializeWrapper
from pymq.remoting.client import RemotingClient
from pymq.remoting.codec import RemotingCommand, encode
from pymq.remoting.codes import RequestCode, ResponseCode
from tests.helpers import make_namesrv, wait_until

MASTER = "127.0.0.1:10911"
SLAVE = "127.0.0.1:10921"


def register_request(
    *,
    broker_id: int = 0,
    addr: str = MASTER,
    name: str = "broker-a",
    cluster: str = "DefaultCluster",
    topics: dict[str, TopicConfig] | None = None,
    version: DataVersion | None = None,
    compressed: bool = False,
    crc: int | None = None,
) -> RemotingCommand:
    table = topics if topics is not None else {"TopicTest": TopicConfig("TopicTest", 4, 4)}
    body = RegisterBrokerBody(
        TopicConfigSerializeWrapper(table, version or DataVersion(timestamp=1, counter=1))
    ).encode(compressed)
    return RemotingCommand.request(
        RequestCode.REGISTER_BROKER,
        {
            "brokerName": name,
            "brokerAddr": addr,
            "clusterName": cluster,
            "haServerAddr": addr.rsplit(":", 1)[0] + ":" + str(int(addr.rsplit(":", 1)[1]) + 1),
            "brokerId": broker_id,
            "compressed": compressed,
            "bodyCrc32": body_crc32(body) if crc is None else crc,
        },
        body,
    )


def route_request(topic: str) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})


async def test_master_and_slave_routes_and_cluster_info(namesrv, client: RemotingClient) -> None:
    ns = f"127.0.0.1:{namesrv.port}"
    first = await client.invoke(ns, register_request())
    assert first.code == ResponseCode.SUCCESS
    assert "masterAddr" not in first.ext_fields
    slave = await client.invoke(ns, register_request(broker_id=1, addr=SLAVE))
    assert slave.code == ResponseCode.SUCCESS
    assert slave.ext_fields == {"masterAddr": MASTER, "haServerAddr": "127.0.0.1:10912"}

    route = await client.invoke(ns, route_request("TopicTest"))
    assert route.code == ResponseCode.SUCCESS
    # Byte for byte what RocketMQ 4.9.4 writes for a 4.9.4 client: sorted keys, nulls omitted.
    assert route.body == (
        b'{"brokerDatas":[{"brokerAddrs":{"0":"127.0.0.1:10911","1":"127.0.0.1:10921"},'
        b'"brokerName":"broker-a","cluster":"DefaultCluster"}],"filterServerTable":{},'
        b'"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,"topicSysFlag":0,'
        b'"writeQueueNums":4}]}'
    )

    # An older client (V4_9_3) gets fastjson's bare integer keys, as from Java's name server;
    # one that asks for standard JSON gets it.
    old = route_request("TopicTest")
    old.version = 399
    assert (await client.invoke(ns, old)).body.startswith(
        b'{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:10911",1:"127.0.0.1:10921"},'
    )
    old = route_request("TopicTest")
    old.version = 399
    old.ext_fields["acceptStandardJsonOnly"] = "true"
    assert (await client.invoke(ns, old)).body == route.body

    # Cluster info: fastjson's form whatever the version, as Java writes it.
    info = await client.invoke(ns, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO))
    assert info.body == (
        b'{"brokerAddrTable":{"broker-a":{"brokerAddrs":{0:"127.0.0.1:10911",1:"127.0.0.1:10921"},'
        b'"brokerName":"broker-a","cluster":"DefaultCluster"}},'
        b'"clusterAddrTable":{"DefaultCluster":["broker-a"]}}'
    )


async def test_unknown_topic_is_topic_not_exist(namesrv, client: RemotingClient) -> None:
    response = await client.invoke(f"127.0.0.1:{namesrv.port}", route_request("Nope"))
    assert response.code == ResponseCode.TOPIC_NOT_EXIST
    assert response.remark == (
        "No topic route info in name server for the topic: Nope\n"
        "See http://rocketmq.apache.org/docs/faq/ for further details."
    )


async def test_crc_mismatch_and_compressed_bodies(namesrv, client: RemotingClient) -> None:
    ns = f"127.0.0.1:{namesrv.port}"
    bad = await client.invoke(ns, register_request(crc=12345))
    assert (bad.code, bad.remark) == (ResponseCode.SYSTEM_ERROR, "crc32 not match")
    assert namesrv.routes.broker_addr_table == {}
    ok = await client.invoke(ns, register_request(compressed=True))
    assert ok.code == ResponseCode.SUCCESS
    route = await client.invoke(ns, route_request("TopicTest"))
    assert json.loads(route.body)["queueDatas"][0]["writeQueueNums"] == 4


async def test_missing_header_field_is_a_clear_error(namesrv, client: RemotingClient) -> None:
    response = await client.invoke(
        f"127.0.0.1:{namesrv.port}", RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC)
    )
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert "topic" in response.remark


async def test_silent_broker_expires(nursery, tmp_path, mock_clock) -> None:
    # Idle-connection closing is off here so that only the 120 s expiry can remove the broker.
    namesrv = make_namesrv(tmp_path, server_channel_max_idle_time_seconds=0)
    await nursery.start(namesrv.run)
    client = RemotingClient(nursery)
    ns = f"127.0.0.1:{namesrv.port}"
    assert (await client.invoke(ns, register_request())).code == ResponseCode.SUCCESS
    broker_channel = await client.channel(ns)

    mock_clock.jump(100)
    await trio.testing.wait_all_tasks_blocked()
    assert (await client.invoke(ns, route_request("TopicTest"))).code == ResponseCode.SUCCESS
    # A QUERY_DATA_VERSION with an unchanged version counts as a heartbeat.
    query = RemotingCommand.request(
        RequestCode.QUERY_DATA_VERSION,
        {"brokerAddr": MASTER, "brokerId": 0, "brokerName": "broker-a", "clusterName": "c"},
        b'{"counter":1,"timestamp":1}',
    )
    answer = await client.invoke(ns, query)
    assert answer.ext_fields["changed"] == "false"
    assert json.loads(answer.body) == {"counter": 1, "timestamp": 1}

    mock_clock.jump(100)  # 200 s after registering, 100 s after the heartbeat
    await trio.testing.wait_all_tasks_blocked()
    assert (await client.invoke(ns, route_request("TopicTest"))).code == ResponseCode.SUCCESS

    mock_clock.jump(30)  # 130 s of silence
    await trio.testing.wait_all_tasks_blocked()
    other = RemotingClient(nursery)
    gone = await other.invoke(ns, route_request("TopicTest"))
    assert gone.code == ResponseCode.TOPIC_NOT_EXIST
    assert namesrv.routes.broker_live_table == {}
    await broker_channel.wait_closed()  # the expired broker's connection is closed too


async def test_closed_broker_connection_removes_it(namesrv, nursery) -> None:
    ns = f"127.0.0.1:{namesrv.port}"
    broker = RemotingClient(nursery)
    assert (await broker.invoke(ns, register_request())).code == ResponseCode.SUCCESS
    reader = RemotingClient(nursery)
    assert (await reader.invoke(ns, route_request("TopicTest"))).code == ResponseCode.SUCCESS
    broker.close()
    await wait_until(lambda: not namesrv.routes.broker_addr_table, timeout=5, interval=0.01)
    assert (await reader.invoke(ns, route_request("TopicTest"))).code == (
        ResponseCode.TOPIC_NOT_EXIST
    )


async def test_unregister_broker(namesrv, client: RemotingClient) -> None:
    ns = f"127.0.0.1:{namesrv.port}"
    await client.invoke(ns, register_request())
    await client.invoke(ns, register_request(broker_id=1, addr=SLAVE))
    unregister = RemotingCommand.request(
        RequestCode.UNREGISTER_BROKER,
        {
            "brokerName": "broker-a",
            "brokerAddr": SLAVE,
            "clusterName": "DefaultCluster",
            "brokerId": 1,
        },
    )
    assert (await client.invoke(ns, unregister)).code == ResponseCode.SUCCESS
    route = json.loads((await client.invoke(ns, route_request("TopicTest"))).body)
    assert route["brokerDatas"][0]["brokerAddrs"] == {"0": MASTER}


async def test_garbage_from_one_client_does_not_disturb_another(
    namesrv, client: RemotingClient
) -> None:
    ns = f"127.0.0.1:{namesrv.port}"
    await client.invoke(ns, register_request())
    good = await client.channel(ns)
    for garbage in (
        struct.pack(">ii", 20, 16) + b"{this is not json",
        struct.pack(">i", 64 * 1024 * 1024),  # claims a 64 MiB frame
        struct.pack(">i", -1),
    ):
        with trio.socket.socket() as sock:
            await sock.connect(("127.0.0.1", namesrv.port))
            await sock.send(garbage)
            with trio.fail_after(5):
                assert await sock.recv(100) == b""  # the server closed this connection only
    assert not good.closed
    response = await client.invoke(ns, route_request("TopicTest"))
    assert response.code == ResponseCode.SUCCESS
    assert namesrv.routes.broker_addr_table  # the broker on the good connection is still there


async def test_kv_config_persists_and_feeds_order_topic_conf(
    nursery, tmp_path, client: RemotingClient
) -> None:
    namesrv = make_namesrv(tmp_path)
    namesrv.namesrv_config.order_message_enable = True
    async with trio.open_nursery() as inner:
        await inner.start(namesrv.run)
        ns = f"127.0.0.1:{namesrv.port}"
        put = RemotingCommand.request(
            RequestCode.PUT_KV_CONFIG,
            {"namespace": "ORDER_TOPIC_CONFIG", "key": "TopicTest", "value": "broker-a:4"},
        )
        assert (await client.invoke(ns, put)).code == ResponseCode.SUCCESS
        inner.cancel_scope.cancel()
    client.close()

    again = make_namesrv(tmp_path)  # a restart reads kvConfig.json back
    again.namesrv_config.order_message_enable = True
    await nursery.start(again.run)
    ns = f"127.0.0.1:{again.port}"
    get = RemotingCommand.request(
        RequestCode.GET_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "TopicTest"}
    )
    assert (await client.invoke(ns, get)).ext_fields == {"value": "broker-a:4"}
    registered = await client.invoke(ns, register_request())
    assert json.loads(registered.body) == {"table": {"TopicTest": "broker-a:4"}}
    route = json.loads((await client.invoke(ns, route_request("TopicTest"))).body)
    assert route["orderTopicConf"] == "broker-a:4"

    listing = RemotingCommand.request(
        RequestCode.GET_KVLIST_BY_NAMESPACE, {"namespace": "ORDER_TOPIC_CONFIG"}
    )
    assert json.loads((await client.invoke(ns, listing)).body) == {
        "table": {"TopicTest": "broker-a:4"}
    }
    delete = RemotingCommand.request(
        RequestCode.DELETE_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "TopicTest"}
    )
    assert (await client.invoke(ns, delete)).code == ResponseCode.SUCCESS
    missing = await client.invoke(ns, get)
    assert missing.code == ResponseCode.QUERY_NOT_FOUND
    assert "TopicTest" in missing.remark
    assert (await client.invoke(ns, listing)).code == ResponseCode.QUERY_NOT_FOUND


async def test_topic_lists_and_write_perm(namesrv, client: RemotingClient) -> None:
    ns = f"127.0.0.1:{namesrv.port}"
    await client.invoke(ns, register_request(topics={"A": TopicConfig("A"), "B": TopicConfig("B")}))
    await client.invoke(
        ns,
        register_request(
            name="broker-b",
            addr="127.0.0.1:20911",
            cluster="Other",
            topics={"C": TopicConfig("C")},
        ),
    )
    all_topics = await client.invoke(
        ns, RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
    )
    assert json.loads(all_topics.body) == {"topicList": ["A", "B", "C"]}
    by_cluster = await client.invoke(
        ns, RemotingCommand.request(RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": "Other"})
    )
    assert json.loads(by_cluster.body) == {"topicList": ["C"]}

    wipe = await client.invoke(
        ns,
        RemotingCommand.request(RequestCode.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"}),
    )
    assert wipe.ext_fields == {"wipeTopicCount": "2"}
    route = json.loads((await client.invoke(ns, route_request("A"))).body)
    assert route["queueDatas"][0]["perm"] == 4

    delete = RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "A"})
    assert (await client.invoke(ns, delete)).code == ResponseCode.SUCCESS
    assert (await client.invoke(ns, route_request("A"))).code == ResponseCode.TOPIC_NOT_EXIST


async def test_query_data_version_reports_changes(namesrv, client: RemotingClient) -> None:
    ns = f"127.0.0.1:{namesrv.port}"
    query = RemotingCommand.request(
        RequestCode.QUERY_DATA_VERSION,
        {"brokerAddr": MASTER, "brokerId": 0, "brokerName": "broker-a", "clusterName": "c"},
        b'{"counter":1,"timestamp":1}',
    )
    unknown = await client.invoke(ns, query)
    assert unknown.ext_fields["changed"] == "true" and unknown.body == b""
    await client.invoke(ns, register_request(version=DataVersion(timestamp=1, counter=2)))
    changed = await client.invoke(ns, query)
    assert changed.ext_fields["changed"] == "true"
    assert json.loads(changed.body) == {"counter": 2, "timestamp": 1}


async def test_namesrv_config_get_and_update(namesrv, client: RemotingClient) -> None:
    ns = f"127.0.0.1:{namesrv.port}"
    got = await client.invoke(ns, RemotingCommand.request(RequestCode.GET_NAMESRV_CONFIG))
    assert b"orderMessageEnable=false\n" in got.body
    update = RemotingCommand.request(
        RequestCode.UPDATE_NAMESRV_CONFIG, body=b"orderMessageEnable=true\n"
    )
    assert (await client.invoke(ns, update)).code == ResponseCode.SUCCESS
    assert namesrv.namesrv_config.order_message_enable is True
    bad = RemotingCommand.request(RequestCode.UPDATE_NAMESRV_CONFIG, body=b"bogusKey=1\n")
    answer = await client.invoke(ns, bad)
    assert answer.code == ResponseCode.SYSTEM_ERROR and "bogusKey" in answer.remark
    frozen = RemotingCommand.request(RequestCode.UPDATE_NAMESRV_CONFIG, body=b"kvConfigPath=/x\n")
    assert (await client.invoke(ns, frozen)).code == ResponseCode.NO_PERMISSION
    # The process's task order is chosen before its loop starts.
    order = RemotingCommand.request(
        RequestCode.UPDATE_NAMESRV_CONFIG, body=b"serverTaskOrder=fifo\n"
    )
    refused = await client.invoke(ns, order)
    assert refused.code == ResponseCode.NO_PERMISSION and "serverTaskOrder" in refused.remark
    assert namesrv.server_config.server_task_order.value == "trio"


async def test_unknown_code_and_unflagged_oneway_are_answered(namesrv) -> None:
    # A raw socket, as a client that never sets the oneway bit (the C++ client) would use it.
    with trio.socket.socket() as sock:
        await sock.connect(("127.0.0.1", namesrv.port))
        request = RemotingCommand(code=9999, opaque=0)
        await sock.send(encode(request))
        data = b""
        with trio.fail_after(5):
            while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
                data += await sock.recv(4096)
        header_len = struct.unpack(">i", data[4:8])[0] & 0xFFFFFF
        header = json.loads(data[8 : 8 + header_len])
        assert header["code"] == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        assert header["opaque"] == 0 and header["flag"] & 1
        assert header["remark"] == "request type 9999 not supported"
