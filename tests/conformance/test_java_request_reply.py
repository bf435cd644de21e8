"""Java 4.9.4's request-reply against pymq: a DefaultMQProducer.request requester and a push
consumer responder (MessageUtil.createReplyMessage + send) in one JVM (java/RequestReply.java),
through an in-process pymq name server and broker; and each of them with pymq's client in the
other role.

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
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from pymq.client import (
    ConsumeFromWhere,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    SendResult,
    create_reply_message,
    topics,
)
from pymq.embedded import Cluster, open_cluster
from pymq.testing import TEST_PROPERTIES

RMQ_BUILD = pathlib.Path(os.environ.get("RMQ_BUILD", "/tmp/rmqjava494"))
CLASSPATH = RMQ_BUILD / "lib" / "full.classpath"
SOURCE = pathlib.Path(__file__).parent / "java" / "RequestReply.java"
TOPIC = "JavaRequestTopic"
FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
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


@pytest.fixture(scope="module")
def java_classes(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    classes = tmp_path_factory.mktemp("java-classes")
    args = ["javac", "-nowarn", "-cp", _classpath(), "-d", str(classes), str(SOURCE)]
    done = subprocess.run(args, capture_output=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return classes


def _classpath() -> str:
    return CLASSPATH.read_text().strip()


@asynccontextmanager
async def _cluster(tmp_path: pathlib.Path) -> AsyncIterator[Cluster]:
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
        yield cluster


async def _java(
    cluster: Cluster, classes: pathlib.Path, home: pathlib.Path, *mode: str
) -> list[str]:
    """Run RequestReply in ``mode``; its output lines (it must end well)."""
    args = [
        "java",
        *JVM_OPTIONS,
        f"-Duser.home={home}",
        f"-Drocketmq.client.logRoot={home / 'logs'}",
        "-cp",
        f"{_classpath()}:{classes}",
        "RequestReply",
        cluster.namesrv_addr,
        TOPIC,
        *mode,
    ]
    with trio.fail_after(120):
        done = await trio.run_process(args, capture_stdout=True, capture_stderr=True, check=False)
    out = done.stdout.decode(errors="replace")
    assert done.returncode == 0, f"java failed ({done.returncode}):\n{out}\n{done.stderr!r}"
    lines = out.splitlines()
    assert "DONE" in lines, out
    return lines


def _fields(line: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S*)", line))


def _sent(lines: list[str]) -> list[str]:
    """The responder's send status of each reply: SEND_OK when the broker pushed it to the
    requester and the requester took it."""
    return [line.split()[1] for line in lines if line.startswith(("REPLY_SENT", "REPLY_FAILED"))]


def _callback_reply(lines: list[str]) -> dict[str, str]:
    (callback,) = [line for line in lines if line.startswith("CALLBACK_")]
    assert callback.startswith("CALLBACK_RESULT"), lines
    reply = _fields(callback)
    assert reply["body"] == "re:q-cb" and reply["type"] == "reply", lines
    assert reply["corr"] == reply["sent_corr"], lines
    assert reply["topic"] == "DefaultCluster_REPLY_TOPIC", lines
    return reply


async def test_java_requester_and_responder_through_pymq(
    tmp_path: pathlib.Path, java_classes: pathlib.Path
) -> None:
    async with _cluster(tmp_path) as cluster:
        lines = await _java(cluster, java_classes, tmp_path, "pair")
        stored = _stored_replies(cluster)
    # Both replies pushed to the Java requester and taken by its client (SEND_OK, not
    # SYSTEM_ERROR "push reply message to ...fail.").
    assert _sent(lines) == ["SEND_OK", "SEND_OK"], lines
    (sync,) = [line for line in lines if line.startswith("SYNC_")]
    assert sync.startswith("SYNC_RESULT"), lines
    got = _fields(sync)
    # 4.9.4 returns its own request (see the module docstring); a fixed client the reply.
    assert got["body"] in ("q-sync", "re:q-sync"), lines
    if got["body"] == "q-sync":
        assert got["same"] == "true" and got["corr"] == got["sent_corr"], lines
    _callback_reply(lines)
    # storeReplyMessageEnable (default true): both replies kept in the reply topic.
    assert sorted(stored) == [b"re:q-cb", b"re:q-sync"]


async def test_pymq_requester_and_java_responder(
    tmp_path: pathlib.Path, java_classes: pathlib.Path
) -> None:
    async with _cluster(tmp_path) as cluster, trio.open_nursery() as nursery:
        java: list[list[str]] = []

        async def respond() -> None:
            java.append(await _java(cluster, java_classes, tmp_path, "responder", "1"))

        nursery.start_soon(respond)
        async with Producer("PyRequestPG", cluster.namesrv_addr) as requester:
            # The JVM starts meanwhile; its consumer starts from the queue's first offset.
            reply = await requester.request(Message(TOPIC, b"from-pymq"), timeout=60)
    assert reply.body == b"re:from-pymq" and reply.topic == "DefaultCluster_REPLY_TOPIC"
    assert reply.properties["MSG_TYPE"] == "reply"
    assert _sent(java[0]) == ["SEND_OK"], java[0]


async def test_java_requester_and_pymq_responder(
    tmp_path: pathlib.Path, java_classes: pathlib.Path
) -> None:
    async with _cluster(tmp_path) as cluster:
        ns = cluster.namesrv_addr
        results: list[SendResult] = []
        async with Producer("PyReplyPG", ns) as replier:

            async def respond(msgs: list[MessageExt]) -> bool:
                for msg in msgs:
                    results.append(await replier.send(create_reply_message(msg, b"re:" + msg.body)))
                return True

            async with PushConsumer("PyResponderCG", ns, respond, consume_from=FIRST) as consumer:
                await consumer.subscribe(TOPIC)
                lines = await _java(cluster, java_classes, tmp_path, "requester")
    _callback_reply(lines)
    assert [r.status for r in results] == ["SEND_OK"]


def _stored_replies(cluster: Cluster) -> list[bytes]:
    store = cluster.broker.store
    topic = "DefaultCluster_REPLY_TOPIC"
    out = []
    for offset in range(store.get_max_offset_in_queue(topic, 0)):
        msg = store.message_at(topic, 0, offset)
        assert msg is not None
        out.append(msg.body)
    return out
