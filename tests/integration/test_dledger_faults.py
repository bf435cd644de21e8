"""The DLedger fault harness's short run (issue #42; the harness: tests/dledger_faults.py, the
long run: scripts/dledger_faults.py): three brokers and two name servers as processes in
their own network namespaces, producers and consumers from the root namespace; the leader
killed with -9 and restarted with a torn tail, a follower cut from the other two and healed;
then the checker: nothing acknowledged lost, nothing served that the group did not keep,
dense queues, followers' logs a prefix of the leader's."""

from __future__ import annotations

import pathlib
import subprocess

import pytest
import trio

from tests.dledger_faults import PREFIX, namespaces_unavailable, run

pytestmark = pytest.mark.slow  # five processes, an election, a failover (about 30 s)

WHY = namespaces_unavailable()


@pytest.mark.skipif(WHY is not None, reason=f"the fault harness needs namespaces: {WHY}")
def test_leader_killed_and_follower_cut_lose_nothing(tmp_path: pathlib.Path) -> None:
    report, harness = trio.run(
        lambda: run(tmp_path, ["kill-leader", "split-follower"], seed=1, hold=1.0, producers=4)
    )
    print(report.summary())
    assert [r.fault for r in harness.rounds] == ["kill-leader", "split-follower"]
    assert report.violations == []
    (kill, _) = harness.rounds
    assert kill.failover is not None and kill.failover < 30
    assert report.acked > 100 and report.final >= report.acked
    assert any("bytes zeroed" in line for line in harness.log_lines)
    # nothing of the run is left: namespaces and the bridge are gone
    run_id = harness.cluster.net.run_id
    assert (
        f"{PREFIX}{run_id}"
        not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    )
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert f"{PREFIX}{run_id}" not in links
