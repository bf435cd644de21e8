"""scripts/bench_namesrv.py's load generator: lookups in flight, answers and refusals counted,
against a stand-in server that splits its answers anywhere; and the whole script end to end."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import socket
import struct
import subprocess
import sys
import threading
import time
from types import ModuleType

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "bench_namesrv.py")


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_namesrv", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _answer(code: int) -> bytes:
    header = b'{"code":%d,"flag":1,"opaque":0}' % code
    body = b"x" * 40
    return struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body


class StandIn:
    """Answers every lookup it reads, every fifth with code 17, writing the answers in pieces
    split at random; counts the answers of each kind and the most lookups a connection had
    unanswered."""

    def __init__(self, connections: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = connections
        self.ok = self.refused = self.most_unanswered = 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        for _ in range(self.connections):
            conn, _ = self.listener.accept()
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        rng = random.Random(7)
        buf = b""
        unanswered = 0
        with conn:
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                buf += data
                out = b""
                while len(buf) >= 4 and len(buf) >= 4 + struct.unpack_from(">i", buf)[0]:
                    buf = buf[4 + struct.unpack_from(">i", buf)[0] :]
                    unanswered += 1
                with self.lock:
                    self.most_unanswered = max(self.most_unanswered, unanswered)
                    while unanswered:
                        unanswered -= 1
                        refuse = (self.ok + self.refused) % 5 == 4
                        self.refused += refuse
                        self.ok += not refuse
                        out += _answer(17 if refuse else 0)
                while out:
                    cut = rng.randint(1, len(out))
                    conn.sendall(out[:cut])
                    out = out[cut:]

    def close(self) -> None:
        self.listener.close()
        for thread in self.threads:
            thread.join(timeout=10)


def test_the_generator_keeps_its_lookups_in_flight_and_counts_every_answer() -> None:
    bench = _bench()
    server = StandIn(connections=3)
    frames = [b"\x00\x00\x00\x08" + bytes(8), b"\x00\x00\x00\x0c" + bytes(12)]
    try:
        rate, latencies, errors = bench.lookups_epoll(f"127.0.0.1:{server.port}", frames, 3, 4, 0.3)
    finally:
        server.close()
    assert server.ok + server.refused > 12  # more than the first writes were answered
    assert len(latencies) == server.ok + server.refused
    assert errors == server.refused > 0
    assert server.most_unanswered <= 4
    assert rate > 0 and min(latencies) >= 0


def test_the_generator_gives_up_on_a_silent_server_and_closes_its_connections(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bench = _bench()
    monkeypatch.setattr(bench, "LOOKUP_GRACE_SECONDS", 0.3)
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        for _ in range(2):
            accepted.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        started = time.monotonic()
        with pytest.raises(SystemExit, match="unanswered"):
            bench.lookups_epoll(f"127.0.0.1:{listener.getsockname()[1]}", [bytes(12)], 2, 3, 0.2)
        assert time.monotonic() - started < 10
        thread.join(timeout=5)
        for conn in accepted:
            conn.settimeout(5)
            while conn.recv(65536):  # what the generator wrote, then its close
                pass
    finally:
        for conn in accepted:
            conn.close()
        listener.close()


def test_the_script_measures_a_name_server_it_starts() -> None:
    for extra in ([], ["--write-per-answer"]):
        out = subprocess.run(
            [sys.executable, SCRIPT, "--groups", "3", "--topics", "20", "--seconds", "0.5", *extra],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        result = json.loads(out.strip().splitlines()[-1])
        assert result["errors"] == 0, out
        assert result["lookups_per_s"] > 0 and result["lookup_p99_ms"] > 0, out
        assert result["rss_mb"] > 0, out


def test_server_settings_reach_the_name_server_it_starts() -> None:
    """A bad value makes the name server refuse to start: the setting got there."""
    run = subprocess.run(
        [sys.executable, SCRIPT, "--seconds", "0.1", "--server-set", "serverTaskOrder=lifo"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode != 0 and "the name server did not start" in run.stderr
    malformed = subprocess.run(
        [sys.executable, SCRIPT, "--server-set", "serverTaskOrder"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert malformed.returncode != 0
    assert "--server-set wants KEY=VALUE, not 'serverTaskOrder'" in malformed.stderr
