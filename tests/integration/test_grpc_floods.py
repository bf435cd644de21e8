"""HTTP/2 floods on a real socket (127.0.0.1), from a client that writes frames by hand (hpack
for its header blocks): rapid reset, empty frames, a SETTINGS flood driving the HPACK table.
Each costs the flooding connection its GOAWAY (ENHANCE_YOUR_CALM) or nothing at all, the calls
it began are counted back, and another connection is served meanwhile."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import hpack
import pytest
import trio
from rocketmq.grpc_protocol import definition_pb2, service_pb2

from pymq.common.topic import TopicConfig
from pymq.embedded import Cluster, open_cluster
from pymq.proxy.h2server import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADER_TABLE_SIZE,
    HEADERS,
    PING,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    ErrorCode,
    H2Server,
    frame,
)
from pymq.proxy.http2 import Call, GrpcLimits, GrpcServer
from pymq.proxy.service import MAX_ACK_ENTRIES, SEND_YIELD_EVERY
from pymq.testing import TEST_PROPERTIES
from tests.helpers import free_port

SERVICE = "/test.Floods/"


def message(body: bytes) -> bytes:
    return b"\x00" + len(body).to_bytes(4, "big") + body


class Wire:
    """A client on a socket: frames written as given, frames read and parsed."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self._in = bytearray()
        self.eof = False

    @classmethod
    async def open(cls, port: int) -> Wire:
        wire = cls(await trio.open_tcp_stream("127.0.0.1", port))
        await wire.send(PREFACE + frame(SETTINGS, 0, 0) + frame(SETTINGS, ACK, 0))
        return wire

    def headers(self, path: str, service: str = SERVICE) -> bytes:
        return bytes(
            self.encoder.encode(
                [
                    (":method", "POST"),
                    (":scheme", "http"),
                    (":path", service + path),
                    (":authority", "127.0.0.1"),
                    ("content-type", "application/grpc"),
                    ("te", "trailers"),
                ]
            )
        )

    def fields(self, block: bytes) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.decoder.decode(block, raw=True)}

    async def send(self, data: bytes) -> None:
        # The server may have closed: what it wrote is still read.
        with contextlib.suppress(trio.BrokenResourceError):
            await self.stream.send_all(data)

    async def frame(self) -> tuple[int, int, int, bytes] | None:
        """The next frame from the server (type, flags, stream, payload); None at the end."""
        while True:
            if len(self._in) >= 9:
                length = int.from_bytes(self._in[:3], "big")
                if len(self._in) >= 9 + length:
                    ftype, flags = self._in[3], self._in[4]
                    sid = int.from_bytes(self._in[5:9], "big") & 0x7FFFFFFF
                    payload = bytes(self._in[9 : 9 + length])
                    del self._in[: 9 + length]
                    return ftype, flags, sid, payload
            try:
                data = await self.stream.receive_some(65536)
            except trio.BrokenResourceError:
                data = b""
            if not data:
                self.eof = True
                return None
            self._in += data

    async def ping(self) -> None:
        """A PING, and its ACK read (so the server has taken in every frame before it)."""
        await self.send(frame(PING, 0, 0, b"pingpong"))
        with trio.fail_after(10):
            while (got := await self.frame()) is not None:
                if got[0] == PING and got[1] & ACK and got[3] == b"pingpong":
                    return
        raise AssertionError("the connection closed before the PING's ACK")

    async def goaway(self) -> int:
        """The error code of the GOAWAY the server sends, once it has closed the socket."""
        codes = []
        with trio.fail_after(10):
            while (got := await self.frame()) is not None:
                if got[0] == GOAWAY:
                    codes.append(struct.unpack(">L", got[3][4:8])[0])
        assert len(codes) == 1
        return codes[0]

    async def answer(self) -> tuple[dict[str, str], bytes]:
        """The frames read up to a grpc-status: the headers and trailers, merged, and the
        DATA bytes (gRPC's length prefix included)."""
        fields: dict[str, str] = {}
        answer = b""
        with trio.fail_after(10):
            while "grpc-status" not in fields:
                got = await self.frame()
                assert got is not None, "the connection closed before the answer"
                if got[0] == HEADERS:
                    fields.update(self.fields(got[3]))
                elif got[0] == DATA:
                    answer += got[3]
        return fields, answer

    async def call(self, sid: int, path: str, body: bytes) -> dict[str, str]:
        """A unary call; its response headers and trailers, merged."""
        return (await self.exchange(sid, path, body))[0]

    async def exchange(
        self, sid: int, path: str, body: bytes, *, service: str = SERVICE
    ) -> tuple[dict[str, str], bytes]:
        """A unary call (its message in DATA frames of 16 KiB, the flow-control windows the
        server grants taken as granted); its response's headers and trailers, merged, and its
        message."""
        data = message(body)
        request = frame(HEADERS, END_HEADERS, sid, self.headers(path, service))
        for at in range(0, len(data), 16384):
            last = at + 16384 >= len(data)
            request += frame(DATA, END_STREAM if last else 0, sid, data[at : at + 16384])
        fields: dict[str, str] = {}
        answer = b""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.send, request)
            with trio.fail_after(20):
                while True:
                    got = await self.frame()
                    assert got is not None, "the connection closed before the call ended"
                    ftype, flags, stream, payload = got
                    if ftype == DATA and stream == sid:
                        answer += payload
                        if payload:  # read: the window handed back
                            grant = struct.pack(">L", len(payload))
                            await self.send(
                                frame(WINDOW_UPDATE, 0, 0, grant)
                                + frame(WINDOW_UPDATE, 0, sid, grant)
                            )
                    if ftype == HEADERS and stream == sid:
                        fields.update(self.fields(payload))
                        if flags & END_STREAM:
                            break
        return fields, answer[5:]


@asynccontextmanager
async def serving() -> AsyncIterator[tuple[GrpcServer, dict[str, int], trio.Event]]:
    """A gRPC server of three methods: Wait (reads its request, then waits until cancelled),
    Echo, and One (a unary call that answers once the event yielded is set); ``counts``
    tells how many Wait and One calls began."""
    counts = {"waits": 0, "ones": 0}
    release = trio.Event()

    async def wait(call: Call) -> None:
        await call.receive()
        counts["waits"] += 1
        await trio.sleep_forever()

    async def one(call: Call) -> None:  # a unary method that takes its time (a long poll)
        request = await call.receive(last=True)
        counts["ones"] += 1
        await release.wait()
        await call.send(request or b"", last=True)

    async def echo(call: Call) -> None:
        await call.send(await call.receive() or b"", last=True)

    grpc = GrpcServer(
        {SERVICE + "Wait": wait, SERVICE + "Echo": echo, SERVICE + "One": one},
        host="127.0.0.1",
        port=0,
        limits=GrpcLimits(max_concurrent_streams=10),
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(grpc.run)
        yield grpc, counts, release
        nursery.cancel_scope.cancel()


async def still_served(grpc: GrpcServer) -> None:
    other = await Wire.open(grpc.port)
    fields = await other.call(1, "Echo", b"hi")
    assert fields["grpc-status"] == "0"
    await other.stream.aclose()


async def test_rapid_reset_loses_its_connection_and_its_calls_are_counted_back() -> None:
    """CVE-2023-44487: calls opened and reset in a loop, never past the concurrency limit,
    each one's reset in the read after its request (so many of them are begun, and wait)."""
    async with serving() as (grpc, counts, _):
        wire = await Wire.open(grpc.port)
        sid = 1
        previous = b""
        for _ in range(H2Server.RESET_BURST // 5 + 10):
            batch = b""
            for _ in range(5):
                batch += frame(HEADERS, END_HEADERS, sid, wire.headers("Wait"))
                batch += frame(DATA, END_STREAM, sid, message(b"x"))
                sid += 2
            await wire.send(previous + batch)
            previous = b"".join(
                frame(RST_STREAM, 0, s, struct.pack(">L", ErrorCode.CANCEL))
                for s in range(sid - 10, sid, 2)
            )
            await trio.sleep(0.001)
        await wire.send(previous)
        assert await wire.goaway() == ErrorCode.ENHANCE_YOUR_CALM
        assert counts["waits"] > 0  # calls began: the flood made the server work
        with trio.fail_after(10):
            while grpc.connections or grpc.open_calls:
                await trio.sleep(0.01)
        await still_served(grpc)


@pytest.mark.parametrize("kind", ["CONTINUATION", "DATA"])
async def test_a_flood_of_empty_frames_loses_its_connection(kind: str) -> None:
    """CVE-2024-27316's class (a header block that never ends, here with empty CONTINUATION
    frames: it never grows to its size limit) and CVE-2019-9518 (empty DATA frames)."""
    async with serving() as (grpc, _, _):
        wire = await Wire.open(grpc.port)
        block = wire.headers("Wait")
        if kind == "CONTINUATION":
            await wire.send(frame(HEADERS, 0, 1, block[:3]))
            flood = frame(CONTINUATION, 0, 1)
        else:
            await wire.send(frame(HEADERS, END_HEADERS, 1, block))
            flood = frame(DATA, 0, 1)
        for _ in range(H2Server.EMPTY_FRAMES // 100 + 1):
            await wire.send(flood * 100)
        assert await wire.goaway() == ErrorCode.ENHANCE_YOUR_CALM
        with trio.fail_after(10):
            while grpc.connections or grpc.open_calls:
                await trio.sleep(0.01)
        await still_served(grpc)


async def test_a_settings_flood_on_the_table_size_costs_nothing() -> None:
    """SETTINGS_HEADER_TABLE_SIZE changed thousands of times (and 4 GiB allowed): the next
    response's header block is small and decodes, the connection goes on."""
    async with serving() as (grpc, _, _):
        wire = await Wire.open(grpc.port)
        wire.decoder.max_allowed_table_size = 2**32 - 1
        sizes = b"".join(struct.pack(">HL", HEADER_TABLE_SIZE, v) for v in (0, 2**32 - 1) * 1365)
        for _ in range(20):
            await wire.send(frame(SETTINGS, 0, 0, sizes))
        await wire.send(frame(HEADERS, END_HEADERS, 1, wire.headers("Nothing")))
        largest = 0
        with trio.fail_after(10):
            while True:
                got = await wire.frame()
                assert got is not None
                ftype, flags, _, payload = got
                if ftype == HEADERS:
                    largest = max(largest, len(payload))
                    fields = wire.fields(payload)
                    if flags & END_STREAM:
                        break
        assert fields["grpc-status"] == "12"  # UNIMPLEMENTED: no such method
        assert largest < 200
        fields = await wire.call(3, "Echo", b"hi")
        assert fields["grpc-status"] == "0"
        await wire.stream.aclose()


# -- a request answered at once, reset in the same read ----------------------------------


@pytest.mark.parametrize("kind", ["unknown method", "not gRPC"])
async def test_a_request_reset_in_the_same_read_as_its_answer_costs_nothing(kind: str) -> None:
    """A request the server answers at once, without a handler (an unknown method, or not
    gRPC at all), and its RST_STREAM in the same read: the answer was written to the stream the
    reset had closed, StreamClosedError ended the connection (logged as a failure, with its
    traceback: one per connection a client cares to open).  Now nothing is written to it."""
    async with serving() as (grpc, _, _):
        wire = await Wire.open(grpc.port)
        if kind == "unknown method":
            block = wire.headers("NoSuchMethod")
        else:
            block = bytes(
                wire.encoder.encode(
                    [
                        (":method", "POST"),
                        (":scheme", "http"),
                        (":path", "/"),
                        (":authority", "127.0.0.1"),
                        ("content-type", "text/plain"),
                    ]
                )
            )
        reset = struct.pack(">L", ErrorCode.CANCEL)
        await wire.send(frame(HEADERS, END_HEADERS, 1, block) + frame(RST_STREAM, 0, 1, reset))
        fields = await wire.call(3, "Echo", b"hi")  # the same connection
        assert fields["grpc-status"] == "0"
        await wire.stream.aclose()


# -- a unary call's request messages past its one ----------------------------------------


def split(sid: int, data: bytes, end: bool = False) -> bytes:
    """``data`` in DATA frames of 16 KiB (the last one ending the stream if ``end``)."""
    out = b""
    for at in range(0, len(data), 16384):
        last = end and at + 16384 >= len(data)
        out += frame(DATA, END_STREAM if last else 0, sid, data[at : at + 16384])
    return out


async def test_messages_past_a_unary_calls_one_are_not_held() -> None:
    """A unary call's handler reads one message; what the client sends after it was queued
    (up to max_queued_messages of max_message_size each: 64 MiB a call, counted in the budget
    every connection shares) until the call ended, 20 s for a long poll.  Now it is dropped
    as it arrives, and the call is answered as served."""
    async with serving() as (grpc, counts, release):
        wire = await Wire.open(grpc.port)
        await wire.send(
            frame(HEADERS, END_HEADERS, 1, wire.headers("One")) + frame(DATA, 0, 1, message(b"a"))
        )
        with trio.fail_after(10):
            while not counts["ones"]:
                await trio.sleep(0.01)
        for _ in range(3):
            await wire.send(split(1, message(b"x" * 1_000_000)))
        await wire.ping()  # every DATA frame before it taken in
        assert grpc.budget.partial_frame_total == 0
        release.set()
        await wire.send(frame(DATA, END_STREAM, 1))
        fields, answer = await wire.answer()
        assert fields["grpc-status"] == "0" and answer == message(b"a")
        await still_served(grpc)


async def test_two_messages_to_a_unary_call_fail_it() -> None:
    """As grpc-java's unary calls: a second request message already there when the handler
    reads the first fails the call INTERNAL (and releases both)."""
    async with serving() as (grpc, counts, _):
        wire = await Wire.open(grpc.port)
        await wire.send(
            frame(HEADERS, END_HEADERS, 1, wire.headers("One"))
            + frame(DATA, END_STREAM, 1, message(b"a") + message(b"b"))
        )
        fields, _ = await wire.answer()
        assert fields["grpc-status"] == "13"  # INTERNAL
        assert "too many request messages" in fields["grpc-message"]
        assert counts["ones"] == 0 and grpc.budget.partial_frame_total == 0


# -- requests whose repeated fields are many: the broker's 5.x service ----------------------

MESSAGING = "/apache.rocketmq.v2.MessagingService/"


@pytest.fixture
async def cluster(tmp_path: Any) -> AsyncIterator[Cluster]:
    props = dict(TEST_PROPERTIES, grpcServerPort=str(free_port()))
    async with open_cluster(
        str(tmp_path), namesrv_port=0, broker_port=0, bind_address="127.0.0.1", properties=props
    ) as cluster:
        await cluster.broker.topic_config_manager.update(TopicConfig("Many", 2, 2))
        yield cluster


def grpc_port(cluster: Cluster) -> int:
    assert cluster.broker.grpc_server is not None
    return cluster.broker.grpc_server.port


async def test_an_ack_of_a_million_entries_is_refused_at_once(cluster: Cluster) -> None:
    """4 MiB of empty AckMessageEntry (two bytes each): each was looked up, and answered with
    a result, in one step of the loop (13 s here, every other client waiting) and an answer of
    tens of megabytes; now refused BAD_REQUEST past MAX_ACK_ENTRIES, before any is looked at."""
    wire = await Wire.open(grpc_port(cluster))
    request = service_pb2.AckMessageRequest()
    request.group.name = "G"
    request.topic.name = "Many"
    empty_entries = b"\x1a\x00"
    fields, answer = await wire.exchange(
        1,
        "AckMessage",
        request.SerializeToString() + empty_entries * 2_000_000,
        service=MESSAGING,
    )
    assert fields["grpc-status"] == "0"
    response = service_pb2.AckMessageResponse.FromString(answer)
    assert response.status.code == definition_pb2.Code.BAD_REQUEST
    assert "too many entries" in response.status.message and not response.entries
    # As many as allowed: each looked at (none is a valid handle).
    fields, answer = await wire.exchange(
        3,
        "AckMessage",
        request.SerializeToString() + empty_entries * MAX_ACK_ENTRIES,
        service=MESSAGING,
    )
    response = service_pb2.AckMessageResponse.FromString(answer)
    assert response.status.code == definition_pb2.Code.INVALID_RECEIPT_HANDLE
    assert len(response.entries) == MAX_ACK_ENTRIES
    await wire.stream.aclose()


async def test_a_batch_of_many_messages_lets_the_loop_serve_others(cluster: Cluster) -> None:
    """A SendMessage of 20,000 tiny messages (each a put) held the loop until the last was
    stored; now it yields every SEND_YIELD_EVERY messages: a task of the same loop sees the
    store between the batch's first put and its last."""
    store = cluster.broker.store
    one = definition_pb2.Message(body=b"x")
    one.topic.name = "Many"
    one.system_properties.message_id = "01"
    count = 20_000
    request = service_pb2.SendMessageRequest(messages=[one] * count)
    begin = store.max_phy_offset
    seen: set[int] = set()

    async def watch() -> None:
        while True:
            seen.add(store.max_phy_offset)
            await trio.sleep(0)

    wire = await Wire.open(grpc_port(cluster))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        fields, answer = await wire.exchange(
            1, "SendMessage", request.SerializeToString(), service=MESSAGING
        )
        nursery.cancel_scope.cancel()
    assert fields["grpc-status"] == "0"
    response = service_pb2.SendMessageResponse.FromString(answer)
    assert response.status.code == definition_pb2.Code.OK
    assert len(response.entries) == count
    end = store.max_phy_offset
    during = {offset for offset in seen if begin < offset < end}
    assert len(during) >= count // SEND_YIELD_EVERY // 2
    await wire.stream.aclose()
