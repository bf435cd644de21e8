"""The store in DLedger mode (pymq.store.dledger_commitlog) with a group of one member, which
elects itself and commits alone: records are DLedger entry bodies whose physical offsets are
entry positions + 48 (Java's DLedgerCommitLog), consume queues point there, a restart keeps
everything, a store that is not to take writes refuses them, and a plain commit log with data
is carried over (read below the divided offset, the DLedger log after it)."""

from __future__ import annotations

import copy
import datetime
import itertools
import os
import struct

import attrs

from pymq.common.record import decode_record
from pymq.dledger.config import from_store_config
from pymq.dledger.store import BODY_OFFSET
from pymq.store import GetMessageStatus, PutMessageStatus, dledger_commitlog
from pymq.store.config import BrokerRole
from pymq.store.message_store import DefaultMessageStore
from tests.helpers import free_port, wait_until
from tests.store.helpers import make_message, running_store, small_config

FAST = {
    "heart_beat_time_interval_ms": 100,
    "min_vote_interval_ms": 10,
    "max_vote_interval_ms": 30,
    "mapped_file_size_for_entry_data": 64 * 1024,
}


def dledger_config(root: str, port: int, **more: object) -> object:
    return small_config(
        root,
        enable_d_leger_commit_log=True,
        d_leger_group="g",
        d_leger_peers=f"n0-127.0.0.1:{port}",
        d_leger_self_id="n0",
        **more,
    )


def kwargs(config: object) -> dict[str, object]:
    return {"dledger_config": attrs.evolve(from_store_config(config), **FAST)}  # type: ignore[arg-type]


async def leading(store: DefaultMessageStore) -> None:
    """Wait until the member leads, then let the store take writes (the broker's role
    change does this once its log is committed and dispatched)."""
    assert store.dledger is not None
    server = store.dledger.server
    await wait_until(
        lambda: server.node is not None and server.node.role.value == "LEADER",
        timeout=10,
        what="the member leads",
    )
    store.config.broker_role = BrokerRole.SYNC_MASTER
    store.read_only = False


async def test_records_are_entry_bodies_at_entry_positions_plus_48(tmp_path) -> None:
    config = dledger_config(str(tmp_path), free_port())
    async with running_store(config, **kwargs(config)) as store:  # type: ignore[arg-type]
        await leading(store)
        results = [await store.put(make_message(body=b"m%d" % i)) for i in range(20)]
        assert [r.status for r in results] == [PutMessageStatus.PUT_OK] * 20
        assert results[0].wrote_offset == BODY_OFFSET  # the first entry is at 0
        for r, nxt in itertools.pairwise(results):
            assert nxt.wrote_offset == r.wrote_offset + r.wrote_bytes + BODY_OFFSET
        assert [r.logic_offset for r in results] == list(range(20))
        for r in results:
            record = store.select_one_message_by_offset(r.wrote_offset)
            assert record is not None and len(record) == r.wrote_bytes
            # PHYSICALOFFSET (record offset 28) names the record's own offset, as the id does
            assert struct.unpack_from(">q", record, 28)[0] == r.wrote_offset
            assert r.msg_id.endswith(f"{r.wrote_offset:016X}")
        await wait_until(lambda: store.get_max_offset_in_queue("TopicTest", 0) == 20, timeout=5)
        got = store.get_message("g", "TopicTest", 0, 0, 32)
        assert got.status is GetMessageStatus.FOUND
        assert [decode_record(m).body for m in got.messages] == [b"m%d" % i for i in range(20)]
        assert store.commitlog.max_offset == results[-1].wrote_offset + results[-1].wrote_bytes
    # restarted: the log, the queue and the queue offsets go on
    async with running_store(config, **kwargs(config)) as store:  # type: ignore[arg-type]
        assert store.get_max_offset_in_queue("TopicTest", 0) == 20
        await leading(store)
        again = await store.put(make_message(body=b"after"))
        assert again.status is PutMessageStatus.PUT_OK and again.logic_offset == 20


async def test_a_store_not_yet_made_master_refuses_writes(tmp_path) -> None:
    config = dledger_config(str(tmp_path), free_port())
    async with running_store(config, **kwargs(config)) as store:  # type: ignore[arg-type]
        assert store.read_only and store.config.broker_role is BrokerRole.SLAVE
        await leading(store)
        # a leader whose queue offsets are being rebuilt: writes refused, nothing appended
        store.read_only = True
        refused = await store.put(make_message(body=b"early"))
        assert refused.status is PutMessageStatus.SERVICE_NOT_AVAILABLE
        assert store.dledger is not None and store.dledger.dledger.ledger_end_index == -1
        store.read_only = False
        ok = await store.put(make_message(body=b"now"))
        assert ok.status is PutMessageStatus.PUT_OK and ok.logic_offset == 0


async def test_a_plain_commit_log_is_carried_over_and_the_dledger_log_goes_on_after_it(
    tmp_path,
) -> None:
    """RocketMQ 4.9.4's dividedCommitlogOffset: a plain commit log written before DLedger mode
    stays readable below the divided offset (its last file closed with a blank), the consume
    queues are kept, and entries go on after it, in the queues' order; a restart keeps it."""
    plain = small_config(str(tmp_path))

    def old_body(i: int) -> bytes:
        return b"old-%d-" % i + b"x" * 3000

    async with running_store(plain) as store:
        old = [await store.put(make_message(body=old_body(i))) for i in range(30)]
        assert {r.status for r in old} == {PutMessageStatus.PUT_OK}
        await wait_until(lambda: store.get_max_offset_in_queue("TopicTest", 0) == 30, timeout=5)
        old_files = [mf.file_from_offset for mf in store.commitlog.queue.files]
        assert len(old_files) == 2  # a full file and the last
    old_end = old[-1].wrote_offset + old[-1].wrote_bytes
    config = dledger_config(str(tmp_path), free_port())
    dl_size = FAST["mapped_file_size_for_entry_data"]
    last_old = old_files[-1] + plain.mapped_file_size_commit_log
    divided = -(-last_old // dl_size) * dl_size

    def bodies(store: DefaultMessageStore, begin: int, count: int) -> list[bytes]:
        got = store.get_message("g", "TopicTest", 0, begin, count)
        assert got.status is GetMessageStatus.FOUND, got.status
        return [decode_record(m).body for m in got.messages]

    async with running_store(config, **kwargs(config)) as store:  # type: ignore[arg-type]
        dledger = store.dledger
        assert dledger is not None and dledger.divided_offset == divided
        # the old log's last file was closed with a blank where its data ended
        tail = store.commitlog.queue.files[-1]
        blank = struct.unpack_from(">iI", tail.mm, old_end - tail.file_from_offset)
        assert blank == (tail.file_size - (old_end - tail.file_from_offset), 0xCBD43194)
        assert store.get_min_offset_in_queue("TopicTest", 0) == 0
        assert store.get_max_offset_in_queue("TopicTest", 0) == 30
        assert bodies(store, 0, 32) == [old_body(i) for i in range(30)]
        assert store.commitlog.min_offset == old_files[0]
        await leading(store)
        new = [await store.put(make_message(body=b"new-%d" % i)) for i in range(10)]
        assert {r.status for r in new} == {PutMessageStatus.PUT_OK}
        assert new[0].wrote_offset == divided + BODY_OFFSET
        assert [r.logic_offset for r in new] == list(range(30, 40))
        await wait_until(lambda: store.get_max_offset_in_queue("TopicTest", 0) == 40, timeout=5)
        want = [old_body(i) for i in range(30)] + [b"new-%d" % i for i in range(10)]
        assert bodies(store, 0, 32) + bodies(store, 32, 32) == want
        assert store.select_one_message_by_offset(old[3].wrote_offset) is not None
    # restarted: the DLedger files give the divided offset; everything still reads
    async with running_store(config, **kwargs(config)) as store:  # type: ignore[arg-type]
        assert store.dledger is not None and store.dledger.divided_offset == divided
        assert store.get_max_offset_in_queue("TopicTest", 0) == 40
        assert bodies(store, 0, 32) + bodies(store, 32, 32) == want
        await leading(store)
        again = await store.put(make_message(body=b"after"))
        assert again.status is PutMessageStatus.PUT_OK and again.logic_offset == 40


HOUR_MS = 3600 * 1000


def data_files(store: DefaultMessageStore) -> list[int]:
    assert store.dledger is not None
    return [f.offset for f in store.dledger.dledger.data.files]


async def test_expired_data_files_go_with_their_queues_and_a_restart_recovers(tmp_path) -> None:
    """DLedger's data files expire as 4.9.4 maps fileReservedTime/deleteWhen onto DLedger
    (fileReservedTime + 1 hours, at the deleteWhen hour), only below what is committed and
    dispatched; the consume queues follow the new minimum; a restart after keeps it all."""
    start = int(datetime.datetime(2026, 3, 10, 4, 30).timestamp() * 1000)
    now = [start]
    mtimes: dict[str, float] = {}

    def mtime(path: str) -> float:
        return mtimes.setdefault(path, start / 1000)

    config = dledger_config(
        str(tmp_path),
        free_port(),
        file_reserved_time=72,  # DLedger: 73 hours
        delete_when="04",
        mapped_file_size_consume_queue=20 * 20,  # 20 entries a consume-queue file
    )
    extra = {"clock_ms": lambda: now[0], "disk_ratio": lambda _p: 0.10, "mtime": mtime}
    async with running_store(config, **kwargs(config), **extra) as store:  # type: ignore[arg-type]
        await leading(store)
        results = [await store.put(make_message(body=b"d" * 3000)) for _ in range(90)]
        assert {r.status for r in results} == {PutMessageStatus.PUT_OK}
        await wait_until(lambda: store.get_max_offset_in_queue("TopicTest", 0) == 90, timeout=5)
        files = data_files(store)
        assert len(files) >= 4
        cq = store.consume_queues.find("TopicTest", 0)
        assert cq is not None and len(cq.queue.files) == 5
        cl = store.clean_commitlog
        # 72.5 hours old, at the delete hour: kept (73 h in DLedger mode)
        now[0] = start + 72 * HOUR_MS + HOUR_MS // 2
        for f in store.dledger.dledger.data.files:  # type: ignore[union-attr]
            mtimes[f.path] = start / 1000
        assert await cl.run_once() == 0
        # not the delete hour and the disk not full: kept, however old
        now[0] = start + 100 * HOUR_MS + 3 * HOUR_MS
        assert await cl.run_once() == 0
        # dispatch behind: nothing at or past it goes, whatever the age; a reader holding the
        # first file as it expires reads on, and its descriptor closes at the last release
        data = store.dledger.dledger.data  # type: ignore[union-attr]
        held = data.hold(results[0].wrote_offset)
        assert held is not None and held.offset == files[0]
        first = store.select_one_message_by_offset(results[0].wrote_offset)
        assert first is not None
        now[0] = start + 96 * HOUR_MS  # 04:30, four days on
        cl.dispatched = lambda: files[1] + 10  # type: ignore[attr-defined]
        assert await cl.run_once() == 1 and data_files(store) == files[1:]
        assert not os.path.exists(held.path)  # unlinked at once
        assert held.read_at(results[0].wrote_offset - files[0], len(first)) == first
        assert data.hold(results[0].wrote_offset) is None  # gone for new readers
        assert not held.hold()
        held.release()
        assert held.fd == -1  # closed by the last release
        cl.dispatched = store._dispatched  # type: ignore[attr-defined]
        await store.clean_files_once()  # the rest but the newest, then the queues
        assert data_files(store) == files[-1:]
        dledger = store.dledger
        assert dledger is not None
        assert store.commitlog.min_offset == files[-1]
        first_kept = min(r.logic_offset for r in results if r.wrote_offset >= files[-1])
        assert dledger.dledger.ledger_begin_index == first_kept  # an entry per message
        assert store.get_min_offset_in_queue("TopicTest", 0) == first_kept
        # the consume-queue files wholly below the new minimum went too
        kept = [f.file_from_offset // 400 for f in cq.queue.files]
        assert kept == list(range(first_kept // 20, 5))
        got = store.get_message("g", "TopicTest", 0, first_kept, 4)
        assert got.status is GetMessageStatus.FOUND
        assert [decode_record(m).queue_offset for m in got.messages] == list(
            range(first_kept, first_kept + len(got.messages))
        )
        names = sorted(os.listdir(dledger.dledger_config.data_path))
        assert names == [f"{files[-1]:020d}"]
    async with running_store(config, **kwargs(config), **extra) as store:  # type: ignore[arg-type]
        assert store.dledger is not None
        assert data_files(store) == files[-1:]
        assert store.dledger.dledger.ledger_begin_index == first_kept
        assert store.dledger.dledger.ledger_end_index == 89
        assert store.get_min_offset_in_queue("TopicTest", 0) == first_kept
        assert store.get_max_offset_in_queue("TopicTest", 0) == 90
        await leading(store)
        again = await store.put(make_message(body=b"after"))
        assert again.status is PutMessageStatus.PUT_OK and again.logic_offset == 90


async def test_a_carried_over_log_expires_by_the_plain_rule_before_any_dledger_file(
    tmp_path,
) -> None:
    """4.9.4's DLedgerCommitLog.deleteExpiredFile: while old files remain they expire by the
    plain rule (fileReservedTime hours, the last one too), and no DLedger file goes; then the
    minimum offset is the DLedger log's and the consume queues follow it."""
    start = int(datetime.datetime(2026, 3, 10, 4, 30).timestamp() * 1000)
    now = [start]
    mtimes: dict[str, float] = {}

    def mtime(path: str) -> float:
        return mtimes.setdefault(path, start / 1000)

    rules = {"file_reserved_time": 72, "delete_when": "04"}
    plain = small_config(str(tmp_path), **rules)
    async with running_store(plain) as store:
        for _ in range(30):
            assert (await store.put(make_message(body=b"o" * 3000))).is_ok
        old_files = len(store.commitlog.queue.files)
        assert old_files == 2
    config = dledger_config(str(tmp_path), free_port(), **rules)
    extra = {"clock_ms": lambda: now[0], "disk_ratio": lambda _p: 0.10, "mtime": mtime}
    async with running_store(config, **kwargs(config), **extra) as store:  # type: ignore[arg-type]
        await leading(store)
        new = [await store.put(make_message(body=b"n" * 3000)) for _ in range(30)]
        assert {r.status for r in new} == {PutMessageStatus.PUT_OK}
        await wait_until(lambda: store.get_max_offset_in_queue("TopicTest", 0) == 60, timeout=5)
        dl_files = data_files(store)
        assert len(dl_files) >= 2
        cl = store.clean_commitlog
        now[0] = start + 72 * HOUR_MS + 10 * 60 * 1000  # 04:40 three days on: 72 h old
        assert await cl.run_once() == 1  # the first old file, by the plain rule
        assert len(store.commitlog.queue.files) == 1 and data_files(store) == dl_files
        assert await cl.run_once() == 1  # then the last one
        assert not store.commitlog.queue.files and data_files(store) == dl_files
        assert store.commitlog.min_offset == dl_files[0]
        await store.clean_files_once()  # DLedger's rule: 73 h, not yet; the queues follow
        assert data_files(store) == dl_files
        assert store.get_min_offset_in_queue("TopicTest", 0) == 30
        got = store.get_message("g", "TopicTest", 0, 30, 4)
        assert [decode_record(m).queue_offset for m in got.messages] == [30, 31, 32, 33]


async def test_reput_dispatches_as_the_plain_reput_and_parses_only_what_it_must(
    tmp_path, monkeypatch
) -> None:
    """The DLedger reput dispatches each committed record through the plain reput's C calls
    (record_hints, dispatch_hinted) and parses in Python only the records those leave (a
    consume-queue file to make, a delayed message's topic): the consume queues and the index
    are what a plain store's reput makes of the same messages."""
    parsed: list[int] = []
    real = dledger_commitlog.read_record_info

    def counting(*args: object, **kw: object) -> object:
        parsed.append(1)
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(dledger_commitlog, "read_record_info", counting)
    messages = [
        make_message(
            topic=f"Topic{i % 2}", queue_id=i % 3, body=b"b%d" % i * 50, tags=f"T{i % 4}",
            keys=f"k{i} shared",
        )
        for i in range(90)
    ] + [make_message(body=b"later", keys="delayed", DELAY="3")]  # fmt: skip
    small_queues = {"mapped_file_size_consume_queue": 20 * 20}  # a new queue file every 20
    stores: dict[str, list[tuple[int, int, int]]] = {}
    found: dict[str, int] = {}
    plain = small_config(str(tmp_path / "plain"), **small_queues)
    config = dledger_config(str(tmp_path / "dledger"), free_port(), **small_queues)
    for name, cfg, extra in (("plain", plain, {}), ("dledger", config, kwargs(config))):
        async with running_store(cfg, **extra) as store:  # type: ignore[arg-type]
            if name == "dledger":
                await leading(store)
            for msg in messages:
                assert (await store.put(copy.deepcopy(msg))).status is PutMessageStatus.PUT_OK
            queues = [(f"Topic{t}", q) for t in (0, 1) for q in range(3)]
            queues.append(("SCHEDULE_TOPIC_XXXX", 2))
            await wait_until(
                lambda: sum(store.get_max_offset_in_queue(*tq) for tq in queues) == 91,  # noqa: B023
                timeout=10,
            )
            rows = []
            for topic, queue_id in queues:
                cq = store.consume_queues.find(topic, queue_id)
                assert cq is not None
                for i in range(cq.max_offset_in_queue):
                    entry = cq.get_entry(i)
                    assert entry is not None
                    phy, size, tags = entry
                    raw = store.select_one_message_by_offset(phy, size)
                    assert raw is not None
                    record = decode_record(raw)
                    assert record.queue_offset == i and record.commitlog_offset == phy
                    if topic == "SCHEDULE_TOPIC_XXXX":  # its tags code: when it is due
                        tags -= record.store_timestamp
                    rows.append((size, tags, record.body_crc))
            stores[name] = rows
            for key in ("k7", "shared", "delayed"):
                hit = store.query_message(
                    "SCHEDULE_TOPIC_XXXX" if key == "delayed" else "Topic1", key, 64, 0, 2**62
                )
                found[f"{name}:{key}"] = len(hit.messages)
    assert stores["dledger"] == stores["plain"]
    assert found["dledger:k7"] == found["plain:k7"] == 1
    assert found["dledger:shared"] == found["plain:shared"] == 45
    assert found["dledger:delayed"] == found["plain:delayed"] == 1
    # Parsed: a queue's first record and each one that starts a queue file (6 queues of 15,
    # 0 and 20 wanting a file), and the delayed one: never the others.
    assert 0 < len(parsed) <= 6 * 2 + 1, len(parsed)


async def test_defer_durable_calls_back_once_a_majority_has_the_entry(tmp_path) -> None:
    """The inline sends' wait in DLedger mode (defer_durable, no task): the callback gets the
    result once the entry is committed (a group of one commits at once), PUT_OK whatever WAIT
    says; a put it does not know of is UNKNOWN_ERROR at once; a refused put is not waited
    for.  (A leader without its majority: test_dledger_brokers' leader alone.)"""
    config = dledger_config(str(tmp_path), free_port())
    got: list[tuple[PutMessageStatus, int]] = []
    async with running_store(config, **kwargs(config)) as store:  # type: ignore[arg-type]
        await leading(store)
        dledger = store.dledger
        assert dledger is not None
        log = dledger.dledger
        result = store.put_now(make_message(body=b"deferred"))
        assert result.status is PutMessageStatus.PUT_OK
        assert store.defer_durable(
            result, "false", lambda r: got.append((r.status, log.committed_index))
        )
        await wait_until(lambda: got, timeout=5)
        assert got == [(PutMessageStatus.PUT_OK, 0)]
        stray = store.put_now(make_message(body=b"x"))
        stray.wrote_bytes += 1  # an end no put had
        assert store.defer_durable(stray, None, lambda r: got.append((r.status, -2)))
        assert got[-1] == (PutMessageStatus.UNKNOWN_ERROR, -2)
        refused = attrs.evolve(result, status=PutMessageStatus.OS_PAGECACHE_BUSY)
        assert not store.defer_durable(refused, None, lambda r: got.append((r.status, -3)))
        assert len(got) == 2
