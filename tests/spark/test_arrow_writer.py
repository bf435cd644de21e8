"""The job's own Parquet writer (pymq/export/arrow_writer.py) driven without Spark: a task's files
hold the rows the data source reads, in Spark's layout; a failing task leaves no file."""

from __future__ import annotations

import datetime
import os
import pathlib
import shutil
import urllib.parse
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pymq.export import datasource
from pymq.export.arrow_writer import (
    PART_SUFFIX,
    STAGING_PREFIX,
    WriteTask,
    _PartFile,
    escape_path_name,
    partition_dir,
    run_task,
    write_parquet,
)
from pymq.export.arrow_writer import Mode as WriteMode
from pymq.export.columns import export_columns
from pymq.export.datasource import arrow_schema
from pymq.export.job import DISTINCT_COLUMNS
from pymq.export.options import ExportOptions, Mode
from pymq.export.scan import CorruptRecordError, plan_store
from tests.spark.test_columns import odd_messages, read_all, with_properties, write_store

RUN = "0123456789abcdef0123456789abcdef"


@pytest.fixture(scope="module")
def odd_store(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("odd-store"))
    extra = (with_properties("TAGS\x01first\x02a\x01b\x02TAGS\x01second"), with_properties(""))
    return write_store(root, odd_messages(300), extra)


def write(opts: ExportOptions, staging: str, **task: Any) -> list[dict]:
    """Every segment of the store through run_task, as Spark would run them (the driver makes
    the run's directory first, as write_parquet does)."""
    os.makedirs(staging, exist_ok=True)
    job = WriteTask(opts, staging, RUN, distinct_columns=DISTINCT_COLUMNS, **task)
    return [report for s in plan_store(opts).segments for report in run_task(job, [s])]


def parts(staging: str) -> list[pathlib.Path]:
    return sorted(pathlib.Path(staging).rglob("*.parquet"))


def by_offset(table: pa.Table) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda r: r["commitlog_offset"])


def test_part_files_hold_the_rows_and_reports_the_data_source_gives(
    odd_store, tmp_path, monkeypatch
):
    monkeypatch.setattr(datasource, "BATCH_ROWS", 50)  # several batches per file
    opts = ExportOptions(path=odd_store, include_system_topics=True)
    staging = str(tmp_path / "staging")
    reports = write(opts, staging, row_group_bytes=20_000)
    expected, expected_reports = read_all(opts, export_columns)
    assert reports == expected_reports
    files = parts(staging)
    assert len(files) == len(reports) >= 3
    assert [f.name for f in files] == [
        f"part-{i:05d}-{RUN}{PART_SUFFIX}" for i in range(len(files))
    ]
    table = pa.concat_tables(pq.read_table(f) for f in files)
    assert table.schema.equals(arrow_schema())  # types, nullability, UTC microseconds
    assert by_offset(table) == by_offset(expected)
    meta = pq.ParquetFile(files[0]).metadata
    assert meta.num_row_groups > 1  # batches gathered up to row_group_bytes, then a new group
    assert meta.row_group(0).column(0).compression == "SNAPPY"
    assert not list(pathlib.Path(staging).rglob(".*"))  # no attempt's temporary file left


def test_partitioned_files_sit_in_spark_directories_without_the_partition_columns(
    odd_store, tmp_path, monkeypatch
):
    monkeypatch.setattr(datasource, "BATCH_ROWS", 50)
    opts = ExportOptions(path=odd_store, include_system_topics=True)
    staging = str(tmp_path / "staging")
    columns = ("topic", "date", "queue_id")
    # A small budget: every partition's file writes a row group whenever the task's gathered
    # batches reach it, and gets several.
    write(opts, staging, partition_by=columns, row_group_bytes=20_000)
    assert max(pq.ParquetFile(f).metadata.num_row_groups for f in parts(staging)) > 1
    rows = []
    for f in parts(staging):
        topic_dir, date_dir, queue_dir = f.parent.relative_to(staging).parts
        table = pq.read_table(f)
        assert not set(columns) & set(table.schema.names)
        for row in table.to_pylist():
            assert date_dir == f"date={row['store_timestamp'].date().isoformat()}"
            topic = urllib.parse.unquote(topic_dir.removeprefix("topic="))
            rows.append(
                {**row, "topic": topic, "queue_id": int(queue_dir.removeprefix("queue_id="))}
            )
    assert by_offset_rows(rows) == by_offset(read_all(opts, export_columns)[0])
    names = {f.parent.relative_to(staging).parts[0] for f in parts(staging)}
    assert "topic=%25RETRY%25g" in names  # '%' escaped as Spark escapes it
    assert "topic=Tópico" in names


def by_offset_rows(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: r["commitlog_offset"])


def test_partition_directory_names_are_escaped_as_spark_escapes_them():
    assert escape_path_name("%RETRY%g") == "%25RETRY%25g"
    assert escape_path_name("a/b:c=d?e") == "a%2Fb%3Ac%3Dd%3Fe"
    assert escape_path_name("x\x01y#z[1]^{}'\"*\\\x7f") == (
        "x%01y%23z%5B1%5D%5E%7B}%27%22%2A%5C%7F"
    )
    assert escape_path_name("Tópico|rocket-mq_1") == "Tópico|rocket-mq_1"
    when = datetime.date(2026, 11, 23)
    assert partition_dir(("topic", "date", "queue_id"), ("a/b", when, 3)) == os.path.join(
        "topic=a%2Fb", "date=2026-11-23", "queue_id=3"
    )
    assert partition_dir(("topic",), ("",)) == "topic=__HIVE_DEFAULT_PARTITION__"


def test_a_failing_task_leaves_no_file(odd_store, tmp_path, monkeypatch):
    monkeypatch.setattr(datasource, "BATCH_ROWS", 10)  # batches written before the bad record
    store = tmp_path / "store"
    shutil.copytree(odd_store, store)
    segment = plan_store(ExportOptions(path=str(store))).segments[1]
    data = bytearray(pathlib.Path(segment.path).read_bytes())
    data[len(data) // 3 : len(data) // 3 + 64] = bytes(64)  # rows before it are written first
    pathlib.Path(segment.path).write_bytes(data)
    opts = ExportOptions(path=str(store), mode=Mode.FAILFAST)
    staging = str(tmp_path / "staging")
    os.mkdir(staging)
    job = WriteTask(opts, staging, RUN, row_group_bytes=5_000)
    flushed = []
    flush = _PartFile.flush

    def counted(part: _PartFile) -> None:
        flush(part)
        flushed.append(os.path.exists(part.tmp))

    monkeypatch.setattr(_PartFile, "flush", counted)
    with pytest.raises(CorruptRecordError):
        list(run_task(job, [segment]))
    assert flushed and all(flushed)  # the task did write a row group, then removed its file
    assert not [p for p in pathlib.Path(staging).rglob("*") if p.is_file()]


@pytest.mark.parametrize("partition_by", [(), ("topic",)])
def test_a_task_of_a_run_already_ended_writes_nothing(odd_store, tmp_path, partition_by):
    """A task that Spark had not stopped when the driver removed a failed run's directory
    fails, and does not bring the directory back with its file in it."""
    segment = plan_store(ExportOptions(path=odd_store)).segments[0]
    staging = tmp_path / "_pymq_temporary-run"
    job = WriteTask(ExportOptions(path=odd_store), str(staging), RUN, partition_by=partition_by)
    with pytest.raises(FileNotFoundError, match="is gone"):
        list(run_task(job, [segment]))
    assert not staging.exists()


class LocalContext:
    """Enough of a SparkContext for write_parquet: every partition run here, in order."""

    def parallelize(self, items: list, slices: int) -> LocalRdd:
        assert slices == len(items)
        return LocalRdd([[item] for item in items])


class LocalRdd:
    def __init__(self, partitions: list[list]) -> None:
        self.partitions = partitions

    def mapPartitions(self, f) -> LocalRdd:
        return LocalRdd([list(f(iter(p))) for p in self.partitions])

    def collect(self) -> list:
        return [item for p in self.partitions for item in p]


def dataset(out: str) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in pathlib.Path(out).rglob("*") if p.is_file())


def test_commit_modes_and_a_failed_run(odd_store, tmp_path, monkeypatch):
    """write_parquet's commit without Spark: error/append add files under a new run id each,
    overwrite replaces everything once written; a run whose second task fails (after the first
    has written its file) leaves the output byte for byte as it was."""
    monkeypatch.setattr(datasource, "BATCH_ROWS", 10)
    opts = ExportOptions(path=odd_store)
    segments = plan_store(opts).segments
    out = str(tmp_path / "out")
    write_parquet(LocalContext(), segments, opts, out, WriteMode.ERROR)
    first = dataset(out)
    run_id = first[-1][len("part-00000-") :][:32]
    names = [f"part-{i:05d}-{run_id}{PART_SUFFIX}" for i in range(len(segments))]
    assert first == ["_SUCCESS", *names]
    write_parquet(LocalContext(), segments[1:], opts, out, WriteMode.APPEND)
    second = dataset(out)
    assert set(first) < set(second) and len(second) == 2 * len(segments)
    pathlib.Path(out, "stray.txt").write_text("left by someone")
    write_parquet(LocalContext(), segments[:1], opts, out, WriteMode.OVERWRITE)
    third = dataset(out)
    assert len(third) == 2 and not set(third) & (set(second) - {"_SUCCESS"})

    store = tmp_path / "store"
    shutil.copytree(odd_store, store)
    bad = plan_store(ExportOptions(path=str(store))).segments[1]
    data = bytearray(pathlib.Path(bad.path).read_bytes())
    data[len(data) // 3 : len(data) // 3 + 64] = bytes(64)
    pathlib.Path(bad.path).write_bytes(data)
    failing = ExportOptions(path=str(store), mode=Mode.FAILFAST)
    contents = {name: pathlib.Path(out, name).read_bytes() for name in third}
    for mode in (WriteMode.OVERWRITE, WriteMode.APPEND):
        with pytest.raises(CorruptRecordError):
            write_parquet(LocalContext(), plan_store(failing).segments, failing, out, mode)
        assert {name: pathlib.Path(out, name).read_bytes() for name in dataset(out)} == contents
    assert not [n for n in os.listdir(out) if n.startswith(STAGING_PREFIX)]


def test_split_by_partition_puts_each_row_under_its_own_values() -> None:
    """Arrow's group_by lists groups in hash order, not sorted order: the rows of each group
    must still be the ones with its values (the slices once followed group_by's order, and
    rows went into another topic's or queue's directory, as this data showed)."""
    from pymq.export.arrow_writer import split_by_partition

    day = datetime.date(2026, 11, 29)
    topics = ["Audit", "Orders", "Orders", "Audit", "Zeta", "Audit", "Orders", "Audit"] * 25
    queues = [1, 0, 2, 3, 0, 1, 0, 3] * 25
    batch = pa.RecordBatch.from_pydict(
        {
            "topic": topics,
            "queue_id": pa.array(queues, pa.int32()),
            "store_timestamp": pa.array(
                [datetime.datetime(2026, 11, 29, 0, 39)] * len(topics), pa.timestamp("ms")
            ),
            "row": list(range(len(topics))),
        }
    )
    seen = []
    for values, rows in split_by_partition(batch, ("topic", "date", "queue_id")):
        topic, date, queue_id = values
        assert date == day
        for i in rows.column("row").to_pylist():
            assert (topics[i], queues[i]) == (topic, queue_id), (values, i)
            seen.append(i)
    assert sorted(seen) == list(range(len(topics)))  # every row once
