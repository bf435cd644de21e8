"""Each C module against its Python twins: the same answer (or the same exception type) on the
same inputs, ordinary and hostile (truncated, corrupted, random bytes), one parametrised test
per module; and every C module has a stub naming exactly its functions.  Skipped under
PYMQ_PURE_PYTHON=1, where the twins alone are in use (and the rest of the suite runs on them).

Functions whose own tests check them, C and twin alike, against a reference are not repeated
here (json_command but for its arguments' edges): json_header and json_command
(tests/unit/test_codec.py, against json's reading; json_header's bounds and refusals),
send_header and plain_header (tests/unit/test_headers.py, against the generic decoder, odd
values included), send_answer_frame (tests/unit/test_recordc.py, against json_response_frame;
its refusals), send_fields and send_answer_fields (tests/unit/test_send_run_c.py and
test_send_answer.py, against decode_frame and the headers' from_ext, sound and damaged; their
bounds and refusals), send_run_fields and send_answer_run (tests/unit/test_send_run_c.py,
against send_fields and send_answer_frame one by one), export_columns (tests/spark/test_columns.py,
against the per-record path), send_frame and batch_body (tests/unit/test_client_frames.py and
test_batch_encoding.py, against the codec and the reference writer), encode_run
(tests/store/test_batch_fast_path.py, against the general path; tests/unit/test_encode_run.py,
each stop, refusal and commit rule), record_hints (tests/store/test_dispatch_hints.py, against
read_record_info, on damaged logs too; tests/store/test_dispatch_hinted_diff.py, against the
general path)."""

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

from pymq.common import batch, clock, message_ext, message_id, record
from pymq.common.batch import BatchItem, encode_batch_body
from pymq.common.message_ext import MessageExt
from pymq.common.native import load_native, pure_python_requested
from pymq.common.record import RecordError
from pymq.remoting import codec, headers
from pymq.store import commitlog, get_message, index_file
from pymq.store.commitlog import encode_record
from tests.helpers import C_MODULES, implementations
from tests.unit import test_recordc

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
    """decode_plain, scan and decode_batch: the record layout's functions."""
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


_SEND_EXT = headers.SendMessageRequestHeader.v2_ext("g", "T", 1, 0, 1700000000000, 0, "p", False)


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


def _commitlogc_cases(c: Any) -> Iterator[Case]:
    msgs = _messages()
    msgs[0].prepared_transaction_offset, msgs[0].sys_flag = 4096, 0x4
    encoded = [(m.topic.encode(), message_ext.properties_bytes(m.properties)) for m in msgs]
    encoded[1] = (encoded[1][0], b"A\x01\x00\x02")  # a NUL in the properties
    fixed = (91, 103)
    odd_host = MessageExt(topic="T", born_host=("not an address", 1))
    no_body = MessageExt(topic="T", body=None)  # type: ignore[arg-type]
    for args in (
        (msgs, encoded, fixed, message_id.pack_ip, {}),
        (msgs[:1], encoded[:1], fixed, message_id.pack_ip, {"127.0.0.1": b"\x01\x02\x03\x04"}),
        (tuple(msgs[:1]), tuple(encoded[:1]), fixed, message_id.pack_ip, {}),
        ([], [], fixed, message_id.pack_ip, {}),
        (msgs, encoded[:2], fixed, message_id.pack_ip, {}),  # encoded too short
        (msgs[:1], [[b"T", b""]], fixed, message_id.pack_ip, {}),  # an item that is no pair
        (msgs[:1], [(b"T", b"", b"")], fixed, message_id.pack_ip, {}),
        ([odd_host], [(b"T", b"")], fixed, message_id.pack_ip, {}),
        ([no_body], [(b"T", b"")], fixed, message_id.pack_ip, {}),
        (msgs[:1], [(b"T", 5)], fixed, message_id.pack_ip, {}),  # properties without a length
        (msgs[:1], encoded[:1], (91,), message_id.pack_ip, {}),
        (msgs[:1], encoded[:1], ("91", 103), message_id.pack_ip, {}),
        (5, encoded, fixed, message_id.pack_ip, {}),
        (msgs[:1], encoded[:1], fixed, message_id.pack_ip, []),  # no dict
        ([odd_host], [(b"T", b"")], fixed, message_id.pack_ip, {"not an address": b"\x7f\0\0\1"}),
    ):
        yield "stored_entries", c.stored_entries, commitlog.stored_entries_py, args


@pytest.mark.parametrize(
    "stored_entries",
    implementations("pymq.store._commitlogc", "stored_entries", commitlog.stored_entries_py),
)
def test_stored_entries_pack_each_born_host_once_in_a_bounded_cache(
    stored_entries: Callable[..., Any],
) -> None:
    """A born host is packed once and kept in the commit log's dict of peers' addresses (its
    packed form taken from there afterwards), which is emptied when it is full."""
    packed: list[str] = []

    def pack(host: str) -> bytes:
        packed.append(host)
        return message_id.pack_ip(host)

    msgs = [MessageExt(topic="T", born_host=(f"10.0.0.{i % 2}", 1)) for i in range(4)]
    encoded = [(b"T", b"")] * 4
    born_ips: dict[str, bytes] = {"10.0.0.1": b"\x0a\x00\x00\x09"}  # kept: taken as it is
    entries, *_ = stored_entries(msgs, encoded, (91, 103), pack, born_ips)
    assert packed == ["10.0.0.0"]
    assert [e[8] for e in entries] == [b"\x0a\x00\x00\x00", b"\x0a\x00\x00\x09"] * 2
    assert born_ips == {"10.0.0.0": b"\x0a\x00\x00\x00", "10.0.0.1": b"\x0a\x00\x00\x09"}
    full = {f"host{i}": b"\0\0\0\0" for i in range(commitlog.BORN_IPS_MAX)}
    stored_entries(msgs[:1], encoded[:1], (91, 103), pack, full)
    assert full == {"10.0.0.0": b"\x0a\x00\x00\x00"}


CASES: dict[str, Callable[[Any], Iterator[Case]]] = {
    "pymq.store._commitlogc": _commitlogc_cases,
    "pymq.common._recordc": _recordc_cases,
    "pymq.remoting._codecc": _codecc_cases,
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
