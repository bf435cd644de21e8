"""Run a pymq command with its event loop's longest task steps recorded.

    python scripts/loop_steps.py REPORT.json -m pymq [pymq's arguments]

A Trio instrument times every task step: its wall time and the CPU time of the loop's thread
in it.  On SIGUSR1 the longest steps since the last SIGUSR1 are written to REPORT.json
(atomically: a temporary file renamed) and the record starts again.  A probe connection's
round trip (scripts/bench_hostile.py) also counts the machine's other load (the bench client
shares its cores); the loop's own steps say what the broker's code held the loop for: a step
with a long wall time and little CPU waited on the machine (descheduled, a page fault, the
GIL), one with as much CPU as wall time was work on the loop.  The longest garbage collection
of the loop's thread is recorded too (``gc_ms``: a pause inside some step, whichever it was).
"""

from __future__ import annotations

import gc
import json
import os
import runpy
import signal
import sys
import threading
import time
import types
from typing import Any

import trio

KEEP = 5


class StepRecorder(trio.abc.Instrument):
    def __init__(self, report: str) -> None:
        self.report = report
        self.worst: list[tuple[float, float, str]] = []
        self.floor = 0.0
        self._wall = 0.0
        self._cpu = 0.0
        self.gc_worst = 0.0
        self._gc_start = 0.0
        self._loop_thread = threading.get_ident()

    def gc_phase(self, phase: str, info: dict[str, int]) -> None:
        if threading.get_ident() != self._loop_thread:
            return
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.gc_worst = max(self.gc_worst, time.perf_counter() - self._gc_start)

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._wall = time.perf_counter()
        self._cpu = time.thread_time()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        wall = time.perf_counter() - self._wall
        if wall > self.floor:
            self.worst.append((wall, time.thread_time() - self._cpu, task.name))
            self.worst.sort(reverse=True)
            del self.worst[KEEP:]
            if len(self.worst) == KEEP:
                self.floor = self.worst[-1][0]

    def write(self, _signum: int, _frame: types.FrameType | None) -> None:
        steps = [
            {"wall_ms": round(w * 1000, 1), "cpu_ms": round(c * 1000, 1), "task": name}
            for w, c, name in self.worst
        ]
        tmp = f"{self.report}.tmp"
        with open(tmp, "w") as out:
            json.dump({"steps": steps, "gc_ms": round(self.gc_worst * 1000, 1)}, out)
        os.replace(tmp, self.report)
        self.worst = []
        self.floor = 0.0
        self.gc_worst = 0.0


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[2] != "-m":
        raise SystemExit("usage: loop_steps.py REPORT.json -m MODULE [ARGS...]")
    recorder = StepRecorder(sys.argv[1])
    signal.signal(signal.SIGUSR1, recorder.write)
    gc.callbacks.append(recorder.gc_phase)
    real_run = trio.run

    def run(*args: Any, **kwargs: Any) -> Any:
        kwargs["instruments"] = [*kwargs.get("instruments", ()), recorder]
        return real_run(*args, **kwargs)

    trio.run = run  # type: ignore[assignment]
    module = sys.argv[3]
    sys.argv = [module, *sys.argv[4:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
