"""The remoting frame codec: both header serializations, streaming, and malformed input."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pymq.remoting.codec import (
    FRAME_MAX_LENGTH,
    RPC_TYPE_RESPONSE,
    FrameDecoder,
    RemotingCommand,
    encode,
    json_command_py,
    json_header_py,
)
from pymq.remoting.codes import LanguageCode, ResponseCode, SerializeType
from pymq.remoting.errors import ProtocolError, RemotingCommandError
from tests.helpers import implementations, mangled

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
ext_fields = st.dictionaries(text, text, max_size=8)


@st.composite
def commands(draw: st.DrawFn, serialize_type: SerializeType) -> RemotingCommand:
    binary = serialize_type == SerializeType.ROCKETMQ
    return RemotingCommand(
        code=draw(st.integers(-(2**15), 2**15 - 1) if binary else st.integers(-(2**31), 2**31 - 1)),
        ext_fields=draw(ext_fields),
        body=draw(st.binary(max_size=300)),
        opaque=draw(st.integers(-(2**31), 2**31 - 1)),
        flag=draw(st.integers(0, 3)),
        # The binary form has no way to tell an empty remark from none.
        remark=draw(st.none() | (text.filter(bool) if binary else text)),
        language=draw(st.sampled_from([c.name for c in LanguageCode])),
        version=draw(st.integers(0, 2**15 - 1)),
        serialize_type=serialize_type,
    )


def decode_all(data: bytes) -> list[RemotingCommand]:
    return FrameDecoder().feed(data)


@given(commands(SerializeType.JSON))
def test_json_header_round_trip(cmd: RemotingCommand) -> None:
    assert decode_all(encode(cmd)) == [cmd]


@given(commands(SerializeType.ROCKETMQ))
def test_binary_header_round_trip(cmd: RemotingCommand) -> None:
    assert decode_all(encode(cmd)) == [cmd]


@given(st.lists(commands(SerializeType.JSON) | commands(SerializeType.ROCKETMQ), max_size=4))
def test_stream_cut_anywhere_decodes_the_same(cmds: list[RemotingCommand]) -> None:
    stream = b"".join(encode(c) for c in cmds)
    for cut in range(len(stream) + 1):
        decoder = FrameDecoder()
        got = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:])
        assert got == cmds
        assert decoder.buffered == 0


def test_byte_by_byte_feeding() -> None:
    cmds = [
        RemotingCommand(code=105, ext_fields={"topic": "TopicTest"}, opaque=i, body=b"x" * i)
        for i in range(3)
    ]
    decoder = FrameDecoder()
    got: list[RemotingCommand] = []
    for byte in b"".join(encode(c) for c in cmds):
        got += decoder.feed(bytes([byte]))
    assert got == cmds


def test_frame_layout_is_big_endian_with_type_in_top_byte() -> None:
    cmd = RemotingCommand(code=10, body=b"hello", serialize_type=SerializeType.ROCKETMQ)
    frame = encode(cmd)
    length, field = struct.unpack(">ii", frame[:8])
    assert length == len(frame) - 4
    assert field >> 24 == 1
    header_len = field & 0xFFFFFF
    assert frame[8 + header_len :] == b"hello"
    # short code | byte language | short version | int opaque | int flag
    assert struct.unpack(">hbhii", frame[8:21]) == (10, 0, cmd.version, 0, 0)


def test_cpp_client_request_is_understood() -> None:
    # What rocketmq-client-cpp 1.2.3 writes: sorted keys, numbers mixed with strings,
    # a trailing newline counted in the header length, and the signature keys.
    header = (
        b'{"code":11,"extFields":{"AccessKey":"","OnsChannel":"ALIYUN","Signature":"x=",'
        b'"commitOffset":"0","consumerGroup":"CID","maxMsgNums":32,"queueId":0,'
        b'"queueOffset":"0","subVersion":"1795310980288","subscription":"*",'
        b'"suspendTimeoutMillis":"15000","sysFlag":6,"topic":"TopicTest","unitMode":true},'
        b'"flag":0,"language":"CPP","opaque":0,"remark":"","version":63}\n'
    )
    frame = struct.pack(">ii", 4 + len(header), len(header)) + header
    [cmd] = decode_all(frame)
    assert cmd.code == 11 and cmd.opaque == 0 and cmd.language == "CPP" and cmd.version == 63
    assert cmd.ext_fields["maxMsgNums"] == "32"
    assert cmd.ext_fields["queueId"] == "0"
    assert cmd.ext_fields["unitMode"] == "true"
    assert cmd.ext_int("sysFlag") == 6
    assert cmd.ext_bool("unitMode") is True
    assert not cmd.is_response and not cmd.is_oneway


def test_response_header_is_what_the_cpp_client_needs() -> None:
    request = RemotingCommand(code=14, opaque=77)
    response = request.response(ext_fields={"offset": 12, "flagged": True})
    frame = encode(response)
    header_len = struct.unpack(">i", frame[4:8])[0]
    header = json.loads(frame[8 : 8 + header_len])
    assert header["opaque"] == 77
    assert header["flag"] & RPC_TYPE_RESPONSE
    assert header["extFields"] == {"offset": "12", "flagged": "true"}  # strings, Java booleans
    empty = encode(request.response(ResponseCode.SUCCESS))
    assert json.loads(empty[8:])["extFields"] == {}  # always present


def test_response_keeps_the_request_serialize_type() -> None:
    request = RemotingCommand(code=14, opaque=5, serialize_type=SerializeType.ROCKETMQ)
    assert request.response().serialize_type == SerializeType.ROCKETMQ


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (struct.pack(">i", -5), "frame length -5"),
        (struct.pack(">i", 0), "frame length 0"),
        (struct.pack(">i", FRAME_MAX_LENGTH + 1), f"frame length {FRAME_MAX_LENGTH + 1}"),
        (struct.pack(">ii", 8, 100) + b"abcd", "header length 100"),
        (struct.pack(">ii", 9, 5) + b"{bad}", "bad JSON header"),
        (struct.pack(">ii", 7, 3) + b"[1]", "not an object"),
        (struct.pack(">ii", 6, (7 << 24) | 2) + b"{}", "unknown serialize type 7"),
        (struct.pack(">ii", 7, (1 << 24) | 3) + b"abc", "bad binary header"),
    ],
)
def test_malformed_frames_are_refused(frame: bytes, reason: str) -> None:
    decoder = FrameDecoder()
    with pytest.raises(ProtocolError, match=reason):
        decoder.feed(frame)
    with pytest.raises(ProtocolError):  # the decoder stays spent
        decoder.feed(encode(RemotingCommand(code=1)))


def test_oversized_frame_is_refused_before_it_arrives() -> None:
    decoder = FrameDecoder(max_frame_length=1024)
    with pytest.raises(ProtocolError):
        decoder.feed(struct.pack(">i", 2048))


def test_missing_or_bad_ext_fields_raise_command_errors() -> None:
    cmd = RemotingCommand(code=105, ext_fields={"queueId": "x"})
    with pytest.raises(RemotingCommandError, match="<topic> is null"):
        cmd.ext_str("topic")
    with pytest.raises(RemotingCommandError, match="not a number"):
        cmd.ext_int("queueId")
    assert cmd.ext_int("missing", -1) == -1
    assert cmd.ext_str("missing", None) is None


def test_request_normalises_values_like_java() -> None:
    req = RemotingCommand.request(30, {"topic": "T", "queueId": 3, "compressed": False, "x": None})
    assert req.ext_fields == {"topic": "T", "queueId": "3", "compressed": "false"}


def test_large_frame_in_pieces_is_kept_once_and_decoded_whole() -> None:
    big = RemotingCommand.request(10, {"k": "v"}, b"\x01" * (1 << 20))
    small = RemotingCommand.request(11, {"n": "2"}, b"tail")
    stream = encode(big) + encode(small)
    decoder = FrameDecoder()
    got: list[RemotingCommand] = []
    for start in range(0, len(stream), 1000):
        got += decoder.feed(stream[start : start + 1000])
        if not got:
            assert decoder.buffered == start + len(stream[start : start + 1000])
    assert [c.code for c in got] == [10, 11]
    assert got[0].body == big.body and got[1].body == b"tail"
    assert decoder.buffered == 0


def test_ext_json_is_what_the_json_header_carries() -> None:
    cmd = RemotingCommand.request(10, {"a": "1", "b": "x"})
    plain = encode(cmd)
    cmd.ext_json = '"a":"1","b":"x"'
    assert encode(cmd) == plain
    decoded = FrameDecoder().feed(plain)[0]
    assert decoded.ext_fields == {"a": "1", "b": "x"}


def test_json_header_with_leading_whitespace_is_read() -> None:
    header = b' \n{"code":11,"extFields":{"a":"1"},"flag":0,"opaque":7,"version":1} '
    frame = struct.pack(">ii", 4 + len(header), len(header)) + header
    (cmd,) = FrameDecoder().feed(frame)
    assert (cmd.code, cmd.opaque, cmd.ext_fields) == (11, 7, {"a": "1"})


def json_frame(header: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body


@pytest.mark.parametrize(
    ("header", "problem"),
    [
        (b'{"code":105,"opaque":1,"version":1e999}', "version is not a Java int"),
        (b'{"code":105,"opaque":1,"version":-1e999}', "version is not a Java int"),
        (b'{"code":105,"opaque":1,"flag":1e999}', "flag is not a Java int"),
        (b'{"code":105,"opaque":1,"flag":2147483648}', "flag is not a Java int"),
        (b'{"code":1e999,"opaque":1}', "code is not a Java int"),
        (b'{"code":"105","opaque":1}', "code is not a Java int"),
        (b'{"opaque":1}', "code is not a Java int"),
        (b'{"code":true,"opaque":1}', "code is not a Java int"),
        (b'{"code":105,"opaque":1,"version":NaN}', "version is not a Java int"),
        (b'{"code":105,"opaque":1,"remark":[1]}', "remark is not a string"),
        (b'{"code":105,"opaque":1,"language":7}', "language is not a string"),
        (b'{"code":105,"opaque":1,"extFields":[]}', "extFields is not an object"),
        (b'{"code":105,"opaque":1,"extFields":{"a":{"b":1}}}', "extFields values must be"),
        (b'{"code":105,"opaque":1,"extFields":{"a":[[[[1]]]]}}', "extFields values must be"),
    ],
)
def test_sound_frame_with_a_bad_field_decodes_with_a_header_error(
    header: bytes, problem: str
) -> None:
    """Java's typed decode would refuse these; the frame is sound, so the request is answered
    (SYSTEM_ERROR, with this text) rather than the connection closed."""
    [cmd] = FrameDecoder().feed(json_frame(header))
    assert cmd.opaque == 1
    assert cmd.header_error is not None and problem in cmd.header_error
    assert isinstance(cmd.code, int) and -(2**31) <= cmd.code < 2**31
    assert all(type(v) is str for v in cmd.ext_fields.values())
    encode(cmd.response(ResponseCode.SYSTEM_ERROR, cmd.header_error))  # answerable


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        (b'{"code":105,"opaque":1e999}', "opaque is not a Java int"),
        (b'{"code":105,"opaque":-2147483649}', "opaque is not a Java int"),
        (b'{"code":105,"opaque":"1"}', "opaque is not a Java int"),
        (b'{"code":105,"opaque":1,"extFields":{"a":' + b"[" * 5000 + b"]" * 5000 + b"}}", "JSON"),
        (b"[" * 100_000, "bad JSON header"),
        (b"{" * 100_000, "bad JSON header"),
        (b'{"code":105,"opaque":' + b"9" * 5000 + b"}", "bad JSON header"),
        (b'{"code":105,"opaque":1,"x":"' + b"a" * (2 << 20) + b'"}', "JSON header of"),
    ],
)
def test_unanswerable_or_hostile_headers_close_the_connection(header: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError, match=reason):
        FrameDecoder().feed(json_frame(header))


def test_scalar_ext_values_are_read_as_java_strings() -> None:
    header = b'{"code":105,"opaque":1,"extFields":{"a":1,"b":true,"c":null,"d":"x"}}'
    [cmd] = FrameDecoder().feed(json_frame(header))
    assert cmd.header_error is None
    assert cmd.ext_fields == {"a": "1", "b": "true", "d": "x"}


@given(commands(SerializeType.JSON) | commands(SerializeType.ROCKETMQ))
def test_peek_reads_what_the_decoder_reads(cmd: RemotingCommand) -> None:
    """peek_request, fast failure's look at a frame it may refuse undecoded, agrees with the
    decoder on code, opaque, flag and serialize type."""
    from pymq.remoting.codec import peek_request

    data = encode(cmd)
    decoder = FrameDecoder()
    buf, bounds = decoder.feed_frames(data)
    assert peek_request(buf, bounds[0], bounds[1]) == (
        cmd.code,
        cmd.opaque,
        cmd.flag,
        int(cmd.serialize_type),
    )


def test_peek_reads_java_key_order_too() -> None:
    """Java writes header keys alphabetically: extFields (with the properties) come first."""
    from pymq.remoting.codec import peek_request

    header = (
        b'{"code":310,"extFields":{"a":"g","i":"x\\"opaque\\":9"},"flag":2,'
        b'"language":"JAVA","opaque":41,"serializeTypeCurrentRPC":"JSON","version":401}'
    )
    data = json_frame(header)
    assert peek_request(data, 4, len(data)) == (310, 41, 2, 0)
    odd = json_frame(b'{"language":"JAVA"}')
    assert peek_request(odd, 4, len(odd)) is None  # not readable cheaply: decode it


@pytest.mark.parametrize("serialize_type", [SerializeType.JSON, SerializeType.ROCKETMQ])
def test_busy_answer_is_the_encoded_response(serialize_type: SerializeType) -> None:
    from pymq.remoting.codec import busy_answer

    remark = '[TIMEOUT_CLEAN_QUEUE]broker busy, "quoted" \u00e9'
    expected = RemotingCommand(
        ResponseCode.SYSTEM_BUSY,
        opaque=-7,
        flag=RPC_TYPE_RESPONSE,
        remark=remark,
        serialize_type=serialize_type,
    )
    assert busy_answer(int(serialize_type), -7, remark) == encode(expected)


@given(
    code=st.integers(-(2**31), 2**31 - 1),
    opaque=st.integers(-(2**31), 2**31 - 1),
    ext=st.dictionaries(st.text(max_size=6), st.text(max_size=8), max_size=5),
)
def test_json_response_frame_is_what_encode_writes(code: int, opaque: int, ext: dict) -> None:
    """The send path's pre-encoded answer frame equals encode() of the response command with
    the same extFields members, and reads back as that command."""
    from pymq.remoting.codec import (
        RPC_TYPE_RESPONSE,
        RemotingCommand,
        _json_header,
        decode_frame,
        encode,
        json_response_frame,
    )

    members = _json_header(RemotingCommand(0, ext)).decode()
    members = members[members.index('"extFields":{') + 13 : members.rindex("},")]
    cmd = RemotingCommand(code, ext, b"", opaque, RPC_TYPE_RESPONSE, None)
    frame = json_response_frame(code, opaque, members)
    assert frame == encode(cmd)
    back = decode_frame(frame[4:])
    assert (back.code, back.opaque, back.flag, back.ext_fields) == (code, opaque, 1, ext)


def _frame_of(header: bytes, body: bytes = b"xy") -> bytes:
    """A frame (without its total length) holding ``header`` as a JSON header."""
    return len(header).to_bytes(4, "big") + header + body


_JSON_HEADER_READERS = [
    (header.values[0], command.values[0])
    for header, command in zip(
        implementations("pymq.remoting._codecc", "json_header", json_header_py),
        implementations("pymq.remoting._codecc", "json_command", json_command_py),
        strict=True,
    )
]
"""The plain header's two readers, json_header (from the frame's bytes) and json_command (of
orjson's dict, in the general decoder): C's and their twins (the twins alone under
PYMQ_PURE_PYTHON=1)."""


def _decoded_either_way(header: bytes) -> object:
    """decode_frame of the header and the general decoder alone (_decode_json_header) with each
    pair of _JSON_HEADER_READERS, and json's reading alone (the reference): asserts all give
    the same command or the same refusal, and returns it."""
    from pymq.remoting import codec

    frame = _frame_of(header)

    def fields(cmd: RemotingCommand) -> object:
        # UTF-8 of every text too: a str built with the wrong kind compares equal but is not.
        texts = [cmd.language, cmd.remark or "", *cmd.ext_fields, *cmd.ext_fields.values()]
        utf8 = [t.encode("utf-8", "surrogatepass") for t in texts]
        return (
            attrs.asdict(cmd) | {"body": b"xy"},
            cmd.header_error,
            type(cmd.remark),
            {type(v) for v in cmd.ext_fields.values()},
            utf8,
        )

    def outcome(decode: Callable[[], RemotingCommand]) -> object:
        try:
            return fields(decode())
        except ProtocolError as exc:
            return ("refused", str(exc))

    got = outcome(lambda: codec._checked_command(codec._json_loads(header)))
    picked = codec._json_header_at, codec._json_command
    try:
        for codec._json_header_at, codec._json_command in _JSON_HEADER_READERS:
            assert outcome(lambda: codec.decode_frame(frame)) == got, codec._json_header_at
            assert outcome(lambda: codec._decode_json_header(header)) == got, codec._json_command
    finally:
        codec._json_header_at, codec._json_command = picked
    return got


_header_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6) | (
    st.text(st.sampled_from('"\\/\b\f\n\r\t\x00\x01\x02\x1f é€\U0001f600\ud800'), max_size=4)
)
# What a JSON header's fields may hold: right and wrong types, Java int and long edges, numbers
# past 64 bits (orjson gives floats, json ints), surrogates (orjson refuses them, json keeps
# them), values nested.
_json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**31) - 1, 2**31), st.integers(-(2**70), 2**70),
    st.sampled_from([2**63 - 1, -(2**63) + 1, 2**63, -(2**63), 2**64, -(2**64), 0.5, -0.0, 1e300]),
    st.floats(allow_nan=False), st.text(max_size=8),
)  # fmt: skip
_json_values = st.recursive(
    _json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)
_int32 = st.integers(-(2**31), 2**31 - 1)
_ANY_FIELDS = {
    "code": _int32 | _json_values, "opaque": _int32 | _json_values,
    "flag": st.integers(0, 3) | _json_values, "version": st.integers(0, 500) | _json_values,
    "remark": _json_values | _header_text,
    "language": st.sampled_from(["JAVA", "CPP", "PYTHON", ""]) | _json_values,
    "serializeTypeCurrentRPC": st.just("JSON") | _json_values,
    "extFields": st.none() | _json_values | st.dictionaries(_header_text, _header_text, max_size=5)
    | st.dictionaries(st.text(max_size=4), _json_values, max_size=4),
}  # fmt: skip
# A top level the plain reader takes (the C++ client writes numbers and booleans in extFields).
_SOUND_TOP = {"code": _int32, "opaque": _int32, "language": st.sampled_from(["JAVA", "CPP"])}


@given(
    fields=st.fixed_dictionaries({}, optional=_ANY_FIELDS)
    | st.fixed_dictionaries(
        _SOUND_TOP, optional={k: v for k, v in _ANY_FIELDS.items() if k not in _SOUND_TOP}
    ),
    ensure_ascii=st.booleans(),
    spaced=st.booleans(),
    dup=st.sampled_from([None, "code", "extFields", "language", "remark", "other"]),
)
@settings(max_examples=300)
def test_json_header_reads_frames_as_the_general_decoder(
    fields: dict, ensure_ascii: bool, spaced: bool, dup: str | None
) -> None:
    """The reader of the plain JSON header (codec._json_header_at, C or its twin) gives the
    command, or leaves the header to the general decoder, so that every frame decodes as json
    alone reads it: escapes, non-ASCII and control characters, surrogates, every type (nested
    too) in every field, a sound top level with any extFields, spacing, and members given
    twice."""
    separators = (", ", ": ") if spaced else (",", ":")
    text = json.dumps(fields, ensure_ascii=ensure_ascii, separators=separators)
    if dup is not None and len(text) > 2:
        value = json.dumps(fields.get(dup, 7), ensure_ascii=ensure_ascii)
        text = text[:-1] + ("," if fields else "") + f'"{dup}":{value}' + "}"
    _decoded_either_way(text.encode("utf-8", "surrogatepass"))


SEND_HEADER = (
    b'{"code":310,"extFields":{"a":"G","b":"T\\u00e9","e":"-1","i":"UNIQ_KEY\\u0001A\\u0002'
    b'WAIT\\u0001true\\u0002","n":"1"},"flag":0,"language":"JAVA","opaque":-12,'
    b'"remark":null,"serializeTypeCurrentRPC":"JSON","version":399}'
)


def damaged_send_header(data: st.DataObject) -> bytes:
    """SEND_HEADER damaged by bytes of the JSON grammar."""
    return mangled(data, SEND_HEADER, b'"\\{}[],:-.0e19 \x00\x7f\x80\xc3\xa9tnu')


@given(data=st.data())
@settings(max_examples=300)
def test_json_header_on_damaged_headers(data: st.DataObject) -> None:
    """Sound send headers with bytes changed, cut or added read as json alone reads them: the
    same command, or the same refusal."""
    _decoded_either_way(damaged_send_header(data))


def test_json_header_reads_the_plain_send_header() -> None:
    """The case the plain reader exists for does take it (not only the general decoder)."""
    from pymq.remoting import codec

    header = (
        b'{"code":310,"extFields":{"a":"G","i":"UNIQ_KEY\\u0001A\\u0002"},"flag":0,'
        b'"language":"JAVA","opaque":7,"serializeTypeCurrentRPC":"JSON","version":399}'
    )
    for reader, _ in _JSON_HEADER_READERS:
        cmd = reader(header, 0, len(header), codec.RemotingCommand, 0)
        assert cmd is not None
        assert (cmd.code, cmd.opaque, cmd.version, cmd.language) == (310, 7, 399, "JAVA")
        assert cmd.ext_fields == {"a": "G", "i": "UNIQ_KEY\x01A\x02"}
    assert _decoded_either_way(header)[0]["ext_fields"] == cmd.ext_fields


@pytest.mark.parametrize("reader", [pair[0] for pair in _JSON_HEADER_READERS])
def test_json_header_reads_any_buffer_inside_its_bounds(reader: Callable[..., Any]) -> None:
    """bytes, bytearray and memoryview alike, the command made by the class given; a header
    past the buffer's end or bounds the wrong way round left to the general decoder (None);
    bounds out of range or not ints, a str, no class to make the command: refused."""
    frame, end, json_type = b"xx" + SEND_HEADER + b"body", 2 + len(SEND_HEADER), SerializeType.JSON
    cmd = reader(frame, 2, end, RemotingCommand, json_type)
    assert (cmd.code, cmd.opaque, cmd.version, cmd.ext_fields["b"]) == (310, -12, 399, "T\u00e9")
    for kind in (bytearray, memoryview):
        assert reader(kind(frame), 2, end, RemotingCommand, json_type) == cmd
    assert RemotingCommand(*reader(frame, 2, end, lambda *f: f, json_type)) == cmd
    spaced = memoryview(frame[:end] + b" ")[:end]  # one past its end: JSON's whitespace
    for data, start, stop in ((frame, 2, len(frame) + 1), (bytearray(frame), 2, len(frame) + 1),
                              (frame[:end], 2, end + 1), (spaced, 2, end + 1),
                              (frame, end, 2)):  # fmt: skip
        assert reader(data, start, stop, RemotingCommand, json_type) is None
    for args, raised in (
        ((frame, -1, end, RemotingCommand), OverflowError),
        ((frame, 2, 2**63, RemotingCommand), OverflowError),
        ((frame, "2", end, RemotingCommand), TypeError),
        ((frame.decode(), 2, end, RemotingCommand), TypeError),
        ((frame, 2, end, None), TypeError),
    ):
        with pytest.raises(raised):
            reader(*args, json_type)


JSON_HEADER_EDGES = [
    b'{"code":10,"opaque":1,"language":"JAVA","extFields":{"a":"\\ud800"}}',
    b'{"code":10,"opaque":1,"language":"JAVA","extFields":{"a":18446744073709551616}}',
    b'{"code":18446744073709551616,"opaque":1,"language":"JAVA","extFields":{}}',
    b'{"code":10,"opaque":1,"language":"JAVA","extFields":{"a":"1"}} ',
    b'{"code":10,"opaque":1,"extFields":{"a":"1"}}',
    b'{"code":10,"opaque":1,"language":"JAVA","extFields":{"a":NaN}}',
    b'{"code":10,"opaque":1,"language":"JAVA"} x',
    b'{"code":11,"opaque":2,"language":"CPP","extFields":{"queueId":0,"unitMode":true,'
    b'"x":null,"big":9223372036854775807,"bigger":9223372036854775808}}',
    # Duplicate keys (the last wins, as in json), -0, nulls beside other kinds.
    b'{"code":10,"language":"CPP","extFields":{"a":1,"a":"x","b":true,"b":null}}',
    b'{"code":10,"language":"CPP","extFields":{"a":"x","a":-0,"b":null,"c":false}}',
    b'{"code":10,"language":"CPP","extFields":{"a":-0.0,"b":1}}',
    b'{"code":10,"language":"CPP","extFields":{"a":1},"extFields":{"b":[1]}}',
    b'{"code":10,"language":"CPP","extFields":{"a":-9223372036854775809,"b":1}}',
    b'{"code":2147483648,"language":"JAVA"}',
    b'{"code":-2147483649,"language":"JAVA"}',
    b'{"code":-2147483648,"opaque":2147483647,"language":"JAVA"}',
    b'{"code":10,"opaque":012,"language":"JAVA"}',
    b'{"code":10,"opaque":-0,"language":"JAVA"}',
    b'{"code":10,"opaque":1.0,"language":"JAVA"}',
    b'{"code":10,"opaque":1e2,"language":"JAVA"}',
    b'{"code":10,"opaque":1234567890123456789012,"language":"JAVA"}',
    b'{"code":10,"language":"JAVA","extFields":{"a":"\\ud800"}}',
    b'{"code":10,"language":"JAVA","extFields":{"a":"\\ud83d\\ude00"}}',
    b'{"code":10,"language":"JAVA","extFields":{"a":"\\u00e9\\u20ac\\u0001"}}',
    b'{"code":10,"language":"JAVA","extFields":{"a":"\\b\\f\\n\\r\\t\\/\\\\\\""}}',
    b'{"code":10,"language":"JAVA","extFields":{"a":"\\x"}}',
    b'{"code":10,"language":"JAVA","extFields":{"a":"\\u00G0"}}',
    b'{"code":10,"language":"JAVA","extFields":{"a":"tab\there"}}',
    b'{"code":10,"language":"JAVA","extFields":{"a":"\xc3\xa9"}}',
    b'{"code":10,"language":"JAVA","extFields":{"a":"\xff"}}',
    b'{"code":10,"language":"JAVA","extFields":{"a":"x","a":"y"}}',
    b'{"code":10,"language":"JAVA","extFields":{"a":"x"},"extFields":null}',
    b'{"code":"10","code":10,"language":"JAVA"}',
    b'{"code":10,"language":"JAVA","remark":null}',
    b'{"code":10,"language":"JAVA","remark":"\\u00e9"}',
    b'{"code":10,"language":"JAVA","remark":5}',
    b'{"code":10,"language":""}',
    b'{"code":10}',
    b'{"language":"JAVA"}',
    b'{"code":10,"language":"JAVA","x":[1]}',
    b'{"code":10,"language":"JAVA","x":{"y":1}}',
    b'{"code":10,"language":"JAVA","x":true,"y":false,"z":null,"w":-5,"v":"s"}',
    b'{"code":10,"language":"JAVA","x":tru}',
    b' \n{ "code" : 10 ,\t"language" : "JAVA" } \r\n',
    b'{"code":10,"language":"JAVA"} x',
    b'{"code":10,"language":"JAVA",}',
    b'{"code":10,,"language":"JAVA"}',
    b'{"code":10,"language":"JAVA"',
    b'{"code":10,"language":"JAVA","extFields":{}}',
    b'{"code":10,"language":"JAVA","extFields":{"a":1}}',
    b'{"code":10,"language":"JAVA","extFields":{"a":"1",}}',
    b'{"c\\u006fde":10,"language":"JAVA"}',
    b'{"code":10,"language":"JAVA","extFields":{"\\u0061":"1"}}',
    b'{"code":1,"language":"JAVA","extFields":{"flag":"1","code":"x"},"x":"code"}',
    b'{"code":1,"language":"JAVA","extFields":{"flag":"1"},"flag":2,"flag":3}',
    b'{"code":1,"language":"JAVA","x":1,"x":2,"y":123456789012345678}',
    b'{"code":1,"language":"JAVA","y":1234567890123456789}',
    b'{"code":1,"language":"JAVA","extFields":"x","remark":true}',
    b'{"code":1,"language":"JAVA","opaque":null,"y":{}}',
    b'{"code":1,"language":"JAVA","x":"\\":\\"","y":"\\\\"}',
    b'{"code":1,"language":"JAVA","r\\u0065mark":"\\u0022"}',
    b'{"code":1,"language":"JAVA"}\x0b',
    b'{"code":1,"language":"JAVA","remark":"\\uDC80x"}',
    b'{"code":1,"language":"JAVA","x":"\\udfff"}',
    b'\t{"code" :1 , "language":"J\\u00e9" ,"remark":"\\ud7ff\\ue000"}\r\n',
    b"{}",
    b"[]",
    b"",
    b"5",
    b'"x"',
    b"null",
    b'[{"code":1}]',
    # Strings with escapes: the code points gathered on the stack for a short rest of header
    # (512 bytes), on the heap past it; plain runs around escapes, DEL, a control character or
    # UTF-8 after an escape, a string cut after its backslash.
    b'{"code":1,"language":"JAVA","remark":"a\\u0001' + b"x" * 480 + b'"}',
    b'{"code":1,"language":"JAVA","remark":"a\\u0001' + b"x" * 600 + b'\\n"}',
    b'{"code":1,"language":"JAVA","extFields":{"k":"\\u0041' + b"y" * 520 + b'"}}',
    b'{"code":1,"language":"JAVA","remark":"\\u0041\x7f\x7f~\\\\z"}',
    b'{"code":1,"language":"JAVA","remark":"\\u0041ab\x1fc"}',
    b'{"code":1,"language":"JAVA","remark":"\\u0041ab\xc3\xa9"}',
    b'{"code":1,"language":"JAVA","remark":"ab\\',
    b'{"code":1,"language":"JAVA","remark":"ab\\u00',
    b'{"code":1,"language":"JAVA","x\x7f":"\x7f","remark":"q\\"\x7f"}',
]
"""Headers at the edges of json_header's plain subset."""


@pytest.mark.parametrize("header", JSON_HEADER_EDGES)
def test_json_header_edge_cases(header: bytes) -> None:
    """Headers at the edges of json_header's plain subset read as json alone reads them."""
    _decoded_either_way(header)


_JAVA = "JAVA"


@pytest.mark.parametrize(
    ("header", "fields", "header_error"),
    [
        (
            {"code": 10, "opaque": 3, "flag": 1, "version": 317, "language": "CPP",
             "remark": "r", "extFields": {"a": "1"}},
            (10, {"a": "1"}, 3, 1, "r", "CPP", 317), None,
        ),
        # null version, extFields and language read as absent; an empty language is refused.
        (
            {"code": 10, "opaque": 3, "version": None, "language": "", "extFields": None},
            (10, {}, 3, 0, None, _JAVA, 0), "language is not a string",
        ),
        ({"code": 10, "opaque": 3, "language": None, "remark": None},
         (10, {}, 3, 0, None, _JAVA, 0), None),
        ({"code": 1}, (1, {}, 0, 0, None, _JAVA, 0), None),
        # Scalars in extFields become Java strings; nulls are dropped.
        (
            {"code": 10, "opaque": 3,
             "extFields": {"a": 1, "b": True, "c": None, "d": 1.5, "e": False, "f": "x"}},
            (10, {"a": "1", "b": "true", "d": "1.5", "e": "false", "f": "x"}, 3, 0, None,
             _JAVA, 0), None,
        ),
        # Several bad fields: each is reset, and the first in header order is named.
        (
            {"code": "x", "opaque": 3, "flag": 2.5, "version": "1", "extFields": [1],
             "remark": 5, "language": 7},
            (0, {}, 3, 0, None, _JAVA, 0), "code is not a Java int: 'x'",
        ),
        (
            {"code": 10, "opaque": 3, "flag": 2.5, "version": "1", "extFields": [1],
             "remark": 5, "language": 7},
            (10, {}, 3, 0, None, _JAVA, 0), "flag is not a Java int: 2.5",
        ),
        (
            {"code": 10, "opaque": 3, "version": "1", "extFields": {"a": [1], "b": 2},
             "remark": 5, "language": 7},
            (10, {}, 3, 0, None, _JAVA, 0), "version is not a Java int: '1'",
        ),
        (
            {"code": 10, "opaque": 3, "extFields": {"a": 1, "b": {}}, "remark": 5,
             "language": False},
            (10, {}, 3, 0, None, _JAVA, 0), "extFields values must be strings",
        ),
        ({"code": 10, "opaque": 3, "remark": 5, "language": False},
         (10, {}, 3, 0, None, _JAVA, 0), "remark is not a string"),
        ({"code": 10, "opaque": 3, "language": []},
         (10, {}, 3, 0, None, _JAVA, 0), "language is not a string"),
        ({"code": 10, "opaque": 3, "extFields": "s"},
         (10, {}, 3, 0, None, _JAVA, 0), "extFields is not an object"),
        (
            {"code": 2**31, "opaque": -(2**31), "flag": -(2**31) - 1, "version": 2**31 - 1},
            (0, {}, -(2**31), 0, None, _JAVA, 2**31 - 1), "code is not a Java int: 2147483648",
        ),
        ({"opaque": 3, "code": 1.0}, (0, {}, 3, 0, None, _JAVA, 0), "code is not a Java int: 1.0"),
    ],
)  # fmt: skip
def test_checked_command_reads_every_field_as_java_would(
    header: dict[str, object], fields: tuple[object, ...], header_error: str | None
) -> None:
    """json's path (the reference the fast paths agree with), field by field: the values kept,
    the ones reset, and the one problem named (the first, in the order the fields are read)."""
    from pymq.remoting.codec import _checked_command

    cmd = _checked_command(header)
    got = (cmd.code, cmd.ext_fields, cmd.opaque, cmd.flag, cmd.remark, cmd.language, cmd.version)
    assert got == fields
    assert cmd.header_error == (
        None if header_error is None else f"bad request header: {header_error}"
    )


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        ([1], "JSON header is not an object"),
        (None, "JSON header is not an object"),
        ({"code": 1, "opaque": None}, "JSON header: opaque is not a Java int: None"),
        ({"code": 1, "opaque": True}, "JSON header: opaque is not a Java int: True"),
    ],
)
def test_checked_command_refuses_what_cannot_be_answered(header: object, reason: str) -> None:
    from pymq.remoting.codec import _checked_command

    with pytest.raises(ProtocolError) as info:
        _checked_command(header)
    assert str(info.value) == reason
