"""Timer messages with master/slave HA (issue #41): the slave keeps a wheel of the replicated
timers and delivers none; promoted (restarted on its store as the master, RocketMQ 4.x's way)
it delivers the pending ones on time, and none the old master delivered before the delivery
point the slave had followed."""

from __future__ import annotations

import os
import pathlib
import time
from collections import Counter

import pytest
import trio

from pymq.broker.config import BrokerConfig
from pymq.broker.controller import BrokerController
from pymq.client import ConsumeFromWhere, Message, MessageExt, Producer, PushConsumer
from pymq.client import topics as topic_admin
from pymq.remoting.client import open_remoting_client
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.remoting.config import NettyClientConfig, NettyServerConfig
from pymq.remoting.headers import RecallMessageRequestHeader, encode
from pymq.store.config import BrokerRole, MessageStoreConfig
from pymq.store.timer.checkpoint import TimerCheckpoint
from pymq.store.timer.store import TIMER_CHECK_FILE
from tests.helpers import make_namesrv, wait_until

pytestmark = pytest.mark.slow  # three brokers in turn, timers seconds out

FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
TOPIC = "HaTimers"
PRECISION_MS = 1000


def now_ms() -> int:
    return int(time.time() * 1000)


def broker(
    tmp: pathlib.Path, store_dir: str, namesrv_port: int, role: BrokerRole, **store: object
) -> BrokerController:
    store_config = MessageStoreConfig(
        store_path_root_dir=str(tmp / store_dir),
        mapped_file_size_commit_log=1 << 20,
        broker_role=role,
        ha_listen_port=0,
    )
    for key, value in store.items():
        setattr(store_config, key, value)
    broker_config = BrokerConfig(
        broker_name="timer-ha",
        broker_id=1 if role is BrokerRole.SLAVE else 0,
        broker_ip1="127.0.0.1",
        broker_ip2="127.0.0.1",
        namesrv_addr=f"127.0.0.1:{namesrv_port}",
        recall_message_enable=True,
    )
    return BrokerController(
        broker_config,
        NettyServerConfig(listen_port=0, bind_address="127.0.0.1"),
        NettyClientConfig(config_file=""),
        store_config,
    )


async def serve(
    controller: BrokerController,
    scope: trio.CancelScope,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    with scope:
        await controller.run(task_status=task_status)


def queued(controller: BrokerController, topic: str) -> int:
    store = controller.store
    return sum(max(store.get_max_offset_in_queue(topic, q), 0) for q in range(8))


async def test_a_promoted_slave_delivers_pending_timers_once_and_on_time(
    tmp_path: pathlib.Path,
) -> None:
    namesrv = make_namesrv(tmp_path)
    async with trio.open_nursery() as nursery:
        ns_port = await nursery.start(namesrv.run)
        ns = f"127.0.0.1:{ns_port}"
        master_scope, slave_scope = trio.CancelScope(), trio.CancelScope()
        master = broker(tmp_path, "master", ns_port, BrokerRole.ASYNC_MASTER)
        await nursery.start(serve, master, master_scope)
        assert master.ha_service is not None
        ha = master.ha_service
        slave = broker(
            tmp_path,
            "slave",
            ns_port,
            BrokerRole.SLAVE,
            ha_master_address=f"127.0.0.1:{master.ha_port}",
        )
        await nursery.start(serve, slave, slave_scope)
        await wait_until(lambda: ha.connections, timeout=10, what="the slave connected")
        await topic_admin.create_topic(ns, TOPIC, brokers=[master.broker_addr])

        start = now_ms()
        due = {f"early{i}".encode(): start + 1000 + 150 * i for i in range(4)}
        due |= {f"late{i}".encode(): start + 8000 + 300 * i for i in range(6)}
        due[b"recalled"] = start + 8500
        async with Producer("P", ns) as producer:
            for body, at in due.items():
                sent = await producer.send(
                    Message(TOPIC, body, properties={"TIMER_DELIVER_MS": str(at)})
                )
                assert sent.recall_handle is not None
            # Recalled on the master: the marker is replicated and the promoted slave honours it.
            assert sent.recall_handle is not None
            await producer.recall_message(TOPIC, sent.recall_handle)
        del due[b"recalled"]
        # A slave takes no recall (RocketMQ 5: SLAVE_NOT_AVAILABLE), and stores nothing.
        assert sent.recall_handle is not None
        header = RecallMessageRequestHeader("P", TOPIC, sent.recall_handle)
        async with open_remoting_client() as client:
            response = await client.invoke(
                slave.broker_addr,
                RemotingCommand.request(RequestCode.RECALL_MESSAGE, encode(header)),
            )
        assert (response.code, response.remark) == (
            ResponseCode.SLAVE_NOT_AVAILABLE,
            "recall failed, broker service not available",
        )
        slave_timer = slave.timer
        # The slave enters every replicated timer in its own wheel, and delivers none: its
        # topic holds only the master's deliveries, replicated.
        await wait_until(
            lambda: slave_timer.timers is not None and slave_timer.timers.enqueue_offset == 12,
            timeout=10,
            what="the slave entered the timers",
        )
        early_end = max(at for body, at in due.items() if body.startswith(b"early"))
        await wait_until(lambda: master.timer.delivered == 4, timeout=15, what="early delivered")
        # The slave follows the master's delivery point past the early ones (its checkpoint
        # sync runs every second) once it holds their deliveries.
        await wait_until(
            lambda: slave_timer.timers is not None and slave_timer.timers.delivered_ms > early_end,
            timeout=10,
            what="the slave followed the master's delivery point",
        )
        assert slave_timer.delivered == 0
        # Six late ones, and the recalled one until its slot is passed (a marker is no timer).
        assert slave_timer.timers is not None and slave_timer.timers.counts == {TOPIC: 7}
        await slave.store.reput.do_reput()
        assert queued(slave, TOPIC) == 4  # the master's deliveries, replicated
        # The slave learns the topic by its metadata sync (after 3 s), as the promoted broker
        # must know it to deliver there.
        await wait_until(lambda: slave.topic_config_manager.select(TOPIC) is not None, timeout=20)
        assert now_ms() < min(at for body, at in due.items() if body.startswith(b"late")) - 2000

        master_scope.cancel()  # the master stops before the late timers are due
        await wait_until(lambda: not ha.connections, timeout=10)
        slave_scope.cancel()
        await trio.sleep(0.2)
        # The slave's timer checkpoint: the promoted broker delivers from the master's
        # delivery point the slave had followed.
        checkpoint = TimerCheckpoint.load(
            os.path.join(slave.store_config.timer_dir, TIMER_CHECK_FILE)
        )
        assert checkpoint is not None
        followed = checkpoint.read_ms
        assert followed == slave_timer.timers.delivered_ms and followed > early_end
        promoted = broker(tmp_path, "slave", ns_port, BrokerRole.ASYNC_MASTER)
        promoted_scope = trio.CancelScope()
        await nursery.start(serve, promoted, promoted_scope)

        got: list[tuple[int, MessageExt]] = []
        changed = trio.Event()

        async def handler(msgs: list[MessageExt]) -> bool:
            nonlocal changed
            got.extend((now_ms(), m) for m in msgs)
            changed.set()
            changed = trio.Event()
            return True

        async with PushConsumer("G", ns, handler, consume_from=FIRST) as consumer:
            await consumer.subscribe(TOPIC)
            with trio.fail_after(30):
                while {m.body for _, m in got} != due.keys():
                    await changed.wait()
            await trio.sleep(1.5)  # room for anything delivered twice
        promoted_scope.cancel()  # before the name server, which it unregisters from
        await wait_until(lambda: not promoted.store.running, timeout=15)
        nursery.cancel_scope.cancel()

    counts = Counter(m.body for _, m in got)
    # At least once for every timer; twice only for one due at or after the point the slave
    # had followed (the master may have delivered it after the slave's last sync): here none.
    assert all(n == 1 for body, n in counts.items() if due[body] < followed), counts
    assert sum(counts.values()) == len(due)
    for at, msg in got:
        if msg.body.startswith(b"late"):
            assert due[msg.body] <= at <= due[msg.body] + PRECISION_MS + 1500, msg.body
            assert int(msg.properties["TIMER_DEQUEUE_MS"]) >= due[msg.body]
    assert promoted.timer.delivered == 6 and promoted.timer.recalled == 1
