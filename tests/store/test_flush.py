"""Flush services: group commit batching, FLUSH_DISK_TIMEOUT, checkpoint contents."""

from __future__ import annotations

import struct

import trio

from pymq.store import FlushDiskType, PutMessageStatus
from pymq.store.mapped_file import MappedFile
from tests.helpers import wait_until
from tests.store.helpers import make_message, running_store, small_config


async def test_sync_flush_group_commit_batches_concurrent_puts(root, monkeypatch):
    syncs = []
    real_sync = MappedFile.sync

    def counting_sync(self):
        syncs.append(self.wrote_position)
        real_sync(self)

    monkeypatch.setattr(MappedFile, "sync", counting_sync)
    config = small_config(root, flush_disk_type=FlushDiskType.SYNC_FLUSH)
    async with running_store(config) as store:
        results = []

        async def producer(i):
            for j in range(10):
                r = await store.put_message(make_message(queue_id=i % 4, body=b"%d-%d" % (i, j)))
                results.append(r)
                # acknowledged means durable: the flushed position covers the record
                assert store.commitlog.queue.flushed_where >= r.wrote_offset + r.wrote_bytes

        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(producer, i)
        assert len(results) == 200
        assert all(r.status is PutMessageStatus.PUT_OK for r in results)
        assert len(syncs) < 200  # concurrent puts shared syncs
        # WAIT=false: acknowledged on append, not on sync
        r = await store.put_message(make_message(WAIT="false"))
        assert r.status is PutMessageStatus.PUT_OK


async def test_sync_flush_timeout_reports_flush_disk_timeout(root):
    config = small_config(root, flush_disk_type=FlushDiskType.SYNC_FLUSH)
    async with running_store(config) as store:
        ok = await store.put_message(make_message())
        assert ok.status is PutMessageStatus.PUT_OK
        config.sync_flush_timeout = 50  # only now: a loaded machine may take 50 ms to sync
        stuck = trio.Event()

        async def stuck_flush(least_pages):
            await stuck.wait()
            return False

        store.commitlog.queue.flush = stuck_flush
        r = await store.put_message(make_message(body=b"slow disk"))
        assert r.status is PutMessageStatus.FLUSH_DISK_TIMEOUT
        assert r.wrote_bytes > 0  # the message is stored, only its durability is unconfirmed
        assert store.look_message_by_offset(r.wrote_offset).body == b"slow disk"
        stuck.set()
        del store.commitlog.queue.flush


async def test_checkpoint_written_on_shutdown(root):
    clock_now = [1_800_000_000_000]
    config = small_config(root)
    async with running_store(config, clock_ms=lambda: clock_now[0]) as store:
        for i in range(5):
            clock_now[0] += 1000
            await store.put_message(make_message(keys=f"k{i}"))
    with open(config.checkpoint_path, "rb") as f:
        raw = f.read()
    assert len(raw) == 4096
    physic, logics, index = struct.unpack_from(">qqq", raw, 0)
    assert physic == logics == index == clock_now[0]


async def test_async_flush_runs_on_its_own(root):
    config = small_config(root, flush_interval_commit_log=20, flush_commit_log_least_pages=0)
    async with running_store(config) as store:
        r = await store.put_message(make_message())
        end = r.wrote_offset + r.wrote_bytes
        # Liveness only: the periodic flush catches up by itself.
        await wait_until(
            lambda: store.commitlog.queue.flushed_where >= end, timeout=10, interval=0.01
        )
        assert store.checkpoint.physic_msg_timestamp == r.store_timestamp
