"""The socket-free state that bounds a connection: output water marks, shared totals, partial
frames."""

from __future__ import annotations

from pymq.remoting.limits import (
    ConnectionLimits,
    OutputBuffer,
    PartialFrameTracker,
    SharedBudget,
)

LIMITS = ConnectionLimits(write_high_water_mark=100, write_low_water_mark=40)


def test_reading_pauses_above_the_high_mark_and_resumes_at_the_low_one() -> None:
    out = OutputBuffer(LIMITS)
    out.append(b"x" * 60)
    assert not out.should_pause()
    out.append(b"y" * 40)
    assert out.should_pause() and not out.may_resume()
    assert out.take(50) == b"x" * 60  # whole frames, at least one
    assert out.size == 40
    assert out.may_resume()
    out.push_front(b"x" * 10)
    assert out.size == 50 and not out.may_resume()
    assert out.take() == b"x" * 10 + b"y" * 40
    assert out.size == 0 and not out


def test_the_total_across_connections_is_counted_and_capped() -> None:
    budget = SharedBudget(write_total_max=150)
    a, b = OutputBuffer(LIMITS, budget), OutputBuffer(LIMITS, budget)
    a.append(b"a" * 90)
    b.append(b"b" * 70)
    assert budget.write_total == 160 and budget.writes_over
    # Both hold output and the total is over: both stop reading, though each is under its mark.
    assert a.should_pause() and b.should_pause()
    c = OutputBuffer(LIMITS, budget)
    assert not c.should_pause()  # a connection with nothing queued keeps being served
    a.take()
    assert budget.write_total == 70 and not budget.writes_over
    assert not b.should_pause()
    b.clear()
    assert budget.write_total == 0


def test_partial_frames_are_counted_while_they_last() -> None:
    budget = SharedBudget(partial_frame_total_max=100)
    one, two = PartialFrameTracker(budget), PartialFrameTracker(budget)
    one.update(80, now=5.0)
    assert one.started == 5.0 and budget.partial_frame_total == 80
    one.update(90, now=6.0)
    assert one.started == 5.0  # the frame's start, not the last receive
    two.update(20, now=7.0)
    assert budget.partial_frames_over and one.must_wait() and two.must_wait()
    one.update(0, now=8.0)
    assert one.started is None and budget.partial_frame_total == 20
    assert not two.must_wait()
    two.release()
    assert budget.partial_frame_total == 0
