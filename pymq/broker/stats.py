"""BrokerStats: the broker's counters, as RocketMQ's BrokerStatsManager and StatsItem keep them.

Two views of the same traffic:

* broker-wide put/get counters sampled once a second into 600 samples, for the 10 s / 1 min /
  10 min rates of GET_BROKER_RUNTIME_INFO (``putTps``, ``getTransferedTps``, ...);
* named stats items (``TOPIC_PUT_NUMS`` keyed by topic, ``GROUP_GET_NUMS`` keyed by
  ``topic@group``, ``BROKER_PUT_NUMS`` keyed by the cluster name, ...), each a running ``value``
  and ``times`` with snapshots every 10 s (7 kept: the last minute), every 10 min (7: the last
  hour) and every hour (25: the last day), as Java's StatsItem samples them.  A window's
  ``sum`` is the value's growth over the kept snapshots, ``tps`` that growth per second and
  ``avgpt`` the growth per call; VIEW_BROKER_STATS_DATA (315) answers them, and the Prometheus
  endpoint reads the minute's ``tps``.  A key has an item only after its first count, as in
  Java (so 315 answers "not exist" before).

``sample`` runs once a second (a periodic task of the broker).  At most :data:`MAX_STATS_KEYS`
keys are kept per stats name; counts for further keys are dropped (logged once per name).
"""

from __future__ import annotations

import collections
import logging
import time

import trio

from pymq.remoting.protocol.body import BrokerStatsData, BrokerStatsItem

log = logging.getLogger(__name__)

# Seconds of history kept: the longest window RocketMQ reports (10 minutes).
HISTORY_SECONDS = 600

# BrokerStatsManager's stats names (the ones pymq counts).
TOPIC_PUT_NUMS = "TOPIC_PUT_NUMS"
TOPIC_PUT_SIZE = "TOPIC_PUT_SIZE"
GROUP_GET_NUMS = "GROUP_GET_NUMS"
GROUP_GET_SIZE = "GROUP_GET_SIZE"
SNDBCK_PUT_NUMS = "SNDBCK_PUT_NUMS"
BROKER_PUT_NUMS = "BROKER_PUT_NUMS"
BROKER_GET_NUMS = "BROKER_GET_NUMS"
GROUP_GET_LATENCY = "GROUP_GET_LATENCY"
STATS_NAMES = (
    TOPIC_PUT_NUMS,
    TOPIC_PUT_SIZE,
    GROUP_GET_NUMS,
    GROUP_GET_SIZE,
    SNDBCK_PUT_NUMS,
    BROKER_PUT_NUMS,
    BROKER_GET_NUMS,
    GROUP_GET_LATENCY,
)
# Most keys (topics, topic@group pairs) one stats name keeps.
MAX_STATS_KEYS = 20_000
# StatsItem: snapshot periods (seconds) and how many snapshots each window keeps.
MINUTE_PERIOD, MINUTE_KEEP = 10.0, 7
HOUR_PERIOD, HOUR_KEEP = 600.0, 7
DAY_PERIOD, DAY_KEEP = 3600.0, 25


class StatsItem:
    """One key's running value and call count, with its minute/hour/day snapshots."""

    __slots__ = ("day", "hour", "minute", "times", "value")

    def __init__(self) -> None:
        self.value = 0
        self.times = 0
        # (wall-clock ms, times, value) snapshots, oldest first.
        self.minute: collections.deque[tuple[int, int, int]] = collections.deque(maxlen=MINUTE_KEEP)
        self.hour: collections.deque[tuple[int, int, int]] = collections.deque(maxlen=HOUR_KEEP)
        self.day: collections.deque[tuple[int, int, int]] = collections.deque(maxlen=DAY_KEEP)

    def add(self, value: int, times: int) -> None:
        self.value += value
        self.times += times

    @staticmethod
    def window(snapshots: collections.deque[tuple[int, int, int]]) -> BrokerStatsItem:
        """StatsItem.computeStatsData: growth between the first and last snapshot kept."""
        if len(snapshots) < 2:
            return BrokerStatsItem()
        first, last = snapshots[0], snapshots[-1]
        total = last[2] - first[2]
        elapsed = last[0] - first[0]
        calls = last[1] - first[1]
        return BrokerStatsItem(
            sum=total,
            tps=total * 1000.0 / elapsed if elapsed > 0 else 0.0,
            avgpt=total / calls if calls > 0 else 0.0,
        )

    def data(self) -> BrokerStatsData:
        return BrokerStatsData(
            stats_minute=self.window(self.minute),
            stats_hour=self.window(self.hour),
            stats_day=self.window(self.day),
        )


class BrokerStats:
    def __init__(self, cluster_name: str = "DefaultCluster") -> None:
        self.cluster_name = cluster_name
        self.put_msgs = 0
        self.put_bytes = 0
        self.get_msgs = 0
        self.get_bytes = 0
        self.boot_timestamp = int(time.time() * 1000)
        # Pulls that found messages, and pulls that found none (getFoundTps, getMissTps).
        self.get_found = 0
        self.get_miss = 0
        self._samples: collections.deque[tuple[float, int, int, int, int, int, int]] = (
            collections.deque(maxlen=HISTORY_SECONDS + 1)
        )
        self.items: dict[str, dict[str, StatsItem]] = {name: {} for name in STATS_NAMES}
        self._full_logged: set[str] = set()
        # The hot path's shortcuts to items (see on_put).
        self._put_items: dict[str, tuple[StatsItem, StatsItem]] = {}
        self._broker_put: StatsItem | None = None
        self._next_snapshot = {"minute": 0.0, "hour": 0.0, "day": 0.0}
        # Totals at the last local midnight and the one before (the *Morning keys).
        self._day = time.localtime().tm_yday
        self.put_today_morning = 0
        self.get_today_morning = 0
        self.put_yesterday_morning = 0
        self.get_yesterday_morning = 0

    # -- counting -----------------------------------------------------------------------------

    def _item(self, name: str, key: str) -> StatsItem | None:
        table = self.items[name]
        item = table.get(key)
        if item is None:
            if len(table) >= MAX_STATS_KEYS:
                if name not in self._full_logged:
                    self._full_logged.add(name)
                    log.warning("stats %s keep %d keys; new keys are not counted", name, len(table))
                return None
            item = table[key] = StatsItem()
        return item

    def _inc(self, name: str, key: str, value: int, times: int) -> None:
        item = self._item(name, key)
        if item is not None:
            item.add(value, times)

    def on_put(self, msgs: int, size: int, topic: str | None = None, sends: int = 1) -> None:
        """``sends`` stored sends of ``msgs`` messages and ``size`` bytes in all (several when
        a run of sends is counted at once): on the hot path, so the topic's two items are
        looked up once."""
        self.put_msgs += msgs
        self.put_bytes += size
        if topic is not None:
            pair = self._put_items.get(topic)
            if pair is None:
                pair = self._put_pair(topic)
            if pair is not None:
                nums, sizes = pair
                nums.value += msgs
                nums.times += sends
                sizes.value += size
                sizes.times += sends
        broker = self._broker_put or self._item(BROKER_PUT_NUMS, self.cluster_name)
        if broker is not None:
            self._broker_put = broker
            broker.value += msgs
            broker.times += sends

    def _put_pair(self, topic: str) -> tuple[StatsItem, StatsItem] | None:
        nums = self._item(TOPIC_PUT_NUMS, topic)
        sizes = self._item(TOPIC_PUT_SIZE, topic)
        if nums is None or sizes is None:
            return None
        if len(self._put_items) >= MAX_STATS_KEYS:
            self._put_items.clear()
        self._put_items[topic] = (nums, sizes)
        return nums, sizes

    def on_get(
        self, msgs: int, size: int, topic: str | None = None, group: str | None = None
    ) -> None:
        self.get_msgs += msgs
        self.get_bytes += size
        if topic is not None and group is not None:
            key = f"{topic}@{group}"
            self._inc(GROUP_GET_NUMS, key, msgs, 1)
            self._inc(GROUP_GET_SIZE, key, size, 1)
        self._inc(BROKER_GET_NUMS, self.cluster_name, msgs, 1)

    def on_send_back(self, group: str, topic: str) -> None:
        self._inc(SNDBCK_PUT_NUMS, f"{topic}@{group}", 1, 1)

    def on_topic_deleted(self, topic: str) -> None:
        """BrokerStatsManager.onTopicDeleted: the topic's items go, and those of its groups
        (keys ``topic@group``, ``queueId@topic@group``), so that a deleted topic is no longer
        reported and its keys no longer count against :data:`MAX_STATS_KEYS`."""
        self._put_items.pop(topic, None)
        self.items[TOPIC_PUT_NUMS].pop(topic, None)
        self.items[TOPIC_PUT_SIZE].pop(topic, None)
        prefix = topic + "@"
        for name in (GROUP_GET_NUMS, GROUP_GET_SIZE, SNDBCK_PUT_NUMS):
            table = self.items[name]
            for key in [k for k in table if k.startswith(prefix)]:
                del table[key]
        latency, infix = self.items[GROUP_GET_LATENCY], "@" + prefix
        for key in [k for k in latency if infix in k]:
            del latency[key]
        self._full_logged = {n for n in self._full_logged if len(self.items[n]) >= MAX_STATS_KEYS}

    def on_get_latency(self, group: str, topic: str, queue_id: int, latency_ms: int) -> None:
        self._inc(GROUP_GET_LATENCY, f"{queue_id}@{topic}@{group}", max(latency_ms, 0), 1)

    def stats_data(self, name: str, key: str) -> BrokerStatsData | None:
        """VIEW_BROKER_STATS_DATA: the key's three windows, None if it has no item."""
        item = self.items.get(name, {}).get(key)
        return item.data() if item is not None else None

    def minute_tps(self, name: str, key: str) -> float:
        item = self.items.get(name, {}).get(key)
        return StatsItem.window(item.minute).tps if item is not None else 0.0

    # -- sampling -----------------------------------------------------------------------------

    def sample(self) -> None:
        now = trio.current_time()
        self._samples.append(
            (
                now,
                self.put_msgs,
                self.put_bytes,
                self.get_msgs,
                self.get_bytes,
                self.get_found,
                self.get_miss,
            )
        )
        wall = int(time.time() * 1000)
        for window, period in (
            ("minute", MINUTE_PERIOD),
            ("hour", HOUR_PERIOD),
            ("day", DAY_PERIOD),
        ):
            if now >= self._next_snapshot[window]:
                self._next_snapshot[window] = now + period
                self.snapshot(window, wall)
        day = time.localtime().tm_yday
        if day != self._day:
            self._day = day
            self.roll_day()

    def snapshot(self, window: str, wall_ms: int) -> None:
        """Add a snapshot of every item to ``window`` ("minute", "hour" or "day")."""
        for table in self.items.values():
            for item in table.values():
                getattr(item, window).append((wall_ms, item.times, item.value))

    def on_pull(self, found: bool) -> None:
        if found:
            self.get_found += 1
        else:
            self.get_miss += 1

    def rate(self, window: float, field: int = 1) -> float:
        """Per-second rate of a counter (1 put msgs, 2 put bytes, 3 get msgs, 4 get bytes,
        5 pulls that found messages, 6 pulls that found none)."""
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

    def java_rate(self, window: int, field: int) -> str:
        """StoreStatsService's rate text: ``""`` until ``window`` seconds have been sampled."""
        if len(self._samples) <= window:
            return ""
        newest, oldest = self._samples[-1], self._samples[-1 - window]
        elapsed = newest[0] - oldest[0]
        return repr((newest[field] - oldest[field]) / elapsed if elapsed > 0 else 0.0)

    def tps_java(self, field: int) -> str:
        """RocketMQ's runtime-info form: the 10 s, 1 min and 10 min rates, space-separated
        (an empty place for a window not sampled yet: ``"0.0 0.28 "`` after a minute)."""
        return " ".join(self.java_rate(w, field) for w in (10, 60, 600))

    def total_tps_java(self) -> str:
        """getTotalTps: found plus missed pulls per second, 0.0 for a window not sampled yet."""
        return " ".join(
            repr(float(self.java_rate(w, 5) or 0.0) + float(self.java_rate(w, 6) or 0.0))
            for w in (10, 60, 600)
        )

    def roll_day(self) -> None:
        """Local midnight passed: today's totals become yesterday's (the *Morning keys)."""
        self.put_yesterday_morning = self.put_today_morning
        self.get_yesterday_morning = self.get_today_morning
        self.put_today_morning = self.put_msgs
        self.get_today_morning = self.get_msgs
