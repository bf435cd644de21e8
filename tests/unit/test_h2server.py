"""pymq's sans-IO HTTP/2 server layer (pymq.proxy.h2server), frame by frame and without sockets:
the preface and SETTINGS, header blocks, flow control both ways, stream states, and each
protocol error answered with its RST_STREAM or GOAWAY code (RFC 9113); h2's client talking to
it; and a Hypothesis fuzz that feeds random and mutated frames and sees only clean errors."""

from __future__ import annotations

import itertools
import struct
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pymq.proxy.h2server import (
    _CHECKED,
    _ORDERS,
    ACK,
    CONTINUATION,
    DATA,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    FIELDS_KEPT,
    GOAWAY,
    HEADER_TABLE_SIZE,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    MAX_CONCURRENT_STREAMS,
    MAX_FRAME_SIZE,
    MAX_HEADER_LIST_SIZE,
    ORDERS_KEPT,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PRIORITY_FLAG,
    PUSH_PROMISE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    ConnectionTerminated,
    DataReceived,
    ErrorCode,
    H2ConnectionError,
    H2Server,
    RequestReceived,
    StreamClosedError,
    StreamReset,
    WindowOpened,
    frame,
    request_headers,
)

REQUEST = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/apache.rocketmq.v2.MessagingService/SendMessage"),
    (":authority", "127.0.0.1:8081"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
    ("x-mq-client-id", "c1"),
]


def u32(value: int) -> bytes:
    return struct.pack(">L", value)


def setting(key: int, value: int) -> bytes:
    return struct.pack(">HL", key, value)


def frames(data: bytes | bytearray) -> list[tuple[int, int, int, bytes]]:
    """The frames in ``data`` (type, flags, stream id, payload); all of it must be frames."""
    out = []
    pos = 0
    while pos < len(data):
        assert len(data) - pos >= 9, "a truncated frame header"
        length = int.from_bytes(data[pos : pos + 3], "big")
        ftype, flags = data[pos + 3], data[pos + 4]
        sid = int.from_bytes(data[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
        payload = bytes(data[pos + 9 : pos + 9 + length])
        assert len(payload) == length, "a truncated frame"
        out.append((ftype, flags, sid, payload))
        pos += 9 + length
    return out


class Peer:
    """A client writing frames by hand (its own HPACK encoder), the server under test."""

    def __init__(self, **kwargs: Any) -> None:
        self.server = H2Server(**kwargs)
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.greeting = frames(self.server.data_to_send())

    def feed(self, data: bytes) -> list[Any]:
        return self.server.receive(data)

    def start(self, settings_payload: bytes = b"", ack: bool = True) -> list[Any]:
        events = self.feed(PREFACE + frame(SETTINGS, 0, 0, settings_payload))
        if ack:
            events += self.feed(frame(SETTINGS, ACK, 0))
        self.out()
        return events

    def out(self) -> list[tuple[int, int, int, bytes]]:
        return frames(self.server.data_to_send())

    def block(self, headers: list[tuple[str, str]] | None = None) -> bytes:
        return bytes(self.encoder.encode(headers or REQUEST))

    def request(self, sid: int, end: bool = False, headers: Any = None) -> list[Any]:
        flags = END_HEADERS | (END_STREAM if end else 0)
        return self.feed(frame(HEADERS, flags, sid, self.block(headers)))

    def error(self, data: bytes) -> ErrorCode:
        """The connection error ``data`` causes, and its GOAWAY checked."""
        with pytest.raises(H2ConnectionError) as info:
            self.feed(data)
        goaway = [f for f in self.out() if f[0] == GOAWAY]
        assert len(goaway) == 1
        assert int.from_bytes(goaway[0][3][4:8], "big") == info.value.code
        assert self.server.closed and self.feed(frame(PING, 0, 0, b"12345678")) == []
        return info.value.code

    def resets(self) -> dict[int, int]:
        return {f[2]: int.from_bytes(f[3], "big") for f in self.out() if f[0] == RST_STREAM}


# -- the preface and SETTINGS ----------------------------------------------------------------


def test_the_greeting_and_the_preface() -> None:
    peer = Peer(max_concurrent_streams=7, initial_window_size=1 << 20, max_header_list_size=999)
    (settings_frame, update) = peer.greeting
    assert settings_frame[:3] == (SETTINGS, 0, 0)
    assert settings_frame[3] == (
        setting(MAX_CONCURRENT_STREAMS, 7)
        + setting(INITIAL_WINDOW_SIZE, 1 << 20)
        + setting(MAX_HEADER_LIST_SIZE, 999)
    )
    assert update == (WINDOW_UPDATE, 0, 0, u32((1 << 20) - DEFAULT_WINDOW))
    # The preface may come a byte at a time; the client's SETTINGS is acknowledged.
    for byte in PREFACE:
        assert peer.feed(bytes([byte])) == []
    assert peer.feed(frame(SETTINGS, 0, 0, setting(MAX_FRAME_SIZE, 20000))) == []
    assert peer.out() == [(SETTINGS, ACK, 0, b"")]
    assert peer.server.peer_max_frame_size == 20000
    assert not peer.server.settings_acked
    peer.feed(frame(SETTINGS, ACK, 0))
    assert peer.server.settings_acked


@pytest.mark.parametrize(
    "data",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\r",
        PREFACE + frame(PING, 0, 0, b"12345678"),  # the first frame is not SETTINGS
        PREFACE + frame(SETTINGS, ACK, 0),
    ],
)
def test_a_bad_preface_is_a_protocol_error(data: bytes) -> None:
    assert Peer().error(data) == ErrorCode.PROTOCOL_ERROR


@pytest.mark.parametrize(
    ("payload", "flags", "sid", "code"),
    [
        (b"\x00\x04" + b"\x80\x00\x00\x00", 0, 0, ErrorCode.FLOW_CONTROL_ERROR),
        (setting(MAX_FRAME_SIZE, 16383), 0, 0, ErrorCode.PROTOCOL_ERROR),
        (setting(MAX_FRAME_SIZE, 1 << 24), 0, 0, ErrorCode.PROTOCOL_ERROR),
        (setting(2, 2), 0, 0, ErrorCode.PROTOCOL_ERROR),  # ENABLE_PUSH
        (b"\x00\x01\x00", 0, 0, ErrorCode.FRAME_SIZE_ERROR),
        (b"", ACK | 0, 0, None),
        (b"\x00", ACK, 0, ErrorCode.FRAME_SIZE_ERROR),
        (b"", 0, 1, ErrorCode.PROTOCOL_ERROR),
    ],
)
def test_settings_checked(payload: bytes, flags: int, sid: int, code: ErrorCode | None) -> None:
    peer = Peer()
    peer.start()
    data = frame(SETTINGS, flags, sid, payload)
    if code is None:
        assert peer.feed(data) == []
    else:
        assert peer.error(data) == code


def test_unknown_settings_and_frame_types_are_ignored() -> None:
    peer = Peer()
    peer.start(setting(0x99, 5) + setting(MAX_HEADER_LIST_SIZE, 10))
    assert peer.feed(frame(0xEE, 0xFF, 3, b"whatever")) == []
    assert peer.out() == []


# -- requests --------------------------------------------------------------------------------


def test_a_request_and_its_message() -> None:
    peer = Peer()
    peer.start()
    [event] = peer.request(1)
    assert isinstance(event, RequestReceived)
    assert (event.stream_id, event.headers, event.ended) == (1, dict(REQUEST), False)
    [data] = peer.feed(frame(DATA, END_STREAM, 1, b"\x00\x00\x00\x00\x02hi"))
    assert isinstance(data, DataReceived) and data.ended and data.data == b"\x00\x00\x00\x00\x02hi"
    # The answer: headers, a message, trailers; the stream is closed after.
    peer.server.send_headers(1, [(":status", "200")])
    assert peer.server.send_data(1, b"reply") == 5
    peer.server.send_headers(1, [("grpc-status", "0")], end_stream=True)
    out = peer.out()
    assert [(f[0], f[1], f[2]) for f in out] == [
        (HEADERS, END_HEADERS, 1),
        (DATA, 0, 1),
        (HEADERS, END_HEADERS | END_STREAM, 1),
    ]
    assert peer.decoder.decode(out[2][3]) == [("grpc-status", "0")]
    assert peer.server.streams == {}
    with pytest.raises(StreamClosedError):
        peer.server.send_data(1, b"more")


def test_a_request_in_one_byte_reads_and_across_continuations() -> None:
    peer = Peer()
    peer.start()
    block = peer.block()
    data = (
        frame(HEADERS, 0, 1, block[:3])
        + frame(CONTINUATION, 0, 1, block[3:10])
        + frame(CONTINUATION, END_HEADERS, 1, block[10:])
        + frame(DATA, END_STREAM | PADDED, 1, b"\x03abc\x00\x00\x00")
    )
    events = []
    for byte in data:
        events += peer.feed(bytes([byte]))
    assert [type(e) for e in events] == [RequestReceived, DataReceived]
    assert events[0].headers == dict(REQUEST)
    assert events[1].data == b"abc" and events[1].ended


def test_headers_with_priority_and_padding_and_priority_frames() -> None:
    peer = Peer()
    peer.start()
    payload = b"\x02" + b"\x00\x00\x00\x00\x10" + peer.block() + b"\x00\x00"
    [event] = peer.feed(frame(HEADERS, END_HEADERS | PADDED | PRIORITY_FLAG, 1, payload))
    assert event.headers == dict(REQUEST)
    assert peer.feed(frame(PRIORITY, 0, 3, b"\x00\x00\x00\x01\x10")) == []  # an idle stream
    assert peer.feed(frame(PRIORITY, 0, 1, b"\x00\x00\x00\x03\x10")) == []
    [event] = peer.request(3)  # PRIORITY opened nothing
    assert event.stream_id == 3


def test_a_block_interrupted_or_continuation_alone_is_a_protocol_error() -> None:
    peer = Peer()
    peer.start()
    block = peer.block()
    interrupted = frame(HEADERS, 0, 1, block[:4]) + frame(PING, 0, 0, b"12345678")
    assert peer.error(interrupted) == ErrorCode.PROTOCOL_ERROR
    peer = Peer()
    peer.start()
    other_stream = frame(HEADERS, 0, 1, block[:4]) + frame(CONTINUATION, END_HEADERS, 3, block[4:])
    assert peer.error(other_stream) == ErrorCode.PROTOCOL_ERROR
    peer = Peer()
    peer.start()
    assert peer.error(frame(CONTINUATION, END_HEADERS, 1, block)) == ErrorCode.PROTOCOL_ERROR


@pytest.mark.parametrize(
    "change",
    [
        [("X-Upper", "1")],
        [("te", "gzip")],
        [("connection", "close")],
        [("x-value", "a\rb")],
        [("x-value", "padded ")],
        [(":status", "200")],
        [("host", "elsewhere")],
    ],
)
def test_a_malformed_request_resets_its_stream_and_hpack_goes_on(change: Any) -> None:
    peer = Peer()
    peer.start()
    # The bad block adds an entry to the table that the next, good block refers to.
    [event] = peer.request(1, headers=[*REQUEST, ("x-indexed", "kept"), *change])
    assert isinstance(event, StreamReset) and not event.remote and not event.announced
    assert event.code == ErrorCode.PROTOCOL_ERROR and event.reason
    assert peer.resets() == {1: ErrorCode.PROTOCOL_ERROR}
    [event] = peer.request(3, headers=[*REQUEST, ("x-indexed", "kept")])
    assert isinstance(event, RequestReceived) and event.headers["x-indexed"] == "kept"
    # Late frames of the reset stream are ignored (but count against the connection window).
    assert peer.feed(frame(DATA, END_STREAM, 1, b"late")) == []
    assert peer.server.recv_window == DEFAULT_WINDOW - 4
    assert peer.out() == []


def test_kept_field_checks_still_judge_each_block() -> None:
    # Each field's check is kept across blocks and connections; the rules on a block's order,
    # repeats and pseudo-headers are still applied to every block.
    good = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/a"), (b":authority", b"h")]
    for _ in range(2):
        assert request_headers([*good, (b"x-a", b"1")]) == {
            ":method": "POST",
            ":scheme": "http",
            ":path": "/a",
            ":authority": "h",
            "x-a": "1",
        }
    assert isinstance(request_headers([(b"x-a", b"1"), *good]), str)  # pseudo after regular
    assert isinstance(request_headers([*good, (b":path", b"/a")]), str)  # repeated
    assert isinstance(request_headers(good[1:]), str)  # no :method
    for _ in range(2):  # a malformed field is refused every time
        assert isinstance(request_headers([*good, (b"X-Upper", b"1")]), str)
        assert isinstance(request_headers([*good, (b"x-v", b"a\nb")]), str)
    for k in range(2 * FIELDS_KEPT):  # fields that change on every call: the kept stay bounded
        assert request_headers([*good, (b"x-id", str(k).encode())])["x-id"] == str(k)  # type: ignore[index]
    assert len(_CHECKED) <= FIELDS_KEPT
    # The first fault in the fields' order is the one told, whichever kind it is, the
    # fields' checks and the names' verdict kept or not (each list read three times).
    late_pseudo = [(b"x-a", b"1"), (b":path", b"/b")]
    for _ in range(3):
        assert request_headers([*good, *late_pseudo, (b"X-Upper", b"1")]) == (
            "pseudo-header :path out of place or repeated"
        )
        assert request_headers([*good, (b"X-Upper", b"1"), *late_pseudo]) == (
            "an illegal character in a header name"
        )
        two_hosts = [(b"host", b"h"), (b"host", b"h")]
        assert request_headers([*good, *two_hosts]) == "more than one host header"
        assert request_headers([*good, (b"host", b"other")]) == "host and :authority differ"
    for k in range(2 * ORDERS_KEPT):  # lists of names never seen before: the kept bounded
        assert isinstance(request_headers([*good, (f"x-{k}".encode(), b"v")]), dict)
    assert len(_ORDERS) <= ORDERS_KEPT


def test_a_header_field_not_utf8_resets_its_stream() -> None:
    peer = Peer()
    peer.start()
    block = peer.encoder.encode([*REQUEST, (b"x-latin1", b"caf\xe9")])
    [event] = peer.feed(frame(HEADERS, END_HEADERS, 1, block))
    assert isinstance(event, StreamReset) and event.code == ErrorCode.PROTOCOL_ERROR


def test_header_blocks_too_large_or_broken_lose_the_connection() -> None:
    peer = Peer(max_header_list_size=200)
    peer.start()
    big = peer.block([*REQUEST, ("x-big", "v" * 300)])
    assert peer.error(frame(HEADERS, END_HEADERS, 1, big)) == ErrorCode.ENHANCE_YOUR_CALM
    # Compressed bytes past the bound are refused before the block ends.
    peer = Peer(max_header_list_size=200)
    peer.start()
    data = frame(HEADERS, 0, 1, b"\x00" * 1000) + frame(CONTINUATION, 0, 1, b"\x00" * 1000)
    assert peer.error(data) == ErrorCode.ENHANCE_YOUR_CALM
    peer = Peer()
    peer.start()
    assert peer.error(frame(HEADERS, END_HEADERS, 1, b"\xff\xff\xff")) in (
        ErrorCode.COMPRESSION_ERROR,
    )


def test_stream_ids_must_be_odd_and_increase() -> None:
    peer = Peer()
    peer.start()
    peer.request(5, end=True)
    events = peer.request(3, end=True)  # below the highest: a closed stream
    assert isinstance(events[0], StreamReset) and events[0].code == ErrorCode.STREAM_CLOSED
    assert peer.resets() == {3: ErrorCode.STREAM_CLOSED}
    assert peer.error(frame(HEADERS, END_HEADERS, 8, peer.block())) == ErrorCode.PROTOCOL_ERROR


def test_trailers_must_end_the_stream() -> None:
    peer = Peer()
    peer.start()
    peer.request(1)
    [event] = peer.feed(frame(HEADERS, END_HEADERS | END_STREAM, 1, peer.block([("x", "y")])))
    assert isinstance(event, DataReceived) and event.ended and event.data == b""
    peer.request(3)
    [event] = peer.feed(frame(HEADERS, END_HEADERS, 3, peer.block([("x", "y")])))
    assert isinstance(event, StreamReset) and event.announced
    assert event.code == ErrorCode.PROTOCOL_ERROR


def test_frames_after_end_stream_reset_the_stream_closed() -> None:
    peer = Peer()
    peer.start()
    peer.request(1, end=True)
    [event] = peer.feed(frame(DATA, 0, 1, b"more"))
    assert isinstance(event, StreamReset) and event.code == ErrorCode.STREAM_CLOSED
    assert peer.resets() == {1: ErrorCode.STREAM_CLOSED}
    assert 1 not in peer.server.streams


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (frame(DATA, 0, 0, b"x"), ErrorCode.PROTOCOL_ERROR),
        (frame(DATA, 0, 9, b"x"), ErrorCode.PROTOCOL_ERROR),  # an idle stream
        (frame(RST_STREAM, 0, 9, u32(8)), ErrorCode.PROTOCOL_ERROR),
        (frame(WINDOW_UPDATE, 0, 9, u32(8)), ErrorCode.PROTOCOL_ERROR),
        (frame(RST_STREAM, 0, 1, b"\x00"), ErrorCode.FRAME_SIZE_ERROR),
        (frame(WINDOW_UPDATE, 0, 0, b"\x00"), ErrorCode.FRAME_SIZE_ERROR),
        (frame(WINDOW_UPDATE, 0, 0, u32(0)), ErrorCode.PROTOCOL_ERROR),
        (frame(WINDOW_UPDATE, 0, 0, u32(MAX := 2**31 - 1)), ErrorCode.FLOW_CONTROL_ERROR),
        (frame(PING, 0, 0, b"1234567"), ErrorCode.FRAME_SIZE_ERROR),
        (frame(PING, 0, 1, b"12345678"), ErrorCode.PROTOCOL_ERROR),
        (frame(GOAWAY, 0, 0, b"1234"), ErrorCode.FRAME_SIZE_ERROR),
        (frame(GOAWAY, 0, 1, b"12345678"), ErrorCode.PROTOCOL_ERROR),
        (frame(PRIORITY, 0, 0, b"12345"), ErrorCode.PROTOCOL_ERROR),
        (frame(PRIORITY, 0, 1, b"1234"), ErrorCode.FRAME_SIZE_ERROR),
        (frame(PUSH_PROMISE, END_HEADERS, 1, u32(2)), ErrorCode.PROTOCOL_ERROR),
        (frame(HEADERS, END_HEADERS, 0, b"\x82"), ErrorCode.PROTOCOL_ERROR),
        (frame(DATA, PADDED, 1, b"\x05abc"), ErrorCode.PROTOCOL_ERROR),  # padding past the end
        (frame(DATA, 0, 1, b"x" * 16385), ErrorCode.FRAME_SIZE_ERROR),
    ],
)
def test_connection_errors_get_goaway_with_their_code(data: bytes, code: ErrorCode) -> None:
    peer = Peer()
    peer.start()
    peer.request(1)
    assert MAX == 2**31 - 1
    assert peer.error(data) == code


def test_ping_is_answered_and_goaway_is_an_event() -> None:
    peer = Peer()
    peer.start()
    assert peer.feed(frame(PING, 0, 0, b"abcdefgh")) == []
    assert peer.out() == [(PING, ACK, 0, b"abcdefgh")]
    assert peer.feed(frame(PING, ACK, 0, b"abcdefgh")) == []
    assert peer.out() == []
    [event] = peer.feed(frame(GOAWAY, 0, 0, u32(7) + u32(ErrorCode.ENHANCE_YOUR_CALM) + b"bye"))
    assert isinstance(event, ConnectionTerminated)
    assert (event.code, event.last_stream_id) == (ErrorCode.ENHANCE_YOUR_CALM, 7)


def test_rst_stream_from_the_peer() -> None:
    peer = Peer()
    peer.start()
    peer.request(1)
    [event] = peer.feed(frame(RST_STREAM, 0, 1, u32(ErrorCode.CANCEL)))
    assert isinstance(event, StreamReset) and event.remote and event.code == ErrorCode.CANCEL
    assert peer.server.streams == {}
    assert peer.feed(frame(RST_STREAM, 0, 1, u32(ErrorCode.CANCEL))) == []  # closed: ignored
    assert peer.server.window(1) == 0
    with pytest.raises(StreamClosedError):
        peer.server.send_headers(1, [(":status", "200")])
    peer.server.reset_stream(1)  # nothing: it is closed
    assert peer.out() == []


def test_the_server_resets_a_stream_and_ignores_its_late_frames() -> None:
    peer = Peer()
    peer.start()
    peer.request(1)
    peer.server.reset_stream(1, ErrorCode.NO_ERROR)
    assert peer.resets() == {1: ErrorCode.NO_ERROR}
    assert peer.feed(frame(DATA, 0, 1, b"x" * 100) + frame(WINDOW_UPDATE, 0, 1, u32(5))) == []
    assert peer.out() == []


def test_a_stream_that_depends_on_itself_is_reset() -> None:
    # RFC 9113 5.3.1: a stream error PROTOCOL_ERROR, in HEADERS (its block still decoded: the
    # HPACK table follows the peer's) or in PRIORITY; the connection goes on.
    peer = Peer()
    peer.start()
    block = peer.block([*REQUEST, ("x-new", "indexed")])  # adds to the dynamic table
    [event] = peer.feed(frame(HEADERS, END_HEADERS | PRIORITY_FLAG, 1, u32(1) + b"\x10" + block))
    assert isinstance(event, StreamReset) and event.code == ErrorCode.PROTOCOL_ERROR
    assert not event.announced and peer.resets() == {1: ErrorCode.PROTOCOL_ERROR}
    [event] = peer.feed(frame(PRIORITY, 0, 5, u32(5) + b"\x10"))
    assert isinstance(event, StreamReset) and peer.resets() == {5: ErrorCode.PROTOCOL_ERROR}
    # Split over CONTINUATION too; and a dependency on another stream is fine.
    block = peer.block([*REQUEST, ("x-new", "indexed")])
    head = frame(HEADERS, PRIORITY_FLAG, 7, u32(0x80000007) + b"\x10" + block[:2])
    [event] = peer.feed(head + frame(CONTINUATION, END_HEADERS, 7, block[2:]))
    assert isinstance(event, StreamReset) and event.code == ErrorCode.PROTOCOL_ERROR
    [event] = peer.feed(
        frame(HEADERS, END_HEADERS | PRIORITY_FLAG, 9, u32(1) + b"\x10" + peer.block())
    )
    assert isinstance(event, RequestReceived) and event.headers["x-mq-client-id"] == "c1"
    assert peer.feed(frame(PRIORITY, 0, 9, u32(7) + b"\x10")) == []


def test_trailers_with_a_pseudo_header_reset_the_stream() -> None:
    # RFC 9113 8.1: trailers hold no pseudo-header: malformed, a stream error.
    peer = Peer()
    peer.start()
    peer.request(1)
    [event] = peer.feed(frame(HEADERS, END_HEADERS | END_STREAM, 1, peer.block([(":path", "/x")])))
    assert isinstance(event, StreamReset) and event.announced
    assert peer.resets() == {1: ErrorCode.PROTOCOL_ERROR}
    peer.request(3)
    [event] = peer.feed(frame(HEADERS, END_HEADERS | END_STREAM, 3, peer.block([("x-t", "1")])))
    assert isinstance(event, DataReceived) and event.ended


# -- max concurrent streams -----------------------------------------------------------------


def test_streams_past_the_limit_refused_then_the_connection_closed() -> None:
    peer = Peer(max_concurrent_streams=2)
    peer.start(ack=False)  # the client has not acknowledged the server's limit yet
    peer.request(1)
    peer.request(3)
    [event] = peer.request(5)
    assert isinstance(event, StreamReset) and event.code == ErrorCode.REFUSED_STREAM
    assert peer.resets() == {5: ErrorCode.REFUSED_STREAM}
    # A stream that ends frees its place.
    peer.feed(frame(RST_STREAM, 0, 1, u32(ErrorCode.CANCEL)))
    [event] = peer.request(7)
    assert isinstance(event, RequestReceived)
    peer.feed(frame(SETTINGS, ACK, 0))  # now the client knows: one more breaks the protocol
    block = peer.block()
    assert peer.error(frame(HEADERS, END_HEADERS, 9, block)) == ErrorCode.PROTOCOL_ERROR


def test_thousands_of_streams_opened_and_closed_leave_nothing_behind() -> None:
    peer = Peer(max_concurrent_streams=10)
    peer.start()
    for sid in range(1, 20001, 2):
        peer.request(sid, end=True)
        peer.server.send_headers(sid, [(":status", "200")], end_stream=True)
        if sid % 3 == 0:
            peer.feed(frame(RST_STREAM, 0, sid, u32(0)))
    assert peer.server.streams == {}
    assert len(peer.server._reset) <= H2Server.RESET_MEMORY
    peer.out()


# -- floods: work or state a peer forces without end -----------------------------------------


def test_rapid_reset_loses_the_connection() -> None:
    # CVE-2023-44487: HEADERS then RST_STREAM, again and again, never waiting for an answer
    # (and never past SETTINGS_MAX_CONCURRENT_STREAMS).  The server may take a burst of them.
    peer = Peer()
    peer.start()
    sid = 1
    for _ in range(H2Server.RESET_BURST):
        events = peer.request(sid) + peer.feed(frame(RST_STREAM, 0, sid, u32(ErrorCode.CANCEL)))
        assert [type(e) for e in events] == [RequestReceived, StreamReset]
        sid += 2
    peer.request(sid)
    code = peer.error(frame(RST_STREAM, 0, sid, u32(ErrorCode.CANCEL)))
    assert code == ErrorCode.ENHANCE_YOUR_CALM


def test_streams_reset_for_the_peers_errors_count_as_its_resets() -> None:
    # A stream error of the peer's making (here a malformed request) is a reset too.
    peer = Peer()
    peer.start()
    bad = [*REQUEST[:2], ("connection", "close"), *REQUEST[2:]]
    for k in range(H2Server.RESET_BURST):
        [event] = peer.request(2 * k + 1, headers=bad)
        assert isinstance(event, StreamReset) and event.code == ErrorCode.PROTOCOL_ERROR
    block = peer.block(bad)
    code = peer.error(frame(HEADERS, END_HEADERS, 2 * H2Server.RESET_BURST + 1, block))
    assert code == ErrorCode.ENHANCE_YOUR_CALM


def test_a_client_that_cancels_some_calls_keeps_its_connection() -> None:
    # Each stream the server ends allows one more reset: a client whose calls are answered may
    # cancel as many others, however long it runs.
    peer = Peer()
    peer.start()
    for k in range(10 * H2Server.RESET_BURST):
        answered, cancelled = 4 * k + 1, 4 * k + 3
        peer.request(answered, end=True)
        peer.request(cancelled)
        peer.server.send_headers(answered, [(":status", "200")], end_stream=True)
        peer.feed(frame(RST_STREAM, 0, cancelled, u32(ErrorCode.CANCEL)))
        # A reset of a stream the server already ended costs nothing either.
        peer.feed(frame(RST_STREAM, 0, answered, u32(ErrorCode.CANCEL)))
    assert not peer.server.closed and peer.server.streams == {}
    assert not [f for f in peer.out() if f[0] == GOAWAY]


def _open(peer: Peer) -> None:
    peer.request(1)


def _in_block(peer: Peer) -> None:
    peer.feed(frame(HEADERS, 0, 1, peer.block()[:2]))


# Frames that carry nothing the server acts on, and what comes before them.
EMPTY = {
    "DATA": (_open, frame(DATA, 0, 1)),
    "padding-only DATA": (_open, frame(DATA, PADDED, 1, b"\x03abc")),
    "CONTINUATION": (_in_block, frame(CONTINUATION, 0, 1)),
    "PRIORITY": (None, frame(PRIORITY, 0, 3, b"\x00\x00\x00\x01\x10")),
    "unknown type": (None, frame(0x42, 0, 0, b"")),
    "PING ACK": (None, frame(PING, ACK, 0, b"12345678")),
    "SETTINGS ACK": (None, frame(SETTINGS, ACK, 0)),
    "late WINDOW_UPDATE": (_open, frame(WINDOW_UPDATE, 0, 1, u32(1))),
    "late RST_STREAM": (_open, frame(RST_STREAM, 0, 1, u32(0))),
    "DATA after a reset": (_open, frame(DATA, 0, 1)),
}


@pytest.mark.parametrize("name", list(EMPTY))
def test_floods_of_empty_frames_lose_the_connection(name: str) -> None:
    # CVE-2019-9518 (empty frames), CVE-2024-27316's class (CONTINUATION without END_HEADERS,
    # here empty: the block never grows to its size limit), CVE-2019-9516's no-op frames.
    before, flood = EMPTY[name]
    peer = Peer()
    peer.start()
    if before is not None:
        before(peer)
    if name.startswith("late"):
        peer.server.send_headers(1, [(":status", "200")], end_stream=True)
        peer.feed(frame(DATA, END_STREAM, 1, b"x"))  # the stream closes
    elif name.endswith("reset"):
        peer.server.reset_stream(1)
    peer.out()
    peer.feed(flood * H2Server.EMPTY_FRAMES)  # a few are nothing wrong
    assert not peer.server.closed
    assert peer.error(flood) == ErrorCode.ENHANCE_YOUR_CALM


def test_frames_that_carry_something_reset_the_empty_count() -> None:
    peer = Peer()
    peer.start()
    # The bytes of a request the server reset, still in flight in small frames: not empty.
    peer.request(1)
    peer.server.reset_stream(1)
    for _ in range(4):
        peer.feed(frame(DATA, 0, 1, b"x" * 10) * H2Server.EMPTY_FRAMES)
    assert not peer.server.closed
    peer.request(3)
    for k in range(10):
        peer.feed(frame(DATA, 0, 3) * (H2Server.EMPTY_FRAMES - 1) + frame(DATA, 0, 3, b"x"))
        peer.feed(frame(PRIORITY, 0, 3, b"\x00\x00\x00\x00\x10") * (H2Server.EMPTY_FRAMES - 1))
        peer.request(2 * k + 5, end=True)  # a new stream
    assert not peer.server.closed


# -- HPACK state the peer drives -----------------------------------------------------------


def _size_updates(block: bytes) -> list[int]:
    """The dynamic table size updates a header block begins with (its rest must decode)."""
    sizes = []
    while block and block[0] & 0xE0 == 0x20:
        size, used = hpack.hpack.decode_integer(block, 5)
        sizes.append(size)
        block = block[used:]
    hpack.Decoder().decode(block)
    return sizes


def test_header_table_size_settings_flood_stays_two_updates() -> None:
    # Each SETTINGS_HEADER_TABLE_SIZE change was kept by hpack until the next block, which
    # signalled them all: a SETTINGS flood grew a list without end, then a block of megabytes.
    peer = Peer()
    peer.start()
    toggles = b"".join(setting(HEADER_TABLE_SIZE, v) for v in (100, 4096, 0, 4096) * 682)
    for _ in range(100):
        peer.feed(frame(SETTINGS, 0, 0, toggles))
    assert len(peer.server.encoder.table_size_changes) <= 2
    peer.request(1)
    peer.out()
    peer.server.send_headers(1, [(":status", "200")])
    [(ftype, _, _, block)] = peer.out()
    assert ftype == HEADERS
    assert _size_updates(block) == [0, 4096]  # the smallest, then the last (RFC 7541 4.2)
    peer.decoder.decode(block)


def test_a_table_size_set_twice_is_still_signalled() -> None:
    # hpack forgot a pending size update when the same size was set again: the peer's decoder,
    # told SETTINGS_HEADER_TABLE_SIZE 0, expects the update in the next block (7541 4.2).
    peer = Peer()
    peer.start(setting(HEADER_TABLE_SIZE, 0) + setting(HEADER_TABLE_SIZE, 0))
    peer.request(1)
    peer.server.send_headers(1, [(":status", "200"), ("grpc-message", "kept?")])
    [(_, _, _, block)] = peer.out()
    assert _size_updates(block) == [0]


def test_the_encoders_table_stays_within_its_own_bound() -> None:
    # A peer allowing a table of 4 GiB let the server's encoder keep every header it sent
    # (a grpc-message naming the client's path: content the client chooses) for ever.
    peer = Peer()
    peer.start(setting(HEADER_TABLE_SIZE, 2**32 - 1))
    decoder = hpack.Decoder()
    decoder.max_allowed_table_size = 2**32 - 1
    for k in range(200):
        sid = 2 * k + 1
        peer.request(sid, end=True)
        message = f"Method not found: {k}" + "x" * 1000
        headers = [(":status", "200"), ("grpc-message", message)]
        peer.server.send_headers(sid, headers, end_stream=True)
        [(_, _, _, block)] = [f for f in peer.out() if f[0] == HEADERS]
        assert decoder.decode(block) == headers
    held = sum(len(n) + len(v) + 32 for n, v in decoder.header_table.dynamic_entries)
    assert held <= H2Server.ENCODER_TABLE_SIZE


# -- flow control ----------------------------------------------------------------------------


def test_received_data_is_handed_back_after_half_a_window() -> None:
    window = 1 << 16
    peer = Peer(initial_window_size=window)
    peer.start()
    peer.request(1)
    chunk = b"x" * 16000
    peer.feed(frame(DATA, 0, 1, chunk))
    assert peer.out() == []
    peer.feed(frame(DATA, 0, 1, chunk) + frame(DATA, 0, 1, chunk))
    updates = {f[2]: int.from_bytes(f[3], "big") for f in peer.out() if f[0] == WINDOW_UPDATE}
    assert updates == {1: 48000, 0: 48000}
    # The windows were handed back: a stream may be sent its whole window again.
    peer.feed(frame(DATA, 0, 1, chunk) * 4)
    peer.out()


def test_data_past_the_windows() -> None:
    peer = Peer(initial_window_size=100)
    peer.start()
    peer.request(1)
    peer.feed(frame(DATA, 0, 1, b"x" * 60))  # handed back (over half the window)
    assert peer.resets() == {}
    [event] = peer.feed(frame(DATA, 0, 1, b"x" * 101))  # past the stream's 100
    assert isinstance(event, StreamReset) and event.code == ErrorCode.FLOW_CONTROL_ERROR
    assert peer.resets() == {1: ErrorCode.FLOW_CONTROL_ERROR}
    # The connection's window is the default 65535 (not raised for a smaller stream window).
    peer.request(3)
    data = b"".join(frame(DATA, 0, 3, b"x" * 16384) for _ in range(4))
    assert peer.error(data) == ErrorCode.FLOW_CONTROL_ERROR


def test_send_data_keeps_the_windows_and_the_frame_size() -> None:
    peer = Peer()
    peer.start(setting(INITIAL_WINDOW_SIZE, 40000))
    peer.request(1, end=True)
    peer.server.send_headers(1, [(":status", "200")])
    peer.out()
    body = bytes(range(256)) * 400  # 102,400 bytes
    sent = peer.server.send_data(1, body, end_stream=True)
    assert sent == 40000
    out = peer.out()
    assert [len(f[3]) for f in out] == [16384, 16384, 40000 - 2 * 16384]
    assert all(f[0] == DATA and f[1] == 0 for f in out)  # not ended: not all of it went
    assert peer.server.send_data(1, body[sent:]) == 0
    assert peer.server.window(1) == 0
    # The stream's window opens; the connection's (65535) then limits.
    [event] = peer.feed(frame(WINDOW_UPDATE, 0, 1, u32(100000)))
    assert isinstance(event, WindowOpened)
    assert peer.server.window(1) == DEFAULT_WINDOW - 40000
    sent += peer.server.send_data(1, body[sent:], end_stream=True)
    assert sent == DEFAULT_WINDOW
    peer.out()
    [event] = peer.feed(frame(WINDOW_UPDATE, 0, 0, u32(1 << 20)))
    assert isinstance(event, WindowOpened)
    assert peer.server.send_data(1, body[sent:], end_stream=True) == len(body) - sent
    out = peer.out()
    assert out[-1][1] == END_STREAM and b"".join(f[3] for f in out) == body[DEFAULT_WINDOW:]
    assert peer.server.streams == {}


def test_a_new_initial_window_moves_open_streams_windows() -> None:
    peer = Peer()
    peer.start(setting(INITIAL_WINDOW_SIZE, 10))
    peer.request(1, end=True)
    peer.server.send_headers(1, [(":status", "200")])
    assert peer.server.send_data(1, b"x" * 30) == 10
    assert peer.server.window(1) == 0
    [event] = peer.feed(frame(SETTINGS, 0, 0, setting(INITIAL_WINDOW_SIZE, 25)))
    assert isinstance(event, WindowOpened)
    assert peer.server.window(1) == 15
    assert peer.feed(frame(SETTINGS, 0, 0, setting(INITIAL_WINDOW_SIZE, 0))) == []
    assert peer.server.window(1) == 0  # may go negative (RFC 9113 6.9.2): nothing to send
    assert peer.server.send_data(1, b"x") == 0
    # A window past 2**31-1 by a WINDOW_UPDATE is the stream's error.
    updates = frame(WINDOW_UPDATE, 0, 1, u32(2**31 - 1)) + frame(WINDOW_UPDATE, 0, 1, u32(20))
    opened, event = peer.feed(updates)
    assert isinstance(opened, WindowOpened)
    assert isinstance(event, StreamReset) and event.code == ErrorCode.FLOW_CONTROL_ERROR


def test_large_header_blocks_are_sent_in_continuations() -> None:
    peer = Peer()
    peer.start()
    peer.request(1, end=True)
    headers = [(":status", "200"), ("x-long", "v" * 40000)]
    peer.server.send_headers(1, headers, end_stream=True)
    out = peer.out()
    assert [(f[0], f[1]) for f in out] == [
        (HEADERS, END_STREAM),
        (CONTINUATION, 0),
        (CONTINUATION, END_HEADERS),
    ]
    assert peer.decoder.decode(b"".join(f[3] for f in out)) == headers


# -- h2's client talking to it ---------------------------------------------------------------


def test_h2s_client_exchanges_a_large_request_and_response() -> None:
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 30000})
    server = H2Server(initial_window_size=1 << 16)
    received = bytearray()
    answer = bytes(range(256)) * 1000
    answered = 0
    request = bytes(range(256)) * 800
    sent = 0
    got = bytearray()
    ended = False
    client_events: list[Any] = []
    sid = client.get_next_available_stream_id()
    client.send_headers(sid, REQUEST)
    for _ in range(1000):
        if sent < len(request):
            room = min(
                client.local_flow_control_window(sid),
                client.max_outbound_frame_size,
                len(request) - sent,
            )
            if room > 0:
                client.send_data(
                    sid, request[sent : sent + room], end_stream=sent + room == len(request)
                )
                sent += room
        for event in server.receive(client.data_to_send()):
            if isinstance(event, RequestReceived):
                server.send_headers(event.stream_id, [(":status", "200")])
            elif isinstance(event, DataReceived):
                received += event.data
        if len(received) == len(request) and answered < len(answer):
            answered += server.send_data(sid, answer[answered:], end_stream=True)
        for answer_event in client.receive_data(server.data_to_send()):
            client_events.append(answer_event)
            if isinstance(answer_event, h2.events.DataReceived):
                got += answer_event.data
                client.acknowledge_received_data(answer_event.flow_controlled_length, sid)
            elif isinstance(answer_event, h2.events.StreamEnded):
                ended = True
        if ended:
            break
    assert bytes(received) == request
    assert bytes(got) == answer and ended
    assert not any(isinstance(e, h2.events.ConnectionTerminated) for e in client_events)


# -- fuzz ------------------------------------------------------------------------------------

_TYPES = st.integers(0, 11)
_FLAGS = st.sampled_from([0, 1, 4, 5, 8, 0x20, 0x25, 0x2D, 0xFF])
_SIDS = st.sampled_from([0, 1, 2, 3, 5, 7, 0x7FFFFFFF])


@st.composite
def _frames(draw: Any) -> bytes:
    ftype = draw(_TYPES)
    flags = draw(_FLAGS)
    sid = draw(_SIDS)
    if ftype in (HEADERS, CONTINUATION) and draw(st.booleans()):
        payload = bytes(hpack.Encoder().encode(REQUEST))
        if draw(st.booleans()):
            payload = payload[: draw(st.integers(0, len(payload)))]
    else:
        payload = draw(st.binary(max_size=40))
    return frame(ftype, flags, sid, payload)


def _conversation() -> bytes:
    """A valid conversation (to be mutated)."""
    encoder = hpack.Encoder()
    block = encoder.encode(REQUEST)
    return (
        PREFACE
        + frame(SETTINGS, 0, 0, setting(INITIAL_WINDOW_SIZE, 100))
        + frame(SETTINGS, ACK, 0)
        + frame(HEADERS, 0, 1, block[:5])
        + frame(CONTINUATION, END_HEADERS, 1, block[5:])
        + frame(DATA, 0, 1, b"\x00\x00\x00\x00\x03abc")
        + frame(WINDOW_UPDATE, 0, 1, u32(10))
        + frame(HEADERS, END_HEADERS | END_STREAM, 3, encoder.encode(REQUEST))
        + frame(PING, 0, 0, b"12345678")
        + frame(RST_STREAM, 0, 1, u32(8))
        + frame(GOAWAY, 0, 0, u32(3) + u32(0))
    )


def _drive(data: bytes, cuts: list[int]) -> None:
    """Feed ``data`` in pieces to a server answering every request: only H2ConnectionError may
    come out, what it writes is whole frames, and after a connection error it reads nothing."""
    server = H2Server(max_concurrent_streams=3, initial_window_size=1000, max_header_list_size=500)
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    written = bytearray(server.data_to_send())
    for start, end in itertools.pairwise(bounds):
        try:
            events = server.receive(data[start:end])
        except H2ConnectionError as exc:
            assert isinstance(exc.code, ErrorCode)
            assert server.closed
            assert server.receive(b"\x00" * 9) == []
            written += server.data_to_send()
            break
        for event in events:
            if isinstance(event, RequestReceived) and event.stream_id in server.streams:
                server.send_headers(event.stream_id, [(":status", "200")])
                server.send_data(event.stream_id, b"answer" * 50)
                server.send_headers(event.stream_id, [("grpc-status", "0")], end_stream=True)
                server.reset_stream(event.stream_id, ErrorCode.NO_ERROR)
        written += server.data_to_send()
        assert len(server.streams) <= 3
    frames(bytes(written))
    assert len(written) < 64 * 1024 + 2 * len(data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_frames(), max_size=12), st.lists(st.integers(0, 10**6), max_size=4))
def test_fuzz_random_frames_give_clean_errors(body: list[bytes], cuts: list[int]) -> None:
    start = PREFACE + frame(SETTINGS, 0, 0)
    _drive(start + b"".join(body), cuts)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=6),
    st.lists(st.integers(0, 10**6), max_size=4),
)
def test_fuzz_mutated_conversations_give_clean_errors(
    mutations: list[tuple[int, int]], cuts: list[int]
) -> None:
    data = bytearray(_conversation())
    for where, value in mutations:
        data[len(PREFACE) + where % (len(data) - len(PREFACE))] = value
    _drive(bytes(data), cuts)
