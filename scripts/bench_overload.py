#!/usr/bin/env python3
"""Overload benchmark: goodput and latency of one pymq broker at about twice its capacity.

    scripts/bench_overload.py                     # fast failure on (RocketMQ's default)
    scripts/bench_overload.py --no-fast-failure   # brokerFastFailureEnable=false

Starts a name server + broker in a temp dir (as scripts/benchmark.py does), creates a topic,
then runs the load generator in a separate process (the machine's cores are shared):

1. capacity: a closed loop (-w requests in flight on each of -c connections) for -d seconds;
2. overload: an open loop at --factor x capacity from the same connections for -d seconds:
   requests are due at fixed times whether or not earlier ones were answered, latency is
   counted from the due time, and a request not answered within --timeout (Java's default
   sendMsgTimeout, 3 s) has failed.

Prints capacity, offered rate, goodput (SEND_OK within the timeout per second),
goodput/capacity, refused (SYSTEM_BUSY) rate, timed-out rate, and p50/p99 of accepted sends.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import trio

from scripts.benchmark import free_port, percentile

SEND_OK, SYSTEM_BUSY = 0, 2


def start_servers(tmp: str, fast_failure: bool) -> tuple[str, str, list[subprocess.Popen]]:
    procs: list[subprocess.Popen] = []
    py = sys.executable
    ns_port, broker_port = free_port(), free_port()

    def spawn(cmd: list[str]) -> None:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        procs.append(proc)
        if "success" not in line and "running" not in line:
            raise SystemExit(f"could not start {cmd[2]}: {line.strip()}")

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
    spawn(
        [
            py,
            "-m",
            "pymq.broker",
            "-n",
            f"127.0.0.1:{ns_port}",
            "--brokerName",
            "broker-a",
            "--listenPort",
            str(broker_port),
            "--haListenPort",
            str(free_port()),
            "--brokerIP1",
            "127.0.0.1",
            "--bindAddress",
            "127.0.0.1",
            "--storePathRootDir",
            os.path.join(tmp, "store"),
            "--brokerFastFailureEnable",
            "true" if fast_failure else "false",
            "--log-level",
            "ERROR",
        ]
    )
    return f"127.0.0.1:{ns_port}", f"127.0.0.1:{broker_port}", procs


# -- the load generator (its own process) ----------------------------------------------------


async def generate(args: argparse.Namespace) -> dict:  # noqa: C901
    from pymq.remoting.codec import FrameDecoder, RemotingCommand, encode, peek_request
    from pymq.remoting.codes import RequestCode

    body = b"x" * args.size
    host, port = args.broker.rsplit(":", 1)

    # Frames are built ahead of time (the generator must not be the bottleneck): one template
    # per queue, with a ten-digit opaque patched in by slicing (opaques count up from 10**9, so
    # every frame of a template has the same length).
    marker = 1_999_999_999

    def template(queue: int) -> tuple[bytes, bytes]:
        ext = {
            "a": "OverloadProducer",
            "b": args.topic,
            "c": "TBW102",
            "d": "4",
            "e": str(queue),
            "f": "0",
            "g": str(int(time.time() * 1000)),
            "h": "0",
            "i": "",
            "j": "0",
            "k": "false",
            "m": "false",
        }
        req = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, ext, body)
        req.opaque = marker
        data = encode(req)
        at = data.index(b'"opaque":%d' % marker) + len(b'"opaque":')
        return data[:at], data[at + len(str(marker)) :]

    templates = [template(q) for q in range(8)]

    def frame(opaque: int) -> bytes:
        head, tail = templates[opaque & 7]
        return head + b"%d" % opaque + tail

    class Conn:
        def __init__(self, stream: trio.SocketStream) -> None:
            self.stream = stream
            self.due: dict[int, float] = {}

    results: list[tuple[float, float, int]] = []  # (due, answered, code)
    opaque_seq = iter(range(10**9, marker))

    async def read_answers(conn: Conn, on_answer: object) -> None:
        decoder = FrameDecoder()
        while True:
            data = await conn.stream.receive_some(1 << 18)
            if not data:
                return
            now = time.perf_counter()
            buf, bounds = decoder.feed_frames(data)
            for i in range(0, len(bounds), 2):
                peeked = peek_request(buf, bounds[i], bounds[i + 1])  # code and opaque only
                assert peeked is not None
                code, opaque = peeked[0], peeked[1]
                due = conn.due.pop(opaque, None)
                if due is not None:
                    results.append((due, now, code))
                    on_answer(conn)  # type: ignore[operator]

    conns = [Conn(await trio.open_tcp_stream(host, int(port))) for _ in range(args.connections)]

    async def closed_loop(seconds: float) -> float:
        results.clear()
        end = time.perf_counter() + seconds
        wake = {id(c): trio.Event() for c in conns}

        def on_answer(conn: Conn) -> None:
            wake[id(conn)].set()

        async def writer(conn: Conn) -> None:
            while time.perf_counter() < end:
                wake[id(conn)] = trio.Event()  # before writing: no answer is missed
                want = args.window - len(conn.due)
                if want > 0:
                    now = time.perf_counter()
                    out = []
                    for _ in range(want):
                        op = next(opaque_seq)
                        conn.due[op] = now
                        out.append(frame(op))
                    await conn.stream.send_all(b"".join(out))
                with trio.move_on_after(0.05):
                    await wake[id(conn)].wait()

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for c in conns:
                nursery.start_soon(read_answers, c, on_answer)
            async with trio.open_nursery() as writers:
                for c in conns:
                    writers.start_soon(writer, c)
            with trio.move_on_after(args.timeout):
                while any(c.due for c in conns):
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        ok = sum(1 for _, _, code in results if code == SEND_OK)
        return ok / (time.perf_counter() - start)

    async def open_loop(rate: float, seconds: float) -> dict:
        results.clear()
        for c in conns:
            c.due.clear()
        interval = 0.002  # requests due in one 2 ms tick are written together
        per_tick = rate * interval / len(conns)
        start = time.perf_counter()

        async def writer(conn: Conn) -> None:
            owed = 0.0
            tick = 0
            while True:
                tick += 1
                due_at = start + tick * interval
                if due_at - start > seconds:
                    return
                delay = due_at - time.perf_counter()
                if delay > 0:
                    await trio.sleep(delay)
                owed += per_tick
                n = int(owed)
                owed -= n
                out = []
                for _ in range(n):
                    op = next(opaque_seq)
                    conn.due[op] = due_at
                    out.append(frame(op))
                if out:
                    await conn.stream.send_all(b"".join(out))  # blocks when TCP pushes back

        async with trio.open_nursery() as nursery:
            for c in conns:
                nursery.start_soon(read_answers, c, lambda conn: None)
            async with trio.open_nursery() as writers:
                for c in conns:
                    writers.start_soon(writer, c)
            with trio.move_on_after(args.timeout):
                while any(c.due for c in conns):
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        offered = rate * seconds
        issued = len(results) + sum(len(c.due) for c in conns)
        in_time = [(d, a, code) for d, a, code in results if a - d <= args.timeout]
        ok = [a - d for d, a, code in in_time if code == SEND_OK]
        busy = sum(1 for _, _, code in in_time if code == SYSTEM_BUSY)
        timed_out = issued - len(in_time)
        return {
            "offered_per_s": round(offered / seconds),
            "issued": issued,
            "goodput_per_s": round(len(ok) / seconds),
            "refused_per_s": round(busy / seconds),
            "timed_out_per_s": round(timed_out / seconds),
            "accepted_p50_ms": round(percentile(ok, 0.5) * 1000, 1),
            "accepted_p99_ms": round(percentile(ok, 0.99) * 1000, 1),
        }

    capacity = await closed_loop(args.duration)
    result = await open_loop(capacity * args.factor, args.duration)
    result["capacity_per_s"] = round(capacity)
    result["goodput_over_capacity"] = round(result["goodput_per_s"] / capacity, 3)
    for c in conns:
        await c.stream.aclose()
    return result


# -- driver -----------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-fast-failure", action="store_true")
    parser.add_argument("-c", dest="connections", type=int, default=4)
    parser.add_argument("-w", dest="window", type=int, default=256, help="closed-loop window")
    parser.add_argument("-d", dest="duration", type=float, default=10.0, help="seconds per phase")
    parser.add_argument("-s", dest="size", type=int, default=1024)
    parser.add_argument("--factor", type=float, default=2.0, help="offered load / capacity")
    parser.add_argument("--timeout", type=float, default=3.0, help="send timeout (s)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # broker address: generator only
    parser.add_argument("--topic", default="OverloadTest")
    args = parser.parse_args()
    if args.worker:
        args.broker = args.worker
        print(json.dumps(trio.run(generate, args)), flush=True)
        return 0
    tmp = tempfile.mkdtemp(prefix="pymq-overload-")
    procs: list[subprocess.Popen] = []
    try:
        namesrv, broker, procs = start_servers(tmp, not args.no_fast_failure)
        from pymq.client.topics import create_topic

        trio.run(lambda: create_topic(namesrv, args.topic, queues=8, brokers=[broker]))
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", broker]
        for flag, value in (
            ("-c", args.connections),
            ("-w", args.window),
            ("-d", args.duration),
            ("-s", args.size),
            ("--factor", args.factor),
            ("--timeout", args.timeout),
            ("--topic", args.topic),
        ):
            cmd += [flag, str(value)]
        out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
        result = json.loads(out.strip().splitlines()[-1])
        result["fast_failure"] = not args.no_fast_failure
        for key in (
            "capacity_per_s",
            "offered_per_s",
            "goodput_per_s",
            "goodput_over_capacity",
            "refused_per_s",
            "timed_out_per_s",
            "accepted_p50_ms",
            "accepted_p99_ms",
        ):
            print(f"{key:>24}: {result[key]}")
        print(json.dumps(result), flush=True)
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
