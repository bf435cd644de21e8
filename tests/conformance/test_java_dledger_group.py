"""A mixed DLedger group: two Java DLedger 0.2.6 members (the jar RocketMQ 4.9.4 ships, run
as its standalone ``io.openmessaging.storage.dledger.DLedger`` server) and one pymq member
(pymq.dledger.server), on loopback ports, with DLedger's default timings.  They elect a
leader; appends go to whichever member leads, over the wire; the leader is killed (SIGKILL
for a Java member, its cancel scope for pymq's), a new one is elected and takes appends, the
killed member restarts and catches up; twice.  At the end every member's store (the Java
ones read by pymq's store) holds every acknowledged entry, identically.

Which member leads is up to the elections (random timeouts), so a run may see pymq lead or
only follow; the test prints what it saw.

Needs the Java build (/work/shared/java/README.md); skipped otherwise.
"""

from __future__ import annotations

import os
import pathlib
import random
import shutil
import subprocess

import pytest
import trio

from pymq.dledger.config import DLedgerConfig
from pymq.dledger.protocol import (
    AppendEntryRequest,
    AppendEntryResponse,
    MetadataRequest,
    MetadataResponse,
    RequestCode,
    decode,
    encode,
)
from pymq.dledger.server import DLedgerServer
from pymq.dledger.store import DLedgerFileStore
from pymq.remoting.client import RemotingClient, open_remoting_client
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.errors import RemotingError
from tests.helpers import free_port

RMQ_BUILD = pathlib.Path(os.environ.get("RMQ_BUILD", "/tmp/rmqjava494"))
CLASSPATH = RMQ_BUILD / "lib" / "full.classpath"
PYMQ = "n2"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not CLASSPATH.exists() or shutil.which("java") is None,
        reason=f"DLedger 0.2.6 is not built ({CLASSPATH} missing, or no java): "
        "see /work/shared/java/README.md",
    ),
]


class MixedGroup:
    def __init__(self, base: pathlib.Path, nursery: trio.Nursery, client: RemotingClient):
        self.base = base
        self.nursery = nursery
        self.client = client
        self.ports = {f"n{i}": free_port() for i in range(3)}
        self.peers = ";".join(f"{pid}-127.0.0.1:{port}" for pid, port in self.ports.items())
        self.java: dict[str, subprocess.Popen[bytes]] = {}
        self.pymq_scope: trio.CancelScope | None = None
        self.acked: dict[int, bytes] = {}
        self.leaders: list[str] = []

    def config(self, pid: str) -> DLedgerConfig:
        return DLedgerConfig(
            group="g", self_id=pid, peers=self.peers, store_base_dir=str(self.base)
        )

    async def start(self, pid: str) -> None:
        if pid != PYMQ:
            log = open(self.base / f"java-{pid}.log", "ab")  # noqa: SIM115 (the child's)
            self.java[pid] = subprocess.Popen(
                [
                    "java",
                    "-Xmx128m",
                    "-cp",
                    CLASSPATH.read_text().strip(),
                    "io.openmessaging.storage.dledger.DLedger",
                    "--group",
                    "g",
                    "--id",
                    pid,
                    "--peers",
                    self.peers,
                    "--store-base-dir",
                    str(self.base),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            log.close()
            return
        server = DLedgerServer(self.config(pid), host="127.0.0.1", rng=random.Random(7))
        scope = trio.CancelScope()

        async def run(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            with scope:
                await server.run(task_status=task_status)
                await trio.sleep_forever()

        await self.nursery.start(run)
        self.pymq_scope = scope

    def kill(self, pid: str) -> None:
        if pid == PYMQ:
            assert self.pymq_scope is not None
            self.pymq_scope.cancel()
            self.pymq_scope = None
        else:
            proc = self.java.pop(pid)
            proc.kill()
            proc.wait()

    def alive(self) -> list[str]:
        return [pid for pid in self.ports if pid in self.java or (pid == PYMQ and self.pymq_scope)]

    async def leader_seen_by(self, pid: str) -> str | None:
        request = MetadataRequest(group="g", remote_id=pid)
        try:
            answer = await self.client.invoke(
                f"127.0.0.1:{self.ports[pid]}",
                RemotingCommand.request(RequestCode.METADATA, body=encode(request)),
                1.0,
            )
        except RemotingError:
            return None
        return decode(MetadataResponse, answer.body).leader_id

    async def agreed_leader(self, not_: str | None = None, timeout: float = 30) -> str:
        with trio.fail_after(timeout):
            while True:
                alive = self.alive()
                seen = {await self.leader_seen_by(pid) for pid in alive}
                if len(seen) == 1:
                    (leader,) = seen
                    if leader in alive and leader != not_:
                        self.leaders.append(leader)
                        return leader
                await trio.sleep(0.2)

    async def append(self, leader: str, count: int) -> None:
        for _ in range(count):
            body = b"mixed-%d" % len(self.acked)
            request = AppendEntryRequest(group="g", remote_id=leader, body=body)
            answer = await self.client.invoke(
                f"127.0.0.1:{self.ports[leader]}",
                RemotingCommand.request(RequestCode.APPEND, body=encode(request)),
                5.0,
            )
            response = decode(AppendEntryResponse, answer.body)
            assert response.code == 200, response
            assert response.index not in self.acked
            self.acked[response.index] = body

    async def caught_up(self, pid: str, leader: str, timeout: float = 30) -> None:
        with trio.fail_after(timeout):
            while await self.leader_seen_by(pid) != leader:
                await trio.sleep(0.2)

    def stop_all(self) -> None:
        for proc in self.java.values():
            proc.terminate()
        for proc in self.java.values():
            proc.wait(timeout=30)
        self.java.clear()
        if self.pymq_scope is not None:
            self.pymq_scope.cancel()


async def test_a_group_of_two_java_members_and_one_pymq_member(tmp_path) -> None:
    async with open_remoting_client() as client, trio.open_nursery() as nursery:
        group = MixedGroup(tmp_path, nursery, client)
        try:
            for pid in group.ports:
                await group.start(pid)
            leader = await group.agreed_leader()
            await group.append(leader, 30)
            for _ in range(2):
                group.kill(leader)
                new = await group.agreed_leader(not_=leader)
                await group.append(new, 30)
                await group.start(leader)
                await group.caught_up(leader, new)
                await group.append(new, 10)
                leader = new
            await trio.sleep(3)  # the last commit index reaches the followers (1 s COMMIT)
        finally:
            group.stop_all()
        await trio.sleep(0.5)
        nursery.cancel_scope.cancel()
    print("leaders in turn:", group.leaders)
    logs = {}
    for pid in group.ports:
        store = DLedgerFileStore(group.config(pid))
        store.open()
        logs[pid] = [(e.term, e.body) for e in store.entries()]
        assert store.committed_index == len(group.acked) - 1, (pid, store.committed_index)
        store.close()
    assert logs["n0"] == logs["n1"] == logs["n2"]
    assert [body for _, body in logs["n0"]] == [group.acked[i] for i in range(len(group.acked))]
