"""ASYNC_FLUSH's advice for the commit log's pages ahead of the writer follows the writes
(commitlog.ADVICE_SWITCH_BYTES): MADV_RANDOM once batches written with pwrite outweigh records
written through the map, readahead again once those outweigh the batches; the files the queue
makes next take the current advice.  SYNC_FLUSH's is always MADV_RANDOM."""

from __future__ import annotations

import pytest

from pymq.common.batch import BatchItem, encode_batch_body
from pymq.common.native import native_extension
from pymq.store import PutMessageStatus, commitlog
from pymq.store.config import FlushDiskType
from tests.store.helpers import make_message, running_store, small_config

pytestmark = pytest.mark.skipif(
    getattr(native_extension, "encode_batch", None) is None, reason="needs the C extension"
)

BORN = ("10.0.0.9", 40123)
SWITCH = 64 * 1024


@pytest.fixture(autouse=True)
def small_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commitlog, "ADVICE_SWITCH_BYTES", SWITCH)


def batch(store, n: int = 20) -> int:  # type: ignore[no-untyped-def]
    body = encode_batch_body([BatchItem(b"x" * 1000, 0, {}) for _ in range(n)])
    assert len(body) >= commitlog.PWRITE_BATCH_MIN  # written with pwrite
    out = store.put_batch_body_now("T", 0, body, "C", 0, 1, BORN, 0)
    if out is None:  # past the file's end: the general path rolls it
        result = store.put_message_now(make_message(topic="T", body=b"z" * 30_000))
        assert result.status is PutMessageStatus.PUT_OK
        return 0
    assert out[0].status is PutMessageStatus.PUT_OK
    return out[0].wrote_bytes


def single(store) -> int:  # type: ignore[no-untyped-def]
    out = store.put_single_now("T", 0, b"y" * 1000, "", 0, "C", 0, 1, BORN, 0)
    assert out is not None and out[0].status is PutMessageStatus.PUT_OK
    return out[0].wrote_bytes


async def test_the_advice_follows_the_heavier_way_of_writing(tmp_path) -> None:
    config = small_config(str(tmp_path), mapped_file_size_commit_log=1 << 20)
    async with running_store(config) as store:
        cl = store.commitlog
        assert store.put_message_now(make_message(topic="T")).status is PutMessageStatus.PUT_OK
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
        assert store.put_message_now(make_message(topic="T")).status is PutMessageStatus.PUT_OK
        mf = cl.queue.files[-1]
        assert mf.advise
        for _ in range(3 * SWITCH // 1000):
            single(store)
        assert mf.advise and cl.queue.advise_writes
