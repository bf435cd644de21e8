"""scripts/benchmark.py's server start: a port taken between its choice and the server's bind
makes the start fail; it is tried again on other ports, and a start that keeps failing ends
the benchmark with the server's own reason and no process left behind."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Iterator

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import benchmark  # noqa: E402


@pytest.fixture
def taken() -> Iterator[int]:
    """A port some other socket listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def server_args() -> argparse.Namespace:
    return argparse.Namespace(flush="ASYNC_FLUSH", file_size=1 << 26, ha=None, server_set=[])


def test_a_start_on_a_taken_port_is_tried_again(tmp_path, monkeypatch, capsys, taken) -> None:
    ports = iter([taken, benchmark.free_port()])
    real = benchmark.free_port
    monkeypatch.setattr(benchmark, "free_port", lambda: next(ports, None) or real())
    namesrv, procs = benchmark.start_servers(server_args(), str(tmp_path))
    try:
        assert len(procs) == 1 and procs[0].poll() is None
        assert namesrv != f"127.0.0.1:{taken}"
        err = capsys.readouterr().err
        assert "could not start pymq: error: cannot start pymq: [Errno 98]" in err
        assert "trying again on other ports" in err
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)


@pytest.fixture
def started(monkeypatch) -> list:
    """The processes benchmark.py starts, as it starts them."""
    procs: list = []
    real_popen = benchmark.subprocess.Popen

    def popen(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        procs.append(proc)
        return proc

    monkeypatch.setattr(benchmark.subprocess, "Popen", popen)
    return procs


def test_a_start_that_keeps_failing_says_why(tmp_path, monkeypatch, taken, started) -> None:
    monkeypatch.setattr(benchmark, "free_port", lambda: taken)
    with pytest.raises(SystemExit, match=r"could not start pymq: .*Address already in use"):
        benchmark.start_servers(server_args(), str(tmp_path))
    assert len(started) == benchmark.START_ATTEMPTS
    assert all(proc.poll() is not None for proc in started)


def test_a_failed_ha_start_stops_what_it_started(tmp_path, monkeypatch, taken, started) -> None:
    """The name server starts; the master cannot (its port is taken): the name server is
    stopped, not left running."""
    calls = iter(range(100))
    real = benchmark.free_port
    # The name server's port, then the master's listen port: taken.
    monkeypatch.setattr(benchmark, "free_port", lambda: taken if next(calls) == 1 else real())
    args = server_args()
    args.ha = "ASYNC_MASTER"
    with pytest.raises(SystemExit, match=r"could not start pymq\.broker"):
        benchmark.start_servers(args, str(tmp_path))
    assert len(started) == 2
    assert all(proc.poll() is not None for proc in started)
