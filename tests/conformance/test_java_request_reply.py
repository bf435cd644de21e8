"""Java 4.9.4's request-reply against pymq: a DefaultMQProducer.request requester and a push
consumer responder (MessageUtil.createReplyMessage + send) in one JVM (java/RequestReply.java),
through an in-process pymq name server and broker.

Needs the Java 4.9.4 client built from source (/work/shared/java/README.md):
``$RMQ_BUILD/lib/full.classpath`` (RMQ_BUILD defaults to /tmp/rmqjava494); skipped otherwise.

Java 4.9.4's synchronous ``request(msg, timeout)`` returns the request message itself once the
broker has stored it (its send callback puts the request where the reply belongs; fixed in
4.9.5), so the reply reaches that requester after the call returned and is dropped by its
client with a warning.  The test checks what that call can show (it returns without error
and the responder's reply was pushed: SEND_OK), and the reply itself through
``request(msg, callback, timeout)``, whose callback 4.9.4 does call with the reply.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil

import pytest
import trio

from pymq.client import topics
from pymq.embedded import Cluster, open_cluster
from pymq.testing import TEST_PROPERTIES

RMQ_BUILD = pathlib.Path(os.environ.get("RMQ_BUILD", "/tmp/rmqjava494"))
CLASSPATH = RMQ_BUILD / "lib" / "full.classpath"
SOURCE = pathlib.Path(__file__).parent / "java" / "RequestReply.java"
TOPIC = "JavaRequestTopic"
JVM_OPTIONS = [
    "-Xms128m",
    "-Xmx256m",
    "--add-opens",
    "java.base/java.nio=ALL-UNNAMED",
    "--add-opens",
    "java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens",
    "java.base/java.lang=ALL-UNNAMED",
]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not CLASSPATH.exists() or shutil.which("javac") is None,
        reason=f"the Java 4.9.4 client is not built ({CLASSPATH} missing, or no javac): "
        "see /work/shared/java/README.md",
    ),
]


async def _run(args: list[str], timeout: float) -> str:
    with trio.fail_after(timeout):
        done = await trio.run_process(args, capture_stdout=True, capture_stderr=True, check=False)
    out = done.stdout.decode(errors="replace")
    assert done.returncode == 0, f"{args[0]} failed ({done.returncode}):\n{out}\n{done.stderr!r}"
    return out


def _fields(line: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S*)", line))


async def test_java_request_and_responder_through_pymq(tmp_path: pathlib.Path) -> None:
    classpath = CLASSPATH.read_text().strip()
    classes = tmp_path / "classes"
    classes.mkdir()
    await _run(["javac", "-nowarn", "-cp", classpath, "-d", str(classes), str(SOURCE)], 120)
    async with open_cluster(
        str(tmp_path / "pymq"),
        namesrv_port=0,
        broker_port=0,
        bind_address="127.0.0.1",
        properties=dict(TEST_PROPERTIES),
    ) as cluster:
        await topics.create_topic(
            cluster.namesrv_addr, TOPIC, brokers=[cluster.broker_addr], queues=2
        )
        out = await _java(cluster, classpath, classes, tmp_path)
        stored = _stored_replies(cluster)
    lines = out.splitlines()
    assert "DONE" in lines, out
    sent = [line for line in lines if line.startswith(("REPLY_SENT", "REPLY_FAILED"))]
    # Both replies pushed to the Java requester and taken by its client (SEND_OK, not
    # SYSTEM_ERROR "push reply message to ...fail.").
    assert [line.split()[1] for line in sent] == ["SEND_OK", "SEND_OK"], out
    (sync,) = [line for line in lines if line.startswith("SYNC_")]
    assert sync.startswith("SYNC_RESULT"), out
    got = _fields(sync)
    # 4.9.4 returns its own request (see the module docstring); a fixed client the reply.
    assert got["body"] in ("q-sync", "re:q-sync"), out
    if got["body"] == "q-sync":
        assert got["same"] == "true" and got["corr"] == got["sent_corr"], out
    (callback,) = [line for line in lines if line.startswith("CALLBACK_")]
    assert callback.startswith("CALLBACK_RESULT"), out
    reply = _fields(callback)
    assert reply["body"] == "re:q-cb" and reply["type"] == "reply", out
    assert reply["corr"] == reply["sent_corr"], out
    assert reply["topic"] == "DefaultCluster_REPLY_TOPIC", out
    # storeReplyMessageEnable (default true): both replies kept in the reply topic.
    assert sorted(stored) == [b"re:q-cb", b"re:q-sync"]


async def _java(cluster: Cluster, classpath: str, classes: pathlib.Path, home: pathlib.Path) -> str:
    return await _run(
        [
            "java",
            *JVM_OPTIONS,
            f"-Duser.home={home}",
            f"-Drocketmq.client.logRoot={home / 'logs'}",
            "-cp",
            f"{classpath}:{classes}",
            "RequestReply",
            cluster.namesrv_addr,
            TOPIC,
        ],
        120,
    )


def _stored_replies(cluster: Cluster) -> list[bytes]:
    store = cluster.broker.store
    topic = "DefaultCluster_REPLY_TOPIC"
    out = []
    for offset in range(store.get_max_offset_in_queue(topic, 0)):
        msg = store.message_at(topic, 0, offset)
        assert msg is not None
        out.append(msg.body)
    return out
