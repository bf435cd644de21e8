"""``encode_run``, the store's one record encoder (pymq.store._commitlogc, twin
pymq.store.commitlog.encode_run_py), run by run: its clock, its commits and what it does with
an error after one, the stops it checks first, the queue offset's bounds, its buffer's end, and
(for the C code) what Python code run meanwhile may change and its references.  Each test runs
on both implementations (the C one where built), so PYMQ_PURE_PYTHON=1 runs them too; that
the two write the same is tests/unit/test_twins.py's."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from pymq.common.native import load_native
from pymq.common.record import decode_records
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
