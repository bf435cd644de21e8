"""pymq.dledger.raft driven deterministically (tests/dledger_sim.py: virtual time, every
message through DLedger's JSON, cut links, stopped nodes), with the invariants checked after
every 10 ms step: one leader per term, committed entries never change."""

from __future__ import annotations

import logging
import random

import attrs
import pytest

from pymq.dledger.config import DLedgerConfig
from pymq.dledger.errors import DLedgerError, ResponseCode
from pymq.dledger.protocol import (
    HeartBeatRequest,
    PullEntriesRequest,
    PushEntryRequest,
    PushType,
    VoteRequest,
    VoteResult,
)
from pymq.dledger.raft import PUSH_BATCH_BYTES, RaftNode, Role, RoleChange
from pymq.dledger.store import DLedgerFileStore, persist_term
from tests.dledger_sim import Sim


def _settled(sim: Sim) -> bool:
    leaders = sim.leaders()
    if len(leaders) != 1:
        return False
    leader = sim.nodes[leaders[0]]
    return all(
        n.role is Role.FOLLOWER and n.leader_id == leaders[0] and n.term == leader.term
        for pid, n in sim.nodes.items()
        if pid != leaders[0] and all(sim.link(pid, o) for o in sim.nodes)
    )


def _elect(sim: Sim, within_ms: float = 15_000) -> RaftNode:
    assert sim.run(within_ms, until=lambda: _settled(sim)), [
        (pid, n.role, n.term) for pid, n in sim.nodes.items()
    ]
    return sim.leader()


def _entries(node: RaftNode) -> list[tuple[int, bytes]]:
    log = node.log
    return [(log.get(i).term, log.get(i).body) for i in range(log.ledger_end_index + 1)]


def test_one_leader_is_elected_among_three(tmp_path) -> None:
    sim = Sim(tmp_path)
    leader = _elect(sim)
    assert sim.now < 10_000
    sim.run(20_000)  # and it stays: heartbeats keep the followers
    assert sim.leader() is leader and leader.term == max(sim.leaders_by_term)


@pytest.mark.parametrize("seed", range(5))
def test_elections_are_deterministic_and_always_single(tmp_path, seed) -> None:
    one = Sim(tmp_path / "a", seed=seed)
    two = Sim(tmp_path / "b", seed=seed)
    _elect(one)
    _elect(two)
    assert (one.now, one.leaders(), one.leader().term) == (
        two.now,
        two.leaders(),
        two.leader().term,
    )


def test_a_new_leader_after_the_leader_stops_and_nothing_committed_is_lost(tmp_path) -> None:
    sim = Sim(tmp_path)
    old = _elect(sim)
    for i in range(50):
        sim.append(b"m%d" % i)
    assert sim.run(3000, until=lambda: old.log.committed_index == 49)
    stopped_at = sim.now
    sim.stop(old.self_id)
    new = _elect(sim)
    # a follower gives up after 3 heartbeats (6 s), then one or two vote rounds
    assert new is not old and new.term > old.term
    assert sim.now - stopped_at < 12_000
    assert new.log.ledger_end_index >= 49
    assert [new.log.get(i).body for i in range(50)] == [b"m%d" % i for i in range(50)]
    index = sim.append(b"after")
    assert sim.run(3000, until=lambda: new.log.committed_index >= index)
    # the old leader restarts from its files and follows
    back = sim.start(old.self_id)
    assert sim.run(15_000, until=lambda: back.log.committed_index >= index)
    assert _entries(back) == _entries(new)


def test_an_isolated_node_keeps_its_term_and_rejoins_without_an_election(tmp_path) -> None:
    sim = Sim(tmp_path)
    leader = _elect(sim)
    term = leader.term
    follower = next(n for n in sim.nodes.values() if n is not leader)
    sim.isolate(follower.self_id)
    sim.run(60_000)
    # DLedger's rule: a round that no quorum answered ends WAIT_TO_REVOTE, the term stays
    assert follower.role is Role.CANDIDATE and follower.term == term
    assert sim.leader() is leader and leader.term == term
    sim.heal()
    assert sim.run(10_000, until=lambda: follower.role is Role.FOLLOWER)
    assert follower.leader_id == leader.self_id and follower.term == term
    assert sim.leader() is leader and max(sim.leaders_by_term) == term


@pytest.mark.parametrize("sticky", [True, False])
def test_a_node_back_with_a_bigger_term_does_not_depose_the_leader(
    tmp_path, monkeypatch, sticky
) -> None:
    """An idle group (every log equal), so DLedger's ledger check does not stop the vote:
    pymq's leader stickiness does.  The control (stickiness off) shows the test can fail."""
    if not sticky:
        monkeypatch.setattr(RaftNode, "_sticky", lambda self, now: False)
    sim = Sim(tmp_path)
    leader = _elect(sim)
    term = leader.term
    other = next(n for n in sim.nodes.values() if n is not leader)
    sim.stop(other.self_id)
    persist_term(sim.configs[other.self_id].default_path, term + 5, None)
    sim.run(1000)
    sim.start(other.self_id)
    sim.run(30_000)
    if sticky:
        assert sim.leader() is leader and leader.term == term
        assert max(sim.leaders_by_term) == term
    else:
        assert max(sim.leaders_by_term) > term  # deposed: a new election at the bigger term


def test_a_leader_that_loses_its_majority_steps_down_and_its_tail_is_truncated(tmp_path) -> None:
    sim = Sim(tmp_path)
    old = _elect(sim)
    for i in range(10):
        sim.append(b"kept-%d" % i)
    assert sim.run(3000, until=lambda: old.log.committed_index == 9)
    sim.isolate(old.self_id)
    lost = [old.append(b"lost-%d" % i, sim.now) for i in range(5)]
    sim.run(3 * 2000 + 2 * 2000)  # maxHeartBeatLeak heartbeats, and the round that sees it
    assert old.role is Role.CANDIDATE
    with pytest.raises(DLedgerError) as info:
        old.append(b"refused", sim.now)
    assert info.value.code == ResponseCode.NOT_LEADER
    codes = {a.index: a.code for a in sim.acks if a.index >= 10}
    assert sorted(codes) == [e.index for e in lost]  # each answered once, none SUCCESS
    assert set(codes.values()) <= {ResponseCode.WAIT_QUORUM_ACK_TIMEOUT, ResponseCode.TERM_CHANGED}
    assert old.log.committed_index == 9
    # the other two elect a leader and go on
    new = _elect(sim)
    assert new is not old
    for i in range(7):
        sim.append(b"new-%d" % i)
    assert sim.run(3000, until=lambda: new.log.committed_index == 16)
    sim.heal()
    assert sim.run(20_000, until=lambda: old.log.committed_index == 16)
    assert old.role is Role.FOLLOWER
    assert _entries(old) == _entries(new)  # the five lost entries were truncated
    assert [b for _, b in _entries(old)][10:] == [b"new-%d" % i for i in range(7)]


def test_commit_needs_a_majority(tmp_path) -> None:
    sim = Sim(tmp_path)
    leader = _elect(sim)
    a, b = (pid for pid in sim.ids if pid != leader.self_id)
    sim.cut |= {frozenset((leader.self_id, a)), frozenset((leader.self_id, b))}
    index = leader.append(b"alone", sim.now).index
    sim.run(1500)
    assert leader.log.committed_index == index - 1  # one copy of three
    sim.cut.discard(frozenset((leader.self_id, a)))
    assert sim.run(3000, until=lambda: leader.log.committed_index == index)
    assert sim.nodes[a].log.ledger_end_index == index


def test_older_terms_entries_commit_by_the_new_terms_water_marks(tmp_path) -> None:
    """DLedger 0.2.6's rule, which RocketMQ's role change relies on: a new leader commits its
    predecessor's uncommitted entries once a majority agrees in its own term, with no write
    of its own (else an idle group's new leader would never become the broker's master)."""
    sim = Sim(tmp_path)
    old = _elect(sim)
    index = old.append(b"of the old term", sim.now).index
    # replicated to the followers, but no push has told them the new commit index yet
    assert sim.run(
        100, until=lambda: all(n.log.ledger_end_index == index for n in sim.nodes.values())
    )
    assert all(n.log.committed_index < index for n in sim.nodes.values() if n is not old)
    sim.stop(old.self_id)
    new = _elect(sim)
    assert new.term > old.term
    assert sim.run(3000, until=lambda: new.log.committed_index == index)
    assert new.log.ledger_end_index == index  # nothing of its own term was needed


def test_a_follower_with_a_divergent_tail_is_compared_back_and_truncated(tmp_path) -> None:
    sim = Sim(tmp_path)
    leader = _elect(sim)
    for i in range(5):
        sim.append(b"common-%d" % i)
    assert sim.run(3000, until=lambda: all(n.log.committed_index == 4 for n in sim.nodes.values()))
    follower = next(n for n in sim.nodes.values() if n is not leader)
    # a tail the leader does not have (written behind the node's back: same term, other
    # bodies, so that only the comparison of whole entries finds where the logs part)
    store = follower.log
    assert isinstance(store, DLedgerFileStore)
    for i in range(6):
        store.append_as_leader(b"divergent-%d" % i, leader.term)
    for i in range(3):
        sim.append(b"leader-%d" % i)
    assert sim.run(10_000, until=lambda: follower.log.committed_index == 7)
    assert _entries(follower) == _entries(leader)


def test_requests_for_another_member_or_group_are_refused(tmp_path) -> None:
    sim = Sim(tmp_path)
    leader = _elect(sim)
    node = sim.nodes["n0"]
    beat = HeartBeatRequest(group="g", remote_id="n9", leader_id=leader.self_id, term=leader.term)
    assert node.handle(beat, sim.now).code == ResponseCode.UNKNOWN_MEMBER
    beat.remote_id, beat.group = "n0", "other"
    assert node.handle(beat, sim.now).code == ResponseCode.UNKNOWN_GROUP
    vote = VoteRequest(group="g", remote_id="n0", leader_id="stranger", term=99)
    answer = node.handle(vote, sim.now)
    assert answer.vote_result is VoteResult.REJECT_UNKNOWN_LEADER and node.term == leader.term
    pull = PullEntriesRequest(group="g", remote_id="n0")
    assert node.handle(pull, sim.now).code == ResponseCode.UNSUPPORTED
    empty = PushEntryRequest(group="g", remote_id="n0", leader_id=leader.self_id, term=leader.term)
    assert node.handle(empty, sim.now).code == ResponseCode.UNEXPECTED_ARGUMENT
    commit = PushEntryRequest(
        group="g", remote_id="n0", leader_id="n9", term=leader.term, type=PushType.COMMIT
    )
    assert node.handle(commit, sim.now).code in (
        ResponseCode.INCONSISTENT_STATE,
        ResponseCode.NOT_FOLLOWER,
    )


def test_a_vote_is_judged_ledger_first_as_dledger_does(tmp_path) -> None:
    config = DLedgerConfig(
        group="g",
        self_id="n0",
        peers="n0-h:1;n1-h:2;n2-h:3",
        store_base_dir=str(tmp_path),
        mapped_file_size_for_entry_data=4096,
        mapped_file_size_for_entry_index=320,
    )
    store = DLedgerFileStore(config)
    store.open()
    for _ in range(3):
        store.append_as_leader(b"x", 2)
    persisted: list[tuple[int, str | None]] = []
    node = RaftNode(
        config,
        store,
        rng=random.Random(0),
        now=0,
        term=4,
        persist_term=lambda t, v: persisted.append((t, v)),
    )

    def vote(term: int, end_term: int, end_index: int, who: str = "n1") -> VoteResult:
        request = VoteRequest(
            group="g",
            remote_id="n0",
            leader_id=who,
            term=term,
            ledger_end_term=end_term,
            ledger_end_index=end_index,
        )
        return node.handle(request, 0).vote_result

    assert vote(9, 1, 50) is VoteResult.REJECT_EXPIRED_LEDGER_TERM  # before the term
    assert vote(9, 2, 1) is VoteResult.REJECT_SMALL_LEDGER_END_INDEX
    assert node.term == 4 and not persisted
    assert vote(3, 2, 2) is VoteResult.REJECT_EXPIRED_VOTE_TERM
    assert vote(4, 2, 2) is VoteResult.ACCEPT and persisted == [(4, "n1")]
    assert vote(4, 2, 5, "n2") is VoteResult.REJECT_ALREADY_VOTED
    assert vote(4, 2, 2) is VoteResult.ACCEPT  # the same candidate again
    assert vote(6, 2, 2, "n2") is VoteResult.REJECT_TERM_NOT_READY
    assert node.role is Role.CANDIDATE and node.need_increase_term
    assert vote(4, 2, 2, "n0") is VoteResult.REJECT_UNEXPECTED_LEADER


@pytest.mark.parametrize("seed", range(4))
def test_random_faults_never_break_the_invariants(tmp_path, seed) -> None:
    """Five minutes of virtual time: links cut and healed, nodes stopped and restarted, appends
    all along.  Sim.check asserts after every step that a term has one leader and that
    committed entries never change; at the end, healed, the logs converge and every
    acknowledged append is in them."""
    rng = random.Random(seed)
    sim = Sim(tmp_path, seed=seed)
    acked: dict[int, bytes] = {}
    bodies: dict[int, bytes] = {}
    n = 0
    for _ in range(60):
        action = rng.random()
        if action < 0.2:
            sim.heal()
            for pid in sim.ids:
                if not sim.up(pid):
                    sim.start(pid)
        elif action < 0.35:
            a, b = rng.sample(sim.ids, 2)
            sim.cut.add(frozenset((a, b)))
        elif action < 0.45 and len(sim.nodes) == len(sim.ids):
            sim.stop(rng.choice(sim.ids))
        for pid in sim.leaders():
            leader = sim.nodes[pid]
            for _ in range(rng.randrange(4)):
                body = b"s%d-%d" % (seed, n)
                n += 1
                try:
                    bodies[leader.append(body, sim.now).index] = body
                except DLedgerError:
                    break
        before = len(sim.acks)
        sim.run(5000)
        for ack in sim.acks[before:]:
            if ack.code is ResponseCode.SUCCESS:
                acked[ack.index] = bodies[ack.index]
    sim.heal()
    for pid in sim.ids:
        if not sim.up(pid):
            sim.start(pid)
    leader = _elect(sim, 30_000)
    sim.append(b"final")
    end = leader.log.ledger_end_index
    assert sim.run(
        20_000, until=lambda: all(x.log.committed_index == end for x in sim.nodes.values())
    )
    logs = [_entries(x) for x in sim.nodes.values()]
    assert logs[0] == logs[1] == logs[2]
    assert acked, "the run acknowledged nothing"
    final = [body for _, body in logs[0]]
    for index, body in acked.items():
        assert final[index] == body


def test_role_changes_are_reported_in_order(tmp_path) -> None:
    sim = Sim(tmp_path)
    leader = _elect(sim)
    follower = next(n for n in sim.nodes.values() if n is not leader)
    mine = leader.take_role_changes()
    assert mine[-1] == RoleChange(leader.term, Role.LEADER, leader.self_id)
    assert follower.take_role_changes()[-1] == RoleChange(
        leader.term, Role.FOLLOWER, leader.self_id
    )
    assert leader.take_role_changes() == []  # taken
    sim.isolate(leader.self_id)
    sim.run(10_000)
    assert leader.take_role_changes() == [RoleChange(leader.term, Role.CANDIDATE, None)]


def test_the_leadership_moves_to_the_preferred_leader_with_nothing_lost(tmp_path) -> None:
    """preferredLeaderId: a leader that is not preferred hands over to the preferred member
    once it has every entry (appends refused meanwhile: LEADER_TRANSFERRING), the preferred
    member takes the next term although the followers hear their leader (leader stickiness
    does not shield against a preferred member), and nothing committed is lost."""
    sim = Sim(tmp_path, preferred_leader_ids="n2")
    sim.stop("n2")  # so that another member leads first
    first = _elect(sim)
    first_term = first.term
    assert first.self_id != "n2"
    for i in range(20):
        sim.append(b"m%d" % i)
    assert sim.run(3000, until=lambda: first.log.committed_index == 19)
    sim.start("n2")
    refused = []

    def transferring() -> bool:
        if first.transferee == "n2" and not refused:
            with pytest.raises(DLedgerError) as info:
                first.append(b"during", sim.now)
            refused.append(info.value.code)
        return sim.leaders() == ["n2"] and _settled(sim)

    assert sim.run(15_000, until=transferring)
    assert refused == [ResponseCode.LEADER_TRANSFERRING]
    new = sim.leader()
    assert new.self_id == "n2" and new.term > first_term
    index = sim.append(b"after")
    assert sim.run(
        3000, until=lambda: all(n.log.committed_index == index for n in sim.nodes.values())
    )
    assert [b for _, b in _entries(new)] == [b"m%d" % i for i in range(20)] + [b"after"]
    sim.run(5000)  # and it stays with the preferred leader
    assert sim.leaders() == ["n2"]


def test_entries_ready_at_a_push_go_in_batches_and_commit(tmp_path) -> None:
    """The entries appended since the last push go to each follower as 0.2.6's batch APPEND
    (``batchEntry``), cut at PUSH_BATCH_BYTES; they all commit, and the followers' logs are
    the leader's."""
    sim = Sim(tmp_path)
    leader = _elect(sim)
    index = leader.append(b"first", sim.now).index  # the followers compared, in APPEND
    assert sim.run(3000, until=lambda: leader.log.committed_index == index)
    body = b"b" * 1000
    count = PUSH_BATCH_BYTES // 1048 + 10  # more than one batch's bytes
    first = leader.log.ledger_end_index + 1
    for _ in range(count):
        leader.append(body, sim.now)
    sends = leader.tick(sim.now + 1)
    appends = [s.request for s in sends if isinstance(s.request, PushEntryRequest)]
    appends = [r for r in appends if r.type is PushType.APPEND]
    assert len(appends) == 4  # two batches to each of two followers
    for peer in {s.peer for s in sends}:
        mine = [s.request for s in sends if s.peer == peer and s.request in appends]
        assert [(r.batch, r.first_entry_index) for r in mine] == [
            (True, first),
            (True, mine[0].last_entry_index + 1),
        ]
        assert mine[-1].last_entry_index == first + count - 1
        assert PUSH_BATCH_BYTES <= mine[0].total_size < PUSH_BATCH_BYTES + 1048
    for send in sends:
        sim._send(leader.self_id, send)
    last = first + count - 1
    assert sim.run(3000, until=lambda: leader.log.committed_index == last)
    for node in sim.nodes.values():
        assert _entries(node) == _entries(leader)


def test_a_followers_one_timer_is_its_leaders_heartbeat_timeout(tmp_path) -> None:
    """next_due as a follower: what the shell sleeps on (its leader's heartbeat timeout,
    maxHeartBeatLeak x heartBeatTimeIntervalMs after the last heartbeat, which tick checks
    with >: due 1 ms after)."""
    sim = Sim(tmp_path)
    leader = _elect(sim)
    follower = next(n for n in sim.nodes.values() if n is not leader)
    leak = follower.config.max_heart_beat_leak * follower.config.heart_beat_time_interval_ms
    due = follower.last_leader_heartbeat + leak
    assert follower.next_due(sim.now) == due + 1 - sim.now
    assert follower.next_due(due + 5) == 0
    assert follower.tick(due) == [] and follower.role is Role.FOLLOWER  # not past it yet
    follower.tick(due + 1)
    assert follower.role is Role.CANDIDATE


def _commit_steps(sim: Sim) -> int:
    """Steps (10 ms each) from an append on the leader until it commits."""
    leader = sim.leader()
    index = sim.append(b"now")
    steps = 0
    while leader.log.committed_index < index:
        sim.step()
        steps += 1
        assert steps < 1000
    return steps


@pytest.mark.parametrize("seed", range(3))
def test_an_idle_leader_ticks_at_its_timers_not_every_10_ms(tmp_path, seed) -> None:
    """next_due: a shell that ticks a node only when its next timer is due, or when a
    request, an answer bringing a timer forward or an append woke it (the Sim's timers mode,
    the server's way), elects, replicates and commits as the 10 ms ticks do -- an append on
    a leader idle for a minute commits as fast -- while the idle leader ticks at its
    heartbeats (2 s) and its followers' COMMIT pushes (1 s), not 100 times a second."""
    every = Sim(tmp_path / "every", seed=seed)
    timers = Sim(tmp_path / "timers", seed=seed, timers=True)
    for sim in (every, timers):
        _elect(sim)
        for i in range(30):
            sim.append(b"m%d" % i)
        assert sim.run(3000, until=lambda s=sim: s.leader().log.committed_index == 29)
    leader = timers.leader()
    before = timers.ticks[leader.self_id]
    timers.run(60_000)  # idle
    idle_ticks = timers.ticks[leader.self_id] - before
    assert idle_ticks <= 60 * 3 + 10, idle_ticks  # a heartbeat and two COMMIT pushes a second
    assert timers.leader() is leader and _settled(timers)  # nobody timed out meanwhile
    every.run(60_000)
    assert _commit_steps(timers) <= _commit_steps(every)
    assert _entries(leader) == _entries(next(n for n in timers.nodes.values() if n is not leader))


def test_elections_and_failover_work_with_timers(tmp_path) -> None:
    """The timers mode through an election, a leader stop and its return (what next_due must
    not miss: vote rounds, revotes, heartbeat timeouts, compare/truncate retries)."""
    sim = Sim(tmp_path, timers=True)
    old = _elect(sim)
    for i in range(20):
        sim.append(b"m%d" % i)
    assert sim.run(3000, until=lambda: old.log.committed_index == 19)
    sim.stop(old.self_id)
    new = _elect(sim)
    assert new is not old
    index = sim.append(b"after")
    assert sim.run(3000, until=lambda: new.log.committed_index >= index)
    back = sim.start(old.self_id)
    assert sim.run(15_000, until=lambda: back.log.committed_index >= index)
    assert _entries(back) == _entries(new)


def test_a_bigger_term_while_the_own_vote_round_waits_is_logged_once(tmp_path, caplog) -> None:
    """A candidate whose own vote round waits for answers is sent to candidate in a peer's
    bigger term by each vote request of that peer (whose rounds end REVOTE_IMMEDIATELY on its
    REJECT_TERM_NOT_READY: 30 to 55 a second); the role change is reported, and logged,
    once per term, however often it comes."""
    config = Sim(tmp_path).configs["n1"]
    store = DLedgerFileStore(attrs.evolve(config, store_base_dir=str(tmp_path / "solo")))
    store.open()
    node = RaftNode(config, store, rng=random.Random(1), now=0.0)
    node.tick(0.0)  # its own round: requests out, no answers
    assert node._vote_round is not None and node.term == 0
    changes = node.take_role_changes()
    caplog.set_level(logging.INFO, logger="pymq.dledger")
    for step in range(50):  # a second of the peer's rounds, the shell ticking between them
        now = 20.0 * (step + 1)
        request = VoteRequest(group="g", leader_id="n0", remote_id="n1", term=5,
                              ledger_end_index=-1, ledger_end_term=-1)  # fmt: skip
        answer = node.handle(request, now)
        assert answer.vote_result is VoteResult.REJECT_TERM_NOT_READY
        node.tick(now)
        changes += node.take_role_changes()
    assert node._vote_round is not None  # still waiting
    assert changes == [RoleChange(5, Role.CANDIDATE, None)]
    logged = [r.getMessage() for r in caplog.records if "in term" in r.getMessage()]
    assert logged == ["n1: CANDIDATE in term 5"]
