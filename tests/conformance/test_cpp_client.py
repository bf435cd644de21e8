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

SCRIPT = Path(__file__).with_name("cpp_client_roundtrip.py")
MODES = ["sync", "orderly", "oneway", "mixed", "batch", "pull", "retry"]
# The script's own --timeout (seconds to wait for every message).  In retry mode the C++ client
# fails a whole pulled batch when the first message of it fails, so a message that shared a
# batch with another comes back once more per delay level (10 s, 30 s, 60 s): on a loaded
# machine that can pass the default 90 s.
TIMEOUTS = {"retry": 180}


# Attempts per mode when, and only when, every failed attempt shows the client's own lock race.
MAX_ATTEMPTS = 3


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
    for log_file in (home / "logs" / "rocketmq-cpp").glob("*"):
        if "get timed_mutex timeout" in log_file.read_text(errors="replace"):
            return True
    return False


async def run_script(mode: str, home: Path) -> tuple[int, str]:
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
    stdout = result.stdout.decode(errors="replace")
    return result.returncode, stdout + result.stderr.decode(errors="replace")[-600:]


@pytest.mark.parametrize("mode", MODES)
async def test_cpp_client_roundtrip(mode: str, tmp_path: Path) -> None:
    for attempt in range(1, MAX_ATTEMPTS + 1):
        home = tmp_path / f"attempt{attempt}"
        code, output = await run_script(mode, home)
        if code == 0 or not client_lock_race(home):
            break
        # A fresh run only for the client's internal lock race (see client_lock_race); any other
        # failure fails the test at once.
        print(f"mode {mode} attempt {attempt} failed on the C++ client's transport lock race")
    assert code == 0, output[-1500:]
    assert f"PASS: mode={mode} received 200/200" in output
