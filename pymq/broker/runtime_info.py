"""GET_BROKER_RUNTIME_INFO: every key Java's 4.9.4 broker reports, with pymq's figures.

The keys, value forms and spacing are Java's (java-wire-samples.md, "GET_BROKER_RUNTIME_INFO");
mqadmin's clusterList and brokerStatus and rocketmq-exporter read them.  Where pymq has the
figure the value is real; where it has no such thing the value is what Java reports for the
same state, documented here:

* ``*ThreadPoolQueueSize`` / ``*HeadWaitTimeMills``: pymq has no thread pools; send and pull
  report the requests received and not yet started on all connections and the longest wait
  among them (what fast failure looks at); query and end-transaction report 0.  The
  ``*Capacity`` keys are the configured capacities.
* ``pageCacheLockTimeMills``: 0 (an append never waits for a lock in pymq).
* ``dispatchMaxBuffer``: 0 (no dispatch buffer); ``remainTransientStoreBufferNumbs``:
  2147483647 (no transient store pool, as Java reports with the pool disabled).
* ``putMessageDistributeTime`` / ``putLatency99`` / ``putLatency999`` /
  ``putMessageEntireTimeMax``: the commit-log append's duration (pymq.store.put_stats).

pymq adds keys of its own (``brokerRole``, ``flushDiskType``, ``diskFull``, HA state, ...;
in DLedger mode ``dLedgerSelfId``, ``dLedgerGroup``, ``dLedgerRole``, ``dLedgerTerm``,
``dLedgerLeaderId``, ``dLedgerLedgerEndIndex``, ``dLedgerCommittedIndex``, ``dLedgerPeers``
(``n0-host:port;n1-host:port``, the group's members) and, on the leader,
``dLedgerFollowerLag``: ``n1:0;n2:3``, entries each follower is known to be missing);
Java's tools ignore keys they do not know.
"""

from __future__ import annotations

import math
import os
import time
from typing import TYPE_CHECKING

from pymq.remoting.codes import CURRENT_VERSION
from pymq.remoting.protocol.fastjson import java_double
from pymq.store.clean_service import disk_space, disk_used_ratio

if TYPE_CHECKING:
    from pymq.broker.controller import BrokerController

BROKER_VERSION_DESC = "V4_9_4"
# The DLedger member's status fields shown as dLedger<Field> (DLedgerServer.status).
DLEDGER_KEYS = ("selfId", "group", "role", "term", "leaderId", "ledgerEndIndex", "committedIndex")
# Integer.MAX_VALUE: remainTransientStoreBufferNumbs without a transient store pool.
NO_TRANSIENT_POOL = 2**31 - 1


def human_bytes(count: int) -> str:
    """UtilAll.humanReadableByteCount(bytes, false): ``0 B``, ``1.5 KiB``, ``252.0 GiB``."""
    if count < 1024:
        return f"{count} B"
    exp = min(int(math.log(count) / math.log(1024)), 6)
    return f"{count / 1024**exp:.1f} {'KMGTPE'[exp - 1]}iB"


def runtime_text(ms: int) -> str:
    """StoreStatsService.getFormatRuntime: ``[ 0 days, 0 hours, 1 minutes, 39 seconds ]``."""
    seconds = max(ms, 0) // 1000
    days, seconds = divmod(seconds, 86400)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    return f"[ {days} days, {hours} hours, {minutes} minutes, {seconds} seconds ]"


def _double(value: float) -> str:
    return java_double(value) or "0.0"


def runtime_info(broker: BrokerController) -> dict[str, str]:
    store, stats, bc = broker.store, broker.stats, broker.broker_config
    store_info = store.runtime_info()
    commitlog_dir = store.config.store_path_commitlog
    ratio = disk_used_ratio(commitlog_dir)
    cq_ratio = disk_used_ratio(store.config.consume_queue_dir)
    space = disk_space(commitlog_dir)
    if space is None:
        capacity = "Total : 0 B, Free : 0 B."
    else:  # Java's "Free" is File.getUsableSpace: what the broker can still write
        capacity = f"Total : {human_bytes(space.total)}, Free : {human_bytes(space.available)}."
    put_times = store.put_message_times_total
    put_size = store.put_message_size_total
    put = store.put_stats
    send, send_wait, pull, pull_wait = broker.fast_failure.water_mark(
        [*broker.server.channels, *broker.fast_server.channels]
    )
    flushed = store.commitlog.queue.flushed_where
    now = int(time.time() * 1000)
    info = {
        "brokerVersionDesc": BROKER_VERSION_DESC,
        "brokerVersion": str(CURRENT_VERSION),
        "bootTimestamp": str(stats.boot_timestamp),
        "runtime": runtime_text(now - stats.boot_timestamp),
        "msgPutTotalTodayNow": str(stats.put_msgs),
        "msgGetTotalTodayNow": str(stats.get_msgs),
        "msgPutTotalTodayMorning": str(stats.put_today_morning),
        "msgGetTotalTodayMorning": str(stats.get_today_morning),
        "msgPutTotalYesterdayMorning": str(stats.put_yesterday_morning),
        "msgGetTotalYesterdayMorning": str(stats.get_yesterday_morning),
        "putTps": stats.tps_java(1),
        "getTransferedTps": stats.tps_java(3),
        "getFoundTps": stats.tps_java(5),
        "getMissTps": stats.tps_java(6),
        "getTotalTps": stats.total_tps_java(),
        "putMessageTimesTotal": str(put_times),
        "putMessageSizeTotal": str(put_size),
        "putMessageAverageSize": _double(put_size / put_times if put_times else 0.0),
        "putMessageFailedTimes": str(put.failed_times),
        "putMessageDistributeTime": put.distribution_text(),
        "putMessageEntireTimeMax": str(put.entire_time_max),
        "putLatency99": f"{put.percentile(0.99):.2f}",
        "putLatency999": f"{put.percentile(0.999):.2f}",
        "getMessageEntireTimeMax": str(put.get_entire_time_max),
        "dispatchMaxBuffer": "0",
        "dispatchBehindBytes": str(store.dispatch_behind_bytes),
        "commitLogMinOffset": str(store.min_phy_offset),
        "commitLogMaxOffset": str(store.max_phy_offset),
        "commitLogDiskRatio": _double(ratio),
        f"commitLogDiskRatio_{os.path.abspath(commitlog_dir)}": _double(ratio),
        "consumeQueueDiskRatio": _double(cq_ratio),
        "commitLogDirCapacity": capacity,
        "earliestMessageTimeStamp": str(store.get_earliest_message_time_store()),
        "remainHowManyDataToFlush": human_bytes(max(store.max_phy_offset - flushed, 0)),
        "remainTransientStoreBufferNumbs": str(NO_TRANSIENT_POOL),
        "pageCacheLockTimeMills": "0",
        "startAcceptSendRequestTimeStamp": str(bc.start_accept_send_request_time_stamp),
        "sendThreadPoolQueueSize": str(send),
        "sendThreadPoolQueueCapacity": str(bc.send_thread_pool_queue_capacity),
        "sendThreadPoolQueueHeadWaitTimeMills": str(send_wait),
        "pullThreadPoolQueueSize": str(pull),
        "pullThreadPoolQueueCapacity": str(bc.pull_thread_pool_queue_capacity),
        "pullThreadPoolQueueHeadWaitTimeMills": str(pull_wait),
        "queryThreadPoolQueueSize": "0",
        "queryThreadPoolQueueCapacity": str(bc.query_thread_pool_queue_capacity),
        "queryThreadPoolQueueHeadWaitTimeMills": "0",
        "EndTransactionQueueSize": "0",
        "EndTransactionThreadPoolQueueCapacity": str(bc.end_transaction_pool_queue_capacity),
    }
    # pymq's own keys, after Java's (never replacing one).
    for key in (
        "flushDiskType",
        "brokerRole",
        "consumeQueueCount",
        "indexFileCount",
        "diskFull",
        "lastExitOk",
        "getMessageTimesTotal",
    ):
        if key in store_info:
            info.setdefault(key, store_info[key])
    if store.dledger is not None:
        dledger = store.dledger.server.status()
        for key in DLEDGER_KEYS:
            value = dledger[key]
            info[f"dLedger{key[0].upper()}{key[1:]}"] = "" if value is None else str(value)
        info["dLedgerPeers"] = str(dledger["peers"])
        info["dLedgerFollowerLag"] = ";".join(
            f"{pid}:{peer['lag']}" for pid, peer in dledger.get("followers", {}).items()
        )
    return info
