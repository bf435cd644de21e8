"""The one helper for periodic background work (DESIGN.md section 3)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

log = logging.getLogger(__name__)


async def every(
    period: float,
    work: Callable[[], Awaitable[object] | object],
    *,
    initial_delay: float | None = None,
    name: str | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``work`` after ``initial_delay`` (default: ``period``) and then every ``period`` seconds.

    ``work`` may be a coroutine function or a plain function.  The schedule is fixed-rate on
    trio's clock (so tests can drive it with ``trio.testing.MockClock``); a run that overruns
    its slot is followed at once by the next.  An exception from ``work`` is logged and the
    schedule goes on, as RocketMQ's scheduled executors do: one bad round must not stop a
    housekeeping service for good.
    """
    label = name or getattr(work, "__qualname__", repr(work))
    deadline = trio.current_time() + (period if initial_delay is None else initial_delay)
    task_status.started()
    while True:
        await trio.sleep_until(deadline)
        try:
            result = work()
            if isinstance(result, Awaitable):
                await result
        except Exception:
            log.exception("periodic task %s failed", label)
        deadline = max(deadline + period, trio.current_time())
