"""Issue #12's defects, reproduced against real servers on loopback: no input ends a server,
a refused send changes nothing, and what one peer can make a server hold is bounded."""

from __future__ import annotations

import json
import socket
import struct

import pytest
import trio
import trio.testing

import pymq.remoting.codec as codec
from pymq.client import Message, Producer
from pymq.client.topics import create_topic
from pymq.embedded import open_cluster
from pymq.remoting.client import RemotingClient, open_remoting_client
from pymq.remoting.codec import FrameDecoder, RemotingCommand, encode
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.remoting.limits import ConnectionLimits, SharedBudget
from pymq.remoting.server import RemotingServer
from pymq.testing import TEST_PROPERTIES

HOSTILE_HEADERS = [
    b'{"code":105,"opaque":1,"version":1e999}',
    b'{"code":105,"opaque":1,"flag":-1e999}',
    b'{"code":105,"opaque":1e999}',
    b'{"code":105,"opaque":1,"extFields":{"a":' + b"[" * 1000 + b"]" * 1000 + b"}}",
    b'{"code":105,"opaque":1,"extFields":{"a":' + b"[" * 100_000 + b"}}",
    b"{" * 50_000,
    b'{"code":105,"opaque":1,"version":' + b"9" * 4400 + b"}",
    b'{"code":2147483648,"opaque":1}',
]


def frame(header: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body


async def exchange(port: int, data: bytes, *, timeout: float = 5) -> list[RemotingCommand]:
    """Send ``data`` on a new connection and read what comes back until the server closes it
    or nothing more comes for a moment."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    decoder = FrameDecoder()
    got: list[RemotingCommand] = []
    async with stream:
        await stream.send_all(data)
        with trio.move_on_after(timeout):
            while True:
                with trio.move_on_after(0.3) as idle:
                    chunk = await stream.receive_some(65536)
                if idle.cancelled_caught or not chunk:
                    break
                got += decoder.feed(chunk)
    return got


@pytest.fixture
def cluster(pymq_cluster):
    """The shared in-process name server and broker (pymq.testing)."""
    return pymq_cluster


async def route_answered(port: int) -> bool:
    request = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})
    [response] = await exchange(port, encode(request))
    return response.opaque == request.opaque


@pytest.mark.slow
async def test_hostile_headers_end_one_connection_never_a_server(cluster) -> None:
    ports = [cluster.namesrv.port, cluster.broker.port, cluster.broker.fast_server.port]
    for port in ports:
        for header in HOSTILE_HEADERS:
            answers = await exchange(port, frame(header))
            for answer in answers:  # a sound frame is answered, the rest close the connection
                assert answer.code == ResponseCode.SYSTEM_ERROR
                assert answer.opaque == 1
        assert await route_answered(port)


async def test_a_bad_field_in_a_sound_frame_is_answered_with_its_opaque(cluster) -> None:
    header = b'{"code":105,"opaque":77,"version":1e999,"extFields":{"topic":"TBW102"}}'
    ok = encode(RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"}))
    # The refused request and a good one behind it on the same connection: both answered.
    first, second = await exchange(cluster.namesrv.port, frame(header) + ok)
    assert (first.code, first.opaque) == (ResponseCode.SYSTEM_ERROR, 77)
    assert "version is not a Java int" in first.remark
    assert second.code == ResponseCode.SUCCESS


async def test_an_error_escaping_the_decoder_closes_that_connection_only(
    cluster, monkeypatch
) -> None:
    """Whatever escapes one connection's handling (here a decoder bug, simulated) closes that
    connection and nothing else."""
    real = codec._decode_json_header

    def buggy(data: bytes) -> RemotingCommand:
        if b"boom" in data:
            raise OverflowError("a decoder bug")
        return real(data)

    monkeypatch.setattr(codec, "_decode_json_header", buggy)
    async with open_remoting_client() as client:
        # A connection that stays open through the other's failure.
        addr = cluster.namesrv_addr
        before = await client.invoke(
            addr, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
        )
        bad = frame(b'{"code":105,"opaque":5,"remark":"boom"}')
        assert await exchange(cluster.namesrv.port, bad) == []  # closed, unanswered
        after = await client.invoke(
            addr, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
        )
        assert before.code == after.code == ResponseCode.SUCCESS
    assert await route_answered(cluster.namesrv.port)


SEND_V2 = {
    "a": "pg",
    "b": "Hardened",
    "c": "TBW102",
    "d": "4",
    "e": "0",
    "f": "0",
    "g": "1700000000000",
    "h": "0",
    "i": "",
    "j": "0",
    "k": "false",
    "m": "false",
}


async def send_v2(client: RemotingClient, addr: str, **changes: str | None) -> RemotingCommand:
    ext = {k: v for k, v in {**SEND_V2, **changes}.items() if v is not None}
    request = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, ext, b"body")
    return await client.invoke(addr, request)


async def test_sends_java_refuses_are_refused_and_take_no_offset(cluster) -> None:
    await create_topic(cluster.namesrv_addr, "Hardened", brokers=[cluster.broker_addr], queues=1)
    addr = cluster.broker_addr
    async with open_remoting_client() as client:
        first = await send_v2(client, addr)
        assert first.code == ResponseCode.SUCCESS
        assert first.ext_fields["queueOffset"] == "0"
        refusals = [{k: None} for k in "cdefgh"] + [
            {"e": ""},
            {"e": "1.5"},
            {"g": str(2**63)},
            {"j": str(2**31)},
            {"h": str(2**31)},
            {"f": str(-(2**31) - 1)},
            {"d": "x"},
        ]
        for change in refusals:
            refused = await send_v2(client, addr, **change)
            assert refused.code == ResponseCode.SYSTEM_ERROR, change
            assert refused.remark.startswith("the custom field <"), refused.remark
        last = await send_v2(client, addr)
        assert last.code == ResponseCode.SUCCESS
        assert last.ext_fields["queueOffset"] == "1"  # no refusal took an offset
    store = cluster.broker.store
    await store.reput.do_reput()  # a new queue's first entry waits for its file (a thread)
    assert store.get_max_offset_in_queue("Hardened", 0) == 2


async def pipeline_pulls(port: int, count: int, topic: str) -> socket.socket:
    """A raw socket that pipelines ``count`` pulls and never reads its answers."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    data = b"".join(
        encode(
            RemotingCommand.request(
                RequestCode.PULL_MESSAGE,
                {
                    "consumerGroup": "slow",
                    "topic": topic,
                    "queueId": 0,
                    "queueOffset": 0,
                    "maxMsgNums": 32,
                    "sysFlag": 4,
                    "commitOffset": 0,
                    "suspendTimeoutMillis": 0,
                    "subscription": "*",
                    "subVersion": 0,
                    "expressionType": "TAG",
                },
            )
        )
        for _ in range(count)
    )
    view = memoryview(data)
    while view:
        try:
            sent = sock.send(view)
        except BlockingIOError:
            break  # the broker stopped reading us: what we wanted
        view = view[sent:]
        await trio.sleep(0)
    return sock


async def test_a_consumer_that_never_reads_is_bounded_and_then_closed(tmp_path) -> None:
    high, low = 256 * 1024, 64 * 1024
    props = {
        **TEST_PROPERTIES,
        "writeBufferHighWaterMark": str(high),
        "writeBufferLowWaterMark": str(low),
        "writeStallTimeoutMillis": "1500",
    }
    async with open_cluster(
        str(tmp_path),
        namesrv_port=0,
        broker_port=0,
        bind_address="127.0.0.1",
        properties=props,
    ) as cluster:
        await create_topic(cluster.namesrv_addr, "Bulk", brokers=[cluster.broker_addr], queues=1)
        async with Producer("bulk", cluster.namesrv_addr) as producer:
            for _ in range(10):
                await producer.send_batch([Message("Bulk", b"x" * 1024) for _ in range(64)])
        record_size = cluster.broker.store.commitlog.queue.max_offset // 640
        server = cluster.broker.server
        sock = await pipeline_pulls(cluster.broker.port, 5000, "Bulk")
        try:
            peak = 0
            with trio.move_on_after(1.0):
                while True:
                    peak = max(peak, server.budget.write_total)
                    await trio.sleep(0.01)
            port = sock.getsockname()[1]
            [slow] = [c for c in server.channels if c.remote_address.endswith(f":{port}")]
            assert slow.state.out.size > 0
            # Each pull answers 32 stored records (~38 KiB): without the mark 5,000 of them
            # would queue 190 MB.  The record size is the store's, not an estimate.
            answer_size = 32 * record_size + 512
            assert 0 < peak <= high + 2 * answer_size * 32, peak
            # Another client is served meanwhile.
            async with Producer("other", cluster.namesrv_addr) as other:
                result = await other.send(Message("Bulk", b"still served"))
                assert result.status == "SEND_OK"
            # The stalled connection is closed after writeStallTimeoutMillis.
            with trio.fail_after(10):
                await slow.wait_closed()
            assert slow.close_reason is not None
            assert slow.close_reason.startswith("peer not reading"), slow.close_reason
            assert server.budget.write_total == 0
        finally:
            sock.close()


async def test_half_frames_are_budgeted_and_time_out(tmp_path) -> None:
    budget = 1024 * 1024
    props = {
        **TEST_PROPERTIES,
        "serverPartialFrameTotalMaxBytes": str(budget),
        "frameReceiveTimeoutMillis": "1500",
    }
    async with open_cluster(
        str(tmp_path),
        namesrv_port=0,
        broker_port=0,
        bind_address="127.0.0.1",
        properties=props,
    ) as cluster:
        server = cluster.broker.server
        claimed = 15 * 1024 * 1024
        streams = []
        try:
            for _ in range(8):
                stream = await trio.open_tcp_stream("127.0.0.1", cluster.broker.port)
                streams.append(stream)
                await stream.send_all(struct.pack(">ii", claimed, 40) + b"{" * 40)
            peak = 0

            async def push(stream: trio.SocketStream) -> None:
                with trio.move_on_after(1.0):
                    for _ in range(64):
                        await stream.send_all(b"x" * 65536)  # blocks once the broker stops

            async with trio.open_nursery() as nursery:
                for stream in streams:
                    nursery.start_soon(push, stream)
                with trio.move_on_after(1.2):
                    while True:
                        peak = max(peak, server.budget.partial_frame_total)
                        await trio.sleep(0.01)
            # The budget, plus at most one receive per connection past it.
            assert peak <= budget + 8 * 256 * 1024, peak
            # Every unfinished frame is dropped by its deadline, and the broker answers others.
            assert peak >= budget  # the frames really were held up to the budget
            held = list(server.channels)
            assert len(held) == 8
            with trio.fail_after(10):
                for channel in held:
                    await channel.wait_closed()
            assert all("frame not completed" in (c.close_reason or "") for c in held)
            assert server.budget.partial_frame_total == 0
            assert await route_answered(cluster.namesrv.port)
            async with Producer("p", cluster.namesrv_addr) as producer:
                assert (await producer.send(Message("TBW102x", b"m"))).status == "SEND_OK"
        finally:
            for stream in streams:
                await stream.aclose()


async def test_connections_and_requests_in_progress_are_capped(nursery) -> None:
    release = trio.Event()

    async def held(channel, req: RemotingCommand) -> RemotingCommand:
        await release.wait()
        return req.response()

    server = RemotingServer(
        host="127.0.0.1",
        port=0,
        limits=ConnectionLimits(max_pending_requests=2),
        budget=SharedBudget(),
        max_connections=2,
    )
    server.register(1001, held)
    await nursery.start(server.run)

    # Requests in progress on one connection: two held, the rest answered SYSTEM_BUSY at once.
    requests = [RemotingCommand.request(1001) for _ in range(5)]
    for i, request in enumerate(requests):
        request.opaque = i + 1
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(b"".join(encode(r) for r in requests))
    decoder = FrameDecoder()
    busy: list[RemotingCommand] = []
    with trio.fail_after(5):
        while len(busy) < 3:
            busy += decoder.feed(await stream.receive_some(65536))
    assert {(r.code, r.opaque) for r in busy} == {(ResponseCode.SYSTEM_BUSY, n) for n in (3, 4, 5)}
    assert busy[0].remark.startswith("[OVERLOAD]")

    # A second connection is served; a third is closed at once.
    second = await trio.open_tcp_stream("127.0.0.1", server.port)
    await trio.testing.wait_all_tasks_blocked()
    third = await trio.open_tcp_stream("127.0.0.1", server.port)
    with trio.fail_after(5):
        assert await third.receive_some(10) == b""
    assert server.refused_connections == 1
    release.set()
    with trio.fail_after(5):
        answered: list[RemotingCommand] = []
        while len(answered) < 2:
            answered += decoder.feed(await stream.receive_some(65536))
    assert {r.opaque for r in answered} == {1, 2}
    for s in (stream, second, third):
        await s.aclose()


def test_limits_keys_are_documented_in_json_form() -> None:
    """The limit keys are RocketMQ-style keys a properties file can set (names checked)."""
    from pymq.common.config import config_keys
    from pymq.remoting.config import NettyServerConfig

    keys = set(config_keys(NettyServerConfig()))
    wanted = {
        "writeBufferHighWaterMark",
        "writeBufferLowWaterMark",
        "writeStallTimeoutMillis",
        "serverTotalWriteBufferMaxBytes",
        "frameMaxLength",
        "frameReceiveTimeoutMillis",
        "serverPartialFrameTotalMaxBytes",
        "serverMaxPendingRequestsPerConnection",
        "serverMaxConnections",
    }
    assert wanted <= keys, json.dumps(sorted(wanted - keys))
