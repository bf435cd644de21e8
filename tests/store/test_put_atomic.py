"""A put the store refuses changes nothing: a field outside its Java type (or anything else the
encoder cannot write) is answered with a status, the queue offset table, the write position,
the counters and the dispatch hints stay as they were, and the next good message takes the
next offset and sits in that slot, also after a reopen.  With the C encoder and its Python
twin."""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import pytest

from pymq.common.message_ext import MessageExt
from pymq.common.record import decode_record
from pymq.store import DefaultMessageStore
from pymq.store import commitlog as commitlog_module
from pymq.store.results import GetMessageStatus, PutMessageStatus
from tests.store.helpers import make_message, running_store, small_config

I32 = 1 << 31
I64 = 1 << 63
BAD_FIELDS = [
    ("flag", I32),
    ("flag", -I32 - 1),
    ("sys_flag", I32),
    ("queue_id", I32),
    ("born_timestamp", I64),
    ("born_timestamp", -I64 - 1),
    ("reconsume_times", I32),
    ("prepared_transaction_offset", I64),
    ("born_host", ("10.0.0.9", 1 << 40)),
    ("born_host", ("not an address", 1)),
]
ENCODERS = ["c", "python"]


@pytest.fixture(params=ENCODERS)
def encoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "c":
        # Imported directly: PYMQ_PURE_PYTHON=1 turns the extension off for the store, not here.
        commitlogc = importlib.import_module("pymq.store._commitlogc")
        monkeypatch.setattr(commitlog_module, "encode_run", commitlogc.encode_run)
    else:
        monkeypatch.setattr(commitlog_module, "encode_run", commitlog_module.encode_run_py)
    yield request.param


def _bad(field: str, value: object) -> MessageExt:
    msg = make_message(body=b"bad")
    setattr(msg, field, value)
    return msg


def _state(store: DefaultMessageStore) -> tuple:
    cl = store.commitlog
    return (
        dict(cl.topic_queue_table),
        cl.max_offset,
        [(mf.path, mf.wrote_position) for mf in cl.queue.files],
        len(cl.dispatch_hints),
        store.put_message_times_total,
        store.put_message_size_total,
    )


async def _bodies(store: DefaultMessageStore, n: int) -> list[tuple[int, bytes]]:
    await store.reput.do_reput()
    got = store.get_message("G", "TopicTest", 0, 0, n + 5)
    assert got.status is GetMessageStatus.FOUND
    return [(m.queue_offset, m.body) for m in map(decode_record, got.messages)]


@pytest.mark.parametrize(("field", "value"), BAD_FIELDS)
@pytest.mark.parametrize("at_file_end", [False, True], ids=["mid-file", "file-roll"])
async def test_a_refused_put_changes_nothing(
    root: str, encoder: str, field: str, value: object, at_file_end: bool
) -> None:
    config = small_config(root)
    async with running_store(config) as store:
        for i in range(3):
            assert (await store.put(make_message(body=b"m%d" % i))).is_ok
        if at_file_end:  # fill the first file so that the bad put would have to roll
            mf = store.commitlog.queue.files[-1]
            filler = b"f" * 1000
            while mf.remaining > 1200:
                assert (await store.put(make_message(topic="Filler", body=filler))).is_ok
        before = _state(store)
        result = await store.put(_bad(field, value))
        assert result.status is PutMessageStatus.MESSAGE_ILLEGAL
        assert result.reason
        assert _state(store) == before
        good = await store.put(make_message(body=b"next"))
        assert good.is_ok
        assert good.logic_offset == 3
        bodies = await _bodies(store, 4)
        assert bodies == [(0, b"m0"), (1, b"m1"), (2, b"m2"), (3, b"next")]
        assert store.get_max_offset_in_queue("TopicTest", 0) == 4
    async with running_store(config) as store:
        assert store.get_max_offset_in_queue("TopicTest", 0) == 4
        assert await _bodies(store, 4) == [(0, b"m0"), (1, b"m1"), (2, b"m2"), (3, b"next")]
        after = await store.put(make_message(body=b"after reopen"))
        assert after.logic_offset == 4


@pytest.mark.parametrize(("field", "value"), BAD_FIELDS)
async def test_a_batch_with_one_bad_message_is_refused_whole(
    root: str, encoder: str, field: str, value: object
) -> None:
    config = small_config(root)
    async with running_store(config) as store:
        assert (await store.put(make_message(body=b"m0"))).is_ok
        before = _state(store)
        batch = [make_message(body=b"b1"), make_message(body=b"b2"), _bad(field, value)]
        result = await store.put(batch)
        assert result.status is PutMessageStatus.MESSAGE_ILLEGAL
        assert result.reason
        assert _state(store) == before
        ok = await store.put([make_message(body=b"g1"), make_message(body=b"g2")])
        assert ok.is_ok
        assert ok.logic_offset == 1
        assert await _bodies(store, 3) == [(0, b"m0"), (1, b"g1"), (2, b"g2")]
    async with running_store(config) as store:
        assert store.get_max_offset_in_queue("TopicTest", 0) == 3
        assert await _bodies(store, 3) == [(0, b"m0"), (1, b"g1"), (2, b"g2")]


async def test_an_encoder_that_fails_for_any_reason_changes_nothing(
    root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever the encoder raises (here: a bug of its own), the put is answered and the
    store is as before."""
    config = small_config(root)
    async with running_store(config) as store:
        assert (await store.put(make_message(body=b"m0"))).is_ok
        real = commitlog_module.encode_run

        def broken(*args: object) -> int:
            raise RuntimeError("encoder bug")

        monkeypatch.setattr(commitlog_module, "encode_run", broken)
        before = _state(store)
        result = await store.put(make_message(body=b"x"))
        assert result.status is PutMessageStatus.UNKNOWN_ERROR
        assert "encoder bug" in result.reason
        batch = await store.put([make_message(body=b"y")])
        assert batch.status is PutMessageStatus.UNKNOWN_ERROR
        assert _state(store) == before
        monkeypatch.setattr(commitlog_module, "encode_run", real)
        assert (await store.put(make_message(body=b"m1"))).logic_offset == 1
        assert await _bodies(store, 2) == [(0, b"m0"), (1, b"m1")]
