"""A deterministic network of pymq.dledger.raft nodes for tests: virtual time in milliseconds,
every message through DLedger's JSON encoding, links that can be cut, nodes that can stop and
restart from their files; and the invariants checked after every step (one leader per term,
committed entries never change, followers' committed logs agree)."""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pymq.dledger.config import DLedgerConfig
from pymq.dledger.protocol import RESPONSES, Message, PushEntryRequest, decode, encode
from pymq.dledger.raft import Ack, RaftNode, Role, Send
from pymq.dledger.store import DLedgerFileStore, load_term, persist_term

STEP_MS = 10  # DLedger's state maintainer runs every 10 ms
LATENCY_MS = 1
TIMEOUT_MS = 3000  # a request without an answer fails after this (DLedger's RPC timeout)


def _wire(message: Message) -> Message:
    return decode(type(message), encode(message))


class Sim:
    """``timers``: tick a node only when its :meth:`RaftNode.next_due` says so or something
    woke it, as pymq.dledger.server's state maintainer does (a request other than a push, an
    answer that brings its next timer forward, an append), not every step; :attr:`ticks`
    counts each node's ticks."""

    def __init__(
        self, base: Path, n: int = 3, seed: int = 1, *, timers: bool = False, **config: Any
    ) -> None:
        self.base = base
        self.ids = [f"n{i}" for i in range(n)]
        peers = ";".join(f"{pid}-127.0.0.1:{41000 + i}" for i, pid in enumerate(self.ids))
        self.configs = {
            pid: DLedgerConfig(
                group="g",
                self_id=pid,
                peers=peers,
                store_base_dir=str(base),
                mapped_file_size_for_entry_data=64 * 1024,
                mapped_file_size_for_entry_index=32 * 1024,
                **config,
            )
            for pid in self.ids
        }
        self.seed = seed
        self.now = 0.0
        self.nodes: dict[str, RaftNode] = {}
        self.cut: set[frozenset[str]] = set()
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.leaders_by_term: dict[int, str] = {}
        self.committed: dict[int, tuple[int, bytes]] = {}
        self._checked: dict[str, int] = {}  # per node: committed entries checked up to
        self.acks: list[Ack] = []
        self.timers = timers
        self.ticks: dict[str, int] = dict.fromkeys(self.ids, 0)
        self._due: dict[str, float] = {}  # timers: when each node ticks next by itself
        for pid in self.ids:
            self.start(pid)

    # -- nodes ---------------------------------------------------------------------------------

    def start(self, pid: str) -> RaftNode:
        config = self.configs[pid]
        store = DLedgerFileStore(config)
        store.open()
        term, vote = load_term(config.default_path)
        node = RaftNode(
            config,
            store,
            rng=random.Random(f"{self.seed}-{pid}-{self.now}"),
            now=self.now,
            term=term,
            vote_for=vote,
            persist_term=lambda t, v, d=config.default_path: persist_term(d, t, v),
        )
        self.nodes[pid] = node
        self._checked[pid] = -1
        self._due[pid] = self.now
        return node

    def wake(self, pid: str) -> None:
        """Tick ``pid`` at the next step (timers)."""
        self._due[pid] = min(self._due.get(pid, self.now), self.now)

    def stop(self, pid: str) -> None:
        node = self.nodes.pop(pid)
        store = node.log
        assert isinstance(store, DLedgerFileStore)
        store.close()

    def up(self, pid: str) -> bool:
        return pid in self.nodes

    def link(self, a: str, b: str) -> bool:
        return frozenset((a, b)) not in self.cut

    def isolate(self, pid: str) -> None:
        self.cut |= {frozenset((pid, o)) for o in self.ids if o != pid}

    def heal(self) -> None:
        self.cut.clear()

    # -- messages ------------------------------------------------------------------------------

    def _at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._queue, (when, next(self._seq), action))

    def _send(self, src: str, send: Send) -> None:
        node = self.nodes[src]
        request = _wire(send.request)
        sent = self.now

        def answer(response: Message | None) -> None:
            if self.nodes.get(src) is not node:
                return  # the sender stopped (or restarted) meanwhile
            for more in node.on_response(send.peer, send.request, response, self.now):
                self._send(src, more)
            if self.now + node.next_due(self.now) < self._due[src]:
                self.wake(src)  # the server's _answered

        def deliver() -> None:
            target = self.nodes.get(send.peer)
            if target is None or not self.link(src, send.peer):
                self._at(sent + TIMEOUT_MS, lambda: answer(None))
                return
            response = _wire(target.handle(request, self.now))
            assert isinstance(response, RESPONSES[request.REQUEST_CODE])
            if not isinstance(request, PushEntryRequest):
                self.wake(send.peer)  # the server's _serve
            if self.link(src, send.peer):
                self._at(self.now + LATENCY_MS, lambda: answer(response))
            else:
                self._at(sent + TIMEOUT_MS, lambda: answer(None))

        self._at(self.now + LATENCY_MS, deliver)

    # -- time ----------------------------------------------------------------------------------

    def step(self) -> None:
        self.now += STEP_MS
        while self._queue and self._queue[0][0] <= self.now:
            _, _, action = heapq.heappop(self._queue)
            action()
        for pid in self.ids:
            node = self.nodes.get(pid)
            if node is None:
                continue
            if self.timers and self.now < self._due[pid]:
                continue
            self.ticks[pid] += 1
            for send in node.tick(self.now):
                self._send(pid, send)
            self.acks.extend(node.take_acks())
            due = node.next_due(self.now)
            self._due[pid] = self.now + (due if due > 0 else STEP_MS)
        self.check()

    def run(self, ms: float, until: Callable[[], bool] | None = None) -> bool:
        end = self.now + ms
        while self.now < end:
            self.step()
            if until is not None and until():
                return True
        return until is None

    # -- views and invariants ------------------------------------------------------------------

    def leaders(self) -> list[str]:
        return [pid for pid, n in self.nodes.items() if n.role is Role.LEADER]

    def leader(self) -> RaftNode:
        (pid,) = self.leaders()
        return self.nodes[pid]

    def append(self, body: bytes) -> int:
        leader = self.leader()
        self.wake(leader.self_id)
        return leader.append(body, self.now).index

    def check(self) -> None:
        for pid, node in self.nodes.items():
            if node.role is Role.LEADER:
                seen = self.leaders_by_term.setdefault(node.term, pid)
                assert seen == pid, f"two leaders in term {node.term}: {seen} and {pid}"
            log = node.log
            start = max(0, log.ledger_begin_index, self._checked[pid] + 1)
            for index in range(start, log.committed_index + 1):
                entry = log.get(index)
                known = self.committed.setdefault(index, (entry.term, entry.body))
                assert known == (entry.term, entry.body), f"{pid}: committed {index} changed"
            self._checked[pid] = max(self._checked[pid], log.committed_index)
