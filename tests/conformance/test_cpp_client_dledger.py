"""The real RocketMQ C++ client (PyPI rocketmq==0.4.4) against a group of three pymq brokers in
DLedger mode (issue #42): it finds the group's master (the leader) through the name server,
sends, and its push consumer receives every message; then the leader is killed, and a client
started afresh finds the new master (registered as brokerId 0) and does the same.

``cpp_client_roundtrip.py`` is ../shared/conformance's script (see test_cpp_client.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import trio

from pymq.client import topics as topic_admin
from tests.helpers import make_namesrv
from tests.integration.test_dledger_brokers import QUEUES, Group

pytestmark = pytest.mark.slow  # separate processes, three brokers, a failover

SCRIPT = Path(__file__).with_name("cpp_client_roundtrip.py")


async def roundtrip(namesrv: str, topic: str, home: Path) -> tuple[int, str]:
    env = dict(os.environ, HOME=str(home))  # the client logs under $HOME/logs
    with trio.fail_after(200):
        result = await trio.run_process(
            [sys.executable, str(SCRIPT), "--namesrv", namesrv, "--topic", topic,
             "--count", "100", "--mode", "sync", "--timeout", "90"],
            env=env,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )  # fmt: skip
    out = result.stdout.decode(errors="replace") + result.stderr.decode(errors="replace")
    return result.returncode, out


async def test_the_cpp_client_follows_a_dledger_group_through_a_failover(tmp_path: Path) -> None:
    namesrv = make_namesrv(tmp_path)
    async with trio.open_nursery() as nursery:
        ns_port = await nursery.start(namesrv.run)
        group = Group(tmp_path, ns_port, nursery)
        for sid in ("n0", "n1", "n2"):
            await group.start(sid)
        leader = await group.master()
        addrs = [b.broker_addr for b in group.brokers.values()]
        for topic in ("CppBefore", "CppAfter"):
            await topic_admin.create_topic(group.ns, topic, queues=QUEUES, brokers=addrs)
        code, out = await roundtrip(group.ns, "CppBefore", tmp_path / "before")
        assert code == 0, out[-2000:]
        old = next(sid for sid, b in group.brokers.items() if b is leader)
        group.stop(old)
        new_leader = await group.master(timeout=20)
        with trio.fail_after(10):
            while await group.routed_master("CppAfter") != new_leader.broker_addr:
                await trio.sleep(0.1)
        code, out = await roundtrip(group.ns, "CppAfter", tmp_path / "after")
        assert code == 0, out[-2000:]
        nursery.cancel_scope.cancel()
