"""The order in which a pymq server process runs Trio's ready tasks (``serverTaskOrder``).

Trio runs the tasks that became ready since it last looked for I/O as one batch, and on
purpose runs each batch in one of two orders, picked at random: first-ready-first or
last-ready-first (Trio's ``unrolled_run``: the batch is reversed when its random
number generator draws under 0.5, then popped from its end).  The randomness is there to keep
programs from depending on an order Trio does not promise.  Its cost is latency under load: a
connection whose request became ready first in one pass can be served last in the next, so it
may wait up to two passes for its answer instead of one.  The name server's route lookups
(8 connections, 8 lookups in flight each) had a p99 of 2.3-2.5 ms with it and 1.6-1.9 ms
first-ready-first, at the same throughput (README, Performance).

``TaskOrder.TRIO``, the default everywhere, leaves Trio as it is and touches nothing private.
``TaskOrder.FIFO`` is an EXPERIMENTAL opt-in (``serverTaskOrder=fifo``) that has Trio run every
batch first-ready-first: the process's Trio random number generator is replaced by one whose
``random()`` always draws 0.0.  That generator is Trio's private state (the gain was measured
on one benchmark, and Trio treats the order as an open question), so: every access to Trio's
internals is in :func:`_swap_generator` and nowhere else; :func:`first_ready_first` logs a
warning saying so, checks the result with a small run of its own and puts Trio's generator back
when the order does not come out first-ready-first (a Trio that schedules differently), with a
warning; pymq works either way, it is only the latency that changes.  tests/unit/
test_scheduling.py fails loudly when Trio's internals change shape.  An application that embeds
pymq's controllers in its own ``trio.run`` chooses for itself; nothing here is applied on import.
"""

from __future__ import annotations

import enum
import logging
import random
from collections.abc import Iterator
from contextlib import contextmanager

import trio

log = logging.getLogger(__name__)

# The name of Trio's scheduling random number generator in its private run module.
GENERATOR = "_r"
# The probe's tasks and how many times each yields: Trio's own order passes it only if each of
# the PROBE_PASSES batches holding its tasks is reversed, with probability 2 ** -PROBE_PASSES.
PROBE_TASKS = 6
PROBE_PASSES = 24


class TaskOrder(enum.Enum):
    FIFO = "fifo"  # experimental opt-in: every batch runs in the order its tasks became ready
    TRIO = "trio"  # the default: Trio's own order, randomised per batch


class _FirstReadyFirst(random.Random):
    """Trio's scheduling generator with ``random()`` fixed at 0.0: Trio reverses each batch,
    which it then runs from its end, so the first task to become ready runs first.

    Trio also draws from it, through ``uniform``, the offset of a run's clock, which becomes
    10000.0 s in every process: Trio randomises it so that nobody compares ``current_time()``
    across runs, and pymq uses it only for differences within one.  (Under pytest-trio's
    deterministic scheduling its ``shuffle`` would become a fixed rotation; the probe refuses
    that order.)"""

    def random(self) -> float:
        return 0.0


def _swap_generator(replacement: random.Random | None) -> random.Random | None:
    """The ONE place that touches Trio's private state (``trio._core._run._r``, its scheduling
    random number generator): returns the generator in place, or None when this Trio has none
    (laid out differently), and puts ``replacement`` in its stead when one is given and Trio
    has a generator to replace.  Only the opt-in ``serverTaskOrder=fifo`` path calls it."""
    try:
        from trio._core import _run
    except ImportError:  # a Trio laid out differently
        return None
    current = getattr(_run, GENERATOR, None)
    if not isinstance(current, random.Random):
        return None
    if replacement is not None:
        setattr(_run, GENERATOR, replacement)
    return current


async def run_order(tasks: int, passes: int) -> list[int]:
    """The order in which ``tasks`` tasks, started in index order, ran: each yields ``passes``
    times, and the list holds its index each time it ran (first-ready-first gives
    ``list(range(tasks)) * passes``)."""
    seen: list[int] = []

    async def worker(index: int) -> None:
        for _ in range(passes):
            seen.append(index)
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        for index in range(tasks):
            nursery.start_soon(worker, index)
    return seen


def _probe_order() -> bool:
    """Whether a fresh ``trio.run`` runs ready tasks first-ready-first, every pass."""
    order = trio.run(run_order, PROBE_TASKS, PROBE_PASSES)
    return order == list(range(PROBE_TASKS)) * PROBE_PASSES


def first_ready_first() -> random.Random | None:
    """Have this process's later ``trio.run`` calls run ready tasks first-ready-first
    (EXPERIMENTAL: relies on Trio's internals, through :func:`_swap_generator` only).

    Returns what :func:`restore` needs to undo it, or None when it could not be done (the
    reason logged as a warning; Trio's own order then stays).  Call it before ``trio.run``:
    RuntimeError inside a run, whose order can no longer be changed safely."""
    try:
        trio.lowlevel.current_trio_token()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("the task order is chosen before trio.run, not inside a run")
    original = _swap_generator(None)
    if original is None:
        log.warning("serverTaskOrder=fifo not applied: this Trio has no scheduling generator")
        return None
    if isinstance(original, _FirstReadyFirst):
        return original  # already first-ready-first: restoring leaves it so
    _swap_generator(_FirstReadyFirst())
    try:
        ordered = _probe_order()
    except BaseException:
        _swap_generator(original)
        raise
    if not ordered:
        _swap_generator(original)
        log.warning(
            "serverTaskOrder=fifo not applied: Trio %s did not run ready tasks in order "
            "with it; its own order stays",
            trio.__version__,
        )
        return None
    log.warning(
        "running Trio's ready tasks first-ready-first (serverTaskOrder=fifo, experimental: it "
        "replaces Trio %s's private scheduling generator trio._core._run.%s; the default, "
        "serverTaskOrder=trio, touches nothing private)",
        trio.__version__,
        GENERATOR,
    )
    return original


def restore(original: random.Random | None) -> None:
    """Undo :func:`first_ready_first` (given what it returned; None does nothing)."""
    if original is not None:
        _swap_generator(original)


@contextmanager
def task_order(order: TaskOrder) -> Iterator[bool]:
    """Within the block, ``trio.run`` uses ``order``; yields whether the order in effect is
    first-ready-first.  Trio's own generator is back when the block ends."""
    if order is not TaskOrder.FIFO:
        yield False
        return
    original = first_ready_first()
    try:
        yield original is not None
    finally:
        restore(original)
