#!/usr/bin/env python3
"""What hostile or unlucky peers can make a broker hold: its resident memory under each.

    scripts/bench_hardening.py [-n 100000] [--connections 40]

Starts a name server + broker in a temp dir (as scripts/bench_overload.py does; default limits)
and prints the broker's RSS (from /proc) before and during:

1. a slow reader: -n messages of 1 KiB are produced, then one socket pipelines PULL_MESSAGE
   (32 messages each) for all of them and never reads an answer; the broker's RSS is sampled
   for a few seconds (issue #12 measured 32 MB -> 4.98 GB before the write-buffer marks);
2. half frames: --connections sockets each send 15 MB of a frame that claims 16 MB and stop
   (issue #12: 33 MB -> 648 MB before the partial-frame budget);
3. after both: that the broker still answers a send.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import struct
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import trio

from scripts.bench_overload import start_servers


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def pull_frame(topic: str, queue: int, offset: int) -> bytes:
    from pymq.remoting.codec import RemotingCommand, encode
    from pymq.remoting.codes import RequestCode

    return encode(
        RemotingCommand.request(
            RequestCode.PULL_MESSAGE,
            {
                "consumerGroup": "slow-reader",
                "topic": topic,
                "queueId": queue,
                "queueOffset": offset,
                "maxMsgNums": 32,
                "sysFlag": 4,
                "commitOffset": 0,
                "suspendTimeoutMillis": 0,
                "subscription": "*",
                "subVersion": 0,
                "expressionType": "TAG",
            },
        )
    )


def sample(pid: int, seconds: float) -> float:
    peak = 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        peak = max(peak, rss_mb(pid))
        time.sleep(0.05)
    return peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=100_000, help="messages produced")
    parser.add_argument("--connections", type=int, default=40, help="half-frame sockets")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="pymq-hardening-")
    procs = []
    try:
        namesrv, broker, procs = start_servers(tmp, True)
        broker_pid = procs[-1].pid
        host, port = broker.rsplit(":", 1)
        from pymq.client import Message, Producer
        from pymq.client.topics import create_topic

        async def produce() -> None:
            await create_topic(namesrv, "Slow", queues=1, brokers=[broker])
            async with Producer("hardening", namesrv) as producer:
                for _ in range(args.n // 32):
                    await producer.send_batch([Message("Slow", b"x" * 1024) for _ in range(32)])

        trio.run(produce)
        time.sleep(12)  # residentTrimInterval (10 s): mapped pages the broker is done with go
        idle = rss_mb(broker_pid)
        print(f"broker RSS idle after producing {args.n:,} x 1 KiB: {idle:.0f} MB")

        slow = socket.create_connection((host, int(port)))
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.setblocking(False)
        frames = b"".join(pull_frame("Slow", 0, o) for o in range(0, args.n, 32))
        sent = 0
        end = time.monotonic() + 5
        while sent < len(frames) and time.monotonic() < end:
            try:
                sent += slow.send(frames[sent : sent + 65536])
            except BlockingIOError:
                time.sleep(0.01)
        peak = sample(broker_pid, 5)
        pulls = len(frames) // len(pull_frame("Slow", 0, 0))
        print(
            f"slow reader: {sent / len(frames):.0%} of {pulls:,} pulls written, none read; "
            f"broker RSS peak {peak:.0f} MB"
        )
        slow.close()

        halves = []
        claimed = 16 * 1024 * 1024 - 8
        for _ in range(args.connections):
            s = socket.create_connection((host, int(port)))
            s.setblocking(False)
            halves.append([s, struct.pack(">ii", claimed, 40) + b"{" * 40, 0])
        chunk = b"x" * 65536
        end = time.monotonic() + 10
        while time.monotonic() < end:
            progressed = False
            for entry in halves:
                s, head, done = entry
                if done >= 15 * 1024 * 1024:
                    continue
                data = head if done == 0 else chunk
                try:
                    n = s.send(data)
                except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                    continue
                entry[2] = done + n
                progressed = True
            if not progressed:
                time.sleep(0.01)
        held = sum(e[2] for e in halves)
        peak = sample(broker_pid, 3)
        print(
            f"half frames: {args.connections} sockets wrote {held / 2**20:.0f} MB of 15 MB each "
            f"(the broker stops reading past its budget); broker RSS peak {peak:.0f} MB"
        )
        for s, _, _ in halves:
            s.close()

        async def still_serves() -> str:
            async with Producer("after", namesrv) as producer:
                return (await producer.send(Message("Slow", b"after"))).status

        print(f"a send afterwards: {trio.run(still_serves)}")
        return 0
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
