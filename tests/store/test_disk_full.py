"""A full disk never kills the store: files are allocated when they are made, so a full disk
fails a file's creation (answered, logged, retried) instead of a write into a sparse mapping
(SIGBUS).  Each test mounts a small tmpfs and fills it for real."""

from __future__ import annotations

import errno
import os
import pathlib
from collections.abc import Iterator

import pytest

from pymq.common.message import decode_record
from pymq.store import mapped_file as mapped_file_module
from pymq.store.mapped_file import CREATING_SUFFIX, MappedFile
from pymq.store.results import GetMessageStatus, PutMessageStatus
from tests.helpers import wait_until
from tests.store.helpers import (
    fill_disk,
    make_message,
    running_store,
    small_config,
    small_tmpfs,
    write_ballast,
)

MIB = 1024 * 1024
BODY = b"x" * 2000


@pytest.fixture
def fs(tmp_path: pathlib.Path) -> Iterator[str]:
    with small_tmpfs(str(tmp_path / "fs"), 4 * MIB) as path:
        yield path


def _leftovers(directory: str, size: int) -> list[str]:
    """Files a failed creation could have left: hidden temporaries, wrong or sparse sizes."""
    bad = []
    for name in os.listdir(directory):
        st = os.stat(os.path.join(directory, name))
        if name.endswith(CREATING_SUFFIX) or st.st_size != size or st.st_blocks * 512 < size:
            bad.append(name)
    return bad


# --- MappedFile ------------------------------------------------------------------------------


def test_create_allocates_every_block(fs: str) -> None:
    mf = MappedFile.create(os.path.join(fs, "d", "00000000000000000000"), MIB)
    try:
        assert os.fstat(mf._fd).st_blocks * 512 >= MIB  # not sparse
    finally:
        mf.close()


@pytest.mark.parametrize("fallocate", ["native", "unsupported"])
def test_create_on_a_full_disk_fails_and_leaves_nothing(
    fs: str, fallocate: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if fallocate == "unsupported":
        monkeypatch.setattr(mapped_file_module, "_fallback_warned", False)

        def no_fallocate(fd: int, offset: int, length: int) -> None:
            raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

        monkeypatch.setattr(os, "posix_fallocate", no_fallocate)
    directory = os.path.join(fs, "d")
    os.makedirs(directory)
    write_ballast(os.path.join(fs, "ballast"), 3 * MIB)
    with pytest.raises(OSError) as caught:
        MappedFile.create(os.path.join(directory, "00000000000000000000"), 2 * MIB)
    assert caught.value.errno == errno.ENOSPC
    assert os.listdir(directory) == []  # neither the file nor its temporary
    # The space the failed attempt took is back: a file that fits is made, all allocated.
    mf = MappedFile.create(os.path.join(directory, "00000000000000000000"), MIB // 2)
    try:
        assert os.fstat(mf._fd).st_blocks * 512 >= MIB // 2
    finally:
        mf.close()


def test_fallback_fills_only_the_holes_of_a_sparse_file(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sparse file (older pymq, Java) gets its blocks when loaded; the zero-writing fallback
    for filesystems without fallocate never overwrites data."""

    def no_fallocate(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(os, "posix_fallocate", no_fallocate)
    path = str(tmp_path / "00000000000000000000")
    with open(path, "wb") as f:
        f.truncate(MIB)
        f.seek(300_000)
        f.write(b"data")
    mf = MappedFile(path, MIB)
    try:
        assert os.fstat(mf._fd).st_blocks * 512 < MIB
        mf.ensure_allocated()
        assert os.fstat(mf._fd).st_blocks * 512 >= MIB
        assert mf.mm[300_000:300_004] == b"data"
        assert mf.mm[:300_000] == bytes(300_000)
    finally:
        mf.close()


# --- the store -------------------------------------------------------------------------------


async def test_commitlog_full_refuses_puts_keeps_acked_and_resumes(fs: str) -> None:
    """1 MiB commit-log files on a 4 MiB disk: puts go until the next file cannot be made, are
    then refused with a reason while the store keeps running, resume once space is freed, and
    everything acknowledged is read back after a restart."""
    root = os.path.join(fs, "store")
    ballast = os.path.join(fs, "ballast")
    write_ballast(ballast, MIB)
    config = small_config(
        root, mapped_file_size_commit_log=MIB, mapped_file_create_retry_interval=20
    )
    acked: dict[int, bytes] = {}
    async with running_store(config, disk_ratio=lambda _path: 0.5) as store:
        refused = []
        for i in range(5000):
            body = b"%06d" % i + BODY
            result = await store.put_message(make_message(body=body))
            if result.status is PutMessageStatus.PUT_OK:
                acked[result.logic_offset] = body
            else:
                refused.append(result)
                if len(refused) == 3:
                    break
        assert len(refused) == 3, "the disk never filled"
        assert len(acked) > 500  # more than one file's worth went in first
        for result in refused:
            assert result.status is PutMessageStatus.CREATE_MAPEDFILE_FAILED
            assert "disk full" in result.reason
        assert store.running
        assert _leftovers(config.store_path_commitlog, MIB) == []
        # The queue offsets stayed dense: the next put takes the next one.
        await store.reput.do_reput()
        assert store.reput.blocked is None
        assert store.get_max_offset_in_queue("TopicTest", 0) == len(acked)

        os.unlink(ballast)  # space comes back: the allocator's retry makes the file
        await wait_until(
            lambda: not store.allocator.failing, timeout=20, interval=0.01, what="allocator retry"
        )
        for i in range(20):
            body = b"again-%d" % i
            result = await store.put_message(make_message(body=body))
            assert result.status is PutMessageStatus.PUT_OK, result
            assert result.logic_offset == len(acked)
            acked[result.logic_offset] = body
        await store.reput.do_reput()

    async with running_store(config, disk_ratio=lambda _path: 0.5) as store:
        assert store.get_max_offset_in_queue("TopicTest", 0) == len(acked)
        got = store.get_message("G", "TopicTest", 0, 0, len(acked))
        read: dict[int, bytes] = {}
        offset = 0
        while offset < len(acked):
            got = store.get_message("G", "TopicTest", 0, offset, 32)
            assert got.status is GetMessageStatus.FOUND
            for raw in got.messages:
                msg = decode_record(raw)
                read[msg.queue_offset] = msg.body
            offset = got.next_begin_offset
        assert read == acked


async def test_consume_queue_file_on_a_full_disk_blocks_dispatch_then_catches_up(
    fs: str,
) -> None:
    """A message whose consume-queue file cannot be made is stored and acked; dispatch waits
    at it (puts are refused meanwhile, with a reason) and indexes it once space is back."""
    root = os.path.join(fs, "store")
    config = small_config(
        root,
        mapped_file_size_commit_log=MIB // 2,
        mapped_file_size_consume_queue=20 * 10_000,
        mapped_file_create_retry_interval=20,
    )
    async with running_store(config, disk_ratio=lambda _path: 0.5) as store:
        assert (await store.put_message(make_message(topic="A"))).is_ok
        await store.reput.do_reput()
        await wait_until(
            lambda: len(os.listdir(config.store_path_commitlog)) == 2,
            timeout=20,
            interval=0.01,
            what="prealloc",
        )
        ballast = os.path.join(fs, "ballast")
        fill_disk(ballast)
        # The commit log has room (its blocks exist): the put is acked.
        first = await store.put_message(make_message(topic="B", body=b"on a full disk"))
        assert first.is_ok
        await store.reput.do_reput()
        assert store.reput.blocked is not None
        assert "no space left" in store.reput.blocked
        refused = await store.put_message(make_message(topic="A"))
        assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert "not writeable" in refused.reason
        assert store.get_max_offset_in_queue("B", 0) == 0
        assert store.running

        os.unlink(ballast)
        await wait_until(
            lambda: store.reput.blocked is None, timeout=20, interval=0.01, what="dispatch retry"
        )
        got = store.get_message("G", "B", 0, 0, 1)
        assert got.status is GetMessageStatus.FOUND
        assert decode_record(got.messages[0]).body == b"on a full disk"
        assert (await store.put_message(make_message(topic="A"))).logic_offset == 1
        await store.reput.do_reput()
        assert store.get_max_offset_in_queue("A", 0) == 2


async def test_index_file_on_a_full_disk_blocks_dispatch_then_catches_up(fs: str) -> None:
    """The same for an index file: the record waits, and is found by key once space is back."""
    root = os.path.join(fs, "store")
    config = small_config(
        root,
        mapped_file_size_commit_log=MIB // 2,
        max_hash_slot_num=64,
        max_index_num=4,  # full after 3 keys: the 4th message needs a new index file
        mapped_file_create_retry_interval=20,
    )
    async with running_store(config, disk_ratio=lambda _path: 0.5) as store:
        assert (await store.put_message(make_message(keys="k0"))).is_ok
        await store.reput.do_reput()
        await wait_until(
            lambda: len(os.listdir(config.store_path_commitlog)) == 2,
            timeout=20,
            interval=0.01,
            what="prealloc",
        )
        ballast = os.path.join(fs, "ballast")
        fill_disk(ballast)
        for key in ("k1", "k2", "late"):
            assert (await store.put_message(make_message(keys=key))).is_ok
        await store.reput.do_reput()
        assert store.reput.blocked is not None
        refused = await store.put_message(make_message())
        assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert _leftovers(config.index_dir, os.path.getsize(store.index.files[0].path)) == []

        os.unlink(ballast)
        await wait_until(
            lambda: store.reput.blocked is None, timeout=20, interval=0.01, what="dispatch retry"
        )
        found = store.query_message("TopicTest", "late", 10, 0, 1 << 62)
        assert [decode_record(raw).body for raw in found.messages] == [b"hello"]
        assert store.get_max_offset_in_queue("TopicTest", 0) == 4
