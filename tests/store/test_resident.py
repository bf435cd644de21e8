"""trim_resident: the broker's resident set stays small however large the store, and trimmed
pages read back intact (the page cache keeps them)."""

from __future__ import annotations

import os

import trio

from pymq.store import PutMessageStatus
from tests.store.helpers import make_message, running_store, small_config


def rss_file_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssFile:"):
                return int(line.split()[1])
    raise AssertionError("no RssFile in /proc/self/status")


async def test_trim_resident_unmaps_written_pages_and_data_reads_back(root):
    config = small_config(
        root,
        mapped_file_size_commit_log=16 * 1024 * 1024,
        resident_trim_interval=0,  # called by hand below
    )
    body = os.urandom(4000)
    async with running_store(config) as store:
        results = []
        for i in range(12_000):  # ~48 MB: two full files and most of a third
            r = await store.put(make_message(queue_id=i % 4, body=body + b"%d" % i))
            assert r.status is PutMessageStatus.PUT_OK
            results.append(r)
        await store.reput.do_reput()
        before = rss_file_kb()
        await store.trim_resident()
        after = rss_file_kb()
        # The two full files and the written part of the last one, but its 8 MiB tail, go.
        assert before - after > 30 * 1024, (before, after)
        for i in (0, 5_000, 11_999):  # reading maps the pages in again, contents intact
            found = store.look_message_by_offset(results[i].wrote_offset)
            assert found is not None and found.body == body + b"%d" % i
        got = store.get_message("G", "TopicTest", 0, 0, 32)
        assert got.message_count == 32


async def test_a_fast_publish_is_trimmed_by_bytes_written_not_only_by_time(root, monkeypatch):
    """With an interval far off, the commit log's growth alone brings the next trim: a fast
    publish does not map in an interval's worth of pages first."""
    from pymq.store import message_store

    monkeypatch.setattr(message_store, "RESIDENT_TRIM_BYTES", 1024 * 1024)
    monkeypatch.setattr(message_store, "RESIDENT_TRIM_POLL_S", 0.01)
    config = small_config(
        root, mapped_file_size_commit_log=16 * 1024 * 1024, resident_trim_interval=3_600_000
    )
    body = os.urandom(4000)
    async with running_store(config) as store:
        trims = 0
        trim = store.trim_resident

        async def counted() -> None:
            nonlocal trims
            trims += 1
            await trim()

        monkeypatch.setattr(store, "trim_resident", counted)
        await trio.sleep(0.05)
        assert trims == 0  # nothing written: the hour-long interval holds
        for i in range(600):  # ~2.4 MB
            r = await store.put(make_message(queue_id=i % 4, body=body))
            assert r.status is PutMessageStatus.PUT_OK
        await trio.sleep(0.1)
        assert trims >= 1
