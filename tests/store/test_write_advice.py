"""The commit log under SYNC_FLUSH is faulted in a page at a time where it is written
(MappedFile.advise_writes), so that a group commit's sync writes the records, not a large
folio around them again and again.  Checked through the kernel's own view of the mapping
(the ``rr`` flag, VM_RAND_READ, in /proc/self/smaps) and through the bytes the process sent
to the disk (/proc/self/io)."""

from __future__ import annotations

import os

import pytest
import trio

from pymq.store import FlushDiskType, PutMessageStatus
from pymq.store.mapped_file import OS_PAGE_SIZE, MappedFile
from tests.store.helpers import make_message, running_store, small_config

MIB = 1024 * 1024


def random_read_ranges(path: str) -> list[tuple[int, int]]:
    """File ranges of ``path``'s mappings in this process that carry MADV_RANDOM."""
    ranges: list[tuple[int, int]] = []
    real = os.path.realpath(path)
    current: tuple[int, int] | None = None
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if fields and "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:
                current = None
                if len(fields) >= 6 and fields[5] == real:
                    low, high = (int(x, 16) for x in fields[0].split("-"))
                    offset = int(fields[2], 16)
                    current = (offset, offset + high - low)
            elif line.startswith("VmFlags:") and current is not None:
                if "rr" in fields[1:]:
                    ranges.append(current)
                current = None
    return sorted(ranges)


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


@pytest.mark.parametrize("flush", [FlushDiskType.SYNC_FLUSH, FlushDiskType.ASYNC_FLUSH])
async def test_only_the_sync_flush_commit_log_is_advised(root, flush):
    config = small_config(root, flush_disk_type=flush, mapped_file_size_commit_log=8 * MIB)
    async with running_store(config) as store:
        for i in range(20):
            result = await store.put_message(make_message(body=b"%d" % i))
            assert result.status is PutMessageStatus.PUT_OK
        last = store.commitlog.queue.files[-1]
        ranges = random_read_ranges(last.path)
        at_tail = covered(ranges, last.wrote_position, last.wrote_position + OS_PAGE_SIZE)
        assert at_tail is (flush is FlushDiskType.SYNC_FLUSH)
        assert last.advise is (flush is FlushDiskType.SYNC_FLUSH)


def disk_write_bytes() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    raise AssertionError("no write_bytes in /proc/self/io")


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
        await store.put_message(make_message(body=body))
        before = disk_write_bytes()
        stored = 0

        async def producer(i: int) -> None:
            nonlocal stored
            for _ in range(600):
                result = await store.put_message(make_message(queue_id=i % 4, body=body))
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
