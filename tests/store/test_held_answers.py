"""The group commit's held answers (CommitLogFlushService.hold_answer): each connection's
answers written in one call per sync, oldest first; timeouts on each answer's own deadline; a
sink or a timeout frame that raises costs only its own answers."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
import trio

from pymq.store import FlushDiskType
from tests.helpers import StuckDisk
from tests.store.helpers import make_message, running_store, small_config


class Sink:
    def __init__(self, broken: bool = False) -> None:
        self.calls: list[list[bytes]] = []
        self.broken = broken

    def answer_frames(self, frames: list[bytes]) -> None:
        if self.broken:
            raise RuntimeError("a broken connection")
        self.calls.append(list(frames))


def _late(name: str):
    def make() -> bytes:
        if name == "raises":
            raise ValueError("cannot make the answer")
        return b"late-" + name.encode()

    return make


async def _stuck_sync(store, disk: StuckDisk) -> int:
    """Put a record whose sync hangs: the answers held next wait for the sync after it."""
    disk.stuck = True
    disk.release.clear()
    entered = disk.entered
    r = store.put_now(make_message(body=b"starter"))
    store.flush_commitlog.on_flushed(r.wrote_offset + r.wrote_bytes, 30, lambda ok: None)
    with trio.fail_after(10):
        while disk.entered == entered:
            await trio.sleep(0.01)
    return store.commitlog.max_offset


async def _hold(store, sink, name: str, timeout_s: float = 30) -> None:
    r = store.put_now(make_message(body=name.encode()))
    held = store.flush_commitlog.hold_answer(
        r.wrote_offset + r.wrote_bytes, timeout_s, sink, b"ok-" + name.encode(), _late(name)
    )
    assert held


@contextlib.asynccontextmanager
async def _stuck(root, monkeypatch) -> AsyncIterator[tuple]:
    """A SYNC_FLUSH store whose group commit hangs in a sync: (store, disk)."""
    disk = StuckDisk(monkeypatch)
    config = small_config(root, flush_disk_type=FlushDiskType.SYNC_FLUSH)
    async with running_store(config) as store:
        await _stuck_sync(store, disk)
        yield store, disk


async def _settled(service, *sinks: Sink, calls: int) -> None:
    with trio.fail_after(10):
        while sum(len(s.calls) for s in sinks) < calls or service._held:
            await trio.sleep(0.01)
    await trio.sleep(0.1)  # nothing more comes


async def test_durable_answers_go_per_sink_in_order_and_a_broken_sink_costs_only_its_own(
    root, monkeypatch
) -> None:
    async with _stuck(root, monkeypatch) as (store, disk):
        service = store.flush_commitlog
        a, b, broken = Sink(), Sink(), Sink(broken=True)
        for sink, name in [(a, "1"), (b, "2"), (broken, "x"), (a, "3"), (b, "4")]:
            await _hold(store, sink, name)
        disk.stuck = False
        disk.release.set()
        await _settled(service, a, b, calls=2)
        assert a.calls == [[b"ok-1", b"ok-3"]] and b.calls == [[b"ok-2", b"ok-4"]]
        assert service._held == {} and not service._unordered
        # Already durable: nothing is held, the caller answers.
        r = store.put_now(make_message(body=b"now"))
        await _settled(service, calls=0)
        while store.commitlog.queue.flushed_where < r.wrote_offset + r.wrote_bytes:
            await store.flush_commitlog._flush(0)
        assert not service.hold_answer(r.wrote_offset + r.wrote_bytes, 30, a, b"f", _late("n"))
        assert service._held == {}


async def test_timeouts_answer_late_frames_and_a_raising_one_costs_only_itself(
    root, monkeypatch
) -> None:
    async with _stuck(root, monkeypatch) as (store, disk):
        service = store.flush_commitlog
        a, b = Sink(), Sink()
        for sink, name in [(a, "1"), (b, "raises"), (a, "3"), (b, "4")]:
            await _hold(store, sink, name, timeout_s=0.1)
        await _settled(service, a, b, calls=2)  # the disk still stuck
        assert a.calls == [[b"late-1", b"late-3"]] and b.calls == [[b"late-4"]]
        disk.stuck = False
        disk.release.set()
        await trio.sleep(0.2)
        assert a.calls == [[b"late-1", b"late-3"]] and b.calls == [[b"late-4"]]  # never again


@pytest.mark.parametrize("later", [False, True])
async def test_a_shorter_timeout_is_not_kept_behind_a_longer_one(
    root, monkeypatch, later: bool
) -> None:
    """syncFlushTimeout lowered while a sync hangs: a newer answer times out on its own
    deadline, not the older one's; then the rest are in order again and the connection leaves
    the timeout scan, its answers still held."""
    async with _stuck(root, monkeypatch) as (store, disk):
        service = store.flush_commitlog
        a = Sink()
        names = ["old", "new", "later"] if later else ["old", "new"]
        for name in names:
            await _hold(store, a, name, timeout_s=0.1 if name == "new" else 30)
        with trio.fail_after(5):
            while not a.calls:
                await trio.sleep(0.01)
        assert a.calls == [[b"late-new"]]
        assert a in service._held and a not in service._unordered
        disk.stuck = False
        disk.release.set()
        await _settled(service, a, calls=2)
        assert a.calls == [[b"late-new"], [b"ok-" + n.encode() for n in names if n != "new"]]
        assert service._held == {} and not service._unordered
