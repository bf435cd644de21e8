"""Export column-decoder benchmark: the data source's read of a store (scan_batches), no Spark.

Writes ``--mib`` MiB of 1 KiB (``--body``) messages with pymq's record codec into commit-log files
in a temporary directory (four topics, tags, keys and a UNIQ_KEY each, as producers send them),
then times :func:`pymq.export.datasource.scan_batches` over every segment: the column decoder
(``pymq.export._columnsc``, or its twin under PYMQ_PURE_PYTHON=1) for runs of ordinary records,
Arrow batches from its buffers.  Prints the best of ``--repeat`` passes in MB/s and messages/s.

    python scripts/bench_columns.py [--mib 64] [--body 1024] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

from pymq.common.message_ext import MessageExt
from pymq.export.datasource import arrow_schema, scan_batches
from pymq.export.options import ExportOptions
from pymq.export.scan import SegmentScan, plan_store
from pymq.store.commitlog import encode_record

FILE_SIZE = 64 * 1024 * 1024


def write_store(root: str, mib: int, body: int) -> int:
    """Commit-log files holding ``mib`` MiB of records; returns how many."""
    directory = os.path.join(root, "commitlog")
    os.makedirs(directory)
    payload = os.urandom(body)
    offset = count = 0
    data = bytearray()
    while offset + len(data) < mib << 20:
        props = {"TAGS": f"tag{count % 3}", "KEYS": f"order-{count}", "UNIQ_KEY": f"{count:032X}"}
        msg = MessageExt(
            topic=f"Topic{count % 4}", body=payload, properties=props, queue_id=count % 8,
            queue_offset=count // 8, born_timestamp=1_700_000_000_000 + count,
            store_timestamp=1_700_000_000_001 + count, commitlog_offset=offset + len(data),
        )  # fmt: skip
        record = encode_record(msg)
        if len(data) + len(record) + 8 > FILE_SIZE:
            blank = FILE_SIZE - len(data)
            data += blank.to_bytes(4, "big") + (0xCBD43194).to_bytes(4, "big") + bytes(blank - 8)
            with open(os.path.join(directory, f"{offset:020d}"), "wb") as f:
                f.write(data)
            offset += FILE_SIZE
            data = bytearray()
            continue
        data += record
        count += 1
    data += bytes(FILE_SIZE - len(data))
    with open(os.path.join(directory, f"{offset:020d}"), "wb") as f:
        f.write(data)
    return count


def read_all(root: str) -> tuple[int, int]:
    """Every segment read as the data source reads it: (rows, record bytes)."""
    opts = ExportOptions(path=root)
    schema = arrow_schema()
    rows = nbytes = 0
    for segment in plan_store(opts).segments:
        scan = SegmentScan(segment, opts)
        rows += sum(batch.num_rows for batch in scan_batches(scan, schema))
        nbytes += scan.report.record_bytes
    return rows, nbytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--body", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="pymq-bench-columns-")
    try:
        count = write_store(root, args.mib, args.body)
        best = float("inf")
        for _ in range(args.repeat):
            started = time.perf_counter()
            rows, nbytes = read_all(root)
            best = min(best, time.perf_counter() - started)
            assert rows == count, (rows, count)
        print(
            f"{count} messages of {args.body} bytes: best of {args.repeat} "
            f"{nbytes / best / 1e6:,.0f} MB/s, {count / best:,.0f} msgs/s"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
