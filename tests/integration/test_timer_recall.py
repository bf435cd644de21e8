"""Recall (cancel) of a pending timer message (issue #41, RocketMQ 5's RECALL_MESSAGE): the send
answers a recall handle, a recall with it stops the message while its sibling is delivered,
and every bad recall is refused with RocketMQ 5's code and remark and changes nothing; the
recall survives kill -9."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
import time
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
import trio

from pymq.client import ConsumeFromWhere, Message, MessageExt, MQClientError, Producer, PushConsumer
from pymq.client import topics as topic_admin
from pymq.common.recall_handle import RecallHandle
from pymq.common.topic import TIMER_TOPIC
from pymq.embedded import Cluster, open_cluster
from pymq.remoting.client import open_remoting_client
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.remoting.headers import RecallMessageRequestHeader, encode
from pymq.testing import TEST_PROPERTIES
from tests.helpers import wait_until

FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
ON = {"recallMessageEnable": "true"}


def now_ms() -> int:
    return int(time.time() * 1000)


def cluster_at(data: str, **props: str) -> AbstractAsyncContextManager[Cluster]:
    return open_cluster(
        data, namesrv_port=0, broker_port=0, bind_address="127.0.0.1",
        properties=dict(TEST_PROPERTIES, **props),
    )  # fmt: skip


class Bodies:
    """What a push consumer received, by body."""

    def __init__(self) -> None:
        self.got: list[MessageExt] = []
        self.changed = trio.Event()

    async def __call__(self, msgs: list[MessageExt]) -> bool:
        self.got.extend(msgs)
        self.changed.set()
        self.changed = trio.Event()
        return True

    def bodies(self) -> list[bytes]:
        return [m.body for m in self.got]

    async def wait_for(self, body: bytes, timeout: float = 30) -> None:
        with trio.fail_after(timeout):
            while body not in self.bodies():
                await self.changed.wait()


async def timer_entries(cluster: Cluster) -> int:
    store = cluster.broker.store
    await store.reput.do_reput()
    return max(store.get_max_offset_in_queue(TIMER_TOPIC, 0), 0)


@pytest.mark.slow
async def test_a_recalled_timer_is_never_delivered_and_its_sibling_is(tmp_path: Path) -> None:
    async with cluster_at(str(tmp_path), **ON) as cluster:
        ns = cluster.namesrv_addr
        await topic_admin.create_topic(ns, "Recall", brokers=[cluster.broker_addr])
        receiver = Bodies()
        async with Producer("P", ns) as producer:
            props = {"TIMER_DELAY_MS": "3000"}
            kept = await producer.send(Message("Recall", b"kept", properties=props))
            gone = await producer.send(Message("Recall", b"gone", properties=props))
            plain = await producer.send(Message("Recall", b"plain"))
            batch = await producer.send_batch([Message("Recall", b"b1"), Message("Recall", b"b2")])
            assert plain.recall_handle is None and batch.recall_handle is None
            assert kept.recall_handle and gone.recall_handle
            handle = RecallHandle.decode(gone.recall_handle)
            assert handle.topic == "Recall"
            assert handle.broker_name == cluster.broker.broker_config.broker_name
            assert handle.message_id == gone.msg_id
            assert 0 < int(handle.timestamp) - now_ms() <= 3000
            # The wire form is RocketMQ 5's: URL-safe Base64 of five space-separated fields.
            raw = base64.urlsafe_b64decode(gone.recall_handle).decode()
            assert raw == f"v1 Recall {handle.broker_name} {handle.timestamp} {gone.msg_id}"
            assert await producer.recall_message("Recall", gone.recall_handle) == gone.msg_id
        async with PushConsumer("G", ns, receiver, consume_from=FIRST) as consumer:
            await consumer.subscribe("Recall")
            await receiver.wait_for(b"kept")
            await trio.sleep(1.5)  # room for the recalled one, were it delivered
        assert sorted(receiver.bodies()) == [b"b1", b"b2", b"kept", b"plain"]
        timer = cluster.broker.timer
        assert timer.recalled == 1 and timer.recalls_late == 0
        assert (await cluster.broker.context.admin.timer_status())["recalled"] == 1
        assert timer.timers is not None and timer.timers.counts == {}


async def recall_raw(cluster: Cluster, topic: str, handle: str) -> RemotingCommand:
    header = RecallMessageRequestHeader("P", topic, handle)
    async with open_remoting_client() as client:
        return await client.invoke(
            cluster.broker_addr,
            RemotingCommand.request(RequestCode.RECALL_MESSAGE, encode(header)),
        )


def forged(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode()


@pytest.mark.slow
async def test_bad_recalls_are_refused_and_change_nothing(tmp_path: Path) -> None:
    async with cluster_at(str(tmp_path), **ON) as cluster:
        ns = cluster.namesrv_addr
        name = cluster.broker.broker_config.broker_name
        for topic in ("Kept", "Other"):
            await topic_admin.create_topic(ns, topic, brokers=[cluster.broker_addr])
        async with Producer("P", ns) as producer:
            sent = await producer.send(
                Message("Kept", b"kept", properties={"TIMER_DELAY_MS": "2500"})
            )
            early = await producer.send(
                Message("Kept", b"early", properties={"TIMER_DELAY_MS": "300"})
            )
        assert sent.recall_handle is not None and early.recall_handle is not None
        good = RecallHandle.decode(sent.recall_handle)
        max_ms = 3 * 86400 * 1000
        illegal = ResponseCode.ILLEGAL_OPERATION
        cases = [
            ("Kept", "", illegal, "recall handle is invalid"),
            ("Kept", "!!not base64!!", illegal, "recall handle is invalid"),
            ("Kept", forged(f"v2 Kept {name} {good.timestamp} {good.message_id}"), illegal,
             "recall handle is invalid"),
            ("Kept", forged(f"v1 Kept {name} {good.timestamp}"), illegal,
             "recall handle is invalid"),
            ("Other", sent.recall_handle, illegal, "recall failed, topic not match"),
            ("Kept", forged(f"v1 Kept elsewhere {good.timestamp} {good.message_id}"), illegal,
             "recall failed, broker service not available"),
            ("Kept", forged(f"v1 Kept {name} soon {good.message_id}"), illegal,
             "recall failed, timestamp invalid"),
            ("Kept", forged(f"v1 Kept {name} {good.timestamp[:-3]}_{good.timestamp[-3:]} "
                            f"{good.message_id}"), illegal, "recall failed, timestamp invalid"),
            ("Kept", forged(f"v1 Kept {name} {now_ms() - 1000} {good.message_id}"), illegal,
             "recall failed, timestamp invalid"),
            ("Kept", forged(f"v1 Kept {name} {now_ms() + max_ms + 60_000} {good.message_id}"),
             illegal, "recall failed, timestamp invalid"),
            ("Nowhere", sent.recall_handle, ResponseCode.TOPIC_NOT_EXIST,
             "recall failed, the topic[Nowhere] not exist"),
        ]  # fmt: skip
        before = await timer_entries(cluster)
        for topic, handle, code, remark in cases:
            response = await recall_raw(cluster, topic, handle)
            assert (response.code, response.remark) == (code, remark), (topic, handle)
            assert "msgId" not in response.ext_fields
        # A recall once the message is due: refused, as RocketMQ 5's timestamp check.
        receiver = Bodies()
        async with PushConsumer("G", ns, receiver, consume_from=FIRST) as consumer:
            await consumer.subscribe("Kept")
            await receiver.wait_for(b"early")
            response = await recall_raw(cluster, "Kept", early.recall_handle)
            assert (response.code, response.remark) == (illegal, "recall failed, timestamp invalid")
            assert await timer_entries(cluster) == before  # no marker stored by any of them
            await receiver.wait_for(b"kept")  # and the message they named is delivered
        assert sorted(receiver.bodies()) == [b"early", b"kept"]
        assert cluster.broker.timer.recalled == 0


async def test_recall_is_refused_unless_enabled(pymq_cluster: Cluster) -> None:
    ns = pymq_cluster.namesrv_addr
    await topic_admin.create_topic(ns, "Off", brokers=[pymq_cluster.broker_addr])
    async with Producer("P", ns) as producer:
        sent = await producer.send(Message("Off", b"x", properties={"TIMER_DELAY_SEC": "30"}))
        assert sent.recall_handle is not None
        before = await timer_entries(pymq_cluster)
        with pytest.raises(MQClientError) as info:
            await producer.recall_message("Off", sent.recall_handle)
        assert info.value.code == ResponseCode.NO_PERMISSION
        assert info.value.remark == "recall failed, operation is forbidden"
        with pytest.raises(MQClientError, match="recall handle is invalid"):
            await producer.recall_message("Off", "garbage!")  # refused by the client
    assert await timer_entries(pymq_cluster) == before
    # Not writeable and allowRecallWhenBrokerNotWriteable=false: SERVICE_NOT_AVAILABLE.
    config = pymq_cluster.broker.broker_config
    config.recall_message_enable = True
    config.broker_permission = 4  # read only
    config.allow_recall_when_broker_not_writeable = False
    response = await recall_raw(pymq_cluster, "Off", sent.recall_handle)
    assert (response.code, response.remark) == (
        ResponseCode.SERVICE_NOT_AVAILABLE,
        "recall failed, broker service not available",
    )
    config.allow_recall_when_broker_not_writeable = True  # RocketMQ 5's default
    response = await recall_raw(pymq_cluster, "Off", sent.recall_handle)
    assert response.code == ResponseCode.SUCCESS and response.ext_fields["msgId"] == sent.msg_id
    assert await timer_entries(pymq_cluster) == before + 1  # the marker


def _start_pymq(data: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "pymq", "--data", data, "--bind", "127.0.0.1",
            "--namesrv-port", "0", "--broker-port", "0",
            "--mappedFileSizeCommitLog", str(1 << 20), "--recallMessageEnable", "true",
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


async def _broker_of(ns: str) -> str:
    async def addr() -> str:
        try:
            return (await topic_admin.master_addresses(ns))[0]
        except Exception:
            return ""  # not registered yet

    found: str = await wait_until(addr, timeout=30, interval=0.1)
    return found


DUE_MS = 30_000


@pytest.mark.slow
async def test_a_recall_survives_kill_9_before_the_due_time(tmp_path: Path) -> None:
    """Recalled, then the broker killed at once (no timer flush, the abort file left): after
    the restart the sibling arrives and the recalled message does not.  Due 30 s after the
    send, so that the broker is back before, even on a loaded machine (a recall is honoured
    when the timer service reads it before the due time: after a crash, once the broker has
    restarted; a timer read after its due time is put at once, before its recall is read, as
    RocketMQ 5's enqueue service does; with 10 s a restart under load came too late)."""
    data = str(tmp_path / "data")
    proc, ns = _start_pymq(data)
    try:
        await topic_admin.create_topic(ns, "Killed", brokers=[await _broker_of(ns)])
        async with Producer("P", ns) as producer:
            props = {"TIMER_DELAY_MS": str(DUE_MS)}
            sent_at = trio.current_time()
            await producer.send(Message("Killed", b"kept", properties=props))
            gone = await producer.send(Message("Killed", b"gone", properties=props))
            assert gone.recall_handle is not None
            await producer.recall_message("Killed", gone.recall_handle)
    finally:
        proc.kill()  # SIGKILL
        proc.wait()
    assert (Path(data) / "broker" / "abort").exists() or any(Path(data).rglob("abort"))
    proc, ns = _start_pymq(data)
    restarted = trio.current_time() - sent_at
    print(f"restarted {restarted:.1f} s after the send (due after {DUE_MS / 1000:.0f} s)")
    try:
        receiver = Bodies()
        async with PushConsumer("G", ns, receiver, consume_from=FIRST) as consumer:
            await consumer.subscribe("Killed")
            await receiver.wait_for(b"kept", timeout=90)
            await trio.sleep(1.5)
    finally:
        proc.kill()
        proc.wait()
    assert receiver.bodies() == [b"kept"]


@pytest.mark.slow
async def test_a_recall_of_a_timer_beyond_the_roll_window_meets_it_in_its_slot(
    tmp_path: Path,
) -> None:
    """The message is put back to the timer topic every round (a window of two 500 ms slots),
    the marker, stored a second later, rolls on its own: they meet in the due slot."""
    props = {"timerRollWindowSlot": "2", "timerPrecisionMs": "500", **ON}
    async with cluster_at(str(tmp_path), **props) as cluster:
        ns = cluster.namesrv_addr
        await topic_admin.create_topic(ns, "Rolled", brokers=[cluster.broker_addr])
        receiver = Bodies()
        async with Producer("P", ns) as producer:
            due = {"TIMER_DELIVER_MS": str(now_ms() + 3500)}
            await producer.send(Message("Rolled", b"kept", properties=due))
            gone = await producer.send(Message("Rolled", b"gone", properties=due))
            assert gone.recall_handle is not None
            await trio.sleep(1.0)  # a roll or two of the message first
            await producer.recall_message("Rolled", gone.recall_handle)
        async with PushConsumer("G", ns, receiver, consume_from=FIRST) as consumer:
            await consumer.subscribe("Rolled")
            await receiver.wait_for(b"kept")
            await trio.sleep(1.0)
        assert receiver.bodies() == [b"kept"]
        # Rolled at each window's last slot (taken as it begins): 2 or 3 times in 3.5 s.
        assert int(receiver.got[0].properties["TIMER_ROLL_TIMES"]) >= 2
        assert cluster.broker.timer.recalled == 1


async def admin_cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    return await trio.run_process(
        [sys.executable, "-m", "pymq.admin", *args],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )


@pytest.mark.slow
async def test_pymq_admin_recall_message(tmp_path: Path) -> None:
    async with cluster_at(str(tmp_path), **ON) as cluster:
        ns = cluster.namesrv_addr
        await topic_admin.create_topic(ns, "Cli", brokers=[cluster.broker_addr])
        async with Producer("P", ns) as producer:
            sent = await producer.send(Message("Cli", b"x", properties={"TIMER_DELAY_SEC": "30"}))
        assert sent.recall_handle is not None
        done = await admin_cli("recallMessage", "-n", ns, "-t", "Cli", "-k", sent.recall_handle)
        assert done.returncode == 0, done.stderr
        assert done.stdout.decode().strip() == f"recalled {sent.msg_id} on {cluster.broker_addr}"
        bad = await admin_cli("recallMessage", "-n", ns, "-t", "Cli", "-k", "nonsense!")
        assert bad.returncode != 0 and b"recall handle is invalid" in bad.stderr
        other = RecallHandle.decode(sent.recall_handle)
        late = RecallHandle(other.topic, other.broker_name, str(now_ms() - 1), other.message_id)
        refused = await admin_cli("recallMessage", "-n", ns, "-t", "Cli", "-k", late.encode())
        assert refused.returncode != 0
        assert b"ILLEGAL_OPERATION: recall failed, timestamp invalid" in refused.stderr


async def test_every_single_send_path_answers_the_handle(tmp_path: Path) -> None:
    """SYNC_FLUSH (the group commit answers later) and a topic created by the send (the task
    path): each timer send's answer carries its handle, and the handle recalls it."""
    async with cluster_at(str(tmp_path), flushDiskType="SYNC_FLUSH", **ON) as cluster:
        ns = cluster.namesrv_addr
        async with Producer("P", ns) as producer:
            props = {"TIMER_DELAY_SEC": "60"}
            created = await producer.send(Message("AutoCreated", b"a", properties=props))
            inline = await producer.send(Message("AutoCreated", b"b", properties=props))
            for sent in (created, inline):
                assert sent.recall_handle is not None
                handle = RecallHandle.decode(sent.recall_handle)
                assert handle.message_id == sent.msg_id
                assert await producer.recall_message("AutoCreated", sent.recall_handle) == (
                    sent.msg_id
                )
