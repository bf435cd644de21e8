"""MappedFile creation and the allocator racing the queue for the same file."""

from __future__ import annotations

import os
import threading

import trio

from pymq.store.mapped_file import MappedFile
from pymq.store.mapped_file_queue import MappedFileAllocator, MappedFileQueue
from tests.helpers import wait_until

SIZE = 4096 * 4


async def test_allocator_never_deletes_a_file_the_queue_made_itself(tmp_path, monkeypatch):
    """The allocator thread is mid-creation when the queue needs the file and makes it itself."""
    release = threading.Event()
    finished = threading.Event()
    real_create = MappedFile.create.__func__
    main = threading.get_ident()

    def gated_create(cls, path, size, **kwargs):
        if threading.get_ident() == main:
            return real_create(cls, path, size, **kwargs)
        release.wait(10)
        try:
            return real_create(cls, path, size, **kwargs)
        finally:
            finished.set()

    monkeypatch.setattr(MappedFile, "create", classmethod(gated_create))
    allocator = MappedFileAllocator()
    queue = MappedFileQueue(str(tmp_path / "log"), SIZE, allocator)
    async with trio.open_nursery() as nursery:
        await nursery.start(allocator.run)
        first = queue.get_last_mapped_file(0)  # asks the allocator for the next file
        await trio.sleep(0.05)  # the allocator's thread starts and waits at the gate
        first.append(b"x" * SIZE)
        second = queue.get_last_mapped_file(0)  # not ready: the queue makes it itself
        assert second.file_from_offset == SIZE
        second.append(b"precious")
        release.set()
        await wait_until(finished.is_set, timeout=10, interval=0.01)  # liveness only
        await trio.sleep(0.05)  # the allocator handles the late file
        assert os.path.exists(second.path)
        with open(second.path, "rb") as f:
            assert f.read(8) == b"precious"
        nursery.cancel_scope.cancel()
    queue.close()


def test_create_is_atomic_and_idempotent(tmp_path):
    path = str(tmp_path / "d" / f"{0:020d}")
    a = MappedFile.create(path, SIZE)
    a.append(b"data")
    b = MappedFile.create(path, SIZE)  # a second creator maps the same file, no truncation
    assert b.mm[:4] == b"data"
    assert os.path.getsize(path) == SIZE
    assert [n for n in os.listdir(tmp_path / "d")] == [f"{0:020d}"]  # no temporary left
    a.close()
    b.close()
