"""The timers view (issue #41): pending timers per topic and the next due time, on the admin
channel's ``timers.status`` stream, ``pymq-admin timerStatus`` and GET_TIMER_METRICS."""

from __future__ import annotations

import json
import time

import pytest

from pymq.broker import admin_service
from pymq.client import Message, Producer, topics
from pymq.embedded import Cluster
from tests.admin.helpers import AdminClient
from tests.helpers import pymq_admin, wait_until


async def send_timers(cluster: Cluster) -> int:
    """Three timers on TimA (the first due soonest), one on TimB; their earliest due time."""
    ns = cluster.namesrv_addr
    for topic in ("TimA", "TimB"):
        await topics.create_topic(ns, topic, brokers=[cluster.broker_addr], queues=1)
    first = int(time.time() * 1000) + 120_000
    async with Producer("P", ns) as producer:
        for topic, due in (
            ("TimA", first),
            ("TimA", first + 60_000),
            ("TimA", first + 90_000),
            ("TimB", first + 30_000),
        ):
            await producer.send(Message(topic, b"t", properties={"TIMER_DELIVER_MS": str(due)}))
    timer = cluster.broker.timer
    await wait_until(lambda: timer.timers is not None and timer.timers.enqueue_offset == 4)
    return first


async def test_timers_stream_lists_pending_timers_and_the_next_due(
    admin_cluster: Cluster, admin: AdminClient
) -> None:
    sub = await admin.call("subscribe", stream="timers.status", interval=0.2)
    sid = sub["subscription"]
    first_event = await admin.next_event(sid)
    assert first_event["pendingTotal"] == 0 and first_event["nextDueMs"] is None
    first = await send_timers(admin_cluster)
    while True:
        data = await admin.next_event(sid)
        if data["pendingTotal"] == 4:
            break
    assert data["timingCount"] == {"TimA": {"count": 3}, "TimB": {"count": 1}}
    assert data["topicsWithTimers"] == 2
    # Delivered at the end of the slot the first due time falls in (1 s precision).
    assert first <= data["nextDueMs"] <= first + 1000
    # Bounded: at most `limit` topics, those with most timers.
    top = await admin.call("timers.status", limit=1)
    assert top["timingCount"] == {"TimA": {"count": 3}} and top["topicsWithTimers"] == 2


async def admin_cli(*args: str) -> str:
    code, out, err = await pymq_admin(*args)
    assert code == 0, err
    return out


async def test_timer_status_subcommand_and_its_bounds(
    admin_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = await send_timers(admin_cluster)
    addr = admin_cluster.broker_addr
    status = json.loads(await admin_cli("timerStatus", "-b", addr, "--json"))[addr]
    assert status["timingCount"] == {"TimA": {"count": 3}, "TimB": {"count": 1}}
    assert status["pendingTotal"] == 4
    assert first <= status["nextDueMs"] <= first + 1000
    out = await admin_cli("timerStatus", "-b", addr)
    assert "4 pending in 2 topics" in out and "TimA" in out and "TimB" in out
    # Bounded: the topics with most timers only, and a scan of so many slots for the next.
    monkeypatch.setattr(admin_service, "TIMER_TOPICS_LISTED", 1)
    monkeypatch.setattr(admin_service, "NEXT_DUE_SCAN_SLOTS", 10)  # 10 s: none due so soon
    status = json.loads(await admin_cli("timerStatus", "-b", addr, "--json"))[addr]
    assert status["timingCount"] == {"TimA": {"count": 3}}
    assert status["topicsWithTimers"] == 2 and status["pendingTotal"] == 4
    assert status.get("nextDueMs") is None  # fastjson leaves a null out
    assert "none within the scanned slots" in await admin_cli("timerStatus", "-b", addr)
