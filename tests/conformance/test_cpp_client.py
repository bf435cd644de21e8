"""The judge: the real RocketMQ C++ client (PyPI rocketmq==0.4.4) against pymq, every mode.

``cpp_client_roundtrip.py`` is ../shared/conformance's script, copied unchanged.  Each mode runs it
in a subprocess against an in-process name server and broker on free loopback ports.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import trio

from pymq.client.topics import create_topic
from pymq.embedded import open_cluster
from pymq.testing import TEST_PROPERTIES

pytestmark = pytest.mark.slow  # separate processes: seconds per test

SCRIPT = Path(__file__).with_name("cpp_client_roundtrip.py")
MODES = ["sync", "orderly", "oneway", "mixed", "batch", "pull", "retry"]
# The script's own --timeout (seconds to wait for every message).  In retry mode the C++ client
# fails a whole pulled batch when the first message of it fails, so a message that shared a
# batch with another comes back once more per delay level (10 s, 30 s, 60 s): on a loaded
# machine that can pass the default 90 s.
TIMEOUTS = {"retry": 180}


# Attempts per mode when, and only when, every failed attempt shows one of the client's own
# faults below.
MAX_ATTEMPTS = 3
# What the script raises, in retry mode, to fail a first delivery on purpose.
ON_PURPOSE = "fail the first delivery on purpose"


def client_lock_race(home: Path) -> bool:
    """Whether the C++ client logged its own transport-table lock timeout ("get timed_mutex
    timeout" in TcpRemotingClient::CreateTransport).

    The bundled librocketmq's ``try_lock_for`` on that table fails at once (not after its 3 s)
    whenever another client thread holds the lock, so the request is never sent: a producer then
    fails every try within a millisecond, and a push consumer's send-back of a failed message is
    lost, because this client version logs the error and moves its offset on anyway (seen in
    retry mode: the message was never sent back, and the broker never heard of it).  A race
    between threads inside the client, which no broker can prevent.
    """
    return "get timed_mutex timeout" in client_log(home)


def client_log(home: Path) -> str:
    return "".join(
        f.read_text(errors="replace") for f in sorted((home / "logs" / "rocketmq-cpp").glob("*"))
    )


def raise_taken_as_success(home: Path, stderr: str) -> bool:
    """Whether the client took a raising callback as a successful one (retry mode).

    The PyPI wrapper re-raises the callback's exception inside its ctypes callback (printing
    "Exception ignored on calling ctypes callback function"), so the int the C++ side reads back
    is whatever the return slot held: usually not 0, which means RECONSUME_LATER, but now and
    then 0, CONSUME_SUCCESS.  Then the message is never sent back, the client moves its offset
    on, and the script never sees it again.  Each failed batch makes the client log its first
    message with "index is:0"; fewer of those than raises means some raise passed as success.
    """
    raises = stderr.count(f"RuntimeError: {ON_PURPOSE}")
    failed_batches = sum(
        1
        for line in client_log(home).splitlines()
        if "consume fail" in line and "index is:0," in line
    )
    return raises > failed_batches


async def run_script(mode: str, home: Path) -> tuple[int, str, str]:
    async with open_cluster(
        str(home / "pymq"),
        namesrv_port=0,
        broker_port=0,
        bind_address="127.0.0.1",
        properties=dict(TEST_PROPERTIES),
    ) as cluster:
        topic = f"Conformance_{mode}"
        # Created first, as the script's README asks: a push consumer then owns its queues
        # before the producer starts.
        await create_topic(cluster.namesrv_addr, topic)
        env = dict(os.environ, HOME=str(home))  # the client logs under $HOME/logs
        with trio.fail_after(300):
            result = await trio.run_process(
                [
                    sys.executable,
                    str(SCRIPT),
                    "--namesrv",
                    cluster.namesrv_addr,
                    "--topic",
                    topic,
                    "--count",
                    "200",
                    "--mode",
                    mode,
                    "--timeout",
                    str(TIMEOUTS.get(mode, 90)),
                ],
                env=env,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    return (
        result.returncode,
        result.stdout.decode(errors="replace"),
        result.stderr.decode(errors="replace"),
    )


@pytest.mark.parametrize("mode", MODES)
async def test_cpp_client_roundtrip(mode: str, tmp_path: Path) -> None:
    for attempt in range(1, MAX_ATTEMPTS + 1):
        home = tmp_path / f"attempt{attempt}"
        code, stdout, stderr = await run_script(mode, home)
        if code == 0:
            break
        if client_lock_race(home):
            fault = "transport lock race"
        elif mode == "retry" and raise_taken_as_success(home, stderr):
            fault = "a raising callback taken as a success"
        else:
            break  # any other failure fails the test at once
        # A fresh run only for a fault inside the client (see the two functions above).
        print(f"mode {mode} attempt {attempt} failed on the C++ client's {fault}")
    output = stdout + stderr[-600:]
    assert code == 0, output[-1500:]
    assert f"PASS: mode={mode} received 200/200" in output
