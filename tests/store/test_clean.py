"""Clean services with an injected clock, disk usage and file ages."""

from __future__ import annotations

import datetime
import os

from pymq.store import GetMessageStatus, PutMessageStatus
from tests.store.helpers import make_message, running_store, small_config

HOUR_MS = 3600 * 1000


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def local_ms(day: int, hour: int) -> int:
    return int(datetime.datetime(2026, 3, day, hour, 30).timestamp() * 1000)


def cl_files(store) -> list[str]:
    """Names of the commit log's files (a pre-allocated next file is not one of them yet)."""
    return [os.path.basename(mf.path) for mf in store.commitlog.queue.files]


async def fill_files(store, count=300):
    for i in range(count):
        await store.put(make_message(queue_id=i % 2, body=b"c" * 900, keys=f"k{i}"))
    await store.reput.do_reput()


async def test_expired_files_deleted_at_the_delete_hour(root):
    start = local_ms(10, 3)
    clock = Clock(start)
    mtimes: dict[str, float] = {}

    def mtime(path: str) -> float:
        return mtimes.setdefault(path, start / 1000)

    config = small_config(root, file_reserved_time=72, delete_when="04")
    async with running_store(
        config, clock_ms=clock, disk_ratio=lambda _p: 0.10, mtime=mtime
    ) as store:
        await fill_files(store)
        files = cl_files(store)
        assert len(files) >= 5
        # Old enough but not the delete hour (03:30): nothing goes.
        clock.now = local_ms(14, 3)
        await store.clean_files_once()
        assert cl_files(store) == files
        # The delete hour, 73 h after 03:30 on the 10th; but the first files are only 71 h old.
        clock.now = local_ms(13, 4)
        for f in files[:2]:
            mtimes[os.path.join(config.store_path_commitlog, f)] = (clock.now - 71 * HOUR_MS) / 1000
        await store.clean_files_once()
        assert cl_files(store) == files  # stops at a young file
        for f in files[:2]:
            mtimes[os.path.join(config.store_path_commitlog, f)] = start / 1000
        await store.clean_files_once()
        left = cl_files(store)
        assert left == files[-1:]  # everything but the newest file
        assert store.min_phy_offset == int(files[-1])
        for q in range(2):
            low = store.get_min_offset_in_queue("TopicTest", q)
            assert low > 0
            r = store.get_message("g", "TopicTest", q, 0, 32)
            assert r.status is GetMessageStatus.OFFSET_TOO_SMALL and r.next_begin_offset == low
            r = store.get_message("g", "TopicTest", q, low, 32)
            assert r.status is GetMessageStatus.FOUND
        # consume-queue files wholly below the commit log went too (100 entries per file)
        cq = store.consume_queues.find("TopicTest", 0)
        assert cq.queue.files[0].file_from_offset > 0
        cq_dir = os.path.join(config.consume_queue_dir, "TopicTest", "0")
        assert len(os.listdir(cq_dir)) == len(cq.queue.files)
        r = await store.put(make_message())
        assert r.status is PutMessageStatus.PUT_OK


async def test_disk_pressure_forces_cleaning_and_refuses_writes(root):
    clock = Clock(local_ms(10, 12))
    ratio = [0.5]
    config = small_config(root, max_index_num=100_000)
    async with running_store(
        config, clock_ms=clock, disk_ratio=lambda _p: ratio[0], mtime=lambda _p: clock.now / 1000
    ) as store:
        await fill_files(store)
        files = cl_files(store)
        ratio[0] = 0.80  # above diskMaxUsedSpaceRatio: deletion allowed, but files are young
        await store.clean_files_once()
        assert cl_files(store) == files
        ratio[0] = 0.87  # above 85 %: forced, whatever the age
        await store.clean_files_once()
        assert cl_files(store) == files[-1:]
        assert (await store.put(make_message())).status is PutMessageStatus.PUT_OK
        ratio[0] = 0.95  # above 90 %: writes refused with a clear reason
        await store.clean_files_once()
        r = await store.put(make_message())
        assert r.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert "disk full" in r.reason
        assert store.runtime_info()["diskFull"] == "true"
        ratio[0] = 0.40
        await store.clean_files_once()
        assert (await store.put(make_message())).status is PutMessageStatus.PUT_OK


async def test_index_files_below_the_commitlog_are_deleted(root):
    clock = Clock(local_ms(10, 12))
    config = small_config(root)  # 256 entries per index file: one per ~128 messages here
    async with running_store(
        config, clock_ms=clock, disk_ratio=lambda _p: 0.87, mtime=lambda _p: 0.0
    ) as store:
        await fill_files(store, 600)
        before = len(os.listdir(config.index_dir))
        assert before >= 3
        for _ in range(5):
            await store.clean_files_once()
        after = os.listdir(config.index_dir)
        assert 1 <= len(after) < before
        assert all(f.end_phy_offset >= store.min_phy_offset for f in store.index.files[:-1])


async def test_message_was_removing_between_the_two_clean_services(root):
    clock = Clock(local_ms(10, 12))
    config = small_config(root)
    async with running_store(
        config, clock_ms=clock, disk_ratio=lambda _p: 0.87, mtime=lambda _p: 0.0
    ) as store:
        await fill_files(store)
        await store.clean_commitlog.run_once()  # commit log cleaned, queues not yet corrected
        r = store.get_message("g", "TopicTest", 0, 0, 4)
        assert r.status is GetMessageStatus.MESSAGE_WAS_REMOVING
        assert r.next_begin_offset > 0
        await store.clean_consume_queue.run_once()
        r = store.get_message("g", "TopicTest", 0, 0, 4)
        assert r.status is GetMessageStatus.OFFSET_TOO_SMALL
