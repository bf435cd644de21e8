"""The loop-step meter the hostile suites use (tests.helpers.LoopSteps): it counts the loop's
own CPU work in a step, and not the time a step waits on the machine."""

from __future__ import annotations

import time

import trio

from tests.helpers import LoopSteps


def burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


async def test_a_step_that_works_is_seen_and_one_that_waits_is_not() -> None:
    with LoopSteps() as idle:
        for _ in range(20):
            await trio.sleep(0)
        time.sleep(0.2)  # blocked, not working: a descheduled loop looks the same
        await trio.sleep(0)
    assert idle.steps >= 20
    assert idle.worst < 0.1, idle
    with LoopSteps() as busy:
        await trio.sleep(0)
        burn(0.3)
        await trio.sleep(0)
    assert busy.worst >= 0.3, busy
    assert "test_a_step_that_works_is_seen" in busy.worst_task
