"""How long puts take, as RocketMQ's StoreStatsService counts it.

``putMessageDistributeTime`` is a histogram of whole milliseconds per put in 13 fixed ranges;
``putLatency99`` / ``putLatency999`` interpolate a percentile over finer buckets (1 ms steps up
to 20 ms, then coarser up to 10 s) filled during the previous minute (:meth:`roll`, every
60 s); ``putMessageEntireTimeMax`` is the longest put seen.  A put is timed from the start of
its append to the commit log to its end (pymq's appends do not wait for a lock).
"""

from __future__ import annotations

import bisect

# The histogram's upper bounds (exclusive; the first is "<= 0 ms") and Java's labels for them.
DISTRIBUTION_BOUNDS = (0, 10, 50, 100, 200, 500, 1000, 2000, 3000, 4000, 5000, 10000)
DISTRIBUTION_LABELS = (
    "<=0ms",
    "0~10ms",
    "10~50ms",
    "50~100ms",
    "100~200ms",
    "200~500ms",
    "500ms~1s",
    "1~2s",
    "2~3s",
    "3~4s",
    "4~5s",
    "5~10s",
    "10s~",
)
# PUT_MESSAGE_ENTIRE_TIME_BUCKETS: (step in ms, how many steps).
_FINE_STEPS = ((1, 20), (2, 15), (5, 10), (10, 10), (50, 6), (100, 5), (1000, 9))


def _fine_bounds() -> list[int]:
    bounds, edge = [], 0
    for step, count in _FINE_STEPS:
        for _ in range(count):
            edge += step
            bounds.append(edge)
    bounds.append(2**63 - 1)
    return bounds


FINE_BOUNDS = _fine_bounds()


class PutStats:
    def __init__(self) -> None:
        self.distribution = [0] * len(DISTRIBUTION_LABELS)
        self.entire_time_max = 0
        self.failed_times = 0
        self._fine = [0] * len(FINE_BOUNDS)
        self._last_fine = [0] * len(FINE_BOUNDS)
        self.get_entire_time_max = 0

    def record(self, millis: int) -> None:
        if millis <= 0:  # nearly every put: under a millisecond
            self.distribution[0] += 1
            self._fine[0] += 1
            return
        self.distribution[bisect.bisect_right(DISTRIBUTION_BOUNDS, millis)] += 1
        self._fine[bisect.bisect_left(FINE_BOUNDS, millis)] += 1
        if millis > self.entire_time_max:
            self.entire_time_max = millis

    def record_quick(self, puts: int = 1) -> None:
        """``record(0)`` for each of ``puts`` puts under a millisecond, nearly every put."""
        self.distribution[0] += puts
        self._fine[0] += puts

    def record_get(self, millis: int) -> None:
        if millis > self.get_entire_time_max:
            self.get_entire_time_max = millis

    def roll(self) -> None:
        """A minute is over: percentiles are read from it, a new one is counted."""
        self._last_fine = self._fine
        self._fine = [0] * len(FINE_BOUNDS)

    def distribution_text(self) -> str:
        return "".join(
            f"[{label}]:{count} "
            for label, count in zip(DISTRIBUTION_LABELS, self.distribution, strict=True)
        )

    def percentile(self, px: float) -> float:
        """findPutMessageEntireTimePX over the previous minute's buckets (ms)."""
        buckets = self._last_fine
        index = int(sum(buckets) * px)
        passed = 0
        for i, count in enumerate(buckets):
            if index <= passed + count:
                relative = index - passed
                low = FINE_BOUNDS[i - 1] if i else 0
                return low + ((FINE_BOUNDS[i] - low) * relative / count if count else 0.0)
            passed += count
        return 0.0
