"""The timer store (issue #41) with many pending timers: enqueue rate, memory, recovery time, and
how late due timers are handed out.

    .venv/bin/python scripts/bench_timer.py                      # 10 million pending timers
    .venv/bin/python scripts/bench_timer.py --count 1000000 --due-per-second 10000

It drives ``pymq.store.timer.TimerStore`` directly, as the broker's timer service does (the
service adds the reads of the timer topic and the puts to the real topics): ``--count`` timers
due over the next days are entered, the store flushed (log, checkpoint, wheel) every
``--flush-every`` entries as the service's flush task does every ``timerFlushIntervalMs``; the
process's memory is read from ``/proc/self/status`` (``RssAnon``: the heap, which must not grow
with the pending timers; ``RssFile``: mapped file pages, which the kernel may drop); the store is
closed without a last flush and opened again, as after kill -9 (recovery re-chains what the last
checkpoint did not cover); then a second store gets ``--due-per-second`` timers due every second
for ``--due-seconds`` seconds and is polled every 5 ms as the dequeue task polls it: lateness is
the time from a timer's due time to its handing out (the precision is ``--precision-ms``, so a
slot is handed out once it is over: lateness is up to one precision plus the polling).

Prints one line per phase and a JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pymq.store.timer.store import TimerStore

DAY_MS = 86_400_000


def memory() -> dict[str, float]:
    """RssAnon and RssFile of this process, in MB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("RssAnon", "RssFile"):
                out[name] = round(int(value.split()[0]) / 1024, 1)
    return out


def flush(store: TimerStore) -> None:
    cp, slots = store.snapshot()
    store.flush_blocking(cp, slots)
    store.flushed(cp, slots)


def open_store(root: str, precision_ms: int) -> TimerStore:
    return TimerStore(
        root,
        precision_ms=precision_ms,
        roll_window_slots=2 * 86_400,  # RocketMQ 5's timerRollWindowSlot default
        log_file_size=100 * 1024 * 1024,  # mappedFileSizeTimerLog
    )


def pending_phase(root: str, args: argparse.Namespace) -> dict[str, object]:
    rng = random.Random(7)
    now = int(time.time() * 1000)
    store = open_store(root, args.precision_ms)
    store.open(now)
    before = memory()
    started = time.perf_counter()
    for i in range(args.count):
        # Due within the next three days (timerMaxDelaySec): some past the roll window.
        store.enter(now + 1000 + rng.randrange(3 * DAY_MS), i * 100, 100, now)
        if i % args.flush_every == args.flush_every - 1:
            flush(store)
    elapsed = time.perf_counter() - started
    after = memory()
    rate = round(args.count / elapsed)
    print(
        f"entered {args.count:,} timers in {elapsed:.1f} s: {rate:,}/s; memory {before} -> {after}"
    )
    # No last flush: up to --flush-every entries past the checkpoint, as after kill -9.
    store.close()
    started = time.perf_counter()
    store = open_store(root, args.precision_ms)
    store.open(now)
    recovery = time.perf_counter() - started
    reopened = memory()
    print(f"recovered in {recovery:.2f} s; memory {reopened}")
    store.close()
    return {
        "count": args.count,
        "enter_per_s": rate,
        "rss_anon_mb_before": before.get("RssAnon"),
        "rss_anon_mb_after": after.get("RssAnon"),
        "rss_file_mb_after": after.get("RssFile"),
        "recovery_s": round(recovery, 2),
        "rss_anon_mb_recovered": reopened.get("RssAnon"),
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def lateness_phase(root: str, args: argparse.Namespace) -> dict[str, object]:
    rng = random.Random(11)
    now = int(time.time() * 1000)
    store = open_store(root, args.precision_ms)
    store.open(now)
    start = now + 2 * args.precision_ms
    total = args.due_per_second * args.due_seconds
    for i in range(total):
        store.enter(start + rng.randrange(args.due_seconds * 1000), i, 100, now)
    flush(store)
    late: list[float] = []
    end = start + args.due_seconds * 1000 + 3 * args.precision_ms
    while time.time() * 1000 < end and len(late) < total:
        due = store.take_due(int(time.time() * 1000))
        if due is None:
            time.sleep(0.005)
            continue
        handed = time.time() * 1000
        late += [handed - entry.deliver_ms for entry in due.due]
    store.close()
    early = sum(1 for v in late if v < 0)
    p50, p99 = percentile(late, 0.5), percentile(late, 0.99)
    print(
        f"{len(late):,} of {total:,} timers due at {args.due_per_second:,}/s handed out: "
        f"lateness p50 {p50:.0f} ms, p99 {p99:.0f} ms, max {max(late):.0f} ms, "
        f"{early} early (precision {args.precision_ms} ms)"
    )
    return {
        "due": total,
        "handed_out": len(late),
        "late_p50_ms": round(p50, 1),
        "late_p99_ms": round(p99, 1),
        "late_max_ms": round(max(late), 1),
        "early": early,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000_000, help="pending timers")
    parser.add_argument("--flush-every", type=int, default=100_000)
    parser.add_argument("--precision-ms", type=int, default=1000)
    parser.add_argument("--due-per-second", type=int, default=10_000)
    parser.add_argument("--due-seconds", type=int, default=5)
    parser.add_argument("--dir", help="where the stores go (default: a temporary directory)")
    args = parser.parse_args()
    if args.count < 1 or args.flush_every < 1 or args.due_per_second < 1 or args.due_seconds < 1:
        raise SystemExit("--count, --flush-every, --due-per-second and --due-seconds must be >= 1")
    base = tempfile.mkdtemp(prefix="pymq-timer-", dir=args.dir)
    try:
        figures = pending_phase(os.path.join(base, "pending"), args)
        figures.update(lateness_phase(os.path.join(base, "due"), args))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps({"bench": "timer", **figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
