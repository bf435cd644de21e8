"""HTTP/2 floods on a real socket (127.0.0.1), from a client that writes frames by hand (hpack
for its header blocks): rapid reset, empty frames, a SETTINGS flood driving the HPACK table.
Each costs the flooding connection its GOAWAY (ENHANCE_YOUR_CALM) or nothing at all, the calls
it began are counted back, and another connection is served meanwhile."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import hpack
import pytest
import trio

from pymq.proxy.h2server import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADER_TABLE_SIZE,
    HEADERS,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    ErrorCode,
    H2Server,
    frame,
)
from pymq.proxy.http2 import Call, GrpcLimits, GrpcServer

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

    def headers(self, path: str) -> bytes:
        return bytes(
            self.encoder.encode(
                [
                    (":method", "POST"),
                    (":scheme", "http"),
                    (":path", SERVICE + path),
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

    async def goaway(self) -> int:
        """The error code of the GOAWAY the server sends, once it has closed the socket."""
        codes = []
        with trio.fail_after(10):
            while (got := await self.frame()) is not None:
                if got[0] == GOAWAY:
                    codes.append(struct.unpack(">L", got[3][4:8])[0])
        assert len(codes) == 1
        return codes[0]

    async def call(self, sid: int, path: str, body: bytes) -> dict[str, str]:
        """A unary call; its response headers and trailers, merged."""
        await self.send(
            frame(HEADERS, END_HEADERS, sid, self.headers(path))
            + frame(DATA, END_STREAM, sid, message(body))
        )
        fields: dict[str, str] = {}
        with trio.fail_after(10):
            while True:
                got = await self.frame()
                assert got is not None, "the connection closed before the call ended"
                ftype, flags, stream, payload = got
                if ftype == HEADERS and stream == sid:
                    fields.update(self.fields(payload))
                    if flags & END_STREAM:
                        return fields


@asynccontextmanager
async def serving() -> AsyncIterator[tuple[GrpcServer, dict[str, int]]]:
    """A gRPC server of two methods: Wait (reads its request, then waits until cancelled) and
    Echo; ``counts`` tells how many Wait calls began."""
    counts = {"waits": 0}

    async def wait(call: Call) -> None:
        await call.receive()
        counts["waits"] += 1
        await trio.sleep_forever()

    async def echo(call: Call) -> None:
        await call.send(await call.receive() or b"", last=True)

    grpc = GrpcServer(
        {SERVICE + "Wait": wait, SERVICE + "Echo": echo},
        host="127.0.0.1",
        port=0,
        limits=GrpcLimits(max_concurrent_streams=10),
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(grpc.run)
        yield grpc, counts
        nursery.cancel_scope.cancel()


async def still_served(grpc: GrpcServer) -> None:
    other = await Wire.open(grpc.port)
    fields = await other.call(1, "Echo", b"hi")
    assert fields["grpc-status"] == "0"
    await other.stream.aclose()


async def test_rapid_reset_loses_its_connection_and_its_calls_are_counted_back() -> None:
    """CVE-2023-44487: calls opened and reset in a loop, never past the concurrency limit,
    each one's reset in the read after its request (so many of them are begun, and wait)."""
    async with serving() as (grpc, counts):
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
    async with serving() as (grpc, _):
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
    async with serving() as (grpc, _):
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
