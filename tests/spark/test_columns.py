"""The export's column decoder (C, or its twin under PYMQ_PURE_PYTHON=1) against the per-record
path: the same rows, the same reports.

No Spark here: the data source's ``read`` is driven directly over commit-log files written with
the record codec (odd records included: IPv6 hosts, compressed bodies, repeated and empty
properties, non-ASCII text, corrupt bytes).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from typing import Any

import attrs
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.pandas.types import to_arrow_schema

from pymq.common.message_ext import MessageExt, MessageSysFlag
from pymq.export import columns, datasource
from pymq.export.datasource import SCHEMA, PymqReader
from pymq.export.options import CheckpointBound, ExportOptions, Mode
from pymq.export.scan import CorruptRecordError, SegmentScan, plan_store
from pymq.store.commitlog import encode_record
from tests.helpers import damaged, implementations

FILE_SIZE = 64 * 1024
STORED_AT = 1_700_000_000_000


def odd_messages(count: int) -> list[MessageExt]:
    """Mostly ordinary messages, with every kind the column decoder leaves to the per-record
    path."""
    out = []
    for i in range(count):
        props: dict[str, str] = {"UNIQ_KEY": f"{i:032X}", "seq": str(i)}
        if i % 4:
            props["TAGS"] = f"tag{i % 3}"
        if i % 5:
            props["KEYS"] = f"k{i}  all " if i % 2 else f"k{i}"
        if i % 7 == 1:
            props["note"] = f"ü{i} 中文"
        body = bytes((i * 31 + j) % 251 for j in range(i * 13 % 700))
        sys_flag = 0
        if i % 17 == 5:
            body = zlib.compress(b"compressed " * 50)
            sys_flag |= MessageSysFlag.COMPRESSED_FLAG
        born = ("::1", 5000) if i % 23 == 11 else ("10.0.0.7", 40000 + i)
        if i % 29 == 3:  # ports are int32 in the record: any value decodes
            born = ("0.0.0.0", -(2**31) if i % 2 else 2**31 - 1)
        out.append(
            MessageExt(
                topic=("Orders", "Audit", "Tópico", "%RETRY%g")[i % 4],
                body=body,
                flag=i % 3,
                properties=props,
                queue_id=i % 4,
                queue_offset=i // 4,
                sys_flag=sys_flag,
                born_timestamp=STORED_AT - 5 + i,
                born_host=born,
                store_timestamp=STORED_AT + i,
                store_host=("192.168.1.20", 10911),
                reconsume_times=i % 2,
            )
        )
    return out


def with_properties(text: str) -> bytes:
    """A record whose PROPERTIES field is ``text`` as is (the codec would never write
    repeated names, empty values or stray separators)."""
    template = encode_record(MessageExt(topic="Props", body=b"raw", properties={}))
    raw = text.encode()
    new = bytearray(template[:-2] + len(raw).to_bytes(2, "big") + raw)  # no properties before
    new[:4] = len(new).to_bytes(4, "big")
    return bytes(new)


def write_store(root: str, messages: list[MessageExt], extra: tuple[bytes, ...] = ()) -> str:
    """A store of FILE_SIZE commit-log files holding ``messages`` then the raw ``extra``
    records (given with PHYSICALOFFSET 0, fixed up here); the last file zero-padded."""
    directory = os.path.join(root, "commitlog")
    os.makedirs(directory)
    records = []
    for msg in messages:
        records.append(lambda at, m=msg: encode_record(_at(m, at)))
    for raw in extra:
        records.append(lambda at, r=raw: r[:28] + at.to_bytes(8, "big") + r[36:])
    files: list[bytearray] = [bytearray()]
    offset = 0
    for make in records:
        data = make(offset)
        if len(files[-1]) + len(data) + 8 > FILE_SIZE:
            blank = FILE_SIZE - len(files[-1])
            files[-1] += blank.to_bytes(4, "big") + (0xCBD43194).to_bytes(4, "big")
            files[-1] += bytes(blank - 8)
            offset += blank
            files.append(bytearray())
            data = make(offset)
        files[-1] += data
        offset += len(data)
    files[-1] += bytes(FILE_SIZE - len(files[-1]))
    for i, data in enumerate(files):
        with open(os.path.join(directory, f"{i * FILE_SIZE:020d}"), "wb") as f:
            f.write(data)
    return root


def _at(msg: MessageExt, offset: int) -> MessageExt:
    return attrs.evolve(msg, commitlog_offset=offset)


def read_all(opts: ExportOptions, decoder: Any) -> tuple[pa.Table, list[dict]]:
    """Every segment read as the data source reads it: (all rows, each segment's report)."""
    reader = PymqReader(opts)
    arrow_schema = to_arrow_schema(SCHEMA, timezone="UTC")
    msg_id = datasource._MsgIds()
    batches, reports = [], []
    for segment in plan_store(opts).segments:
        scan = SegmentScan(segment, reader.options)
        to_batch = lambda msgs: datasource.to_record_batch(msgs, arrow_schema, msg_id)  # noqa: E731
        batches.extend(scan.arrow_batches(arrow_schema, to_batch, 50, 20_000, decoder))
        reports.append(scan.report.to_json())
    return pa.Table.from_batches(batches, schema=arrow_schema), reports


def both_paths(opts: ExportOptions, decoder: Any = None) -> tuple[pa.Table, list[dict], int]:
    """The rows and reports of the column decoder (``decoder``, else as picked) and of the
    per-record path, which must be the same; and the rows the column decoder gave."""
    rows = [0]

    def counting(*args: Any) -> Any:
        result = (decoder or columns.export_columns)(*args)
        rows[0] += result[1]
        return result

    table, reports = read_all(opts, counting)
    pure_table, pure_reports = read_all(opts, None)
    if not table.equals(pure_table):
        pairs = zip(table.to_pylist(), pure_table.to_pylist(), strict=False)
        pytest.fail(f"{table.num_rows} rows vs {pure_table.num_rows}, first differing: "
                    f"{next(((x, y) for x, y in pairs if x != y), None)}")  # fmt: skip
    assert reports == pure_reports
    return table, reports, rows[0]


@pytest.fixture(scope="module")
def odd_store(tmp_path_factory) -> str:
    """odd_messages, one stored past year 292,000 (the header has no CRC: a bad record, which
    used to fail the whole task in the Arrow conversion), and records of odd properties."""
    root = str(tmp_path_factory.mktemp("odd-store"))
    msgs = odd_messages(300)
    msgs[2] = attrs.evolve(msgs[2], store_timestamp=1 << 62)
    extra = tuple(
        with_properties(text)
        for text in (
            "TAGS\x01first\x02a\x01b\x02TAGS\x01second",  # a repeated name: last value wins
            "TAGS\x01\x02KEYS\x01 \x02\x01v\x02n\x01",  # empty names and values are dropped
            "\x02\x02UNIQ_KEY\x01u\x01v\x02",  # a separator inside a value, and at the ends
            "",
            # A NUL where no torn write leaves one (not the first or last byte, nor at a
            # 512-byte boundary of the file) is data: exported, as recovery keeps it.
            "UNIQ_KEY\x01ab\0cd",
        )
    )
    return write_store(root, msgs, extra)


OPTIONS = [
    {},
    {"topics": frozenset({"Audit", "%RETRY%g"})},
    {"include_system_topics": True},
    {"from_time": STORED_AT + 100, "to_time": STORED_AT + 250},
    {"from_offset": 70_000, "to_offset": 150_000},
    {"until_checkpoint": CheckpointBound.NO, "from_time": -(1 << 62)},
]


@pytest.mark.parametrize(
    "decoder", implementations("pymq.export._columnsc", "export_columns", columns.export_columns_py)
)
@pytest.mark.parametrize("options", OPTIONS)
def test_both_paths_give_the_same_rows_and_reports(odd_store, options, decoder):
    table, reports, rows = both_paths(ExportOptions(path=odd_store, **options), decoder)
    assert rows > table.num_rows * 0.7 > 0, "the column decoder took few rows: is it used?"
    if options:
        return
    assert table.num_rows == 300 - 75 - 1 + 5  # %RETRY% topics are system topics; a bad one
    assert len(reports) >= 3
    (bad,) = [b for r in reports for b in r["bad_ranges"]]
    assert "timestamp out of range" in bad["reason"]
    props = [r for r in table.to_pylist() if r["topic"] == "Props"]
    assert [dict(r["properties"]) for r in props] == [
        {"TAGS": "second", "a": "b"}, {"KEYS": " "}, {"UNIQ_KEY": "u\x01v"}, {},
        {"UNIQ_KEY": "ab\0cd"},
    ]  # fmt: skip
    assert [r["tags"] for r in props] == ["second", None, None, None, None]
    assert [r["keys"] for r in props] == [[]] * 5
    assert [r["unique_key"] for r in props[2:]] == ["u\x01v", None, "ab\0cd"]
    multi = [r for r in table.to_pylist() if r["keys"] and len(r["keys"]) > 1]
    assert multi and all(r["keys"][1] == "all" for r in multi)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(where=st.integers(0, 3 * FILE_SIZE), value=st.integers(0, 255), truncate=st.booleans())
def test_corrupt_bytes_are_judged_alike(odd_store, tmp_path_factory, where, value, truncate):
    """One damaged byte (or a torn tail) anywhere: same rows kept, same bad ranges reported."""
    root = str(tmp_path_factory.mktemp("damaged"))
    os.makedirs(os.path.join(root, "commitlog"))
    names = sorted(os.listdir(os.path.join(odd_store, "commitlog")))
    for i, name in enumerate(names):
        with open(os.path.join(odd_store, "commitlog", name), "rb") as f:
            data = bytearray(f.read())
        if where // FILE_SIZE == i:
            data = damaged(data, where % FILE_SIZE, value, truncate)
        with open(os.path.join(root, "commitlog", name), "wb") as f:
            f.write(data)
    both_paths(ExportOptions(path=root, include_system_topics=True))


def test_compressed_bodies_and_ipv6_hosts_stay_in_the_c_run(tmp_path):
    """Clients compress bodies over 4 KiB, and hosts are of either family: such records must not
    split the column decoder's runs into one-row batches.  One flagged compressed does not
    inflate: exported as stored.  Host texts and message ids as the per-record path makes them
    (ipaddress's IPv6 text, a 56-digit offset id)."""
    hosts = [("10.0.0.1", 1), ("::1", 2), ("2001:db8::1:0:0:1", -3), ("::ffff:1.2.3.4", 4)]
    msgs = []
    for i, m in enumerate(odd_messages(40)):
        m = attrs.evolve(m, topic="Orders", born_host=hosts[i % 4], store_host=hosts[i // 3 % 4])
        if i % 2:
            body = b"not zlib at all" if i == 7 else zlib.compress(b"big body %d " % i * 400)
            m = attrs.evolve(m, body=body, sys_flag=m.sys_flag | MessageSysFlag.COMPRESSED_FLAG)
        msgs.append(m)
    table, reports, rows = both_paths(ExportOptions(path=write_store(str(tmp_path), msgs)))
    assert rows == table.num_rows == 40
    bodies = table.column("body").to_pylist()
    assert bodies[3] == b"big body 3 " * 400 and bodies[7] == b"not zlib at all"
    assert sum(r["body_bytes"] for r in reports) == sum(len(b) for b in bodies)
    assert {len(m) for m in table.column("msg_id").to_pylist()} == {32, 56}
    assert "[2001:db8::1:0:0:1]:-3" in table.column("born_host").to_pylist()


def test_export_columns_hands_compressed_bodies_to_inflate():
    data = bytearray()
    for i in range(3):
        flag = MessageSysFlag.COMPRESSED_FLAG if i == 1 else 0
        m = MessageExt(topic="T", body=b"stored%d" % i, sys_flag=flag, commitlog_offset=len(data))
        data += encode_record(m)
    assert next(_runs(bytes(data)))[1] == 1  # no inflate: the compressed record ends the run
    calls = []

    def inflate(body: bytes, offset: int) -> bytes:
        calls.append((body, offset))
        return b"inflated!"

    end, rows, _, body_bytes, buffers = next(_runs(bytes(data), inflate=inflate))
    assert (end, rows, body_bytes) == (len(data), 3, 7 + 9 + 7)
    assert calls == [(b"stored1", len(encode_record(MessageExt(topic="T", body=b"stored0"))))]
    assert bytes(buffers[-1]) == b"stored0inflated!stored2"
    with pytest.raises(TypeError):
        next(_runs(bytes(data), inflate=lambda body, offset: "not bytes"))
    with pytest.raises(KeyError):
        next(_runs(bytes(data), inflate=lambda body, offset: {}[offset]))


def test_failfast_raises_on_the_c_path_too(odd_store, tmp_path):
    root = str(tmp_path)
    os.makedirs(os.path.join(root, "commitlog"))
    name = sorted(os.listdir(os.path.join(odd_store, "commitlog")))[0]
    with open(os.path.join(odd_store, "commitlog", name), "rb") as f:
        data = bytearray(f.read())
    data[5000] ^= 0xFF
    with open(os.path.join(root, "commitlog", name), "wb") as f:
        f.write(data)
    opts = ExportOptions(path=root, mode=Mode.FAILFAST)
    with pytest.raises(CorruptRecordError):
        read_all(opts, columns.export_columns)


def _runs(data: bytes, **kw: Any) -> Iterator[tuple]:
    yield columns.export_columns(
        data,
        kw.get("pos", 0),
        kw.get("stop", len(data)),
        kw.get("base", 0),
        kw.get("stop_ts"),
        kw.get("rows", 1000),
        kw.get("body", 1 << 20),
        kw.get("inflate"),
        kw.get("host6"),
    )


def test_export_columns_stops_where_it_must():
    msgs = [_at(m, 0) for m in odd_messages(8) if not m.sys_flag and ":" not in m.born_host[0]]
    data = bytearray()
    for m in msgs:
        data += encode_record(_at(m, len(data)))
    sizes = [len(encode_record(m)) for m in msgs]
    ((end, rows, record_bytes, body_bytes, buffers),) = _runs(bytes(data))
    assert (end, rows, record_bytes) == (len(data), len(msgs), len(data))
    assert body_bytes == sum(len(m.body) for m in msgs) == len(buffers[-1])
    assert _runs(bytes(data), rows=2).__next__()[:2] == (sizes[0] + sizes[1], 2)
    # The body limit lets the first row through whatever its size, and then stops.
    assert next(_runs(bytes(data), body=1))[1] == 1
    # Records stored after the bound are left to the caller.
    assert next(_runs(bytes(data), stop_ts=msgs[2].store_timestamp))[1] == 3
    # A record of more than 256 properties is left to the per-record path.
    many = encode_record(
        _at(attrs.evolve(msgs[0], properties={f"n{i}": "v" for i in range(257)}), 0)
    )
    assert next(_runs(many))[1] == 0
    # A body length past the record's end (IPv4 hosts: the length at byte 84).
    bad = bytearray(encode_record(_at(msgs[0], 0)))
    bad[84:88] = len(bad).to_bytes(4, "big")
    assert next(_runs(bytes(bad)))[1] == 0
    # A record must sit at its own physical offset.
    assert next(_runs(bytes(data), base=1))[1] == 0
    # Records must start before stop, and end inside the buffer.
    assert next(_runs(bytes(data), stop=sizes[0]))[1] == 1
    assert next(_runs(bytes(data[:-1])))[1] == len(msgs) - 1
    with pytest.raises(OverflowError):
        next(_runs(bytes(data), rows=0))
    with pytest.raises(OverflowError):
        next(_runs(bytes(data), pos=-1))


@settings(max_examples=300, deadline=None)
@given(
    cut=st.integers(0, 4000),
    tail=st.binary(max_size=300),
    pos=st.integers(0, 5000),
    stop=st.integers(0, 5000),
)
def test_export_columns_stays_inside_any_bytes(cut, tail, pos, stop):
    """Valid records then anything at all: no read past the buffer, and only whole records."""
    data = bytearray()
    for m in odd_messages(12):
        data += encode_record(_at(m, len(data)))
    data = bytes(data[:cut]) + tail
    ((end, rows, record_bytes, body_bytes, buffers),) = _runs(data, pos=pos, stop=stop)
    assert end - (pos if rows else end) == record_bytes <= len(data)
    assert rows == 0 or end <= len(data)
    assert len(buffers[-1]) == body_bytes
