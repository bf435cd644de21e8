"""A broker in DLedger mode runs the masters' services only while it is the group's master
(RocketMQ 4.9.4's changeToMaster / changeToSlave): the schedule (delay-level) delivery, the
transaction check-back and the timer delivery start when its member leads and stop when it
follows (a follower runs only its replica of the timer wheel); each set is a task of the
broker's nursery, so a leader -> follower -> leader cycle leaves no task behind."""

from __future__ import annotations

import collections
import pathlib

import pytest
import trio

from pymq.broker.config import BrokerConfig
from pymq.broker.controller import BrokerController
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


def build(tmp: pathlib.Path, namesrv: str) -> BrokerController:
    store_config = MessageStoreConfig(
        store_path_root_dir=str(tmp / "n0"),
        mapped_file_size_commit_log=1 << 20,
        enable_d_leger_commit_log=True,
        d_leger_group="roles",
        d_leger_peers=f"n0-127.0.0.1:{free_port()}",
        d_leger_self_id="n0",
    )
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

        def master() -> bool:
            return (
                broker.store_config.broker_role is BrokerRole.SYNC_MASTER
                and task_names()[SCHEDULE] == levels
            )

        def slave() -> bool:
            return (
                broker.store_config.broker_role is BrokerRole.SLAVE and task_names()[SCHEDULE] == 0
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
