"""The Trio shell around :class:`pymq.dledger.raft.RaftNode`: one DLedger member serving its
peers on its ``dLegerPeers`` port over pymq's remoting, as DLedger 0.2.6's
``DLedgerRpcNettyService`` does (a request's code is its :class:`RequestCode`, its body the
JSON request; the answer a remoting response of code 200 whose body is the JSON response).

Every loop is a task in the member's nursery: the remoting server, the state maintainer (the
node's :meth:`~RaftNode.tick` when its next timer is due, :meth:`~RaftNode.next_due`: an idle
leader's heartbeats and COMMIT pushes, a follower's leader heartbeat timeout, a candidate's
vote round; or at once when a request, an answer that brings a timer forward or an append may
have given it work; where DLedger's StateMaintainer wakes every 10 ms), a task per connection
being made to a peer, and the flusher (the store's files made durable ``flushFileInterval``
ms after they were written, in a worker thread; an idle member's flusher sleeps until
something is written; the checkpoint every ``checkPointInterval`` ms).
Cancelling the member's scope stops it all; the store is flushed and closed on the way out.

Requests to a peer are written at once, in the order the node made them, and their answers
come back through the connection's reader (``invoke_callback``): no task per request, and
pushes reach a follower in order.  Peers' requests are served in the connection's reader
(``inline``), in arrival order, since the node answers them at once; a push is applied
there, a ``pwrite`` to the page cache.  A client's APPEND waits for its commit in a task of
its own.  A request body that is not the message its code names is answered with that
message's response carrying UNEXPECTED_ARGUMENT and the reason (a Java member sends no
answer at all).

The broker's way in is :meth:`DLedgerServer.append_encoded` (entries whose headers the one
record encoder wrote; pymq.store.dledger_commitlog) then :meth:`~DLedgerServer.wait_ack`, or
:meth:`~DLedgerServer.on_ack` for a callback without a waiting task (the sends served in a
connection's reader); a body alone goes in with :meth:`DLedgerServer.append_nowait`, and
:meth:`DLedgerServer.append` does both (a client's APPEND).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any

import trio

from pymq.dledger.config import DLedgerConfig
from pymq.dledger.errors import DLedgerError, ResponseCode
from pymq.dledger.protocol import (
    REQUESTS,
    RESPONSES,
    AppendEntryRequest,
    AppendEntryResponse,
    EntryTexts,
    Message,
    ProtocolError,
    RequestCode,
    decode,
    decode_request,
    encode,
)
from pymq.dledger.raft import Ack, RaftNode, Role, RoleChange, Send
from pymq.dledger.store import DLedgerEntry, DLedgerFileStore, load_term, persist_term
from pymq.remoting.channel import Channel
from pymq.remoting.client import RemotingClient, open_remoting_client
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.errors import RemotingError
from pymq.remoting.server import RemotingServer

log = logging.getLogger(__name__)

TICK_MS = 10
RPC_TIMEOUT = 3.0
"""Seconds a request to a peer waits for its answer (DLedger's 3000 ms)."""
ERROR_PAUSE = 0.2
"""Seconds the state maintainer pauses after the store failed it (DLedger: 200 ms)."""
FRAME_CODE = ResponseCode.SUCCESS.value
"""The remoting code of every answer: DLedger writes its own SUCCESS (200) there, whatever
the outcome (the outcome is the body's ``code``), not RocketMQ's SUCCESS (0)."""


class DLedgerServer:
    """One member.  ``host``: the address to listen on (the port is this member's in
    ``dLegerPeers``).  ``rng``: the election timeouts' randomness (a seeded one in tests).
    ``on_role_change``: called with each role this member takes, in order, from the state
    maintainer (it must not block); they are logged in any case."""

    def __init__(
        self,
        config: DLedgerConfig,
        *,
        host: str = "0.0.0.0",
        rng: random.Random | None = None,
        on_role_change: Callable[[RoleChange], None] | None = None,
        store: DLedgerFileStore | None = None,
    ) -> None:
        config.check()
        self.config = config
        self.host = host
        self.rng = rng or random.Random()
        self.on_role_change = on_role_change
        self.node: RaftNode | None = None
        self.store: DLedgerFileStore | None = None
        self._given_store = store
        self.on_commit: Callable[[], None] | None = None
        """Called (it must not block) when the committed index has moved: the broker's
        dispatch of committed entries is woken by it."""
        self._last_committed = -2
        """A store its owner opened and closes (RocketMQ's DLedgerCommitLog reads it before
        the member starts and after it stops); else run() opens and closes its own."""
        self._client: RemotingClient | None = None
        self._nursery: trio.Nursery | None = None
        # Entries appended here whose outcome is not decided: the callbacks waiting for it.
        self._watched: dict[int, list[Callable[[Ack], None]]] = {}
        self._decided: dict[int, Ack] = {}  # outcomes of append_nowait's entries, not yet taken
        self._connecting: dict[str, list[Send]] = {}
        self._wake = trio.Event()
        self.wakeups = 0
        """The state maintainer's rounds (a tick each) since the member started."""
        self._sleep_until = float("inf")
        """When the sleeping state maintainer wakes by itself (ms; inf while it runs)."""
        self._written = trio.Event()
        """Set when the log may have been written: the flusher of an idle member waits for it."""
        self._texts = EntryTexts()
        """The pushed entries' JSON text, written once for every follower (while leading)."""

    @staticmethod
    def now() -> float:
        return trio.current_time() * 1000.0

    def status(self) -> dict[str, Any]:
        """What the tools show of this member: its id and group, role, term, leader, its log's
        end and committed index, and as the leader each follower's match index and lag
        (entries the follower is known to be missing)."""
        node, store = self.node, self.store
        status: dict[str, Any] = {
            "selfId": self.config.self_id,
            "group": self.config.group,
            "peers": self.config.peers,
            "role": node.role.value if node is not None else "STOPPED",
            "term": node.term if node is not None else -1,
            "leaderId": node.leader_id if node is not None else None,
            "ledgerEndIndex": store.ledger_end_index if store is not None else -1,
            "committedIndex": store.committed_index if store is not None else -1,
        }
        if node is not None and store is not None:
            status["followers"] = {
                pid: {"matchIndex": match, "lag": store.ledger_end_index - match}
                for pid, match in sorted(node.match_indexes().items())
            }
        return status

    # -- running ---------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``task_status.started`` gets the port."""
        config = self.config
        store = self._given_store
        owned = store is None
        if store is None:
            store = DLedgerFileStore(config)
            await trio.to_thread.run_sync(store.open)
        term, vote = load_term(config.default_path)
        self.store = store
        self.node = RaftNode(
            config,
            store,
            rng=self.rng,
            now=self.now(),
            term=term,
            vote_for=vote,
            persist_term=lambda t, v: persist_term(config.default_path, t, v),
        )
        port = config.peer_map()[config.self_id].port
        server = RemotingServer(host=self.host, port=port, name=f"dledger-{config.self_id}")
        for code in REQUESTS:
            if code is RequestCode.APPEND:
                server.register(code, self._serve_append)
            else:
                server.register(code, self._serve_async, inline=self._serve)
        try:
            async with open_remoting_client() as client, trio.open_nursery() as nursery:
                self._client, self._nursery = client, nursery
                await nursery.start(server.run)
                nursery.start_soon(self._maintain)
                nursery.start_soon(self._flush)
                task_status.started(server.port)
        finally:
            self.node = None  # appends from now on: LEADER_NOT_READY
            self._fail_waiters()
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(store.close if owned else store.flush)

    async def _maintain(self) -> None:
        node = self.node
        assert node is not None
        while True:
            try:
                self._dispatch(node.tick(self.now()))
            except DLedgerError:  # the store failed a read; DLedger logs it and goes on
                log.exception("%s: state maintainer", node.self_id)
                await trio.sleep(ERROR_PAUSE)
            self._deliver_acks()
            for change in node.take_role_changes():  # (the node logs them)
                if change.role is not Role.LEADER:
                    self._texts = EntryTexts()  # pushes no more: its memory back
                if self.on_role_change is not None:
                    self.on_role_change(change)
            # Asleep until the node's next timer (a follower's is its leader's heartbeat
            # timeout, an idle leader's its next heartbeat or COMMIT push), not every
            # TICK_MS: a request, an answer that may change a role and an append wake it.
            # A timer still due after its tick (none should be) waits TICK_MS, as DLedger.
            due = node.next_due(self.now())
            delay = due if due > 0 else TICK_MS
            self.wakeups += 1
            self._sleep_until = self.now() + delay
            with trio.move_on_after(delay / 1000):
                await self._wake.wait()
            self._sleep_until = float("inf")  # awake: nothing need wake it
            self._wake = trio.Event()

    async def _flush(self) -> None:
        store = self.store
        assert store is not None
        last_checkpoint = self.now()
        while True:
            await trio.sleep(self.config.flush_file_interval / 1000)
            if store.dirty():  # no worker thread for an idle member
                await trio.to_thread.run_sync(store.flush)
            else:  # idle: asleep until something is written or the checkpoint is due
                self._written = trio.Event()
                due = last_checkpoint + self.config.check_point_interval - self.now()
                with trio.move_on_after(max(0.0, due) / 1000):
                    await self._written.wait()
            if self.now() - last_checkpoint > self.config.check_point_interval:
                await trio.to_thread.run_sync(store.persist_checkpoint)
                last_checkpoint = self.now()

    # -- our requests --------------------------------------------------------------------------

    def _dispatch(self, sends: list[Send]) -> None:
        for send in sends:
            self._send(send)

    def _send(self, send: Send) -> None:
        """Write ``send`` now, in order behind the earlier ones to the same peer (a push out of
        order makes a follower answer INCONSISTENT_STATE); its answer comes to
        :meth:`_answered` from the connection's reader.  While the connection to the peer is
        being made, requests to it queue in order."""
        queued = self._connecting.get(send.peer)
        if queued is not None:
            queued.append(send)
            return
        node, client = self.node, self._client
        assert node is not None and client is not None and self._nursery is not None
        channel = client.open_channel(node.peers[send.peer])
        if channel is None:
            self._connecting[send.peer] = [send]
            self._nursery.start_soon(self._connect, send.peer)
            return
        self._invoke(channel, send)

    async def _connect(self, peer: str) -> None:
        node, client = self.node, self._client
        assert node is not None and client is not None
        channel: Channel | None
        try:
            channel = await client.channel(node.peers[peer])
        except RemotingError as exc:
            log.debug("%s -> %s: %s", node.self_id, peer, exc)
            channel = None
        queued = self._connecting.pop(peer, [])
        for send in queued:
            if channel is None:
                self._answered(send, None)
            else:
                self._invoke(channel, send)

    def _invoke(self, channel: Channel, send: Send) -> None:
        code = send.request.REQUEST_CODE
        command = RemotingCommand.request(code, body=encode(send.request, self._texts))

        def done(answer: RemotingCommand | None, error: Exception | None) -> None:
            response: Message | None = None
            if answer is not None:
                try:
                    response = decode(RESPONSES[code], answer.body)
                except DLedgerError as exc:
                    log.warning("%s answered %s with a bad body: %s", send.peer, code.name, exc)
            self._answered(send, response)

        try:
            channel.invoke_callback(command, RPC_TIMEOUT, done)
        except RemotingError:
            self._answered(send, None)

    def _answered(self, send: Send, response: Message | None) -> None:
        node = self.node
        if node is None:  # stopped meanwhile
            return
        now = self.now()
        try:
            self._dispatch(node.on_response(send.peer, send.request, response, now))
        except DLedgerError:  # the store failed a read: the next tick tries again
            log.exception("%s: answer from %s", node.self_id, send.peer)
        self._deliver_acks()
        # An answer may bring a timer forward (a vote round decided, a push to retry): the
        # maintainer is woken for it, not for the answers that leave it as it was.
        if now + node.next_due(now) < self._sleep_until:
            self._wake.set()

    # -- peers' requests -----------------------------------------------------------------------

    def _serve(self, channel: Channel, request: RemotingCommand) -> RemotingCommand:
        node = self.node
        assert node is not None
        code = RequestCode(request.code)
        try:
            message = decode_request(request.code, request.body)
        except ProtocolError as exc:
            refusal = RESPONSES[code](code=exc.code.value)
            return request.response(FRAME_CODE, body=encode(refusal), remark=str(exc))
        try:
            answer = node.handle(message, self.now())
        except DLedgerError as exc:  # the store failed: answered with its code
            log.exception("%s: %s from %s", node.self_id, code.name, message.local_id)
            answer = RESPONSES[code](code=exc.code.value, leader_id=node.leader_id)
            return request.response(FRAME_CODE, body=encode(answer), remark=str(exc))
        if code is RequestCode.PUSH:
            self._written.set()  # a push changes no role or timer: the maintainer sleeps on
        else:
            self._wake.set()  # a vote or heartbeat may have changed what the maintainer does
        return request.response(FRAME_CODE, body=encode(answer))

    async def _serve_async(self, channel: Channel, request: RemotingCommand) -> RemotingCommand:
        return self._serve(channel, request)

    async def _serve_append(self, channel: Channel, request: RemotingCommand) -> RemotingCommand:
        try:
            message = decode(AppendEntryRequest, request.body)
        except ProtocolError as exc:
            refusal = AppendEntryResponse(code=exc.code.value)
            return request.response(FRAME_CODE, body=encode(refusal), remark=str(exc))
        node = self.node
        assert node is not None
        result = node.append_request(message, self.now())
        if isinstance(result, AppendEntryResponse):
            return request.response(FRAME_CODE, body=encode(result))
        ack = await self._wait(result)
        response = AppendEntryResponse(
            group=node.group, term=node.term, leader_id=node.leader_id, code=ack.code.value
        )
        if ack.code is ResponseCode.SUCCESS:
            response.index, response.pos = ack.index, ack.pos
        return request.response(FRAME_CODE, body=encode(response))

    # -- appends ---------------------------------------------------------------------------------

    async def append(self, body: bytes) -> Ack:
        """Append ``body`` on this member (the leader) and wait for its outcome: SUCCESS once
        a majority has it, WAIT_QUORUM_ACK_TIMEOUT or TERM_CHANGED otherwise; DLedgerError
        (NOT_LEADER, LEADER_PENDING_FULL, ...) when it cannot be appended here."""
        return await self.wait_ack(self.append_nowait(body).index)

    def append_nowait(self, body: bytes) -> DLedgerEntry:
        """Append ``body`` on this member (the leader) now; its outcome is :meth:`wait_ack`'s
        or :meth:`on_ack`'s (kept until the node decides it, whether or not anyone waits).
        DLedgerError (NOT_LEADER, LEADER_PENDING_FULL, LEADER_NOT_READY, the store's) when it
        cannot be appended here."""
        node = self.node
        if node is None:
            raise DLedgerError(ResponseCode.LEADER_NOT_READY, "not started")
        entry = node.append(body, self.now())
        self._watched[entry.index] = []
        self._wake.set()
        self._written.set()
        return entry

    def append_encoded(
        self, data: bytes | memoryview, entries: list[DLedgerEntry], watched: list[int]
    ) -> None:
        """:meth:`append_nowait` of ``entries``, encoded by the caller as ``data`` (their
        indexes and term the node's ``next_entry``; pymq.store.dledger_commitlog), written
        together or not at all (DLedgerError).  The outcomes kept for :meth:`wait_ack` /
        :meth:`on_ack` are those of the indexes in ``watched`` (the entries a put is
        acknowledged by: each single message's, a batch's last)."""
        node = self.node
        if node is None:
            raise DLedgerError(ResponseCode.LEADER_NOT_READY, "not started")
        node.append_encoded(data, entries, self.now())
        for index in watched:
            self._watched[index] = []
        self._wake.set()
        self._written.set()

    async def wait_ack(self, index: int) -> Ack:
        """The outcome of the entry :meth:`append_nowait` appended at ``index``."""
        self._deliver_acks()
        ack = self._decided.pop(index, None)
        if ack is not None:
            return ack
        callbacks = self._watched.get(index)
        if callbacks is None:
            return Ack(index, -1, ResponseCode.UNKNOWN)
        event, box = trio.Event(), []

        def decided(ack: Ack) -> None:
            box.append(ack)
            event.set()

        callbacks.append(decided)
        await event.wait()
        return box[0]

    def on_ack(self, index: int, callback: Callable[[Ack], None]) -> None:
        """``callback(ack)`` with the outcome of the entry :meth:`append_nowait` appended at
        ``index``, once decided (now if it is: UNKNOWN for an index it does not know), from
        the task that learns it (it must not block; what it raises is logged): no task
        waits."""
        self._deliver_acks()
        ack = self._decided.pop(index, None)
        callbacks = self._watched.get(index) if ack is None else None
        if callbacks is not None:
            callbacks.append(callback)
            return
        callback(ack if ack is not None else Ack(index, -1, ResponseCode.UNKNOWN))

    async def _wait(self, entry: DLedgerEntry) -> Ack:
        self._watched.setdefault(entry.index, [])
        self._wake.set()
        self._written.set()
        return await self.wait_ack(entry.index)

    def _deliver_acks(self) -> None:
        node = self.node
        if node is None:
            return
        committed = node.log.committed_index
        if committed != self._last_committed:
            self._last_committed = committed
            if self.on_commit is not None:
                self.on_commit()
        for ack in node.take_acks():
            self._decide(ack)

    def _decide(self, ack: Ack) -> None:
        """``ack`` to those waiting for it, or kept for a later wait_ack / on_ack (the oldest
        dropped beyond maxPendingRequestsNum: UNKNOWN if asked for at last)."""
        callbacks = self._watched.pop(ack.index, None)
        if callbacks is None:
            return
        if not callbacks:
            self._decided[ack.index] = ack
            if len(self._decided) > self.config.max_pending_requests_num:
                del self._decided[next(iter(self._decided))]
            return
        for callback in callbacks:
            try:
                callback(ack)
            except Exception:
                log.exception("the callback of entry %d failed", ack.index)

    def _fail_waiters(self) -> None:
        for index in list(self._watched):
            self._decide(Ack(index, -1, ResponseCode.TERM_CHANGED))


def member_configs(
    base_dir: str, ports: list[int], group: str = "g", **timings: Any
) -> list[DLedgerConfig]:
    """Configs of a group of ``len(ports)`` members n0, n1, ... on 127.0.0.1 (tests, tools)."""
    peers = ";".join(f"n{i}-127.0.0.1:{port}" for i, port in enumerate(ports))
    return [
        DLedgerConfig(group=group, self_id=f"n{i}", peers=peers, store_base_dir=base_dir, **timings)
        for i in range(len(ports))
    ]
