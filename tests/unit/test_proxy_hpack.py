"""The gRPC server's HPACK decoder (pymq.proxy.http2._Decoder): a block ending in plain literals
(what the official 5.x clients repeat on every call) is read without hpack's general decoder,
and must mean exactly what hpack makes of it, for any block: the same headers, the same
dynamic table after it, the same errors (a truncated block, a list over the size limit, bad
UTF-8)."""

from __future__ import annotations

import random
from typing import Any

import hpack
import pytest

from pymq.proxy.h2server import (
    ACK,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PREFACE,
    SETTINGS,
    ErrorCode,
    H2ConnectionError,
    H2Server,
    RequestReceived,
    frame,
)
from pymq.proxy.http2 import _Decoder, _Encoder, _plain_tail


def plain(name: bytes, value: bytes) -> bytes:
    """A literal without indexing, its name literal too, neither Huffman coded."""
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


METADATA = [
    (b"x-mq-language", b"PYTHON"),
    (b"x-mq-request-id", b"c10af03c-11ed-4f17-85fa-2cf50de32307"),
    (b"x-mq-namespace", b""),
    (b"authorization", b"MQv2-HMAC-SHA1 Credential=ak, Signature=f717"),
]
REQUEST = [
    (b":method", b"POST"),
    (b":path", b"/apache.rocketmq.v2.MessagingService/SendMessage"),
    (b"content-type", b"application/grpc"),
    (b"grpc-timeout", b"3010m"),
]


def both(
    block: bytes, reference: hpack.Decoder, ours: _Decoder, raw: bool = True
) -> tuple[str, Any]:
    """What hpack's decoder and ours make of ``block`` (each with its own table), compared:
    the same headers or the same error, and the same dynamic table after."""
    outcomes: list[tuple[str, Any]] = []
    for decoder in (reference, ours):
        try:
            outcomes.append(("ok", [tuple(h) for h in decoder.decode(block, raw=raw)]))
        except Exception as exc:
            outcomes.append(("error", type(exc)))
    assert outcomes[0] == outcomes[1]
    assert list(reference.header_table.dynamic_entries) == list(ours.header_table.dynamic_entries)
    return outcomes[0]


def test_a_grpc_clients_block_is_split_and_read_alike() -> None:
    encoder = hpack.Encoder()
    reference, ours = hpack.Decoder(), _Decoder()
    as_text = hpack.Decoder(), _Decoder()  # the same blocks, decoded to str
    for call in range(5):
        head = encoder.encode(REQUEST)  # indexed after the first call
        block = head + b"".join(plain(n, v + str(call).encode()) for n, v in METADATA)
        walked = _plain_tail(block)
        assert walked is not None and walked[0][0] == len(head)
        assert walked[1] == (call > 0)  # the first call's head adds to the table
        kind, headers = both(block, reference, ours)
        assert kind == "ok" and len(headers) == len(REQUEST) + len(METADATA)
        kind, _ = both(block, *as_text, raw=False)
        assert kind == "ok"


def test_blocks_it_cannot_split_go_to_hpack_whole() -> None:
    encoder = hpack.Encoder()
    head = encoder.encode(REQUEST)
    assert _plain_tail(head) is None  # no plain literal at its end
    # A plain literal followed by an indexed field: the run does not reach the end.
    assert _plain_tail(plain(b"a", b"b") + b"\x82") is None
    # A Huffman-coded value, a long name: not plain.
    assert _plain_tail(b"\x00\x01a\x81\xff") is None
    assert _plain_tail(b"\x00\x7f\x00" + b"n" * 127 + b"\x01v") is None
    assert _plain_tail(b"") is None


def test_truncated_and_oversized_blocks_fail_as_hpack_fails() -> None:
    block = hpack.Encoder().encode(REQUEST) + b"".join(plain(n, v) for n, v in METADATA)
    for cut in range(1, len(block)):
        reference, ours = hpack.Decoder(), _Decoder()
        # Both tables start as the encoder's first block left them, then read the cut one.
        both(block[:cut], reference, ours)
    reference, ours = hpack.Decoder(), _Decoder()
    reference.max_header_list_size = ours.max_header_list_size = 300
    kind, error = both(block, reference, ours)
    assert (kind, error) == ("error", hpack.OversizedHeaderListError)
    bad = plain(b"x-bad", b"\xff\xfe")
    kind, error = both(bad, hpack.Decoder(), _Decoder(), raw=False)
    assert (kind, error) == ("error", hpack.HPACKDecodingError)


@pytest.mark.parametrize("seed", range(20))
def test_random_blocks_mean_the_same(seed: int) -> None:
    """Blocks of every representation (indexed, literal with and without indexing, never
    indexed, Huffman or not, table size updates) in random order, followed or not by plain
    literals, some cut short: both decoders agree on each, with tables kept across them."""
    rng = random.Random(seed)
    encoder = hpack.Encoder()
    reference, ours = hpack.Decoder(), _Decoder()
    names = [b"x-a", b"x-b", b"content-type", b":path", b"x-" + b"n" * 130]
    for _ in range(30):
        headers: list[Any] = [
            (rng.choice(names), bytes(rng.randrange(256) for _ in range(rng.randrange(0, 140))))
            for _ in range(rng.randrange(0, 6))
        ]
        if rng.random() < 0.2:
            encoder.header_table_size = rng.choice([0, 256, 4096])
        sensitive = [hpack.NeverIndexedHeaderTuple(*h) for h in headers[:1]]
        block = encoder.encode(headers[1:] + sensitive, huffman=rng.random() < 0.5)
        block += b"".join(
            plain(rng.choice(names)[:20], bytes(rng.randrange(32, 127) for _ in range(10)))
            for _ in range(rng.randrange(0, 4))
        )
        if rng.random() < 0.2:
            block = block[: rng.randrange(len(block) + 1)]
            # A cut block leaves the tables as they were only if both fail alike: compare on
            # fresh decoders so later blocks are not judged on a table the cut left behind.
            both(block, hpack.Decoder(), _Decoder())
            continue
        both(block, reference, ours)


def test_a_kept_head_is_read_again_once_the_table_changed() -> None:
    """The same head bytes mean other headers after a block changed the dynamic table (a
    literal with indexing, a size update): the decoded head kept before is not used."""
    encoder = hpack.Encoder()
    reference, ours = hpack.Decoder(), _Decoder()
    tail = plain(b"x-mq-language", b"PYTHON")
    first = encoder.encode([(b"x-one", b"1")])  # added to the table: index 62
    both(first + tail, reference, ours)
    head = bytes([0x80 | 62])  # "the newest entry"
    assert both(head + tail, reference, ours)[1][0] == (b"x-one", b"1")
    assert both(head + tail, reference, ours)[1][0] == (b"x-one", b"1")  # kept, same table
    second = encoder.encode([(b"x-two", b"2")])  # now index 62 is x-two
    both(second + tail, reference, ours)
    assert both(head + tail, reference, ours)[1][0] == (b"x-two", b"2")
    # A size update (to nothing: the table emptied): index 62 is no more.
    assert both(bytes([0x20]) + tail, reference, ours)[0] == "ok"
    assert both(head + tail, reference, ours) == ("error", hpack.InvalidTableIndex)
    # A block hpack reads whole (no plain tail) may change the table too: this one sizes it
    # up again and adds x-four.
    encoder.header_table_size = 1024
    third = encoder.encode([(b"x-four", b"4")])
    assert _plain_tail(third) is None
    both(third, reference, ours)
    assert both(head + tail, reference, ours)[1][0] == (b"x-four", b"4")


def test_a_block_beginning_with_the_last_head_means_what_hpack_reads() -> None:
    """A block that begins with the bytes of the head split last is walked from the head's
    end: whatever follows (a tail cut anywhere, a field that is not a plain literal, an index
    out of range, a table size update, a malformed Huffman string, nothing at all), both
    decoders agree, from the same table."""
    encoder = hpack.Encoder()
    first = encoder.encode(REQUEST)  # literals with indexing: the table's entries
    head = encoder.encode(REQUEST)  # indexed fields alone, as a client's later calls have it
    tail = b"".join(plain(n, v) for n, v in METADATA)
    at = len(tail) - 1 - len(METADATA[-1][1])
    long_last = tail[:at] + bytes([tail[at] + 1]) + tail[at + 1 :]
    followers = [tail[:cut] for cut in range(len(tail))]
    followers += [
        bytes([0x80 | 70]) + tail,  # an index past the table
        b"\x82" + tail,  # one more indexed field: the head is longer
        bytes([0x20]) + tail,  # a table size update after fields
        bytes([0x3F, 0xE1, 0x1F]) + tail,  # an update past the maximum
        b"\x00\x83\xff\xff\xff\x01v" + tail,  # a name of Huffman code that is no symbol
        b"\x00\x01a\x82\xff\xff" + tail,  # a value's Huffman padding too long
        tail + b"\x82",  # plain literals, then not: no tail
        tail + bytes([0x40, 1]) + b"n" + bytes([1]) + b"v",  # ends with a literal indexed
        # The primed block's length and head: the same layout (other bytes in the values and
        # names), and layouts that differ only where the walk reads.
        b"".join(plain(n.upper(), v.swapcase()) for n, v in METADATA),
        b"".join(plain(n + b"x", v[1:]) for n, v in METADATA),  # lengths moved by one
        b"\x10" + tail[1:],  # the first literal never indexed: hpack reads it, in the head
        long_last,  # the last value's length one past the block's end
    ]
    for follower in followers:
        reference, ours = hpack.Decoder(), _Decoder()
        both(first, reference, ours)
        both(head + tail, reference, ours)
        assert ours._layouts[0].head == head
        both(head + follower, reference, ours)
    # A head that adds to the table (literals with indexing) is read by hpack every time, also
    # when the block begins with it as the last one did: the tables stay alike.
    reference, ours = hpack.Decoder(), _Decoder()
    for _ in range(3):
        both(hpack.Encoder().encode(REQUEST) + tail, reference, ours)


def test_a_kept_head_still_counts_toward_the_size_limit() -> None:
    encoder = hpack.Encoder()
    reference, ours = hpack.Decoder(), _Decoder()
    big = (b"x-big", b"v" * 100)
    tail = plain(b"x-a", b"1")
    both(encoder.encode([big]) + tail, reference, ours)
    head = bytes([0x80 | 62])
    both(head + tail, reference, ours)  # the head kept
    reference.max_header_list_size = ours.max_header_list_size = 150
    assert both(head + tail, reference, ours) == ("error", hpack.OversizedHeaderListError)


RESPONSE = [(b":status", b"200"), (b"content-type", b"application/grpc")]
OK_TRAILERS = [(b"grpc-status", b"0")]


def test_the_encoder_writes_what_hpack_writes_with_blocks_kept() -> None:
    """Byte for byte hpack's blocks, call after call, through table changes: new entries
    (a status message), a table size the peer sets, a sensitive field; the constant lists
    are kept once they are indexed fields alone."""
    reference, ours = hpack.Encoder(), _Encoder()
    decoder = hpack.Decoder()

    def same(headers: list[Any]) -> bytes:
        block = reference.encode(headers)
        assert ours.encode(list(headers)) == block
        assert [tuple(h) for h in decoder.decode(block, raw=True)] == [
            (bytes(n), bytes(v)) for n, v in headers
        ]
        return block

    for call in range(40):
        same(RESPONSE)
        if call % 7 == 3:  # a failure's trailers: a new entry moves every index
            same([(b"grpc-status", b"5"), (b"grpc-message", f"no {call}".encode())])
        elif call % 11 == 5:  # the peer's SETTINGS_HEADER_TABLE_SIZE
            size = 64 if call % 2 else 4096
            reference.header_table_size = ours.header_table_size = size
        elif call == 20:
            same([hpack.NeverIndexedHeaderTuple(b"grpc-status", b"0")])
        same(OK_TRAILERS)
    assert ours._kept  # the constant lists were kept


def test_the_encoder_keeps_only_indexed_blocks() -> None:
    ours = _Encoder()
    first = ours.encode(list(OK_TRAILERS))  # a literal with indexing: added, not kept
    assert not ours._kept
    again = ours.encode(list(OK_TRAILERS))  # now an indexed field: kept
    assert again != first and len(again) == 1 and ours._kept
    assert ours.encode(list(OK_TRAILERS)) is again
    # A field with hpack's third item (sensitive) is encoded by hpack, never kept.
    ours.encode([(*OK_TRAILERS[0], True)])
    assert all(len(field) == 2 for key in ours._kept for field in key[0])


def test_bad_blocks_after_a_repeated_head_close_the_connection_cleanly() -> None:
    """The gRPC server's HTTP/2 layer with these decoders: a client's block repeated (its
    head and tail layout kept), then one of the same head with a broken follower (an index
    past the table, a size update past the maximum, a Huffman string with EOS or padding too
    long, a literal running past the block's end): a COMPRESSION_ERROR connection error,
    GOAWAY queued, nothing else raised."""
    request = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/a")]
    request.append((b":authority", b"h"))
    tail = b"".join(plain(n, v) for n, v in METADATA)
    at = len(tail) - 1 - len(METADATA[-1][1])
    followers = [
        bytes([0x80 | 70]) + tail,
        bytes([0x3F, 0xE1, 0x1F]) + tail,
        b"\x00\x83\xff\xff\xff\x01v" + tail,
        b"\x00\x01a\x82\xff\xff" + tail,
        tail[:at] + bytes([tail[at] + 1]) + tail[at + 1 :],
    ]
    for follower in followers:
        server = H2Server(decoder=_Decoder(), encoder=_Encoder())
        server.receive(PREFACE + frame(SETTINGS, 0, 0) + frame(SETTINGS, ACK, 0))
        encoder = hpack.Encoder()
        for sid in (1, 3, 5):
            block = encoder.encode(request) + tail
            [event] = server.receive(frame(HEADERS, END_HEADERS | END_STREAM, sid, block))
            assert isinstance(event, RequestReceived)
        head = encoder.encode(request)
        with pytest.raises(H2ConnectionError) as caught:
            server.receive(frame(HEADERS, END_HEADERS | END_STREAM, 7, head + follower))
        assert caught.value.code == ErrorCode.COMPRESSION_ERROR
        assert server.closed and GOAWAY in [f[1] for f in _frames(bytes(server.data_to_send()))]


def _frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(length, type, flags, payload) of each frame in ``data``."""
    out = []
    while data:
        length = int.from_bytes(data[:3], "big")
        out.append((length, data[3], data[4], data[9 : 9 + length]))
        data = data[9 + length :]
    return out
