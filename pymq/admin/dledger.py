"""The DLedger groups' view of the tools (``pymq-admin dLedgerStatus``, the console's DLedger
table), built from the brokers' GET_BROKER_RUNTIME_INFO tables: no request of its own.

A broker in DLedger mode reports ``dLedgerGroup``, ``dLedgerSelfId``, ``dLedgerPeers``,
``dLedgerRole``, ``dLedgerTerm``, ``dLedgerLeaderId``, ``dLedgerLedgerEndIndex``,
``dLedgerCommittedIndex`` and, on the leader, ``dLedgerFollowerLag`` (``n1:0;n2:3``: entries
each follower is known to be missing) -- pymq/broker/runtime_info.py.  Members are grouped by
broker name and group; a peer whose broker did not answer (or is not registered) is listed
from the others' ``dLedgerPeers`` as unreachable.  Sans-IO.
"""

from __future__ import annotations

from typing import Any


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


def _peers(text: str | None) -> dict[str, str]:
    """``n0-host:port;n1-host:port`` as {selfId: DLedger address}."""
    out: dict[str, str] = {}
    for item in (text or "").split(";"):
        sid, sep, addr = item.strip().partition("-")
        if sep and sid:
            out[sid] = addr
    return out


def dledger_groups(brokers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The groups of the DLedger members among ``brokers``.

    ``brokers``: one dict per broker with ``brokerName``, ``brokerAddr``, ``brokerId`` and
    ``table`` (its runtime-info table, or None when it did not answer).  Each group:
    ``brokerName``, ``group``, ``term`` and ``leaderId`` (the highest term's leader any member
    reports), ``committedIndex`` (the leader's, else the highest reported) and ``members``:
    ``selfId``, ``brokerAddr``, ``brokerId``, ``role``, ``term``, ``ledgerEndIndex``,
    ``committedIndex``, ``lag`` (entries behind, from the leader; None when unknown) and
    ``online``; ordered by selfId.
    """
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for broker in brokers:
        table = broker.get("table") or {}
        group = table.get("dLedgerGroup")
        sid = table.get("dLedgerSelfId")
        if not group or not sid:
            continue
        key = (broker.get("brokerName") or "", group)
        entry = groups.setdefault(key, {"members": {}, "peers": {}})
        entry["peers"].update(_peers(table.get("dLedgerPeers")))
        entry["members"][sid] = {
            "selfId": sid,
            "brokerAddr": broker.get("brokerAddr"),
            "brokerId": broker.get("brokerId"),
            "role": table.get("dLedgerRole"),
            "term": _int(table.get("dLedgerTerm")),
            "leaderId": table.get("dLedgerLeaderId") or None,
            "ledgerEndIndex": _int(table.get("dLedgerLedgerEndIndex")),
            "committedIndex": _int(table.get("dLedgerCommittedIndex")),
            "followerLag": table.get("dLedgerFollowerLag") or "",
            "online": True,
        }
    out = []
    for (name, group), entry in sorted(groups.items()):
        members: dict[str, dict[str, Any]] = entry["members"]
        for sid, addr in entry["peers"].items():
            members.setdefault(
                sid,
                {
                    "selfId": sid,
                    "brokerAddr": None,
                    "brokerId": None,
                    "role": None,
                    "term": None,
                    "leaderId": None,
                    "ledgerEndIndex": None,
                    "committedIndex": None,
                    "followerLag": "",
                    "online": False,
                    "dledgerAddr": addr,
                },
            )
        known = [m for m in members.values() if m["term"] is not None]
        latest = max(known, key=lambda m: m["term"], default=None)
        term = latest["term"] if latest is not None else None
        leader_id = latest["leaderId"] if latest is not None else None
        leader = members.get(leader_id) if leader_id else None
        if leader is not None and leader["role"] != "LEADER":
            leader = None  # not (yet) confirmed by the leader itself
        lags: dict[str, int] = {}
        if leader is not None:
            for item in leader["followerLag"].split(";"):
                peer, sep, lag = item.partition(":")
                if sep and _int(lag) is not None:
                    lags[peer] = int(lag)
        committed = [m["committedIndex"] for m in known if m["committedIndex"] is not None]
        rows = []
        for sid in sorted(members):
            m = members[sid]
            row = {k: v for k, v in m.items() if k not in ("followerLag", "leaderId")}
            row["lag"] = 0 if leader is not None and sid == leader["selfId"] else lags.get(sid)
            rows.append(row)
        out.append(
            {
                "brokerName": name,
                "group": group,
                "term": term,
                "leaderId": leader_id,
                "committedIndex": (
                    leader["committedIndex"]
                    if leader is not None
                    else (max(committed) if committed else None)
                ),
                "members": rows,
            }
        )
    return out
