"""A SYNC_MASTER and its pymq slave, in process, with each of the HA port's protections on
(haSlaveAllowList with haSecret, TLS from the tls.* keys, ACL accounts): the slave replicates
and acknowledges sends, and a stranger speaking RocketMQ's plain protocol gets nothing."""

from __future__ import annotations

import pathlib
import socket
from collections.abc import Callable

import pytest
import trio
import trustme

from pymq.broker.config import BrokerConfig
from pymq.broker.controller import BrokerController
from pymq.common.config import ConfigError
from pymq.embedded import open_cluster
from pymq.remoting.config import NettyClientConfig, NettyServerConfig
from pymq.store.config import BrokerRole, MessageStoreConfig
from pymq.store.ha.auth import CHALLENGE_SIZE, encode_proof, slave_hello
from pymq.store.ha.framing import encode_report
from pymq.store.results import PutMessageStatus
from pymq.testing import TEST_PROPERTIES
from tests.helpers import LoopSteps, make_namesrv, wait_until
from tests.store.helpers import make_message

ACL = """\
globalWhiteRemoteAddresses: []
accounts:
  - accessKey: RocketMQAdmin
    secretKey: 12345678admin
    admin: true
  - accessKey: producerUser
    secretKey: producerSecret
"""


def broker(
    tmp: pathlib.Path,
    name: str,
    namesrv_port: int,
    role: BrokerRole,
    *,
    server: dict[str, object] | None = None,
    client: dict[str, object] | None = None,
    store: dict[str, object] | None = None,
    config: dict[str, object] | None = None,
) -> BrokerController:
    store_config = MessageStoreConfig(
        store_path_root_dir=str(tmp / name),
        mapped_file_size_commit_log=1 << 20,
        broker_role=role,
        ha_listen_port=0,
        sync_flush_timeout=3000,
    )
    broker_config = BrokerConfig(
        broker_name="ha-guard",
        broker_id=0 if role is not BrokerRole.SLAVE else 1,
        broker_ip1="127.0.0.1",
        broker_ip2="127.0.0.1",
        namesrv_addr=f"127.0.0.1:{namesrv_port}",
    )
    server_config = NettyServerConfig(listen_port=0, bind_address="127.0.0.1")
    client_config = NettyClientConfig(config_file="")
    for target, values in (
        (store_config, store),
        (broker_config, config),
        (server_config, server),
        (client_config, client),
    ):
        for key, value in (values or {}).items():
            setattr(target, key, value)
    return BrokerController(broker_config, server_config, client_config, store_config)


async def stranger(port: int) -> bytes:
    """RocketMQ's plain slave asking for everything: what the master sends it."""
    got = bytearray()
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(encode_report(0))
        with trio.move_on_after(2):
            while data := await stream.receive_some(65536):
                got += data
    return bytes(got)


def certs(tmp: pathlib.Path) -> dict[str, object]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(tmp / "cert.pem"))
    cert.private_key_pem.write_to_path(str(tmp / "key.pem"))
    return {
        "server_cert_path": str(tmp / "cert.pem"),
        "server_key_path": str(tmp / "key.pem"),
        "config_file": "",
    }


Keys = dict[str, dict[str, object]]
Setup = tuple[Keys, Keys, dict[str, object]]


def secret_mode(tmp: pathlib.Path) -> Setup:
    master: Keys = {"store": {"ha_slave_allow_list": "10.0.0.1;127.0.0.1", "ha_secret": "s3cret"}}
    slave: Keys = {"store": {"ha_secret": "s3cret"}}
    return master, slave, {}


def tls_mode(tmp: pathlib.Path) -> Setup:
    tls = certs(tmp)
    master: Keys = {"server": {**tls, "server_mode": "enforcing"}}
    slave: Keys = {"client": {"client_enable": True}}
    # The name server takes the slave's TLS registration and the master's plain one.
    return master, slave, {**tls, "server_mode": "permissive"}


def acl_mode(tmp: pathlib.Path) -> Setup:
    home = tmp / "home"
    (home / "conf").mkdir(parents=True)
    (home / "conf" / "plain_acl.yml").write_text(ACL)
    master: Keys = {"config": {"acl_enable": True, "rocketmq_home": str(home)}}
    slave: Keys = {"config": {"access_key": "RocketMQAdmin", "secret_key": "12345678admin"}}
    return master, slave, {}


@pytest.mark.parametrize("mode", [secret_mode, tls_mode, acl_mode])
async def test_a_pymq_slave_replicates_and_a_stranger_gets_nothing(
    tmp_path: pathlib.Path, mode: Callable[[pathlib.Path], Setup]
) -> None:
    master_keys, slave_keys, namesrv_keys = mode(tmp_path)
    namesrv = make_namesrv(tmp_path, **namesrv_keys)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(namesrv.run)
        master = broker(tmp_path, "master", port, BrokerRole.SYNC_MASTER, **master_keys)
        await nursery.start(master.run)
        assert master.ha_service is not None
        ha = master.ha_service
        slave_keys.setdefault("store", {})["ha_master_address"] = f"127.0.0.1:{master.ha_port}"
        slave = broker(tmp_path, "slave", port, BrokerRole.SLAVE, **slave_keys)
        await nursery.start(slave.run)
        await wait_until(lambda: ha.connections, timeout=10, what="the slave connected")
        for i in range(20):
            result = await master.store.put(make_message(body=b"m%d" % i))
            assert result.status is PutMessageStatus.PUT_OK
        end = master.store.max_phy_offset
        await wait_until(lambda: slave.store.max_phy_offset == end, timeout=10)
        assert ha.push_to_slave_max_offset == end

        refused = ha.refused
        assert await stranger(master.ha_port) == b""
        assert ha.refused == refused + 1 and len(ha.connections) == 1
        if mode is acl_mode:
            # Only admin accounts replicate (the slave's requests to its master need admin).
            assert master.ha_guard is not None and master.ha_guard.account_secret is not None
            assert master.ha_guard.account_secret("RocketMQAdmin") == b"12345678admin"
            assert master.ha_guard.account_secret("producerUser") is None
        nursery.cancel_scope.cancel()


def test_a_bad_allow_list_stops_the_start(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ConfigError, match="haSlaveAllowList"):
        broker(tmp_path, "m", 9876, BrokerRole.ASYNC_MASTER, store={"ha_slave_allow_list": "x"})


def flood(port: int, rounds: int) -> tuple[int, int]:
    """From a thread, as strangers would: wrong proofs, garbage and silent sockets on the HA
    port.  Returns (connections made, bytes the master sent beyond its challenges)."""
    leaked = made = 0
    for i in range(rounds):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            made += 1
            kind = i % 3
            if kind == 0:  # the handshake with a wrong proof
                nonce, hello = slave_hello()
                sock.sendall(hello)
                challenge = b""
                while len(challenge) < CHALLENGE_SIZE:
                    chunk = sock.recv(CHALLENGE_SIZE - len(challenge))
                    if not chunk:
                        break
                    challenge += chunk
                sock.sendall(encode_proof(challenge, nonce, "", b"guess") + encode_report(0))
            elif kind == 1:  # RocketMQ's plain protocol
                sock.sendall(encode_report(0))
            else:  # garbage
                sock.sendall(b"\x7f" * 64 + b"\xff" * 64)
            try:
                while chunk := sock.recv(65536):
                    leaked += len(chunk)
            except ConnectionResetError:
                pass
    return made, leaked


@pytest.mark.slow
async def test_a_flood_of_strangers_gets_nothing_and_does_not_stall_the_broker(
    tmp_path: pathlib.Path,
) -> None:
    properties = dict(TEST_PROPERTIES, haSecret="s3cret")
    async with open_cluster(
        str(tmp_path),
        namesrv_port=0,
        broker_port=0,
        bind_address="127.0.0.1",
        properties=properties,
    ) as cluster:
        for i in range(50):
            await cluster.broker.store.put(make_message(body=b"x" * 1000 + b"%d" % i))
        ha = cluster.broker.ha_service
        assert ha is not None
        with LoopSteps() as steps:
            made, leaked = await trio.to_thread.run_sync(flood, ha.port, 600)
        assert made == 600 and leaked == 0
        # The last strangers' closes are served after the flood returns.
        await wait_until(lambda: not ha.connections and not ha._open, what="strangers gone")
        assert ha.refused == 600
        print(f"HA flood: 600 strangers, {steps}")
        assert steps.worst < 0.05, steps
