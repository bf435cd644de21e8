"""HAService on the master: accepts slaves, streams the commit log to them, tracks their acks.

One task accepts on ``haListenPort``; each connection is first admitted by the port's guard
(:mod:`pymq.store.ha.auth`: allow-list, TLS, the slave handshake), then gets a read task (offset
reports; the connection is dropped after ``haHousekeepingInterval`` of silence) and a write task
(frames of at most ``haTransferBatchSize`` bytes from where the slave is; an empty frame every
``haSendHeartbeatInterval`` when there is nothing new).  A slave that reports offset 0 (an empty
store) is sent everything from the master's oldest commit-log file.

What a peer can make the master do is bounded: at most :data:`MAX_SLAVE_CONNECTIONS` connections
(:data:`MAX_CONNECTIONS_PER_HOST` from one host), admitted or not, and when they are all open a
newcomer closes the oldest connection still in admission (so silent strangers cannot hold the
port against the slave; admitted slaves keep theirs); admission within
``haHousekeepingInterval``; reads of at most :data:`READ_SIZE` bytes; a first report (where to
start) within what the master has (0, or from its oldest offset to its max), else the connection
is closed.  A report is an ack only of bytes sent on that connection: one beyond the end of what
was handed to the socket closes the connection as a liar, and one at or below where the
connection started acknowledges nothing (a slave that merely says where it is has been sent
nothing).

For SYNC_MASTER, :meth:`wait_for_replica` is the store's replica waiter: a put is acknowledged
only once a slave's ack covers it (FLUSH_SLAVE_TIMEOUT after ``syncFlushTimeout``), and at once
SLAVE_NOT_AVAILABLE when no slave is connected or the best one is more than
``haSlaveFallbehindMax`` bytes behind.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import attrs
import trio

from pymq.store.config import MessageStoreConfig
from pymq.store.ha.auth import (
    HELLO,
    MAC_SIZE,
    NONCE_SIZE,
    HAGuard,
    encode_answer,
    new_challenge,
)
from pymq.store.ha.framing import HAProtocolError, ReportDecoder, encode_transfer
from pymq.store.ha.ports import MasterStore
from pymq.store.results import PutMessageStatus

log = logging.getLogger(__name__)

# WriteSocketService: with nothing to send, look again after this long at most.
IDLE_WAIT = 0.1

# Connections on the HA port (admitted or being admitted) beyond this many, or beyond
# MAX_CONNECTIONS_PER_HOST from one host, are closed at once: a master has a slave or two.
MAX_SLAVE_CONNECTIONS = 64
MAX_CONNECTIONS_PER_HOST = 8
# One read from a slave takes at most this many bytes (a slave sends 8-byte reports).
READ_SIZE = 4096
# A refused host is logged at WARNING once per this many seconds (then at DEBUG), for at most
# REFUSAL_LOG_HOSTS hosts at a time: a stranger retrying in a loop does not flood the log.
REFUSAL_LOG_PERIOD = 60.0
REFUSAL_LOG_HOSTS = 256


class HARefused(Exception):
    """A connection the master does not serve (the guard's, or a bad first report)."""


@attrs.define(eq=False)
class SlaveConnection:
    address: str
    request_offset: int = -1  # first report; -1 until the slave has said where it is
    ack_offset: int = 0
    last_read: float = 0.0
    # Where streaming started, and the end of what has been handed to the socket since: a
    # report counts as an ack only within (start_offset, sent_end].
    start_offset: int = -1
    sent_end: int = -1
    # Closed in admission for a newcomer (HAService._evict_admitting).
    evicted: bool = False


async def _receive_exactly(stream: trio.abc.Stream, size: int, buf: bytearray) -> bytes:
    """``size`` bytes from ``buf`` and then ``stream`` (what came beyond stays in ``buf``);
    HARefused when the peer closes first."""
    while len(buf) < size:
        data = await stream.receive_some(READ_SIZE)
        if not data:
            raise HARefused("closed during admission")
        buf += data
    out = bytes(buf[:size])
    del buf[:size]
    return out


class HAService:
    def __init__(
        self,
        store: MasterStore,
        config: MessageStoreConfig,
        host: str = "0.0.0.0",
        guard: HAGuard | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.host = host
        self.guard = guard or HAGuard()
        # Admitted slaves (those that count for SYNC_MASTER and the admin view).
        self.connections: set[SlaveConnection] = set()
        # Open connections per host, admitted or not (the bounds above).
        self._open: dict[str, int] = {}
        # Connections in admission, oldest first: the admission deadline's scope of each.
        self._admitting: OrderedDict[SlaveConnection, trio.CancelScope] = OrderedDict()
        self.refused = 0
        self._refusals_logged: OrderedDict[str, float] = OrderedDict()
        self.push_to_slave_max_offset = 0
        self._new_data = trio.Event()
        self._ack_changed = trio.Event()
        self.port = 0

    # -- notifications ------------------------------------------------------------------------

    def notify_new_data(self) -> None:
        """Wake the slaves' writers (called for every dispatched record).  Without a slave
        nobody waits: a writer joins :attr:`connections` before it first looks for data, and
        looks before it waits, so no new event is made per record then."""
        if not self.connections:
            return
        self._new_data.set()
        self._new_data = trio.Event()

    def _on_report(self, conn: SlaveConnection, offset: int) -> None:
        """A slave's report after its first: an ack of what was sent to it, or nothing;
        HAProtocolError (closing the connection) when it claims more than was sent."""
        if offset > conn.sent_end:
            raise HAProtocolError(
                f"ack {offset} beyond the {conn.sent_end} sent to this slave: a liar"
            )
        conn.ack_offset = offset
        if offset <= conn.start_offset:
            return  # says where it is; nothing sent on this connection is acknowledged
        if offset > self.push_to_slave_max_offset:
            self.push_to_slave_max_offset = offset
        self._ack_changed.set()
        self._ack_changed = trio.Event()

    # -- SYNC_MASTER ----------------------------------------------------------------------------

    def is_slave_ok(self, master_put_where: int) -> bool:
        return bool(self.connections) and (
            master_put_where - self.push_to_slave_max_offset < self.config.ha_slave_fallbehind_max
        )

    async def wait_for_replica(self, end_offset: int) -> PutMessageStatus:
        if not self.is_slave_ok(end_offset):
            return PutMessageStatus.SLAVE_NOT_AVAILABLE
        self.notify_new_data()
        with trio.move_on_after(self.config.sync_flush_timeout / 1000):
            while self.push_to_slave_max_offset < end_offset:
                await self._ack_changed.wait()
            return PutMessageStatus.PUT_OK
        log.warning("sync transfer to slave of offset %d timed out", end_offset)
        return PutMessageStatus.FLUSH_SLAVE_TIMEOUT

    def status(self) -> list[dict[str, object]]:
        """Each slave's address, acknowledged offset and lag in bytes (for the admin view)."""
        max_offset = self.store.max_phy_offset
        return [
            {"address": c.address, "ackOffset": c.ack_offset, "lagBytes": max_offset - c.ack_offset}
            for c in sorted(self.connections, key=lambda c: c.address)
        ]

    # -- the service ----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(self.config.ha_listen_port, host=self.host)
        self.port = listeners[0].socket.getsockname()[1]
        log.info("HA service listening on port %d", self.port)
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._serve, listeners)
            task_status.started(self.port)

    def _refuse(self, address: str, why: str) -> None:
        self.refused += 1
        host = address.rpartition(":")[0]
        now = trio.current_time()
        logged = self._refusals_logged
        last = logged.get(host)
        level = logging.DEBUG
        if last is None or now - last >= REFUSAL_LOG_PERIOD:
            level = logging.WARNING
            logged[host] = now
            logged.move_to_end(host)
            if len(logged) > REFUSAL_LOG_HOSTS:
                logged.popitem(last=False)
        log.log(level, "HAService refused the connection of %s: %s", address, why)

    async def _serve(self, stream: trio.SocketStream) -> None:
        """One connection, until it ends.  The connection's boundary: anything raised in
        serving it closes it, with one log line, and nothing else."""
        try:
            host, port = stream.socket.getpeername()[:2]
        except OSError:
            host, port = "unknown", 0
        address = f"{host}:{port}"
        open_here = self._open.get(host, 0)
        if sum(self._open.values()) >= MAX_SLAVE_CONNECTIONS and not self._evict_admitting():
            self._refuse(address, f"{MAX_SLAVE_CONNECTIONS} HA connections open")
        elif open_here >= MAX_CONNECTIONS_PER_HOST:
            self._refuse(address, f"{MAX_CONNECTIONS_PER_HOST} HA connections open from {host}")
        elif not self.guard.allows(host):
            self._refuse(address, "not in haSlaveAllowList")
        else:
            self._open[host] = open_here + 1
            try:
                await self._serve_admissible(stream, host, address)
            finally:
                left = self._open[host] - 1
                if left:
                    self._open[host] = left
                else:
                    del self._open[host]
            return
        await trio.aclose_forcefully(stream)

    def _evict_admitting(self) -> bool:
        """Close the oldest connection still in admission (for a newcomer on a full port);
        False when every open connection is an admitted slave."""
        if not self._admitting:
            return False
        conn, scope = self._admitting.popitem(last=False)
        conn.evicted = True
        scope.cancel()
        return True

    async def _serve_admissible(self, raw: trio.SocketStream, host: str, address: str) -> None:
        conn = SlaveConnection(address, last_read=trio.current_time())
        stream: trio.abc.Stream = raw
        admitted = False
        try:
            with trio.move_on_after(self.config.ha_housekeeping_interval / 1000) as deadline:
                self._admitting[conn] = deadline
                try:
                    stream, pending = await self._admit(raw, host)
                finally:
                    self._admitting.pop(conn, None)
            if conn.evicted:
                raise HARefused("still in admission when the port was full: closed for another")
            if deadline.cancelled_caught:
                raise HARefused("not admitted within haHousekeepingInterval")
            log.info("HAService receive new connection, %s", address)
            self.connections.add(conn)
            admitted = True
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read, stream, conn, nursery.cancel_scope, pending)
                nursery.start_soon(self._write, stream, conn, nursery.cancel_scope)
        except HARefused as exc:
            self._refuse(address, str(exc))
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._refuse(address, f"connection broken during admission: {exc!r}")
        except Exception as exc:
            log.error("HA connection to %s closed after an error: %r", address, exc)
        finally:
            self.connections.discard(conn)
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)
            if admitted:
                log.info("HA connection to slave %s closed", address)

    async def _admit(self, raw: trio.SocketStream, host: str) -> tuple[trio.abc.Stream, bytes]:
        """The stream to serve (TLS or plain) and what was read beyond the handshake; HARefused
        when the guard turns the connection away.  Nothing is sent before a good proof but
        the challenge."""
        guard = self.guard
        stream: trio.abc.Stream = raw
        if guard.tls is not None:
            wrapped = await guard.tls.wrap(raw)
            if wrapped is None:
                raise HARefused("no TLS handshake (tls.server.mode)")
            stream = wrapped
        buf = bytearray()
        first = await _receive_exactly(stream, len(HELLO), buf)
        if first != HELLO:
            if not guard.admits_plain(host):
                raise HARefused(
                    "no HA handshake, and haSecret or aclEnable needs one (RocketMQ's slave "
                    "cannot give it: see haSlaveAllowList and the ACL's global white list)"
                )
            return stream, first + bytes(buf)
        slave_nonce = await _receive_exactly(stream, NONCE_SIZE, buf)
        nonce, challenge = new_challenge()
        await stream.send_all(challenge)
        key_size = (await _receive_exactly(stream, 1, buf))[0]
        access_key = await _receive_exactly(stream, key_size, buf)
        mac = await _receive_exactly(stream, MAC_SIZE, buf)
        try:
            secret = guard.verify(access_key, (nonce, slave_nonce), mac)
        except HAProtocolError as exc:
            raise HARefused(f"HA handshake refused: {exc}") from None
        # Mutual: the master proves the same secret back (pymq.store.ha.auth).
        await stream.send_all(encode_answer(secret, slave_nonce, nonce, access_key))
        return stream, bytes(buf)

    def _start(self, conn: SlaveConnection, offset: int) -> None:
        """The first report: where to stream from, or HARefused when the master has no data
        there (a slave ahead of the master, or behind its oldest file)."""
        store = self.store
        max_offset = store.max_phy_offset
        if offset == 0:
            start = store.min_phy_offset
        elif offset > max_offset:
            raise HARefused(f"asks for offset {offset}, beyond this master's max {max_offset}")
        elif offset < store.min_phy_offset:
            raise HARefused(
                f"asks for offset {offset}, before this master's oldest {store.min_phy_offset}"
            )
        else:
            start = offset
        log.info("slave %s requests offset %d", conn.address, offset)
        conn.start_offset = conn.sent_end = start
        conn.ack_offset = offset
        conn.request_offset = offset

    async def _read(
        self,
        stream: trio.abc.Stream,
        conn: SlaveConnection,
        scope: trio.CancelScope,
        pending: bytes = b"",
    ) -> None:
        decoder = ReportDecoder()
        housekeeping = self.config.ha_housekeeping_interval / 1000
        try:
            data: bytes | bytearray = pending
            while True:
                if not data:
                    with trio.move_on_after(housekeeping) as idle:
                        data = await stream.receive_some(READ_SIZE)
                    if idle.cancelled_caught:
                        log.warning(
                            "ha housekeeping, found this connection[%s] expired", conn.address
                        )
                        break
                    if not data:
                        break
                    conn.last_read = trio.current_time()
                offset = decoder.feed(data)
                data = b""
                if offset is None:
                    continue
                if conn.request_offset < 0:
                    self._start(conn, offset)
                else:
                    self._on_report(conn, offset)
        except HARefused as exc:
            self._refuse(conn.address, str(exc))
        except (trio.BrokenResourceError, trio.ClosedResourceError, HAProtocolError) as exc:
            log.warning("HA read from %s failed: %s", conn.address, exc)
        finally:
            scope.cancel()

    async def _write(
        self, stream: trio.abc.Stream, conn: SlaveConnection, scope: trio.CancelScope
    ) -> None:
        store = self.store
        batch = self.config.ha_transfer_batch_size
        heartbeat = self.config.ha_send_heartbeat_interval / 1000
        try:
            while conn.start_offset < 0:
                await trio.sleep(0.01)
            next_offset = conn.start_offset
            last_write = trio.current_time()
            while True:
                data = None
                if next_offset < store.max_phy_offset:
                    data = store.get_commitlog_data(next_offset, batch)
                if data:
                    # What is handed to the socket counts as sent before send_all returns: the
                    # slave's ack of the last bytes can be read before this task runs again.
                    frame = encode_transfer(next_offset, data)
                    next_offset += len(data)
                    conn.sent_end = next_offset
                    await stream.send_all(frame)
                    last_write = trio.current_time()
                    continue
                if trio.current_time() - last_write > heartbeat:
                    await stream.send_all(encode_transfer(next_offset))
                    last_write = trio.current_time()
                with trio.move_on_after(IDLE_WAIT):
                    await self._new_data.wait()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.warning("HA write to %s failed: %s", conn.address, exc)
        finally:
            scope.cancel()
