"""A broker serving gRPC imports no RocketMQ client package (issue #40): the official 5.x
client's modules set up its log files under ``~/logs/rocketmq_python`` when imported and bring
grpcio, none of which the broker needs.  The broker runs in a process of its own with a fresh
HOME, serves the official Producer (run here, in the test's process), and then reports what
it has imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from rocketmq.v5.client import ClientConfiguration, Credentials
from rocketmq.v5.model import Message
from rocketmq.v5.producer import Producer

from tests.helpers import free_port

BROKER = """
import json, sys, trio
from pymq.common.topic import TopicConfig
from pymq.embedded import open_cluster
from pymq.testing import TEST_PROPERTIES

FOREIGN = ("rocketmq", "grpc", "h2")  # the official client, grpcio, the h2 library

async def main(data: str, port: int) -> None:
    props = dict(TEST_PROPERTIES, grpcServerPort=str(port))
    async with open_cluster(
        data, namesrv_port=0, broker_port=0, bind_address="127.0.0.1", properties=props
    ) as cluster:
        await cluster.broker.topic_config_manager.update(TopicConfig("Alone", 1, 1))
        print("ready", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)  # the test's producer is done
        await cluster.broker.store.reput.do_reput()
        report = {
            "loaded": sorted(m for m in sys.modules if m.split(".")[0] in FOREIGN),
            "served": "pymq.proxy.service" in sys.modules,
            "stored": cluster.broker.store.get_max_offset_in_queue("Alone", 0),
        }
        print(json.dumps(report), flush=True)

trio.run(main, sys.argv[1], int(sys.argv[2]))
"""


@pytest.mark.slow
async def test_a_grpc_broker_imports_no_client_and_writes_no_client_logs(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    port = free_port()
    env = dict(os.environ, HOME=str(home))
    proc = subprocess.Popen(
        [sys.executable, "-c", BROKER, str(tmp_path / "data"), str(port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        ready = await trio.to_thread.run_sync(proc.stdout.readline)
        assert ready == "ready\n", proc.stderr.read() if proc.stderr else ready

        def produce() -> None:
            producer = Producer(ClientConfiguration(f"127.0.0.1:{port}", Credentials()), ("Alone",))
            producer.startup()
            try:
                message = Message()
                message.topic = "Alone"
                message.body = b"served without a client package"
                producer.send(message)
            finally:
                producer.shutdown()

        await trio.to_thread.run_sync(produce)
        proc.stdin.write("done\n")
        proc.stdin.flush()
        with trio.fail_after(30):
            line = await trio.to_thread.run_sync(proc.stdout.readline)
        report = json.loads(line)
    finally:
        proc.kill()
        proc.wait()
    assert report == {"loaded": [], "served": True, "stored": 1}
    assert not (home / "logs" / "rocketmq_python").exists()
