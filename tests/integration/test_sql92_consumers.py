"""SQL92 subscriptions through the real protocol: a push consumer (CHECK_CLIENT_CONFIG,
heartbeat-registered filter, pulls without the expression) and a pull consumer (the expression in
each pull), against a broker with and without enablePropertyFilter, and filtered retry."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager as AsyncContextManager

import pytest
import trio

from pymq.client import (
    ConsumeFromWhere,
    Message,
    MessageExt,
    MessageSelector,
    MQClientError,
    Producer,
    PullConsumer,
    PushConsumer,
    topics,
)
from pymq.common.consumer import MessageQueue
from pymq.common.topic import retry_topic
from pymq.embedded import Cluster, open_cluster
from pymq.remoting.codes import ResponseCode
from pymq.testing import TEST_PROPERTIES

FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET


@pytest.fixture
async def sql_cluster(tmp_path) -> AsyncIterator[Cluster]:
    properties = dict(TEST_PROPERTIES, enablePropertyFilter="true", filterSupportRetry="true")
    async with open_cluster(
        str(tmp_path),
        namesrv_port=0,
        broker_port=0,
        bind_address="127.0.0.1",
        properties=properties,
    ) as cluster:
        yield cluster


async def produce(cluster: Cluster, topic: str, count: int) -> None:
    await topics.create_topic(cluster.namesrv_addr, topic, brokers=[cluster.broker_addr])
    async with Producer("P", cluster.namesrv_addr) as producer:
        for i in range(count):
            msg = Message(topic, f"m{i}".encode(), tags="T")
            msg.properties["n"] = str(i)
            msg.properties["kind"] = "even" if i % 2 == 0 else "odd"
            result = await producer.send(msg)
            assert result.status == "SEND_OK"
    await cluster.broker.store.reput.do_reput()


class Collector:
    """Records what it gets; fails the first delivery of the messages numbered ``fail``."""

    def __init__(self, fail: frozenset[int] = frozenset()) -> None:
        self.messages: list[MessageExt] = []
        self.fail = set(fail)
        self.changed = trio.Event()

    async def __call__(self, msgs: list[MessageExt]) -> bool:
        self.messages.extend(msgs)
        self.changed.set()
        self.changed = trio.Event()
        failing = {int(m.properties["n"]) for m in msgs} & self.fail
        self.fail -= failing
        return not failing

    async def wait_for(self, count: int, timeout: float = 30) -> None:
        with trio.fail_after(timeout):
            while len(self.messages) < count:
                await self.changed.wait()


async def test_push_consumer_by_sql(sql_cluster: Cluster) -> None:
    await produce(sql_cluster, "Metrics", 20)
    collector = Collector()
    selector = MessageSelector.by_sql("n >= 10 AND kind = 'even'")
    async with PushConsumer("CG_SQL", sql_cluster.namesrv_addr, collector, consume_from=FIRST) as c:
        await c.subscribe("Metrics", selector)
        await collector.wait_for(5)
        await trio.sleep(0.3)  # nothing else arrives
    assert sorted(int(m.properties["n"]) for m in collector.messages) == [10, 12, 14, 16, 18]
    data = sql_cluster.broker.consumer_filter_manager.get("Metrics", "CG_SQL")
    assert data is not None and data.expression == "n >= 10 AND kind = 'even'"


async def test_pull_consumer_by_sql(sql_cluster: Cluster) -> None:
    await produce(sql_cluster, "Metrics", 12)
    async with PullConsumer("Puller", sql_cluster.namesrv_addr) as puller:
        await puller.subscribe("Metrics", MessageSelector.by_sql("n IN ('1', '5', '7')"))
        got: list[int] = []
        for mq in await puller.fetch_subscribe_message_queues("Metrics"):
            result = await puller.pull(mq, None, 0, 32)
            got += [int(m.properties["n"]) for m in result.messages]
            assert result.next_begin_offset == result.max_offset
            if not result.messages and result.max_offset:
                assert result.status == "NO_MATCHED_MSG"
        assert sorted(got) == [1, 5, 7]
        bad = (await puller.fetch_subscribe_message_queues("Metrics"))[0]
        with pytest.raises(MQClientError) as info:
            await puller.pull(bad, MessageSelector.by_sql("n >"), 0, 32)
        assert info.value.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED


async def test_a_bad_expression_fails_the_consumer_with_javas_remark(sql_cluster: Cluster) -> None:
    await produce(sql_cluster, "Metrics", 1)
    consumer = PushConsumer("CG_BAD", sql_cluster.namesrv_addr, Collector())
    await consumer.subscribe("Metrics", MessageSelector.by_sql("a between AND (("))
    with pytest.raises(MQClientError) as info:
        async with consumer:
            pass
    assert info.value.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
    assert 'Encountered " "AND" "AND "" at line 1, column 11.' in str(info.value)


async def test_a_broker_without_property_filter_refuses_sql(pymq_cluster: Cluster) -> None:
    await produce(pymq_cluster, "Metrics", 1)
    async with PushConsumer("CG_NF", pymq_cluster.namesrv_addr, Collector()) as consumer:
        with pytest.raises(MQClientError) as info:
            await consumer.subscribe("Metrics", MessageSelector.by_sql("n > 1"))
        assert info.value.code == ResponseCode.SYSTEM_ERROR
        assert "The broker does not support consumer to filter message by SQL92" in str(info.value)
        assert "Metrics" not in consumer.subscriptions


async def test_retried_messages_are_filtered_by_the_current_filter(sql_cluster: Cluster) -> None:
    """With filterSupportRetry, messages coming back through %RETRY%group are filtered by the
    group's current filter of their original topic: after the consumer narrows its expression,
    only the retried message that still matches is delivered again."""
    await produce(sql_cluster, "Metrics", 6)
    collector = Collector(fail=frozenset({1, 3}))  # sent back, to come through the retry topic
    group = "CG_RETRY"
    async with PushConsumer(group, sql_cluster.namesrv_addr, collector, consume_from=FIRST) as c:
        await c.subscribe("Metrics", MessageSelector.by_sql("kind = 'odd'"))
        await collector.wait_for(3)
        assert sorted(int(m.properties["n"]) for m in collector.messages) == [1, 3, 5]
        # The sent-back messages wait 10 s (delay level 3) before entering the retry topic.
        await c.subscribe("Metrics", MessageSelector.by_sql("n = 1"))
        await collector.wait_for(4, timeout=60)
        retry_mq = MessageQueue(retry_topic(group), "broker-a", 0)
        with trio.fail_after(30):
            while c.offsets.get(retry_mq, 0) < 2:  # both retried messages were scanned
                await trio.sleep(0.05)
        await trio.sleep(0.2)
    numbers = [int(m.properties["n"]) for m in collector.messages]
    assert numbers[3:] == [1]  # n=3 no longer matches: skipped in the retry topic
    assert collector.messages[3].topic == "Metrics"
    assert sql_cluster.broker.store.get_max_offset_in_queue(retry_topic(group), 0) == 2


async def test_filters_survive_a_broker_restart(tmp_path) -> None:
    """consumerFilter.json is written at shutdown (and every 10 s) and read again at start (its
    filters compiled when first needed); the reloaded filter is dead until the group's
    heartbeat comes back, and still filters."""
    properties = dict(TEST_PROPERTIES, enablePropertyFilter="true")
    data = str(tmp_path)

    def cluster() -> AsyncContextManager[Cluster]:
        return open_cluster(
            data, namesrv_port=0, broker_port=0, bind_address="127.0.0.1", properties=properties
        )

    async with cluster() as first:
        await produce(first, "Metrics", 8)
        collector = Collector()
        async with PushConsumer("CG_KEEP", first.namesrv_addr, collector, consume_from=FIRST) as c:
            await c.subscribe("Metrics", MessageSelector.by_sql("n < 2"))
            await collector.wait_for(2)
    path = tmp_path / "store" / "config" / "consumerFilter.json"
    saved = json.loads(path.read_text())
    entry = saved["filterDataByTopic"]["Metrics"]["groupFilterData"]["CG_KEEP"]
    assert entry["expression"] == "n < 2" and entry["expressionType"] == "SQL92"
    assert entry["deadTime"] >= entry["bornTime"]  # the group left at shutdown

    async with cluster() as second:
        data_after = second.broker.consumer_filter_manager.get("Metrics", "CG_KEEP")
        assert data_after is not None and data_after.is_dead
        manager = second.broker.consumer_filter_manager
        compiled = await manager.prepare(data_after)
        assert compiled is not None and compiled.matches({"n": "1"}.get)
        assert data_after.client_version == entry["clientVersion"]
