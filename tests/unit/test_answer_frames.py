"""Channel.answer_frames: the group commit's answers queued in order with one wake of the
writer, and dropped once the channel has closed (its output is gone; counting them would hold
the server's write budget for good)."""

from __future__ import annotations

import trio.testing

from pymq.remoting.channel import Channel
from pymq.remoting.limits import SharedBudget


async def test_answer_frames_queue_in_order_and_are_dropped_once_closed() -> None:
    budget = SharedBudget()
    left, _right = trio.testing.memory_stream_pair()
    channel = Channel(left, budget=budget)
    channel.answer_frames([b"one", b"two"])
    assert channel._writer_wake.is_set()
    assert channel._out.take() == b"onetwo"
    assert budget.write_total == 0
    channel.close("gone")
    channel.answer_frames([b"late" * 1000])
    assert not channel._out and channel._out.size == 0
    assert budget.write_total == 0
