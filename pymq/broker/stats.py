"""BrokerStats: put/get counters and their rates over the last 10 s, 1 min and 10 min.

``sample`` runs once a second (a periodic task of the broker) and keeps 600 samples, so a rate is
the difference of two samples divided by the time between them.
"""

from __future__ import annotations

import collections
import time

import trio

# Seconds of history kept: the longest window RocketMQ reports (10 minutes).
HISTORY_SECONDS = 600


class BrokerStats:
    def __init__(self) -> None:
        self.put_msgs = 0
        self.put_bytes = 0
        self.get_msgs = 0
        self.get_bytes = 0
        self.boot_timestamp = int(time.time() * 1000)
        self._samples: collections.deque[tuple[float, int, int, int, int]] = collections.deque(
            maxlen=HISTORY_SECONDS + 1
        )

    def on_put(self, msgs: int, size: int) -> None:
        self.put_msgs += msgs
        self.put_bytes += size

    def on_get(self, msgs: int, size: int) -> None:
        self.get_msgs += msgs
        self.get_bytes += size

    def sample(self) -> None:
        self._samples.append(
            (trio.current_time(), self.put_msgs, self.put_bytes, self.get_msgs, self.get_bytes)
        )

    def rate(self, window: float, field: int = 1) -> float:
        """Per-second rate of a counter (1 put msgs, 2 put bytes, 3 get msgs, 4 get bytes)."""
        if len(self._samples) < 2:
            return 0.0
        newest = self._samples[-1]
        oldest = newest
        for sample in reversed(self._samples):
            oldest = sample
            if newest[0] - sample[0] >= window:
                break
        elapsed = newest[0] - oldest[0]
        return (newest[field] - oldest[field]) / elapsed if elapsed > 0 else 0.0

    def tps_text(self, field: int) -> str:
        return " ".join(f"{self.rate(w, field):.2f}" for w in (10, 60, 600))
