"""serverTaskOrder: Trio's own order by default; first-ready-first (fifo) as an experimental
opt-in that relies on Trio's internals, all of them reached through one function."""

from __future__ import annotations

import logging
import random
from typing import Any

import pytest
import trio
from trio._core import _run as trio_run

from pymq import __main__ as embedded_main
from pymq.broker import __main__ as broker_main
from pymq.common import scheduling
from pymq.common.cli import run_main
from pymq.common.scheduling import TaskOrder, first_ready_first, restore, task_order
from pymq.embedded import build_cluster
from pymq.groups import broker_command
from pymq.namesrv import __main__ as namesrv_main
from pymq.remoting.config import NettyServerConfig, task_order_of

TASKS = 5
PASSES = 40


async def _pass_orders() -> list[list[int]]:
    """The order TASKS tasks ran in, pass by pass, each yielding PASSES times."""
    seen = await scheduling.run_order(TASKS, PASSES)
    return [seen[i : i + TASKS] for i in range(0, len(seen), TASKS)]


FIFO_ORDERS = [list(range(TASKS))] * PASSES


@pytest.fixture(autouse=True)
def production_scheduling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trio's scheduling as a server process has it: pytest-trio switches Trio to a seeded
    shuffle of each batch (for Hypothesis) in the test process, an order the probe rightly
    refuses."""
    monkeypatch.setattr(trio_run, "_ALLOW_DETERMINISTIC_SCHEDULING", False)


def test_the_probe_refuses_pytest_trios_shuffled_scheduling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = trio_run._r
    monkeypatch.setattr(trio_run, "_ALLOW_DETERMINISTIC_SCHEDULING", True)
    assert first_ready_first() is None
    assert trio_run._r is original


def test_trios_internals_still_have_the_shape_the_fifo_opt_in_relies_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The guard of the experimental opt-in: fails loudly when Trio changes what it swaps."""
    generator = getattr(trio_run, scheduling.GENERATOR, None)
    assert isinstance(generator, random.Random), (
        f"Trio {trio.__version__} no longer has its scheduling generator at "
        f"trio._core._run.{scheduling.GENERATOR}: serverTaskOrder=fifo can no longer be applied "
        "(pymq.common.scheduling._swap_generator); drop or rework the experimental opt-in"
    )
    with caplog.at_level(logging.WARNING, logger="pymq.common.scheduling"):
        original = first_ready_first()
    try:
        assert original is generator, (
            f"serverTaskOrder=fifo was refused on Trio {trio.__version__}: its ready tasks no "
            f"longer run first-ready-first with a generator drawing 0.0 ({caplog.text!r}); "
            "Trio's scheduling changed, rework pymq.common.scheduling or drop the opt-in"
        )
        assert trio.run(_pass_orders) == FIFO_ORDERS, (
            f"Trio {trio.__version__} ran ready tasks out of order with its generator swapped"
        )
    finally:
        restore(original)
    assert trio_run._r is generator
    assert "experimental" in caplog.text and "trio._core._run._r" in caplog.text


def test_only_one_function_reaches_trios_internals() -> None:
    """Every ``trio._core`` access of pymq sits in scheduling._swap_generator."""
    import inspect
    import pathlib

    import pymq

    root = pathlib.Path(pymq.__file__).parent
    users = [
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if "from trio._core" in path.read_text() or "import trio._core" in path.read_text()
    ]
    assert users == ["common/scheduling.py"]
    source = inspect.getsource(scheduling)
    inside = inspect.getsource(scheduling._swap_generator)
    assert source.count("from trio._core") == inside.count("from trio._core") == 1
    assert "setattr(" not in source.replace(inside, "")


def test_fifo_runs_every_pass_in_the_order_tasks_became_ready() -> None:
    original = trio_run._r
    with task_order(TaskOrder.FIFO) as applied:
        assert applied
        assert trio.run(_pass_orders) == FIFO_ORDERS
    assert trio_run._r is original  # Trio's own generator is back


def test_the_default_touches_nothing_private(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []
    monkeypatch.setattr(scheduling, "_swap_generator", lambda new: calls.append(new))
    order = NettyServerConfig().server_task_order

    async def serve() -> None:
        assert await _pass_orders() != FIFO_ORDERS

    assert run_main(serve, what="a test", order=order) == 0
    with task_order(order) as applied:
        assert not applied
    assert calls == []


def test_trio_order_is_left_alone_and_is_not_fifo() -> None:
    """The control: without the change Trio's order varies between passes (all 40 passes in
    order by chance: 2 ** -40), so the FIFO test above can fail."""
    original = trio_run._r
    with task_order(TaskOrder.TRIO) as applied:
        assert not applied
        assert trio_run._r is original
        assert trio.run(_pass_orders) != FIFO_ORDERS
        assert not scheduling._probe_order()


def test_a_probe_that_fails_puts_trios_generator_back(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    original = trio_run._r
    monkeypatch.setattr(scheduling, "_probe_order", lambda: False)
    with caplog.at_level(logging.WARNING, logger="pymq.common.scheduling"):
        assert first_ready_first() is None
    assert trio_run._r is original
    assert "serverTaskOrder=fifo not applied" in caplog.text
    assert "did not run ready tasks in order" in caplog.text


def test_a_probe_that_raises_puts_trios_generator_back(monkeypatch: pytest.MonkeyPatch) -> None:
    original = trio_run._r

    def broken() -> bool:
        raise RuntimeError("probe broke")

    monkeypatch.setattr(scheduling, "_probe_order", broken)
    with pytest.raises(RuntimeError, match="probe broke"):
        first_ready_first()
    assert trio_run._r is original


def test_a_trio_without_the_generator_is_left_as_it_is(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(trio_run, "_r", object())
    with (
        caplog.at_level(logging.WARNING, logger="pymq.common.scheduling"),
        task_order(TaskOrder.FIFO) as applied,
    ):
        assert not applied
    assert "no scheduling generator" in caplog.text
    monkeypatch.delattr(trio_run, "_r")
    assert first_ready_first() is None


def test_applying_twice_and_restoring_keeps_it_applied_until_the_outer_restore() -> None:
    original = trio_run._r
    outer = first_ready_first()
    assert outer is original
    try:
        inner = first_ready_first()
        assert inner is not None
        restore(inner)
        assert trio.run(_pass_orders) == FIFO_ORDERS
    finally:
        restore(outer)
    assert trio_run._r is original
    restore(None)  # nothing to undo
    assert trio_run._r is original


def test_the_fixed_generator_always_draws_zero() -> None:
    fixed = scheduling._FirstReadyFirst()
    assert fixed.random() == 0.0
    assert isinstance(fixed, random.Random)


def test_run_main_runs_the_server_in_the_order_given() -> None:
    orders: list[list[list[int]]] = []

    async def serve() -> None:
        orders.append(await _pass_orders())

    assert run_main(serve, what="a test", order=TaskOrder.FIFO) == 0
    assert orders[-1] == FIFO_ORDERS
    assert run_main(serve, what="a test", order=TaskOrder.TRIO) == 0
    assert orders[-1] != FIFO_ORDERS
    assert run_main(serve, what="a test") == 0  # an embedding caller's default: Trio's
    assert orders[-1] != FIFO_ORDERS
    assert not isinstance(trio_run._r, scheduling._FirstReadyFirst)


def test_the_key_defaults_to_trio_and_reads_both_values() -> None:
    from pymq.common.config import ConfigError, set_key

    server = NettyServerConfig()
    assert server.server_task_order is TaskOrder.TRIO
    set_key(server, "serverTaskOrder", "trio")
    assert server.server_task_order is TaskOrder.TRIO
    with pytest.raises(ConfigError, match=r"serverTaskOrder: 'random' \(one of fifo, trio\)"):
        set_key(server, "serverTaskOrder", "random")


def _capture_run_main(monkeypatch: pytest.MonkeyPatch, module: Any) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def fake(*args: object, **kwargs: Any) -> int:
        seen.update(kwargs)
        return 0

    monkeypatch.setattr(module, "run_main", fake)
    return seen


@pytest.mark.parametrize("value", ["fifo", "trio", None])
def test_each_entry_point_passes_its_key_to_run_main(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, value: str | None
) -> None:
    flag = [] if value is None else ["--serverTaskOrder", value]
    want = TaskOrder(value or "trio")
    seen = _capture_run_main(monkeypatch, namesrv_main)
    kv = ["--kvConfigPath", str(tmp_path / "kv.json")]
    assert namesrv_main.main(["--log-level", "ERROR", *kv, *flag]) == 0
    assert seen["order"] is want
    seen = _capture_run_main(monkeypatch, broker_main)
    store = ["--storePathRootDir", str(tmp_path / "store")]
    assert broker_main.main(["--log-level", "ERROR", *store, *flag]) == 0
    assert seen["order"] is want
    seen = _capture_run_main(monkeypatch, embedded_main)
    assert embedded_main.main(["--data", str(tmp_path / "data"), *flag]) == 0
    assert seen["order"] is want
    seen.clear()
    assert embedded_main.main(["--data", str(tmp_path / "data"), "--groups", "2", *flag]) == 0
    assert seen["order"] is want
    # The processes: the embedded name server's config, the group brokers' command lines.
    props = {} if value is None else {"serverTaskOrder": value}
    namesrv, configs = build_cluster(str(tmp_path / "c"), properties=dict(props))
    assert namesrv.server_config.server_task_order is want
    assert [c.server_task_order for c in configs if isinstance(c, NettyServerConfig)] == [want]
    assert task_order_of(props) is want
    command = broker_command(1, str(tmp_path), "127.0.0.1:9876", 10921, "127.0.0.1", props, 0)
    assert ("--serverTaskOrder" in command) is (value is not None)
    if value is not None:
        assert command[command.index("--serverTaskOrder") + 1] == value


def test_the_order_cannot_be_chosen_inside_a_run() -> None:
    original = trio_run._r

    async def inside() -> None:
        with pytest.raises(RuntimeError, match=r"chosen before trio\.run"):
            first_ready_first()

    trio.run(inside)
    assert trio_run._r is original


def test_entry_points_refuse_a_bad_order(capsys: pytest.CaptureFixture[str]) -> None:
    assert embedded_main.main(["--serverTaskOrder", "lifo"]) == 2
    assert "bad value for serverTaskOrder: 'lifo' (one of fifo, trio)" in capsys.readouterr().err
    assert namesrv_main.main(["--serverTaskOrder", "lifo"]) == 2
    assert "bad value for serverTaskOrder: 'lifo' (one of fifo, trio)" in capsys.readouterr().err
