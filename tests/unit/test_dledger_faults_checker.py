"""The DLedger fault harness's own parts that need no namespaces (tests/dledger_faults.py):
its read-only reader of a DLedger log agrees with pymq's store and its recovery, a torn tail
is what recovery then cuts, the checker finds each kind of violation, and the NFQUEUE
delayer's netlink messages."""

from __future__ import annotations

import socket
import struct
from pathlib import Path

from pymq.dledger.config import DLedgerConfig
from pymq.dledger.store import DLedgerEntry, DLedgerFileStore
from tests import dledger_faults as df


def _store(tmp_path: Path, n: int) -> DLedgerFileStore:
    config = DLedgerConfig(
        group="g",
        self_id="n0",
        peers="n0-127.0.0.1:1",
        store_base_dir=str(tmp_path),
        mapped_file_size_for_entry_data=1024,  # a few entries a file: blanks, several files
        mapped_file_size_for_entry_index=32 * 64,
    )
    store = DLedgerFileStore(config)
    store.open()
    for i in range(n):
        store.append_as_leader(b"entry-%d;" % i * (i % 5 + 1), 1 + i // 10)
    store.flush()
    return store


def test_read_log_reads_what_the_store_wrote(tmp_path: Path) -> None:
    store = _store(tmp_path, 40)
    got = df.read_log(Path(store.config.data_path))
    assert len(got) == 40 and len(store.data.files) >= 3
    assert all(a.same_as(b) for a, b in zip(got, store.entries(), strict=True))
    store.close()


def test_a_torn_tail_is_what_recovery_cuts(tmp_path: Path) -> None:
    store = _store(tmp_path, 40)
    store.close()
    data = Path(store.config.data_path)
    checkpoint = Path(store.config.default_path) / "checkpoint"
    before, left = df.tear_tail(data, checkpoint, 100)
    assert before == 40 and left < 40
    assert checkpoint.read_text() == f"committedIndex={left - 3}\nendIndex=39\n"
    again = DLedgerFileStore(store.config)
    again.open()
    assert again.ledger_end_index + 1 == left == len(df.read_log(data))
    again.close()


def _workload() -> df.Workload:
    w = df.Workload(df.Cluster(Path("/nonexistent")))
    for i, (q, o) in enumerate([(0, 0), (0, 1), (1, 0)]):
        body = b"m-%d" % i
        w.attempted.add(body)
        w.acks.append(df.Ack(body, 1.0, 1.1, "b0", q, o))
        w.served[(q, o)] = body
    w.attempted.add(b"timed-out")
    return w


def _logs(n: int = 4) -> dict[str, list[DLedgerEntry]]:
    leader = [DLedgerEntry(i, 1, b"e%d" % i, 48 * i) for i in range(n)]
    return {"b0": leader, "b1": leader[:-1], "b2": list(leader)}


def _final() -> dict[tuple[int, int], bytes]:
    return {(0, 0): b"m-0", (0, 1): b"m-1", (1, 0): b"m-2", (1, 1): b"timed-out"}


def test_the_checker_passes_a_clean_run() -> None:
    report = df.check(_workload(), _final(), _logs(), "b0", [])
    assert report.violations == []
    assert report.unacked_committed == 1 and report.final == 4 and report.acked == 3


def test_the_checker_finds_a_lost_acknowledged_message() -> None:
    final = _final()
    final[(0, 1)] = b"timed-out"  # another message where the SEND_OK said m-1 is
    del final[(1, 1)]
    violations = df.check(_workload(), final, _logs(), "b0", []).violations
    assert any("SEND_OK b'm-1'" in v and "lost" in v for v in violations), violations


def test_the_checker_finds_a_hole_in_a_queue() -> None:
    final = _final()
    final[(1, 3)] = final.pop((1, 1))
    violations = df.check(_workload(), final, _logs(), "b0", []).violations
    assert violations == ["queue 1 not dense: missing offsets [1, 2]"]


def test_the_checker_finds_a_served_message_the_group_dropped() -> None:
    w = _workload()
    w.attempted.add(b"uncommitted")
    w.served[(1, 1)] = b"uncommitted"  # served, then the offset held another message
    violations = df.check(w, _final(), _logs(), "b0", []).violations
    assert violations == ["served b'uncommitted' at (1, 1), final read has b'timed-out'"]


def test_the_checker_finds_a_message_never_sent() -> None:
    final = _final()
    final[(1, 2)] = b"phantom"
    violations = df.check(_workload(), final, _logs(5), "b0", []).violations
    assert violations == ["b'phantom' at (1, 2) was never sent"]


def test_the_checker_finds_a_follower_log_that_is_not_a_prefix() -> None:
    logs = _logs()
    logs["b1"] = [*logs["b1"][:2], DLedgerEntry(2, 2, b"other", 96)]
    violations = df.check(_workload(), _final(), logs, "b0", []).violations
    assert violations == [
        "b1's entry 2 (term 2) differs from the leader b0's (term 1): not a prefix"
    ]
    logs = _logs()
    logs["b2"] = [*logs["b2"], DLedgerEntry(4, 1, b"e4", 192)]
    violations = df.check(_workload(), _final(), logs, "b0", []).violations
    assert violations == ["b2's log (5) is longer than the leader's"]


def test_failover_percentiles() -> None:
    rounds = [df.Round("kill-leader", ["b0"], "b0", 0.0, failover=t) for t in (3.0, 1.0, 2.0)]
    rounds.append(df.Round("kill-two", ["b0", "b1"], "b0", 0.0, failover=20.0))
    report = df.check(_workload(), _final(), _logs(), "b0", rounds)
    assert report.failovers == {"kill-leader": [3.0, 1.0, 2.0], "kill-two": [20.0]}
    summary = report.summary()
    assert "failover (leader killed/paused/cut): n=3 p50=2.00 s p99=3.00 s" in summary
    assert df.percentile([float(i) for i in range(1, 101)], 99) == 99.0
    assert df.percentile([5.0], 50) == 5.0


def test_the_delayer_reads_packet_ids_and_writes_verdicts() -> None:
    # a NFQNL_MSG_PACKET as the kernel sends it: nlmsghdr, nfgenmsg, then NFQA_PACKET_HDR
    # (id, hw protocol, hook) among other attributes
    def packet(packet_id: int) -> bytes:
        attrs = struct.pack("=HH", 4 + 8, 5) + bytes(8)  # another attribute first
        attrs += struct.pack("=HH", 4 + 7, 1) + struct.pack("!IHB", packet_id, 0x0800, 3) + b"\0"
        body = struct.pack("!BBH", socket.AF_INET, 0, 0) + attrs
        return struct.pack("=IHHII", 16 + len(body), (3 << 8) | 0, 0, 0, 0) + body

    assert list(df._packet_ids(packet(7) + packet(123456))) == [7, 123456]
    verdict = df._nl_message(1, 0, [(2, struct.pack("!II", 1, 7))])
    length, kind, flags, _, _ = struct.unpack_from("=IHHII", verdict)
    assert (length, kind, flags) == (len(verdict), (3 << 8) | 1, 1)
    assert verdict[-8:] == struct.pack("!II", 1, 7)


def test_acks_since_and_the_first_from_another_member() -> None:
    w = df.Workload(df.Cluster(Path("/nonexistent")))
    for body, started, done, broker in [
        (b"a", 0.0, 0.5, "b0"),
        (b"b", 0.9, 1.2, "b0"),  # started before the fault, answered after it
        (b"c", 1.1, 1.3, "b0"),
        (b"d", 1.2, 1.9, "b1"),
        (b"e", 1.5, 1.7 + 0.5, "b1"),
    ]:
        w.acks.append(df.Ack(body, started, done, broker, 0, 0))
    assert [a.body for a in w.acks_since(1.0)] == [b"e", b"d", b"c"]
    first = w.first_ack_after(1.0, not_from="b0")
    assert first is not None and first.body == b"d"
    assert w.first_ack_after(3.0) is None
