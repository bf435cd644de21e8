"""A rolling replacement of a Java DLedger group by pymq brokers (issue #42, point 2): three Java
RocketMQ 4.9.4 brokers in DLedger mode serve a topic; one member at a time is stopped as an
operator stops it (SIGTERM) and a pymq broker starts in its place, on its ports, its
``broker.conf`` keys and its store directory (DLedger files, consume queues, topics, offsets).
Messages are sent before and after every step. At the end the group is three pymq brokers and
every acknowledged message is there, at dense queue offsets.

Needs the Java build (/work/shared/java/README.md); skipped otherwise.
"""

from __future__ import annotations

import pathlib
import subprocess

import trio

from pymq.broker.config import BrokerConfig
from pymq.broker.controller import BrokerController
from pymq.client import Producer
from pymq.remoting.config import NettyClientConfig, NettyServerConfig
from pymq.store.config import MessageStoreConfig
from tests.conformance.test_java_dledger_brokers import (
    FILE_SIZE,
    SCRIPT,
    create_on_every_member,
    java_conf,
    routed_master,
)
from tests.conformance.test_java_dledger_brokers import pytestmark as java_marks
from tests.helpers import free_broker_port, free_port, make_namesrv
from tests.integration.test_dledger_brokers import NAME, assert_dense, pull_all, send_all

pytestmark = java_marks
MEMBERS = ("n0", "n1", "n2")


def pymq_broker(root: pathlib.Path, port: int, peers: str, pid: str, ns: str) -> BrokerController:
    """The Java member's replacement: the same keys, the same ports, the same store."""
    return BrokerController(
        BrokerConfig(
            broker_name=NAME, broker_ip1="127.0.0.1", broker_ip2="127.0.0.1", namesrv_addr=ns
        ),
        NettyServerConfig(listen_port=port, bind_address="127.0.0.1"),
        NettyClientConfig(config_file=""),
        MessageStoreConfig(
            store_path_root_dir=str(root),
            store_path_commit_log=str(root / "commitlog"),
            mapped_file_size_commit_log=FILE_SIZE,
            enable_d_leger_commit_log=True,
            d_leger_group=NAME,
            d_leger_peers=peers,
            d_leger_self_id=pid,
        ),
    )


async def test_a_java_group_is_replaced_by_pymq_brokers_one_at_a_time(
    tmp_path: pathlib.Path,
) -> None:
    namesrv = make_namesrv(tmp_path)
    dledger_ports = {pid: free_port() for pid in MEMBERS}
    peers = ";".join(f"{pid}-127.0.0.1:{port}" for pid, port in dledger_ports.items())
    ports = {pid: free_broker_port() for pid in MEMBERS}
    addrs = {pid: f"127.0.0.1:{port}" for pid, port in ports.items()}
    java: dict[str, subprocess.Popen[bytes]] = {}
    try:
        async with trio.open_nursery() as nursery:
            ns = f"127.0.0.1:{await nursery.start(namesrv.run)}"
            for pid in MEMBERS:
                root = tmp_path / pid
                root.mkdir()
                conf = java_conf(root, ports[pid], peers, pid)
                with open(root / "java.log", "ab") as log:
                    java[pid] = subprocess.Popen(
                        ["bash", str(SCRIPT), str(conf), ns], stdout=log, stderr=log
                    )
            with trio.fail_after(150):
                await create_on_every_member(ns, addrs)
            acked: dict[bytes, object] = {}
            async with Producer("rolling-producer", ns) as producer:
                with trio.fail_after(60):
                    while not await routed_master(ns):
                        await trio.sleep(0.5)
                acked |= await send_all(producer, [b"java-%d" % i for i in range(30)])
                for step, pid in enumerate(MEMBERS):
                    proc = java.pop(pid)
                    proc.terminate()  # as an operator stops a broker: its shutdown hook runs
                    await trio.to_thread.run_sync(proc.wait, 60)
                    broker = pymq_broker(tmp_path / pid, ports[pid], peers, pid, ns)
                    await nursery.start(broker.run)
                    print(f"{pid}: Java stopped, pymq in its place")
                    bodies = [b"step%d-%d" % (step, i) for i in range(30)]
                    acked |= await send_all(producer, bodies)
            with trio.fail_after(60):
                while not (master := await routed_master(ns)):
                    await trio.sleep(0.5)
            assert master in addrs.values() and not java  # only pymq brokers are left
            pulled = await pull_all(ns, "rolling-consumer")
            got = {body for queue in pulled.values() for _, body in queue}
            assert set(acked) <= got, sorted(set(acked) - got)[:5]
            assert len(acked) == 120
            assert_dense(pulled)
            nursery.cancel_scope.cancel()
    finally:
        for proc in java.values():
            proc.kill()
            proc.wait()
