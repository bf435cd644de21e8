"""Message trace: the text RocketMQ clients write to the trace topic, and a message's trace.

A client with message trace on (Java: ``new DefaultMQProducer(group, true)``, consumers too)
sends, about half a second after each send or consume, a normal message to the trace topic
(``RMQ_SYS_TRACE_TOPIC``, or the broker's ``msgTraceTopicName``) whose KEYS are the traced
message ids and keys, so the broker's index finds the traces of a message id.  Its body is a
sequence of records; fields are separated by 0x01 and each record ends with 0x02 (Java's
``TraceDataEncoder``):

* ``Pub``: type, timestamp, regionId, producer group, topic, msgId, tags, keys, store host, body
  length, cost (ms), message type, offset msgId, success (13 fields in old clients, a 15th is the
  client host);
* ``SubBefore``: type, timestamp, regionId, consumer group, requestId, msgId, retry times, keys;
* ``SubAfter``: type, requestId, msgId, cost (ms), success, keys, context code, timestamp,
  consumer group (6 and 7 fields in old clients);
* ``EndTransaction``: type, timestamp, regionId, group, topic, msgId, tags, keys, store host,
  message type, transaction id, transaction state, from a transaction check.

:func:`parse_trace_data` reads the records (a record it cannot read is skipped, where Java's
decoder throws), :func:`trace_views` picks those of one message id as mqadmin's
``queryMsgTraceById`` does, and :func:`format_trace` lays them out for people.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import attrs

TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
CONTENT_SPLITOR = "\x01"
FIELD_SPLITOR = "\x02"
TRACE_TYPES = ("Pub", "SubBefore", "SubAfter", "EndTransaction")
MESSAGE_TYPES = ("Normal", "Trans_Msg_Half", "Trans_msg_Commit", "Delay_Msg")
# ConsumeReturnType ordinals: the SubAfter context code.
CONTEXT_CODES = ("SUCCESS", "TIME_OUT", "EXCEPTION", "RETURNNULL", "FAILED")


@attrs.frozen
class TraceRecord:
    """One record of a trace message (Java's TraceContext with its one TraceBean)."""

    trace_type: str
    msg_id: str
    timestamp: int = 0
    region_id: str = ""
    group: str = ""
    request_id: str = ""
    topic: str = ""
    tags: str = ""
    keys: str = ""
    store_host: str = ""
    body_length: int = 0
    cost_time: int = 0
    msg_type: str = ""
    offset_msg_id: str = ""
    success: bool = True
    client_host: str = ""
    retry_times: int = 0
    context_code: int = 0
    transaction_id: str = ""
    transaction_state: str = ""
    from_transaction_check: bool = False


def _bool(text: str) -> bool:
    return text.lower() == "true"  # Boolean.parseBoolean


def _message_type(text: str) -> str:
    index = int(text)
    return MESSAGE_TYPES[index] if 0 <= index < len(MESSAGE_TYPES) else text


def _record(line: list[str]) -> TraceRecord | None:
    kind = line[0]
    if kind == "Pub":
        offset_msg_id, success, client_host = "", True, ""
        if len(line) == 13:
            success = _bool(line[12])
        elif len(line) >= 14:
            offset_msg_id, success = line[12], _bool(line[13])
            if len(line) >= 15:
                client_host = line[14]
        return TraceRecord(
            "Pub",
            line[5],
            timestamp=int(line[1]),
            region_id=line[2],
            group=line[3],
            topic=line[4],
            tags=line[6],
            keys=line[7],
            store_host=line[8],
            body_length=int(line[9]),
            cost_time=int(line[10]),
            msg_type=_message_type(line[11]),
            offset_msg_id=offset_msg_id,
            success=success,
            client_host=client_host,
        )
    if kind == "SubBefore":
        return TraceRecord(
            "SubBefore",
            line[5],
            timestamp=int(line[1]),
            region_id=line[2],
            group=line[3],
            request_id=line[4],
            retry_times=int(line[6]),
            keys=line[7],
        )
    if kind == "SubAfter":
        return TraceRecord(
            "SubAfter",
            line[2],
            request_id=line[1],
            cost_time=int(line[3]),
            success=_bool(line[4]),
            keys=line[5],
            context_code=int(line[6]) if len(line) >= 7 else 0,
            timestamp=int(line[7]) if len(line) >= 9 else 0,
            group=line[8] if len(line) >= 9 else "",
        )
    if kind == "EndTransaction":
        return TraceRecord(
            "EndTransaction",
            line[5],
            timestamp=int(line[1]),
            region_id=line[2],
            group=line[3],
            topic=line[4],
            tags=line[6],
            keys=line[7],
            store_host=line[8],
            msg_type=_message_type(line[9]),
            transaction_id=line[10],
            transaction_state=line[11],
            from_transaction_check=_bool(line[12]),
        )
    return None


def parse_trace_data(text: str) -> list[TraceRecord]:
    """The records of a trace message's body, in order; unknown or malformed ones skipped."""
    records: list[TraceRecord] = []
    for chunk in text.split(FIELD_SPLITOR):
        if not chunk:
            continue
        try:
            record = _record(chunk.split(CONTENT_SPLITOR))
        except (IndexError, ValueError):
            continue
        if record is not None:
            records.append(record)
    return records


@attrs.frozen
class TraceView:
    """One step of a message's life, as mqadmin shows it (Java's TraceView)."""

    trace_type: str
    group: str
    client_host: str  # the host that sent the trace message (the producer or consumer)
    timestamp: int
    cost_time: int
    status: str  # success / failed
    msg_id: str
    topic: str = ""
    tags: str = ""
    keys: str = ""
    store_host: str = ""
    offset_msg_id: str = ""
    request_id: str = ""
    retry_times: int = 0

    def to_json(self) -> dict[str, object]:
        return {
            "type": self.trace_type,
            "group": self.group,
            "clientHost": self.client_host,
            "timestamp": self.timestamp,
            "costTime": self.cost_time,
            "status": self.status,
            "msgId": self.msg_id,
            "topic": self.topic,
            "tags": self.tags,
            "keys": self.keys,
            "storeHost": self.store_host,
            "offsetMsgId": self.offset_msg_id,
            "requestId": self.request_id,
            "retryTimes": self.retry_times,
        }


def trace_views(msg_id: str, body: bytes, born_host: str) -> list[TraceView]:
    """The steps of message ``msg_id`` recorded in one trace message (``born_host``: the host
    that sent it); TraceView.decodeFromTraceTransData, with SubBefore's requestId and retry
    count kept."""
    views: list[TraceView] = []
    for record in parse_trace_data(body.decode("utf-8", "replace")):
        if record.msg_id != msg_id:
            continue
        views.append(
            TraceView(
                trace_type=record.trace_type,
                group=record.group,
                client_host=record.client_host or born_host,
                timestamp=record.timestamp,
                cost_time=record.cost_time,
                status="success" if record.success else "failed",
                msg_id=record.msg_id,
                topic=record.topic,
                tags=record.tags,
                keys=record.keys,
                store_host=record.store_host,
                offset_msg_id=record.offset_msg_id,
                request_id=record.request_id,
                retry_times=record.retry_times,
            )
        )
    return views


def _time(ms: int) -> str:
    if ms <= 0:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def format_trace(views: Iterable[TraceView]) -> list[str]:
    """mqadmin queryMsgTraceById's layout: the publish steps, then per consumer group its
    consume steps (pymq shows SubBefore, with its retry count, besides SubAfter)."""
    row = "{:<10} {:<20} {:<20} {:<20} {:<10} {:<10}"
    lines: list[str] = []
    consumers: dict[str, list[TraceView]] = {}
    for view in views:
        if view.trace_type in ("Pub", "EndTransaction"):
            lines.append(
                row.format(
                    "#Type", "#ProducerGroup", "#ClientHost", "#SendTime", "#CostTimes", "#Status"
                ).rstrip()
            )
            lines.append(
                row.format(
                    view.trace_type,
                    view.group,
                    view.client_host,
                    _time(view.timestamp),
                    f"{view.cost_time}ms",
                    view.status,
                ).rstrip()
            )
            lines.append(f"  topic {view.topic}  tags {view.tags or '-'}  keys "
                         f"{view.keys or '-'}  stored on {view.store_host or '-'}  offset msgId "
                         f"{view.offset_msg_id or '-'}")  # fmt: skip
            lines.append("")
        elif view.trace_type in ("SubBefore", "SubAfter"):
            consumers.setdefault(view.group, []).append(view)
    for group, steps in consumers.items():
        del group
        lines.append(
            row.format(
                "#Type", "#ConsumerGroup", "#ClientHost", "#ConsumerTime", "#CostTimes", "#Status"
            ).rstrip()
        )
        for view in steps:
            if view.trace_type == "SubBefore":
                cost, status = "-", f"retry {view.retry_times}"
            else:
                cost, status = f"{view.cost_time}ms", view.status
            lines.append(
                row.format(
                    "Sub" if view.trace_type == "SubAfter" else "SubBefore",
                    view.group,
                    view.client_host,
                    _time(view.timestamp),
                    cost,
                    status,
                ).rstrip()
            )
        lines.append("")
    while lines and not lines[-1]:
        lines.pop()
    return lines
