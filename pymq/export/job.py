"""The export job: a store's messages into Parquet or JSON, with a summary and incremental state.

:func:`run_export` plans the store on the driver first (so a path that is not a store, or bad
options, fail in a second with a clear :class:`ExportError` before any JVM starts), then writes
the dataset.  Parquet is written by the Spark tasks themselves with pyarrow, one per commit-log
file, and committed once all have succeeded (:mod:`pymq.export.arrow_writer`); each task returns
a report of what it read.  JSON (and Parquet with ``spark_writer``) is read through the ``pymq``
data source and written by Spark, each task writing its report into a private temporary
directory.  The job adds the reports up for the summary (messages, bytes, per-topic counts, bad
ranges) and for the state file.

State: ``OUTPUT/_pymq_export.json`` (ignored by Parquet and JSON readers, as its name starts with
``_``) records every run and ``last_offset``, the commit-log offset the next ``incremental`` run
starts from: everything before it was considered (exported, filtered out, or reported bad).  A
torn tail at the end of the newest file is not counted as considered, so a later run reads it
again once the broker has finished writing it.

The report directory must be visible to the driver and the executors alike, as the store must:
this job is meant for ``local[*]`` masters or executors that share the store's filesystem.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import attrs

from pymq.common.files import write_file_atomic
from pymq.export.options import CheckpointBound, ExportOptions, Mode, OptionError
from pymq.export.scan import (
    BadRange,
    SegmentReport,
    StoreError,
    StorePlan,
    plan_store,
    read_reports,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

STATE_FILE = "_pymq_export.json"
STATE_VERSION = 1
FORMATS = ("parquet", "json")
PARTITION_COLUMNS = ("topic", "date", "queue_id")
"""Columns ``--partition-by`` accepts; ``date`` is the UTC date of ``store_timestamp``."""
PROGRESS_INTERVAL_S = 1.0
DISTINCT_COLUMNS = (
    "queue_offset",
    "commitlog_offset",
    "msg_id",
    "unique_key",
    "keys.list.element",
    "born_timestamp",
    "store_timestamp",
    "body",
)
"""Parquet columns whose values (nearly) never repeat: written without a dictionary."""
PARQUET_OPTIONS = {f"parquet.enable.dictionary#{column}": "false" for column in DISTINCT_COLUMNS}
"""Writer options for Parquet output.  parquet-java starts every column chunk with a dictionary
and only falls back to plain encoding once the dictionary passes 1 MiB: for these columns that
is a hash lookup per value for nothing (a 128 MiB row group never fills the dictionary of an
int64 column, so offsets stayed dictionary-encoded), a large share of the write's CPU."""

Echo = Callable[[str], None]


class ExportError(Exception):
    """The export cannot run as asked; the message says why and what to do."""


@attrs.frozen
class JobConfig:
    """One run of the job, as the command line describes it."""

    store: str
    output: str
    format: str = "parquet"
    topics: frozenset[str] | None = None
    since: int | None = None
    until: int | None = None
    from_offset: int | None = None
    to_offset: int | None = None
    include_system_topics: bool = False
    until_checkpoint: CheckpointBound = CheckpointBound.AUTO
    partition_by: tuple[str, ...] = ()
    master: str = "local[*]"
    incremental: bool = False
    overwrite: bool = False
    failfast: bool = False
    spark_writer: bool = False
    """Write Parquet with Spark's own writer (through the data source) instead of pyarrow."""


@attrs.frozen
class ExportSummary:
    """What a run did; also the shape of one entry of the state file's ``runs``."""

    started: str
    seconds: float
    write_seconds: float
    """The Spark read-and-write action alone, without planning and session start."""
    from_offset: int
    last_offset: int
    files: int
    messages: int
    record_bytes: int
    body_bytes: int
    topics: dict[str, int]
    bad_ranges: list[BadRange]
    notes: list[str]

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


# --- state ----------------------------------------------------------------------------------------


def read_state(output: str) -> dict[str, Any] | None:
    """The state file of ``output``, or None when there is none; :class:`ExportError` if bad."""
    path = os.path.join(output, STATE_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ExportError(f"cannot read {path}: {exc}") from exc
    if not isinstance(state, dict) or not isinstance(state.get("last_offset"), int):
        raise ExportError(f"{path} is not a pymq export state file (no last_offset)")
    return state


def write_state(output: str, state: dict[str, Any]) -> None:
    write_file_atomic(os.path.join(output, STATE_FILE), json.dumps(state, indent=2).encode())


def _has_dataset(output: str) -> bool:
    return os.path.isdir(output) and any(
        not n.startswith((".", "_")) or n == "_SUCCESS" for n in os.listdir(output)
    )


# --- the run --------------------------------------------------------------------------------------


def _options(cfg: JobConfig, from_offset: int | None, report_dir: str | None) -> ExportOptions:
    opts = ExportOptions(
        path=cfg.store,
        topics=cfg.topics,
        include_system_topics=cfg.include_system_topics,
        from_time=cfg.since,
        to_time=cfg.until,
        from_offset=from_offset,
        to_offset=cfg.to_offset,
        until_checkpoint=cfg.until_checkpoint,
        mode=Mode.FAILFAST if cfg.failfast else Mode.PERMISSIVE,
        report_dir=report_dir,
    )
    opts.check()
    return opts


def _start_offset(cfg: JobConfig, state: dict[str, Any] | None, plan: StorePlan) -> int | None:
    """fromOffset of this run: the state's last offset when incremental, checked against the
    store; :class:`ExportError` when the store cannot be the one exported before."""
    if not cfg.incremental or state is None:
        return cfg.from_offset
    last = state["last_offset"]
    if state.get("store") and os.path.abspath(state["store"]) != plan.root:
        raise ExportError(
            f"{cfg.output} was exported from {state['store']}, not {plan.root}; "
            "use another output directory, or --overwrite to start again"
        )
    if last > plan.max_offset:
        raise ExportError(
            f"the last export ended at commit-log offset {last} but the store ends at "
            f"{plan.max_offset}: was the store replaced? use --overwrite to start again"
        )
    return max(last, cfg.from_offset or 0)


def run_export(
    cfg: JobConfig, *, spark: SparkSession | None = None, echo: Echo | None = None
) -> ExportSummary:
    """Export as ``cfg`` says and return the summary (also printed through ``echo``).

    With ``spark`` given the job uses that session and leaves it running; otherwise it starts
    one on ``cfg.master`` and stops it.  Raises :class:`ExportError` for a request that cannot
    run (not a store, bad options, output already holding a dataset, a state file from another
    store); errors from Spark itself propagate.
    """
    say = echo or (lambda line: print(line, file=sys.stderr, flush=True))
    started = time.monotonic()
    started_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    if cfg.format not in FORMATS:
        raise ExportError(f"--format must be one of {', '.join(FORMATS)}, not {cfg.format!r}")
    bad_columns = [c for c in cfg.partition_by if c not in PARTITION_COLUMNS]
    if bad_columns:
        raise ExportError(
            f"cannot partition by {', '.join(bad_columns)}: use {', '.join(PARTITION_COLUMNS)}"
        )
    state = read_state(cfg.output) if cfg.incremental or not cfg.overwrite else None
    if _has_dataset(cfg.output) and not cfg.incremental and not cfg.overwrite:
        raise ExportError(
            f"{cfg.output} already holds an export: add --incremental to export only what is new "
            "since, or --overwrite to replace it"
        )
    try:
        plan = plan_store(_options(cfg, cfg.from_offset, None))
        from_offset = _start_offset(cfg, state, plan)
        plan = plan_store(_options(cfg, from_offset, None))
    except (StoreError, OptionError) as exc:
        raise ExportError(str(exc)) from exc
    notes = list(plan.notes)
    if from_offset is not None and from_offset < plan.min_offset:
        notes.append(
            f"commit-log bytes {from_offset}..{plan.min_offset} were deleted from the store "
            "before they could be exported"
        )
    for note in notes:
        say(f"note: {note}")
    scan_bytes = sum(s.end - s.start for s in plan.segments)
    say(
        f"pymq export: {plan.root} -> {cfg.output} ({cfg.format}); {len(plan.segments)} of "
        f"{plan.files} commit-log file(s) to scan, up to {_size(scan_bytes)}"
    )
    first = from_offset if from_offset is not None else plan.min_offset
    reports: list[SegmentReport] = []
    write_seconds = 0.0
    if plan.segments:
        reports, write_seconds = _run_spark(cfg, plan, from_offset, spark, say)
    missing = len(plan.segments) - len(reports)
    if missing:
        notes.append(f"{missing} partition(s) sent no report; the summary leaves them out")
    topics: Counter[str] = Counter()
    for r in reports:
        topics.update(r.topics)
    last = first
    if reports and not missing:
        last = max(first, max(reports, key=lambda r: r.index).resume_offset)
    summary = ExportSummary(
        started=started_at,
        seconds=round(time.monotonic() - started, 3),
        write_seconds=round(write_seconds, 3),
        from_offset=first,
        last_offset=last,
        files=len(plan.segments),
        messages=sum(r.messages for r in reports),
        record_bytes=sum(r.record_bytes for r in reports),
        body_bytes=sum(r.body_bytes for r in reports),
        topics=dict(sorted(topics.items())),
        bad_ranges=[b for r in reports for b in r.bad_ranges],
        notes=notes,
    )
    runs = list(state.get("runs", [])) if state and not cfg.overwrite else []
    runs.append(summary.to_json())
    os.makedirs(cfg.output, exist_ok=True)
    write_state(
        cfg.output,
        {"version": STATE_VERSION, "store": plan.root, "last_offset": last, "runs": runs},
    )
    for line in format_summary(summary):
        say(line)
    return summary


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_summary(s: ExportSummary) -> list[str]:
    """The summary as printed lines."""
    secs = s.write_seconds or float("inf")
    lines = [
        f"exported {s.messages} message(s), {_size(s.record_bytes)} of records "
        f"({_size(s.body_bytes)} of bodies) from {s.files} file(s) in {s.seconds:.1f} s; "
        f"the Spark write took {s.write_seconds:.1f} s ({s.record_bytes / secs / 1e6:.1f} MB/s, "
        f"{s.messages / secs:.0f} msgs/s)",
        f"commit-log offsets {s.from_offset}..{s.last_offset} done; "
        f"the next --incremental run starts at {s.last_offset}",
    ]
    if s.topics:
        width = max(len(t) for t in s.topics)
        lines.append("per topic:")
        lines.extend(f"  {t:<{width}}  {n}" for t, n in s.topics.items())
    if s.bad_ranges:
        lines.append(f"problems: {len(s.bad_ranges)} bad range(s) skipped, valid records kept:")
        lines.extend(f"  {b.describe()}" for b in s.bad_ranges)
    return lines


@contextmanager
def _session(cfg: JobConfig, spark: SparkSession | None) -> Iterator[SparkSession]:
    if spark is not None:
        yield spark
        return
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from pymq.export.spark_daemon import DAEMON_CONFIG

    session = (
        SparkSession.builder.master(cfg.master)
        .appName("pymq-export")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "false")
        .config(map=dict(DAEMON_CONFIG))  # its workers import the installed PySpark
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


def _run_spark(
    cfg: JobConfig, plan: StorePlan, from_offset: int | None, spark: SparkSession | None, say: Echo
) -> tuple[list[SegmentReport], float]:
    """Read and write with Spark: (the tasks' reports, seconds the write action took).

    Parquet is written by the tasks themselves with pyarrow (:mod:`pymq.export.arrow_writer`);
    JSON through the ``pymq`` data source and Spark's writer."""
    from pymq.export.datasource import register

    mode = "append" if cfg.incremental else "overwrite" if cfg.overwrite else "error"
    with _session(cfg, spark) as session:
        register(session)
        if cfg.format == "parquet" and not cfg.spark_writer:
            from pymq.export.arrow_writer import write_parquet

            opts = _options(cfg, from_offset, None)
            started = time.monotonic()
            with _progress(session, len(plan.segments), say):
                reports = write_parquet(
                    session.sparkContext,
                    plan.segments,
                    opts,
                    cfg.output,
                    mode,
                    cfg.partition_by,
                    DISTINCT_COLUMNS,
                )
            return reports, time.monotonic() - started
        return _spark_write(cfg, plan, from_offset, session, mode, say)


def _spark_write(
    cfg: JobConfig,
    plan: StorePlan,
    from_offset: int | None,
    session: SparkSession,
    mode: str,
    say: Echo,
) -> tuple[list[SegmentReport], float]:
    """The data source's DataFrame written by Spark's writer (JSON; Parquet with spark_writer)."""
    from pyspark.sql import functions as F

    from pymq.export.datasource import FORMAT_NAME

    report_dir = tempfile.mkdtemp(prefix="pymq-export-")
    try:
        opts = _options(cfg, from_offset, report_dir)
        df = session.read.format(FORMAT_NAME).options(**opts.to_spark_options()).load()
        if "date" in cfg.partition_by:  # the UTC date, whatever the session's time zone
            days = F.floor(F.unix_millis("store_timestamp") / 86_400_000).cast("int")
            df = df.withColumn("date", F.date_from_unix_date(days))
        writer = df.write.format(cfg.format)
        if cfg.format == "parquet":
            writer = writer.options(**PARQUET_OPTIONS)
        if cfg.partition_by:
            writer = writer.partitionBy(*cfg.partition_by)
        started = time.monotonic()
        with _progress(session, len(plan.segments), say):
            writer.mode(mode).save(cfg.output)
        seconds = time.monotonic() - started
        return read_reports(report_dir), seconds
    finally:
        shutil.rmtree(report_dir, ignore_errors=True)


@contextmanager
def _progress(spark: SparkSession, total: int, say: Echo) -> Iterator[None]:
    """Print ``n/total files`` as Spark's tasks finish, from a daemon thread polling Spark."""
    tracker = spark.sparkContext.statusTracker()
    done = threading.Event()

    def poll() -> None:
        shown = -1
        while not done.wait(PROGRESS_INTERVAL_S):
            finished = 0
            try:
                for stage in tracker.getActiveStageIds():
                    info = tracker.getStageInfo(stage)
                    if info is not None:
                        finished = max(finished, info.numCompletedTasks)
            except Exception:  # the session is going away: stop reporting
                return
            if finished > shown:  # stages come and go: only ever count up
                shown = finished
                say(f"progress: {finished}/{total} commit-log file(s) done")

    thread = threading.Thread(target=poll, name="pymq-export-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
