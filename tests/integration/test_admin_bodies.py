"""The admin bodies mqadmin and the dashboard parse, over real sockets, against the bodies the
Java 4.9.4 broker wrote (java-wire-samples/), read by the tests' own fastjson reader; and the
offset reset reaching a live consumer (RESET_CONSUMER_CLIENT_OFFSET)."""

from __future__ import annotations

import time
from pathlib import Path

import trio

from pymq.client import Message, Producer, PushConsumer, topics
from pymq.common.consumer import ConsumeFromWhere
from pymq.common.message_ext import MessageExt
from pymq.embedded import Cluster
from pymq.remoting.client import RemotingClient
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from tests.fastjson_reader import Obj, compatible, read, shape
from tests.helpers import start_minute_window, wait_until

SAMPLES = Path(__file__).parent.parent / "data" / "java_wire_samples"
TOPIC, GROUP, PRODUCER = "TopicA", "CG_CAP", "PG_STAY"


def req(code: int, **fields: object) -> RemotingCommand:
    return RemotingCommand.request(code, fields)


def java_shape(name: str) -> object:
    return shape(read((SAMPLES / name).read_bytes()))


def assert_like_java(body: bytes, sample_name: str) -> Obj:
    parsed = read(body)
    assert compatible(shape(parsed), java_shape(sample_name)), (body, sample_name)
    return parsed


def queue_keys(table: Obj) -> list[tuple[str, int]]:
    return sorted((k.get("topic"), k.get("queueId")) for k, _ in table.entries)


async def test_admin_bodies_and_reset_reach_a_live_consumer(
    pymq_cluster: Cluster, client: RemotingClient
) -> None:
    ns, broker = pymq_cluster.namesrv_addr, pymq_cluster.broker_addr
    await topics.create_topic(ns, TOPIC, queues=4)
    received: list[MessageExt] = []

    async def handler(msgs: list[MessageExt]) -> bool:
        received.extend(msgs)
        return True

    first = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    async with (
        Producer(PRODUCER, ns) as producer,
        PushConsumer(GROUP, ns, handler, consume_from=first) as consumer,
    ):
        await consumer.subscribe(TOPIC)
        sent = [await producer.send(Message(TOPIC, f"m{i}".encode())) for i in range(12)]
        await wait_until(lambda: len(received) >= 12, timeout=30, interval=0.05)
        await consumer.persist_offsets()
        stats = pymq_cluster.broker.stats
        # Two minute snapshots, as StatsItem takes every 10 s (not waited for here).
        start_minute_window(stats, int(time.time() * 1000) - 10_000)
        sent.append(await producer.send(Message(TOPIC, b"late")))
        await wait_until(lambda: len(received) >= 13, timeout=30, interval=0.05)
        stats.snapshot("minute", int(time.time() * 1000))

        topic_stats = await client.invoke(
            broker, req(RequestCode.GET_TOPIC_STATS_INFO, topic=TOPIC)
        )
        table = assert_like_java(topic_stats.body, "GET_TOPIC_STATS_INFO-202.body.json")
        offsets = table.get("offsetTable")
        assert queue_keys(offsets) == [(TOPIC, q) for q in range(4)]
        assert sum(v.get("maxOffset") for v in (v for _, v in offsets.entries)) == 13

        async def consumed_all() -> bool:
            await consumer.persist_offsets()
            body = (
                await client.invoke(
                    broker, req(RequestCode.GET_CONSUME_STATS, consumerGroup=GROUP, topic=TOPIC)
                )
            ).body
            entries = read(body).get("offsetTable").entries
            return sum(v.get("consumerOffset") for _, v in entries) == 13

        await wait_until(consumed_all, timeout=15, interval=0.1)
        for fields, name in (
            ({"consumerGroup": GROUP}, "GET_CONSUME_STATS-208-no-topic.body.json"),
            (
                {"consumerGroup": GROUP, "topic": TOPIC},
                "GET_CONSUME_STATS-208-with-topic.body.json",
            ),
        ):
            reply = await client.invoke(broker, req(RequestCode.GET_CONSUME_STATS, **fields))
            parsed = assert_like_java(reply.body, name)
            assert isinstance(parsed.get("consumeTps"), float)
        unknown = await client.invoke(
            broker, req(RequestCode.GET_CONSUME_STATS, consumerGroup="never-seen")
        )
        assert (
            unknown.code == ResponseCode.SUCCESS
            and read(unknown.body).get("offsetTable").entries == []
        )

        conn = await client.invoke(
            broker, req(RequestCode.GET_CONSUMER_CONNECTION_LIST, consumerGroup=GROUP)
        )
        parsed = assert_like_java(conn.body, "GET_CONSUMER_CONNECTION_LIST-203.body.json")
        client_id = parsed.get("connectionSet")[0].get("clientId")
        assert client_id == consumer.client.client_id  # type: ignore[union-attr]

        prod = await client.invoke(
            broker, req(RequestCode.GET_PRODUCER_CONNECTION_LIST, producerGroup=PRODUCER)
        )
        assert prod.code == ResponseCode.SUCCESS
        assert_like_java(prod.body, "GET_PRODUCER_CONNECTION_LIST-204.body.json")
        none = await client.invoke(
            broker, req(RequestCode.GET_PRODUCER_CONNECTION_LIST, producerGroup="nobody")
        )
        assert (none.code, none.remark) == (1, "the producer group[nobody] not exist")

        for code, sample in (
            (RequestCode.GET_ALL_TOPIC_CONFIG, "GET_ALL_TOPIC_CONFIG-21.body.json"),
            (RequestCode.GET_ALL_CONSUMER_OFFSET, "GET_ALL_CONSUMER_OFFSET-43.body.json"),
            (RequestCode.GET_ALL_DELAY_OFFSET, "GET_ALL_DELAY_OFFSET-45.body.json"),
            (
                RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
                "GET_ALL_SUBSCRIPTIONGROUP_CONFIG-201.body.json",
            ),
        ):
            parsed = assert_like_java((await client.invoke(broker, req(code))).body, sample)
        offsets = read((await client.invoke(broker, req(RequestCode.GET_ALL_CONSUMER_OFFSET))).body)
        assert sorted(offsets.get("offsetTable").get(f"{TOPIC}@{GROUP}").keys()) == [0, 1, 2, 3]

        every = await client.invoke(broker, req(RequestCode.GET_ALL_PRODUCER_INFO))
        producers = read(every.body).get("data").get(PRODUCER)
        assert [p.get("clientId") for p in producers] == [producer.client.client_id]  # type: ignore[union-attr]
        assert producers[0].get("lastUpdateTimestamp") > 0

        who = await client.invoke(broker, req(RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, topic=TOPIC))
        who_body = assert_like_java(who.body, "QUERY_TOPIC_CONSUME_BY_WHO-300.body.json")
        assert who_body.get("groupList") == [GROUP]

        span = await client.invoke(
            broker, req(RequestCode.QUERY_CONSUME_TIME_SPAN, topic=TOPIC, group=GROUP)
        )
        spans = assert_like_java(span.body, "QUERY_CONSUME_TIME_SPAN-303.body.json")
        for item in spans.get("consumeTimeSpanSet"):
            assert item.get("delayTime") == 0
            assert "#" in item.get("maxTimeStampStr")

        for name, key, sample in (
            ("TOPIC_PUT_NUMS", TOPIC, "VIEW_BROKER_STATS_DATA-315-TOPIC_PUT_NUMS-TopicA.body.json"),
            (
                "GROUP_GET_NUMS",
                f"{TOPIC}@{GROUP}",
                "VIEW_BROKER_STATS_DATA-315-GROUP_GET_NUMS-TopicA@CG_CAP.body.json",
            ),
            (
                "BROKER_PUT_NUMS",
                "DefaultCluster",
                "VIEW_BROKER_STATS_DATA-315-BROKER_PUT_NUMS-CapCluster.body.json",
            ),
        ):
            reply = await client.invoke(
                broker, req(RequestCode.VIEW_BROKER_STATS_DATA, statsName=name, statsKey=key)
            )
            assert reply.code == ResponseCode.SUCCESS, reply.remark
            minute = assert_like_java(reply.body, sample).get("statsMinute")
            assert minute.get("sum") == 1 and minute.get("tps") > 0
        missing = await client.invoke(
            broker,
            req(RequestCode.VIEW_BROKER_STATS_DATA, statsName="TOPIC_PUT_NUMS", statsKey="Nope"),
        )
        assert (missing.code, missing.remark) == (1, "The stats <TOPIC_PUT_NUMS> <Nope> not exist")
        assert missing.body == b""

        all_stats = await client.invoke(
            broker, req(RequestCode.GET_BROKER_CONSUME_STATS, isOrder="false")
        )
        parsed = assert_like_java(all_stats.body, "GET_BROKER_CONSUME_STATS-317.body.json")
        groups = [m.keys()[0] for m in parsed.get("consumeStatsList")]
        assert GROUP in groups and "SELF_TEST_C_GROUP" in groups
        assert parsed.get("totalDiff") == 0

        # GET_CONSUMER_RUNNING_INFO, relayed to the Python consumer and back.
        info = await client.invoke(
            broker,
            req(
                RequestCode.GET_CONSUMER_RUNNING_INFO,
                consumerGroup=GROUP,
                clientId=client_id,
                jstackEnable="false",
            ),
        )
        assert (info.code, info.remark) == (0, "not set any response code")
        running = assert_like_java(info.body, "GET_CONSUMER_RUNNING_INFO-307.body.json")
        assert queue_keys(running.get("mqTable")) == sorted(
            [(TOPIC, q) for q in range(4)] + [(f"%RETRY%{GROUP}", 0)]
        )
        gone = await client.invoke(
            broker,
            req(RequestCode.GET_CONSUMER_RUNNING_INFO, consumerGroup=GROUP, clientId="nobody"),
        )
        assert (gone.code, gone.remark) == (1, f"The Consumer <{GROUP}> <nobody> not online")

        # CONSUME_MESSAGE_DIRECTLY: the broker adds the message, the consumer's handler runs.
        before = len(received)
        direct = await client.invoke(
            broker,
            req(
                RequestCode.CONSUME_MESSAGE_DIRECTLY,
                consumerGroup=GROUP,
                clientId=client_id,
                msgId=sent[0].offset_msg_id,
            ),
        )
        assert direct.code == ResponseCode.SUCCESS
        result = read(direct.body)
        assert result.get("consumeResult") == "CR_SUCCESS"
        assert len(received) == before + 1 and received[-1].body == b"m0"

        # INVOKE_BROKER_TO_GET_CONSUMER_STATUS: the broker asks each client (221).
        status = await client.invoke(
            broker,
            req(
                RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS,
                topic=TOPIC,
                group=GROUP,
                clientAddr="",
            ),
        )
        assert (status.code, status.remark) == (0, "not set any response code")
        parsed = assert_like_java(status.body, "INVOKE_BROKER_TO_GET_CONSUMER_STATUS-223.body.json")
        ((cid, table),) = parsed.get("consumerTable").entries
        assert cid == client_id and queue_keys(table) == [(TOPIC, q) for q in range(4)]
        assert sum(v for _, v in table.entries) == 13
        nobody = await client.invoke(
            broker,
            req(RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, topic=TOPIC, group="nobody"),
        )
        assert (nobody.code, nobody.remark) == (
            1,
            "No Any Consumer online in the consumer group: [nobody]",
        )

        system = await client.invoke(broker, req(RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_BROKER))
        assert "SELF_TEST_TOPIC" in read(system.body).get("topicList")

        clone = await client.invoke(
            broker,
            req(
                RequestCode.CLONE_GROUP_OFFSET,
                srcGroup=GROUP,
                destGroup="CG_CLONE",
                offline="false",
            ),
        )
        assert clone.code == ResponseCode.SUCCESS
        cloned = await client.invoke(
            broker, req(RequestCode.GET_CONSUME_STATS, consumerGroup="CG_CLONE", topic=TOPIC)
        )
        entries = read(cloned.body).get("offsetTable").entries
        assert sum(v.get("consumerOffset") for _, v in entries) == 13

        # QUERY_CONSUME_QUEUE (queryCq): the raw entries of a queue.
        cq = await client.invoke(
            broker,
            req(
                RequestCode.QUERY_CONSUME_QUEUE,
                topic=TOPIC,
                queueId=0,
                index=0,
                count=2,
                consumerGroup=GROUP,
            ),
        )
        assert cq.code == ResponseCode.SUCCESS
        cq_body = read(cq.body)
        assert cq_body.get("minQueueIndex") == 0 and cq_body.get("maxQueueIndex") >= 2
        assert [e.get("physicSize") > 0 for e in cq_body.get("queueData")] == [True, True]
        assert cq_body.get("subscriptionData").get("topic") == TOPIC
        no_cq = await client.invoke(
            broker,
            req(RequestCode.QUERY_CONSUME_QUEUE, topic="Nope", queueId=0, index=0, count=1),
        )
        assert (no_cq.code, no_cq.remark) == (1, "0@Nope is not exist!")

        # CLEAN_UNUSED_TOPIC drops the queues of a topic no config names; 306 answers SUCCESS.
        await topics.create_topic(ns, "Unused", queues=1)
        await producer.send(Message("Unused", b"x"))
        store = pymq_cluster.broker.store
        await wait_until(lambda: store.consume_queues.find("Unused", 0) is not None, timeout=10)
        await pymq_cluster.broker.topic_config_manager.delete("Unused")
        cleaned = await client.invoke(broker, req(RequestCode.CLEAN_UNUSED_TOPIC))
        assert cleaned.code == ResponseCode.SUCCESS
        assert store.consume_queues.find("Unused", 0) is None
        assert store.consume_queues.find(TOPIC, 0) is not None
        expired = await client.invoke(broker, req(RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE))
        assert expired.code == ResponseCode.SUCCESS
        commitlog = await client.invoke(broker, req(RequestCode.DELETE_EXPIRED_COMMITLOG))
        assert commitlog.code == ResponseCode.SUCCESS

        # The reset: Java's answer, and the live consumer pulls everything again.
        reset = await client.invoke(
            broker,
            req(
                RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
                topic=TOPIC,
                group=GROUP,
                timestamp=0,
                isForce="true",
            ),
        )
        assert (reset.code, reset.remark) == (0, "not set any response code")
        table = assert_like_java(reset.body, "INVOKE_BROKER_TO_RESET_OFFSET-222.body.json")
        assert [v for _, v in table.get("offsetTable").entries] == [0, 0, 0, 0]
        before = len(received)
        await wait_until(lambda: len(received) >= before + 13, timeout=30, interval=0.05)
        assert sorted(m.body for m in received[before:]) == sorted(
            [f"m{i}".encode() for i in range(12)] + [b"late"]
        )

    # pymq places a group it does not know yet (Java refuses it): a new group can be
    # positioned before it first starts.
    new_group = await client.invoke(
        broker,
        req(
            RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
            topic=TOPIC,
            group="NEW_GROUP",
            timestamp=-1,
            isForce="true",
        ),
    )
    assert new_group.code == ResponseCode.SUCCESS
    offsets = pymq_cluster.broker.consumer_offset_manager.query_offsets("NEW_GROUP", TOPIC)
    assert sum(offsets.values()) == 13
    no_topic = await client.invoke(
        broker,
        req(
            RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
            topic="NoSuchTopic",
            group=GROUP,
            timestamp=0,
            isForce="true",
        ),
    )
    assert (no_topic.code, no_topic.remark) == (
        1,
        "[reset-offset] reset offset failed, no topic in this broker. topic=NoSuchTopic",
    )
    await trio.sleep(0)
