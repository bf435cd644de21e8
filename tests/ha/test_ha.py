"""Master/slave HA with a name server, a master and a slave as separate processes on loopback."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import trio

from pymq.client import Message, Producer, PullConsumer, topics
from pymq.remoting.client import open_remoting_client
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from tests.helpers import free_broker_port, free_port, wait_until

pytestmark = pytest.mark.slow  # separate processes: seconds per test

FILE_SIZE = 1 << 20  # small commit-log files: several files with little data


@attrs.define
class Proc:
    popen: subprocess.Popen
    port: int = 0
    store: Path | None = None

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()

    def stop(self) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        return self.popen.wait(timeout=30)


async def _spawn(args: list[str]) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert proc.stdout is not None
    line = await trio.to_thread.run_sync(proc.stdout.readline)
    if "success" not in line:
        proc.kill()
        raise AssertionError(f"{args[0]} did not start: {line!r}")
    return proc, line


async def start_namesrv(tmp: Path) -> Proc:
    popen, banner = await _spawn(
        [
            "pymq.namesrv",
            "--listenPort",
            "0",
            "--bindAddress",
            "127.0.0.1",
            "--kvConfigPath",
            str(tmp / "kv.json"),
        ]
    )
    # The name server binds a port the OS picks and prints it: no race for a free port.
    match = re.search(r"listening on port (\d+)", banner)
    assert match, banner
    return Proc(popen, int(match.group(1)))


async def start_broker(
    namesrv: Proc, store: Path, role: str, broker_id: int, port: int | None = None
) -> Proc:
    port = port or free_broker_port()
    popen, _ = await _spawn(
        [
            "pymq.broker",
            "-n",
            namesrv.addr,
            "--brokerName",
            "broker-a",
            "--brokerId",
            str(broker_id),
            "--brokerRole",
            role,
            "--listenPort",
            str(port),
            "--haListenPort",
            str(free_port()),
            "--brokerIP1",
            "127.0.0.1",
            "--brokerIP2",
            "127.0.0.1",
            "--bindAddress",
            "127.0.0.1",
            "--storePathRootDir",
            str(store),
            "--mappedFileSizeCommitLog",
            str(FILE_SIZE),
            "--flushDiskType",
            "ASYNC_FLUSH",
        ]
    )
    return Proc(popen, port, store)


async def runtime_info(addr: str) -> dict[str, str]:
    async with open_remoting_client() as client:
        response = await client.invoke(
            addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO)
        )
    return json.loads(response.body)["table"]


async def max_offset(addr: str) -> int:
    return int((await runtime_info(addr))["commitLogMaxOffset"])


async def wait_caught_up(slave: Proc, target: int, timeout: float = 30) -> None:
    async def caught_up() -> bool:
        return await max_offset(slave.addr) >= target

    await wait_until(caught_up, timeout=timeout, interval=0.1)


def commitlog_bytes(store: Path, upto: int) -> bytes:
    directory = store / "commitlog"
    data = b"".join((directory / name).read_bytes() for name in sorted(os.listdir(directory)))
    return data[:upto]


async def produce(namesrv: Proc, topic: str, bodies: list[str]) -> list[str]:
    """Send each body; return the ones the broker acknowledged as stored (SEND_OK)."""
    acked = []
    async with Producer("HA_P", namesrv.addr) as producer:
        for body in bodies:
            result = await producer.send(Message(topic, body.encode()))
            if result.status == "SEND_OK":
                acked.append(body)
    return acked


async def create_topic(broker: Proc, namesrv: Proc, topic: str) -> None:
    await topics.create_topic(namesrv.addr, topic, brokers=[broker.addr])


async def wait_slave_knows_topic(slave: Proc, topic: str) -> None:
    """A slave learns topics by its metadata sync (after 3 s, then every 10 s)."""
    async with open_remoting_client() as client:

        async def knows() -> bool:
            response = await client.invoke(
                slave.addr, RemotingCommand.request(RequestCode.GET_ALL_TOPIC_CONFIG)
            )
            return f'"{topic}"'.encode() in response.body

        await wait_until(knows, timeout=30, interval=0.2)


async def pull_everything(namesrv: Proc, topic: str) -> set[str]:
    bodies: set[str] = set()
    async with PullConsumer("HA_READER", namesrv.addr) as puller:
        for mq in await puller.fetch_subscribe_message_queues(topic):
            offset = 0
            while True:
                result = await puller.pull(mq, "*", offset, 32)
                bodies.update(m.body.decode() for m in result.messages)
                if result.status != "FOUND":
                    break
                offset = result.next_begin_offset
    return bodies


@pytest.fixture
async def procs():
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.kill()


async def test_async_master_slave_byte_identical_and_restart(tmp_path: Path, procs) -> None:
    namesrv = await start_namesrv(tmp_path)
    master = await start_broker(namesrv, tmp_path / "master", "ASYNC_MASTER", 0)
    slave = await start_broker(namesrv, tmp_path / "slave", "SLAVE", 1)
    procs += [namesrv, master, slave]
    await create_topic(master, namesrv, "HaTopic")
    acked = await produce(namesrv, "HaTopic", [f"a{i}-" + "x" * 2000 for i in range(1200)])
    assert len(acked) == 1200  # ~2.5 MB: more than two 1 MiB commit-log files
    target = await max_offset(master.addr)
    await wait_caught_up(slave, target)
    info = await runtime_info(master.addr)
    assert info["haConnections"] == "1" and "lag=0" in info["haSlaves"]

    # The slave dispatches what it received (its reput task, after the commit log: a new
    # queue's first entry waits for its file, made in a worker thread), then serves the
    # messages itself.
    async with open_remoting_client() as client:
        query = RemotingCommand.request(
            RequestCode.GET_MAX_OFFSET, {"topic": "HaTopic", "queueId": 0}
        )
        on_master = await client.invoke(master.addr, query)
        assert on_master.ext_fields["offset"] != "0"
        seen: list[str] = []

        async def dispatched() -> bool:
            on_slave = await client.invoke(slave.addr, query)
            seen.append(on_slave.ext_fields["offset"])
            return seen[-1] == on_master.ext_fields["offset"]

        with trio.move_on_after(30):
            while not await dispatched():
                await trio.sleep(0.05)
        print(f"slave's queue 0 after catching up: {seen[0]}, then {seen[-1]} ({len(seen)} asks)")
    assert seen[-1] == on_master.ext_fields["offset"], seen[-5:]

    # A slave refuses writes with a clear code.
    async with open_remoting_client() as client:
        send = RemotingCommand.request(
            RequestCode.SEND_MESSAGE,
            {
                "producerGroup": "P",
                "topic": "HaTopic",
                "defaultTopic": "TBW102",
                "defaultTopicQueueNums": 4,
                "queueId": 0,
                "sysFlag": 0,
                "bornTimestamp": 0,
                "flag": 0,
                "properties": "",
                "reconsumeTimes": 0,
            },
            b"refused",
        )
        refused = await client.invoke(slave.addr, send)
    assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert "the broker's disk is full [CL: " in refused.remark  # Java 4.9.4's remark
    assert "messages are put to the slave" in refused.remark

    # The master restarts on its store; the slave reconnects and catches up with new messages.
    assert master.stop() == 0
    master = await start_broker(namesrv, tmp_path / "master", "ASYNC_MASTER", 0, master.port)
    procs.append(master)
    await produce(namesrv, "HaTopic", [f"b{i}" for i in range(100)])
    target = await max_offset(master.addr)
    await wait_caught_up(slave, target)

    assert master.stop() == 0 and slave.stop() == 0
    assert commitlog_bytes(tmp_path / "slave", target) == commitlog_bytes(
        tmp_path / "master", target
    )


async def test_sync_master_killed_loses_no_acknowledged_message(tmp_path: Path, procs) -> None:
    namesrv = await start_namesrv(tmp_path)
    master = await start_broker(namesrv, tmp_path / "master", "SYNC_MASTER", 0)
    slave = await start_broker(namesrv, tmp_path / "slave", "SLAVE", 1)
    procs += [namesrv, master, slave]
    await create_topic(master, namesrv, "SyncTopic")

    async def slave_connected() -> bool:
        info = await runtime_info(master.addr)
        return info.get("haConnections") == "1"

    # Sends are SLAVE_NOT_AVAILABLE until the slave has connected.
    await wait_until(slave_connected, timeout=20, interval=0.1)

    await wait_slave_knows_topic(slave, "SyncTopic")
    acked: list[str] = []

    async def keep_sending() -> None:
        async with Producer("HA_P", namesrv.addr, send_timeout=2) as producer:
            for i in range(100_000):
                try:
                    result = await producer.send(Message("SyncTopic", f"s{i}".encode()))
                except Exception:
                    return  # the master is gone
                if result.status == "SEND_OK":
                    acked.append(f"s{i}")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(keep_sending)
        await wait_until(lambda: len(acked) >= 300, timeout=60, interval=0.01)
        master.kill()  # kill -9 in the middle of the stream
    assert len(acked) >= 300

    # Every acknowledged message is on the slave, and readers get them there.
    bodies = await pull_everything(namesrv, "SyncTopic")
    assert set(acked) <= bodies

    cpp = await trio.run_process(
        [
            sys.executable,
            str(Path(__file__).with_name("cpp_pull.py")),
            namesrv.addr,
            "SyncTopic",
            str(len(bodies)),
        ],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env=dict(os.environ, HOME=str(tmp_path)),
    )
    assert cpp.returncode == 0, cpp.stderr.decode(errors="replace")[-2000:]
    assert set(acked) <= set(cpp.stdout.decode().split())


async def test_late_slave_catches_up_from_the_oldest_file(tmp_path: Path, procs) -> None:
    namesrv = await start_namesrv(tmp_path)
    master = await start_broker(namesrv, tmp_path / "master", "ASYNC_MASTER", 0)
    procs += [namesrv, master]
    await create_topic(master, namesrv, "Late")
    await produce(namesrv, "Late", [f"l{i}-" + "y" * 3000 for i in range(800)])
    target = await max_offset(master.addr)
    assert target > 2 * FILE_SIZE
    slave = await start_broker(namesrv, tmp_path / "slave", "SLAVE", 1)
    procs.append(slave)
    await wait_caught_up(slave, target)
    assert master.stop() == 0 and slave.stop() == 0
    assert commitlog_bytes(tmp_path / "slave", target) == commitlog_bytes(
        tmp_path / "master", target
    )
