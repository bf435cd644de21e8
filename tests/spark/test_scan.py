"""The export's plain-Python side: planning a store and scanning files, bad bytes included."""

from __future__ import annotations

import os
import pathlib
import shutil
import struct
import subprocess
import sys

import pytest

from pymq.client import Producer
from pymq.common.message_id import decode_offset_msg_id
from pymq.common.record import decode_record
from pymq.common.topic import is_system_topic
from pymq.embedded import open_cluster
from pymq.export.options import CheckpointBound, ExportOptions, Mode, OptionError
from pymq.export.scan import CorruptRecordError, SegmentScan, StoreError, plan_store
from tests.helpers import wait_until
from tests.spark.helpers import FILE_SIZE, make_messages, produce, store_of

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("scan-store"))
    sent = produce(data_dir, make_messages(240, seed=1), delayed=1)
    return store_of(data_dir), sent


@pytest.fixture
def store_copy(written, tmp_path):
    store, sent = written
    copy = str(tmp_path / "store")
    shutil.copytree(store, copy)
    return copy, sent


def scan_all(opts: ExportOptions):
    plan = plan_store(opts)
    msgs, reports = [], []
    for segment in plan.segments:
        scan = SegmentScan(segment, opts)
        msgs.extend(scan)
        reports.append(scan.report)
    return plan, msgs, reports


def offset_of(sent) -> int:
    return decode_offset_msg_id(sent.result.offset_msg_id)[2]


def commitlog_file(store: str, offset: int) -> tuple[str, int]:
    start = offset - offset % FILE_SIZE
    return os.path.join(store, "commitlog", f"{start:020d}"), offset - start


def test_every_sent_message_is_scanned_once_in_order(written):
    store, sent = written
    plan, msgs, reports = scan_all(ExportOptions(path=store))
    assert len(plan.segments) == plan.files >= 3
    assert [m.commitlog_offset for m in msgs] == [offset_of(s) for s in sent]
    assert [m.body for m in msgs] == [s.message.body for s in sent]
    assert not any(r.bad_ranges for r in reports)
    assert sum(r.messages for r in reports) == len(sent)
    _, everything, _ = scan_all(ExportOptions(path=store, include_system_topics=True))
    assert everything[-1].topic == "SCHEDULE_TOPIC_XXXX"  # the delayed message, stored last
    assert reports[-1].resume_offset == everything[-1].commitlog_offset + everything[-1].store_size
    assert sum(r.messages for r in reports) == len(sent)


def test_system_topics_are_left_out_unless_asked_for(written):
    store, _sent = written
    _, msgs, _ = scan_all(ExportOptions(path=store, include_system_topics=True))
    assert [m.topic for m in msgs].count("SCHEDULE_TOPIC_XXXX") == 1
    _, named, _ = scan_all(ExportOptions(path=store, topics=frozenset({"SCHEDULE_TOPIC_XXXX"})))
    assert [m.body for m in named] == [b"later-0"]
    for topic in ("SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "%RETRY%g", "%DLQ%g"):
        assert is_system_topic(topic)
    assert not is_system_topic("Orders")


def test_offset_bounds_and_topics(written):
    store, sent = written
    lo, hi = offset_of(sent[50]), offset_of(sent[150])
    opts = ExportOptions(path=store, from_offset=lo, to_offset=hi, topics=frozenset({"Audit"}))
    plan, msgs, _ = scan_all(opts)
    expected = [s for s in sent[50:150] if s.message.topic == "Audit"]
    assert [m.commitlog_offset for m in msgs] == [offset_of(s) for s in expected]
    assert len(plan.segments) < plan.files


def test_checkpoint_bound_stops_at_what_was_flushed(store_copy):
    store, _sent = store_copy
    _, msgs, _ = scan_all(ExportOptions(path=store))
    stamp = msgs[99].store_timestamp
    with open(os.path.join(store, "checkpoint"), "r+b") as f:
        f.write(struct.pack(">q", stamp))
    open(os.path.join(store, "abort"), "wb").close()  # a running (or crashed) broker
    plan, bounded, reports = scan_all(ExportOptions(path=store))
    assert plan.checkpoint_timestamp == stamp
    assert bounded == [m for m in msgs if m.store_timestamp <= stamp]
    assert 100 <= len(bounded) < len(msgs)
    after = bounded[-1].commitlog_offset + bounded[-1].store_size
    assert max(r.resume_offset for r in reports) == after
    _, everything, _ = scan_all(ExportOptions(path=store, until_checkpoint=CheckpointBound.NO))
    assert len(everything) == len(msgs)


def test_torn_tail_keeps_the_valid_records_and_reports_the_rest(store_copy):
    store, sent = store_copy
    last = offset_of(sent[-1])
    path, pos = commitlog_file(store, last)
    record = decode_record(pathlib.Path(path).read_bytes(), pos)
    with open(path, "r+b") as f:  # the last record's second half never reached the disk
        f.seek(pos + record.store_size // 2)
        f.write(b"\0" * (FILE_SIZE - pos - record.store_size // 2))
    following = int(os.path.basename(path)) + FILE_SIZE
    with open(os.path.join(store, "commitlog", f"{following:020d}"), "wb") as f:
        f.truncate(FILE_SIZE)  # the broker pre-allocates the next file
    plan, msgs, reports = scan_all(ExportOptions(path=store, include_system_topics=True))
    assert plan.segments[-1].path == path
    assert any("pre-allocated" in note for note in plan.notes)
    assert [m.commitlog_offset for m in msgs] == [offset_of(s) for s in sent[:-1]]
    bad = [b for r in reports for b in r.bad_ranges]
    assert len(bad) == 1
    assert bad[0].start == last and bad[0].end == last + record.store_size // 2
    assert reports[-1].resume_offset == last  # read again next time: it may still be written


def test_corrupt_record_in_a_closed_file_is_skipped_and_scanning_goes_on(store_copy):
    store, sent = store_copy
    victim = sent[5]
    path, pos = commitlog_file(store, offset_of(victim))
    assert pos > 0 and victim.message.body
    data = bytearray(pathlib.Path(path).read_bytes())
    size = decode_record(data, pos).store_size
    data[pos + 8] ^= 0xFF  # BODYCRC no longer matches the body
    pathlib.Path(path).write_bytes(data)
    _, msgs, reports = scan_all(ExportOptions(path=store))
    assert [m.commitlog_offset for m in msgs] == [offset_of(s) for s in sent if s is not victim]
    bad = [b for r in reports for b in r.bad_ranges]
    assert [(b.start, b.end) for b in bad] == [(offset_of(victim), offset_of(victim) + size)]
    with pytest.raises(CorruptRecordError):
        scan_all(ExportOptions(path=store, mode=Mode.FAILFAST))


def test_garbage_in_the_middle_of_a_file_is_skipped_to_the_next_record(store_copy):
    store, sent = store_copy
    first, third = offset_of(sent[1]), offset_of(sent[3])
    path, pos = commitlog_file(store, first)
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(b"\x07" * (third - first))
    _, msgs, reports = scan_all(ExportOptions(path=store))
    assert len(msgs) == len(sent) - 2
    assert [(b.start, b.end) for r in reports for b in r.bad_ranges] == [(first, third)]


def test_a_directory_that_is_not_a_store(tmp_path):
    with pytest.raises(StoreError, match="not a RocketMQ store"):
        plan_store(ExportOptions(path=str(tmp_path)))
    with pytest.raises(StoreError, match="does not exist"):
        plan_store(ExportOptions(path=str(tmp_path / "missing")))


def test_options_from_spark_strings():
    opts = ExportOptions.from_options(
        {"path": "/s", "topics": "a, b", "fromTime": "2026-01-01T00:00:00Z", "toOffset": "100"}
    )
    assert opts.topics == frozenset({"a", "b"})
    assert opts.from_time == 1767225600000
    assert opts.to_offset == 100
    assert ExportOptions.from_options(opts.to_spark_options()) == opts
    with pytest.raises(OptionError, match="fromOffset"):
        ExportOptions.from_options({"path": "/s", "fromOffset": "x"})
    with pytest.raises(OptionError, match="untilCheckpoint"):
        ExportOptions.from_options({"path": "/s", "untilCheckpoint": "maybe"})


def test_script_says_what_is_wrong_without_a_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "scripts/spark_export.py", "--store", str(tmp_path), "--output", "x"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "is not a RocketMQ store" in result.stderr
    assert "Traceback" not in result.stderr


async def test_live_broker_store_is_read_up_to_the_checkpoint(tmp_path):
    """While a broker runs (abort file present) only flushed, checkpointed records are read."""
    properties = {
        "mappedFileSizeCommitLog": str(FILE_SIZE),
        "flushConsumeQueueThoroughInterval": "50",  # write the checkpoint often
    }
    async with (
        open_cluster(
            str(tmp_path),
            namesrv_port=0,
            broker_port=0,
            bind_address="127.0.0.1",
            properties=properties,
        ) as cluster,
        Producer("Live", cluster.namesrv_addr) as producer,
    ):
        store = store_of(str(tmp_path))
        assert os.path.exists(os.path.join(store, "abort"))
        sent = [await producer.send(m) for m in make_messages(40, seed=4)]
        last = offset_of_result(sent[-1])

        def scanned_up_to_last() -> tuple | None:
            plan, msgs, _ = scan_all(ExportOptions(path=store))
            return (plan, msgs) if msgs and msgs[-1].commitlog_offset == last else None

        plan, msgs = await wait_until(scanned_up_to_last, timeout=10, interval=0.05)
        assert plan.checkpoint_timestamp is not None
        assert [m.commitlog_offset for m in msgs] == [offset_of_result(r) for r in sent]
        assert all(m.store_timestamp <= plan.checkpoint_timestamp for m in msgs)


def offset_of_result(result) -> int:
    return decode_offset_msg_id(result.offset_msg_id)[2]
