"""Reput dispatch benchmark: consume-queue and index dispatch of a backlog, on this machine.

Puts ``--count`` messages of ``--body`` bytes (eight queues, tags, keys and a UNIQ_KEY each) into
a store in a temporary directory with dispatch held back, then times the reput's dispatch of
the whole backlog (``do_reput``): once with the put path's dispatch hints (``dispatch_hinted``,
C or its twin under PYMQ_PURE_PYTHON=1), once with the hints dropped (a slave's or recovery's
records: hints read back by ``record_hints``, then ``dispatch_hinted``).  Prints the best of
``--repeat`` runs of each in records/s.

    python scripts/bench_dispatch.py [--count 100000] [--body 256] [--repeat 3]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time

import trio

from pymq.common.message_ext import MessageExt
from pymq.store import DefaultMessageStore, MessageStoreConfig, PutMessageStatus


async def dispatch_once(root: str, count: int, body: int, hinted: bool) -> float:
    """Seconds the reput takes for a backlog of ``count`` records."""
    config = MessageStoreConfig(store_path_root_dir=root, mapped_file_size_commit_log=1 << 28)
    store = DefaultMessageStore(config)
    payload = b"x" * body
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        store.reput.woken = True  # the puts leave their records to the timed dispatch below
        for i in range(count):
            msg = MessageExt(
                topic="BenchTopic", body=payload, queue_id=i % 8,
                properties={"TAGS": f"t{i % 4}", "KEYS": f"order-{i}", "UNIQ_KEY": f"{i:032X}"},
            )  # fmt: skip
            result = await store.put(msg)
            assert result.status is PutMessageStatus.PUT_OK, result
        if not hinted:
            store.commitlog.dispatch_hints.clear()
        started = time.perf_counter()
        await store.reput.do_reput()
        elapsed = time.perf_counter() - started
        store.reput.woken = False
        assert sum(cq.max_offset_in_queue for cq in store.consume_queues) == count
        nursery.cancel_scope.cancel()
    return elapsed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--body", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for hinted, label in ((True, "hinted (put path's hints)"), (False, "hints read back")):
        best = float("inf")
        for _ in range(args.repeat):
            root = tempfile.mkdtemp(prefix="pymq-bench-dispatch-")
            try:
                best = min(best, await dispatch_once(root, args.count, args.body, hinted))
            finally:
                shutil.rmtree(root, ignore_errors=True)
        print(f"dispatch, {label}: {args.count / best:,.0f} records/s (best of {args.repeat})")


if __name__ == "__main__":
    trio.run(main)
