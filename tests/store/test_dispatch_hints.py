"""Dispatch hints: what the put path hands reput must build exactly what parsing the records
back builds (consume queues and index, byte for byte), and a hint that does not match the log
must not be used."""

from __future__ import annotations

import collections
import os

from pymq.common.message_ext import MessageSysFlag
from pymq.store import commitlog as commitlog_module
from pymq.store.commitlog import DispatchHint
from pymq.store.reput import ReputMessageService
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
