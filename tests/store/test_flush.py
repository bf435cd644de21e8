"""Flush services: group commit batching, FLUSH_DISK_TIMEOUT, checkpoint contents."""

from __future__ import annotations

import errno
import functools
import os
import struct
import threading

import pytest
import trio

from pymq.store import FlushDiskType, PutMessageStatus, mapped_file, mapped_file_queue
from pymq.store.mapped_file import MappedFile
from pymq.store.mapped_file_queue import NativeSyncThread, SyncThread
from tests.helpers import StuckDisk, smaps_entries, wait_until
from tests.store.helpers import make_message, running_store, small_config


async def test_sync_flush_group_commit_batches_concurrent_puts(root, monkeypatch):
    syncs = []
    real_sync = MappedFile.sync

    def counting_sync(self):
        syncs.append(self.wrote_position)
        real_sync(self)

    monkeypatch.setattr(MappedFile, "sync", counting_sync)
    monkeypatch.setattr(mapped_file_queue, "NATIVE_SYNC", False)  # syncs counted in Python
    config = small_config(root, flush_disk_type=FlushDiskType.SYNC_FLUSH)
    async with running_store(config) as store:
        results = []

        async def producer(i):
            for j in range(10):
                r = await store.put(make_message(queue_id=i % 4, body=b"%d-%d" % (i, j)))
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
        r = await store.put(make_message(WAIT="false"))
        assert r.status is PutMessageStatus.PUT_OK


async def test_sync_flush_timeout_reports_flush_disk_timeout(root, monkeypatch):
    disk = StuckDisk(monkeypatch)
    config = small_config(root, flush_disk_type=FlushDiskType.SYNC_FLUSH)
    async with running_store(config) as store:
        ok = await store.put(make_message())
        assert ok.status is PutMessageStatus.PUT_OK
        config.sync_flush_timeout = 50  # only now: a loaded machine may take 50 ms to sync
        disk.stuck = True
        r = await store.put(make_message(body=b"slow disk"))
        assert r.status is PutMessageStatus.FLUSH_DISK_TIMEOUT
        assert r.wrote_bytes > 0  # the message is stored, only its durability is unconfirmed
        assert store.look_message_by_offset(r.wrote_offset).body == b"slow disk"
        assert store.commitlog.queue.flushed_where < r.wrote_offset + r.wrote_bytes
        # The disk comes back: the stuck sync ends, releases the queue's lock, and the next
        # put is acknowledged as durable.
        disk.stuck = False
        disk.release.set()
        config.sync_flush_timeout = 5000
        r = await store.put(make_message(body=b"healthy again"))
        assert r.status is PutMessageStatus.PUT_OK
        assert store.commitlog.queue.flushed_where >= r.wrote_offset + r.wrote_bytes


async def test_a_failing_sync_acknowledges_nothing_and_advances_nothing(root, monkeypatch):
    disk = StuckDisk(monkeypatch)
    config = small_config(root, flush_disk_type=FlushDiskType.SYNC_FLUSH)
    async with running_store(config) as store:
        assert (await store.put(make_message())).status is PutMessageStatus.PUT_OK
        flushed = store.commitlog.queue.flushed_where
        config.sync_flush_timeout = 100
        disk.error = OSError(errno.EIO, "injected I/O error")
        r = await store.put(make_message(body=b"lost?"))
        assert r.status is PutMessageStatus.FLUSH_DISK_TIMEOUT
        assert disk.entered >= 2  # the group commit tried, and tried again
        assert store.commitlog.queue.flushed_where == flushed
        disk.error = None
        config.sync_flush_timeout = 5000
        r = await store.put(make_message(body=b"after"))
        assert r.status is PutMessageStatus.PUT_OK
        assert store.commitlog.queue.flushed_where >= r.wrote_offset + r.wrote_bytes


async def test_group_commit_waits_its_turn_when_the_queue_lock_is_held(root):
    config = small_config(root, flush_disk_type=FlushDiskType.SYNC_FLUSH)
    async with running_store(config) as store:
        queue = store.commitlog.queue
        results = []
        # The lock is held (as by a deletion or a timed flush) while the put waits.
        async with trio.open_nursery() as nursery, queue.io_lock:
            nursery.start_soon(lambda: _put_into(store, results))
            await wait_until(lambda: store.flush_commitlog._waiters)
            await trio.sleep(0.05)
            assert results == []  # not acknowledged while nothing could sync
        assert results[0].status is PutMessageStatus.PUT_OK
        assert queue.flushed_where >= results[0].wrote_offset + results[0].wrote_bytes


async def _put_into(store, results) -> None:
    results.append(await store.put(make_message()))


async def test_a_sync_in_flight_releases_the_lock_after_its_waiter_is_cancelled(root, monkeypatch):
    disk = StuckDisk(monkeypatch)
    config = small_config(root, flush_disk_type=FlushDiskType.SYNC_FLUSH)
    async with running_store(config) as store:
        queue = store.commitlog.queue
        disk.stuck = True
        with trio.move_on_after(0.1):
            await store.put(make_message())
        assert disk.entered == 1
        assert queue.io_lock.value == 0  # the job still holds it while its thread is stuck
        disk.release.set()
        with trio.fail_after(10):
            async with queue.io_lock:  # released by the thread's report, not by a waiter
                pass
        assert queue.flushed_where == queue.max_offset


def test_sync_thread_runs_work_in_order_in_its_own_thread():
    thread = SyncThread("test-sync")
    seen: list[tuple[int, str]] = []
    done = threading.Event()
    for i in range(5):
        thread.run(lambda i=i: seen.append((i, threading.current_thread().name)))
    thread.run(lambda: 1 / 0)  # a defect in work is logged; the thread goes on
    thread.run(done.set)
    assert done.wait(10)
    thread.stop()
    thread._thread.join(10)
    assert not thread._thread.is_alive()
    assert seen == [(i, "test-sync") for i in range(5)]


async def test_checkpoint_written_on_shutdown(root):
    clock_now = [1_800_000_000_000]
    config = small_config(root)
    async with running_store(config, clock_ms=lambda: clock_now[0]) as store:
        for i in range(5):
            clock_now[0] += 1000
            await store.put(make_message(keys=f"k{i}"))
    with open(config.checkpoint_path, "rb") as f:
        raw = f.read()
    assert len(raw) == 4096
    physic, logics, index = struct.unpack_from(">qqq", raw, 0)
    assert physic == logics == index == clock_now[0]


async def test_async_flush_runs_on_its_own(root):
    config = small_config(root, flush_interval_commit_log=20, flush_commit_log_least_pages=0)
    async with running_store(config) as store:
        r = await store.put(make_message())
        end = r.wrote_offset + r.wrote_bytes
        # Liveness only: the periodic flush catches up by itself.
        await wait_until(
            lambda: store.commitlog.queue.flushed_where >= end, timeout=10, interval=0.01
        )
        assert store.checkpoint.physic_msg_timestamp == r.store_timestamp


needs_native_sync = pytest.mark.skipif(
    not mapped_file_queue.NATIVE_SYNC, reason="the C extension's sync worker is not built"
)


@needs_native_sync
async def test_the_group_commit_syncs_through_the_c_thread(root, monkeypatch):
    """With the C extension the group commit's syncs never call MappedFile.sync: the C thread
    calls fdatasync on the files' descriptors, and the puts are acknowledged once it is done."""
    called = []
    monkeypatch.setattr(MappedFile, "sync", lambda mf: called.append(mf))
    config = small_config(root, flush_disk_type=FlushDiskType.SYNC_FLUSH)
    async with running_store(config) as store:
        assert isinstance(store.flush_commitlog._sync_thread, NativeSyncThread)
        r = await store.put(make_message(body=b"durable"))
        assert r.status is PutMessageStatus.PUT_OK
        assert store.commitlog.queue.flushed_where >= r.wrote_offset + r.wrote_bytes
        # (Consume queues and the final flush at shutdown still sync in Python.)
        assert not [mf for mf in called if mf in store.commitlog.queue.files]


@needs_native_sync
async def test_a_failing_c_sync_acknowledges_nothing_and_advances_nothing(root, monkeypatch):
    """fdatasync failing in the C thread (here: a pipe's descriptor, EINVAL) is reported as the
    Python thread's OSError is: nothing acknowledged, nothing advanced, and the next good sync
    acknowledges again."""
    read_end, write_end = os.pipe()
    config = small_config(root, flush_disk_type=FlushDiskType.SYNC_FLUSH)
    try:
        async with running_store(config) as store:
            assert (await store.put(make_message())).status is PutMessageStatus.PUT_OK
            flushed = store.commitlog.queue.flushed_where
            config.sync_flush_timeout = 100
            monkeypatch.setattr(MappedFile, "fileno", lambda mf: read_end)
            r = await store.put(make_message(body=b"lost?"))
            assert r.status is PutMessageStatus.FLUSH_DISK_TIMEOUT
            assert store.commitlog.queue.flushed_where == flushed
            monkeypatch.undo()
            config.sync_flush_timeout = 5000
            r = await store.put(make_message(body=b"after"))
            assert r.status is PutMessageStatus.PUT_OK
            assert store.commitlog.queue.flushed_where >= r.wrote_offset + r.wrote_bytes
    finally:
        os.close(read_end)
        os.close(write_end)


@needs_native_sync
async def test_the_c_thread_reports_in_order_and_after_stop(tmp_path):
    mf = MappedFile.create(str(tmp_path / "00000000000000000000"), 1024 * 1024)
    read_end, write_end = os.pipe()

    class PipeFile:
        def fileno(self) -> int:
            return read_end

    reports: list[BaseException | None] = []
    thread = NativeSyncThread("test-native-sync")
    try:
        for files in ([mf], [mf, PipeFile()], [mf]):
            before = len(reports)
            thread.sync_files(files, reports.append)  # type: ignore[list-item]
            with pytest.raises(RuntimeError):  # one job at a time
                thread.sync_files([mf], reports.append)
            await wait_until(lambda: len(reports) > before)  # noqa: B023
        assert reports[0] is None and reports[2] is None
        assert isinstance(reports[1], OSError) and reports[1].errno == errno.EINVAL
        # A sync handed over just before stop() is still reported, and the reaper then ends.
        thread.sync_files([mf], reports.append)
        thread.stop()
        await wait_until(lambda: len(reports) == 4)
        assert reports[3] is None
        await wait_until(lambda: thread._worker is None)
    finally:
        mf.close()
        os.close(read_end)
        os.close(write_end)


@needs_native_sync
async def test_the_c_thread_syncs_the_files_handed_over_though_closed_meanwhile(tmp_path):
    """The worker syncs its own duplicates of the descriptors taken at submit: a file closed
    once its job is handed over, and its number reused (here by a pipe) before the thread gets
    to it, is still the file synced, and the job does not fail or sync something else."""

    class Fd:
        def __init__(self, fd: int) -> None:
            self.fd = fd

        def fileno(self) -> int:
            return self.fd

    slow = os.open(str(tmp_path / "slow"), os.O_RDWR | os.O_CREAT)
    later = os.open(str(tmp_path / "later"), os.O_RDWR | os.O_CREAT)
    read_end, write_end = os.pipe()
    thread = NativeSyncThread("test-native-sync-dup")
    reports: list[BaseException | None] = []
    try:
        os.write(slow, b"x" * (8 * 1024 * 1024))  # dirty: its fdatasync takes a while
        os.write(later, b"y" * 4096)
        thread.sync_files([Fd(slow), Fd(later)], reports.append)  # type: ignore[list-item]
        os.close(later)
        os.dup2(read_end, later)  # the number now names a pipe (fdatasync: EINVAL)
        await wait_until(lambda: reports, timeout=30)
        assert reports == [None]
        # A closed file's descriptor (-1) fails its job (EBADF), as os.fdatasync(-1) would.
        thread.sync_files([Fd(slow), Fd(-1)], reports.append)  # type: ignore[list-item]
        await wait_until(lambda: len(reports) == 2)
        assert isinstance(reports[1], OSError) and reports[1].errno == errno.EBADF
    finally:
        thread.stop()
        for fd in (slow, later, read_end, write_end):
            os.close(fd)


def dirty_kb(path: str) -> int:
    """Dirty kB of ``path``'s mappings in this process (/proc/self/smaps)."""
    return sum(
        int(fields[name].split()[0])
        for _, _, fields in smaps_entries(path)
        for name in ("Private_Dirty", "Shared_Dirty")
    )


@pytest.mark.parametrize("native", [True, False], ids=["populate_write", "byte_writes"])
def test_redirty_marks_synced_pages_for_writing_again(tmp_path, monkeypatch, native):
    if not native:
        monkeypatch.setattr(mapped_file, "_populate_write", None)
    elif mapped_file._populate_write is None:
        pytest.skip("no MADV_POPULATE_WRITE (C extension or kernel)")
    path = str(tmp_path / "00000000000000000000")
    mf = MappedFile.create(path, 1024 * 1024)
    try:
        mf.allocate_to(64 * 1024)
        mf.mm[100:30000] = b"r" * 29900
        mf.sync()
        assert dirty_kb(path) == 0  # written back: clean
        assert mf.redirty(100, 30000) == 8  # the pages holding bytes 0..30000
        assert dirty_kb(path) == 32
        assert mf.mm[100:30000] == b"r" * 29900 and mf.mm[:100] == bytes(100)
        mf.sync()
        assert dirty_kb(path) == 0
    finally:
        mf.close()


async def test_after_a_failed_sync_the_next_one_writes_the_pages_again(root, monkeypatch):
    """A writeback error is reported once: the kernel leaves the pages it could not write clean,
    and the next fdatasync succeeds without writing them.  Here the failing sync really writes
    (cleaning the pages) and then reports EIO; the group commit must dirty those pages again
    before it retries, or it would acknowledge records that never reached the disk."""
    config = small_config(root, flush_disk_type=FlushDiskType.SYNC_FLUSH)
    monkeypatch.setattr(mapped_file_queue, "NATIVE_SYNC", False)
    real_sync = MappedFile.sync
    failures: list[int] = []
    dirty_after_failure: list[int] = []

    def sync(mf: MappedFile) -> None:
        real_sync(mf)  # the pages are clean now, as after a failed writeback
        if failures:
            failures.pop()
            raise OSError(errno.EIO, "injected writeback error")

    async with running_store(config) as store:
        queue = store.commitlog.queue
        assert (await store.put(make_message())).status is PutMessageStatus.PUT_OK
        path = queue.files[-1].path
        assert dirty_kb(path) == 0
        real_failed = queue._sync_failed

        def failed(todo):  # type: ignore[no-untyped-def]
            real_failed(todo)
            dirty_after_failure.append(dirty_kb(path))

        monkeypatch.setattr(queue, "_sync_failed", failed)
        monkeypatch.setattr(MappedFile, "sync", sync)
        failures.append(1)
        r = await store.put(make_message(body=b"x" * 5000))
        assert r.status is PutMessageStatus.PUT_OK  # acknowledged by the retry, which wrote
        assert dirty_after_failure and dirty_after_failure[0] >= 4
        assert dirty_kb(path) == 0
        assert queue.flushed_where >= r.wrote_offset + r.wrote_bytes


@needs_native_sync
async def test_a_failing_c_sync_marks_the_pages_for_writing_again(root, monkeypatch):
    read_end, write_end = os.pipe()
    config = small_config(root, flush_disk_type=FlushDiskType.SYNC_FLUSH)
    redirtied: list[tuple[int, int]] = []
    real_redirty = MappedFile.redirty

    def redirty(mf: MappedFile, start: int, end: int) -> int:
        redirtied.append((mf.file_from_offset + start, mf.file_from_offset + end))
        return real_redirty(mf, start, end)

    try:
        async with running_store(config) as store:
            assert (await store.put(make_message())).status is PutMessageStatus.PUT_OK
            flushed = store.commitlog.queue.flushed_where
            config.sync_flush_timeout = 100
            monkeypatch.setattr(MappedFile, "redirty", redirty)
            monkeypatch.setattr(MappedFile, "fileno", lambda mf: read_end)
            r = await store.put(make_message(body=b"lost?"))
            assert r.status is PutMessageStatus.FLUSH_DISK_TIMEOUT
            monkeypatch.undo()
            assert redirtied and redirtied[0] == (flushed, r.wrote_offset + r.wrote_bytes)
    finally:
        os.close(read_end)
        os.close(write_end)


async def test_a_full_index_file_whose_sync_failed_is_written_again(tmp_path, monkeypatch):
    from pymq.store.index_service import IndexService

    index = IndexService(str(tmp_path), 16, 8, lambda: 1_700_000_000_000)
    index.load(True, 0)
    for i in range(12):  # 8 entries fill the first file; the next roll queues it for a sync
        index.build_index("T", f"k{i}", None, 100 * (i + 1), 1_700_000_000_000 + i, 0)
    full = index._unsynced_full[0]
    real_sync = MappedFile.sync
    fail = [True]

    def sync(mf: MappedFile) -> None:
        real_sync(mf)  # written and cleaned, then reported failed: a lost writeback
        if fail and fail.pop():
            raise OSError(errno.EIO, "injected writeback error")

    monkeypatch.setattr(MappedFile, "sync", sync)
    with pytest.raises(OSError):
        await index.flush()
    assert index._unsynced_full == [full] and index.flushed_index_timestamp == 0
    assert dirty_kb(full.mf.path) >= 4  # marked for writing again
    await index.flush()
    assert dirty_kb(full.mf.path) == 0 and not index._unsynced_full
    assert index.flushed_index_timestamp == full.end_timestamp > 0
    for f in index.files:
        f.close()


@pytest.mark.parametrize("path", ["group commit", "timed flush"])
async def test_a_failed_sync_dirties_again_the_pages_written_while_it_ran(
    tmp_path, monkeypatch, path
):
    """The loop keeps appending while a sync runs, and ``fdatasync`` writes back every dirty page
    of the file, those too: when it fails, the pages written after the sync began are as clean
    and as unwritten as the others, and the next sync, which covers them, would not write them."""
    from pymq.store.mapped_file_queue import MappedFileQueue

    queue = MappedFileQueue(str(tmp_path / "log"), 1024 * 1024)
    mf = queue.get_last_mapped_file()
    mf.append(b"a" * 5000)
    started, go = threading.Event(), threading.Event()
    real_sync = MappedFile.sync

    def sync(self: MappedFile) -> None:
        started.set()
        go.wait(5)
        real_sync(self)  # written and cleaned, then reported failed: a lost writeback
        raise OSError(errno.EIO, "injected writeback error")

    monkeypatch.setattr(MappedFile, "sync", sync)
    thread = SyncThread("test-sync")
    try:
        async with trio.open_nursery() as nursery:
            if path == "group commit":
                job = queue.begin_flush(thread)
                assert job is not None
                wait = job.wait
            else:
                wait = functools.partial(queue.flush, 0)
            failed = trio.Event()

            async def flush() -> None:
                with pytest.raises(OSError):
                    await wait()
                failed.set()

            nursery.start_soon(flush)
            await trio.to_thread.run_sync(started.wait, 5)
            mf.append(b"b" * 20000)  # while the sync runs: bytes 5000..25000
            go.set()
            await failed.wait()
        assert queue.flushed_where == 0
        assert dirty_kb(mf.path) >= 28  # the 7 pages of bytes 0..25000, all to be written
    finally:
        thread.stop()
        queue.close()


@pytest.mark.parametrize("native", [True, False], ids=["populate_write", "byte_writes"])
def test_redirty_leaves_the_holes_of_a_sparse_file_alone(tmp_path, monkeypatch, native):
    """Nothing is written above ``allocated``: a write fault on a hole would allocate its block
    (and raise SIGBUS on a full disk).  A full index file found sparse on disk (written by Java)
    is redirtied whole after a failed sync."""
    if not native:
        monkeypatch.setattr(mapped_file, "_populate_write", None)
    path = str(tmp_path / "00000000000000000000")
    mf = MappedFile.create(path, 1024 * 1024, chunk=64 * 1024)
    try:
        assert mf.allocated == 64 * 1024
        mf.mm[:100] = b"x" * 100
        mf.sync()
        blocks = os.stat(path).st_blocks
        assert mf.redirty(0, mf.file_size) == 16  # the allocated 64 KiB only
        assert dirty_kb(path) == 64
        mf.sync()
        assert os.stat(path).st_blocks == blocks  # no hole was filled
        mf.close()
        assert mf.redirty(0, mf.file_size) == 0  # closed (by shutdown, or deleted): nothing
    finally:
        mf.close()


async def test_an_index_file_deleted_while_its_sync_runs_leaves_the_next_one_queued(
    tmp_path, monkeypatch
):
    """The clean service may delete the full file a flush is syncing (it takes it off the list
    of files to sync): the flush then must not take the next file off in its place, unsynced,
    or the checkpoint's index timestamp would pass entries that never reached the disk."""
    from pymq.store.index_service import IndexService

    index = IndexService(str(tmp_path), 16, 8, lambda: 1_700_000_000_000)
    index.load(True, 0)
    for i in range(20):  # 7 entries a file: two full files queued for a sync, a third written
        index.build_index("T", f"k{i}", None, 100 * (i + 1), 1_700_000_000_000 + i, 0)
    first, second = index._unsynced_full
    real_sync = MappedFile.sync
    synced, go = threading.Event(), threading.Event()
    done: list[MappedFile] = []

    def sync(mf: MappedFile) -> None:
        real_sync(mf)
        done.append(mf)
        if mf is first.mf:
            synced.set()
            go.wait(5)

    monkeypatch.setattr(MappedFile, "sync", sync)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(index.flush)
        await trio.to_thread.run_sync(synced.wait, 5)
        index._unsynced_full.remove(first)  # as IndexService.delete_files does first
        go.set()
    assert done == [first.mf, second.mf] and not index._unsynced_full
    assert index.flushed_index_timestamp == second.end_timestamp
    for f in index.files:
        f.close()
    first.close()


async def test_a_failing_disk_is_retried_on_a_backoff(root, monkeypatch):
    """While syncs keep failing, the group commit retries 10 ms, 20 ms, ... apart (each try
    redirties the unflushed pages), not every 10 ms, and puts arriving meanwhile do not add
    tries of their own; the first good sync acknowledges again and resets the count."""
    disk = StuckDisk(monkeypatch)
    config = small_config(root, flush_disk_type=FlushDiskType.SYNC_FLUSH)
    async with running_store(config) as store:
        assert (await store.put(make_message())).status is PutMessageStatus.PUT_OK
        config.sync_flush_timeout = 300
        disk.error = OSError(errno.EIO, "injected I/O error")
        before = disk.entered
        results = []

        async def put(i: int) -> None:
            await trio.sleep(i * 0.005)  # puts arriving all through the backoff
            results.append(await store.put(make_message(body=b"m%d" % i)))

        async with trio.open_nursery() as nursery:
            for i in range(40):
                nursery.start_soon(put, i)
        assert {r.status for r in results} == {PutMessageStatus.FLUSH_DISK_TIMEOUT}
        tries = disk.entered - before
        assert 2 <= tries <= 10, tries  # 0, 10, 30, 70, 150, 310 ms...: not one per put
        disk.error = None
        config.sync_flush_timeout = 5000
        r = await store.put(make_message(body=b"after"))
        assert r.status is PutMessageStatus.PUT_OK  # the next try, within a second
        assert store.commitlog.queue.sync_failures == 0
