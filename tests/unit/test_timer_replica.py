"""A slave's timer service follows its master's delivery point only once it holds the
master's deliveries up to it (pymq/broker/timer.py, TimerMessageService.follow_horizon)."""

from __future__ import annotations

import types
from pathlib import Path

from pymq.broker.timer import CHECKPOINT_BODY, TimerMessageService


def replica(tmp_path: Path) -> tuple[TimerMessageService, types.SimpleNamespace]:
    store = types.SimpleNamespace(
        config=types.SimpleNamespace(timer_dir=str(tmp_path)), max_phy_offset=0
    )
    return TimerMessageService(store, replica=True), store  # type: ignore[arg-type]


def test_a_mark_is_followed_once_its_deliveries_are_replicated(tmp_path: Path) -> None:
    service, store = replica(tmp_path)
    service.horizon = 1000
    service.follow_master(2000, 500)
    service.follow_master(3000, 900)
    assert service.follow_horizon() == 1000  # nothing replicated yet
    store.max_phy_offset = 600
    assert service.follow_horizon() == 2000
    store.max_phy_offset = 900
    assert service.follow_horizon() == 3000
    service.follow_master(2500, 950)  # never backwards
    store.max_phy_offset = 1000
    assert service.follow_horizon() == 3000


def test_marks_not_replicated_are_bounded(tmp_path: Path) -> None:
    service, store = replica(tmp_path)
    for i in range(1000):
        service.follow_master(i * 1000, i * 10)
    store.max_phy_offset = 10**9
    assert service.follow_horizon() == 999_000  # the newest kept, memory bounded


def test_checkpoint_body_is_rocketmq_5s_layout() -> None:
    assert CHECKPOINT_BODY.size == 56  # TimerCheckpoint.encode: seven longs
