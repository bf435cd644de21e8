"""The ``pymq`` Spark data source: a store's messages as a DataFrame (Python DataSource API).

    from pymq.export.datasource import register
    register(spark)
    df = spark.read.format("pymq").option("path", "/data/store").load()

One input partition per commit-log file (a record never spans two files).  Planning
(:meth:`PymqReader.partitions`) runs :func:`pymq.export.scan.plan_store` in Spark's planning
worker; each task runs a :class:`pymq.export.scan.SegmentScan` and hands Spark Arrow record
batches, so no row goes through Spark's per-row Python conversion.  Runs of ordinary records are
decoded by the C extension straight into Arrow buffers (:mod:`pymq.export.columns`); other
records, and all of them without the extension, as :class:`MessageExt` rows.  Options are listed in
:mod:`pymq.export.options`.  Errors: a path that is not a store or a bad option fails the query at
planning with the :class:`~pymq.export.scan.StoreError` / :class:`~pymq.export.options.OptionError`
message; corrupt bytes are skipped and reported (logged by the task, and written to
``reportDir`` when given) unless ``mode=failfast``.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pymq.common.message_ext import MessageExt
from pymq.common.message_id import create_offset_msg_id
from pymq.export.columns import export_columns, format_host
from pymq.export.options import ExportOptions
from pymq.export.scan import Segment, SegmentScan, plan_store

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

FORMAT_NAME = "pymq"
BATCH_ROWS = 8192
"""Rows per Arrow batch handed to Spark..."""
BATCH_BYTES = 32 << 20
"""...or fewer, once the bodies in a batch pass this many bytes."""

SCHEMA = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("queue_id", IntegerType(), False),
        StructField("queue_offset", LongType(), False),
        StructField("commitlog_offset", LongType(), False),
        StructField("msg_id", StringType(), False),
        StructField("unique_key", StringType(), True),
        StructField("tags", StringType(), True),
        StructField("keys", ArrayType(StringType(), False), False),
        StructField("flag", IntegerType(), False),
        StructField("born_timestamp", TimestampType(), False),
        StructField("born_host", StringType(), False),
        StructField("store_timestamp", TimestampType(), False),
        StructField("store_host", StringType(), False),
        StructField("reconsume_times", IntegerType(), False),
        StructField("sys_flag", IntegerType(), False),
        StructField("properties", MapType(StringType(), StringType(), False), False),
        StructField("body", BinaryType(), False),
    ]
)
"""One row per message; hosts are ``ip:port``, timestamps the broker's milliseconds."""


class _MsgIds:
    """Offset message ids by store host prefix: :func:`create_offset_msg_id` once per host."""

    def __init__(self) -> None:
        self._prefixes: dict[tuple[str, int], str] = {}

    def __call__(self, m: MessageExt) -> str:
        prefix = self._prefixes.get(m.store_host)
        if prefix is None:
            prefix = create_offset_msg_id(m.store_host[0], m.store_host[1], 0)[:-16]
            self._prefixes[m.store_host] = prefix
        return f"{prefix}{m.commitlog_offset:016X}"


def to_record_batch(
    msgs: list[MessageExt], arrow_schema: pa.Schema, msg_id: Callable[[MessageExt], str]
) -> pa.RecordBatch:
    """Messages as one Arrow batch of :data:`SCHEMA` (``arrow_schema`` is its Arrow form)."""
    import pyarrow as pa

    columns = [
        [m.topic for m in msgs],
        [m.queue_id for m in msgs],
        [m.queue_offset for m in msgs],
        [m.commitlog_offset for m in msgs],
        [msg_id(m) for m in msgs],
        [m.unique_key for m in msgs],
        [m.tags for m in msgs],
        [m.keys for m in msgs],
        [m.flag for m in msgs],
        [m.born_timestamp * 1000 for m in msgs],
        [format_host(m.born_host) for m in msgs],
        [m.store_timestamp * 1000 for m in msgs],
        [format_host(m.store_host) for m in msgs],
        [m.reconsume_times for m in msgs],
        [m.sys_flag for m in msgs],
        [list(m.properties.items()) for m in msgs],
        [m.body for m in msgs],
    ]
    arrays = [
        pa.array(col, type=field.type) for col, field in zip(columns, arrow_schema, strict=True)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)


class SegmentPartition(InputPartition):
    """The input partition of one commit-log file: carries its :class:`Segment`."""

    def __init__(self, segment: Segment) -> None:
        super().__init__(segment.index)
        self.segment = segment


class PymqReader(DataSourceReader):
    """Plans one partition per commit-log file and reads each into Arrow batches."""

    def __init__(self, options: ExportOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        return [SegmentPartition(s) for s in plan_store(self.options).segments]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, SegmentPartition):  # planning found no file at all
            return
        scan = SegmentScan(partition.segment, self.options)
        yield from scan_batches(scan, arrow_schema())
        if self.options.report_dir:
            scan.report.write(self.options.report_dir)


def arrow_schema() -> pa.Schema:
    """:data:`SCHEMA` as Arrow has it (timestamps in microseconds, UTC)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(SCHEMA, timezone="UTC")


def scan_batches(scan: SegmentScan, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The scan's rows as Arrow batches of ``schema`` (:func:`arrow_schema`); ``scan.report`` is
    final once they are all taken.  Used by the data source's tasks and by the job's own
    Parquet writer (:mod:`pymq.export.parquet`)."""
    msg_id = _MsgIds()
    # A batch holds thousands of small acyclic objects that reference counting frees; the
    # cyclic collector would walk them over and over, a large share of the time.  This
    # worker runs nothing else while the partition is read, and the collector comes back on
    # at the end.
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield from scan.arrow_batches(
            schema,
            lambda msgs: to_record_batch(msgs, schema, msg_id),
            BATCH_ROWS,
            BATCH_BYTES,
            export_columns,
        )
    finally:
        if collecting:
            gc.enable()


class PymqDataSource(DataSource):
    """``spark.read.format("pymq")``: a RocketMQ 4.x / pymq store directory, read-only."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.export_options = ExportOptions.from_options(dict(options))

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return PymqReader(self.export_options)


def register(spark: SparkSession) -> None:
    """Make ``format("pymq")`` available in ``spark``."""
    spark.dataSource.register(PymqDataSource)
