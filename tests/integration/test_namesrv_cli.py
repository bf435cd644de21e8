"""``python -m pymq.namesrv`` as an operator runs it: config file, flags, -p, signals."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest

from pymq.remoting.codec import FrameDecoder, RemotingCommand, encode
from pymq.remoting.codes import RequestCode, ResponseCode
from tests.helpers import free_port


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pymq.namesrv", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_print_config_layers_file_and_flags(tmp_path) -> None:
    conf = tmp_path / "namesrv.properties"
    conf.write_text("listenPort=19876\norderMessageEnable=true\nmysteryKey=1\n")
    result = run_cli("-c", str(conf), "--kvConfigPath", "/tmp/kv.json", "-p")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "listenPort=19876" in lines
    assert "orderMessageEnable=true" in lines
    assert "kvConfigPath=/tmp/kv.json" in lines
    assert "unknown config key 'mysteryKey'" in result.stderr


def test_bad_config_is_a_one_line_error(tmp_path) -> None:
    result = run_cli("--listenPort", "ninety")
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: bad value for listenPort")
    missing = run_cli("-c", str(tmp_path / "nope.properties"))
    assert missing.returncode == 2
    assert "cannot read config file" in missing.stderr


def _request(port: int, cmd: RemotingCommand) -> RemotingCommand:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(encode(cmd))
        decoder = FrameDecoder()
        while True:
            data = sock.recv(65536)
            assert data, "connection closed before the answer"
            answers = decoder.feed(data)
            if answers:
                return answers[0]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_serves_and_stops_cleanly_on_signal(tmp_path, signum: signal.Signals) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pymq.namesrv",
            "--listenPort",
            str(port),
            "--bindAddress",
            "127.0.0.1",
            "--kvConfigPath",
            str(tmp_path / "kv.json"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        assert f"listening on port {port}" in banner
        answer = _request(
            port, RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
        )
        assert answer.code == ResponseCode.TOPIC_NOT_EXIST
        time.sleep(0.1)
        proc.send_signal(signum)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in (proc.stderr.read() if proc.stderr else "")
