"""The broker over real loopback sockets, driven by the pymq client and by raw requests."""

from __future__ import annotations

import json
import types

import pytest
import trio
import trio.testing

from pymq.client import (
    ConsumeFromWhere,
    Message,
    MessageExt,
    MQClientError,
    Producer,
    PullConsumer,
    PushConsumer,
    topics,
)
from pymq.common.consumer import MessageQueue
from pymq.embedded import Cluster, open_cluster
from pymq.remoting.client import RemotingClient
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.testing import TEST_PROPERTIES
from tests.helpers import wait_until

FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET


async def create_topic(
    client: RemotingClient, cluster: Cluster, topic: str, **fields: object
) -> None:
    await topics.create_topic(cluster.namesrv_addr, topic, brokers=[cluster.broker_addr], **fields)


class Collector:
    """A push-consumer handler that records what it gets and can fail on purpose."""

    def __init__(self, fail: bool = False) -> None:
        self.messages: list[MessageExt] = []
        self.fail = fail
        self.changed = trio.Event()

    async def __call__(self, msgs: list[MessageExt]) -> bool:
        self.messages.extend(msgs)
        self.changed.set()
        self.changed = trio.Event()
        return not self.fail

    async def wait_for(self, count: int, timeout: float = 30) -> None:
        with trio.fail_after(timeout):
            while len(self.messages) < count:
                await self.changed.wait()

    def bodies(self) -> set[bytes]:
        return {m.body for m in self.messages}


async def test_produce_and_consume_through_the_name_server(pymq_cluster: Cluster, client) -> None:
    await create_topic(client, pymq_cluster, "Orders")
    collector = Collector()
    async with Producer("P", pymq_cluster.namesrv_addr) as producer:
        sent = []
        for i in range(20):
            result = await producer.send(
                Message("Orders", f"order-{i}".encode(), tags="TagA", keys=[f"k{i}", "all"])
            )
            assert result.status == "SEND_OK"
            sent.append(result)
        big = await producer.send(Message("Orders", b"x" * 10_000, tags="Big"))  # compressed
    async with PushConsumer("C", pymq_cluster.namesrv_addr, collector, consume_from=FIRST) as c:
        await c.subscribe("Orders", "TagA || Big")
        await collector.wait_for(21)
    got = {m.body: m for m in collector.messages}
    assert set(got) == {f"order-{i}".encode() for i in range(20)} | {b"x" * 10_000}
    assert len(collector.messages) == 21  # exactly once
    first = got[b"order-0"]
    assert first.tags == "TagA" and first.keys == ["k0", "all"]
    assert first.unique_key == sent[0].msg_id
    assert first.msg_id == sent[0].offset_msg_id
    assert (first.queue_id, first.queue_offset) == (sent[0].queue.queue_id, sent[0].queue_offset)
    assert got[b"x" * 10_000].msg_id == big.offset_msg_id

    async with PullConsumer("Puller", pymq_cluster.namesrv_addr) as puller:
        queues = await puller.fetch_subscribe_message_queues("Orders")
        assert sorted(q.queue_id for q in queues) == [0, 1, 2, 3]
        pulled = []
        for mq in queues:
            result = await puller.pull(mq, "TagA", 0, 32)
            pulled += result.messages
            assert result.next_begin_offset == result.max_offset
        assert {m.body for m in pulled} == {f"order-{i}".encode() for i in range(20)}


async def test_tag_filtering_and_batches(pymq_cluster: Cluster, client) -> None:
    await create_topic(client, pymq_cluster, "Mixed")
    async with Producer("P", pymq_cluster.namesrv_addr) as producer:
        queue = MessageQueue("Mixed", "broker-a", 2)
        batch = [Message("Mixed", f"b{i}".encode(), tags="A" if i % 2 else "B") for i in range(10)]
        result = await producer.send_batch(batch, queue=queue)
        assert (result.status, result.queue.queue_id, result.queue_offset) == ("SEND_OK", 2, 0)
    # Dispatch to the consume queues follows the append asynchronously (as in RocketMQ): a pull
    # that does not wait could come first.
    await pymq_cluster.broker.store.reput.do_reput()
    async with PullConsumer("Puller", pymq_cluster.namesrv_addr) as puller:
        found = await puller.pull(queue, "A", 0, 32)
        assert [m.body for m in found.messages] == [f"b{i}".encode() for i in range(1, 10, 2)]
        assert [m.queue_offset for m in found.messages] == [1, 3, 5, 7, 9]
        none = await puller.pull(queue, "C", 0, 32)
        assert none.status == "NO_MATCHED_MSG" and none.next_begin_offset == 10


async def test_two_consumers_split_the_queues_and_take_over(pymq_cluster: Cluster, client) -> None:
    await create_topic(client, pymq_cluster, "Shared")
    ns = pymq_cluster.namesrv_addr
    first, second = Collector(), Collector()
    async with PushConsumer("G", ns, first, consume_from=FIRST) as a:
        await a.subscribe("Shared")
        async with PushConsumer("G", ns, second, consume_from=FIRST) as b:
            await b.subscribe("Shared")

            def balanced() -> bool:
                mine = {m for m in a.assigned if m.topic == "Shared"}
                theirs = {m for m in b.assigned if m.topic == "Shared"}
                return len(mine) == 2 and len(theirs) == 2 and not mine & theirs

            await wait_until(balanced, timeout=30, interval=0.05)
            async with Producer("P", ns) as producer:
                for i in range(40):
                    await producer.send(Message("Shared", f"m{i}".encode()))
            await first.wait_for(20)
            await second.wait_for(20)
            assert first.bodies().isdisjoint(second.bodies())
        # b left: a is told at once (NOTIFY_CONSUMER_IDS_CHANGED) and takes every queue over.
        await wait_until(
            lambda: len({m for m in a.assigned if m.topic == "Shared"}) >= 4,
            timeout=30,
            interval=0.05,
        )
        async with Producer("P", ns) as producer:
            for i in range(40, 60):
                await producer.send(Message("Shared", f"m{i}".encode()))
        await first.wait_for(40)
    everything = first.bodies() | second.bodies()
    assert everything == {f"m{i}".encode() for i in range(60)}


async def test_broker_restart_loses_nothing(tmp_path, nursery) -> None:
    data = str(tmp_path / "data")
    sent: set[bytes] = set()
    before = Collector()
    async with open_cluster(
        data,
        namesrv_port=0,
        broker_port=0,
        bind_address="127.0.0.1",
        properties=dict(TEST_PROPERTIES),
    ) as cluster:
        client = RemotingClient(nursery)
        await create_topic(client, cluster, "Durable")
        client.close()
        async with Producer("P", cluster.namesrv_addr) as producer:
            for i in range(30):
                await producer.send(Message("Durable", f"d{i}".encode()))
                sent.add(f"d{i}".encode())
        async with PushConsumer("G", cluster.namesrv_addr, before, consume_from=FIRST) as c:
            await c.subscribe("Durable")
            await before.wait_for(30)
        # Leaving the consumer committed its offsets; leaving the cluster stops the broker.
    config_dir = tmp_path / "data" / "store" / "config"
    for name in ("topics", "consumerOffset", "subscriptionGroup", "consumerFilter", "delayOffset"):
        assert json.loads((config_dir / f"{name}.json").read_text())  # written, and valid JSON
    assert '"Durable@G"' in (config_dir / "consumerOffset.json").read_text()
    after = Collector()
    async with open_cluster(
        data,
        namesrv_port=0,
        broker_port=0,
        bind_address="127.0.0.1",
        properties=dict(TEST_PROPERTIES),
    ) as cluster:
        async with Producer("P", cluster.namesrv_addr) as producer:
            for i in range(30, 50):
                await producer.send(Message("Durable", f"d{i}".encode()))
                sent.add(f"d{i}".encode())
        async with PushConsumer("G", cluster.namesrv_addr, after, consume_from=FIRST) as c:
            await c.subscribe("Durable")
            await after.wait_for(20)
            await trio.sleep(0.5)  # room for anything wrongly delivered twice
    assert before.bodies() | after.bodies() == sent
    assert before.bodies().isdisjoint(after.bodies())  # resumed from the committed offsets
    assert len(after.messages) == 20


@pytest.mark.slow
async def test_retry_delay_redelivery_then_dlq(tmp_path) -> None:
    props = dict(TEST_PROPERTIES, messageDelayLevel=" ".join(["1s"] * 18))
    async with open_cluster(
        str(tmp_path), namesrv_port=0, broker_port=0, bind_address="127.0.0.1", properties=props
    ) as cluster:
        failing = Collector(fail=True)
        async with Producer("P", cluster.namesrv_addr) as producer:
            await producer.send(Message("Flaky", b"poison", keys="poison-key"))
        async with PushConsumer(
            "G", cluster.namesrv_addr, failing, consume_from=FIRST, max_reconsume_times=2
        ) as consumer:
            await consumer.subscribe("Flaky")
            await failing.wait_for(3, timeout=60)
            store = cluster.broker.store
            await wait_until(
                lambda: store.get_max_offset_in_queue("%DLQ%G", 0) >= 1, timeout=30, interval=0.05
            )
        assert [m.reconsume_times for m in failing.messages] == [0, 1, 2]
        assert all(m.topic == "Flaky" and m.body == b"poison" for m in failing.messages)
        raw = store.get_message("G", "%DLQ%G", 0, 0, 1).messages[0]
        from pymq.common.record import decode_record

        dead = decode_record(raw)
        assert dead.body == b"poison" and dead.reconsume_times == 3
        assert dead.properties["RETRY_TOPIC"] == "Flaky"
        assert dead.properties["ORIGIN_MESSAGE_ID"] == failing.messages[0].msg_id


async def test_held_pull_wakes_on_arrival_not_timeout(
    pymq_cluster: Cluster, client, mock_clock
) -> None:
    # The mock clock moves only when every task has been idle for a second of real time, and
    # then straight to the next deadline: a pull woken by the arrival comes back with no clock
    # time gone, one that waited out its 15 s suspension comes back 15 s later.
    mock_clock.autojump_threshold = 1.0
    await create_topic(client, pymq_cluster, "Wake")
    queue = MessageQueue("Wake", "broker-a", 0)
    async with PullConsumer("G", pymq_cluster.namesrv_addr) as puller:
        results = []
        held_for: list[float] = []

        async def hold() -> None:
            start = trio.current_time()
            results.append(await puller.pull(queue, "*", 0, 32, suspend_ms=15000, timeout=60))
            held_for.append(trio.current_time() - start)

        async with trio.open_nursery() as n:
            n.start_soon(hold)
            await trio.testing.wait_all_tasks_blocked()
            assert results == []
            async with Producer("P", pymq_cluster.namesrv_addr) as producer:
                await producer.send(Message("Wake", b"now"), queue=queue)
        assert results[0].status == "FOUND"
        assert [m.body for m in results[0].messages] == [b"now"]
        assert held_for[0] < 1.0  # woken by the arrival, not by the suspend timeout
    # The store reports arrivals of the topics someone waits on, and of the schedule topic;
    # of every topic while a slave is connected.
    broker = pymq_cluster.broker
    assert "Wake" not in broker._arrival_topics()  # nobody waits now
    # A pull whose suspension runs out no longer has its topic reported.
    async with PullConsumer("G2", pymq_cluster.namesrv_addr) as puller:
        empty = MessageQueue("Wake", "broker-a", 1)
        timed_out = await puller.pull(empty, "*", 0, 32, suspend_ms=2000, timeout=60)
    assert timed_out.status != "FOUND"
    assert "Wake" not in broker._arrival_topics()
    assert "SCHEDULE_TOPIC_XXXX" in broker._arrival_topics()
    real = broker.ha_service
    broker.ha_service = types.SimpleNamespace(connections=[object()])  # type: ignore[assignment]
    try:
        assert broker._arrival_topics() is None
    finally:
        broker.ha_service = real


def send_request(topic: str, body: bytes = b"x", queue_id: int = 0) -> RemotingCommand:
    return RemotingCommand.request(
        RequestCode.SEND_MESSAGE,
        {
            "producerGroup": "P",
            "topic": topic,
            "defaultTopic": "TBW102",
            "defaultTopicQueueNums": 4,
            "queueId": queue_id,
            "sysFlag": 0,
            "bornTimestamp": 0,
            "flag": 0,
            "properties": "",
            "reconsumeTimes": 0,
        },
        body,
    )


def pull_request(topic: str, group: str = "G", queue_id: int = 0) -> RemotingCommand:
    return RemotingCommand.request(
        RequestCode.PULL_MESSAGE,
        {
            "consumerGroup": group,
            "topic": topic,
            "queueId": queue_id,
            "queueOffset": 0,
            "maxMsgNums": 32,
            "sysFlag": 4,
            "commitOffset": 0,
            "suspendTimeoutMillis": 0,
            "subscription": "*",
            "subVersion": 0,
        },
    )


async def test_error_paths_answer_with_their_codes(tmp_path, client) -> None:
    props = dict(
        TEST_PROPERTIES,
        autoCreateTopicEnable="false",
        autoCreateSubscriptionGroup="false",
        maxMessageSize="1024",
    )
    async with open_cluster(
        str(tmp_path), namesrv_port=0, broker_port=0, bind_address="127.0.0.1", properties=props
    ) as cluster:
        broker = cluster.broker_addr

        async def call(request: RemotingCommand) -> RemotingCommand:
            return await client.invoke(broker, request)

        missing = await call(send_request("NoSuchTopic"))
        assert missing.code == ResponseCode.TOPIC_NOT_EXIST and "NoSuchTopic" in missing.remark
        illegal = await call(send_request("bad topic!"))
        assert (
            illegal.code == ResponseCode.MESSAGE_ILLEGAL and "illegal characters" in illegal.remark
        )

        await create_topic(client, cluster, "Small")
        too_big = await call(send_request("Small", b"x" * 2048))
        assert too_big.code == ResponseCode.MESSAGE_ILLEGAL and "maxMessageSize" in too_big.remark
        bad_queue = await call(send_request("Small", queue_id=9))
        assert bad_queue.code == ResponseCode.SYSTEM_ERROR and "queueId[9]" in bad_queue.remark

        await create_topic(client, cluster, "ReadOnly", perm=4)
        read_only = await call(send_request("ReadOnly"))
        assert read_only.code == ResponseCode.NO_PERMISSION

        no_group = await call(pull_request("Small", group="Unknown"))
        assert no_group.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
        group = json.dumps({"groupName": "Disabled", "consumeEnable": False}).encode()
        create_group = RemotingCommand.request(
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=group
        )
        assert (await call(create_group)).code == ResponseCode.SUCCESS
        assert (await call(pull_request("Small", "Disabled"))).code == ResponseCode.NO_PERMISSION
        group = json.dumps({"groupName": "G"}).encode()
        await call(
            RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=group)
        )
        assert (await call(pull_request("Nope"))).code == ResponseCode.TOPIC_NOT_EXIST
        bad_pull_queue = await call(pull_request("Small", queue_id=7))
        assert bad_pull_queue.code == ResponseCode.SYSTEM_ERROR

        # The store refusing writes (disk over 90 %) is SERVICE_NOT_AVAILABLE with Java's remark.
        store = cluster.broker.store
        store.clean_commitlog.disk_ratio = lambda path: 0.95
        await store.clean_files_once()
        full = await call(send_request("Small"))
        assert full.code == ResponseCode.SERVICE_NOT_AVAILABLE
        assert "the broker's disk is full [CL: " in full.remark
        store.clean_commitlog.disk_ratio = lambda path: 0.10
        await store.clean_files_once()
        assert (await call(send_request("Small"))).code == ResponseCode.SUCCESS

        # A read-only broker refuses every send.
        update = RemotingCommand.request(
            RequestCode.UPDATE_BROKER_CONFIG, body=b"brokerPermission=4\n"
        )
        assert (await call(update)).code == ResponseCode.SUCCESS
        forbidden = await call(send_request("Small"))
        assert forbidden.code == ResponseCode.NO_PERMISSION and "forbidden" in forbidden.remark


async def test_client_reports_refusals(pymq_cluster: Cluster) -> None:
    async with Producer("P", pymq_cluster.namesrv_addr) as producer:
        with pytest.raises(MQClientError) as info:
            await producer.send(Message("bad topic!", b"x"))
        assert info.value.code in (ResponseCode.MESSAGE_ILLEGAL, ResponseCode.TOPIC_NOT_EXIST)


async def test_a_oneway_send_is_stored_and_never_answered(pymq_cluster: Cluster, client) -> None:
    """A oneway SEND_MESSAGE_V2 (served inline, whose success answer is a ready frame) gets no
    answer: the first frame back on the connection answers the request after it."""
    from pymq.remoting import headers as H
    from pymq.remoting.codec import RPC_ONEWAY, FrameDecoder, encode

    await create_topic(client, pymq_cluster, "OneWay")
    host, port = pymq_cluster.broker_addr.rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    try:
        frames = b""
        for i, flag in enumerate((RPC_ONEWAY, 0)):
            ext = H.SendMessageRequestHeader.v2_ext("pg", "OneWay", 0, 0, 1, 0, "", False)
            req = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, ext, b"body-%d" % i)
            req.opaque, req.flag = 100 + i, flag
            frames += encode(req)
        await stream.send_all(frames)
        decoder = FrameDecoder()
        answers: list[RemotingCommand] = []
        with trio.fail_after(10):
            while not answers:
                answers += decoder.feed(await stream.receive_some(65536))
        assert [a.opaque for a in answers] == [101]
        assert answers[0].code == ResponseCode.SUCCESS
        assert answers[0].ext_fields["queueOffset"] == "1"  # the oneway one was stored first
    finally:
        await stream.aclose()


async def test_a_compressed_body_that_inflates_past_the_bound_is_skipped(
    pymq_cluster: Cluster, client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body a sender compressed to inflate to more than the consumer's bound (a zip bomb:
    a megabyte of zeros is a kilobyte) is skipped, said in the log; the messages beside it
    are delivered, a good compressed one inflated."""
    import zlib

    import pymq.client.consumer as consumer_module
    import pymq.client.producer as producer_module

    monkeypatch.setattr(consumer_module, "MAX_INFLATED_BODY", 1024 * 1024)
    bomb = zlib.compress(b"\0" * (1024 * 1024 + 1), 9)
    real_compress = zlib.compress

    def compress(body: bytes, level: int = -1) -> bytes:
        return bomb if body.startswith(b"BOMB") else real_compress(body, level)

    monkeypatch.setattr(producer_module.zlib, "compress", compress)
    await create_topic(client, pymq_cluster, "Bombs")
    async with Producer("P", pymq_cluster.namesrv_addr) as producer:
        mq = MessageQueue("Bombs", "broker-a", 0)
        for body in (b"before", b"BOMB" + b"x" * 5000, b"y" * 5000, b"after"):
            assert (await producer.send(Message("Bombs", body), queue=mq)).status == "SEND_OK"
    # A new queue's first entry waits for its file (made in a thread): dispatched before the pull.
    await pymq_cluster.broker.store.reput.do_reput()
    async with PullConsumer("Puller", pymq_cluster.namesrv_addr) as puller:
        result = await puller.pull(mq, "*", 0, 32)
    assert [m.body for m in result.messages] == [b"before", b"y" * 5000, b"after"]
    assert result.next_begin_offset == 4
