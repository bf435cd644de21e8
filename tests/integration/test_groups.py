"""``python -m pymq --groups N``: a name server and N broker processes that start, serve and
stop together, and never outlive the command."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import trio

from pymq.client import Message, Producer
from pymq.client.topics import create_topic
from pymq.groups import free_base_port
from tests.helpers import free_port

pytestmark = pytest.mark.slow


def start_groups(tmp_path, groups: int, *extra: str) -> tuple[subprocess.Popen, str, list[str]]:
    base = free_base_port(groups)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pymq",
            "--groups",
            str(groups),
            "--data",
            str(tmp_path),
            "--bind",
            "127.0.0.1",
            "--namesrv-port",
            "0",
            "--broker-port",
            str(base),
            "--admin-port",
            "0",
            "--metrics-port",
            "0",
            "--mappedFileSizeCommitLog",
            str(1 << 20),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    banner = proc.stdout.readline()
    if not banner.startswith("pymq is running"):
        proc.kill()
        _, err = proc.communicate(timeout=30)
        raise AssertionError(f"groups did not start: {banner!r}\n{err}")
    namesrv = re.search(r"name server (\S+),", banner).group(1)  # type: ignore[union-attr]
    brokers = [proc.stdout.readline().split()[1] for _ in range(groups)]
    return proc, namesrv, brokers


def children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (from /proc/*/stat)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def free_port_pair() -> int:
    for _ in range(100):
        port = free_port()
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no two free ports in a row")


def test_groups_serve_one_topic_across_processes_and_stop_cleanly(tmp_path) -> None:
    metrics = free_port_pair()
    proc, namesrv, brokers = start_groups(tmp_path, 2, "--metrics-port", str(metrics))
    try:
        assert len(brokers) == 2 and brokers[0] != brokers[1]
        pids = children(proc.pid)
        assert len(pids) == 2  # one process per broker group

        async def send_across() -> set[str]:
            await create_topic(namesrv, "GroupsTopic", queues=2)
            names = set()
            async with Producer("GroupsProducer", namesrv) as producer:
                for i in range(16):
                    result = await producer.send(Message("GroupsTopic", f"m{i}".encode()))
                    names.add(result.queue.broker_name)
            return names

        assert trio.run(send_across) == {"broker-a", "broker-b"}
        # each group serves its own /metrics, on the given port + its index
        for i, name in enumerate(("broker-a", "broker-b")):
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics + i}/metrics", timeout=10) as r:
                text = r.read().decode()
            assert f'broker="{name}"' in text
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "pymq stopped." in out
        for pid in pids:
            assert not alive(pid)
        for name in ("broker-a", "broker-b"):  # each stopped cleanly: no abort file
            store = os.path.join(tmp_path, name, "store")
            assert os.path.isdir(store) and not os.path.exists(os.path.join(store, "abort"))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_brokers_die_with_a_killed_parent(tmp_path) -> None:
    proc, _, _ = start_groups(tmp_path, 2)
    pids = children(proc.pid)
    assert len(pids) == 2
    proc.kill()  # no chance to stop them: their standard input closes, and they stop
    proc.wait()
    assert wait_until_sync(lambda: not any(alive(p) for p in pids), 30)


def wait_until_sync(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def test_a_group_that_cannot_start_stops_the_others(tmp_path) -> None:
    base = free_base_port(2)
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", base + 10))  # broker-b's port is taken
    blocker.listen()
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "pymq",
                "--groups",
                "2",
                "--data",
                str(tmp_path),
                "--bind",
                "127.0.0.1",
                "--namesrv-port",
                "0",
                "--broker-port",
                str(base),
                "--admin-port",
                "0",
                "--metrics-port",
                "0",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        blocker.close()
    assert result.returncode == 1, result.stderr
    assert "broker group broker-b did not start" in result.stderr
    assert "Traceback" not in result.stderr
    # broker-a had started and was stopped cleanly
    assert not os.path.exists(os.path.join(tmp_path, "broker-a", "store", "abort"))


def test_groups_out_of_range_is_a_config_error(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pymq", "--groups", "0", "--data", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--groups must be 1..26" in result.stderr
