"""ASYNC_FLUSH's advice for the commit log's pages ahead of the writer, with
commitLogWriteAdvice=follow, follows the writes (commitlog.ADVICE_SWITCH_BYTES): MADV_RANDOM
once batches written with pwrite outweigh records written through the map, readahead again once
those outweigh the batches; the files the queue makes next take the current advice.
SYNC_FLUSH's is always MADV_RANDOM."""

from __future__ import annotations

import pytest

from pymq.common.batch import BatchItem, encode_batch_body
from pymq.store import PutMessageStatus, commitlog
from pymq.store.config import FlushDiskType, WriteAdvice
from pymq.store.results import BatchBody, SingleSend
from tests.store.helpers import make_message, running_store, small_config

BORN = ("10.0.0.9", 40123)
FOLLOW = WriteAdvice.FOLLOW  # as commitLogWriteAdvice=auto on a device reading ahead little
SWITCH = 64 * 1024


@pytest.fixture(autouse=True)
def small_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commitlog, "ADVICE_SWITCH_BYTES", SWITCH)


def batch(store, n: int = 20) -> int:  # type: ignore[no-untyped-def]
    body = encode_batch_body([BatchItem(b"x" * 1000, 0, {}) for _ in range(n)])
    assert len(body) >= commitlog.PWRITE_BATCH_MIN  # written with pwrite
    out = store.put_now(BatchBody("T", 0, body, "C", 0, 1, BORN, 0))
    if out is None:  # past the file's end: the general path rolls it
        result = store.put_now(make_message(topic="T", body=b"z" * 30_000))
        assert result.status is PutMessageStatus.PUT_OK
        return 0
    assert out[0].status is PutMessageStatus.PUT_OK
    return out[0].wrote_bytes


def single(store) -> int:  # type: ignore[no-untyped-def]
    out = store.put_now(SingleSend("T", 0, b"y" * 1000, "", 0, "C", 0, 1, BORN, 0))
    assert out is not None and out[0].status is PutMessageStatus.PUT_OK
    return out[0].wrote_bytes


async def test_the_advice_follows_the_heavier_way_of_writing(tmp_path) -> None:
    config = small_config(
        str(tmp_path), mapped_file_size_commit_log=1 << 20, commit_log_write_advice=FOLLOW
    )
    async with running_store(config) as store:
        cl = store.commitlog
        assert store.put_now(make_message(topic="T")).status is PutMessageStatus.PUT_OK
        mf = cl.queue.files[-1]
        assert not mf.advise and not cl.queue.advise_writes
        written = 0
        while written < SWITCH - 30_000:  # batches, not yet past the switch
            written += batch(store)
        assert not mf.advise
        written += batch(store) + batch(store)
        assert mf.advise and cl.queue.advise_writes
        # Singles written through the map: the batches' lead is at most SWITCH, so the advice
        # changes back after 2 * SWITCH of them, not before SWITCH.
        mapped = 0
        while mapped < SWITCH:
            mapped += single(store)
        assert mf.advise
        while mf.advise:
            mapped += single(store)
            assert mapped <= 2 * SWITCH + 2048
        assert not cl.queue.advise_writes
        # The next file is made with the current advice: batches again, past the commit log's
        # first file.
        first = mf
        while cl.queue.files[-1] is first or not cl.queue.files[-1].advise:
            batch(store)
        assert cl.queue.advise_writes and len(cl.queue.files) >= 2


async def test_sync_flush_keeps_its_advice_whatever_the_writes(tmp_path) -> None:
    config = small_config(
        str(tmp_path), mapped_file_size_commit_log=1 << 20, flush_disk_type=FlushDiskType.SYNC_FLUSH
    )
    async with running_store(config) as store:
        cl = store.commitlog
        assert store.put_now(make_message(topic="T")).status is PutMessageStatus.PUT_OK
        mf = cl.queue.files[-1]
        assert mf.advise
        for _ in range(3 * SWITCH // 1000):
            single(store)
        assert mf.advise and cl.queue.advise_writes


def small_batch(store, n: int = 5) -> int:  # type: ignore[no-untyped-def]
    body = encode_batch_body([BatchItem(b"s" * 1000, 0, {}) for _ in range(n)])
    assert len(body) < commitlog.PWRITE_BATCH_MIN  # written through the map
    out = store.put_now(BatchBody("T", 0, body, "C", 0, 1, BORN, 0))
    assert out is not None and out[0].status is PutMessageStatus.PUT_OK
    return out[0].wrote_bytes


def general(store) -> int:  # type: ignore[no-untyped-def]
    result = store.put_now(make_message(topic="T", body=b"g" * 1000))
    assert result.status is PutMessageStatus.PUT_OK
    return result.wrote_bytes


async def _advised_by_batches(store) -> None:  # type: ignore[no-untyped-def]
    cl = store.commitlog
    assert store.put_now(make_message(topic="T")).status is PutMessageStatus.PUT_OK
    written = 0
    while written <= SWITCH:
        written += batch(store)
    assert cl.queue.files[-1].advise and cl.queue.advise_writes


@pytest.mark.parametrize("write", [small_batch, general], ids=["small-batches", "general-path"])
async def test_every_write_through_the_map_weighs_against_the_advice(tmp_path, write) -> None:  # type: ignore[no-untyped-def]
    """Small batches (append_run through the map) and the general path (append_stored)
    write through the map too: as many of their bytes as of single sends end the advice."""
    config = small_config(
        str(tmp_path), mapped_file_size_commit_log=1 << 20, commit_log_write_advice=FOLLOW
    )
    async with running_store(config) as store:
        await _advised_by_batches(store)
        cl = store.commitlog
        mf = cl.queue.files[-1]
        mapped = 0
        while mf.advise and mapped <= 2 * SWITCH + 8192:
            mapped += write(store)
        assert cl.queue.files[-1] is mf
        assert not mf.advise and not cl.queue.advise_writes


async def test_the_file_the_roll_makes_is_advised_before_any_write(tmp_path) -> None:
    """The queue makes the next file with the current advice (MappedFileQueue._new_file), not
    the next batch's _weigh_advice."""
    config = small_config(
        str(tmp_path), mapped_file_size_commit_log=1 << 20, commit_log_write_advice=FOLLOW
    )
    async with running_store(config) as store:
        await _advised_by_batches(store)
        cl = store.commitlog
        first = cl.queue.files[-1]
        while cl.queue.files[-1] is first:
            general(store)  # the general path, which never weighs
            if cl.queue.files[-1] is first:
                batch(store)
        assert cl.queue.files[-1].advise
