"""Dispatch hints: what the put path hands reput must build exactly what parsing the records
back builds (consume queues and index, byte for byte), and a hint that does not match the log
must not be used."""

from __future__ import annotations

import collections
import os
import threading

import pytest

from pymq.common.message_ext import MessageSysFlag
from pymq.store import commitlog as commitlog_module
from pymq.store import reput as reput_module
from pymq.store.commitlog import DispatchHint
from pymq.store.index_file import IndexFile
from pymq.store.reput import ReputMessageService
from tests.store.helpers import dispatch_mode, make_message, running_store, small_config


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000_000

    def __call__(self) -> int:
        self.now += 7
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
    async with running_store(config, clock_ms=Clock()) as store:
        for i in range(300):
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


def index_state(f: IndexFile) -> tuple:
    """An index file's header fields, and its header's bytes as written so far."""
    fields = (f.begin_timestamp, f.end_timestamp, f.begin_phy_offset, f.end_phy_offset)
    return (*fields, f.hash_slot_count, f.index_count, bytes(f.mf.mm[:40]))


class RecordingDeque(collections.deque):
    def __init__(self, items: collections.deque) -> None:
        super().__init__(items)
        self.seen: list = []

    def append(self, item: object) -> None:
        self.seen.append(item)
        super().append(item)


class LoopClock(Clock):
    """Clock advancing only on the loop's thread: the index service names a file it creates
    in a worker thread by the time then, which would otherwise shift the timestamps of the
    records put meanwhile by a tick, depending on the thread's timing."""

    def __call__(self) -> int:
        if threading.current_thread() is not threading.main_thread():
            return self.now
        return super().__call__()


async def fill_varied(
    root: str, mode: str, wanted: dict[str, int] | None = None, hinted: list[int] | None = None
) -> tuple[dict[str, bytes], list[bytes], tuple]:
    """Puts of every shape the hinted dispatch meets: UNIQ_KEYs (as every send has), KEYS with
    runs of spaces, no keys, tags or none, prepared and rolled-back records, a delayed topic,
    many queues (their files roll at 100 entries), 256-entry index files that roll (some in
    the middle of a record's keys, some by the reput task's prepare between records), and
    records dispatched in runs and one at a time.  The index headers are compared while the
    store runs too: closing rewrites the last one.  With ``wanted`` (a live dict of topics, as
    the broker's long polling keeps it) the listener is given those topics only, and "Other"
    is wanted from the 300th put to the 600th.  ``dispatch_mode(mode)`` (tests/store/helpers)
    picks the dispatch; ``hinted`` gets each dispatch_hinted call's count of records done."""
    config = small_config(root, resident_trim_interval=0)
    arrivals: list[tuple] = []
    with dispatch_mode(mode):
        real = reput_module._dispatch_hinted

        def counting(*args):  # type: ignore[no-untyped-def]
            out = real(*args)
            if hinted is not None:
                hinted.append(out[0])
            return out

        reput_module._dispatch_hinted = counting  # dispatch_mode puts the real one back
        async with running_store(config, clock_ms=LoopClock()) as store:
            if wanted is None:
                store.set_arrival_listener(lambda *args: arrivals.append(args))
            else:
                store.set_arrival_listener(lambda *args: arrivals.append(args), lambda: wanted)
            for i in range(900):
                if wanted is not None and i in (300, 600):
                    if i == 300:
                        wanted["Other"] = 1
                    else:
                        del wanted["Other"]
                extra = {}
                if i % 3:
                    extra["UNIQ_KEY"] = f"0A000001{i:024X}"
                if i % 97 == 0:
                    extra["DELAY"] = "3"
                keys = None
                if i % 5 == 0:
                    keys = f"  k{i}  shared k{i % 7}" if i % 10 else "   "
                msg = make_message(
                    topic=("Hinted", "Other", "Third")[i % 3],
                    queue_id=i % 6,
                    body=b"m%d" % i,
                    tags=None if i % 4 == 0 else f"Tag{i % 3}",
                    keys=keys,
                    **extra,
                )
                if i % 29 == 0:
                    msg.sys_flag |= MessageSysFlag.TRANSACTION_PREPARED_TYPE
                elif i % 31 == 0:
                    msg.sys_flag |= MessageSysFlag.TRANSACTION_ROLLBACK_TYPE
                await store.put(msg)
                if i % 40 == 39 or i > 500:
                    await store.reput.do_reput()
                if i == 860:  # from here on, keep a copy of each hint the puts leave
                    store.commitlog.dispatch_hints = RecordingDeque(store.commitlog.dispatch_hints)
            await store.reput.do_reput()
            assert not store.commitlog.dispatch_hints  # every hint was taken
            # A re-dispatch of records already dispatched (as after recovery): no queue entries.
            saved = store.commitlog.dispatch_hints.seen
            assert len(saved) > 30
            store.commitlog.dispatch_hints.extend(saved)
            store.reput.reput_from_offset = saved[0].physical_offset
            await store.reput.do_reput()
            table = store.consume_queues
            state = (
                table.logics_msg_timestamp,
                store.reput.reput_from_offset,
                sorted(
                    (t, q, cq.max_physic_offset, cq.max_offset_in_queue)
                    for t, by_id in table.queues.items()
                    for q, cq in by_id.items()
                ),
                [index_state(f) for f in store.consume_queues.index.files],
                arrivals,
                len(store.query_message("Hinted", "shared", 64, 0, store.clock_ms()).messages),
            )
    # The index files in order; their names are the (racy) times they were created.
    index = [data for _name, data in sorted(tree_bytes(config.index_dir).items())]
    return tree_bytes(config.consume_queue_dir), index, state


@pytest.mark.parametrize("modes", [("fast", "general"), ("c", "twin")])
async def test_dispatch_in_c_writes_what_the_python_loop_writes(tmp_path, modes):
    """The hinted dispatch as built (C, or its twin) writes what the general path writes; the C
    function what its twin writes."""
    calls: list[int] = []
    native_cq, native_index, native_state = await fill_varied(
        str(tmp_path / "c"), modes[0], hinted=calls
    )
    assert sum(calls) > 700  # most records went through the hinted dispatch
    python_cq, python_index, python_state = await fill_varied(str(tmp_path / "py"), modes[1])
    assert native_cq.keys() == python_cq.keys() and len(native_cq) > 10
    for name in python_cq:
        assert native_cq[name] == python_cq[name], name
    assert len(native_index) >= 3  # rolled
    assert native_index == python_index
    assert native_state == python_state
    assert native_state[-1] > 0


async def test_arrivals_are_reported_for_the_wanted_topics_only(tmp_path, monkeypatch):
    """The listener's topics (DefaultMessageStore.set_arrival_listener): both dispatch loops
    call it for those topics' records only, as the topics are when each record is
    dispatched, and write the same files as without them."""

    results = []
    for mode in ("fast", "general"):
        results.append(
            await fill_varied(str(tmp_path / f"w{mode}"), mode, {"Hinted": 1, "Third": 2})
        )
    everything = await fill_varied(str(tmp_path / "all"), "general")
    for cq, index, state in results:
        assert cq == everything[0] and index == everything[1]
        arrivals = state[4]
        assert state[:4] == everything[2][:4]
        # Every arrival of Hinted and Third, none of the schedule topic's (not wanted), and
        # Other's only while it was wanted.
        assert {a[0] for a in everything[2][4]} > {"Hinted", "Third", "Other"}
        assert {a[0] for a in arrivals} == {"Hinted", "Third", "Other"}
        want = [a for a in everything[2][4] if a[0] in ("Hinted", "Third")]
        assert [a for a in arrivals if a[0] != "Other"] == want
        others = [a for a in arrivals if a[0] == "Other"]
        all_others = [a for a in everything[2][4] if a[0] == "Other"]
        assert 0 < len(others) < len(all_others)
    assert results[0][2] == results[1][2]  # the hinted dispatch reports what the general does
