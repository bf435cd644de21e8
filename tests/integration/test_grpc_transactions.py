"""Transactional messages from the official 5.x Producer (issue #40): a committed half message
reaches its topic, a rolled-back one never does, and an orphaned one (neither) is checked by
the broker over the Telemetry stream: the checker's UNKNOWN leaves it pending, its COMMIT
then delivers it, once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
from rocketmq.grpc_protocol import TransactionResolution
from rocketmq.v5.client import ClientConfiguration, Credentials
from rocketmq.v5.model import Message
from rocketmq.v5.producer import Producer, TransactionChecker

from pymq.common.topic import TopicConfig
from pymq.embedded import Cluster, open_cluster
from pymq.testing import TEST_PROPERTIES
from tests.helpers import free_port

TOPIC = "Tx5"


@pytest.fixture
async def cluster(tmp_path) -> AsyncIterator[Cluster]:
    props = dict(
        TEST_PROPERTIES,
        grpcServerPort=str(free_port()),
        transactionCheckInterval="300",
        transactionTimeOut="300",
    )
    async with open_cluster(
        str(tmp_path), namesrv_port=0, broker_port=0, bind_address="127.0.0.1", properties=props
    ) as cluster:
        await cluster.broker.topic_config_manager.update(
            TopicConfig(TOPIC, 1, 1, attributes={"message.type": "TRANSACTION"})
        )
        yield cluster


class Checker(TransactionChecker):
    """UNKNOWN for each message's first check, then COMMIT."""

    def __init__(self) -> None:
        self.checked: list[bytes] = []

    def check(self, message: Any) -> int:
        self.checked.append(message.body)
        if self.checked.count(message.body) == 1:
            return TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED
        return TransactionResolution.COMMIT


def message(body: bytes) -> Message:
    msg = Message()
    msg.topic = TOPIC
    msg.body = body
    msg.tag = "tx"
    return msg


async def in_topic(cluster: Cluster) -> list[bytes]:
    store = cluster.broker.store
    await store.reput.do_reput()
    result = store.get_message("check", TOPIC, 0, 0, 32)
    return [m for m in result.messages]


async def test_commit_rollback_and_an_orphan_resolved_by_the_checker(cluster: Cluster) -> None:
    checker = Checker()
    port = cluster.broker.grpc_server.port  # type: ignore[union-attr]
    producer = Producer(ClientConfiguration(f"127.0.0.1:{port}", Credentials()), (TOPIC,), checker)

    def first_steps() -> None:
        producer.startup()
        committed = producer.begin_transaction()
        producer.send(message(b"committed"), committed)
        committed.commit()
        rolled_back = producer.begin_transaction()
        producer.send(message(b"rolled-back"), rolled_back)
        rolled_back.rollback()
        orphan = producer.begin_transaction()
        producer.send(message(b"orphan"), orphan)  # neither committed nor rolled back

    try:
        await trio.to_thread.run_sync(first_steps)
        with trio.fail_after(20):
            while len(await in_topic(cluster)) < 2:
                await trio.sleep(0.1)
    finally:
        await trio.to_thread.run_sync(producer.shutdown)
    records = await in_topic(cluster)
    assert len(records) == 2
    assert b"committed" in records[0] and b"orphan" in records[1]
    # The orphan was checked twice: UNKNOWN, then COMMIT; the others never.
    assert checker.checked == [b"orphan", b"orphan"]
    stats = cluster.broker.transactions.stats
    assert stats.committed == 2 and stats.rolled_back == 1
    await trio.sleep(1)  # a few more check rounds: nothing else is delivered
    assert len(await in_topic(cluster)) == 2
