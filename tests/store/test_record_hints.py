"""``record_hints`` (C, or its twin): the dispatch hints of records appended without one (an HA
slave's, recovery's, or past the put path's DISPATCH_HINTS_MAX), read back.  Each row must be what
reput's Python loop reads of its record (read_record_info, then property_value of TAGS, KEYS and
UNIQ_KEY), and the reading must stop, leaving the record to that loop, wherever the two could
differ; dispatching a log without hints must leave the same files with and without them."""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pymq.common.message_id import pack_ip
from pymq.common.record import (
    QUEUE_OFFSET_POSITION,
    property_value,
    read_record_info,
    record_length,
)
from pymq.common.topic import SCHEDULE_TOPIC
from pymq.store import reput as reput_module
from pymq.store.commitlog import DispatchHint, encode_run
from tests.store.test_dispatch_hinted_diff import Side, dispatch_in_lockstep

IP = pack_ip("10.1.2.3")


def record(
    props: bytes,
    phy: int,
    *,
    topic: bytes = b"T",
    queue_id: int = 3,
    queue_offset: int = 7,
    sys_flag: int = 0,
    store_timestamp: int = 1_800_000_000_123,
    body: bytes = b"body",
) -> bytes:
    """A record as the store's one record encoder writes a stored message (its properties as
    given), at physical offset ``phy``, with this queue offset whatever its sys flag."""
    buf = bytearray(record_length(sys_flag, len(body), len(topic), len(props)))
    entry = ("t", queue_id, body, props, 0, sys_flag, 1_800_000_000_000, 0, IP, 1234, 0)
    _, rows, _, _, _ = encode_run(
        buf, 0, len(buf), phy, [entry], {"t": topic}, {}, lambda: store_timestamp, b"", b"", 0,
        IP, 10911, 0, 0, "", None,
    )  # fmt: skip
    assert rows, "the record did not fit its layout"
    buf[QUEUE_OFFSET_POSITION : QUEUE_OFFSET_POSITION + 8] = queue_offset.to_bytes(8, "big")
    return bytes(buf)


def python_row(log: bytes, pos: int, file_from: int) -> DispatchHint:
    """What reput's Python loop reads of the record at ``pos``."""
    info = read_record_info(log, pos, check_crc=False)
    props = info.properties
    return DispatchHint(
        file_from + pos, info.size, info.topic, info.queue_id, info.queue_offset,
        property_value(props, "TAGS"), info.store_timestamp, info.sys_flag,
        property_value(props, "KEYS"), property_value(props, "UNIQ_KEY"),
    )  # fmt: skip


def read_back(log: bytes, file_from: int = 0, pos: int = 0, max_rows: int = 1 << 20):
    return reput_module._record_hints(
        log, pos, len(log), file_from, max_rows, SCHEDULE_TOPIC.encode(), DispatchHint
    )


def test_common_records_are_read_back_as_the_python_loop_reads_them() -> None:
    file_from = 1 << 30
    texts = [
        b"",
        b"UNIQ_KEY\x01AC11000100002A9F0000000000000000\x02WAIT\x01true\x02",
        b"TAGS\x01TagA\x02KEYS\x01order-1 order-2\x02UNIQ_KEY\x01U1\x02CLUSTER\x01C\x02",
        b"KEYS\x01k\x02TAGS\x01t",  # no last separator
        b"MIN_OFFSET\x010\x02MAX_OFFSET\x019\x02",
    ]
    log = b""
    for i, props in enumerate(texts):
        log += record(props, file_from + len(log), queue_id=i, queue_offset=10 + i,
                      sys_flag=4 if i == 2 else 0)  # fmt: skip
    rows, stop = read_back(log, file_from)
    assert stop == len(log)
    expected, pos = [], 0
    while pos < len(log):
        expected.append(python_row(log, pos, file_from))
        pos += expected[-1].size
    assert rows == expected
    assert all(type(r) is DispatchHint for r in rows)
    assert rows[2].tags == "TagA" and rows[2].keys == "order-1 order-2" and rows[1].tags is None
    # At most max_rows, and from any record.
    rows, stop = read_back(log, file_from, pos=expected[1].physical_offset - file_from, max_rows=2)
    assert rows == expected[1:3] and stop == expected[3].physical_offset - file_from


@pytest.mark.parametrize(
    "odd",
    [
        b"TAGS\x01a\x02TAGS\x01b\x02",  # a name twice: property_value takes the first
        b"KEYS\x01\x02",  # an empty value: property_value says None
        b"\x01v\x02",  # an empty name
        b"KEYS\x01a\x01b\x02",  # a value holding the name separator
        b"TAGS",  # a name without a value
        b"TAGS\x01\xe6\xa0\x87\x02",  # not ASCII
        b"TAGS\x01a\x00b\x02",  # a NUL
    ],
)
def test_reading_stops_where_the_python_loop_must_judge(odd: bytes) -> None:
    plain = record(b"TAGS\x01x\x02", 0)
    log = plain + record(odd, len(plain)) + record(b"TAGS\x01y\x02", 2 * len(plain) + 99)
    rows, stop = read_back(log)
    assert [r.tags for r in rows] == ["x"] and stop == len(plain)


def test_reading_stops_at_the_schedule_topic_a_blank_and_a_misplaced_record() -> None:
    first = record(b"", 0)
    scheduled = record(b"DELAY\x013\x02", len(first), topic=SCHEDULE_TOPIC.encode())
    assert read_back(first + scheduled)[1] == len(first)
    misplaced = record(b"", 12345)  # its physical offset is not where it lies
    assert read_back(first + misplaced)[1] == len(first)
    blank = (8).to_bytes(4, "big") + (0xCBD43194).to_bytes(4, "big")
    assert read_back(first + blank)[1] == len(first)
    assert read_back(first[:-1]) == ([], 0)  # cut short


_names = st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "WAIT", "CLUSTER", "X", "TAGSX", "KEY"])
_values = st.text(st.characters(min_codepoint=0, max_codepoint=0x7F), max_size=6)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.lists(st.tuples(_names, _values), max_size=5).map(
            lambda items: "".join(f"{n}\x01{v}\x02" for n, v in items).encode()
        ),
        min_size=1,
        max_size=6,
    ),
    st.lists(st.binary(max_size=6), max_size=6),
)
def test_every_row_read_back_is_the_python_loops(texts: list[bytes], cuts: list[bytes]) -> None:
    """Any properties (names twice, empty or odd values, junk bytes after them): each row read back
    equals the Python loop's reading of its record, and reading stops at the first record
    whose properties are not strictly name\\x01value\\x02 items with distinct names."""
    texts = [t + junk for t, junk in zip(texts, cuts + [b""] * len(texts), strict=False)]
    log = b""
    for props in texts:
        log += record(props, len(log))
    rows, stop = read_back(log)
    pos = 0
    for row in rows:
        assert row == python_row(log, pos, 0)
        pos += row.size
    assert stop == pos
    if stop < len(log):
        props = texts[len(rows)]
        items = props.split(b"\x02")
        if items and items[-1] == b"":
            items.pop()
        pairs = [i.split(b"\x01") for i in items]
        names = [p[0] for p in pairs]
        assert (
            any(len(p) != 2 or not p[0] or not p[1] for p in pairs)
            or len(set(n for n in names if n in (b"TAGS", b"KEYS", b"UNIQ_KEY")))
            < len([n for n in names if n in (b"TAGS", b"KEYS", b"UNIQ_KEY")])
            or any(b == 0 or b >= 0x80 for b in props)
        ), props


_TOPIC_BYTES = st.sampled_from([b"T", b"Other", SCHEDULE_TOPIC.encode(), "\u00e9t".encode()])
_PROPS = st.sampled_from(
    [
        b"",
        b"TAGS\x01TagA\x02",
        b"TAGS\x01TagB\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01U\x02",
        b"KEYS\x01  \x02",
        b"DELAY\x013\x02TAGS\x01d\x02",
        b"TAGS\x01a\x02TAGS\x01b\x02",
        b"KEYS\x01\xe4\xb8\xad\x02",
    ]
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(_TOPIC_BYTES, st.integers(0, 2), _PROPS, st.sampled_from([0, 4, 8, 12])),
        min_size=1,
        max_size=40,
    ),
    st.lists(st.integers(1, 9), min_size=1, max_size=4),
)
def test_a_log_without_hints_dispatches_as_the_python_loop_parses_it(
    specs: list[tuple[bytes, int, bytes, int]], limits: list[int]
) -> None:
    """The same log of real records and no hints (a slave's), dispatched with its hints read
    back and dispatch_hinted (as built), and by the general path parsing every record: the same
    consume queues, index files, arrivals and offsets after every call."""
    log = bytearray()
    offsets: dict[tuple[bytes, int], int] = {}
    for topic, queue_id, props, sys_flag in specs:
        queue_offset = offsets.get((topic, queue_id), 0)
        offsets[(topic, queue_id)] = queue_offset + 1
        log += record(
            props, len(log), topic=topic, queue_id=queue_id, queue_offset=queue_offset,
            sys_flag=sys_flag, store_timestamp=1_800_000_000_000 + len(log),
        )  # fmt: skip
    weight = reput_module.HINTED_PER_PARSED
    reput_module.HINTED_PER_PARSED = 1  # a read-back record and a parsed one weigh alike
    read: list[int] = []
    real = reput_module._record_hints

    def counted(*args):  # type: ignore[no-untyped-def]
        rows, stop = real(*args)
        read.append(len(rows))
        return rows, stop

    reput_module._record_hints = counted
    try:
        with tempfile.TemporaryDirectory() as tmp:
            sides = [
                Side(os.path.join(tmp, mode), log, mode, 64, 256, 20 * 64, [])
                for mode in ("fast", "general")
            ]
            try:
                dispatch_in_lockstep(sides, lambda rounds: limits[rounds % len(limits)])
                assert sides[0].reput.reput_from_offset == len(log)
            finally:
                for side in sides:
                    side.close()
    finally:
        reput_module.HINTED_PER_PARSED = weight
        reput_module._record_hints = real
    plain = sum(
        1 for topic, _, props, _ in specs
        if topic in (b"T", b"Other") and props not in (b"TAGS\x01a\x02TAGS\x01b\x02",)
        and not props.startswith(b"KEYS\x01\xe4")
    )  # fmt: skip
    assert sum(read) == plain  # every plain record's hint was read back, none other
