"""``message.trace`` on the admin channel: the console's view of a message's trace."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from trio_websocket import open_websocket_url

from pymq.embedded import ADMIN_ANY_PORT, Cluster, open_cluster
from pymq.remoting.client import RemotingClient
from pymq.remoting.codes import ResponseCode
from pymq.testing import TEST_PROPERTIES
from tests.admin.helpers import AdminClient, ws_url
from tests.integration.test_trace_topic import CONSUMED, PUB, PUBLISHED, SUB, send_captured


@pytest.fixture
async def trace_admin(tmp_path) -> AsyncIterator[tuple[Cluster, AdminClient]]:
    async with open_cluster(
        str(tmp_path),
        namesrv_port=0,
        broker_port=0,
        bind_address="127.0.0.1",
        properties=dict(TEST_PROPERTIES, traceTopicEnable="true"),
        admin_port=ADMIN_ANY_PORT,
    ) as cluster:
        channel = cluster.admin_channel
        assert channel is not None
        async with open_websocket_url(ws_url(cluster)) as ws:
            client = AdminClient(ws)
            await client.call("auth", token=channel.token)
            yield cluster, client


async def test_message_trace(trace_admin, client: RemotingClient) -> None:
    cluster, admin = trace_admin
    reply = await admin.request("message.trace", msgId=PUBLISHED)
    assert reply["error"]["code"] == "QUERY_NOT_FOUND"
    for sample in (PUB, SUB):
        response = await send_captured(client, cluster.broker_addr, sample)
        assert response.code == ResponseCode.SUCCESS
    await cluster.broker.store.reput.do_reput()
    published = await admin.call("message.trace", msgId=PUBLISHED)
    assert [(s["type"], s["group"], s["costTime"], s["status"]) for s in published] == [
        ("Pub", "PG_TRACE", 20, "success")
    ]
    assert published[0]["clientHost"] == "127.0.0.1"
    assert published[0]["storeHost"] == "127.0.0.1:49911" and published[0]["tags"] == "TagT"
    consumed = await admin.call("message.trace", msgId=CONSUMED)
    assert [s["type"] for s in consumed] == ["SubBefore", "SubAfter"]
    reply = await admin.request("message.trace", msgId=PUBLISHED, traceTopic="NoSuchTopic")
    assert reply["error"]["code"] == "TOPIC_NOT_EXIST"
