"""NUL characters in a message's properties: data, stored and served as Java's broker does,
except where recovery would take them for a torn write (see ``record.nul_where_torn``).

The C++ client (rocketmq 0.4.4) sometimes sends a UNIQ_KEY with a NUL in it; Java's broker
stores such a send.  pymq never writes a NUL at the properties' first or last byte, or at a
512-byte sector boundary of the commit-log file, which a lost write would leave too: it writes
the properties in another order, and refuses the message only when no order avoids it.  Each
test runs with the C record encoder (where built) and its Python twin.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator

import pytest

from pymq.broker.schedule import ScheduleMessageService
from pymq.common.message_ext import encode_properties
from pymq.common.record import TEAR_ALIGN, decode_record, record_length
from pymq.store import (
    DefaultMessageStore,
    GetMessageStatus,
    MessageStoreConfig,
    PutMessageStatus,
)
from pymq.store import commitlog as commitlog_module
from tests.store.helpers import make_message, running_store, small_config
from tests.store.test_append_paths import ENCODERS
from tests.store.test_recovery import commitlog_file, set_abort


@pytest.fixture(autouse=True, params=ENCODERS)
def encoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's one record encoder, which writes the order the commit log picks: the C
    function (where built), then its twin."""
    monkeypatch.setattr(commitlog_module, "encode_run", request.param)


TOPIC = "TopicTest"
KEY = "0100007F0000F8D700005B8EA6 \0" + "4C00"  # as the C++ client sent one


@contextlib.asynccontextmanager
async def reopened(
    config: MessageStoreConfig, end: int, *, abnormal: bool = True
) -> AsyncIterator[DefaultMessageStore]:
    """The store started again (after a crash unless told otherwise) over what a store that
    stopped at ``end`` wrote: its recovery must keep every byte of it."""
    set_abort(config, abnormal)
    async with running_store(config) as store:
        assert store.max_phy_offset == end
        yield store


def _props_start(store, msg) -> int:
    """The file offset the properties of ``msg`` would start at if it were put now."""
    files = store.commitlog.queue.files
    pos = files[-1].wrote_position if files else 0
    props = encode_properties(msg.properties).encode()
    return pos + record_length(0, len(msg.body), len(msg.topic.encode()), len(props)) - len(props)


def _nul_at_sector(store, body_len: int = 10, tags: str | None = "TagA") -> tuple:
    """A message whose properties' only NUL lands on a sector boundary if put now."""
    probe = make_message(body=b"b" * body_len, tags=tags, UNIQ_KEY="x" * 700)
    start = _props_start(store, probe)
    boundary = start + (-start % TEAR_ALIGN)
    if boundary == start:  # the first byte: another rule; move the boundary inside
        boundary += TEAR_ALIGN
    value_at = start + encode_properties(probe.properties).encode().index(b"UNIQ_KEY\x01") + 9
    value = list("x" * 700)
    value[boundary - value_at] = "\0"
    msg = make_message(body=b"b" * body_len, tags=tags, UNIQ_KEY="".join(value))
    assert start + encode_properties(msg.properties).encode().index(0) == boundary
    return msg, boundary


@pytest.mark.parametrize("abnormal", [False, True])
async def test_a_nul_inside_a_message_id_is_stored_served_and_recovered(tmp_path, abnormal):
    config = small_config(str(tmp_path))
    async with running_store(config) as store:
        r = await store.put(make_message(UNIQ_KEY=KEY))
        assert r.status is PutMessageStatus.PUT_OK, r.reason
        r2 = await store.put(make_message(body=b"after"))
        assert r2.status is PutMessageStatus.PUT_OK
        await store.reput.do_reput()
        got = store.get_message("g", TOPIC, 0, 0, 8)
        assert got.status is GetMessageStatus.FOUND and len(got.messages) == 2
        assert decode_record(got.messages[0]).properties["UNIQ_KEY"] == KEY
        end = store.max_phy_offset
    async with reopened(config, end, abnormal=abnormal) as store:  # the NUL is data: kept
        msg = store.look_message_by_offset(r.wrote_offset)
        assert msg is not None and msg.properties["UNIQ_KEY"] == KEY
        got = store.get_message("g", TOPIC, 0, 0, 8)
        assert [decode_record(m).body for m in got.messages] == [b"hello", b"after"]


async def test_a_nul_on_a_sector_boundary_is_stored_in_another_order(tmp_path):
    """Properties are a map: when a NUL would land on a sector boundary, the store writes them
    in another order rather than refuse the message (whose NUL is data)."""
    config = small_config(str(tmp_path))
    async with running_store(config) as store:
        await store.put(make_message())  # queue offset 0
        msg, _boundary = _nul_at_sector(store)
        r = await store.put(msg)
        assert r.status is PutMessageStatus.PUT_OK and r.logic_offset == 1, r.reason
        stored = store.look_message_by_offset(r.wrote_offset)
        assert stored is not None and stored.properties == msg.properties
        # The same in a batch: each record's properties in an order safe where it lands.
        batch, _ = _nul_at_sector(store)
        r = await store.put([batch, make_message(body=b"b" * 10)])
        assert r.status is PutMessageStatus.PUT_OK and r.msg_num == 2, r.reason
        stored = store.look_message_by_offset(r.wrote_offset)
        assert stored is not None and stored.properties == batch.properties
        end = store.max_phy_offset
    async with reopened(config, end) as store:
        assert store.get_max_offset_in_queue(TOPIC, 0) == 4


async def test_a_nul_on_a_sector_boundary_no_order_avoids_is_refused(tmp_path):
    config = small_config(str(tmp_path))
    async with running_store(config) as store:
        await store.put(make_message())
        msg, boundary = _nul_at_sector(store, tags=None)  # one property: no other order
        before = store.max_phy_offset
        r = await store.put(msg)
        assert r.status is PutMessageStatus.MESSAGE_ILLEGAL
        assert f"file offset {boundary}" in r.reason and "torn write" in r.reason
        assert store.max_phy_offset == before
        r = await store.put([msg, make_message(body=b"b" * 10)])
        assert r.status is PutMessageStatus.MESSAGE_ILLEGAL and "torn write" in r.reason
        assert store.max_phy_offset == before
        # One byte further along, the same NUL is data.
        msg.body += b"b"
        r = await store.put(msg)
        assert r.status is PutMessageStatus.PUT_OK and r.logic_offset == 1, r.reason
        end = store.max_phy_offset
    async with reopened(config, end) as store:
        assert store.look_message_by_offset(r.wrote_offset) is not None


@pytest.mark.parametrize("value", ["\0K", "abc\0"])
async def test_properties_beginning_or_ending_with_nul_are_stored_in_another_order(tmp_path, value):
    config = small_config(str(tmp_path))
    async with running_store(config) as store:
        msg = make_message()  # TAGS, which can go first or last
        if value[0] == "\0":  # a name beginning with NUL, first
            msg.properties = {value: "v", **msg.properties}
        else:  # a value ending with NUL, last
            msg.properties = {**msg.properties, "K": value}
        r = await store.put(msg)
        assert r.status is PutMessageStatus.PUT_OK, r.reason
        end = store.max_phy_offset
    async with reopened(config, end) as store:
        stored = store.look_message_by_offset(r.wrote_offset)
        assert stored is not None and stored.properties == msg.properties


@pytest.mark.parametrize("value", ["\0K", "abc\0"])
async def test_properties_that_must_begin_or_end_with_nul_are_refused(tmp_path, value):
    config = small_config(str(tmp_path))
    async with running_store(config) as store:
        msg = make_message(tags=None)
        msg.properties = {"K": value} if value[0] != "\0" else {value: "v"}
        r = await store.put(msg)
        assert r.status is PutMessageStatus.MESSAGE_ILLEGAL
        assert "begin or end with a NUL" in r.reason
        assert store.max_phy_offset == 0


async def test_a_delayed_message_is_delivered_whatever_its_properties_order(tmp_path):
    """The schedule service re-puts a delayed message without its DELAY property: when DELAY
    was first and the next name begins with a NUL, that put must not be refused (the level's
    delivery would retry it for ever, holding back every later message of the level)."""
    config = small_config(str(tmp_path))
    async with running_store(config) as store:
        msg = make_message(tags=None)
        msg.properties = {"DELAY": "1", "\0n": "v", "K": "w"}
        r = await store.put(msg)
        assert r.status is PutMessageStatus.PUT_OK, r.reason
        delayed = store.look_message_by_offset(r.wrote_offset)
        assert delayed is not None
        real = ScheduleMessageService._real_message(delayed)
        r = await store.put(real)
        assert r.status is PutMessageStatus.PUT_OK, r.reason
        end = store.max_phy_offset
    async with reopened(config, end) as store:
        stored = store.look_message_by_offset(r.wrote_offset)
        assert stored is not None and stored.properties["\0n"] == "v"
        assert stored.topic == TOPIC


async def test_a_torn_tail_inside_properties_holding_a_nul_is_still_truncated(tmp_path):
    """A record with a data NUL, then a lost sector in the next record's properties: recovery
    keeps the first and truncates at the second."""
    config = small_config(str(tmp_path))
    async with running_store(config) as store:
        first = await store.put(make_message(UNIQ_KEY=KEY))
        second = await store.put(make_message(UNIQ_KEY="y" * 1500))
        assert first.status is second.status is PutMessageStatus.PUT_OK
    start = second.wrote_offset
    stop = start + second.wrote_bytes
    lost = stop - 700  # inside the long value
    lost += -lost % TEAR_ALIGN
    assert start < lost < stop
    with open(commitlog_file(config, lost), "r+b") as f:
        f.seek(lost)
        f.write(bytes(stop - lost))
    set_abort(config, True)
    async with running_store(config) as store:
        assert store.max_phy_offset == start
        msg = store.look_message_by_offset(first.wrote_offset)
        assert msg is not None and msg.properties["UNIQ_KEY"] == KEY
    assert os.path.getsize(commitlog_file(config, 0)) == config.mapped_file_size_commit_log
