"""The stall probe that the hostile suites use: it sees a stalled loop, and not an idle one."""

from __future__ import annotations

import time

import trio

from pymq.embedded import Cluster
from tests.helpers import StallProbe


async def test_the_probe_sees_a_stalled_loop_and_not_an_idle_one(pymq_cluster: Cluster) -> None:
    port = int(pymq_cluster.broker_addr.rsplit(":", 1)[1])
    async with StallProbe(port) as idle:
        await trio.sleep(0.2)
    assert idle.count > 5
    assert idle.worst < 0.1
    async with StallProbe(port) as stalled:
        await trio.sleep(0.05)
        time.sleep(0.3)  # the broker's loop is this test's loop: a 300 ms stall
        await trio.sleep(0.05)
    assert stalled.worst >= 0.25
