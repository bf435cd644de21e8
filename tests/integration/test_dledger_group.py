"""Three pymq DLedger members (pymq.dledger.server) on loopback ports, each a task under its
own cancel scope: they elect a leader, take 1,000 appends, lose the leader (its scope
cancelled: its server, its connections and its loops end), elect another within seconds, lose
no acknowledged entry, and the followers' logs are prefixes of the leader's.  Then the old
member restarts from its files and catches up."""

from __future__ import annotations

import random

import pytest
import trio

from pymq.dledger.errors import DLedgerError, ResponseCode
from pymq.dledger.protocol import (
    AppendEntryRequest,
    AppendEntryResponse,
    MetadataRequest,
    MetadataResponse,
    RequestCode,
    VoteResponse,
    decode,
    encode,
)
from pymq.dledger.raft import Role, RoleChange
from pymq.dledger.server import DLedgerServer, member_configs
from pymq.remoting.client import open_remoting_client
from pymq.remoting.codec import RemotingCommand
from tests.helpers import free_port, wait_until

# DLedger's timings scaled down tenfold (heartbeats every 200 ms, a follower gives up after
# three), so that a failover takes about a second
TIMINGS = {
    "heart_beat_time_interval_ms": 200,
    "max_heart_beat_leak": 3,
    "min_vote_interval_ms": 30,
    "max_vote_interval_ms": 100,
    "mapped_file_size_for_entry_data": 256 * 1024,
    "mapped_file_size_for_entry_index": 32 * 4096,
}


class Group:
    def __init__(self, base: str, nursery: trio.Nursery) -> None:
        self.ports = [free_port() for _ in range(3)]
        self.configs = member_configs(base, self.ports, **TIMINGS)
        self.nursery = nursery
        self.servers: dict[str, DLedgerServer] = {}
        self.scopes: dict[str, trio.CancelScope] = {}
        self.changes: list[tuple[str, RoleChange]] = []

    async def start(self, pid: str) -> DLedgerServer:
        config = next(c for c in self.configs if c.self_id == pid)
        server = DLedgerServer(
            config,
            host="127.0.0.1",
            rng=random.Random(pid),
            on_role_change=lambda change: self.changes.append((pid, change)),
        )
        scope = trio.CancelScope()

        async def run(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            with scope:
                await server.run(task_status=task_status)
                await trio.sleep_forever()

        await self.nursery.start(run)
        self.servers[pid], self.scopes[pid] = server, scope
        return server

    def kill(self, pid: str) -> None:
        self.scopes.pop(pid).cancel()
        del self.servers[pid]

    def leader(self) -> DLedgerServer | None:
        leaders = [
            s for s in self.servers.values() if s.node is not None and s.node.role is Role.LEADER
        ]
        if len(leaders) != 1:
            return None
        leader = leaders[0]
        assert leader.node is not None
        others = [s.node for s in self.servers.values() if s is not leader]
        if all(n is not None and n.leader_id == leader.node.self_id for n in others):
            return leader
        return None


def _log(server: DLedgerServer) -> list[tuple[int, bytes]]:
    store = server.store
    assert store is not None
    return [(e.term, e.body) for e in store.entries()]


@pytest.mark.slow
async def test_three_members_elect_replicate_and_fail_over(tmp_path) -> None:
    async with trio.open_nursery() as nursery:
        group = Group(str(tmp_path), nursery)
        for pid in ("n0", "n1", "n2"):
            await group.start(pid)
        leader = await wait_until(group.leader, timeout=10, what="a leader")
        assert leader.node is not None

        acked: dict[int, bytes] = {}

        async def producer(k: int) -> None:
            for i in range(k, 1000, 20):
                body = b"message-%04d" % i
                ack = await leader.append(body)
                assert ack.code is ResponseCode.SUCCESS, ack
                acked[ack.index] = body

        started = trio.current_time()
        with trio.fail_after(15):  # about 1 s here; 22 s when pushes went out of order
            async with trio.open_nursery() as producers:
                for k in range(20):
                    producers.start_soon(producer, k)
        print(f"1000 appends in {trio.current_time() - started:.2f} s")
        assert len(acked) == 1000 and sorted(acked) == list(range(1000))

        # a client's APPEND and METADATA over the wire, as DLedgerClient sends them
        async with open_remoting_client() as client:
            address = f"127.0.0.1:{group.ports[int(leader.node.self_id[1:])]}"
            request = AppendEntryRequest(
                group="g", remote_id=leader.node.self_id, body=b"over the wire"
            )
            answer = await client.invoke(
                address, RemotingCommand.request(RequestCode.APPEND, body=encode(request))
            )
            appended = decode(AppendEntryResponse, answer.body)
            assert (answer.code, appended.code, appended.index) == (200, 200, 1000)
            acked[1000] = b"over the wire"
            meta = await client.invoke(
                address,
                RemotingCommand.request(
                    RequestCode.METADATA,
                    body=encode(MetadataRequest(group="g", remote_id=leader.node.self_id)),
                ),
            )
            peers = decode(MetadataResponse, meta.body)
            assert peers.leader_id == leader.node.self_id and len(peers.peers or {}) == 3
            junk = await client.invoke(
                address, RemotingCommand.request(RequestCode.VOTE, body=b"{")
            )
            assert decode(VoteResponse, junk.body).code == ResponseCode.UNEXPECTED_ARGUMENT

        old_id, old_term = leader.node.self_id, leader.node.term
        killed_at = trio.current_time()
        group.kill(old_id)
        try:
            dead = await leader.append(b"to a dead member")
        except DLedgerError as exc:
            assert exc.code is ResponseCode.LEADER_NOT_READY
        else:
            assert dead.code is ResponseCode.TERM_CHANGED
        new = await wait_until(group.leader, timeout=10, what="a new leader")
        failover = trio.current_time() - killed_at
        assert new.node is not None and new.node.self_id != old_id and new.node.term > old_term
        assert failover < 5, failover
        assert (new.node.self_id, RoleChange(new.node.term, Role.LEADER, new.node.self_id)) in (
            group.changes
        )
        print(f"failover in {failover:.2f} s")
        ack = await new.append(b"after the failover")
        assert ack.code is ResponseCode.SUCCESS
        acked[ack.index] = b"after the failover"

        new_log = _log(new)
        for index, body in acked.items():
            assert new_log[index][1] == body
        for server in group.servers.values():
            mine = _log(server)
            assert mine == new_log[: len(mine)]

        back = await group.start(old_id)
        await wait_until(
            lambda: back.store is not None and back.store.committed_index == ack.index,
            timeout=10,
            what="the old leader catching up",
        )
        assert _log(back) == _log(new)
        nursery.cancel_scope.cancel()


async def test_a_store_failure_is_answered_with_its_code_and_the_member_goes_on(
    tmp_path,
) -> None:
    (config,) = member_configs(str(tmp_path), [free_port()], **TIMINGS)
    server = DLedgerServer(config, host="127.0.0.1", rng=random.Random(1))
    async with trio.open_nursery() as nursery, open_remoting_client() as client:
        port = await nursery.start(server.run)
        await wait_until(lambda: server.node is not None and server.node.role is Role.LEADER)
        assert server.node is not None
        ack = await server.append(b"alone")  # a group of one commits at once
        assert (ack.code, ack.index) == (ResponseCode.SUCCESS, 0)

        def broken(request: object, now: float) -> object:
            raise DLedgerError(ResponseCode.DISK_ERROR, "simulated")

        real = server.node.handle
        server.node.handle = broken  # type: ignore[method-assign]
        vote = RemotingCommand.request(
            RequestCode.VOTE, body=encode(MetadataRequest(group="g", remote_id="n0"))
        )
        answer = await client.invoke(f"127.0.0.1:{port}", vote)
        assert answer.code == 200 and "simulated" in (answer.remark or "")
        assert decode(VoteResponse, answer.body).code == ResponseCode.DISK_ERROR
        server.node.handle = real  # type: ignore[method-assign]
        meta = RemotingCommand.request(
            RequestCode.METADATA, body=encode(MetadataRequest(group="g", remote_id="n0"))
        )
        answer = await client.invoke(f"127.0.0.1:{port}", meta)
        assert decode(MetadataResponse, answer.body).leader_id == "n0"
        nursery.cancel_scope.cancel()


async def test_an_idle_follower_sleeps_until_its_heartbeat_timeout_and_flushes_on_writes(
    tmp_path,
) -> None:
    """A follower's only timer is its leader's heartbeat timeout: idle, its state maintainer
    runs when a heartbeat comes or the timeout is due, not every 10 ms, and its flusher sleeps
    until something is written (then it fsyncs within flushFileInterval, as before); a
    follower whose leader is gone still becomes a candidate in time."""
    async with trio.open_nursery() as nursery:
        group = Group(str(tmp_path), nursery)
        for pid in ("n0", "n1", "n2"):
            await group.start(pid)
        await wait_until(lambda: group.leader() is not None, timeout=10, what="a leader")
        leader = group.leader()
        assert leader is not None and leader.node is not None
        followers = [s for s in group.servers.values() if s is not leader]
        ticks = {id(s): 0 for s in followers}
        flushes = {id(s): 0 for s in followers}
        for s in followers:
            node, store = s.node, s.store
            assert node is not None and store is not None

            def counted_tick(now: float, s=s, real=node.tick) -> list:  # type: ignore[no-untyped-def]
                ticks[id(s)] += 1
                return real(now)

            def counted_dirty(s=s, real=store.dirty) -> bool:  # type: ignore[no-untyped-def]
                flushes[id(s)] += 1
                return real()

            node.tick = counted_tick  # type: ignore[method-assign]
            store.dirty = counted_dirty  # type: ignore[method-assign]
        await trio.sleep(1.0)
        # heartbeats every 200 ms wake it (about 5 in a second), not 100 ticks of 10 ms
        for s in followers:
            assert ticks[id(s)] <= 15, ticks
            assert flushes[id(s)] <= 15, flushes
        for i in range(20):
            assert (await leader.append(b"w%d" % i)).code is ResponseCode.SUCCESS
        for s in followers:  # written, then fsynced within flushFileInterval (10 ms)
            store = s.store
            assert store is not None
            await wait_until(lambda store=store: not store.dirty(), timeout=2, what="fsynced")
        assert leader.node is not None
        old = leader.node.self_id
        group.kill(old)  # its followers' timeout comes: one of them leads
        await wait_until(
            lambda: group.leader() is not None and group.leader() is not leader,
            timeout=10,
            what="a new leader",
        )
        nursery.cancel_scope.cancel()


async def test_an_idle_leader_wakes_at_its_heartbeats_not_every_10_ms(
    tmp_path, autojump_clock
) -> None:
    """The state maintainer of an idle leader (a group of one here: its own vote elects it)
    sleeps until its node's next timer (its next heartbeat, every 2 s by default), not every
    10 ms: its wakeups over a minute of a mock clock are counted, and an append after that
    minute is acknowledged at once."""
    (config,) = member_configs(str(tmp_path), [free_port()])
    server = DLedgerServer(config, host="127.0.0.1", rng=random.Random(1))
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        await wait_until(
            lambda: server.node is not None and server.node.role is Role.LEADER, timeout=30
        )
        assert (await server.append(b"first")).code is ResponseCode.SUCCESS
        before = server.wakeups
        await trio.sleep(60)
        idle = server.wakeups - before
        assert idle <= 60 / 2 * 2 + 5, idle  # (10 ms ticks: 6,000)
        start = trio.current_time()
        assert (await server.append(b"after")).code is ResponseCode.SUCCESS
        assert trio.current_time() - start < 0.01
        nursery.cancel_scope.cancel()
