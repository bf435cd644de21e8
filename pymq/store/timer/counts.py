"""Pending timers per real topic (RocketMQ 5's ``timermetrics`` timing count), kept exactly and
durable with the checkpoint.

The count of a topic goes up when one of its timers is entered in the wheel and down when the
slot holding it is delivered (or dropped, or rolled: a rolled timer counts again once entered
afresh).  The service changes counts only at the instants it moves ``enqueue_offset`` and
``delivered_ms``, so the counts taken with a checkpoint are those of that checkpoint's state,
and recovery (which enters again from ``enqueue_offset`` and delivers again from ``read_ms``)
redoes exactly the changes made after it.

``config/timermetrics`` holds the counts of the two latest checkpoints, each stamped with its
checkpoint's ``(log_end, enqueue_offset, read_ms)``: it is written (atomically, fsynced) just
before the checkpoint, so whichever checkpoint a crash leaves, the file has its counts.  With
no matching stamp (a store written before this file existed) :meth:`TimerCounts.load` returns
None and the caller counts the pending entries once.  Memory: one int per topic with timers.
"""

from __future__ import annotations

import json
import os

from pymq.store.timer.checkpoint import TimerCheckpoint

TIMER_COUNTS_FILE = os.path.join("config", "timermetrics")


def _stamp(cp: TimerCheckpoint) -> list[int]:
    return [cp.log_end, cp.enqueue_offset, cp.read_ms]


def add(counts: dict[str, int], topic: str, n: int) -> None:
    """``counts[topic] += n``, never below zero; a topic at zero leaves the table."""
    value = counts.get(topic, 0) + n
    if value > 0:
        counts[topic] = value
    else:
        counts.pop(topic, None)


def load(path: str, cp: TimerCheckpoint) -> dict[str, int] | None:
    """The counts stamped with ``cp``; None when the file has none (or is unreadable)."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
        for snap in data["snapshots"]:
            if snap["stamp"] == _stamp(cp):
                counts = snap["timingCount"]
                return {str(k): int(v) for k, v in counts.items() if int(v) > 0}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return None


def save(path: str, cp: TimerCheckpoint, counts: dict[str, int]) -> None:
    """Write ``counts`` stamped with ``cp``, keeping the previous snapshot (blocking)."""
    snapshots: list[dict[str, object]] = []
    try:
        with open(path, "rb") as f:
            old = json.loads(f.read())["snapshots"]
        snapshots = [s for s in old if s["stamp"] != _stamp(cp)][-1:]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    snapshots.append({"stamp": _stamp(cp), "timingCount": counts})
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"snapshots": snapshots}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
