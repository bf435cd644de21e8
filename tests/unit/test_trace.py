"""The trace text format, read from what the Java 4.9.4 client wrote (captured)."""

from __future__ import annotations

from pymq.trace.data import TraceRecord, format_trace, parse_trace_data, trace_views

SAMPLES = "/work/shared/reference/java-wire-samples"
PUB = f"{SAMPLES}/TRACE-SEND_MESSAGE_V2-310-RMQ_SYS_TRACE_TOPIC-Pub.request-body.txt"
SUB = f"{SAMPLES}/TRACE-SEND_MESSAGE_V2-310-RMQ_SYS_TRACE_TOPIC-SubBefore-SubAfter.request-body.txt"
MSG0 = "FD0000000000000000000000000000022B755FFD2B27744084B80000"
CONSUMED = "FD0000000000000000000000000000020BAB5FFD2B27743A2E150003"


def body(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_java_publish_records() -> None:
    records = parse_trace_data(body(PUB).decode())
    assert len(records) == 2
    assert records[0] == TraceRecord(
        "Pub",
        MSG0,
        timestamp=1795441585337,
        region_id="DefaultRegion",
        group="PG_TRACE",
        topic="TopicA",
        tags="TagT",
        keys="TRKEY0",
        store_host="127.0.0.1:49911",
        body_length=8,
        cost_time=20,
        msg_type="Normal",
        offset_msg_id="7F0000010000C2F70000000000002489",
        success=True,
    )
    assert records[1].keys == "TRKEY1" and records[1].cost_time == 3


def test_java_consume_records() -> None:
    records = parse_trace_data(body(SUB).decode())
    assert [r.trace_type for r in records] == ["SubBefore", "SubAfter"] * 5
    before, after = records[0], records[1]
    assert before.msg_id == after.msg_id == CONSUMED
    assert (before.timestamp, before.region_id, before.group, before.retry_times, before.keys) == (
        1795441594776,
        "null",
        "CG_TRACE",
        0,
        "KEY3",
    )
    assert before.request_id == after.request_id
    assert (after.cost_time, after.success, after.context_code) == (2, True, 0)
    assert (after.timestamp, after.group) == (1795441594778, "CG_TRACE")


def test_old_and_broken_records() -> None:
    old_pub = "Pub\x011\x02"  # too short: skipped
    pub13 = "\x01".join(["Pub", "5", "r", "g", "T", "id", "", "", "h:1", "3", "4", "1", "false"])
    sub6 = "\x01".join(["SubAfter", "req", "id", "7", "true", "k"])
    records = parse_trace_data(old_pub + pub13 + "\x02" + sub6 + "\x02" + "Weird\x01x\x02")
    assert [(r.trace_type, r.success, r.msg_type) for r in records] == [
        ("Pub", False, "Trans_Msg_Half"),
        ("SubAfter", True, ""),
    ]
    assert records[1].cost_time == 7 and records[1].timestamp == 0


def test_views_of_one_message_and_their_layout() -> None:
    views = trace_views(MSG0, body(PUB), "10.0.0.5")
    assert len(views) == 1 and views[0].client_host == "10.0.0.5"
    views += trace_views(CONSUMED, body(SUB), "10.0.0.6")
    assert [v.trace_type for v in views] == ["Pub", "SubBefore", "SubAfter"]
    lines = format_trace(views)
    assert lines[0].split() == [
        "#Type",
        "#ProducerGroup",
        "#ClientHost",
        "#SendTime",
        "#CostTimes",
        "#Status",
    ]
    assert lines[1].split()[:3] == ["Pub", "PG_TRACE", "10.0.0.5"]
    assert lines[1].split()[-2:] == ["20ms", "success"]
    consumer = lines[lines.index("") + 1 :]
    assert consumer[0].split()[1] == "#ConsumerGroup"
    assert consumer[1].split()[:3] == ["SubBefore", "CG_TRACE", "10.0.0.6"]
    assert consumer[1].split()[-2:] == ["retry", "0"]
    assert consumer[2].split()[0] == "Sub" and consumer[2].split()[-2:] == ["2ms", "success"]
