"""Each C module against its Python twins: the same answer (or the same exception type) on the
same inputs, ordinary and hostile (truncated, corrupted, random bytes), one parametrised test
per module; and every C module has a stub naming exactly its functions.  Skipped under
PYMQ_PURE_PYTHON=1, where the twins alone are in use (and the rest of the suite runs on them).

Functions whose own tests check them, C and twin alike, against a reference are not repeated
here (json_header and json_command but for their arguments' edges): those two
(tests/unit/test_codec.py, against json's reading), send_run_fields and send_answer_run
(tests/unit/test_send_run_c.py, against send_fields and send_answer_frame one by one),
export_columns (tests/spark/test_columns.py, against the per-record path), send_frame and
batch_body (tests/unit/test_client_frames.py and test_batch_encoding.py, against the codec and
the reference writer)."""

from __future__ import annotations

import ast
import importlib
import pathlib
import random
import struct
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pymq.broker.processors import send
from pymq.common import batch, clock, message_ext, message_id, record
from pymq.common.batch import BatchItem, encode_batch_body
from pymq.common.message_ext import MessageExt
from pymq.common.native import load_native, pure_python_requested
from pymq.common.record import RecordError
from pymq.remoting import codec, headers
from pymq.store import commitlog, get_message, index_file, reput
from pymq.store.commitlog import DispatchHint, encode_record
from tests.helpers import C_MODULES, mangled
from tests.unit import test_codec, test_recordc

pytestmark = pytest.mark.skipif(pure_python_requested(), reason="PYMQ_PURE_PYTHON=1: no C")

Case = tuple[str, Callable[..., Any], Callable[..., Any], tuple[Any, ...]]


def _outcome(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[str, Any]:
    """What ``fn(*args)`` gives: its value (mutable arguments included, as the C functions
    write into them), or the exception's type."""
    copies = tuple(bytearray(a) if isinstance(a, bytearray) else a for a in args)
    copies = tuple(list(a) if isinstance(a, list) else a for a in copies)
    try:
        value = fn(*copies)
    except (
        ValueError,
        TypeError,
        OverflowError,
        RecordError,
        UnicodeError,
        IndexError,
        BufferError,
        headers.HeaderError,
    ) as exc:
        return "raises", type(exc).__mro__[1] if type(exc) is RecordError else type(exc)
    written = [a for a in copies if isinstance(a, (bytearray, list))]
    return "ok", (value, written)


def _messages() -> list[MessageExt]:
    return [
        MessageExt(topic="T", body=b"hello", properties={"KEYS": "k1 k2", "TAGS": "a"}),
        MessageExt(topic="\u00e9t\u00e9", body=b"", properties={}, queue_id=7, flag=-1),
        MessageExt(
            topic="T6",
            body=bytes(range(256)) * 3,
            born_host=("::1", 10911),
            store_host=("fe80::2", 1),
            queue_offset=2**62,
            reconsume_times=3,
        ),
    ]


def _hostile(data: bytes, seed: int) -> Iterator[bytes]:
    """``data``, every truncation at a few points, and random byte flips and random bytes."""
    rnd = random.Random(seed)
    yield data
    for cut in sorted({0, 1, 4, 8, len(data) // 2, len(data) - 1}):
        yield data[: max(cut, 0)]
    for _ in range(12):
        flipped = bytearray(data)
        if flipped:
            flipped[rnd.randrange(len(flipped))] = rnd.randrange(256)
        yield bytes(flipped)
    yield bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 200)))


def _recordc_cases(c: Any) -> Iterator[Case]:
    def crc32_on(clmul: bool) -> Callable[..., int]:
        def crc32(data: Any, seed: int) -> int:
            was = c.set_clmul(clmul)
            try:
                return int(c.crc32(data, seed))
            finally:
                c.set_clmul(was)

        return crc32

    noise = random.Random(7).randbytes(3 * 65536 + 77)
    for data in (b"", b"a", bytes(range(256)) * 40, b"\xff" * 1001, noise):
        for skip in (0, 1, 7, 15):  # every alignment of the start, both CRC paths
            for seed in (0, 1, 0xFFFFFFFF):
                view = memoryview(data)[skip:]
                yield "crc32", crc32_on(skip % 2 == 0), zlib.crc32, (view, seed)
    many = {f"name{i}": f"v\u00e4lue{i}" for i in range(40)}  # beyond the C's stack list
    for props in (
        {}, {"a": "b"}, {"\u00e9": "\U0001f600", "K": ""}, {"a": 1}, many, [("a", "b")],
        {"a": "\udc80"}, {"\u20ac": "\x00"},
    ):  # fmt: skip
        yield "properties_bytes", c.properties_bytes, message_ext._properties_bytes_py, (props,)
    for text in (
        "", "a\x01b", "a\x01b\x02c\x01d\x02", "\x01x\x02y\x01\x02a\x01b\x02a\x01c", "\x02", "a",
        "a\x01b\x01c\x02d\x01e\x02", "\u00e9\x01\u20ac\x02\U0001f600\x01\udc80\x02K\x01\x01",
        "K\x01\u20ac" * 20, b"a\x01b",
    ):  # fmt: skip
        yield "decode_properties", c.decode_properties, message_ext._decode_properties_py, (text,)
    for s in ("", "a", "TopicTest", "\u00e9\U0001f600" * 50, "\ud800x"):
        yield "java_hash", c.java_hash, message_ext._java_string_hash_py, (s,)
        for prefix in (0, -1, 2**31 - 1):
            twin = message_ext._java_string_hash_after_py
            yield "java_hash_after", c.java_hash_after, twin, (prefix, s)
    for prefix, offset in (("0A0B", 0), ("", 2**63 - 1), ("X", 255), ("P", -1), ("P", 2**64)):
        yield "offset_msg_id", c.offset_msg_id, message_id._offset_msg_id_py, (prefix, offset)
    rows = [(0,), (16, "x"), (2**40,)]
    yield "offset_msg_ids", c.offset_msg_ids, message_id._offset_msg_ids_py, ("AB", rows)
    yield "offset_msg_ids", c.offset_msg_ids, message_id._offset_msg_ids_py, ("AB", [])
    yield from _record_cases(c)


def _record_cases(c: Any) -> Iterator[Case]:
    """decode_plain, scan and decode_batch: the record layout's functions (its encoder,
    encode_run, is _run_cases')."""
    records = [encode_record(m) for m in _messages()]
    joined = b"".join(records)
    for data in _hostile(joined, 1):
        for pos, kind in ((0, bytes), (3, bytearray), (len(records[0]), memoryview)):
            args = (kind(b"\xee" * 3 + data if pos == 3 else data), pos, True, MessageExt)
            yield "decode_plain", c.decode_plain, record._decode_plain_py, args
        for crc, base, pos in ((True, 1000, 0), (False, None, 0), (True, 7, len(records[0]))):
            args = (data, pos, len(data), crc, base, lambda *a: a[1] % 2 == 0, [])
            yield "scan", c.scan, record._scan_plain, args
    body = encode_batch_body([BatchItem(b"x" * 40, 0, {"a": "b"}), BatchItem(b"", 7, {})])
    for data in _hostile(body, 2):
        args = (data, BatchItem, RecordError)
        yield "decode_batch", c.decode_batch, batch.decode_batch_py, args
    yield "now_ms", lambda: c.now_ms() // 10_000, lambda: clock._now_ms_py() // 10_000, ()


def _codecc_cases(c: Any) -> Iterator[Case]:
    frame = codec.busy_json_answer(5, codec.busy_json_tail("x"))
    frames = frame * 3 + b"\x00\x00\x00\x02ab" + b"\x7f\xff\xff\xff"
    lengths = (-(2**31), -1, 0, 3, 4, 64, 200, 2**31 - 1)
    odd = b"".join(struct.pack(">i", n) + b"abcd" for n in lengths)  # sound and unsound lengths
    for data in (*_hostile(frames, 3), *_hostile(odd, 8)):
        for limit in (4, 16, 1 << 20, 2**31 - 1, 2**40):
            yield "frame_bounds", c.frame_bounds, codec._walk_frames, (data, limit)
    java = b'{"code":11,"extFields":{},"flag":0,"language":"JAVA","opaque":-5,"version":401}'
    binary = codec.RemotingCommand(code=10, opaque=3, serialize_type=codec.SerializeType.ROCKETMQ)
    frames = [
        codec.encode(codec.RemotingCommand(code=10, opaque=9, remark="r"))[4:],
        codec.encode(codec.RemotingCommand(code=310, opaque=-(2**31), flag=2))[4:],  # oneway
        codec.encode(codec.RemotingCommand(code=11, opaque=2**31 - 1, flag=1))[4:],  # answer
        len(java).to_bytes(4, "big") + java,
        codec.encode(binary)[4:],
        codec.encode(codec.RemotingCommand(code=34, opaque=1))[4:],
    ]
    run, bounds = b"", []
    for f in frames:
        bounds += [len(run) + 4, len(run) + 4 + len(f)]
        run += len(f).to_bytes(4, "big") + f
    tails = {10: codec.busy_json_tail("busy"), 11: None, 310: b"x"}
    for data in _hostile(run, 4):
        for first in (0, 2, len(frames)):
            args = (data, bounds, first, len(frames), codec.BUSY_JSON_HEAD_PREFIX, tails, {})
            yield "busy_answers", c.busy_answers, codec.busy_answers_py, args
    cpp = orjson.loads(test_recordc.CPP_SEND_HEADER)  # the C++ client's numbers in extFields
    for header in (cpp, [cpp], None):
        args = (header, codec.RemotingCommand, codec.SerializeType.JSON)
        yield "json_command", c.json_command, codec.json_command_py, args
    yield from _json_header_cases(c)
    yield from _send_tier_cases(c)
    names, cls = headers._SHORT_NAMES, headers.SendMessageRequestHeader
    for args in ([], names, cls, 0), ([], names, cls, 1), (_SEND_EXT, names[:12], tuple, 0):
        yield "send_header", c.send_header, headers.send_header_py, args
    cpp = codec.json_command_py(orjson.loads(test_recordc.CPP_SEND_HEADER), lambda *f: f[1], 0)
    args = (cpp, headers._LONG_NAMES, headers.SendMessageRequestHeader, False)
    yield "send_header", c.send_header, headers.send_header_py, args
    args = ((), headers._END_SPEC, headers.EndTransactionRequestHeader)
    yield "plain_header", c.plain_header, headers.plain_header_py, args
    for odd in ((("a", "x"),), (("a",),), ["a"], (("a", 1),), (("a", ""),), (("a", "s"),) * 17):
        yield "plain_header", c.plain_header, headers.plain_header_py, ({"a": "1"}, odd, tuple)


def _json_header_cases(c: Any) -> Iterator[Case]:
    """json_header on the arguments' edges (tests/unit/test_codec.py checks it, C and twin,
    against json's reading of headers)."""
    cls, json_type = codec.RemotingCommand, codec.SerializeType.JSON
    frame = b"xx" + test_codec.SEND_HEADER + b"body"
    end = 2 + len(test_codec.SEND_HEADER)
    for args in (
        (frame, 2, end, cls, json_type),
        (bytearray(frame), 2, end, cls, json_type),
        (memoryview(frame), 2, end, cls, json_type),
        (frame, 2, end, lambda *f: f, 5),
        (frame, 2, len(frame) + 1, cls, json_type),
        (bytearray(frame), 2, len(frame) + 1, cls, json_type),
        (frame, end, 2, cls, json_type),
        (frame, -1, end, cls, json_type),
        (frame, 2, 2**63, cls, json_type),
        (frame, "2", end, cls, json_type),
        (frame.decode(), 2, end, cls, json_type),
        (frame, 2, end, None, json_type),
    ):
        yield "json_header", c.json_header, codec.json_header_py, args


_GONE = object()


def _changed(sound: dict, values: st.SearchStrategy[Any]) -> st.SearchStrategy[dict]:
    """``sound`` with up to three members changed to ``values`` or left out."""
    changes = st.lists(st.tuples(st.sampled_from(list(sound)), values | st.just(_GONE)), max_size=3)
    return changes.map(lambda c: {k: v for k, v in (sound | dict(c)).items() if v is not _GONE})


_SEND_EXT = headers.SendMessageRequestHeader.v2_ext("g", "T", 1, 0, 1700000000000, 0, "p", False)
_END_EXT = headers.EndTransactionRequestHeader.producer_ext("g", 1, 2, 8, "id")
_ODD_TEXT = st.sampled_from(
    ["-1", "+0", "007", " 1", "1.5", "-0", "1234567890", "1" * 10, "1" * 18, "1" * 19, "", "\u0661",
     "TRUE", "True", "yes", "x", "true", "false", "0", "1", "3", "16", 5, 7, None]
)  # fmt: skip


@pytest.mark.skipif(load_native("pymq.remoting._codecc") is None, reason="not built")
@given(
    send=_changed(_SEND_EXT | {"l": "16"}, _ODD_TEXT),
    end=_changed(_END_EXT | {"fromTransactionCheck": "false", "transactionId": "t"}, _ODD_TEXT),
    batch_code=st.booleans(),
)
@settings(max_examples=300)
def test_header_readers_agree(send: dict, end: dict, batch_code: bool) -> None:
    """send_header and plain_header (END_TRANSACTION's) and their twins on sound headers with
    up to three members left out or holding odd numbers, flags, types."""
    c = load_native("pymq.remoting._codecc")
    args = (send, headers._SHORT_NAMES, headers.SendMessageRequestHeader, batch_code)
    assert _outcome(c.send_header, args) == _outcome(headers.send_header_py, args)
    args = (end, headers._END_SPEC, headers.EndTransactionRequestHeader)
    assert _outcome(c.plain_header, args) == _outcome(headers.plain_header_py, args)


def _send_frames() -> list[bytes]:
    """Frames of the send tier: sends as pymq's, Java's and the C++ client's producers write
    them (V2, batch, SEND_MESSAGE with long names and unquoted numbers, signed), and send
    answers (plain, with a transaction id, a recall handle, an error)."""
    v2 = headers.SendMessageRequestHeader.v2_ext("G", "T", 1, 0, 1700000000000, 0, "p", False)
    batch = {**v2, "m": "true"}
    signed = {**v2, "AccessKey": "ak", "Signature": "c2ln"}
    frames = [
        codec.encode(codec.RemotingCommand(310, v2, b"body", 5)),
        codec.encode(codec.RemotingCommand(320, batch, b"items", 6)),
        codec.encode(codec.RemotingCommand(310, signed, b"", 7)),
        codec.encode(codec.RemotingCommand(310, {**v2, "e": "-1"}, b"b", 8)),
        codec.encode(codec.RemotingCommand(310, {**v2, "topic": "T"}, b"b", 8)),
        codec.encode(codec.RemotingCommand(310, v2, b"b", 9, flag=1)),
    ]
    cpp = (
        b'{"code":10,"extFields":{"producerGroup":"G","topic":"T","defaultTopic":"TBW102",'
        b'"defaultTopicQueueNums":4,"queueId":2,"sysFlag":0,"bornTimestamp":1700000000000,'
        b'"flag":0,"properties":"a\\u0001b","reconsumeTimes":1,"unitMode":false,'
        b'"batch":null,"OnsChannel":"ALIYUN"},"flag":0,"language":"CPP","opaque":3,'
        b'"serializeTypeCurrentRPC":"JSON","version":0}'
    )
    frames.append(struct.pack(">ii", 4 + len(cpp) + 2, len(cpp)) + cpp + b"xy")
    answer = {"msgId": "7F0000010000C30100000000000001AA", "queueId": "3", "queueOffset": "9"}
    for ext, code, remark in (
        (answer, 0, None),
        ({**answer, "transactionId": "t1", "MSG_REGION": "DefaultRegion"}, 0, None),
        ({**answer, "recallHandle": "djE="}, 0, None),
        ({**answer, "queueId": "-3"}, 0, None),
        (answer, 1, "boom"),
    ):
        response = codec.RemotingCommand(code, ext, b"", 11, codec.RPC_TYPE_RESPONSE, remark)
        frames.append(codec.encode(response))
    return frames


def _send_tier_cases(c: Any) -> Iterator[Case]:
    """send_fields and send_answer_fields on the frames producers and brokers write, damaged,
    and on the arguments' edges (send_run_fields: tests/unit/test_send_run_c.py, against the
    Python loop of send_fields, as built and under PYMQ_PURE_PYTHON=1)."""
    frames = _send_frames()
    for n, frame in enumerate(frames):
        for data in _hostile(frame, n):
            for name, py_fn in (
                ("send_fields", codec.send_fields_py),
                ("send_answer_fields", codec.send_answer_fields_py),
            ):
                yield name, getattr(c, name), py_fn, (data, 4, len(data))
    frame = frames[0]
    for args in (
        (bytearray(frame), 4, len(frame)),
        (memoryview(frame), 4, len(frame)),
        (frame, 4, len(frame) + 1),
        (frame, len(frame), 4),
        (frame, -1, len(frame)),
        (frame, 4, 2**63),
        (frame, "4", len(frame)),
        (frame.decode("latin-1"), 4, len(frame)),
        (frame[:6], 4, 6),
    ):
        yield "send_fields", c.send_fields, codec.send_fields_py, args
        yield "send_answer_fields", c.send_answer_fields, codec.send_answer_fields_py, args


@pytest.mark.skipif(load_native("pymq.remoting._codecc") is None, reason="not built")
@given(data=st.data())
@settings(max_examples=300)
def test_send_readers_agree_on_damaged_frames(data: st.DataObject) -> None:
    """send_fields and send_answer_fields and their twins on sound frames with bytes of the
    JSON grammar changed, cut or added (the header length kept, so the damage is read)."""
    c = load_native("pymq.remoting._codecc")
    frame = data.draw(st.sampled_from(_send_frames()))
    (length,) = struct.unpack_from(">i", frame, 4)
    header = mangled(data, frame[8 : 8 + length], b'"\\{}[],:-.0e19 \x00\x7f\x80tnuabm')
    body = frame[8 + length :]
    damaged = struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body
    args = (damaged, 4, len(damaged))
    assert _outcome(c.send_fields, args) == _outcome(codec.send_fields_py, args)
    assert _outcome(c.send_answer_fields, args) == _outcome(codec.send_answer_fields_py, args)


def _index_put_args(room: int, count: int, keys: Any, **over: Any) -> tuple[Any, ...]:
    """index_put's arguments for an index file of 8 slots and room for ``room`` entries, with
    ``count`` so far (the file's entries at slot 3, chained as a put writes them)."""
    buf = bytearray(index_file.index_file_size(8, room))
    entries_at = index_file.HEADER_SIZE + 8 * index_file.SLOT_SIZE
    if count:
        index_file.SLOT.pack_into(buf, index_file.HEADER_SIZE + 3 * 4, count - 1)
    fields = {"slot_num": 8, "index_num": room, "entries_at": entries_at, "count": count}
    fields |= {"slot_count": count, "begin": 1_700_000_000_000, "prefix": -12345, "keys": keys}
    fields |= {"phy": 4096, "store": 1_700_000_005_000}
    fields |= over
    return (buf, *fields.values())


def _dispatchc_cases(c: Any) -> Iterator[Case]:
    data = encode_record(_messages()[0])
    for blob in _hostile(data, 5):
        for size in (len(data), len(blob), 0, -1):
            yield "record_is", c.record_is, get_message._record_is_py, (blob, size)
    keys = ["k1", "\u00e9\U0001f600", "", "TopicTest#key"] * 3
    for args in (
        _index_put_args(16, 0, keys),
        _index_put_args(16, 1, keys),
        _index_put_args(16, 5, keys, begin=0, store=-1),
        _index_put_args(16, 14, keys),  # fills up
        _index_put_args(16, 16, keys),  # already full
        _index_put_args(16, 2, ("a", "b"), prefix=0xFFFFFFFF, phy=-1),
        _index_put_args(16, 2, ["a", 5, "b"]),  # written up to the bad key
        _index_put_args(16, 2, 5),
        _index_put_args(16, 2, keys, slot_num=0),
        _index_put_args(16, 2, keys, slot_num=2**20),
        _index_put_args(16, 2, keys, index_num=17),
        (*_index_put_args(16, 2, keys)[:4], -1, *_index_put_args(16, 2, keys)[5:]),
        _index_put_args(16, 2, keys, prefix=2**32),
        _index_put_args(16, 2, keys, phy=2**63),
        _index_put_args(16, 2, keys, store=1.5),
        (b"\x00" * 1000, *_index_put_args(16, 0, keys)[1:]),
        ("text", *_index_put_args(16, 0, keys)[1:]),
    ):
        yield "index_put", c.index_put, index_file.index_put_py, args
    yield from _dispatchc_hint_cases(c)


def _log_region(base: int) -> bytes:
    """Records as a commit-log file from ``base`` holds them (each at its own physical offset):
    plain ones, one with odd properties, one of the schedule topic, one with an IPv6 host."""
    specs: list[tuple[str, dict[str, str], tuple[str, int]]] = [
        ("T", {"TAGS": "a", "KEYS": "k1 k2", "UNIQ_KEY": "U1", "X": "y"}, ("10.0.0.1", 5)),
        ("T2", {}, ("10.0.0.1", 5)),
        ("T", {"WAIT": "true"}, ("10.0.0.1", 5)),
        ("T", {"A": "b\x01c"}, ("10.0.0.1", 5)),  # not strictly formed
        ("T", {"TAGS": "z"}, ("10.0.0.1", 5)),
        ("SCHEDULE_TOPIC_XXXX", {"DELAY": "3"}, ("10.0.0.1", 5)),
        ("T", {"TAGS": "z"}, ("::1", 5)),
    ]
    out = bytearray()
    for topic, props, host in specs:
        msg = MessageExt(topic=topic, body=b"b" * len(out), properties=props, born_host=host)
        msg.commitlog_offset, msg.queue_offset, msg.store_timestamp = base + len(out), 9, 77
        out += encode_record(msg)
    return bytes(out)


def _dispatchc_hint_cases(c: Any) -> Iterator[Case]:
    base = 1 << 30
    region = _log_region(base)
    skip = b"SCHEDULE_TOPIC_XXXX"
    for data in _hostile(region, 9):
        for pos, rows in ((0, 1024), (0, 2), (0, 0), (len(data) + 5, 9)):
            args = (data, pos, len(data), base, rows, skip, DispatchHint)
            yield "record_hints", c.record_hints, reput.record_hints_py, args
    cut = region.index(b"T2") - 200  # inside the first record
    at = 0
    while at < len(region):  # from each record on: the odd one, the skipped, the IPv6 one
        args = (region, at, 1 << 20, base, 9, skip, None)
        yield "record_hints", c.record_hints, reput.record_hints_py, args
        at += struct.unpack_from(">i", region, at)[0]
    for args in (
        (memoryview(region), 0, 1 << 40, base, 9, skip, None),
        (bytearray(region), cut, len(region), base, 9, skip, DispatchHint),
        (region, 0, len(region), base + 1, 9, skip, None),  # not at their own offsets
        (region, 0, len(region), base, 9, b"", None),
        (region, 0, len(region), base, 9, "S", None),
        (region, 0, len(region), base, 9, skip, tuple),
        (region, -1, len(region), base, 9, skip, None),
        (region, 0, len(region), -1, 9, skip, None),
        ("text", 0, 4, base, 9, skip, None),
    ):
        yield "record_hints", c.record_hints, reput.record_hints_py, args


def _sendc_cases(c: Any) -> Iterator[Case]:
    twin = send.send_answer_frame_py
    for opaque, queue_id, offset, version in (
        (0, 0, 0, 0),
        (2**31 - 1, -(2**31), 2**63 - 1, 401),
        (-(2**31), 7, -(2**63), -1),
        (2**31, 0, 0, 401),
        (0, 0, 2**63, 401),
        (0, "1", 0, 401),
    ):
        for msg_id in ("0A0B", "A" * 32 + "," + "B" * 32, "", "\u00e9", 5):
            for region, trace in ((b'"DefaultRegion"', True), (b'"\\u00e9"', False), ("r", 0)):
                args = (opaque, msg_id, queue_id, offset, region, trace, version)
                yield "send_answer_frame", c.send_answer_frame, twin, args
    args = (1, "x" * 0xFFFFFF, 0, 0, b'"r"', True, 401)
    yield "send_answer_frame", c.send_answer_frame, twin, args


_TOPICS = {"T": b"T", "T2": b"Topic-2", "Long": b"L" * 128, "Nul": b"N\x00", "S": b"S"}
_TIMES = [1_700_000_000_001 + i for i in range(8)]


def _run_args(**over: Any) -> tuple[Any, ...]:
    """encode_run's arguments, the queue table as items and the clock as its readings (see
    _run), with ``over``."""
    fields: dict[str, Any] = {"buf": bytearray(3000), "pos": 8, "limit": 3000}
    fields |= {"file_from": 1 << 30, "entries": [_entry()], "table": (), "times": _TIMES}
    fields |= {"topics": _TOPICS, "cluster_b": b"DefaultCluster", "born_ip": b"\x7f\x00\x00\x01"}
    fields |= {"born_port": 5, "store_ip": b"\x0a\x00\x00\x02", "store_port": 10911}
    fields |= {"max_bp": 4096, "stop_flags": 0x4 | 0x8, "stop_topic": "S"}
    fields |= {"hint_type": DispatchHint} | over
    return tuple(fields.values())


def _entry(topic: Any = "T", queue_id: Any = 3, body: Any = b"hello", **over: Any) -> Any:
    """An encode_run entry: a single send, or with props=None a batch body."""
    fields = {"props": "TAGS\x01a\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01U1\x02WAIT\x01false"}
    fields |= {"flag": -1, "sys_flag": 0, "born": 1_700_000_000_000, "reconsume": 0} | over
    return (topic, queue_id, body, *fields.values())


def _run(fn: Callable[..., Any]) -> Callable[..., Any]:
    """encode_run with a fresh queue table (from ``table``'s items) and a clock reading
    ``times`` in turn (None: the wall clock, then the stamp is left out), giving the table
    afterwards too, and an error returned after a commit as its type."""

    def call(buf: Any, pos: Any, limit: Any, file_from: Any, entries: Any, table: Any,
             times: Any, topics: Any, *rest: Any) -> Any:  # fmt: skip
        queue_table = dict(table)
        clock = None if times is None else iter(times).__next__
        out = fn(buf, pos, limit, file_from, entries, topics, queue_table, clock, *rest)
        if isinstance(out, tuple) and isinstance(out[4], BaseException):
            out = (*out[:4], type(out[4]))
        return out, queue_table

    return call


def _run_table() -> Iterator[tuple[Any, ...]]:
    """encode_run's inputs: every reason a send is left to the general path or refused, at
    the head of a run (nothing committed) and after a record (committed, then the stop)."""
    many = "\x02".join(f"p{i}\x01v" for i in range(33))
    for props in (
        "", "WAIT\x01TRUE\x02a\x01b\x02", "\x01x\x02y\x01\x02a\x01b\x01c\x02\x02", "DELAY\x010",
        "TRAN_MSG\x01true", "TIMER_DELAY_MS\x015", "TIMER_\x015", "CLUSTER\x01x",
        "a\x01b\x02a\x01c", many, many[: many.rindex("\x02")], "\u00e9\x01x", "a\x00\x01b",
        "a\x01" + "b" * 70000, "a\x01" + "b" * 33000, b"a\x01b", "DELAY\x012",
    ):  # fmt: skip
        yield _run_args(entries=[_entry(props=props)])
        yield _run_args(entries=[_entry(), _entry(props=props)], max_bp=1 << 20)
    for over in (
        {"body": memoryview(b"x" * 300)}, {"body": "text"}, {"body": bytearray(b"x")},
        {"body": b"x" * 5000}, {"flag": 2**31}, {"sys_flag": 0x10}, {"sys_flag": 0x4},
        {"queue_id": 2**31}, {"reconsume": -(2**31)}, {"born": 2**63}, {"topic": "S"},
        {"topic": "Missing"}, {"topic": "Long"}, {"topic": "Nul"}, {"topic": 5},
    ):  # fmt: skip
        for entries in ([_entry(**over)], [_entry(), _entry(**over), _entry()]):
            yield _run_args(entries=entries)
    for at, value in (
        ("hint_type", None), ("hint_type", tuple), ("hint_type", 5), ("max_bp", 40),
        ("max_bp", -1), ("limit", 130), ("limit", 131), ("limit", 0), ("pos", 3100),
        ("buf", b"\x00" * 600), ("buf", None), ("file_from", 2**62), ("born_ip", b"\x00" * 16),
        ("store_ip", "1.2.3.4"), ("store_ip", b"\x00" * 3), ("cluster_b", b""),
        ("cluster_b", b"\x02x"), ("cluster_b", "C"), ("born_port", "5"), ("store_port", 2**31),
        ("topics", []), ("entries", ()), ("entries", []), ("entries", [(1, 2)]),
        ("entries", [_entry(), (1, 2)]), ("table", ((("T", 3), 41),)),
        ("table", ((("T", 3), -1),)),
        ("times", None), ("times", _TIMES[:1]), ("stop_topic", b"S"),
    ):  # fmt: skip
        two = {"entries": [_entry(), _entry("T2", 1, b"x" * 100)]}
        yield _run_args(**(two | {at: value}))
    items = [
        BatchItem(b"x" * 40, 0, {"TAGS": "a", "WAIT": "true", "DELAY": "0"}),
        BatchItem(b"", 7, {"KEYS": "k", "UNIQ_KEY": "u", "WAIT": "false"}),
        BatchItem(b"y", -1, {}),
    ]
    body = encode_batch_body(items)
    for data in [*_hostile(body, 6), b"", encode_batch_body([BatchItem(b"z", 0, {"DELAY": "1"})])]:
        for limit in (1000, 300):
            yield _run_args(entries=[_entry(body=data, props=None)], limit=limit)
    for header in ((0, 0), (7, 3), (2**62, 1), (1, -1), (1,), [1, 2], "x"):
        for limit in (3000, 400, 180):
            yield (*_run_args(entries=[_entry(), _entry(body=body, props=None)], limit=limit),
                   header)  # fmt: skip
    for entries in (
        [_entry(body=memoryview(body), props=None), _entry(), _entry(body=body, props=None)],
        [_entry(), _entry(body=body[:-1], props=None), _entry()],
        [_entry(body=body, props=None, sys_flag=0x10)],
        [_entry(body=5, props=None)],
    ):
        yield _run_args(entries=entries, table=((("T", 3), 9),))


def _commitlogc_cases(c: Any) -> Iterator[Case]:
    for args in _run_table():
        yield "encode_run", _run(c.encode_run), _run(commitlog.encode_run_py), args


_PROPERTY = st.sampled_from(
    ["TAGS\x01a", "KEYS\x01k1 k2", "UNIQ_KEY\x010A09", "WAIT\x01true", "WAIT\x01false",
     "WAIT\x01TRUE", "DELAY\x012", "DELAY\x010", "TRAN_MSG\x01true", "A\x01\u00e9", "CLUSTER\x01x",
     "X\x01y", "\x01v", "TIMER_DELAY_MS\x011"]
)  # fmt: skip
_ITEMS = st.lists(
    st.builds(BatchItem, st.binary(max_size=80), st.integers(-(2**31), 2**31 - 1),
              st.dictionaries(st.sampled_from(["TAGS", "KEYS", "WAIT", "DELAY", "a"]),
                              st.sampled_from(["", "0", "1", "t", "\u00e9"]), max_size=3)),
    max_size=4,
).map(encode_batch_body)  # fmt: skip
_RUN_ENTRY = st.tuples(
    st.sampled_from(["T", "T2", "Missing", "S", "Long", "Nul"]),
    st.integers(0, 3),
    st.binary(max_size=300) | _ITEMS,
    st.lists(_PROPERTY, max_size=4).map("\x02".join) | st.none(),
    st.integers(-(2**31), 2**31 - 1),
    st.sampled_from([0, 0, 0, 1, 2, 4, 8, 0x10, 0x20]),
    st.integers(0, 2**41),
    st.integers(0, 16),
)


@settings(max_examples=300, deadline=None)
@given(
    entries=st.lists(_RUN_ENTRY, max_size=6),
    start=st.integers(0, 64),
    room=st.integers(0, 3200),  # past the buffer's end too
    known=st.dictionaries(st.tuples(st.just("T"), st.integers(0, 3)), st.integers(0, 10**12)),
    cut=st.integers(0, 3),
    header=st.none() | st.tuples(st.integers(0, 2**40), st.integers(0, 2**40)),
)
def test_encode_run_agrees_with_its_twin(entries, start, room, known, cut, header) -> None:
    """Runs of single sends and batch bodies (cut short at times), every stop among them,
    as plain records or DLedger entries (entry_header)."""
    entries = [(*e[:2], e[2][: len(e[2]) - cut] if e[3] is None else e[2], *e[3:]) for e in entries]
    args = _run_args(entries=entries, pos=start, limit=start + room, table=tuple(known.items()))
    if header is not None:
        args = (*args, header)
    c = load_native("pymq.store._commitlogc")
    assert _outcome(_run(c.encode_run), args) == _outcome(_run(commitlog.encode_run_py), args)


CASES: dict[str, Callable[[Any], Iterator[Case]]] = {
    "pymq.broker._sendc": _sendc_cases,
    "pymq.common._recordc": _recordc_cases,
    "pymq.remoting._codecc": _codecc_cases,
    "pymq.store._commitlogc": _commitlogc_cases,
    "pymq.store._dispatchc": _dispatchc_cases,
}


@pytest.mark.parametrize("module", sorted(CASES))
def test_c_module_agrees_with_its_python_twins(module: str) -> None:
    c = load_native(module)
    assert c is not None, f"{module} was not built"
    seen = set()
    for name, c_fn, py_fn, args in CASES[module](c):
        seen.add(name)
        assert _outcome(c_fn, args) == _outcome(py_fn, args), (name, args)
    assert seen, module


@pytest.mark.parametrize("module", C_MODULES)
def test_c_module_has_a_stub_naming_its_functions(module: str) -> None:
    c = importlib.import_module(module)
    stub = pathlib.Path(c.__file__).parent / (module.rsplit(".", 1)[1] + ".pyi")
    tree = ast.parse(stub.read_text())
    stubbed = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert stubbed == {k for k in vars(c) if not k.startswith("__")}
