"""Prometheus metrics: ``/metrics`` with rocketmq-exporter's metric names, served by the broker.

RocketMQ 5.x's keys turn it on: ``metricsExporterType=PROM`` serves on
``metricsPromExporterHost`` (blank: ``brokerIP1``) port ``metricsPromExporterPort`` (5557).  The
names and labels are those of apache/rocketmq-exporter (``rocketmq_producer_tps``,
``rocketmq_consumer_offset``, ``rocketmq_brokeruntime_*``, ...), so the Grafana dashboard
published for that exporter works against the broker with no exporter process; the values are
computed the way the exporter computes them from the admin answers (VIEW_BROKER_STATS_DATA's
minute TPS, topic and consume stats, runtime info), at scrape time, from the broker's own state.
``rocketmq_message_accumulation`` (the dashboard computes it from two others) is served too.

With ``timerWheelEnable`` on a master, RocketMQ 5's timer metrics (DefaultStoreMetricsManager),
with its labels ``cluster``, ``node_type`` (``broker``), ``node_id`` (the broker name),
``storage_type`` (``local``), ``storage_medium`` (``disk``), and ``topic`` (the real topic) on
the per-topic ones:

- ``rocketmq_timer_enqueue_total`` / ``rocketmq_timer_dequeue_total`` (counters, per topic):
  timer messages read from the timer topic / put out of the wheel (to their real topic, or
  back to the timer topic by a roll) since the broker started;
- ``rocketmq_timing_messages`` (per topic): timers pending in the wheel;
- ``rocketmq_timer_enqueue_lag``: timer-topic messages not yet read;
- ``rocketmq_timer_enqueue_latency``: milliseconds since the last message read was stored (0
  when none was read in the last 2 s);
- ``rocketmq_timer_dequeue_lag``: timers pending in the wheel (all topics);
- ``rocketmq_timer_dequeue_latency``: how far the wheel's delivery is behind the clock, in whole
  seconds (RocketMQ 5 records seconds there).

Not served: ``rocketmq_timer_message_snapshot`` (a walk over a day of wheel slots per scrape).

With ``grpcServerPort`` set, RocketMQ 5's ``rocketmq_rpc_latency`` histogram (milliseconds,
buckets 1, 3, 5, 10, 50, 100, 1000, 3000, 10000) of the gRPC calls served, labelled
``protocol_type`` (``grpc``), ``request_code`` (the method; ``unknown`` for one not served) and
``response_code`` (the gRPC status); its ``_count`` is the calls.  And RocketMQ 5's
``rocketmq_consumer_inflight_messages`` gauge (labels ``topic``, ``consumer_group``): the
messages 5.x consumers received by POP and have not acked yet (invisible, or visible again and
waiting to be received again).

The ``rocketmq_client_*`` gauges come, as the exporter gets them, from asking each online
consumer for its running info (GET_CONSUMER_RUNNING_INFO's ``statusTable``): the server does so
every :data:`CLIENT_METRICS_PERIOD` seconds (at most :data:`MAX_CLIENTS_PER_ROUND` clients,
:data:`CLIENT_CALL_TIMEOUT` seconds each) and serves the last answers.  Not served:
``rocketmq_broker_commitlog_diff`` (needs the slaves' offsets).

The text is written by ``prometheus_client`` from one collector's metrics, gathered on the event
loop in slices and written out in a worker thread.  The HTTP side is a small Trio server in the
broker's nursery: ``GET /metrics`` only, one request per connection, at most
:data:`MAX_CONNECTIONS` at once, a request head of at most :data:`MAX_HEAD_BYTES` read within
:data:`HEAD_TIMEOUT` seconds (a scraper that sends half a request and stops is closed then), and
an answer written within :data:`WRITE_TIMEOUT` seconds (a scraper that does not read it is
closed then, freeing its slot; before #37 it held the slot for good, and 16 of them kept every
scrape at 503).  A connection therefore lives at most
``HEAD_TIMEOUT + WRITE_TIMEOUT`` seconds (plus :data:`DRAIN_TIMEOUT` after a refused head).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from pymq.broker.stats import (
    BROKER_GET_NUMS,
    BROKER_PUT_NUMS,
    GROUP_GET_NUMS,
    GROUP_GET_SIZE,
    SNDBCK_PUT_NUMS,
    TOPIC_PUT_NUMS,
    TOPIC_PUT_SIZE,
    StatsItem,
)
from pymq.broker.timer import ENQUEUE_LATENCY_WINDOW_SECONDS
from pymq.common.serde import read_body
from pymq.common.topic import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX, TIMER_TOPIC
from pymq.remoting import headers as H
from pymq.remoting.channel import Channel
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.remoting.errors import RemotingError
from pymq.remoting.protocol import fastjson
from pymq.store.clean_service import disk_space

if TYPE_CHECKING:
    from pymq.broker.controller import BrokerController

log = logging.getLogger(__name__)

# metricsExporterType values: RocketMQ 5.x's MetricsExporterType; pymq serves PROM.
EXPORTER_DISABLE, EXPORTER_PROM = "DISABLE", "PROM"
EXPORTER_TYPES = ("DISABLE", "OTLP_GRPC", "PROM", "LOG")
METRICS_PATH = "/metrics"
# Limits of the HTTP side.
MAX_CONNECTIONS = 16
MAX_HEAD_BYTES = 8192
HEAD_TIMEOUT = 10.0
# An answer not taken by the scraper within this is abandoned and the connection closed
# (Prometheus's own scrape_timeout defaults to 10 s).
WRITE_TIMEOUT = 10.0
# After refusing an oversized head: how long and how much more is read before closing.
DRAIN_TIMEOUT = 1.0
DRAIN_MAX_BYTES = 1024 * 1024

# rocketmq_brokeruntime_* gauges read from GET_BROKER_RUNTIME_INFO's table: name -> key.
RUNTIME_GAUGES = {
    "msg_put_total_today_now": "msgPutTotalTodayNow",
    "msg_gettotal_today_now": "msgGetTotalTodayNow",
    "msg_gettotal_yesterdaymorning": "msgGetTotalYesterdayMorning",
    "msg_puttotal_yesterdaymorning": "msgPutTotalYesterdayMorning",
    "msg_gettotal_todaymorning": "msgGetTotalTodayMorning",
    "msg_puttotal_todaymorning": "msgPutTotalTodayMorning",
    "dispatch_behind_bytes": "dispatchBehindBytes",
    "put_message_size_total": "putMessageSizeTotal",
    "put_message_average_size": "putMessageAverageSize",
    "query_threadpool_queue_capacity": "queryThreadPoolQueueCapacity",
    "remain_transientstore_buffer_numbs": "remainTransientStoreBufferNumbs",
    "earliest_message_timestamp": "earliestMessageTimeStamp",
    "putmessage_entire_time_max": "putMessageEntireTimeMax",
    "start_accept_sendrequest_time": "startAcceptSendRequestTimeStamp",
    "send_threadpool_queue_size": "sendThreadPoolQueueSize",
    "putmessage_times_total": "putMessageTimesTotal",
    "getmessage_entire_time_max": "getMessageEntireTimeMax",
    "pagecache_lock_time_mills": "pageCacheLockTimeMills",
    "commitlog_disk_ratio": "commitLogDiskRatio",
    "consumequeue_disk_ratio": "consumeQueueDiskRatio",
    "put_latency_99": "putLatency99",
    "put_latency_999": "putLatency999",
    "dispatch_maxbuffer": "dispatchMaxBuffer",
    "pull_threadpoolqueue_capacity": "pullThreadPoolQueueCapacity",
    "send_threadpoolqueue_capacity": "sendThreadPoolQueueCapacity",
    "pull_threadpoolqueue_size": "pullThreadPoolQueueSize",
    "query_threadpoolqueue_size": "queryThreadPoolQueueSize",
    "pull_threadpoolqueue_headwait_timemills": "pullThreadPoolQueueHeadWaitTimeMills",
    "query_threadpoolqueue_headwait_timemills": "queryThreadPoolQueueHeadWaitTimeMills",
    "send_threadpoolqueue_headwait_timemills": "sendThreadPoolQueueHeadWaitTimeMills",
    "commitlog_maxoffset": "commitLogMaxOffset",
    "commitlog_minoffset": "commitLogMinOffset",
}
# The three windows of the *Tps keys: metric name stem -> key.
RUNTIME_TPS = {
    "put_tps": "putTps",
    "getfound_tps": "getFoundTps",
    "getmiss_tps": "getMissTps",
    "gettotal_tps": "getTotalTps",
    "gettransfered_tps": "getTransferedTps",
}
# putMessageDistributeTime's ranges, in its order: metric suffix of each.
PMDT_SUFFIXES = (
    "0ms",
    "0to10ms",
    "10to50ms",
    "50to100ms",
    "100to200ms",
    "200to500ms",
    "500to1s",
    "1to2s",
    "2to3s",
    "3to4s",
    "4to5s",
    "5to10s",
    "10stomore",
)
DLEDGER_LABELS = ["cluster", "brokerName", "group", "selfId"]
# The rocketmq_client_* gauges: metric name -> ConsumeStatus field.
CLIENT_GAUGES = {
    "rocketmq_client_consume_fail_msg_count": "consumeFailedMsgs",
    "rocketmq_client_consume_fail_msg_tps": "consumeFailedTPS",
    "rocketmq_client_consume_ok_msg_tps": "consumeOKTPS",
    "rocketmq_client_consume_rt": "consumeRT",
    "rocketmq_client_consumer_pull_rt": "pullRT",
    "rocketmq_client_consumer_pull_tps": "pullTPS",
}
CLIENT_LABELS = ["clientAddr", "clientId", "group", "topic"]
# RocketMQ 5's store metric labels (BrokerMetricsManager's and DefaultStoreMetricsManager's).
STORE_LABELS = ["cluster", "node_type", "node_id", "storage_type", "storage_medium"]
# How often the online consumers are asked for their status, how many per round at most, and
# how long each may take to answer.
CLIENT_METRICS_PERIOD = 30.0
MAX_CLIENTS_PER_ROUND = 1000
CLIENT_CALL_TIMEOUT = 5.0
RUNTIME_LABELS = ["cluster", "brokerIP", "brokerHost", "des", "boottime", "broker_version"]
TOPIC_LABELS = ["cluster", "broker", "topic"]
GROUP_LABELS = ["cluster", "broker", "topic", "group"]
BROKER_LABELS = ["cluster", "brokerIP", "broker"]
GRPC_LABELS = [
    "cluster", "node_type", "node_id", "protocol_type", "request_code", "response_code"
]  # fmt: skip
INFLIGHT_LABELS = ["cluster", "node_type", "node_id", "topic", "consumer_group"]
# A scrape reads the broker's state on the event loop in slices of this many topics (or groups,
# or stats rows), giving the loop back between them: one pass over 3,000 topics took 58 ms of
# CPU (#37), now a few milliseconds at a time.
SLICE = 256


class _Pause:
    """Yielded by the collector's passes between slices (see :data:`SLICE`)."""


PAUSE = _Pause()


def _number(text: str | None) -> float:
    try:
        return float(text) if text else 0.0
    except ValueError:
        return 0.0


def _windows(text: str | None) -> list[float]:
    """The 10 s, 1 min and 10 min values of a ``*Tps`` text (0 for an unsampled window)."""
    parts = (text or "").split(" ")
    return [_number(parts[i]) if i < len(parts) else 0.0 for i in range(3)]


class BrokerCollector(Collector):
    """The exporter's gauges, computed from one broker's state at each scrape."""

    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker
        # (clientAddr, clientId, group, topic) -> that topic's ConsumeStatus, as last answered.
        self.client_status: dict[tuple[str, str, str, str], dict[str, object]] = {}

    def collect(self) -> Iterable[Metric]:
        return (m for m in self.passes() if not isinstance(m, _Pause))

    def passes(self) -> Iterator[Metric | _Pause]:
        """Every metric, with :data:`PAUSE` between slices of the long passes: whoever drives
        it on the event loop yields there (:meth:`MetricsServer.render_async`).  Each pass
        walks a copy of the table it reads, so a change meanwhile is read or not, never an
        error."""
        yield from self._topics()
        yield from self._groups()
        yield from self._broker_nums()
        yield from self._runtime()
        yield from self._clients()
        yield from self._timers()
        yield from self._grpc()
        yield from self._dledger()

    def _clients(self) -> Iterator[Metric]:
        for name, field in CLIENT_GAUGES.items():
            family = GaugeMetricFamily(name, field, labels=CLIENT_LABELS)
            for labels, status in list(self.client_status.items()):
                value = status.get(field)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    family.add_metric(list(labels), float(value))
            yield family

    async def refresh_client_status(self) -> int:
        """Ask each online consumer for its running info; keep the statusTable answers.
        Returns how many clients answered."""
        fresh: dict[tuple[str, str, str, str], dict[str, object]] = {}
        asked = answered = 0
        for group, info in list(self.broker.consumer_manager.groups.items()):
            for client in list(info.channels.values()):
                channel = client.channel
                if asked >= MAX_CLIENTS_PER_ROUND:
                    break
                if not isinstance(channel, Channel) or channel.closed:
                    continue
                asked += 1
                header = H.GetConsumerRunningInfoRequestHeader(group, client.client_id, False)
                request = RemotingCommand.request(
                    RequestCode.GET_CONSUMER_RUNNING_INFO, H.encode(header)
                )
                try:
                    answer = await channel.invoke(request, CLIENT_CALL_TIMEOUT)
                    running = await read_body(fastjson.loads, answer.body, "running info")
                    table = running.get("statusTable", {})
                except (RemotingError, ValueError, AttributeError) as exc:
                    log.debug("running info of %s: %s", client.client_id, exc)
                    continue
                if answer.code != ResponseCode.SUCCESS or not isinstance(table, dict):
                    continue
                answered += 1
                for topic, status in table.items():
                    if isinstance(topic, str) and isinstance(status, dict):
                        key = (client.remote_address, client.client_id, group, topic)
                        fresh[key] = status
        self.client_status = fresh
        return answered

    def _names(self) -> tuple[str, str, str]:
        bc = self.broker.broker_config
        return bc.broker_cluster_name, bc.broker_name, self.broker.broker_addr

    def _minute_tps(
        self, family: GaugeMetricFamily, name: str, labels: Callable[[str], list[str]]
    ) -> Iterator[_Pause]:
        """Add each row of stats ``name`` to ``family``: its minute TPS, labelled from its key."""
        for n, (key, item) in enumerate(list(self.broker.stats.items[name].items()), 1):
            family.add_metric(labels(key), StatsItem.window(item.minute).tps)
            if n % SLICE == 0:
                yield PAUSE

    def _topics(self) -> Iterator[Metric | _Pause]:
        cluster, broker_name, _ = self._names()
        store = self.broker.store

        def by_topic(topic: str) -> list[str]:
            return [cluster, broker_name, topic]

        tps = GaugeMetricFamily("rocketmq_producer_tps", "TopicPutNums", labels=TOPIC_LABELS)
        yield from self._minute_tps(tps, TOPIC_PUT_NUMS, by_topic)
        size = GaugeMetricFamily(
            "rocketmq_producer_message_size", "TopicPutMessageSize", labels=TOPIC_LABELS
        )
        yield from self._minute_tps(size, TOPIC_PUT_SIZE, by_topic)
        offset = GaugeMetricFamily("rocketmq_producer_offset", "TopicOffset", labels=TOPIC_LABELS)
        retry = GaugeMetricFamily(
            "rocketmq_topic_retry_offset", "TopicRetryOffset", labels=TOPIC_LABELS
        )
        dlq = GaugeMetricFamily(
            "rocketmq_topic_dlq_offset", "TopicDLQOffset", labels=["cluster", "broker", "group"]
        )
        for n, (topic, config) in enumerate(
            list(self.broker.topic_config_manager.table.items()), 1
        ):
            if n % SLICE == 0:
                yield PAUSE
            total = sum(
                max(store.get_max_offset_in_queue(topic, q), 0)
                for q in range(config.write_queue_nums)
            )
            if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                retry.add_metric([cluster, broker_name, topic], total)
            elif topic.startswith(DLQ_GROUP_TOPIC_PREFIX):
                dlq.add_metric([cluster, broker_name, topic[len(DLQ_GROUP_TOPIC_PREFIX) :]], total)
            else:
                offset.add_metric([cluster, broker_name, topic], total)
        yield from (tps, size, offset, retry, dlq)

    def _groups(self) -> Iterator[Metric | _Pause]:
        cluster, broker_name, _ = self._names()
        b = self.broker
        store = b.store

        def by_group(key: str) -> list[str]:
            topic, _, group = key.rpartition("@")
            return [cluster, broker_name, topic, group]

        consumer_tps = GaugeMetricFamily(
            "rocketmq_consumer_tps", "GroupGetNums", labels=GROUP_LABELS
        )
        yield from self._minute_tps(consumer_tps, GROUP_GET_NUMS, by_group)
        consumer_size = GaugeMetricFamily(
            "rocketmq_consumer_message_size", "GroupGetMessageSize", labels=GROUP_LABELS
        )
        yield from self._minute_tps(consumer_size, GROUP_GET_SIZE, by_group)
        send_back = GaugeMetricFamily(
            "rocketmq_send_back_nums", "SendBackNums", labels=GROUP_LABELS
        )
        for n, (key, item) in enumerate(list(b.stats.items[SNDBCK_PUT_NUMS].items()), 1):
            if n % SLICE == 0:
                yield PAUSE
            topic, _, group = key.rpartition("@")
            send_back.add_metric(
                [cluster, broker_name, topic, group], StatsItem.window(item.minute).sum
            )
        offsets = GaugeMetricFamily(
            "rocketmq_consumer_offset", "GroupBrokerTotalOffset", labels=GROUP_LABELS
        )
        accumulation = GaugeMetricFamily(
            "rocketmq_message_accumulation",
            "How far the group's consumer offset lags behind the topic's (messages)",
            labels=GROUP_LABELS,
        )
        latency = GaugeMetricFamily(
            "rocketmq_group_get_latency_by_storetime",
            "GroupGetLatencyByStoreTime",
            labels=GROUP_LABELS,
        )
        diff_labels = ["group", "topic", "countOfOnlineConsumers", "msgModel"]
        diff = GaugeMetricFamily("rocketmq_group_diff", "GroupDiff", labels=diff_labels)
        retry_diff = GaugeMetricFamily(
            "rocketmq_group_retrydiff", "GroupRetryDiff", labels=diff_labels
        )
        dlq_diff = GaugeMetricFamily("rocketmq_group_dlqdiff", "GroupDLQDiff", labels=diff_labels)
        now = int(time.time() * 1000)
        for n, (key, queues) in enumerate(list(b.consumer_offset_manager.offset_table.items()), 1):
            if n % SLICE == 0:
                yield PAUSE
            topic, _, group = key.rpartition("@")
            config = b.topic_config_manager.select(topic)
            if config is None:
                continue
            consumed = broker_total = lag_ms = 0
            for queue_id in range(config.read_queue_nums):
                broker_offset = max(store.get_max_offset_in_queue(topic, queue_id), 0)
                consumer_offset = max(queues.get(queue_id, 0), 0)
                consumed += consumer_offset
                broker_total += broker_offset
                if consumer_offset < broker_offset:
                    stored = store.get_message_store_timestamp(topic, queue_id, consumer_offset)
                    if stored > 0:
                        lag_ms = max(lag_ms, now - stored)
            labels = [cluster, broker_name, topic, group]
            offsets.add_metric(labels, consumed)
            accumulation.add_metric(labels, max(broker_total - consumed, 0))
            latency.add_metric(labels, lag_ms)
            info = b.consumer_manager.get(group)
            online = len(info.channels) if info is not None else 0
            model = info.message_model.value if info is not None else "CLUSTERING"
            family = diff
            if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                family = retry_diff
            elif topic.startswith(DLQ_GROUP_TOPIC_PREFIX):
                family = dlq_diff
            family.add_metric([group, topic, str(online), model], broker_total - consumed)
        yield from (
            consumer_tps,
            consumer_size,
            send_back,
            offsets,
            accumulation,
            latency,
            diff,
            retry_diff,
            dlq_diff,
        )

    def _timers(self) -> Iterator[Metric | _Pause]:
        timer = self.broker.timer
        timers = timer.timers
        if timers is None:  # off, or a slave: no timer service runs
            return
        cluster, broker_name, _ = self._names()
        store_labels = [cluster, "broker", broker_name, "local", "disk"]
        per_topic = [*STORE_LABELS, "topic"]
        for name, text, table in (
            ("rocketmq_timer_enqueue", "Total number of timer enqueue", timer.enqueue_total),
            ("rocketmq_timer_dequeue", "Total number of timer dequeue", timer.dequeue_total),
        ):
            counter = CounterMetricFamily(name, text, labels=per_topic)
            for n, (topic, count) in enumerate(list(table.items()), 1):
                counter.add_metric([*store_labels, topic], count)
                if n % SLICE == 0:
                    yield PAUSE
            yield counter
        timing = GaugeMetricFamily(
            "rocketmq_timing_messages", "Current message number in timing", labels=per_topic
        )
        for n, (topic, count) in enumerate(list(timers.counts.items()), 1):
            timing.add_metric([*store_labels, topic], count)
            if n % SLICE == 0:
                yield PAUSE
        yield timing
        store = self.broker.store
        now = store.clock_ms()
        cq = store.consume_queues.find(TIMER_TOPIC, 0)
        enqueue_lag = 0 if cq is None else max(cq.max_offset_in_queue - timers.enqueue_offset, 0)
        recent = (
            timer.last_enqueue_at >= 0
            and trio.current_time() - timer.last_enqueue_at < ENQUEUE_LATENCY_WINDOW_SECONDS
        )
        for name, text, value in (
            ("rocketmq_timer_enqueue_lag", "Timer enqueue messages lag", enqueue_lag),
            (
                "rocketmq_timer_enqueue_latency",
                "Timer enqueue latency",
                max(now - timer.last_enqueue_store_ms, 0) if recent else 0,
            ),
            (
                "rocketmq_timer_dequeue_lag",
                "Timer dequeue messages lag",
                sum(timers.counts.values()),
            ),
            (
                "rocketmq_timer_dequeue_latency",
                "Timer dequeue latency",
                max(now - timers.read_ms, 0) // 1000,
            ),
        ):
            gauge = GaugeMetricFamily(name, text, labels=STORE_LABELS)
            gauge.add_metric(store_labels, value)
            yield gauge

    def _grpc(self) -> Iterator[Metric]:
        """``rocketmq_rpc_latency`` (RocketMQ 5's histogram, in ms) of the gRPC calls served
        (grpcServerPort), by method (``request_code``; ``unknown`` for a method not served)
        and gRPC status (``response_code``); its ``_count`` is the calls."""
        server = self.broker.grpc_server
        if server is None:
            return
        cluster, broker_name, _ = self._names()
        family = HistogramMetricFamily(
            "rocketmq_rpc_latency",
            "gRPC calls served, by method and status, and their latency in milliseconds",
            labels=GRPC_LABELS,
        )
        bounds = server.stats.bounds
        for (method, status), (_, total, per_bucket) in sorted(server.stats.table.items()):
            cumulative, buckets = 0, []
            for bound, count in zip(bounds, per_bucket, strict=True):
                cumulative += count
                buckets.append((bound, cumulative))
            family.add_metric(
                [cluster, "broker", broker_name, "grpc", method, str(status)],
                buckets,
                sum_value=total,
            )
        yield family
        inflight = GaugeMetricFamily(
            "rocketmq_consumer_inflight_messages",
            "Messages 5.x (POP) consumers received and have not acked, by topic and group",
            labels=INFLIGHT_LABELS,
        )
        service = self.broker.grpc_service
        counts = service.pop.inflight_counts() if service is not None else {}
        for (group, topic), count in sorted(counts.items()):
            inflight.add_metric([cluster, "broker", broker_name, topic, group], count)
        yield inflight

    def _dledger(self) -> Iterator[Metric]:
        """pymq's own, in DLedger mode: the member's term, whether it leads, its log's end and
        committed index (labels: cluster, brokerName, group, selfId), and on the leader each
        follower's lag in entries (label ``peer`` added)."""
        dledger = self.broker.store.dledger
        if dledger is None:
            return
        status = dledger.server.status()
        cluster, broker_name, _ = self._names()
        labels = [cluster, broker_name, status["group"], status["selfId"]]
        for name, text, value in (
            ("pymq_dledger_term", "DLedger term", status["term"]),
            ("pymq_dledger_is_leader", "1 when this member leads", status["role"] == "LEADER"),
            ("pymq_dledger_ledger_end_index", "Last index in the log", status["ledgerEndIndex"]),
            ("pymq_dledger_committed_index", "Committed index", status["committedIndex"]),
        ):
            gauge = GaugeMetricFamily(name, text, labels=DLEDGER_LABELS)
            gauge.add_metric(labels, float(value))
            yield gauge
        lag = GaugeMetricFamily(
            "pymq_dledger_follower_lag",
            "Entries a follower is known to be missing (on the leader)",
            labels=[*DLEDGER_LABELS, "peer"],
        )
        for peer, follower in status.get("followers", {}).items():
            lag.add_metric([*labels, peer], follower["lag"])
        yield lag

    def _broker_nums(self) -> Iterator[Metric]:
        cluster, broker_name, addr = self._names()
        stats = self.broker.stats
        for name, stats_name, text in (
            ("rocketmq_broker_tps", BROKER_PUT_NUMS, "BrokerPutNums"),
            ("rocketmq_broker_qps", BROKER_GET_NUMS, "BrokerGetNums"),
        ):
            family = GaugeMetricFamily(name, text, labels=BROKER_LABELS)
            family.add_metric([cluster, addr, broker_name], stats.minute_tps(stats_name, cluster))
            yield family

    def _runtime(self) -> Iterator[Metric]:
        cluster, _, addr = self._names()
        table = self.broker.runtime_info()
        labels = [
            cluster,
            addr,
            "",
            table.get("brokerVersionDesc", ""),
            table.get("bootTimestamp", ""),
            table.get("brokerVersion", ""),
        ]

        def gauge(name: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(f"rocketmq_brokeruntime_{name}", name, labels=RUNTIME_LABELS)
            family.add_metric(labels, value)
            return family

        for name, key in RUNTIME_GAUGES.items():
            yield gauge(name, _number(table.get(key)))
        for stem, key in RUNTIME_TPS.items():
            for window, value in zip(("10", "60", "600"), _windows(table.get(key)), strict=True):
                yield gauge(f"{stem}{window}", value)
        counts = self.broker.store.put_stats.distribution
        for suffix, count in zip(PMDT_SUFFIXES, counts, strict=True):
            yield gauge(f"pmdt_{suffix}", count)
        store = self.broker.store
        space = disk_space(store.config.store_path_commitlog)
        # The exporter's free is commitLogDirCapacity's "Free": File.getUsableSpace.
        total, free = (0.0, 0.0) if space is None else (space.total, space.available)
        yield gauge("commitlogdir_capacity_total", total)
        yield gauge("commitlogdir_capacity_free", free)
        flushed = store.commitlog.queue.flushed_where
        yield gauge("remain_howmanydata_toflush", max(store.max_phy_offset - flushed, 0))


class _Snapshot(Collector):
    """Metrics gathered before: the text is written from them in a worker thread, never from
    the broker's live state."""

    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self.metrics


class MetricsServer:
    """``GET /metrics`` over HTTP/1.1 for one broker, as a service of its nursery."""

    def __init__(self, broker: BrokerController, host: str, port: int) -> None:
        self.broker = broker
        self.host = host
        self.port = port
        self.collector = BrokerCollector(broker)
        self._slots = trio.Semaphore(MAX_CONNECTIONS)
        # One scrape rendered at a time: the state of the scrapes that arrive together is read
        # in separate passes of the event loop, not back to back in one.
        self._rendering = trio.Lock()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{METRICS_PATH}"

    async def render_async(self) -> bytes:
        """The exposition text: the broker's state read on the event loop in slices (see
        :data:`SLICE`), the text (some two thirds of the work with thousands of topics) written
        in a worker thread."""
        async with self._rendering:
            metrics = []
            for item in self.collector.passes():
                if isinstance(item, _Pause):
                    await trio.lowlevel.checkpoint()
                else:
                    metrics.append(item)
            snapshot = CollectorRegistry(auto_describe=False)
            snapshot.register(_Snapshot(metrics))
            return await trio.to_thread.run_sync(generate_latest, snapshot)

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"the Prometheus endpoint cannot listen on {self.host}:{self.port} "
                f"(metricsPromExporterHost/metricsPromExporterPort): {exc.strerror or exc}",
            ) from exc
        self.port = listeners[0].socket.getsockname()[1]
        log.info("Prometheus metrics on %s", self.url)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._poll_clients)
            task_status.started(self.port)
            await trio.serve_listeners(self._serve, listeners, handler_nursery=nursery)

    async def _poll_clients(self) -> None:
        while True:
            await trio.sleep(CLIENT_METRICS_PERIOD)
            await self.collector.refresh_client_status()

    async def _serve(self, stream: trio.SocketStream) -> None:
        """One scrape connection; whatever happens in it ends it, never the broker (the
        listener's nursery is the broker's)."""
        try:
            async with stream:
                if self._slots.value == 0:
                    await self._answer(
                        stream, 503, "Service Unavailable", b"too many connections\n"
                    )
                    return
                async with self._slots:
                    await self._serve_one(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the scraper went away (or reset the connection)
        except Exception:
            log.exception("a metrics connection failed; it is closed")

    async def _serve_one(self, stream: trio.SocketStream) -> None:
        head = b""
        with trio.move_on_after(HEAD_TIMEOUT):
            while b"\r\n\r\n" not in head and b"\n\n" not in head:
                chunk = await stream.receive_some(MAX_HEAD_BYTES)
                if not chunk:
                    return
                head += chunk
                if len(head) > MAX_HEAD_BYTES:
                    await self._answer(stream, 431, "Request Header Fields Too Large", b"")
                    await self._drain(stream)
                    return
        if b"\r\n\r\n" not in head and b"\n\n" not in head:
            return  # timed out (or the peer stopped) before the end of the head: no answer
        request_line = head.split(b"\n", 1)[0].decode("latin-1").strip().split(" ")
        if len(request_line) != 3 or not request_line[2].startswith("HTTP/1."):
            await self._answer(stream, 400, "Bad Request", b"bad request line\n")
            return
        method, target, _version = request_line
        path = target.split("?", 1)[0]
        if path != METRICS_PATH:
            await self._answer(stream, 404, "Not Found", b"only /metrics is served\n")
            return
        if method not in ("GET", "HEAD"):
            await self._answer(stream, 405, "Method Not Allowed", b"GET /metrics\n")
            return
        try:
            body = await self.render_async()
        except Exception:
            log.exception("collecting the metrics failed")
            await self._answer(stream, 500, "Internal Server Error", b"collecting failed\n")
            return
        await self._answer(stream, 200, "OK", body, CONTENT_TYPE_LATEST, send_body=method == "GET")

    @staticmethod
    async def _drain(stream: trio.SocketStream) -> None:
        """Read what the client still sends (bounded, briefly) so that closing with unread
        data does not reset the connection before it has read the answer."""
        await stream.send_eof()
        received = 0
        with trio.move_on_after(DRAIN_TIMEOUT):
            while received < DRAIN_MAX_BYTES:
                chunk = await stream.receive_some(MAX_HEAD_BYTES)
                if not chunk:
                    break
                received += len(chunk)

    @staticmethod
    async def _answer(
        stream: trio.SocketStream,
        status: int,
        reason: str,
        body: bytes,
        content_type: str = "text/plain; charset=utf-8",
        *,
        send_body: bool = True,
    ) -> None:
        head = (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        with trio.move_on_after(WRITE_TIMEOUT) as deadline:
            # Two writes rather than a copy of a body that may be megabytes.
            await stream.send_all(head)
            if send_body and body:
                await stream.send_all(body)
        if deadline.cancelled_caught:
            log.info("a metrics scraper did not read its answer in %.0f s: closed", WRITE_TIMEOUT)


def exporter_type(value: str) -> str:
    """The configured metricsExporterType, checked: DISABLE or PROM (others are RocketMQ 5.x's
    OTLP and log exporters, which pymq does not have)."""
    wanted = value.strip().upper()
    if wanted not in EXPORTER_TYPES:
        raise ValueError(
            f"metricsExporterType must be one of {', '.join(EXPORTER_TYPES)}, not {value!r}"
        )
    if wanted not in (EXPORTER_DISABLE, EXPORTER_PROM):
        raise ValueError(
            f"metricsExporterType={wanted} is not supported by pymq: use PROM (Prometheus "
            "/metrics) or DISABLE"
        )
    return wanted
