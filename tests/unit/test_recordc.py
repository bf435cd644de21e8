"""The C record codec and remoting helpers' own behaviour (pymq.common._recordc and friends):
known values, bounds, refusals that write nothing, the GIL let go, no references kept, and the
picking of the C functions.  Whether each C function agrees with its Python twin is
tests/unit/test_twins.py's.
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

from pymq.broker.processors import send
from pymq.common import clock, message_ext, native, record
from pymq.common.message_ext import MessageExt
from pymq.store.commitlog import encode_record
from tests.helpers import c_functions, implementations


def _native():
    return c_functions(direct=True)


def test_extension_is_built():
    """The test command installs pymq with its C extension; a missing build is a failure.
    With PYMQ_PURE_PYTHON=1 the switch itself is checked: the Python twins are in use."""
    if native.pure_python_requested():
        assert not native.NATIVE_CODEC
        from pymq.store import commitlog

        assert commitlog.encode_run is commitlog.encode_run_py
        from pymq.remoting import codec, headers

        assert codec._json_command is codec.json_command_py
        assert headers._send_header is headers.send_header_py
        return
    assert native.NATIVE_CODEC, "pymq.common._recordc was not built (is a C compiler missing?)"
    assert message_ext.properties_bytes is _native().properties_bytes
    assert message_ext.decode_properties is _native().decode_properties
    assert record._decode_plain is _native().decode_plain
    from pymq.remoting import codec

    assert codec._json_command is _native().json_command
    from pymq.remoting import headers
    from pymq.store import commitlog, index_file

    assert headers._send_header is _native().send_header
    assert headers._plain_header is _native().plain_header
    assert commitlog.encode_run is _native().encode_run
    assert index_file._index_put is _native().index_put


@pytest.fixture(params=[True, False], ids=["clmul", "tables"])
def crc_path(request) -> Iterator[bool]:
    """Both CRC paths: carry-less multiplication (where the CPU has it) and tables."""
    native = _native()
    was = native.set_clmul(request.param)
    try:
        yield request.param
    finally:
        native.set_clmul(was)


def test_crc32_long_inputs(crc_path):
    data = os.urandom(3 * 65536 + 77)
    for n in (63, 64, 65, 127, 128, 129, 1024, 4096 + 15, 65536, len(data)):
        assert _native().crc32(data[:n]) == zlib.crc32(data[:n]), n


def test_decode_properties_edges():
    decode = _native().decode_properties
    assert decode("") == {} and decode("\x02") == {} and decode("a") == {}
    assert decode("a\x01b\x01c\x02d\x01e\x02") == {"a": "b\x01c", "d": "e"}
    assert list(decode("a\x011\x02b\x012\x02a\x013").items()) == [("a", "3"), ("b", "2")]
    with pytest.raises(TypeError):
        decode(b"a\x01b")


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
            assert (await store.put(msg)).status is PutMessageStatus.PUT_OK
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
    # java_hash_after continues a prefix's hash.
    for prefix, s in (("Topic", "#key"), ("", "\U0001f600x"), ("\u00e9", "")):
        after = _native().java_hash_after(_native().java_hash(prefix), s)
        assert after == _native().java_hash(prefix + s)


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


def test_offset_msg_id_refuses_bad_input():
    with pytest.raises(OverflowError):
        _native().offset_msg_id("AB", -1)
    with pytest.raises(TypeError):
        _native().offset_msg_id("é", 1)


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
    """encode_run makes its rows as the tuple subclass given last (DispatchHint), the same
    fields as the plain tuples it makes with None; anything else is refused."""
    from pymq.common.batch import BatchItem, encode_batch_body
    from pymq.store.commitlog import DispatchHint

    body = encode_batch_body([BatchItem(b"a", 0, {"TAGS": "t"}), BatchItem(b"bb", 1, {})])
    local, store = b"\x7f\x00\x00\x01", b"\x7f\x00\x00\x02"
    entries = [("T", 1, b"x", "TAGS\x01t", 0, 0, 5, 0), ("T", 1, body, None, 0, 0, 5, 0)]

    def encode(hint: object) -> tuple:
        args = (bytearray(4096), 0, 4096, 1000, entries, {"T": b"T"}, {}, lambda: 6, b"C", local)
        return _native().encode_run(*args, 9, store, 10911, 4096, 0, "S", hint)

    plain, hinted = encode(None), encode(DispatchHint)
    assert [type(r) for r in plain[1]] == [tuple] * 3
    assert [type(r) for r in hinted[1]] == [DispatchHint] * 3
    assert hinted == plain  # the same fields
    assert hinted[1][0].tags == "t" and hinted[1][2].queue_offset == 2
    for bad in (int, tuple, 5, str):
        with pytest.raises(TypeError):
            encode(bad)


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
    send_header): a fall-back to Python would only show as a slower broker under the C++
    client.  (The twins read it alike: tests/unit/test_twins.py.)"""
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
    assert batch.decode_batch_py(item, BatchItem, RecordError) == expected
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
    """The send answer's writer (C, or its twin) against the general one (SendProcessor's
    _answer_now), for any region (quoted as JSON, UTF-8) and a batch's comma-joined ids."""
    from pymq.broker.processors.send import send_answer_frame
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
    got = send_answer_frame(
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


@pytest.mark.parametrize(
    "write", implementations("pymq.broker._sendc", "send_answer_frame", send.send_answer_frame_py)
)
@pytest.mark.parametrize(
    ("args", "raised"),
    [
        ((1, "caf\u00e9", 0, 0, b'""', False, 401), ValueError),  # an id not ASCII
        ((1, "x" * 0xFFFFFF, 0, 0, b'"r"', True, 401), ValueError),  # an answer too long
        ((2**31, "AB", 0, 0, b'""', False, 401), OverflowError),
        ((1, "AB", 0, 2**63, b'""', False, 401), OverflowError),
        ((1, "AB", "1", 0, b'""', False, 401), TypeError),
        ((1, 5, 0, 0, b'""', False, 401), TypeError),
        ((1, "AB", 0, 0, "r", False, 401), TypeError),  # the region not bytes
    ],
)
def test_send_answer_frame_refuses_what_it_cannot_write(write, args, raised):
    with pytest.raises(raised):
        write(*args)
