"""A connection's state without a socket: runs of frames, calls in flight, tasks, budgets."""

from __future__ import annotations

import pytest

from pymq.remoting.codec import RPC_TYPE_RESPONSE, RemotingCommand, decode_frame_at, encode
from pymq.remoting.connection import Call, CallTable, Connection
from pymq.remoting.errors import ProtocolError, RemotingConnectError, RemotingTimeoutError
from pymq.remoting.limits import ConnectionLimits, SharedBudget


def frames(n: int, start: int = 1) -> bytes:
    out = []
    for opaque in range(start, start + n):
        cmd = RemotingCommand.request(105, {"topic": "T"})
        cmd.opaque = opaque
        out.append(encode(cmd))
    return b"".join(out)


def opaques(run) -> list[int]:
    return [
        decode_frame_at(run.buf, run.bounds[2 * i], run.bounds[2 * i + 1]).opaque
        for i in range(run.first, run.stop)
    ]


def test_frames_are_served_in_runs_oldest_read_first() -> None:
    budget = SharedBudget()
    conn = Connection(ConnectionLimits(), budget)
    conn.receive(frames(5), received=1.0, now=1.0)
    conn.receive(frames(2, start=6), received=2.0, now=2.0)
    assert conn.queued_reads == 2 and budget.partial_frame_total == conn.inbox_bytes > 0
    runs = []
    while (run := conn.next_run(3)) is not None:
        runs.append((opaques(run), run.received, run.total))
    assert runs == [([1, 2, 3], 1.0, 5), ([4, 5], 1.0, 5), ([6, 7], 2.0, 2)]
    assert not conn.inbox and conn.inbox_bytes == 0 and budget.partial_frame_total == 0


def test_a_frame_split_across_reads_is_served_once_whole() -> None:
    budget = SharedBudget()
    conn = Connection(ConnectionLimits(), budget)
    data = frames(1)
    conn.receive(data[:10], received=1.0, now=1.0)
    assert not conn.inbox
    assert conn.partial.started == 1.0 and budget.partial_frame_total == 10
    conn.receive(data[10:], received=3.0, now=3.0)
    run = conn.next_run(32)
    assert run is not None and opaques(run) == [1] and run.received == 3.0
    assert conn.partial.started is None and budget.partial_frame_total == 0


def test_a_frames_deadline_starts_with_that_frame() -> None:
    """Frames streamed so that every read ends inside the next one: each read that completes
    a frame starts the clock of the one it leaves in progress (the connection's
    frame_receive_timeout is per frame, not per unbroken stream)."""
    conn = Connection(ConnectionLimits())
    data = frames(3)
    size = len(data) // 3
    conn.receive(data[: size // 2], received=1.0, now=1.0)
    assert conn.partial.started == 1.0
    conn.receive(data[size // 2 : size + 5], received=2.0, now=2.0)  # ends 1, begins 2
    assert conn.partial.started == 2.0
    conn.receive(data[size + 5 : size + 9], received=3.0, now=3.0)  # more of frame 2
    assert conn.partial.started == 2.0
    conn.receive(data[size + 9 :], received=4.0, now=4.0)  # ends 2 and 3: nothing in progress
    assert conn.partial.started is None


def test_a_bad_stream_is_refused_after_the_sound_frames_before_it() -> None:
    conn = Connection(ConnectionLimits())
    conn.receive(frames(2) + b"\xff\xff\xff\xff", received=0.0, now=0.0)
    run = conn.next_run(32)
    assert run is not None and opaques(run) == [1, 2]
    assert conn.decoder.broken is not None
    with pytest.raises(ProtocolError):
        conn.receive(frames(1), received=0.0, now=0.0)
    with pytest.raises(ProtocolError):  # a bad stream with nothing sound before it
        Connection(ConnectionLimits()).receive(b"\x00\x00\x00\x00", received=0.0, now=0.0)


def test_read_ahead_stops_at_a_frames_worth_or_when_the_server_is_over_budget() -> None:
    budget = SharedBudget(partial_frame_total_max=1 << 30)
    conn = Connection(ConnectionLimits(max_frame_length=4096), budget)
    assert conn.may_read_ahead()
    while conn.inbox_bytes < 4096:
        conn.receive(frames(10), received=0.0, now=0.0)
    assert not conn.may_read_ahead()
    other = Connection(ConnectionLimits(), SharedBudget(partial_frame_total_max=100))
    other.receive(frames(10), received=0.0, now=0.0)
    assert not other.may_read_ahead()


def test_tasks_are_capped_per_connection() -> None:
    conn = Connection(ConnectionLimits(max_pending_requests=2))
    assert conn.start_task() and conn.start_task()
    assert not conn.start_task()
    conn.task_done()
    assert conn.start_task() and conn.tasks == 2


def response(opaque: int) -> RemotingCommand:
    return RemotingCommand(0, opaque=opaque, flag=RPC_TYPE_RESPONSE)


def test_responses_complete_the_calls_they_answer() -> None:
    table = CallTable()
    woken: list[int] = []
    awaited = Call(wake=lambda: woken.append(1))
    outcomes: list[tuple] = []
    table.add(1, awaited)
    table.add(2, Call(callback=lambda r, e: outcomes.append((r.opaque, e)), deadline=10.0))
    assert len(table) == 2 and table.timed == 1
    assert not table.answer(response(99))  # nobody waits for it
    assert table.answer(response(1)) and woken == [1] and awaited.response.opaque == 1
    assert table.answer(response(2)) and outcomes == [(2, None)] and table.timed == 0
    assert len(table) == 0


def test_callback_calls_expire_at_their_deadline_and_a_raising_callback_is_contained() -> None:
    table = CallTable()
    errors: list[Exception | None] = []

    def boom(r: RemotingCommand | None, e: Exception | None) -> None:
        raise RuntimeError("a callback bug")

    table.add(1, Call(callback=lambda r, e: errors.append(e), deadline=5.0, code=105))
    table.add(2, Call(callback=boom, deadline=5.0))
    table.add(3, Call(callback=lambda r, e: errors.append(e), deadline=50.0))
    table.add(4, Call(wake=lambda: None))  # awaited: its task keeps its own deadline
    woken: list[int] = []
    swept = Call(wake=lambda: woken.append(5), deadline=5.0, code=320)  # awaited, swept
    table.add(5, swept)
    assert table.timed == 4
    assert table.expire(4.9, lambda call: RemotingTimeoutError("late")) == 0
    assert table.expire(5.0, lambda call: RemotingTimeoutError(f"late {call.code}")) == 3
    assert [str(e) for e in errors] == ["late 105"]
    assert woken == [5] and str(swept.error) == "late 320" and swept.response is None
    assert set(table.calls) == {3, 4} and table.timed == 1
    table.drop(4)
    table.fail_all(RemotingConnectError("closed"))
    assert isinstance(errors[-1], RemotingConnectError) and len(table) == 0
    assert table.timed == 0


def test_closing_releases_budgets_and_fails_calls() -> None:
    budget = SharedBudget()
    conn = Connection(ConnectionLimits(), budget)
    conn.receive(frames(3) + frames(1)[:7], received=0.0, now=0.0)
    conn.out.append(b"x" * 100)
    failed: list[Exception | None] = []
    conn.calls.add(7, Call(callback=lambda r, e: failed.append(e)))
    assert budget.partial_frame_total > 0 and budget.write_total == 100
    conn.close(RemotingConnectError("gone"))
    assert budget.partial_frame_total == 0 and budget.write_total == 0
    assert not conn.inbox and isinstance(failed[0], RemotingConnectError)


class FixedAdmission:
    """Fast failure with fixed limits: a request that waited past ``min_wait`` is refused."""

    def __init__(self, min_wait: float, busy_mark: float = -1.0) -> None:
        self.min_wait = min_wait
        self.busy_mark = busy_mark
        self.noted: list[tuple[int, int, str]] = []
        self.clock = lambda: 0.0

    def shed(self, channel: object, request: RemotingCommand, *args: float) -> None:
        return None

    def shed_remark(self, code: int, received: float, waited: float, queued: int) -> str | None:
        return f"[TIMEOUT] waited {waited:.1f}s" if waited > self.min_wait else None

    def note_shed(self, code: int, count: int, remark: str) -> None:
        self.noted.append((code, count, remark))


def test_a_run_is_judged_once_by_its_wait_and_refusals_cost_no_decode() -> None:
    """judge: a run that waited past the limit is shed (each frame answered SYSTEM_BUSY from a
    peek at its header, oneway ones not answered), one received at or before the busy mark
    too; a run well inside the limit is served, and reading ahead starts at a quarter of it."""
    conn = Connection(ConnectionLimits())
    requests = [RemotingCommand.request(10, {"x": str(i)}) for i in range(3)]
    requests[1].flag |= 2  # oneway
    conn.receive(b"".join(encode(r) for r in requests), received=5.0, now=5.0)
    run = conn.next_run(32)
    assert run is not None
    admission = FixedAdmission(min_wait=1.0)
    assert conn.judge(run, 0.1, admission) == (None, False)  # type: ignore[arg-type]
    assert (conn.backlog, conn.backlog_since) == (3, 5.0)
    assert conn.judge(run, 0.3, admission) == (None, True)  # type: ignore[arg-type]
    shed, behind = conn.judge(run, 2.0, admission)  # type: ignore[arg-type]
    assert shed is not None and behind
    assert shed.refuse_run(run.buf, run.bounds, run.first, run.stop, conn.out) == 3
    answers = []
    data = conn.out.take()
    pos = 0
    while pos < len(data):
        length = int.from_bytes(data[pos : pos + 4], "big")
        answers.append(decode_frame_at(data, pos + 4, pos + 4 + length))
        pos += 4 + length
    assert [a.opaque for a in answers] == [requests[0].opaque, requests[2].opaque]
    assert {a.code for a in answers} == {2}  # SYSTEM_BUSY
    assert all(a.flag & RPC_TYPE_RESPONSE for a in answers)
    shed.report()
    assert admission.noted == [(10, 3, "[TIMEOUT] waited 2.0s")]
    busy = FixedAdmission(min_wait=1.0, busy_mark=5.0)  # received while marked busy
    shed, _ = conn.judge(run, 0.1, busy)  # type: ignore[arg-type]
    assert shed is not None


def test_place_routes_responses_refuses_bad_headers_and_caps_tasks() -> None:
    """place: a response completes its call (an unknown one is dropped), a request with a bad
    header is refused SYSTEM_ERROR with the header's error, past the cap of requests in tasks
    SYSTEM_BUSY [OVERLOAD], the others go to a task."""
    from pymq.remoting.connection import OVERLOAD_REMARK, TASK

    conn = Connection(ConnectionLimits(max_pending_requests=1))
    call = Call()
    conn.calls.add(7, call)
    response = RemotingCommand(0, {}, b"", 7, RPC_TYPE_RESPONSE)
    assert conn.place(response) is None and call.response is response
    assert conn.place(RemotingCommand(0, {}, b"", 8, RPC_TYPE_RESPONSE)) is None
    bad = RemotingCommand.request(10)
    bad.header_error = "the custom field <b> is null"
    assert conn.place(bad) == (1, "the custom field <b> is null")
    assert conn.place(RemotingCommand.request(10)) is TASK
    assert conn.place(RemotingCommand.request(10)) == (2, OVERLOAD_REMARK)
    conn.task_done()
    assert conn.place(RemotingCommand.request(10)) is TASK
