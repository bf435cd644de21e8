"""TimerStore: the timer log, the wheel and the checkpoint together, without I/O scheduling.

The Trio service (``pymq/broker/timer.py``) feeds it timers read from the timer topic and asks
it, tick by tick, for the timers due; everything here is synchronous and testable with a fake
clock (``now_ms`` is always passed in).

Rules:

- a timer due at or before ``now_ms`` is not entered (:meth:`enter` returns False): the caller
  delivers it at once;
- a timer is entered in the slot that ends at or after its due time (the slot its due time
  falls in, or the one before when the due time is a slot boundary: RocketMQ 5's rounding of
  TIMER_OUT_MS); slot ``T`` is handed out by :meth:`take_due` once
  ``now_ms >= T + precision``, so nothing is delivered before it is due and at most one
  precision late (plus the service's latency), a due time on a boundary exactly on time;
  a slot's due timers are handed out earliest due first (entered in any order); a caller may
  take a slot up to one precision ahead (``ahead_ms``) and put each timer at its due time;
- a timer further out than the roll window (``timerRollWindowSlot`` slots past the next slot
  to deliver) is entered in the window's last slot and handed back as ``rolled`` when that
  slot comes round, to be entered again (``roll_times`` counts how often); so is one whose
  slot the wheel had already passed when it was entered (the wall clock went back: it waits
  in the next slot to deliver until due);
- the wall clock going forward makes :meth:`take_due` hand out the skipped slots one by one;
  going back, it hands out nothing until the clock reaches the next slot again.

Crash safety (see :meth:`snapshot` and :meth:`flush_blocking`): the log is fsynced up to
``log_end`` before the checkpoint naming it is written, and the wheel's slots are written only
after that, and only as they stood when ``log_end`` was taken, so the wheel file never points
past the checkpointed log.  Recovery cuts the log at ``log_end`` (and at the first bad entry
before it), re-chains the entries of ``[relink_from, log_end)`` that the wheel file may miss,
and the service enters the timer topic again from ``enqueue_offset``, delivers from
``read_ms``: what was acknowledged is never lost, what was delivered since the checkpoint may
be delivered again (at least once).
"""

from __future__ import annotations

import os

import attrs

from pymq.store.timer import counts as timer_counts
from pymq.store.timer.checkpoint import TimerCheckpoint
from pymq.store.timer.log import ENTRY_SIZE, TimerEntry, TimerLog
from pymq.store.timer.wheel import TIMER_WHEEL_TTL_DAYS, Slot, TimerWheel

DAY_SECONDS = 86_400


def _due_ms(entry: TimerEntry) -> int:
    return entry.deliver_ms


@attrs.define
class DueSlot:
    """What :meth:`TimerStore.take_due` hands out for one slot (entries oldest first)."""

    slot_ms: int
    due: list[TimerEntry] = attrs.Factory(list)
    rolled: list[TimerEntry] = attrs.Factory(list)


TIMER_LOG_DIR = "timerlog"
TIMER_WHEEL_FILE = "timerwheel"
TIMER_CHECK_FILE = os.path.join("config", "timercheck")


class TimerStore:
    def __init__(
        self,
        root_dir: str,
        *,
        precision_ms: int,
        roll_window_slots: int,
        log_file_size: int,
        slots_total: int = TIMER_WHEEL_TTL_DAYS * DAY_SECONDS,
    ) -> None:
        self.precision_ms = precision_ms
        # Slots further out than the wheel would wrap onto slots still pending.
        self.roll_window_slots = max(1, min(roll_window_slots, slots_total - 1))
        self.log = TimerLog(os.path.join(root_dir, TIMER_LOG_DIR), log_file_size)
        self.wheel = TimerWheel(os.path.join(root_dir, TIMER_WHEEL_FILE), slots_total, precision_ms)
        self.check_path = os.path.join(root_dir, TIMER_CHECK_FILE)
        self.counts_path = os.path.join(root_dir, timer_counts.TIMER_COUNTS_FILE)
        self.counts: dict[str, int] = {}
        """Pending timers per real topic (see pymq/store/timer/counts.py; the service keeps
        them)."""
        self.counts_known = True
        """False after :meth:`open` found no counts for its checkpoint: the service counts
        the pending entries once (:meth:`pending_entries`)."""
        self._snap_counts: dict[str, int] = {}
        self.read_ms = 0
        """The next slot :meth:`take_due` hands out."""
        self.delivered_ms = 0
        """Every slot before it is delivered (the service sets it once the puts are done)."""
        self.enqueue_offset = 0
        """The timer topic's consume-queue offset entered up to (set by the service)."""
        self.relink_from = 0
        self.entered = 0
        self.rolled = 0

    # --- recovery ------------------------------------------------------------------------

    def open(self, now_ms: int) -> None:
        """Recover from the checkpoint (see the module docstring)."""
        cp = TimerCheckpoint.load(self.check_path)
        if cp is None:
            # A new timer store: whatever a wheel or log file holds is not vouched for.
            self.log.truncate(0)
            self.read_ms = self.delivered_ms = self.wheel.slot_time(now_ms)
            return
        if cp.precision_ms != self.precision_ms:
            self._change_precision(cp, now_ms)
            return
        # Entries before relink_from were fsynced and chained by an earlier checkpoint; from
        # there the log is checked entry by entry and cut at the checkpoint's end (or before).
        end = self.log.recover(cp.relink_from, cp.log_end)
        for pos, entry in self.log.entries(min(cp.relink_from, end), end):
            self.wheel.relink(entry.slot_ms, pos, entry.prev_pos)
        self.relink_from = min(cp.relink_from, end)
        self.enqueue_offset = cp.enqueue_offset
        self.read_ms = self.delivered_ms = cp.read_ms
        loaded = timer_counts.load(self.counts_path, cp)
        self.counts = loaded or {}
        self.counts_known = loaded is not None

    def pending_entries(self) -> list[TimerEntry]:
        """Every entry not yet delivered (a scan of the whole log: only for a store whose
        counts are unknown, once)."""
        return [e for _, e in self.log.entries(0, self.log.end) if e.slot_ms >= self.read_ms]

    def _change_precision(self, cp: TimerCheckpoint, now_ms: int) -> None:
        """``timerPrecisionMs`` differs from the one the log was written with: the slots of
        pending timers cannot be found any more, so the change is refused while any is pending
        (a scan of the whole log); with none, the log and wheel start afresh."""
        end = self.log.recover(0, cp.log_end)
        pending = sum(1 for _, e in self.log.entries(0, end) if e.slot_ms >= cp.read_ms)
        if pending:
            raise ValueError(
                f"timerPrecisionMs changed from {cp.precision_ms} to {self.precision_ms} while "
                f"{pending} timer log entries are pending: set it back until they are delivered"
            )
        self.log.truncate(0)
        self.wheel.clear()
        self.enqueue_offset = cp.enqueue_offset
        self.read_ms = self.delivered_ms = self.wheel.slot_time(max(cp.read_ms, now_ms))

    # --- enqueue -------------------------------------------------------------------------

    def enter(
        self, deliver_ms: int, phy_offset: int, phy_size: int, now_ms: int, roll_times: int = 0
    ) -> bool:
        """Enter a timer; False (nothing written) when it is due now."""
        if deliver_ms <= now_ms:
            return False
        wheel = self.wheel
        slot_ms = max(wheel.slot_time(deliver_ms - 1), self.read_ms)
        window_end = self.read_ms + (self.roll_window_slots - 1) * self.precision_ms
        if slot_ms > window_end:
            slot_ms = window_end
            self.rolled += 1
        slot = wheel.get(slot_ms)
        pos = self.log.append(
            TimerEntry(slot.last_pos, slot_ms, deliver_ms, phy_offset, phy_size, roll_times)
        )
        wheel.link(slot_ms, pos, slot)
        self.entered += 1
        return True

    # --- dequeue -------------------------------------------------------------------------

    def next_pending_slot(self, max_slots: int) -> int | None:
        """The first slot from :attr:`read_ms` on that holds entries, looking at most
        ``max_slots`` slots ahead (one ``pread`` each); None when there is none."""
        start = self.read_ms
        for i in range(max_slots):
            slot_ms = start + i * self.precision_ms
            if not self.wheel.get(slot_ms).empty:
                return slot_ms
        return None

    def next_due_ms(self) -> int:
        """When the next slot may be handed out (epoch ms)."""
        return self.read_ms + self.precision_ms

    def take_due(self, now_ms: int, ahead_ms: int = 0) -> DueSlot | None:
        """The next slot's timers once that slot is over at ``now_ms + ahead_ms`` (None
        before): those due by then, and those not (rolled ones, or entered while the clock was
        behind), which the caller enters again (:meth:`enter`, or a fresh copy through the
        commit log, as the service does, so that a message waiting days is not left in an old
        commit-log file).  With ``ahead_ms`` (at most one precision) the caller takes a slot
        before it is over and hands out each due timer at its own due time, not earlier."""
        slot_ms = self.read_ms
        now_ms += ahead_ms
        if slot_ms + self.precision_ms > now_ms:
            return None
        chain = self.chain(self.wheel.get(slot_ms))
        self.read_ms = slot_ms + self.precision_ms
        out = DueSlot(slot_ms)
        for entry in chain:
            if entry.deliver_ms > now_ms:
                out.rolled.append(entry)
            else:
                out.due.append(entry)
        # Earliest due first: a slot's timers are put one after another, so the ones that have
        # waited longest (due at its start) are not left behind those due at its end.
        out.due.sort(key=_due_ms)
        return out

    def chain(self, slot: Slot) -> list[TimerEntry]:
        """A slot's entries, oldest first."""
        out = []
        pos = slot.last_pos
        while pos >= 0:
            entry = self.log.read(pos)
            if entry is None or entry.slot_ms != slot.slot_ms:
                break  # cannot happen on a recovered store: the wheel never points past it
            out.append(entry)
            pos = entry.prev_pos
        out.reverse()
        return out

    # --- checkpoint ----------------------------------------------------------------------

    def snapshot(self) -> tuple[TimerCheckpoint, dict[int, Slot]]:
        """What :meth:`flush_blocking` makes durable, taken at one instant on the loop
        (with the counts of that instant; one flush at a time)."""
        self._snap_counts = dict(self.counts)
        self.log.write_pending()  # every entry the checkpoint names is written
        cp = TimerCheckpoint(
            log_end=self.log.end,
            relink_from=self.relink_from,
            enqueue_offset=self.enqueue_offset,
            read_ms=self.delivered_ms,
            precision_ms=self.precision_ms,
        )
        return cp, dict(self.wheel.dirty)

    def flush_blocking(self, cp: TimerCheckpoint, slots: dict[int, Slot]) -> None:
        """Log fsync → counts → checkpoint → wheel slots → wheel fsync, then spent log files
        deleted (blocking: run in a thread; the loop then calls :meth:`flushed`)."""
        self.log.flush()
        timer_counts.save(self.counts_path, cp, self._snap_counts)
        cp.save(self.check_path)
        self.wheel.write_slots(slots)
        self.wheel.flush()
        self.clean_files()

    def flushed(self, cp: TimerCheckpoint, slots: dict[int, Slot]) -> None:
        """On the loop after :meth:`flush_blocking`: the written slots leave the dirty table,
        and the next checkpoint re-chains from here."""
        self.wheel.forget(slots)
        self.relink_from = cp.log_end

    def clean_files(self) -> int:
        """Delete timer-log files every entry of which is delivered: an entry is entered at
        most a roll window past the next slot to deliver at that time, which is at most its
        own slot, so a file whose last entry's slot plus a window is delivered is spent."""
        window = self.roll_window_slots * self.precision_ms
        removed = 0
        starts = self.log.file_starts()
        for start in starts[:-1]:
            last = self.log.read(start + self.log.file_size - ENTRY_SIZE)
            if last is None or last.slot_ms + window >= self.delivered_ms:
                break
            removed += self.log.delete_files_before(start + self.log.file_size)
        return removed

    def close(self) -> None:
        self.log.close()
        self.wheel.close()
