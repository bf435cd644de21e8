"""Consume-queue reads (Java's getMessage rules), lookups by time and by key, arrivals."""

from __future__ import annotations

import os
import pathlib

import trio

from pymq.common.message_ext import java_string_hash
from pymq.common.record import decode_record
from pymq.store import GetMessageStatus as S
from pymq.store.consume_queue import CQ_STORE_UNIT_SIZE
from tests.store.helpers import SMALL_CQ, make_message, running_store, small_config


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


async def test_get_message_statuses(root):
    config = small_config(root)
    async with running_store(config) as store:
        r = store.get_message("g", "Nope", 0, 0, 32)
        assert r.status is S.NO_MATCHED_LOGIC_QUEUE and r.next_begin_offset == 0
        for i in range(10):
            tags = "TagA" if i % 2 == 0 else "TagB"
            await store.put(make_message(queue_id=0, body=b"%d" % i, tags=tags))
        await store.reput.do_reput()
        r = store.get_message("g", "TopicTest", 0, 0, 4)
        assert r.status is S.FOUND and r.message_count == 4 and r.next_begin_offset == 4
        assert (r.min_offset, r.max_offset) == (0, 10)
        assert r.queue_offsets == [0, 1, 2, 3]
        r = store.get_message("g", "TopicTest", 0, 10, 4)
        assert r.status is S.OFFSET_OVERFLOW_ONE and r.next_begin_offset == 10
        r = store.get_message("g", "TopicTest", 0, 11, 4)
        assert r.status is S.OFFSET_OVERFLOW_BADLY and r.next_begin_offset == 0  # min is 0
        only_b = {java_string_hash("TagB")}
        r = store.get_message("g", "TopicTest", 0, 0, 32, only_b)
        assert r.status is S.FOUND
        assert [decode_record(m).body for m in r.messages] == [b"1", b"3", b"5", b"7", b"9"]
        assert r.next_begin_offset == 10
        r = store.get_message("g", "TopicTest", 0, 0, 32, {java_string_hash("TagZ")})
        assert r.status is S.NO_MATCHED_MESSAGE and r.next_begin_offset == 10
        # an empty queue that exists: NO_MESSAGE_IN_QUEUE
        store.consume_queues.find_or_create("Empty", 0)
        r = store.get_message("g", "Empty", 0, 5, 32)
        assert r.status is S.NO_MESSAGE_IN_QUEUE and r.next_begin_offset == 0


async def test_get_message_stops_at_consume_queue_file_end_and_size_caps(root):
    config = small_config(root, max_transfer_count_on_message_in_memory=1000)
    per_file = SMALL_CQ // CQ_STORE_UNIT_SIZE
    async with running_store(config) as store:
        for _ in range(per_file + 10):
            await store.put(make_message(body=b"x" * 10))
        await store.reput.do_reput()
        r = store.get_message("g", "TopicTest", 0, per_file - 3, 64)
        assert r.status is S.FOUND and r.message_count == 3  # one consume-queue file per pull
        assert r.next_begin_offset == per_file
        r = store.get_message("g", "TopicTest", 0, per_file, 64)
        assert r.message_count == 10
        config.max_transfer_bytes_on_message_in_memory = 3 * r.messages[0].__len__()
        r = store.get_message("g", "TopicTest", 0, 0, 64)
        assert r.message_count == 3 and r.next_begin_offset == 3


async def test_offset_by_time_and_store_timestamps(root):
    clock = Clock(1_000_000)
    config = small_config(root)
    async with running_store(config, clock_ms=clock) as store:
        for i in range(50):
            clock.now = 1_000_000 + i * 1000
            await store.put(make_message(queue_id=1))
        await store.reput.do_reput()
        assert store.get_message_store_timestamp("TopicTest", 1, 7) == 1_007_000
        assert store.get_earliest_message_time("TopicTest", 1) == 1_000_000
        by_time = store.get_offset_in_queue_by_time
        assert by_time("TopicTest", 1, 0) == 0
        assert by_time("TopicTest", 1, 1_020_000) == 20
        assert by_time("TopicTest", 1, 1_020_001) == 21
        assert by_time("TopicTest", 1, 9_999_999) == 50
        assert by_time("Nope", 1, 1) == 0


async def test_query_by_key_and_unique_key(root):
    clock = Clock(2_000_000_000_000)
    config = small_config(root)  # 256 entries per index file: several files
    async with running_store(config, clock_ms=clock) as store:
        offsets = {}
        for i in range(300):
            clock.now += 10
            r = await store.put(make_message(keys=f"order-{i % 30} shared", UNIQ_KEY=f"U{i:030d}"))
            offsets[i] = r.wrote_offset
        await store.reput.do_reput()
        assert len(os.listdir(config.index_dir)) >= 2
        found = store.query_message("TopicTest", "order-7", 64, 0, clock.now)
        bodies = sorted(decode_record(m).commitlog_offset for m in found.messages)
        assert bodies == sorted(offsets[i] for i in range(7, 300, 30))
        found = store.query_message("TopicTest", f"U{123:030d}", 64, 0, clock.now)
        assert [decode_record(m).commitlog_offset for m in found.messages] == [offsets[123]]
        assert store.query_message("Other", "order-7", 64, 0, clock.now).messages == []
        limited = store.query_message("TopicTest", "shared", 5, 0, clock.now)
        assert len(limited.messages) == 5
        assert limited.index_last_update_phyoffset == offsets[299]


async def test_records_without_keys_leave_the_index_as_it_was(root):
    """A record with neither KEYS nor UNIQ_KEY (a transaction's op record) writes nothing to
    the index, its header included; a full index file still rolls, as Java's buildIndex gets
    its file first."""
    config = small_config(root)  # 256 entries per index file
    async with running_store(config) as store:
        await store.put(make_message(keys="k-1"))
        await store.reput.do_reput()
        index = store.index
        assert index is not None
        path = index.files[-1].path
        index.files[-1].mf.mm.flush()
        before = pathlib.Path(path).read_bytes()
        for _ in range(5):
            await store.put(make_message(tags=None))
        await store.reput.do_reput()
        index.files[-1].mf.mm.flush()
        assert pathlib.Path(path).read_bytes() == before
        for i in range(300):  # fill the file: the next record, keyless, rolls to a new one
            await store.put(make_message(keys=f"k-{i}"))
        await store.reput.do_reput()
        while not index.files[-1].is_full:
            await store.put(make_message(keys="more"))
            await store.reput.do_reput()
        files = len(index.files)
        await store.put(make_message(tags=None))
        await store.reput.do_reput()
        assert len(index.files) == files + 1


async def test_index_survives_restart(root):
    config = small_config(root)
    async with running_store(config) as store:
        r = await store.put(make_message(keys="k-1"))
    async with running_store(config) as store:
        found = store.query_message("TopicTest", "k-1", 10, 0, 2**62)
        assert [decode_record(m).commitlog_offset for m in found.messages] == [r.wrote_offset]


async def test_arrival_listener_woken_by_put(root):
    config = small_config(root)
    async with running_store(config) as store:
        arrived = []
        event = trio.Event()

        def listener(topic, queue_id, offset, tags_code, store_ts):
            arrived.append((topic, queue_id, offset, tags_code))
            event.set()

        store.set_arrival_listener(listener)
        await store.put(make_message(queue_id=5, tags="TagA"))
        with trio.fail_after(10):  # liveness only: the reput task must wake up on its own
            await event.wait()
        assert arrived == [("TopicTest", 5, 1, java_string_hash("TagA"))]


async def test_delete_topics(root):
    config = small_config(root)
    async with running_store(config) as store:
        await store.put(make_message(topic="Gone", queue_id=1))
        await store.put(make_message(topic="Kept", queue_id=1))
        await store.reput.do_reput()
        assert await store.delete_topics(["Gone"]) == 1
        assert store.get_max_offset_in_queue("Gone", 1) == 0
        assert not os.path.exists(os.path.join(config.consume_queue_dir, "Gone"))
        assert store.get_max_offset_in_queue("Kept", 1) == 1
        r = await store.put(make_message(topic="Gone", queue_id=1))
        assert r.logic_offset == 0
    info_keys = {"commitLogMaxOffset", "dispatchBehindBytes"}
    assert info_keys <= set(store.runtime_info())


async def test_a_deleted_topic_stays_deleted_when_dispatch_lagged(root):
    # A send is answered once its record is in the commit log; dispatch may come later. A
    # deletion in between must not see its queue come back when the reput task catches up.
    config = small_config(root)
    async with running_store(config) as store:
        async with store.reput.caught_up():  # the reput task is busy: the put only wakes it
            await store.put(make_message(topic="Late", queue_id=0))
        assert store.get_max_offset_in_queue("Late", 0) == 0  # not dispatched yet
        assert await store.delete_topics(["Late"]) == 1
        await store.reput.do_reput()
        assert store.get_max_offset_in_queue("Late", 0) == 0
        assert not os.path.exists(os.path.join(config.consume_queue_dir, "Late"))


async def test_failing_listener_does_not_stop_dispatch(root):
    config = small_config(root)
    async with running_store(config) as store:
        calls = []

        def listener(topic, queue_id, offset, tags_code, store_ts):
            calls.append(offset)
            raise RuntimeError("long polling bug")

        store.set_arrival_listener(listener)
        for _ in range(3):
            await store.put(make_message())
        await store.reput.do_reput()
        assert calls == [1, 2, 3]
        assert store.get_max_offset_in_queue("TopicTest", 0) == 3


async def test_query_by_producer_unique_ids(root):
    """Real UNIQ_KEYs (32 hex digits, 20 of them fixed per producer) are indexed with the hash
    of the whole ``topic#key``, for two producers and two topics."""
    from pymq.common.message_id import UniqueIdGenerator

    clock = Clock(2_000_000_000_000)
    async with running_store(small_config(root), clock_ms=clock) as store:
        sent = []
        for gen in (UniqueIdGenerator("10.0.0.1", pid=11), UniqueIdGenerator("10.0.0.2", pid=22)):
            for i in range(40):
                clock.now += 10
                uniq = gen.create(clock.now)
                topic = "TopicTest" if i % 2 else "Other"
                r = await store.put(make_message(topic=topic, UNIQ_KEY=uniq))
                sent.append((topic, uniq, r.wrote_offset))
        await store.reput.do_reput()
        for topic, uniq, offset in sent:
            found = store.query_message(topic, uniq, 8, 0, clock.now)
            assert [decode_record(m).commitlog_offset for m in found.messages] == [offset]


def test_index_files_load_in_log_order_though_their_names_went_back_an_hour(tmp_path, monkeypatch):
    """Index files are named by local time, which repeats an hour when daylight saving time
    ends: a file made in the repeated hour has a smaller name than the one before it.  Loading
    orders them by what they hold, so the newest (the one written to) comes last."""
    from pymq.store import index_service
    from pymq.store.index_service import IndexService

    names = iter(range(20261101015900000, 0, -3_600_000))  # each an hour before the last
    monkeypatch.setattr(index_service, "index_file_name", lambda ms: str(next(names)))
    ts = 1_700_000_000_000
    index = IndexService(str(tmp_path), 16, 8, lambda: ts)
    index.load(True, 0)
    for i in range(20):  # 7 entries a file: three files
        index.build_index("T", f"k{i}", None, 100 * (i + 1), ts + i, 0)
    written = [f.mf.path for f in index.files]
    assert len(written) == 3 and sorted(written) == written[::-1]  # names run backwards
    index.close()
    again = IndexService(str(tmp_path), 16, 8, lambda: ts)
    again.load(True, 0)
    assert [f.mf.path for f in again.files] == written
    again.build_index("T", "k20", None, 2100, ts + 20, 0)  # written to the newest file
    assert again.files[-1].end_phy_offset == 2100
    for i in range(21):
        assert again.query("T", f"k{i}", 4, 0, 2**62)[0] == [100 * (i + 1)], i
    again.close()
