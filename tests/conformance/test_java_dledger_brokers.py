"""A mixed DLedger group of brokers (issue #42): two Java RocketMQ 4.9.4 brokers in DLedger mode
(``mqbroker.sh`` of /work/shared/java) and one pymq broker, one pymq name server, with
DLedger's default timings.  Whichever member leads registers as the master; messages sent
through the name server's route are consumable from it, and the pymq broker dispatches the
committed entries whoever wrote them (the records are byte-compatible both ways); the leader is
killed (SIGKILL for a Java broker, its cancel scope for pymq's), a new master is elected and
registered, sends resume, and nothing acknowledged is lost.

Needs the Java build (/work/shared/java/README.md); skipped otherwise.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest
import trio

from pymq.broker.config import BrokerConfig
from pymq.broker.controller import BrokerController
from pymq.client import Producer
from pymq.client import topics as topic_admin
from pymq.remoting.client import open_remoting_client
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode
from pymq.remoting.config import NettyClientConfig, NettyServerConfig
from pymq.store.config import MessageStoreConfig
from tests.helpers import free_broker_port, free_port, make_namesrv, wait_until
from tests.integration.test_dledger_brokers import (
    NAME,
    QUEUES,
    TOPIC,
    assert_dense,
    pull_all,
    queued,
    send_all,
)

RMQ_BUILD = pathlib.Path(os.environ.get("RMQ_BUILD", "/tmp/rmqjava494"))
SCRIPT = pathlib.Path("/work/shared/java/mqbroker.sh")
PYMQ = "n2"
FILE_SIZE = 1 << 20  # mappedFileSizeCommitLog: the DLedger data files' size, the same everywhere

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (RMQ_BUILD / "lib" / "full.classpath").exists()
        or not SCRIPT.exists()
        or shutil.which("java") is None,
        reason="RocketMQ 4.9.4 is not built (see /work/shared/java/README.md)",
    ),
]


def java_conf(root: pathlib.Path, port: int, peers: str, pid: str) -> pathlib.Path:
    """A Java member's broker.conf in DLedger mode, its store under ``root``."""
    conf = root / "broker.conf"
    conf.write_text(
        "\n".join(
            [
                f"brokerName={NAME}",
                f"listenPort={port}",
                f"haListenPort={port + 1}",
                "brokerIP1=127.0.0.1",
                f"storePathRootDir={root}",
                f"storePathCommitLog={root / 'commitlog'}",
                f"mappedFileSizeCommitLog={FILE_SIZE}",
                "enableDLegerCommitLog=true",
                f"dLegerGroup={NAME}",
                f"dLegerPeers={peers}",
                f"dLegerSelfId={pid}",
                "",
            ]
        )
    )
    return conf


async def routed_master(ns: str) -> str:
    async with Producer("probe", ns) as probe:
        assert probe.client is not None
        try:
            route = await probe.client.fetch_route(TOPIC)
        except Exception:
            return ""
    if route is None:
        return ""
    data = [d for d in route.broker_datas if d.broker_name == NAME]
    return data[0].broker_addrs.get(0, "") if data else ""


async def has_topic(addr: str) -> bool:
    async with open_remoting_client() as client:
        try:
            answer = await client.invoke(
                addr, RemotingCommand.request(RequestCode.GET_ALL_TOPIC_CONFIG), timeout=3
            )
        except Exception:
            return False
    return answer.code == 0 and f'"{TOPIC}"'.encode() in (answer.body or b"")


async def create_on_every_member(ns: str, addrs: dict[str, str]) -> None:
    """Until every member has the topic: created where it is accepted, synced from the
    master where a follower refuses it."""
    while True:
        missing = [a for a in addrs.values() if not await has_topic(a)]
        if not missing:
            return
        for addr in missing:
            try:
                await topic_admin.create_topic(ns, TOPIC, queues=QUEUES, brokers=[addr], timeout=3)
            except Exception as exc:
                print(f"topic not created on {addr} yet: {exc!r}")
        await trio.sleep(1)


async def test_a_group_of_java_and_pymq_brokers_fails_over(tmp_path: pathlib.Path) -> None:
    namesrv = make_namesrv(tmp_path)
    dledger_ports = {f"n{i}": free_port() for i in range(3)}
    peers = ";".join(f"{pid}-127.0.0.1:{port}" for pid, port in dledger_ports.items())
    java: dict[str, subprocess.Popen[bytes]] = {}
    addrs: dict[str, str] = {}
    try:
        async with trio.open_nursery() as nursery:
            ns_port = await nursery.start(namesrv.run)
            ns = f"127.0.0.1:{ns_port}"
            for pid in ("n0", "n1"):
                port = free_broker_port()
                root = tmp_path / pid
                root.mkdir()
                conf = java_conf(root, port, peers, pid)
                log = open(root / "java.log", "ab")  # noqa: SIM115 (the child's)
                java[pid] = subprocess.Popen(
                    ["bash", str(SCRIPT), str(conf), ns], stdout=log, stderr=subprocess.STDOUT
                )
                log.close()
                addrs[pid] = f"127.0.0.1:{port}"
            store_config = MessageStoreConfig(
                store_path_root_dir=str(tmp_path / PYMQ),
                mapped_file_size_commit_log=FILE_SIZE,
                enable_d_leger_commit_log=True,
                d_leger_group=NAME,
                d_leger_peers=peers,
                d_leger_self_id=PYMQ,
            )
            broker = BrokerController(
                BrokerConfig(
                    broker_name=NAME,
                    broker_ip1="127.0.0.1",
                    broker_ip2="127.0.0.1",
                    namesrv_addr=ns,
                ),
                # A fixed port as an operator gives: a Java follower syncs the topics from its
                # master through the fast ("VIP") port, listenPort - 2, as 4.9.4 always does.
                NettyServerConfig(listen_port=free_broker_port(), bind_address="127.0.0.1"),
                NettyClientConfig(config_file=""),
                store_config,
            )
            pymq_scope = trio.CancelScope()

            async def serve(*, task_status: trio.TaskStatus[None]) -> None:
                with pymq_scope:
                    await broker.run(task_status=task_status)

            await nursery.start(serve)
            addrs[PYMQ] = broker.broker_addr

            # The Java brokers take a while to start: the topic is created on each once up. A
            # member already elected follower refuses (Java's "from slave broker", as for any
            # slave): it gets the topic from its master's metadata, as a slave does.
            with trio.fail_after(150):
                await create_on_every_member(ns, addrs)
            with trio.fail_after(60):
                while not (master := await routed_master(ns)):
                    await trio.sleep(0.5)
            leader = next(pid for pid, a in addrs.items() if a == master)
            print(f"first master: {leader}")

            async with Producer("mixed-producer", ns) as producer:
                acked = await send_all(producer, [b"first-%d" % i for i in range(30)])
                await wait_until(lambda: queued(broker) >= 30, timeout=20, what="pymq dispatch")
                if leader == PYMQ:
                    pymq_scope.cancel()
                else:
                    java.pop(leader).kill()
                with trio.fail_after(60):
                    while (now := await routed_master(ns)) in ("", master):
                        await trio.sleep(0.5)
                print(f"second master: {next(p for p, a in addrs.items() if a == now)}")
                acked |= await send_all(producer, [b"second-%d" % i for i in range(30)])
            pulled = await pull_all(ns, "mixed-consumer")
            bodies = {b for got in pulled.values() for _, b in got}
            assert set(acked) <= bodies
            assert_dense(pulled)
            if leader != PYMQ:  # the pymq member dispatched everything, whoever wrote it
                await wait_until(
                    lambda: queued(broker) == len(bodies), timeout=20, what="pymq caught up"
                )
            nursery.cancel_scope.cancel()
    finally:
        for proc in java.values():
            proc.kill()
            proc.wait()
