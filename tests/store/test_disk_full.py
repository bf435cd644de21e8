"""A full disk never kills the store: a file's blocks are allocated before anything is written
into its mapping (its first chunk when it is made, the next ones ahead of the write position),
so a full disk fails a file's creation or a chunk's allocation (answered, logged, retried)
instead of a write into a sparse mapping (SIGBUS).  Disk use grows with the data.  Most tests
mount a small tmpfs and fill it for real."""

from __future__ import annotations

import errno
import os
import pathlib
import threading
from collections.abc import Iterator

import pytest
import trio

from pymq.common.record import decode_record
from pymq.store import DefaultMessageStore, MessageStoreConfig
from pymq.store import mapped_file as mapped_file_module
from pymq.store.commitlog import CommitLog
from pymq.store.index_file import IndexFile
from pymq.store.mapped_file import CREATING_SUFFIX, MappedFile
from pymq.store.mapped_file_queue import MappedFileQueue
from pymq.store.results import GetMessageStatus, PutMessageStatus
from tests.helpers import c_functions, wait_until
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


def caught_up(store) -> bool:  # type: ignore[no-untyped-def]
    """Dispatch unblocked and done (``blocked`` is cleared when a retry starts, before the
    files it waited for are made in a worker thread)."""
    return (
        store.reput.blocked is None and store.reput.reput_from_offset == store.commitlog.max_offset
    )


def _leftovers(directory: str, size: int) -> list[str]:
    """Files a failed creation could have left: hidden temporaries, wrong sizes."""
    bad = []
    for name in os.listdir(directory):
        st = os.stat(os.path.join(directory, name))
        if name.endswith(CREATING_SUFFIX) or st.st_size != size:
            bad.append(name)
    return bad


def _on_disk(path: str) -> int:
    return os.stat(path).st_blocks * 512


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def _check_allocation(
    mf: MappedFile, data_end: int, first: int | None = None, *, ahead: int = 0
) -> None:
    """The rule: a file's blocks exist up to its data end (never lag the writes) and at most
    one chunk beyond (or its first allocation, ``first``, which is one chunk unless given),
    plus ``ahead`` chunks allocated before the writer needs them (the commit log's one)."""
    assert mf.allocated >= data_end, (mf, data_end)
    on_disk = _on_disk(mf.path)
    assert on_disk >= mf.allocated // 4096 * 4096, (mf, on_disk)
    upper = max(first if first is not None else mf.chunk, _round_up(data_end, mf.chunk))
    upper += ahead * mf.chunk
    assert on_disk <= _round_up(min(upper, mf.file_size), 4096), (mf, data_end, on_disk)


def _check_commitlog_allocation(mf: MappedFile, *, warm: bool = False) -> None:
    """The commit log follows the rule; with warmMapedFileEnable it allocates one chunk more,
    ahead of its writer, once the writer is in its last chunk."""
    _check_allocation(mf, mf.wrote_position, ahead=1 if warm else 0)


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mapped_file_module, "ALLOCATE_CHUNK", 8192)
    monkeypatch.setattr(mapped_file_module, "CQ_ALLOCATE_CHUNK", 4096)


# --- MappedFile ------------------------------------------------------------------------------


def test_create_allocates_the_first_chunk_and_appends_the_next(
    fs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mapped_file_module, "ALLOCATE_CHUNK", 64 * 1024)
    mf = MappedFile.create(os.path.join(fs, "d", "00000000000000000000"), MIB)
    try:
        assert mf.allocated == 64 * 1024
        assert 64 * 1024 <= _on_disk(mf.path) < MIB
        for _ in range(10):
            assert mf.append(b"z" * 30_000)
            _check_allocation(mf, mf.wrote_position)
        assert mf.allocated == 320 * 1024  # 300,000 bytes rounded up to the 64 KiB chunk
        mf.allocate_to(MIB + 1)  # never past the end of the file
        assert mf.allocated == MIB
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
    mf = MappedFile(path, MIB, chunk=64 * 1024)
    try:
        assert mf.allocated == 0  # found on disk: nothing known
        assert _on_disk(path) < 300_000
        mf.ensure_allocated(300_004)  # its data end: up to there and the next chunk
        assert mf.allocated == 320 * 1024
        assert 300_004 <= _on_disk(path) <= 320 * 1024  # not the whole file
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
    # One consume-queue file and one index file for the whole test, made (with all their
    # blocks) by the first put: a new one needed while the commit log fills the disk could not
    # be made, and dispatch would stop (a race the test lost about one run in three).
    config = small_config(
        root,
        mapped_file_size_commit_log=MIB,
        mapped_file_create_retry_interval=20,
        mapped_file_size_consume_queue=60_000,
        max_index_num=6000,
    )
    acked: dict[int, bytes] = {}
    next_file = os.path.join(config.store_path_commitlog, f"{MIB:020d}")
    async with running_store(config, disk_ratio=lambda _path: 0.5) as store:
        refused = []
        for i in range(5000):
            body = b"%06d" % i + BODY
            result = await store.put(make_message(body=body))
            if result.status is PutMessageStatus.PUT_OK:
                acked[result.logic_offset] = body
            else:
                refused.append(result)
                if len(refused) == 3:
                    break
            if i == 0:
                # The first put's dispatch makes those files (in a worker thread): made
                # before the commit log fills the disk (the puts ran ahead of it once in CI).
                await store.reput.do_reput()
                # And the allocator's next commit-log file, made ahead: the put path takes it
                # rather than making its own while the allocator's is half made (two at once
                # do not fit, and the second file went unused in one run).
                await wait_until(
                    lambda: next_file in store.allocator._ready, timeout=10, what="the next file"
                )
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
            result = await store.put(make_message(body=body))
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
        assert (await store.put(make_message(topic="A"))).is_ok
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
        first = await store.put(make_message(topic="B", body=b"on a full disk"))
        assert first.is_ok
        await store.reput.do_reput()
        assert store.reput.blocked is not None
        assert "no space left" in store.reput.blocked
        refused = await store.put(make_message(topic="A"))
        assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert "not writeable" in refused.reason
        assert store.get_max_offset_in_queue("B", 0) == 0
        assert store.running

        os.unlink(ballast)
        await wait_until(lambda: caught_up(store), timeout=20, interval=0.01, what="dispatch retry")
        got = store.get_message("G", "B", 0, 0, 1)
        assert got.status is GetMessageStatus.FOUND
        assert decode_record(got.messages[0]).body == b"on a full disk"
        assert (await store.put(make_message(topic="A"))).logic_offset == 1
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
        assert (await store.put(make_message(keys="k0"))).is_ok
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
            assert (await store.put(make_message(keys=key))).is_ok
        await store.reput.do_reput()
        assert store.reput.blocked is not None
        refused = await store.put(make_message())
        assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert _leftovers(config.index_dir, os.path.getsize(store.index.files[0].path)) == []

        os.unlink(ballast)
        await wait_until(lambda: caught_up(store), timeout=20, interval=0.01, what="dispatch retry")
        found = store.query_message("TopicTest", "late", 10, 0, 1 << 62)
        assert [decode_record(raw).body for raw in found.messages] == [b"hello"]
        assert store.get_max_offset_in_queue("TopicTest", 0) == 4


# --- allocation ahead of the writes ------------------------------------------------------------


def _check_index_allocation(f: IndexFile) -> None:
    """Header and slot table (and a chunk of entries) at creation, entries a chunk at a time."""
    _check_allocation(f.mf, f.data_end, first=f._entries_at + f.mf.chunk)


def _check_store_allocation(store: DefaultMessageStore) -> None:
    for mf in store.commitlog.queue.files:
        _check_commitlog_allocation(mf, warm=store.commitlog.warm)
    for cq in store.consume_queues:
        for mf in cq.queue.files:
            _check_allocation(mf, mf.wrote_position)
    assert store.index is not None
    for f in store.index.files:
        _check_index_allocation(f)


async def test_blocks_grow_with_the_data_and_never_lag_it(fs: str, small_chunks: None) -> None:
    """Commit log (8 KiB chunks here), consume queue (4 KiB) and index (8 KiB for its
    entries; header and slot table at creation): after every put and dispatch each file's
    blocks cover its data and go at most one chunk beyond."""
    root = os.path.join(fs, "store")
    config = small_config(
        root,
        mapped_file_size_commit_log=MIB,
        mapped_file_size_consume_queue=20 * 2000,
        max_hash_slot_num=64,
        max_index_num=3000,
    )
    async with running_store(config, disk_ratio=lambda _path: 0.5) as store:
        commitlog = store.commitlog.queue
        _check_store_allocation(store)
        for i in range(600):
            result = await store.put(make_message(body=b"b" * 1000, keys=f"k{i}"))
            assert result.is_ok
            if i % 7 == 0:
                await store.reput.do_reput()
            _check_store_allocation(store)
        await store.reput.do_reput()
        _check_store_allocation(store)
        # They grew, a chunk at a time, far from their full sizes.
        assert 600 * 1000 < _on_disk(commitlog.files[0].path) < MIB
        cq = store.consume_queues.find_or_create("TopicTest", 0)
        assert 600 * 20 <= _on_disk(cq.queue.files[0].path) <= 600 * 20 + 4096
        index = store.index.files[0]
        assert index._entries_at + 8192 < _on_disk(index.path) < index.mf.file_size


async def test_commitlog_chunk_on_a_full_disk_is_refused_and_resumes(
    fs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit-log file made, but the disk full when its next 64 KiB chunk is needed: the put
    is refused (CREATE_MAPEDFILE_FAILED, a reason), nothing changes, the store keeps running,
    puts resume once space is back, and everything acked is read back after a restart."""
    monkeypatch.setattr(mapped_file_module, "ALLOCATE_CHUNK", 64 * 1024)
    root = os.path.join(fs, "store")
    config = small_config(
        root, mapped_file_size_commit_log=2 * MIB, mapped_file_create_retry_interval=20
    )
    acked: dict[int, bytes] = {}
    async with running_store(config, disk_ratio=lambda _path: 0.5) as store:
        first = await store.put(make_message(body=b"first"))
        acked[first.logic_offset] = b"first"
        await store.reput.do_reput()
        await wait_until(
            lambda: len(os.listdir(config.store_path_commitlog)) == 2,
            timeout=20,
            interval=0.01,
            what="prealloc",
        )
        ballast = os.path.join(fs, "ballast")
        fill_disk(ballast)
        refused = []
        for i in range(200):
            body = b"%06d" % i + BODY
            before = store.commitlog.max_offset
            result = await store.put(make_message(body=body))
            if result.status is PutMessageStatus.PUT_OK:
                acked[result.logic_offset] = body
                continue
            refused.append(result)
            assert store.commitlog.max_offset == before  # nothing written
            if len(refused) == 3:
                break
        assert len(refused) == 3, "the disk never filled"
        for result in refused:
            assert result.status is PutMessageStatus.CREATE_MAPEDFILE_FAILED
            assert "disk full" in result.reason
        mf = store.commitlog.queue.files[0]
        assert len(store.commitlog.queue.files) == 1
        assert 0 < mf.wrote_position < 256 * 1024  # refused in the middle of the file
        _check_commitlog_allocation(mf)
        assert store.running
        await store.reput.do_reput()
        assert store.reput.blocked is None
        assert store.get_max_offset_in_queue("TopicTest", 0) == len(acked)

        os.unlink(ballast)
        await trio.sleep(0.03)  # the retry interval: the next put allocates again
        for i in range(100):
            body = b"again-%d" % i + BODY
            result = await store.put(make_message(body=body))
            assert result.status is PutMessageStatus.PUT_OK, result
            assert result.logic_offset == len(acked)
            acked[result.logic_offset] = body
        await store.reput.do_reput()
        _check_commitlog_allocation(mf)

    async with running_store(config, disk_ratio=lambda _path: 0.5) as store:
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


@pytest.mark.parametrize("which", ["consume queue", "index"])
async def test_dispatch_chunk_on_a_full_disk_blocks_then_catches_up(
    fs: str, which: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills while the commit log still has blocks: dispatch stops at the record whose
    consume-queue (or index) entry needs the next chunk, puts are refused meanwhile
    (SERVICE_NOT_AVAILABLE), and everything is dispatched once space is back."""
    monkeypatch.setattr(mapped_file_module, "ALLOCATE_CHUNK", 16 * 1024)
    monkeypatch.setattr(mapped_file_module, "CQ_ALLOCATE_CHUNK", 16 * 1024)
    root = os.path.join(fs, "store")
    config = small_config(
        root,
        mapped_file_size_commit_log=MIB,
        mapped_file_size_consume_queue=20 * 4000,
        max_hash_slot_num=64,
        max_index_num=4000,
        mapped_file_create_retry_interval=20,
    )
    async with running_store(config, disk_ratio=lambda _path: 0.5) as store:
        assert (await store.put(make_message(keys="k"))).is_ok
        await store.reput.do_reput()
        await wait_until(
            lambda: len(os.listdir(config.store_path_commitlog)) == 2,
            timeout=20,
            interval=0.01,
            what="prealloc",
        )
        # Everything but the file under test gets all its blocks now.
        store.commitlog.queue.files[0].allocate_to(MIB)
        cq = store.consume_queues.find_or_create("TopicTest", 0)
        assert store.index is not None
        index = store.index.files[0]
        if which == "index":
            cq.queue.files[0].allocate_to(cq.file_size)
        else:
            index.mf.allocate_to(index.mf.file_size)
        ballast = os.path.join(fs, "ballast")
        fill_disk(ballast)
        acked = 1
        for i in range(3000):
            result = await store.put(make_message(keys=f"key{i}"))
            if not result.is_ok:
                assert result.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
                assert "not writeable" in result.reason
                break
            acked += 1
            await store.reput.do_reput()
        else:
            pytest.fail("dispatch never blocked")
        assert store.reput.blocked is not None
        assert "no space left" in store.reput.blocked.lower()
        assert store.running
        target = index.mf if which == "index" else cq.queue.files[0]
        assert 0 < target.allocated < target.file_size  # in the middle of the file
        assert store.get_max_offset_in_queue("TopicTest", 0) <= acked

        os.unlink(ballast)
        await wait_until(lambda: caught_up(store), timeout=20, interval=0.01, what="dispatch retry")
        assert store.get_max_offset_in_queue("TopicTest", 0) == acked
        for key in ("k", f"key{acked - 2}"):
            found = store.query_message("TopicTest", key, 10, 0, 1 << 62)
            assert len(found.messages) == 1, key
        assert (await store.put(make_message())).is_ok
        await store.reput.do_reput()
        if which == "index":
            _check_index_allocation(index)
        else:
            _check_allocation(target, target.wrote_position)


def test_a_sparse_file_found_on_load_is_allocated_to_its_data_end(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit-log file left sparse by Java or an older pymq: recovery allocates it up to the
    end of its data and the next chunk, not its whole size."""
    monkeypatch.setattr(mapped_file_module, "ALLOCATE_CHUNK", 64 * 1024)
    directory = tmp_path / "commitlog"
    directory.mkdir()
    path = str(directory / "00000000000000000000")
    with open(path, "wb") as f:
        f.truncate(4 * MIB)
        f.write(b"r" * 200_000)  # "records", followed by a hole
    queue = MappedFileQueue(str(directory), 4 * MIB)
    queue.load()
    try:
        mf = queue.files[0]
        assert mf.allocated == 0
        queue.truncate_dirty_files(200_000)  # what recovery ends with
        assert mf.wrote_position == 200_000
        assert mf.allocated == 256 * 1024
        assert 200_000 <= _on_disk(path) <= 256 * 1024
        assert mf.mm[:200_000] == b"r" * 200_000
    finally:
        queue.close()


async def test_a_fresh_default_store_takes_little_disk(tmp_path: pathlib.Path) -> None:
    """Default sizes (1 GiB commit-log files, the next one made ahead, 6 MB consume-queue files,
    ~420 MB index files): after a few puts the store takes tens of MiB, not gigabytes."""
    root = str(tmp_path / "store")
    async with running_store(MessageStoreConfig(store_path_root_dir=root)) as store:
        for i in range(40):
            msg = make_message(topic=f"T{i % 4}", queue_id=i % 4, keys=f"k{i}")
            assert (await store.put(msg)).is_ok
        await store.reput.do_reput()
        commitlog = store.config.store_path_commitlog
        await wait_until(
            lambda: len(os.listdir(commitlog)) == 2, timeout=20, interval=0.01, what="prealloc"
        )
        assert os.path.getsize(os.path.join(commitlog, os.listdir(commitlog)[0])) == 1 << 30
        total = 0
        for directory, _dirs, files in os.walk(root):
            total += sum(_on_disk(os.path.join(directory, name)) for name in files)
        assert total < 64 * MIB, total
        _check_store_allocation(store)


def test_a_sparse_file_found_on_a_full_disk_still_loads(
    fs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recovery cannot allocate a sparse last file on a full disk: the store still starts (a
    warning), and writes into the file allocate first, refused until space is back."""
    monkeypatch.setattr(mapped_file_module, "ALLOCATE_CHUNK", 64 * 1024)
    directory = os.path.join(fs, "commitlog")
    os.makedirs(directory)
    path = os.path.join(directory, "00000000000000000000")
    with open(path, "wb") as f:
        f.truncate(2 * MIB)
        f.write(b"r" * 100_000)
    ballast = os.path.join(fs, "ballast")
    fill_disk(ballast)
    queue = MappedFileQueue(directory, 2 * MIB)
    queue.load()
    try:
        queue.truncate_dirty_files(100_000)
        mf = queue.files[0]
        assert mf.wrote_position == 100_000
        assert mf.allocated == 0
        with pytest.raises(OSError) as caught:
            mf.append(b"n" * 100_000)
        assert caught.value.errno == errno.ENOSPC
        assert mf.wrote_position == 100_000
        os.unlink(ballast)
        assert mf.append(b"n" * 100_000)
        assert mf.allocated == 256 * 1024
        assert mf.mm[:200_000] == b"r" * 100_000 + b"n" * 100_000
    finally:
        queue.close()


# --- the commit log's chunk ahead and its prefault ---------------------------------------------


@pytest.mark.skipif(c_functions() is None, reason="needs the C extension (PYMQ_PURE_PYTHON=1)")
async def test_the_commitlog_allocates_and_prefaults_a_chunk_ahead(
    fs: str, small_chunks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the writer is in its last allocated chunk, the next one is allocated and its pages
    are faulted in by a worker thread (each chunk once), so the event loop's writes
    find them mapped; the records read back unchanged."""
    populated: list[tuple[int, int]] = []  # of the first file
    real_populate = MappedFile.populate

    def recording(self: MappedFile, start: int, end: int) -> None:
        # The commit log's first file (not the next, made and populated in advance, nor a
        # consume queue's, whose first page is populated as it is made).
        if self.file_from_offset == 0 and os.sep + "commitlog" + os.sep in self.path:
            populated.append((start, end))
        real_populate(self, start, end)

    monkeypatch.setattr(MappedFile, "populate", recording)
    config = small_config(
        os.path.join(fs, "store"), mapped_file_size_commit_log=MIB, warm_maped_file_enable=True
    )
    bodies = [b"%04d" % i + b"b" * 996 for i in range(60)]
    async with running_store(config, disk_ratio=lambda _path: 0.5) as store:
        for body in bodies:
            assert (await store.put(make_message(body=body))).is_ok
            mf = store.commitlog.queue.files[0]
            assert mf.allocated - mf.wrote_position > mf.chunk  # always a whole chunk ahead
        chunk = 8192
        ahead = [(chunk * i, chunk * (i + 1)) for i in range(1, mf.allocated // chunk)]
        assert len(ahead) >= 7
        # Worker threads: they may finish in any order.
        await wait_until(lambda: set(ahead) <= set(populated), timeout=5, what="populate")
        assert sorted(populated) == ahead  # each chunk ahead once, the first one never
        offset = 0
        for body in bodies:
            raw = store.commitlog.get_record(offset)
            assert raw is not None and decode_record(raw).body == body
            offset += len(raw)


def test_populate_changes_no_byte_and_stops_at_close(fs: str) -> None:
    """populate faults pages in without writing them: data already there stays; a closed
    file is left alone; a kernel that refuses MADV_POPULATE_WRITE turns it off for good."""
    mf = MappedFile.create(os.path.join(fs, "d", "00000000000000000000"), MIB)
    try:
        mf.allocate_to(MIB)
        data = os.urandom(100_000)
        mf.mm[5000 : 5000 + len(data)] = data
        mf.populate(0, MIB)
        assert mf.mm[5000 : 5000 + len(data)] == data
        assert mf.mm[:5000] == bytes(5000)
    finally:
        mf.close()
    mf.populate(0, MIB)  # closed: nothing happens, nothing raised


def test_populate_is_switched_off_where_the_kernel_has_no_madv_populate_write(
    fs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def refusing(buf: object, start: int, length: int) -> int:
        calls.append(start)
        return errno.EINVAL

    monkeypatch.setattr(mapped_file_module, "_populate_write", refusing)
    mf = MappedFile.create(os.path.join(fs, "d", "00000000000000000000"), MIB)
    try:
        mf.allocate_to(MIB)
        mf.populate(0, MIB)
        assert calls == [0]  # refused once: the rest of the range is not tried
        assert mapped_file_module._populate_write is None
        mf.populate(0, MIB)
        assert calls == [0]
    finally:
        mf.close()


async def test_a_chunk_ahead_that_does_not_fit_refuses_nothing_early(
    fs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a full disk the chunk ahead is not allocated, and that alone refuses no put: puts
    that fit the blocks already allocated are stored; the first that needs more is refused
    (CREATE_MAPEDFILE_FAILED), as without the chunk ahead."""
    monkeypatch.setattr(mapped_file_module, "ALLOCATE_CHUNK", 64 * 1024)
    config = small_config(
        os.path.join(fs, "store"), mapped_file_size_commit_log=MIB, warm_maped_file_enable=True
    )
    async with running_store(config, disk_ratio=lambda _path: 0.5) as store:
        assert (await store.put(make_message(body=BODY))).is_ok
        mf = store.commitlog.queue.files[0]
        fill_disk(os.path.join(fs, "ballast"))
        allocated = mf.allocated
        stored = 0
        while True:
            result = await store.put(make_message(body=BODY))
            if not result.is_ok:
                break
            stored += 1
        assert result.status is PutMessageStatus.CREATE_MAPEDFILE_FAILED
        assert mf.allocated == allocated  # nothing more could be had
        assert allocated - mf.wrote_position < len(BODY) + 200  # refused only once full
        assert stored > 0


def test_a_slaves_replicated_data_gets_a_chunk_ahead_and_keeps_the_rule(
    fs: str, small_chunks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HA, warmMapedFileEnable: CommitLog.append_data (a slave writing its master's bytes, in
    pieces of any size and across file ends) allocates and prefaults the chunk ahead as puts
    do: each file's blocks exist up to its data and at most two chunks beyond, full files are
    allocated to their end, each chunk ahead is populated once, and the bytes read back as
    written."""
    populated: list[tuple[int, int, int]] = []
    real_populate = MappedFile.populate

    def recording(self: MappedFile, start: int, end: int) -> None:
        populated.append((self.file_from_offset, start, end))
        real_populate(self, start, end)

    monkeypatch.setattr(MappedFile, "populate", recording)
    # No thread: the populate runs at once, so what it was asked for is known when checked.
    monkeypatch.setattr(
        mapped_file_module.trio.lowlevel, "start_thread_soon", lambda fn, deliver: fn()
    )
    monkeypatch.setattr(mapped_file_module, "_populate_write", lambda buf, start, n: 0)
    cl = CommitLog(os.path.join(fs, "commitlog"), 64 * 1024, warm=True)
    try:
        written = bytearray()
        for i, size in enumerate([3000, 5000, 11_000, 700, 30_000, 16_384, 40_000, 9000] * 2):
            data = bytes([i % 251 + 1]) * size
            assert cl.append_data(len(written), data)
            written += data
            for mf in cl.queue.files:
                _check_commitlog_allocation(mf, warm=True)
                if mf.is_full:
                    assert mf.allocated == mf.file_size
        assert len(cl.queue.files) == -(-len(written) // (64 * 1024))
        assert len(populated) == len(set(populated))  # each chunk once
        for mf in cl.queue.files:
            ahead = sorted((s, e) for f, s, e in populated if f == mf.file_from_offset)
            # Whole chunks after the first (which came with the file), none past the blocks;
            # chunks a big piece needed at once were allocated by its write, not ahead.
            chunks = [(s, s + mf.chunk) for s in range(mf.chunk, mf.allocated, mf.chunk)]
            assert ahead and set(ahead) <= set(chunks), (mf, ahead)
        offset = 0
        for mf in cl.queue.files:
            got = mf.read(0, mf.wrote_position)
            assert got == bytes(written[offset : offset + mf.wrote_position])
            offset += mf.wrote_position
        assert offset == len(written)
    finally:
        cl.close()


def test_a_close_waits_for_the_populate_step_under_way_and_ends_the_populate(
    fs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """destroy() (the clean service deleting an old file, shutdown closing it) while a worker
    populates the file: the close waits for the step under way (the map is never unmapped
    under madvise), the populate stops at its next step, and the file goes."""
    entered, release = threading.Event(), threading.Event()
    calls: list[int] = []

    def slow(buf: object, start: int, length: int) -> int:
        calls.append(start)
        entered.set()
        assert release.wait(30)
        return 0

    monkeypatch.setattr(mapped_file_module, "_populate_write", slow)
    mf = MappedFile.create(os.path.join(fs, "d", "00000000000000000000"), MIB)
    mf.allocate_to(MIB)
    worker = threading.Thread(target=mf.populate, args=(0, MIB))
    worker.start()
    try:
        assert entered.wait(30)
        closer = threading.Thread(target=mf.destroy)
        closer.start()
        closer.join(0.2)
        assert closer.is_alive()  # waiting for the step (it cannot end before the release)
        assert os.path.exists(mf.path)
    finally:
        release.set()
        worker.join(30)
    closer.join(30)
    assert not worker.is_alive() and not closer.is_alive()
    assert calls == [0]  # the next step saw the file closed
    assert not os.path.exists(mf.path)


def _written_bytes() -> int:
    """This process's bytes sent to a disk so far (/proc/self/io write_bytes)."""
    with open("/proc/self/io") as f:
        return int(dict(line.split(": ") for line in f.read().splitlines())["write_bytes"])


def test_prefaulting_writes_the_chunk_ahead_to_disk_as_zeros(tmp_path: pathlib.Path) -> None:
    """What warmMapedFileEnable costs, and why it is off by default: a populated chunk holds no
    data yet, but its pages are dirty, so the next fdatasync writes it out as zeros (found by
    the review: each chunk goes to disk twice).  Skipped where this process's disk writes
    cannot be seen (tmpfs, no /proc/self/io) or nothing is prefaulted."""
    if not os.path.exists("/proc/self/io") or mapped_file_module._populate_write is None:
        pytest.skip("no /proc/self/io or no MADV_POPULATE_WRITE here")
    mf = MappedFile.create(str(tmp_path / "commitlog" / "00000000000000000000"), 16 * MIB)
    try:
        mf.allocate_to(8 * MIB)
        before = _written_bytes()  # (counted as pages are dirtied)
        mf.mm[:MIB] = b"d" * MIB  # calibration: data written is seen as written
        mf.sync()
        if _written_bytes() - before < MIB:
            pytest.skip("this filesystem's writes are not counted (tmpfs?)")
        before = _written_bytes()
        mf.populate(4 * MIB, 8 * MIB)
        if mapped_file_module._populate_write is None:
            pytest.skip("the kernel refused MADV_POPULATE_WRITE")
        mf.sync()
        assert _written_bytes() - before >= 4 * MIB
    finally:
        mf.destroy()


async def test_by_default_the_commitlog_writes_only_its_data(tmp_path: pathlib.Path) -> None:
    """Without warmMapedFileEnable nothing is prefaulted: a broker's flushes write its records
    and little else (no chunk of zeros ahead of them)."""
    if not os.path.exists("/proc/self/io"):
        pytest.skip("no /proc/self/io")
    config = small_config(str(tmp_path / "store"), mapped_file_size_commit_log=64 * MIB)
    async with running_store(config, disk_ratio=lambda _path: 0.5) as store:
        assert not store.commitlog.warm
        before = _written_bytes()
        for _ in range(3000):  # 6 MB: past the first 4 MiB chunk
            assert (await store.put(make_message(body=BODY))).is_ok
        await store.flush_commitlog.flush_all()
        written = _written_bytes() - before
        data = store.commitlog.max_offset
        if written < data:
            pytest.skip("this filesystem's writes are not counted (tmpfs?)")
        # The records, the consume queue and index entries and their headers, a page or so of
        # each: far less than the 4 MiB chunk ahead that warmMapedFileEnable would add.
        assert written < data + 2 * MIB, (written, data)
