"""Store benchmark: put, get and recovery throughput of DefaultMessageStore on this machine.

Prints msgs/s and MB/s for 1 KiB messages: ASYNC_FLUSH and SYNC_FLUSH puts (single and batch),
reput dispatch, get (pull) reads, and abnormal recovery (re-dispatch skipping what the consume
queues already hold, and a full rebuild with consume queues and checkpoint deleted).  Everything
runs in a temporary directory that is removed afterwards.

    python scripts/bench_store.py [--count N] [--file-size BYTES] [--body BYTES] [--rounds N]
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import shutil
import statistics
import tempfile
import time

import trio

from pymq.common.message_ext import MessageExt
from pymq.common.message_id import UniqueIdGenerator
from pymq.store import DefaultMessageStore, FlushDiskType, MessageStoreConfig, PutMessageStatus

TOPIC = "BenchTopic"
QUEUES = 8
SYNC_PRODUCERS = 64
"""Concurrent producers for the SYNC_FLUSH runs: group commit needs company to batch."""
BATCH = 32


def make_config(root: str, file_size: int, flush: FlushDiskType) -> MessageStoreConfig:
    return MessageStoreConfig(
        store_path_root_dir=root,
        mapped_file_size_commit_log=file_size,
        flush_disk_type=flush,
    )


def messages(count: int, body_size: int) -> list[MessageExt]:
    ids = UniqueIdGenerator("10.0.0.1")
    body = os.urandom(body_size)
    return [
        MessageExt(
            topic=TOPIC,
            body=body,
            queue_id=i % QUEUES,
            properties={
                "KEYS": f"order-{i}",
                "TAGS": "TagA",
                "UNIQ_KEY": ids.create(),
                "WAIT": "true",
            },
            born_timestamp=1_700_000_000_000,
            born_host=("10.0.0.1", 50000),
        )
        for i in range(count)
    ]


class Timer:
    """Wall and CPU time of a block: on a shared VM the CPU figure is the steadier one."""

    def __enter__(self) -> Timer:
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall0
        self.cpu = time.process_time() - self.cpu0


def report(label: str, n: int, nbytes: int, t: Timer) -> None:
    print(
        f"{label:<44} {n / t.wall:>10,.0f} msgs/s {nbytes / t.wall / 1e6:>7.1f} MB/s"
        f"  | per CPU-second {n / t.cpu:>10,.0f} msgs/s {nbytes / t.cpu / 1e6:>7.1f} MB/s"
        f"  ({n} msgs, {t.wall:.2f} s)"
    )


async def bench_puts(
    root: str, args: argparse.Namespace, flush: FlushDiskType, batch: bool, count: int
) -> float:
    """Time the puts of ``count`` messages into a new store at ``root``; returns msgs/s."""
    store = DefaultMessageStore(make_config(root, args.file_size, flush))
    msgs = messages(count, args.body)
    # The benchmark's own messages are not the store's: keep the collector from walking them
    # over and over while the store's puts run (a broker holds no such list).
    gc.collect()
    gc.freeze()
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        start_offset = store.max_phy_offset
        timer = Timer().__enter__()
        if flush is FlushDiskType.ASYNC_FLUSH:
            if batch:
                for q in range(QUEUES):
                    mine = [m for m in msgs if m.queue_id == q]
                    for i in range(0, len(mine), BATCH):
                        r = await store.put(mine[i : i + BATCH])
                        assert r.status is PutMessageStatus.PUT_OK, r
            else:
                for m in msgs:
                    r = await store.put(m)
                    assert r.status is PutMessageStatus.PUT_OK, r
        else:
            chunks = [msgs[i::SYNC_PRODUCERS] for i in range(SYNC_PRODUCERS)]

            async def producer(mine: list[MessageExt]) -> None:
                if batch:
                    for q in range(QUEUES):
                        of_q = [m for m in mine if m.queue_id == q]
                        for i in range(0, len(of_q), BATCH):
                            r = await store.put(of_q[i : i + BATCH])
                            assert r.status is PutMessageStatus.PUT_OK, r
                else:
                    for m in mine:
                        r = await store.put(m)
                        assert r.status is PutMessageStatus.PUT_OK, r

            async with trio.open_nursery() as producers:
                for mine in chunks:
                    producers.start_soon(producer, mine)
        timer.__exit__()
        nbytes = store.max_phy_offset - start_offset
        kind = f"put {flush.value} {f'batch of {BATCH}' if batch else 'single'}"
        if flush is FlushDiskType.SYNC_FLUSH:
            kind += f" ({SYNC_PRODUCERS} producers)"
        report(kind, count, nbytes, timer)
        del msgs
        gc.unfreeze()
        with Timer() as dispatch:
            await store.reput.do_reput()
        if not batch and flush is FlushDiskType.ASYNC_FLUSH:
            report("  reput dispatch (consume queue + index)", count, nbytes, dispatch)
        nursery.cancel_scope.cancel()
    return count / timer.wall


async def bench_get(root: str, args: argparse.Namespace) -> None:
    store = DefaultMessageStore(make_config(root, args.file_size, FlushDiskType.ASYNC_FLUSH))
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        n = nbytes = 0
        with Timer() as timer:
            for q in range(QUEUES):
                offset = store.get_min_offset_in_queue(TOPIC, q)
                while True:
                    r = store.get_message("bench", TOPIC, q, offset, 32)
                    if not r.messages:
                        break
                    n += len(r.messages)
                    nbytes += r.buffer_total_size
                    offset = r.next_begin_offset
        report("get (pull, 32 per call)", n, nbytes, timer)
        nursery.cancel_scope.cancel()


def bench_recovery(root: str, args: argparse.Namespace, rebuild: bool) -> None:
    config = make_config(root, args.file_size, FlushDiskType.ASYNC_FLUSH)
    open(config.abort_path, "wb").close()
    if rebuild:
        shutil.rmtree(config.consume_queue_dir, ignore_errors=True)
        shutil.rmtree(config.index_dir, ignore_errors=True)
        os.unlink(config.checkpoint_path)
    store = DefaultMessageStore(config)
    with Timer() as timer:
        store._open()  # load + recover, as run() does in a worker thread
    scanned = store.max_phy_offset - store.min_phy_offset
    label = "abnormal recovery, full rebuild" if rebuild else "abnormal recovery, queues intact"
    count = sum(cq.max_offset_in_queue for cq in store.consume_queues)
    store._close_files()
    report(label, count, scanned, timer)


async def main(args: argparse.Namespace) -> None:
    base = tempfile.mkdtemp(prefix="pymq-bench-")
    try:
        print(f"{args.count} messages of {args.body} bytes, commit-log files of {args.file_size}")
        async_root = os.path.join(base, "async")
        rates = []
        for _ in range(args.rounds):
            shutil.rmtree(async_root, ignore_errors=True)
            rates.append(
                await bench_puts(async_root, args, FlushDiskType.ASYNC_FLUSH, False, args.count)
            )
        if args.rounds > 1:
            rates.sort()
            print(
                f"ASYNC_FLUSH single puts over {args.rounds} rounds: min {rates[0]:,.0f}, "
                f"median {statistics.median(rates):,.0f}, max {rates[-1]:,.0f} msgs/s"
            )
        await bench_get(async_root, args)
        bench_recovery(async_root, args, rebuild=False)
        bench_recovery(async_root, args, rebuild=True)
        await bench_puts(
            os.path.join(base, "async-batch"), args, FlushDiskType.ASYNC_FLUSH, True, args.count
        )
        sync_count = max(1000, args.count // 10)
        await bench_puts(
            os.path.join(base, "sync"), args, FlushDiskType.SYNC_FLUSH, False, sync_count
        )
        await bench_puts(
            os.path.join(base, "sync-batch"), args, FlushDiskType.SYNC_FLUSH, True, sync_count
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--file-size", type=int, default=256 * 1024 * 1024)
    parser.add_argument("--body", type=int, default=1024)
    parser.add_argument(
        "--rounds", type=int, default=1, help="repeat the ASYNC single puts (this VM is noisy)"
    )
    logging.basicConfig(level=logging.ERROR)
    trio.run(main, parser.parse_args())
