"""TLS on the remoting ports (tls.server.mode): enforcing refuses plain connections, permissive
takes both on one port, the Python client, the broker's own client and ``openssl s_client``
connect.  Certificates are made here, by trustme, for each test."""

from __future__ import annotations

import pathlib
import ssl
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import pytest
import trio
import trustme

from pymq.broker.config import BrokerConfig
from pymq.broker.controller import BrokerController
from pymq.client import Message, Producer, PullConsumer, topics
from pymq.common.config import ConfigError
from pymq.namesrv.controller import NamesrvController
from pymq.remoting.client import open_remoting_client
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.remoting.config import NettyClientConfig, NettyServerConfig
from pymq.remoting.errors import RemotingError
from pymq.store.config import MessageStoreConfig
from tests.helpers import make_namesrv, wait_until


@attrs.frozen
class Certs:
    ca: trustme.CA
    ca_path: str
    cert_path: str
    key_path: str

    def client_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context()
        self.ca.configure_trust(ctx)
        return ctx


@pytest.fixture
def certs(tmp_path: pathlib.Path) -> Certs:
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    ca_path, cert_path, key_path = (str(tmp_path / n) for n in ("ca.pem", "cert.pem", "key.pem"))
    ca.cert_pem.write_to_path(ca_path)
    server.cert_chain_pems[0].write_to_path(cert_path)
    server.private_key_pem.write_to_path(key_path)
    return Certs(ca, ca_path, cert_path, key_path)


def server_tls(certs: Certs, mode: str) -> dict[str, object]:
    return {
        "server_mode": mode,
        "server_cert_path": certs.cert_path,
        "server_key_path": certs.key_path,
        "config_file": "",
    }


async def ask(addr: str, ctx: ssl.SSLContext | None) -> RemotingCommand:
    """One request; a RemotingError is raised as itself (not in the client's exception group)."""
    error: RemotingError | None = None
    async with open_remoting_client(ssl_context=ctx, connect_timeout=5) as client:
        request = RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
        try:
            return await client.invoke(addr, request, 5)
        except RemotingError as exc:
            error = exc
    assert error is not None
    raise error


@asynccontextmanager
async def running_namesrv(
    tmp_path: pathlib.Path, **tls: object
) -> AsyncIterator[NamesrvController]:
    namesrv = make_namesrv(tmp_path, **tls)
    async with trio.open_nursery() as nursery:
        await nursery.start(namesrv.run)
        yield namesrv
        nursery.cancel_scope.cancel()


async def test_enforcing_refuses_plain_and_serves_tls(tmp_path: pathlib.Path, certs: Certs) -> None:
    async with running_namesrv(tmp_path, **server_tls(certs, "enforcing")) as namesrv:
        addr = f"127.0.0.1:{namesrv.port}"
        answer = await ask(addr, certs.client_context())
        assert answer.code == ResponseCode.SUCCESS
        with pytest.raises(RemotingError):
            await ask(addr, None)
        tls = namesrv.server.tls
        assert tls is not None and tls.tls_connections == 1 and tls.failed_handshakes == 1
        # A client that does not trust the server's CA is refused by its own check.
        with pytest.raises(RemotingError, match="TLS handshake"):
            await ask(addr, ssl.create_default_context())


async def test_permissive_takes_plain_and_tls_on_one_port(
    tmp_path: pathlib.Path, certs: Certs
) -> None:
    async with running_namesrv(tmp_path, **server_tls(certs, "permissive")) as namesrv:
        addr = f"127.0.0.1:{namesrv.port}"
        assert (await ask(addr, None)).code == ResponseCode.SUCCESS
        assert (await ask(addr, certs.client_context())).code == ResponseCode.SUCCESS
        tls = namesrv.server.tls
        assert tls is not None and (tls.plain_connections, tls.tls_connections) == (1, 1)


async def test_disabled_is_plain_only(tmp_path: pathlib.Path, certs: Certs) -> None:
    async with running_namesrv(tmp_path) as namesrv:
        assert namesrv.server.tls is None
        addr = f"127.0.0.1:{namesrv.port}"
        assert (await ask(addr, None)).code == ResponseCode.SUCCESS
        with pytest.raises(RemotingError):
            await ask(addr, certs.client_context())


async def test_openssl_s_client_connects(tmp_path: pathlib.Path, certs: Certs) -> None:
    async with running_namesrv(tmp_path, **server_tls(certs, "enforcing")) as namesrv:
        result = await trio.run_process(
            [
                "openssl",
                "s_client",
                "-connect",
                f"127.0.0.1:{namesrv.port}",
                "-CAfile",
                certs.ca_path,
                "-verify_return_error",
                "-brief",
            ],
            stdin=b"",
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    output = (result.stdout + result.stderr).decode(errors="replace")
    assert result.returncode == 0, output
    assert "Verification: OK" in output or "Verify return code: 0 (ok)" in output, output


async def test_client_certificates_when_required(tmp_path: pathlib.Path, certs: Certs) -> None:
    settings = server_tls(certs, "enforcing")
    settings.update(server_need_client_auth="require", server_trust_cert_path=certs.ca_path)
    async with running_namesrv(tmp_path, **settings) as namesrv:
        addr = f"127.0.0.1:{namesrv.port}"
        with pytest.raises(RemotingError):
            await ask(addr, certs.client_context())  # no client certificate
        with_cert = certs.client_context()
        certs.ca.issue_cert("client.example").configure_cert(with_cert)
        assert (await ask(addr, with_cert)).code == ResponseCode.SUCCESS


def test_settings_that_cannot_make_a_server_refuse_to_start(
    tmp_path: pathlib.Path, certs: Certs
) -> None:
    config = NettyServerConfig(config_file="")
    config.server_mode = "enforcing"
    with pytest.raises(ConfigError, match=r"needs tls.server.certPath"):
        config.tls_server()
    config.server_mode = "sometimes"
    with pytest.raises(ConfigError, match=r"tls\.server\.mode must be"):
        config.tls_server()
    config = NettyServerConfig(**server_tls(certs, "permissive"))  # type: ignore[arg-type]
    config.server_key_path = str(tmp_path / "missing.pem")
    with pytest.raises(ConfigError, match="cannot load"):
        config.tls_server()
    config = NettyServerConfig(**server_tls(certs, "permissive"))  # type: ignore[arg-type]
    config.test_mode_enable = True
    with pytest.raises(ConfigError, match="self-signed"):
        config.tls_server()
    # tls.config.file's values win, as RocketMQ reads them.
    tls_file = tmp_path / "tls.properties"
    tls_file.write_text(f"tls.server.mode=enforcing\ntls.server.certPath={certs.cert_path}\n")
    config = NettyServerConfig(**server_tls(certs, "disabled"))  # type: ignore[arg-type]
    config.config_file = str(tls_file)
    server = config.tls_server()
    assert server is not None and server.mode.value == "enforcing"


async def test_broker_and_python_client_over_tls(tmp_path: pathlib.Path, certs: Certs) -> None:
    async with running_namesrv(tmp_path, **server_tls(certs, "enforcing")) as namesrv:
        namesrv_addr = f"127.0.0.1:{namesrv.port}"
        client_config = NettyClientConfig(
            client_enable=True,
            client_auth_server=True,
            client_trust_cert_path=certs.ca_path,
            config_file="",
        )
        broker = BrokerController(
            BrokerConfig(broker_ip1="127.0.0.1", namesrv_addr=namesrv_addr),
            NettyServerConfig(
                listen_port=0,
                bind_address="127.0.0.1",
                **server_tls(certs, "enforcing"),  # type: ignore[arg-type]
            ),
            client_config,
            MessageStoreConfig(
                store_path_root_dir=str(tmp_path / "store"), mapped_file_size_commit_log=1 << 20
            ),
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            # The broker registered over TLS.
            assert broker.broker_config.broker_name in namesrv.routes.broker_addr_table
            ctx = certs.client_context()
            await topics.create_topic(namesrv_addr, "Secure", queues=2, tls=ctx)
            async with Producer("P", namesrv_addr, tls=ctx) as producer:
                result = await producer.send(Message("Secure", b"over tls"))
                assert result.status == "SEND_OK"
            # A new queue's first entry is dispatched by the reput task (file made in a thread).
            await broker.store.reput.do_reput()
            async with PullConsumer("C", namesrv_addr, tls=ctx) as consumer:
                pulled = []
                for mq in await consumer.fetch_subscribe_message_queues("Secure"):
                    pulled += (await consumer.pull(mq, "*", 0, 32)).messages
                assert [m.body for m in pulled] == [b"over tls"]
            with pytest.raises(RemotingError):
                await ask(broker.broker_addr, None)  # plain TCP is refused
            # The command-line tools, told the CA.
            sent = await cli(
                "pymq.client",
                "send",
                "-n",
                namesrv_addr,
                "-t",
                "Secure",
                "-b",
                "cli",
                "--tls-ca",
                certs.ca_path,
            )
            assert sent.startswith("SEND_OK"), sent
            listed = await cli(
                "pymq.admin", "topicList", "-n", namesrv_addr, "--tlsCaFile", certs.ca_path
            )
            assert "Secure" in listed.split()
            nursery.cancel_scope.cancel()


async def cli(*args: str) -> str:
    result = await trio.run_process(
        [sys.executable, "-m", *args], capture_stdout=True, capture_stderr=True, check=False
    )
    assert result.returncode == 0, (args, result.stderr.decode(errors="replace"))
    return result.stdout.decode()


async def test_servers_with_unusable_tls_settings_refuse_to_start(tmp_path: pathlib.Path) -> None:
    for module in ("pymq.namesrv", "pymq.broker"):
        result = await trio.run_process(
            [sys.executable, "-m", module, "--tls.server.mode", "enforcing", "--listenPort", "0"],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        err = result.stderr.decode()
        assert result.returncode == 2, (module, err)
        assert "needs tls.server.certPath" in err and "Traceback" not in err


async def test_connections_in_their_handshake_count_against_the_cap(
    tmp_path: pathlib.Path, certs: Certs
) -> None:
    """Sockets that never start their TLS handshake hold a slot each until its timeout: past
    serverMaxConnections a new connection is closed at once, not left to handshake."""
    tls = server_tls(certs, "enforcing")
    async with running_namesrv(tmp_path, server_max_connections=2, **tls) as namesrv:
        silent = [await trio.open_tcp_stream("127.0.0.1", namesrv.port) for _ in range(2)]
        await wait_until(lambda: namesrv.server._handshaking == 2)
        with pytest.raises(RemotingError):
            await ask(f"127.0.0.1:{namesrv.port}", certs.client_context())
        assert namesrv.server.refused_connections >= 1
        for stream in silent:
            await stream.aclose()
        await wait_until(lambda: namesrv.server._handshaking == 0)
        answer = await ask(f"127.0.0.1:{namesrv.port}", certs.client_context())
        assert answer.code == ResponseCode.SUCCESS
