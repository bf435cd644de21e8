"""A one-member DLedger group's broker, in-process (issue #42).

Services by role: it runs the masters' services only while it is the group's master
(RocketMQ 4.9.4's changeToMaster / changeToSlave): the schedule (delay-level) delivery, the
transaction check-back and the timer delivery start when its member leads and stop when it
follows (a follower runs only its replica of the timer wheel); each set is a task of the
broker's nursery, so a leader -> follower -> leader cycle leaves no task behind.

Carry-over: a broker written to without DLedger mode and restarted in it serves its old
messages and new ones after them (4.9.4's dividedCommitlogOffset)."""

from __future__ import annotations

import collections
import pathlib

import pytest
import trio

from pymq.broker.config import BrokerConfig
from pymq.broker.controller import BrokerController
from pymq.client import Message, MQClientError, Producer, PullConsumer
from pymq.client import topics as topic_admin
from pymq.common.consumer import MessageQueue
from pymq.dledger.raft import Role, RoleChange
from pymq.remoting.config import NettyClientConfig, NettyServerConfig
from pymq.store.config import BrokerRole, MessageStoreConfig
from tests.helpers import free_port, make_namesrv, wait_until

pytestmark = pytest.mark.slow  # an election, three role changes

SCHEDULE = "pymq.broker.schedule.ScheduleMessageService._deliver_level"
CHECK = "pymq.broker.transaction.TransactionService.run"
TIMER_DELIVERY = "pymq.broker.timer.TimerMessageService._dequeue_loop"


def task_names() -> collections.Counter[str]:
    """Every task of this run, by name."""
    names: collections.Counter[str] = collections.Counter()
    root = trio.lowlevel.current_root_task()
    assert root is not None
    stack = [root]
    while stack:
        task = stack.pop()
        names[task.name] += 1
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return names


def services(names: collections.Counter[str]) -> dict[str, int]:
    """The tasks of the services that follow the role, by name."""
    modules = ("pymq.broker.schedule.", "pymq.broker.timer.", "pymq.broker.transaction.")
    return {
        name: count
        for name, count in names.items()
        if name.startswith(modules) or "_role_services" in name
    }


def build(tmp: pathlib.Path, namesrv: str, *, dledger: bool = True) -> BrokerController:
    store_config = MessageStoreConfig(
        store_path_root_dir=str(tmp / "n0"),
        mapped_file_size_commit_log=1 << 20,
    )
    if dledger:
        store_config.enable_d_leger_commit_log = True
        store_config.d_leger_group = "roles"
        store_config.d_leger_peers = f"n0-127.0.0.1:{free_port()}"
        store_config.d_leger_self_id = "n0"
    broker_config = BrokerConfig(
        broker_name="roles",
        broker_ip1="127.0.0.1",
        broker_ip2="127.0.0.1",
        namesrv_addr=namesrv,
    )
    return BrokerController(
        broker_config,
        NettyServerConfig(listen_port=0, bind_address="127.0.0.1"),
        NettyClientConfig(config_file=""),
        store_config,
    )


async def test_masters_services_follow_the_role_and_leave_nothing_behind(
    tmp_path: pathlib.Path,
) -> None:
    namesrv = make_namesrv(tmp_path)
    async with trio.open_nursery() as nursery:
        ns_port = await nursery.start(namesrv.run)
        broker = build(tmp_path, f"127.0.0.1:{ns_port}")
        await nursery.start(broker.run)
        levels = len(broker.schedule.delay_levels_ms)

        def master() -> bool:  # the role, and its services all started
            names = task_names()
            return (
                broker.store_config.broker_role is BrokerRole.SYNC_MASTER
                and names[SCHEDULE] == levels
                and names[CHECK] == 1
                and names[TIMER_DELIVERY] == 1
            )

        def slave() -> bool:
            names = task_names()
            return (
                broker.store_config.broker_role is BrokerRole.SLAVE
                and names[SCHEDULE] == 0
                and names[TIMER_DELIVERY] == 1
            )

        await wait_until(master, timeout=15, what="the member leads and is master")
        as_master = task_names()
        assert as_master[SCHEDULE] == levels
        assert as_master[CHECK] == 1
        assert as_master[TIMER_DELIVERY] == 1 and not broker.timer.replica
        node = broker.store.dledger.server.node  # type: ignore[union-attr]
        assert node is not None
        for _ in range(2):
            # the member follows (as when another leads): the broker becomes a slave, and
            # none of the masters' services runs on it (their puts would be refused)
            broker._on_dledger_role(RoleChange(node.term, Role.FOLLOWER, None))
            await wait_until(slave, timeout=10, what="the broker became a slave")
            as_slave = task_names()
            assert as_slave[SCHEDULE] == 0
            assert as_slave[CHECK] == 0
            assert as_slave[TIMER_DELIVERY] == 1 and broker.timer.replica  # its replica
            # it leads again: the services are back, once each
            broker._on_dledger_role(RoleChange(node.term, Role.LEADER, "n0"))
            await wait_until(master, timeout=10, what="the broker is master again")
            again = task_names()
            assert again[SCHEDULE] == levels and again[CHECK] == 1
            assert again[TIMER_DELIVERY] == 1 and not broker.timer.replica
            # nothing left behind: the same services' tasks as before the cycle
            assert services(again) == services(as_master)
        nursery.cancel_scope.cancel()


async def test_a_plain_brokers_messages_are_served_after_it_restarts_in_dledger_mode(
    tmp_path: pathlib.Path,
) -> None:
    namesrv = make_namesrv(tmp_path)
    topic = "CarriedOver"
    async with trio.open_nursery() as nursery:
        ns_port = await nursery.start(namesrv.run)
        ns = f"127.0.0.1:{ns_port}"

        async def serve(
            broker: BrokerController,
            scope: trio.CancelScope,
            stopped: trio.Event,
            *,
            task_status: trio.TaskStatus[int],
        ) -> None:
            try:
                with scope:
                    await broker.run(task_status=task_status)
            finally:
                stopped.set()

        plain, plain_scope = build(tmp_path, ns, dledger=False), trio.CancelScope()
        plain_stopped = trio.Event()
        await nursery.start(serve, plain, plain_scope, plain_stopped)
        await topic_admin.create_topic(ns, topic, queues=1, brokers=[plain.broker_addr])
        async with Producer("carry-producer", ns) as producer:
            for i in range(20):
                sent = await producer.send(Message(topic, b"plain-%d" % i))
                assert sent.status == "SEND_OK"
        plain_scope.cancel()
        with trio.fail_after(10):
            await plain_stopped.wait()

        broker = build(tmp_path, ns)
        await nursery.start(serve, broker, trio.CancelScope(), trio.Event())
        await wait_until(
            lambda: broker.store_config.broker_role is BrokerRole.SYNC_MASTER,
            timeout=15,
            what="master in DLedger mode",
        )
        assert broker.store.dledger is not None and broker.store.dledger.divided_offset > 0
        async with Producer("carry-producer", ns) as producer:
            with trio.fail_after(20):
                for i in range(20):
                    while True:  # the route may still name the plain broker's registration
                        try:
                            sent = await producer.send(Message(topic, b"dledger-%d" % i), timeout=3)
                            break
                        except MQClientError:
                            await trio.sleep(0.2)
                    assert sent.status == "SEND_OK"
        want = [b"plain-%d" % i for i in range(20)] + [b"dledger-%d" % i for i in range(20)]
        got: list[tuple[int, bytes]] = []
        async with PullConsumer("carry-consumer", ns) as consumer:
            mq = MessageQueue(topic, "roles", 0)
            offset = 0
            with trio.fail_after(20):
                while len(got) < len(want):
                    result = await consumer.pull(mq, "*", offset, 32)
                    got += [(m.queue_offset, m.body) for m in result.messages]
                    offset = result.next_begin_offset
        assert [b for _, b in got] == want
        assert [o for o, _ in got] == list(range(40))
        nursery.cancel_scope.cancel()
