"""The timer store (issue #41) with many pending timers: enqueue rate, memory, recovery time, and
how late due timers are handed out.

    .venv/bin/python scripts/bench_timer.py                      # 10 million pending timers
    .venv/bin/python scripts/bench_timer.py --count 1000000 --due-per-second 10000
    .venv/bin/python scripts/bench_timer.py --broker --count 1000000   # through a real broker

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

With ``--broker`` the timers go through a real broker instead (a name server and a broker
started as subprocesses on free 127.0.0.1 ports, their store in the temporary directory):
pymq's producer sends ``--count`` timer messages (TIMER_DELIVER_MS, due within the next days)
in SEND_BATCH_MESSAGE requests of ``--batch`` (1: single sends), ``--window`` messages
unanswered at most, as an application publishing fast would; the figures are the send rate
(acknowledged), the enqueue rate (until the broker's timer service has entered them all:
GET_TIMER_METRICS' pendingTotal), the broker's RssAnon/RssFile with them pending, then the
time until every one is pending again after kill -9 of the broker and after a clean stop
(SIGTERM) and restart on the same store, and the pending count each time (none lost); then,
with them still pending, ``--due-per-second`` timers due every second for ``--due-seconds``
seconds: how late the broker put each to its topic (TIMER_DEQUEUE_MS less the due time, read
back with a push consumer).

Prints one line per phase and a JSON line at the end.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import trio  # noqa: E402
from benchmark import cpu_seconds, free_port  # noqa: E402

from pymq.client import (  # noqa: E402
    ConsumeFromWhere,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    SendResult,
)
from pymq.client.topics import create_topic  # noqa: E402
from pymq.common.serde import loads_lenient  # noqa: E402
from pymq.remoting.client import open_remoting_client  # noqa: E402
from pymq.remoting.codec import RemotingCommand  # noqa: E402
from pymq.remoting.codes import RequestCode  # noqa: E402
from pymq.store.timer.store import TimerStore  # noqa: E402

DAY_MS = 86_400_000


def memory(pid: int | str = "self") -> dict[str, float]:
    """RssAnon and RssFile of a process (this one by default), in MB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
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


BENCH_TOPIC = "BenchTimer"


class Broker:
    """A name server and a broker as subprocesses on free loopback ports; the broker can be
    killed or stopped and started again on its store."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.ns_port = free_port()
        self.port = free_port()
        self.namesrv = f"127.0.0.1:{self.ns_port}"
        self.addr = f"127.0.0.1:{self.port}"
        self.ns: subprocess.Popen[str] | None = None
        self.proc: subprocess.Popen[str] | None = None

    def _spawn(self, cmd: list[str], name: str) -> subprocess.Popen[str]:
        with open(os.path.join(self.base, f"{name}.stderr"), "a+") as errors:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errors, text=True)
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if "success" not in line and "running" not in line:
                proc.kill()
                proc.wait()
                errors.seek(0)
                raise SystemExit(f"could not start the {name}: {errors.read()[-2000:]}")
        return proc

    def start_namesrv(self) -> None:
        self.ns = self._spawn(
            [sys.executable, "-m", "pymq.namesrv", "--listenPort", str(self.ns_port),
             "--bindAddress", "127.0.0.1", "--kvConfigPath", os.path.join(self.base, "kv.json"),
             "--log-level", "ERROR"],
            "namesrv",
        )  # fmt: skip

    def start(self) -> None:
        self.proc = self._spawn(
            [sys.executable, "-m", "pymq.broker", "-n", self.namesrv, "--brokerName", "bench",
             "--listenPort", str(self.port), "--haListenPort", str(free_port()),
             "--brokerIP1", "127.0.0.1", "--bindAddress", "127.0.0.1",
             "--storePathRootDir", os.path.join(self.base, "store"), "--log-level", "ERROR"],
            "broker",
        )  # fmt: skip

    def stop(self, sig: int = signal.SIGTERM) -> None:
        proc = self.proc
        if proc is not None:
            proc.send_signal(sig)
            proc.wait(timeout=600)
            self.proc = None

    def close(self) -> None:
        for proc in (self.proc, self.ns):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


async def timer_metrics(addr: str) -> dict[str, object] | None:
    """GET_TIMER_METRICS' answer, or None while the broker (or its timer store) is not up."""
    try:
        async with open_remoting_client() as client:
            reply = await client.invoke(
                addr, RemotingCommand.request(RequestCode.GET_TIMER_METRICS), timeout=30
            )
    except OSError:
        return None
    except Exception as exc:  # not yet listening, or answered before the store is open
        if "connect" in str(exc).lower() or "closed" in str(exc).lower():
            return None
        raise
    if reply.code != 0 or not reply.body:
        return None
    status: dict[str, object] = loads_lenient(reply.body)
    return status


async def wait_pending(addr: str, count: int, timeout: float) -> tuple[float, int]:
    """Seconds until the broker reports ``count`` pending timers (or ``timeout`` passed);
    the last pending count seen."""
    started = time.perf_counter()
    pending = -1
    with trio.move_on_after(timeout):
        while True:
            status = await timer_metrics(addr)
            if status is not None:
                pending = int(status.get("pendingTotal", 0))  # type: ignore[call-overload]
                if pending >= count:
                    break
            await trio.sleep(0.05)
    return time.perf_counter() - started, pending


async def send_timers(args: argparse.Namespace, namesrv: str) -> tuple[float, int]:
    """Send ``--count`` timer messages; (seconds, sends retried).  A send the broker refuses
    (flow control: SYSTEM_BUSY) is sent again, as a producer's retries would."""
    rng = random.Random(5)
    body = b"x" * args.body_size
    now = int(time.time() * 1000)
    earliest, span = now + 3_600_000, int(2.9 * DAY_MS) - 3_600_000  # due in 1 h .. 2.9 days
    retried = 0
    in_flight = 0
    slot = trio.Event()
    again: list[list[Message]] = []

    def done(msgs: list[Message], result: SendResult | None, error: Exception | None) -> None:
        nonlocal in_flight, retried
        in_flight -= len(msgs)
        if error is not None:
            retried += len(msgs)
            if retried == len(msgs):
                print(f"first refused send (sent again): {error}", file=sys.stderr)
            again.append(msgs)
        slot.set()

    def timer_message() -> Message:
        due = str(earliest + rng.randrange(span))
        return Message(BENCH_TOPIC, body, properties={"TIMER_DELIVER_MS": due})

    async with Producer("BenchTimerProducer", namesrv, send_timeout=60) as producer:
        await producer.publish_queues(BENCH_TOPIC)  # the route first: not part of the timing
        started = time.perf_counter()
        made = 0
        last_report = started
        while made < args.count or again or in_flight:
            if in_flight >= args.window or (made >= args.count and not again):
                slot = trio.Event()
                await slot.wait()
                continue
            if again:
                msgs = again.pop()
                await trio.sleep(0.01)  # a refused send waits a little, as a producer's retry
            else:
                msgs = [timer_message() for _ in range(min(args.batch, args.count - made))]
                made += len(msgs)
            in_flight += len(msgs)
            callback = functools.partial(done, msgs)
            if len(msgs) > 1:
                await producer.send_batch_async(msgs, callback)
            else:
                await producer.send_async(msgs[0], callback)
            if time.perf_counter() - last_report >= 10:
                last_report = time.perf_counter()
                rate = made / (last_report - started)
                print(f"  sent {made:,} ({rate:,.0f}/s)", file=sys.stderr)
        return time.perf_counter() - started, retried


async def recover(broker: Broker, count: int, how: str, timeout: float) -> dict[str, object]:
    """Stop the broker (kill -9 or SIGTERM), start it again, and time until every timer is
    pending again."""
    broker.stop(signal.SIGKILL if how == "kill" else signal.SIGTERM)
    started = time.perf_counter()
    await trio.to_thread.run_sync(broker.start)
    _, pending = await wait_pending(broker.addr, count, timeout)
    recovery = time.perf_counter() - started
    assert broker.proc is not None
    mem = memory(broker.proc.pid)
    print(
        f"after {'kill -9' if how == 'kill' else 'a clean stop'}: {pending:,} pending "
        f"({count - pending:,} lost) {recovery:.1f} s after the start; broker memory {mem}"
    )
    return {
        f"recovery_{how}_s": round(recovery, 2),
        f"pending_after_{how}": pending,
        f"rss_anon_mb_after_{how}": mem.get("RssAnon"),
    }


DUE_TOPIC = "BenchTimerDue"


async def broker_lateness(broker: Broker, args: argparse.Namespace) -> dict[str, object]:
    """``--due-per-second`` timers due every second for ``--due-seconds`` seconds through the
    broker (with the others pending): how late each was put to its topic (its
    TIMER_DEQUEUE_MS, the broker's put, less its due time), read back by a push consumer."""
    total = args.due_per_second * args.due_seconds
    await create_topic(broker.namesrv, DUE_TOPIC, brokers=[broker.addr])
    rng = random.Random(13)
    # Due from a little after the last send would be done (at 5,000 sends/s at the least).
    start = int(time.time() * 1000) + 2000 + total // 5
    async with Producer("BenchTimerDueProducer", broker.namesrv, send_timeout=60) as producer:
        for first in range(0, total, args.batch):
            msgs = [
                Message(
                    DUE_TOPIC,
                    b"due",
                    properties={
                        "TIMER_DELIVER_MS": str(start + rng.randrange(args.due_seconds * 1000))
                    },
                )
                for _ in range(min(args.batch, total - first))
            ]
            if len(msgs) > 1:
                await producer.send_batch(msgs)
            else:
                await producer.send(msgs[0])
    sent_by = int(time.time() * 1000)
    late: list[float] = []
    done = trio.Event()

    async def handler(msgs: list[MessageExt]) -> bool:
        for msg in msgs:
            props = msg.properties
            late.append(int(props["TIMER_DEQUEUE_MS"]) - int(props["TIMER_DELIVER_MS"]))
        if len(late) >= total:
            done.set()
        return True

    first = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    async with PushConsumer(
        "BenchTimerDueGroup", broker.namesrv, handler, consume_from=first, batch_size=32
    ) as consumer:
        await consumer.subscribe(DUE_TOPIC)
        with trio.move_on_after(args.due_seconds + 60 + (start - sent_by) / 1000):
            await done.wait()
    early = sum(1 for v in late if v < 0)
    p50, p99 = percentile(late, 0.5), percentile(late, 0.99)
    print(
        f"{len(late):,} of {total:,} timers due at {args.due_per_second:,}/s (the last sent "
        f"{(start - sent_by) / 1000:.1f} s before the first was due) put to their topic: "
        f"lateness p50 {p50:.0f} ms, p99 {p99:.0f} ms, max {max(late):.0f} ms, {early} early "
        f"(precision 1000 ms)"
    )
    return {
        "due": total,
        "handed_out": len(late),
        "late_p50_ms": p50,
        "late_p99_ms": p99,
        "late_max_ms": max(late),
        "early": early,
        "first_due_after_last_send_s": round((start - sent_by) / 1000, 1),
    }


async def broker_phase(base: str, args: argparse.Namespace) -> dict[str, object]:
    broker = Broker(base)
    try:
        await trio.to_thread.run_sync(broker.start_namesrv)
        await trio.to_thread.run_sync(broker.start)
        await create_topic(broker.namesrv, BENCH_TOPIC, brokers=[broker.addr])
        assert broker.proc is not None
        idle = memory(broker.proc.pid)
        cpu = cpu_seconds([broker.proc.pid])
        seconds, retried = await send_timers(args, broker.namesrv)
        entered, pending = await wait_pending(broker.addr, args.count, args.timeout)
        total = seconds + entered
        cpu_us = (cpu_seconds([broker.proc.pid]) - cpu) * 1e6 / args.count
        mem = memory(broker.proc.pid)
        send_rate, enqueue_rate = round(args.count / seconds), round(args.count / total)
        print(
            f"sent {args.count:,} timer messages (batch {args.batch}) in {seconds:.1f} s: "
            f"{send_rate:,}/s acknowledged, {retried} sent again; all pending {total:.1f} s after "
            f"the first send: {enqueue_rate:,}/s; {pending:,} pending; broker CPU {cpu_us:.0f} us "
            f"a timer; broker memory {idle} idle, {mem} with them pending"
        )
        figures: dict[str, object] = {
            "count": args.count,
            "batch": args.batch,
            "send_per_s": send_rate,
            "enqueue_per_s": enqueue_rate,
            "sent_again": retried,
            "broker_cpu_us_per_timer": round(cpu_us, 1),
            "pending": pending,
            "rss_anon_mb_idle": idle.get("RssAnon"),
            "rss_anon_mb_pending": mem.get("RssAnon"),
            "rss_file_mb_pending": mem.get("RssFile"),
        }
        figures.update(await recover(broker, args.count, "kill", args.timeout))
        figures.update(await recover(broker, args.count, "stop", args.timeout))
        figures.update(await broker_lateness(broker, args))
        return figures
    finally:
        broker.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000_000, help="pending timers")
    parser.add_argument("--flush-every", type=int, default=100_000)
    parser.add_argument("--precision-ms", type=int, default=1000)
    parser.add_argument("--due-per-second", type=int, default=10_000)
    parser.add_argument("--due-seconds", type=int, default=5)
    parser.add_argument("--dir", help="where the stores go (default: a temporary directory)")
    parser.add_argument("--broker", action="store_true", help="through a real broker")
    parser.add_argument("--batch", type=int, default=64, help="--broker: messages a request")
    parser.add_argument("--window", type=int, default=1024, help="--broker: unanswered at most")
    parser.add_argument("--body-size", type=int, default=64, help="--broker: body bytes")
    parser.add_argument(
        "--timeout", type=float, default=3600, help="--broker: longest wait for the pending count"
    )
    args = parser.parse_args()
    if args.count < 1 or args.flush_every < 1 or args.due_per_second < 1 or args.due_seconds < 1:
        raise SystemExit("--count, --flush-every, --due-per-second and --due-seconds must be >= 1")
    base = tempfile.mkdtemp(prefix="pymq-timer-", dir=args.dir)
    try:
        if args.broker:
            if args.batch < 1 or args.window < args.batch:
                raise SystemExit("--batch must be >= 1 and --window at least --batch")
            figures = trio.run(broker_phase, base, args)
        else:
            figures = pending_phase(os.path.join(base, "pending"), args)
            figures.update(lateness_phase(os.path.join(base, "due"), args))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps({"bench": "timer-broker" if args.broker else "timer", **figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
