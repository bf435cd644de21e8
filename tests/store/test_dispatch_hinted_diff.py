"""Differential tests of the reput's hinted dispatch (``dispatch_hinted``, C or its twin) against
its general path (``_hint_for`` and ``dispatch_fields``, see tests/store/helpers.dispatch_mode),
and of the C function against its twin: the same hints over the same log, dispatched both ways,
must leave the same consume queues, index files (bytes and attributes), arrivals, hints, offsets
and ``logics_msg_timestamp`` -- after every call, not only at the end."""

from __future__ import annotations

import logging
import os
import struct
import tempfile
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pymq.common.record import MESSAGE_MAGIC_CODE
from pymq.store import reput as reput_module
from pymq.store.commitlog import DispatchHint
from pymq.store.consume_queue_table import ConsumeQueueTable
from pymq.store.index_service import IndexService
from pymq.store.reput import ReputMessageService
from tests.store.helpers import FakeCommitLog, dispatch_mode

logging.getLogger("pymq.store").setLevel(logging.CRITICAL)  # odd queue offsets, index rolls

HEADER = struct.Struct(">iI")


class Side:
    def __init__(
        self,
        root: str,
        log: bytearray,
        mode: str,
        slots: int,
        index_num: int,
        cq_size: int,
        precreate: list[tuple[str, int]],
    ) -> None:
        clock = iter(range(1_800_000_000_000, 1 << 62, 1000))
        self.index = IndexService(
            os.path.join(root, "index"), slots, index_num, lambda: next(clock)
        )
        self.index.ensure_writable_file()
        self.table = ConsumeQueueTable(os.path.join(root, "cq"), cq_size, self.index, [1000])
        for topic, qid in precreate:
            self.table.find_or_create(topic, qid)
        self.cl = FakeCommitLog(log, len(log) + 4096)
        self.reput = ReputMessageService(self.cl, self.table)  # type: ignore[arg-type]
        self.mode = mode
        self.calls: list[tuple] = []
        self.arrivals: list[tuple] = []
        self.reput.listener = lambda *a: self.arrivals.append((a, self.seen(a[0], a[1])))

    def dispatch(self, budget: int) -> tuple[bool, bool]:
        """_dispatch_some in this side's mode; each dispatch_hinted call's answer kept (the C
        function and its twin must split the work alike, not only end alike)."""
        with dispatch_mode(self.mode):
            real = reput_module._dispatch_hinted

            def logged(*args: object) -> tuple:
                out = real(*args)
                self.calls.append((*out[:4], type(out[4])))
                return out

            reput_module._dispatch_hinted = logged
            try:
                return self.reput._dispatch_some(budget, create_files=True)
            finally:
                reput_module._dispatch_hinted = real

    def seen(self, topic: str, qid: int) -> tuple:
        """What a listener reads when it is called: its queue's attributes (the C run writes
        them back before it calls the listener).  Not the index: the Python loop calls the
        listener before the record is indexed, the C run after (nothing a listener does reads
        the index)."""
        cq = self.table.queues[topic][qid]
        return cq.max_physic_offset, [mf.wrote_position for mf in cq.queue.files]

    def state(self) -> tuple:
        cqs = []
        for topic, by_id in sorted(self.table.queues.items()):
            for qid, cq in sorted(by_id.items()):
                files = [
                    (mf.file_from_offset, mf.wrote_position, bytes(mf.mm[: mf.file_size]))
                    for mf in cq.queue.files
                ]
                cqs.append((topic, qid, cq.max_physic_offset, files))
        index = []
        for f in self.index.files:
            index.append(
                (
                    f.begin_timestamp,
                    f.end_timestamp,
                    f.begin_phy_offset,
                    f.end_phy_offset,
                    f.hash_slot_count,
                    f.index_count,
                    bytes(f.mf.mm),
                )
            )
        return (
            cqs,
            index,
            list(self.arrivals),
            list(self.cl.dispatch_hints),
            self.reput.reput_from_offset,
            self.table.logics_msg_timestamp,
            dict(self.index._prefix_hashes),
        )

    def close(self) -> None:
        self.table.close()
        self.index.close()


def build_log(records: list[dict]) -> tuple[bytearray, list[DispatchHint]]:
    log = bytearray()
    hints = []
    for r in records:
        size = r["size"]
        phy = len(log)
        rec = bytearray(size)
        HEADER.pack_into(rec, 0, size, MESSAGE_MAGIC_CODE)
        log += rec
        hints.append(
            DispatchHint(
                phy,
                size,
                r["topic"],
                r["qid"],
                r["qoff"],
                r["tags"],
                r["ts"],
                r["sys_flag"],
                r["keys"],
                r["uniq"],
            )
        )
    return log, hints


def unallocate(side: Side, rounds: int) -> None:
    """Forget the blocks past the data of the newest files (as for a file found on disk), so
    that the next puts must allocate first: the C run leaves those to the Python loop."""
    for cq in side.table:
        if cq.queue.files and rounds % 2:
            mf = cq.queue.files[-1]
            mf.allocated = min(mf.allocated, mf.wrote_position)
    if side.index.files and rounds % 3 == 0:
        f = side.index.files[-1]
        f.mf.allocated = min(f.mf.allocated, f.data_end)


def dispatch_in_lockstep(
    sides: list[Side],
    limit_of: Callable[[int], int],
    before_round: Callable[[int], None] | None = None,
    between_rounds: Callable[[int], None] | None = None,
) -> int:
    """Dispatch both sides round by round, ``limit_of(round)`` hinted records a round, until
    neither has more: after each round both returned the same and hold the same.  Between
    rounds ``between_rounds(rounds done)``, then the index files roll as _do_reput_locked's
    prepare rolls them.  Returns the number of rounds."""
    rounds = 0
    while True:
        if before_round is not None:
            before_round(rounds)
        outs = [side.dispatch(limit_of(rounds)) for side in sides]
        assert outs[0] == outs[1]
        if {sides[0].mode, sides[1].mode} == {"c", "twin"}:
            assert sides[0].calls == sides[1].calls
        states = [side.state() for side in sides]
        assert states[0] == states[1], f"after round {rounds}"
        rounds += 1
        if not outs[0][1]:
            return rounds
        if between_rounds is not None:
            between_rounds(rounds)
        if sides[0].index.needs_new_file():
            for side in sides:
                side.index._roll(side.index._new_file_blocking())


def run_both(
    records: list[dict],
    limits: list[int],
    redispatch_from: int | None,
    slots: int = 8,
    index_num: int = 12,
    cq_size: int = 20 * 6,
    precreate: list[tuple[str, int]] = (),
    unallocated: bool = False,
    wanted: list[frozenset[str] | None] = (),  # type: ignore[assignment]
    modes: tuple[str, str] = ("fast", "general"),
) -> int:
    """``wanted``: the listener's topics of each round (DefaultMessageStore.
    set_arrival_listener), in turn; none: every topic.  ``limits`` are dispatch budgets in
    hinted records, and every record here is hinted: they count records.  Returns the number
    of rounds."""
    log, hints = build_log(records)
    with tempfile.TemporaryDirectory() as tmp:
        sides = [
            Side(os.path.join(tmp, mode), log, mode, slots, index_num, cq_size, list(precreate))
            for mode in modes
        ]
        try:
            for side in sides:
                side.cl.dispatch_hints.extend(hints)

            def listen(rounds: int) -> None:
                topics = wanted[rounds % len(wanted)]
                for side in sides:
                    side.reput.listener_topics = lambda t=topics: None if t is None else set(t)

            def forget_blocks(rounds: int) -> None:
                for side in sides:
                    unallocate(side, rounds)

            rounds = dispatch_in_lockstep(
                sides,
                lambda rounds: limits[rounds % len(limits)] if limits else 1 << 30,
                before_round=listen if wanted else None,
                between_rounds=forget_blocks if unallocated else None,
            )
            if redispatch_from is not None and hints:
                start = hints[redispatch_from % len(hints)]
                for side in sides:
                    side.cl.dispatch_hints.extend(
                        h for h in hints if h.physical_offset >= start.physical_offset
                    )
                    side.reput.reput_from_offset = start.physical_offset
                while True:
                    outs = [side.dispatch(1 << 30) for side in sides]
                    assert outs[0] == outs[1]
                    if not outs[0][1]:
                        break
                states = [side.state() for side in sides]
                assert states[0] == states[1], "after the re-dispatch"
        finally:
            for side in sides:
                side.close()
    return rounds


# No \x01 / \x02: a hint holding one is parsed back, and these fake records cannot be.
CHARS = st.sampled_from(
    [*"ab  Z#", "\u00e9", "\u4e2d", "\U0001f600", "\U00010437", "\ud800", "\uffff", "\x00"]
)
TEXT = st.text(CHARS, max_size=12)
OPT_TEXT = st.one_of(st.none(), st.just(""), TEXT)
TOPICS = st.sampled_from(["T", "Other", "\U0001f600top", "\u00e9t"])


@st.composite
def record_lists(draw):
    n = draw(st.integers(1, 40))
    counters: dict[tuple[str, int], int] = {}
    out = []
    ts = 1_800_000_000_000
    for _ in range(n):
        topic = draw(TOPICS)
        qid = draw(st.integers(0, 2))
        qoff = counters.get((topic, qid), 0)
        if draw(st.integers(0, 30)) == 0:
            qoff += draw(st.integers(-1, 2))  # an odd queue offset now and then
            qoff = max(qoff, 0)
        counters[(topic, qid)] = qoff + 1
        ts += draw(st.integers(0, 3000))
        out.append(
            dict(
                size=draw(st.integers(8, 40)),
                topic=topic,
                qid=qid,
                qoff=qoff,
                tags=draw(OPT_TEXT),
                ts=ts,
                sys_flag=draw(st.sampled_from([0, 0, 0, 0x4, 0x8, 0xC, 0x1, 0x2, 0x5])),
                keys=draw(OPT_TEXT),
                uniq=draw(OPT_TEXT),
            )
        )
    return out


# Each differential test runs the hinted dispatch as built against the general path (behaviour),
# and the C function against its twin (the twin-agreement check of dispatch_hinted).
PAIRS = pytest.mark.parametrize("modes", [("fast", "general"), ("c", "twin")])


@PAIRS
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    records=record_lists(),
    limits=st.lists(st.integers(1, 50), max_size=3),
    redispatch_from=st.one_of(st.none(), st.integers(0, 100)),
    precreate=st.lists(st.tuples(TOPICS, st.integers(0, 2)), max_size=4),
    unallocated=st.booleans(),
    wanted=st.lists(st.one_of(st.none(), st.frozensets(TOPICS)), max_size=3),
)
def test_dispatch_hinted_matches_python_loop(
    modes, records, limits, redispatch_from, precreate, unallocated, wanted
):
    run_both(
        records, limits, redispatch_from, precreate=precreate, unallocated=unallocated,
        wanted=wanted, modes=modes,
    )  # fmt: skip


def rec(i: int, **kw: object) -> dict:
    base = dict(
        size=16,
        topic="T",
        qid=0,
        qoff=i,
        tags="TagA",
        ts=1_800_000_000_000 + i * 1000,
        sys_flag=0,
        keys=None,
        uniq=None,
    )
    base.update(kw)
    return base


@PAIRS
@pytest.mark.parametrize("queues", [31, 32, 33, 70])
def test_a_run_over_more_queues_than_the_c_run_keeps(queues: int, modes: tuple[str, str]) -> None:
    """dispatch_hinted keeps up to 32 queues' state per call and writes them all back when a
    33rd comes: any number of queues in one run ends as the Python loop leaves them."""
    records = [
        rec(i, topic=f"T{i % queues}", qid=i // queues % 2, qoff=i // (2 * queues), uniq=f"u{i}")
        for i in range(3 * queues)
    ]
    # No topic awaited (the listener is never called, so nothing is written back in between),
    # then every topic (written back before each call).
    for wanted in ([frozenset()], [None]):
        run_both(records, [], None, index_num=1000, cq_size=20 * 8, wanted=wanted, modes=modes)
        run_both(records, [7, 40], 5, index_num=1000, cq_size=20 * 8, wanted=wanted, modes=modes)


@PAIRS
def test_blank_keys_first_in_a_fresh_index_file(modes):
    """KEYS of spaces only, no UNIQ_KEY: build_index writes the header (a fresh file's
    index_count 1 goes to disk) and caches the topic's prefix hash; the C run must too."""
    records = [rec(0, keys="k0"), rec(1, keys="k1")]  # topic's prefix cached, queue made
    records += [rec(2 + i, keys="   ") for i in range(3)]
    # index_num 3: entries 1 and 2 fill the first file; the rest go to a fresh one.
    assert run_both(records, [2, 1, 1, 1], None, index_num=3, modes=modes) == 4  # by round


@PAIRS
def test_blank_keys_in_a_new_topic(modes):
    """The prefix-hash cache of a topic first met with blank KEYS."""
    records = [rec(0, keys="k0"), rec(0, topic="New"), rec(1, topic="New", keys="   ")]
    assert run_both(records, [1, 1, 1], None, modes=modes) == 3


class Interrupt(BaseException):
    """Not an Exception: _safe_listener lets it through (as KeyboardInterrupt)."""


async def interrupted_fill(root: str, mode: str) -> tuple:
    from tests.store.helpers import make_message, running_store, small_config

    config = small_config(root, resident_trim_interval=0)
    clock = iter(range(1_800_000_000_000, 1 << 62, 7))
    arrivals: list[tuple] = []
    fail_at = [3]

    def listener(*args: object) -> None:
        arrivals.append(args)
        if len(arrivals) == fail_at[0]:
            raise Interrupt

    with dispatch_mode(mode):
        async with running_store(config, clock_ms=lambda: next(clock)) as store:
            reput = store.reput
            store.set_arrival_listener(listener)
            reput.woken = True  # the puts leave the records to the calls below
            for i in range(6):
                await store.put(make_message(topic="T", keys=f"k{i}", UNIQ_KEY=f"U{i:030d}"))
            with pytest.raises(Interrupt):
                reput._dispatch_some(1 << 30, create_files=True)
            fail_at[0] = -1
            while reput._dispatch_some(1 << 30, create_files=True)[1]:
                pass
            reput.woken = False
            index = store.consume_queues.index.files[-1]
            return (
                reput.reput_from_offset,
                store.consume_queues.logics_msg_timestamp,
                index.index_count,
                bytes(index.mf.mm),
                arrivals,
            )


@PAIRS
async def test_a_listener_interruption_leaves_what_the_python_loop_leaves(tmp_path, modes):
    """The Python loop counts each record as it is done: after an exception from the listener
    the re-dispatch starts at that record (its queue entry kept, its keys indexed then).  The
    C run must not leave the records it already did uncounted (indexed twice on re-dispatch,
    logics_msg_timestamp behind)."""
    native = await interrupted_fill(str(tmp_path / modes[0]), modes[0])
    python = await interrupted_fill(str(tmp_path / modes[1]), modes[1])
    assert native[:3] == python[:3]
    assert native[3] == python[3]
    assert native[4] == python[4]


@PAIRS
@pytest.mark.parametrize("pieces", [31, 32, 33, 40])
def test_many_keys_around_the_c_limit(pieces, modes):
    """Up to DISPATCH_MAX_KEYS keys (UNIQ_KEY included) in C, more left to the loop; index
    files that roll in the middle of a record's keys."""
    keys = "  ".join(f"k{j}\U0001f600" for j in range(pieces - 1))
    records = [rec(0, keys="first")] + [rec(i, keys=keys, uniq=f"U{i}") for i in range(1, 6)]
    assert run_both(records, [1, 2, 3], 2, index_num=70, modes=modes) == 3


@PAIRS
def test_an_error_in_the_middle_of_a_run_writes_back_what_was_done(tmp_path, modes) -> None:
    """An exception part-way through a C run (not from the listener: nothing was written back
    before it) must still leave the queues' and the index's attributes saying what the bytes
    say, as the Python loop leaves them: the write-back on the failure path."""
    records = [rec(i, uniq=f"u{i}") for i in range(3)] + [rec(0, topic="Broken", uniq="ux")]
    log, hints = build_log(records)
    states = []
    for mode in modes:
        side = Side(str(tmp_path / mode), log, mode, 8, 12, 20 * 6, [("T", 0)])
        try:
            side.reput.listener = None  # no listener call: nothing written back in between
            side.table.queues["Broken"] = {0: object()}  # a queue with none of its attributes
            side.cl.dispatch_hints.extend(hints)
            with pytest.raises(AttributeError):
                side.dispatch(1 << 30)
            del side.table.queues["Broken"]
            state = side.state()
            states.append(state[:3] + state[4:])  # not the hints: Python took the bad one's
            cq = side.table.queues["T"][0]
            assert cq.queue.files[-1].wrote_position == 3 * 20
            assert cq.max_physic_offset == 3 * 16
            assert side.index.files[-1].end_phy_offset == 2 * 16
        finally:
            side.table.queues.pop("Broken", None)
            side.close()
    assert states[0] == states[1]
