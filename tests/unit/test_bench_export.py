"""scripts/bench_export.py's CPU accounting of the Spark processes (its descendants)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "bench_export.py")


def _bench():
    spec = importlib.util.spec_from_file_location("bench_export", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_descendants_cpu_counts_a_grandchild_while_it_runs():
    bench = _bench()
    burn = (
        "import subprocess, sys\n"
        "code = 'import time\\nt = time.process_time()\\n"
        "while time.process_time() - t < 0.4: pass\\nprint(1, flush=True)\\n"
        "sys.stdin.read()'\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import sys\\n' + code],"
        " stdin=subprocess.PIPE, stdout=sys.stdout)\n"
        "child.communicate(sys.stdin.read())\n"
    )
    before = bench.descendants_cpu()
    parent = subprocess.Popen(
        [sys.executable, "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout.readline().strip() == "1"  # the grandchild burned its CPU
        assert bench.descendants_cpu() - before >= 0.35
    finally:
        parent.communicate("")
