"""Bad input on the broker's gRPC port (issue #40), from a raw HTTP/2 client (h2): malformed
protobuf, unknown methods, an oversize message, a response never read, a request never
finished, too many streams, garbage instead of HTTP/2.  Each gets a clear gRPC status or loses
its own connection; the request bytes held return to zero and the broker keeps serving."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import attrs
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import pytest
import trio
from hyperframe.frame import HeadersFrame
from rocketmq.grpc_protocol import definition_pb2, service_pb2

from pymq.common.topic import TopicConfig
from pymq.embedded import Cluster, open_cluster
from pymq.proxy.http2 import (
    DEADLINE_EXCEEDED,
    INTERNAL,
    INVALID_ARGUMENT,
    RESOURCE_EXHAUSTED,
    UNIMPLEMENTED,
    GrpcServer,
)
from pymq.testing import TEST_PROPERTIES
from tests.helpers import free_port

SERVICE = "/apache.rocketmq.v2.MessagingService/"
STREAMS = 8


@pytest.fixture
async def cluster(tmp_path) -> AsyncIterator[Cluster]:
    props = dict(
        TEST_PROPERTIES,
        grpcServerPort=str(free_port()),
        grpcMaxConcurrentStreams=str(STREAMS),
        writeStallTimeoutMillis="1000",
        frameReceiveTimeoutMillis="1000",
    )
    async with open_cluster(
        str(tmp_path), namesrv_port=0, broker_port=0, bind_address="127.0.0.1", properties=props
    ) as cluster:
        await cluster.broker.topic_config_manager.update(TopicConfig("Hostile", 2, 2))
        yield cluster


def server(cluster: Cluster) -> GrpcServer:
    assert cluster.broker.grpc_server is not None
    return cluster.broker.grpc_server


class RawClient:
    """An HTTP/2 client speaking gRPC by hand."""

    def __init__(self, stream: trio.SocketStream, settings: dict[int, int] | None) -> None:
        self.stream = stream
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.h2.initiate_connection()
        if settings:
            self.h2.update_settings(settings)
        self.responses: dict[int, dict[str, Any]] = {}
        self.terminated = False
        self.eof = False

    @classmethod
    async def open(cls, port: int, settings: dict[int, int] | None = None) -> RawClient:
        client = cls(await trio.open_tcp_stream("127.0.0.1", port), settings)
        await client.flush()
        return client

    async def flush(self) -> None:
        data = self.h2.data_to_send()
        if data:
            await self.stream.send_all(data)

    async def call(
        self,
        path: str,
        message: bytes | None,
        *,
        end: bool = True,
        headers: list[tuple[str, str]] | None = None,
    ) -> int:
        sid = self.h2.get_next_available_stream_id()
        headers = headers or [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "127.0.0.1"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("x-mq-client-id", "raw-h2"),
        ]
        self.h2.send_headers(sid, headers, end_stream=message is None and end)
        if message is not None:
            self.h2.send_data(sid, message, end_stream=end)
        self.responses[sid] = {"headers": {}, "data": b"", "ended": False}
        await self.flush()
        return sid

    async def pump(self) -> None:
        data = await self.stream.receive_some(65536)
        if not data:
            self.eof = True
            return
        for event in self.h2.receive_data(data):
            response = self.responses.get(getattr(event, "stream_id", 0))
            if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                assert response is not None
                response["headers"].update((k.decode(), v.decode()) for k, v in event.headers)
            elif isinstance(event, h2.events.DataReceived):
                assert response is not None
                response["data"] += event.data
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
                if response is not None:
                    response["ended"] = True
                    if isinstance(event, h2.events.StreamReset):
                        response["reset"] = event.error_code
            elif isinstance(event, h2.events.ConnectionTerminated):
                self.terminated = True
        await self.flush()

    async def finish(self, sid: int, timeout: float = 10) -> dict[str, Any]:
        with trio.fail_after(timeout):
            while not self.responses[sid]["ended"]:
                await self.pump()
                assert not self.eof, "connection closed before the call ended"
        return self.responses[sid]

    async def closed_by_server(self, timeout: float = 10) -> None:
        with trio.fail_after(timeout):
            while not self.eof:
                try:
                    await self.pump()
                except trio.BrokenResourceError:
                    return

    async def aclose(self) -> None:
        await self.stream.aclose()


def framed(message: bytes, length: int | None = None) -> bytes:
    size = len(message) if length is None else length
    return b"\x00" + size.to_bytes(4, "big") + message


def route_request(topic: str = "Hostile") -> bytes:
    request = service_pb2.QueryRouteRequest()
    request.topic.name = topic
    return framed(request.SerializeToString())


async def still_serving(cluster: Cluster) -> None:
    """A well-formed call on a new connection is answered OK, and no request bytes are held."""
    client = await RawClient.open(server(cluster).port)
    try:
        response = await client.finish(await client.call(SERVICE + "QueryRoute", route_request()))
    finally:
        await client.aclose()
    assert response["headers"]["grpc-status"] == "0"
    route = service_pb2.QueryRouteResponse.FromString(response["data"][5:])
    assert route.status.code == definition_pb2.Code.OK
    assert len(route.message_queues) == 2
    assert server(cluster).budget.partial_frame_total == 0


async def test_malformed_protobuf_and_unknown_methods_get_a_status(cluster: Cluster) -> None:
    client = await RawClient.open(server(cluster).port)
    bad = await client.call(SERVICE + "SendMessage", framed(b"\xff\xff\xff\xff\x0f"))
    unknown = await client.call(SERVICE + "NoSuchMethod", framed(b""))
    other = await client.call("/other.Service/Method", None)
    no_message = await client.call(SERVICE + "Heartbeat", None)
    response = await client.finish(bad)
    assert response["headers"]["grpc-status"] == str(INVALID_ARGUMENT)
    assert "malformed SendMessageRequest" in response["headers"]["grpc-message"]
    for sid, path in ((unknown, SERVICE[1:] + "NoSuchMethod"), (other, "other.Service/Method")):
        response = await client.finish(sid)
        assert response["headers"]["grpc-status"] == str(UNIMPLEMENTED)
        assert path in response["headers"]["grpc-message"]
    response = await client.finish(no_message)
    assert response["headers"]["grpc-status"] == str(INVALID_ARGUMENT)
    # The connection still serves a good call after all that.
    good = await client.finish(await client.call(SERVICE + "QueryRoute", route_request()))
    assert good["headers"]["grpc-status"] == "0"
    await client.aclose()
    await still_serving(cluster)


async def test_a_compressed_message_without_an_encoding_is_internal(cluster: Cluster) -> None:
    """The compressed flag set in a call without grpc-encoding: INTERNAL, as grpc-java's and
    grpc-go's servers answer it (a grpc-encoding the server lacks is UNIMPLEMENTED)."""
    client = await RawClient.open(server(cluster).port)
    flagged = b"\x01" + route_request()[1:]
    sid = await client.call(SERVICE + "QueryRoute", flagged)
    response = await client.finish(sid)
    assert response["headers"]["grpc-status"] == str(INTERNAL)
    assert "compressed message without grpc-encoding" in response["headers"]["grpc-message"]
    headers = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", SERVICE + "QueryRoute"),
        (":authority", "127.0.0.1"),
        ("content-type", "application/grpc"),
        ("grpc-encoding", "snappy"),
    ]
    response = await client.finish(await client.call("", flagged, headers=headers))
    assert response["headers"]["grpc-status"] == str(UNIMPLEMENTED)
    await client.aclose()
    await still_serving(cluster)


async def test_an_oversize_message_is_refused_before_its_bytes_arrive(cluster: Cluster) -> None:
    limit = server(cluster).limits.max_message_size
    client = await RawClient.open(server(cluster).port)
    # Only the prefix announcing one byte too many, and a little of the body.
    sid = await client.call(SERVICE + "SendMessage", framed(b"x" * 100, limit + 1), end=False)
    response = await client.finish(sid)
    assert response["headers"]["grpc-status"] == str(RESOURCE_EXHAUSTED)
    assert f"limit of {limit} bytes" in response["headers"]["grpc-message"]
    await client.aclose()
    await still_serving(cluster)


async def test_a_request_never_finished_times_out(cluster: Cluster) -> None:
    client = await RawClient.open(server(cluster).port)
    headers_only = await client.call(SERVICE + "QueryRoute", None, end=False)
    half_message = await client.call(
        SERVICE + "QueryRoute", framed(b"\x0a\x02", length=50), end=False
    )
    with trio.fail_after(5):  # the half message is held, counted in the shared budget
        while server(cluster).budget.partial_frame_total == 0:
            await trio.sleep(0.01)
    for sid in (headers_only, half_message):
        response = await client.finish(sid, timeout=5)
        assert response["headers"]["grpc-status"] == str(DEADLINE_EXCEEDED)
    await client.aclose()
    await still_serving(cluster)


async def test_a_response_never_read_closes_that_connection_only(cluster: Cluster) -> None:
    # A client granting no flow-control window cannot be sent the response's data.
    stalled = await RawClient.open(
        server(cluster).port, {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0}
    )
    for _ in range(3):
        await stalled.call(SERVICE + "QueryRoute", route_request())
    await still_serving(cluster)  # served meanwhile
    with trio.fail_after(10):
        while server(cluster).connections:
            await trio.sleep(0.05)
    await stalled.closed_by_server()
    await stalled.aclose()
    await still_serving(cluster)


async def test_too_many_streams_lose_the_connection(cluster: Cluster) -> None:
    client = await RawClient.open(server(cluster).port)
    await client.pump()  # the server's SETTINGS (its stream limit) acknowledged
    for _ in range(STREAMS):
        await client.call(SERVICE + "Telemetry", None, end=False)
    with trio.fail_after(5):  # every stream open on the server (idle streams are allowed)
        while len(next(iter(server(cluster).connections)).calls) < STREAMS:
            await trio.sleep(0.01)
    # h2 refuses to exceed the server's limit itself: one more HEADERS frame written by hand
    # (with h2's own header encoder, whose state the server's decoder shares).
    frame = HeadersFrame(client.h2.highest_outbound_stream_id + 2)
    frame.data = client.h2.encoder.encode(
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", SERVICE + "Telemetry"),
            (":authority", "127.0.0.1"),
            ("content-type", "application/grpc"),
        ]
    )
    frame.flags.add("END_HEADERS")
    await client.stream.send_all(frame.serialize())
    with trio.fail_after(10):
        while not client.terminated and not client.eof:
            await client.pump()
    await client.aclose()
    with trio.fail_after(5):
        while server(cluster).connections:
            await trio.sleep(0.05)
    await still_serving(cluster)


async def test_garbage_instead_of_http2_closes_the_connection(cluster: Cluster) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", server(cluster).port)
    await stream.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\x00" * 100)
    with trio.fail_after(10):
        while True:
            try:
                data = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                break
            if not data:
                break
    await stream.aclose()
    await still_serving(cluster)


async def test_calls_past_the_servers_cap_are_refused_and_counted_back(cluster: Cluster) -> None:
    grpc = server(cluster)
    grpc.limits = attrs.evolve(grpc.limits, max_calls=3)
    client = await RawClient.open(grpc.port)
    sids = [await client.call(SERVICE + "Telemetry", None, end=False) for _ in range(5)]
    with trio.fail_after(5):  # two of the five reset REFUSED_STREAM, at once
        while sum(client.responses[sid]["ended"] for sid in sids) < 2:
            await client.pump()
    assert grpc.open_calls == 3 and grpc.refused_calls == 2
    assert not client.terminated  # the connection itself goes on
    await client.aclose()
    with trio.fail_after(5):
        while grpc.open_calls:
            await trio.sleep(0.01)
    grpc.limits = attrs.evolve(grpc.limits, max_calls=10000)
    await still_serving(cluster)


# -- calls served in the connection's reader until they wait (AckMessage, offsets, sends) ----


def ack_request(handle: str = "not-a-handle") -> bytes:
    request = service_pb2.AckMessageRequest()
    request.group.name = "G"
    request.topic.name = "Hostile"
    entry = request.entries.add()
    entry.receipt_handle = handle
    entry.message_id = "id"
    return framed(request.SerializeToString())


async def counted_back(grpc: GrpcServer) -> None:
    """Every call ended on the server: none counted in progress, no request byte held."""
    with trio.fail_after(5):
        while grpc.open_calls or grpc.budget.partial_frame_total:
            await trio.sleep(0.01)


async def test_calls_in_the_reader_answer_bad_input_with_a_status(cluster: Cluster) -> None:
    grpc = server(cluster)
    client = await RawClient.open(grpc.port)
    # Malformed, missing, and a good one, all in flight at once on one connection.
    bad = await client.call(SERVICE + "AckMessage", framed(b"\xff\xff\xff\xff\x0f"))
    empty = await client.call(SERVICE + "GetOffset", None)
    good = await client.call(SERVICE + "AckMessage", ack_request())
    response = await client.finish(bad)
    assert response["headers"]["grpc-status"] == str(INVALID_ARGUMENT)
    assert "malformed AckMessageRequest" in response["headers"]["grpc-message"]
    response = await client.finish(empty)
    assert response["headers"]["grpc-status"] == str(INVALID_ARGUMENT)
    assert "without a GetOffsetRequest" in response["headers"]["grpc-message"]
    response = await client.finish(good)
    assert response["headers"]["grpc-status"] == "0"
    answer = service_pb2.AckMessageResponse.FromString(response["data"][5:])
    assert answer.entries[0].status.code == definition_pb2.Code.INVALID_RECEIPT_HANDLE
    # Many at once in one write: each answered (together, in one send).
    sids = [await client.call(SERVICE + "AckMessage", ack_request(f"h{i}")) for i in range(6)]
    for sid in sids:
        assert (await client.finish(sid))["headers"]["grpc-status"] == "0"
    await client.aclose()
    await counted_back(grpc)
    assert ("AckMessage", INVALID_ARGUMENT) in grpc.stats.table
    await still_serving(cluster)


async def test_a_request_never_whole_leaves_the_reader_and_times_out(cluster: Cluster) -> None:
    grpc = server(cluster)
    client = await RawClient.open(grpc.port)
    headers_only = await client.call(SERVICE + "AckMessage", None, end=False)
    half = await client.call(SERVICE + "UpdateOffset", framed(b"\x0a\x02", length=50), end=False)
    # A whole message is served without the client's END_STREAM (then the stream is reset).
    whole_not_ended = await client.call(SERVICE + "AckMessage", ack_request(), end=False)
    assert (await client.finish(whole_not_ended))["headers"]["grpc-status"] == "0"
    for sid in (headers_only, half):
        response = await client.finish(sid, timeout=5)
        assert response["headers"]["grpc-status"] == str(DEADLINE_EXCEEDED)
    assert not client.terminated
    await client.aclose()
    await counted_back(grpc)
    await still_serving(cluster)


async def test_a_call_reset_mid_request_is_counted_back(cluster: Cluster) -> None:
    grpc = server(cluster)
    client = await RawClient.open(grpc.port)
    sid = await client.call(SERVICE + "AckMessage", framed(b"\x0a\x02", length=50), end=False)
    with trio.fail_after(5):  # the half message is held, and the call counted
        while grpc.budget.partial_frame_total == 0 or grpc.open_calls == 0:
            await trio.sleep(0.01)
    client.h2.reset_stream(sid)
    await client.flush()
    await counted_back(grpc)
    assert ("AckMessage", 1) in grpc.stats.table  # CANCELLED
    # The connection goes on serving.
    good = await client.finish(await client.call(SERVICE + "AckMessage", ack_request()))
    assert good["headers"]["grpc-status"] == "0"
    await client.aclose()
    await still_serving(cluster)


async def test_calls_in_the_reader_keep_the_limits(cluster: Cluster) -> None:
    grpc = server(cluster)
    # An oversize message is refused before its bytes arrive.
    limit = grpc.limits.max_message_size
    client = await RawClient.open(grpc.port)
    sid = await client.call(SERVICE + "AckMessage", framed(b"x" * 100, limit + 1), end=False)
    response = await client.finish(sid)
    assert response["headers"]["grpc-status"] == str(RESOURCE_EXHAUSTED)
    await client.aclose()
    # Calls waiting for their request count against the server's calls in progress.
    grpc.limits = attrs.evolve(grpc.limits, max_calls=2)
    try:
        client = await RawClient.open(grpc.port)
        sids = [await client.call(SERVICE + "AckMessage", None, end=False) for _ in range(4)]
        with trio.fail_after(5):  # two reset REFUSED_STREAM at once
            while sum(client.responses[sid]["ended"] for sid in sids) < 2:
                await client.pump()
        assert grpc.open_calls == 2 and grpc.refused_calls == 2
        await client.aclose()
        await counted_back(grpc)
    finally:
        grpc.limits = attrs.evolve(grpc.limits, max_calls=10000)
    await still_serving(cluster)


async def test_an_answer_waits_for_the_window_in_a_task_of_its_own(cluster: Cluster) -> None:
    """A client granting a stream too small a window for the answer: the call leaves the
    reader to wait, the connection goes on serving, and the answer arrives whole once the
    window opens."""
    grpc = server(cluster)
    client = await RawClient.open(grpc.port, {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 8})
    await client.pump()  # the settings exchanged
    sid = await client.call(SERVICE + "AckMessage", ack_request())
    with trio.fail_after(5):  # the first 8 bytes arrive, then nothing
        while len(client.responses[sid]["data"]) < 8:
            await client.pump()
    assert not client.responses[sid]["ended"] and grpc.open_calls == 1
    other = await client.call(SERVICE + "GetOffset", None)  # the reader is not held
    with trio.fail_after(5):
        while not client.responses[other]["ended"]:
            await client.pump()
    client.h2.increment_flow_control_window(65535, stream_id=sid)
    await client.flush()
    response = await client.finish(sid)
    assert response["headers"]["grpc-status"] == "0"
    answer = service_pb2.AckMessageResponse.FromString(response["data"][5:])
    assert answer.entries[0].status.code == definition_pb2.Code.INVALID_RECEIPT_HANDLE
    await client.aclose()
    await counted_back(grpc)


GOOD_HEADERS = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", SERVICE + "GetOffset"),
    (":authority", "127.0.0.1"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]


@pytest.mark.parametrize(
    "change",
    [
        [("X-Upper", "1")],  # an upper-case name
        [("x:colon", "1")],  # a colon inside a name
        [("x\x01ctl", "1")],  # a control character in a name
        [("", "empty name")],
        [("connection", "keep-alive")],  # connection-specific
        [("te", "gzip")],
        [("x-value", "a\nb")],  # LF in a value
        [("x-value", " padded")],  # a value beginning with a blank
        [(b"x-latin1", b"caf\xe9")],  # a value that is not UTF-8
        [(b"x-\xff", b"1")],  # a name that is not UTF-8
        [("host", "other")],  # host and :authority differ
        [("host", "127.0.0.1"), ("host", "127.0.0.1")],
        [(":status", "200")],  # a response's pseudo-header
        [(":path", "/again")],  # a pseudo-header twice
        "drop :path",
        "drop :method",
        "pseudo last",
    ],
)
async def test_a_malformed_header_block_resets_its_stream_only(cluster: Cluster, change) -> None:
    """Each malformed request is a stream error (RST_STREAM PROTOCOL_ERROR, RFC 9113 8.1.1):
    the connection goes on serving, and nothing is counted as a call."""
    grpc = server(cluster)
    client = await RawClient.open(grpc.port)
    # The client side writes the block as given: no check, no normalisation.
    client.h2.config.validate_outbound_headers = False
    client.h2.config.normalize_outbound_headers = False
    if change == "drop :path":
        headers = [h for h in GOOD_HEADERS if h[0] != ":path"]
    elif change == "drop :method":
        headers = [h for h in GOOD_HEADERS if h[0] != ":method"]
    elif change == "pseudo last":
        headers = [h for h in GOOD_HEADERS if h[0] != ":scheme"] + [(":scheme", "http")]
    else:
        headers = GOOD_HEADERS + list(change)
    bad = await client.call("", None, headers=headers)
    response = await client.finish(bad)
    assert response.get("reset") == h2.errors.ErrorCodes.PROTOCOL_ERROR
    assert not client.terminated
    good = await client.finish(await client.call("", None, headers=GOOD_HEADERS))
    assert good["headers"]["grpc-status"] == str(INVALID_ARGUMENT)  # no message: served
    await client.aclose()
    await counted_back(grpc)


async def test_an_idle_connection_is_closed_and_a_busy_one_is_not() -> None:
    """idle_timeout: a connection with no call that sends nothing is closed with GOAWAY once
    it has been idle that long; one whose call is still being served is not, however long the
    call takes, and is closed once idle after it."""
    from pymq.proxy.http2 import Call, GrpcLimits

    async def slow(call: Call) -> None:
        await call.receive()
        await trio.sleep(1.5)
        await call.send(b"done", last=True)

    grpc = GrpcServer(
        {SERVICE + "Slow": slow},
        host="127.0.0.1",
        port=0,
        limits=GrpcLimits(idle_timeout=0.5),
    )
    async with trio.open_nursery() as nursery:
        port = await nursery.start(grpc.run)
        idle = await RawClient.open(port)
        begin = trio.current_time()
        await idle.closed_by_server(timeout=5)
        assert idle.terminated  # a GOAWAY first
        assert 0.4 <= trio.current_time() - begin < 3
        await idle.aclose()

        busy = await RawClient.open(port)
        sid = await busy.call(SERVICE + "Slow", framed(b"x"))
        response = await busy.finish(sid)  # 1.5 s of a call: three idle timeouts
        assert response["headers"]["grpc-status"] == "0"
        assert response["data"] == framed(b"done")
        begin = trio.current_time()
        await busy.closed_by_server(timeout=5)
        assert trio.current_time() - begin < 3
        await busy.aclose()
        nursery.cancel_scope.cancel()


async def test_a_socket_never_drained_closes_that_connection() -> None:
    """write_stall_timeout on the socket: a client that grants every window and then reads
    nothing has its connection closed once one send has waited that long (no timer per send:
    the connection's watcher), while another connection is served meanwhile."""
    from pymq.proxy.http2 import Call, GrpcLimits

    sent = 0

    async def flood(call: Call) -> None:
        nonlocal sent
        await call.receive()
        await trio.sleep(0)  # out of the reader: each send is written at once
        while True:
            await call.send(b"x" * 65536)
            sent += 1

    async def echo(call: Call) -> None:
        await call.send(await call.receive() or b"", last=True)

    grpc = GrpcServer(
        {SERVICE + "Flood": flood, SERVICE + "Echo": echo},
        host="127.0.0.1",
        port=0,
        limits=GrpcLimits(write_stall_timeout=0.5),
    )
    async with trio.open_nursery() as nursery:
        port = await nursery.start(grpc.run)
        big = 2**31 - 1
        stalled = await RawClient.open(port, {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: big})
        stalled.h2.increment_flow_control_window(big - 65535)
        await stalled.flush()
        await trio.sleep(1.2)  # the greeting's sends long done: the watcher sleeps for idle
        await stalled.call(SERVICE + "Flood", framed(b"go"))
        with trio.fail_after(10):
            while sent < 2:  # the socket's buffers filled, then its send waits
                await trio.sleep(0.01)
        other = await RawClient.open(port)
        response = await other.finish(await other.call(SERVICE + "Echo", framed(b"hi")))
        assert response["data"] == framed(b"hi")
        await other.aclose()
        with trio.fail_after(10):
            while grpc.connections:
                await trio.sleep(0.05)
        assert grpc.open_calls == 0
        assert sent < 1000  # stopped, not written to a peer that reads nothing
        await stalled.aclose()
        nursery.cancel_scope.cancel()


async def test_a_request_larger_than_the_window_is_received_whole(cluster: Cluster) -> None:
    """A request of three times the server's flow-control window arrives whole: the server
    hands the window back as it takes the DATA frames in (acknowledged per read)."""
    window = server(cluster).limits.initial_window_size
    request = service_pb2.SendMessageRequest()
    msg = request.messages.add()
    msg.topic.name = "Hostile"
    msg.body = bytes(range(256)) * (3 * window // 256)
    msg.system_properties.message_id = "01AABBCCDDEEFF00112233445566778899"
    msg.system_properties.message_type = definition_pb2.MessageType.NORMAL
    payload = framed(request.SerializeToString())
    client = await RawClient.open(server(cluster).port)
    sid = await client.call(SERVICE + "SendMessage", None, end=False)
    sent = 0
    with trio.fail_after(20):
        while sent < len(payload):
            room = min(
                client.h2.local_flow_control_window(sid),
                client.h2.max_outbound_frame_size,
                len(payload) - sent,
            )
            if room <= 0:
                await client.pump()  # the server's WINDOW_UPDATEs
                continue
            sent += room
            client.h2.send_data(sid, payload[sent - room : sent], end_stream=sent == len(payload))
            await client.flush()
    response = await client.finish(sid)
    assert response["headers"]["grpc-status"] == "0"
    answer = service_pb2.SendMessageResponse.FromString(response["data"][5:])
    assert answer.status.code == definition_pb2.Code.OK, answer.status
    await client.aclose()
    await still_serving(cluster)


async def test_calls_answered_before_their_request_ends_free_their_streams(
    cluster: Cluster,
) -> None:
    """A call answered at once (an unknown method, a request that is not gRPC) while the client
    has not ended its side is reset NO_ERROR after the answer, as a served call is: it does not
    stay open on the server, so many of them on one connection never reach the stream limit
    (before, each stayed half-open and the ninth lost the connection)."""
    grpc = server(cluster)
    client = await RawClient.open(grpc.port)
    await client.pump()  # the server's SETTINGS (its stream limit) acknowledged
    for k in range(3 * STREAMS):
        if k % 2:
            sid = await client.call(SERVICE + "NoSuchMethod", None, end=False)
            response = await client.finish(sid)
            assert response["headers"]["grpc-status"] == str(UNIMPLEMENTED)
        else:
            headers = [h for h in GOOD_HEADERS if h[0] != "content-type"]
            sid = await client.call("", None, end=False, headers=headers)
            response = await client.finish(sid)
            assert response["headers"][":status"] == "415"
    assert not client.terminated
    good = await client.finish(await client.call(SERVICE + "QueryRoute", route_request()))
    assert good["headers"]["grpc-status"] == "0"
    await client.aclose()
    await counted_back(grpc)


@pytest.mark.parametrize("window", [4 * 105, 4 * 105 + 50, 65535])
async def test_a_streamed_batch_goes_out_in_one_write_and_never_waits_on_itself(
    window: int,
) -> None:
    """Messages sent ``more`` (a ReceiveMessage's batch) are written together by the send that
    ends the batch: one socket write for the batch, not one per message, from a call that
    left the reader.  A send that finds the peer's window shut writes what the batch queued
    first, whether the window was used up exactly (``4 * 105``: four whole messages) or
    in the middle of a message: the peer can only open its window for bytes it has read,
    so the call goes on (it would otherwise wait out the write stall timeout)."""
    from pymq.proxy.h2server import H2Server
    from pymq.proxy.http2 import Call

    writes: list[int] = []
    data_to_send = H2Server.data_to_send

    def counted(self: H2Server) -> Any:
        data = data_to_send(self)
        if data:
            writes.append(len(data))
        return data

    async def batch(call: Call) -> None:
        await call.receive()
        await trio.sleep(0)  # out of the reader, as a receive that long-polled
        writes.clear()
        for i in range(10):
            await call.send(bytes([i]) * 100, more=i < 9, last=i == 9)

    grpc = GrpcServer({SERVICE + "Batch": batch}, host="127.0.0.1", port=0)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(grpc.run)
        H2Server.data_to_send = counted  # type: ignore[method-assign]
        try:
            client = await RawClient.open(
                port, {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window}
            )
            sid = await client.call(SERVICE + "Batch", framed(b"go"))
            response = await client.finish(sid, timeout=5)  # the stall timeout is 30 s
        finally:
            H2Server.data_to_send = data_to_send  # type: ignore[method-assign]
        assert response["headers"]["grpc-status"] == "0"
        assert response["data"] == b"".join(framed(bytes([i]) * 100) for i in range(10))
        if window == 65535:
            assert len(writes) == 1  # headers, ten messages and trailers: one write
        else:
            assert len(writes) >= 2  # written as the window opened
        await client.aclose()
        nursery.cancel_scope.cancel()
