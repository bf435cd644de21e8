"""Hostile suites of #37 (items 9, 10, 12): floods of new topics, scrapers that never read, and
queue counts no broker can walk.  Each measures the broker's loop with a probe connection
(tests.helpers.StallProbe) while the attack runs."""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from pymq.embedded import Cluster, open_cluster
from pymq.remoting.codec import FrameDecoder, RemotingCommand, encode
from pymq.remoting.codes import ResponseCode
from pymq.remoting.headers import SendMessageRequestHeader
from pymq.testing import TEST_PROPERTIES
from tests.helpers import StallProbe

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

        async with StallProbe(port) as probe:
            await trio.to_thread.run_sync(flood)
            with trio.fail_after(20):
                while len(topics.table) < limit:
                    await trio.sleep(0.05)
            answer = await trio.to_thread.run_sync(exchange, port, send_frame("one-more", 1))
        assert len(topics.table) == limit > before
        assert answer.code == ResponseCode.TOPIC_NOT_EXIST
        assert "autoCreateTopicMaxCount" in (answer.remark or "")
        assert topics.select("one-more") is None
        # A topic that exists is still served.
        ok = await trio.to_thread.run_sync(exchange, port, send_frame("flood-0000", 2))
        assert ok.code == ResponseCode.SUCCESS, ok.remark
        print(f"auto-create flood: probe worst {probe.worst * 1000:.1f} ms over {probe.count}")
        # Not yet 50 ms: each new topic's first message creates its consume-queue file on the
        # loop (mkdir, open, fallocate: 4-40 ms here, more behind other fsyncs).
        assert probe.worst < 0.25, probe.worst


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
        real_render = server.render
        # A broker of many topics: an answer far larger than the socket buffers.
        big = real_render() + b"# padding\n" * 800_000
        monkeypatch.setattr(server, "render", lambda: big)
        async with StallProbe(cluster.broker.port) as probe:
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
        print(f"stalled scrapers: probe worst {probe.worst * 1000:.1f} ms over {probe.count}")
        assert probe.worst < 0.05, probe.worst
