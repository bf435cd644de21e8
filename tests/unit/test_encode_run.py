"""``encode_run``, the store's one record encoder (pymq.store._commitlogc, twin
pymq.store.commitlog.encode_run_py), run by run: its clock, its commits and what it does with
an error after one, the stops it checks first, the queue offset's bounds, its buffer's end, and
(for the C code) what Python code run meanwhile may change and its references; what a send or
the run's arguments leave to the general path or refuse.  Each test runs on both
implementations (the C one where built), so PYMQ_PURE_PYTHON=1 runs them too; that the records
written are the general path's is tests/store/test_batch_fast_path.py's."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from pymq.common.batch import BatchItem, encode_batch_body
from pymq.common.native import load_native
from pymq.common.record import decode_records
from pymq.dledger.store import BODY_OFFSET, DLedgerEntry
from pymq.store.commitlog import encode_run_py

TOPIC_BYTES = {
    "T1": b"T1",
    "Topic-2": b"Topic-2",
    "SCHEDULE_TOPIC_XXXX": b"SCHEDULE_TOPIC_XXXX",
    "Long": b"L" * 128,  # longer than a topic may be: left to Python
    "Nul": b"N\x00",  # likewise
}
STOP_TOPIC = "SCHEDULE_TOPIC_XXXX"
STOP_FLAGS = 0x4 | 0x8  # a transaction's prepared and commit types
CLUSTER, BORN_IP, STORE_IP = b"DefaultCluster", bytes([10, 0, 0, 9]), bytes([192, 168, 0, 1])
FILE_FROM = 1 << 30

_C = load_native("pymq.store._commitlogc")
IMPLEMENTATIONS = [pytest.param(encode_run_py, id="python")]
if _C is not None:
    IMPLEMENTATIONS.append(pytest.param(_C.encode_run, id="c"))


@pytest.fixture(params=IMPLEMENTATIONS)
def encode(request: pytest.FixtureRequest) -> Callable[..., Any]:
    return request.param  # type: ignore[no-any-return]


def run(encode: Callable[..., Any], buf: Any, pos: int, limit: int, entries: list, table: dict,
        clock: object) -> Any:  # fmt: skip
    return encode(
        buf, pos, limit, FILE_FROM, entries, TOPIC_BYTES, table, clock, CLUSTER, BORN_IP, 40123,
        STORE_IP, 10911, 4096, STOP_FLAGS, STOP_TOPIC, None,
    )  # fmt: skip


def test_the_wall_clock_when_no_clock_is_given(encode: Callable[..., Any]) -> None:
    buf = bytearray(4096)
    before = int(time.time() * 1000)
    entries = [("T1", 0, b"body", "", 0, 0, 1, 0), ("T1", 0, b"body", "", 0, 0, 1, 0)]
    end, rows, _, stamp, error = run(encode, buf, 0, 4096, entries, {}, None)
    after = int(time.time() * 1000)
    assert error is None and len(rows) == 2 and end > 0
    assert before <= rows[0][6] <= rows[1][6] == stamp <= after + 1


def test_an_error_after_a_commit_is_returned_with_what_was_committed(
    encode: Callable[..., Any],
) -> None:
    """Entries committed stand (their queue offsets are in the table): the error comes back
    beside them instead of being raised, and an error before any commit is raised."""
    good = ("T1", 1, b"body", "TAGS\x01a", 0, 0, 1, 0)
    bad = ("T1", 1, b"body", "", "not a flag", 0, 1, 0)
    table: dict = {}
    buf = bytearray(4096)
    end, rows, waits, _, error = run(encode, buf, 0, 4096, [good, good, bad, good], table, None)
    assert isinstance(error, TypeError) and len(rows) == len(waits) == 2
    assert table == {("T1", 1): 2} and end == 2 * rows[0][1]
    with pytest.raises(TypeError):
        run(encode, buf, end, 4096, [bad, good], table, None)
    assert table == {("T1", 1): 2}

    def failing_clock() -> int:
        raise RuntimeError("clock broke")

    with pytest.raises(RuntimeError):
        run(encode, buf, end, 4096, [good], table, failing_clock)
    for wrong in (
        [("T1",)],
        [("T1", 1, "str body", "", 0, 0, 1, 0)],
        [("T1", 2**40, b"", "", 0, 0, 1, 0)],
    ):
        with pytest.raises((TypeError, OverflowError)):
            run(encode, buf, end, 4096, wrong, table, None)
    assert table == {("T1", 1): 2}


def test_hosts_and_clusters_left_to_the_general_path(encode: Callable[..., Any]) -> None:
    """IPv6 hosts (by flag or by address) and a cluster name that is not plain ASCII append
    nothing, as encode_run leaves them to the general path."""
    entry = ("T1", 0, b"body", "", 0, 0, 1, 0)
    buf = bytearray(4096)
    for born_ip, cluster, sys_flag in (
        (bytes(16), CLUSTER, 0),
        (BORN_IP, "Clu\u00e9".encode(), 0),
        (BORN_IP, b"", 0),
        (BORN_IP, CLUSTER, 0x10),
        (BORN_IP, CLUSTER, 0x20),
    ):
        out = encode(
            buf, 0, 4096, FILE_FROM, [(*entry[:5], sys_flag, *entry[6:])], TOPIC_BYTES, {},
            None, cluster, born_ip, 1, STORE_IP, 2, 4096, STOP_FLAGS, STOP_TOPIC, None,
        )  # fmt: skip
        assert out[:3] == (0, [], []), (born_ip, cluster, sys_flag)


def test_a_clock_that_changes_the_entries_and_topics_meanwhile(encode: Callable[..., Any]) -> None:
    """The clock is Python code: one that empties the entry list and the topics' dict while
    an entry is appended leaves that entry whole (its bytes and topic held), and the run ends
    there."""
    import os

    # Objects of their own (no constants the code keeps alive), as a request's would be.
    entries = [("T9", 0, os.urandom(100), "TAGS\x01t", 0, 0, 1, 0) for _ in range(3)]
    topics = {"T9": ("T" + str(9)).encode()}

    expected_body = bytes(bytearray(entries[0][2]))
    litter = []

    def meddling() -> int:
        entries.clear()
        topics.clear()
        litter.extend(os.urandom(100) for _ in range(200))  # reuse what was freed, if it was
        return 1_800_000_000_000

    buf = bytearray(4096)
    end, rows, _, _, error = encode(
        buf, 0, 4096, FILE_FROM, entries, topics, {}, meddling, CLUSTER, BORN_IP, 1, STORE_IP,
        2, 4096, STOP_FLAGS, STOP_TOPIC, None,
    )  # fmt: skip
    assert error is None and len(rows) == 1 and rows[0][2] == "T9" and end == rows[0][1]
    (record,) = decode_records(bytes(buf[:end]))
    assert (record.topic, record.body) == ("T9", expected_body)


def test_the_stops_come_before_the_fields_are_read(encode: Callable[..., Any]) -> None:
    """An entry that stops the run (an unknown topic, a transaction's flag, the schedule
    topic) stops it even when its other fields are out of range, as CommitLog's checks
    came first."""
    good = ("T1", 0, b"body", "", 0, 0, 1, 0)
    for stopper in (
        ("Missing", 2**40, b"", "", "x", 0, 1, 2**40),
        ("T1", 2**40, b"", "", "x", 4, 1, 2**40),
        (STOP_TOPIC, 2**40, None, None, "x", 0, 1, 2**40),
    ):
        buf = bytearray(4096)
        end, rows, _, _, error = run(encode, buf, 0, 4096, [good, stopper, good], {}, None)
        assert error is None and len(rows) == 1 and end == rows[0][1], stopper


def test_the_queue_offset_s_bounds(encode: Callable[..., Any]) -> None:
    """The last queue offset a record may hold (2**62 - 1) is written; the table then holds
    one that no record may, and the next put stops with the error, the first committed."""
    good = ("T1", 0, b"body", "", 0, 0, 1, 0)
    table = {("T1", 0): 2**62 - 1}
    buf = bytearray(4096)
    end, rows, _, _, error = run(encode, buf, 0, 4096, [good, good], table, None)
    assert len(rows) == 1 and rows[0][4] == 2**62 - 1 and isinstance(error, OverflowError)
    assert table == {("T1", 0): 2**62}
    assert not any(buf[end:])


class Hashing(str):
    """A topic whose hash raises on its ``fail_at``-th computation."""

    calls = 0
    fail_at = 0

    def __hash__(self) -> int:
        Hashing.calls += 1
        if Hashing.calls == Hashing.fail_at:
            raise RuntimeError("hash broke")
        return str.__hash__(self)


def test_a_commit_that_fails_is_rolled_back(encode: Callable[..., Any]) -> None:
    """The queue table's update is the commit: when it fails (here the topic's hash raising
    as the table is written, the third hash of an entry), the entry's row and WAIT are taken
    back and its record zeroed; the entries before it stand."""
    topic = Hashing("T1")
    topics = {topic: b"T1"}
    good = (topic, 0, b"body", "", 0, 0, 1, 0)
    for committed in (0, 1):
        Hashing.calls, Hashing.fail_at = 0, 3 * committed + 3
        buf, table = bytearray(4096), {}
        args = (buf, 0, 4096, FILE_FROM, [good] * 3, topics, table, None, CLUSTER, BORN_IP, 1,
                STORE_IP, 2, 4096, STOP_FLAGS, STOP_TOPIC, None)  # fmt: skip
        if committed == 0:
            with pytest.raises(RuntimeError):
                encode(*args)
            assert table == {} and not any(buf)
            continue
        end, rows, waits, _, error = encode(*args)
        assert isinstance(error, RuntimeError) and len(rows) == len(waits) == 1
        assert table == {("T1", 0): 1} and end == rows[0][1] and not any(buf[end:])


def test_no_reference_is_kept_or_lost(encode: Callable[..., Any]) -> None:
    """Thousands of runs on every path leave the reference counts of what they were given
    as they were."""
    body, topic_b = b"body-" + bytes(10), ("T" + "1").encode()
    topics = {"T1": topic_b}
    good = ("T1", 0, body, "TAGS\x01a", 0, 0, 1, 0)
    stop = ("T1", 0, body, "", 0, 4, 1, 0)
    bad = ("T1", 0, body, "", "x", 0, 1, 0)
    watched = (body, topic_b, good, stop, bad)
    before = [sys.getrefcount(o) for o in watched]
    for _ in range(2000):
        for entries in ([good, good], [good, stop], [good, bad], [bad], [stop]):
            buf = bytearray(1024)
            try:
                out = encode(
                    buf, 0, 1024, FILE_FROM, entries, topics, {}, None, CLUSTER, BORN_IP, 1,
                    STORE_IP, 2, 4096, STOP_FLAGS, STOP_TOPIC, None,
                )  # fmt: skip
            except TypeError:
                continue
            del out
    del entries  # the last list the loop made
    assert [sys.getrefcount(o) for o in watched] == before


def test_a_limit_past_the_buffer_stops_at_the_buffer_s_end(encode: Callable[..., Any]) -> None:
    """A limit beyond the buffer is the buffer's end: a record that would cross it stops the
    run, nothing written past it."""
    small = ("T1", 0, bytes(100), "", 0, 0, 1, 0)
    big = ("T1", 0, bytes(200), "", 0, 0, 1, 0)
    backing = bytearray(1024)
    buf = memoryview(backing)[:400]  # what lies past its end must stay untouched
    end, rows, _, _, error = run(encode, buf, 0, 10_000, [small, big, small], {}, None)  # type: ignore[arg-type]
    assert error is None and len(rows) == 1 and end == rows[0][1] <= 400
    assert not any(backing[end:])


def test_a_batch_entry_is_all_or_nothing(encode: Callable[..., Any]) -> None:
    """A batch body's items are one entry: consecutive queue offsets, one WAIT (the first
    item's), and an item left to the general path (a delay, a cut item) leaves the whole
    batch to it, the records written before it zeroed, the entries before it standing."""
    from pymq.common.batch import BatchItem, encode_batch_body

    items = [BatchItem(b"a", 0, {"WAIT": "false"}), BatchItem(b"bb", 3, {"TAGS": "t"})]
    body = encode_batch_body(items)
    single = ("T1", 0, b"one", "", 0, 0, 1, 0)
    buf, table = bytearray(4096), {("T1", 0): 5}
    end, rows, waits, _, error = run(
        encode, buf, 0, 4096, [(*single[:2], body, None, *single[4:]), single], table, None
    )
    assert error is None and waits == ["false", None] and table == {("T1", 0): 8}
    assert [r[4] for r in rows] == [5, 6, 7]
    records = decode_records(bytes(buf[:end]))
    assert [(r.body, r.flag, r.queue_offset) for r in records] == [
        (b"a", 0, 5), (b"bb", 3, 6), (b"one", 0, 7)
    ]  # fmt: skip
    for bad in (
        encode_batch_body([*items, BatchItem(b"c", 0, {"DELAY": "2"})]),
        body[:-1],
        b"",
    ):
        buf, table = bytearray(4096), {}
        out = run(
            encode, buf, 0, 4096, [single, (*single[:2], bad, None, *single[4:])], table, None
        )
        end, rows, waits, _, error = out
        assert error is None and len(rows) == 1 and table == {("T1", 0): 1}
        assert not any(buf[end:])  # the batch's records zeroed


def test_the_twin_takes_back_an_entry_whose_hint_row_fails(monkeypatch) -> None:
    """The Python twin's own failure point (a hint row that cannot be made, as the C code's
    allocations may fail): the entry's records are zeroed and its rows dropped, a single
    send's or a batch's, and the entries before it stand."""
    from pymq.common.batch import BatchItem, encode_batch_body
    from pymq.store import commitlog

    real, calls = commitlog._hint_row, []

    def failing(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:
            raise MemoryError("no row")
        return real(*args)

    monkeypatch.setattr(commitlog, "_hint_row", failing)
    body = encode_batch_body([BatchItem(b"a", 0, {}), BatchItem(b"b", 0, {})])
    single = ("T1", 0, b"one", "", 0, 0, 1, 0)
    for second in ((*single[:2], body, None, *single[4:]), single, single):
        calls.clear()
        buf, table = bytearray(4096), {}
        entries = [single, second, single] if second[3] is None else [single, single, second]
        end, rows, waits, _, error = run(encode_run_py, buf, 0, 4096, entries, table, None)
        assert isinstance(error, MemoryError) and len(rows) == len(waits) == (
            1 if second[3] is None else 2
        )
        assert table == {("T1", 0): len(rows)} and not any(buf[end:])


# --- runs of stored messages (CommitLog.append_stored: message objects) ----------------------

V6_IP = bytes(15) + b"\x01"  # ::1


def stored(props: bytes = b"TAGS\x01a", *, topic: str = "T1", queue_id: int = 1,
           sys_flag: int = 0, born_ip: bytes = BORN_IP, prepared: int = 0,
           body: bytes = b"body", flag: int = 0) -> tuple:  # fmt: skip
    """A stored message's entry: (topic, queue id, body, properties bytes, flag, sys flag,
    born timestamp, reconsume times, born IP, born port, prepared transaction offset)."""
    return (topic, queue_id, body, props, flag, sys_flag, 5, 2, born_ip, 40123, prepared)


def run_stored(encode: Callable[..., Any], buf: Any, entries: list, table: dict,
               store_ip: bytes = STORE_IP, pos: int = 0) -> Any:  # fmt: skip
    return encode(
        buf, pos, len(buf), FILE_FROM, entries, TOPIC_BYTES, table, lambda: 77, b"", b"", 0,
        store_ip, 10911, 0, 0, "", None,
    )  # fmt: skip


def test_stored_properties_are_written_exactly_as_given(encode: Callable[..., Any]) -> None:
    """What a send's entry would have rewritten or left to Python (WAIT=true, no CLUSTER,
    DELAY, TRAN_MSG, TIMER_, non-ASCII, a NUL, a name twice, over 32 items, an item without a
    value) is stored byte for byte; the hint row reads TAGS, KEYS, UNIQ_KEY as
    decode_properties would, the last of a name winning; a stored run reports no WAIT value
    (None: its callers hold the properties), whatever its properties say."""
    props = (
        b"WAIT\x01true\x02DELAY\x013\x02TRAN_MSG\x01true\x02TIMER_DELAY_SEC\x019\x02"
        b"TAGS\x01t1\x02KEYS\x01k\xc3\xa9\x02UNIQ_KEY\x01U\x00K\x02TAGS\x01t2\x02empty\x01\x02"
        + b"".join(b"P%d\x01v\x02" % i for i in range(40))
    )
    buf = bytearray(4096)
    end, rows, waits, stamp, error = run_stored(encode, buf, [stored(props)], {})
    assert error is None and stamp == 77 and waits == [None]
    (msg,) = decode_records(bytes(buf[:end]))
    raw = bytes(buf[end - len(props) : end])
    assert raw == props and buf[end - len(props) - 2 : end - len(props)] == len(props).to_bytes(2)
    assert rows[0][5] == "t2" and rows[0][8] == "k\u00e9" and rows[0][9] == "U\x00K"
    assert msg.properties["TAGS"] == "t2" and "CLUSTER" not in msg.properties
    assert msg.reconsume_times == 2 and msg.born_timestamp == 5 and msg.store_timestamp == 77


@pytest.mark.parametrize(
    "props",
    [
        b"TAGS\x01a\x02KEYS\x01k\x02UNIQ_KEY\x01u",
        b"TAGSX\x01a\x02TAG\x01b\x02KEYSS\x01c\x02UNIQ_KEYS\x01d\x02UNIQ_KE\x01e",
        b"TAGS\x01\x02KEYS\x01\x02UNIQ_KEY\x01\x02TAGS\x02KEYS\x02UNIQ_KEY",
        b"TAGS\x01\x01x\x02KEYS\x01a\x01b\x02UNIQ_KEY\x01\x01",
        b"\x01TAGS\x01a\x02\x02\x02TAGS\x01last\x02T\x02K\x02U\x02TAGS",
        b"KEYS\x01x\x02TAGS\x01y\x02UNIQ_KEY\x01\xe2\x82\xac\x02T",
        b"TAGS\x01t\x02",
        b"tags\x01a\x02Keys\x01b\x02uNIQ_KEY\x01c\x02TAGS\x01\xc3\xa9",
        b"U",
        b"",
    ],
)
def test_stored_hint_names_read_as_decode_properties(
    encode: Callable[..., Any], props: bytes
) -> None:
    """A stored record's hint row has the TAGS, KEYS and UNIQ_KEY values decode_properties
    reads from its properties: names that only start or end like them, items without a
    value or a separator, values holding a separator, short items at the end, UTF-8 bytes
    beyond ASCII; the last of a name wins."""
    buf = bytearray(4096)
    end, rows, waits, _, error = run_stored(encode, buf, [stored(props)], {})
    assert error is None and waits == [None]
    (msg,) = decode_records(bytes(buf[:end]))
    want = msg.properties
    assert (rows[0][5], rows[0][8], rows[0][9]) == (
        want.get("TAGS"),
        want.get("KEYS"),
        want.get("UNIQ_KEY"),
    )


@pytest.mark.parametrize(
    ("born_ip", "store_ip", "flags"),
    [(BORN_IP, STORE_IP, 0), (V6_IP, STORE_IP, 0x10), (BORN_IP, V6_IP, 0x20), (V6_IP, V6_IP, 0x30)],
)
def test_stored_ipv6_hosts_set_their_flags_and_16_byte_fields(
    encode: Callable[..., Any], born_ip: bytes, store_ip: bytes, flags: int
) -> None:
    """The host flags follow the addresses' lengths, whatever sys_flag said (here the
    opposite), and the header holds 16-byte hosts with their ports."""
    buf = bytearray(4096)
    end, rows, _, _, _ = run_stored(
        encode, buf, [stored(sys_flag=0x30 ^ flags | 0x1, born_ip=born_ip)], {}, store_ip=store_ip
    )
    (msg,) = decode_records(bytes(buf[:end]))
    assert rows[0][7] == msg.sys_flag == flags | 0x1
    assert end == 88 + (12 if flags & 0x10 else 0) + (12 if flags & 0x20 else 0) + 4 + 1 + 2 + 2 + 6
    assert msg.born_host == ("::1" if born_ip == V6_IP else "10.0.0.9", 40123)
    assert msg.store_host == ("::1" if store_ip == V6_IP else "192.168.0.1", 10911)
    assert msg.body == b"body" and msg.commitlog_offset == FILE_FROM


def test_stored_prepared_and_rolled_back_messages_take_no_queue_offset(
    encode: Callable[..., Any],
) -> None:
    """TransactionPreparedType (0x4) and TransactionRollbackType (0xC): queue offset 0 and the
    table untouched, as RocketMQ's CommitLog; the prepared transaction offset is written; a
    commit (0x8) or a plain message takes the queue's next offset."""
    table = {("T1", 1): 5}
    entries = [
        stored(sys_flag=0x4, prepared=123), stored(sys_flag=0xC, prepared=-9),
        stored(sys_flag=0x8, prepared=2**63 - 1), stored(),
    ]  # fmt: skip
    buf = bytearray(4096)
    end, rows, _, _, error = run_stored(encode, buf, entries, table)
    assert error is None and [r[4] for r in rows] == [0, 0, 5, 6] and table == {("T1", 1): 7}
    msgs = decode_records(bytes(buf[:end]))
    assert [m.prepared_transaction_offset for m in msgs] == [123, -9, 2**63 - 1, 0]
    assert [m.queue_offset for m in msgs] == [0, 0, 5, 6]
    table = {}
    run_stored(encode, bytearray(4096), [stored(sys_flag=0x4)], table)
    assert table == {}


@pytest.mark.parametrize(
    "last",
    [
        stored(b"p" * 32768),  # properties too long for the layout
        stored(topic="Nul"),  # a topic the layout refuses
        stored(topic="unknown"),  # a topic not in topic_bytes
        stored(born_ip=b"\x01\x02\x03"),  # no address
        stored(body=b"b" * 4000),  # no room
    ],
)
def test_a_stored_run_is_all_or_nothing(encode: Callable[..., Any], last: tuple) -> None:
    """A stored message the encoder cannot write stops the whole run: nothing is committed
    (the table as it was), the records written before it are zeroed, nothing is returned."""
    table = {("T1", 1): 3}
    buf = bytearray(b"\xee" * 8) + bytearray(4088)
    end, rows, waits, stamp, error = run_stored(
        encode, buf, [stored(), stored(), last], table, pos=8
    )
    assert (end, rows, waits, stamp, error) == (8, [], [], 0, None)
    assert table == {("T1", 1): 3} and buf == bytearray(b"\xee" * 8) + bytearray(4088)


@pytest.mark.parametrize(
    "last",
    [
        stored(flag=2**31),  # a field outside its Java type
        ("T1", 1, b"b", "str props", 0, 0, 5, 2, BORN_IP, 1, 0),  # properties not bytes
        ("T1", 1, b"b", "", 0, 0, 1, 0),  # a send's entry in a stored run
    ],
)
def test_a_stored_run_that_fails_raises_and_changes_nothing(
    encode: Callable[..., Any], last: tuple
) -> None:
    table = {("T1", 1): 3}
    buf = bytearray(4096)
    with pytest.raises((OverflowError, TypeError)):
        run_stored(encode, buf, [stored(), last], table)
    assert table == {("T1", 1): 3} and buf == bytearray(4096)


# --- what a send's entry or the run's arguments leave to the general path or refuse ---------

GOOD = ("T1", 0, b"body", "TAGS\x01a", 0, 0, 1, 0)
_33 = "\x02".join(f"p{i}\x01v" for i in range(33))


def arguments(**over: Any) -> dict[str, Any]:
    """encode_run's arguments by name (a run of GOOD then a send to Topic-2), with ``over``."""
    args = dict(buf=bytearray(4096), pos=0, limit=4096, file_from=FILE_FROM,
                entries=[GOOD, ("Topic-2", 1, b"x" * 100, "", 0, 0, 1, 0)], topics=TOPIC_BYTES,
                table={}, clock=iter(range(7, 99)).__next__, cluster=CLUSTER, born_ip=BORN_IP,
                born_port=1, store_ip=STORE_IP, store_port=2, max_bp=4096, stop_flags=STOP_FLAGS,
                stop_topic=STOP_TOPIC, hint_type=None)  # fmt: skip
    return args | over


@pytest.mark.parametrize(
    ("props", "taken"),
    [
        ("", True), ("WAIT\x01TRUE\x02a\x01b\x02", True), ("TIMER_\x015", True),
        ("\x01x\x02y\x01\x02a\x01b\x01c\x02\x02", True),  # items without a name or value
        (_33[: _33.rindex("\x02")], True), ("a\x01" + "b" * 32000, True),
        ("DELAY\x010", False), ("DELAY\x012", False), ("TRAN_MSG\x01true", False),
        ("TIMER_DELAY_MS\x015", False), ("CLUSTER\x01x", False), ("a\x01b\x02a\x01c", False),
        (_33, False), ("\u00e9\x01x", False), ("a\x00\x01b", False),
        ("a\x01" + "b" * 33000, False),
    ],
)  # fmt: skip
def test_a_send_s_properties_the_general_path_must_judge_stop_the_run(
    encode: Callable[..., Any], props: str, taken: bool
) -> None:
    """A delay, a transaction's half, a timer, its own CLUSTER, a name twice, over 32 items,
    text not ASCII, a NUL, more than the layout holds: the run stops before that send, the
    one before it standing and nothing written past it; any other is stored."""
    args = arguments(buf=bytearray(80_000), limit=80_000, max_bp=1 << 20)
    args["entries"] = [GOOD, ("T1", 0, b"b", props, 0, 0, 1, 0)]
    end, rows, waits, _, error = encode(*args.values())
    assert error is None and len(rows) == len(waits) == 1 + taken, props[:40]
    assert args["table"] == {("T1", 0): 1 + taken} and not any(args["buf"][end:])
    assert decode_records(bytes(args["buf"][:end]))[-1].properties["CLUSTER"] == "DefaultCluster"


@pytest.mark.parametrize(
    ("over", "raised"),
    [
        ({"buf": b"\x00" * 4096}, BufferError), ({"buf": None}, TypeError),
        ({"file_from": 2**62}, OverflowError), ({"born_port": "5"}, TypeError),
        ({"store_port": 2**31}, OverflowError), ({"store_ip": "1.2.3.4"}, TypeError),
        ({"cluster": "C"}, TypeError), ({"max_bp": -1}, OverflowError), ({"topics": []}, TypeError),
        ({"entries": ()}, TypeError), ({"entries": [(1, 2)]}, TypeError),
        ({"table": {("T1", 0): -1}}, OverflowError), ({"stop_topic": b"S"}, TypeError),
        ({"hint_type": tuple}, TypeError), ({"hint_type": 5}, TypeError),
        ({"entries": [("T1", 0, b"b", "", 2**31, 0, 1, 0)]}, OverflowError),
        ({"entries": [("T1", 0, b"b", "", 0, 0, 2**63, 0)]}, OverflowError),
        ({"entries": [("T1", 2**31, b"b", "", 0, 0, 1, 0)]}, OverflowError),
        ({"entries": [(5, 0, b"b", "", 0, 0, 1, 0)]}, TypeError),
        ({"entries": [("T1", 0, b"b", b"a\x01b", 0, 0, 1, 0)]}, TypeError),
    ],
)  # fmt: skip
def test_arguments_out_of_their_types_or_ranges_raise_and_change_nothing(
    encode: Callable[..., Any], over: dict[str, Any], raised: type[Exception]
) -> None:
    args = arguments(**over)
    table = dict(args["table"])
    with pytest.raises(raised):
        encode(*args.values())
    assert args["table"] == table and not any(args["buf"] or b"")


@pytest.mark.parametrize(
    "over",
    [
        {"max_bp": 9}, {"limit": 125}, {"limit": 0}, {"pos": 4100}, {"store_ip": bytes(3)},
        {"cluster": b"\x02x"}, {"entries": []},
        {"entries": [("T1", 0, b"x" * 5000, "", 0, 0, 1, 0)]},
    ],
)  # fmt: skip
def test_what_no_record_can_be_written_for_stops_before_the_first(
    encode: Callable[..., Any], over: dict[str, Any]
) -> None:
    """A body and properties over max_bp, no room below the limit or in the buffer, a store
    IP of neither family, a cluster name not plain: nothing written, nothing committed."""
    args = arguments(**over)
    assert encode(*args.values()) == (args["pos"], [], [], 0, None)
    assert args["table"] == {} and not any(args["buf"])


def test_rows_are_of_the_hint_type_and_the_clock_read_once_a_send(
    encode: Callable[..., Any],
) -> None:
    """Each row a hint_type (None: a plain tuple) of the record's fields; bodies of any
    buffer type and a reconsume count at its lower bound are written; a clock that runs out
    after the first send's reading stops the run with that error, the first standing."""
    from pymq.store.commitlog import DispatchHint

    for hint_type in (None, DispatchHint):
        body = [memoryview(b"mv"), bytearray(b"ba")]
        args = arguments(hint_type=hint_type)
        args["entries"] = [(*GOOD[:2], b, *GOOD[3:7], -(2**31)) for b in body]
        end, rows, _, stamp, error = encode(*args.values())
        assert error is None and stamp == 8 and [type(r) for r in rows] == [hint_type or tuple] * 2
        assert rows[1][:7] == (FILE_FROM + rows[0][1], rows[1][1], "T1", 0, 1, "a", 8)
        records = decode_records(bytes(args["buf"][:end]))
        assert [(r.body, r.reconsume_times) for r in records] == [
            (b"mv", -(2**31)),
            (b"ba", -(2**31)),
        ]
    args = arguments(clock=iter([7]).__next__)
    _, rows, _, stamp, error = encode(*args.values())
    assert isinstance(error, StopIteration) and len(rows) == 1 and stamp == 7


# --- DLedger entries (entry_header: pymq.store.dledger_commitlog) ------------------------------


def _entry_reference(encode: Callable[..., Any], entries: list, table: dict, clock: Any,
                     start: int, index: int, term: int,
                     stored_run: bool) -> tuple[bytes, list]:  # fmt: skip
    """What DLedger mode wrote before the encoder took entry_header (and what a Java member
    writes): each record encoded alone as a plain one at its entry's position + 48, then
    wrapped by DLedgerEntry.encode().  The entries' bytes joined and the hint rows."""
    out, rows, pos = b"", [], start
    for entry in entries:
        one = bytearray(1 << 16)
        if stored_run:
            _, got, *_ = encode(
                one, 0, len(one), pos + BODY_OFFSET, [entry], TOPIC_BYTES, table, clock, b"",
                b"", 0, STORE_IP, 10911, 0, 0, "", None,
            )  # fmt: skip
        else:
            _, got, *_ = encode(
                one, 0, len(one), pos + BODY_OFFSET, [entry], TOPIC_BYTES, table, clock,
                CLUSTER, BORN_IP, 40123, STORE_IP, 10911, 4096, STOP_FLAGS, STOP_TOPIC, None,
            )  # fmt: skip
        # a batch body: its items' records, each re-encoded alone in an entry of its own
        at = 0
        for row in got:
            record = bytes(one[at : at + row[1]])
            # the record's own PHYSICALOFFSET: where it lands in the entry that holds it
            record = record[:28] + (pos + BODY_OFFSET).to_bytes(8, "big") + record[36:]
            out += DLedgerEntry(index, term, record, pos).encode()
            rows.append((pos + BODY_OFFSET, *row[1:]))
            pos += BODY_OFFSET + row[1]
            index += 1
            at += row[1]
    return out, rows


def test_entry_headers_make_the_entries_dledger_mode_wrote_before(
    encode: Callable[..., Any],
) -> None:
    """With entry_header, each record (a single send's, a batch item's, a stored message's)
    is the body of a DLedger entry of its own, byte for byte what DLedgerEntry.encode() of
    the plain record at that position makes: the entry's header (magic, size, index, term,
    pos, zeros, body length), the record's PHYSICALOFFSET its entry's + 48; the indexes run
    on from the first; the hints name the records."""
    batch = encode_batch_body([
        BatchItem(b"x" * 40, 0, {"TAGS": "a", "WAIT": "true"}),
        BatchItem(b"", 7, {"KEYS": "k"}),
        BatchItem(b"y", -1, {}),
    ])  # fmt: skip
    sends = [
        ("T1", 0, b"one", "TAGS\x01t\x02WAIT\x01false", 3, 0, 1, 0),
        ("T1", 0, batch, None, 0, 0, 1, 0),
        ("Topic-2", 1, b"two", "", 0, 0, 1, 2),
    ]
    for entries, stored_run in ((sends, False), ([stored(), stored(sys_flag=0x4)], True)):
        start, index, term = 4096 * 3 + 16, 41, 5
        ref_table: dict = {("T1", 0): 9, ("T1", 1): 2}
        want, want_rows = _entry_reference(
            encode_run_py, entries, ref_table, lambda: 77, start, index, term, stored_run
        )
        buf, table = bytearray(8192), {("T1", 0): 9, ("T1", 1): 2}
        if stored_run:
            args = (b"", b"", 0, STORE_IP, 10911, 0, 0, "", None)
        else:
            args = (CLUSTER, BORN_IP, 40123, STORE_IP, 10911, 4096, STOP_FLAGS, STOP_TOPIC, None)
        end, rows, _, _, error = encode(
            buf, 0, len(buf), start, entries, TOPIC_BYTES, table, lambda: 77, *args,
            (index, term),
        )  # fmt: skip
        assert error is None and bytes(buf[:end]) == want
        assert [tuple(r) for r in rows] == want_rows and table == ref_table
        # (the reference's entries decode as the DLedger store reads them back)
        first = DLedgerEntry.decode(want)
        assert (first.index, first.term, first.pos) == (index, term, start)


def test_entry_headers_count_in_the_room(encode: Callable[..., Any]) -> None:
    """The room below limit holds the headers: a record that fits only without its entry's
    header stops the run there, nothing of it written."""
    entries = [("T1", 0, b"a" * 100, "", 0, 0, 1, 0)] * 2
    buf = bytearray(4096)
    end, rows, *_ = encode(
        buf, 0, 4096, FILE_FROM, entries, TOPIC_BYTES, {}, lambda: 1, CLUSTER, BORN_IP, 1,
        STORE_IP, 1, 4096, 0, "", None, (0, 1),
    )  # fmt: skip
    entry = end // 2
    buf2 = bytearray(4096)
    end2, rows2, *_ = encode(
        buf2, 0, 2 * entry - 1, FILE_FROM, entries, TOPIC_BYTES, {}, lambda: 1, CLUSTER,
        BORN_IP, 1, STORE_IP, 1, 4096, 0, "", None, (0, 1),
    )  # fmt: skip
    assert (end2, len(rows2), len(rows)) == (entry, 1, 2)
    assert not any(buf2[entry:])
    with pytest.raises(TypeError):
        encode(buf, 0, 4096, FILE_FROM, entries, TOPIC_BYTES, {}, lambda: 1, CLUSTER, BORN_IP,
               1, STORE_IP, 1, 4096, 0, "", None, (0,))  # fmt: skip
    with pytest.raises(OverflowError):
        encode(buf, 0, 4096, FILE_FROM, entries, TOPIC_BYTES, {}, lambda: 1, CLUSTER, BORN_IP,
               1, STORE_IP, 1, 4096, 0, "", None, (-1, 1))  # fmt: skip
