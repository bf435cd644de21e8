"""HAClient on the slave: pulls the master's commit log and appends it at exactly its own end.

It connects to the master's HA address (``haMasterAddress``, or what the name server's
registration answer named), reports its max offset at once, after every append and at least every
``haSendHeartbeatInterval``, and appends each frame only at its own max offset: anything else
closes the connection, and the client reconnects.  The store's reput dispatches what was
appended into the slave's consume queues and index.

With ``tls.enable`` (``ssl_context``) it connects with TLS; with a credential (``haSecret``, or
the broker's ACL account) it proves itself with pymq's handshake before its first report
(:mod:`pymq.store.ha.auth`).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable

import trio

from pymq.common.address import split_address
from pymq.store.config import MessageStoreConfig
from pymq.store.ha.auth import (
    ANSWER_SIZE,
    CHALLENGE_SIZE,
    check_answer,
    encode_proof,
    slave_hello,
)
from pymq.store.ha.framing import HAProtocolError, TransferDecoder, encode_report
from pymq.store.ha.ports import SlaveStore

log = logging.getLogger(__name__)

# HAClient: pause between connection attempts.
RECONNECT_DELAY = 1.0
# Connecting, the TLS handshake and pymq's HA handshake must each end within this many seconds.
CONNECT_TIMEOUT = 3.0
# One read from the master takes at most this many bytes (Java's HAClient reads into 4 MiB).
READ_SIZE = 4 * 1024 * 1024


class HAClient:
    def __init__(
        self,
        store: SlaveStore,
        config: MessageStoreConfig,
        master_address: Callable[[], str | None],
        *,
        ssl_context: ssl.SSLContext | None = None,
        credential: tuple[str, bytes] | None = None,
    ) -> None:
        """``credential``: ``(accessKey, secret)`` to prove to the master (an empty accessKey
        for ``haSecret``); None: RocketMQ's plain protocol."""
        self.store = store
        self.config = config
        self.master_address = master_address
        self.ssl_context = ssl_context
        self.credential = credential
        self.connected_to: str | None = None
        self.reported_offset = -1

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            address = self.master_address()
            if address:
                try:
                    await self._session(address)
                except (
                    OSError,
                    trio.BrokenResourceError,
                    trio.TooSlowError,
                    HAProtocolError,
                ) as exc:
                    log.warning("HA connection to master %s ended: %s", address, exc)
                finally:
                    self.connected_to = None
            await trio.sleep(RECONNECT_DELAY)

    async def _session(self, address: str) -> None:
        host, port = split_address(address)
        with trio.fail_after(CONNECT_TIMEOUT):
            raw = await trio.open_tcp_stream(host, port)
        stream: trio.abc.Stream = raw
        async with raw:
            if self.ssl_context is not None:
                ctx = self.ssl_context
                with trio.fail_after(CONNECT_TIMEOUT):
                    # The store imports nothing of remoting: the handshake written out here.
                    name = host if ctx.check_hostname else None
                    stream = trio.SSLStream(raw, ctx, server_hostname=name)
                    await stream.do_handshake()
            decoder = TransferDecoder(self.config.ha_transfer_batch_size)
            if self.credential is not None:
                await self._prove(stream, *self.credential)
            self.connected_to = address
            log.info("HA client connected to master %s", address)
            heartbeat = self.config.ha_send_heartbeat_interval / 1000
            await self._report(stream)
            last_report = trio.current_time()
            while True:
                with trio.move_on_after(heartbeat):
                    data = await stream.receive_some(READ_SIZE)
                    if not data:
                        log.warning(
                            "master %s closed the HA connection (a master may refuse a slave: "
                            "haSlaveAllowList, haSecret, the ACL account, TLS; see its log)",
                            address,
                        )
                        return
                    for offset, body in decoder.feed(data):
                        if body:
                            self.store.start_replica_at(offset)
                            mine = self.store.max_phy_offset
                            if offset != mine:
                                log.error(
                                    "master pushed offset not equal the max phy offset in slave, "
                                    "SLAVE: %d MASTER: %d",
                                    mine,
                                    offset,
                                )
                                return
                            if not self.store.append_to_commitlog(offset, body):
                                log.error("appending replicated data at %d failed", offset)
                                return
                    if self.store.max_phy_offset != self.reported_offset:
                        await self._report(stream)
                        last_report = trio.current_time()
                if trio.current_time() - last_report >= heartbeat:
                    await self._report(stream)
                    last_report = trio.current_time()

    async def _prove(self, stream: trio.abc.Stream, access_key: str, secret: bytes) -> None:
        """pymq's mutual HA handshake: HAProtocolError when the master does not answer it, or
        does not prove the secret back (:mod:`pymq.store.ha.auth`)."""
        nonce, hello = slave_hello()
        await stream.send_all(hello)
        challenge = await _receive_at_most(stream, CHALLENGE_SIZE)
        # encode_proof refuses anything but a whole challenge, naming the likely cause.
        await stream.send_all(encode_proof(challenge, nonce, access_key, secret))
        answer = await _receive_at_most(stream, ANSWER_SIZE)
        check_answer(answer, challenge, nonce, access_key, secret)

    async def _report(self, stream: trio.abc.Stream) -> None:
        offset = self.store.max_phy_offset
        await stream.send_all(encode_report(offset))
        self.reported_offset = offset


async def _receive_at_most(stream: trio.abc.Stream, size: int) -> bytes:
    """``size`` bytes, or fewer when the peer closes or CONNECT_TIMEOUT passes first.  Never
    more: what follows belongs to the next step."""
    buf = bytearray()
    with trio.move_on_after(CONNECT_TIMEOUT):
        while len(buf) < size:
            data = await stream.receive_some(size - len(buf))
            if not data:
                break
            buf += data
    return bytes(buf)
