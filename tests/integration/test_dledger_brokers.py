"""Three pymq brokers in DLedger mode (issue #42), one name server, all in-process on loopback:
the group elects a leader, which registers as the master (brokerId 0) and the others as slaves
(brokerId selfId + 1); sends through the name server's route are answered SEND_OK once a
majority has them and are consumable from the leader, and the followers build their consume
queues from the committed entries; the leader is killed (its cancel scope), another is elected
and registered as master, sends resume, and nothing acknowledged is lost, every queue dense.
A leader left alone refuses sends with Java's code and remark; a member restarted with a torn
tail catches up."""

from __future__ import annotations

import os
import pathlib
from typing import Any

import attrs
import pytest
import trio

from pymq.admin import cli
from pymq.admin.protocol import Request
from pymq.admin.session import AdminSession
from pymq.broker.config import BrokerConfig
from pymq.broker.controller import BrokerController
from pymq.broker.metrics import BrokerCollector
from pymq.client import (
    ConsumeFromWhere,
    Message,
    MessageExt,
    MQClientError,
    Producer,
    PullConsumer,
    PushConsumer,
)
from pymq.client import topics as topic_admin
from pymq.common.consumer import MessageQueue
from pymq.dledger.config import from_store_config
from pymq.remoting import headers as H
from pymq.remoting.client import open_remoting_client
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.remoting.config import NettyClientConfig, NettyServerConfig
from pymq.store.config import BrokerRole, MessageStoreConfig
from pymq.store.message_store import DefaultMessageStore
from tests.helpers import free_port, make_namesrv, wait_until

pytestmark = pytest.mark.slow  # three brokers, elections, a failover

TOPIC = "DLedgerTopic"
BUSY_REMARK = "[PC_SYNCHRONIZED]broker busy, start flow control for a while"
NAME = "dl-broker"
QUEUES = 4
# DLedger's timings scaled down tenfold (heartbeats every 200 ms, a follower gives up after
# three missed), so that a failover takes about a second
TIMINGS = {
    "heart_beat_time_interval_ms": 200,
    "max_heart_beat_leak": 3,
    "min_vote_interval_ms": 30,
    "max_vote_interval_ms": 100,
    "max_wait_ack_time_ms": 1500,
}


class Group:
    def __init__(self, tmp: pathlib.Path, ns_port: int, nursery: trio.Nursery) -> None:
        self.tmp = tmp
        self.ns = f"127.0.0.1:{ns_port}"
        self.nursery = nursery
        self.ports = [free_port() for _ in range(3)]
        self.peers = ";".join(f"n{i}-127.0.0.1:{p}" for i, p in enumerate(self.ports))
        self.brokers: dict[str, BrokerController] = {}
        self.scopes: dict[str, trio.CancelScope] = {}
        self.preferred: str | None = None

    def build(self, sid: str) -> BrokerController:
        store_config = MessageStoreConfig(
            store_path_root_dir=str(self.tmp / sid),
            mapped_file_size_commit_log=1 << 20,
            enable_d_leger_commit_log=True,
            d_leger_group=NAME,
            d_leger_peers=self.peers,
            d_leger_self_id=sid,
            preferred_leader_id=self.preferred,
        )
        dledger = attrs.evolve(from_store_config(store_config), **TIMINGS)
        broker_config = BrokerConfig(
            broker_name=NAME,
            broker_ip1="127.0.0.1",
            broker_ip2="127.0.0.1",
            namesrv_addr=self.ns,
        )
        return BrokerController(
            broker_config,
            NettyServerConfig(listen_port=0, bind_address="127.0.0.1"),
            NettyClientConfig(config_file=""),
            store_config,
            store=DefaultMessageStore(store_config, dledger_config=dledger),
        )

    async def start(self, sid: str) -> BrokerController:
        broker = self.brokers[sid] = self.build(sid)
        scope = self.scopes[sid] = trio.CancelScope()

        async def serve(*, task_status: trio.TaskStatus[None]) -> None:
            with scope:
                await broker.run(task_status=task_status)

        await self.nursery.start(serve)
        return broker

    def stop(self, sid: str) -> None:
        self.scopes.pop(sid).cancel()
        del self.brokers[sid]

    def masters(self) -> list[str]:
        return [
            sid
            for sid, b in self.brokers.items()
            if b.broker_config.broker_id == 0
            and b.store_config.broker_role is BrokerRole.SYNC_MASTER
        ]

    async def master(self, timeout: float = 15) -> BrokerController:
        await wait_until(lambda: len(self.masters()) == 1, timeout=timeout, what="one master")
        return self.brokers[self.masters()[0]]

    async def routed_master(self, topic: str = TOPIC) -> str:
        """The address the name server routes the group's master (brokerId 0) to."""
        async with Producer("probe", self.ns) as probe:
            assert probe.client is not None
            route = await probe.client.fetch_route(topic)
        assert route is not None
        (data,) = [d for d in route.broker_datas if d.broker_name == NAME]
        return data.broker_addrs.get(0, "")


async def send_all(producer: Producer, bodies: list[bytes]) -> dict[bytes, Any]:
    """Send each body until it is acknowledged (SEND_OK), as an application retries a send
    that failed (the producer itself fetches the route again after a failure)."""
    acked: dict[bytes, Any] = {}
    for body in bodies:
        with trio.fail_after(20):
            while True:
                try:
                    acked[body] = await producer.send(Message(TOPIC, body), timeout=3)
                    break
                except MQClientError:
                    await trio.sleep(0.2)
    return acked


async def pull_all(ns: str, group: str) -> dict[int, list[tuple[int, bytes]]]:
    """Every queue's messages (queue offset, body) from offset 0, pulled from the master."""
    out: dict[int, list[tuple[int, bytes]]] = {}
    async with PullConsumer(group, ns) as consumer:
        for q in range(QUEUES):
            mq = MessageQueue(TOPIC, NAME, q)
            got: list[tuple[int, bytes]] = []
            offset = 0
            while True:
                result = await consumer.pull(mq, "*", offset, 32)
                if not result.messages:
                    break
                got += [(m.queue_offset, m.body) for m in result.messages]
                offset = result.next_begin_offset
            out[q] = got
    return out


async def send_nothing(message: str) -> None:
    """An admin session's sender, for handlers called directly."""


def queued(broker: BrokerController) -> int:
    return sum(max(broker.store.get_max_offset_in_queue(TOPIC, q), 0) for q in range(QUEUES))


def assert_dense(pulled: dict[int, list[tuple[int, bytes]]]) -> None:
    for q, got in pulled.items():
        assert [o for o, _ in got] == list(range(len(got))), f"queue {q} not dense"


async def test_a_group_elects_serves_fails_over_and_loses_nothing_acknowledged(
    tmp_path: pathlib.Path,
) -> None:
    namesrv = make_namesrv(tmp_path)
    async with trio.open_nursery() as nursery:
        ns_port = await nursery.start(namesrv.run)
        group = Group(tmp_path, ns_port, nursery)
        for sid in ("n0", "n1", "n2"):
            await group.start(sid)
        leader = await group.master()
        followers = [b for b in group.brokers.values() if b is not leader]
        for f in followers:  # slaves with RocketMQ's follower ids
            assert f.store_config.broker_role is BrokerRole.SLAVE
            sid = f.store_config.d_leger_self_id
            assert sid is not None and f.broker_config.broker_id == int(sid[1:]) + 1
        addrs = [b.broker_addr for b in group.brokers.values()]
        await topic_admin.create_topic(group.ns, TOPIC, queues=QUEUES, brokers=addrs)
        assert await group.routed_master() == leader.broker_addr

        pushed: set[bytes] = set()

        async def handler(msgs: list[MessageExt]) -> bool:
            pushed.update(m.body for m in msgs)
            return True

        async with (
            Producer("dl-producer", group.ns) as producer,
            PushConsumer(
                "dl-push",
                group.ns,
                handler,
                consume_from=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
            ) as consumer,
        ):
            await consumer.subscribe(TOPIC)
            first = [b"before-%d" % i for i in range(40)]
            acked = await send_all(producer, first)
            batch = [b"batch-%d" % i for i in range(5)]  # a batch: an entry per message
            sent = await producer.send_batch([Message(TOPIC, b) for b in batch])
            acked |= dict.fromkeys(batch, sent)
            first += batch
            for result in acked.values():
                assert result.status == "SEND_OK"
            # consumable from the leader; the followers dispatched the committed entries too
            pulled = await pull_all(group.ns, "dl-c1")
            assert sorted(b for got in pulled.values() for _, b in got) == sorted(first)
            assert_dense(pulled)
            for f in followers:
                await wait_until(lambda f=f: queued(f) == 45, timeout=10, what="follower CQs")
            # pushed at once: the leader's long polling is woken by each committed arrival
            await wait_until(lambda: set(first) <= pushed, timeout=2, what="pushed at once")
            # physical offsets are entry positions + 48, as Java's DLedgerCommitLog's
            offsets = [leader.store.get_commitlog_offset_in_queue(TOPIC, q, 0) for q in range(4)]
            assert all(o >= 48 for o in offsets)
            assert min(offsets) == 48

            old = next(sid for sid, b in group.brokers.items() if b is leader)
            killed_at = trio.current_time()
            group.stop(old)
            # sends go on at once: they fail until the new master is elected and registered
            acked |= await send_all(producer, [b"after-0"])
            failover = trio.current_time() - killed_at
            new_leader = await group.master()
            assert new_leader is not leader
            assert await group.routed_master() == new_leader.broker_addr
            second = [b"after-%d" % i for i in range(1, 40)]
            acked |= await send_all(producer, second)
            print(f"failover (leader cancelled -> first SEND_OK): {failover:.2f} s")
            # the tools' view: GET_BROKER_RUNTIME_INFO's DLedger keys and the gauges
            info = new_leader.runtime_info()
            assert info["dLedgerRole"] == "LEADER" and info["brokerRole"] == "SYNC_MASTER"
            assert int(info["dLedgerTerm"]) >= 2 and info["dLedgerGroup"] == NAME
            assert info["dLedgerLeaderId"] == new_leader.store_config.d_leger_self_id
            assert int(info["dLedgerCommittedIndex"]) == int(info["dLedgerLedgerEndIndex"]) >= 45
            lags = dict(p.split(":") for p in info["dLedgerFollowerLag"].split(";"))
            assert set(lags) == {"n0", "n1", "n2"} - {new_leader.store_config.d_leger_self_id}
            assert int(lags[old]) > 0  # the killed member misses what came since
            gauges = {
                (m.name, s.labels.get("peer")): s.value
                for m in BrokerCollector(new_leader).collect()
                if m.name.startswith("pymq_dledger")
                for s in m.samples
            }
            assert gauges[("pymq_dledger_is_leader", None)] == 1.0
            assert gauges[("pymq_dledger_follower_lag", old)] == int(lags[old])
            # pymq-admin dLedgerStatus and the console's dledger.status: the same view
            leader_id = new_leader.store_config.d_leger_self_id
            view = await cli.run(cli.build_parser().parse_args(["dLedgerStatus", "-n", group.ns]))
            assert isinstance(view, cli.Output), view
            session = AdminSession(new_leader, "t", send_nothing, nursery, authenticated=True)
            console = await session._dledger_status(Request(1, "dledger.status", {}))
            for groups in (view.data, console["groups"]):
                (g,) = groups
                assert (g["brokerName"], g["group"], g["leaderId"]) == (NAME, NAME, leader_id)
                assert g["term"] == int(info["dLedgerTerm"]) and g["committedIndex"] >= 45
                members = {m["selfId"]: m for m in g["members"]}
                assert set(members) == {"n0", "n1", "n2"}
                assert members[leader_id]["role"] == "LEADER" and members[leader_id]["lag"] == 0
                assert members[leader_id]["brokerId"] == 0
                assert not members[old]["online"] and members[old]["lag"] > 0
                (live,) = set(members) - {leader_id, old}
                assert members[live]["role"] == "FOLLOWER" and members[live]["online"]
                assert members[live]["brokerId"] == int(live[1:]) + 1
            text = view.render()
            assert f"group {NAME}: term {info['dLedgerTerm']}, leader {leader_id}" in text
            assert "unreachable" in text
            # a consumer running throughout gets every acknowledged message
            await wait_until(lambda: set(acked) <= pushed, timeout=30, what="pushed all")

        pulled = await pull_all(group.ns, "dl-c2")
        bodies = [b for got in pulled.values() for _, b in got]
        assert set(acked) <= set(bodies)  # nothing acknowledged lost
        assert len(bodies) == len(set(bodies))  # nothing twice
        assert_dense(pulled)

        # the old leader comes back as a follower and catches up
        back = await group.start(old)
        await wait_until(lambda: queued(back) == len(bodies), timeout=20, what="catch-up")
        assert back.store_config.broker_role is BrokerRole.SLAVE
        assert back.broker_config.broker_id == int(old[1:]) + 1
        nursery.cancel_scope.cancel()


async def test_a_leader_alone_refuses_sends_with_javas_code(tmp_path: pathlib.Path) -> None:
    namesrv = make_namesrv(tmp_path)
    async with trio.open_nursery() as nursery:
        ns_port = await nursery.start(namesrv.run)
        group = Group(tmp_path, ns_port, nursery)
        for sid in ("n0", "n1", "n2"):
            await group.start(sid)
        leader = await group.master()
        addrs = [b.broker_addr for b in group.brokers.values()]
        await topic_admin.create_topic(group.ns, TOPIC, queues=QUEUES, brokers=addrs)
        for sid in [s for s, b in group.brokers.items() if b is not leader]:
            group.stop(sid)
        ext = H.SendMessageRequestHeader.v2_ext("pg", TOPIC, 0, 0, 1, 0, "", False)
        async with open_remoting_client() as client:
            answers = []
            for i in range(2):
                req = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, ext, b"alone-%d" % i)
                answers.append(await client.invoke(leader.broker_addr, req, 10))
                await wait_until(
                    lambda: leader.store_config.broker_role is BrokerRole.SLAVE,
                    timeout=10,
                    what="the leader stepped down",
                )
        # the first (a leader without its majority): not acknowledged -- SYSTEM_BUSY when
        # it waited maxWaitAckTimeMs or was refused once the heartbeats had failed (Java's
        # OS_PAGECACHE_BUSY), SYSTEM_ERROR "UNKNOWN_ERROR" when the leader stepped down while
        # it waited (DLedger's TERM_CHANGED); the second, once it stepped down: a slave's
        # refusal
        assert (answers[0].code, answers[0].remark) in (
            (
                ResponseCode.SYSTEM_BUSY,
                "[PC_SYNCHRONIZED]broker busy, start flow control for a while",
            ),
            (ResponseCode.SYSTEM_ERROR, "UNKNOWN_ERROR"),
        ), answers[0]
        assert answers[1].code == ResponseCode.SERVICE_NOT_AVAILABLE
        # a slave's refusal, as Java 4.9.4 words it for any slave
        assert answers[1].remark is not None
        assert answers[1].remark.startswith("service not available now. It may be caused by")
        assert "messages are put to the slave" in answers[1].remark
        assert queued(leader) == 0  # nothing was dispatched: nothing committed
        nursery.cancel_scope.cancel()


async def test_a_member_restarted_with_a_torn_tail_catches_up(tmp_path: pathlib.Path) -> None:
    namesrv = make_namesrv(tmp_path)
    async with trio.open_nursery() as nursery:
        ns_port = await nursery.start(namesrv.run)
        group = Group(tmp_path, ns_port, nursery)
        for sid in ("n0", "n1", "n2"):
            await group.start(sid)
        leader = await group.master()
        addrs = [b.broker_addr for b in group.brokers.values()]
        await topic_admin.create_topic(group.ns, TOPIC, queues=QUEUES, brokers=addrs)
        async with Producer("dl-producer", group.ns) as producer:
            acked = await send_all(producer, [b"m-%d" % i for i in range(30)])
        follower_id = next(sid for sid, b in group.brokers.items() if b is not leader)
        follower = group.brokers[follower_id]
        await wait_until(lambda: queued(follower) == 30, timeout=10, what="follower CQs")
        log_store = follower.store.dledger
        assert log_store is not None
        data_dir = log_store.dledger_config.data_path
        group.stop(follower_id)
        await trio.sleep(0.3)
        # A crash: the tail written since the last flush torn (its last 300 bytes zeroed: the
        # last entry's header is gone, and recovery cuts it; the one before keeps its header
        # but not its body, which only the leader's comparison of whole entries finds), and
        # the checkpoint as it was written before those entries came (every 3 s).
        (name,) = sorted(os.listdir(data_dir))[-1:]
        path = os.path.join(data_dir, name)
        end = leader.store.commitlog.max_offset - int(name)
        assert end > 1000
        with open(path, "r+b") as f:
            f.seek(end - 300)
            f.write(bytes(300))
        checkpoint = os.path.join(log_store.dledger_config.default_path, "checkpoint")
        with open(checkpoint, "w") as f:
            f.write("committedIndex=19\nendIndex=19\n")
        back = await group.start(follower_id)
        back_log = back.store.dledger
        assert back_log is not None
        assert back_log.dledger.ledger_end_index == 28 and back_log.dledger.committed_index == 19
        # the leader finds the divergence at its next push of an entry (as DLedger 0.2.6: an
        # idle leader does not look at a follower that came back)
        async with Producer("dl-producer", group.ns) as producer:
            acked |= await send_all(producer, [b"n-%d" % i for i in range(5)])
        theirs = leader.store.dledger.dledger  # type: ignore[union-attr]
        await wait_until(
            lambda: (
                back_log.dledger.ledger_end_index == theirs.ledger_end_index
                and back_log.dledger.committed_index == theirs.committed_index
                and queued(back) == 35
            ),
            timeout=20,
            what="the restarted member caught up",
        )
        assert len(acked) == 35
        for i in range(theirs.ledger_end_index + 1):
            assert back_log.dledger.get(i).encode() == theirs.get(i).encode()
        nursery.cancel_scope.cancel()


async def test_the_preferred_leader_takes_over_and_becomes_master(tmp_path: pathlib.Path) -> None:
    namesrv = make_namesrv(tmp_path)
    async with trio.open_nursery() as nursery:
        ns_port = await nursery.start(namesrv.run)
        group = Group(tmp_path, ns_port, nursery)
        group.preferred = "n2"
        for sid in ("n0", "n1"):  # n2 comes later: another member leads first
            await group.start(sid)
        first = await group.master()
        addrs = [b.broker_addr for b in group.brokers.values()]
        await topic_admin.create_topic(group.ns, TOPIC, queues=QUEUES, brokers=addrs)
        async with Producer("dl-producer", group.ns) as producer:
            acked = await send_all(producer, [b"a-%d" % i for i in range(20)])
            preferred = await group.start("n2")
            await topic_admin.create_topic(
                group.ns, TOPIC, queues=QUEUES, brokers=[preferred.broker_addr]
            )
            await wait_until(lambda: group.masters() == ["n2"], timeout=20, what="n2 master")
            assert first.store_config.broker_role is BrokerRole.SLAVE
            with trio.fail_after(10):
                while await group.routed_master() != preferred.broker_addr:
                    await trio.sleep(0.1)
            acked |= await send_all(producer, [b"b-%d" % i for i in range(20)])
        pulled = await pull_all(group.ns, "dl-c3")
        assert set(acked) <= {b for got in pulled.values() for _, b in got}
        assert_dense(pulled)
        nursery.cancel_scope.cancel()


async def test_the_leader_killed_under_load_loses_nothing_acknowledged(
    tmp_path: pathlib.Path,
) -> None:
    """Producers keep sending while the leader is killed: entries in flight (appended, not
    yet committed) are lost or kept, but every send answered SEND_OK is consumable from the
    new leader, and every queue is dense (offsets without holes)."""
    namesrv = make_namesrv(tmp_path)
    async with trio.open_nursery() as nursery:
        ns_port = await nursery.start(namesrv.run)
        group = Group(tmp_path, ns_port, nursery)
        for sid in ("n0", "n1", "n2"):
            await group.start(sid)
        leader = await group.master()
        addrs = [b.broker_addr for b in group.brokers.values()]
        await topic_admin.create_topic(group.ns, TOPIC, queues=QUEUES, brokers=addrs)
        acked: set[bytes] = set()
        stop = trio.Event()

        async def produce(producer: Producer, k: int) -> None:
            i = 0
            while not stop.is_set():
                body = b"p%d-%d" % (k, i)
                i += 1
                try:
                    result = await producer.send(Message(TOPIC, body), timeout=3)
                except MQClientError:
                    await trio.sleep(0.05)
                    continue
                assert result.status == "SEND_OK"
                acked.add(body)

        async with Producer("dl-load", group.ns) as producer, trio.open_nursery() as load:
            for k in range(8):
                load.start_soon(produce, producer, k)
            await wait_until(lambda: len(acked) >= 100, timeout=20, what="load running")
            old = next(sid for sid, b in group.brokers.items() if b is leader)
            group.stop(old)
            before = len(acked)
            await wait_until(lambda: len(acked) >= before + 100, timeout=30, what="resumed")
            stop.set()
        new_leader = await group.master()
        assert new_leader is not leader
        pulled = await pull_all(group.ns, "dl-c4")
        bodies = {b for got in pulled.values() for _, b in got}
        assert acked <= bodies, f"{len(acked - bodies)} acknowledged messages lost"
        assert_dense(pulled)
        nursery.cancel_scope.cancel()


async def test_sends_to_the_leader_are_served_in_the_reader_and_answered_at_the_commit(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A send to a topic that exists is put in the connection's reader (no task per request,
    as a SYNC_FLUSH broker's) and its answer written when the entry commits (a majority has
    it): pipelined sends, single and batch, are all SEND_OK, and each answer comes when the
    leader's committed index has its entry."""
    from pymq.broker.processors.send import SendProcessor

    tasks: list[int] = []
    real = SendProcessor.send_message

    async def counted(self: SendProcessor, channel: Any, req: RemotingCommand) -> Any:
        tasks.append(req.code)
        return await real(self, channel, req)

    monkeypatch.setattr(SendProcessor, "send_message", counted)
    namesrv = make_namesrv(tmp_path)
    async with trio.open_nursery() as nursery:
        ns_port = await nursery.start(namesrv.run)
        group = Group(tmp_path, ns_port, nursery)
        for sid in ("n0", "n1", "n2"):
            await group.start(sid)
        leader = await group.master()
        addrs = [b.broker_addr for b in group.brokers.values()]
        await topic_admin.create_topic(group.ns, TOPIC, queues=QUEUES, brokers=addrs)
        dledger = leader.store.dledger
        assert dledger is not None
        log = dledger.dledger
        committed_at_answer: list[tuple[int, int]] = []
        ext = H.SendMessageRequestHeader.v2_ext("pg", TOPIC, 0, 0, 1, 0, "", False)
        async with open_remoting_client() as client:

            async def send(i: int) -> None:
                req = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, ext, b"inline-%d" % i)
                answer = await client.invoke(leader.broker_addr, req, 10)
                assert answer.code == ResponseCode.SUCCESS, answer
                offset = int(answer.ext_fields["queueOffset"])
                committed_at_answer.append((offset, log.committed_index))

            async with trio.open_nursery() as senders:  # pipelined on one connection
                for i in range(64):
                    senders.start_soon(send, i)
        assert sorted(o for o, _ in committed_at_answer) == list(range(64))
        # one entry per message from index 0 on: answered once its entry was committed
        assert all(committed >= offset for offset, committed in committed_at_answer)
        async with Producer("pg-batch", group.ns) as producer:
            batch = [Message(TOPIC, b"batch-%d" % i) for i in range(5)]
            result = await producer.send_batch(batch)
            assert result.status == "SEND_OK"
        assert tasks == []  # none went through the task of send_message
        nursery.cancel_scope.cancel()
