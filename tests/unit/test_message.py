"""The commit-log record codec against hand-built golden bytes, plus round-trips."""

from __future__ import annotations

import datetime
import socket
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pymq.common import record
from pymq.common.batch import BatchItem, decode_batch_body, encode_batch_body
from pymq.common.message_ext import (
    MessageExt,
    MessageSysFlag,
    decode_properties,
    encode_properties,
    java_string_hash,
    tags_code,
)
from pymq.common.message_id import (
    UniqueIdGenerator,
    create_offset_msg_id,
    decode_offset_msg_id,
    unique_id_ip,
)
from pymq.common.record import (
    BLANK_MAGIC_CODE,
    MESSAGE_MAGIC_CODE,
    BlankRecord,
    RecordError,
    decode_record,
    decode_records,
    iter_records,
)
from pymq.store.commitlog import encode_record
from tests.helpers import damaged


def golden_record_v4() -> bytes:
    """A record written out field by field from the documented 4.x layout (IPv4 hosts)."""
    body = b"Hello RocketMQ"
    topic = b"TopicTest"
    props = b"TAGS\x01TagA\x02KEYS\x01k1 k2"
    crc = zlib.crc32(body) & 0x7FFFFFFF
    total = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 8 + 8 + 4 + 8 + 4 + len(body) + 1
    total += len(topic) + 2 + len(props)
    out = b""
    out += struct.pack(">i", total)  # TOTALSIZE
    out += struct.pack(">i", -626843481)  # MAGICCODE
    out += struct.pack(">i", crc)  # BODYCRC
    out += struct.pack(">i", 3)  # QUEUEID
    out += struct.pack(">i", 7)  # FLAG
    out += struct.pack(">q", 42)  # QUEUEOFFSET
    out += struct.pack(">q", 123456)  # PHYSICALOFFSET
    out += struct.pack(">i", 0)  # SYSFLAG
    out += struct.pack(">q", 1_700_000_000_000)  # BORNTIMESTAMP
    out += socket.inet_aton("10.0.0.5") + struct.pack(">i", 50123)  # BORNHOST
    out += struct.pack(">q", 1_700_000_000_123)  # STORETIMESTAMP
    out += socket.inet_aton("192.168.1.2") + struct.pack(">i", 10911)  # STOREHOST
    out += struct.pack(">i", 2)  # RECONSUMETIMES
    out += struct.pack(">q", 0)  # PREPAREDTRANSACTIONOFFSET
    out += struct.pack(">i", len(body)) + body
    out += struct.pack(">b", len(topic)) + topic
    out += struct.pack(">h", len(props)) + props
    assert len(out) == total == 91 + len(body) + len(topic) + len(props)
    return out


def golden_message() -> MessageExt:
    return MessageExt(
        topic="TopicTest",
        body=b"Hello RocketMQ",
        flag=7,
        properties={"TAGS": "TagA", "KEYS": "k1 k2"},
        queue_id=3,
        queue_offset=42,
        commitlog_offset=123456,
        sys_flag=0,
        born_timestamp=1_700_000_000_000,
        born_host=("10.0.0.5", 50123),
        store_timestamp=1_700_000_000_123,
        store_host=("192.168.1.2", 10911),
        reconsume_times=2,
    )


def test_encode_matches_golden_bytes():
    assert encode_record(golden_message()) == golden_record_v4()


def test_decode_golden_bytes():
    raw = golden_record_v4()
    msg = decode_record(raw)
    expected = golden_message()
    expected.body_crc = zlib.crc32(b"Hello RocketMQ") & 0x7FFFFFFF
    expected.store_size = len(raw)
    assert msg == expected
    assert msg.tags == "TagA"
    assert msg.keys == ["k1", "k2"]
    assert msg.msg_id == "C0A80102" + "00002A9F" + "000000000001E240"


def test_ipv6_hosts_set_flags_and_widen_fields():
    msg = golden_message()
    msg.born_host = ("::1", 1)
    msg.store_host = ("fe80::2", 2)
    raw = encode_record(msg)
    assert len(raw) == len(golden_record_v4()) + 24
    sys_flag = struct.unpack_from(">i", raw, 36)[0]
    assert sys_flag & MessageSysFlag.BORNHOST_V6_FLAG
    assert sys_flag & MessageSysFlag.STOREHOSTADDRESS_V6_FLAG
    # born host: 16 address bytes + port at 48; store timestamp follows at 68
    assert raw[48:64] == socket.inet_pton(socket.AF_INET6, "::1")
    assert struct.unpack_from(">q", raw, 68)[0] == msg.store_timestamp
    back = decode_record(raw)
    assert back.born_host == ("::1", 1)
    assert back.store_host == ("fe80::2", 2)
    assert len(back.msg_id) == 56


def test_blank_record_is_signalled():
    raw = struct.pack(">iI", 100, BLANK_MAGIC_CODE) + bytes(92)
    with pytest.raises(BlankRecord) as info:
        decode_record(raw)
    assert info.value.size == 100


def test_every_truncation_is_an_error():
    raw = golden_record_v4()
    for cut in range(len(raw)):
        with pytest.raises(RecordError):
            decode_record(raw[:cut])


def test_crc_flip_detected_and_optional():
    raw = bytearray(golden_record_v4())
    raw[88] ^= 0x01  # first body byte
    with pytest.raises(RecordError, match="CRC"):
        decode_record(raw)
    assert decode_record(raw, check_crc=False).body[0] == ord("H") ^ 1


def test_bad_magic_and_inconsistent_total():
    raw = bytearray(golden_record_v4())
    raw[4] ^= 0xFF
    with pytest.raises(RecordError, match="magic"):
        decode_record(raw)
    raw = bytearray(golden_record_v4())
    struct.pack_into(">i", raw, 0, len(raw) - 1)
    with pytest.raises(RecordError):
        decode_record(raw)


def test_iter_records_stops_at_blank():
    one = golden_record_v4()
    buf = one + one + struct.pack(">iI", 8, BLANK_MAGIC_CODE)
    assert [m.store_size for m in iter_records(buf)] == [len(one), len(one)]


hosts = st.one_of(
    st.tuples(st.ip_addresses(v=4).map(str), st.integers(0, 65535)),
    st.tuples(st.ip_addresses(v=6).map(str), st.integers(0, 65535)),
)
prop_text = st.text(
    alphabet=st.characters(blacklist_characters="\x00\x01\x02", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=20,
)


@given(
    topic=st.text(
        alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=127
    ),
    body=st.binary(max_size=2000),
    props=st.dictionaries(prop_text, prop_text, max_size=5),
    ints=st.tuples(
        st.integers(-(2**31), 2**31 - 1),
        st.integers(0, 2**31 - 1),
        st.integers(0, 2**62),
        st.integers(0, 2**62),
        st.integers(0, 2**40),
        st.integers(0, 2**40),
        st.integers(0, 100),
    ),
    sys_flag=st.sampled_from([0, 1, 2, 4, 8, 12]),
    born=hosts,
    store=hosts,
)
def test_round_trip(topic, body, props, ints, sys_flag, born, store):
    flag, queue_id, queue_offset, phys, born_ts, store_ts, reconsume = ints
    msg = MessageExt(
        topic=topic,
        body=body,
        flag=flag,
        properties=props,
        queue_id=queue_id,
        queue_offset=queue_offset,
        commitlog_offset=phys,
        sys_flag=sys_flag,
        born_timestamp=born_ts,
        born_host=born,
        store_timestamp=store_ts,
        store_host=store,
        reconsume_times=reconsume,
    )
    raw = encode_record(msg)
    back = decode_record(b"junk" + raw + b"more", 4)
    assert back.store_size == len(raw)
    assert back.topic == topic and back.body == body and back.properties == props
    assert (back.flag, back.queue_id, back.queue_offset, back.commitlog_offset) == (
        flag,
        queue_id,
        queue_offset,
        phys,
    )
    assert back.sys_flag & 0xF == sys_flag
    assert back.born_host[1] == born[1] and back.store_host[1] == store[1]
    assert back.born_timestamp == born_ts and back.store_timestamp == store_ts
    # The consumer's fast decoder agrees with the careful one, for IPv4 and IPv6 alike.
    twice = raw + raw
    assert decode_records(twice) == list(iter_records(twice)) == [back, back]


def _careful_or_error(raw: bytes, **kwargs: bool) -> object:
    try:
        return record._decode_record_careful(raw, 0, kwargs.get("check_crc", True), True)
    except RecordError as exc:
        return type(exc)


def _fast_or_error(raw: bytes, **kwargs: bool) -> object:
    try:
        return decode_record(raw, **kwargs)
    except RecordError as exc:
        return type(exc)


@given(
    body=st.binary(max_size=300),
    props=st.dictionaries(prop_text, prop_text, max_size=4),
    v6=st.booleans(),
    damage=st.one_of(st.none(), st.tuples(st.integers(0, 400), st.integers(1, 255))),
    check_crc=st.booleans(),
)
def test_decode_record_fast_path_equals_the_careful_parser(body, props, v6, damage, check_crc):
    """decode_record reads the common record inline; whatever it gives or refuses, the careful
    parser gives or refuses alike, damaged bytes included."""
    msg = golden_message()
    msg.body, msg.properties = body, props
    if v6:
        msg.born_host = ("::1", 7)
    raw = bytearray(encode_record(msg))
    if damage is not None:
        at, xor = damage
        raw[at % len(raw)] ^= xor
    assert _fast_or_error(bytes(raw), check_crc=check_crc) == _careful_or_error(
        bytes(raw), check_crc=check_crc
    )


def test_decode_records_refuses_what_decode_record_refuses():
    one = golden_record_v4()
    assert decode_records(one + struct.pack(">iI", 8, BLANK_MAGIC_CODE)) == [decode_record(one)]
    with pytest.raises(RecordError):
        decode_records(one + one[:-1])  # torn
    nul = bytearray(one)
    nul[-2] = 0  # a NUL inside the properties: data in a pull body (the broker judged tears)
    assert decode_records(bytes(nul)) == [decode_record(bytes(nul))]
    assert "\0" in encode_properties(decode_records(bytes(nul))[0].properties)
    nul[-2] = 1
    nul[one.index(golden_message().topic.encode())] = 0  # a NUL in the topic never is
    with pytest.raises(RecordError, match="topic"):
        decode_records(bytes(nul))
    flipped = bytearray(one)
    flipped[one.index(golden_message().body)] ^= 1
    assert decode_records(bytes(flipped))[0].body != golden_message().body  # CRC not checked
    with pytest.raises(RecordError, match="CRC"):
        decode_records(bytes(flipped), check_crc=True)


def test_too_long_topic_or_properties_refused():
    msg = golden_message()
    msg.topic = "t" * 128
    with pytest.raises(RecordError, match="topic"):
        encode_record(msg)
    msg = golden_message()
    msg.properties = {"K": "v" * 40000}
    with pytest.raises(RecordError, match="properties"):
        encode_record(msg)


def test_properties_codec():
    assert encode_properties({"A": "1", "B": "2"}) == "A\x011\x02B\x012"
    assert decode_properties("A\x011\x02B\x012") == {"A": "1", "B": "2"}
    assert decode_properties("A\x011\x02B\x012\x02") == {"A": "1", "B": "2"}
    assert decode_properties("") == {}
    assert decode_properties("A\x01\x02\x01x\x02C\x013") == {"C": "3"}
    assert decode_properties("A\x01b\x01c") == {"A": "b\x01c"}


@given(st.dictionaries(prop_text, prop_text))
def test_properties_round_trip(props):
    assert decode_properties(encode_properties(props)) == props


def test_java_string_hash_known_values():
    # Values as Java's String.hashCode prints them.
    assert java_string_hash("") == 0
    assert java_string_hash("a") == 97
    assert java_string_hash("TagA") == 2598919
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("Hello World") == -862545276
    assert java_string_hash("polygenelubricants") == -2147483648
    assert java_string_hash("\u00e9t\u00e9") == 233 * 961 + 116 * 31 + 233  # non-ASCII BMP
    assert java_string_hash("\U0001f600") == 0xD83D * 31 + 0xDE00  # surrogate pair
    assert tags_code(None) == 0 and tags_code("") == 0 and tags_code("TagA") == 2598919


@given(st.text(max_size=1500))
def test_java_string_hash_matches_reference_loop(s):
    units = s.encode("utf-16-be")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i : i + 2], "big")) & 0xFFFFFFFF
    assert java_string_hash(s) == (h - (1 << 32) if h & 0x80000000 else h)


def test_offset_msg_id():
    assert create_offset_msg_id("127.0.0.1", 19911, 0) == "7F00000100004DC70000000000000000"
    assert decode_offset_msg_id("7F00000100004DC70000000000000000") == ("127.0.0.1", 19911, 0)
    six = create_offset_msg_id("::1", 10911, 2**40)
    assert len(six) == 56 and six == six.upper()
    assert decode_offset_msg_id(six) == ("::1", 10911, 2**40)
    with pytest.raises(ValueError):
        decode_offset_msg_id("ABCD")


def test_unique_id_layout():
    gen = UniqueIdGenerator("10.1.2.3", pid=77)
    a = gen.create(1_700_000_000_000)
    b = gen.create(1_700_000_000_000)
    assert len(a) == 32 and a == a.upper() and a != b
    assert unique_id_ip(a) == "10.1.2.3"
    assert a[8:12] == "004D"  # pid 77
    millis = struct.unpack(">I", bytes.fromhex(a[20:28]))[0]
    assert gen.begin_of_month_ms + millis == 1_700_000_000_000


@pytest.mark.parametrize("day", [1, 24, 25, 27, 31])
def test_unique_id_late_in_a_month(day: int) -> None:
    """From the 25th day on, the milliseconds since the month began pass 2**31: Java writes
    them as an int that wraps and reads them back unsigned; creating an id must not fail."""
    moment = datetime.datetime(2026, 10, day, 23, 59, 59, 999)
    now_ms = int(moment.timestamp() * 1000)
    gen = UniqueIdGenerator("10.1.2.3", pid=77)
    uniq = gen.create(now_ms)
    span = struct.unpack(">I", bytes.fromhex(uniq[20:28]))[0]
    assert gen.begin_of_month_ms + span == now_ms
    month_start = datetime.datetime(2026, 10, 1).timestamp() * 1000
    assert gen.begin_of_month_ms == month_start


def test_batch_body_golden_and_round_trip():
    items = [BatchItem(b"abc", 1, {"TAGS": "x"}), BatchItem(b"", 0, {})]
    raw = encode_batch_body(items)
    props = b"TAGS\x01x"
    first = struct.pack(">iiiii", 20 + 3 + 2 + len(props), 0, 0, 1, 3) + b"abc"
    first += struct.pack(">h", len(props)) + props
    second = struct.pack(">iiiii", 22, 0, 0, 0, 0) + struct.pack(">h", 0)
    assert raw == first + second
    assert decode_batch_body(raw) == items
    with pytest.raises(RecordError):
        decode_batch_body(raw[:-1])


def test_magic_constants():
    assert struct.pack(">I", MESSAGE_MAGIC_CODE) == struct.pack(">i", -626843481)
    assert struct.pack(">I", BLANK_MAGIC_CODE) == struct.pack(">i", -875286124)


def test_nul_in_topic_or_properties_reads_as_torn():
    raw = bytearray(golden_record_v4())
    raw[-1] = 0  # last properties byte zeroed, as a torn write leaves it
    with pytest.raises(RecordError, match="NUL"):
        decode_record(raw, tears=True)
    assert decode_record(raw).properties  # not a file: data
    msg = golden_message()
    msg.topic = "a\0b"
    with pytest.raises(RecordError, match="NUL"):
        encode_record(msg)


@pytest.mark.parametrize("kind", ["first", "last", "sector", "between"])
def test_a_nul_in_the_properties_is_torn_only_where_a_lost_sector_puts_one(kind):
    """A lost write is zeros from a sector boundary on: it zeroes the properties' first byte,
    a byte at a 512-byte boundary of the file, or their last byte.  A NUL elsewhere is data
    (the C++ client sometimes sends one in UNIQ_KEY; Java's broker stores it)."""
    from pymq.common.record import nul_where_torn, scan_records

    msg = golden_message()
    msg.properties = {"UNIQ_KEY": "x" * 1200, "Z": "end"}
    clean = encode_record(msg)
    end = len(clean)
    props_len = len(encode_properties(msg.properties).encode())
    props_at = end - props_len
    sector = props_at + (-props_at % 512)
    at = {"first": props_at, "last": end - 1, "sector": sector, "between": sector + 7}[kind]
    buf = bytearray(clean)
    buf[at] = 0
    torn = kind != "between"
    assert nul_where_torn(buf, props_at, props_len) == (at if torn else -1)
    assert scan_records(bytes(buf), 0, end)[0] == (0 if torn else end)
    if torn:
        with pytest.raises(RecordError, match="NUL byte in the properties"):
            decode_record(buf, tears=True)
    else:
        value = decode_record(buf, tears=True).properties["UNIQ_KEY"]
        assert value[at - props_at - 9] == "\0" and len(value) == 1200
    assert decode_record(buf).store_size == end  # not a file (a pull body): data either way
    # The sector boundaries are the file's: the same bytes elsewhere in a file judge otherwise.
    if kind == "sector":
        assert nul_where_torn(buf, props_at, props_len, origin=7) == -1
    if kind == "between":
        assert nul_where_torn(buf, props_at, props_len, origin=(-at) % 512) == at


def _records(n: int) -> tuple[bytearray, list[int]]:
    buf = bytearray()
    starts = []
    for i in range(n):
        msg = golden_message()
        msg.body = bytes([i]) * (i * 13 % 70)
        msg.commitlog_offset = len(buf)
        if i == 2:
            msg.born_host = ("::1", 5)  # one IPv6 record takes the careful path
        starts.append(len(buf))
        buf += encode_record(msg)
    return buf, starts


def _slow_scan(buf: bytes) -> int:
    pos = 0
    while pos < len(buf):
        try:
            msg = decode_record(buf, pos, tears=True)
        except (RecordError, BlankRecord):
            return pos
        if msg.commitlog_offset != pos:
            return pos
        pos += msg.store_size
    return pos


@settings(max_examples=400)
@given(st.integers(0, 10_000), st.integers(0, 255), st.booleans())
def test_scan_records_agrees_with_decode_record(where, value, truncate):
    from pymq.common.record import scan_records

    buf, starts = _records(6)
    buf = damaged(buf, where % len(buf), value, truncate)
    end, why, selected = scan_records(
        bytes(buf), 0, len(buf), physical_base=0, select=lambda *a: True
    )
    assert end == _slow_scan(bytes(buf))
    assert selected == [s for s in starts if s < end]
    assert (why == "end") == (end == len(buf))


@given(st.text(max_size=40), st.text(max_size=60))
def test_java_string_hash_after_prefix(prefix, s):
    from pymq.common.message_ext import java_string_hash_after

    assert java_string_hash_after(java_string_hash(prefix), s) == java_string_hash(prefix + s)


@given(st.dictionaries(prop_text, prop_text, max_size=6), prop_text, st.booleans())
def test_property_value_matches_decode(props, name, trailing):
    from pymq.common.record import property_value

    text = encode_properties(props) + ("\x02" if trailing and props else "")
    assert property_value(text, name) == decode_properties(text).get(name)
    for key in props:
        assert property_value(text, key) == props[key]


def test_tear_safe_properties_reorders_a_map_and_gives_up_in_bounded_work():
    from pymq.common.message_ext import properties_bytes
    from pymq.common.record import nul_where_torn, tear_safe_properties

    props = {"\0a": "v", "K": "x\0y", "Z": "end\0"}
    data = tear_safe_properties(props)
    assert data is not None and data[0] != 0 and data[-1] != 0
    assert decode_properties(data.decode()) == props
    assert len(data) == len(properties_bytes(props))
    # A NUL on a sector boundary (the properties start 3 bytes before one): moved.
    at = 512 - 3
    raw = properties_bytes({"K": "x\0y", "A": "bb"})
    assert nul_where_torn(raw, 0, len(raw), at) == 3
    moved = tear_safe_properties({"K": "x\0y", "A": "bb"}, at)
    assert moved is not None and nul_where_torn(moved, 0, len(moved), at) < 0
    # No order avoids it: None (after at most 64 orders, however many items).
    assert tear_safe_properties({"\0a": "v"}) is None
    assert tear_safe_properties({"a": "v\0"}) is None
    dense = {f"k{i}": "\0" * 500 + "x" for i in range(60)}
    assert tear_safe_properties(dense, 0) is None
