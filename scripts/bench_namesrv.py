#!/usr/bin/env python3
"""The name server at scale: many broker groups' topics registered, then route lookups.

    scripts/bench_namesrv.py                         # 100 groups x 1,000 topics, 8 x 8 lookups
    scripts/bench_namesrv.py --groups 10 --topics 100 --seconds 5
    scripts/bench_namesrv.py -n 127.0.0.1:9876       # against a running name server
    scripts/bench_namesrv.py --server-set serverTaskOrder=fifo   # a config key for the server

Starts ``python -m pymq.namesrv`` on a free port (unless -n is given), then:

1. registration: each of ``--groups`` broker groups (a master) registers ``--topics`` topics of
   its own over its own connection, all at once, as brokers starting together do; printed: the
   time until every group's REGISTER_BROKER was answered.
2. lookups: ``--connections`` connections, each with ``--in-flight`` GET_ROUTEINFO_BY_TOPIC
   requests outstanding at all times (a new one as each answer arrives), for random registered
   topics, for ``--seconds``; printed: lookups per second and the latency percentiles.

The load generator writes pre-encoded request frames and reads only the answers' length fields
and codes, so that it costs less than the server it measures: one thread waits on all the
connections with epoll and writes the lookups that replace one read's answers together, in one
write (8.4 µs of CPU per lookup against the name server's 13.8 on 2026-11-27).
``--write-per-answer`` runs the generator used until 2026-11-28 instead, a Trio task per
connection writing each next lookup on its own as its answer is read: it spent more CPU per
lookup than the name server (46 against 41 µs) and measured itself.  The in-flight count is
the same either way.  A run that gets no answer for ``--seconds`` plus 30 s fails.  The name
server's resident memory (VmRSS) is printed after registration and after the lookups; one JSON
line ends the run.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import select
import socket
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import trio

from pymq.common.record import body_crc32
from pymq.common.route import RegisterBrokerBody
from pymq.common.topic import DataVersion, TopicConfig, TopicConfigSerializeWrapper
from pymq.remoting.client import RemotingClient
from pymq.remoting.codec import RemotingCommand, encode
from pymq.remoting.codes import RequestCode, ResponseCode
from scripts.bench_hardening import rss_mb
from scripts.benchmark import free_port, server_settings

LOOKUP_GRACE_SECONDS = 30.0
_LENGTH = struct.Struct(">i")


def topic_name(group: int, index: int) -> str:
    return f"BenchTopic_{group:03d}_{index:05d}"


def register_request(group: int, topics: int, port: int) -> RemotingCommand:
    table = {topic_name(group, i): TopicConfig(topic_name(group, i), 8, 8) for i in range(topics)}
    body = RegisterBrokerBody(TopicConfigSerializeWrapper(table, DataVersion(counter=1))).encode(
        compressed=False
    )
    header = {
        "brokerAddr": f"127.0.0.1:{port}",
        "brokerId": "0",
        "brokerName": f"broker-{group:03d}",
        "clusterName": "BenchCluster",
        "haServerAddr": f"127.0.0.1:{port + 1}",
        "compressed": "false",
        "bodyCrc32": str(body_crc32(body)),
    }
    return RemotingCommand.request(RequestCode.REGISTER_BROKER, header, body)


async def register_all(
    addr: str, groups: int, topics: int, nursery: trio.Nursery
) -> tuple[float, list[RemotingClient]]:
    """Every group registered over its own connection; the connections stay open (the name
    server forgets a broker whose connection closes)."""
    requests = [register_request(g, topics, 20000 + 2 * g) for g in range(groups)]
    clients = [RemotingClient(nursery) for _ in range(groups)]

    async def one(client: RemotingClient, request: RemotingCommand) -> None:
        reply = await client.invoke(addr, request, 60)
        if reply.code != ResponseCode.SUCCESS:
            raise SystemExit(f"REGISTER_BROKER refused: {reply.code} {reply.remark}")

    start = time.perf_counter()
    async with trio.open_nursery() as inner:
        for client, request in zip(clients, requests, strict=True):
            inner.start_soon(one, client, request)
    return time.perf_counter() - start, clients


async def lookups(
    addr: str,
    topics: list[str],
    connections: int,
    in_flight: int,
    seconds: float,
    per_answer: bool = False,
) -> tuple[int, list[float], int]:
    """(lookups per second, latencies, refused lookups): the epoll loop in a worker thread, or
    with ``per_answer`` the Trio tasks that wrote each next lookup on its own."""
    frames = [
        encode(RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": t}))
        for t in topics  # every registered topic: the first lookup of each builds its route
    ]
    if per_answer:
        return await lookups_per_answer(addr, frames, connections, in_flight, seconds)
    return await trio.to_thread.run_sync(
        lookups_epoll, addr, frames, connections, in_flight, seconds
    )


def lookups_epoll(
    addr: str, frames: list[bytes], connections: int, in_flight: int, seconds: float
) -> tuple[int, list[float], int]:
    """The load generator: one thread waiting on every connection with epoll, each read's
    answers replaced by as many new lookups in one write, so that ``in_flight`` lookups stay
    outstanding on every connection."""
    host, port = addr.rsplit(":", 1)
    latencies: list[float] = []
    errors = 0
    rng = random.Random()
    pick, count = rng.randrange, len(frames)
    poller = select.epoll()
    socks: dict[int, socket.socket] = {}
    sent: dict[int, collections.deque[float]] = {}
    bufs: dict[int, bytearray] = {}
    start = time.perf_counter()
    stop_at = start + seconds
    give_up_at = stop_at + LOOKUP_GRACE_SECONDS  # a name server that stops answering
    try:
        for _ in range(connections):
            sock = socket.create_connection((host, int(port)))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            fd = sock.fileno()
            socks[fd], bufs[fd] = sock, bytearray()
            sent[fd] = collections.deque([time.perf_counter()] * in_flight)
            sock.sendall(b"".join(frames[pick(count)] for _ in range(in_flight)))
            poller.register(fd, select.EPOLLIN)
        waiting = connections
        while waiting:
            events = poller.poll(1.0)
            if not events and time.perf_counter() > give_up_at:
                raise SystemExit(
                    f"lookups still unanswered {LOOKUP_GRACE_SECONDS:g} s after the run's end"
                )
            for fd, _ in events:
                data = socks[fd].recv(1 << 16)
                if not data:
                    raise SystemExit("name server closed a connection")
                buf = bufs[fd]
                buf += data
                now = time.perf_counter()
                times = sent[fd]
                more: list[bytes] = []  # the answered lookups' successors, written together
                pos = 0
                while len(buf) - pos >= 4:
                    (length,) = _LENGTH.unpack_from(buf, pos)
                    if len(buf) - pos < 4 + length:
                        break
                    if not buf.startswith(b'{"code":0,', pos + 8, pos + 4 + length):
                        errors += 1
                        if errors == 1:
                            header_length = _LENGTH.unpack_from(buf, pos + 4)[0] & 0xFFFFFF
                            header = bytes(buf[pos + 8 : pos + 8 + header_length])
                            print("first refused lookup:", header[:300], file=sys.stderr)
                    pos += 4 + length
                    if not times:
                        raise SystemExit("the name server answered more than was asked")
                    latencies.append(now - times.popleft())
                    if now < stop_at:
                        more.append(frames[pick(count)])
                del buf[:pos]
                if more:
                    times.extend([time.perf_counter()] * len(more))
                    socks[fd].sendall(b"".join(more))
                elif not times:
                    poller.unregister(fd)
                    waiting -= 1
    finally:
        poller.close()
        for sock in socks.values():
            sock.close()
    return int(len(latencies) / (time.perf_counter() - start)), latencies, errors


async def lookups_per_answer(
    addr: str, frames: list[bytes], connections: int, in_flight: int, seconds: float
) -> tuple[int, list[float], int]:
    """The generator until 2026-11-28, as it was: a Trio task per connection writing each next
    lookup as its answer is read."""
    host, port = addr.rsplit(":", 1)
    latencies: list[float] = []
    errors = 0
    done = 0
    stop_at = time.perf_counter() + seconds

    async def connection() -> None:
        nonlocal errors, done
        stream = await trio.open_tcp_stream(host, int(port))
        sent: list[float] = []  # send times, answered in order (one connection, inline)
        buf = bytearray()
        rng = random.Random()

        async def send_one() -> None:
            sent.append(time.perf_counter())
            await stream.send_all(frames[rng.randrange(len(frames))])

        for _ in range(in_flight):
            await send_one()
        while sent:
            data = await stream.receive_some(1 << 16)
            if not data:
                raise SystemExit("name server closed a connection")
            buf += data
            while len(buf) >= 4:
                (length,) = _LENGTH.unpack_from(buf, 0)
                if len(buf) < 4 + length:
                    break
                header = bytes(buf[8 : 8 + (_LENGTH.unpack_from(buf, 4)[0] & 0xFFFFFF)])
                del buf[: 4 + length]
                now = time.perf_counter()
                latencies.append(now - sent.pop(0))
                if not header.startswith(b'{"code":0,'):
                    errors += 1
                    if errors == 1:
                        print("first refused lookup:", header[:300], file=sys.stderr)
                done += 1
                if now < stop_at:
                    await send_one()
        await stream.aclose()

    start = time.perf_counter()
    with trio.fail_after(seconds + LOOKUP_GRACE_SECONDS):
        async with trio.open_nursery() as nursery:
            for _ in range(connections):
                nursery.start_soon(connection)
    elapsed = time.perf_counter() - start
    return int(done / elapsed), latencies, errors


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else 0.0


async def run(
    args: argparse.Namespace, addr: str, pid: int | None
) -> tuple[float, int, list[float], int, float | None]:
    async with trio.open_nursery() as nursery:
        rss_start = rss_mb(pid) if pid else None
        register_s, clients = await register_all(addr, args.groups, args.topics, nursery)
        rss_registered = rss_mb(pid) if pid else None
        print(
            f"registered {args.groups} groups x {args.topics} topics in {register_s:.2f} s"
            f" (RSS {rss_start and round(rss_start, 1)} -> "
            f"{rss_registered and round(rss_registered, 1)} MB)"
        )
        topics = [topic_name(g, i) for g in range(args.groups) for i in range(args.topics)]
        rate, latencies, errors = await lookups(
            addr, topics, args.connections, args.in_flight, args.seconds, args.write_per_answer
        )
        rss_end = rss_mb(pid) if pid else None
        for client in clients:
            client.close()
        nursery.cancel_scope.cancel()
    return register_s, rate, latencies, errors, rss_end


def _first_exit(exc: BaseException) -> SystemExit | None:
    """The SystemExit in ``exc``, or in the exception groups it nests, if any."""
    if isinstance(exc, SystemExit):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _first_exit(inner)
            if found is not None:
                return found
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", dest="namesrv", help="a running name server (none: start one)")
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument("--topics", type=int, default=1000, help="topics per group")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--server-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config key for the name server it starts (repeatable; e.g. serverTaskOrder=trio)",
    )
    parser.add_argument(
        "--write-per-answer",
        action="store_true",
        help="write each next lookup on its own as its answer is read (the generator before "
        "2026-11-28, which spent more CPU per lookup than the name server)",
    )
    args = parser.parse_args()
    if args.connections < 1 or args.in_flight < 1:
        parser.error("--connections and --in-flight must be at least 1")

    proc = None
    addr = args.namesrv
    tmp = tempfile.mkdtemp(prefix="pymq-ns-bench-")
    if addr is None:
        port = free_port()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pymq.namesrv",
                "--listenPort",
                str(port),
                "--bindAddress",
                "127.0.0.1",
                "--kvConfigPath",
                os.path.join(tmp, "kv.json"),
                "--log-level",
                "ERROR",
                *server_settings(args.server_set),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert proc.stdout is not None
        if "success" not in proc.stdout.readline():
            proc.kill()
            raise SystemExit("the name server did not start")
        addr = f"127.0.0.1:{port}"
    pid = proc.pid if proc else None
    try:
        try:
            register_s, rate, latencies, errors, rss_end = trio.run(run, args, addr, pid)
        except BaseException as exc:  # a SystemExit of the generator comes in a group
            stop = _first_exit(exc)
            if stop is None:
                raise
            raise SystemExit(stop.code) from None
        p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
        print(
            f"route lookups: {rate:,} /s from {args.connections} connections x "
            f"{args.in_flight} in flight; p50 {p50:.3f} ms, p99 {p99:.3f} ms; errors {errors};"
            f" RSS {rss_end and round(rss_end, 1)} MB"
        )
        print(
            json.dumps(
                {
                    "groups": args.groups,
                    "topics_per_group": args.topics,
                    "register_all_s": round(register_s, 3),
                    "lookups_per_s": rate,
                    "lookup_p50_ms": round(p50, 3),
                    "lookup_p99_ms": round(p99, 3),
                    "errors": errors,
                    "rss_mb": rss_end and round(rss_end, 1),
                }
            )
        )
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
