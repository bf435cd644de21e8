"""A member back from a crash whose checkpoint names as committed an entry whose body did not
survive (found by the fault harness, tests/dledger_faults.py, issue #42): 0.2.6 writes no CRC,
so recovery keeps an entry with a whole header and a torn body, and the checkpoint's
committedIndex (written every 3 s, apart from the data's flushes) may cover it.  The leader's
COMPARE finds the entry differs and asks the member to truncate before it; the member must
not refuse for ever on the ground that the entry is committed."""

from __future__ import annotations

import os
from pathlib import Path

from pymq.dledger.raft import Role
from tests.dledger_sim import Sim


def test_a_committed_entry_with_a_torn_body_is_replaced_by_the_leaders(tmp_path: Path) -> None:
    sim = Sim(tmp_path)
    assert sim.run(
        15_000,
        until=lambda: (
            len(sim.leaders()) == 1
            and all(n.role in (Role.LEADER, Role.FOLLOWER) for n in sim.nodes.values())
        ),
    )
    leader = sim.leader()
    for i in range(20):
        sim.append(b"body-%03d" % i * 20)
    assert sim.run(
        5_000, until=lambda: all(n.log.committed_index == 19 for n in sim.nodes.values())
    ), [(n.role, n.log.ledger_end_index, n.log.committed_index) for n in sim.nodes.values()]
    pid = next(p for p, n in sim.nodes.items() if n is not leader)
    config = sim.configs[pid]
    sim.stop(pid)
    # the crash: the last entry's body torn behind its whole header (its last 40 bytes
    # zeroed), the checkpoint naming it committed
    (name,) = sorted(os.listdir(config.data_path))[-1:]
    last = leader.log.get(19)
    with open(os.path.join(config.data_path, name), "r+b") as f:
        f.seek(last.pos + last.size - 40 - int(name))
        f.write(bytes(40))
    Path(config.default_path, "checkpoint").write_text("committedIndex=19\nendIndex=19\n")
    sim.committed.pop(19)  # the simulator's own record of committed entries: not this one
    sim.check = lambda: None  # type: ignore[method-assign]  # (the torn entry reads as committed)
    back = sim.start(pid)
    assert back.log.ledger_end_index == 19 and back.log.committed_index == 19
    assert not back.log.get(19).same_as(last)  # recovery cannot see the torn body
    for i in range(5):
        sim.append(b"more-%d" % i)
    assert sim.run(
        10_000, until=lambda: back.log.ledger_end_index == leader.log.ledger_end_index == 24
    ), (back.role, back.log.ledger_end_index, back.log.committed_index)
    assert back.role is Role.FOLLOWER
    for i in range(25):
        assert back.log.get(i).same_as(leader.log.get(i)), i
    assert sim.run(3_000, until=lambda: back.log.committed_index == 24)
