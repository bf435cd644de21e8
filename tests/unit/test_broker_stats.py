"""StatsItem windows, the runtime-info rate texts and the put-latency statistics."""

from __future__ import annotations

import trio
import trio.testing

from pymq.broker.runtime_info import human_bytes, runtime_text
from pymq.broker.stats import GROUP_GET_NUMS, TOPIC_PUT_NUMS, BrokerStats
from pymq.store.put_stats import PutStats


def test_stats_item_windows_as_java_computes_them() -> None:
    stats = BrokerStats("C")
    assert stats.stats_data(TOPIC_PUT_NUMS, "T") is None  # no item before the first count
    stats.on_put(2, 200, "T")
    stats.snapshot("minute", 0)
    stats.on_put(3, 300, "T")
    stats.on_put(3, 300, "T")
    stats.snapshot("minute", 60_000)
    data = stats.stats_data(TOPIC_PUT_NUMS, "T")
    assert data is not None
    assert (data.stats_minute.sum, data.stats_minute.tps, data.stats_minute.avgpt) == (6, 0.1, 3.0)
    assert data.stats_hour.sum == 0 and data.stats_day.tps == 0.0
    assert stats.stats_data("BROKER_PUT_NUMS", "C").stats_minute.sum == 6  # type: ignore[union-attr]
    stats.on_get(4, 40, "T", "G")
    assert stats.stats_data(GROUP_GET_NUMS, "T@G") is not None
    assert stats.minute_tps(TOPIC_PUT_NUMS, "T") == 0.1


async def test_rate_texts_leave_unsampled_windows_empty(
    autojump_clock: trio.testing.MockClock,
) -> None:
    stats = BrokerStats()
    for _ in range(12):
        stats.on_put(1, 10)
        stats.on_pull(found=True)
        stats.sample()
        await trio.sleep(1)
    put = stats.tps_java(1)
    ten, minute, ten_minutes = put.split(" ")
    assert float(ten) > 0 and minute == "" and ten_minutes == ""
    assert len(stats.total_tps_java().split(" ")) == 3


def test_put_stats_distribution_and_percentiles() -> None:
    put = PutStats()
    for ms in [0] * 98 + [15, 3000]:
        put.record(ms)
    text = put.distribution_text()
    assert text.startswith("[<=0ms]:98 [0~10ms]:0 [10~50ms]:1 ")
    assert text.endswith("[2~3s]:0 [3~4s]:1 [4~5s]:0 [5~10s]:0 [10s~]:0 ")
    assert put.entire_time_max == 3000
    assert put.percentile(0.99) == 0.0  # nothing in the previous minute yet
    put.roll()
    assert 0 < put.percentile(0.99) <= 15
    assert put.percentile(1.0) > 2000


def test_human_forms() -> None:
    assert human_bytes(0) == "0 B"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(252 * 1024**3) == "252.0 GiB"
    assert runtime_text(99_000) == "[ 0 days, 0 hours, 1 minutes, 39 seconds ]"


def test_a_deleted_topics_stats_go() -> None:
    stats = BrokerStats()
    stats.on_put(1, 10, "Gone")
    stats.on_put(1, 10, "Kept")
    stats.on_get(1, 10, "Gone", "G")
    stats.on_get(1, 10, "Kept", "G")
    stats.on_send_back("G", "Gone")
    stats.on_get_latency("G", "Gone", 3, 5)
    stats.on_topic_deleted("Gone")
    for name, table in stats.items.items():
        assert not [k for k in table if "Gone" in k], name
    assert "Kept" in stats.items[TOPIC_PUT_NUMS] and "Kept@G" in stats.items[GROUP_GET_NUMS]
    stats.on_put(2, 20, "Gone")  # counted afresh, not into a forgotten item
    assert stats.items[TOPIC_PUT_NUMS]["Gone"].value == 2
