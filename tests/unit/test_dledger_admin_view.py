"""The tools' DLedger view (pymq/admin/dledger.py): groups built from the brokers' runtime-info
tables -- members (a peer that did not answer listed from the others' dLedgerPeers), the term
and leader, the leader's committed index, and each follower's lag as the leader reports it."""

from __future__ import annotations

from typing import Any

from pymq.admin.dledger import dledger_groups

PEERS = "n0-10.0.0.1:40911;n1-10.0.0.2:40911;n2-10.0.0.3:40911"


def table(sid: str, role: str, term: int, leader: str, end: int, committed: int, **more: str):
    return {
        "dLedgerGroup": "g",
        "dLedgerSelfId": sid,
        "dLedgerPeers": PEERS,
        "dLedgerRole": role,
        "dLedgerTerm": str(term),
        "dLedgerLeaderId": leader,
        "dLedgerLedgerEndIndex": str(end),
        "dLedgerCommittedIndex": str(committed),
        **more,
    }


def test_a_group_with_a_follower_behind_and_one_down() -> None:
    brokers: list[dict[str, Any]] = [
        {
            "brokerName": "b",
            "brokerAddr": "10.0.0.2:10911",
            "brokerId": 0,
            "table": table("n1", "LEADER", 4, "n1", 99, 97, dLedgerFollowerLag="n0:7;n2:40"),
        },
        {
            "brokerName": "b",
            "brokerAddr": "10.0.0.1:10911",
            "brokerId": 1,
            "table": table("n0", "FOLLOWER", 4, "n1", 92, 90),
        },
        {"brokerName": "b", "brokerAddr": "10.0.0.3:10911", "brokerId": 3, "table": None},
        {"brokerName": "plain", "brokerAddr": "10.0.0.9:10911", "brokerId": 0, "table": {}},
    ]
    (group,) = dledger_groups(brokers)
    assert (group["brokerName"], group["group"], group["term"]) == ("b", "g", 4)
    assert (group["leaderId"], group["committedIndex"]) == ("n1", 97)
    members = {m["selfId"]: m for m in group["members"]}
    assert list(members) == ["n0", "n1", "n2"]
    assert members["n1"]["role"] == "LEADER" and members["n1"]["lag"] == 0
    assert members["n0"]["lag"] == 7 and members["n0"]["brokerId"] == 1
    assert members["n0"]["ledgerEndIndex"] == 92 and members["n0"]["online"]
    # the member that did not answer: from the peers, with the leader's figure for it
    assert not members["n2"]["online"] and members["n2"]["brokerAddr"] is None
    assert members["n2"]["lag"] == 40 and members["n2"]["dledgerAddr"] == "10.0.0.3:40911"


def test_without_a_confirmed_leader_no_lag_is_claimed() -> None:
    """Followers name a leader that did not answer: the term and its id are shown, the lags
    are unknown, the committed index is the highest reported."""
    brokers: list[dict[str, Any]] = [
        {"brokerName": "b", "brokerAddr": "a0", "brokerId": 1,
         "table": table("n0", "FOLLOWER", 5, "n2", 10, 8)},
        {"brokerName": "b", "brokerAddr": "a1", "brokerId": 2,
         "table": table("n1", "CANDIDATE", 6, "", 10, 9)},
    ]  # fmt: skip
    (group,) = dledger_groups(brokers)
    assert group["term"] == 6 and group["leaderId"] is None
    assert group["committedIndex"] == 9
    assert all(m["lag"] is None for m in group["members"])


def test_no_dledger_broker_no_group() -> None:
    assert (
        dledger_groups([{"brokerName": "p", "brokerAddr": "a", "table": {"brokerRole": "x"}}]) == []
    )
