"""scripts/bench_timer.py runs and prints its figures (a small run: the bench's own default is
10 million pending timers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "bench_timer.py")


@pytest.mark.slow
def test_a_small_run_prints_its_figures(tmp_path) -> None:
    out = subprocess.run(
        [sys.executable, SCRIPT, "--count", "3000", "--flush-every", "1000",
         "--due-per-second", "300", "--due-seconds", "1", "--precision-ms", "200",
         "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["bench"] == "timer" and figures["count"] == 3000
    assert figures["handed_out"] == figures["due"] == 300
    assert figures["early"] == 0  # never before its due time
    assert 0 <= figures["late_p99_ms"] <= figures["late_max_ms"]
    assert os.listdir(tmp_path) == []  # its stores removed
