#!/usr/bin/env python3
"""Benchmark the Spark export against a plain Python loop over the same commit-log files.

    .venv/bin/python scripts/bench_export.py [--size-mib 1024] [--body 1024] [--master local[2]]
    .venv/bin/python scripts/bench_export.py --store ~/store      # an existing store, kept

Without ``--store`` a store of ``--size-mib`` MiB of commit log is written into a temporary
directory with pymq's own CommitLog (``--file-mib`` files, default 128 MiB, four topics,
incompressible bodies) and deleted afterwards, as is the Parquet output.  Figures: commit-log
MB/s scanned (10^6 bytes) and messages/s for (1) a plain loop running
:class:`pymq.export.scan.SegmentScan` over every file in this one process (decode with CRC
check, no Spark), and (2) ``run_export`` to Parquet on the given master (the tasks writing
with pyarrow; ``--spark-writer``: Spark's own writer), timed for the Spark write action alone,
after a read-only counting pass through the data source; ``--runs N`` exports N times in the
one session (the first run starts the export's Python workers, later ones find them warm).  On
Linux the Spark figures also give the CPU time of the JVM and its Python workers (this
process's descendants), which a machine busy with other work moves much less than wall time:
MB per CPU-second times the master's cores bounds what the export can do with them to itself.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import warnings
from typing import TYPE_CHECKING

from pymq.common.message_ext import MessageExt, encode_properties
from pymq.export.job import JobConfig, run_export
from pymq.export.options import ExportOptions
from pymq.export.scan import SegmentScan, plan_store
from pymq.store.commitlog import CommitLog

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TOPICS = ("BenchOrders", "BenchPayments", "BenchAudit", "BenchClicks")
BATCH = 64


def generate(root: str, size_mib: int, body_size: int, file_mib: int) -> tuple[int, int]:
    """Write about ``size_mib`` MiB of commit log under ``root``; (messages, bytes written)."""
    log = CommitLog(os.path.join(root, "commitlog"), file_mib << 20)
    log.load()
    pool = os.urandom(16 << 20)  # incompressible, and too big for Parquet pages to dedupe
    target = size_mib << 20
    count = 0
    born = int(time.time() * 1000)
    try:
        while log.max_offset < target:
            msgs, encoded = [], []
            for i in range(BATCH):
                n = count + i
                props = {"TAGS": f"tag{n % 8}", "KEYS": f"k{n}", "UNIQ_KEY": f"{n:032X}"}
                start = (n * (body_size + 61)) % (len(pool) - body_size)
                msgs.append(
                    MessageExt(
                        topic=TOPICS[n % len(TOPICS)],
                        body=pool[start : start + body_size],
                        properties=props,
                        queue_id=n % 4,
                        born_timestamp=born,
                        born_host=("127.0.0.1", 50000),
                    )
                )
                encoded.append((msgs[-1].topic.encode(), encode_properties(props).encode()))
            result = log.append_stored(msgs, encoded)
            if result.status.name != "PUT_OK":
                raise RuntimeError(f"cannot write the benchmark store: {result}")
            count += BATCH
        for mf in log.queue.files:
            mf.sync()
        return count, log.max_offset
    finally:
        log.close()


def plain_loop(store: str) -> tuple[int, int, float]:
    """(messages, commit-log bytes, seconds) for decoding every file in this process."""
    opts = ExportOptions(path=store)
    started = time.perf_counter()
    plan = plan_store(opts)
    messages = scanned = 0
    for segment in plan.segments:
        scan = SegmentScan(segment, opts)
        for _msg in scan:
            messages += 1
        scanned += scan.report.resume_offset - segment.start
    return messages, scanned, time.perf_counter() - started


def descendants_cpu() -> float | None:
    """CPU seconds (user + system, reaped children included) of every process below this one,
    from /proc; None where there is no /proc."""
    if not os.path.isdir("/proc/self"):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[tuple[int, float]]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        cpu = sum(int(x) for x in fields[11:15]) / tick  # utime, stime, cutime, cstime
        children.setdefault(int(fields[1]), []).append((int(name), cpu))
    total, stack = 0.0, [os.getpid()]
    while stack:
        for pid, cpu in children.get(stack.pop(), []):
            total += cpu
            stack.append(pid)
    return total


def _cpu_note(before: float | None, scanned: int) -> str:
    after = descendants_cpu()
    if before is None or after is None or after <= before:
        return ""
    used = after - before
    return f"; CPU (JVM + Python workers) {used:.1f} s = {scanned / used / 1e6:.1f} MB per CPU-s"


def start_session(master: str) -> SparkSession:
    from pyspark.sql import SparkSession

    from pymq.export.datasource import register
    from pymq.export.spark_daemon import DAEMON_CONFIG

    session = (
        SparkSession.builder.master(master)
        .appName("pymq-bench-export")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config(map=dict(DAEMON_CONFIG))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    return session


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", help="an existing store to read (not deleted)")
    parser.add_argument("--size-mib", type=int, default=1024, help="store size to generate")
    parser.add_argument(
        "--file-mib", type=int, default=128, help="commit-log file size (one partition each)"
    )
    parser.add_argument("--body", type=int, default=1024, help="body bytes per message")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument(
        "--spark-writer", action="store_true", help="export with Spark's own Parquet writer"
    )
    parser.add_argument(
        "--runs", type=int, default=1, help="exports in the one session (the first is cold)"
    )
    parser.add_argument("--workdir", default=None, help="where to generate (default: /tmp)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    workdir = tempfile.mkdtemp(prefix="pymq-bench-export-", dir=args.workdir)
    try:
        store = args.store
        if store is None:
            store = os.path.join(workdir, "store")
            t = time.perf_counter()
            count, size = generate(store, args.size_mib, args.body, args.file_mib)
            print(
                f"generated {count} messages, {size / 2**20:.0f} MiB of commit log "
                f"in {time.perf_counter() - t:.1f} s",
                flush=True,
            )
        messages, scanned, plain_secs = plain_loop(store)
        print(
            f"plain Python loop (1 process): {messages} msgs, {scanned / 1e6:.0f} MB in "
            f"{plain_secs:.1f} s = {scanned / plain_secs / 1e6:.1f} MB/s, "
            f"{messages / plain_secs:.0f} msgs/s",
            flush=True,
        )
        out = os.path.join(workdir, "out")
        t = time.perf_counter()
        spark = start_session(args.master)
        print(f"Spark session started in {time.perf_counter() - t:.1f} s", flush=True)
        t = time.perf_counter()
        cpu = descendants_cpu()
        rows = spark.read.format("pymq").option("path", store).load().count()
        secs = time.perf_counter() - t
        print(
            f"Spark read-only pass (count, cold Python workers): {rows} msgs in {secs:.1f} s "
            f"= {scanned / secs / 1e6:.1f} MB/s, {rows / secs:.0f} msgs/s"
            f"{_cpu_note(cpu, scanned)}",
            flush=True,
        )
        cfg = JobConfig(store=store, output=out, master=args.master, spark_writer=args.spark_writer)
        writer = "Spark's writer" if args.spark_writer else "pyarrow in the tasks"
        try:
            for run in range(1, args.runs + 1):
                shutil.rmtree(out, ignore_errors=True)
                cpu = descendants_cpu()
                summary = run_export(cfg, spark=spark, echo=lambda line: None)
                cpu_note = _cpu_note(cpu, scanned)
                assert summary.messages == messages, (summary.messages, messages)
                w = summary.write_seconds
                print(
                    f"Spark export to Parquet ({args.master}, {writer}, run {run}): "
                    f"{summary.messages} msgs in {w:.1f} s = {scanned / w / 1e6:.1f} MB/s "
                    f"= {scanned / w / (scanned / plain_secs):.2f}x the plain loop, "
                    f"{summary.messages / w:.0f} msgs/s "
                    f"(with planning and summary {summary.seconds:.1f} s){cpu_note}",
                    flush=True,
                )
        finally:
            spark.stop()
        print(f"Parquet output: {_du(out) / 2**20:.0f} MiB", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _du(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


if __name__ == "__main__":
    sys.exit(main())
