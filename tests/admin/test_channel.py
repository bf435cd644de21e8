"""The admin websocket channel over real sockets: auth, requests, subscriptions, errors."""

from __future__ import annotations

import json
import os
import time

import pytest
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, open_websocket_url

import pymq
from pymq.admin.auth import TOKEN_FILE_NAME, load_or_create_token
from pymq.client import ConsumeFromWhere, Message, MessageExt, Producer, PushConsumer
from pymq.embedded import ADMIN_ANY_PORT, Cluster
from tests.admin.helpers import AdminClient, ws_url
from tests.helpers import wait_until


async def http_get(cluster: Cluster, path: str) -> tuple[int, bytes]:
    channel = cluster.admin_channel
    assert channel is not None
    stream = await trio.open_tcp_stream("127.0.0.1", channel.port)
    async with stream:
        await stream.send_all(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{channel.port}\r\n\r\n".encode()
        )
        data = b""
        with trio.fail_after(5):
            while chunk := await stream.receive_some():
                data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[1]


async def produce(cluster: Cluster, topic: str, count: int, key: str = "") -> list[str]:
    ids = []
    async with Producer("admin-test-producer", cluster.namesrv_addr) as producer:
        for i in range(count):
            result = await producer.send(
                Message(topic, f"body-{i}".encode(), tags="T", keys=key or f"key-{i}")
            )
            ids.append(result.offset_msg_id)
    return ids


# -- auth ---------------------------------------------------------------------------------------


async def test_requests_without_the_token_are_refused(admin_cluster):
    async with open_websocket_url(ws_url(admin_cluster)) as ws:
        client = AdminClient(ws)
        reply = await client.request("broker.status")
        assert reply["ok"] is False
        assert reply["error"]["code"] == "UNAUTHORIZED"
        reply = await client.request("auth", token="not-the-token")
        assert reply["error"]["code"] == "UNAUTHORIZED"
        reply = await client.request("subscribe", stream="broker.status")
        assert reply["error"]["code"] == "UNAUTHORIZED"
        assert not client.events


async def test_a_wrong_token_in_the_url_is_rejected_at_the_handshake(admin_cluster):
    with pytest.raises(ConnectionRejected) as info:
        async with open_websocket_url(ws_url(admin_cluster, "wrong")):
            pass
    assert info.value.status_code == 403


async def test_the_token_in_the_url_authenticates(admin_cluster):
    token = admin_cluster.admin_channel.token
    async with open_websocket_url(ws_url(admin_cluster, token)) as ws:
        status = await AdminClient(ws).call("broker.status")
        assert status["brokerName"] == "broker-a"
        # The console's Version row: RocketMQ's version for clients, and pymq's own.
        assert status["brokerVersionDesc"] == "V4_9_4"
        assert status["pymqVersion"] == pymq.__version__


async def test_three_wrong_tokens_close_the_connection(admin_cluster):
    async with open_websocket_url(ws_url(admin_cluster)) as ws:
        client = AdminClient(ws)
        for _ in range(3):
            reply = await client.request("auth", token="guess")
            assert reply["error"]["code"] == "UNAUTHORIZED"
        with pytest.raises(ConnectionClosed) as info, trio.fail_after(5):
            await ws.get_message()
        assert info.value.reason.code == 1008


async def test_token_is_generated_once_into_the_config_dir(admin_cluster, tmp_path):
    channel = admin_cluster.admin_channel
    config_dir = admin_cluster.broker.store_config.config_dir
    path = os.path.join(config_dir, TOKEN_FILE_NAME)
    with open(path) as f:
        assert f.read().strip() == channel.token
    assert len(channel.token) >= 40
    assert os.stat(path).st_mode & 0o077 == 0
    assert load_or_create_token("", config_dir) == channel.token
    assert load_or_create_token("set-in-config", config_dir) == "set-in-config"


# -- static files -------------------------------------------------------------------------------


async def test_console_is_served_at_the_root(admin_cluster):
    status, body = await http_get(admin_cluster, "/")
    assert status == 200 and b"<html" in body.lower()
    status, _ = await http_get(admin_cluster, "/app.js")
    assert status == 200
    status, _ = await http_get(admin_cluster, "/../../pyproject.toml")
    assert status == 404
    status, _ = await http_get(admin_cluster, "/missing.js")
    assert status == 404


# -- requests -----------------------------------------------------------------------------------


async def test_every_request_type(admin_cluster, admin):
    assert "pong" in await admin.call("ping")

    status = await admin.call("broker.status")
    assert status["brokerRole"] == "ASYNC_MASTER"
    assert status["brokerVersionDesc"] and "putTps" in status and "commitLogDiskRatio" in status
    assert "msgPutTotalTodayNow" in await admin.call("broker.runtimeInfo")

    cluster = await admin.call("cluster.status")
    assert cluster["namesrvReachable"] is True
    assert cluster["clusters"] == {"DefaultCluster": ["broker-a"]}
    assert cluster["brokers"][0]["brokerAddr"] == admin_cluster.broker_addr
    assert cluster["brokers"][0]["online"] is True

    created = await admin.call("topic.update", topic="AdminT", readQueueNums=2, writeQueueNums=2)
    assert created["readQueueNums"] == 2
    topics = {t["topic"]: t for t in await admin.call("topic.list")}
    assert topics["AdminT"]["permText"] == "RW" and not topics["AdminT"]["system"]
    assert topics["TBW102"]["system"]
    user_topics = await admin.call("topic.list", includeSystem=False)
    assert [t["topic"] for t in user_topics] == ["AdminT"]
    updated = await admin.call("topic.update", topic="AdminT", perm=4)
    assert updated["perm"] == 4 and updated["readQueueNums"] == 2
    await admin.call("topic.update", topic="AdminT", perm=6)

    before = int(time.time() * 1000)
    ids = await produce(admin_cluster, "AdminT", 6, key="")

    async def dispatched() -> list | None:  # the store dispatches just after the reply
        queues = (await admin.call("topic.status", topic="AdminT"))["queues"]
        return queues if sum(q["maxOffset"] for q in queues) == 6 else None

    queues = await wait_until(dispatched, timeout=5, interval=0.02)
    assert all(q["lastUpdateTimestamp"] >= before for q in queues if q["maxOffset"])

    by_id = await admin.call("message.byId", msgId=ids[0])
    assert by_id["bodyPreview"] == "body-0" and by_id["topic"] == "AdminT"
    by_uniq = await admin.call("message.byId", msgId=by_id["uniqKey"], topic="AdminT")
    assert by_uniq["msgId"] == ids[0]
    found = await admin.call("message.byKey", topic="AdminT", key="key-3")
    assert [m["bodyPreview"] for m in found] == ["body-3"]
    at = await admin.call("message.byOffset", topic="AdminT", queueId=0, offset=0)
    assert at["queueId"] == 0 and at["queueOffset"] == 0

    reset = await admin.call(
        "group.resetOffsetByTime", group="admin-g", topic="AdminT", timestamp=0
    )
    assert [o["offset"] for o in reset["offsets"]] == [0, 0]
    progress = await admin.call("group.progress", group="admin-g")
    assert progress["diffTotal"] == 6
    assert {q["queueId"] for q in progress["queues"]} == {0, 1}
    reset = await admin.call(
        "group.resetOffsetByTime", group="admin-g", topic="AdminT", timestamp=-1
    )
    assert (await admin.call("group.progress", group="admin-g"))["diffTotal"] == 0
    reset = await admin.call(
        "group.resetOffsetByTime",
        group="admin-g",
        topic="AdminT",
        timestamp=int(time.time() * 1000) + 60_000,
    )
    assert (await admin.call("group.progress", group="admin-g"))["diffTotal"] == 0

    group = await admin.call("group.update", group="admin-g", retryMaxTimes=3)
    assert group["groupName"] == "admin-g" and group["retryMaxTimes"] == 3
    groups = {g["group"]: g for g in await admin.call("group.list")}
    assert groups["admin-g"]["online"] is False
    assert groups["admin-g"]["rebalance"] == "OFFLINE"
    reply = await admin.request("group.connections", group="admin-g")
    assert reply["error"]["code"] == "CONSUMER_NOT_ONLINE"

    async def handler(msgs: list[MessageExt]) -> bool:
        return True

    first = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    async with PushConsumer(
        "admin-live", admin_cluster.namesrv_addr, handler, consume_from=first
    ) as consumer:
        await consumer.subscribe("AdminT")

        async def connections() -> dict | None:
            reply = await admin.request("group.connections", group="admin-live")
            return reply if reply["ok"] else None

        reply = await wait_until(connections, timeout=10, interval=0.1)
        assert reply["result"]["connectionSet"][0]["clientId"]
        assert "AdminT" in reply["result"]["subscriptionTable"]
        live = {g["group"]: g for g in await admin.call("group.list")}["admin-live"]
        assert live["online"] and live["members"] and live["rebalance"] == "BALANCED"

    config = await admin.call("config.get")
    assert config["config"]["brokerName"] == "broker-a"
    assert "brokerName" in config["restartOnly"]
    updated = await admin.call(
        "config.update", config={"maxDelayTime": 41, "slaveReadEnable": True}
    )
    assert updated["updated"] == {"maxDelayTime": "41", "slaveReadEnable": "true"}
    assert admin_cluster.broker.broker_config.max_delay_time == 41
    reply = await admin.request("config.update", config={"brokerName": "x"})
    assert reply["error"]["code"] == "NO_PERMISSION"
    reply = await admin.request("config.update", config={"noSuchKey": "1"})
    assert reply["error"]["code"] == "SYSTEM_ERROR" and "noSuchKey" in reply["error"]["message"]
    reply = await admin.request("config.update", config={"maxDelayTime": "x", "flushDiskType": 1})
    assert reply["ok"] is False
    assert admin_cluster.broker.broker_config.max_delay_time == 41

    deleted = await admin.call("topic.delete", topic="AdminT")
    assert deleted == {"deleted": "AdminT", "namesrvFailed": []}
    routes = admin_cluster.namesrv.routes
    assert "AdminT" not in routes.get_all_topic_list().topic_list
    reply = await admin.request("topic.status", topic="AdminT")
    assert reply["error"]["code"] == "TOPIC_NOT_EXIST"


async def test_failed_operations_are_structured_errors(admin):
    reply = await admin.request("topic.update", topic="bad topic!")
    assert reply["error"]["code"] == "SYSTEM_ERROR"
    reply = await admin.request("topic.update", topic="DefaultCluster")
    assert "reserved" in reply["error"]["message"]
    reply = await admin.request("topic.delete", topic="NoSuchTopic")
    assert reply["error"]["code"] == "TOPIC_NOT_EXIST"
    reply = await admin.request("message.byId", msgId="00")
    assert reply["error"]["code"] == "QUERY_NOT_FOUND"
    reply = await admin.request("message.byOffset", topic="TBW102", queueId=99, offset=0)
    assert reply["error"]["code"] == "SYSTEM_ERROR"
    reply = await admin.request("group.progress", group="nobody-knows")
    assert reply["error"]["code"] == "SUBSCRIPTION_GROUP_NOT_EXIST"


async def test_bad_messages_get_structured_errors_and_the_socket_stays_open(admin):
    for text, code in [
        ("not json", "BAD_REQUEST"),
        ("[1, 2]", "BAD_REQUEST"),
        ('{"id": 7}', "BAD_REQUEST"),
        ('{"id": 8, "type": "no.such.thing"}', "UNKNOWN_TYPE"),
        ('{"id": 9, "type": "topic.status", "params": []}', "BAD_REQUEST"),
        ('{"id": 10, "type": "topic.status"}', "BAD_REQUEST"),
        ('{"id": 11, "type": "topic.status", "params": {"topic": 5}}', "BAD_REQUEST"),
        ('{"id": 12, "type": "message.byOffset", "params": {"topic": "T", "queueId": "x"}}', None),
        ('{"id": {"a": 1}, "type": "ping"}', "BAD_REQUEST"),
        ('{"id": 13, "type": "subscribe", "params": {"stream": "nope"}}', "BAD_REQUEST"),
        ('{"id": 14, "type": "unsubscribe", "params": {"subscription": 99}}', "BAD_REQUEST"),
        ('{"id": 15, "type": "config.update", "params": {"config": {"a": [1]}}}', "BAD_REQUEST"),
    ]:
        reply = await admin.raw(text)
        assert reply["type"] == "response" and reply["ok"] is False, text
        assert reply["error"]["code"] == (code or "BAD_REQUEST"), (text, reply)
        assert reply["error"]["message"]
    reply = json.loads(json.dumps(await admin.request("ping")))
    assert reply["ok"] is True


@pytest.mark.slow
async def test_a_slow_request_does_not_hold_up_the_others(admin_cluster, admin):
    # A "name server" that accepts connections and never answers: cluster.status waits on it.
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    silent = f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
    api = admin_cluster.broker.outer_api
    api.namesrv_addrs = [silent, *api.namesrv_addrs]
    try:
        await admin.ws.send_message(json.dumps({"id": "slow", "type": "cluster.status"}))
        await admin.ws.send_message(json.dumps({"id": "fast", "type": "ping"}))
        first = await admin.next_response()
        assert first["id"] == "fast" and first["ok"]
        second = await admin.next_response()
        assert second["id"] == "slow" and second["ok"]
        assert second["result"]["namesrvReachable"] is True  # the next name server answered
    finally:
        api.namesrv_addrs.remove(silent)
        await listeners[0].aclose()


# -- subscriptions ------------------------------------------------------------------------------


async def test_subscription_sees_tps_change_within_two_seconds(admin_cluster, admin):
    await admin.call("topic.update", topic="TpsT", readQueueNums=1, writeQueueNums=1)
    sub = await admin.call("subscribe", stream="broker.status", interval=0.2)
    assert sub["subscription"] is not None
    first = await admin.next_event(sub["subscription"])
    assert first["putTps"] == 0
    async with Producer("tps-producer", admin_cluster.namesrv_addr) as producer:
        await producer.send(Message("TpsT", b"warm-up"))
        start = trio.current_time()
        async with trio.open_nursery() as nursery:

            async def traffic() -> None:
                while True:
                    await producer.send(Message("TpsT", b"x"))
                    await trio.sleep(0.01)

            nursery.start_soon(traffic)
            while True:
                event = await admin.next_event(sub["subscription"], timeout=3)
                if event["putTps"] > 0:
                    break
            nursery.cancel_scope.cancel()
    assert trio.current_time() - start < 2.0


async def test_subscriptions_push_changes_and_stop_on_unsubscribe(admin):
    sub = await admin.call("subscribe", stream="topic.list", interval=0.2, params={})
    sid = sub["subscription"]
    names = {t["topic"] for t in await admin.next_event(sid)}
    assert "PushT" not in names
    await admin.call("topic.update", topic="PushT")
    names = {t["topic"] for t in await admin.next_event(sid)}
    assert "PushT" in names
    progress = await admin.call(
        "subscribe", stream="group.progress", interval=0.2, params={"group": "missing"}
    )
    data = await admin.next_event(progress["subscription"])
    assert data["error"]["code"] == "SUBSCRIPTION_GROUP_NOT_EXIST"
    reply = await admin.request("subscribe", stream="topic.list")  # id reused? no: fresh id
    assert reply["ok"]
    assert (await admin.call("unsubscribe", subscription=sid)) == {"unsubscribed": sid}
    await admin.call("topic.update", topic="PushT2")
    await trio.sleep(0.6)
    await admin.call("ping")
    assert not [e for e in admin.events if e["subscription"] == sid and "PushT2" in str(e)]


# -- HTTP edges and shutdown --------------------------------------------------------------------


async def raw_http(cluster: Cluster, data: bytes) -> bytes:
    channel = cluster.admin_channel
    stream = await trio.open_tcp_stream("127.0.0.1", channel.port)
    async with stream:
        await stream.send_all(data)
        reply = b""
        with trio.fail_after(5):
            while chunk := await stream.receive_some():
                reply += chunk
    return reply


async def test_http_edges(admin_cluster):
    host = f"127.0.0.1:{admin_cluster.admin_channel.port}".encode()
    assert b" 405 " in await raw_http(
        admin_cluster, b"POST / HTTP/1.1\r\nHost: " + host + b"\r\n\r\n"
    )
    assert b" 400 " in await raw_http(admin_cluster, b"garbage\r\n\r\n")
    upgrade = (
        b"GET /elsewhere HTTP/1.1\r\nHost: "
        + host
        + b"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    assert b" 404 " in await raw_http(admin_cluster, upgrade)
    reply = await raw_http(admin_cluster, b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n")
    assert b" 431 " in reply or reply == b""
    head = await raw_http(admin_cluster, b"HEAD /app.css HTTP/1.1\r\nHost: " + host + b"\r\n\r\n")
    assert b"text/css" in head and head.endswith(b"\r\n\r\n")


@pytest.mark.slow
async def test_broker_shutdown_closes_websockets_cleanly(tmp_path):
    from pymq.embedded import open_cluster
    from pymq.testing import TEST_PROPERTIES

    stop = trio.Event()

    async def run_cluster(task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with open_cluster(
            str(tmp_path),
            namesrv_port=0,
            broker_port=0,
            bind_address="127.0.0.1",
            properties=dict(TEST_PROPERTIES),
            admin_port=ADMIN_ANY_PORT,
        ) as cluster:
            task_status.started(cluster)
            await stop.wait()

    async with trio.open_nursery() as nursery:
        cluster = await nursery.start(run_cluster)
        token = cluster.admin_channel.token
        async with open_websocket_url(ws_url(cluster, token)) as ws:
            client = AdminClient(ws)
            sub = await client.call("subscribe", stream="broker.status", interval=0.2)
            await client.next_event(sub["subscription"])
            stop.set()  # the broker stops while the subscription is live
            with pytest.raises(ConnectionClosed) as info, trio.fail_after(10):
                while True:
                    await ws.get_message()
            assert info.value.reason.code == 1000
