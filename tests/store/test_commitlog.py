"""Commit-log layout on disk: rolling across files with blank records, limits, batches."""

from __future__ import annotations

import itertools
import os
import struct

from pymq.common.record import BLANK_MAGIC_CODE, MESSAGE_MAGIC_CODE, decode_record, iter_records
from pymq.store import PutMessageStatus
from tests.helpers import wait_until
from tests.store.helpers import SMALL_COMMITLOG, make_message, running_store, small_config


async def test_records_never_span_files(root):
    config = small_config(root)
    bodies = [bytes([i % 251]) * (300 + 37 * (i % 50)) for i in range(400)]
    async with running_store(config) as store:
        offsets = []
        for i, body in enumerate(bodies):
            r = await store.put(make_message(queue_id=i % 3, body=body))
            assert r.status is PutMessageStatus.PUT_OK
            offsets.append((r.wrote_offset, r.wrote_bytes))
    names = sorted(os.listdir(config.store_path_commitlog))
    assert len(names) > 3
    assert all(len(n) == 20 and int(n) % SMALL_COMMITLOG == 0 for n in names)
    assert [int(n) for n in names] == [i * SMALL_COMMITLOG for i in range(len(names))]
    seen = []
    for n in names:
        with open(os.path.join(config.store_path_commitlog, n), "rb") as f:
            data = f.read()
        assert len(data) == SMALL_COMMITLOG
        pos = 0
        while pos + 8 <= len(data):
            total, magic = struct.unpack_from(">iI", data, pos)
            if magic == BLANK_MAGIC_CODE:
                assert total == len(data) - pos  # the blank fills the rest of the file
                assert total >= 8
                break
            if magic != MESSAGE_MAGIC_CODE:
                assert n == names[-1] and total == 0  # only the last file has unused space
                break
            msg = decode_record(data, pos)
            assert msg.commitlog_offset == int(n) + pos
            seen.append(msg.body)
            pos += total
        else:
            raise AssertionError("a file ended without a blank record")
    assert seen == bodies
    # offsets returned by puts point at the records and are contiguous within a file
    for (off, size), nxt in itertools.pairwise(offsets):
        assert nxt[0] == off + size or nxt[0] % SMALL_COMMITLOG == 0


async def test_read_back_and_queue_offsets_after_restart(root):
    config = small_config(root)
    async with running_store(config) as store:
        for i in range(300):
            await store.put(make_message(queue_id=i % 4, body=b"x" * 500))
    async with running_store(config) as store:
        for q in range(4):
            assert store.get_max_offset_in_queue("TopicTest", q) == 75
        r = await store.put(make_message(queue_id=2))
        assert r.logic_offset == 75
        msg = store.look_message_by_offset(r.wrote_offset)
        assert msg is not None and msg.body == b"hello" and msg.queue_offset == 75
        assert msg.store_host == ("192.168.0.1", 10911)
        assert r.msg_id == msg.msg_id


async def test_limits_refuse_and_write_nothing(root):
    config = small_config(root, max_message_size=2000)
    async with running_store(config) as store:
        before = store.max_phy_offset
        r = await store.put(make_message(topic="T" * 128))
        assert r.status is PutMessageStatus.MESSAGE_ILLEGAL and "topic" in r.reason
        r = await store.put(make_message(big="v" * 40000))
        assert r.status is PutMessageStatus.PROPERTIES_SIZE_EXCEEDED
        r = await store.put(make_message(body=b"b" * 2000))
        assert r.status is PutMessageStatus.MESSAGE_ILLEGAL and "maxMessageSize" in r.reason
        r = await store.put(make_message(topic="a\0b"))
        assert r.status is PutMessageStatus.MESSAGE_ILLEGAL and "NUL" in r.reason
        assert store.max_phy_offset == before
        r = await store.put(make_message(topic="T" * 127, body=b"b" * 1000))
        assert r.status is PutMessageStatus.PUT_OK


async def test_batch_put_is_contiguous_and_all_or_nothing(root):
    config = small_config(root)
    async with running_store(config) as store:
        await store.put(make_message(queue_id=1))
        batch = [make_message(queue_id=1, body=b"b%d" % i, keys=f"k{i}") for i in range(5)]
        r = await store.put(batch)
        assert r.status is PutMessageStatus.PUT_OK
        assert r.msg_num == 5 and r.logic_offset == 1
        assert len(r.msg_id.split(",")) == 5
        data = store.get_commitlog_data(r.wrote_offset, r.wrote_bytes)
        msgs = list(iter_records(data))
        assert [m.queue_offset for m in msgs] == [1, 2, 3, 4, 5]
        assert [m.body for m in msgs] == [b"b%d" % i for i in range(5)]
        bad = [make_message(queue_id=1), make_message(queue_id=1, topic="X" * 200)]
        before = store.max_phy_offset
        r = await store.put(bad)
        assert r.status is PutMessageStatus.MESSAGE_ILLEGAL
        assert store.max_phy_offset == before
        mixed = [make_message(queue_id=1), make_message(queue_id=2)]
        assert (await store.put(mixed)).status is PutMessageStatus.MESSAGE_ILLEGAL
        delayed = [make_message(queue_id=1, DELAY="3")]
        assert (await store.put(delayed)).status is PutMessageStatus.MESSAGE_ILLEGAL


async def test_delayed_message_goes_to_schedule_topic(root):
    config = small_config(root)
    async with running_store(config) as store:
        r = await store.put(make_message(topic="Orders", queue_id=3, DELAY="3"))
        assert r.status is PutMessageStatus.PUT_OK
        msg = store.look_message_by_offset(r.wrote_offset)
        assert msg.topic == "SCHEDULE_TOPIC_XXXX" and msg.queue_id == 2
        assert msg.properties["REAL_TOPIC"] == "Orders"
        assert msg.properties["REAL_QID"] == "3"
        await store.reput.do_reput()
        cq = store.consume_queues.find("SCHEDULE_TOPIC_XXXX", 2)
        # the tags code of a delayed message is its due time: store time + 10 s (level 3)
        assert cq.get_entry(0)[2] == msg.store_timestamp + 10_000


async def test_transaction_prepared_not_in_consume_queue(root):
    config = small_config(root)
    async with running_store(config) as store:
        prepared = make_message(queue_id=0)
        prepared.sys_flag = 0x4
        r = await store.put(prepared)
        assert r.status is PutMessageStatus.PUT_OK and r.logic_offset == 0
        r2 = await store.put(make_message(queue_id=0))
        assert r2.logic_offset == 0
        await store.reput.do_reput()
        assert store.get_max_offset_in_queue("TopicTest", 0) == 1
        assert store.get_commitlog_offset_in_queue("TopicTest", 0, 0) == r2.wrote_offset


async def test_ha_copy_between_stores(root, tmp_path):
    master_cfg = small_config(root)
    slave_cfg = small_config(str(tmp_path / "slave"))
    from pymq.store import BrokerRole

    slave_cfg.broker_role = BrokerRole.SLAVE
    async with running_store(master_cfg) as master, running_store(slave_cfg) as slave:
        for i in range(200):
            await master.put(make_message(queue_id=i % 2, body=b"z" * 700))
        assert (await slave.put(make_message())).status is (PutMessageStatus.SERVICE_NOT_AVAILABLE)
        assert not slave.append_to_commitlog(100, b"xx")  # not at the slave's max offset
        offset = 0
        while offset < master.max_phy_offset:
            chunk = master.get_commitlog_data(offset, 5000)  # cuts records mid-way
            assert chunk
            assert slave.append_to_commitlog(offset, chunk)
            offset += len(chunk)
            await slave.reput.do_reput()
        assert slave.max_phy_offset == master.max_phy_offset
        await slave.reput.do_reput()
        assert slave.get_max_offset_in_queue("TopicTest", 1) == 100
        got = slave.get_message("g", "TopicTest", 1, 0, 32)
        assert [decode_record(m).queue_offset for m in got.messages] == list(range(32))


async def test_next_file_is_preallocated_off_the_loop(root):

    config = small_config(root)
    async with running_store(config) as store:
        await store.put(make_message())
        nxt = os.path.join(config.store_path_commitlog, f"{SMALL_COMMITLOG:020d}")
        # Liveness only: the allocator task creates it by itself. The file exists on disk
        # before its worker thread hands the mapping back, so wait for the hand-over.
        await wait_until(lambda: nxt in store.allocator._ready, timeout=10, interval=0.01)
        ready = store.allocator._ready[nxt]
        while len(store.commitlog.queue.files) < 2:
            await store.put(make_message(body=b"f" * 1000))
        assert store.commitlog.queue.files[1] is ready  # taken, not created on the loop
