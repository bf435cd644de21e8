#!/usr/bin/env python3
"""Scaling out: the publish benchmark against 1 broker group, then against N, in one run.

    scripts/bench_groups.py                  # 1 group, then 2 groups; 2 producer processes
    scripts/bench_groups.py --groups 4 --producers 4 -q 100000 --rounds 2

Each configuration is ``python -m pymq --groups G`` (a name server and G broker processes);
one topic with ``--queues`` queues on every group; then ``--producers`` processes of
``scripts/benchmark.py -n`` publish ``-q`` messages between them at the same time (window -w
each, 1 KiB).  Printed per configuration: the summed publish rate and each process's CPU per
message (brokers, producers); and the scaling factor, N groups over 1.  Rounds alternate the
configurations so that a machine's drift hits both.

What bounds the factor: every broker process is single-threaded, so N groups can use N cores;
the producers need cores too.  On a 2-core machine (brokers and producers sharing both), expect
at most ~2x and in practice less: the one-group run already uses the second core for its
producer.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from pymq.groups import free_base_port  # noqa: E402
from scripts.benchmark import cpu_seconds  # noqa: E402


def broker_pids(parent: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == parent:
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


def run_config(groups: int, args: argparse.Namespace) -> dict:
    tmp = tempfile.mkdtemp(prefix="pymq-groups-")
    base = free_base_port(groups)
    cmd = [sys.executable, "-m", "pymq", "--groups", str(groups), "--data", tmp]
    cmd += ["--bind", "127.0.0.1", "--namesrv-port", "0", "--broker-port", str(base)]
    cmd += ["--admin-port", "0", "--metrics-port", "0", "--log-level", "ERROR"]
    server = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert server.stdout is not None
        banner = server.stdout.readline()
        match = re.search(r"name server (\S+),", banner)
        if match is None:
            raise SystemExit(f"pymq --groups {groups} did not start: {banner!r}")
        namesrv = match.group(1)
        topic = f"GroupsBench_{uuid.uuid4().hex[:6]}"
        bench = [sys.executable, os.path.join(ROOT, "scripts", "benchmark.py"), "-n", namesrv]
        bench += ["-t", topic, "-s", str(args.size), "-w", str(args.window), "--no-consume"]
        bench += ["--queues", str(args.queues)]
        # Create the topic on every group first (one tiny run), then measure.
        subprocess.run([*bench, "-q", "64"], check=True, capture_output=True, timeout=120)
        pids = broker_pids(server.pid)
        cpu0 = cpu_seconds(pids)
        per = args.count // args.producers
        started = time.perf_counter()
        producers = [
            subprocess.Popen(
                [*bench, "-q", str(per)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
            )
            for _ in range(args.producers)
        ]
        results = []
        for proc in producers:
            out, _ = proc.communicate(timeout=600)
            results.append(json.loads(out.decode().strip().splitlines()[-1]))
        elapsed = time.perf_counter() - started
        broker_cpu = cpu_seconds(pids) - cpu0
        sent = sum(r["n"] for r in results)
        return {
            "groups": groups,
            # Each producer's rate over its own publishing (their start-up is not counted);
            # they run at the same time, so the rates add up.
            "msgs_per_s": sum(r["publish_msgs_per_s"] for r in results),
            "wall_msgs_per_s": sent / elapsed,
            "broker_cpu_us_per_msg": broker_cpu * 1e6 / max(1, sent),
            "producer_cpu_us_per_msg": statistics.fmean(
                r["client_cpu_us_per_msg"] for r in results
            ),
            "failures": sum(r["failures"] for r in results),
        }
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=2, help="groups to compare with one")
    parser.add_argument("--producers", type=int, default=2, help="producer processes")
    parser.add_argument("--queues", type=int, default=8, help="queues of the topic per group")
    parser.add_argument("-q", dest="count", type=int, default=200000, help="messages in all")
    parser.add_argument("-s", dest="size", type=int, default=1024)
    parser.add_argument("-w", dest="window", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    rates: dict[int, list[float]] = {1: [], args.groups: []}
    for _ in range(args.rounds):
        for groups in (1, args.groups):
            result = run_config(groups, args)
            rates[groups].append(result["msgs_per_s"])
            print(
                f"{groups} group(s): {result['msgs_per_s']:9,.0f} msgs/s from "
                f"{args.producers} producers; broker CPU {result['broker_cpu_us_per_msg']:.1f} "
                f"us/msg, producer CPU {result['producer_cpu_us_per_msg']:.1f} us/msg, "
                f"failures {result['failures']}",
                flush=True,
            )
    factor = statistics.median(rates[args.groups]) / statistics.median(rates[1])
    print(f"scaling factor, {args.groups} groups over 1: {factor:.2f}x (cores: {os.cpu_count()})")
    print(
        json.dumps(
            {
                "groups": args.groups,
                "producers": args.producers,
                "one_group_msgs_per_s": round(statistics.median(rates[1])),
                "n_groups_msgs_per_s": round(statistics.median(rates[args.groups])),
                "scaling_factor": round(factor, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
