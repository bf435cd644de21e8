"""Generators of hostile RocketMQ remoting frames, for the codec and the socket fuzz tests.

Two flavours of the same palette: hypothesis strategies (the codec properties shrink with them)
and functions of a seeded ``random.Random`` (the socket tests, where one server serves every
case and a seed must reproduce the whole run).

Headers are built as JSON *text*, not as Python values, so that they can carry what ``json``
would never write: ``NaN``/``Infinity``/``1e999`` literals, integers past any Java type, lone
surrogate escapes, duplicate keys, nesting thousands of levels deep.
"""

from __future__ import annotations

import json
import random
import struct

from hypothesis import strategies as st

from pymq.remoting.codec import FrameDecoder, RemotingCommand, encode
from pymq.remoting.errors import ProtocolError

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

# The header fields RemotingCommand's JSON form has, and a few it does not.
HEADER_FIELDS = (
    "code",
    "opaque",
    "flag",
    "version",
    "language",
    "remark",
    "extFields",
    "serializeTypeCurrentRPC",
)

# Numbers at and past every edge a Java peer has (short, int, long), and what only Python reads.
NUMBER_LITERALS = (
    "0",
    "-0",
    "1",
    "-1",
    "32767",
    "32768",
    "-32769",
    "65536",
    "2147483647",
    "2147483648",
    "-2147483648",
    "-2147483649",
    "4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "18446744073709551616",
    "1" + "0" * 400,
    "-" + "9" * 4000,
    "9" * 5000,  # past CPython's int-string digit limit
    "1e999",
    "-1e999",
    "1E+400",
    "1e-999",
    "NaN",
    "Infinity",
    "-Infinity",
    "1.5",
    "-0.0",
    "2.147483648E9",
    "1e10",
    "0.1",
)
STRING_LITERALS = (
    '""',
    '"abc"',
    '"\\ud800"',
    '"\\udfff\\ud800"',
    '"a\\u0000b"',
    '"true"',
    '"1e999"',
    '"9223372036854775808"',
    '"-1"',
    '"TopicTest"',
    '" 12 "',
    '"JAVA"',
    '"ROCKETMQ"',
    '"\\"\\\\/\\b\\f\\n\\r\\t"',
)
OTHER_LITERALS = ("null", "true", "false", "[]", "{}", '{"a":"b"}', "[1,2,3]")
LITERALS = NUMBER_LITERALS + STRING_LITERALS + OTHER_LITERALS

# Bytes that make UTF-8 invalid: a lone continuation, a truncated sequence, an encoded
# surrogate, an overlong slash, bytes no UTF-8 has.
BAD_UTF8 = (b"\x80", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xc0\xaf", b"\xff", b"\xfe\xfe")

# Length fields that lie: negative, too small to hold anything, at and past the frame cap.
LYING_LENGTHS = (
    INT32_MIN,
    -1,
    0,
    1,
    3,
    4,
    5,
    16 * 1024 * 1024,
    16 * 1024 * 1024 + 1,
    INT32_MAX,
)


def sampled(values: tuple | list) -> st.SearchStrategy:
    """``sampled_from`` by index: hypothesis would otherwise repr the huge literals."""
    return st.integers(0, len(values) - 1).map(values.__getitem__)


def json_object(members: list[tuple[str, str]]) -> str:
    """An object from (key, value text) pairs; keys may repeat."""
    return "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in members) + "}"


def deep_nesting(depth: int, kind: str, closed: bool = True) -> str:
    if kind == "[":
        return "[" * depth + ("]" * depth if closed else "")
    if kind == "{":
        return '{"a":' * depth + "1" + ("}" * depth if closed else "")
    # alternating, as a real payload would nest
    opens = "".join('[{"a":' if i % 2 else "[" for i in range(depth))
    closes = "".join("}]" if i % 2 else "]" for i in reversed(range(depth)))
    return opens + "1" + (closes if closed else "")


def valid_header_members(code: int = 105, ext: dict[str, str] | None = None) -> list[list]:
    """The members of a sound JSON header, as [key, value text] pairs (mutable)."""
    ext = {"topic": "TopicTest"} if ext is None else ext
    return [
        ["code", str(code)],
        ["language", '"JAVA"'],
        ["version", "399"],
        ["opaque", "7"],
        ["flag", "0"],
        ["extFields", json_object([(k, json.dumps(v)) for k, v in ext.items()])],
        ["serializeTypeCurrentRPC", '"JSON"'],
    ]


def frame(
    header: bytes,
    body: bytes = b"",
    *,
    serialize_type: int = 0,
    header_length: int | None = None,
    length: int | None = None,
) -> bytes:
    """A frame around ``header``; the two length fields are right unless told otherwise."""
    hlen = len(header) if header_length is None else header_length
    total = 4 + len(header) + len(body) if length is None else length
    field = ((serialize_type & 0xFF) << 24) | (hlen & 0xFFFFFF)
    return struct.pack(">iI", total, field) + header + body


def json_frame(members: list[list] | str, body: bytes = b"", **kw: int) -> bytes:
    text = members if isinstance(members, str) else json_object([tuple(m) for m in members])
    return frame(text.encode("utf-8", "surrogatepass"), body, **kw)


def binary_header(
    *,
    code: int = 105,
    language: int = 0,
    version: int = 399,
    opaque: int = 7,
    flag: int = 0,
    remark: bytes | None = None,
    remark_len: int | None = None,
    ext: list[tuple[bytes, bytes]] | None = None,
    ext_len: int | None = None,
    entry_lens: list[tuple[int | None, int | None]] | None = None,
) -> bytes:
    """A ROCKETMQ-serialized header; every length can be made to lie."""
    out = struct.pack(
        ">hbhii",
        _wrap(code, 16),
        _wrap(language, 8),
        _wrap(version, 16),
        _wrap(opaque, 32),
        _wrap(flag, 32),
    )
    remark = remark or b""
    out += struct.pack(">i", len(remark) if remark_len is None else remark_len) + remark
    body = b""
    for i, (k, v) in enumerate(ext or []):
        klen, vlen = (entry_lens[i] if entry_lens and i < len(entry_lens) else (None, None)) or (
            None,
            None,
        )
        body += struct.pack(">h", _wrap(len(k) if klen is None else klen, 16)) + k
        body += struct.pack(">i", _wrap(len(v) if vlen is None else vlen, 32)) + v
    out += struct.pack(">i", len(body) if ext_len is None else _wrap(ext_len, 32)) + body
    return out


def _wrap(value: int, bits: int) -> int:
    """``value`` as the signed ``bits``-bit integer with the same low bits."""
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


# -- the contract -----------------------------------------------------------------------------


def check_command(cmd: RemotingCommand) -> None:
    """What every command the decoder returns must satisfy."""
    assert isinstance(cmd, RemotingCommand), cmd
    for name in ("code", "opaque", "flag", "version"):
        value = getattr(cmd, name)
        assert type(value) is int, f"{name} is {type(value).__name__}: {value!r}"
        assert INT32_MIN <= value <= INT32_MAX, f"{name} {value} outside int32"
    assert type(cmd.ext_fields) is dict
    for key, value in cmd.ext_fields.items():
        assert type(key) is str, f"extFields key {key!r}"
        assert type(value) is str, f"extFields[{key!r}] is {type(value).__name__}: {value!r}"
    assert cmd.remark is None or type(cmd.remark) is str, f"remark {cmd.remark!r}"
    assert type(cmd.language) is str, f"language {cmd.language!r}"
    assert isinstance(cmd.body, bytes | bytearray)
    encode(cmd)  # must not raise


def feed_checked(data: bytes, *, chunk: int | None = None) -> list[RemotingCommand] | None:
    """Feed ``data`` to a fresh decoder (whole, or in ``chunk``-byte pieces): the commands it
    returned (each checked), or None when it refused the input with ProtocolError.  Any other
    exception propagates: that is the failure these tests look for."""
    decoder = FrameDecoder()
    out: list[RemotingCommand] = []
    try:
        if chunk is None:
            out = decoder.feed(data)
        else:
            for i in range(0, len(data), chunk):
                out += decoder.feed(data[i : i + chunk])
    except ProtocolError:
        # A spent decoder stays spent.
        try:
            decoder.feed(b"\x00\x00\x00\x04\x00\x00\x00\x00")
        except ProtocolError:
            pass
        else:
            raise AssertionError("the decoder accepted input after a ProtocolError") from None
        for cmd in out:
            check_command(cmd)
        return None
    for cmd in out:
        check_command(cmd)
    return out


# -- hypothesis strategies --------------------------------------------------------------------

_keys = sampled(["topic", "a", "b", "queueId", "", "k" * 300, "\ud800", "code", "extFields"])
_keys |= st.text(max_size=8)

json_scalars = st.one_of(
    sampled(LITERALS),
    st.integers().map(str),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats().map(json.dumps),  # NaN, Infinity and -Infinity included
    st.text(max_size=12).map(json.dumps),
    st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=3).map(json.dumps),
    st.text(max_size=12).map(lambda s: json.dumps(s, ensure_ascii=False)),
)

# What a numeric field (code, opaque, flag, version) gets most often: numbers at and past the
# edges, and the same as strings.
number_texts = st.one_of(
    sampled(NUMBER_LITERALS),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats().map(json.dumps),
    sampled(NUMBER_LITERALS[:20]).map(lambda n: f'"{n}"'),
)
NUMERIC_FIELDS = ("code", "opaque", "flag", "version")

json_values = st.recursive(
    json_scalars,
    lambda kids: st.one_of(
        st.lists(kids, max_size=4).map(lambda xs: "[" + ",".join(xs) + "]"),
        st.lists(st.tuples(_keys, kids), max_size=4).map(json_object),
    ),
    max_leaves=12,
)

deep_values = st.builds(
    deep_nesting,
    st.integers(min_value=500, max_value=10_000),
    st.sampled_from(["[", "{", "mixed"]),
    st.booleans(),
)


def _ext_objects(values: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """An extFields value: an object whose values are drawn from ``values``."""
    return st.lists(st.tuples(_keys, values), max_size=5).map(json_object)


@st.composite
def json_header_texts(draw: st.DrawFn, deep: bool = False) -> str:
    """A JSON header: sound, with some fields replaced, removed, repeated or added.

    ``deep``: the replacing values may nest thousands of levels deep."""
    values = json_values | deep_values if deep else json_values
    ext_objects = _ext_objects(values)
    field_values = st.one_of(values, ext_objects)
    kind = draw(st.integers(0, 9))
    if kind == 0:  # not an object at all, or an object of anything
        return draw(field_values)
    members = valid_header_members(draw(st.sampled_from([10, 11, 34, 105, 310])))
    for _ in range(draw(st.integers(1, 4))):
        action = draw(st.integers(0, 5))
        if action <= 2:  # replace a field's value
            i = draw(st.integers(0, len(members) - 1))
            name = members[i][0]
            if name == "extFields":
                members[i][1] = draw(ext_objects)
            elif name in NUMERIC_FIELDS:
                members[i][1] = draw(number_texts | field_values)
            else:
                members[i][1] = draw(field_values)
        elif action == 3 and members:  # drop a field
            members.pop(draw(st.integers(0, len(members) - 1)))
        elif action == 4:  # repeat or add a field
            name = draw(st.sampled_from(HEADER_FIELDS) | st.text(max_size=6))
            members.append([name, draw(field_values)])
        else:  # an extFields of anything
            members = [m for m in members if m[0] != "extFields"]
            members.append(["extFields", draw(ext_objects)])
        if not members:
            break
    return json_object([tuple(m) for m in members])


@st.composite
def json_header_bytes(draw: st.DrawFn, deep: bool = False) -> bytes:
    data = draw(json_header_texts(deep)).encode("utf-8", "surrogatepass")
    if draw(st.integers(0, 14)) == 0:  # invalid UTF-8 spliced in somewhere
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(sampled(BAD_UTF8)) + data[at:]
    if draw(st.integers(0, 29)) == 0:  # leading or trailing junk
        data = draw(st.sampled_from([b" ", b"\n", b"\x00", b"x", b"{}"])) + data
    if draw(st.integers(0, 29)) == 0:
        data = data + draw(st.sampled_from([b" ", b"\x00", b"}", b"{}", b"\xff"]))
    return data


_lengths = st.one_of(
    st.none(),
    sampled(LYING_LENGTHS),
    st.integers(INT32_MIN, INT32_MAX),
    st.integers(-8, 8),  # marks an offset from the truth, see frames_of
)


@st.composite
def frames_of(draw: st.DrawFn, headers: st.SearchStrategy[bytes], serialize_type: int) -> bytes:
    """A frame around a drawn header, its length fields mostly right, sometimes lying."""
    header = draw(headers)
    body = draw(st.binary(max_size=40))
    stype = serialize_type if draw(st.integers(0, 19)) else draw(st.integers(0, 255))
    true_hlen, true_len = len(header), 4 + len(header) + len(body)
    hlen = len_ = None
    if draw(st.integers(0, 11)) == 0:
        hlen = draw(st.integers(0, 0xFFFFFF) | st.integers(true_hlen - 4, true_hlen + 4))
    if draw(st.integers(0, 11)) == 0:
        lie = draw(_lengths)
        len_ = true_len + lie if lie is not None and -8 <= lie <= 8 else lie
    data = frame(header, body, serialize_type=stype, header_length=hlen, length=len_)
    if draw(st.integers(0, 14)) == 0:  # cut short
        data = data[: draw(st.integers(0, len(data)))]
    return data


_bin_bytes = st.binary(max_size=12) | sampled(BAD_UTF8) | st.just("\u00e9".encode())
_maybe_lie = st.none() | st.integers(-(2**15), 2**15 - 1) | sampled(LYING_LENGTHS)


@st.composite
def binary_header_bytes(draw: st.DrawFn) -> bytes:
    """ROCKETMQ headers whose fields take any value and whose lengths may lie."""
    ext = draw(st.lists(st.tuples(_bin_bytes, _bin_bytes), max_size=4))
    lies = draw(st.lists(st.tuples(_maybe_lie, _maybe_lie), max_size=len(ext)))
    data = binary_header(
        code=draw(st.integers(-(2**15), 2**15 - 1)),
        language=draw(st.integers(0, 255)),
        version=draw(st.integers(-(2**15), 2**15 - 1)),
        opaque=draw(st.integers(INT32_MIN, INT32_MAX)),
        flag=draw(st.integers(INT32_MIN, INT32_MAX)),
        remark=draw(st.none() | _bin_bytes),
        remark_len=draw(_maybe_lie),
        ext=ext,
        ext_len=draw(_maybe_lie),
        entry_lens=lies,
    )
    if draw(st.integers(0, 4)) == 0:
        cut = draw(st.integers(0, len(data)))
        data = data[:cut] + draw(st.binary(max_size=8))
    return data


json_frames = frames_of(json_header_bytes(), 0)
deep_json_frames = frames_of(json_header_bytes(deep=True), 0)
binary_frames = frames_of(binary_header_bytes(), 1)


# -- the same palette for a seeded random.Random ----------------------------------------------


def random_json_value(rng: random.Random, depth: int = 0) -> str:
    roll = rng.random()
    if roll < 0.03 and depth == 0:
        return deep_nesting(rng.randint(500, 10_000), rng.choice("[{m"), rng.random() < 0.8)
    if roll < 0.6 or depth >= 3:
        pick = rng.randrange(6)
        if pick <= 2:
            return rng.choice(LITERALS)
        if pick == 3:
            return str(rng.randint(-(2**70), 2**70))
        if pick == 4:
            return json.dumps(random_text(rng))
        return str(rng.randint(INT32_MIN, INT32_MAX))
    if roll < 0.8:
        items = [random_json_value(rng, depth + 1) for _ in range(rng.randrange(4))]
        return "[" + ",".join(items) + "]"
    count = rng.randrange(4)
    return json_object([(random_key(rng), random_json_value(rng, depth + 1)) for _ in range(count)])


def random_text(rng: random.Random) -> str:
    alphabet = 'aZ09_-%|:; \t"\\\u00e9\u4e2d\U0001f600\ud800\udfff\x00\x01'
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))


def random_key(rng: random.Random) -> str:
    if rng.random() < 0.5:
        return rng.choice(["topic", "a", "b", "", "queueId", "code", "k" * 300])
    return random_text(rng)


def random_ext_value(rng: random.Random) -> str | None:
    """A value for one known ext field: as Java would never send it (None: leave it out)."""
    roll = rng.randrange(10)
    if roll == 0:
        return None
    if roll <= 3:
        return rng.choice((*NUMBER_LITERALS[:20], "", " ", "abc", "-", "+1", "0x10", "1_000"))
    if roll <= 5:
        return str(rng.randint(-(2**70), 2**70))
    if roll <= 7:
        return random_text(rng)
    if roll == 8:
        return rng.choice(["true", "false", "TRUE", "yes", "null", "TopicTest", "%RETRY%x"])
    return "x" * rng.choice([127, 128, 255, 256, 1000, 70_000])
