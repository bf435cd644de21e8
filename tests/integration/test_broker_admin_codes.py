"""Broker admin and lookup codes over real sockets, and client expiry."""

from __future__ import annotations

import json
import time

import trio
import trio.testing

from pymq.client import Message, Producer, PushConsumer, topics
from pymq.common.consumer import HeartbeatData, ProducerData
from pymq.common.record import decode_record, iter_records
from pymq.common.serde import to_json
from pymq.embedded import Cluster
from pymq.remoting.client import RemotingClient
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from tests.helpers import wait_until


async def broker_controller_register(cluster: Cluster) -> None:
    await cluster.broker.register_broker_all(force=True)


def req(code: int, **fields: object) -> RemotingCommand:
    return RemotingCommand.request(code, fields)


async def test_lookups_by_offset_key_and_time(
    pymq_cluster: Cluster, client: RemotingClient
) -> None:
    broker = pymq_cluster.broker_addr
    await topics.create_topic(pymq_cluster.namesrv_addr, "Lookup", queues=1)
    before = int(time.time() * 1000) - 1
    async with Producer("P", pymq_cluster.namesrv_addr) as producer:
        first = await producer.send(Message("Lookup", b"one", keys="order-1"))
        await trio.sleep(0.01)
        middle = int(time.time() * 1000)
        await producer.send(Message("Lookup", b"two", keys="order-2 shared"))
        await producer.send(Message("Lookup", b"three", keys="shared"))
    store = pymq_cluster.broker.store
    await wait_until(
        lambda: store.get_max_offset_in_queue("Lookup", 0) >= 3, timeout=10, interval=0.01
    )

    earliest = await client.invoke(
        broker, req(RequestCode.GET_EARLIEST_MSG_STORETIME, topic="Lookup", queueId=0)
    )
    assert int(earliest.ext_fields["timestamp"]) >= before
    by_time = await client.invoke(
        broker,
        req(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, topic="Lookup", queueId=0, timestamp=middle),
    )
    assert by_time.ext_fields["offset"] == "1"
    low = await client.invoke(broker, req(RequestCode.GET_MIN_OFFSET, topic="Lookup", queueId=0))
    high = await client.invoke(broker, req(RequestCode.GET_MAX_OFFSET, topic="Lookup", queueId=0))
    assert (low.ext_fields["offset"], high.ext_fields["offset"]) == ("0", "3")

    _, _, phy = (
        first.offset_msg_id[:8],
        first.offset_msg_id[8:16],
        int(first.offset_msg_id[16:], 16),
    )
    view = await client.invoke(broker, req(RequestCode.VIEW_MESSAGE_BY_ID, offset=phy))
    assert view.code == ResponseCode.SUCCESS and decode_record(view.body).body == b"one"
    missing = await client.invoke(broker, req(RequestCode.VIEW_MESSAGE_BY_ID, offset=phy + 7))
    assert missing.code == ResponseCode.SYSTEM_ERROR

    found = await client.invoke(
        broker,
        req(
            RequestCode.QUERY_MESSAGE,
            topic="Lookup",
            key="shared",
            maxNum=32,
            beginTimestamp=0,
            endTimestamp=2**62,
        ),
    )
    assert found.code == ResponseCode.SUCCESS
    assert sorted(m.body for m in iter_records(found.body)) == [b"three", b"two"]
    by_uniq = await client.invoke(
        broker,
        req(
            RequestCode.QUERY_MESSAGE,
            topic="Lookup",
            key=first.msg_id,
            maxNum=32,
            beginTimestamp=0,
            endTimestamp=2**62,
        ),
    )
    assert [m.body for m in iter_records(by_uniq.body)] == [b"one"]
    none = await client.invoke(
        broker,
        req(
            RequestCode.QUERY_MESSAGE,
            topic="Lookup",
            key="nope",
            maxNum=32,
            beginTimestamp=0,
            endTimestamp=2**62,
        ),
    )
    assert none.code == ResponseCode.QUERY_NOT_FOUND


async def test_topic_config_listing_and_delete(
    pymq_cluster: Cluster, client: RemotingClient
) -> None:
    broker, ns = pymq_cluster.broker_addr, pymq_cluster.namesrv_addr
    await topics.create_topic(ns, "Doomed", queues=2)
    async with Producer("P", ns) as producer:
        await producer.send(Message("Doomed", b"x"))
    listing = json.loads((await client.invoke(broker, req(RequestCode.GET_ALL_TOPIC_CONFIG))).body)
    assert listing["topicConfigTable"]["Doomed"]["writeQueueNums"] == 2
    for system in (
        "TBW102",
        "SELF_TEST_TOPIC",
        "DefaultCluster",
        "broker-a",
        "SCHEDULE_TOPIC_XXXX",
    ):
        assert system in listing["topicConfigTable"]
    deleted = await client.invoke(broker, req(RequestCode.DELETE_TOPIC_IN_BROKER, topic="Doomed"))
    assert deleted.code == ResponseCode.SUCCESS
    listing = json.loads((await client.invoke(broker, req(RequestCode.GET_ALL_TOPIC_CONFIG))).body)
    assert "Doomed" not in listing["topicConfigTable"]
    assert pymq_cluster.broker.store.get_max_offset_in_queue("Doomed", 0) == 0
    # As in RocketMQ, the name server keeps the route until it is told too (mqadmin deleteTopic
    # sends DELETE_TOPIC_IN_NAMESRV after the brokers), and the broker does not bring it back.
    await client.invoke(ns, req(RequestCode.DELETE_TOPIC_IN_NAMESRV, topic="Doomed"))
    await broker_controller_register(pymq_cluster)
    route = req(RequestCode.GET_ROUTEINFO_BY_TOPIC, topic="Doomed")
    assert (await client.invoke(ns, route)).code == ResponseCode.TOPIC_NOT_EXIST
    runtime = json.loads(
        (await client.invoke(broker, req(RequestCode.GET_BROKER_RUNTIME_INFO))).body
    )
    assert int(runtime["table"]["commitLogMaxOffset"]) > 0
    config = await client.invoke(broker, req(RequestCode.GET_BROKER_CONFIG))
    assert b"brokerName=broker-a\n" in config.body


async def test_silent_clients_expire_and_groups_are_told(
    pymq_cluster: Cluster, client: RemotingClient, mock_clock
) -> None:
    mock_clock.autojump_threshold = 1.0  # a stuck wait fails by its timeout instead of hanging
    await topics.create_topic(pymq_cluster.namesrv_addr, "TopicX")  # consumers find the broker
    broker = pymq_cluster.broker
    heartbeat = HeartbeatData("silent-client", [ProducerData("SilentProducer")], [])
    assert (
        await client.invoke(
            pymq_cluster.broker_addr,
            RemotingCommand.request(RequestCode.HEART_BEAT, body=to_json(heartbeat)),
        )
    ).code == ResponseCode.SUCCESS
    assert "SilentProducer" in broker.producer_manager.groups
    silent = await client.channel(pymq_cluster.broker_addr)

    notified = trio.Event()

    async def handle(msgs: list) -> bool:
        return True

    async with PushConsumer("Watchers", pymq_cluster.namesrv_addr, handle) as consumer:
        await consumer.subscribe("TopicX")
        assert consumer.client is not None
        consumer.client.on_ids_changed = lambda group: notified.set()
        mock_clock.jump(100)  # the consumer's own heartbeat keeps it alive; the producer's not
        await trio.testing.wait_all_tasks_blocked()
        assert "SilentProducer" in broker.producer_manager.groups
        mock_clock.jump(30)  # 130 s of silence from the producer's connection
        await wait_until(
            lambda: "SilentProducer" not in broker.producer_manager.groups,
            timeout=5,
            interval=0.01,
        )
        await silent.wait_closed()
        # A second member joining makes the broker notify the first at once.
        async with PushConsumer("Watchers", pymq_cluster.namesrv_addr, handle) as second:
            await second.subscribe("TopicX")
            with trio.fail_after(5):
                await notified.wait()


async def test_query_correction_offset(pymq_cluster: Cluster, client: RemotingClient) -> None:
    """QUERY_CORRECTION_OFFSET (308): the lowest offset of the groups not filtered out, per
    queue; Long.MAX_VALUE where the compare group is behind it; nothing changed."""
    broker = pymq_cluster.broker_addr
    offsets = pymq_cluster.broker.consumer_offset_manager
    for group, queue_offsets in {
        "G1": {0: 10, 1: 4},
        "G2": {0: 7, 1: 9},
        "G3": {0: 2},
    }.items():
        for queue_id, offset in queue_offsets.items():
            offsets.commit_offset("test", group, "Corr", queue_id, offset)
    offsets.commit_offset("test", "G1", "Other", 0, 0)
    before = json.dumps(offsets.encode(), sort_keys=True)

    async def correction(**fields: object) -> bytes:
        answer = await client.invoke(broker, req(RequestCode.QUERY_CORRECTION_OFFSET, **fields))
        assert (answer.code, answer.remark) == (ResponseCode.SUCCESS, None)
        return answer.body

    assert await correction(topic="Corr", compareGroup="G2") == b'{"correctionOffsets":{0:2,1:4}}'
    assert await correction(topic="Corr", compareGroup="G2", filterGroups="") == (
        b'{"correctionOffsets":{0:2,1:4}}'
    )
    assert await correction(topic="Corr", compareGroup="G1", filterGroups="G3") == (
        b'{"correctionOffsets":{0:7,1:4}}'
    )
    # G3 is behind the others on queue 0: nothing to correct there (Long.MAX_VALUE).
    assert await correction(topic="Corr", compareGroup="G3", filterGroups="G3,G9") == (
        b'{"correctionOffsets":{0:9223372036854775807,1:4}}'
    )
    assert await correction(topic="Nothing", compareGroup="G1") == b'{"correctionOffsets":{}}'
    # Java deletes the filtered groups' offsets as it reads them; pymq changes nothing.
    assert json.dumps(offsets.encode(), sort_keys=True) == before

    missing = await client.invoke(broker, req(RequestCode.QUERY_CORRECTION_OFFSET, topic="Corr"))
    assert (missing.code, missing.remark) == (
        ResponseCode.SYSTEM_ERROR,
        "the custom field <compareGroup> is null",
    )
