"""Dispatch hints: what the put path hands reput must build exactly what parsing the records
back builds (consume queues and index, byte for byte), and a hint that does not match the log
must not be used."""

from __future__ import annotations

import collections
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pymq.common.message_ext import MessageSysFlag
from pymq.store import commitlog as commitlog_module
from pymq.store.commitlog import DispatchHint
from pymq.store.reput import ReputMessageService
from tests.helpers import mangled
from tests.store.helpers import make_message, running_store, small_config


class Clock:
    """Time the test sets before each put: a clock that moved on every call would move with
    the background services' calls too, as many as the machine's speed allows, and the
    schedule topic's tags codes (times) of two runs would differ."""

    def __init__(self) -> None:
        self.now = 1_800_000_000_000

    def __call__(self) -> int:
        return self.now


def tree_bytes(directory: str) -> dict[str, bytes]:
    out = {}
    for base, _dirs, files in os.walk(directory):
        for name in files:
            path = os.path.join(base, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = f.read()
    return out


async def fill(root: str) -> tuple[dict[str, bytes], dict[str, bytes], int]:
    config = small_config(root, resident_trim_interval=0)
    clock = Clock()
    async with running_store(config, clock_ms=clock) as store:
        for i in range(300):
            clock.now += 7
            extra = {}
            if i % 7 == 0:
                extra["DELAY"] = "2"  # to SCHEDULE_TOPIC_XXXX: its tags code is a time
            if i % 11 == 0:
                extra["UNIQ_KEY"] = f"0A000001{i:024X}"
            msg = make_message(
                topic="Hinted" if i % 3 else "Other",
                queue_id=i % 4,
                body=b"m%d" % i,
                tags=None if i % 5 == 0 else f"Tag{i % 2}",
                keys=f"k{i} shared" if i % 2 else None,
                **extra,
            )
            if i % 13 == 0:
                msg.sys_flag |= MessageSysFlag.TRANSACTION_PREPARED_TYPE  # no queue entry
            await store.put(msg)
            if i % 50 == 49:
                await store.reput.do_reput()
        await store.reput.do_reput()
        left = len(store.commitlog.dispatch_hints)
        found = store.query_message("Hinted", "shared", 64, 0, store.clock_ms())
        assert len(found.messages) == 64
    return tree_bytes(config.consume_queue_dir), tree_bytes(config.index_dir), left


async def test_hints_build_what_parsing_builds(tmp_path, monkeypatch):
    hinted_cq, hinted_index, left = await fill(str(tmp_path / "hinted"))
    assert left == 0  # every hint was taken
    monkeypatch.setattr(commitlog_module, "DISPATCH_HINTS_MAX", 0)  # no hints: parse each record
    parsed_cq, parsed_index, _ = await fill(str(tmp_path / "parsed"))
    assert hinted_cq.keys() == parsed_cq.keys() and len(hinted_cq) > 4
    for name in parsed_cq:
        assert hinted_cq[name] == parsed_cq[name], name
    assert hinted_index == parsed_index


def test_a_hint_that_does_not_match_the_log_is_not_used():
    record = bytearray(64)
    record[0:4] = (48).to_bytes(4, "big")
    record[4:8] = (0xDAA320A7).to_bytes(4, "big", signed=False)  # MESSAGE_MAGIC_CODE
    view = memoryview(bytes(record))
    hint = DispatchHint(1000, 48, "T", 0, 0, None, 0, 0, None, None)
    stale = hint._replace(physical_offset=900)
    hints = collections.deque([stale, hint])
    assert ReputMessageService._hint_for(hints, 1000, view, 0, 64) == hint
    assert not hints  # the stale one was dropped, the used one taken
    wrong_size = collections.deque([hint._replace(size=52), hint])
    assert ReputMessageService._hint_for(wrong_size, 1000, view, 0, 64) is None
    assert not wrong_size  # the log is not what they describe: all dropped
    partial = collections.deque([hint])
    assert ReputMessageService._hint_for(partial, 1000, view, 0, 40) is None
    assert list(partial) == [hint]  # kept for when the record is whole
    # A property value holding a separator is written differently than the dict holds it.
    odd = hint._replace(tags="Tag\x02X")
    assert ReputMessageService._hint_for(collections.deque([odd]), 1000, view, 0, 64) is None


def _log_region(base: int) -> tuple[bytes, list[int]]:
    """Records as a commit-log file from ``base`` holds them (each at its own physical offset),
    and where each starts: plain ones, one with odd properties, one of the schedule topic, one
    with an IPv6 host."""
    from pymq.common.message_ext import MessageExt
    from pymq.store.commitlog import encode_record

    specs: list[tuple[str, dict[str, str], tuple[str, int]]] = [
        ("T", {"TAGS": "a", "KEYS": "k1 k2", "UNIQ_KEY": "U1", "X": "y"}, ("10.0.0.1", 5)),
        ("T2", {}, ("10.0.0.1", 5)),
        ("T", {"WAIT": "true"}, ("10.0.0.1", 5)),
        ("T", {"A": "b\x01c"}, ("10.0.0.1", 5)),  # not strictly formed
        ("T", {"TAGS": "z"}, ("10.0.0.1", 5)),
        ("SCHEDULE_TOPIC_XXXX", {"DELAY": "3"}, ("10.0.0.1", 5)),
        ("T", {"TAGS": "z"}, ("::1", 5)),
    ]
    out, starts = bytearray(), []
    for topic, props, host in specs:
        msg = MessageExt(topic=topic, body=b"b" * len(out), properties=props, born_host=host)
        msg.commitlog_offset, msg.queue_offset, msg.store_timestamp = base + len(out), 9, 77
        starts.append(len(out))
        out += encode_record(msg)
    return bytes(out), starts


_BASE, _SKIP = 1 << 30, b"SCHEDULE_TOPIC_XXXX"
_REGION, _STARTS = _log_region(_BASE)


def _record_hints_implementations() -> list:
    from pymq.store import reput
    from tests.helpers import implementations

    return implementations("pymq.store._dispatchc", "record_hints", reput.record_hints_py)


@pytest.mark.parametrize("record_hints", _record_hints_implementations())
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_hints_read_back_are_what_parsing_reads_even_of_a_damaged_log(record_hints, data) -> None:
    """record_hints (C, and its twin) on a log with bytes changed, cut or added: each row is
    what read_record_info reads of the record at that place, at most max_rows of them, one
    after the other from pos, and the stop is where the last ends."""
    from pymq.common.record import property_value, read_record_info

    log = mangled(data, _REGION) if data.draw(st.booleans()) else _REGION
    inside = (_STARTS[2] + _STARTS[3]) // 2  # a record's middle
    pos = data.draw(st.sampled_from([*_STARTS, inside, len(log) + 5]))
    max_rows = data.draw(st.sampled_from([0, 1, 2, 1024]))
    kind = data.draw(st.sampled_from([bytes, bytearray, memoryview]))
    rows, stop = record_hints(kind(log), pos, len(log), _BASE, max_rows, _SKIP, DispatchHint)
    at = pos
    for row in rows:
        info = read_record_info(log, at, check_crc=False)
        tags, keys, uniq = (
            property_value(info.properties, n) for n in ("TAGS", "KEYS", "UNIQ_KEY")
        )
        assert row == DispatchHint(
            _BASE + at, info.size, info.topic, info.queue_id, info.queue_offset, tags,
            info.store_timestamp, info.sys_flag, keys, uniq,
        )  # fmt: skip
        at += info.size
    assert stop == at and len(rows) <= max_rows


@pytest.mark.parametrize("record_hints", _record_hints_implementations())
def test_hints_stop_at_each_record_the_python_loop_must_judge(record_hints) -> None:
    """From each record on: odd properties, the schedule topic and an IPv6 host (not plain
    records) stop the rows; records not at their own offsets give none; bad arguments raise."""
    s = _STARTS
    for pos, rows, stop in ((0, 3, s[3]), (s[3], 0, s[3]), (s[4], 1, s[5]), (s[5], 0, s[5]),
                            (s[6], 0, s[6]), (len(_REGION), 0, len(_REGION))):  # fmt: skip
        got = record_hints(_REGION, pos, 1 << 40, _BASE, 9, _SKIP, None)
        assert (len(got[0]), got[1]) == (rows, stop), pos
        assert all(type(row) is tuple for row in got[0])
    assert record_hints(_REGION, 0, len(_REGION), _BASE + 1, 9, _SKIP, None) == ([], 0)
    assert len(record_hints(_REGION, 0, len(_REGION), _BASE, 9, b"", None)[0]) == 3
    for args, raised in (
        ((_REGION, 0, len(_REGION), _BASE, 9, "S", None), TypeError),
        ((_REGION, 0, len(_REGION), _BASE, 9, _SKIP, tuple), TypeError),
        ((_REGION, -1, len(_REGION), _BASE, 9, _SKIP, None), OverflowError),
        ((_REGION, 0, len(_REGION), -1, 9, _SKIP, None), OverflowError),
        (("text", 0, 4, _BASE, 9, _SKIP, None), TypeError),
    ):
        with pytest.raises(raised):
            record_hints(*args)
