"""The commit log under SYNC_FLUSH is faulted in a page at a time where it is written
(MappedFile.advise_writes), so that a group commit's sync writes the records, not a large
folio around them again and again.  Checked through the kernel's own view of the mapping
(the ``rr`` flag, VM_RAND_READ, in /proc/self/smaps) and through the bytes the process sent
to the disk (/proc/self/io)."""

from __future__ import annotations

import ctypes
import mmap
import os
from typing import Any

import pytest
import trio

from pymq.common.files import LARGE_READAHEAD_KB, readahead_kb
from pymq.common.message_ext import MessageExt
from pymq.store import FlushDiskType, PutMessageStatus
from pymq.store.config import WriteAdvice
from pymq.store.mapped_file import OS_PAGE_SIZE, MappedFile
from pymq.store.mapped_file_queue import MappedFileQueue
from tests.helpers import smaps_entries
from tests.store.helpers import make_message, running_store, small_config

MIB = 1024 * 1024


def random_read_ranges(path: str) -> list[tuple[int, int]]:
    """File ranges of ``path``'s mappings in this process that carry MADV_RANDOM."""
    return sorted(
        (low, high)
        for low, high, fields in smaps_entries(path)
        if "rr" in fields.get("VmFlags", "").split()
    )


def covered(ranges: list[tuple[int, int]], start: int, end: int) -> bool:
    return any(lo <= start and end <= hi for lo, hi in ranges)


def test_advice_follows_allocation_and_is_taken_back_on_release(tmp_path):
    path = str(tmp_path / "00000000000000000000")
    mf = MappedFile.create(path, 16 * MIB, chunk=MIB)
    try:
        assert random_read_ranges(path) == []  # nothing unless asked
        mf.advise_writes()
        assert covered(random_read_ranges(path), 0, MIB)  # the allocated first chunk
        mf.allocate_to(3 * MIB + 1)
        ranges = random_read_ranges(path)
        assert covered(ranges, 0, 4 * MIB)
        assert not covered(ranges, 4 * MIB, 4 * MIB + OS_PAGE_SIZE)  # not allocated yet
        mf.append(b"x" * (2 * MIB))
        mf.release_resident(2 * MIB)  # done with the first 2 MiB: readahead again
        ranges = random_read_ranges(path)
        assert not covered(ranges, 0, OS_PAGE_SIZE)
        assert not covered(ranges, 2 * MIB - OS_PAGE_SIZE, 2 * MIB)
        assert covered(ranges, 2 * MIB, 4 * MIB)
    finally:
        mf.close()


def test_a_recovered_file_is_advised_from_its_data_end(tmp_path):
    path = str(tmp_path / "00000000000000000000")
    MappedFile.create(path, 16 * MIB, chunk=MIB).close()
    mf = MappedFile(path, 16 * MIB, chunk=MIB)  # as loading maps it: nothing known
    try:
        mf.wrote_position = 5 * MIB + 100
        mf.advise_writes()
        mf.ensure_allocated(5 * MIB + 100)
        ranges = random_read_ranges(path)
        assert covered(ranges, 5 * MIB, 6 * MIB)
        assert not covered(ranges, 5 * MIB - OS_PAGE_SIZE, 5 * MIB)  # the data: read ahead
    finally:
        mf.close()


SYNC, ASYNC = FlushDiskType.SYNC_FLUSH, FlushDiskType.ASYNC_FLUSH


@pytest.mark.parametrize(
    ("flush", "advice", "device_kb", "advised"),
    [
        (SYNC, WriteAdvice.AUTO, 128, True),
        (SYNC, WriteAdvice.FOLLOW, None, True),  # SYNC_FLUSH's whatever the key
        (ASYNC, WriteAdvice.AUTO, 8192, True),  # this project's VM
        (ASYNC, WriteAdvice.AUTO, LARGE_READAHEAD_KB, True),
        (ASYNC, WriteAdvice.AUTO, LARGE_READAHEAD_KB - 1, False),
        (ASYNC, WriteAdvice.AUTO, 128, False),  # Linux's default
        (ASYNC, WriteAdvice.AUTO, None, False),  # no block device (tmpfs) or no sysfs
        (ASYNC, WriteAdvice.RANDOM, 128, True),
        (ASYNC, WriteAdvice.FOLLOW, 8192, False),
    ],
)
async def test_the_commit_log_is_advised_as_its_flush_device_and_key_say(
    root, flush, advice, device_kb, advised
):
    asked: list[str] = []

    def readahead(path: str) -> int | None:
        asked.append(path)
        return device_kb

    config = small_config(
        root,
        flush_disk_type=flush,
        mapped_file_size_commit_log=8 * MIB,
        commit_log_write_advice=advice,
    )
    async with running_store(config, readahead=readahead) as store:
        for i in range(20):
            result = await store.put(make_message(body=b"%d" % i))
            assert result.status is PutMessageStatus.PUT_OK
        last = store.commitlog.queue.files[-1]
        ranges = random_read_ranges(last.path)
        at_tail = covered(ranges, last.wrote_position, last.wrote_position + OS_PAGE_SIZE)
        assert at_tail is advised
        assert last.advise is advised
    # The device is asked of only where the key leaves it to the device.
    auto = flush is ASYNC and advice is WriteAdvice.AUTO
    assert asked == ([config.store_path_commitlog] if auto else [])


def test_the_readahead_of_a_path_is_its_device_s(tmp_path) -> None:
    """readahead_kb reads the device's read_ahead_kb where sysfs has it; a directory not made
    yet is on its parent's device; a filesystem without a block device has none."""
    here = readahead_kb(str(tmp_path))
    if here is None:
        pytest.skip("no block device readahead here (tmpfs, overlayfs or no sysfs)")
    dev = os.stat(tmp_path).st_dev
    bdi = f"/sys/class/bdi/{os.major(dev)}:{os.minor(dev)}/read_ahead_kb"
    if os.path.exists(bdi):  # a whole disk: its backing device's own figure
        with open(bdi) as f:
            assert here == int(f.read())
    assert here > 0
    assert readahead_kb(str(tmp_path / "not" / "made" / "yet")) == here
    if os.path.isdir("/proc"):
        assert readahead_kb("/proc") is None  # procfs: no block device


def disk_write_bytes() -> int:
    if not os.path.exists("/proc/self/io"):
        pytest.skip("no /proc/self/io (a kernel without task I/O accounting)")
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    raise AssertionError("no write_bytes in /proc/self/io")


@pytest.mark.slow
async def test_group_commit_writes_the_records_not_large_folios_again(root):
    """Concurrent puts of 1 KiB, each waiting for the group commit: the bytes the process
    sends to the disk stay within a small multiple of the records' (without the advice, on
    Linux 6.18 with ext4, each sync wrote the large folio around the write position again:
    about 15x the records)."""
    config = small_config(
        root, flush_disk_type=FlushDiskType.SYNC_FLUSH, mapped_file_size_commit_log=64 * MIB
    )
    body = b"b" * 1024
    async with running_store(config) as store:
        await store.put(make_message(body=body))
        before = disk_write_bytes()
        stored = 0

        async def producer(i: int) -> None:
            nonlocal stored
            for _ in range(600):
                result = await store.put(make_message(queue_id=i % 4, body=body))
                assert result.status is PutMessageStatus.PUT_OK
                stored += result.wrote_bytes

        async with trio.open_nursery() as nursery:
            for i in range(64):
                nursery.start_soon(producer, i)
        written = disk_write_bytes() - before
    if written == 0:
        pytest.skip("this filesystem does not account written bytes (tmpfs?)")
    # Records, their consume-queue entries and index entries, and the tail page each sync
    # writes again: a few times the records at most.
    assert written < 4 * stored, f"{written} bytes written for {stored} bytes of records"


def test_a_full_file_is_read_ahead_again_once_the_next_is_written(tmp_path):
    """Readers of a full file's data (consumers catching up) get readahead back as soon as the
    queue moves on, even when trim_resident never runs (resident_trim_interval 0)."""
    queue = MappedFileQueue(str(tmp_path), 8 * MIB)
    queue.advise_writes = True
    try:
        first = queue.get_last_mapped_file(0)
        assert covered(random_read_ranges(first.path), 0, OS_PAGE_SIZE)
        first.append(b"x" * (8 * MIB))
        second = queue.get_last_mapped_file(0)
        assert second is not first
        assert random_read_ranges(first.path) == []
        assert covered(random_read_ranges(second.path), 0, OS_PAGE_SIZE)
    finally:
        queue.close()


def mapped_pages_cached(mm: mmap.mmap, start: int, end: int) -> int:
    """Pages of ``[start, end)`` of the file mapped by ``mm`` that are in the page cache
    (mincore: residency is the page cache's, whoever maps the file)."""
    libc = ctypes.CDLL(None, use_errno=True)
    buf = (ctypes.c_char * len(mm)).from_buffer(mm)
    try:
        base = ctypes.addressof(buf) + start
        count = -(-(end - start) // mmap.PAGESIZE)
        vec = (ctypes.c_ubyte * count)()
        if libc.mincore(ctypes.c_void_p(base), ctypes.c_size_t(end - start), vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        return sum(v & 1 for v in vec)
    finally:
        del buf


def resident_pages(mf: MappedFile, start: int, end: int) -> int:
    """Pages of ``[start, end)`` of ``mf`` in the page cache."""
    return mapped_pages_cached(mf.mm, start, end)


def test_recovery_drops_the_cached_pages_past_the_data_end(tmp_path):
    """Recovery reads the last file with readahead, which caches the pages past its data end
    as large folios; madvise cannot split those, so the file about to be written drops them."""
    directory = tmp_path / "commitlog"
    mf = MappedFile.create(str(directory / "00000000000000000000"), 16 * MIB, chunk=MIB)
    mf.allocate_to(6 * MIB)
    mf.mm[: 3 * MIB + 100] = b"y" * (3 * MIB + 100)
    mf.sync()
    mf.close()
    queue = MappedFileQueue(str(directory), 16 * MIB, chunk=MIB)
    queue.advise_writes = True
    queue.load()
    try:
        last = queue.files[-1]
        os.pread(last._fd, MIB, 10 * MIB)  # can this filesystem's cached pages be dropped?
        os.posix_fadvise(last._fd, 10 * MIB, MIB, os.POSIX_FADV_DONTNEED)
        if resident_pages(last, 10 * MIB, 11 * MIB):
            pytest.skip("this filesystem keeps its cached pages (tmpfs?)")
        os.pread(last._fd, 3 * MIB, 3 * MIB)  # as a scan's readahead past the data would
        if resident_pages(last, 4 * MIB, 6 * MIB) == 0:
            pytest.skip("the pages read were not cached")
        queue.truncate_dirty_files(3 * MIB + 100)
        assert resident_pages(last, 4 * MIB, 6 * MIB) == 0
        assert last.read(0, 4) == b"yyyy"  # the data is read again
        assert covered(random_read_ranges(last.path), 3 * MIB, 4 * MIB)
    finally:
        queue.close()


def test_a_file_recovered_without_blocks_is_advised_from_its_write_position(tmp_path):
    """Recovery could not allocate (a full disk: ``allocated`` stays 0); the first write then
    allocates from 0, but only the part from the write position on is advised."""
    path = str(tmp_path / "00000000000000000000")
    MappedFile.create(path, 16 * MIB, chunk=MIB).close()
    mf = MappedFile(path, 16 * MIB, chunk=MIB)
    try:
        mf.wrote_position = 5 * MIB + 100
        mf.advise_writes()
        mf.append(b"z" * 100)
        ranges = random_read_ranges(path)
        assert covered(ranges, 5 * MIB, 6 * MIB)
        assert not covered(ranges, 5 * MIB - OS_PAGE_SIZE, 5 * MIB)
    finally:
        mf.close()


def test_a_warm_file_is_advised_before_its_pages_are_faulted_in(tmp_path):
    from pymq.store.mapped_file_queue import _create_populated

    path = str(tmp_path / "00000000000000000000")
    mf = _create_populated(path, 16 * MIB, True)
    try:
        assert mf.advise
        assert covered(random_read_ranges(path), 0, mf.allocated)
    finally:
        mf.close()


def cached_pages(path: str, start: int, end: int) -> int:
    """Pages of ``[start, end)`` of the file at ``path`` in the page cache, through a mapping of
    our own (mapping faults nothing in)."""
    fd = os.open(path, os.O_RDWR)
    try:
        mm = mmap.mmap(fd, 0)
    finally:
        os.close(fd)
    try:
        return mapped_pages_cached(mm, start, end)
    finally:
        mm.close()


async def write_newest_file(root: str, count: int) -> tuple[str, int]:
    """A store of ``count`` 1 KiB messages in a 16 MiB commit-log file, shut down: the file's
    path and its data end."""
    config = small_config(root, mapped_file_size_commit_log=16 * MIB)
    async with running_store(config) as store:
        for i in range(count):
            result = await store.put(make_message(body=b"%05d" % i + b"x" * 1000))
            assert result.status is PutMessageStatus.PUT_OK
        newest = store.commitlog.queue.files[-1]
        return newest.path, newest.wrote_position


def export_scan(root: str, **options: Any) -> list[MessageExt]:
    """Every message the export's scan reads from the store at ``root``, whose newest file is
    a segment of the plan."""
    from pymq.export.options import ExportOptions
    from pymq.export.scan import SegmentScan, plan_store

    opts = ExportOptions(path=root, **options)
    plan = plan_store(opts)
    assert plan.segments[-1].newest
    return [msg for segment in plan.segments for msg in SegmentScan(segment, opts)]


async def test_an_export_scan_drops_the_zeros_it_cached_past_the_newest_files_data(root):
    """The export's scan reads the newest commit-log file to its zeros, and readahead caches
    more of them as large folios; a SYNC_FLUSH broker writing there next would sync whole
    folios again, so the scan drops them when it is done with the file."""
    path, data_end = await write_newest_file(root, 50)
    assert data_end < 2 * MIB
    fd = os.open(path, os.O_RDONLY)
    try:
        os.pread(fd, MIB, 10 * MIB)  # can this filesystem's cached pages be dropped?
        os.posix_fadvise(fd, 10 * MIB, MIB, os.POSIX_FADV_DONTNEED)
        if cached_pages(path, 10 * MIB, 11 * MIB):
            pytest.skip("this filesystem keeps its cached pages (tmpfs?)")
        os.pread(fd, 3 * MIB, 2 * MIB)  # zeros cached past the data, as readahead leaves them
    finally:
        os.close(fd)
    if cached_pages(path, 2 * MIB, 5 * MIB) == 0:
        pytest.skip("the pages read were not cached")
    assert len(export_scan(root)) == 50
    assert cached_pages(path, 2 * MIB, 5 * MIB) == 0


async def test_an_export_scan_that_stops_early_leaves_the_records_after_its_stop_cached(root):
    """A scan of the newest file that stops before its data end (here toOffset; on a running
    broker the checkpoint's bound) drops nothing: the cached records after its stop are the
    newest, most read ones, and it never read up to the zeros."""
    path, data_end = await write_newest_file(root, 4500)
    assert data_end > 4 * MIB
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        if cached_pages(path, 2 * MIB, 4 * MIB):
            pytest.skip("this filesystem keeps its cached pages (tmpfs?)")
        os.pread(fd, data_end, 0)  # the records cached, as consumers' reads leave them
    finally:
        os.close(fd)
    cached = cached_pages(path, 2 * MIB, 4 * MIB)
    if cached == 0:
        pytest.skip("the pages read were not cached")
    assert 0 < len(export_scan(root, to_offset=MIB)) < 4500
    assert cached_pages(path, 2 * MIB, 4 * MIB) == cached
