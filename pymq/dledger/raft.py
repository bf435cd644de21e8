"""DLedger's election and replication as a sans-IO state machine: no clock, no sockets, no
randomness of its own.  The shell (pymq.dledger.server) gives it the time in milliseconds and
a ``random.Random``, hands it the requests peers send (:meth:`RaftNode.handle`) and the answers
to its own (:meth:`RaftNode.on_response`, ``None`` for a network error or a timeout), and sends
the requests it returns (:class:`Send`) from :meth:`RaftNode.tick`.

Election (DLedger 0.2.6's ``DLedgerLeaderElector``, kept so that Java members interoperate):

- A follower that has not heard a heartbeat for ``maxHeartBeatLeak`` x
  ``heartBeatTimeIntervalMs`` becomes a candidate *in its current term*.
- A candidate waits until its next vote time (a random ``minVoteIntervalMs`` ..
  ``maxVoteIntervalMs`` ahead), then asks every member, itself included, in a round.  The
  round ends when every member answered, when a quorum accepted, when accepted +
  REJECT_TERM_NOT_READY make a quorum, when one answered REJECT_ALREADY_HAS_LEADER, or after
  2000 ms + a random part of ``maxVoteIntervalMs``.  The round is parsed as DLedger does:
  a bigger term seen -> WAIT_TO_VOTE_NEXT in that term; a leader seen -> WAIT_TO_REVOTE after
  a heartbeat timeout; no quorum of answers -> WAIT_TO_REVOTE (the term is *not* raised);
  no quorum of answers from members whose ledger is not ahead -> WAIT_TO_REVOTE after one more
  ``maxVoteIntervalMs``; a quorum accepted -> PASSED (leader); accepted + not ready make a
  quorum -> REVOTE_IMMEDIATELY; otherwise WAIT_TO_VOTE_NEXT.  The term goes up only before a
  round that follows WAIT_TO_VOTE_NEXT, or at once after a request showed a bigger term.
- A vote is judged as DLedger does: an unknown or unexpected candidate, then the *ledger*
  (the candidate's last term, then its last index, against the voter's), then the term, then
  the vote already given in this term.

Why a partitioned node cannot depose a healthy leader (the pre-vote question).  DLedger has no
pre-vote message, and a pymq member must speak DLedger's protocol to Java members, so pymq adds
no new message.  Instead: (1) DLedger's own rule above: an isolated candidate gets no quorum of
answers, so its rounds end WAIT_TO_REVOTE and its term never grows, however long the partition;
(2) the ledger is judged before the term, so a candidate behind on the log never makes an
up-to-date member raise its term; (3) pymq adds Raft's "leader stickiness" (Raft thesis
section 9.6): a member that heard its leader's heartbeat within the last
2 x ``heartBeatTimeIntervalMs`` (a leader: had a quorum of heartbeat answers that recently)
answers a vote for a *bigger* term REJECT_ALREADY_HAS_LEADER without taking that term,
which a Java candidate reads as "wait a heartbeat timeout".  (3) covers what (1) and (2) do
not: a member that comes back with a bigger term (restarted from an old ``currterm``, or
raised by a Java member) and a log as long as the leader's (an idle group).  Such a member
stays a candidate until the leader next changes; DLedger 0.2.6 leaves such a member out the
same way whenever its log is behind.  The window is shorter than a follower's own heartbeat
timeout (``maxHeartBeatLeak`` x interval), so a real election after a leader failure is not
slowed.  Stickiness does not shield against a preferred leader (``preferredLeaderIds``) or
the member a leader is handing over to: leadership transfer must let them through.

Leadership transfer (DLedger 0.2.6's checkPreferredLeader / handleLeadershipTransfer /
handleTakeLeadership): once a second a leader that is not preferred picks the preferred member
least behind (under ``maxLeadershipTransferWaitIndex`` entries), refuses appends
(LEADER_TRANSFERRING) until that member has every entry, then sends it LEADERSHIP_TRANSFER;
the transferee stands at once in the next term with the take-leadership vote intervals.  The
transferee answers as soon as its campaign starts (DLedger answers once it is decided); a
transfer not done within 3 x ``leadershipTransferWaitTimeout`` is given up.

Leader: heartbeats every ``heartBeatTimeIntervalMs`` in rounds as DLedger's; a leader without
a quorum of successful answers for ``maxHeartBeatLeak`` intervals steps down to candidate (and
refuses appends from then on: NOT_LEADER), as does one that sees a bigger term while lacking a
quorum.  Replication is DLedger's push protocol, per follower: COMPARE from the leader's last
entry back to where the logs agree, TRUNCATE the follower there (its entries past the
diverging point are dropped; committed ones never are: the store refuses, except one that
COMPARE found differs from the leader's, a body torn in a crash), then APPEND entries
in order, those ready at a push in one request (0.2.6's batch push, ``batchEntry``, which a
0.2.6 follower takes whatever its own ``enableBatchPush``; up to :data:`PUSH_BATCH_BYTES`), at
most :data:`MAX_PENDING_PUSHES` pushes in flight, the one the follower waits for re-sent after
``maxPushTimeOutMs`` without an answer, and a COMMIT every second when idle.  The commit index
is the index a majority (the leader included) has in the leader's term, as DLedger 0.2.6's
QuorumAckChecker takes it: water marks are kept per current term (a follower's is set once
COMPARE/TRUNCATE found where its log agrees with the leader's, then by its APPEND answers),
and the entry at that index commits whatever its term (``updateCommittedIndex`` does not look
at it).  So a new leader commits its predecessor's uncommitted entries as soon as a majority
agrees, with no write of its own: RocketMQ 4.9.4's DLedgerRoleChangeHandler waits for
``ledgerEndIndex == committedIndex`` before the broker becomes master, which Raft's stricter
rule (only entries of the leader's term commit by counting) would make wait for ever on an
idle group.  Raft's usual remedy, a no-op entry at the start of each term, is not open to a
member of a RocketMQ group: every entry body is dispatched as a message record, and 4.9.4's
reput has no body it skips cleanly (a body that fails its check with a positive size is
skipped, but its ``readSize`` is not advanced, so the rest of that read is dropped).  The
cost is Raft's figure-8 case, as in Java: an entry of an older term that a leader replicated
to a majority can still be overwritten by a later leader whose log ends in a bigger term.

Follower: applies pushes as DLedger's ``EntryHandler`` (an APPEND must be the next index, or
one it already holds identically; a gap is answered INCONSISTENT_STATE at once, sending the
leader back to COMPARE) and takes the leader's commit index no further than the last entry
it knows matches the leader's log in this term.

Appends (:meth:`RaftNode.append`) are the leader's; each is acknowledged (:meth:`take_acks`)
SUCCESS once committed, WAIT_QUORUM_ACK_TIMEOUT after ``maxWaitAckTimeMs`` without, or
TERM_CHANGED when leadership moved; at most ``maxPendingRequestsNum`` wait at once
(LEADER_PENDING_FULL beyond).
"""

from __future__ import annotations

import enum
import logging
import random
from collections.abc import Callable
from typing import Protocol

import attrs

from pymq.dledger.config import DLedgerConfig
from pymq.dledger.errors import DLedgerError, ResponseCode
from pymq.dledger.protocol import (
    MAX_BATCH_ENTRIES,
    AppendEntryRequest,
    AppendEntryResponse,
    GetEntriesRequest,
    GetEntriesResponse,
    HeartBeatRequest,
    HeartBeatResponse,
    LeadershipTransferRequest,
    LeadershipTransferResponse,
    Message,
    MetadataRequest,
    MetadataResponse,
    ParseResult,
    PullEntriesRequest,
    PullEntriesResponse,
    PushEntryRequest,
    PushEntryResponse,
    PushType,
    VoteRequest,
    VoteResponse,
    VoteResult,
)
from pymq.dledger.store import MAX_ENTRY_SIZE, DLedgerEntry

log = logging.getLogger(__name__)

MAX_PENDING_PUSHES = 1000
"""APPEND pushes in flight to one follower (DLedger's ``maxPendingSize``)."""
PUSH_BATCH_BYTES = 256 * 1024
"""A batch APPEND push carries entries until they reach this many bytes (or DLedger's
``maxBatchPushSize`` when larger, up to :data:`~pymq.dledger.store.MAX_ENTRY_SIZE`: with one
entry over, its base64 JSON stays well inside a 16 MiB remoting frame), at most
:data:`MAX_BATCH_ENTRIES` entries."""
COMMIT_PUSH_INTERVAL_MS = 1000
"""An idle leader tells each follower its commit index this often (DLedger: 1 s)."""
PUSH_RETRY_MS = 500
"""After a failed COMPARE or TRUNCATE, the next one waits this long (DLedger: 500 ms)."""
PREFERRED_CHECK_MS = 1000
"""A leader looks for a preferred leader to hand over to this often (DLedger: 1 s)."""
VOTE_ROUND_BASE_MS = 2000
"""A vote round lasts at most this + a random part of ``maxVoteIntervalMs`` (DLedger)."""


class Role(enum.Enum):
    CANDIDATE = "CANDIDATE"
    LEADER = "LEADER"
    FOLLOWER = "FOLLOWER"


class Log(Protocol):
    """What the node needs of a log (pymq.dledger.store.DLedgerFileStore has it)."""

    ledger_begin_index: int
    ledger_end_index: int
    ledger_end_term: int
    committed_index: int

    def get(self, index: int) -> DLedgerEntry: ...

    def term_at(self, index: int) -> int: ...

    def append_as_leader(self, body: bytes, term: int) -> DLedgerEntry: ...

    def append_encoded_as_leader(
        self, data: bytes | memoryview, entries: list[DLedgerEntry]
    ) -> None: ...

    def append_as_follower(self, entry: DLedgerEntry) -> DLedgerEntry: ...

    def append_run_as_follower(self, entries: list[DLedgerEntry]) -> None: ...

    def truncate(self, entry: DLedgerEntry) -> int: ...

    def update_committed_index(self, new_committed: int) -> None: ...

    def distrust_committed_from(self, index: int) -> None: ...


@attrs.frozen
class Send:
    """A request for the shell to send to ``peer``; its answer goes to ``on_response``."""

    peer: str
    request: Message


@attrs.frozen
class RoleChange:
    """This member took ``role`` in ``term`` (``leader``: the leader it follows, or itself)."""

    term: int
    role: Role
    leader: str | None


@attrs.frozen
class Ack:
    """The outcome of one :meth:`RaftNode.append`."""

    index: int
    pos: int
    code: ResponseCode


@attrs.define
class _VoteRound:
    term: int
    deadline: float
    waiting: set[str]
    known_max_term: int
    accepted: int = 0
    valid: int = 0
    not_ready: int = 0
    bigger_ledger: int = 0
    already_has_leader: bool = False


@attrs.define
class _BeatRound:
    term: int
    deadline: float
    waiting: set[str]
    succ: int = 1
    not_ready: int = 0
    max_term: int = -1
    inconsistent_leader: bool = False


@attrs.define
class _Peer:
    """The leader's push state for one follower (DLedger's ``EntryDispatcher``)."""

    state: PushType = PushType.COMPARE
    compare_index: int = -1
    write_index: int = 0
    match: int = -1
    pending: dict[int, tuple[float, int]] = attrs.Factory(dict)
    """APPEND pushes in flight: first index -> (sent at, last index), in index order."""
    control_in_flight: bool = False
    retry_at: float = 0.0
    last_commit_push: float = float("-inf")


class RaftNode:
    """One member.  ``persist_term(term, vote_for)`` must make the term and vote durable
    before it returns (``currterm``); ``term``/``vote_for``: what it last persisted."""

    def __init__(
        self,
        config: DLedgerConfig,
        log: Log,
        *,
        rng: random.Random,
        now: float,
        term: int = 0,
        vote_for: str | None = None,
        persist_term: Callable[[int, str | None], None] = lambda term, vote: None,
    ) -> None:
        config.check()
        self.config = config
        self.log = log
        self.rng = rng
        self.self_id = config.self_id
        self.group = config.group
        self.peers = {pid: p.address for pid, p in config.peer_map().items()}
        self.others = [pid for pid in self.peers if pid != self.self_id]
        self._persist = persist_term
        self.term = term
        self.vote_for = vote_for
        self.role = Role.CANDIDATE
        self.leader_id: str | None = None
        self.known_max_term = -1
        hb = config.heart_beat_time_interval_ms
        self._hb = hb
        self._leak = config.max_heart_beat_leak * hb
        self._sticky_ms = 2 * hb
        # candidate
        self.last_parse_result = ParseResult.WAIT_TO_REVOTE
        self.need_increase_term = False
        self.next_vote_time = -1.0
        self._vote_round: _VoteRound | None = None
        # follower
        self.last_leader_heartbeat = -1.0
        self._leader_match = -1
        # leader
        self.last_send_heartbeat = -1.0
        self.last_succ_heartbeat = now
        self._beat_round: _BeatRound | None = None
        self._dispatch: dict[str, _Peer] = {}
        self._acks: dict[int, tuple[int, float]] = {}  # index -> (term, appended at)
        self._done: list[Ack] = []
        self._role_changes: list[RoleChange] = []
        self._last_change: RoleChange | None = None
        # leadership transfer (preferredLeaderIds): as the leader, the member it hands over
        # to (appends refused meanwhile) and since when; as the transferee, the term it takes
        self._preferred = config.preferred_leaders()
        self.transferee: str | None = None
        self._transfer_since = 0.0
        self._transfer_asked = False
        self._last_preferred_check = now
        self.term_to_take_leadership = -1

    # -- helpers ---------------------------------------------------------------------------------

    def is_quorum(self, count: int) -> bool:
        return count >= len(self.peers) // 2 + 1

    def _rand(self, low: int, high: int) -> int:
        return low + self.rng.randrange(high - low)

    def _next_vote_time(self, now: float) -> float:
        c = self.config
        if self.term_to_take_leadership == self.term and self.self_id in self._preferred:
            low, high = (
                c.min_take_leadership_vote_interval_ms,
                c.max_take_leadership_vote_interval_ms,
            )
            return now + self._rand(low, high)
        return now + self._rand(c.min_vote_interval_ms, c.max_vote_interval_ms)

    def _set_term(self, term: int, vote_for: str | None) -> None:
        self._persist(term, vote_for)
        self.term, self.vote_for = term, vote_for

    def _base(self, response: Message, request: Message) -> Message:
        response.group, response.remote_id = request.group, request.remote_id
        response.local_id, response.leader_id = request.local_id, request.leader_id
        response.term = request.term
        return response

    # -- role changes (MemberState + DLedgerLeaderElector) ----------------------------------------

    def _to_candidate(self, term: int) -> None:
        if term < self.term:
            return
        if term > self.known_max_term:
            self.known_max_term = term
        self.role = Role.CANDIDATE
        self.leader_id = None
        self._leave_leadership()
        self._changed(term)

    def _to_follower(self, term: int, leader_id: str, now: float) -> None:
        assert term == self.term
        self.last_parse_result = ParseResult.WAIT_TO_REVOTE
        self.role = Role.FOLLOWER
        self.leader_id = leader_id
        self.last_leader_heartbeat = now
        self._leader_match = -1
        self._vote_round = None
        self._leave_leadership()
        self._changed(term)

    def _to_leader(self, term: int, now: float) -> None:
        if term != self.term:
            return
        self.role = Role.LEADER
        self.leader_id = self.self_id
        self.last_send_heartbeat = -1.0
        self.last_succ_heartbeat = now
        self._beat_round = None
        self._dispatch = {pid: _Peer() for pid in self.others}
        self._changed(term)

    def _changed(self, term: int) -> None:
        """Note a role change for :meth:`take_role_changes` (DLedger's RoleChangeHandler),
        and log it: once, however often the same role in the same term is taken again (a
        member whose own vote round waits is sent to candidate in a peer's bigger term by
        each vote request of that peer's rounds, 30 to 55 a second)."""
        change = RoleChange(term, self.role, self.leader_id)
        if change == self._last_change:
            return
        self._last_change = change
        self._role_changes.append(change)
        log.info("%s: %s in term %d", self.self_id, change.role.value, term)

    def _leave_leadership(self) -> None:
        self.transferee = None
        self._beat_round = None
        self._dispatch = {}
        for index in self._acks:
            self._done.append(Ack(index, -1, ResponseCode.TERM_CHANGED))
        self._acks.clear()

    def _next_term(self) -> int:
        assert self.role is Role.CANDIDATE
        term = self.known_max_term if self.known_max_term > self.term else self.term + 1
        self._set_term(term, None)
        return term

    # -- the clock ---------------------------------------------------------------------------------

    def tick(self, now: float) -> list[Send]:
        """Run the timers due at ``now`` (DLedger's StateMaintainer, every 10 ms, and the
        pushers); the requests to send."""
        if self.role is Role.LEADER:
            sends = self._maintain_leader(now)
            sends += self._push(now)
            sends += self._transfer(now)
            self._expire_acks(now)
            return sends
        if self.role is Role.FOLLOWER:
            if now - self.last_leader_heartbeat > self._leak:
                self._to_candidate(self.term)
            return []
        return self._maintain_candidate(now)

    def next_due(self, now: float) -> float:
        """The milliseconds from ``now`` until :meth:`tick` next has something to do (0: at
        once), so that the shell sleeps until then unless a request, an answer or an append
        wakes it: an idle leader ticks at its heartbeats, its followers' COMMIT pushes and
        the timeouts it waits for (a push unanswered, an append unacknowledged, a transfer,
        the preferred-leader check), not every 10 ms.  The timers that compare with ``>``
        are due 1 ms after their bound."""
        if self.role is Role.FOLLOWER:
            due = self.last_leader_heartbeat + self._leak + 1
        elif self.role is Role.CANDIDATE:
            if self._vote_round is not None:
                due = self._vote_round.deadline
            elif self.need_increase_term:
                return 0.0
            else:
                due = self.next_vote_time
        else:
            due = self._leader_due(now)
        return max(0.0, due - now)

    def _leader_due(self, now: float) -> float:
        """When a leader's :meth:`tick` next has something to do (an absolute time)."""
        rnd = self._beat_round
        due = rnd.deadline if rnd is not None else self.last_send_heartbeat + self._hb + 1
        end = self.log.ledger_end_index
        for peer in self._dispatch.values():
            if peer.state is PushType.APPEND:
                if peer.write_index <= end and len(peer.pending) < MAX_PENDING_PUSHES:
                    return now
                waited = peer.pending.get(peer.match + 1)
                if waited is not None:
                    due = min(due, waited[0] + self.config.max_push_time_out_ms + 1)
                if peer.write_index > end and not peer.control_in_flight:
                    due = min(due, peer.last_commit_push + COMMIT_PUSH_INTERVAL_MS + 1)
            elif not peer.control_in_flight and not (
                peer.state is PushType.COMPARE and peer.compare_index == -1 and end == -1
            ):
                due = min(due, peer.retry_at)
        if self.transferee is not None:
            due = min(
                due, self._transfer_since + 3 * self.config.leadership_transfer_wait_timeout + 1
            )
            target = self._dispatch.get(self.transferee)
            if not self._transfer_asked and target is not None and target.match >= end:
                return now
        elif self._preferred and self.self_id not in self._preferred:
            due = min(due, self._last_preferred_check + PREFERRED_CHECK_MS)
        if self._acks:
            _, appended_at = next(iter(self._acks.values()))
            due = min(due, appended_at + self.config.max_wait_ack_time_ms + 1)
        return due

    def _maintain_candidate(self, now: float) -> list[Send]:
        if self._vote_round is not None:
            if now >= self._vote_round.deadline:
                self._parse_votes(now)
            return []
        if now < self.next_vote_time and not self.need_increase_term:
            return []
        if self.last_parse_result is ParseResult.WAIT_TO_VOTE_NEXT or self.need_increase_term:
            term = self._next_term()
            self.last_parse_result = ParseResult.WAIT_TO_REVOTE
        else:
            term = self.term
        if self.need_increase_term:
            self.next_vote_time = self._next_vote_time(now)
            self.need_increase_term = False
            return []
        deadline = now + VOTE_ROUND_BASE_MS + self.rng.randrange(self.config.max_vote_interval_ms)
        rnd = _VoteRound(term, deadline, set(self.others), known_max_term=term)
        self._vote_round = rnd
        request = VoteRequest(
            group=self.group,
            leader_id=self.self_id,
            term=term,
            ledger_end_index=self.log.ledger_end_index,
            ledger_end_term=self.log.ledger_end_term,
        )
        self._count_vote(rnd, self._judge_vote(attrs.evolve(request, remote_id=self.self_id), True))
        sends = [Send(pid, attrs.evolve(request, remote_id=pid)) for pid in self.others]
        if self._vote_round_over(rnd):
            self._parse_votes(now)
        return sends

    def _count_vote(self, rnd: _VoteRound, response: VoteResponse) -> None:
        result = response.vote_result
        if result is not VoteResult.UNKNOWN:
            rnd.valid += 1
        if result is VoteResult.ACCEPT:
            rnd.accepted += 1
        elif result is VoteResult.REJECT_ALREADY_HAS_LEADER:
            rnd.already_has_leader = True
        elif result in (
            VoteResult.REJECT_TERM_SMALL_THAN_LEDGER,
            VoteResult.REJECT_EXPIRED_VOTE_TERM,
        ):
            rnd.known_max_term = max(rnd.known_max_term, response.term)
        elif result in (
            VoteResult.REJECT_EXPIRED_LEDGER_TERM,
            VoteResult.REJECT_SMALL_LEDGER_END_INDEX,
        ):
            rnd.bigger_ledger += 1
        elif result is VoteResult.REJECT_TERM_NOT_READY:
            rnd.not_ready += 1

    def _vote_round_over(self, rnd: _VoteRound) -> bool:
        return (
            not rnd.waiting
            or rnd.already_has_leader
            or self.is_quorum(rnd.accepted)
            or self.is_quorum(rnd.accepted + rnd.not_ready)
        )

    def _parse_votes(self, now: float) -> None:
        rnd = self._vote_round
        assert rnd is not None
        self._vote_round = None
        if self.role is not Role.CANDIDATE or self.term != rnd.term:
            return
        vote_max = self.config.max_vote_interval_ms
        if rnd.known_max_term > rnd.term:
            result = ParseResult.WAIT_TO_VOTE_NEXT
            self.next_vote_time = self._next_vote_time(now)
            self._to_candidate(rnd.known_max_term)
        elif rnd.already_has_leader:
            result = ParseResult.WAIT_TO_REVOTE
            self.next_vote_time = self._next_vote_time(now) + self._leak
        elif not self.is_quorum(rnd.valid):
            result = ParseResult.WAIT_TO_REVOTE
            self.next_vote_time = self._next_vote_time(now)
        elif not self.is_quorum(rnd.valid - rnd.bigger_ledger):
            result = ParseResult.WAIT_TO_REVOTE
            self.next_vote_time = self._next_vote_time(now) + vote_max
        elif self.is_quorum(rnd.accepted):
            result = ParseResult.PASSED
        elif self.is_quorum(rnd.accepted + rnd.not_ready):
            result = ParseResult.REVOTE_IMMEDIATELY
        else:
            result = ParseResult.WAIT_TO_VOTE_NEXT
            self.next_vote_time = self._next_vote_time(now)
        self.last_parse_result = result
        if result is ParseResult.PASSED:
            self._to_leader(rnd.term, now)

    def _maintain_leader(self, now: float) -> list[Send]:
        rnd = self._beat_round
        if rnd is not None:
            if now >= rnd.deadline:
                self._parse_beats(now)
            return []
        if now - self.last_send_heartbeat <= self._hb:
            return []
        self.last_send_heartbeat = now
        self._beat_round = _BeatRound(self.term, now + self._hb, set(self.others))
        if not self.others:
            self._parse_beats(now)
            return []
        return [
            Send(
                pid,
                HeartBeatRequest(
                    group=self.group,
                    local_id=self.self_id,
                    remote_id=pid,
                    leader_id=self.self_id,
                    term=self.term,
                ),
            )
            for pid in self.others
        ]

    # -- leadership transfer (DLedgerServer.checkPreferredLeader, handleLeadershipTransfer) -----

    def _transfer(self, now: float) -> list[Send]:
        """Once a second a leader that is not a preferred leader picks the preferred member
        least behind (less than ``maxLeadershipTransferWaitIndex`` entries, and known to the
        pushes of this term) and stops taking appends; once that member has every entry it is
        asked to take the leadership over (LEADERSHIP_TRANSFER).  A transfer not done within
        ``leadershipTransferWaitTimeout`` x 3 is given up, and appends resume."""
        if self.transferee is not None:
            if now - self._transfer_since > 3 * self.config.leadership_transfer_wait_timeout:
                self.transferee = None
                return []
            peer = self._dispatch.get(self.transferee)
            end = self.log.ledger_end_index
            if self._transfer_asked or peer is None or peer.match < end:
                return []
            self._transfer_asked = True
            request = LeadershipTransferRequest(
                group=self.group,
                local_id=self.self_id,
                remote_id=self.transferee,
                leader_id=self.self_id,
                term=self.term,
                transfer_id=self.self_id,
                transferee_id=self.transferee,
                take_leadership_ledger_index=end,
            )
            return [Send(self.transferee, request)]
        if not self._preferred or self.self_id in self._preferred:
            return []
        if now - self._last_preferred_check < PREFERRED_CHECK_MS:
            return []
        self._last_preferred_check = now
        end = self.log.ledger_end_index
        behind = {
            pid: end - self._dispatch[pid].match
            for pid in self._preferred
            if pid in self._dispatch and self._dispatch[pid].match >= 0
        }
        if not behind:
            return []
        pid = min(behind, key=lambda p: behind[p])
        if behind[pid] >= self.config.max_leadership_transfer_wait_index:
            return []
        self.transferee, self._transfer_since, self._transfer_asked = pid, now, False
        return []

    def _on_transfer(self, request: LeadershipTransferRequest, response: Message | None) -> None:
        if self.role is not Role.LEADER or request.term != self.term:
            return
        if response is None or response.code != ResponseCode.SUCCESS.value:
            self.transferee = None  # appends resume; tried again at a later check

    def _take_leadership(self, request: LeadershipTransferRequest) -> LeadershipTransferResponse:
        """As the transferee: stand at once in the next term, with the take-leadership vote
        intervals (DLedgerLeaderElector.handleTakeLeadership).  Answered at once: SUCCESS once
        the campaign has started (DLedger answers when it is decided)."""
        answer = LeadershipTransferResponse()
        self._base(answer, request)
        if request.transferee_id != self.self_id:
            answer.code = ResponseCode.UNEXPECTED_ARGUMENT.value
        elif request.term != self.term:
            answer.code = ResponseCode.INCONSISTENT_TERM.value
        elif self.log.ledger_end_index < request.take_leadership_ledger_index:
            answer.code = ResponseCode.TAKE_LEADERSHIP_FAILED.value
        else:
            self.term_to_take_leadership = request.term + 1
            self._to_candidate(request.term + 1)
            self.need_increase_term = True
        answer.term = self.term
        return answer

    def _parse_beats(self, now: float) -> None:
        rnd = self._beat_round
        assert rnd is not None
        self._beat_round = None
        if self.role is not Role.LEADER or self.term != rnd.term:
            return
        if self.is_quorum(rnd.succ):
            self.last_succ_heartbeat = now
        elif self.is_quorum(rnd.succ + rnd.not_ready):
            self.last_send_heartbeat = -1.0
        elif rnd.max_term > rnd.term:
            self._to_candidate(rnd.max_term)
        elif rnd.inconsistent_leader or now - self.last_succ_heartbeat > self._leak:
            self._to_candidate(rnd.term)

    # -- answers to our requests ---------------------------------------------------------------

    def on_response(
        self, peer: str, request: Message, response: Message | None, now: float
    ) -> list[Send]:
        """An answer (``None``: a network error or a timeout) to a request from :meth:`tick`."""
        if isinstance(request, VoteRequest):
            self._on_vote(peer, request, response, now)
        elif isinstance(request, HeartBeatRequest):
            self._on_beat(peer, request, response, now)
        elif isinstance(request, LeadershipTransferRequest):
            self._on_transfer(request, response)
        elif isinstance(request, PushEntryRequest):
            self._on_push(peer, request, response, now)
            return self._push(now)
        return []

    def _on_vote(
        self, peer: str, request: VoteRequest, response: Message | None, now: float
    ) -> None:
        rnd = self._vote_round
        if rnd is None or rnd.term != request.term or peer not in rnd.waiting:
            return
        rnd.waiting.discard(peer)
        vote = response if isinstance(response, VoteResponse) else VoteResponse()
        self._count_vote(rnd, vote)
        if self._vote_round_over(rnd):
            self._parse_votes(now)

    def _on_beat(
        self, peer: str, request: HeartBeatRequest, response: Message | None, now: float
    ) -> None:
        rnd = self._beat_round
        if rnd is None or rnd.term != request.term or peer not in rnd.waiting:
            return
        rnd.waiting.discard(peer)
        code = ResponseCode.of(response.code) if response is not None else ResponseCode.UNKNOWN
        if code is ResponseCode.SUCCESS:
            rnd.succ += 1
        elif code is ResponseCode.EXPIRED_TERM and response is not None:
            rnd.max_term = max(rnd.max_term, response.term)
        elif code is ResponseCode.INCONSISTENT_LEADER:
            rnd.inconsistent_leader = True
        elif code is ResponseCode.TERM_NOT_READY:
            rnd.not_ready += 1
        if not rnd.waiting or self.is_quorum(rnd.succ) or self.is_quorum(rnd.succ + rnd.not_ready):
            self._parse_beats(now)

    # -- requests from peers ---------------------------------------------------------------------

    def handle(self, request: Message, now: float) -> Message:
        """The answer to a peer's request, as DLedgerServer gives it (an APPEND goes to
        :meth:`append_request` instead: its answer waits for the commit)."""
        if isinstance(request, AppendEntryRequest):
            raise TypeError("an APPEND is answered through append_request and take_acks")
        if isinstance(request, PullEntriesRequest):
            return self._base(PullEntriesResponse(code=ResponseCode.UNSUPPORTED.value), request)
        if request.remote_id != self.self_id or request.group != self.group:
            code = (
                ResponseCode.UNKNOWN_MEMBER
                if request.remote_id != self.self_id
                else ResponseCode.UNKNOWN_GROUP
            )
            answer = _RESPONSE_OF[type(request)]()
            self._base(answer, request)
            answer.code, answer.leader_id = code.value, self.leader_id
            return answer
        if isinstance(request, VoteRequest):
            return self._judge_vote(request, False, now)
        if isinstance(request, HeartBeatRequest):
            return self._on_heartbeat(request, now)
        if isinstance(request, PushEntryRequest):
            return self._on_push_request(request)
        if isinstance(request, MetadataRequest):
            return MetadataResponse(
                group=self.group, peers=dict(self.peers), leader_id=self.leader_id
            )
        if isinstance(request, GetEntriesRequest):
            return self._client_get(request)
        assert isinstance(request, LeadershipTransferRequest)
        return self._take_leadership(request)

    def _may_take_over(self, candidate: str) -> bool:
        """A candidate a live leader does not shield against: the member this leader hands
        over to, or a preferred leader (the member a leader hands over to)."""
        return candidate == self.transferee or candidate in self._preferred

    def _sticky(self, now: float) -> bool:
        """Whether this member has a live leader (Raft's leader stickiness)."""
        if self.role is Role.LEADER:
            return now - self.last_succ_heartbeat < self._sticky_ms
        return self.role is Role.FOLLOWER and now - self.last_leader_heartbeat < self._sticky_ms

    def _judge_vote(self, request: VoteRequest, self_vote: bool, now: float = 0.0) -> VoteResponse:
        def answer(result: VoteResult, term: int | None = None) -> VoteResponse:
            response = self._base(VoteResponse(vote_result=result), request)
            assert isinstance(response, VoteResponse)
            response.term = self.term if term is None else term
            return response

        candidate = request.leader_id
        if candidate is None or candidate not in self.peers:
            return answer(VoteResult.REJECT_UNKNOWN_LEADER)
        if not self_vote and candidate == self.self_id:
            return answer(VoteResult.REJECT_UNEXPECTED_LEADER)
        if request.ledger_end_term < self.log.ledger_end_term:
            return answer(VoteResult.REJECT_EXPIRED_LEDGER_TERM)
        if (
            request.ledger_end_term == self.log.ledger_end_term
            and request.ledger_end_index < self.log.ledger_end_index
        ):
            return answer(VoteResult.REJECT_SMALL_LEDGER_END_INDEX)
        if request.term < self.term:
            return answer(VoteResult.REJECT_EXPIRED_VOTE_TERM)
        if request.term == self.term:
            if self.vote_for is not None and self.vote_for != candidate:
                if self.leader_id is not None:
                    return answer(VoteResult.REJECT_ALREADY_HAS_LEADER)
                return answer(VoteResult.REJECT_ALREADY_VOTED)
        else:
            if not self_vote and self._sticky(now) and not self._may_take_over(candidate):
                return answer(VoteResult.REJECT_ALREADY_HAS_LEADER)
            self._to_candidate(request.term)
            self.need_increase_term = True
            return answer(VoteResult.REJECT_TERM_NOT_READY)
        if request.term < self.log.ledger_end_term:
            return answer(VoteResult.REJECT_TERM_SMALL_THAN_LEDGER, self.log.ledger_end_term)
        self._set_term(self.term, candidate)
        return answer(VoteResult.ACCEPT)

    def _on_heartbeat(self, request: HeartBeatRequest, now: float) -> HeartBeatResponse:
        leader = request.leader_id
        if leader is None or leader not in self.peers:
            return HeartBeatResponse(term=self.term, code=ResponseCode.UNKNOWN_MEMBER.value)
        if leader == self.self_id:
            return HeartBeatResponse(term=self.term, code=ResponseCode.UNEXPECTED_MEMBER.value)
        if request.term < self.term:
            return HeartBeatResponse(term=self.term, code=ResponseCode.EXPIRED_TERM.value)
        if request.term == self.term:
            if self.leader_id is None:
                self._to_follower(request.term, leader, now)
                return HeartBeatResponse()
            if leader == self.leader_id:
                self.last_leader_heartbeat = now
                return HeartBeatResponse()
            return HeartBeatResponse(code=ResponseCode.INCONSISTENT_LEADER.value)
        self._to_candidate(request.term)
        self.need_increase_term = True
        return HeartBeatResponse(code=ResponseCode.TERM_NOT_READY.value)

    # -- follower: pushes ------------------------------------------------------------------------

    def _push_answer(self, request: PushEntryRequest, code: ResponseCode) -> PushEntryResponse:
        response = PushEntryResponse(group=request.group, code=code.value, term=request.term)
        if request.type is not PushType.COMMIT:
            response.index = request.first_entry_index
            response.count = request.count
        response.begin_index = self.log.ledger_begin_index
        response.end_index = self.log.ledger_end_index
        return response

    def _on_push_request(self, request: PushEntryRequest) -> PushEntryResponse:
        if request.type is not PushType.COMMIT and not request.entries():
            return self._push_answer(request, ResponseCode.UNEXPECTED_ARGUMENT)
        if self.role is not Role.FOLLOWER:
            return self._push_answer(request, ResponseCode.NOT_FOLLOWER)
        if request.term != self.term or request.leader_id != self.leader_id:
            return self._push_answer(request, ResponseCode.INCONSISTENT_STATE)
        try:
            if request.type is PushType.APPEND:
                last = self._follow_append(request.entries())
            elif request.type is PushType.COMPARE:
                assert request.entry is not None
                last = self._follow_compare(request.entry)
            elif request.type is PushType.TRUNCATE:
                assert request.entry is not None
                self.log.truncate(request.entry)
                last = request.entry.index
            else:
                last = -1
        except DLedgerError:
            return self._push_answer(request, ResponseCode.INCONSISTENT_STATE)
        self._leader_match = max(self._leader_match, last)
        self.log.update_committed_index(min(request.commit_index, self._leader_match))
        return self._push_answer(request, ResponseCode.SUCCESS)

    def _follow_append(self, entries: list[DLedgerEntry]) -> int:
        held = 0
        for entry in entries:  # those it holds already must be the same
            if entry.index > self.log.ledger_end_index:
                break
            if not entry.same_as(self.log.get(entry.index)):
                raise DLedgerError(ResponseCode.INCONSISTENT_STATE, "differs")
            held += 1
        if held < len(entries):
            self.log.append_run_as_follower(entries[held:])  # a gap: INCONSISTENT_INDEX
        return entries[-1].index

    def _follow_compare(self, entry: DLedgerEntry) -> int:
        if not entry.same_as(self.log.get(entry.index)):
            # An entry named committed here that is not the leader's did not survive a crash
            # whole (0.2.6 writes no CRC: recovery keeps a body torn behind a whole header,
            # and the checkpoint's committedIndex may cover it): no longer committed, so that
            # the leader's TRUNCATE replaces it, as 0.2.6's follower's would.
            self.log.distrust_committed_from(entry.index)
            raise DLedgerError(ResponseCode.INCONSISTENT_STATE, "differs")
        # the logs agree up to here; whatever follows may not (the leader truncates it)
        return entry.index if entry.index == self.log.ledger_end_index else -1

    # -- leader: pushes --------------------------------------------------------------------------

    def _push_request(
        self,
        peer: str,
        kind: PushType,
        entry: DLedgerEntry | None,
        batch: list[DLedgerEntry] | None = None,
    ) -> Send:
        return Send(
            peer,
            PushEntryRequest(
                group=self.group,
                remote_id=peer,
                leader_id=self.self_id,
                term=self.term,
                entry=entry,
                batch_entry=batch if batch is not None else [],
                type=kind,
                commit_index=self.log.committed_index,
            ),
        )

    def _append_push(self, peer: str, first: int, last: int) -> Send:
        """An APPEND of the entries ``first`` .. ``last``: one entry as ``entry``, more as a
        batch (``batchEntry``: 0.2.6's batch push, which its follower takes whatever its own
        ``enableBatchPush`` says)."""
        if first == last:
            return self._push_request(peer, PushType.APPEND, self.log.get(first))
        batch = [self.log.get(i) for i in range(first, last + 1)]
        return self._push_request(peer, PushType.APPEND, None, batch)

    def _push(self, now: float) -> list[Send]:
        if self.role is not Role.LEADER:
            return []
        sends: list[Send] = []
        end = self.log.ledger_end_index
        for pid, peer in self._dispatch.items():
            if peer.state is PushType.APPEND:
                sends += self._push_append(pid, peer, end, now)
            elif not peer.control_in_flight and now >= peer.retry_at:
                if peer.state is PushType.COMPARE:
                    if peer.compare_index == -1 and end == -1:
                        continue
                    if not self.log.ledger_begin_index <= peer.compare_index <= end:
                        peer.compare_index = end
                    entry = self.log.get(peer.compare_index)
                else:
                    entry = self.log.get(peer.compare_index)
                peer.control_in_flight = True
                sends.append(self._push_request(pid, peer.state, entry))
        self._advance_commit()
        return sends

    def _push_append(self, pid: str, peer: _Peer, end: int, now: float) -> list[Send]:
        """DLedger's doBatchAppend for one follower: the entries not yet pushed go out in
        batches (each up to :data:`PUSH_BATCH_BYTES`), at most :data:`MAX_PENDING_PUSHES`
        pushes in flight; the push the follower's water mark waits for is re-sent after
        ``maxPushTimeOutMs`` without an answer; an idle follower gets a COMMIT each second."""
        pending = peer.pending
        while pending:  # in index order: drop the pushes the follower has answered
            first = next(iter(pending))
            if pending[first][1] > peer.match:
                break
            del pending[first]
        limit = min(max(PUSH_BATCH_BYTES, self.config.max_batch_push_size), MAX_ENTRY_SIZE)
        sends: list[Send] = []
        while peer.write_index <= end and len(pending) < MAX_PENDING_PUSHES:
            first = last = peer.write_index
            size = self.log.get(first).size
            while last < end and size < limit and last - first + 1 < MAX_BATCH_ENTRIES:
                last += 1
                size += self.log.get(last).size
            pending[first] = (now, last)
            sends.append(self._append_push(pid, first, last))
            peer.write_index = last + 1
        waited = pending.get(peer.match + 1)
        if waited is not None and now - waited[0] > self.config.max_push_time_out_ms:
            pending[peer.match + 1] = (now, waited[1])
            sends.append(self._append_push(pid, peer.match + 1, waited[1]))
        if (
            peer.write_index > end
            and not peer.control_in_flight
            and now - peer.last_commit_push > COMMIT_PUSH_INTERVAL_MS
        ):
            peer.last_commit_push = now
            peer.control_in_flight = True
            sends.append(self._push_request(pid, PushType.COMMIT, None))
        return sends

    def _to_state(self, peer: _Peer, index: int, state: PushType) -> None:
        peer.state = state
        if state is PushType.APPEND:
            peer.compare_index = -1
            peer.match = max(peer.match, index)
            peer.write_index = index + 1
            peer.pending.clear()
        elif state is PushType.COMPARE:
            peer.compare_index = -1
            peer.pending.clear()
        else:
            peer.compare_index = index

    def _on_push(
        self, pid: str, request: PushEntryRequest, response: Message | None, now: float
    ) -> None:
        peer = self._dispatch.get(pid)
        if self.role is not Role.LEADER or peer is None or request.term != self.term:
            return
        if request.type is not PushType.APPEND:
            peer.control_in_flight = False
        code = ResponseCode.of(response.code) if response is not None else ResponseCode.UNKNOWN
        if request.type is PushType.APPEND:
            if peer.state is not PushType.APPEND:
                return
            if code is ResponseCode.SUCCESS:
                peer.pending.pop(request.first_entry_index, None)
                peer.match = max(peer.match, request.last_entry_index)
            elif code is ResponseCode.INCONSISTENT_STATE:
                self._to_state(peer, -1, PushType.COMPARE)
            return
        if request.type is PushType.COMMIT:
            return
        if not isinstance(response, PushEntryResponse) or code not in (
            ResponseCode.SUCCESS,
            ResponseCode.INCONSISTENT_STATE,
        ):
            self._to_state(peer, -1, PushType.COMPARE)
            peer.retry_at = now + PUSH_RETRY_MS
            return
        if request.type is PushType.TRUNCATE:
            if peer.state is PushType.TRUNCATE and code is ResponseCode.SUCCESS:
                self._to_state(peer, peer.compare_index, PushType.APPEND)
            else:
                self._to_state(peer, -1, PushType.COMPARE)
                peer.retry_at = now + PUSH_RETRY_MS
            return
        if peer.state is not PushType.COMPARE:
            return
        self._compared(peer, code, response)

    def _compared(self, peer: _Peer, code: ResponseCode, response: PushEntryResponse) -> None:
        """DLedger's doCompare after one answer: agree (APPEND), or look further back, or
        truncate the follower."""
        begin, end = self.log.ledger_begin_index, self.log.ledger_end_index
        truncate_index = -1
        if code is ResponseCode.SUCCESS:
            if peer.compare_index == response.end_index:
                self._to_state(peer, peer.compare_index, PushType.APPEND)
                return
            truncate_index = peer.compare_index
        elif (
            response.end_index < begin
            or response.begin_index > end
            or peer.compare_index < response.begin_index
        ):
            truncate_index = begin
        elif peer.compare_index > response.end_index:
            peer.compare_index = response.end_index
        else:
            peer.compare_index -= 1
        if peer.compare_index < begin:
            truncate_index = begin
        if truncate_index != -1:
            self._to_state(peer, truncate_index, PushType.TRUNCATE)

    def _advance_commit(self) -> None:
        marks = [self.log.ledger_end_index] + [p.match for p in self._dispatch.values()]
        marks.sort(reverse=True)
        quorum_index = marks[len(marks) // 2]
        if quorum_index <= self.log.committed_index or quorum_index < 0:
            return
        self.log.update_committed_index(quorum_index)
        committed, acks = self.log.committed_index, self._acks
        while acks:  # appended in index order
            index = next(iter(acks))
            if index > committed:
                break
            del acks[index]
            self._done.append(Ack(index, self.log.get(index).pos, ResponseCode.SUCCESS))

    # -- appends ---------------------------------------------------------------------------------

    def append(self, body: bytes, now: float) -> DLedgerEntry:
        """Append ``body`` as the leader; DLedgerError NOT_LEADER (also once the leader has
        gone ``maxHeartBeatLeak`` heartbeats without a quorum), LEADER_PENDING_FULL, or the
        store's.  Its outcome comes from :meth:`take_acks`."""
        self.check_appendable(1, now)
        entry = self.log.append_as_leader(body, self.term)
        self._acks[entry.index] = (self.term, now)
        if not self.others:
            self._advance_commit()
        return entry

    def next_entry(self, now: float) -> tuple[int, int]:
        """The index and term the next entry appended here takes (an encoder writes them
        into its header: :meth:`append_encoded`); DLedgerError as :meth:`check_appendable`
        when not even one entry can be appended now."""
        self.check_appendable(1, now)
        return self.log.ledger_end_index + 1, self.term

    def append_encoded(
        self, data: bytes | memoryview, entries: list[DLedgerEntry], now: float
    ) -> None:
        """:meth:`append` of ``entries`` (their indexes and term :meth:`next_entry`'s, in
        order), encoded by the caller as ``data``, written together; refused whole
        (DLedgerError, nothing written) when they cannot all be appended now.  Each one's
        outcome comes from :meth:`take_acks`."""
        self.check_appendable(len(entries), now)
        if entries[0].term != self.term:
            raise DLedgerError(
                ResponseCode.INCONSISTENT_TERM, f"term {entries[0].term} where {self.term} leads"
            )
        self.log.append_encoded_as_leader(data, entries)
        acks, term = self._acks, self.term
        for entry in entries:
            acks[entry.index] = (term, now)
        if not self.others:
            self._advance_commit()

    def check_appendable(self, count: int, now: float) -> None:
        """DLedgerError unless ``count`` entries can be appended here now: NOT_LEADER (also
        once the leader has gone ``maxHeartBeatLeak`` heartbeats without a quorum),
        LEADER_TRANSFERRING while it hands the leadership over, LEADER_PENDING_FULL beyond
        ``maxPendingRequestsNum`` waiting."""
        if self.role is not Role.LEADER or now - self.last_succ_heartbeat > self._leak:
            raise DLedgerError(ResponseCode.NOT_LEADER, f"{self.self_id} does not lead")
        if self.transferee is not None:
            raise DLedgerError(
                ResponseCode.LEADER_TRANSFERRING, f"handing the leadership to {self.transferee}"
            )
        if len(self._acks) + count > self.config.max_pending_requests_num:
            raise DLedgerError(ResponseCode.LEADER_PENDING_FULL, "too many appends waiting")

    def _expire_acks(self, now: float) -> None:
        limit = self.config.max_wait_ack_time_ms
        for index, (_, at) in list(self._acks.items()):
            if now - at > limit:
                del self._acks[index]
                self._done.append(Ack(index, -1, ResponseCode.WAIT_QUORUM_ACK_TIMEOUT))

    def match_indexes(self) -> dict[str, int]:
        """A leader's view of each follower: the last index known to match its log (-1 until
        a comparison found it); empty unless leading."""
        return {pid: peer.match for pid, peer in self._dispatch.items()}

    def take_role_changes(self) -> list[RoleChange]:
        """The roles taken since the last call, in order (what RocketMQ's
        DLedgerRoleChangeHandler acts on: a LEADER registers as the group's master)."""
        changes, self._role_changes = self._role_changes, []
        return changes

    def take_acks(self) -> list[Ack]:
        """The appends decided since the last call."""
        done, self._done = self._done, []
        return done

    def append_request(
        self, request: AppendEntryRequest, now: float
    ) -> DLedgerEntry | AppendEntryResponse:
        """A client's APPEND: the entry appended (answer SUCCESS with its index and position
        once :meth:`take_acks` says so), or the answer refusing it now."""
        response = AppendEntryResponse(group=self.group, term=self.term, leader_id=self.leader_id)
        if request.remote_id != self.self_id:
            response.code = ResponseCode.UNKNOWN_MEMBER.value
        elif request.group != self.group:
            response.code = ResponseCode.UNKNOWN_GROUP.value
        elif not request.body:
            response.code = ResponseCode.REQUEST_WITH_EMPTY_BODYS.value
        else:
            try:
                return self.append(request.body, now)
            except DLedgerError as exc:
                response.code = exc.code.value
        return response

    def _client_get(self, request: GetEntriesRequest) -> GetEntriesResponse:
        response = GetEntriesResponse(group=self.group, leader_id=self.leader_id)
        if self.role is not Role.LEADER:
            response.code = ResponseCode.NOT_LEADER.value
        elif request.begin_index is None:
            response.code = ResponseCode.UNEXPECTED_ARGUMENT.value
        else:
            try:
                response.entries = [self.log.get(request.begin_index)]
            except DLedgerError as exc:
                response.code = exc.code.value
        return response


_RESPONSE_OF: dict[type[Message], type[Message]] = {
    VoteRequest: VoteResponse,
    HeartBeatRequest: HeartBeatResponse,
    PushEntryRequest: PushEntryResponse,
    MetadataRequest: MetadataResponse,
    AppendEntryRequest: AppendEntryResponse,
    GetEntriesRequest: GetEntriesResponse,
    LeadershipTransferRequest: LeadershipTransferResponse,
}
