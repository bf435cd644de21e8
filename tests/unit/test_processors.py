"""The send, pull and consumer processors called without a socket (issue #17, point 2).

Each test builds a :class:`~pymq.broker.context.BrokerContext` over a real store in a temp dir
and fresh managers, and calls the processors with ``RemotingCommand`` requests and a fake channel
that has only what processors touch (``remote_address`` and ``answer``).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest
import trio

from pymq.broker.config import BrokerConfig
from pymq.broker.context import BrokerContext
from pymq.broker.processors.consumer import ConsumerProcessor
from pymq.broker.processors.pull import (
    FLAG_COMMIT_OFFSET,
    FLAG_SUBSCRIPTION,
    FLAG_SUSPEND,
    PullProcessor,
)
from pymq.broker.processors.send import SendProcessor
from pymq.common.consumer import (
    ConsumerData,
    ConsumerList,
    HeartbeatData,
    MessageModel,
    ProducerData,
    SubscriptionData,
)
from pymq.common.message_ext import encode_properties
from pymq.common.record import decode_records
from pymq.common.serde import from_json, to_json
from pymq.common.topic import TopicConfig, dlq_topic, retry_topic
from pymq.remoting import headers as H
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.store import DefaultMessageStore, MessageStoreConfig
from tests.helpers import answer_command
from tests.unit.contexts import make_broker_context

TOPIC = "TopicTest"
GROUP = "cg"
CLIENT = "10.0.0.9:40000"


@attrs.define(eq=False)  # hashed by identity, as channels are
class FakeChannel:
    """What processors touch of a channel: its peer's address and the deferred answer."""

    remote_address: str = CLIENT
    answers: list[tuple[RemotingCommand, RemotingCommand]] = attrs.Factory(list)

    def answer(self, request: RemotingCommand, response: RemotingCommand) -> None:
        self.answers.append((request, response))


@pytest.fixture
async def ctx(nursery: trio.Nursery, tmp_path) -> AsyncIterator[BrokerContext]:
    store_config = MessageStoreConfig(
        store_path_root_dir=str(tmp_path / "store"),
        mapped_file_size_commit_log=64 * 1024,
        mapped_file_size_consume_queue=20 * 100,
        max_hash_slot_num=64,
        max_index_num=256,
    )
    broker_config = BrokerConfig(broker_name="broker-a", broker_ip1="127.0.0.1")
    store = DefaultMessageStore(store_config)
    store.store_host = ("127.0.0.1", 10911)
    context = make_broker_context(store, broker_config)
    await nursery.start(store.run)
    await context.topic_config_manager.update(TopicConfig(TOPIC, 4, 4))
    yield context


def send_request(
    topic: str = TOPIC,
    queue_id: int = 0,
    body: bytes = b"hello",
    *,
    tags: str = "TagA",
    default_topic: str = "TBW102",
    reconsume_times: int | None = None,
) -> RemotingCommand:
    header = H.SendMessageRequestHeader(
        producer_group="pg",
        topic=topic,
        default_topic=default_topic,
        default_topic_queue_nums=4,
        queue_id=queue_id,
        sys_flag=0,
        born_timestamp=1_700_000_000_000,
        flag=0,
        properties=encode_properties({"TAGS": tags, "WAIT": "true"}),
        reconsume_times=reconsume_times,
    )
    return RemotingCommand.request(RequestCode.SEND_MESSAGE, H.encode(header), body)


def pull_request(
    offset: int,
    *,
    queue_id: int = 0,
    sys_flag: int = FLAG_SUBSCRIPTION,
    subscription: str = "*",
    commit_offset: int = -1,
    suspend_ms: int = 0,
) -> RemotingCommand:
    header = H.PullMessageRequestHeader(
        consumer_group=GROUP,
        topic=TOPIC,
        queue_id=queue_id,
        queue_offset=offset,
        max_msg_nums=32,
        sys_flag=sys_flag,
        commit_offset=commit_offset,
        suspend_timeout_millis=suspend_ms,
        subscription=subscription,
        sub_version=0,
        expression_type=None,
    )
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, H.encode(header))


def request(code: int, header: Any) -> RemotingCommand:
    return RemotingCommand.request(code, H.encode(header))


async def dispatched(store: DefaultMessageStore, topic: str, queue_id: int, count: int) -> None:
    """Wait until reput has put ``count`` messages into the queue's consume queue."""
    with trio.fail_after(5):
        while store.get_max_offset_in_queue(topic, queue_id) < count:
            await trio.sleep(0.005)


async def put(ctx: BrokerContext, *bodies: bytes, tags: str = "TagA") -> None:
    send = SendProcessor(ctx)
    for body in bodies:
        response = await send.send_message(FakeChannel(), send_request(body=body, tags=tags))
        assert response.code == ResponseCode.SUCCESS, response.remark
    await dispatched(ctx.store, TOPIC, 0, len(bodies))


# -- send -----------------------------------------------------------------------------------


async def test_send_inline_and_in_task_answer_offsets(ctx: BrokerContext) -> None:
    send = SendProcessor(ctx)
    channel = FakeChannel()
    first = answer_command(send._serve_decoded(channel, send_request(body=b"one")))
    assert first is not None and first.code == ResponseCode.SUCCESS
    assert first.ext_fields["queueId"] == "0" and first.ext_fields["queueOffset"] == "0"
    second = await send.send_message(channel, send_request(queue_id=0, body=b"two"))
    assert second.code == ResponseCode.SUCCESS and second.ext_fields["queueOffset"] == "1"
    assert first.ext_fields["msgId"] != second.ext_fields["msgId"]
    assert ctx.stats.put_msgs == 2
    await dispatched(ctx.store, TOPIC, 0, 2)
    stored = ctx.store.look_message_by_offset(0)
    assert stored is not None and stored.body == b"one" and stored.tags == "TagA"
    assert stored.store_host == ("127.0.0.1", 10911)
    assert stored.properties["CLUSTER"] == "DefaultCluster" and "WAIT" not in stored.properties


async def test_a_batch_to_a_known_topic_is_served_inline_as_the_task_serves_it(
    ctx: BrokerContext,
) -> None:
    """SEND_BATCH_MESSAGE (and a SEND_MESSAGE with batch set) of a topic that exists is answered
    in the reader like a single send, with the offsets the task path gives; a bad batch is
    refused there the same way; an unknown topic still goes to the task (auto-create)."""
    from pymq.common.batch import BatchItem, encode_batch_body

    send = SendProcessor(ctx)
    body = encode_batch_body([BatchItem(b"b%d" % i, properties={"TAGS": "T"}) for i in range(3)])

    def batch(topic: str = TOPIC, payload: bytes = body) -> RemotingCommand:
        ext = H.SendMessageRequestHeader.v2_ext("pg", topic, 0, 0, 1_700_000_000_000, 0, "", True)
        return RemotingCommand.request(RequestCode.SEND_BATCH_MESSAGE, ext, payload)

    inline = answer_command(send._serve_decoded(FakeChannel(), batch()))
    assert inline is not None and inline.code == ResponseCode.SUCCESS
    assert inline.ext_fields["queueOffset"] == "0"
    in_task = await send.send_message(FakeChannel(), batch())
    assert in_task.code == ResponseCode.SUCCESS and in_task.ext_fields["queueOffset"] == "3"
    assert inline.ext_fields.keys() == in_task.ext_fields.keys()
    await dispatched(ctx.store, TOPIC, 0, 6)
    refused = send._serve_decoded(FakeChannel(), batch(payload=b"\x00\x01"))
    assert refused is not None and refused.code == ResponseCode.MESSAGE_ILLEGAL
    assert "bad batch body" in (refused.remark or "")
    assert send._serve_decoded(FakeChannel(), batch(topic="NoSuchTopic")) is None


async def test_send_to_unknown_topic_without_default_is_topic_not_exist(
    ctx: BrokerContext,
) -> None:
    send = SendProcessor(ctx)
    req = send_request(topic="Nowhere", default_topic="NoSuchDefault")
    assert send._serve_decoded(FakeChannel(), req) is None  # handed to the task path
    response = await send.send_message(FakeChannel(), req)
    assert response.code == ResponseCode.TOPIC_NOT_EXIST
    assert "topic[Nowhere] not exist" in response.remark
    assert ctx.topic_config_manager.select("Nowhere") is None


async def test_send_to_unknown_topic_is_auto_created_from_tbw102(ctx: BrokerContext) -> None:
    response = await SendProcessor(ctx).send_message(FakeChannel(), send_request(topic="Fresh"))
    assert response.code == ResponseCode.SUCCESS
    assert ctx.topic_config_manager.select("Fresh") is not None


async def test_send_to_a_queue_the_topic_lacks_is_refused(ctx: BrokerContext) -> None:
    send = SendProcessor(ctx)
    for answer in (
        send._serve_decoded(FakeChannel(), send_request(queue_id=9)),
        await send.send_message(FakeChannel(), send_request(queue_id=9)),
    ):
        assert answer is not None and answer.code == ResponseCode.SYSTEM_ERROR
        assert answer.remark == (
            f"request queueId[9] is illegal, topic {TOPIC} has 4 queues, producer: {CLIENT}"
        )


async def test_retry_send_past_max_reconsume_times_goes_to_dlq(ctx: BrokerContext) -> None:
    send = SendProcessor(ctx)
    req = send_request(topic=retry_topic(GROUP), reconsume_times=16)
    assert send._serve_decoded(FakeChannel(), req) is None  # retry topics take the task
    response = await send.send_message(FakeChannel(), req)
    assert response.code == ResponseCode.SUCCESS
    assert response.ext_fields["queueId"] == "0"
    dlq = dlq_topic(GROUP)
    assert ctx.topic_config_manager.select(dlq) is not None
    await dispatched(ctx.store, dlq, 0, 1)
    assert ctx.store.get_max_offset_in_queue(retry_topic(GROUP), 0) == 0

    below = await send.send_message(FakeChannel(), send_request(topic=retry_topic(GROUP)))
    assert below.code == ResponseCode.SUCCESS
    await dispatched(ctx.store, retry_topic(GROUP), 0, 1)


# Java 4.9.4's SendMessageProcessor remark for SERVICE_NOT_AVAILABLE, its diskUtil() filled in.
JAVA_NOT_AVAILABLE = re.compile(
    r"service not available now\. It may be caused by one of the following reasons: "
    r"the broker's disk is full \[CL: [ -]\d\.\d\d CQ: [ -]\d\.\d\d INDEX: [ -]\d\.\d\d\], "
    r"messages are put to the slave, message store has been shut down, etc\."
)


async def test_a_store_that_takes_no_writes_answers_as_java_does(ctx: BrokerContext) -> None:
    """A slave (or DLedger follower): sends are SERVICE_NOT_AVAILABLE with Java's remark,
    inline and in a task alike; a send-back is SYSTEM_ERROR with the status's name."""
    await put(ctx, b"first")
    offset = ctx.store.get_commitlog_offset_in_queue(TOPIC, 0, 0)
    send = SendProcessor(ctx)
    ctx.store.read_only = True
    answers = [
        send._serve_decoded(FakeChannel(), send_request()),
        await send.send_message(FakeChannel(), send_request()),
    ]
    for answer in answers:
        assert answer is not None and answer.code == ResponseCode.SERVICE_NOT_AVAILABLE
        assert answer.remark is not None and JAVA_NOT_AVAILABLE.fullmatch(answer.remark), answer
    back = H.ConsumerSendMsgBackRequestHeader(offset=offset, group=GROUP, delay_level=0)
    refused = await send.consumer_send_msg_back(
        FakeChannel(), request(RequestCode.CONSUMER_SEND_MSG_BACK, back)
    )
    assert (refused.code, refused.remark) == (ResponseCode.SYSTEM_ERROR, "SERVICE_NOT_AVAILABLE")


# -- pull -----------------------------------------------------------------------------------


async def test_pull_finds_messages(ctx: BrokerContext) -> None:
    await put(ctx, b"a", b"b", b"c")
    response = await PullProcessor(ctx).pull_message(FakeChannel(), pull_request(0))
    assert response.code == ResponseCode.SUCCESS
    assert response.ext_fields["nextBeginOffset"] == "3"
    assert response.ext_fields["minOffset"] == "0" and response.ext_fields["maxOffset"] == "3"
    assert response.ext_fields["suggestWhichBrokerId"] == "0"
    assert [m.body for m in decode_records(response.body)] == [b"a", b"b", b"c"]
    assert ctx.stats.get_msgs == 3
    # protectBroker's figure: the commit-log bytes past the last entry the pull read
    last = ctx.store.get_commitlog_offset_in_queue(TOPIC, 0, 2)
    assert ctx.fall_behind.table[(0, TOPIC, GROUP)] == ctx.store.max_phy_offset - last


async def test_pull_filters_by_tag(ctx: BrokerContext) -> None:
    await put(ctx, b"a", tags="TagA")
    await put(ctx, b"b", tags="TagB")
    response = await PullProcessor(ctx).pull_message(
        FakeChannel(), pull_request(0, subscription="TagB")
    )
    assert response.code == ResponseCode.SUCCESS
    assert [m.body for m in decode_records(response.body)] == [b"b"]


async def test_pull_at_the_end_is_not_found(ctx: BrokerContext) -> None:
    await put(ctx, b"a")
    response = await PullProcessor(ctx).pull_message(FakeChannel(), pull_request(1))
    assert response.code == ResponseCode.PULL_NOT_FOUND
    assert response.remark == "no new message in this queue"
    assert response.ext_fields["nextBeginOffset"] == "1"
    assert response.body == b""


async def test_pull_past_the_end_is_offset_moved(ctx: BrokerContext) -> None:
    await put(ctx, b"a", b"b")
    response = await PullProcessor(ctx).pull_message(FakeChannel(), pull_request(100))
    assert response.code == ResponseCode.PULL_OFFSET_MOVED
    assert response.remark == "the offset 100 is out of range [0, 2]"
    # OFFSET_OVERFLOW_BADLY on a queue whose min offset is 0: start again from 0, as Java does.
    assert response.ext_fields["nextBeginOffset"] == "0"


async def test_pull_without_a_registered_subscription_is_refused(ctx: BrokerContext) -> None:
    pull = PullProcessor(ctx)
    response = await pull.pull_message(FakeChannel(), pull_request(0, sys_flag=0))
    assert response.code == ResponseCode.SUBSCRIPTION_NOT_EXIST
    assert response.remark == "the consumer's group info not exist"

    await heartbeat(ctx, topic="OtherTopic")
    response = await pull.pull_message(FakeChannel(), pull_request(0, sys_flag=0))
    assert response.code == ResponseCode.SUBSCRIPTION_NOT_EXIST
    assert response.remark == "the consumer's subscription not exist"


async def test_pull_refuses_unknown_topic_and_bad_queue(ctx: BrokerContext) -> None:
    pull = PullProcessor(ctx)
    response = await pull.pull_message(FakeChannel(), pull_request(0, queue_id=4))
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert response.remark.startswith("queueId[4] is illegal, topic:[TopicTest]")
    await ctx.topic_config_manager.delete(TOPIC)
    response = await pull.pull_message(FakeChannel(), pull_request(0))
    assert response.code == ResponseCode.TOPIC_NOT_EXIST


async def test_pull_with_the_commit_flag_commits_the_offset(ctx: BrokerContext) -> None:
    await put(ctx, b"a", b"b")
    flags = FLAG_SUBSCRIPTION | FLAG_COMMIT_OFFSET
    response = await PullProcessor(ctx).pull_message(
        FakeChannel(), pull_request(2, sys_flag=flags, commit_offset=2)
    )
    assert response.code == ResponseCode.PULL_NOT_FOUND
    assert ctx.consumer_offset_manager.query_offset(GROUP, TOPIC, 0) == 2


async def test_suspended_pull_is_woken_by_a_put(ctx: BrokerContext) -> None:
    await put(ctx, b"old")
    pull = PullProcessor(ctx)
    answers: list[RemotingCommand] = []

    async def held_pull() -> None:
        req = pull_request(1, sys_flag=FLAG_SUBSCRIPTION | FLAG_SUSPEND, suspend_ms=30_000)
        answers.append(await pull.pull_message(FakeChannel(), req))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(held_pull)
            await trio.sleep(0.1)
            assert answers == []  # held: nothing new in the queue
            started = trio.current_time()
            await SendProcessor(ctx).send_message(FakeChannel(), send_request(body=b"new"))
    assert trio.current_time() - started < 5
    [response] = answers
    assert response.code == ResponseCode.SUCCESS
    assert [m.body for m in decode_records(response.body)] == [b"new"]
    assert response.ext_fields["nextBeginOffset"] == "2"


async def test_suspended_pull_answers_not_found_at_its_timeout(ctx: BrokerContext) -> None:
    await put(ctx, b"a")
    req = pull_request(1, sys_flag=FLAG_SUBSCRIPTION | FLAG_SUSPEND, suspend_ms=50)
    with trio.fail_after(5):
        response = await PullProcessor(ctx).pull_message(FakeChannel(), req)
    assert response.code == ResponseCode.PULL_NOT_FOUND


# -- consumer -------------------------------------------------------------------------------


async def heartbeat(
    ctx: BrokerContext, *, topic: str = TOPIC, client_id: str = "client-1"
) -> RemotingCommand:
    data = HeartbeatData(
        client_id=client_id,
        producer_data_set=[ProducerData("pg")],
        consumer_data_set=[
            ConsumerData(
                group_name=GROUP,
                message_model=MessageModel.CLUSTERING,
                subscription_data_set=[SubscriptionData.build(topic, "TagA")],
            )
        ],
    )
    req = RemotingCommand.request(RequestCode.HEART_BEAT, body=to_json(data))
    return await ConsumerProcessor(ctx).heart_beat(FakeChannel(), req)


async def test_heartbeat_registers_the_consumer_and_its_retry_topic(ctx: BrokerContext) -> None:
    response = await heartbeat(ctx)
    assert response.code == ResponseCode.SUCCESS
    info = ctx.consumer_manager.get(GROUP)
    assert info is not None and info.client_ids() == ["client-1"]
    subscription = info.find_subscription(TOPIC)
    assert subscription is not None and subscription.tags_set == ["TagA"]
    assert ctx.topic_config_manager.select(retry_topic(GROUP)) is not None
    assert "pg" in ctx.producer_manager.groups

    consumer = ConsumerProcessor(ctx)
    listed = await consumer.get_consumer_list_by_group(
        FakeChannel(), request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, H.ConsumerGroupHeader(GROUP))
    )
    assert listed.code == ResponseCode.SUCCESS
    assert from_json(listed.body, ConsumerList).consumer_id_list == ["client-1"]

    # A pull without its own subscription now filters by the registered one.
    await put(ctx, b"a", tags="TagA")
    await put(ctx, b"b", tags="TagB")
    pulled = await PullProcessor(ctx).pull_message(FakeChannel(), pull_request(0, sys_flag=0))
    assert pulled.code == ResponseCode.SUCCESS
    assert [m.body for m in decode_records(pulled.body)] == [b"a"]


async def test_bad_heartbeat_body_is_refused(ctx: BrokerContext) -> None:
    req = RemotingCommand.request(RequestCode.HEART_BEAT, body=b"{ torn")
    response = await ConsumerProcessor(ctx).heart_beat(FakeChannel(), req)
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert response.remark.startswith("bad heartbeat body")


async def test_consumer_offsets_query_and_update(ctx: BrokerContext) -> None:
    consumer = ConsumerProcessor(ctx)
    query = request(
        RequestCode.QUERY_CONSUMER_OFFSET, H.QueryConsumerOffsetRequestHeader(GROUP, TOPIC, 1)
    )
    # Nothing committed, and the queue starts at 0: consume from 0.
    response = await consumer.query_consumer_offset(FakeChannel(), query)
    assert response.code == ResponseCode.SUCCESS and response.ext_fields["offset"] == "0"

    def update(offset: int) -> RemotingCommand:
        return request(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            H.UpdateConsumerOffsetRequestHeader(GROUP, TOPIC, 1, offset),
        )

    response = await consumer.update_consumer_offset(FakeChannel(), update(5))
    assert response.code == ResponseCode.SUCCESS
    response = await consumer.query_consumer_offset(FakeChannel(), query)
    assert response.ext_fields["offset"] == "5"
    # -1 is the client's "unknown": it never overwrites a committed offset.
    await consumer.update_consumer_offset(FakeChannel(), update(-1))
    assert ctx.consumer_offset_manager.query_offset(GROUP, TOPIC, 1) == 5


@pytest.mark.parametrize("trace_on", [False, True])
async def test_the_pre_encoded_send_answer_is_the_frame_the_command_made(
    ctx: BrokerContext, monkeypatch: pytest.MonkeyPatch, trace_on: bool
) -> None:
    """A successful inline send of a JSON request is answered with a ready frame: byte for byte
    what Channel.answer wrote from _answer's command (a single send and a batch's msgId list, a
    region that is no ASCII, TRACE_ON either way), counted once in the stats; a request of the
    ROCKETMQ (binary) serialize type still gets a command, so a binary answer."""
    from pymq.common.batch import BatchItem, encode_batch_body
    from pymq.remoting.codec import RPC_TYPE_RESPONSE, encode
    from pymq.remoting.codes import SerializeType

    ctx.broker_config.region_id = "Région-\u2603"
    ctx.broker_config.trace_on = trace_on
    send = SendProcessor(ctx)
    results: list[Any] = []
    store = ctx.store
    for name in ("_put_message", "_put_messages"):  # put_now of messages
        real = getattr(store, name)

        def recording(msgs: Any, real: Any = real) -> Any:
            results.append(real(msgs))
            return results[-1]

        monkeypatch.setattr(store, name, recording)
    real_fast = store._put_batch_body  # put_now of a BatchBody

    def recording_fast(*args: Any) -> Any:  # the batch's fast path: (result, wait) or None
        out = real_fast(*args)
        if out is not None:
            results.append(out[0])
        return out

    monkeypatch.setattr(store, "_put_batch_body", recording_fast)

    def expected(req: RemotingCommand, queue_id: int) -> bytes:
        cmd = send._answer(req, results[-1], queue_id)  # as Channel.answer finished it
        cmd.opaque, cmd.flag = req.opaque, cmd.flag | RPC_TYPE_RESPONSE
        cmd.serialize_type = req.serialize_type
        return encode(cmd)

    body = encode_batch_body([BatchItem(b"b%d" % i) for i in range(3)])
    ext = H.SendMessageRequestHeader.v2_ext("pg", TOPIC, 1, 0, 1_700_000_000_000, 0, "", True)
    requests = [
        (send_request(queue_id=0), 0, 1),
        (RemotingCommand.request(RequestCode.SEND_BATCH_MESSAGE, ext, body), 1, 3),
    ]
    for req, queue_id, count in requests:
        before = ctx.stats.put_msgs
        frame = send._serve_decoded(FakeChannel(), req)
        assert type(frame) is bytes
        assert ctx.stats.put_msgs == before + count  # once
        assert frame == expected(req, queue_id)
    assert "," in results[-1].msg_id  # the batch's list of ids

    binary = send_request(queue_id=2)
    binary.serialize_type = SerializeType.ROCKETMQ
    answer = send._serve_decoded(FakeChannel(), binary)
    assert isinstance(answer, RemotingCommand) and answer.code == ResponseCode.SUCCESS
    assert answer.ext_fields["MSG_REGION"] == "Région-\u2603"


async def test_a_batch_item_whose_properties_are_no_utf8_is_stored_as_java_stores_it(
    ctx: BrokerContext,
) -> None:
    """Java's broker reads a batch item's properties with new String(bytes, UTF_8): bad bytes
    become U+FFFD and the batch is stored.  (It was a SYSTEM_ERROR with a traceback logged for
    every such frame.)"""
    import struct

    send = SendProcessor(ctx)
    props = b"TAGS\x01T\xff"
    body = struct.pack(">iiiii", 20 + 2 + 2 + len(props), 0, 0, 0, 2) + b"hi"
    body += struct.pack(">h", len(props)) + props
    ext = H.SendMessageRequestHeader.v2_ext("pg", TOPIC, 0, 0, 1_700_000_000_000, 0, "", True)
    req = RemotingCommand.request(RequestCode.SEND_BATCH_MESSAGE, ext, body)
    answer = answer_command(send._serve_decoded(FakeChannel(), req))
    assert answer is not None and answer.code == ResponseCode.SUCCESS, answer.remark
    await dispatched(ctx.store, TOPIC, 0, 1)
    stored = ctx.store.look_message_by_offset(0)
    assert stored is not None and stored.body == b"hi" and stored.tags == "T\ufffd"
