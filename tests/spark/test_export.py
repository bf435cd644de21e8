"""Spark in local mode over stores written by the broker: the data source and the export job."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import shutil

import pytest

from pymq.common.message_id import decode_offset_msg_id
from pymq.common.record import decode_record
from pymq.export.job import STATE_FILE, ExportError, JobConfig, read_state, run_export
from tests.spark.helpers import FILE_SIZE, make_messages, produce, store_of

# pyspark checks the pandas version when Arrow is used; the export does not use pandas.
SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "spark_export.py")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas"),
]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("export-store"))
    sent = produce(data_dir, make_messages(300, seed=2), delayed=1)
    return data_dir, sent


def read(spark, store: str, **options: str):
    return spark.read.format("pymq").option("path", store).options(**options).load()


def by_offset(rows) -> dict[int, object]:
    return {r.commitlog_offset: r for r in rows}


def test_export_matches_what_the_client_sent(spark, written):
    data_dir, sent = written
    df = read(spark, store_of(data_dir))
    files = len(os.listdir(os.path.join(store_of(data_dir), "commitlog")))
    assert files >= 3
    assert df.rdd.getNumPartitions() == files  # one partition per commit-log file
    rows = by_offset(df.collect())
    assert len(rows) == len(sent)
    for s in sent:
        _ip, _port, offset = decode_offset_msg_id(s.result.offset_msg_id)
        row = rows[offset]
        msg = s.message
        assert row.topic == msg.topic
        assert row.body == msg.body
        assert row.tags == msg.tags
        assert row.keys == (list(msg.keys) if msg.keys else [])
        assert row.unique_key == s.result.msg_id
        assert row.msg_id == s.result.offset_msg_id
        assert row.queue_id == s.result.queue.queue_id
        assert row.queue_offset == s.result.queue_offset
        for key, value in msg.properties.items():
            assert row.properties[key] == value
        assert row.born_timestamp <= row.store_timestamp
        assert row.store_host.startswith("127.0.0.1:")


def test_topic_and_time_filters(spark, written):
    data_dir, sent = written
    store = store_of(data_dir)
    everything = read(spark, store).select("topic", "store_timestamp", "commitlog_offset")
    rows = sorted(everything.collect(), key=lambda r: r.commitlog_offset)
    audit = read(spark, store, topics="Audit").collect()
    assert {r.topic for r in audit} == {"Audit"}
    assert len(audit) == sum(1 for s in sent if s.message.topic == "Audit")
    middle = rows[len(rows) // 2].store_timestamp
    later = rows[len(rows) * 3 // 4].store_timestamp
    since_ms = int(middle.timestamp() * 1000)
    until_ms = int(later.timestamp() * 1000)
    window = read(spark, store, fromTime=str(since_ms), toTime=later.isoformat() + "Z").collect()
    expected = [r.commitlog_offset for r in rows if since_ms <= _ms(r) < until_ms]
    assert sorted(r.commitlog_offset for r in window) == expected
    assert 0 < len(expected) < len(rows)
    system = read(spark, store, includeSystemTopics="true").count()
    assert system == len(sent) + 1  # the delayed message still in SCHEDULE_TOPIC_XXXX


def _ms(row) -> int:
    return int(row.store_timestamp.timestamp() * 1000)


def test_incremental_export_picks_up_only_new_messages(spark, tmp_path, written):
    data_dir = str(tmp_path / "data")
    shutil.copytree(written[0], data_dir)
    first = written[1]
    out = str(tmp_path / "out")
    cfg = JobConfig(store=store_of(data_dir), output=out, partition_by=("topic", "date"))
    summary = run_export(cfg, spark=spark, echo=lambda _line: None)
    assert summary.messages == len(first)
    assert summary.topics == {"Audit": 150, "Orders": 150}
    with pytest.raises(ExportError, match="already holds an export"):
        run_export(cfg, spark=spark, echo=lambda _line: None)

    more = produce(data_dir, make_messages(60, seed=3))
    lines: list[str] = []
    incremental = JobConfig(
        store=store_of(data_dir), output=out, partition_by=("topic", "date"), incremental=True
    )
    again = run_export(incremental, spark=spark, echo=lines.append)
    # The restarted broker may also deliver the delayed message (into Orders) by now.
    truth = read(spark, store_of(data_dir)).count()
    assert truth - len(first) - len(more) in (0, 1)
    assert again.messages == truth - len(first)
    assert again.from_offset == summary.last_offset
    assert any("per topic" in line for line in lines)
    exported = spark.read.parquet(out)
    assert exported.count() == truth
    assert exported.select("commitlog_offset").distinct().count() == truth
    assert {r.date.isoformat() for r in exported.select("date").distinct().collect()}
    bodies = {bytes(r.body) for r in exported.where("topic = 'Orders'").collect()}
    assert {s.message.body for s in first + more if s.message.topic == "Orders"} <= bodies

    state = read_state(out)
    assert os.path.exists(os.path.join(out, STATE_FILE))
    assert [r["messages"] for r in state["runs"]] == [len(first), again.messages]
    assert state["last_offset"] == again.last_offset > summary.last_offset
    nothing = run_export(incremental, spark=spark, echo=lambda _line: None)
    assert nothing.messages == 0


def test_torn_tail_exports_the_valid_records_and_reports_the_range(spark, tmp_path, written):
    data_dir, sent = written
    store = str(tmp_path / "store")
    shutil.copytree(store_of(data_dir), store)
    last = decode_offset_msg_id(sent[-1].result.offset_msg_id)[2]
    path = os.path.join(store, "commitlog", f"{last - last % FILE_SIZE:020d}")
    pos = last % FILE_SIZE
    size = decode_record(pathlib.Path(path).read_bytes(), pos).store_size
    with open(path, "r+b") as f:
        f.truncate(pos + size // 3)  # the file itself ends inside the record
    out = str(tmp_path / "out")
    lines: list[str] = []
    summary = run_export(
        JobConfig(store=store, output=out, format="json"), spark=spark, echo=lines.append
    )
    assert summary.messages == len(sent) - 1
    assert [(b.start, b.end) for b in summary.bad_ranges] == [(last, last + size // 3)]
    assert any("bad range" in line for line in lines)
    assert spark.read.json(out).count() == len(sent) - 1


def test_parquet_columns_of_distinct_values_are_written_without_a_dictionary(
    spark, tmp_path, written
):
    import pyarrow.parquet as pq

    out = str(tmp_path / "out")
    run_export(JobConfig(store=store_of(written[0]), output=out), spark=spark, echo=print)
    files = [f for f in pathlib.Path(out).glob("*.parquet") if pq.ParquetFile(f).metadata.num_rows]
    assert files
    group = pq.ParquetFile(files[0]).metadata.row_group(0)
    encodings = {
        group.column(i).path_in_schema: group.column(i).encodings for i in range(group.num_columns)
    }
    for column in ("body", "msg_id", "commitlog_offset", "keys.list.element"):
        assert not any("DICTIONARY" in e for e in encodings[column]), (column, encodings[column])
    for column in ("topic", "tags", "store_host", "properties.key_value.key"):
        assert any("DICTIONARY" in e for e in encodings[column]), (column, encodings[column])


def test_not_a_store_fails_before_spark_runs(spark, tmp_path):
    with pytest.raises(ExportError, match="not a RocketMQ store"):
        run_export(JobConfig(store=str(tmp_path), output=str(tmp_path / "o")), spark=spark)


def test_failfast_stops_at_a_corrupt_record_and_says_so(spark, tmp_path, written):
    data_dir, sent = written
    store = str(tmp_path / "store")
    shutil.copytree(store_of(data_dir), store)
    offset = decode_offset_msg_id(sent[3].result.offset_msg_id)[2]
    path = os.path.join(store, "commitlog", f"{offset - offset % FILE_SIZE:020d}")
    data = bytearray(pathlib.Path(path).read_bytes())
    data[offset % FILE_SIZE + 8] ^= 0xFF  # BODYCRC
    pathlib.Path(path).write_bytes(data)
    cfg = JobConfig(store=store, output=str(tmp_path / "out"), failfast=True)
    with pytest.raises(Exception) as failure:  # Spark wraps the task's error
        run_export(cfg, spark=spark, echo=lambda _line: None)
    spec = importlib.util.spec_from_file_location("spark_export", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    line = script.spark_error_line(failure.value)
    assert "CorruptRecordError" in line and "body CRC mismatch" in line


# --- the job's own Parquet writer (pyarrow in the tasks) against Spark's -----------------------

PART_NAME = re.compile(r"part-\d{5}-[0-9a-f]{32}-c000\.snappy\.parquet")


def listing(out: str) -> dict[str, bytes]:
    """Every file under ``out`` (relative path to content)."""
    return {
        str(p.relative_to(out)): p.read_bytes() for p in pathlib.Path(out).rglob("*") if p.is_file()
    }


def part_files(out: str) -> list[pathlib.Path]:
    return sorted(p for p in pathlib.Path(out).rglob("*.parquet"))


def nullable(schema):
    """``schema`` with every field, array element and map value nullable (Spark's asNullable)."""
    from pyspark.sql.types import ArrayType, MapType, StructField, StructType

    def loosen(t):
        if isinstance(t, StructType):
            return StructType([StructField(f.name, loosen(f.dataType), True) for f in t])
        if isinstance(t, ArrayType):
            return ArrayType(loosen(t.elementType), True)
        if isinstance(t, MapType):
            return MapType(loosen(t.keyType), loosen(t.valueType), True)
        return t

    return loosen(schema)


def sorted_rows(df) -> list:
    return sorted(df.collect(), key=lambda r: r.commitlog_offset)


def test_parquet_reads_back_as_the_data_source_and_as_sparks_own_writer(spark, tmp_path, written):
    store = store_of(written[0])
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    summary = run_export(JobConfig(store=store, output=ours), spark=spark, echo=lambda _: None)
    run_export(
        JobConfig(store=store, output=theirs, spark_writer=True), spark=spark, echo=lambda _: None
    )
    source = read(spark, store)
    back = spark.read.parquet(ours)
    assert back.schema == spark.read.parquet(theirs).schema
    assert back.schema == nullable(source.schema)  # as Spark reads any Parquet file back
    assert sorted_rows(back) == sorted_rows(source)  # every column, maps and arrays included
    assert summary.messages == len(written[1])
    names = {p.name for p in part_files(ours)}
    assert len(names) == summary.files and all(PART_NAME.fullmatch(n) for n in names)
    assert os.path.exists(os.path.join(ours, "_SUCCESS"))
    assert not [n for n in os.listdir(ours) if n.startswith("_pymq_temporary")]


def test_partitioned_parquet_has_sparks_directories_and_rows(spark, tmp_path, written):
    store = store_of(written[0])
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    columns = ("topic", "date", "queue_id")
    for out, spark_writer in ((ours, False), (theirs, True)):
        cfg = JobConfig(
            store=store,
            output=out,
            partition_by=columns,
            include_system_topics=True,
            spark_writer=spark_writer,
        )
        run_export(cfg, spark=spark, echo=lambda _: None)
    dirs = {str(p.parent.relative_to(ours)) for p in part_files(ours)}
    assert dirs == {str(p.parent.relative_to(theirs)) for p in part_files(theirs)}
    assert any(d.startswith("topic=SCHEDULE_TOPIC_XXXX/") for d in dirs)
    back, spark_back = spark.read.parquet(ours), spark.read.parquet(theirs)
    assert back.schema == spark_back.schema
    assert sorted_rows(back) == sorted_rows(spark_back)


def test_incremental_parquet_runs_add_files_of_their_own(spark, tmp_path, written):
    store = store_of(written[0])
    out = str(tmp_path / "out")
    offsets = sorted(r.commitlog_offset for r in read(spark, store).collect())
    middle = offsets[len(offsets) // 2]
    first = run_export(
        JobConfig(store=store, output=out, to_offset=middle), spark=spark, echo=lambda _: None
    )
    names_before = {p.name for p in part_files(out)}
    second = run_export(
        JobConfig(store=store, output=out, incremental=True), spark=spark, echo=lambda _: None
    )
    third = run_export(
        JobConfig(store=store, output=out, incremental=True), spark=spark, echo=lambda _: None
    )
    assert first.messages == len(offsets) // 2
    assert first.messages + second.messages == len(offsets)
    assert third.messages == 0
    names = {p.name for p in part_files(out)}
    assert names_before < names  # the first run's files stay, the second run's are new
    assert len({n.split("-", 2)[2] for n in names}) == 2  # two run ids
    back = spark.read.parquet(out)
    assert sorted(r.commitlog_offset for r in back.select("commitlog_offset").collect()) == offsets
    assert sorted_rows(back) == sorted_rows(read(spark, store))


def test_a_failing_task_leaves_the_output_as_it_was(spark, tmp_path, written):
    data_dir, sent = written
    store = str(tmp_path / "store")
    shutil.copytree(store_of(data_dir), store)
    out = str(tmp_path / "out")
    offset = decode_offset_msg_id(sent[-5].result.offset_msg_id)[2]  # in the last file
    cfg = JobConfig(store=store, output=out, to_offset=offset)
    assert run_export(cfg, spark=spark, echo=lambda _: None).files >= 3
    before = listing(out)
    path = os.path.join(store, "commitlog", f"{offset - offset % FILE_SIZE:020d}")
    data = bytearray(pathlib.Path(path).read_bytes())
    data[offset % FILE_SIZE + 8] ^= 0xFF  # BODYCRC
    pathlib.Path(path).write_bytes(data)
    for cfg in (
        JobConfig(store=store, output=out, failfast=True, overwrite=True),
        JobConfig(store=store, output=out, failfast=True, incremental=True),
    ):
        with pytest.raises(Exception, match="CorruptRecordError"):
            run_export(cfg, spark=spark, echo=lambda _: None)
        assert listing(out) == before  # the other tasks' files went with the temporary dir
    fresh = str(tmp_path / "fresh")
    with pytest.raises(Exception, match="CorruptRecordError"):
        run_export(
            JobConfig(store=store, output=fresh, failfast=True), spark=spark, echo=lambda _: None
        )
    assert not part_files(fresh) and not os.path.exists(os.path.join(fresh, "_SUCCESS"))


def test_overwrite_replaces_the_dataset_and_an_empty_export_reads_back(spark, tmp_path, written):
    store = store_of(written[0])
    out = str(tmp_path / "out")
    run_export(JobConfig(store=store, output=out), spark=spark, echo=lambda _: None)
    old = {p.name for p in part_files(out)}
    cfg = JobConfig(store=store, output=out, topics=frozenset({"Nobody"}), overwrite=True)
    summary = run_export(cfg, spark=spark, echo=lambda _: None)
    assert summary.messages == 0
    assert not old & {p.name for p in part_files(out)}
    back = spark.read.parquet(out)
    assert back.count() == 0
    assert back.schema == nullable(read(spark, store).schema)  # from one file with no rows
    assert [r["messages"] for r in read_state(out)["runs"]] == [0]


def test_json_is_still_written_by_spark(spark, tmp_path, written):
    store = store_of(written[0])
    out = str(tmp_path / "out")
    summary = run_export(
        JobConfig(store=store, output=out, format="json"), spark=spark, echo=lambda _: None
    )
    assert summary.messages == len(written[1])
    assert list(pathlib.Path(out).glob("part-*.json"))
    back = spark.read.json(out)
    assert back.count() == summary.messages
    assert {r.topic for r in back.select("topic").distinct().collect()} == {"Audit", "Orders"}


def test_an_export_by_sparks_writer_goes_on_incrementally_with_pyarrow(spark, tmp_path, written):
    """An output of earlier versions (Spark's writer: its own timestamp encoding, file names and
    checksum files) takes pyarrow's files next to its own and reads back whole."""
    store = store_of(written[0])
    out = str(tmp_path / "out")
    offsets = sorted(r.commitlog_offset for r in read(spark, store).collect())
    middle = offsets[len(offsets) // 3]
    old = JobConfig(store=store, output=out, to_offset=middle, spark_writer=True)
    first = run_export(old, spark=spark, echo=lambda _: None)
    new = JobConfig(store=store, output=out, incremental=True)
    second = run_export(new, spark=spark, echo=lambda _: None)
    assert first.messages + second.messages == len(offsets) and first.messages > 0
    assert sorted_rows(spark.read.parquet(out)) == sorted_rows(read(spark, store))
