#!/usr/bin/env python3
"""Export a pymq / RocketMQ 4.x store's messages to Parquet or JSON with PySpark.

    .venv/bin/python scripts/spark_export.py --store ~/store --output /data/mq \\
        [--format parquet|json] [--topics a,b] [--since T --until T] \\
        [--partition-by topic,date] [--master local[*]] [--incremental]

Times are epoch milliseconds or ISO-8601 (UTC when no zone is given).  Progress and the summary
go to stderr; ``OUTPUT/_pymq_export.json`` records each run, and ``--incremental`` exports only
what the store gained since the last run.  Exit status: 0 done (bad ranges, if any, are listed
in the summary), 1 Spark failed, 2 the export cannot run as asked (the message says why).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import sys
import warnings

from pymq.export.job import FORMATS, PARTITION_COLUMNS, ExportError, JobConfig, run_export
from pymq.export.options import CheckpointBound, OptionError, parse_time_ms


def _csv(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def parse_args(argv: list[str] | None = None) -> JobConfig:
    """The job's config from the command line; argparse exits with status 2 on bad flags."""
    parser = argparse.ArgumentParser(
        prog="spark_export.py",
        description="Export a pymq / RocketMQ 4.x store's messages with PySpark.",
    )
    parser.add_argument("--store", required=True, help="store root (storePathRootDir)")
    parser.add_argument("--output", required=True, help="output directory")
    parser.add_argument("--format", choices=FORMATS, default="parquet")
    parser.add_argument("--topics", type=_csv, help="comma-separated topics (default: all)")
    parser.add_argument("--since", help="store time, inclusive (epoch ms or ISO-8601)")
    parser.add_argument("--until", help="store time, exclusive (epoch ms or ISO-8601)")
    parser.add_argument("--from-offset", type=int, help="commit-log offset, inclusive")
    parser.add_argument("--to-offset", type=int, help="commit-log offset, exclusive")
    parser.add_argument(
        "--include-system-topics",
        action="store_true",
        help="also export SCHEDULE_TOPIC_XXXX, RMQ_SYS_*, %%RETRY%%*, %%DLQ%%* and the like",
    )
    parser.add_argument(
        "--until-checkpoint",
        choices=[b.value for b in CheckpointBound],
        default=CheckpointBound.AUTO.value,
        help="stop at what the broker has flushed (auto: when the store's abort file exists)",
    )
    parser.add_argument(
        "--partition-by",
        type=_csv,
        default=[],
        help=f"comma-separated output partition columns ({', '.join(PARTITION_COLUMNS)})",
    )
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    parser.add_argument(
        "--incremental", action="store_true", help="export only what is new since the last run"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing export")
    parser.add_argument(
        "--failfast", action="store_true", help="fail at the first corrupt record instead"
    )
    parser.add_argument(
        "--spark-writer",
        action="store_true",
        help="write Parquet with Spark's own writer instead of pyarrow in the tasks (slower)",
    )
    args = parser.parse_args(argv)
    if args.incremental and args.overwrite:
        parser.error("--incremental and --overwrite do not go together")
    try:
        since = parse_time_ms("--since", args.since) if args.since else None
        until = parse_time_ms("--until", args.until) if args.until else None
    except OptionError as exc:
        parser.error(str(exc))
    return JobConfig(
        store=args.store,
        output=args.output,
        format=args.format,
        topics=frozenset(args.topics) if args.topics else None,
        since=since,
        until=until,
        from_offset=args.from_offset,
        to_offset=args.to_offset,
        include_system_topics=args.include_system_topics,
        until_checkpoint=CheckpointBound(args.until_checkpoint),
        partition_by=tuple(args.partition_by),
        master=args.master,
        incremental=args.incremental,
        overwrite=args.overwrite,
        failfast=args.failfast,
        spark_writer=args.spark_writer,
    )


def _java_missing() -> bool:
    home = os.environ.get("JAVA_HOME")
    return not (home and os.path.exists(os.path.join(home, "bin", "java"))) and not shutil.which(
        "java"
    )


_OUR_ERROR = re.compile(r"^(?:[\w.]+\.)?(?:CorruptRecordError|StoreError|OptionError): .*")


def spark_error_line(exc: BaseException) -> str:
    """The most telling line of a Spark failure: our own error raised in a Python worker if the
    text carries one, else the first line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    ours = [line for line in lines if _OUR_ERROR.match(line)]
    if ours:
        return ours[-1]
    return lines[0] if lines else type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    if _java_missing():
        print(
            "spark_export: error: Spark needs Java 17 (or 21) and none was found: install it "
            "(Debian/Ubuntu: apt-get install -y openjdk-17-jre-headless) or set JAVA_HOME",
            file=sys.stderr,
        )
        return 2
    try:
        run_export(cfg)
    except ExportError as exc:
        print(f"spark_export: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a Spark failure: the line that says why, not a wall of JVM frames
        print(f"spark_export: Spark failed: {spark_error_line(exc)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
