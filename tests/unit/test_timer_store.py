"""The timer store's on-disk structures (pymq/store/timer): log, wheel, checkpoint, and the
slot rules of TimerStore, with a fake clock."""

from __future__ import annotations

import os

import pytest

from pymq.store.timer import counts as timer_counts
from pymq.store.timer.checkpoint import TimerCheckpoint
from pymq.store.timer.log import ENTRY_SIZE, TimerEntry, TimerLog
from pymq.store.timer.store import TIMER_LOG_DIR, TIMER_WHEEL_FILE, TimerStore
from pymq.store.timer.wheel import SLOT_SIZE, TimerWheel

T0 = 1_800_000_000_000  # an epoch ms on a slot boundary of every precision used here


def make(tmp_path: os.PathLike[str], **kw: int) -> TimerStore:
    args = {"precision_ms": 1000, "roll_window_slots": 10, "log_file_size": ENTRY_SIZE * 4}
    args.update(kw)
    return TimerStore(str(tmp_path), slots_total=100, **args)


def flush(store: TimerStore) -> None:
    cp, slots = store.snapshot()
    store.flush_blocking(cp, slots)
    store.flushed(cp, slots)


def drain(store: TimerStore, now_ms: int) -> list[TimerEntry]:
    """Every due timer up to ``now_ms``; rolled ones entered again (as the service does)."""
    out: list[TimerEntry] = []
    while (slot := store.take_due(now_ms)) is not None:
        out.extend(slot.due)
        for e in slot.rolled:
            assert e.deliver_ms > now_ms  # handed back only when not yet due
            assert store.enter(e.deliver_ms, e.phy_offset, e.phy_size, now_ms, e.roll_times + 1)
    return out


def test_entry_round_trip_and_corruption() -> None:
    entry = TimerEntry(-1, T0, T0 + 5, 1234, 99, 2)
    data = entry.encode()
    assert len(data) == ENTRY_SIZE
    assert TimerEntry.decode(data) == entry
    assert TimerEntry.decode(data[:-1]) is None
    flipped = bytearray(data)
    flipped[30] ^= 1
    assert TimerEntry.decode(bytes(flipped)) is None


def test_log_files_are_fixed_size_and_positions_global(tmp_path: os.PathLike[str]) -> None:
    log = TimerLog(str(tmp_path), ENTRY_SIZE * 2 + 7)  # rounded down to whole entries
    positions = [log.append(TimerEntry(-1, T0, T0, i, 1)) for i in range(5)]
    assert positions == [i * ENTRY_SIZE for i in range(5)]
    assert log.read(3 * ENTRY_SIZE) == TimerEntry(-1, T0, T0, 3, 1)  # not written yet
    log.write_pending()  # across three files
    assert log.file_starts() == [0, 2 * ENTRY_SIZE, 4 * ENTRY_SIZE]
    assert log.read(3 * ENTRY_SIZE) == TimerEntry(-1, T0, T0, 3, 1)
    log.close()
    again = TimerLog(str(tmp_path), ENTRY_SIZE * 2 + 7)
    assert again.end == 5 * ENTRY_SIZE


def test_log_recovery_cuts_a_torn_tail(tmp_path: os.PathLike[str]) -> None:
    log = TimerLog(str(tmp_path), ENTRY_SIZE * 3)
    for i in range(4):
        log.append(TimerEntry(-1, T0, T0, i, 1))
    log.write_pending()
    # The last entry torn: half of it written, and garbage after it.
    last = os.path.join(str(tmp_path), f"{3 * ENTRY_SIZE:020d}")
    with open(last, "r+b") as f:
        f.truncate(ENTRY_SIZE // 2)
        f.seek(0, os.SEEK_END)
        f.write(b"\x00" * 10)
    log.close()
    log = TimerLog(str(tmp_path), ENTRY_SIZE * 3)
    assert log.recover(0) == 3 * ENTRY_SIZE
    assert log.end == 3 * ENTRY_SIZE
    assert not os.path.exists(last)
    # And a corrupt entry in the middle cuts the log there.
    with open(os.path.join(str(tmp_path), f"{0:020d}"), "r+b") as f:
        f.seek(ENTRY_SIZE + 20)
        f.write(b"\xff")
    assert log.recover(0) == ENTRY_SIZE
    assert log.append(TimerEntry(-1, T0, T0, 7, 1)) == ENTRY_SIZE


def test_wheel_slot_arithmetic_and_stale_slots(tmp_path: os.PathLike[str]) -> None:
    wheel = TimerWheel(os.path.join(str(tmp_path), "w"), 60, 1000)
    assert os.path.getsize(wheel.path) == 60 * SLOT_SIZE
    assert wheel.slot_time(T0 + 999) == T0
    assert wheel.slot_time(T0 + 1000) == T0 + 1000
    assert wheel.index(T0) == wheel.index(T0 + 60_000)  # one round later, same slot
    assert wheel.link(T0, 0) == -1
    assert wheel.link(T0, 48) == 0
    slot = wheel.get(T0)
    assert (slot.first_pos, slot.last_pos, slot.num) == (0, 48, 2)
    # The same index a round later is another time's slot: empty.
    assert wheel.get(T0 + 60_000).empty
    wheel.write_slots(dict(wheel.dirty))
    wheel.forget(dict(wheel.dirty))
    assert not wheel.dirty
    wheel.close()
    again = TimerWheel(os.path.join(str(tmp_path), "w"), 60, 1000)
    assert again.get(T0).last_pos == 48
    assert again.get(T0 + 60_000).empty


def test_precision_edges_never_early(tmp_path: os.PathLike[str]) -> None:
    store = make(tmp_path)
    store.open(T0)
    assert not store.enter(T0, 1, 1, now_ms=T0)  # due now: the caller delivers it
    assert not store.enter(T0 - 5000, 1, 1, now_ms=T0)  # in the past
    assert store.enter(T0 + 1, 10, 1, now_ms=T0)
    assert store.enter(T0 + 999, 11, 1, now_ms=T0)
    assert store.enter(T0 + 1000, 12, 1, now_ms=T0)  # on a boundary: slot T0, as RocketMQ 5
    assert store.enter(T0 + 1001, 13, 1, now_ms=T0)
    assert store.take_due(T0 + 999) is None  # slot T0 is not over: T0+999 is not yet due
    assert [e.phy_offset for e in drain(store, T0 + 1000)] == [10, 11, 12]  # 12 on time
    assert store.take_due(T0 + 1999) is None
    assert [e.phy_offset for e in drain(store, T0 + 2000)] == [13]
    for entry in [*drain(store, T0 + 5000)]:
        raise AssertionError(f"nothing else is pending: {entry}")


def test_roll_over_past_the_window(tmp_path: os.PathLike[str]) -> None:
    store = make(tmp_path, roll_window_slots=10)
    store.open(T0)
    far = T0 + 25_500  # 25 slots out, the window is 10
    assert store.enter(far, 7, 1, now_ms=T0)
    assert store.rolled == 1
    seen = []
    now = T0
    while now <= far + 1000:
        now += 1000
        for entry in drain(store, now):
            seen.append((now, entry))
    assert len(seen) == 1
    when, entry = seen[0]
    assert when >= far and when - far <= 1000
    assert entry.phy_offset == 7 and entry.roll_times == 2  # re-entered at T0+9 s and T0+18 s
    assert store.rolled == 2  # put in the window's last slot twice: at T0 and at T0+10 s


def test_wall_clock_jumps_forward_and_back(tmp_path: os.PathLike[str]) -> None:
    store = make(tmp_path, roll_window_slots=50)
    store.open(T0)
    store.enter(T0 + 3_000, 1, 1, now_ms=T0)
    store.enter(T0 + 30_000, 2, 1, now_ms=T0)
    # Forward 10 s at once: the skipped slots are handed out, the later timer waits.
    assert [e.phy_offset for e in drain(store, T0 + 10_000)] == [1]
    assert store.read_ms == T0 + 10_000
    # Back 8 s: nothing is handed out until the clock reaches the next slot again...
    assert drain(store, T0 + 2_000) == []
    # ...and a timer whose slot the wheel has passed waits in the next slot, not early.
    assert store.enter(T0 + 5_000, 3, 1, now_ms=T0 + 2_000)
    assert drain(store, T0 + 4_999) == []
    assert [e.phy_offset for e in drain(store, T0 + 11_000)] == [3]
    assert drain(store, T0 + 29_999) == []
    assert [e.phy_offset for e in drain(store, T0 + 31_000)] == [2]


def test_restart_resumes_without_loss_or_double_delivery(tmp_path: os.PathLike[str]) -> None:
    store = make(tmp_path)
    store.open(T0)
    for i in range(6):
        store.enter(T0 + 1500 + i * 1000, 100 + i, 1, now_ms=T0)
    store.enqueue_offset = 6
    assert [e.phy_offset for e in drain(store, T0 + 3000)] == [100, 101]
    store.delivered_ms = store.read_ms
    flush(store)
    # After the checkpoint: one more timer entered and one slot delivered, then a crash.
    store.enter(T0 + 9500, 106, 1, now_ms=T0 + 3000)
    drain(store, T0 + 4000)
    store.log.close()
    store.wheel.close()

    again = make(tmp_path)
    again.open(T0 + 4000)
    assert again.enqueue_offset == 6  # the timer entered after it is entered again
    assert again.log.end == 6 * ENTRY_SIZE  # ...not kept twice
    assert again.read_ms == T0 + 3000
    got = [e.phy_offset for e in drain(again, T0 + 20_000)]
    assert got == [102, 103, 104, 105]  # 102 again: at least once; 100 and 101 not again


def test_recovery_rechains_what_the_wheel_file_missed(tmp_path: os.PathLike[str]) -> None:
    store = make(tmp_path)
    store.open(T0)
    store.enter(T0 + 1500, 1, 1, now_ms=T0)
    store.enter(T0 + 1600, 2, 1, now_ms=T0)
    cp, _slots = store.snapshot()
    store.log.flush()
    cp.save(store.check_path)  # crash after the checkpoint, before the wheel slots were written
    store.log.close()
    store.wheel.close()
    again = make(tmp_path)
    again.open(T0)
    assert [e.phy_offset for e in drain(again, T0 + 3000)] == [1, 2]


def test_spent_log_files_are_deleted(tmp_path: os.PathLike[str]) -> None:
    store = make(tmp_path, roll_window_slots=5)  # 4 entries per file
    store.open(T0)
    for i in range(9):
        store.enter(T0 + 1000 + i * 100, i, 1, now_ms=T0)
    store.log.write_pending()
    assert len(store.log.file_starts()) == 3
    assert len(drain(store, T0 + 2000)) == 9
    store.delivered_ms = store.read_ms
    flush(store)
    assert len(store.log.file_starts()) == 3  # a window has not passed yet
    drain(store, T0 + 10_000)
    store.delivered_ms = store.read_ms
    flush(store)
    assert store.log.file_starts() == [8 * ENTRY_SIZE]


def test_corrupt_checkpoint_refuses_to_start(tmp_path: os.PathLike[str]) -> None:
    store = make(tmp_path)
    store.open(T0)
    flush(store)
    with open(store.check_path, "r+b") as f:
        f.seek(20)
        f.write(b"\x01")
    with pytest.raises(ValueError, match="corrupt"):
        make(tmp_path).open(T0)
    assert TimerCheckpoint.load(os.path.join(str(tmp_path), "none")) is None
    assert os.path.isdir(os.path.join(str(tmp_path), TIMER_LOG_DIR))
    assert os.path.exists(os.path.join(str(tmp_path), TIMER_WHEEL_FILE))


def test_a_precision_change_is_refused_while_timers_are_pending(
    tmp_path: os.PathLike[str],
) -> None:
    store = make(tmp_path)
    store.open(T0)
    store.enter(T0 + 2500, 1, 1, now_ms=T0)
    flush(store)
    store.close()
    with pytest.raises(ValueError, match="timerPrecisionMs changed from 1000 to 500"):
        make(tmp_path, precision_ms=500).open(T0)
    # Back at 1000 it is still there; once delivered, the change is taken.
    store = make(tmp_path)
    store.open(T0)
    assert [e.phy_offset for e in drain(store, T0 + 3000)] == [1]
    store.delivered_ms = store.read_ms
    flush(store)
    store.close()
    changed = make(tmp_path, precision_ms=500)
    changed.open(T0 + 3200)
    assert changed.read_ms == T0 + 3000 and changed.log.end == 0
    assert changed.enter(T0 + 3700, 2, 1, now_ms=T0 + 3200)
    assert drain(changed, T0 + 3999) == []
    assert [e.phy_offset for e in drain(changed, T0 + 4000)] == [2]


def test_pending_counts_come_back_with_the_checkpoint_they_were_taken_with(
    tmp_path: os.PathLike[str],
) -> None:
    store = make(tmp_path)
    store.open(T0)
    store.enter(T0 + 1500, 1, 1, now_ms=T0)
    store.enter(T0 + 5500, 2, 1, now_ms=T0)
    store.counts.update({"A": 1, "B": 1})
    store.enqueue_offset = 2
    flush(store)  # checkpoint 1: A=1, B=1
    drain(store, T0 + 2000)
    store.delivered_ms = store.read_ms
    store.counts.pop("A")
    cp, _slots = store.snapshot()
    store.log.flush()
    timer_counts.save(store.counts_path, cp, store.counts)  # crash before checkpoint 2
    store.log.close()
    store.wheel.close()
    again = make(tmp_path)
    again.open(T0 + 2000)
    assert again.counts_known and again.counts == {"A": 1, "B": 1}  # checkpoint 1's
    assert again.read_ms == T0  # ...which delivers slot T0 again, and A's count goes then
    flush(again)  # checkpoint 2 with counts {"A": 1, "B": 1}
    again.log.close()
    again.wheel.close()
    os.remove(again.counts_path)  # a store written before the counts file
    third = make(tmp_path)
    third.open(T0 + 2000)
    assert not third.counts_known and third.counts == {}
    assert [e.phy_offset for e in third.pending_entries()] == [1, 2]


def test_a_checkpoint_names_only_written_entries(tmp_path: os.PathLike[str]) -> None:
    """Entries are written behind (many a pwrite); a checkpoint writes them first, so a crash
    after it (the process gone, entries appended since never written) loses none it names,
    and those appended after it are entered again from the timer topic's offset."""
    store = make(tmp_path, log_file_size=ENTRY_SIZE * 1000)
    store.open(T0)
    for i in range(3):
        store.enter(T0 + 1500 + i * 1000, 100 + i, 1, now_ms=T0)
    store.enqueue_offset = 3
    flush(store)
    store.enter(T0 + 9500, 103, 1, now_ms=T0)  # after the checkpoint: never written
    for fd in store.log._fds.values():  # kill -9: the files closed, nothing more written
        os.close(fd)
    store.wheel.close()
    again = make(tmp_path, log_file_size=ENTRY_SIZE * 1000)
    again.open(T0)
    assert again.log.end == 3 * ENTRY_SIZE and again.enqueue_offset == 3
    assert [e.phy_offset for e in drain(again, T0 + 20_000)] == [100, 101, 102]


def test_a_slot_hands_out_its_timers_earliest_due_first(tmp_path: os.PathLike[str]) -> None:
    """Entered in any order, a slot's timers come out by due time (equal ones as entered): the
    service puts them one after another, and those due at the slot's start have waited
    longest."""
    store = make(tmp_path)
    store.open(T0)
    dues = [T0 + 900, T0 + 100, T0 + 500, T0 + 100, T0 + 1000, T0 + 1]
    for i, due in enumerate(dues):
        assert store.enter(due, i, 1, now_ms=T0)
    slot = store.take_due(T0 + 1000)
    assert slot is not None and slot.slot_ms == T0
    assert [e.phy_offset for e in slot.due] == [5, 1, 3, 2, 0, 4]


def test_a_slot_taken_ahead_holds_its_not_yet_due_timers_as_due(
    tmp_path: os.PathLike[str],
) -> None:
    """``ahead_ms``: the service takes a slot as it begins (and puts each timer at its due
    time); its timers are handed out as due, a roll past the slot's end still as rolled."""
    store = make(tmp_path, roll_window_slots=2)
    store.open(T0)
    assert store.enter(T0 + 100, 1, 1, now_ms=T0)
    assert store.enter(T0 + 900, 2, 1, now_ms=T0)
    assert store.enter(T0 + 5_000, 3, 1, now_ms=T0)  # past the window: in its last slot
    assert store.take_due(T0) is None  # the slot is not over
    slot = store.take_due(T0, ahead_ms=1000)
    assert slot is not None and slot.slot_ms == T0
    assert [e.phy_offset for e in slot.due] == [1, 2] and slot.rolled == []
    assert store.read_ms == T0 + 1000 and store.delivered_ms == T0  # the caller sets it
    assert store.take_due(T0 + 10, ahead_ms=1000) is None  # the next slot has not begun
    rolled = store.take_due(T0 + 1000, ahead_ms=1000)
    assert rolled is not None and [e.phy_offset for e in rolled.rolled] == [3]
