"""The C accelerator ``pymq.common._recordc`` against its pure-Python twins.

The README's test command builds the extension, so it must be there; every function is checked
against the Python code it replaces (which stays the reference and the fallback).
"""

from __future__ import annotations

import contextlib
import os
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pymq.common import clock, message_ext, message_id, native, record
from pymq.common.message_ext import MessageExt, MessageSysFlag
from pymq.common.message_id import pack_ip
from pymq.common.record import decode_record, encode_record, host_flags, scan_records
from tests.helpers import c_functions, damaged


def _native():
    return c_functions(direct=True)


def test_extension_is_built():
    """The test command installs pymq with its C extension; a missing build is a failure.
    With PYMQ_PURE_PYTHON=1 the switch itself is checked: the Python twins are in use."""
    if native.pure_python_requested():
        assert not native.NATIVE_CODEC
        assert record.encode_record_into is record._encode_record_into_py
        return
    assert native.NATIVE_CODEC, "pymq.common._recordc was not built (is a C compiler missing?)"
    assert record.encode_record_into is _native().encode_into
    assert message_ext.properties_bytes is _native().properties_bytes
    assert message_ext.decode_properties is _native().decode_properties
    assert record._decode_plain is _native().decode_plain
    from pymq.remoting import codec

    assert codec._json_command is _native().json_command
    from pymq.remoting import headers

    assert headers._send_header is _native().send_header
    assert headers._plain_header is _native().plain_header


@pytest.fixture(params=[True, False], ids=["clmul", "tables"])
def crc_path(request) -> Iterator[bool]:
    """Both CRC paths: carry-less multiplication (where the CPU has it) and tables."""
    native = _native()
    was = native.set_clmul(request.param)
    try:
        yield request.param
    finally:
        native.set_clmul(was)


@pytest.mark.parametrize("clmul", [True, False], ids=["clmul", "tables"])
def test_crc32_matches_zlib(clmul):
    native = _native()
    was = native.set_clmul(clmul)

    @settings(max_examples=300)
    @given(data=st.binary(max_size=600), skip=st.integers(0, 15), seed=st.integers(0, 2**32 - 1))
    def check(data, skip, seed):
        view = memoryview(data)[skip:]  # every alignment of the start
        assert native.crc32(view) == zlib.crc32(view)
        assert native.crc32(view, seed) == zlib.crc32(view, seed)

    try:
        check()
    finally:
        native.set_clmul(was)


def test_crc32_long_inputs(crc_path):
    data = os.urandom(3 * 65536 + 77)
    for n in (63, 64, 65, 127, 128, 129, 1024, 4096 + 15, 65536, len(data)):
        assert _native().crc32(data[:n]) == zlib.crc32(data[:n]), n


hosts = st.sampled_from(["10.0.0.1", "192.168.1.2", "::1", "fe80::2:3"])
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)


@settings(max_examples=300)
@given(
    body=st.binary(max_size=300),
    topic=st.text(min_size=1, max_size=40).map(lambda t: t.encode()[:127]),
    props=st.binary(max_size=200),
    born=hosts,
    store=hosts,
    ints32=st.tuples(int32, int32, int32, int32, int32, st.integers(0, 0xFFFF)),
    ints64=st.tuples(int64, int64, int64, int64, int64),
    pos=st.integers(0, 9),
)
def test_encode_into_matches_python(body, topic, props, born, store, ints32, ints64, pos):
    queue_id, flag, born_port, reconsume, sys_bits, store_port = ints32
    queue_offset, phy, born_ts, store_ts, prepared = ints64
    born_ip, store_ip = pack_ip(born), pack_ip(store)
    sys_flag = (sys_bits & ~0x30) | host_flags(born_ip, store_ip)
    args = (
        body, topic, props, queue_id, flag, queue_offset, phy, sys_flag, born_ts, born_ip,
        born_port, store_ts, store_ip, store_port, reconsume, prepared,
    )  # fmt: skip
    a, b = bytearray(b"\xee" * 900), bytearray(b"\xee" * 900)
    size_c = _native().encode_into(a, pos, *args)
    size_py = record._encode_record_into_py(b, pos, *args)
    assert size_c == size_py
    assert a == b


def test_encode_into_writes_a_decodable_record():
    msg = MessageExt(
        topic="T", body=b"hello", queue_id=3, properties={"TAGS": "a"}, born_host=("::1", 7)
    )
    raw = encode_record(msg)
    back = decode_record(raw)
    buf = bytearray(len(raw))
    size = record.encode_record_into(
        buf, 0, back.body, b"T", b"TAGS\x01a", back.queue_id, back.flag, back.queue_offset,
        back.commitlog_offset, back.sys_flag, back.born_timestamp, pack_ip("::1"), 7,
        back.store_timestamp, pack_ip(back.store_host[0]), back.store_host[1],
        back.reconsume_times, back.prepared_transaction_offset,
    )  # fmt: skip
    assert size == len(raw) and bytes(buf) == raw


def _args(**over: object) -> list[object]:
    ip = pack_ip("10.0.0.1")
    base = dict(
        body=b"x", topic=b"T", props=b"", queue_id=0, flag=0, queue_offset=0, phy=0,
        sys_flag=0, born_ts=0, born_ip=ip, born_port=0, store_ts=0, store_ip=ip, store_port=0,
        reconsume=0, prepared=0,
    )  # fmt: skip
    base.update(over)
    return list(base.values())


@pytest.mark.parametrize(
    ("over", "error"),
    [
        ({"queue_id": 2**31}, OverflowError),
        ({"flag": -(2**31) - 1}, OverflowError),
        ({"phy": 2**63}, OverflowError),
        ({"queue_id": "1"}, TypeError),
        ({"topic": "T"}, TypeError),
        ({"topic": b"t" * 128}, ValueError),
        ({"props": b"p" * 32768}, ValueError),
        ({"born_ip": pack_ip("::1")}, ValueError),  # 16 bytes but no IPv6 flag
        ({"sys_flag": MessageSysFlag.STOREHOSTADDRESS_V6_FLAG}, ValueError),
        ({"body": 5}, TypeError),
    ],
)
def test_encode_into_refuses_bad_fields_and_writes_nothing(over, error):
    buf = bytearray(b"\xee" * 300)
    with pytest.raises(error):
        _native().encode_into(buf, 0, *_args(**over))
    assert buf == b"\xee" * 300


def test_encode_into_refuses_a_record_that_does_not_fit():
    buf = bytearray(100)
    with pytest.raises(ValueError, match="does not fit"):
        _native().encode_into(buf, 20, *_args())  # 93 bytes at 20 of 100
    with pytest.raises(ValueError, match="does not fit"):
        _native().encode_into(buf, 101, *_args(body=b""))
    assert buf == bytes(100)
    with pytest.raises(BufferError):
        _native().encode_into(b"read-only" * 20, 0, *_args())
    assert _native().encode_into(buf, 7, *_args()) == 93


prop_text = st.text(
    alphabet=st.characters(blacklist_characters="\x00\x01\x02", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=20,
)


@given(st.dictionaries(prop_text, prop_text, max_size=8))
def test_properties_bytes_matches_python(props):
    assert _native().properties_bytes(props) == message_ext._properties_bytes_py(props)


def test_properties_bytes_refuses_what_python_refuses():
    with pytest.raises(TypeError):
        _native().properties_bytes({"a": 1})
    with pytest.raises(TypeError):
        _native().properties_bytes([("a", "b")])
    with pytest.raises(UnicodeEncodeError):
        _native().properties_bytes({"a": "\udc80"})
    assert _native().properties_bytes({}) == b""


# Property strings as they come: separators anywhere, empty names and values, repeated names,
# a trailing separator, text beyond Latin-1 (all of PEP 393's string kinds).
raw_prop_text = st.text(
    alphabet=st.sampled_from(["\x01", "\x02", "a", "b", "K", "é", "€", "😀", "\udc80"]),
    max_size=40,
)


@given(raw_prop_text)
def test_decode_properties_matches_python(text):
    decoded = _native().decode_properties(text)
    expected = message_ext._decode_properties_py(text)
    assert decoded == expected and list(decoded) == list(expected)


def test_decode_properties_edges():
    decode = _native().decode_properties
    assert decode("") == {} and decode("\x02") == {} and decode("a") == {}
    assert decode("a\x01b\x01c\x02d\x01e\x02") == {"a": "b\x01c", "d": "e"}
    assert list(decode("a\x011\x02b\x012\x02a\x013").items()) == [("a", "3"), ("b", "2")]
    with pytest.raises(TypeError):
        decode(b"a\x01b")


@given(
    body=st.binary(max_size=300),
    props=st.dictionaries(prop_text, prop_text, max_size=4),
    topic=st.text(min_size=1, max_size=30).filter(lambda t: "\x00" not in t),
    hosts=st.sampled_from(
        [(("10.0.0.9", 40000), ("127.0.0.1", 10911)), (("::1", 7), ("127.0.0.1", 10911))]
    ),
    damage=st.one_of(st.none(), st.tuples(st.integers(0, 500), st.integers(1, 255))),
    check_crc=st.booleans(),
    pad=st.integers(0, 5),
    kind=st.sampled_from([bytes, bytearray, memoryview]),
)
def test_decode_plain_matches_python(body, props, topic, hosts, damage, check_crc, pad, kind):
    msg = MessageExt(
        topic=topic, body=body, flag=-3, properties=props, queue_id=5, queue_offset=2**40,
        commitlog_offset=77, sys_flag=0x8, born_timestamp=-1, born_host=hosts[0],
        store_timestamp=2**41, store_host=hosts[1], reconsume_times=2,
        prepared_transaction_offset=-5,
    )  # fmt: skip
    try:
        raw = bytearray(b"\xee" * pad + encode_record(msg))
    except record.RecordError:
        return  # a topic too long for the layout
    if damage is not None:
        at, xor = damage
        raw[at % len(raw)] ^= xor
    buf = kind(bytes(raw))
    native = _native().decode_plain(buf, pad, check_crc, MessageExt)
    assert native == record._decode_plain_py(buf, pad, check_crc, MessageExt)
    if damage is None and hosts[0][0] == "10.0.0.9":
        assert native == decode_record(bytes(raw), pad)
        assert native is not None and native.properties == props and native.body == body


def test_decode_plain_bounds():
    raw = encode_record(
        MessageExt(topic="T", body=b"b", born_host=("1.2.3.4", 5), store_host=("6.7.8.9", 10))
    )
    decode_plain = _native().decode_plain
    assert decode_plain(raw, 0, True, MessageExt).born_host == ("1.2.3.4", 5)
    assert decode_plain(raw, 0, True, MessageExt).store_host == ("6.7.8.9", 10)
    for pos in (-1, 1, len(raw), 2**40):
        assert decode_plain(raw, pos, True, MessageExt) is None
    assert decode_plain(raw[:-1], 0, True, MessageExt) is None
    with pytest.raises(TypeError):
        decode_plain("text", 0, True, MessageExt)


def _stream(n: int) -> tuple[bytearray, list[int]]:
    buf = bytearray()
    starts = []
    for i in range(n):
        msg = MessageExt(
            topic=(f"Topic{i % 3}") if i != 4 else "Tópico",  # one non-ASCII topic
            body=bytes([i]) * (i * 37 % 150),
            queue_id=i % 4,
            properties={"TAGS": f"t{i}"} if i % 2 else {},
            born_host=("::1", 5) if i == 6 else ("10.0.0.1", 5),  # one IPv6 record
            commitlog_offset=len(buf),
        )
        starts.append(len(buf))
        buf += encode_record(msg)
    return buf, starts


@settings(max_examples=400)
@given(
    where=st.integers(0, 100_000),
    value=st.integers(0, 255),
    truncate=st.booleans(),
    check_crc=st.booleans(),
    base=st.sampled_from([None, 0, 7]),
)
def test_scan_matches_python_walker(where, value, truncate, check_crc, base):
    buf, _ = _stream(10)
    where %= len(buf)
    data = bytes(damaged(buf, where, value, truncate))
    seen_c: list[tuple] = []
    seen_py: list[tuple] = []
    sel_c: list[int] = []
    sel_py: list[int] = []

    def pick(seen: list[tuple]):
        return lambda *a: seen.append(a) or a[1] % 2 == 0

    for pos in (0, where):
        end_c = _native().scan(data, pos, len(data), check_crc, base, pick(seen_c), sel_c)
        end_py = record._scan_plain(data, pos, len(data), check_crc, base, pick(seen_py), sel_py)
        assert end_c == end_py
        assert sel_c == sel_py
        assert seen_c == seen_py


def test_scan_records_is_the_same_with_either_walker(monkeypatch):
    buf, starts = _stream(12)
    buf += bytes(40)  # a zeroed tail, as a preallocated file has
    want = scan_records(bytes(buf), 0, len(buf), physical_base=0, select=lambda *a: True)
    assert want[0] == len(buf) - 40 and want[2] == starts
    monkeypatch.setattr(record, "_scan_fast", record._scan_plain)
    assert scan_records(bytes(buf), 0, len(buf), physical_base=0, select=lambda *a: True) == want


def test_scan_propagates_an_exception_from_select():
    buf, _ = _stream(3)

    def boom(*a: object) -> bool:
        raise KeyError("select failed")

    with pytest.raises(KeyError):
        _native().scan(bytes(buf), 0, len(buf), True, None, boom, [])


def test_store_round_trip_in_pure_python(tmp_path):
    """PYMQ_PURE_PYTHON=1 turns the extension off: the store works the same without it."""
    code = f"""
import trio
from pymq.common import clock, message_ext, message_id, native, record
from pymq.common.message_ext import MessageExt
from pymq.common.record import decode_record
from pymq.store import DefaultMessageStore, MessageStoreConfig, PutMessageStatus
assert not native.NATIVE_CODEC

async def main():
    store = DefaultMessageStore(MessageStoreConfig(store_path_root_dir={str(tmp_path)!r},
                                                   mapped_file_size_commit_log=4096))
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        for i in range(20):
            msg = MessageExt(topic="T", body=b"b%d" % i, queue_id=0, properties={{"KEYS": "k"}})
            assert (await store.put_message(msg)).status is PutMessageStatus.PUT_OK
        await store.reput.do_reput()
        got = store.get_message("g", "T", 0, 0, 32)
        bodies = [decode_record(raw).body for raw in got.messages]
        assert bodies == [b"b%d" % i for i in range(20)], got
        assert store.query_message("T", "k", 32, 0, 2**62).messages
        nursery.cancel_scope.cancel()

trio.run(main)
print("ok")
"""
    env = dict(os.environ, PYMQ_PURE_PYTHON="1")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


java_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60)


@settings(max_examples=300)
@given(s=java_text, prefix=java_text)
def test_java_hash_matches_python(s, prefix):
    """Java's String.hashCode over UTF-16 code units, astral characters as surrogate pairs."""
    native = _native()
    assert native.java_hash(s) == message_ext._java_string_hash_py(s)
    ph = native.java_hash(prefix)
    assert native.java_hash_after(ph, s) == message_ext._java_string_hash_after_py(ph, s)
    assert native.java_hash_after(ph, s) == native.java_hash(prefix + s)


def test_java_hash_known_values():
    # By String.hashCode's definition, s[0]*31^(n-1) + ... + s[n-1] over UTF-16 units (mod 2^32).
    assert _native().java_hash("TagA") == 2598919
    assert _native().java_hash("") == 0
    assert _native().java_hash("\U0001f600") == 31 * 0xD83D + 0xDE00
    with pytest.raises(TypeError):
        _native().java_hash(b"TagA")
    # A lone surrogate (JSON can carry one) is one UTF-16 unit, as in Java; both twins agree.
    assert _native().java_hash("a\ud800") == 31 * 97 + 0xD800
    assert message_ext._java_string_hash_py("a\ud800") == 31 * 97 + 0xD800
    assert message_ext._java_string_hash_after_py(97, "\ud800") == 31 * 97 + 0xD800


def test_scan_physical_base_near_the_top_does_not_wrap():
    import struct

    buf, starts = _stream(2)
    base = 2**63 - 10
    second = starts[1]  # base + second overflows 64 bits
    struct.pack_into(">q", buf, 28, base)  # first record: PHYSICALOFFSET == base + 0
    struct.pack_into(">q", buf, second + 28, base + second - 2**64)  # the wrapped sum
    data = bytes(buf)
    assert record._scan_plain(data, 0, len(data), False, base, None, []) == second
    assert _native().scan(data, 0, len(data), False, base, None, []) == second


def test_now_ms_is_the_wall_clock_in_milliseconds():
    """The store's one clock (pymq.common.clock): the C twin agrees with the Python one."""
    from pymq.common import topic
    from pymq.store import commitlog

    expected = _native().now_ms if native.NATIVE_CODEC else clock._now_ms_py
    assert clock.now_ms is expected
    assert commitlog.now_ms is clock.now_ms and topic.now_ms is clock.now_ms
    for _ in range(100):
        before = clock._now_ms_py()
        now = _native().now_ms()
        after = clock._now_ms_py()
        assert before <= now <= after


def test_properties_bytes_with_many_properties():
    props = {f"name{i}": f"välue{i}" for i in range(40)}  # beyond the stack list
    assert _native().properties_bytes(props) == message_ext._properties_bytes_py(props)


@given(offset=st.integers(0, 2**63 - 1))
def test_offset_msg_id_matches_python(offset):
    prefix = "7F00000100002A9F"
    assert _native().offset_msg_id(prefix, offset) == message_id._offset_msg_id_py(prefix, offset)


def test_offset_msg_id_refuses_bad_input():
    with pytest.raises(OverflowError):
        _native().offset_msg_id("AB", -1)
    with pytest.raises(TypeError):
        _native().offset_msg_id("é", 1)


@given(
    offsets=st.lists(st.integers(0, 2**63 - 1), max_size=40),
    prefix=st.text(st.characters(min_codepoint=48, max_codepoint=70), max_size=32),
)
def test_offset_msg_ids_match_python(offsets, prefix):
    rows = [(offset, "other fields") for offset in offsets]
    want = message_id._offset_msg_ids_py(prefix, rows)
    assert _native().offset_msg_ids(prefix, rows) == want
    assert want == ",".join(message_id._offset_msg_id_py(prefix, o) for o in offsets)


def test_offset_msg_ids_refuse_bad_input():
    with pytest.raises(OverflowError):
        _native().offset_msg_ids("AB", [(1,), (-1,)])
    with pytest.raises(TypeError):
        _native().offset_msg_ids("é", [(1,)])
    with pytest.raises(TypeError):
        _native().offset_msg_ids("AB", [(1,), 2])
    with pytest.raises(TypeError):
        _native().offset_msg_ids("AB", [()])
    with pytest.raises(TypeError):
        _native().offset_msg_ids("AB", ((1,),))
    with pytest.raises(TypeError):  # an int-like offset: no Python code runs while rows is read
        _native().offset_msg_ids("AB", [(True,)])


def test_encode_rows_are_made_as_the_hint_type():
    """encode_batch and encode_single make their rows as the tuple subclass given last
    (DispatchHint), the same fields as the plain tuples they make without it."""
    from pymq.common.batch import BatchItem, encode_batch_body
    from pymq.store.commitlog import DispatchHint

    body = encode_batch_body([BatchItem(b"a", 0, {"TAGS": "t"}), BatchItem(b"bb", 1, {})])
    local, store = b"\x7f\x00\x00\x01", b"\x7f\x00\x00\x02"
    shared = (b"T", b"C", "T", 1, 0, 5, local, 9, 6, store, 10911, 0, 4096)
    outs = {}
    for hint in (None, DispatchHint, "absent"):
        buf = bytearray(4096)
        batch_args = (buf, 0, 4096, body, 0, 1000, *shared)
        single_args = (buf, 0, 4096, b"x", "TAGS\x01t", 0, 3, 1000, *shared)
        if hint == "absent":
            native = _native()
            outs[hint] = (native.encode_batch(*batch_args), native.encode_single(*single_args))
        else:
            outs[hint] = (
                _native().encode_batch(*batch_args, hint),
                _native().encode_single(*single_args, hint),
            )
    (b_plain, s_plain), (b_hint, s_hint) = outs[None], outs[DispatchHint]
    assert outs["absent"] == outs[None]
    assert [type(r) for r in b_plain[1]] == [tuple, tuple] and type(s_plain[1]) is tuple
    assert [type(r) for r in b_hint[1]] == [DispatchHint, DispatchHint]
    assert type(s_hint[1]) is DispatchHint
    assert b_hint == b_plain and s_hint == s_plain  # the same fields
    assert b_hint[1][1].queue_offset == 1 and s_hint[1].tags == "t"
    for bad in (int, tuple, 5, str):
        with pytest.raises(TypeError):
            _native().encode_batch(bytearray(4096), 0, 4096, body, 0, 1000, *shared, bad)


def test_scan_without_select_lets_other_threads_run():
    """Recovery's plain walk runs without the GIL: a large file does not stall the loop.

    With a long switch interval the main thread keeps the GIL through Python code, so the
    other thread can only count while the scan has let go of it."""
    import threading

    one = encode_record(MessageExt(topic="T", body=b"x" * 100, queue_id=1))
    data = one * 150_000  # ~30 MB of records; no physical base, so they may repeat
    count = 0
    stop = threading.Event()

    def spin() -> None:
        nonlocal count
        while not stop.is_set():
            count += 1

    interval = sys.getswitchinterval()
    worker = threading.Thread(target=spin)
    worker.start()
    try:
        while count == 0:
            pass
        # The switch interval outlasts all the scans below, so the other thread can only count
        # while a scan has let go of the GIL.  On a loaded machine the OS may not run it during
        # one short scan: a few tries are allowed.
        sys.setswitchinterval(0.5)
        during = 0
        for _ in range(10):
            before = count
            end = _native().scan(data, 0, len(data), True, None, None, [])
            during = count - before
            if during:
                break
    finally:
        sys.setswitchinterval(interval)
        stop.set()
        worker.join()
    assert end == len(data)
    assert during > 0


# -- fast failure's busy answers --------------------------------------------------------------


def _request_frame(draw, i: int) -> bytes:
    from pymq.remoting.codec import RemotingCommand, SerializeType, encode

    kind = draw(st.sampled_from(["ours", "ours", "ours", "java", "binary", "garbage", "response"]))
    code = draw(st.sampled_from([310, 10, 11, 34, 105, 2**31 - 1, -5]))
    opaque = draw(st.integers(-(2**31), 2**31 - 1))
    flag = draw(st.sampled_from([0, 0, 2, 1, 3]))
    if kind == "garbage":
        header = draw(st.binary(max_size=60))
        return draw(st.binary(min_size=4, max_size=4)) + header
    cmd = RemotingCommand(
        code, {"a": "x"}, b"body", opaque, flag | (1 if kind == "response" else 0)
    )
    if kind == "binary":
        cmd.serialize_type = SerializeType.ROCKETMQ
        cmd.code = code & 0x3FFF  # a short in the binary header
    frame = encode(cmd)[4:]
    if kind == "java":  # keys alphabetical: extFields first, as Java writes them
        header = (
            b'{"code":%d,"extFields":{},"flag":%d,"language":"JAVA","opaque":%d,"version":401}'
            % (code, flag, opaque)
        )
        frame = len(header).to_bytes(4, "big") + header
    return frame


@st.composite
def busy_runs(draw):
    frames = [_request_frame(draw, i) for i in range(draw(st.integers(0, 12)))]
    buf = b"".join(len(f).to_bytes(4, "big") + f for f in frames)
    bounds, pos = [], 0
    for f in frames:
        bounds += [pos + 4, pos + 4 + len(f)]
        pos += 4 + len(f)
    tails = draw(
        st.dictionaries(
            st.sampled_from([310, 10, 11, 34, 105]),
            st.none() | st.binary(min_size=1, max_size=30),
            max_size=5,
        )
    )
    first = draw(st.integers(0, len(frames)))
    return buf, bounds, first, len(frames), tails


@given(busy_runs())
def test_busy_answers_twins_agree(run):
    """The C busy_answers (fast failure's refusal loop) and its Python twin give the same
    answers, stop at the same frame and count the same refusals."""
    from pymq.remoting.codec import BUSY_JSON_HEAD_PREFIX, busy_answers_py

    buf, bounds, first, stop, tails = run
    py_refused: dict[int, int] = {}
    c_refused: dict[int, int] = {}
    expected = busy_answers_py(buf, bounds, first, stop, BUSY_JSON_HEAD_PREFIX, tails, py_refused)
    got = _native().busy_answers(buf, bounds, first, stop, BUSY_JSON_HEAD_PREFIX, tails, c_refused)
    assert got == expected
    assert c_refused == py_refused


def test_busy_answers_are_the_encoded_system_busy_responses():
    from pymq.remoting.codec import (
        BUSY_JSON_HEAD_PREFIX,
        RemotingCommand,
        busy_json_answer,
        busy_json_tail,
        encode,
    )

    frames = []
    for opaque, flag in ((7, 0), (8, 2), (-9, 0)):
        cmd = RemotingCommand.request(310, {"b": "T"}, b"x")
        cmd.opaque, cmd.flag = opaque, flag
        frames.append(encode(cmd))
    buf = b"".join(frames)
    bounds, pos = [], 0
    for f in frames:
        bounds += [pos + 4, pos + len(f)]
        pos += len(f)
    tail = busy_json_tail("[TIMEOUT_CLEAN_QUEUE]broker busy")
    refused: dict[int, int] = {}
    answers, stop = _native().busy_answers(
        buf, bounds, 0, 3, BUSY_JSON_HEAD_PREFIX, {310: tail}, refused
    )
    assert stop == 3 and refused == {310: 3}  # the oneway is counted, not answered
    assert answers == busy_json_answer(7, tail) + busy_json_answer(-9, tail)
    expected = RemotingCommand(2, opaque=7, flag=1, remark="[TIMEOUT_CLEAN_QUEUE]broker busy")
    assert busy_json_answer(7, tail) == encode(expected)
    with pytest.raises(ValueError):
        _native().busy_answers(buf, bounds, 0, 4, BUSY_JSON_HEAD_PREFIX, {}, {})


# A SEND_MESSAGE header as rocketmq-client-cpp 2.x writes it (captured from the wire): numbers
# and booleans in extFields, its flags as "0" / "1", a newline after the JSON.
CPP_SEND_HEADER = (
    b'{"code":10,"extFields":{"AccessKey":"","OnsChannel":"ALIYUN","Signature":"G4s5izFbTSalPTXV'
    b'vgxi6CcyyXA=","batch":"0","bornTimestamp":"1795470141032","defaultTopic":"TBW102","default'
    b'TopicQueueNums":4,"flag":0,"producerGroup":"BenchmarkCpp_25fdc4","properties":"UNIQ_KEY'
    b'\\u00010100007F000024100000E888517B0100\\u0002WAIT\\u0001true\\u0002","queueId":0,"reconsum'
    b'eTimes":"0","sysFlag":0,"topic":"T1","unitMode":"0"},"flag":0,"language":"CPP","opaque":1,'
    b'"remark":"","version":63}\n'
)


def test_the_cpp_clients_send_header_is_read_in_c():
    """The C++ client's send header takes the C path end to end (json_command, then
    send_header), reading what the Python twins read: a fall-back to Python would only show as
    a slower broker under the C++ client."""
    import orjson

    from pymq.remoting import codec
    from pymq.remoting.headers import _LONG_NAMES, SendMessageRequestHeader

    header = orjson.loads(CPP_SEND_HEADER)
    cmd = _native().json_command(header, codec.RemotingCommand, 0)
    assert cmd is not None
    assert cmd.ext_fields["queueId"] == "0" and cmd.ext_fields["defaultTopicQueueNums"] == "4"
    send = _native().send_header(cmd.ext_fields, _LONG_NAMES, SendMessageRequestHeader, False)
    assert send is not None
    assert (send.topic, send.queue_id, send.unit_mode, send.batch) == ("T1", 0, False, False)

    def read() -> object:
        got = codec._decode_json_header(CPP_SEND_HEADER)
        return got, SendMessageRequestHeader.from_ext(got.code, got.ext_fields)

    from pymq.remoting import headers

    saved = codec._json_command, headers._send_header
    native_read = read()
    codec._json_command = headers._send_header = None
    try:
        assert read() == native_read
    finally:
        codec._json_command, headers._send_header = saved


_batch_items = st.lists(
    st.builds(
        lambda body, flag, props: (body, flag, props),
        st.binary(max_size=40),
        st.integers(-(2**31), 2**31 - 1),
        st.dictionaries(
            st.text(alphabet="ab\x01\x02é", min_size=0, max_size=4),
            st.text(alphabet="xy\x01\x02\u2603", max_size=4),
            max_size=3,
        ),
    ),
    max_size=4,
)


@settings(max_examples=400)
@given(
    items=_batch_items,
    cut=st.integers(0, 400),
    flips=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=3),
    junk=st.binary(max_size=30),
)
def test_decode_batch_in_c_equals_the_python_twin(items, cut, flips, junk):
    """_recordc.decode_batch reads a batch body as batch._decode_batch_body_py does: the same
    items (bad UTF-8 in properties read as U+FFFD), or the same RecordError words, for sound
    bodies and for cut, flipped and extended ones."""
    from pymq.common import batch
    from pymq.common.batch import BatchItem, encode_batch_body
    from pymq.common.record import RecordError

    raw = bytearray(encode_batch_body([BatchItem(b, f, p) for b, f, p in items]))
    variants = [bytes(raw), bytes(raw[: min(cut, len(raw))]), bytes(raw) + junk]
    for at, value in flips:
        if raw:
            raw[at % len(raw)] = value
    variants.append(bytes(raw))

    def read(data: bytes, fn) -> object:
        try:
            return fn(data)
        except RecordError as exc:
            return (type(exc), str(exc))

    for data in variants:
        expected = read(data, batch._decode_batch_body_py)
        got = read(data, lambda d: _native().decode_batch(d, BatchItem, RecordError))
        assert got == expected
        assert read(memoryview(data), batch.decode_batch_body) == expected


def test_json_command_holds_no_reference_on_any_path():
    """json_command's C++ client case copies extFields: no reference to a key, a value or the
    dicts is left behind, whether the command is built, left to Python (a bad language after
    the copy, a float among the values) or the constructor raises."""
    from pymq.remoting import codec

    value = int("1234567890123456789")  # objects of this test's own, counted exactly
    key = "".join(["queue", "Id"])
    flag = "".join(["tr", "ue"])

    def boom(*args: object) -> object:
        raise RuntimeError("boom")

    def calls() -> None:
        for language, extra, cls in [
            ("CPP", None, codec.RemotingCommand),
            (7, None, codec.RemotingCommand),  # refused after the copy was made
            ("CPP", 1.5, codec.RemotingCommand),  # refused while copying
            ("CPP", None, boom),
        ]:
            ext = {key: value, "b": True, "n": None, "s": flag}
            if extra is not None:
                ext["f"] = extra
            header = {"code": 10, "language": language, "extFields": ext}
            with contextlib.suppress(RuntimeError):
                _native().json_command(header, cls, 0)

    calls()
    before = [sys.getrefcount(x) for x in (value, key, flag)]
    for _ in range(100):
        calls()
    assert [sys.getrefcount(x) for x in (value, key, flag)] == before


def test_batch_properties_that_are_no_utf8_read_as_java_reads_them():
    """Bad UTF-8 in a batch item's properties is read with U+FFFD for the bad bytes (Java's
    new String(bytes, UTF_8)), in C and in Python alike, instead of failing the batch."""
    import struct

    from pymq.common import batch
    from pymq.common.batch import BatchItem
    from pymq.common.record import RecordError

    props = b"TAGS\x01a\xffb\x02KEYS\x01k\xe2\x82"
    item = struct.pack(">iiiii", 20 + 3 + 2 + len(props), 0, 0, 0, 3) + b"abc"
    item += struct.pack(">h", len(props)) + props
    expected = [BatchItem(b"abc", 0, {"TAGS": "a\ufffdb", "KEYS": "k\ufffd"})]
    assert batch._decode_batch_body_py(item) == expected
    assert _native().decode_batch(item, BatchItem, RecordError) == expected


@settings(max_examples=300, deadline=None)
@given(
    opaque=st.integers(-(2**31), 2**31 - 1),
    ids=st.lists(st.text("0123456789ABCDEF", min_size=32, max_size=32), min_size=1, max_size=4),
    queue_id=st.integers(-(2**31), 2**31 - 1),
    queue_offset=st.integers(-(2**63), 2**63 - 1),
    region=st.text(max_size=20),
    trace_on=st.booleans(),
)
def test_send_answer_frame_is_json_response_frame(
    opaque, ids, queue_id, queue_offset, region, trace_on
):
    """The send answer's C writer against the Python one it replaces (SendProcessor's
    _answer_now), for any region (quoted as JSON, UTF-8) and a batch's comma-joined ids."""
    from pymq.remoting.codec import json_response_frame, quote_json
    from pymq.remoting.codes import CURRENT_VERSION, ResponseCode
    from pymq.remoting.headers import SendMessageResponseHeader

    msg_id = ",".join(ids)
    quoted = quote_json(region)
    expected = json_response_frame(
        ResponseCode.SUCCESS,
        opaque,
        SendMessageResponseHeader.ext_json(msg_id, queue_id, queue_offset, quoted, trace_on),
    )
    got = _native().send_answer_frame(
        opaque, msg_id, queue_id, queue_offset, quoted.encode("utf-8", "surrogatepass"),
        trace_on, CURRENT_VERSION,
    )  # fmt: skip
    assert got == expected


@pytest.mark.parametrize(
    "opaque, queue_id, queue_offset, version",
    [
        (0, 0, 0, 0), (-1, -1, -1, -1), (9, 10, 99, 401),
        (-(2**31), -(2**31), -(2**63), -(2**31)), (2**31 - 1, 2**31 - 1, 2**63 - 1, 2**31 - 1),
    ],
)  # fmt: skip
def test_send_answer_frame_writes_numbers_at_their_limits(opaque, queue_id, queue_offset, version):
    from pymq.remoting.codec import json_response_frame, quote_json
    from pymq.remoting.codes import ResponseCode
    from pymq.remoting.headers import SendMessageResponseHeader

    ext = SendMessageResponseHeader.ext_json("AB", queue_id, queue_offset, quote_json("R"), True)
    frame = _native().send_answer_frame(opaque, "AB", queue_id, queue_offset, b'"R"', True, version)
    expected = json_response_frame(ResponseCode.SUCCESS, opaque, ext)
    expected_header = expected[8:].replace(b'"version":401', b'"version":%d' % version)
    assert frame[8:] == expected_header
    assert frame[:8] == struct.pack(">II", 4 + len(expected_header), len(expected_header))


def test_send_answer_frame_refuses_what_it_cannot_write():
    with pytest.raises(ValueError):
        _native().send_answer_frame(1, "caf\u00e9", 0, 0, b'""', False, 401)
    with pytest.raises(OverflowError):
        _native().send_answer_frame(2**31, "AB", 0, 0, b'""', False, 401)
