"""Differential tests of the reput's hinted dispatch against its general path (``_hint_for`` and
``dispatch_fields`` for hinted records, every other record parsed; see
tests/store/helpers.dispatch_mode), and of the C functions against their twins: the same log of
real records, some hinted by the put path and the rest read back (``record_hints``, as for an HA
slave's or recovery's records), dispatched both ways, must leave the same consume queues, index
files (bytes and attributes), arrivals, hints, offsets and ``logics_msg_timestamp`` -- after every
call, not only at the end; and each hint read back is what the Python loop reads of its record."""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pymq.common.message_ext import MessageExt
from pymq.common.record import property_value, read_record_info
from pymq.common.topic import SCHEDULE_TOPIC
from pymq.store import reput as reput_module
from pymq.store.commitlog import DispatchHint, encode_record
from pymq.store.consume_queue_table import ConsumeQueueTable
from pymq.store.index_service import IndexService
from pymq.store.reput import ReputMessageService
from tests.store.helpers import FakeCommitLog, dispatch_mode

logging.getLogger("pymq.store").setLevel(logging.CRITICAL)  # odd queue offsets, index rolls


class Interrupt(BaseException):
    """Not an Exception: _safe_listener lets it through (as KeyboardInterrupt)."""


class Side:
    def __init__(self, root: str, log: bytes, mode: str, slots: int = 8, index_num: int = 12,
                 cq_size: int = 20 * 6, precreate: Any = (),
                 interrupt_at: int = 0) -> None:  # fmt: skip
        clock = iter(range(1_800_000_000_000, 1 << 62, 1000))
        self.index = IndexService(os.path.join(root, "index"), slots, index_num, clock.__next__)
        self.index.ensure_writable_file()
        self.table = ConsumeQueueTable(os.path.join(root, "cq"), cq_size, self.index, [1000])
        for topic, qid in precreate:
            self.table.find_or_create(topic, qid)
        self.cl = FakeCommitLog(log, len(log) + 4096)
        self.reput = ReputMessageService(self.cl, self.table)  # type: ignore[arg-type]
        self.mode, self.calls, self.arrivals, self.read = mode, [], [], 0
        self.reput.listener = self.listen
        self.interrupt_at, self.given = interrupt_at, set()

    def give(self, hints: Any) -> None:
        self.cl.dispatch_hints.extend(hints)
        self.given |= {id(h) for h in hints}

    def listen(self, *a: Any) -> None:
        """Keeps what a listener reads when it is called: its queue's attributes (the C run
        writes them back before it calls the listener; not the index, which the Python loop
        writes after the call)."""
        cq = self.table.queues[a[0]][a[1]]
        self.arrivals.append((a, cq.max_physic_offset, [f.wrote_position for f in cq.queue.files]))
        if len(self.arrivals) == self.interrupt_at:
            raise Interrupt

    def dispatch(self, budget: int) -> object:
        """_dispatch_some in this side's mode; each dispatch_hinted call's answer kept (the C
        function and its twin must split the work alike, not only end alike), and each hint
        read back checked against the Python loop's reading of its record."""
        with dispatch_mode(self.mode):
            hinted, read = reput_module._dispatch_hinted, reput_module._record_hints

            def logged(*args: Any) -> Any:
                out = hinted(*args)
                self.calls.append((*out[:4], type(out[4])))
                return out

            def checked(buf: Any, pos: int, *args: Any) -> Any:
                rows, stop = read(buf, pos, *args)
                for row in rows:
                    self.read += 1
                    info = read_record_info(buf, row.physical_offset, check_crc=False)
                    props = [
                        property_value(info.properties, n) for n in ("TAGS", "KEYS", "UNIQ_KEY")
                    ]
                    assert row == DispatchHint(
                        info.physical_offset, info.size, info.topic, info.queue_id,
                        info.queue_offset, props[0], info.store_timestamp, info.sys_flag,
                        *props[1:],
                    )  # fmt: skip
                return rows, stop

            reput_module._dispatch_hinted, reput_module._record_hints = logged, checked
            try:
                return self.reput._dispatch_some(budget, create_files=True)
            except Interrupt:
                return "interrupted"

    def state(self) -> tuple:
        cqs = [
            (topic, qid, cq.max_physic_offset,
             [(f.file_from_offset, f.wrote_position, bytes(f.mm[: f.file_size]))
              for f in cq.queue.files])
            for topic, by_id in sorted(self.table.queues.items())
            for qid, cq in sorted(by_id.items())
        ]  # fmt: skip
        index = [
            (f.begin_timestamp, f.end_timestamp, f.begin_phy_offset, f.end_phy_offset,
             f.hash_slot_count, f.index_count, bytes(f.mf.mm))
            for f in self.index.files
        ]  # fmt: skip
        given = [h for h in self.cl.dispatch_hints if id(h) in self.given]  # not those read back
        return (cqs, index, list(self.arrivals), given,
                self.reput.reput_from_offset, self.table.logics_msg_timestamp,
                dict(self.index._prefix_hashes))  # fmt: skip

    def close(self) -> None:
        self.table.close()
        self.index.close()


def record(props: bytes, phy: int, topic: str = "T", qid: int = 0, qoff: int = 0, ts: int = 0,
           sys_flag: int = 0, body: bytes = b"body") -> bytes:  # fmt: skip
    """A record at ``phy`` whose PROPERTIES are ``props`` as is (names twice, stray separators:
    what the codec never writes)."""
    msg = MessageExt(topic=topic, body=body, queue_id=qid, queue_offset=qoff, sys_flag=sys_flag,
                     store_timestamp=ts, commitlog_offset=phy,
                     born_host=("10.1.2.3", 5))  # fmt: skip
    data = bytearray(encode_record(msg)[:-2] + len(props).to_bytes(2, "big") + props)
    data[:4] = len(data).to_bytes(4, "big")
    return bytes(data)


def build_log(records: list[dict]) -> tuple[bytes, list[DispatchHint], list[int]]:
    """The records at their offsets, the put path's hints of those with ``hinted``, and
    where each starts."""
    log, hints, starts = b"", [], []
    for r in records:
        starts.append(len(log))
        data = record(r.get("props", b""), len(log), r["topic"], r["qid"], r["qoff"], r["ts"],
                      r["sys_flag"], b"b" * r.get("body", 4))  # fmt: skip
        if r.get("hinted", True):
            hints.append(DispatchHint(len(log), len(data), r["topic"], r["qid"], r["qoff"],
                                      r["tags"], r["ts"], r["sys_flag"], r["keys"],
                                      r["uniq"]))  # fmt: skip
        log += data
    return log, hints, starts


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


def dispatch_in_lockstep(sides: list[Side], limit_of: Callable[[int], int],
                         before_round: Callable[[int], None]) -> int:  # fmt: skip
    """Dispatch both sides round by round, ``limit_of(round)`` records a round, until neither has
    more: after each round both returned the same and hold the same.  Before each round
    ``before_round(rounds done)``, after it the index files roll as _do_reput_locked's prepare
    rolls them.  Returns the number of rounds."""
    rounds = 0
    while True:
        before_round(rounds)
        outs = [side.dispatch(limit_of(rounds)) for side in sides]
        assert outs[0] == outs[1]
        if {sides[0].mode, sides[1].mode} == {"c", "twin"}:
            assert sides[0].calls == sides[1].calls
        rounds += 1
        if outs[0] == "interrupted":  # the C run counts the record whose listener raised as
            continue  # done, the loop does it again (its entry kept): compared after that
        states = [side.state() for side in sides]
        assert states[0] == states[1], f"after round {rounds - 1}"
        if not outs[0][1]:  # type: ignore[index]
            return rounds
        if sides[0].index.needs_new_file():
            for side in sides:
                side.index._roll(side.index._new_file_blocking())


def run_both(records: list[dict], limits: list[int] = (), redispatch_from: int | None = None,  # type: ignore[assignment]
             unallocated: bool = False, wanted: list[Any] = (),  # type: ignore[assignment]
             modes: tuple[str, str] = ("fast", "general"),
             **side: Any) -> tuple[int, int]:  # fmt: skip
    """``wanted``: the listener's topics of each round (DefaultMessageStore.
    set_arrival_listener), in turn; none: every topic.  ``limits``: the budgets of each round,
    in turn, a read-back or parsed record weighing as a hinted one (HINTED_PER_PARSED 1).
    ``redispatch_from``: afterwards the records from that one dispatched again (as after
    recovery).  Returns (rounds, hints read back on the first side)."""
    log, hints, starts = build_log(records)
    weight, reput_module.HINTED_PER_PARSED = reput_module.HINTED_PER_PARSED, 1
    with tempfile.TemporaryDirectory() as tmp:
        sides = [Side(os.path.join(tmp, mode), log, mode, **side) for mode in modes]
        try:
            for s in sides:
                s.give(hints)

            def before_round(rounds: int) -> None:
                for s in sides:
                    if wanted:
                        topics = wanted[rounds % len(wanted)]
                        s.reput.listener_topics = lambda t=topics: None if t is None else set(t)
                    if unallocated:
                        unallocate(s, rounds)

            rounds = dispatch_in_lockstep(
                sides,
                lambda rounds: limits[rounds % len(limits)] if limits else 1 << 30,
                before_round,
            )
            assert sides[0].reput.reput_from_offset == len(log)
            if redispatch_from is not None and records:
                at = starts[redispatch_from % len(records)]
                for s in sides:
                    s.give([h for h in hints if h.physical_offset >= at])
                    s.reput.reput_from_offset = at
                dispatch_in_lockstep(sides, lambda rounds: 1 << 30, lambda rounds: None)
            return rounds, sides[0].read
        finally:
            reput_module.HINTED_PER_PARSED = weight
            for s in sides:
                s.close()


# No \x01 / \x02 in hints: one holding one is parsed back, so its text is never read.
CHARS = st.sampled_from(
    [*"ab  Z#", "\u00e9", "\u4e2d", "\U0001f600", "\U00010437", "\ud800", "\uffff", "\x00"]
)
OPT_TEXT = st.one_of(st.none(), st.just(""), st.text(CHARS, max_size=12))
TOPICS = st.sampled_from(["T", "Other", "\U0001f600top", "\u00e9t", SCHEDULE_TOPIC])
# What a record read back holds: plain properties, and each kind the Python loop must judge.
PROPS = st.sampled_from([
    b"", b"TAGS\x01TagA\x02", b"TAGS\x01TagB\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01U\x02",
    b"KEYS\x01k\x02TAGS\x01t",
    b"KEYS\x01  \x02", b"DELAY\x013\x02TAGS\x01d\x02", b"UNIQ_KEY\x01AC11\x02WAIT\x01true\x02",
    b"TAGS\x01a\x02TAGS\x01b\x02", b"KEYS\x01\x02", b"\x01v\x02", b"KEYS\x01a\x01b\x02", b"TAGS",
    b"TAGS\x01\xe6\xa0\x87\x02", b"TAGS\x01a\x00b\x02", b"KEYS\x01\xe4\xb8\xad\x02X\x01y",
])  # fmt: skip


@st.composite
def record_lists(draw: st.DrawFn) -> list[dict]:
    counters: dict[tuple[str, int], int] = {}
    out = []
    ts = 1_800_000_000_000
    for _ in range(draw(st.integers(1, 40))):
        topic, qid = draw(TOPICS), draw(st.integers(0, 2))
        qoff = counters.get((topic, qid), 0)
        if draw(st.integers(0, 30)) == 0:
            qoff = max(qoff + draw(st.integers(-1, 2)), 0)  # an odd queue offset now and then
        counters[(topic, qid)] = qoff + 1
        ts += draw(st.integers(0, 3000))
        out.append(dict(
            topic=topic, qid=qid, qoff=qoff, tags=draw(OPT_TEXT), ts=ts,
            sys_flag=draw(st.sampled_from([0, 0, 0, 0x4, 0x8, 0xC, 0x1, 0x2, 0x5])),
            keys=draw(OPT_TEXT), uniq=draw(OPT_TEXT), hinted=draw(st.booleans()), props=draw(PROPS),
            body=draw(st.integers(0, 40)),
        ))  # fmt: skip
    return out


# Each test runs the hinted dispatch as built against the general path (behaviour), and the C
# functions against their twins (the twin-agreement check of dispatch_hinted and record_hints).
PAIRS = pytest.mark.parametrize("modes", [("fast", "general"), ("c", "twin")])


@PAIRS
@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
@given(
    records=record_lists(),
    limits=st.lists(st.integers(1, 50), max_size=3),
    redispatch_from=st.one_of(st.none(), st.integers(0, 100)),
    precreate=st.lists(st.tuples(TOPICS, st.integers(0, 2)), max_size=4),
    unallocated=st.booleans(),
    wanted=st.lists(st.one_of(st.none(), st.frozensets(TOPICS)), max_size=3),
)
def test_dispatch_hinted_matches_python_loop(modes, records, limits, redispatch_from, precreate,
                                             unallocated, wanted):  # fmt: skip
    run_both(records, limits, redispatch_from, unallocated, wanted, modes, precreate=precreate)


def rec(i: int, **kw: object) -> dict:
    return dict(topic="T", qid=0, qoff=i, tags="TagA", ts=1_800_000_000_000 + i * 1000, sys_flag=0,
                keys=None, uniq=None) | kw  # fmt: skip


def _many_queues(queues: int) -> list[dict]:
    return [rec(i, topic=f"T{i % queues}", qid=i // queues % 2, qoff=i // (2 * queues),
                uniq=f"u{i}") for i in range(3 * queues)]  # fmt: skip


def _many_keys(pieces: int) -> list[dict]:
    keys = "  ".join(f"k{j}\U0001f600" for j in range(pieces - 1))
    return [rec(0, keys="first")] + [rec(i, keys=keys, uniq=f"U{i}") for i in range(1, 6)]


# Cases the property seldom draws: (records, run_both's arguments, (rounds, hints read back)).
CASES = [
    # dispatch_hinted keeps up to 32 queues' state per call and writes them all back when a 33rd
    # comes; no topic awaited (nothing written back in between), then every topic.
    *[(_many_queues(n), dict(limits=limits, redispatch_from=again, wanted=[wanted], index_num=1000,
                             cq_size=20 * 8), None)
      for n in (31, 32, 33, 70) for wanted in (frozenset(), None)
      for limits, again in (((), None), ((7, 40), 5))],
    # KEYS of spaces only, no UNIQ_KEY, first in a fresh index file: build_index writes the
    # header and caches the topic's prefix hash; the C run must too (index_num 3: a roll).
    ([rec(0, keys="k0"), rec(1, keys="k1"), *[rec(2 + i, keys="   ") for i in range(3)]],
     dict(limits=[2, 1, 1, 1], index_num=3), (4, 0)),
    ([rec(0, keys="k0"), rec(0, topic="New"), rec(1, topic="New", keys="   ")], dict(limits=[1]),
     (3, 0)),
    # Up to DISPATCH_MAX_KEYS keys (UNIQ_KEY included) in C, more left to the loop; index files
    # rolling in the middle of a record's keys.
    *[(_many_keys(n), dict(limits=[1, 2, 3], redispatch_from=2, index_num=70), (3, 0))
      for n in (31, 32, 33, 40)],
    # Read back: the common records, at most max_rows a call; stops at each kind to judge.
    ([rec(i, hinted=False, props=p, qid=i, sys_flag=4 * (i == 2)) for i, p in enumerate([
        b"", b"UNIQ_KEY\x01AC11000100002A9F0000000000000000\x02WAIT\x01true\x02",
        b"TAGS\x01TagA\x02KEYS\x01order-1 order-2\x02UNIQ_KEY\x01U1\x02CLUSTER\x01C\x02",
        b"KEYS\x01k\x02TAGS\x01t", b"MIN_OFFSET\x010\x02MAX_OFFSET\x019\x02"])],
     dict(limits=[2]), (3, 5)),
    *[([rec(0, hinted=False, props=b"TAGS\x01x\x02"), rec(1, hinted=False, props=odd),
        rec(2, hinted=False, props=b"TAGS\x01y\x02")], {}, (1, 2))
      for odd in (b"TAGS\x01a\x02TAGS\x01b\x02", b"KEYS\x01\x02", b"\x01v\x02",
                  b"KEYS\x01a\x01b\x02", b"TAGS", b"TAGS\x01\xe6\xa0\x87\x02",
                  b"TAGS\x01a\x00b\x02")],
    ([rec(0, hinted=False), rec(1, hinted=False, topic=SCHEDULE_TOPIC, props=b"DELAY\x013\x02"),
      rec(2, hinted=False)], {}, (1, 2)),
    # The listener interrupted (at its 1st to 3rd call): the C run must count the records it
    # did (else indexed twice on re-dispatch, logics_msg_timestamp behind).
    *[([rec(i, keys=f"k{i}", uniq=f"U{i}",
            props=b"KEYS\x01k%d\x02UNIQ_KEY\x01U%d\x02TAGS\x01TagA" % (i, i)) for i in range(4)],
       dict(interrupt_at=n), None) for n in (1, 2, 3)],
]  # fmt: skip


@PAIRS
@pytest.mark.parametrize("case", range(len(CASES)))
def test_dispatch_hinted_cases(case: int, modes: tuple[str, str]) -> None:
    records, kwargs, expected = CASES[case]
    got = run_both(records, modes=modes, **kwargs)
    assert expected is None or got == expected


def test_a_misplaced_or_blank_record_is_not_read_back() -> None:
    first = record(b"", 0)
    blank = (8).to_bytes(4, "big") + (0xCBD43194).to_bytes(4, "big")
    for log in (first + record(b"", 12345), first + blank):  # not at its own offset; a blank
        rows, stop = reput_module._record_hints(log, 0, len(log), 0, 9, b"S", DispatchHint)
        assert len(rows) == 1 and stop == len(first)
    assert reput_module._record_hints(first[:-1], 0, len(first) - 1, 0, 9, b"S", None) == ([], 0)


@PAIRS
def test_an_error_in_the_middle_of_a_run_writes_back_what_was_done(tmp_path, modes) -> None:
    """An exception part-way through a C run (not from the listener: nothing was written back
    before it) must still leave the queues' and the index's attributes saying what the bytes
    say, as the Python loop leaves them: the write-back on the failure path."""
    records = [rec(i, uniq=f"u{i}") for i in range(3)] + [rec(0, topic="Broken", uniq="ux")]
    log, hints, _ = build_log(records)
    states = []
    for mode in modes:
        side = Side(str(tmp_path / mode), log, mode, precreate=[("T", 0)])
        try:
            side.reput.listener = None  # no listener call: nothing written back in between
            side.table.queues["Broken"] = {0: object()}  # a queue with none of its attributes
            side.give(hints)
            with pytest.raises(AttributeError):
                side.dispatch(1 << 30)
            del side.table.queues["Broken"]
            state = side.state()
            states.append(state[:3] + state[4:])  # not the hints: Python took the bad one's
            cq = side.table.queues["T"][0]
            assert cq.queue.files[-1].wrote_position == 3 * 20
            assert cq.max_physic_offset == hints[2].physical_offset + hints[2].size
            assert side.index.files[-1].end_phy_offset == hints[2].physical_offset
        finally:
            side.table.queues.pop("Broken", None)
            side.close()
    assert states[0] == states[1]
