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

from pymq.common.topic import RMQ_SYS_TRANS_OP_HALF_TOPIC, TopicConfig
from pymq.embedded import Cluster, open_cluster
from pymq.testing import TEST_PROPERTIES
from tests.helpers import free_port, wait_until

TOPIC = "Tx5"


@pytest.fixture
async def cluster(tmp_path) -> AsyncIterator[Cluster]:
    props = dict(
        TEST_PROPERTIES,
        grpcServerPort=str(free_port()),
        # No check round runs unless the test calls one (so none races the producer's own
        # commit and rollback); a half message is checkable 300 ms after it was stored.
        transactionCheckInterval="3600000",
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

    store = cluster.broker.store

    async def check_round(checks: int) -> None:
        """One round of the broker's checks once every half message is old enough, then the
        checker's ``checks``-th answer awaited (so that no round asks twice what one answer
        resolves)."""
        await trio.sleep(0.4)  # older than transactionTimeOut
        await store.reput.do_reput()
        await cluster.broker.transactions.check()
        await wait_until(lambda: len(checker.checked) == checks, what=f"check {checks}")

    async def two_in_topic() -> bool:
        return len(await in_topic(cluster)) == 2

    try:
        await trio.to_thread.run_sync(first_steps)
        # The commit's and the rollback's op records are in before any check round.
        await store.reput.do_reput()
        assert store.get_max_offset_in_queue(RMQ_SYS_TRANS_OP_HALF_TOPIC, 0) == 2
        assert [b"committed" in r for r in await in_topic(cluster)] == [True]
        await check_round(1)  # UNKNOWN: the orphan stays half
        assert len(await in_topic(cluster)) == 1
        await check_round(2)  # COMMIT
        await wait_until(two_in_topic, what="the orphan's commit")
    finally:
        await trio.to_thread.run_sync(producer.shutdown)
    records = await in_topic(cluster)
    assert len(records) == 2
    assert b"committed" in records[0] and b"orphan" in records[1]
    # The orphan was checked twice: UNKNOWN, then COMMIT; the others never.
    assert checker.checked == [b"orphan", b"orphan"]
    stats = cluster.broker.transactions.stats
    assert stats.committed == 2 and stats.rolled_back == 1
    for _ in range(3):  # more check rounds: nothing else is delivered or asked
        await trio.sleep(0.4)
        await cluster.broker.transactions.check()
    assert len(await in_topic(cluster)) == 2
    assert checker.checked == [b"orphan", b"orphan"]
