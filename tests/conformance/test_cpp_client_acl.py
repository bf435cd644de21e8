"""The real C++ RocketMQ client with ACL session credentials (``set_session_credentials``)
against a pymq broker with aclEnable=true: a permitted send is stored; a denied topic, a wrong
secret and no credentials are refused (the client logs the broker's AclException remark)."""

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

SCRIPT = Path(__file__).with_name("cpp_client_acl.py")
ACL = """\
accounts:
  - accessKey: RocketMQAdmin
    secretKey: 12345678admin
    admin: true
  - accessKey: cppProducer
    secretKey: cppSecret123
    defaultTopicPerm: DENY
    topicPerms: [CppAllowed=PUB]
"""


async def test_cpp_client_with_session_credentials(tmp_path: Path) -> None:
    home = tmp_path / "rocketmq"
    (home / "conf").mkdir(parents=True)
    (home / "conf" / "plain_acl.yml").write_text(ACL)
    properties = dict(TEST_PROPERTIES, aclEnable="true", rocketmqHome=str(home))
    async with open_cluster(
        str(tmp_path / "pymq"),
        namesrv_port=0,
        broker_port=0,
        bind_address="127.0.0.1",
        properties=properties,
    ) as cluster:
        for topic in ("CppAllowed", "CppDenied"):
            await create_topic(
                cluster.namesrv_addr,
                topic,
                brokers=[cluster.broker_addr],
                credentials=("RocketMQAdmin", "12345678admin"),
            )
        runs = iter(range(100))

        async def send(topic: str, *credentials: str) -> tuple[str, str]:
            """The script's verdict, and what the client logged (it logs the broker's remark of
            a refused send, and raises a generic error once its retries are spent)."""
            client_home = tmp_path / f"run{next(runs)}"
            env = dict(os.environ, HOME=str(client_home))  # the client logs under $HOME/logs
            args = [sys.executable, str(SCRIPT), "--namesrv", cluster.namesrv_addr]
            args += ["--topic", topic]
            if credentials:
                args += ["--access-key", credentials[0], "--secret-key", credentials[1]]
            with trio.fail_after(120):
                result = await trio.run_process(
                    args, env=env, capture_stdout=True, capture_stderr=True, check=False
                )
            out = result.stdout.decode(errors="replace").strip()
            assert result.returncode == 0, (out, result.stderr.decode(errors="replace")[-800:])
            logs = sorted((client_home / "logs" / "rocketmq-cpp").glob("*"))
            return out.splitlines()[-1], "".join(f.read_text(errors="replace") for f in logs)

        verdict, _ = await send("CppAllowed", "cppProducer", "cppSecret123")
        assert verdict == "SENT 0"  # SendStatus.OK
        remark = "error remark:org.apache.rocketmq.acl.common.AclException: "
        for topic, credentials, refusal in (
            ("CppDenied", ("cppProducer", "cppSecret123"), "No default permission for topic:"),
            ("CppAllowed", ("cppProducer", "notTheSecret"), "Check signature failed for"),
            # Without credentials this client still sends an AccessKey, empty: as the 4.9.4
            # broker does, pymq knows no such account.
            ("CppAllowed", (), "No acl config for , "),
        ):
            verdict, log = await send(topic, *credentials)
            assert verdict.startswith("REFUSED"), (topic, credentials, verdict)
            assert remark + refusal in log, (topic, credentials, log[-1500:])
        assert cluster.broker.stats.put_msgs == 1
