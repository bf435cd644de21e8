"""The DLedger fault harness's long run (issue #42; the harness is tests/dledger_faults.py):
three brokers of one DLedger group and two name servers, each a process in its own network
namespace on this machine, under a workload of producers and consumers, through many rounds of
faults (kill -9 of the leader, of a follower, of two members; SIGSTOP pauses; partitions that
isolate the leader or split 1-2, then heal; packet loss and delay; restarts with torn tails);
then the checker, and the failover times' p50/p99.

    sudo .venv/bin/python scripts/dledger_faults.py                  # 24 rounds, every fault
    sudo .venv/bin/python scripts/dledger_faults.py --rounds 40 --faults kill-leader,pause-leader
    sudo .venv/bin/python scripts/dledger_faults.py --cleanup        # a killed run's leftovers

Needs root and iproute2 (``ip netns``); loss uses ``tc netem`` where the kernel has it, else
iptables' statistic match; delay needs netem (skipped otherwise, and said so).  Nothing leaves
the machine: the bridge has no route out.  Exits 1 when the checker finds a violation.
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import trio

from tests.dledger_faults import FAULTS, cleanup_stale, namespaces_unavailable, run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=24, help="fault rounds (default 24)")
    parser.add_argument(
        "--faults",
        default=",".join(FAULTS),
        help=f"faults to cycle through, in order (default: all of {', '.join(FAULTS)})",
    )
    parser.add_argument("--seed", type=int, default=None, help="which follower each fault hits")
    parser.add_argument("--hold", type=float, default=3.0, help="seconds a fault is held")
    parser.add_argument("--producers", type=int, default=6, help="concurrent senders")
    parser.add_argument(
        "--torn-committed",
        action="store_true",
        help="torn tails with a checkpoint that names the torn entry committed (a member "
        "then never catches up: a known bug, tests/unit/test_dledger_torn_committed.py)",
    )
    parser.add_argument("--workdir", help="stores and logs (default: a temporary directory)")
    parser.add_argument("--cleanup", action="store_true", help="remove a killed run's leftovers")
    args = parser.parse_args()
    why = namespaces_unavailable()
    if why:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    if args.cleanup:
        print("removed:", " ".join(cleanup_stale()) or "nothing")
        return 0
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown:
        parser.error(f"unknown faults {unknown}; known: {', '.join(FAULTS)}")
    plan = list(itertools.islice(itertools.cycle(faults), args.rounds))
    # SIGTERM ends the run as Ctrl-C does: through the harness's cleanup
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with tempfile.TemporaryDirectory(prefix="dledger-faults-") as tmp:
        workdir = Path(args.workdir or tmp)
        report, harness = trio.run(
            lambda: run(workdir, plan, seed=args.seed, hold=args.hold, producers=args.producers)
        )
    for r in harness.rounds:
        print(r.line())
    ran = [r for r in harness.rounds if r.skipped is None]
    print(f"rounds: {len(ran)} run of {len(plan)}: " + ", ".join(r.fault for r in ran))
    for fault, why in sorted({(r.fault, r.skipped) for r in harness.rounds if r.skipped}):
        print(f"skipped {fault}: {why}")
    print(report.summary())
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
