"""Parquet output written by the export's Spark tasks themselves, with pyarrow.

Spark's own Parquet writer takes rows: the Arrow batches the data source makes would be turned
into rows in the JVM and written by parquet-java one value at a time, most of the export's CPU.
For Parquet, :func:`write_parquet` has Spark run one task per
:class:`~pymq.export.scan.Segment` (commit-log file) that scans it into the same Arrow batches
(:func:`pymq.export.datasource.scan_batches`) and writes them with ``pyarrow.parquet`` (C++), so
no row ever reaches the JVM.  Spark still schedules, retries and reports the tasks.

The files are what Spark's writer makes and reads back as the data source's DataFrame: snappy,
``part-NNNNN-<run id>-c000.snappy.parquet``, timestamps as UTC microseconds (Spark's
TimestampType), no dictionary for the columns in :data:`pymq.export.job.DISTINCT_COLUMNS`,
row groups of about :data:`ROW_GROUP_BYTES`, and for ``partition_by`` Hive-style
``column=value/`` directories with Spark's escaping, the partition columns left out of the files.

Commit: every task writes into ``OUTPUT/_pymq_temporary-<run id>/`` (a reader skips names
starting with ``_``), each file under a name of its own attempt first, renamed when complete.
Only when every task has succeeded does the driver move the files into ``OUTPUT`` (after
removing the old dataset, for ``overwrite``) and write ``_SUCCESS``; when a task fails the
temporary directory is removed and ``OUTPUT`` is left as it was.  Tasks never create that
directory (only the partition directories below it), and its removal is tried again while it
is still there, so a task Spark has not stopped yet when the run fails leaves no file behind
unless it keeps the directory busy past the retries (then logged).  As with Spark's own
committer, the output must be on a filesystem the driver and the executors share.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import attrs

from pymq.export.options import ExportOptions
from pymq.export.scan import Segment, SegmentReport, SegmentScan

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark import SparkContext

log = logging.getLogger(__name__)

ROW_GROUP_BYTES = 128 << 20
"""Batches are gathered into row groups of about this size (parquet-java's default block)."""
SUCCESS_FILE = "_SUCCESS"
STAGING_PREFIX = "_pymq_temporary-"
PART_SUFFIX = "-c000.snappy.parquet"
STAGING_REMOVE_TRIES = 20
"""Tries (STAGING_REMOVE_PAUSE apart) at removing a failed run's temporary directory: a task of
the run that Spark has not stopped yet may add a file while it is being removed."""
STAGING_REMOVE_PAUSE = 0.05
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
"""Spark's directory name for a null (or empty string) partition value."""
_ESCAPED = frozenset([*map(chr, range(1, 0x20)), *"\"#%'*/:=?\\\x7f{[]^"])
"""Characters Spark's ``escapePathName`` writes as ``%XX`` in a partition directory name."""


class Mode:
    """How :func:`write_parquet` treats what the output already holds."""

    ERROR = "error"
    """The caller has checked that the output holds no dataset: files are added."""
    APPEND = "append"
    OVERWRITE = "overwrite"
    """Everything in the output is replaced, once the new files are all written."""


def escape_path_name(value: str) -> str:
    """A partition value as Spark writes it in a directory name (``%XX`` for special chars)."""
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in value)


def partition_dir(columns: tuple[str, ...], values: tuple[object, ...]) -> str:
    """``col=value/...`` for one combination of partition values, as Spark names it."""
    parts = []
    for column, value in zip(columns, values, strict=True):
        text = "" if value is None else str(value)  # dates print as yyyy-mm-dd, as Spark's do
        parts.append(f"{column}={escape_path_name(text) if text else HIVE_NULL}")
    return os.path.join(*parts)


@attrs.frozen
class WriteTask:
    """What every task of one run needs (pickled to the executors)."""

    options: ExportOptions
    staging: str
    run_id: str
    partition_by: tuple[str, ...] = ()
    distinct_columns: tuple[str, ...] = ()
    """Columns written without a dictionary (Parquet paths, e.g. ``keys.list.element``)."""
    row_group_bytes: int = ROW_GROUP_BYTES

    def part_name(self, segment: Segment) -> str:
        return f"part-{segment.index:05d}-{self.run_id}{PART_SUFFIX}"


class _PartFile:
    """One output file of a task: batches gathered into row groups, written under a name of
    this attempt's own and renamed to the final name by :meth:`close`."""

    def __init__(self, path: str, schema: pa.Schema, task: WriteTask, attempt: int) -> None:
        self.path = path
        self.tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{attempt}.tmp")
        self.schema = schema
        self.task = task
        self.pending: list[pa.RecordBatch] = []
        self.writer: Any = None

    def add(self, batch: pa.RecordBatch) -> int:
        """Gather ``batch``; returns its size in bytes."""
        self.pending.append(batch)
        size: int = batch.nbytes
        return size

    def flush(self) -> None:
        """Write what was gathered as one row group."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self.writer is None:
            make_dirs_below(self.task.staging, os.path.dirname(self.path))
            distinct = set(self.task.distinct_columns)
            self.writer = pq.ParquetWriter(
                self.tmp,
                self.schema,
                compression="snappy",
                use_dictionary=[c for c in _leaf_paths(self.schema) if c not in distinct],
            )
        if self.pending:
            table = pa.Table.from_batches(self.pending, self.schema)
            self.writer.write_table(table, row_group_size=max(1, table.num_rows))
        self.pending = []

    def close(self) -> None:
        self.flush()
        self.writer.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if os.path.exists(self.tmp):
            os.remove(self.tmp)


def make_dirs_below(root: str, directory: str) -> None:
    """Create ``directory`` and its parents below ``root`` (the run's temporary directory),
    never ``root`` itself: a task that Spark has not stopped yet when the driver removes a
    failed run's directory must not bring it back with its file in it.  Raises
    FileNotFoundError when ``root`` is gone."""
    if not os.path.isdir(root):
        raise FileNotFoundError(
            f"the export's temporary directory {root} is gone (its run ended without this task)"
            " or not visible here (the output must be on a filesystem the driver and the"
            " executors share)"
        )
    path = root
    relative = os.path.relpath(directory, root)
    if relative == os.curdir:
        return
    if relative == os.pardir or relative.startswith(os.pardir + os.sep):
        raise ValueError(f"{directory} is not below {root}")
    for part in relative.split(os.sep):
        path = os.path.join(path, part)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path)


def _leaf_paths(schema: pa.Schema) -> list[str]:
    """Parquet column paths of ``schema`` as pyarrow names them for ``use_dictionary``."""
    import pyarrow as pa

    def walk(prefix: str, typ: pa.DataType) -> Iterator[str]:
        if pa.types.is_map(typ):
            yield f"{prefix}.key_value.key"
            yield f"{prefix}.key_value.value"
        elif pa.types.is_list(typ):
            yield from walk(f"{prefix}.list.element", typ.value_type)
        elif pa.types.is_struct(typ):
            for field in typ:
                yield from walk(f"{prefix}.{field.name}", field.type)
        else:
            yield prefix

    return [path for field in schema for path in walk(field.name, field.type)]


def _partition_values(batch: pa.RecordBatch, column: str) -> pa.Array:
    import pyarrow as pa
    import pyarrow.compute as pc

    if column == "date":  # the UTC date of the store time, as the Spark path computes it
        return pc.cast(batch.column("store_timestamp"), pa.date32())
    return batch.column(column)


def split_by_partition(
    batch: pa.RecordBatch, columns: tuple[str, ...]
) -> Iterator[tuple[tuple[object, ...], pa.RecordBatch]]:
    """(partition values, the rows that have them without the partition columns) per distinct
    combination in ``batch``; rows keep their order within a combination."""
    import pyarrow as pa
    import pyarrow.compute as pc

    data = batch.select([n for n in batch.schema.names if n not in columns])
    keys = pa.table({c: _partition_values(batch, c) for c in columns})
    if all(pc.count_distinct(keys.column(c)).as_py() <= 1 for c in columns):
        if batch.num_rows:
            yield tuple(keys.column(c)[0].as_py() for c in columns), data
        return
    order = pc.sort_indices(keys, sort_keys=[(c, "ascending") for c in columns])  # stable
    keys, data = keys.take(order), data.take(order)
    # group_by gives its groups in hash order, not in the order the rows were sorted in:
    # sorted the same way, each group's count is the length of its run of sorted rows.
    groups = (
        keys.group_by(list(columns), use_threads=False)
        .aggregate([([], "count_all")])
        .sort_by([(c, "ascending") for c in columns])
    )
    start = 0
    for row in groups.to_pylist():
        count = row["count_all"]
        yield tuple(row[c] for c in columns), data.slice(start, count)
        start += count


def run_task(task: WriteTask, segments: Iterable[Segment]) -> Iterator[dict[str, object]]:
    """The body of one Spark task: each segment scanned and written; yields its report."""
    from pyspark import TaskContext

    from pymq.export.datasource import arrow_schema, scan_batches

    context = TaskContext.get()
    attempt = context.attemptNumber() if context is not None else 0
    schema = arrow_schema()
    for segment in segments:
        scan = SegmentScan(segment, task.options)
        files = _TaskFiles(task, segment, schema, attempt)
        try:
            for batch in scan_batches(scan, schema):
                files.add(batch)
            files.close()
        except BaseException:
            files.abort()
            raise
        yield scan.report.to_json()


class _TaskFiles:
    """The files one segment's rows go to (one, or one per partition), and the memory they
    hold: once the gathered batches of all of them reach ``row_group_bytes`` each writes its
    own as a row group, so that a task holds about that much whatever the partitions."""

    def __init__(self, task: WriteTask, segment: Segment, schema: pa.Schema, attempt: int):
        self.task = task
        self.name = task.part_name(segment)
        self.attempt = attempt
        self.schema = pa_schema_without(schema, task.partition_by)
        self.files: dict[tuple[object, ...], _PartFile] = {}
        self.pending_bytes = 0

    def add(self, batch: pa.RecordBatch) -> None:
        task = self.task
        if task.partition_by:
            parts: Iterable[tuple[tuple[object, ...], pa.RecordBatch]]
            parts = split_by_partition(batch, task.partition_by)
        else:
            parts = [((), batch)]
        for values, rows in parts:
            part = self.files.get(values)
            if part is None:
                directory = task.staging
                if values:
                    directory = os.path.join(directory, partition_dir(task.partition_by, values))
                path = os.path.join(directory, self.name)
                part = self.files[values] = _PartFile(path, self.schema, task, self.attempt)
            self.pending_bytes += part.add(rows)
        if self.pending_bytes >= task.row_group_bytes:
            for part in self.files.values():
                if part.pending:
                    part.flush()
            self.pending_bytes = 0

    def close(self) -> None:
        for part in self.files.values():
            part.close()

    def abort(self) -> None:
        for part in self.files.values():
            part.abort()


def pa_schema_without(schema: pa.Schema, columns: tuple[str, ...]) -> pa.Schema:
    """``schema`` without the named fields (the partition columns; ``date`` is not in it)."""

    for column in columns:
        index = schema.get_field_index(column)
        if index >= 0:
            schema = schema.remove(index)
    return schema


def write_parquet(
    sc: SparkContext,
    segments: list[Segment],
    options: ExportOptions,
    output: str,
    mode: str,
    partition_by: tuple[str, ...] = (),
    distinct_columns: tuple[str, ...] = (),
) -> list[SegmentReport]:
    """Write ``segments`` under ``output`` as Parquet, one Spark task per segment, and commit;
    returns the tasks' reports by segment index.  A failed task fails the call (Spark's error
    propagates) and leaves ``output`` as it was."""
    run_id = uuid.uuid4().hex
    output = os.path.abspath(output)  # the executors' working directory is not the driver's
    os.makedirs(output, exist_ok=True)
    staging = os.path.join(output, f"{STAGING_PREFIX}{run_id}")
    os.makedirs(staging)
    task = WriteTask(options, staging, run_id, partition_by, distinct_columns)
    try:
        results = (
            sc.parallelize(segments, len(segments))
            .mapPartitions(functools.partial(run_task, task))
            .collect()
        )
        reports = sorted((SegmentReport.from_json(r) for r in results), key=lambda r: r.index)
        parts = _staged_files(staging)
        if not parts and not partition_by and mode != Mode.APPEND:
            _write_empty(os.path.join(staging, f"part-00000-{run_id}{PART_SUFFIX}"), task)
            parts = _staged_files(staging)
        _commit(output, staging, parts, mode)
        return reports
    finally:
        remove_staging(staging)


def remove_staging(staging: str) -> None:
    """Remove a run's temporary directory, trying again while it is still there: after a
    failed run Spark may not have stopped every task yet, and one that adds a file while
    ``rmtree`` runs leaves the directory behind.  Once it is gone no task can bring it back
    (:func:`make_dirs_below`)."""
    for attempt in range(STAGING_REMOVE_TRIES):
        shutil.rmtree(staging, ignore_errors=True)
        if not os.path.lexists(staging):
            return
        if attempt + 1 < STAGING_REMOVE_TRIES:
            time.sleep(STAGING_REMOVE_PAUSE)
    log.warning("could not remove the export's temporary directory %s", staging)


def _staged_files(staging: str) -> list[str]:
    """Paths (relative to ``staging``) of the complete part files a run's tasks left."""
    found = []
    for directory, _dirs, names in os.walk(staging):
        for name in names:
            if name.startswith("part-") and name.endswith(PART_SUFFIX):
                found.append(os.path.relpath(os.path.join(directory, name), staging))
    return sorted(found)


def _write_empty(path: str, task: WriteTask) -> None:
    """A file with the schema and no rows, so that an export of nothing reads back."""
    from pymq.export.datasource import arrow_schema

    part = _PartFile(path, arrow_schema(), task, 0)
    part.close()


def _commit(output: str, staging: str, parts: list[str], mode: str) -> None:
    if mode == Mode.OVERWRITE:
        for name in os.listdir(output):
            if os.path.join(output, name) == staging:
                continue
            path = os.path.join(output, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
    for rel in parts:
        target = os.path.join(output, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.replace(os.path.join(staging, rel), target)
    with open(os.path.join(output, SUCCESS_FILE), "wb"):
        pass
