"""What hostile requests cost everyone else: the broker's event loop as a probe connection sees it.

Starts the embedded default (``python -m pymq``, SQL92 filtering on) in a temporary directory, then
runs each hostile case of issue #37 against it while a probe connection (tests.helpers.StallProbe:
a thread with its own socket, timing a cheap request every 5 ms) measures how long the broker
keeps everybody else waiting.  Prints, per case, the worst and the 99th-percentile probe round
trip, the broker loop's longest task step in the case (wall and CPU ms, from scripts/loop_steps.py:
a probe's round trip also counts the machine's other load, the bench client shares its cores),
the case's own figures, and the broker's resident memory before and after.  The target is a
worst round trip under 50 ms in every case.

    .venv/bin/python scripts/bench_hostile.py                 # every case
    .venv/bin/python scripts/bench_hostile.py --cases lenient-heartbeat,sql92-pull
    PYTHONPATH=/tmp/old .venv/bin/python scripts/bench_hostile.py   # another checkout's broker

Loopback only; the servers stop at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import trio

from pymq.client import Message, MessageSelector, Producer, PullConsumer
from pymq.common.consumer import MessageQueue
from pymq.remoting.client import RemotingClient
from pymq.remoting.codec import RemotingCommand, encode
from pymq.remoting.codes import RequestCode
from scripts.benchmark import embedded_args, free_port, memory_mb, percentile
from tests.helpers import StallProbe

TARGET_MS = 50.0
Case = Callable[["Broker"], Awaitable[dict[str, object]]]


class Broker:
    def __init__(self, namesrv: str, port: int, metrics_port: int, pid: int, steps: str) -> None:
        self.namesrv = namesrv
        self.port = port
        self.addr = f"127.0.0.1:{port}"
        self.metrics_port = metrics_port
        self.pid = pid
        self.steps = steps  # where loop_steps.py writes the loop's longest steps


def raw_request(port: int, frame: bytes, *, read: bool = True, timeout: float = 30.0) -> bytes:
    """Write ``frame`` on a new connection; with ``read``, return the first bytes answered."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(frame)
        return sock.recv(65536) if read else b""


def _frame(code: int, body: bytes, fields: dict[str, str] | None = None) -> bytes:
    return encode(RemotingCommand.request(code, ext_fields=fields or {}, body=body))


async def lenient_heartbeat(broker: Broker) -> dict[str, object]:
    """An unauthenticated 15 MB HEART_BEAT body that ``json`` refuses (an unterminated string)."""
    body = b'{"clientID":"' + b"x" * (15 << 20)
    answer = await trio.to_thread.run_sync(raw_request, broker.port, _frame(34, body))
    return {"answered_bytes": len(answer)}


async def lenient_lock(broker: Broker) -> dict[str, object]:
    """The same body as a LOCK_BATCH_MQ request."""
    body = b'{"consumerGroup":"' + b"x" * (15 << 20)
    answer = await trio.to_thread.run_sync(raw_request, broker.port, _frame(41, body))
    return {"answered_bytes": len(answer)}


SQL_PROPERTIES = 30 * 1024
SQL_MESSAGES = 200


async def sql92_pull(broker: Broker) -> dict[str, object]:
    """Messages with 30 KB of properties, then one pull with a 64 KiB SQL92 expression."""
    topic = "HostileSql"
    props = {f"p{i}": "v" * 100 for i in range(SQL_PROPERTIES // 110)}
    async with Producer("hostile-sql", broker.namesrv) as producer:
        for _ in range(SQL_MESSAGES):
            msg = Message(topic, b"x", properties=dict(props))
            await producer.send(msg, queue=MessageQueue(topic, "broker-a", 0))
    clause = " OR ".join(f"p{i % 200} = 'no match {i}'" for i in range(2000))
    expression = clause[: 64 * 1024 - 64].rsplit(" OR ", 1)[0]
    async with PullConsumer("hostile-sql-group", broker.namesrv) as puller:
        started = time.monotonic()
        try:
            result = await puller.pull(
                MessageQueue(topic, "broker-a", 0), MessageSelector.by_sql(expression), 0, 32
            )
            outcome = str(result.status)
        except Exception as exc:  # a refusal is an outcome too
            outcome = f"refused: {exc}"[:120]
    return {
        "expression_bytes": len(expression),
        "pull_s": round(time.monotonic() - started, 3),
        "outcome": outcome,
    }


async def queue_count(broker: Broker) -> dict[str, object]:
    """A topic asked for with 2^31-1 queues, then the topic's stats."""
    fields = {
        "topic": "HostileQueues",
        "defaultTopic": "TBW102",
        "readQueueNums": str(2**31 - 1),
        "writeQueueNums": str(2**31 - 1),
        "perm": "6",
        "topicFilterType": "SINGLE_TAG",
        "order": "false",
    }
    async with trio.open_nursery() as nursery:
        client = RemotingClient(nursery)
        created = await client.invoke(
            broker.addr, RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, fields)
        )
        stats = await client.invoke(
            broker.addr,
            RemotingCommand.request(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "HostileQueues"}),
            timeout=60,
        )
        nursery.cancel_scope.cancel()
    return {"create": created.code, "create_remark": created.remark, "stats": stats.code}


ONEWAY_TOPICS = 3000


def _oneway_frames(count: int, new_topics: bool = True) -> list[bytes]:
    frames = []
    for i in range(count):
        fields = {
            "a": "hostile-oneway",
            "b": f"HostileTopic{i if new_topics else 'Same'}",
            "c": "TBW102",
            "d": "4",
            "e": "0",
            "f": "0",
            "g": str(int(time.time() * 1000)),
            "h": "0",
            "i": "",
            "j": "0",
            "k": "false",
        }
        cmd = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, fields, body=b"y" * 4096)
        cmd.flag |= 2  # oneway
        frames.append(encode(cmd))
    return frames


async def oneway_new_topics(broker: Broker, new_topics: bool = True) -> dict[str, object]:
    """Paced oneway sends, each to a new topic (auto-created), on one connection."""
    frames = _oneway_frames(ONEWAY_TOPICS, new_topics)

    def send_all() -> int:
        sent = 0
        with socket.create_connection(("127.0.0.1", broker.port), timeout=30) as sock:
            for frame in frames:
                sock.sendall(frame)
                sent += len(frame)
                time.sleep(0.001)
        return sent

    sent = await trio.to_thread.run_sync(send_all)
    await trio.sleep(5)  # what it still holds once the sends are done
    return {"sent_mb": round(sent / 2**20, 1), "rss_after_5s_mb": memory_mb([broker.pid])}


STUCK_SCRAPERS = 16


async def stuck_scrapers(broker: Broker) -> dict[str, object]:
    """Scrapers that ask for /metrics and never read, then an honest scrape."""
    socks = []
    for _ in range(STUCK_SCRAPERS):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", broker.metrics_port))
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        socks.append(sock)
    try:
        await trio.sleep(2)

        def scrape() -> str:
            with socket.create_connection(("127.0.0.1", broker.metrics_port), timeout=30) as s:
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                return s.recv(64).split(b"\r\n", 1)[0].decode(errors="replace")

        deadline = time.monotonic() + 60
        status = await trio.to_thread.run_sync(scrape)
        while " 200 " not in status and time.monotonic() < deadline:
            await trio.sleep(1)
            status = await trio.to_thread.run_sync(scrape)
        return {"honest_scrape": status, "waited_s": round(60 - (deadline - time.monotonic()), 1)}
    finally:
        for sock in socks:
            sock.close()


CASES: dict[str, Case] = {
    "lenient-heartbeat": lenient_heartbeat,
    "lenient-lock": lenient_lock,
    "sql92-pull": sql92_pull,
    "queue-count": queue_count,
    "oneway-new-topics": oneway_new_topics,
    # The same sends to one topic: what the machine's load alone costs the probe (the bench
    # client and the broker share its cores), beside which oneway-new-topics reads.
    "oneway-one-topic": functools.partial(oneway_new_topics, new_topics=False),
    "stuck-scrapers": stuck_scrapers,
}


BROKER_DATA_MAX = 4 << 30
"""The broker's heap cap (RLIMIT_DATA: anonymous memory, not the store's mapped files): a case
that makes an unbounded broker allocate without end ends in its MemoryError, not the machine's."""


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_DATA, (BROKER_DATA_MAX, BROKER_DATA_MAX))


def start(tmp: str) -> tuple[subprocess.Popen, Broker]:
    ns_port, port, metrics_port = free_port(), free_port(), free_port()
    # The loop's own longest steps, beside what the probe sees (see loop_steps.py).
    steps = os.path.join(tmp, "loop-steps.json")
    loop_steps = os.path.join(os.path.dirname(os.path.abspath(__file__)), "loop_steps.py")
    cmd = [sys.executable, loop_steps, steps, *embedded_args(tmp, ns_port, port)]
    cmd += ["--metrics-port", str(metrics_port), "--enablePropertyFilter", "true"]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        preexec_fn=_cap_memory,  # a broker without the bounds would take the machine down
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "running" not in line:
        proc.kill()
        raise SystemExit(f"could not start pymq: {line.strip() or 'no output'}")
    return proc, Broker(f"127.0.0.1:{ns_port}", port, metrics_port, proc.pid, steps)


async def loop_steps(broker: Broker) -> dict[str, Any]:
    """The broker loop's longest steps since the last call (loop_steps.py writes them on
    SIGUSR1)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(broker.steps)
    os.kill(broker.pid, signal.SIGUSR1)
    with trio.fail_after(10):
        while not os.path.exists(broker.steps):
            await trio.sleep(0.01)
    with open(broker.steps) as f:
        return json.load(f)


async def run_case(name: str, case: Case, broker: Broker) -> dict[str, object]:
    before = memory_mb([broker.pid])
    await loop_steps(broker)  # from here on
    probe = StallProbe(broker.port, timeout=120)
    try:
        async with probe:
            try:
                figures = await case(broker)
            except Exception as exc:
                figures = {"error": f"{type(exc).__name__}: {exc}"[:160]}
    except trio.TooSlowError:  # the probe got no first answer: the broker is stuck
        figures = {"error": "the broker did not answer the probe within 120 s"}
    trips = [t * 1000 for t in probe.round_trips] or [120_000.0]
    loop = await loop_steps(broker)
    steps = loop["steps"]
    return {
        "case": name,
        "worst_ms": round(max(trips), 1),
        "p99_ms": round(percentile(trips, 0.99), 1),
        "step_ms": steps[0]["wall_ms"] if steps else 0.0,
        "step_cpu_ms": max((s["cpu_ms"] for s in steps), default=0.0),
        "longest_steps": steps,
        "gc_ms": loop["gc_ms"],
        "probes": len(trips),
        "rss_mb": [before, memory_mb([broker.pid])],
        **figures,
    }


def show(r: dict[str, object]) -> None:
    shown = ("case", "worst_ms", "p99_ms", "rss_mb", "step_ms", "step_cpu_ms", "longest_steps")
    shown += ("gc_ms",)
    extra = {k: v for k, v in r.items() if k not in shown}
    mark = "" if float(r["worst_ms"]) < TARGET_MS else "  (over 50 ms)"  # type: ignore[arg-type]
    rss = "/".join(str(m) for m in r["rss_mb"])  # type: ignore[attr-defined]
    step = f"{r['step_ms']}/{r['step_cpu_ms']} gc {r['gc_ms']}"
    print(
        f"{r['case']:<20} {r['worst_ms']:>9} {r['p99_ms']:>8} {step:>22}  {rss:>20}  {extra}{mark}"
    )
    sys.stdout.flush()


async def main_async(names: list[str], broker: Broker) -> list[dict[str, object]]:
    print(
        f"{'case':<20} {'worst ms':>9} {'p99 ms':>8} {'step ms/cpu, gc':>22}  "
        f"{'RSS MB before/after':>20}  figures"
    )
    results = []
    for name in names:
        result = await run_case(name, CASES[name], broker)
        show(result)
        results.append(result)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cases", default=",".join(CASES), help="comma list of " + ", ".join(CASES)
    )
    args = parser.parse_args()
    names = [n for n in args.cases.split(",") if n]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise SystemExit(f"unknown cases: {', '.join(unknown)} (known: {', '.join(CASES)})")
    tmp = tempfile.mkdtemp(prefix="pymq-hostile-")
    proc, broker = start(tmp)
    try:
        results = trio.run(main_async, names, broker)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"bench": "hostile", "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
