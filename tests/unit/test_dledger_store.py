"""DLedger 0.2.6's file store: the layout byte for byte, appends, reads, truncation, recovery
of a torn tail, the checkpoint and currterm files."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from pymq.dledger.config import DLedgerConfig
from pymq.dledger.errors import DLedgerError, ResponseCode
from pymq.dledger.store import (
    BODY_OFFSET,
    HEADER_SIZE,
    MAX_ENTRY_SIZE,
    DLedgerEntry,
    DLedgerFileStore,
    delete_files,
    load_term,
    persist_term,
    rocketmq_wrote_offset,
)

DATA_SIZE = 1024
INDEX_SIZE = 32 * 8


def _config(tmp_path: Path, data: int = DATA_SIZE, index: int = INDEX_SIZE) -> DLedgerConfig:
    return DLedgerConfig(
        group="g",
        self_id="n0",
        peers="n0-127.0.0.1:1",
        store_base_dir=str(tmp_path),
        mapped_file_size_for_entry_data=data,
        mapped_file_size_for_entry_index=index,
    )


def _open(tmp_path: Path, **kw: int) -> DLedgerFileStore:
    store = DLedgerFileStore(_config(tmp_path, **kw))
    store.open()
    return store


def _body(i: int) -> bytes:
    return b"".join(b"body-%d;" % i for _ in range(i % 7 + 1))


def _reopen(store: DLedgerFileStore) -> DLedgerFileStore:
    store.close()
    again = DLedgerFileStore(store.config)
    again.open()
    return again


def _data_file(tmp_path: Path, offset: int = 0) -> Path:
    return tmp_path / "dledger-n0" / "data" / f"{offset:020d}"


def _index_file(tmp_path: Path, offset: int = 0) -> Path:
    return tmp_path / "dledger-n0" / "index" / f"{offset:020d}"


def test_the_constants_are_dledgers() -> None:
    # DLedgerEntry: POS_OFFSET = 4+4+8+8, HEADER_SIZE = POS_OFFSET+8+4+4+4, BODY_OFFSET = +4
    assert (HEADER_SIZE, BODY_OFFSET) == (44, 48)
    assert rocketmq_wrote_offset(4096) == 4096 + 48
    assert DLedgerConfig().mapped_file_size_for_entry_index == 32 * 5 * 1024 * 1024


def test_a_store_built_by_hand_as_dledger_lays_it_out_is_read_back(tmp_path) -> None:
    """Files written field by field from DLedgerEntryCoder's layout, not with the store's
    encoder: big-endian magic, size, index, term, pos, channel, chainCrc, bodyCrc, body
    length, body; index entries magic, pos, size, index, term; a blank (-1, rest) where the
    next entry does not fit with 8 bytes to spare."""
    data = bytearray(DATA_SIZE * 2)
    index = bytearray(INDEX_SIZE)
    bodies = [b"x" * 300, b"y" * 400, b"z" * 200, b"w" * 10]  # the third does not fit
    pos = 0
    for i, body in enumerate(bodies):
        size = 48 + len(body)
        if pos % DATA_SIZE + size + 8 > DATA_SIZE:
            rest = DATA_SIZE - pos % DATA_SIZE
            data[pos : pos + 8] = (-1).to_bytes(4, "big", signed=True) + rest.to_bytes(4, "big")
            pos += rest
        term = 1 if i < 2 else 3
        head = (
            (1).to_bytes(4, "big")
            + size.to_bytes(4, "big")
            + i.to_bytes(8, "big")
            + term.to_bytes(8, "big")
            + pos.to_bytes(8, "big")
            + bytes(12)  # channel, chainCrc, bodyCrc
            + len(body).to_bytes(4, "big")
        )
        data[pos : pos + size] = head + body
        index[i * 32 : i * 32 + 32] = (
            (1).to_bytes(4, "big")
            + pos.to_bytes(8, "big")
            + size.to_bytes(4, "big")
            + i.to_bytes(8, "big")
            + term.to_bytes(8, "big")
        )
        pos += size
    base = tmp_path / "dledger-n0"
    (base / "data").mkdir(parents=True)
    (base / "index").mkdir()
    _data_file(tmp_path).write_bytes(data[:DATA_SIZE])
    _data_file(tmp_path, DATA_SIZE).write_bytes(data[DATA_SIZE:])
    _index_file(tmp_path).write_bytes(index)
    (base / "checkpoint").write_text("committedIndex=2\nendIndex=3\n")
    store = _open(tmp_path)
    assert (store.ledger_begin_index, store.ledger_end_index, store.ledger_end_term) == (0, 3, 3)
    assert store.committed_index == 2
    got = [store.get(i) for i in range(4)]
    assert [e.body for e in got] == bodies
    assert [e.pos for e in got] == [0, 348, 1024, 1272]
    assert [e.term for e in got] == [1, 1, 3, 3]
    assert store.committed_pos == 1024 + 248
    # and the store writes the same bytes for the same entries
    again = _open(tmp_path / "again")
    for e in got:
        again.append_as_leader(e.body, e.term)
    again.close()
    assert _data_file(tmp_path / "again").read_bytes() == bytes(data[:DATA_SIZE])
    assert _data_file(tmp_path / "again", DATA_SIZE).read_bytes() == bytes(data[DATA_SIZE:])
    assert _index_file(tmp_path / "again").read_bytes() == bytes(index)


def test_append_and_read_across_files_then_reopen(tmp_path) -> None:
    store = _open(tmp_path)
    entries = [store.append_as_leader(_body(i), 1 + i // 20) for i in range(60)]
    assert [e.index for e in entries] == list(range(60))
    for e in entries:
        assert store.get(e.index) == e
        assert e.pos // DATA_SIZE == (e.pos + e.size - 1) // DATA_SIZE  # never spans files
    assert len(os.listdir(tmp_path / "dledger-n0" / "data")) > 3
    store.update_committed_index(41)
    again = _reopen(store)
    assert (again.ledger_end_index, again.ledger_end_term, again.committed_index) == (59, 3, 41)
    assert [again.get(i) for i in range(60)] == entries
    assert again.term_at(19) == 1 and again.term_at(20) == 2 and again.term_at(-1) == -1


def test_reads_outside_the_log_are_refused(tmp_path) -> None:
    store = _open(tmp_path)
    store.append_as_leader(b"a", 1)
    for bad in (-1, 1, 2**40):
        with pytest.raises(DLedgerError) as info:
            store.get(bad)
        assert info.value.code == ResponseCode.INDEX_OUT_OF_RANGE


def test_follower_appends_are_checked_before_anything_is_written(tmp_path) -> None:
    leader = _open(tmp_path / "leader")
    follower = _open(tmp_path / "follower")
    entries = [leader.append_as_leader(_body(i), 2) for i in range(5)]
    follower.append_as_follower(entries[0])
    for bad, code in (
        (entries[2], ResponseCode.INCONSISTENT_INDEX),  # a gap
        (DLedgerEntry(1, 2, entries[1].body, entries[1].pos + 8), ResponseCode.DISK_ERROR),
        (DLedgerEntry(1, 1, entries[1].body, entries[1].pos), ResponseCode.INCONSISTENT_STATE),
        (DLedgerEntry(1, 2, b"x" * MAX_ENTRY_SIZE, 56), ResponseCode.UNEXPECTED_ARGUMENT),
    ):
        with pytest.raises(DLedgerError) as info:
            follower.append_as_follower(bad)
        assert info.value.code == code
        assert follower.ledger_end_index == 0
    for e in entries[1:]:
        follower.append_as_follower(e)
    follower.close()
    leader.close()
    for name in ("data", "index"):
        for f in os.listdir(tmp_path / "leader" / "dledger-n0" / name):
            mine = tmp_path / "follower" / "dledger-n0" / name / f
            assert mine.read_bytes() == (tmp_path / "leader" / "dledger-n0" / name / f).read_bytes()


def test_an_entry_larger_than_the_limit_or_a_file_is_refused(tmp_path) -> None:
    store = _open(tmp_path, data=4 * 1024 * 1024 + 1024)
    with pytest.raises(DLedgerError, match="exceeds"):
        store.append_as_leader(b"x" * (MAX_ENTRY_SIZE - 47), 1)
    store.append_as_leader(b"x" * (MAX_ENTRY_SIZE - 48), 1)
    small = _open(tmp_path / "small")
    with pytest.raises(DLedgerError, match="does not fit"):
        small.append_as_leader(b"x" * DATA_SIZE, 1)
    assert small.ledger_end_index == -1


def test_truncate_after_drops_entries_and_they_never_come_back(tmp_path) -> None:
    store = _open(tmp_path)
    entries = [store.append_as_leader(_body(i), 1) for i in range(30)]
    store.update_committed_index(9)
    with pytest.raises(DLedgerError, match="committed"):
        store.truncate_after(8)
    # cut inside a file, with dropped entries after the cut in that same file
    k = next(
        i for i in range(10, 27) if entries[i].pos // DATA_SIZE == entries[i + 2].pos // DATA_SIZE
    )
    store.truncate_after(k)
    assert (store.ledger_end_index, store.ledger_end_term) == (k, 1)
    with pytest.raises(DLedgerError):
        store.get(k + 1)
    # an entry of the same size and term as the old k+1: the old k+2.. must not reappear
    replaced = store.append_as_leader(_body(k + 1).replace(b"body", b"BODY"), 1)
    assert replaced.pos == entries[k + 1].pos
    again = _reopen(store)
    assert again.ledger_end_index == k + 1
    assert again.get(k + 1) == replaced


def test_truncate_as_dledger_follower_keeps_or_replaces_the_leaders_entry(tmp_path) -> None:
    leader = _open(tmp_path / "leader")
    follower = _open(tmp_path / "follower")
    common = [leader.append_as_leader(_body(i), 1) for i in range(5)]
    for e in common:
        follower.append_as_follower(e)
    # the follower got entries 5..7 of an old term that the new leader does not have
    for i in range(5, 8):
        follower.append_as_leader(b"stale-%d" % i, 1)
    new = [leader.append_as_leader(_body(i) * 2, 2) for i in range(5, 9)]
    assert follower.truncate(common[4]) == 4  # same entry: the ones after it go
    assert follower.ledger_end_index == 4
    for i in range(5, 8):
        follower.append_as_leader(b"stale-%d" % i, 1)
    assert follower.truncate(new[0]) == 5  # differs: replaced, the rest dropped
    assert follower.get(5) == new[0] and follower.ledger_end_index == 5
    for e in new[1:]:
        follower.append_as_follower(e)
    assert [follower.get(i) for i in range(9)] == [leader.get(i) for i in range(9)]
    # the files say the same as the reads of the newest entries (kept in memory)
    reread = _reopen(follower)
    assert [reread.get(i) for i in range(9)] == [leader.get(i) for i in range(9)]


def _filled(tmp_path: Path, n: int = 20) -> list[DLedgerEntry]:
    store = _open(tmp_path)
    entries = [store.append_as_leader(_body(i), 1) for i in range(n)]
    store.close()
    return entries


def _tail(tmp_path: Path) -> tuple[Path, int]:
    files = sorted((tmp_path / "dledger-n0" / "data").iterdir())
    return files[-1], int(files[-1].name)


@pytest.mark.parametrize(
    "damage",
    ["partial_header", "garbage_header", "size_past_file", "wrong_pos", "term_goes_back"],
)
def test_recovery_cuts_a_torn_tail(tmp_path, damage) -> None:
    entries = _filled(tmp_path)
    last = entries[-1]
    path, offset = _tail(tmp_path)
    at = last.pos + last.size - offset
    with open(path, "r+b") as f:
        f.seek(at)
        if damage == "partial_header":
            f.write(struct.pack(">ii", 1, 100))
        elif damage == "garbage_header":
            f.write(os.urandom(48))
        elif damage == "size_past_file":
            f.write(struct.pack(">iiqqqiiii", 1, 5000, 20, 1, last.pos + last.size, 0, 0, 0, 4952))
        elif damage == "wrong_pos":
            f.write(struct.pack(">iiqqqiiii", 1, 52, 20, 1, 7, 0, 0, 0, 4) + b"abcd")
        else:  # whole, but of a term below the last one's
            f.write(
                struct.pack(">iiqqqiiii", 1, 50, 20, 0, last.pos + last.size, 0, 0, 0, 2) + b"ab"
            )
    store = _open(tmp_path)
    assert store.ledger_end_index == 19
    assert [store.get(i) for i in range(20)] == entries
    assert store.data.max_wrote_position == last.pos + last.size
    # what was cut is zeroed: the next append starts clean and recovers
    nxt = store.append_as_leader(b"next", 1)
    assert _reopen(store).get(20) == nxt


def test_recovery_cuts_an_entry_whose_index_is_not_the_next(tmp_path) -> None:
    entries = _filled(tmp_path)
    last = entries[-1]
    path, offset = _tail(tmp_path)
    stray = DLedgerEntry(25, 1, b"stray", last.pos + last.size)
    with open(path, "r+b") as f:
        f.seek(last.pos + last.size - offset)
        f.write(stray.encode())
    assert _open(tmp_path).ledger_end_index == 19


def test_recovery_rebuilds_a_missing_or_damaged_index_and_cuts_a_longer_one(tmp_path) -> None:
    entries = _filled(tmp_path)
    index_dir = tmp_path / "dledger-n0" / "index"
    for f in index_dir.iterdir():
        f.unlink()
    store = _open(tmp_path)
    assert [store.get(i) for i in range(20)] == entries
    store.close()
    # a damaged index entry in the middle: rewritten from the data
    first = sorted(index_dir.iterdir())[0]
    raw = bytearray(first.read_bytes())
    raw[3 * 32 : 4 * 32] = bytes(32)
    first.write_bytes(bytes(raw))
    store = _open(tmp_path)
    assert [store.get(i) for i in range(20)] == entries
    # index entries past the data's end (the data's tail lost): cut
    store.truncate_after(15)
    store.close()
    store = DLedgerFileStore(_config(tmp_path))
    store.open()
    assert store.ledger_end_index == 15
    assert store.index.max_wrote_position == 16 * 32


def test_recovery_refuses_to_drop_more_than_a_file(tmp_path) -> None:
    entries = _filled(tmp_path, 60)
    files = sorted((tmp_path / "dledger-n0" / "data").iterdir())
    assert len(files) >= 4
    start = int(files[-3].name)  # where recovery starts reading (the third-last file)
    victim = [e for e in entries if start < e.pos < start + DATA_SIZE][1]
    raw = bytearray(files[-3].read_bytes())
    raw[victim.pos - start : victim.pos - start + 4] = b"\x00\x00\x00\x09"
    files[-3].write_bytes(bytes(raw))
    store = DLedgerFileStore(_config(tmp_path))
    with pytest.raises(DLedgerError, match="more than a file"):
        store.open()
    assert sorted((tmp_path / "dledger-n0" / "data").iterdir()) == files  # nothing dropped


def test_a_file_of_another_size_is_refused(tmp_path) -> None:
    _filled(tmp_path)
    store = DLedgerFileStore(_config(tmp_path, data=2048))
    with pytest.raises(DLedgerError, match="configured file size"):
        store.open()


def test_the_checkpoint_and_term_files(tmp_path) -> None:
    store = _open(tmp_path)
    for i in range(5):
        store.append_as_leader(b"e%d" % i, 4)
    store.update_committed_index(3)
    store.update_committed_index(2)  # never back
    store.update_committed_index(99)  # cut to the end
    assert store.committed_index == 4
    store.persist_checkpoint()
    base = tmp_path / "dledger-n0"
    assert (base / "checkpoint").read_text() == "committedIndex=4\nendIndex=4\n"
    assert load_term(str(base)) == (0, None)
    persist_term(str(base), 7, "n2")
    assert (base / "currterm").read_text() == "voteLeader=n2\ncurrTerm=7\n"
    persist_term(str(base), 8, None)
    assert (base / "currterm.bak").read_text() == "voteLeader=n2\ncurrTerm=7\n"
    assert load_term(str(base)) == (8, None)
    (base / "currterm").write_text("currTerm=x\n")
    with pytest.raises(DLedgerError, match="not a term"):
        load_term(str(base))
    # a checkpoint that is not a number is ignored, as Java's Long.valueOf failure is
    (base / "checkpoint").write_text("committedIndex=abc\n")
    store.data.close()
    store.index.close()
    assert _open(tmp_path).committed_index == -1


def test_dirty_says_whether_a_flush_has_work(tmp_path) -> None:
    """The flusher skips its worker thread for a clean store: dirty() is True after an
    append or a truncation, False after a flush."""
    config = DLedgerConfig(
        group="g", self_id="n0", peers="n0-127.0.0.1:1", store_base_dir=str(tmp_path),
        mapped_file_size_for_entry_data=4096, mapped_file_size_for_entry_index=32 * 64,
    )  # fmt: skip
    store = DLedgerFileStore(config)
    store.open()
    try:
        assert not store.dirty()
        store.append_as_leader(b"x" * 10, 0)
        store.append_as_leader(b"y" * 10, 0)
        assert store.dirty()
        store.flush()
        assert not store.dirty()
        store.truncate_after(0)
        assert store.dirty()
        store.flush()
        assert not store.dirty()
    finally:
        store.close()


def test_expired_files_go_from_the_first_below_the_bound_and_a_reopen_keeps_it(tmp_path) -> None:
    """0.2.6's deleteExpiredFileByTime with pymq's bound: files old enough go from the first
    on, never the last, none reaching ``below``, stopping at a young one; the begin index
    moves to the first entry left, reads below it are refused, and a reopened store agrees."""
    store = _open(tmp_path, index=32 * 64)
    for _ in range(40):
        store.append_as_leader(b"e" * 150, 1)  # 198 bytes: five entries a 1 KiB file
    store.update_committed_index(39)
    files = [f.offset for f in store.data.files]
    assert len(files) == 8
    age = {f.path: 0.0 for f in store.data.files}  # all written at time 0
    old, young = 10_000, 5_000

    def expired(at_once: bool = False, below: int | None = None) -> int:
        bound = store.committed_pos if below is None else below
        return store.expired_files(young, old, at_once, bound, age.__getitem__)

    assert expired() == 7  # every file but the last
    assert expired(below=files[2]) == 1  # a file ending at the bound stays
    assert expired(below=files[2] + 1) == 2
    age[store.data.files[1].path] = 6.0  # the second is young: the first only
    assert expired() == 1
    assert expired(at_once=True) == 7  # any age when at once
    dropped = store.drop_first_files(2)
    delete_files(dropped)
    assert [f.offset for f in store.data.files] == files[2:]
    assert not _data_file(tmp_path, files[0]).exists()
    assert store.ledger_begin_index == 10
    with pytest.raises(DLedgerError) as info:
        store.get(9)
    assert info.value.code is ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN
    assert store.get(10).pos == files[2]
    store = _reopen(store)
    try:
        assert (store.ledger_begin_index, store.ledger_end_index) == (10, 39)
        assert store.committed_index == 39
        assert store.get(10).pos == files[2] and store.get(39).body == b"e" * 150
        assert store.append_as_leader(b"next", 1).index == 40
    finally:
        store.close()


def test_a_run_of_pushed_entries_is_written_as_one_at_a_time_would_be(tmp_path) -> None:
    """append_run_as_follower (a batch push, written a file's run at a time) leaves files
    byte for byte as the leader's, across file ends; a gap ends it with its error after the
    entries before it."""
    leader = _open(tmp_path / "a", index=32 * 16)  # index files of 16 entries: runs cross
    for i in range(40):
        leader.append_as_leader(_body(i) * 3, 1 + i // 20)
    entries = list(leader.entries())
    follower = _open(tmp_path / "b", index=32 * 16)
    follower.append_run_as_follower(entries[:1])
    follower.append_run_as_follower(entries[1:37])
    follower.append_run_as_follower(entries[37:])
    assert (follower.ledger_end_index, follower.ledger_end_term) == (39, 2)
    assert [e.same_as(follower.get(e.index)) for e in entries] == [True] * 40
    leader.flush()
    follower.flush()
    for kind in ("data", "index"):
        a_dir = tmp_path / "a" / "dledger-n0" / kind
        b_dir = tmp_path / "b" / "dledger-n0" / kind
        assert sorted(os.listdir(a_dir)) == sorted(os.listdir(b_dir))
        for name in os.listdir(a_dir):
            assert (a_dir / name).read_bytes() == (b_dir / name).read_bytes(), (kind, name)
    follower = _reopen(follower)
    assert follower.ledger_end_index == 39
    other = _open(tmp_path / "c", index=32 * 16)
    with pytest.raises(DLedgerError) as info:
        other.append_run_as_follower(entries[:5] + entries[6:9])
    assert info.value.code is ResponseCode.INCONSISTENT_INDEX
    assert other.ledger_end_index == 4
    for store in (leader, follower, other):
        store.close()


def test_a_follower_behind_the_leaders_first_entry_starts_over_at_it(tmp_path) -> None:
    """The leader's older files expired while a follower was away: TRUNCATE to the leader's
    first entry, past the follower's end, starts the follower's log over there (0.2.6's
    rebuildWithPos), pushes go on from it, and a reopen recovers it."""
    leader = _open(tmp_path / "a", index=32 * 64)
    for _ in range(40):
        leader.append_as_leader(b"e" * 150, 1)
    leader.update_committed_index(39)
    count = leader.expired_files(0, 1, True, leader.committed_pos)
    delete_files(leader.drop_first_files(count))
    begin = leader.ledger_begin_index
    assert begin == 35
    follower = _open(tmp_path / "b", index=32 * 64)
    for i in range(3):  # the follower has what the leader no longer has, and stops there
        follower.append_as_follower(DLedgerEntry(i, 1, b"e" * 150, i * 198))
    follower.update_committed_index(2)
    assert follower.truncate(leader.get(begin)) == begin
    assert (follower.ledger_begin_index, follower.ledger_end_index) == (begin, begin)
    follower.append_run_as_follower([leader.get(i) for i in range(begin + 1, 40)])
    follower = _reopen(follower)
    try:
        assert (follower.ledger_begin_index, follower.ledger_end_index) == (begin, 39)
        assert [follower.get(i).same_as(leader.get(i)) for i in range(begin, 40)] == [True] * 5
        assert follower.data.min_offset == leader.data.min_offset
    finally:
        follower.close()
        leader.close()


class _FullDisk:
    """os.pwrite for pymq.dledger.store that refuses (``short``: takes half of) the writes to
    the files under ``part`` ("data" or "index") while ``full`` is set."""

    def __init__(self, part: str, short: bool = False) -> None:
        self.part, self.short, self.full, self.refused = part, short, False, 0
        self.real = os.pwrite

    def __call__(self, fd: int, data: bytes, offset: int) -> int:
        if self.full and f"/{self.part}/" in os.readlink(f"/proc/self/fd/{fd}"):
            self.refused += 1
            if self.short and len(data) > 1:
                return self.real(fd, bytes(data)[: len(data) // 2], offset)
            raise OSError(28, "No space left on device")
        return self.real(fd, data, offset)


@pytest.mark.parametrize(("part", "short"), [("index", False), ("data", False), ("data", True)])
@pytest.mark.parametrize("run", [False, True])
def test_a_write_the_full_disk_refuses_leaves_the_log_as_it_was(
    tmp_path, monkeypatch, part, short, run
) -> None:
    """A data or index write refused or cut short (a full disk) fails the append with
    DISK_ERROR and leaves nothing behind: the same entry appended again once there is room
    goes where it would have, and every entry is there after a reopen (data left of the failed
    append would hold its index twice: the follower would refuse every later push as out of
    place, and recovery would cut the log there)."""
    leader = _open(tmp_path / "leader")
    entries = [leader.append_as_leader(_body(i) * 3, 1) for i in range(12)]
    roll = next(i for i, e in enumerate(entries) if e.pos >= DATA_SIZE)  # after a blank
    assert 4 < roll < 11
    store = _open(tmp_path / "store")
    disk = _FullDisk(part, short)
    monkeypatch.setattr("pymq.dledger.store.os.pwrite", disk)
    for at in (3, roll):
        if run:
            store.append_run_as_follower(entries[store.ledger_end_index + 1 : at])
        else:
            for e in entries[store.ledger_end_index + 1 : at]:
                store.append_as_follower(e)
        disk.full = True
        with pytest.raises(DLedgerError) as info:
            if run:
                store.append_run_as_follower(entries[at : at + 3])
            else:
                store.append_as_follower(entries[at])
        assert info.value.code is ResponseCode.DISK_ERROR
        assert store.ledger_end_index == at - 1
        disk.full = False
    store.append_run_as_follower(entries[store.ledger_end_index + 1 :])
    assert disk.refused >= 2
    again = _reopen(store)
    assert again.ledger_end_index == 11
    assert [e.same_as(again.get(e.index)) for e in entries] == [True] * 12
    again.close()
    leader.close()
