"""The two C calls of a run of single sends (SendProcessor._send_singles and _answer_singles):
``_recordc.send_run_fields`` reads and takes, frame for frame, what ``send_fields`` called on
each frame and the Python checks would (the entries, their fields, where it stops, and the
topic judged once per change), and ``send_answer_run`` writes byte for byte the frames
``send_answer_frame`` writes for each put, with the totals the broker's statistics count."""

from __future__ import annotations

import contextlib
import struct
import sys
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pymq.broker.processors import send
from pymq.common.message_id import offset_msg_id
from pymq.remoting import codec
from pymq.remoting.codec import RemotingCommand, decode_frame, encode
from pymq.remoting.headers import SendMessageRequestHeader
from pymq.store.commitlog import DispatchHint
from tests.helpers import implementations, mangled, send_tier_functions
from tests.integration.test_send_raw import _items, batch_frame, cpp_frame, ext_for, frame
from tests.integration.test_send_run import run_of

native_extension = send_tier_functions()


COUNTS = {"T1": 4, "Topic-2": 2, "Zero": 0}  # a topic's queue count; others: None (unjudged)


def reference(buf: bytes, bounds: list[int], first: int, stop: int, judge) -> tuple:
    """The Python loop send_run_fields replaces: send_fields of each frame and its checks."""
    entries: list[tuple] = []
    parsed: list[tuple] = []
    last, count = None, None
    for i in range(first, stop):
        end = bounds[2 * i + 1]
        fields = native_extension.send_fields(buf, bounds[2 * i], end)
        if fields is None:
            return i, fields, entries, parsed
        (_, topic, queue_id, sys_flag, born, flag, props, reconsume, body_at, batch) = fields
        if batch or sys_flag & 0xC:  # a batch, or a transaction's half or rollback
            return i, fields, entries, parsed
        if last is None or topic != last:
            count, last = judge(topic), topic
        if count is None or not 0 <= queue_id < count:
            return i, fields, entries, parsed
        entries.append(
            (topic, queue_id, buf[body_at:end], props or "", flag, sys_flag, born, reconsume or 0)
        )
        parsed.append(fields)
    return stop, None, entries, parsed


# send_run_fields and send_answer_run: C's and their twins (the twins alone under
# PYMQ_PURE_PYTHON=1), each checked against the Python loop of send_fields / send_answer_frame.
RUN_FIELDS = pytest.mark.parametrize(
    "run_fields",
    implementations("pymq.remoting._codecc", "send_run_fields", codec.send_run_fields_py),
)
ANSWER_RUN = pytest.mark.parametrize(
    "answer_run", implementations("pymq.broker._sendc", "send_answer_run", send.send_answer_run_py)
)


def fast(run_fields, buf: bytes, bounds: list[int], first: int, stop: int, judge) -> tuple:
    entries: list[tuple] = []
    parsed: list[tuple] = []
    i, fields = run_fields(buf, bounds, first, stop, judge, entries, parsed)
    return i, fields, entries, parsed


FRAME = st.one_of(
    st.builds(
        lambda topic, queue_id, props: frame(ext_for(topic, queue_id, props)),
        st.sampled_from(["T1", "T1", "Topic-2", "Zero", "Unjudged"]),
        st.integers(-1, 5),
        st.sampled_from(["", None, "TAGS\x01a\x02WAIT\x01true", "UNIQ_KEY\x01AB\x02WAIT\x01false"]),
    ),
    st.builds(lambda topic: batch_frame(topic, _items(2)), st.sampled_from(["T1", "Topic-2"])),
    st.builds(lambda topic: cpp_frame(topic, "TAGS\x01t"), st.sampled_from(["T1", "Topic-2"])),
    st.just(frame(ext_for("T1"), code=36)),  # another request: not a send
    st.just(frame(ext_for("T1", 1, f="4"))),  # a transaction's half: the store's, as a message
    st.just(frame(ext_for("Topic-2", 0, f="12"))),  # a rollback: the same
    st.just(frame(ext_for("T1", g="12x"))),  # a born timestamp that is no number
    st.just(encode(RemotingCommand(310, {}, b"b", 5, 0))),  # no fields
)


@st.composite
def damaged_header(draw: st.DrawFn, sound: bytes) -> bytes:
    """``sound`` with bytes of the JSON grammar changed, cut or added in its header (the
    length fields made to fit, so that the damage is read)."""
    (length,) = struct.unpack_from(">i", sound, 4)
    header = mangled(draw, sound[8 : 8 + length], b'"\\{}[],:-.0e19 \x00\x7f\x80tnuabm')
    body = sound[8 + length :]
    return struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body


ODD_SENDS = st.sampled_from(
    [frame(ext_for("T1", AccessKey="ak", Signature="c2ln")), frame(ext_for("T1"), flag=1),
     frame(ext_for("T1"), remark="r"), frame(ext_for("T1", h="-1", j="3", k="true")),
     frame(ext_for("T1", h="5", j="3")), frame(ext_for("T1", m="true")),
     batch_frame("T1", _items(1), m="false"), frame({**ext_for("T1"), "topic": "T"}),
     frame(ext_for("T1"), code=10), cpp_frame("T1", "", unitMode=False, batch=None),
     # The group and default topic are read, not kept: escapes, odd bytes and empty text.
     frame(ext_for("T1", a='G"q\\\x01/')), frame(ext_for("T1", c="TBW\u00e9")),
     frame(ext_for("T1", a="", c="")), frame(ext_for("T1", a="\u00e9"))]
)  # fmt: skip


@pytest.mark.parametrize(
    "send_fields", implementations("pymq.remoting._codecc", "send_fields", codec.send_fields_py)
)
@settings(max_examples=300, deadline=None)
@given((FRAME | ODD_SENDS).flatmap(lambda f: st.just(f) | damaged_header(f)))
def test_send_fields_reads_what_the_usual_path_reads(send_fields, data: bytes) -> None:
    """send_fields (C, and its twin) of a frame, sound or damaged, gives the fields decode_frame
    and the send header's from_ext read of a plain send or batch (a batch by its code and its
    header alike), or leaves it to them."""
    got = send_fields(data, 4, len(data))
    if got is not None:
        cmd = decode_frame(data[4:])
        assert cmd.header_error is None and cmd.code in (10, 310, 320) and cmd.flag == 0
        head = SendMessageRequestHeader.from_ext(cmd.code, cmd.ext_fields)
        assert got == (
            cmd.opaque, head.topic, head.queue_id, head.sys_flag, head.born_timestamp, head.flag,
            head.properties, head.reconsume_times, len(data) - len(cmd.body), head.batch,
        )  # fmt: skip
        assert head.batch is (cmd.code == 320)  # a batch's body is read as one by its code
    elif data in (frame(ext_for("T1")), frame(ext_for("T1", h="5", j="3"))):
        pytest.fail("a plain send left to the usual path")


@pytest.mark.parametrize("name", ["send_fields", "send_answer_fields"])
def test_the_frame_readers_read_any_buffer_inside_its_bounds(name: str) -> None:
    """send_fields and send_answer_fields (C, and their twins): bytes, bytearray, memoryview
    alike; bounds past the buffer or the wrong way round, a cut frame: None; bounds out of
    range or not ints, a str: refused."""
    data = frame(ext_for("T1", 3))
    if name == "send_answer_fields":
        data = native_extension.send_answer_frame(77, "0A0B", 3, 12345, b'"R"', True, 401)
    twin = getattr(codec, name + "_py")
    for fn in [p.values[0] for p in implementations("pymq.remoting._codecc", name, twin)]:
        want = fn(data, 4, len(data))
        assert want is not None and want[1:3] == (
            ("T1", 3) if name == "send_fields" else ("0A0B", 3)
        )
        for kind in (bytearray, memoryview):
            assert fn(kind(data), 4, len(data)) == want
        for args in ((data, 4, len(data) + 1), (data, len(data), 4), (data[:6], 4, 6)):
            assert fn(*args) is None
        refused: list[tuple[tuple[Any, ...], type[Exception]]] = [
            ((data, -1, len(data)), OverflowError),
            ((data, 4, 2**63), OverflowError),
            ((data, "4", len(data)), TypeError),
            ((data.decode("latin-1"), 4, len(data)), TypeError),
        ]
        for bad, raised in refused:
            with pytest.raises(raised):
                fn(*bad)


@RUN_FIELDS
@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        FRAME | FRAME | FRAME.flatmap(lambda f: st.composite(mangled)(f)), min_size=1, max_size=8
    ),
    st.data(),
)
def test_send_run_fields_takes_what_the_python_loop_takes(
    run_fields, frames: list[bytes], data
) -> None:
    buf, bounds = run_of(frames)
    if data.draw(st.booleans()):  # bounds off by a few bytes, some past the buffer
        bounds = [max(0, b + data.draw(st.integers(-8, 8))) for b in bounds]
    first = data.draw(st.integers(0, len(frames) - 1))
    stop = data.draw(st.integers(first, len(frames)))
    counts = data.draw(
        st.dictionaries(
            st.sampled_from(["T1", "Topic-2", "Zero", "Unjudged"]),
            st.one_of(st.none(), st.integers(-3, 8)),
        )
    )
    calls: list[str] = []

    def judge(topic: str) -> int | None:
        calls.append(topic)
        return counts.get(topic)

    want = reference(buf, bounds, first, stop, counts.get)
    assert fast(run_fields, buf, bounds, first, stop, judge) == want
    # Judged once per change of topic among the frames it read.
    read = [native_extension.send_fields(buf, bounds[2 * k], bounds[2 * k + 1])
            for k in range(first, min(want[0] + 1, stop))]  # fmt: skip
    topics = [f[1] for f in read if f is not None and not f[9] and not f[3] & 0xC]
    assert calls == [t for k, t in enumerate(topics) if k == 0 or topics[k - 1] != t]


@RUN_FIELDS
def test_send_run_fields_stops_where_the_judge_says(run_fields) -> None:
    frames = [frame(ext_for("T1", 0)), frame(ext_for("T1", 3)), frame(ext_for("Topic-2", 1))]
    frames += [frame(ext_for("Topic-2", 2)), frame(ext_for("T1", 1))]
    buf, bounds = run_of(frames)
    i, fields, entries, parsed = fast(run_fields, buf, bounds, 0, 5, COUNTS.get)
    assert i == 3 and fields is not None and fields[1] == "Topic-2" and fields[2] == 2
    assert [(e[0], e[1]) for e in entries] == [("T1", 0), ("T1", 3), ("Topic-2", 1)]
    assert [f[0] for f in parsed] == [77, 77, 77]
    assert entries[0][2] == b"body-%d" % len(ext_for("T1", 0))
    i, fields, entries, _ = fast(run_fields, buf, bounds, 0, 5, lambda topic: None)
    assert (i, entries) == (0, []) and fields is not None and fields[1] == "T1"
    # A transaction's half (or rollback) is no send the run takes (send_fields: None): the
    # run stops there, its topic not judged, the frames after it not read.
    for flag in ("4", "12"):
        half = frame(ext_for("Topic-2", 0, f=flag))
        buf, bounds = run_of([frames[0], half, b"\x00" * 12])
        judged: list[str] = []
        i, fields, entries, _ = fast(run_fields, buf, bounds, 0, 3, _judging(judged))
        assert (i, fields, judged, len(entries)) == (1, None, ["T1"], 1)


def _judging(judged: list[str]) -> Callable[[str], int]:
    """A judge that notes the topics it is asked about; every queue count 4."""

    def judge(topic: str) -> int:
        judged.append(topic)
        return 4

    return judge


def test_send_run_fields_refuses_bad_arguments_and_raises_what_the_judge_raises() -> None:
    buf, bounds = run_of([frame(ext_for("T1", 0)), frame(ext_for("T1", 1))])
    f = native_extension.send_run_fields
    with pytest.raises(TypeError):
        f(buf, tuple(bounds), 0, 2, COUNTS.get, [], [])
    with pytest.raises(TypeError):
        f(buf, bounds, 0, 2, None, [], [])
    with pytest.raises(ValueError, match="past the bounds"):
        f(buf, bounds[:3], 0, 2, COUNTS.get, [], [])
    with pytest.raises(OverflowError):
        f(buf, bounds, -1, 2, COUNTS.get, [], [])
    # A frame past the buffer is no send (as send_fields reads it).
    assert f(buf, [0, len(buf) + 10, 0, 1], 0, 1, COUNTS.get, [], []) == (0, None)
    entries: list[tuple] = []
    with pytest.raises(ZeroDivisionError):
        f(buf, bounds, 0, 2, lambda topic: 1 // 0, entries, [])
    assert entries == []
    with pytest.raises(TypeError):
        f(buf, bounds, 0, 2, lambda topic: "4", [], [])

    def shrink(topic: str) -> int:  # a judge that changes the bounds meanwhile
        del bounds[2:]
        return 4

    with pytest.raises(ValueError, match="past the bounds"):
        f(buf, bounds, 0, 2, shrink, [], [])


def test_send_run_fields_leaks_nothing() -> None:
    frames = [frame(ext_for("T1", 0, "TAGS\x01a")), cpp_frame("T1", "TAGS\x01t")]
    frames += [frame(ext_for("T1", 9)), batch_frame("T1", _items(2))]
    buf, bounds = run_of(frames)
    judges = [COUNTS.get, lambda topic: None, lambda topic: 1 // 0]

    def rounds() -> None:
        for _ in range(2000):
            for judge in judges:
                for first in range(4):
                    with contextlib.suppress(ZeroDivisionError):
                        native_extension.send_run_fields(buf, bounds, first, 4, judge, [], [])

    rounds()
    before = sys.gettotalrefcount() if hasattr(sys, "gettotalrefcount") else None
    # The topic's str: a reference leaked to it shows in its count when the parser hands out
    # one cached object, and in the memory traced when it makes a new one each time.
    topic = native_extension.send_fields(buf, bounds[0], bounds[1])[1]
    topic_refs = sys.getrefcount(topic)
    tracemalloc.start()
    rounds()
    first_peak = tracemalloc.get_traced_memory()[0]
    rounds()
    grown = tracemalloc.get_traced_memory()[0] - first_peak
    tracemalloc.stop()
    assert grown < 64 * 1024, grown
    assert sys.getrefcount(topic) - topic_refs < 100
    if before is not None:
        assert sys.gettotalrefcount() - before < 100


HINT = st.builds(
    lambda phy, size, topic, queue_id, queue_offset: DispatchHint(
        phy, size, topic, queue_id, queue_offset, None, 0, 0, None, None
    ),
    st.integers(0, 2**63 - 1),
    st.integers(0, 2**31 - 1),
    st.sampled_from(["T1", "T1", "Topic-2", "\u00e9t\u00e9"]),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**63), 2**63 - 1),
)


def totals_of(hints: list[DispatchHint]) -> list[tuple]:
    """SendProcessor._count_puts' calls: (topic, count, size) per run of one topic."""
    out: list[list] = []
    for hint in hints:
        if out and out[-1][0] == hint.topic:
            out[-1][1] += 1
            out[-1][2] += hint.size
        else:
            out.append([hint.topic, 1, hint.size])
    return [tuple(row) for row in out]


@ANSWER_RUN
@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(-(2**31), 2**31 - 1), HINT), max_size=12),
    st.integers(0, 3),
    st.sampled_from(["7F00000100002A9F", "C0A8000100000000", ""]),
    st.sampled_from([b'"DefaultRegion"', b'"R\\u00e9gion"', b'""']),
    st.booleans(),
    st.integers(-(2**31), 2**31 - 1),
)
def test_send_answer_run_writes_each_answer_as_send_answer_frame(
    answer_run, rows: list[tuple], extra: int, prefix: str, region: bytes, trace: bool, version: int
) -> None:
    parsed = [(opaque, "T1") for opaque, _ in rows] + [(1, "x")] * extra  # may be longer
    hints = [hint for _, hint in rows]
    joined, totals = answer_run(parsed, hints, prefix, region, trace, version)
    want = b"".join(
        native_extension.send_answer_frame(
            opaque, offset_msg_id(prefix, hint.physical_offset), hint.queue_id,
            hint.queue_offset, region, trace, version,
        )
        for opaque, hint in rows
    )  # fmt: skip
    assert joined == want
    assert [tuple(t) for t in totals] == totals_of(hints)


def test_send_answer_run_refuses_what_it_cannot_write() -> None:
    hint = DispatchHint(5, 10, "T1", 0, 0, None, 0, 0, None, None)
    run = native_extension.send_answer_run
    with pytest.raises(ValueError, match="fewer fields"):
        run([], [hint], "AB", b'"R"', False, 1)
    with pytest.raises(ValueError, match="prefix"):
        run([(1,)], [hint], "\u00e9", b'"R"', False, 1)
    with pytest.raises(ValueError, match="prefix"):
        run([(1,)], [hint], "A" * 65, b'"R"', False, 1)
    with pytest.raises(TypeError):
        run([(1,)], [(1, 2)], "AB", b'"R"', False, 1)  # a hint too short
    with pytest.raises(TypeError):
        run([[1]], [hint], "AB", b'"R"', False, 1)  # fields not a tuple
    with pytest.raises(TypeError):
        run([(1,)], (hint,), "AB", b'"R"', False, 1)  # hints not a list
    with pytest.raises(OverflowError):
        run([(2**31,)], [hint], "AB", b'"R"', False, 1)  # an opaque no int32
    with pytest.raises(ValueError, match="region is too long"):
        run([(1,)], [hint], "AB", b'"' + b"r" * 0xFFFFFF + b'"', False, 1)
    with pytest.raises(ValueError, match="an answer too long"):  # the region fits, its answer not
        run([(1,)], [hint], "AB", b'"' + b"r" * 0xFFFFFD + b'"', False, 1)
    assert run([], [], "AB", b'"R"', False, 1) == (b"", [])


def test_python_code_run_by_the_arguments_cannot_pull_them_away() -> None:
    """Items whose __index__ or __eq__ runs Python that empties the lists being read: an error
    or a result, never a read of freed memory (each crashed the first version)."""
    data = frame(ext_for("T1", 0))
    bounds: list = []

    class Start:
        def __index__(self) -> int:
            bounds.clear()
            return 4

    bounds += [Start(), len(data)]
    assert native_extension.send_run_fields(data, bounds, 0, 1, lambda t: 4, [], []) == (1, None)

    hints: list = []

    class Topic(str):
        def __eq__(self, other: object) -> bool:
            hints.clear()
            return False

        __hash__ = str.__hash__

    hints += [(1, 10, Topic("A"), 0, 0), (2, 10, Topic("B" * 100), 0, 0), (3, 10, "C", 0, 0)]
    with pytest.raises(ValueError, match="changed"):
        native_extension.send_answer_run([(1,), (2,), (3,)], hints, "AB", b'"R"', False, 1)

    for victim in ("hints", "parsed"):
        lists: dict[str, list] = {"hints": [], "parsed": [(1,), (2,)]}
        emptied = lists[victim]

        class Offset:
            def __index__(self, emptied: list = emptied) -> int:
                emptied.clear()
                return 5

        # Long tuples: past the tuple free list, so that a hint let go is really freed.
        lists["hints"] += [(Offset(), 10, "T", 0, 0) + (None,) * 20, (6, 10, "T", 0, 0)]
        with pytest.raises(ValueError, match="changed"):
            native_extension.send_answer_run(
                lists["parsed"], lists["hints"], "AB", b'"R"', False, 1
            )
