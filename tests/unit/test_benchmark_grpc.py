"""scripts/benchmark.py --grpc: the official 5.x client's publish and receive+ack beside the 4.x
client's on one fresh pymq, with the broker's CPU per message read from /proc (the client's
threads in this process not counted), ends with a JSON line of every phase's figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PHASES = (
    "remoting_sync",
    "grpc_sync",
    "remoting_async",
    "grpc_async",
    "remoting_consume",
    "grpc_receive",
)

pytest.importorskip("rocketmq.v5.producer")


@pytest.mark.slow
def test_grpc_mode_prints_both_protocols_figures(tmp_path) -> None:
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "benchmark.py"), "--grpc"]
    cmd += ["-q", "200", "--threads", "2", "-w", "16", "--grpc-rounds", "1", "-s", "128"]
    done = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=dict(os.environ)
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["system"] == "pymq-grpc" and result["threads"] == 2
    for phase in PHASES:
        assert result[f"{phase}_failures"] == 0, phase
        assert result[f"{phase}_msgs_per_s"] > 0, phase
        assert result[f"{phase}_server_us_per_msg"] >= 0, phase
    for grpc in ("grpc_sync", "grpc_async", "grpc_receive"):
        assert result[f"{grpc}_cpu_ratio_median"] > 0
    assert "median ratio" in done.stderr and "(target <= 1.5)" in done.stderr
