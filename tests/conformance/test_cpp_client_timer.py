"""The real C++ RocketMQ client (4.x, PyPI rocketmq==0.4.4) sending RocketMQ 5 timer messages
by setting TIMER_DELAY_MS, TIMER_DELAY_SEC and TIMER_DELIVER_MS as user properties: pymq keeps
them in the timer topic and delivers each to its topic no earlier than due (and at most the
timer precision plus the consumer's round late), with RocketMQ 5's timer properties; a plain
message of the same run goes straight through."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import trio

from pymq.client import ConsumeFromWhere, MessageExt, PushConsumer, topics
from pymq.common.topic import TIMER_TOPIC
from pymq.embedded import Cluster

pytestmark = pytest.mark.slow  # a separate process: seconds per test

SCRIPT = Path(__file__).with_name("cpp_client_timer.py")
# How late a delivery may be: timerPrecisionMs (1 s) and a push consumer's pull round.
LATE_MAX_MS = 1000 + 3000


async def test_cpp_client_timer_properties(pymq_cluster: Cluster, tmp_path: Path) -> None:
    ns = pymq_cluster.namesrv_addr
    await topics.create_topic(ns, "CppTimer", brokers=[pymq_cluster.broker_addr])
    deliver_at = int(time.time() * 1000) + 3000
    env = dict(os.environ, HOME=str(tmp_path))  # the client logs under $HOME/logs
    args = [sys.executable, str(SCRIPT), "--namesrv", ns, "--topic", "CppTimer"]
    with trio.fail_after(120):
        result = await trio.run_process(
            [*args, "--deliver-ms", str(deliver_at)],
            env=env,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    out = result.stdout.decode(errors="replace").split("\n")
    assert result.returncode == 0, (out, result.stderr.decode(errors="replace")[-800:])
    sent = {line.split()[1]: line.split() for line in out if line.startswith("SENT ")}
    assert {body: fields[2] for body, fields in sent.items()} == {
        "ms": "0", "sec": "0", "at": "0", "plain": "0"  # SendStatus.OK
    }  # fmt: skip
    before = {body: int(fields[3]) for body, fields in sent.items()}
    due = {
        "ms": before["ms"] + 1500,
        "sec": before["sec"] + 2000,
        "at": deliver_at,
    }
    store = pymq_cluster.broker.store
    await store.reput.do_reput()
    assert store.get_max_offset_in_queue(TIMER_TOPIC, 0) == 3  # kept aside until due
    got: dict[bytes, tuple[int, MessageExt]] = {}
    arrived = trio.Event()

    async def on_messages(msgs: list[MessageExt]) -> bool:
        now = int(time.time() * 1000)
        for msg in msgs:
            got[msg.body] = (now, msg)
        if len(got) >= 4:
            arrived.set()
        return True

    first = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    async with PushConsumer("CppTimerG", ns, on_messages, consume_from=first) as consumer:
        await consumer.subscribe("CppTimer")
        with trio.fail_after(60):
            await arrived.wait()
    assert set(got) == {b"ms", b"sec", b"at", b"plain"}
    for body, due_ms in due.items():
        at, msg = got[body.encode()]
        props = msg.properties
        assert at >= due_ms, f"{body} arrived {due_ms - at} ms early"
        assert at <= due_ms + LATE_MAX_MS + 2000, f"{body} arrived {at - due_ms} ms late"
        assert msg.topic == "CppTimer" and msg.tags == "TagTimer"
        assert msg.keys == ["TIMERKEY_" + body]
        assert int(props["TIMER_OUT_MS"]) >= due_ms - 5  # the broker's clock read a bit later
        assert int(props["TIMER_DEQUEUE_MS"]) >= int(props["TIMER_OUT_MS"])
        assert "REAL_TOPIC" not in props
    assert "TIMER_OUT_MS" not in got[b"plain"][1].properties
