"""``python -m pymq.admin SUBCOMMAND`` (also ``pymq-admin``): mqadmin's everyday subcommands.

Like mqadmin, it speaks the RocketMQ remoting protocol to the name server (``-n``, default
``$NAMESRV_ADDR``) and to brokers (``-b`` address, or every master of ``-c`` cluster).  Output is
a human table, or JSON with ``--json``.  Failure prints one line, ``error: <reason>``, on stderr
and exits 1; a usage error exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, TextIO

import attrs
import trio
import yaml

from pymq.acl.rpc_hook import AclSigner
from pymq.admin.dledger import dledger_groups
from pymq.broker.admin_service import message_view, perm_text
from pymq.broker.processors.admin import CALL_CLIENT_TIMEOUT
from pymq.broker.subscription_group_manager import SubscriptionGroupConfig
from pymq.common.cli import add_version
from pymq.common.message_id import decode_offset_msg_id
from pymq.common.properties import parse_properties
from pymq.common.recall_handle import RecallHandle
from pymq.common.record import RecordError, decode_record, iter_records
from pymq.common.serde import loads_lenient, to_json
from pymq.common.topic import (
    AUTO_CREATE_TOPIC_KEY_TOPIC,
    CID_RMQ_SYS_TRANS,
    RMQ_SYS_TRANS_HALF_TOPIC,
    RMQ_SYS_TRANS_OP_HALF_TOPIC,
    TRANS_CHECK_MAX_TIME_TOPIC,
)
from pymq.remoting import headers as H
from pymq.remoting.client import RemotingClient, open_remoting_client
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.remoting.errors import RemotingError
from pymq.remoting.protocol import fastjson
from pymq.trace.data import TRACE_TOPIC, TraceView, format_trace, trace_views

# mqadmin's request timeout.
TIMEOUT = 5.0
# A request the broker relays to a client (GET_CONSUMER_RUNNING_INFO, CONSUME_MESSAGE_DIRECTLY)
# waits for the broker's own wait for the client (10 s) and a request's time more, so that the
# broker's answer comes (the client's, or CONSUME_MSG_TIMEOUT), never a timeout of the tool's
# own while the client may still answer.
RELAYED_TIMEOUT = CALL_CLIENT_TIMEOUT + TIMEOUT
# PullSysFlag.FLAG_SUBSCRIPTION: the pull carries its own subscription expression.
PULL_FLAG_SUBSCRIPTION = 0x4
# MixAll.TOOLS_CONSUMER_GROUP: the group tools pull as.
TOOLS_CONSUMER_GROUP = "TOOLS_CONSUMER"
MASTER_ID = 0


class CliError(Exception):
    """A failure reported as one line on stderr, exit status 1."""


@attrs.define
class Output:
    """What a subcommand found: ``data`` for --json, and a table (or lines) for people."""

    data: Any
    headers: list[str] = attrs.Factory(list)
    rows: list[list[object]] = attrs.Factory(list)
    lines: list[str] = attrs.Factory(list)

    def render(self) -> str:
        out = list(self.lines)
        if self.headers:
            out.append(format_table(self.headers, self.rows))
        return "\n".join(out)


def format_table(headers: list[str], rows: list[list[object]]) -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for row in cells:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def format_time(ms: int) -> str:
    if ms <= 0:
        return "-"
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]


def parse_timestamp(text: str) -> int:
    """mqadmin's forms: ``now``, milliseconds, or ``yyyy-MM-dd#HH:mm:ss:SSS`` (local time)."""
    if text == "now":
        return int(time.time() * 1000)
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        moment = datetime.strptime(text, "%Y-%m-%d#%H:%M:%S:%f")
    except ValueError:
        raise CliError(
            f"bad timestamp {text!r}: use now, milliseconds or yyyy-MM-dd#HH:mm:ss:SSS"
        ) from None
    return int(moment.timestamp() * 1000)


def parse_bool(text: str) -> bool:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    raise argparse.ArgumentTypeError(f"expected true or false, not {text!r}")


class Admin:
    """The remote calls the subcommands make, failing with CliError on any refusal."""

    def __init__(self, client: RemotingClient, namesrv: str | None) -> None:
        self.client = client
        self._namesrv = namesrv

    @property
    def namesrv(self) -> str:
        if not self._namesrv:
            raise CliError("no name server address: give -n host:port or set NAMESRV_ADDR")
        return self._namesrv.split(";")[0]

    async def invoke(
        self,
        addr: str,
        code: RequestCode,
        header: object | None = None,
        body: bytes = b"",
        *,
        ok: Sequence[int] = (ResponseCode.SUCCESS,),
        timeout: float = TIMEOUT,
    ) -> RemotingCommand:
        """``code`` with ``header`` (an instance of its class in :mod:`pymq.remoting.headers`,
        written by the one encoder) and ``body`` to ``addr``, waiting ``timeout`` seconds;
        CliError unless answered ``ok``."""
        fields = H.encode(header) if header is not None else None
        try:
            reply = await self.client.invoke(
                addr, RemotingCommand.request(code, fields, body), timeout
            )
        except ValueError as exc:
            raise CliError(str(exc)) from None
        except RemotingError as exc:
            raise CliError(f"{code.name} to {addr} failed: {exc}") from None
        if reply.code not in ok:
            name = _code_name(reply.code)
            # One line: RocketMQ's remarks may carry a second one (the FAQ link).
            remark = (reply.remark or "no remark").splitlines()[0]
            raise CliError(f"{code.name} to {addr}: {name}: {remark}")
        return reply

    async def cluster_info(self) -> dict[str, Any]:
        reply = await self.invoke(self.namesrv, RequestCode.GET_BROKER_CLUSTER_INFO)
        return loads_lenient(reply.body)

    async def route(self, topic: str) -> dict[str, Any]:
        reply = await self.invoke(
            self.namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC, H.GetRouteInfoRequestHeader(topic)
        )
        return loads_lenient(reply.body)

    async def masters_of_cluster(self, cluster: str) -> dict[str, str]:
        """brokerName -> master address for every broker of ``cluster``."""
        info = await self.cluster_info()
        names = info.get("clusterAddrTable", {}).get(cluster)
        if names is None:
            raise CliError(f"no cluster {cluster!r} on name server {self.namesrv}")
        table = info.get("brokerAddrTable", {})
        masters = {}
        for name in sorted(names):
            addrs = {int(k): v for k, v in table.get(name, {}).get("brokerAddrs", {}).items()}
            if MASTER_ID in addrs:
                masters[name] = addrs[MASTER_ID]
        return masters

    async def all_masters(self) -> dict[str, str]:
        info = await self.cluster_info()
        masters = {}
        for name, data in sorted(info.get("brokerAddrTable", {}).items()):
            addrs = {int(k): v for k, v in data.get("brokerAddrs", {}).items()}
            if MASTER_ID in addrs:
                masters[name] = addrs[MASTER_ID]
        return masters

    async def targets(self, args: argparse.Namespace) -> list[str]:
        """The broker addresses a -b / -c subcommand acts on."""
        if getattr(args, "brokerAddr", None):
            return [args.brokerAddr]
        if getattr(args, "clusterName", None):
            masters = await self.masters_of_cluster(args.clusterName)
            if not masters:
                raise CliError(f"cluster {args.clusterName!r} has no master broker")
            return list(masters.values())
        raise CliError("give -b brokerAddr or -c clusterName")

    async def topic_masters(self, topic: str) -> dict[str, str]:
        route = await self.route(topic)
        masters = {}
        for data in route.get("brokerDatas", []):
            addrs = {int(k): v for k, v in data.get("brokerAddrs", {}).items()}
            addr = addrs.get(MASTER_ID) or next(iter(addrs.values()), None)
            if addr:
                masters[data["brokerName"]] = addr
        return dict(sorted(masters.items()))


def _code_name(code: int) -> str:
    try:
        return ResponseCode(code).name
    except ValueError:
        return f"code {code}"


def queue_rows(table: dict[Any, Any]) -> list[dict[str, Any]]:
    """A map keyed by MessageQueue (fastjson's form) as rows: the queue's fields, then the
    value's, ordered by topic and queue id."""
    rows = []
    for mq, value in table.items():
        row = dict(mq)
        row.update(value if isinstance(value, dict) else {"offset": value})
        rows.append(row)
    return sorted(rows, key=lambda r: (r.get("topic", ""), r.get("queueId", 0)))


# -- subcommands ------------------------------------------------------------------------------


async def cluster_list(admin: Admin, args: argparse.Namespace) -> Output:
    info = await admin.cluster_info()
    rows, data = [], []
    for cluster, names in sorted(info.get("clusterAddrTable", {}).items()):
        if args.clusterName and cluster != args.clusterName:
            continue
        for name in sorted(names):
            addrs = info.get("brokerAddrTable", {}).get(name, {}).get("brokerAddrs", {})
            for broker_id, addr in sorted(addrs.items(), key=lambda kv: int(kv[0])):
                try:
                    reply = await admin.invoke(addr, RequestCode.GET_BROKER_RUNTIME_INFO)
                    table = loads_lenient(reply.body).get("table", {})
                except CliError:
                    table = {}
                # The 10 s rate; RocketMQ leaves a window empty until it has been sampled.
                put = ((table.get("putTps") or "").split() or ["0"])[0]
                get = ((table.get("getTransferedTps") or "").split() or ["0"])[0]
                entry = {
                    "clusterName": cluster,
                    "brokerName": name,
                    "brokerId": int(broker_id),
                    "brokerAddr": addr,
                    "version": table.get("brokerVersionDesc"),
                    "inTps": float(put),
                    "outTps": float(get),
                    "msgPutTotalTodayNow": int(table.get("msgPutTotalTodayNow", 0)),
                    "msgGetTotalTodayNow": int(table.get("msgGetTotalTodayNow", 0)),
                    "brokerRole": table.get("brokerRole"),
                    "online": bool(table),
                }
                data.append(entry)
                rows.append(
                    [
                        cluster,
                        name,
                        broker_id,
                        addr,
                        entry["version"],
                        f"{entry['inTps']:.2f}",
                        f"{entry['outTps']:.2f}",
                        entry["msgPutTotalTodayNow"],
                        entry["msgGetTotalTodayNow"],
                        entry["brokerRole"] or "unreachable",
                    ]
                )
    if args.clusterName and not data:
        raise CliError(f"no cluster {args.clusterName!r} on name server {admin.namesrv}")
    headers = [
        "#Cluster Name",
        "#Broker Name",
        "#BID",
        "#Addr",
        "#Version",
        "#InTPS",
        "#OutTPS",
        "#InTotalToday",
        "#OutTotalToday",
        "#Role",
    ]
    return Output(data, headers, rows)


async def dledger_status(admin: Admin, args: argparse.Namespace) -> Output:
    """Each DLedger group's members, term, leader, committed index and each follower's lag,
    from every registered broker's runtime info (pymq/admin/dledger.py)."""
    info = await admin.cluster_info()
    clusters = info.get("clusterAddrTable", {})
    if args.clusterName and args.clusterName not in clusters:
        raise CliError(f"no cluster {args.clusterName!r} on name server {admin.namesrv}")
    names = set(clusters.get(args.clusterName, [])) if args.clusterName else None
    brokers = []
    for name, data in sorted(info.get("brokerAddrTable", {}).items()):
        if names is not None and name not in names:
            continue
        for broker_id, addr in sorted(data.get("brokerAddrs", {}).items()):
            try:
                reply = await admin.invoke(addr, RequestCode.GET_BROKER_RUNTIME_INFO)
                table = loads_lenient(reply.body).get("table", {})
            except CliError:
                table = None
            brokers.append(
                {"brokerName": name, "brokerAddr": addr, "brokerId": int(broker_id), "table": table}
            )
    groups = dledger_groups(brokers)
    lines, rows = [], []
    for g in groups:
        lines.append(
            f"{g['brokerName']} group {g['group']}: term {_cell(g['term'])}, "
            f"leader {g['leaderId'] or 'none'}, committed index {_cell(g['committedIndex'])}"
        )
        for m in g["members"]:
            rows.append(
                [
                    g["brokerName"],
                    g["group"],
                    m["selfId"],
                    m["brokerAddr"] or "unreachable",
                    m["brokerId"],
                    m["role"],
                    m["term"],
                    m["ledgerEndIndex"],
                    m["committedIndex"],
                    m["lag"],
                ]
            )
    if not groups:
        lines.append("no broker in DLedger mode")
        return Output(groups, lines=lines)
    headers = [
        "#Broker Name",
        "#Group",
        "#SelfId",
        "#Addr",
        "#BID",
        "#Role",
        "#Term",
        "#LedgerEnd",
        "#Committed",
        "#Lag",
    ]
    return Output(groups, headers, rows, lines)


async def broker_status(admin: Admin, args: argparse.Namespace) -> Output:
    data: dict[str, Any] = {}
    lines: list[str] = []
    for addr in await admin.targets(args):
        reply = await admin.invoke(addr, RequestCode.GET_BROKER_RUNTIME_INFO)
        table = dict(sorted(loads_lenient(reply.body).get("table", {}).items()))
        data[addr] = table
        prefix = f"{addr:<24}" if len(data) > 1 or args.clusterName else ""
        lines.extend(f"{prefix}{k:<32}: {v}" for k, v in table.items())
    return Output(data, lines=lines)


async def timer_status(admin: Admin, args: argparse.Namespace) -> Output:
    """Pending timer messages per topic on each broker (GET_TIMER_METRICS: the broker lists
    the topics with most, at most a thousand), and when the next ones are due."""
    data: dict[str, Any] = {}
    lines: list[str] = []
    rows: list[list[object]] = []
    for addr in await admin.targets(args):
        reply = await admin.invoke(addr, RequestCode.GET_TIMER_METRICS)
        status = loads_lenient(reply.body) if reply.body else {}
        data[addr] = status
        next_due = status.get("nextDueMs")
        lines.append(
            f"{addr}: {status.get('pendingTotal', 0)} pending in "
            f"{status.get('topicsWithTimers', 0)} topics, next due "
            + (format_time(next_due) if next_due else "none within the scanned slots")
        )
        counts = status.get("timingCount", {})
        for topic, metric in sorted(counts.items(), key=lambda kv: (-kv[1]["count"], kv[0])):
            rows.append([addr, topic, metric["count"]])
    return Output(data, ["#Broker", "#Topic", "#Pending"], rows, lines)


async def recall_message(admin: Admin, args: argparse.Namespace) -> Output:
    """Cancel a pending timer message by the recall handle its send returned (RocketMQ 5's
    RECALL_MESSAGE, to the master of the broker the handle names)."""
    try:
        handle = RecallHandle.decode(args.recallHandle)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    addr = (await admin.topic_masters(args.topic)).get(handle.broker_name)
    if addr is None:
        raise CliError(f"no master of broker {handle.broker_name!r} serves topic {args.topic!r}")
    header = H.RecallMessageRequestHeader(None, args.topic, args.recallHandle)
    reply = await admin.invoke(addr, RequestCode.RECALL_MESSAGE, header)
    msg_id = reply.ext_fields.get("msgId", "")
    return Output({"msgId": msg_id, "broker": addr}, lines=[f"recalled {msg_id} on {addr}"])


async def _grpc_status(admin: Admin, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Each broker's GET_GRPC_STATUS answer (pymq's own), of -g / -t when given; brokers
    without a gRPC port are left out."""
    fields = {}
    if getattr(args, "consumerGroup", None):
        fields["consumerGroup"] = args.consumerGroup
    if getattr(args, "topic", None):
        fields["topic"] = args.topic
    targets = await admin.targets(args) if args.brokerAddr or args.clusterName else None
    if targets is None:
        targets = list((await admin.all_masters()).values())
    found = {}
    for addr in targets:
        try:
            reply = await admin.client.invoke(
                addr, RemotingCommand.request(RequestCode.GET_GRPC_STATUS, fields), TIMEOUT
            )
        except RemotingError as exc:
            raise CliError(f"GET_GRPC_STATUS to {addr} failed: {exc}") from None
        if reply.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
            continue  # not a pymq broker
        if reply.code != ResponseCode.SUCCESS:
            remark = (reply.remark or "no remark").splitlines()[0]
            raise CliError(f"GET_GRPC_STATUS to {addr}: {_code_name(reply.code)}: {remark}")
        status = loads_lenient(reply.body) if reply.body else {}
        if status.get("grpcEnabled"):
            found[addr] = status
    return found


async def grpc_clients(admin: Admin, args: argparse.Namespace) -> Output:
    """The RocketMQ 5 (gRPC) clients connected to each broker: id, address, language and
    version, type, consumer group, topics, and when they last sent a heartbeat."""
    data, rows = {}, []
    for addr, status in (await _grpc_status(admin, args)).items():
        data[addr] = status["clients"]
        for c in status["clients"]:
            rows.append(
                [
                    addr,
                    c["clientId"],
                    c["clientAddr"],
                    f"{c['language'] or '-'} {c['version'] or '-'}",
                    c["clientType"],
                    c["group"] or None,
                    ",".join(c["topics"]) or None,
                    format_time(int(c["lastHeartbeat"])),
                ]
            )
    headers = [
        "#Broker",
        "#ClientId",
        "#ClientAddr",
        "#Language/Version",
        "#Type",
        "#Group",
        "#Topics",
        "#LastHeartbeat",
    ]
    return Output(data, headers, rows)


async def pop_status(admin: Admin, args: argparse.Namespace) -> Output:
    """Messages the RocketMQ 5 (POP) consumers of each broker hold in flight, per group, topic
    and queue: how many, how many still invisible, and the oldest one's offset, delivery
    attempts and remaining invisible time."""
    data, rows = {}, []
    for addr, status in (await _grpc_status(admin, args)).items():
        data[addr] = status["inflight"]
        for q in status["inflight"]:
            rows.append(
                [
                    addr,
                    q["group"],
                    q["topic"],
                    q["queueId"],
                    q["inFlight"],
                    q["invisible"],
                    q["oldestOffset"],
                    q["oldestAttempts"],
                    f"{q['oldestInvisibleMs'] / 1000:.1f}s",
                ]
            )
    headers = [
        "#Broker",
        "#Group",
        "#Topic",
        "#QID",
        "#InFlight",
        "#Invisible",
        "#Oldest Offset",
        "#Oldest Attempts",
        "#Oldest Invisible For",
    ]
    return Output(data, headers, rows)


async def topic_list(admin: Admin, args: argparse.Namespace) -> Output:
    if args.clusterName:
        reply = await admin.invoke(
            admin.namesrv, RequestCode.GET_TOPICS_BY_CLUSTER, H.ClusterHeader(args.clusterName)
        )
    else:
        reply = await admin.invoke(admin.namesrv, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
    topics = sorted(loads_lenient(reply.body).get("topicList", []))
    return Output(topics, lines=topics)


async def topic_route(admin: Admin, args: argparse.Namespace) -> Output:
    route = await admin.route(args.topic)
    rows = []
    for q in sorted(route.get("queueDatas", []), key=lambda q: q["brokerName"]):
        addrs: dict[str, str] = next(
            (b["brokerAddrs"] for b in route["brokerDatas"] if b["brokerName"] == q["brokerName"]),
            {},
        )
        rows.append(
            [
                q["brokerName"],
                ",".join(f"{k}={v}" for k, v in sorted(addrs.items())),
                q["readQueueNums"],
                q["writeQueueNums"],
                perm_text(q["perm"]),
            ]
        )
    headers = ["#Broker Name", "#Addrs", "#Read Queues", "#Write Queues", "#Perm"]
    return Output(route, headers, rows)


async def topic_status(admin: Admin, args: argparse.Namespace) -> Output:
    data, rows = [], []
    for name, addr in (await admin.topic_masters(args.topic)).items():
        reply = await admin.invoke(
            addr, RequestCode.GET_TOPIC_STATS_INFO, H.TopicHeader(args.topic)
        )
        for q in queue_rows(fastjson.loads(reply.body).get("offsetTable", {})):
            q["brokerName"] = name
            data.append(q)
            rows.append(
                [
                    name,
                    q["queueId"],
                    q["minOffset"],
                    q["maxOffset"],
                    format_time(q["lastUpdateTimestamp"]),
                ]
            )
    headers = ["#Broker Name", "#QID", "#Min Offset", "#Max Offset", "#Last Updated"]
    return Output(data, headers, rows)


async def update_topic(admin: Admin, args: argparse.Namespace) -> Output:
    header = H.CreateTopicRequestHeader(
        topic=args.topic,
        default_topic=AUTO_CREATE_TOPIC_KEY_TOPIC,
        read_queue_nums=args.readQueueNums,
        write_queue_nums=args.writeQueueNums,
        perm=args.perm,
        topic_filter_type="SINGLE_TAG",
        topic_sys_flag=0,
        order=args.order,
        attributes=args.attributes,
    )
    done = []
    for addr in await admin.targets(args):
        await admin.invoke(addr, RequestCode.UPDATE_AND_CREATE_TOPIC, header)
        done.append(addr)
    config = {
        "topic": args.topic,
        "readQueueNums": args.readQueueNums,
        "writeQueueNums": args.writeQueueNums,
        "perm": args.perm,
        "topicFilterType": "SINGLE_TAG",
        "order": args.order,
    }
    lines = [f"create topic to {addr} success." for addr in done] + [f"TopicConfig {config}"]
    return Output({"brokers": done, "topicConfig": config}, lines=lines)


async def delete_topic(admin: Admin, args: argparse.Namespace) -> Output:
    addrs = await admin.targets(args)
    for addr in addrs:
        await admin.invoke(addr, RequestCode.DELETE_TOPIC_IN_BROKER, H.TopicHeader(args.topic))
    await admin.invoke(
        admin.namesrv, RequestCode.DELETE_TOPIC_IN_NAMESRV, H.TopicHeader(args.topic)
    )
    where = args.clusterName or args.brokerAddr
    return Output(
        {"topic": args.topic, "brokers": addrs},
        lines=[f"delete topic [{args.topic}] from {where} success."],
    )


async def consumer_progress(admin: Admin, args: argparse.Namespace) -> Output:
    masters = await admin.all_masters()
    if not args.consumerGroup:
        groups: set[str] = set()
        for addr in masters.values():
            reply = await admin.invoke(addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
            groups |= set(loads_lenient(reply.body).get("subscriptionGroupTable", {}))
        data: list[dict[str, Any]] = []
        rows: list[list[object]] = []
        for group in sorted(groups):
            diff, online = 0, 0
            for addr in masters.values():
                reply = await admin.invoke(
                    addr, RequestCode.GET_CONSUME_STATS, H.GetConsumeStatsRequestHeader(group)
                )
                diff += sum(
                    q["brokerOffset"] - q["consumerOffset"]
                    for q in queue_rows(fastjson.loads(reply.body).get("offsetTable", {}))
                )
                conn = await admin.invoke(
                    addr,
                    RequestCode.GET_CONSUMER_CONNECTION_LIST,
                    H.ConsumerGroupHeader(group),
                    ok=(ResponseCode.SUCCESS, ResponseCode.CONSUMER_NOT_ONLINE),
                )
                if conn.code == ResponseCode.SUCCESS:
                    online += len(fastjson.loads(conn.body).get("connectionSet", []))
            data.append({"group": group, "count": online, "diffTotal": diff})
            rows.append([group, online, diff])
        return Output(data, ["#Group", "#Count", "#Diff Total"], rows)
    stats_header = H.GetConsumeStatsRequestHeader(args.consumerGroup, args.topic)
    data, rows = [], []
    found = False
    tps = 0.0
    for name, addr in masters.items():
        reply = await admin.invoke(addr, RequestCode.GET_CONSUME_STATS, stats_header)
        stats = fastjson.loads(reply.body)
        tps += float(stats.get("consumeTps", 0.0))
        for q in queue_rows(stats.get("offsetTable", {})):
            found = True
            q["brokerName"] = name
            q["lag"] = q["brokerOffset"] - q["consumerOffset"]
            data.append(q)
            rows.append(
                [
                    q["topic"],
                    name,
                    q["queueId"],
                    q["brokerOffset"],
                    q["consumerOffset"],
                    q["lag"],
                    format_time(q["lastTimestamp"]),
                ]
            )
    if not found:
        raise CliError(f"consumer group {args.consumerGroup!r} not found on any broker")
    diff = sum(q["lag"] for q in data)
    headers = ["#Topic", "#Broker Name", "#QID", "#Broker Offset", "#Consumer Offset", "#Diff"]
    table = format_table([*headers, "#LastTime"], rows)
    return Output(
        {"group": args.consumerGroup, "queues": data, "diffTotal": diff},
        lines=[table, "", f"Consume TPS: {tps:.2f}", f"Diff Total: {diff}"],
    )


async def producer_connection(admin: Admin, args: argparse.Namespace) -> Output:
    """mqadmin producerConnection: the connected producers of a group, on the topic's brokers."""
    data: list[dict[str, Any]] = []
    rows: list[list[object]] = []
    for name, addr in (await admin.topic_masters(args.topic)).items():
        reply = await admin.invoke(
            addr,
            RequestCode.GET_PRODUCER_CONNECTION_LIST,
            H.ProducerGroupHeader(args.producerGroup),
            ok=(ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR),
        )
        if reply.code != ResponseCode.SUCCESS:
            continue
        for c in fastjson.loads(reply.body).get("connectionSet", []):
            data.append({"brokerName": name, **c})
            rows.append(
                [len(rows) + 1, c["clientId"], c["clientAddr"], c["language"], c["version"]]
            )
    if not data:
        raise CliError(f"the producer group[{args.producerGroup}] not exist")
    headers = ["#", "#ClientId", "#ClientAddr", "#Language", "#Version"]
    return Output(data, headers, rows)


async def consumer_status(admin: Admin, args: argparse.Namespace) -> Output:
    """mqadmin consumerStatus: each online member's running info (relayed by the broker), of
    the one -i names when given; with -s its thread stack too (a RocketMQ 5 client answers
    only that: the broker asks it on its Telemetry stream)."""
    for addr in (await admin.all_masters()).values():
        reply = await admin.invoke(
            addr,
            RequestCode.GET_CONSUMER_CONNECTION_LIST,
            H.ConsumerGroupHeader(args.consumerGroup),
            ok=(ResponseCode.SUCCESS, ResponseCode.CONSUMER_NOT_ONLINE),
        )
        if reply.code != ResponseCode.SUCCESS:
            continue
        data, rows, stacks = [], [], []
        for c in fastjson.loads(reply.body).get("connectionSet", []):
            if args.clientId and c["clientId"] != args.clientId:
                continue
            info = await admin.invoke(
                addr,
                RequestCode.GET_CONSUMER_RUNNING_INFO,
                H.GetConsumerRunningInfoRequestHeader(
                    args.consumerGroup, c["clientId"], args.jstack
                ),
                timeout=RELAYED_TIMEOUT,
            )
            running = fastjson.loads(info.body)
            props = running.get("properties", {})
            queues = queue_rows(running.get("mqTable", {}))
            entry = {"clientId": c["clientId"], "properties": props, "queues": queues}
            if args.jstack:
                entry["jstack"] = running.get("jstack")
                stacks += ["", f"#{c['clientId']} thread stack:", running.get("jstack") or "-"]
            data.append(entry)
            rows.append(
                [
                    c["clientId"],
                    c["language"],
                    props.get("PROP_CLIENT_VERSION", "-"),
                    props.get("messageModel", "-"),
                    len(queues),
                ]
            )
        if args.clientId and not data:
            raise CliError(f"no client {args.clientId} online in {args.consumerGroup}")
        headers = ["#ClientId", "#Language", "#Version", "#MessageModel", "#Queues"]
        if stacks:
            return Output(data, lines=[format_table(headers, rows), *stacks])
        return Output(data, headers, rows)
    raise CliError(f"the consumer group [{args.consumerGroup}] not online")


async def stats_all(admin: Admin, args: argparse.Namespace) -> Output:
    """mqadmin statsAll: per topic and consuming group, the last minute's TPS (315)."""
    if args.topic:
        topic_names = [args.topic]
    else:
        reply = await admin.invoke(admin.namesrv, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        topic_names = sorted(loads_lenient(reply.body).get("topicList", []))
    data, rows = [], []

    async def minute(addr: str, name: str, key: str) -> dict[str, Any] | None:
        reply = await admin.invoke(
            addr,
            RequestCode.VIEW_BROKER_STATS_DATA,
            H.ViewBrokerStatsDataRequestHeader(name, key),
            ok=(ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR),
        )
        if reply.code != ResponseCode.SUCCESS:
            return None  # no item yet: nothing sent or pulled since the broker started
        minute_stats: dict[str, Any] = fastjson.loads(reply.body)["statsMinute"]
        return minute_stats

    for topic in topic_names:
        if topic.startswith(("%RETRY%", "%DLQ%")):
            continue
        try:
            masters = await admin.topic_masters(topic)
        except CliError:
            continue
        for addr in masters.values():
            put = await minute(addr, "TOPIC_PUT_NUMS", topic)
            if put is None:
                continue
            who = await admin.invoke(
                addr, RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, H.TopicHeader(topic)
            )
            groups = fastjson.loads(who.body).get("groupList", []) or [""]
            for group in groups:
                got = await minute(addr, "GROUP_GET_NUMS", f"{topic}@{group}") if group else None
                entry = {
                    "topic": topic,
                    "group": group,
                    "inTps": put["tps"],
                    "outTps": got["tps"] if got else 0.0,
                    "inMsgLastMinute": put["sum"],
                    "outMsgLastMinute": got["sum"] if got else 0,
                }
                data.append(entry)
                rows.append(
                    [
                        topic,
                        group or "-",
                        f"{entry['inTps']:.2f}",
                        f"{entry['outTps']:.2f}",
                        entry["inMsgLastMinute"],
                        entry["outMsgLastMinute"],
                    ]
                )
    headers = ["#Topic", "#Consumer Group", "#InTPS", "#OutTPS", "#InMsg1Min", "#OutMsg1Min"]
    return Output(data, headers, rows)


async def consumer_connection(admin: Admin, args: argparse.Namespace) -> Output:
    for addr in (await admin.all_masters()).values():
        reply = await admin.invoke(
            addr,
            RequestCode.GET_CONSUMER_CONNECTION_LIST,
            H.ConsumerGroupHeader(args.consumerGroup),
            ok=(ResponseCode.SUCCESS, ResponseCode.CONSUMER_NOT_ONLINE),
        )
        if reply.code == ResponseCode.SUCCESS:
            data = fastjson.loads(reply.body)
            rows = [
                [i, c["clientId"], c["clientAddr"], c["language"], c["version"]]
                for i, c in enumerate(data["connectionSet"], 1)
            ]
            table = format_table(["#", "#ClientId", "#ClientAddr", "#Language", "#Version"], rows)
            subs = format_table(
                ["#Topic", "#SubExpression"],
                [[t, s.get("subString")] for t, s in sorted(data["subscriptionTable"].items())],
            )
            lines = [
                table,
                "",
                "Below is subscription:",
                subs,
                "",
                f"ConsumeType: {data['consumeType']}",
                f"MessageModel: {data['messageModel']}",
                f"ConsumeFromWhere: {data['consumeFromWhere']}",
            ]
            return Output(data, lines=lines)
    raise CliError(f"the consumer group [{args.consumerGroup}] not online")


_MESSAGE_FIELDS = (
    "msgId",
    "uniqKey",
    "topic",
    "tags",
    "keys",
    "queueId",
    "queueOffset",
    "commitLogOffset",
    "reconsumeTimes",
    "bornTimestamp",
    "storeTimestamp",
    "bornHost",
    "storeHost",
    "sysFlag",
    "properties",
    "bodyLength",
    "bodyPreview",
)


def _message_output(views: list[dict[str, Any]]) -> Output:
    lines: list[str] = []
    for view in views:
        if lines:
            lines.append("")
        for key in _MESSAGE_FIELDS:
            value = view.get(key)
            if key.endswith("Timestamp"):
                value = format_time(value or 0)
            lines.append(f"{key[0].upper() + key[1:] + ':':<20}{_cell(value)}")
    return Output(views if len(views) != 1 else views[0], lines=lines)


async def consume_message_directly(admin: Admin, args: argparse.Namespace) -> Output:
    """mqadmin queryMsgById -g -d: the broker hands the message the offset id names to one
    consumer of the group to consume now (CONSUME_MESSAGE_DIRECTLY; a RocketMQ 5 client gets
    it as a VerifyMessageCommand on its Telemetry stream), and its result is printed."""
    try:
        ip, port, _ = decode_offset_msg_id(args.msgId)
    except ValueError:
        raise CliError(f"{args.msgId} is not an offset message id") from None
    addr = f"{ip}:{port}"
    header = H.ConsumeMessageDirectlyResultRequestHeader(
        args.consumerGroup, args.clientId, args.msgId, None
    )
    reply = await admin.invoke(
        addr, RequestCode.CONSUME_MESSAGE_DIRECTLY, header, timeout=RELAYED_TIMEOUT
    )
    result = fastjson.loads(reply.body) if reply.body else {}
    lines = [
        f"{key}: {result.get(key)}"
        for key in ("consumeResult", "remark", "order", "autoCommit", "spentTimeMills")
    ]
    return Output(result, lines=lines)


async def query_msg_by_id(admin: Admin, args: argparse.Namespace) -> Output:
    """By offset message id (it names the broker); with -t, also by unique key (client id).
    With -g and -d, the message is consumed by that client instead (mqadmin's form)."""
    if args.consumerGroup or args.clientId:
        if not (args.consumerGroup and args.clientId):
            raise CliError("-g consumerGroup and -d clientId go together")
        return await consume_message_directly(admin, args)
    try:
        ip, port, offset = decode_offset_msg_id(args.msgId)
    except ValueError:
        ip, port, offset = "", 0, 0
    problem = f"no message with offset id {args.msgId}"
    if ip and 0 < port < 65536:
        try:
            reply = await admin.invoke(
                f"{ip}:{port}",
                RequestCode.VIEW_MESSAGE_BY_ID,
                H.ViewMessageRequestHeader(offset),
                ok=(ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR),
            )
        except CliError as exc:
            problem = str(exc)
        else:
            if reply.code == ResponseCode.SUCCESS:
                return _message_output([message_view(decode_record(reply.body))])
    if not args.topic:
        raise CliError(f"{problem} (give -t TOPIC to look it up as a unique key)")
    views = await _query(admin, args.topic, args.msgId, 32, 0, 2**62, unique=True)
    views = [v for v in views if v["uniqKey"] == args.msgId]
    if not views:
        raise CliError(f"no message with id {args.msgId} in topic {args.topic}")
    return _message_output(views[:1])


async def _query(
    admin: Admin, topic: str, key: str, max_num: int, begin: int, end: int, *, unique: bool
) -> list[dict[str, Any]]:
    views: list[dict[str, Any]] = []
    for addr in (await admin.topic_masters(topic)).values():
        reply = await admin.invoke(
            addr,
            RequestCode.QUERY_MESSAGE,
            H.QueryMessageRequestHeader(topic, key, max_num, begin, end, unique),
            ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND),
        )
        if reply.code == ResponseCode.SUCCESS:
            try:
                views.extend(message_view(m) for m in iter_records(reply.body))
            except RecordError as exc:
                raise CliError(f"bad record from {addr}: {exc}") from None
    return sorted(views, key=lambda v: v["storeTimestamp"])


async def query_msg_by_key(admin: Admin, args: argparse.Namespace) -> Output:
    views = await _query(
        admin,
        args.topic,
        args.msgKey,
        args.maxNum,
        args.beginTimestamp,
        args.endTimestamp,
        unique=False,
    )
    if not views:
        raise CliError(f"no message with key {args.msgKey!r} in topic {args.topic}")
    rows = [[v["msgId"], v["queueId"], v["queueOffset"], v["bodyPreview"][:40]] for v in views]
    return Output(views, ["#Message ID", "#QID", "#Offset", "#Body"], rows)


async def query_msg_trace_by_id(admin: Admin, args: argparse.Namespace) -> Output:
    """mqadmin queryMsgTraceById: the trace messages whose keys name the message id (QUERY_MESSAGE
    on the trace topic), and the message's steps in them: publish, consume-before and
    consume-after, with hosts, times and costs."""
    views: list[tuple[int, TraceView]] = []
    now = int(time.time() * 1000)
    for addr in (await admin.topic_masters(args.traceTopic)).values():
        reply = await admin.invoke(
            addr,
            RequestCode.QUERY_MESSAGE,
            H.QueryMessageRequestHeader(args.traceTopic, args.msgId, 64, 0, now),
            ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND),
        )
        if reply.code != ResponseCode.SUCCESS:
            continue
        try:
            for msg in iter_records(reply.body):
                for view in trace_views(args.msgId, msg.body, msg.born_host[0]):
                    views.append((msg.store_timestamp, view))
        except RecordError as exc:
            raise CliError(f"bad record from {addr}: {exc}") from None
    if not views:
        raise CliError(f"no trace of message {args.msgId} in topic {args.traceTopic}")
    ordered = [view for _, view in sorted(views, key=lambda pair: pair[0])]
    return Output([v.to_json() for v in ordered], lines=format_trace(ordered))


def _tools_pull(topic: str, queue_id: int, offset: int, count: int) -> H.PullMessageRequestHeader:
    """A pull of ``count`` messages as TOOLS_CONSUMER, every tag, nothing committed or held."""
    return H.PullMessageRequestHeader(
        consumer_group=TOOLS_CONSUMER_GROUP,
        topic=topic,
        queue_id=queue_id,
        queue_offset=offset,
        max_msg_nums=count,
        sys_flag=PULL_FLAG_SUBSCRIPTION,
        commit_offset=0,
        suspend_timeout_millis=0,
        subscription="*",
        sub_version=0,
        expression_type="TAG",
    )


async def query_msg_by_offset(admin: Admin, args: argparse.Namespace) -> Output:
    masters = await admin.topic_masters(args.topic)
    addr = masters.get(args.brokerName)
    if addr is None:
        raise CliError(f"topic {args.topic} has no broker named {args.brokerName!r}")
    reply = await admin.invoke(
        addr,
        RequestCode.PULL_MESSAGE,
        _tools_pull(args.topic, args.queueId, args.offset, 1),
        ok=range(0, 64),
    )
    messages = list(iter_records(reply.body)) if reply.code == ResponseCode.SUCCESS else []
    if not messages or messages[0].queue_offset != args.offset:
        raise CliError(
            f"no message at {args.topic} {args.brokerName} queue {args.queueId} "
            f"offset {args.offset}: {reply.remark or _code_name(reply.code)}"
        )
    return _message_output([message_view(messages[0])])


async def reset_offset_by_time(admin: Admin, args: argparse.Namespace) -> Output:
    timestamp = parse_timestamp(args.timestamp)
    data, rows = [], []
    for name, addr in (await admin.topic_masters(args.topic)).items():
        reply = await admin.invoke(
            addr,
            RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
            H.ResetOffsetRequestHeader(args.topic, args.group, timestamp, args.force),
        )
        for q in queue_rows(fastjson.loads(reply.body).get("offsetTable", {})):
            data.append({"brokerName": name, "queueId": q["queueId"], "offset": q["offset"]})
            rows.append([name, q["queueId"], q["offset"]])
    if not data:
        raise CliError(f"topic {args.topic} has no queues to reset")
    return Output(data, ["#brokerName", "#queueId", "#offset"], rows)


async def update_sub_group(admin: Admin, args: argparse.Namespace) -> Output:
    config = SubscriptionGroupConfig(
        group_name=args.groupName,
        consume_enable=args.consumeEnable,
        consume_from_min_enable=args.consumeFromMinEnable,
        consume_broadcast_enable=args.consumeBroadcastEnable,
        retry_queue_nums=args.retryQueueNums,
        retry_max_times=args.retryMaxTimes,
        broker_id=args.brokerId,
        which_broker_when_consume_slowly=args.whichBrokerWhenConsumeSlowly,
        notify_consumer_ids_changed_enable=args.notifyConsumerIdsChanged,
        consume_message_orderly=args.consumeMessageOrderly,
    )
    body = to_json(config)
    done = []
    for addr in await admin.targets(args):
        await admin.invoke(addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body)
        done.append(addr)
    plain = json.loads(body)
    lines = [f"create subscription group to {addr} success." for addr in done]
    return Output({"brokers": done, "subscriptionGroupConfig": plain}, lines=[*lines, str(plain)])


async def get_broker_config(admin: Admin, args: argparse.Namespace) -> Output:
    data, lines = {}, []
    for addr in await admin.targets(args):
        reply = await admin.invoke(addr, RequestCode.GET_BROKER_CONFIG)
        props = dict(sorted(parse_properties(reply.body.decode("utf-8")).items()))
        data[addr] = props
        lines.append(f"============{addr}============")
        lines.extend(f"{k:<50}=  {v}" for k, v in props.items())
    return Output(data, lines=lines)


async def update_broker_config(admin: Admin, args: argparse.Namespace) -> Output:
    body = f"{args.key}={args.value}\n".encode()
    done = []
    for addr in await admin.targets(args):
        await admin.invoke(addr, RequestCode.UPDATE_BROKER_CONFIG, body=body)
        done.append(addr)
    lines = [f"update broker config success, {addr}" for addr in done]
    return Output({"brokers": done, "key": args.key, "value": args.value}, lines=lines)


# -- transactions -----------------------------------------------------------------------------

# transactionStatus reads at most this many half messages per broker by default.
TRANSACTION_SCAN_DEFAULT = 2000
_PULL_BATCH = 32


async def _max_offset(admin: Admin, addr: str, topic: str) -> int:
    reply = await admin.invoke(addr, RequestCode.GET_MAX_OFFSET, H.TopicQueueHeader(topic, 0))
    return int(reply.ext_fields.get("offset", "0"))


async def _pull_queue0(admin: Admin, addr: str, topic: str, start: int, end: int) -> list[Any]:
    """The messages of ``topic`` queue 0 in [start, end), pulled as TOOLS_CONSUMER (nothing is
    committed)."""
    out: list[Any] = []
    offset = start
    while offset < end:
        reply = await admin.invoke(
            addr,
            RequestCode.PULL_MESSAGE,
            _tools_pull(topic, 0, offset, min(_PULL_BATCH, end - offset)),
            ok=range(0, 64),
        )
        batch = list(iter_records(reply.body)) if reply.code == ResponseCode.SUCCESS else []
        if not batch:
            next_offset = int(reply.ext_fields.get("nextBeginOffset", offset) or offset)
            if next_offset <= offset:
                break
            offset = next_offset
            continue
        out.extend(m for m in batch if m.queue_offset < end)
        offset = batch[-1].queue_offset + 1
    return out


async def transaction_status(admin: Admin, args: argparse.Namespace) -> Output:
    """Half and op progress of each broker's transaction check service (its consumer offsets
    of CID_RMQ_SYS_TRANS), what TRANS_CHECK_MAX_TIME_TOPIC holds, and the half messages the
    service has not passed yet, by real topic."""
    data: dict[str, Any] = {}
    rows: list[list[object]] = []
    topic_rows: list[list[object]] = []
    for addr in await admin.targets(args):
        reply = await admin.invoke(addr, RequestCode.GET_ALL_CONSUMER_OFFSET)
        table = loads_lenient(reply.body).get("offsetTable", {}) if reply.body else {}

        def progress(topic: str, table: dict[str, Any] = table) -> int:
            queues = table.get(f"{topic}@{CID_RMQ_SYS_TRANS}", {})
            return int(queues.get("0", queues.get(0, -1)))

        half_end = await _max_offset(admin, addr, RMQ_SYS_TRANS_HALF_TOPIC)
        op_end = await _max_offset(admin, addr, RMQ_SYS_TRANS_OP_HALF_TOPIC)
        discarded = await _max_offset(admin, addr, TRANS_CHECK_MAX_TIME_TOPIC)
        half_at = max(0, progress(RMQ_SYS_TRANS_HALF_TOPIC))
        op_at = max(0, progress(RMQ_SYS_TRANS_OP_HALF_TOPIC))
        # Half messages the check service has not passed yet, by real topic: those still
        # waiting for an outcome and those ended since its last round (ended ones are marked
        # in the op topic, which brokers do not serve to pulls).
        scan_end = min(half_end, half_at + args.scan)
        halves = await _pull_queue0(admin, addr, RMQ_SYS_TRANS_HALF_TOPIC, half_at, scan_end)
        unchecked: dict[str, int] = {}
        for half in halves:
            topic = half.properties.get("REAL_TOPIC", "?")
            if args.topic and topic != args.topic:
                continue
            unchecked[topic] = unchecked.get(topic, 0) + 1
        truncated = scan_end < half_end
        data[addr] = {
            "halfMaxOffset": half_end,
            "halfCheckOffset": half_at,
            "opMaxOffset": op_end,
            "opCheckOffset": op_at,
            "discarded": discarded,
            "uncheckedByTopic": unchecked,
            "uncheckedTruncated": truncated,
        }
        rows.append([addr, half_end, half_at, op_end, op_at, discarded])
        more = "+" if truncated else ""
        topic_rows += [[addr, t, f"{n}{more}"] for t, n in sorted(unchecked.items())]
    headers = ["#Broker", "#Half End", "#Half Checked", "#Op End", "#Op Checked", "#Discarded"]
    lines = [format_table(headers, rows)]
    if topic_rows:
        lines += ["", format_table(["#Broker", "#Topic", "#Unchecked Half"], topic_rows)]
    return Output(data, lines=lines)


# -- ACL (the broker's codes 50-54) --------------------------------------------------------------


async def update_acl_config(admin: Admin, args: argparse.Namespace) -> Output:
    header = H.CreateAccessConfigRequestHeader(
        access_key=args.accessKey,
        secret_key=args.secretKey,
        white_remote_address=args.whiteRemoteAddress,
        admin=args.admin,
        default_topic_perm=args.defaultTopicPerm,
        default_group_perm=args.defaultGroupPerm,
        topic_perms=args.topicPerms,
        group_perms=args.groupPerms,
    )
    done = []
    for addr in await admin.targets(args):
        await admin.invoke(addr, RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, header)
        done.append(addr)
    shown = {k: ("******" if k == "secretKey" else v) for k, v in H.encode(header).items()}
    lines = [f"create or update plain access config to {addr} success." for addr in done]
    return Output({"brokers": done, "plainAccessConfig": shown}, lines=[*lines, str(shown)])


async def delete_access_config(admin: Admin, args: argparse.Namespace) -> Output:
    done = []
    for addr in await admin.targets(args):
        await admin.invoke(
            addr, RequestCode.DELETE_ACL_CONFIG, H.DeleteAccessConfigRequestHeader(args.accessKey)
        )
        done.append(addr)
    lines = [f"delete plain access config account from {addr} success." for addr in done]
    return Output({"brokers": done, "accessKey": args.accessKey}, lines=lines)


async def cluster_acl_config_version(admin: Admin, args: argparse.Namespace) -> Output:
    data, rows = [], []
    for addr in await admin.targets(args):
        reply = await admin.invoke(addr, RequestCode.GET_BROKER_CLUSTER_ACL_INFO)
        ext = reply.ext_fields
        files = loads_lenient(ext.get("allAclFileVersion") or "{}") or {}
        if not files:
            files = {"": loads_lenient(ext.get("version") or "{}") or {}}
        for path, version in sorted(files.items()):
            entry = {
                "clusterName": ext.get("clusterName"),
                "brokerName": ext.get("brokerName"),
                "brokerAddr": ext.get("brokerAddr", addr),
                "aclFilePath": path,
                "aclConfigVersionNum": int(version.get("counter", 0)),
                "aclLastUpdateTime": int(version.get("timestamp", 0)),
            }
            data.append(entry)
            rows.append(
                [
                    entry["clusterName"],
                    entry["brokerName"],
                    entry["brokerAddr"],
                    path or "-",
                    entry["aclConfigVersionNum"],
                    format_time(entry["aclLastUpdateTime"]),
                ]
            )
    headers = [
        "#Cluster Name",
        "#Broker Name",
        "#Broker Addr",
        "#AclFilePath",
        "#AclConfigVersionNum",
        "#AclLastUpdateTime",
    ]
    return Output(data, headers, rows)


async def update_global_white_addr(admin: Admin, args: argparse.Namespace) -> Output:
    header = H.UpdateGlobalWhiteAddrsConfigRequestHeader(
        args.globalWhiteRemoteAddresses, args.aclFileFullPath or None
    )
    done = []
    for addr in await admin.targets(args):
        await admin.invoke(addr, RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, header)
        done.append(addr)
    lines = [f"update global white remote addresses to {addr} success." for addr in done]
    return Output({"brokers": done, **H.encode(header)}, lines=lines)


def credentials(args: argparse.Namespace) -> tuple[str, str] | None:
    """The ACL account to sign with: ``--aclAccessKey``/``--aclSecretKey``, else mqadmin's
    ``$ROCKETMQ_HOME/conf/tools.yml`` (``accessKey``, ``secretKey``), else none."""
    if args.aclAccessKey or args.aclSecretKey:
        if not (args.aclAccessKey and args.aclSecretKey):
            raise CliError("--aclAccessKey and --aclSecretKey go together")
        return args.aclAccessKey, args.aclSecretKey
    home = os.environ.get("ROCKETMQ_HOME")
    tools = os.path.join(home, "conf", "tools.yml") if home else None
    if tools is None or not os.path.isfile(tools):
        return None
    try:
        with open(tools, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as exc:
        raise CliError(f"cannot read {tools}: {exc}") from None
    if not isinstance(data, dict) or not data.get("accessKey") or not data.get("secretKey"):
        return None
    return str(data["accessKey"]), str(data["secretKey"])


# -- the parser -------------------------------------------------------------------------------

Command = Callable[[Admin, argparse.Namespace], Awaitable[Output]]


def _broker_or_cluster(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    group = p.add_mutually_exclusive_group(required=required)
    group.add_argument("-b", "--brokerAddr", help="broker address host:port")
    group.add_argument("-c", "--clusterName", help="every master broker of this cluster")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-n",
        "--namesrvAddr",
        default=os.environ.get("NAMESRV_ADDR"),
        help="name server address host:port (default $NAMESRV_ADDR)",
    )
    common.add_argument("--json", action="store_true", help="print JSON for scripts")
    common.add_argument(
        "--aclAccessKey",
        help="ACL account to sign requests with (default: $ROCKETMQ_HOME/conf/tools.yml)",
    )
    common.add_argument("--aclSecretKey", help="the signing ACL account's secret key")
    common.add_argument("--tls", action="store_true", help="connect with TLS (system CAs)")
    common.add_argument("--tlsCaFile", help="connect with TLS, trusting this CA file (PEM)")
    parser = argparse.ArgumentParser(
        prog="pymq-admin", description="mqadmin-style administration of pymq (and RocketMQ)"
    )
    add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")

    def command(name: str, run: Command, text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=text, description=text)
        p.set_defaults(run=run)
        return p

    p = command("clusterList", cluster_list, "List clusters and their brokers with TPS")
    p.add_argument("-c", "--clusterName")
    p = command(
        "dLedgerStatus",
        dledger_status,
        "DLedger groups: members, term, leader, committed index, each follower's lag",
    )
    p.add_argument("-c", "--clusterName")
    p = command("brokerStatus", broker_status, "Runtime figures of a broker")
    _broker_or_cluster(p)
    p = command("timerStatus", timer_status, "Pending timer messages per topic, next due time")
    _broker_or_cluster(p)
    p = command("recallMessage", recall_message, "Cancel a pending timer message (RocketMQ 5)")
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-k", "--recallHandle", required=True, help="the handle its send returned")
    p = command("grpcClients", grpc_clients, "RocketMQ 5 (gRPC) clients of the brokers")
    _broker_or_cluster(p, required=False)
    p.add_argument("-g", "--consumerGroup", help="only this consumer group's (or topic's)")
    p.add_argument("-t", "--topic", help="only clients of this topic")
    p = command("popStatus", pop_status, "Messages RocketMQ 5 consumers hold in flight (POP)")
    _broker_or_cluster(p, required=False)
    p.add_argument("-g", "--consumerGroup", help="only this consumer group")
    p.add_argument("-t", "--topic", help="only this topic")
    p = command("topicList", topic_list, "List every topic the name server knows")
    p.add_argument("-c", "--clusterName", help="only topics of this cluster")
    p = command("topicRoute", topic_route, "A topic's route: brokers and queue counts")
    p.add_argument("-t", "--topic", required=True)
    p = command("topicStatus", topic_status, "Min/max offset and last store time per queue")
    p.add_argument("-t", "--topic", required=True)
    p = command("updateTopic", update_topic, "Create or update a topic")
    _broker_or_cluster(p)
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-r", "--readQueueNums", type=int, default=8)
    p.add_argument("-w", "--writeQueueNums", type=int, default=8)
    p.add_argument("-p", "--perm", type=int, default=6, help="2 write, 4 read, 6 both")
    p.add_argument("-o", "--order", type=parse_bool, default=False)
    p.add_argument(
        "-a", "--attributes", help="RocketMQ 5 topic attributes, e.g. +message.type=FIFO"
    )
    p = command("deleteTopic", delete_topic, "Delete a topic from brokers and name server")
    _broker_or_cluster(p)
    p.add_argument("-t", "--topic", required=True)
    p = command("consumerProgress", consumer_progress, "Consumer offsets and lag")
    p.add_argument("-g", "--consumerGroup")
    p.add_argument("-t", "--topic", help="only this topic")
    p = command("consumerConnection", consumer_connection, "Online members of a group")
    p.add_argument("-g", "--consumerGroup", required=True)
    p = command("consumerStatus", consumer_status, "Running info of a group's online members")
    p.add_argument("-g", "--consumerGroup", required=True)
    p.add_argument("-i", "--clientId", help="only this client")
    p.add_argument("-s", "--jstack", action="store_true", help="with each client's thread stack")
    p = command("producerConnection", producer_connection, "Connected producers of a group")
    p.add_argument("-g", "--producerGroup", required=True)
    p.add_argument("-t", "--topic", required=True)
    p = command("statsAll", stats_all, "Last minute's in/out TPS per topic and group")
    p.add_argument("-t", "--topic", help="only this topic")
    p = command("queryMsgById", query_msg_by_id, "A message by offset id (or unique key, -t)")
    p.add_argument("-i", "--msgId", required=True)
    p.add_argument("-t", "--topic", help="topic to search when the id is a unique key")
    p.add_argument("-g", "--consumerGroup", help="with -d: that consumer consumes it now")
    p.add_argument("-d", "--clientId", help="with -g: the client of the group to consume it")
    p = command("queryMsgByKey", query_msg_by_key, "Messages by key")
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-k", "--msgKey", required=True)
    p.add_argument("-b", "--beginTimestamp", type=int, default=0)
    p.add_argument("-e", "--endTimestamp", type=int, default=2**62)
    p.add_argument("-c", "--maxNum", type=int, default=64)
    p = command("queryMsgTraceById", query_msg_trace_by_id, "A message's trace (message trace)")
    p.add_argument("-i", "--msgId", required=True, help="the message id (its unique key)")
    p.add_argument("-t", "--traceTopic", default=TRACE_TOPIC, help="the trace topic")
    p = command("queryMsgByOffset", query_msg_by_offset, "A message by queue and offset")
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-b", "--brokerName", required=True)
    p.add_argument("-i", "--queueId", type=int, required=True)
    p.add_argument("-o", "--offset", type=int, required=True)
    p = command("resetOffsetByTime", reset_offset_by_time, "Reset a group's offsets to a time")
    p.add_argument("-g", "--group", required=True)
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-s", "--timestamp", required=True, help="now, ms, or yyyy-MM-dd#HH:mm:ss:SSS")
    p.add_argument("-f", "--force", type=parse_bool, default=True)
    p = command("updateSubGroup", update_sub_group, "Create or update a subscription group")
    _broker_or_cluster(p)
    p.add_argument("-g", "--groupName", required=True)
    p.add_argument("-s", "--consumeEnable", type=parse_bool, default=True)
    p.add_argument("-m", "--consumeFromMinEnable", type=parse_bool, default=False)
    p.add_argument("-d", "--consumeBroadcastEnable", type=parse_bool, default=False)
    p.add_argument("-q", "--retryQueueNums", type=int, default=1)
    p.add_argument("-r", "--retryMaxTimes", type=int, default=16)
    p.add_argument("-i", "--brokerId", type=int, default=0)
    p.add_argument("-w", "--whichBrokerWhenConsumeSlowly", type=int, default=1)
    p.add_argument("-a", "--notifyConsumerIdsChanged", type=parse_bool, default=True)
    p.add_argument(
        "-o",
        "--consumeMessageOrderly",
        type=parse_bool,
        default=None,
        help="RocketMQ 5: the group's 5.x consumers receive FIFO topics in order",
    )
    p = command(
        "transactionStatus",
        transaction_status,
        "Transaction check progress (half/op queues) and unchecked half messages by topic",
    )
    _broker_or_cluster(p)
    p.add_argument("-t", "--topic", help="only half messages of this topic")
    p.add_argument(
        "--scan",
        type=int,
        default=TRANSACTION_SCAN_DEFAULT,
        help=f"half messages read at most (default {TRANSACTION_SCAN_DEFAULT})",
    )
    p = command("getBrokerConfig", get_broker_config, "A broker's effective config")
    _broker_or_cluster(p)
    p = command("updateBrokerConfig", update_broker_config, "Change a broker key at runtime")
    _broker_or_cluster(p)
    p.add_argument("-k", "--key", required=True)
    p.add_argument("-v", "--value", required=True)
    p = command("updateAclConfig", update_acl_config, "Create or update an ACL account")
    _broker_or_cluster(p)
    p.add_argument("-a", "--accessKey", required=True)
    p.add_argument("-s", "--secretKey", required=True)
    p.add_argument("-w", "--whiteRemoteAddress")
    p.add_argument("-i", "--defaultTopicPerm", help="DENY, PUB, SUB or PUB|SUB")
    p.add_argument("-u", "--defaultGroupPerm", help="DENY, PUB, SUB or PUB|SUB")
    p.add_argument("-t", "--topicPerms", help="topicA=DENY,topicB=PUB|SUB")
    p.add_argument("-g", "--groupPerms", help="groupA=DENY,groupB=SUB")
    p.add_argument("-m", "--admin", type=parse_bool, default=False)
    p = command("deleteAccessConfig", delete_access_config, "Delete an ACL account")
    _broker_or_cluster(p)
    p.add_argument("-a", "--accessKey", required=True)
    p = command(
        "clusterAclConfigVersion", cluster_acl_config_version, "ACL config versions of brokers"
    )
    _broker_or_cluster(p)
    p = command(
        "updateGlobalWhiteAddr", update_global_white_addr, "Replace the global white addresses"
    )
    _broker_or_cluster(p)
    p.add_argument("-g", "--globalWhiteRemoteAddresses", required=True, help="comma list")
    p.add_argument("-f", "--aclFileFullPath", help="the ACL file (default plain_acl.yml)")
    return parser


async def run(args: argparse.Namespace) -> Output | CliError:
    """The subcommand's output, or the error to report (caught here, inside the client's
    nursery, so that it does not come out wrapped in an exception group)."""
    try:
        account = credentials(args)
    except CliError as exc:
        return exc
    signer = AclSigner(*account) if account is not None else None
    try:
        ctx = (
            ssl.create_default_context(cafile=args.tlsCaFile)
            if args.tlsCaFile
            else ssl.create_default_context()
            if args.tls
            else None
        )
    except (OSError, ssl.SSLError) as exc:
        return CliError(f"cannot use {args.tlsCaFile}: {exc}")
    async with open_remoting_client(
        connect_timeout=TIMEOUT, signer=signer, ssl_context=ctx
    ) as client:
        try:
            return await args.run(Admin(client, args.namesrvAddr), args)
        except CliError as exc:
            return exc
        except Exception as exc:  # a malformed answer: still one line, never a traceback
            return CliError(f"{type(exc).__name__}: {exc}")


def report(args: argparse.Namespace, output: Output | CliError, out: TextIO, err: TextIO) -> int:
    """Write what :func:`run` gave as the command prints it (the text, or ``--json``'s JSON, to
    ``out``; an error as one ``error: ...`` line to ``err``) and return the exit status."""
    if isinstance(output, CliError):
        print(f"error: {output}", file=err)
        return 1
    if args.json:
        print(json.dumps(output.data, indent=2, sort_keys=True, default=str), file=out)
    else:
        text = output.render()
        if text:
            print(text, file=out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        output = trio.run(run, args)
    except KeyboardInterrupt:
        return 130
    return report(args, output, sys.stdout, sys.stderr)
