"""``python -m pymq.broker`` and ``python -m pymq`` as operators run them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request

import trio

from pymq.acl.rpc_hook import AclSigner
from pymq.remoting.client import open_remoting_client
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from tests.helpers import free_broker_port, free_port


def run(
    module: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_broker_conf_keys_and_flags(tmp_path) -> None:
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "brokerClusterName = DefaultCluster\n"
        "brokerName = broker-a\n"
        "brokerId = 0\n"
        "deleteWhen = 04\n"
        "fileReservedTime = 48\n"
        "brokerRole = ASYNC_MASTER\n"
        "flushDiskType = SYNC_FLUSH\n"
        "listenPort = 30911\n"
        "storePathRootDir = /data/rocketmq/store\n"
        "autoCreateTopicEnable = false\n"
        "someFutureKey = 1\n"
    )
    result = run("pymq.broker", "-c", str(conf), "-n", "10.1.1.1:9876;10.1.1.2:9876", "-p")
    assert result.returncode == 0, result.stderr
    lines = set(result.stdout.splitlines())
    for expected in (
        "brokerName=broker-a",
        "namesrvAddr=10.1.1.1:9876;10.1.1.2:9876",
        "flushDiskType=SYNC_FLUSH",
        "fileReservedTime=48",
        "listenPort=30911",
        "haListenPort=30912",
        "storePathRootDir=/data/rocketmq/store",
        "autoCreateTopicEnable=false",
    ):
        assert expected in lines
    assert "unknown config key 'someFutureKey'" in result.stderr


def test_slave_with_broker_id_zero_refuses_to_start() -> None:
    result = run("pymq.broker", "--brokerRole", "SLAVE", "-p")
    assert result.returncode == 2
    assert "Slave's brokerId must be > 0" in result.stderr
    bad_enum = run("pymq.broker", "--flushDiskType", "SOMETIMES", "-p")
    assert bad_enum.returncode == 2 and "flushDiskType" in bad_enum.stderr


def test_acl_enable_without_a_usable_acl_file_refuses_to_start(tmp_path) -> None:
    # An operator who asks for ACL must not get a broker that accepts every request.
    env = {k: v for k, v in os.environ.items() if k != "ROCKETMQ_HOME"}
    broken = tmp_path / "home"
    (broken / "conf").mkdir(parents=True)
    (broken / "conf" / "plain_acl.yml").write_text("accounts:\n  - accessKey: ab\n")
    for module in ("pymq.broker", "pymq"):
        for home, expected in (("", "needs rocketmqHome"), (str(broken), "plain_acl.yml")):
            args = ["--aclEnable", "true", "--rocketmqHome", home]
            if module == "pymq":
                args += ["--data", str(tmp_path), "--admin-port", "0", "--namesrv-port", "0"]
                args += ["--broker-port", str(free_broker_port())]
            result = run(module, *args, env=env)
            assert result.returncode == 2, (module, result.stdout, result.stderr)
            assert "aclEnable=true but the ACL configuration is not usable" in result.stderr
            assert expected in result.stderr
            assert "Traceback" not in result.stderr


def test_acl_enable_checks_every_request(tmp_path) -> None:
    home = tmp_path / "home"
    (home / "conf").mkdir(parents=True)
    (home / "conf" / "plain_acl.yml").write_text(
        "accounts:\n  - accessKey: RocketMQAdmin\n    secretKey: 12345678admin\n    admin: true\n"
    )
    port = free_broker_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pymq.broker",
            "--aclEnable",
            "true",
            "--rocketmqHome",
            str(home),
            "--listenPort",
            str(port),
            "--bindAddress",
            "127.0.0.1",
            "--brokerIP1",
            "127.0.0.1",
            "--storePathRootDir",
            str(tmp_path / "store"),
            "-n",
            f"127.0.0.1:{free_port()}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "boot success" in line, (line, proc.stderr and proc.stderr.read())

        async def ask() -> tuple[RemotingCommand, RemotingCommand]:
            async with open_remoting_client() as client:
                request = RemotingCommand.request(RequestCode.GET_BROKER_CONFIG)
                unsigned = await client.invoke(f"127.0.0.1:{port}", request)
            signer = AclSigner("RocketMQAdmin", "12345678admin")
            async with open_remoting_client(signer=signer) as client:
                request = RemotingCommand.request(RequestCode.GET_BROKER_CONFIG)
                signed = await client.invoke(f"127.0.0.1:{port}", request)
            return unsigned, signed

        unsigned, signed = trio.run(ask)
        assert unsigned.code == ResponseCode.SYSTEM_ERROR
        assert "AclException: No accessKey is configured" in (unsigned.remark or "")
        assert signed.code == ResponseCode.SUCCESS
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_second_broker_on_one_store_refuses(tmp_path) -> None:
    ns_port, port_a, port_b = free_port(), free_broker_port(), free_broker_port()
    while abs(port_a - port_b) <= 3 or ns_port in range(port_b - 2, port_b + 2):
        port_b = free_broker_port()
    store = str(tmp_path / "store")
    common = [
        "--brokerIP1",
        "127.0.0.1",
        "--bindAddress",
        "127.0.0.1",
        "--storePathRootDir",
        store,
        "-n",
        f"127.0.0.1:{ns_port}",
    ]
    first = subprocess.Popen(
        [sys.executable, "-m", "pymq.broker", "--listenPort", str(port_a), *common],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert first.stdout is not None
        line = first.stdout.readline()
        if "boot success" not in line:
            first.kill()
            _, err = first.communicate(timeout=30)
            raise AssertionError(f"first broker did not boot: {line!r}\n{err}")
        second = run("pymq.broker", "--listenPort", str(port_b), *common)
        assert second.returncode == 1
        assert second.stderr.strip().splitlines()[-1].startswith("error: cannot start the broker")
        assert "Traceback" not in second.stderr
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=30) == 0
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert not os.path.exists(os.path.join(store, "abort"))  # clean shutdown


def test_embedded_default_starts_prints_help_and_stops(tmp_path) -> None:
    metrics_port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pymq",
            "--data",
            str(tmp_path),
            "--bind",
            "127.0.0.1",
            "--namesrv-port",
            "0",  # the OS picks: the broker also binds port - 2 and port + 1, so a free
            "--broker-port",  # port checked beforehand could still collide
            "0",
            "--mappedFileSizeCommitLog",
            str(1 << 20),
            "--admin-port",
            "0",
            "--metrics-port",
            str(metrics_port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        assert banner.startswith("pymq is running: name server 127.0.0.1:")
        rest = ""
        while "Press Ctrl-C" not in rest:
            line = proc.stdout.readline()
            assert line, rest
            rest += line
        assert "python -m pymq.client send" in rest and "python -m pymq.client consume" in rest
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        assert f"Prometheus:    {url}" in rest
        with urllib.request.urlopen(url, timeout=10) as answer:
            assert b"rocketmq_brokeruntime_put_tps10" in answer.read()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_standalone_broker_serves_the_admin_console(tmp_path) -> None:
    """``python -m pymq.broker --adminListenPort`` hands the admin channel to the broker."""
    port, admin_port, ns_port = free_broker_port(), free_port(), free_port()
    token = "a-standalone-token-0123456789"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pymq.broker",
            "--listenPort",
            str(port),
            "--brokerIP1",
            "127.0.0.1",
            "--bindAddress",
            "127.0.0.1",
            "--storePathRootDir",
            str(tmp_path / "store"),
            "--mappedFileSizeCommitLog",
            str(1 << 20),
            "--adminListenPort",
            str(admin_port),
            "--adminToken",
            token,
            "-n",
            f"127.0.0.1:{ns_port}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "boot success" in line, line  # the channel listens before the broker says so
        host = f"127.0.0.1:{admin_port}"
        page = _http(admin_port, f"GET / HTTP/1.1\r\nHost: {host}\r\n\r\n", until_close=True)
        assert page.startswith(b"HTTP/1.1 200") and b"<html" in page.lower()
        upgrade = (
            f"GET /ws?token={token} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n"
        )
        assert _http(admin_port, upgrade, until_close=False).startswith(b"HTTP/1.1 101")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _http(port: int, request: str, *, until_close: bool) -> bytes:
    """What is answered to ``request``: all of it, or the response head only."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request.encode())
        data = b""
        while until_close or b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        return data
