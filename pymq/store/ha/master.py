"""HAService on the master: accepts slaves, streams the commit log to them, tracks their acks.

One task accepts on ``haListenPort``; each slave connection gets a read task (offset reports;
the connection is dropped after ``haHousekeepingInterval`` of silence) and a write task (frames of
at most ``haTransferBatchSize`` bytes from where the slave is; an empty frame every
``haSendHeartbeatInterval`` when there is nothing new).  A slave that reports offset 0 (an empty
store) is sent everything from the master's oldest commit-log file.

For SYNC_MASTER, :meth:`wait_for_replica` is the store's replica waiter: a put is acknowledged
only once a slave's ack covers it (FLUSH_SLAVE_TIMEOUT after ``syncFlushTimeout``), and at once
SLAVE_NOT_AVAILABLE when no slave is connected or the best one is more than
``haSlaveFallbehindMax`` bytes behind.
"""

from __future__ import annotations

import logging

import attrs
import trio

from pymq.store.config import MessageStoreConfig
from pymq.store.ha.framing import HAProtocolError, ReportDecoder, encode_transfer
from pymq.store.ha.ports import MasterStore
from pymq.store.results import PutMessageStatus

log = logging.getLogger(__name__)

# WriteSocketService: with nothing to send, look again after this long at most.
IDLE_WAIT = 0.1

# Connections on the HA port beyond this many are closed at once (a master has a slave or two;
# the port takes no credentials, so what a stranger can open there is bounded).
MAX_SLAVE_CONNECTIONS = 64


@attrs.define(eq=False)
class SlaveConnection:
    address: str
    request_offset: int = -1  # first report; -1 until the slave has said where it is
    ack_offset: int = 0
    last_read: float = 0.0


class HAService:
    def __init__(
        self, store: MasterStore, config: MessageStoreConfig, host: str = "0.0.0.0"
    ) -> None:
        self.store = store
        self.config = config
        self.host = host
        self.connections: set[SlaveConnection] = set()
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

    def _on_ack(self, conn: SlaveConnection, offset: int) -> None:
        conn.ack_offset = offset
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

    async def _serve(self, stream: trio.SocketStream) -> None:
        """One slave's connection, until it ends.  The connection's boundary: anything raised
        in serving it closes it, with one log line, and nothing else."""
        try:
            host, port = stream.socket.getpeername()[:2]
        except OSError:
            host, port = "unknown", 0
        conn = SlaveConnection(f"{host}:{port}", last_read=trio.current_time())
        if len(self.connections) >= MAX_SLAVE_CONNECTIONS:
            log.warning(
                "HAService: %d slave connections open, refusing %s",
                len(self.connections),
                conn.address,
            )
            await trio.aclose_forcefully(stream)
            return
        log.info("HAService receive new connection, %s", conn.address)
        self.connections.add(conn)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read, stream, conn, nursery.cancel_scope)
                nursery.start_soon(self._write, stream, conn, nursery.cancel_scope)
        except Exception as exc:
            log.error("HA connection to %s closed after an error: %r", conn.address, exc)
        finally:
            self.connections.discard(conn)
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)
            log.info("HA connection to slave %s closed", conn.address)

    async def _read(
        self, stream: trio.SocketStream, conn: SlaveConnection, scope: trio.CancelScope
    ) -> None:
        decoder = ReportDecoder()
        housekeeping = self.config.ha_housekeeping_interval / 1000
        try:
            while True:
                with trio.move_on_after(housekeeping) as idle:
                    data = await stream.receive_some(1024 * 1024)
                if idle.cancelled_caught:
                    log.warning("ha housekeeping, found this connection[%s] expired", conn.address)
                    break
                if not data:
                    break
                conn.last_read = trio.current_time()
                offset = decoder.feed(data)
                if offset is None:
                    continue
                if conn.request_offset < 0:
                    conn.request_offset = offset
                    log.info("slave %s requests offset %d", conn.address, offset)
                self._on_ack(conn, offset)
        except (trio.BrokenResourceError, trio.ClosedResourceError, HAProtocolError) as exc:
            log.warning("HA read from %s failed: %s", conn.address, exc)
        finally:
            scope.cancel()

    async def _write(
        self, stream: trio.SocketStream, conn: SlaveConnection, scope: trio.CancelScope
    ) -> None:
        store = self.store
        batch = self.config.ha_transfer_batch_size
        heartbeat = self.config.ha_send_heartbeat_interval / 1000
        try:
            while conn.request_offset < 0:
                await trio.sleep(0.01)
            next_offset = conn.request_offset
            if next_offset == 0:
                next_offset = store.min_phy_offset
            last_write = trio.current_time()
            while True:
                data = None
                if next_offset < store.max_phy_offset:
                    data = store.get_commitlog_data(next_offset, batch)
                if data:
                    await stream.send_all(encode_transfer(next_offset, data))
                    next_offset += len(data)
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
