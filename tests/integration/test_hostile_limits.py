"""Hostile suites of #37 (items 9, 10, 12): floods of new topics, scrapers that never read, and
queue counts no broker can walk.  Each measures what the broker's loop works in one task step
(tests.helpers.LoopSteps, CPU time of the loop's thread) while the attack runs."""

from __future__ import annotations

import json
import socket
import time
import types
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from pymq.common.route import RegisterBrokerBody
from pymq.common.topic import MAX_QUEUE_NUMS
from pymq.embedded import Cluster, open_cluster
from pymq.remoting.client import RemotingClient
from pymq.remoting.codec import FrameDecoder, RemotingCommand, encode
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.remoting.headers import SendMessageRequestHeader
from pymq.testing import TEST_PROPERTIES
from tests.helpers import LoopSteps

# The longest task step the attacks may cause: the loop's own CPU time in one step.
STEP_MAX = 0.05

ONEWAY = 2  # RemotingCommand flag bit 1


def send_frame(topic: str, opaque: int, flag: int = 0, queue_nums: int = 4) -> bytes:
    ext = SendMessageRequestHeader.v2_ext(
        "G", topic, 0, 0, 1_800_000_000_000, 0, "", False, default_topic_queue_nums=queue_nums
    )
    return encode(RemotingCommand(310, ext, b"x" * 64, opaque, flag))


def exchange(port: int, frame: bytes) -> RemotingCommand:
    """One request, its answer (blocking: run it in a thread)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(frame)
        decoder = FrameDecoder()
        while True:
            data = sock.recv(65536)
            assert data, "the broker closed the connection"
            answers = decoder.feed(data)
            if answers:
                return answers[0]


@asynccontextmanager
async def open_broker(tmp_path, **props: str) -> AsyncIterator[Cluster]:
    async with open_cluster(
        str(tmp_path),
        namesrv_port=0,
        broker_port=0,
        bind_address="127.0.0.1",
        properties={**TEST_PROPERTIES, **props},
    ) as cluster:
        yield cluster


@pytest.mark.slow
async def test_oneway_sends_to_new_topics_stop_at_the_auto_create_limit(tmp_path) -> None:
    limit = 150
    async with open_broker(tmp_path, autoCreateTopicMaxCount=str(limit)) as cluster:
        topics = cluster.broker.topic_config_manager
        port = cluster.broker.port
        before = len(topics.table)

        def flood() -> None:
            with socket.create_connection(("127.0.0.1", port)) as sock:
                for i in range(0, 400, 20):  # paced, as the sender was
                    frames = (send_frame(f"flood-{j:04d}", j, ONEWAY) for j in range(i, i + 20))
                    sock.sendall(b"".join(frames))
                    time.sleep(0.01)

        with LoopSteps() as steps:
            await trio.to_thread.run_sync(flood)
            with trio.fail_after(20):
                while len(topics.table) < limit:
                    await trio.sleep(0.05)
            answer = await trio.to_thread.run_sync(exchange, port, send_frame("one-more", 1))
        assert len(topics.table) == limit > before
        assert answer.code == ResponseCode.TOPIC_NOT_EXIST
        assert "autoCreateTopicMaxCount" in (answer.remark or "")
        assert topics.select("one-more") is None
        # A send to a retry topic, which auto-creates one even without autoCreateTopicEnable.
        retry = await trio.to_thread.run_sync(exchange, port, send_frame("%RETRY%flood", 3))
        assert retry.code == ResponseCode.TOPIC_NOT_EXIST, retry.remark
        assert len(topics.table) == limit
        # A topic that exists is still served.
        ok = await trio.to_thread.run_sync(exchange, port, send_frame("flood-0000", 2))
        assert ok.code == ResponseCode.SUCCESS, ok.remark
        print(f"auto-create flood: {steps}")
        assert steps.worst < STEP_MAX, steps


def stuck_scraper(port: int, request: bytes) -> socket.socket:
    """A scraper that sends ``request`` and never reads (a tiny receive window)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(request)
    return sock


async def scrape_status(port: int) -> int:
    """The status of one scrape; 503 also when the connection was reset (the server answers
    503 and closes without reading the request, which may reset it before it is read)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    data = b""
    try:
        async with stream:
            await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            while chunk := await stream.receive_some(1 << 20):
                data += chunk
    except trio.BrokenResourceError:
        return 503
    return int(data.split(b" ", 2)[1])


@pytest.mark.slow
@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", id="never-reads-the-answer"),
        pytest.param(b"GET /metrics HTTP/1.1\r\nHo", id="half-a-request"),
    ],
)
async def test_scrapers_that_stall_free_their_slot(tmp_path, monkeypatch, request_bytes) -> None:
    """#37 item 10: MAX_CONNECTIONS scrapers that never read their (large) answer, or that send
    half a request and stop, are closed after WRITE_TIMEOUT / HEAD_TIMEOUT; then /metrics is
    served again.  Before, a scraper that never read held its slot for good."""
    from pymq.broker import metrics

    monkeypatch.setattr(metrics, "WRITE_TIMEOUT", 1.0, raising=False)
    monkeypatch.setattr(metrics, "HEAD_TIMEOUT", 1.0)
    props = {
        "metricsExporterType": "PROM",
        "metricsPromExporterHost": "127.0.0.1",
        "metricsPromExporterPort": "0",
    }
    async with open_broker(tmp_path, **props) as cluster:
        server = cluster.broker.metrics
        assert server is not None
        # A broker of many topics: an answer far larger than the socket buffers.
        big = await server.render_async() + b"# padding\n" * 800_000

        async def render_big() -> bytes:
            return big

        monkeypatch.setattr(server, "render_async", render_big)
        with LoopSteps() as steps:
            stuck = [
                await trio.to_thread.run_sync(stuck_scraper, server.port, request_bytes)
                for _ in range(metrics.MAX_CONNECTIONS)
            ]
            try:
                await trio.sleep(0.3)
                assert await scrape_status(server.port) == 503  # every slot taken
                with trio.fail_after(5):
                    while (status := await scrape_status(server.port)) == 503:
                        await trio.sleep(0.1)
                assert status == 200
            finally:
                for sock in stuck:
                    sock.close()
        print(f"stalled scrapers: {steps}")
        assert steps.worst < STEP_MAX, steps


HUGE = 2**31 - 1


def create_topic_request(topic: str, reads: int, writes: int) -> RemotingCommand:
    fields = {
        "topic": topic,
        "defaultTopic": "TBW102",
        "readQueueNums": str(reads),
        "writeQueueNums": str(writes),
        "perm": "6",
        "topicFilterType": "SINGLE_TAG",
        "topicSysFlag": "0",
        "order": "false",
    }
    return RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, fields)


@pytest.mark.slow
async def test_queue_counts_past_the_maximum_are_refused_everywhere(tmp_path) -> None:
    """#37 item 12: a topic or group of 2^31-1 queues, by any way a count enters, is refused
    with a remark and changes nothing; the stats walks that follow stay bounded."""
    async with open_broker(tmp_path) as cluster:
        broker = cluster.broker
        port = broker.port
        async with trio.open_nursery() as nursery:
            rc = RemotingClient(nursery)
            addr = cluster.broker_addr
            with LoopSteps() as steps:
                for reads, writes in ((HUGE, 4), (4, HUGE), (MAX_QUEUE_NUMS + 1, 4), (-1, 4)):
                    answer = await rc.invoke(addr, create_topic_request("Huge", reads, writes))
                    assert answer.code == ResponseCode.SYSTEM_ERROR, (reads, writes)
                    assert str(MAX_QUEUE_NUMS) in (answer.remark or ""), answer.remark
                assert broker.topic_config_manager.select("Huge") is None
                # The largest count allowed is served, and walked, without a stall.
                ok = await rc.invoke(addr, create_topic_request("Wide", MAX_QUEUE_NUMS, 4))
                assert ok.code == ResponseCode.SUCCESS, ok.remark
                # The largest topic's walks, again and again, as a monitoring tool would.
                for _ in range(20):
                    stats = await rc.invoke(
                        addr,
                        RemotingCommand.request(
                            RequestCode.GET_TOPIC_STATS_INFO, {"topic": "Wide"}
                        ),
                    )
                    assert stats.code == ResponseCode.SUCCESS, stats.remark
                    consume = await rc.invoke(
                        addr,
                        RemotingCommand.request(
                            RequestCode.GET_CONSUME_STATS, {"consumerGroup": "G", "topic": "Wide"}
                        ),
                    )
                    assert consume.code in (
                        ResponseCode.SUCCESS,
                        ResponseCode.CONSUMER_NOT_ONLINE,
                    ), consume.remark

                # A subscription group's retryQueueNums.
                group = {"groupName": "HugeRetry", "retryQueueNums": HUGE}
                answer = await rc.invoke(
                    addr,
                    RemotingCommand.request(
                        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                        body=json.dumps(group).encode(),
                    ),
                )
                assert answer.code == ResponseCode.SYSTEM_ERROR
                assert "retryQueueNums" in (answer.remark or ""), answer.remark
                assert "HugeRetry" not in broker.subscription_group_manager.table

                # The send header's defaultTopicQueueNums: the topic gets TBW102's at most.
                sent = await trio.to_thread.run_sync(
                    exchange, port, send_frame("AutoHuge", 5, queue_nums=HUGE)
                )
                assert sent.code == ResponseCode.SUCCESS, sent.remark
                auto = broker.topic_config_manager.select("AutoHuge")
                assert auto is not None
                assert auto.write_queue_nums == broker.broker_config.default_topic_queue_nums

                # A broker registering a topic of 2^31-1 queues at the name server.
                wrapper = broker.topic_config_manager.serialize_wrapper()
                body = json.loads(RegisterBrokerBody(wrapper, []).encode())
                table = body["topicConfigSerializeWrapper"]["topicConfigTable"]
                table["Rogue"] = {**table["Wide"], "topicName": "Rogue", "readQueueNums": HUGE}
                body["topicConfigSerializeWrapper"]["dataVersion"]["counter"] += 1000
                header = {
                    "brokerName": "rogue",
                    "brokerAddr": "127.0.0.1:1",
                    "clusterName": "DefaultCluster",
                    "haServerAddr": "127.0.0.1:2",
                    "brokerId": "0",
                    "compressed": "false",
                    "bodyCrc32": "0",
                }
                answer = await rc.invoke(
                    cluster.namesrv_addr,
                    RemotingCommand.request(
                        RequestCode.REGISTER_BROKER, header, json.dumps(body).encode()
                    ),
                )
                assert answer.code == ResponseCode.SYSTEM_ERROR
                assert "readQueueNums" in (answer.remark or ""), answer.remark
                routes = cluster.namesrv.routes
                assert "Rogue" not in routes.topic_queue_table
                assert "rogue" not in routes.broker_addr_table
            nursery.cancel_scope.cancel()
        print(f"queue counts: {steps}")
        assert steps.worst < STEP_MAX, steps


def test_the_admin_channel_refuses_queue_counts_past_the_maximum() -> None:
    """The admin channel and CLI build topics with AdminService.build_topic_config."""
    from pymq.broker.admin_service import AdminError, AdminService

    service = AdminService.__new__(AdminService)
    service.broker = types.SimpleNamespace(  # type: ignore[attr-defined]
        broker_config=types.SimpleNamespace(broker_cluster_name="DefaultCluster"),
        # No topic yet (its attributes, RocketMQ 5's message type, start from none).
        topic_config_manager=types.SimpleNamespace(select=lambda topic: None),
    )
    with pytest.raises(AdminError, match="writeQueueNums"):
        service.build_topic_config("T", read_queue_nums=4, write_queue_nums=HUGE)
    assert service.build_topic_config("T", read_queue_nums=4, write_queue_nums=4)


@pytest.mark.parametrize(
    ("file_name", "content", "field"),
    [
        (
            "topics.json",
            {"topicConfigTable": {"Big": {"topicName": "Big", "readQueueNums": HUGE}}},
            "readQueueNums",
        ),
        (
            "subscriptionGroup.json",
            {"subscriptionGroupTable": {"G": {"groupName": "G", "retryQueueNums": HUGE}}},
            "retryQueueNums",
        ),
    ],
)
async def test_a_broker_does_not_start_on_queue_counts_past_the_maximum(
    tmp_path, file_name: str, content: dict, field: str
) -> None:
    config_dir = tmp_path / "store" / "config"
    config_dir.mkdir(parents=True)
    (config_dir / file_name).write_text(json.dumps(content))
    with pytest.raises(BaseException) as caught:
        async with open_broker(tmp_path):
            pass
    text = repr(caught.value) + "".join(repr(e) for e in getattr(caught.value, "exceptions", []))
    assert field in text and str(MAX_QUEUE_NUMS) in text, text


async def test_a_default_topic_queue_nums_past_the_maximum_stops_the_start(tmp_path) -> None:
    with pytest.raises(BaseException) as caught:
        async with open_broker(tmp_path, defaultTopicQueueNums=str(HUGE)):
            pass
    assert "readQueueNums" in repr(caught.value), repr(caught.value)
