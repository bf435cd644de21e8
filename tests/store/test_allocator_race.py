"""The pre-allocator must never delete a file the queue opened while it was still creating it."""

from __future__ import annotations

import os
import time

import trio
import trio.testing

from pymq.store import mapped_file_queue
from pymq.store.mapped_file import MappedFile
from pymq.store.mapped_file_queue import MappedFileAllocator


async def test_file_claimed_while_being_created_survives(tmp_path, monkeypatch) -> None:
    path = str(tmp_path / "commitlog" / f"{1 << 20:020d}")
    created = trio.Event()
    finished = trio.Event()
    real_create = MappedFile.create

    def slow_create(p: str, size: int) -> MappedFile:
        mf = real_create(p, size)
        trio.from_thread.run_sync(created.set)
        time.sleep(0.3)  # the worker thread is still busy when the queue needs the file
        trio.from_thread.run_sync(finished.set)
        return mf

    monkeypatch.setattr(mapped_file_queue.MappedFile, "create", staticmethod(slow_create))
    allocator = MappedFileAllocator()
    async with trio.open_nursery() as nursery:
        await nursery.start(allocator.run)
        allocator.request(path, 1 << 20)
        await created.wait()
        assert allocator.take(path) is None  # not ready: the queue creates it on demand
        mine = real_create(path, 1 << 20)
        assert mine.append(b"acknowledged bytes")
        with trio.fail_after(10):
            await finished.wait()
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert os.path.exists(path)
    with open(path, "rb") as f:
        assert f.read(18) == b"acknowledged bytes"
    mine.close()


async def test_a_file_being_created_at_shutdown_is_deleted_not_leaked(
    tmp_path, monkeypatch
) -> None:
    """Cancelled while its thread creates a file, the allocator waits for the thread and deletes
    the file it made: an empty file left behind would load as part of the queue."""
    path = str(tmp_path / "commitlog" / f"{1 << 20:020d}")
    created = trio.Event()
    real_create = MappedFile.create
    made: list[MappedFile] = []

    def slow_create(p: str, size: int) -> MappedFile:
        mf = real_create(p, size)
        made.append(mf)
        trio.from_thread.run_sync(created.set)
        time.sleep(0.3)  # still in the thread when the allocator is cancelled
        return mf

    monkeypatch.setattr(mapped_file_queue.MappedFile, "create", staticmethod(slow_create))
    allocator = MappedFileAllocator()
    async with trio.open_nursery() as nursery:
        await nursery.start(allocator.run)
        allocator.request(path, 1 << 20)
        await created.wait()
        nursery.cancel_scope.cancel()
    assert not os.path.exists(path)
    assert len(made) == 1 and made[0]._fd < 0  # unmapped and closed too
