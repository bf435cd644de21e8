#!/usr/bin/env python3
"""Producer/consumer benchmark in the manner of RocketMQ's own, with its option letters.

    scripts/benchmark.py                      # starts pymq (name server + broker) in a temp dir
    scripts/benchmark.py -n 127.0.0.1:9876    # against a running name server
    scripts/benchmark.py --flush SYNC_FLUSH --ha SYNC_MASTER -q 20000

Publishes -q messages of -s bytes with at most -w unacknowledged (Producer.send_async with a
window; --sync: -w tasks each awaiting send(); -b: batch requests),
printing send TPS, average and max RT and failures every second; then consumes everything it
sent with a push consumer.  Ends with one JSON line in the format of ../shared/bench
(EXTRA_BENCH), so pymq can run beside Redis, NATS and RabbitMQ in one rotation.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import trio

from pymq.client import ConsumeFromWhere, Message, MessageExt, Producer, PushConsumer
from pymq.client.topics import create_topic
from pymq.remoting.client import open_remoting_client
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of processes (Linux /proc), robust to a busy machine."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def start_servers(args: argparse.Namespace, tmp: str) -> tuple[str, list[subprocess.Popen]]:
    """The embedded default, or a name server + master + slave when --ha is given."""
    py = sys.executable
    procs: list[subprocess.Popen] = []

    def spawn(cmd: list[str]) -> subprocess.Popen:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "success" not in line and "running" not in line:
            proc.kill()
            raise SystemExit(f"could not start {cmd[2]}: {line.strip()}")
        procs.append(proc)
        return proc

    common = ["--flushDiskType", args.flush, "--mappedFileSizeCommitLog", str(args.file_size)]
    if not args.ha:
        ns_port = free_port()
        spawn(
            [
                py,
                "-m",
                "pymq",
                "--data",
                tmp,
                "--bind",
                "127.0.0.1",
                "--namesrv-port",
                str(ns_port),
                "--broker-port",
                str(free_port()),
                "--log-level",
                "ERROR",
                "--admin-port",
                "0",
                "--metrics-port",
                "0",
                *common,
            ]
        )
        return f"127.0.0.1:{ns_port}", procs
    ns_port = free_port()
    spawn(
        [
            py,
            "-m",
            "pymq.namesrv",
            "--listenPort",
            str(ns_port),
            "--bindAddress",
            "127.0.0.1",
            "--kvConfigPath",
            os.path.join(tmp, "kv.json"),
            "--log-level",
            "ERROR",
        ]
    )
    for role, broker_id in ((args.ha, 0), ("SLAVE", 1)):
        spawn(
            [
                py,
                "-m",
                "pymq.broker",
                "-n",
                f"127.0.0.1:{ns_port}",
                "--brokerName",
                "broker-a",
                "--brokerId",
                str(broker_id),
                "--brokerRole",
                role,
                "--listenPort",
                str(free_port()),
                "--haListenPort",
                str(free_port()),
                "--brokerIP1",
                "127.0.0.1",
                "--brokerIP2",
                "127.0.0.1",
                "--bindAddress",
                "127.0.0.1",
                "--storePathRootDir",
                os.path.join(tmp, role),
                "--log-level",
                "ERROR",
                *common,
            ]
        )
    return f"127.0.0.1:{ns_port}", procs


async def wait_for_slave(namesrv: str) -> None:
    async with open_remoting_client() as client:
        with trio.fail_after(20):
            while True:
                info = await client.invoke(
                    namesrv, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
                )
                data = next(iter(json.loads(info.body)["brokerAddrTable"].values()), {})
                master = data.get("brokerAddrs", {}).get("0")
                if master and len(data.get("brokerAddrs", {})) > 1:
                    runtime = await client.invoke(
                        master, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO)
                    )
                    if json.loads(runtime.body)["table"].get("haConnections") == "1":
                        return
                await trio.sleep(0.2)


async def publish(args: argparse.Namespace, namesrv: str) -> tuple[float, list[float], int]:  # noqa: C901
    body = os.urandom(args.size // 2).hex().encode()[: args.size]
    latencies: list[float] = []
    failures = 0
    sent = 0
    window_stats: list[float] = []
    done = trio.Event()

    async with Producer("BenchmarkProducer", namesrv, send_timeout=10) as producer:
        await producer.publish_queues(args.topic)  # route first: not part of the timing
        total_requests = (args.count + args.batch - 1) // args.batch
        next_request = 0

        async def worker() -> None:
            nonlocal next_request, sent, failures
            while next_request < total_requests:
                next_request += 1
                t0 = time.perf_counter()
                try:
                    if args.batch > 1:
                        await producer.send_batch(
                            [Message(args.topic, body) for _ in range(args.batch)]
                        )
                    else:
                        await producer.send(Message(args.topic, body))
                except Exception:
                    failures += 1
                    continue
                rt = (time.perf_counter() - t0) * 1000
                latencies.append(rt)
                window_stats.append(rt)
                sent += args.batch

        async def reporter() -> None:
            last = 0
            while not done.is_set():
                with trio.move_on_after(1.0):
                    await done.wait()
                rts, window_stats[:] = list(window_stats), []
                avg = statistics.fmean(rts) if rts else 0.0
                print(
                    f"Send TPS: {sent - last:7d} Max RT(ms): {max(rts, default=0):8.3f} "
                    f"Average RT(ms): {avg:7.3f} Send Failed: {failures} Sent: {sent}",
                    file=sys.stderr,
                )
                last = sent

        async def windowed_async() -> None:
            # Java's async send with a window: no task per message, the answer arrives in a
            # callback, and the loop waits only when -w messages are unanswered.
            nonlocal sent, failures
            in_flight = 0
            slot = trio.Event()
            drained = trio.Event()
            msg = Message(args.topic, body)

            def done(t0: float, result: object, error: Exception | None) -> None:
                nonlocal in_flight, sent, failures
                in_flight -= 1
                if error is not None:
                    failures += 1
                else:
                    rt = (time.perf_counter() - t0) * 1000
                    latencies.append(rt)
                    window_stats.append(rt)
                    sent += 1
                slot.set()
                if in_flight == 0 and finished_sending:
                    drained.set()

            finished_sending = False
            for _ in range(args.count):
                while in_flight >= args.window:
                    slot = trio.Event()
                    await slot.wait()
                in_flight += 1
                t0 = time.perf_counter()
                try:
                    await producer.send_async(msg, functools.partial(done, t0))
                except Exception:
                    in_flight -= 1
                    failures += 1
            finished_sending = True
            if in_flight:
                await drained.wait()

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reporter)
            if args.batch == 1 and not args.sync:
                await windowed_async()
            else:
                async with trio.open_nursery() as workers:
                    for _ in range(
                        max(1, args.window // max(1, args.batch) if args.batch > 1 else args.window)
                    ):
                        workers.start_soon(worker)
            elapsed = time.perf_counter() - start
            done.set()
    return sent / elapsed, latencies, failures


async def consume(args: argparse.Namespace, namesrv: str, expected: int) -> float:
    received = 0
    finished = trio.Event()

    async def handle(msgs: list[MessageExt]) -> bool:
        nonlocal received
        received += len(msgs)
        if received >= expected:
            finished.set()
        return True

    group = f"BenchmarkConsumer_{uuid.uuid4().hex[:8]}"
    async with PushConsumer(
        group,
        namesrv,
        handle,
        consume_from=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        batch_size=32,
    ) as consumer:
        start = time.perf_counter()
        await consumer.subscribe(args.topic)
        with trio.move_on_after(max(60, expected / 1000)):
            await finished.wait()
        elapsed = time.perf_counter() - start
    if received < expected:
        print(f"consumed only {received} of {expected}", file=sys.stderr)
    return received / elapsed


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main_async(args: argparse.Namespace) -> dict:
    tmp = tempfile.mkdtemp(prefix="pymq-bench-")
    procs: list[subprocess.Popen] = []
    try:
        namesrv = args.namesrv
        if not namesrv:
            namesrv, procs = await trio.to_thread.run_sync(start_servers, args, tmp)
            if args.ha:
                await wait_for_slave(namesrv)
        await create_topic(namesrv, args.topic, queues=args.queues)
        pids = [p.pid for p in procs]
        cpu0 = cpu_seconds(pids)
        client_cpu0 = time.process_time()
        publish_rate, latencies, failures = await publish(args, namesrv)
        client_cpu_us = (time.process_time() - client_cpu0) * 1e6
        sent = len(latencies) * args.batch
        server_cpu_us = (cpu_seconds(pids) - cpu0) * 1e6 / max(1, sent)
        client_cpu_us /= max(1, sent)
        consume_rate = await consume(args, namesrv, sent) if not args.no_consume else 0.0
        return {
            "system": args.name if not args.ha else f"{args.name}-{args.ha.lower()}",
            "n": sent,
            "size": args.size,
            "publish_msgs_per_s": round(publish_rate, 1),
            "consume_msgs_per_s": round(consume_rate, 1),
            "publish_p50_ms": round(percentile(latencies, 0.5), 3),
            "publish_p99_ms": round(percentile(latencies, 0.99), 3),
            "failures": failures,
            "server_cpu_us_per_msg": round(server_cpu_us, 1) if procs else None,
            "client_cpu_us_per_msg": round(client_cpu_us, 1),
            "flush": args.flush,
            "window": args.window,
            "batch": args.batch,
        }
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", dest="namesrv", help="name server address (none: start pymq)")
    parser.add_argument("-t", dest="topic", default=f"BenchmarkTest_{uuid.uuid4().hex[:6]}")
    parser.add_argument("-s", dest="size", type=int, default=1024, help="message size in bytes")
    parser.add_argument("-w", dest="window", type=int, default=256, help="messages in flight")
    parser.add_argument("-b", dest="batch", type=int, default=1, help="messages per request")
    parser.add_argument("-q", dest="count", type=int, default=50000, help="messages to send")
    parser.add_argument("--queues", type=int, default=8, help="queues of the topic")
    parser.add_argument("--flush", default="ASYNC_FLUSH", choices=["ASYNC_FLUSH", "SYNC_FLUSH"])
    parser.add_argument("--ha", choices=["ASYNC_MASTER", "SYNC_MASTER"], help="add a slave")
    parser.add_argument("--file-size", type=int, default=256 * 1024 * 1024)
    parser.add_argument("--no-consume", action="store_true")
    parser.add_argument(
        "--name", default="pymq", help='"system" in the JSON line (to tell variants apart)'
    )
    parser.add_argument(
        "--sync",
        action="store_true",
        help="one task per in-flight send with the awaited send() (default: send_async)",
    )
    args = parser.parse_args()
    result = trio.run(main_async, args)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
