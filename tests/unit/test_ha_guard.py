"""The master's HA port against strangers and liars, over loopback: the guard (allow-list, TLS,
haSecret, ACL accounts), acks bounded by what was sent, first reports bounded by the master's
data, and the bounds on connections and admission.  A real HAClient is the honest slave."""

from __future__ import annotations

import logging
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio
import trustme

from pymq.common.config import ConfigError
from pymq.remoting.tls import TlsMode, TlsServer
from pymq.store.config import MessageStoreConfig
from pymq.store.ha import master as master_module
from pymq.store.ha import slave as slave_module
from pymq.store.ha.auth import (
    CHALLENGE_SIZE,
    HELLO,
    PROVEN,
    UNPROVEN,
    HAGuard,
    encode_proof,
    master_mac,
    parse_allow_list,
    slave_hello,
)
from pymq.store.ha.framing import TransferDecoder, encode_report, encode_transfer
from pymq.store.ha.master import MAX_CONNECTIONS_PER_HOST, HAService
from pymq.store.ha.slave import HAClient
from pymq.store.results import PutMessageStatus
from tests.helpers import wait_until

DATA = bytes(range(256)) * 4  # the master's commit log: 1024 bytes


class MasterMem:
    def __init__(self, data: bytes = DATA, base: int = 0) -> None:
        self.data = bytearray(data)
        self.base = base

    @property
    def max_phy_offset(self) -> int:
        return self.base + len(self.data)

    @property
    def min_phy_offset(self) -> int:
        return self.base

    def get_commitlog_data(self, offset: int, max_size: int) -> bytes | None:
        if not self.base <= offset < self.max_phy_offset:
            return None
        start = offset - self.base
        return bytes(self.data[start : start + max_size])


class SlaveMem:
    def __init__(self) -> None:
        self.data = bytearray()
        self.base: int | None = None

    @property
    def max_phy_offset(self) -> int:
        return 0 if self.base is None else self.base + len(self.data)

    def start_replica_at(self, offset: int) -> None:
        if self.base is None:
            self.base = offset

    def append_to_commitlog(self, start: int, data: bytes | memoryview) -> bool:
        if start != self.max_phy_offset:
            return False
        self.data += data
        return True


@asynccontextmanager
async def master(
    guard: HAGuard | None = None, store: MasterMem | None = None, **config: int
) -> AsyncIterator[HAService]:
    settings = MessageStoreConfig(
        ha_listen_port=0, sync_flush_timeout=300, ha_transfer_batch_size=100
    )
    for name, value in config.items():
        setattr(settings, name, value)
    ha = HAService(
        store or MasterMem(),
        settings,
        host="127.0.0.1",
        guard=guard,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(ha.run)
        yield ha
        nursery.cancel_scope.cancel()


async def receive_all(stream: trio.abc.Stream, timeout: float = 2.0) -> bytes:
    """What the master sends until it closes (or ``timeout`` passes)."""
    got = bytearray()
    with trio.move_on_after(timeout):
        while True:
            try:
                data = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                break
            if not data:
                break
            got += data
    return bytes(got)


async def stranger(port: int, first: bytes, timeout: float = 2.0) -> bytes:
    """A plain connection sending ``first``: everything the master sends it."""
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(first)
        return await receive_all(stream, timeout)


async def replicate(
    port: int,
    *,
    credential: tuple[str, bytes] | None = None,
    ssl_context: ssl.SSLContext | None = None,
    wait: float = 5.0,
) -> bytes:
    """What a real HAClient replicates within ``wait`` seconds (it stops once it has it all)."""
    slave = SlaveMem()
    client = HAClient(
        slave,
        MessageStoreConfig(ha_send_heartbeat_interval=100),
        lambda: f"127.0.0.1:{port}",
        ssl_context=ssl_context,
        credential=credential,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(client.run)
        with trio.move_on_after(wait):
            while len(slave.data) < len(DATA):
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    return bytes(slave.data)


def frames_of(stream: bytes) -> bytes:
    return b"".join(body for _, body in TransferDecoder(len(DATA)).feed(stream))


# -- default: RocketMQ's plain protocol, unchanged -----------------------------------------------


async def test_default_serves_a_plain_slave_and_a_pymq_slave() -> None:
    async with master() as ha:
        assert frames_of(await stranger(ha.port, encode_report(0), timeout=0.5)) == DATA
        assert await replicate(ha.port) == DATA
        # A pymq slave proving an ACL account speaks the handshake; with no proof required
        # the master answers UNPROVEN, which such a slave takes.
        assert await replicate(ha.port, credential=("admin", b"whatever")) == DATA
        # A slave proving haSecret does not: this master cannot prove it back.
        assert await replicate(ha.port, credential=("", b"whatever"), wait=0.6) == b""


# -- haSlaveAllowList ------------------------------------------------------------------------------


async def test_allow_list_closes_other_hosts_before_reading() -> None:
    async with master(HAGuard(allow=parse_allow_list("10.9.9.9;192.168.0.*"))) as ha:
        assert await stranger(ha.port, encode_report(0)) == b""
        assert await replicate(ha.port, wait=0.6) == b""
        assert ha.refused >= 2 and not ha.connections
    async with master(HAGuard(allow=parse_allow_list("10.9.9.9; 127.0.0.1-9"))) as ha:
        assert await replicate(ha.port) == DATA


def test_allow_list_syntax() -> None:
    assert parse_allow_list("") == ()
    assert len(parse_allow_list("10.0.0.1,10.0.0.2;10.1.*.*;;")) == 2
    with pytest.raises(ConfigError, match=r"haSlaveAllowList: '10\.0\.0\.300'"):
        parse_allow_list("10.0.0.1;10.0.0.300")


# -- haSecret --------------------------------------------------------------------------------------


async def test_secret_stranger_gets_nothing_and_the_slave_that_knows_it_replicates() -> None:
    async with master(HAGuard(secret=b"s3cret")) as ha:
        # RocketMQ's plain protocol: no handshake, nothing sent.
        assert await stranger(ha.port, encode_report(0)) == b""
        # The handshake with a wrong secret: the challenge, then nothing.
        async with await trio.open_tcp_stream("127.0.0.1", ha.port) as stream:
            nonce, hello = slave_hello()
            await stream.send_all(hello)
            challenge = await receive_all(stream, timeout=0.3)
            assert len(challenge) == CHALLENGE_SIZE and challenge.startswith(HELLO)
            await stream.send_all(encode_proof(challenge, nonce, "", b"guess") + encode_report(0))
            assert await receive_all(stream) == b""
        # A proof is bound to its connection's nonce: a replayed one fails.
        async with await trio.open_tcp_stream("127.0.0.1", ha.port) as stream:
            await stream.send_all(hello)
            other = await receive_all(stream, timeout=0.3)
            assert other != challenge
            replayed = encode_proof(challenge, nonce, "", b"s3cret")
            await stream.send_all(replayed + encode_report(0))
            assert await receive_all(stream) == b""
        assert await replicate(ha.port, credential=("", b"wrong"), wait=0.6) == b""
        assert not ha.connections
        assert await replicate(ha.port, credential=("", b"s3cret")) == DATA


# -- aclEnable ------------------------------------------------------------------------------------


def acl_guard(white: Callable[[str], bool] = lambda host: False) -> HAGuard:
    accounts = {"RocketMQAdmin": b"12345678admin"}  # the admin accounts, as the controller's
    return HAGuard(account_secret=accounts.get, white_host=white)


async def test_acl_slave_proves_an_admin_account() -> None:
    async with master(acl_guard()) as ha:
        assert await stranger(ha.port, encode_report(0)) == b""
        assert await replicate(ha.port, credential=("RocketMQAdmin", b"nope"), wait=0.6) == b""
        assert await replicate(ha.port, credential=("someone", b"12345678admin"), wait=0.6) == b""
        assert await replicate(ha.port, credential=("", b"12345678admin"), wait=0.6) == b""
        assert await replicate(ha.port, credential=("RocketMQAdmin", b"12345678admin")) == DATA


async def test_acl_global_white_host_replicates_in_plain_unless_a_secret_is_set() -> None:
    async with master(acl_guard(white=lambda host: host == "127.0.0.1")) as ha:
        assert frames_of(await stranger(ha.port, encode_report(0), timeout=0.5)) == DATA
    guard = HAGuard(
        secret=b"s", account_secret=acl_guard().account_secret, white_host=lambda h: True
    )
    async with master(guard) as ha:
        assert await stranger(ha.port, encode_report(0)) == b""
        assert await replicate(ha.port, credential=("", b"s")) == DATA


# -- TLS -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def server_ctx(ca: trustme.CA, require_client_cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(ctx)
    if require_client_cert:
        ca.configure_trust(ctx)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_ctx(ca: trustme.CA, with_cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ca.configure_trust(ctx)
    if with_cert:
        ca.issue_cert("slave").configure_cert(ctx)
    return ctx


async def tls_stranger(port: int, ctx: ssl.SSLContext) -> bytes:
    raw = await trio.open_tcp_stream("127.0.0.1", port)
    stream = trio.SSLStream(raw, ctx, server_hostname="127.0.0.1")
    try:
        await stream.send_all(encode_report(0))
        return await receive_all(stream)
    except trio.BrokenResourceError:
        return b""
    finally:
        await trio.aclose_forcefully(stream)


async def test_tls_enforcing_refuses_plain_and_serves_a_tls_slave(ca: trustme.CA) -> None:
    async with master(HAGuard(tls=TlsServer(server_ctx(ca), TlsMode.ENFORCING))) as ha:
        assert await stranger(ha.port, encode_report(0)) == b""
        assert await replicate(ha.port, ssl_context=client_ctx(ca)) == DATA


async def test_tls_permissive_takes_plain_as_the_remoting_ports_do(ca: trustme.CA) -> None:
    async with master(HAGuard(tls=TlsServer(server_ctx(ca), TlsMode.PERMISSIVE))) as ha:
        assert frames_of(await stranger(ha.port, encode_report(0), timeout=0.5)) == DATA
        assert await replicate(ha.port, ssl_context=client_ctx(ca)) == DATA


async def test_tls_client_certificate_required(ca: trustme.CA) -> None:
    tls = TlsServer(server_ctx(ca, require_client_cert=True), TlsMode.ENFORCING)
    async with master(HAGuard(tls=tls)) as ha:
        assert await tls_stranger(ha.port, client_ctx(ca)) == b""
        assert await replicate(ha.port, ssl_context=client_ctx(ca), wait=0.6) == b""
        assert await replicate(ha.port, ssl_context=client_ctx(ca, with_cert=True)) == DATA


# -- acks and first reports ------------------------------------------------------------------------


async def test_a_lying_ack_cannot_complete_a_sync_send() -> None:
    async with master() as ha:
        async with await trio.open_tcp_stream("127.0.0.1", ha.port) as stream:
            # "I already have everything": nothing is sent, so nothing is acknowledged.
            await stream.send_all(encode_report(len(DATA)))
            await wait_until(lambda: ha.connections, timeout=2)
            async with trio.open_nursery() as nursery:
                results: list[PutMessageStatus] = []

                async def wait() -> None:
                    results.append(await ha.wait_for_replica(len(DATA)))

                nursery.start_soon(wait)
                await trio.sleep(0.05)
                await stream.send_all(encode_report(len(DATA)))
                await stream.send_all(encode_report(1 << 50))  # beyond what was sent: a liar
                assert await receive_all(stream) == b""  # closed
            assert results == [PutMessageStatus.FLUSH_SLAVE_TIMEOUT]
        assert ha.push_to_slave_max_offset == 0 and not ha.connections


async def test_an_honest_ack_completes_it_and_one_byte_more_is_a_lie() -> None:
    async with master() as ha:
        async with await trio.open_tcp_stream("127.0.0.1", ha.port) as stream:
            await stream.send_all(encode_report(0))
            got = bytearray()
            while len(frames_of(bytes(got))) < len(DATA):
                got += await stream.receive_some(65536)
            await stream.send_all(encode_report(len(DATA)))
            assert await ha.wait_for_replica(len(DATA)) is PutMessageStatus.PUT_OK
            await stream.send_all(encode_report(len(DATA) + 1))
            assert await receive_all(stream) == b""
        assert not ha.connections


@pytest.mark.parametrize(
    "first",
    [
        encode_report(1 << 50),  # beyond the master's max
        encode_report(100),  # before its oldest offset (500)
        encode_report(-1),  # negative
        b"\x80" * 8,  # garbage: negative as an offset
    ],
)
async def test_a_first_report_outside_the_masters_data_is_refused(first: bytes) -> None:
    async with master(store=MasterMem(DATA, base=500)) as ha:
        assert await stranger(ha.port, first) == b""
        assert not ha.connections and ha.push_to_slave_max_offset == 0
        # Where the master has data, it streams from there.
        got = frames_of(await stranger(ha.port, encode_report(700), timeout=0.5))
        assert got == DATA[200:]


# -- bounds on what a peer holds -------------------------------------------------------------------


async def test_connections_from_one_host_are_bounded() -> None:
    async with master() as ha:
        streams = [
            await trio.open_tcp_stream("127.0.0.1", ha.port)
            for _ in range(MAX_CONNECTIONS_PER_HOST)
        ]
        await trio.sleep(0.1)
        refused_before = ha.refused
        assert await stranger(ha.port, encode_report(0)) == b""
        assert ha.refused == refused_before + 1
        for stream in streams:
            await stream.aclose()
        await wait_until(lambda: not ha._open, timeout=2)
        assert frames_of(await stranger(ha.port, encode_report(0), timeout=0.5)) == DATA


async def test_silent_strangers_filling_every_slot_do_not_lock_the_slave_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Connections that never finish their admission used to hold every slot for
    haHousekeepingInterval, again and again, and the slave was refused meanwhile: with the
    port full, the oldest connection still in admission is closed for the newcomer."""
    monkeypatch.setattr(master_module, "MAX_SLAVE_CONNECTIONS", 4)
    monkeypatch.setattr(master_module, "MAX_CONNECTIONS_PER_HOST", 100)
    # An admitted slave keeps its slot: only connections in admission are closed.
    async with master(HAGuard(secret=b"s3cret")) as ha, trio.open_nursery() as nursery:
        slave = SlaveMem()
        client = HAClient(
            slave,
            MessageStoreConfig(ha_send_heartbeat_interval=100),
            lambda: f"127.0.0.1:{ha.port}",
            credential=("", b"s3cret"),
        )
        await nursery.start(client.run)
        await wait_until(lambda: len(slave.data) == len(DATA), timeout=5)
        silent = [await trio.open_tcp_stream("127.0.0.1", ha.port) for _ in range(3)]
        await wait_until(lambda: sum(ha._open.values()) == 4, timeout=2)
        assert await replicate(ha.port, credential=("", b"s3cret")) == DATA
        assert len(ha.connections) >= 1 and client.connected_to is not None
        # The oldest silent ones were closed for it; the admitted slave was not.
        assert await silent[0].receive_some(1) == b""
        for stream in silent:
            await stream.aclose()
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("secret", [None, b"s"])
async def test_a_slow_admission_is_closed_at_the_deadline(secret: bytes | None) -> None:
    """A peer that dribbles its first report (or its proof) a byte at a time, each within the
    silence limit, is closed once haHousekeepingInterval has passed since it connected."""
    async with master(HAGuard(secret=secret), ha_housekeeping_interval=400) as ha:
        async with await trio.open_tcp_stream("127.0.0.1", ha.port) as stream:
            start = trio.current_time()
            if secret:
                await stream.send_all(slave_hello()[1])
                dribble = b"\x00" * 20  # a proof's first bytes
            else:
                dribble = encode_report(0)[:-1]

            async def drip() -> None:
                for byte in dribble:
                    await trio.sleep(0.25)
                    try:
                        await stream.send_all(bytes([byte]))
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        return

            async with trio.open_nursery() as nursery:
                nursery.start_soon(drip)
                got = await receive_all(stream, timeout=6)
                closed_after = trio.current_time() - start
                nursery.cancel_scope.cancel()
        assert closed_after < 1.2
        if secret:  # the challenge, and nothing more
            assert len(got) == CHALLENGE_SIZE and got.startswith(HELLO)
        else:
            assert got == b""
        assert not ha.connections and not ha._open


async def test_refusals_of_one_host_are_logged_once_a_period(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="pymq.store.ha.master")
    async with master(HAGuard(secret=b"s")) as ha:
        for _ in range(3):
            assert await stranger(ha.port, encode_report(0)) == b""
        await wait_until(lambda: ha.refused == 3, timeout=2)
    refusals = [r for r in caplog.records if "refused the connection" in r.getMessage()]
    assert [r.levelno for r in refusals] == [logging.WARNING, logging.DEBUG, logging.DEBUG]


async def test_a_master_that_never_answers_the_slave_is_retried_not_fatal(
    monkeypatch: pytest.MonkeyPatch, ca: trustme.CA
) -> None:
    """A TLS handshake or HA handshake the master never answers times out, and the slave
    tries again (a timeout used to end the slave's HA task, and the broker with it)."""
    monkeypatch.setattr(slave_module, "CONNECT_TIMEOUT", 0.2)
    monkeypatch.setattr(slave_module, "RECONNECT_DELAY", 0.05)
    accepted = 0

    async def silent(stream: trio.SocketStream) -> None:
        nonlocal accepted
        accepted += 1
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, silent, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        for kwargs in ({"ssl_context": client_ctx(ca)}, {"credential": ("", b"s")}):
            accepted = 0
            assert await replicate(port, wait=1.0, **kwargs) == b""
            assert accepted >= 3
        nursery.cancel_scope.cancel()


async def test_a_reset_during_admission_is_a_refusal_not_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with master() as ha:
        stream = await trio.open_tcp_stream("127.0.0.1", ha.port)
        await stream.send_all(b"\x00\x00\x00")
        await trio.sleep(0.05)
        # SO_LINGER 0: the close is a reset.
        stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await stream.aclose()
        # The refusal is counted before the connection's bookkeeping is let go: wait for both.
        await wait_until(lambda: ha.refused == 1 and not ha._open and not ha.connections, timeout=2)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


# -- the slave against a master that does not prove the secret -------------------------------------


async def rogue_master(
    answer: Callable[[bytes, bytes], bytes] | None,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """A peer at the slave's haMasterAddress that does not know haSecret: it takes the slave's
    hello, sends a challenge, ignores the proof, sends ``answer(slave nonce, challenge)``
    (nothing when None) and then streams a commit log of its own."""

    async def serve(stream: trio.SocketStream) -> None:
        buf = bytearray()
        with trio.move_on_after(2):
            while len(buf) < CHALLENGE_SIZE:  # the slave's hello (as long as a challenge)
                buf += await stream.receive_some(CHALLENGE_SIZE - len(buf))
        nonce = bytes(buf[len(HELLO) :])
        challenge = HELLO + bytes(range(32))
        try:
            await stream.send_all(challenge)
            with trio.move_on_after(0.2):
                await stream.receive_some(4096)  # the proof
            if answer is not None:
                await stream.send_all(answer(nonce, challenge))
            await stream.send_all(encode_transfer(0, DATA))
            await trio.sleep(1)
        except trio.BrokenResourceError:
            pass

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, serve, listeners)
        task_status.started(listeners[0].socket.getsockname()[1])


@pytest.mark.parametrize(
    "answer",
    [
        None,  # no answer at all: the frames right after the challenge
        lambda nonce, challenge: UNPROVEN + bytes(32),  # "I ask no proof"
        lambda nonce, challenge: PROVEN + bytes(32),  # a made-up proof
        # A proof by another secret, or for another connection's nonce.
        lambda nonce, challenge: PROVEN + master_mac(b"other", nonce, challenge[8:], b""),
        lambda nonce, challenge: PROVEN + master_mac(b"s3cret", bytes(32), challenge[8:], b""),
    ],
)
async def test_a_slave_with_ha_secret_takes_nothing_from_a_master_that_cannot_prove_it(
    monkeypatch: pytest.MonkeyPatch, answer: Callable[[bytes, bytes], bytes] | None
) -> None:
    """The handshake is mutual: a wrong or hostile haMasterAddress cannot feed a slave that
    proves haSecret a commit log (the slave used to take one after any challenge)."""
    monkeypatch.setattr(slave_module, "CONNECT_TIMEOUT", 0.3)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(rogue_master, answer)
        assert await replicate(port, credential=("", b"s3cret"), wait=1.0) == b""
        # The right proof is taken: the rogue above differs only in it.
        if answer is None:
            good = await nursery.start(
                rogue_master,
                lambda nonce, ch: PROVEN + master_mac(b"s3cret", nonce, ch[8:], b""),
            )
            assert await replicate(good, credential=("", b"s3cret")) == DATA
        nursery.cancel_scope.cancel()


async def test_an_account_slave_refuses_a_wrong_master_proof(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A slave proving an ACL account takes UNPROVEN (a master without aclEnable), never a
    wrong proof."""
    monkeypatch.setattr(slave_module, "CONNECT_TIMEOUT", 0.3)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(rogue_master, lambda nonce, ch: PROVEN + bytes(32))
        assert await replicate(port, credential=("admin", b"pw"), wait=1.0) == b""
        nursery.cancel_scope.cancel()
