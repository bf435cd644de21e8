"""Timer messages (issue #41) end to end with pymq's own client: TIMER_DELIVER_MS,
TIMER_DELAY_SEC and TIMER_DELAY_MS on a send, delivered to the real topic no earlier than due,
refusals with RocketMQ 5's codes, and pending timers surviving a broker restart."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from pymq.client import (
    ConsumeFromWhere,
    Message,
    MessageExt,
    MQClientError,
    Producer,
    PushConsumer,
    topics,
)
from pymq.common.topic import TIMER_TOPIC
from pymq.embedded import Cluster, open_cluster
from pymq.remoting.codes import ResponseCode
from pymq.testing import TEST_PROPERTIES
from tests.helpers import wait_until

FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET


class Receiver:
    def __init__(self) -> None:
        self.got: list[tuple[int, MessageExt]] = []
        self.changed = trio.Event()

    async def __call__(self, msgs: list[MessageExt]) -> bool:
        now = int(time.time() * 1000)
        self.got.extend((now, m) for m in msgs)
        self.changed.set()
        self.changed = trio.Event()
        return True

    async def wait_for(self, count: int, timeout: float = 60) -> None:
        with trio.fail_after(timeout):
            while len(self.got) < count:
                await self.changed.wait()

    def by_body(self) -> dict[bytes, tuple[int, MessageExt]]:
        return {m.body: (at, m) for at, m in self.got}


def now_ms() -> int:
    return int(time.time() * 1000)


@pytest.mark.slow
async def in_queue(store, topic: str) -> int:  # type: ignore[no-untyped-def]
    """Entries in the topic's queue 0 once everything stored is dispatched (a new queue's
    first entry waits for the reput task, which makes its file in a worker thread)."""
    await store.reput.do_reput()
    return store.get_max_offset_in_queue(topic, 0)


async def test_timers_arrive_in_their_topic_not_before_due(pymq_cluster: Cluster) -> None:
    ns = pymq_cluster.namesrv_addr
    await topics.create_topic(ns, "Later", brokers=[pymq_cluster.broker_addr])
    receiver = Receiver()
    async with Producer("P", ns) as producer:
        sent_at = now_ms()
        due = {
            b"ms": sent_at + 1500,
            b"sec": sent_at + 2000,
            b"at": sent_at + 2500,
        }
        await producer.send(Message("Later", b"ms", properties={"TIMER_DELAY_MS": "1500"}))
        await producer.send(Message("Later", b"sec", properties={"TIMER_DELAY_SEC": "2"}))
        await producer.send(
            Message("Later", b"at", properties={"TIMER_DELIVER_MS": str(due[b"at"])})
        )
        await producer.send(Message("Later", b"plain"))
    store = pymq_cluster.broker.store
    assert await in_queue(store, TIMER_TOPIC) == 3  # kept aside, not in "Later"
    async with PushConsumer("G", ns, receiver, consume_from=FIRST) as consumer:
        await consumer.subscribe("Later")
        await receiver.wait_for(4)
    got = receiver.by_body()
    assert got.keys() == {b"ms", b"sec", b"at", b"plain"}
    for body, due_ms in due.items():
        at, msg = got[body]
        assert at >= due_ms, f"{body!r} arrived {due_ms - at} ms early"
        props = msg.properties
        assert msg.topic == "Later"
        assert int(props["TIMER_OUT_MS"]) >= due_ms - 5  # the broker's clock read a bit later
        assert int(props["TIMER_DEQUEUE_MS"]) >= int(props["TIMER_OUT_MS"])
        assert int(props["TIMER_ENQUEUE_MS"]) <= int(props["TIMER_OUT_MS"])
        assert "REAL_TOPIC" not in props and "REAL_QID" not in props
    assert "TIMER_OUT_MS" not in got[b"plain"][1].properties


async def test_bad_and_too_long_timers_are_refused(pymq_cluster: Cluster) -> None:
    ns = pymq_cluster.namesrv_addr
    await topics.create_topic(ns, "Refused", brokers=[pymq_cluster.broker_addr])
    store = pymq_cluster.broker.store
    async with Producer("P", ns) as producer:
        for props in (
            {"TIMER_DELAY_SEC": str(3 * 86400 + 1)},
            {"TIMER_DELAY_MS": str(3 * 86400 * 1000 + 5000)},
            {"TIMER_DELIVER_MS": str(now_ms() + 4 * 86400 * 1000)},
            {"TIMER_DELAY_SEC": "soon"},
            {"TIMER_DELIVER_MS": "1_000"},
            {"TIMER_DELAY_MS": "99999999999999999999"},
        ):
            with pytest.raises(MQClientError) as info:
                await producer.send(Message("Refused", b"x", properties=props))
            assert info.value.code == ResponseCode.MESSAGE_ILLEGAL, props
            assert "should not be bigger than the max delay 259200000ms" in info.value.remark
        # Nothing was stored by the refusals.
        assert await in_queue(store, TIMER_TOPIC) == 0
        assert await in_queue(store, "Refused") == 0
        # Within the limit is accepted.
        await producer.send(Message("Refused", b"ok", properties={"TIMER_DELAY_SEC": "259200"}))
    assert await in_queue(store, TIMER_TOPIC) == 1


async def test_past_timer_and_delay_level_rule(pymq_cluster: Cluster) -> None:
    ns = pymq_cluster.namesrv_addr
    await topics.create_topic(ns, "Now", brokers=[pymq_cluster.broker_addr])
    store = pymq_cluster.broker.store
    receiver = Receiver()
    async with Producer("P", ns) as producer:
        # A due time in the past: stored in its topic at once, not kept aside.
        await producer.send(
            Message("Now", b"past", properties={"TIMER_DELIVER_MS": str(now_ms() - 60_000)})
        )
        # A delay level wins over the timer properties, which are dropped (RocketMQ 5).
        await producer.send(
            Message("Now", b"level", delay_level=1, properties={"TIMER_DELAY_SEC": "3600"})
        )
    assert await in_queue(store, TIMER_TOPIC) == 0
    async with PushConsumer("G", ns, receiver, consume_from=FIRST) as consumer:
        await consumer.subscribe("Now")
        await receiver.wait_for(2, timeout=30)
    got = receiver.by_body()
    assert "TIMER_OUT_MS" not in got[b"past"][1].properties
    assert "TIMER_DELAY_SEC" not in got[b"level"][1].properties


async def test_timer_wheel_disabled_refuses_timers(tmp_path: Path) -> None:
    props = dict(TEST_PROPERTIES, timerWheelEnable="false")
    async with open_cluster(
        str(tmp_path), namesrv_port=0, broker_port=0, bind_address="127.0.0.1", properties=props
    ) as cluster:
        await topics.create_topic(cluster.namesrv_addr, "T", brokers=[cluster.broker_addr])
        async with Producer("P", cluster.namesrv_addr) as producer:
            with pytest.raises(MQClientError) as info:
                await producer.send(Message("T", b"x", properties={"TIMER_DELAY_SEC": "5"}))
            assert info.value.code == ResponseCode.SYSTEM_ERROR
            assert info.value.remark == (
                "accurate timer message is not enabled, timerWheelEnable is false"
            )
            await producer.send(Message("T", b"plain"))  # other sends are unaffected
        assert await in_queue(cluster.broker.store, TIMER_TOPIC) == 0


@pytest.mark.slow
async def test_pending_timers_survive_a_restart(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    due: dict[bytes, int] = {}
    async with open_cluster(
        data, namesrv_port=0, broker_port=0, bind_address="127.0.0.1",
        properties=dict(TEST_PROPERTIES),
    ) as cluster:  # fmt: skip
        await topics.create_topic(cluster.namesrv_addr, "Kept", brokers=[cluster.broker_addr])
        async with Producer("P", cluster.namesrv_addr) as producer:
            for i in range(5):
                body = f"k{i}".encode()
                due[body] = now_ms() + 3000 + i * 300
                await producer.send(
                    Message("Kept", body, properties={"TIMER_DELIVER_MS": str(due[body])})
                )
        timer = cluster.broker.timer
        await wait_until(
            lambda: timer.timers is not None and timer.timers.enqueue_offset == 5,
            timeout=30,
            interval=0.05,
        )
        assert await in_queue(cluster.broker.store, "Kept") == 0
    receiver = Receiver()
    async with open_cluster(
        data, namesrv_port=0, broker_port=0, bind_address="127.0.0.1",
        properties=dict(TEST_PROPERTIES),
    ) as cluster:  # fmt: skip
        consumer = PushConsumer("G", cluster.namesrv_addr, receiver, consume_from=FIRST)
        async with consumer:
            await consumer.subscribe("Kept")
            await receiver.wait_for(5)
            await trio.sleep(1.5)  # room for anything wrongly delivered twice
    got = receiver.by_body()
    assert got.keys() == due.keys()
    assert len(receiver.got) == 5
    for body, due_ms in due.items():
        assert got[body][0] >= due_ms


def _start_pymq(data: str) -> tuple[subprocess.Popen[str], str]:
    """``python -m pymq`` on ``data``; the process and its name server's address."""
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "pymq", "--data", data, "--bind", "127.0.0.1",
            "--namesrv-port", "0", "--broker-port", "0", "--grpc-port", "0",
            "--mappedFileSizeCommitLog", str(1 << 20),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    banner = proc.stdout.readline()
    match = re.search(r"name server (127\.0\.0\.1:\d+)", banner)
    if match is None:
        proc.kill()
        proc.wait()
        raise AssertionError(f"no banner: {banner!r}")
    return proc, match.group(1)


@pytest.mark.slow
async def test_kill_9_with_timers_pending_loses_none_and_delivers_none_early(
    tmp_path: Path,
) -> None:
    """Killed right after the sends were acknowledged (before any timer flush), and once more
    while the timers are being delivered: every timer arrives, none before it is due."""
    data = str(tmp_path / "data")
    due: dict[bytes, int] = {}
    proc, ns = _start_pymq(data)
    try:
        async with Producer("P", ns) as producer:
            await wait_until_created(ns)
            for i in range(20):
                body = f"t{i}".encode()
                due[body] = now_ms() + 2500 + i * 150
                await producer.send(
                    Message("Killed", body, properties={"TIMER_DELIVER_MS": str(due[body])})
                )
    finally:
        proc.kill()  # SIGKILL: no flush, no checkpoint
        proc.wait()
    proc, ns = _start_pymq(data)
    try:
        await trio.sleep(max(0.0, (min(due.values()) - now_ms()) / 1000) + 0.6)
        proc.kill()  # again, while some are delivered and some pending
        proc.wait()
        proc, ns = _start_pymq(data)
        receiver = Receiver()
        async with PushConsumer("G", ns, receiver, consume_from=FIRST) as consumer:
            await consumer.subscribe("Killed")
            with trio.move_on_after(60):
                while {m.body for _, m in receiver.got} != due.keys():
                    await receiver.changed.wait()
    finally:
        proc.kill()
        proc.wait()
    got = receiver.by_body()
    assert got.keys() == due.keys()  # none lost (some may come twice: at least once)
    for _at, msg in receiver.got:
        assert int(msg.properties["TIMER_DEQUEUE_MS"]) >= due[msg.body]
        assert msg.store_timestamp >= due[msg.body]


async def wait_until_created(ns: str) -> None:
    """Create topic Killed on the one broker the name server knows."""

    async def broker() -> str | None:
        with contextlib.suppress(Exception):
            return (await topics.master_addresses(ns))[0]
        return None

    addr = None
    with trio.fail_after(30):
        while addr is None:
            addr = await broker()
            if addr is None:
                await trio.sleep(0.1)
    await topics.create_topic(ns, "Killed", brokers=[addr])


async def test_a_batch_of_timers_waits_and_a_mixed_batch_is_refused(
    pymq_cluster: Cluster,
) -> None:
    ns = pymq_cluster.namesrv_addr
    await topics.create_topic(ns, "Batched", brokers=[pymq_cluster.broker_addr])
    store = pymq_cluster.broker.store
    receiver = Receiver()
    async with Producer("P", ns) as producer:
        sent_at = now_ms()
        await producer.send_batch(
            [
                Message("Batched", b"b1", properties={"TIMER_DELAY_MS": "1200"}),
                Message("Batched", b"b2", properties={"TIMER_DELAY_SEC": "1"}),
            ]
        )
        with pytest.raises(MQClientError) as info:
            await producer.send_batch(
                [
                    Message("Batched", b"plain"),
                    Message("Batched", b"timer", properties={"TIMER_DELAY_SEC": "1"}),
                ]
            )
        assert info.value.code == ResponseCode.MESSAGE_ILLEGAL
        assert "mix timer messages" in info.value.remark
    assert await in_queue(store, TIMER_TOPIC) == 2
    async with PushConsumer("G", ns, receiver, consume_from=FIRST) as consumer:
        await consumer.subscribe("Batched")
        await receiver.wait_for(2)
    got = receiver.by_body()
    assert got.keys() == {b"b1", b"b2"}
    assert got[b"b1"][0] >= sent_at + 1200 and got[b"b2"][0] >= sent_at + 1000


@pytest.mark.slow
async def test_a_timer_beyond_the_roll_window_is_put_again_and_arrives_on_time(
    tmp_path: Path,
) -> None:
    props = dict(TEST_PROPERTIES, timerRollWindowSlot="2", timerPrecisionMs="500")
    async with open_cluster(
        str(tmp_path), namesrv_port=0, broker_port=0, bind_address="127.0.0.1", properties=props
    ) as cluster:
        ns = cluster.namesrv_addr
        await topics.create_topic(ns, "Rolled", brokers=[cluster.broker_addr])
        receiver = Receiver()
        async with Producer("P", ns) as producer:
            due = now_ms() + 3000
            await producer.send(
                Message("Rolled", b"far", properties={"TIMER_DELIVER_MS": str(due)})
            )
        async with PushConsumer("G", ns, receiver, consume_from=FIRST) as consumer:
            await consumer.subscribe("Rolled")
            await receiver.wait_for(1)
        at, msg = receiver.got[0]
        assert at >= due
        # Entered at most a window (two slots, 1 s) past the slot being delivered: put to the
        # timer topic again each round (the window's last slot is taken as it begins, about
        # 1 s and 2 s after the send), counted as RocketMQ 5 counts it.
        rolls = int(msg.properties["TIMER_ROLL_TIMES"])
        assert rolls >= 2
        assert await in_queue(cluster.broker.store, TIMER_TOPIC) == 1 + rolls
        assert msg.topic == "Rolled" and "REAL_TOPIC" not in msg.properties


async def test_a_timer_is_put_at_its_own_due_time_not_at_its_slots_end(
    pymq_cluster: Cluster,
) -> None:
    """The service takes a slot as it begins and puts each timer when it falls due: a timer
    due early in its slot is not held until the slot is over (up to one precision late)."""
    ns = pymq_cluster.namesrv_addr
    precision = pymq_cluster.broker.store.config.timer_precision_ms
    await topics.create_topic(ns, "OnTime", brokers=[pymq_cluster.broker_addr])
    receiver = Receiver()
    due = (now_ms() // precision + 3) * precision + precision // 10  # early in its slot
    async with Producer("P", ns) as producer:
        await producer.send(Message("OnTime", b"x", properties={"TIMER_DELIVER_MS": str(due)}))
    async with PushConsumer("G", ns, receiver, consume_from=FIRST) as consumer:
        await consumer.subscribe("OnTime")
        await receiver.wait_for(1)
    _, msg = receiver.got[0]
    slot_end = (due // precision + 1) * precision  # where a slot handed out whole would put it
    put_at = int(msg.properties["TIMER_DEQUEUE_MS"])
    assert due <= put_at < slot_end, (due, put_at, slot_end)
