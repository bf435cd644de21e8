"""Recovery: torn tails, garbage, flipped CRCs, lost consume queues, abort and lock files."""

from __future__ import annotations

import os
import random
import shutil

import pytest

from pymq.common.record import decode_record
from pymq.store import DefaultMessageStore, GetMessageStatus
from pymq.store.checkpoint import StoreLockedError
from tests.store.helpers import make_message, running_store, small_config

TOPIC = "TopicTest"


async def fill(config, count, body_size=20, queues=1):
    """Put ``count`` messages, stop cleanly; return [(offset, size, body)]."""
    out = []
    async with running_store(config) as store:
        for i in range(count):
            body = bytes([65 + i % 26]) * body_size + b"%d" % i
            r = await store.put(make_message(queue_id=i % queues, body=body))
            out.append((r.wrote_offset, r.wrote_bytes, body))
    return out


def commitlog_file(config, offset):
    size = config.mapped_file_size_commit_log
    return os.path.join(config.store_path_commitlog, f"{offset - offset % size:020d}")


def patch(config, offset, data: bytes):
    path = commitlog_file(config, offset)
    with open(path, "r+b") as f:
        f.seek(offset % config.mapped_file_size_commit_log)
        f.write(data)


def served(store, queues=1):
    """Every record the consume queues serve, checked: CRC, queue offset, position."""
    out = []
    for q in range(queues):
        offset = store.get_min_offset_in_queue(TOPIC, q)
        while True:
            r = store.get_message("g", TOPIC, q, offset, 32)
            if r.status is not GetMessageStatus.FOUND:
                assert r.status in (
                    GetMessageStatus.OFFSET_OVERFLOW_ONE,
                    GetMessageStatus.NO_MESSAGE_IN_QUEUE,
                )
                break
            for raw, qoff in zip(r.messages, r.queue_offsets, strict=True):
                msg = decode_record(raw, check_crc=True)
                assert msg.queue_offset == qoff and msg.queue_id == q
                out.append((msg.commitlog_offset, msg.store_size, msg.body))
            offset = r.next_begin_offset
    return sorted(out)


def set_abort(config, abnormal: bool):
    if abnormal:
        open(config.abort_path, "wb").close()
    elif os.path.exists(config.abort_path):
        os.unlink(config.abort_path)


async def test_truncation_at_every_byte_of_last_record(tmp_path):
    template = small_config(str(tmp_path / "template"))
    records = await fill(template, 6)
    last_off, last_size, _ = records[-1]
    for cut in range(last_size + 1):
        root = str(tmp_path / f"cut{cut}")
        shutil.copytree(template.store_path_root_dir, root)
        config = small_config(root)
        patch(config, last_off + cut, bytes(last_size - cut))
        set_abort(config, abnormal=cut % 2 == 1)
        async with running_store(config) as store:
            expected = records if cut == last_size else records[:-1]
            assert store.max_phy_offset == expected[-1][0] + expected[-1][1]
            assert store.get_max_offset_in_queue(TOPIC, 0) == len(expected)
            assert served(store) == expected
            r = await store.put(make_message(body=b"new"))
            assert r.wrote_offset == store.max_phy_offset - r.wrote_bytes
            assert r.logic_offset == len(expected)
        shutil.rmtree(root)


@pytest.mark.parametrize("abnormal", [False, True])
async def test_garbage_after_last_record(tmp_path, abnormal):
    config = small_config(str(tmp_path / "s"))
    records = await fill(config, 8)
    end = records[-1][0] + records[-1][1]
    rnd = random.Random(7)
    patch(config, end, bytes(rnd.getrandbits(8) for _ in range(500)))
    set_abort(config, abnormal)
    async with running_store(config) as store:
        assert store.max_phy_offset == end
        assert served(store) == records
        r = await store.put(make_message(body=b"after-garbage"))
        records.append((r.wrote_offset, r.wrote_bytes, b"after-garbage"))
    set_abort(config, True)
    async with running_store(config) as store:
        assert served(store) == records
        assert store.max_phy_offset == records[-1][0] + records[-1][1]


@pytest.mark.parametrize("abnormal", [False, True])
@pytest.mark.parametrize("victim", [-1, 3])
async def test_flipped_crc_ends_recovery_before_the_bad_record(tmp_path, abnormal, victim):
    config = small_config(str(tmp_path / "s"))
    records = await fill(config, 8)
    off, size, body = records[victim]
    # flip one bit of the body's last byte (the body ends before topic + properties)
    with open(commitlog_file(config, off), "rb") as f:
        f.seek(off % config.mapped_file_size_commit_log)
        raw = f.read(size)
    body_at = raw.index(body)
    patch(config, off + body_at + len(body) - 1, bytes([body[-1] ^ 0x10]))
    set_abort(config, abnormal)
    async with running_store(config) as store:
        assert store.max_phy_offset == off
        kept = records[: records.index((off, size, body))]
        assert served(store) == kept
        assert store.look_message_by_offset(off) is None


async def test_corruption_in_an_older_file_drops_later_files(tmp_path):
    config = small_config(str(tmp_path / "s"))
    records = await fill(config, 300, body_size=600, queues=2)
    files = sorted(os.listdir(config.store_path_commitlog))
    assert len(files) >= 4
    victim_file = int(files[-2])
    victim = next(r for r in records if r[0] > victim_file + 1000)
    patch(config, victim[0] + 2, b"\x00\x00")  # TOTALSIZE no longer matches
    async with running_store(config) as store:
        assert store.max_phy_offset == victim[0]
        assert served(store, queues=2) == [r for r in records if r[0] < victim[0]]
    assert sorted(os.listdir(config.store_path_commitlog)) == files[:-1]


async def test_abnormal_recovery_rebuilds_lost_consume_queues_and_index(tmp_path):
    config = small_config(str(tmp_path / "s"))
    records = await fill(config, 200, body_size=500, queues=3)
    shutil.rmtree(config.consume_queue_dir)
    os.unlink(config.checkpoint_path)
    set_abort(config, True)
    async with running_store(config) as store:
        assert not store.last_exit_ok
        assert served(store, queues=3) == records
        for q in range(3):
            assert store.get_max_offset_in_queue(TOPIC, q) == len(records[q::3])


async def test_consume_queue_beyond_commitlog_is_truncated(tmp_path):
    config = small_config(str(tmp_path / "s"))
    records = await fill(config, 10)
    # The commit log loses its last three records; the consume queue still points at them.
    cut = records[7][0]
    patch(config, cut, bytes(sum(r[1] for r in records[7:])))
    async with running_store(config) as store:
        assert store.get_max_offset_in_queue(TOPIC, 0) == 7
        assert served(store) == records[:7]
        r = await store.put(make_message(body=b"x"))
        assert r.logic_offset == 7 and r.wrote_offset == cut


async def test_abort_file_lifecycle(tmp_path):
    config = small_config(str(tmp_path / "s"))
    async with running_store(config) as store:
        assert os.path.exists(config.abort_path)
        assert store.last_exit_ok
        await store.put(make_message())
    assert not os.path.exists(config.abort_path)
    async with running_store(config) as store:
        assert store.last_exit_ok
    set_abort(config, True)
    async with running_store(config) as store:
        assert not store.last_exit_ok
        assert store.get_max_offset_in_queue(TOPIC, 0) == 1


async def test_lock_refuses_a_second_store(tmp_path):
    config = small_config(str(tmp_path / "s"))
    async with running_store(config):
        second = DefaultMessageStore(small_config(config.store_path_root_dir))
        with pytest.raises(StoreLockedError, match="already started"):
            await second.run()
    async with running_store(config) as store:  # released on shutdown
        assert store.running


async def test_wrong_file_size_refuses_to_load(tmp_path):
    config = small_config(str(tmp_path / "s"))
    await fill(config, 3)
    other = small_config(config.store_path_root_dir, mapped_file_size_commit_log=128 * 1024)
    with pytest.raises(Exception, match="file size"):
        await DefaultMessageStore(other).run()
    async with running_store(config) as store:  # the failed start released the lock
        assert store.get_max_offset_in_queue(TOPIC, 0) == 3


async def test_interrupted_file_creation_does_not_block_the_start(tmp_path):
    config = small_config(str(tmp_path / "s"))
    records = await fill(config, 5)
    # A crash between creating and sizing a file (older layout) or during our own creation.
    open(os.path.join(config.store_path_commitlog, f"{65536 * 3:020d}"), "wb").close()
    leftover = os.path.join(config.store_path_commitlog, f".{65536:020d}.creating")
    open(leftover, "wb").close()
    set_abort(config, True)
    async with running_store(config) as store:
        assert served(store) == records
        assert not os.path.exists(leftover)
        assert [os.path.basename(mf.path) for mf in store.commitlog.queue.files] == [f"{0:020d}"]


async def test_consume_queue_behind_commitlog_is_redispatched_on_normal_start(tmp_path):
    config = small_config(str(tmp_path / "s"))
    records = await fill(config, 12)
    cq_file = os.path.join(config.consume_queue_dir, TOPIC, "0", f"{0:020d}")
    with open(cq_file, "r+b") as f:  # lose the last five entries
        f.seek(7 * 20)
        f.write(bytes(5 * 20))
    assert not os.path.exists(config.abort_path)
    async with running_store(config) as store:
        assert store.last_exit_ok
        assert store.get_max_offset_in_queue(TOPIC, 0) == 12
        assert served(store) == records


async def test_ipv6_hosts_through_the_store(tmp_path):
    config = small_config(str(tmp_path / "s"))
    async with running_store(config) as store:
        store.store_host = ("fe80::1", 10911)
        msg = make_message()
        msg.born_host = ("2001:db8::7", 4242)
        r = await store.put(msg)
        await store.put(make_message())  # IPv4 born host, IPv6 store host
        await store.reput.do_reput()
        got = store.look_message_by_offset(r.wrote_offset)
        assert got.born_host == ("2001:db8::7", 4242)
        assert got.store_host == ("fe80::1", 10911)
        assert len(r.msg_id) == 56
    set_abort(config, True)
    async with running_store(config) as store:
        assert store.get_max_offset_in_queue(TOPIC, 0) == 2
        assert len(served(store)) == 2


@pytest.mark.parametrize("damage", ["offset", "size", "huge", "zero"])
async def test_a_damaged_consume_queue_entry_is_skipped_not_served(tmp_path, damage):
    """An entry that does not point at a record of its size (a flipped bit, a file changed
    behind the broker) is skipped as a filtered one is: the pulls serve the others, in order,
    and never hand consumers bytes that are no record."""
    import struct

    config = small_config(str(tmp_path))
    sent = await fill(config, 6)
    cq_file = os.path.join(config.store_path_root_dir, "consumequeue", TOPIC, "0", f"{0:020d}")
    with open(cq_file, "r+b") as f:
        f.seek(2 * 20)
        phy, size, code = struct.unpack(">qiq", f.read(20))
        phy, size = {
            "offset": (phy + 7, size),
            "size": (phy, size + 1),
            "huge": (phy, 2**31 - 1),
            "zero": (phy, 1),
        }[damage]
        f.seek(2 * 20)
        f.write(struct.pack(">qiq", phy, size, code))
    async with running_store(config) as store:
        bodies, offsets, offset = [], [], 0
        while offset < 6:  # pull as a consumer does (a huge size ends one batch early)
            got = store.get_message("g", TOPIC, 0, offset, 32)
            assert got.status in (GetMessageStatus.FOUND, GetMessageStatus.NO_MATCHED_MESSAGE)
            bodies += [decode_record(raw, check_crc=True).body for raw in got.messages]
            offsets += got.queue_offsets
            assert got.next_begin_offset > offset
            offset = got.next_begin_offset
        assert bodies == [body for i, (_, _, body) in enumerate(sent) if i != 2]
        assert offsets == [0, 1, 3, 4, 5]


def test_record_is_agrees_with_its_python_twin():
    import struct

    from tests.helpers import c_functions

    native_extension = c_functions()
    from pymq.store.get_message import _record_is_py, record_is

    good = struct.pack(">iI", 12, 0xDAA320A7) + b"abcd"
    cases = [
        (good, 12), (good, 13), (good[:8], 8), (b"", 0), (good[:7], 7),
        (struct.pack(">iI", -1, 0xDAA320A7), 8), (struct.pack(">iI", 8, 0xCBD43194), 8),
        (struct.pack(">iI", 8, 0xDAA320A7), 8), (good, -5),
    ]  # fmt: skip
    expected = [True, False, False, False, False, False, False, True, False]
    assert [_record_is_py(d, n) for d, n in cases] == expected
    if native_extension is not None:
        assert record_is is native_extension.record_is
        assert [record_is(d, n) for d, n in cases] == expected
