"""Transactional messages over a real store, without sockets (issue #13).

Half messages through the send processor, END_TRANSACTION's commit / rollback / unknown and its
refusals, and the check-back service's rounds driven by hand with a fake clock and a fake
producer connection.  What each step writes is compared with what the real 4.9.4 broker wrote in
the captured run (``java-wire-samples.md`` section 5).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator

import attrs
import pytest
import trio

from pymq.broker import transaction as transaction_module
from pymq.broker.client_manager import (
    ClientChannelInfo,
)
from pymq.broker.config import BrokerConfig
from pymq.broker.consumer_offset_manager import ConsumerOffsetManager
from pymq.broker.context import BrokerContext
from pymq.broker.processors.send import SendProcessor
from pymq.broker.transaction import TransactionService, half_properties
from pymq.common.clock import now_ms
from pymq.common.message_ext import (
    MessageExt,
    decode_properties,
    encode_properties,
    java_hashmap_order,
    properties_bytes,
)
from pymq.common.record import decode_record
from pymq.common.topic import (
    CID_RMQ_SYS_TRANS,
    RMQ_SYS_TRANS_HALF_TOPIC,
    RMQ_SYS_TRANS_OP_HALF_TOPIC,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TopicConfig,
)
from pymq.remoting import headers as H
from pymq.remoting.channel import ANSWER_LATER
from pymq.remoting.codec import RemotingCommand, encode
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.store import DefaultMessageStore, MessageStoreConfig
from pymq.store.commitlog import encode_record
from pymq.store.config import BrokerRole
from tests.helpers import answer_command
from tests.unit.contexts import make_broker_context

SAMPLES = "/work/shared/reference/java-wire-samples"
TOPIC = "TopicTx"
GROUP = "PG_TX"
HALF, OP = RMQ_SYS_TRANS_HALF_TOPIC, RMQ_SYS_TRANS_OP_HALF_TOPIC


@attrs.define(eq=False)
class FakeProducer:
    """A producer's connection as the check service sees it: requests it was sent."""

    remote_address: str = "10.0.0.7:50000"
    closed: bool = False
    sent: list[RemotingCommand] = attrs.Factory(list)

    async def invoke_oneway(self, request: RemotingCommand) -> None:
        self.sent.append(request)

    def answer(self, request: RemotingCommand, response: RemotingCommand) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = now_ms()

    def __call__(self) -> int:
        return self.now


@pytest.fixture
async def ctx(nursery: trio.Nursery, tmp_path) -> AsyncIterator[BrokerContext]:
    store_config = MessageStoreConfig(
        store_path_root_dir=str(tmp_path / "store"),
        mapped_file_size_commit_log=256 * 1024,
        mapped_file_size_consume_queue=20 * 100,
        max_hash_slot_num=64,
        max_index_num=256,
    )
    broker_config = BrokerConfig(
        broker_name="broker-a",
        broker_ip1="127.0.0.1",
        broker_cluster_name="CapCluster",
        transaction_time_out=3000,
        transaction_check_max=3,
    )
    store = DefaultMessageStore(store_config)
    store.store_host = ("127.0.0.1", 49911)
    context = make_broker_context(store, broker_config)
    await nursery.start(store.run)
    await context.topic_config_manager.update(TopicConfig(TOPIC, 4, 4))
    yield context


def sample_header(name: str) -> dict[str, str]:
    with open(os.path.join(SAMPLES, name)) as f:
        ext: dict[str, str] = json.load(f)["extFields"]
    return ext


def half_request(
    queue_id: int = 1,
    key: str = "TXKEY-COMMIT",
    uniq: str = "U1",
    born: int | None = None,
    extra: dict[str, str] | None = None,
) -> RemotingCommand:
    """A Java producer's half send, as captured (V2 header, sysFlag 4), born now."""
    ext = sample_header("TX-SEND_MESSAGE_V2-310-half-COMMIT.request-header.json")
    props = decode_properties(ext["i"])
    props["KEYS"], props["UNIQ_KEY"] = key, uniq
    props.update(extra or {})
    born = now_ms() if born is None else born
    ext = {**ext, "e": str(queue_id), "g": str(born), "i": encode_properties(props)}
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, ext, b"tx COMMIT")


def end_request(
    send_answer: RemotingCommand,
    kind: int,
    *,
    group: str = GROUP,
    from_check: bool = False,
    uniq: str = "U1",
) -> RemotingCommand:
    offset = int(send_answer.ext_fields["msgId"][-16:], 16)
    header = H.EndTransactionRequestHeader(
        producer_group=group,
        tran_state_table_offset=int(send_answer.ext_fields["queueOffset"]),
        commit_log_offset=offset,
        commit_or_rollback=kind,
        msg_id=uniq,
        from_transaction_check=from_check,
        transaction_id=uniq if from_check else None,
    )
    return RemotingCommand.request(RequestCode.END_TRANSACTION, H.encode(header), oneway=True)


async def dispatched(store: DefaultMessageStore, topic: str, count: int, queue_id: int = 0) -> None:
    with trio.fail_after(5):
        while store.get_max_offset_in_queue(topic, queue_id) < count:
            await trio.sleep(0.005)


async def send_half(ctx: BrokerContext, **kwargs: object) -> RemotingCommand:
    answer = await SendProcessor(ctx).send_message(FakeProducer(), half_request(**kwargs))  # type: ignore[arg-type]
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    await dispatched(ctx.store, HALF, int(answer.ext_fields["queueOffset"]) + 1)
    return answer


def stored(ctx: BrokerContext, topic: str, offset: int, queue_id: int = 0) -> MessageExt:
    msg = ctx.store.message_at(topic, queue_id, offset)
    assert msg is not None, f"nothing at {topic}/{queue_id}/{offset}"
    return msg


# -- properties order ---------------------------------------------------------------------------


def test_java_hashmap_order_matches_the_captured_records() -> None:
    sent = decode_properties(
        sample_header("TX-SEND_MESSAGE_V2-310-half-COMMIT.request-header.json")["i"]
    )
    wait = sent.pop("WAIT")
    half = half_properties({**sent, "CLUSTER": "CapCluster", "WAIT": wait}, "TopicTx", 1)
    assert list(half) == [
        "REAL_TOPIC", "KEYS", "TRAN_MSG", "UNIQ_KEY", "CLUSTER", "PGROUP", "WAIT", "TAGS",
        "REAL_QID",
    ]  # fmt: skip
    assert half["WAIT"] == "true" and half["REAL_QID"] == "1" and half["CLUSTER"] == "CapCluster"
    # The check body of the capture: TRANSACTION_CHECK_TIMES lands second.
    with open(
        os.path.join(SAMPLES, "TX-CHECK_TRANSACTION_STATE-39-check1.request-body.hex.txt")
    ) as f:
        body = decode_record(bytes.fromhex(f.read().strip()))
    again = java_hashmap_order({**half, "TRANSACTION_CHECK_TIMES": "1", "WAIT": "false"})
    assert list(again) == list(body.properties)
    assert list(java_hashmap_order({"TAGS": "d", "WAIT": "true"})) == ["WAIT", "TAGS"]


# -- half messages --------------------------------------------------------------------------


async def test_half_message_is_stored_hidden_in_the_half_topic(ctx: BrokerContext) -> None:
    answer = await send_half(ctx, queue_id=1)
    # The answer names the real queue, the half record's id and its half-queue offset.
    assert answer.ext_fields["queueId"] == "1" and answer.ext_fields["queueOffset"] == "0"
    half = stored(ctx, HALF, 0)
    assert answer.ext_fields["msgId"] == half.msg_id
    assert half.sys_flag == 0 and half.queue_id == 0 and half.body == b"tx COMMIT"
    assert half.properties["REAL_TOPIC"] == TOPIC and half.properties["REAL_QID"] == "1"
    assert half.properties["PGROUP"] == GROUP and half.properties["TRAN_MSG"] == "true"
    keys = list(half.properties)
    assert keys[0] == "REAL_TOPIC" and keys[-1] == "REAL_QID"
    assert all(ctx.store.get_max_offset_in_queue(TOPIC, q) == 0 for q in range(4))


async def test_inline_send_path_stores_half_messages_too(ctx: BrokerContext) -> None:
    send = SendProcessor(ctx)
    answer = answer_command(send._serve_decoded(FakeProducer(), half_request(queue_id=2)))  # type: ignore[arg-type]
    assert answer is not None and answer.code == ResponseCode.SUCCESS
    assert answer.ext_fields["queueId"] == "2"
    await dispatched(ctx.store, HALF, 1)
    assert stored(ctx, HALF, 0).properties["REAL_QID"] == "2"
    assert ctx.store.get_max_offset_in_queue(TOPIC, 2) == 0


async def test_reject_transaction_message_refuses_and_writes_nothing(ctx: BrokerContext) -> None:
    ctx.broker_config.reject_transaction_message = True
    answer = await SendProcessor(ctx).send_message(FakeProducer(), half_request())  # type: ignore[arg-type]
    assert answer.code == ResponseCode.NO_PERMISSION
    assert answer.remark == "the broker[127.0.0.1] sending transaction message is forbidden"
    assert ctx.store.max_phy_offset == 0


# -- END_TRANSACTION ----------------------------------------------------------------------------


async def test_commit_stores_the_real_message_and_an_op(ctx: BrokerContext) -> None:
    service = TransactionService(ctx)
    answer = await send_half(ctx, queue_id=1)
    half = stored(ctx, HALF, 0)
    response = await service.end_transaction(FakeProducer(), end_request(answer, 8))
    assert response is not None and response.code == ResponseCode.SUCCESS
    await dispatched(ctx.store, TOPIC, 1, queue_id=1)
    real = stored(ctx, TOPIC, 0, queue_id=1)
    assert real.sys_flag == 8 and real.prepared_transaction_offset == half.commitlog_offset
    assert real.properties == half.properties and list(real.properties) == list(half.properties)
    assert real.body == half.body and real.born_timestamp == half.born_timestamp
    await dispatched(ctx.store, OP, 1)
    op = stored(ctx, OP, 0)
    assert op.body == b"0" and list(op.properties.items()) == [("WAIT", "true"), ("TAGS", "d")]
    assert op.sys_flag == 0 and service.stats.committed == 1


async def test_rollback_writes_only_an_op_and_unknow_nothing(ctx: BrokerContext) -> None:
    service = TransactionService(ctx)
    rolled = await send_half(ctx, queue_id=0, uniq="R")
    pending = await send_half(ctx, queue_id=0, uniq="P")
    assert await service.end_transaction(FakeProducer(), end_request(rolled, 12, uniq="R"))
    end = ctx.store.max_phy_offset
    assert await service.end_transaction(FakeProducer(), end_request(pending, 0, uniq="P")) is None
    await dispatched(ctx.store, OP, 1)
    assert stored(ctx, OP, 0).body == b"0"
    assert ctx.store.max_phy_offset == end  # UNKNOW wrote nothing
    assert all(ctx.store.get_max_offset_in_queue(TOPIC, q) == 0 for q in range(4))
    assert service.stats.rolled_back == 1 and service.stats.unknown == 1


@pytest.mark.parametrize(
    ("change", "remark"),
    [
        ({"producerGroup": "OTHER"}, "The producer group wrong"),
        ({"tranStateTableOffset": "7"}, "The transaction state table offset wrong"),
        ({"commitLogOffset": "999999"}, "Find prepared transaction message failed"),
    ],
)
async def test_end_transaction_checks_the_half_message(
    ctx: BrokerContext, change: dict[str, str], remark: str
) -> None:
    service = TransactionService(ctx)
    answer = await send_half(ctx)
    request = end_request(answer, 8)
    request.ext_fields.update(change)
    end = ctx.store.max_phy_offset
    response = await service.end_transaction(FakeProducer(), request)
    assert response is not None and response.code == ResponseCode.SYSTEM_ERROR
    assert response.remark == remark
    assert ctx.store.max_phy_offset == end  # refused: nothing written


async def test_commit_of_a_record_that_is_not_a_half_message_is_refused(
    ctx: BrokerContext,
) -> None:
    service = TransactionService(ctx)
    answer = await send_half(ctx)
    await service.end_transaction(FakeProducer(), end_request(answer, 8))
    await dispatched(ctx.store, TOPIC, 1, queue_id=1)
    real = stored(ctx, TOPIC, 0, queue_id=1)
    request = end_request(answer, 8)
    request.ext_fields["commitLogOffset"] = str(real.commitlog_offset)
    response = await service.end_transaction(FakeProducer(), request)
    assert response is not None and response.remark == "Find prepared transaction message failed"


def test_end_transaction_header_is_validated_as_java_does() -> None:
    ext = sample_header("TX-END_TRANSACTION-37-COMMIT.request-header.json")
    assert H.decode(H.EndTransactionRequestHeader, ext).commit_or_rollback == 8
    with pytest.raises(H.HeaderError, match="commitOrRollback field wrong"):
        H.decode(H.EndTransactionRequestHeader, {**ext, "commitOrRollback": "4"})
    with pytest.raises(H.HeaderError, match="<msgId> is null"):
        H.decode(H.EndTransactionRequestHeader, {k: v for k, v in ext.items() if k != "msgId"})


async def test_a_second_commit_of_one_transaction_writes_no_second_message(
    ctx: BrokerContext,
) -> None:
    service = TransactionService(ctx)
    answer = await send_half(ctx)
    for _ in range(2):
        await service.end_transaction(FakeProducer(), end_request(answer, 8))
    await dispatched(ctx.store, OP, 2)
    assert ctx.store.get_max_offset_in_queue(TOPIC, 1) == 1
    assert service.stats.duplicate_ends == 1


async def test_end_transaction_on_a_slave_is_slave_not_available(
    ctx: BrokerContext,
) -> None:
    answer = await send_half(ctx)
    ctx.store.config.broker_role = BrokerRole.SLAVE
    response = await TransactionService(ctx).end_transaction(FakeProducer(), end_request(answer, 8))
    assert response is not None and response.code == ResponseCode.SLAVE_NOT_AVAILABLE
    assert response.remark is None


# -- the check-back service ---------------------------------------------------------------------


def register(ctx: BrokerContext, producer: FakeProducer, group: str = GROUP) -> None:
    ctx.producer_manager.register(
        group, ClientChannelInfo(producer, f"client-{id(producer)}", "JAVA", 401, 0.0)
    )


def checks(producer: FakeProducer) -> list[tuple[H.CheckTransactionStateRequestHeader, MessageExt]]:
    return [
        (H.decode(H.CheckTransactionStateRequestHeader, r.ext_fields), decode_record(r.body))
        for r in producer.sent
    ]


async def test_check_round_asks_a_producer_about_an_old_pending_half(ctx: BrokerContext) -> None:
    clock = Clock()
    service = TransactionService(ctx, clock_ms=clock)
    producer = FakeProducer()
    register(ctx, producer)
    await send_half(ctx, queue_id=3, uniq="U3")
    old = stored(ctx, HALF, 0)
    clock.now = old.store_timestamp + 1  # the round starts after the half was stored ...
    await service.check()
    assert producer.sent == []  # ... but it is younger than transactionTimeOut: later
    clock.now = max(old.born_timestamp + 3_001, old.store_timestamp + 1)
    await service.check()
    [(header, body)] = checks(producer)
    assert producer.sent[0].flag & 2  # oneway
    await dispatched(ctx.store, HALF, 2)
    renewed = stored(ctx, HALF, 1)
    assert renewed.properties["TRANSACTION_CHECK_TIMES"] == "1"
    assert list(renewed.properties)[1] == "TRANSACTION_CHECK_TIMES"
    assert header.commit_log_offset == renewed.commitlog_offset
    assert header.tran_state_table_offset == 1 and header.offset_msg_id == renewed.msg_id
    assert header.msg_id == header.transaction_id == "U3"
    # The body: real topic and queue, the new record's offsets, the old store time, WAIT=false.
    assert (body.topic, body.queue_id, body.queue_offset) == (TOPIC, 3, 1)
    assert body.commitlog_offset == renewed.commitlog_offset
    assert body.store_timestamp == old.store_timestamp
    assert body.born_timestamp == old.born_timestamp
    assert body.properties["WAIT"] == "false" and renewed.properties["WAIT"] == "true"
    assert list(body.properties) == list(renewed.properties)
    offsets = ctx.consumer_offset_manager
    assert offsets.query_offset(CID_RMQ_SYS_TRANS, HALF, 0) == 1


async def test_unknown_forever_moves_to_trans_check_max_time_topic(ctx: BrokerContext) -> None:
    clock = Clock()
    service = TransactionService(ctx, clock_ms=clock)
    producer = FakeProducer()
    register(ctx, producer)
    await send_half(ctx, uniq="U4")
    for round_ in range(1, 5):
        clock.now = max(clock.now, ctx.store.clock_ms()) + 10_000
        await service.check()
        await dispatched(ctx.store, HALF, min(round_, 3) + 1)
    # Three checks (TRANSACTION_CHECK_TIMES 1, 2, 3), then the message is given up.
    assert [b.properties["TRANSACTION_CHECK_TIMES"] for _, b in checks(producer)] == ["1", "2", "3"]
    await dispatched(ctx.store, TRANS_CHECK_MAX_TIME_TOPIC, 1)
    discarded = stored(ctx, TRANS_CHECK_MAX_TIME_TOPIC, 0)
    assert discarded.properties["TRANSACTION_CHECK_TIMES"] == "3"
    assert discarded.properties["REAL_TOPIC"] == TOPIC and discarded.body == b"tx COMMIT"
    config = ctx.topic_config_manager.select(TRANS_CHECK_MAX_TIME_TOPIC)
    assert config is not None and (config.read_queue_nums, config.perm) == (1, 6)
    assert ctx.store.get_max_offset_in_queue(HALF, 0) == 4  # no more re-puts
    assert ctx.store.get_max_offset_in_queue(OP, 0) == 0  # no op for a discarded message
    assert service.stats.discarded == 1
    clock.now += 10_000
    await service.check()
    assert len(producer.sent) == 3


async def test_commit_answering_a_check_ends_the_checks(ctx: BrokerContext) -> None:
    clock = Clock()
    service = TransactionService(ctx, clock_ms=clock)
    producer = FakeProducer()
    register(ctx, producer)
    await send_half(ctx, uniq="U5")
    clock.now = max(clock.now, ctx.store.clock_ms()) + 10_000
    await service.check()
    [(header, _body)] = checks(producer)
    await dispatched(ctx.store, HALF, 2)
    answer = RemotingCommand(0, {"msgId": header.offset_msg_id or "", "queueOffset": "1"})
    response = await service.end_transaction(
        producer, end_request(answer, 8, from_check=True, uniq="U5")
    )
    assert response is not None and response.code == ResponseCode.SUCCESS
    await dispatched(ctx.store, TOPIC, 1, queue_id=1)
    real = stored(ctx, TOPIC, 0, queue_id=1)
    assert real.properties["TRANSACTION_CHECK_TIMES"] == "1"
    assert real.prepared_transaction_offset == header.commit_log_offset
    for _ in range(3):
        clock.now += 10_000
        await service.check()
    assert len(producer.sent) == 1
    offsets = ctx.consumer_offset_manager
    assert offsets.query_offset(CID_RMQ_SYS_TRANS, HALF, 0) == 2
    assert offsets.query_offset(CID_RMQ_SYS_TRANS, OP, 0) == 1


async def test_a_closed_producer_is_skipped_for_another_of_its_group(ctx: BrokerContext) -> None:
    clock = Clock()
    service = TransactionService(ctx, clock_ms=clock)
    gone, alive = FakeProducer(closed=True), FakeProducer()
    register(ctx, gone)
    register(ctx, alive)
    for n in range(3):
        await send_half(ctx, uniq=f"G{n}")
    clock.now = max(clock.now, ctx.store.clock_ms()) + 10_000
    await service.check()
    assert gone.sent == [] and len(alive.sent) == 3


async def test_check_with_no_producer_still_counts_the_check(ctx: BrokerContext) -> None:
    clock = Clock()
    service = TransactionService(ctx, clock_ms=clock)
    await send_half(ctx, uniq="N")
    clock.now = max(clock.now, ctx.store.clock_ms()) + 10_000
    await service.check()
    await dispatched(ctx.store, HALF, 2)
    assert stored(ctx, HALF, 1).properties["TRANSACTION_CHECK_TIMES"] == "1"
    assert service.stats.checks_without_producer == 1


async def test_progress_survives_a_new_service(ctx: BrokerContext) -> None:
    """The progress is in the consumer offsets: a new service (a restarted broker) resumes."""
    clock = Clock()
    producer = FakeProducer()
    register(ctx, producer)
    first = TransactionService(ctx, clock_ms=clock)
    answer = await send_half(ctx, uniq="C")
    await first.end_transaction(producer, end_request(answer, 8, uniq="C"))
    await send_half(ctx, uniq="D")
    clock.now = max(clock.now, ctx.store.clock_ms()) + 10_000
    await first.check()
    assert [b.properties["UNIQ_KEY"] for _, b in checks(producer)] == ["D"]
    persisted = ConsumerOffsetManager(ctx.store.config.config_dir)
    persisted.load()
    assert persisted.query_offset(CID_RMQ_SYS_TRANS, HALF, 0) == 2
    second = TransactionService(ctx, clock_ms=clock)
    clock.now += 10_000
    await second.check()  # asks about D's re-put again, never about the committed C
    kinds = [b.properties["UNIQ_KEY"] for _, b in checks(producer)]
    assert kinds == ["D", "D"]
    assert ctx.store.get_max_offset_in_queue(TOPIC, 1) == 1


def test_end_transaction_fast_decoder_equals_the_generic_one() -> None:
    for name in ("COMMIT", "ROLLBACK", "UNKNOW", "from-check-COMMIT", "from-check-UNKNOW"):
        ext = sample_header(f"TX-END_TRANSACTION-37-{name}.request-header.json")
        assert H.EndTransactionRequestHeader.from_ext(ext) == H.decode(
            H.EndTransactionRequestHeader, ext
        )
    ext = sample_header("TX-END_TRANSACTION-37-COMMIT.request-header.json")
    for field in ("producerGroup", "commitLogOffset", "msgId"):
        partial = {k: v for k, v in ext.items() if k != field}
        with pytest.raises(H.HeaderError, match=f"<{field}> is null"):
            H.EndTransactionRequestHeader.from_ext(partial)
    with pytest.raises(H.HeaderError, match="commitLogOffset"):
        H.EndTransactionRequestHeader.from_ext({**ext, "commitLogOffset": "1.5"})
    with pytest.raises(H.HeaderError, match="commitOrRollback field wrong"):
        H.EndTransactionRequestHeader.from_ext({**ext, "commitOrRollback": "3"})


async def test_inline_end_transaction_serves_oneway_requests_without_a_task(
    ctx: BrokerContext,
) -> None:
    service = TransactionService(ctx)
    answer = await send_half(ctx)
    served = service.end_transaction_inline(FakeProducer(), end_request(answer, 8))
    assert served is ANSWER_LATER  # oneway: nothing to answer, nothing deferred
    await dispatched(ctx.store, TOPIC, 1, queue_id=1)
    # An answered END on a store that must wait for the disk goes to a task.
    ctx.store.must_wait = True
    answered = end_request(answer, 12)
    answered.flag = 0
    assert service.end_transaction_inline(FakeProducer(), answered) is None


def test_producer_end_ext_equals_the_header_encoder() -> None:
    header = H.EndTransactionRequestHeader("PG_TX", 4, 7205, 8, "FD00", False)
    assert H.EndTransactionRequestHeader.producer_ext("PG_TX", 4, 7205, 8, "FD00") == H.encode(
        header
    )
    # The captured Java END carries the same fields.
    ext = sample_header("TX-END_TRANSACTION-37-COMMIT.request-header.json")
    ours = H.EndTransactionRequestHeader.producer_ext(
        "PG_TX", 0, 5404, 8, "FD0000000000000000000000000000021A395FFD2B27743D676E0000"
    )
    assert ours == ext
    # Its JSON, written by the producer's fast writer, says what the codec would write.
    fast = RemotingCommand(RequestCode.END_TRANSACTION, dict(ours))
    fast.ext_json = H.EndTransactionRequestHeader.producer_json(ours)
    slow = RemotingCommand(RequestCode.END_TRANSACTION, dict(ours))
    assert encode(fast) == encode(slow)
    quoted = H.EndTransactionRequestHeader.producer_ext('P"G\u00e9', 1, 2, 12, 'i"d')
    assert json.loads("{" + H.EndTransactionRequestHeader.producer_json(quoted) + "}") == quoted


async def test_end_transaction_at_an_offset_inside_a_record_is_refused(ctx: BrokerContext) -> None:
    answer = await send_half(ctx)
    request = end_request(answer, 8)
    request.ext_fields["commitLogOffset"] = str(int(request.ext_fields["commitLogOffset"]) + 3)
    end = ctx.store.max_phy_offset
    response = await TransactionService(ctx).end_transaction(FakeProducer(), request)
    assert response is not None and response.remark == "Find prepared transaction message failed"
    assert ctx.store.max_phy_offset == end


async def test_an_op_with_a_foreign_tag_does_not_hold_the_op_progress(ctx: BrokerContext) -> None:
    clock = Clock()
    service = TransactionService(ctx, clock_ms=clock)
    stray = MessageExt(
        topic=OP,
        body=b"0",
        properties={"WAIT": "true", "TAGS": "x"},
        born_timestamp=now_ms(),
        store_host=ctx.store_host,
        born_host=ctx.store_host,
    )
    assert ctx.store.put_now(stray).is_ok
    answer = await send_half(ctx)
    await service.end_transaction(FakeProducer(), end_request(answer, 12))
    await dispatched(ctx.store, OP, 2)
    clock.now = max(clock.now, ctx.store.clock_ms()) + 10_000
    await service.check()
    offsets = ctx.consumer_offset_manager
    assert offsets.query_offset(CID_RMQ_SYS_TRANS, HALF, 0) == 1
    assert offsets.query_offset(CID_RMQ_SYS_TRANS, OP, 0) == 2
    assert service.stats.checks == 0


async def test_check_immunity_defers_the_check_and_an_op_of_the_first_offset_ends_it(
    ctx: BrokerContext,
) -> None:
    clock = Clock()
    service = TransactionService(ctx, clock_ms=clock)
    producer = FakeProducer()
    register(ctx, producer)
    answer = await send_half(ctx, uniq="I", extra={"CHECK_IMMUNITY_TIME_IN_SECONDS": "60"})
    half = stored(ctx, HALF, 0)
    clock.now = max(half.born_timestamp + 10_000, half.store_timestamp + 1)  # timeout passed
    await service.check()
    assert producer.sent == []  # immune for 60 s: put back, remembering its first offset
    await dispatched(ctx.store, HALF, 2)
    assert stored(ctx, HALF, 1).properties["TRAN_PREPARED_QUEUE_OFFSET"] == "0"
    # The producer commits the first half record; the copy is then done with, not checked.
    await service.end_transaction(producer, end_request(answer, 8, uniq="I"))
    await dispatched(ctx.store, OP, 1)
    service._ended.clear()  # as after a restart: only the op tells
    clock.now += 10_000
    await service.check()
    assert producer.sent == [] and ctx.store.get_max_offset_in_queue(HALF, 0) == 2
    assert ctx.consumer_offset_manager.query_offset(CID_RMQ_SYS_TRANS, HALF, 0) == 2
    # Past its immunity, a pending one is checked.
    await send_half(ctx, uniq="J", extra={"CHECK_IMMUNITY_TIME_IN_SECONDS": "60"})
    clock.now = max(clock.now, ctx.store.clock_ms()) + 61_000
    await service.check()
    assert [b.properties["UNIQ_KEY"] for _, b in checks(producer)] == ["J"]


async def test_a_copycat_half_cannot_end_another_producers_transaction(
    ctx: BrokerContext,
) -> None:
    """#37: ended transactions were remembered by group, UNIQ_KEY and born time, all chosen by
    the producer: another producer that sent a half alike in all three and committed it made
    the victim's COMMIT write only an op (answered SUCCESS, its message never delivered).  A
    transaction is now named by its first half record's commit-log offset."""
    service = TransactionService(ctx)
    born = now_ms()
    victim = await send_half(ctx, uniq="SAME", born=born)
    copycat = await send_half(ctx, uniq="SAME", born=born)
    for answer in (copycat, victim):
        response = await service.end_transaction(
            FakeProducer(), end_request(answer, 8, uniq="SAME")
        )
        assert response is not None and response.code == ResponseCode.SUCCESS
    await dispatched(ctx.store, TOPIC, 2, queue_id=1)  # both messages stored under the real topic
    assert service.stats.duplicate_ends == 0 and service.stats.committed == 2


async def test_a_commit_of_the_checked_copy_and_a_late_end_write_one_message(
    ctx: BrokerContext,
) -> None:
    """The check service stores a half again before it asks; the producer's answer names the
    copy, and a late END the first record: one transaction, one message."""
    clock = Clock()
    service = TransactionService(ctx, clock_ms=clock)
    producer = FakeProducer()
    register(ctx, producer)
    first = await send_half(ctx, uniq="U9")
    old = stored(ctx, HALF, 0)
    clock.now = max(old.born_timestamp + 3_001, old.store_timestamp + 1)
    await service.check()
    [(header, _)] = checks(producer)
    await dispatched(ctx.store, HALF, 2)
    copy = stored(ctx, HALF, 1)
    from_check = end_request(first, 8, uniq="U9", from_check=True)
    from_check.ext_fields["commitLogOffset"] = str(header.commit_log_offset)
    from_check.ext_fields["tranStateTableOffset"] = str(copy.queue_offset)
    assert (await service.end_transaction(producer, from_check)).code == ResponseCode.SUCCESS
    late = await service.end_transaction(producer, end_request(first, 8, uniq="U9"))
    assert late is not None and late.code == ResponseCode.SUCCESS
    await dispatched(ctx.store, OP, 2)
    assert ctx.store.get_max_offset_in_queue(TOPIC, 1) == 1
    assert service.stats.duplicate_ends == 1


async def test_the_memory_of_ended_transactions_is_bounded_whatever_the_messages_carry(
    ctx: BrokerContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only integers are kept (the first half records' offsets), at most ENDED_MEMORY of each
    table: a 30 KB UNIQ_KEY cost 32 KB per remembered transaction, now it costs nothing."""
    service = TransactionService(ctx)
    answer = await send_half(ctx, uniq="u" * 30_000)
    await service.end_transaction(FakeProducer(), end_request(answer, 8, uniq="u" * 30_000))
    [key] = service._ended
    assert type(key) is int and key == int(answer.ext_fields["msgId"][-16:], 16)
    monkeypatch.setattr(transaction_module, "ENDED_MEMORY", 100)
    for offset in range(1_000):
        service._remember_ended(offset)
    assert len(service._ended) == 100 and min(service._ended) == 900


# Committed records, byte for byte: whatever path builds the committed record (the lookup of the
# half, the positional MessageExt, the put), its stored bytes are the half's record re-encoded
# under the real topic and queue with COMMIT in SYSFLAG, the half's offset as
# preparedTransactionOffset, and the half's properties string unchanged.
COMMIT_CASES: list[tuple[bytes, int, int, dict[str, str | None]]] = [
    # (body, flag, extra sysFlag bits, properties changed (None: removed))
    (b"tx COMMIT", 0, 0, {}),
    (b"", 0, 0, {}),
    (b"x", -1, 0, {"KEYS": "a b c"}),
    (os.urandom(1000), 7, 0, {"TAGS": "TagÜ", "Ключ": "значение"}),
    (os.urandom(100_000), 2**31 - 1, 0x1, {}),  # a compressed body
    (b"multi", 0, 0x2, {"TAGS": "a||b"}),  # MULTI_TAGS
    (b"no keys", 0, 0, {"KEYS": None, "TAGS": None}),
    (b"extra", 0, 0, {f"p{i}": "v" * i for i in range(1, 30)}),
    (b"emoji \xf0\x9f\x98\x80", 0, 0, {"UNIQ_KEY": "😀-U", "TAGS": "😀"}),
    (b"immune", 0, 0, {"CHECK_IMMUNITY_TIME_IN_SECONDS": "5"}),
]


async def commit_and_compare(
    ctx: BrokerContext, service: TransactionService, half_offset: int, queue_offset: int
) -> None:
    """COMMIT the half record at ``half_offset`` and compare the committed record's bytes with
    the half's re-encoded as the commit must be."""
    half_raw = ctx.store.select_one_message_by_offset(half_offset)
    assert half_raw is not None
    half = decode_record(half_raw)
    assert half.queue_offset == queue_offset
    header = H.EndTransactionRequestHeader(
        producer_group=half.properties["PGROUP"],
        tran_state_table_offset=queue_offset,
        commit_log_offset=half_offset,
        commit_or_rollback=8,
        msg_id=half.properties["UNIQ_KEY"],
    )
    end = RemotingCommand.request(RequestCode.END_TRANSACTION, H.encode(header), oneway=True)
    assert service.end_transaction_inline(FakeProducer(), end) is ANSWER_LATER
    real_queue = int(half.properties["REAL_QID"])
    real_offset = ctx.store.commitlog.topic_queue_table[(TOPIC, real_queue)] - 1
    await dispatched(ctx.store, TOPIC, real_offset + 1, real_queue)
    real = stored(ctx, TOPIC, real_offset, real_queue)
    real_raw = ctx.store.select_one_message_by_offset(real.commitlog_offset)
    expected = MessageExt(
        topic=TOPIC,
        body=half.body,
        flag=half.flag,
        properties=half.properties,
        queue_id=real_queue,
        queue_offset=real_offset,
        commitlog_offset=real.commitlog_offset,
        sys_flag=(half.sys_flag & ~0xC) | 8,
        born_timestamp=half.born_timestamp,
        born_host=half.born_host,
        store_timestamp=real.store_timestamp,
        store_host=ctx.store_host,
        reconsume_times=half.reconsume_times,
        prepared_transaction_offset=half_offset,
    )
    assert real_raw == encode_record(expected)
    # The properties string is the half's, byte for byte (REAL_TOPIC, REAL_QID, TRAN_MSG).
    props_len = len(properties_bytes(half.properties))
    assert real_raw[-props_len - 2 :] == half_raw[-props_len - 2 :]


async def test_committed_records_are_the_half_reencoded_byte_for_byte(
    ctx: BrokerContext,
) -> None:
    service = TransactionService(ctx)
    sender = SendProcessor(ctx)
    for n, (body, flag, sys_bits, changes) in enumerate(COMMIT_CASES):
        extra = {k: v for k, v in changes.items() if v is not None and k != "UNIQ_KEY"}
        request = half_request(
            queue_id=n % 4, uniq=changes.get("UNIQ_KEY") or f"U-{n}", extra=extra
        )
        props = decode_properties(request.ext_fields["i"])
        for name, value in changes.items():
            if value is None:
                props.pop(name, None)
        request.ext_fields["i"] = encode_properties(props)
        request.ext_fields["h"] = str(flag)
        request.ext_fields["f"] = str(4 | sys_bits)
        request.body = body
        answer = await sender.send_message(FakeProducer(), request)  # type: ignore[arg-type]
        assert answer.code == ResponseCode.SUCCESS, answer.remark
        half_offset = int(answer.ext_fields["msgId"][-16:], 16)
        await commit_and_compare(ctx, service, half_offset, int(answer.ext_fields["queueOffset"]))
    # A half record with an IPv6 born host (the send path writes IPv4 hosts only; a record
    # written by another broker may carry one): the careful decoder's path, same bytes.
    first = stored(ctx, HALF, 0)
    v6 = attrs.evolve(
        first,
        born_host=("fe80::1", 50000),
        properties={**first.properties, "UNIQ_KEY": "U-v6"},
        store_host=ctx.store_host,
    )
    result = ctx.store.put_now(v6)
    await commit_and_compare(ctx, service, result.wrote_offset, result.logic_offset)


async def test_resume_check_half_message_puts_a_given_up_message_back(
    ctx: BrokerContext,
) -> None:
    """RESUME_CHECK_HALF_MESSAGE (323): a message the check service gave up goes back to the
    half queue with TRANSACTION_CHECK_TIMES 0, is checked again, and its commit delivers it."""
    clock = Clock()
    service = TransactionService(ctx, clock_ms=clock)
    producer = FakeProducer()
    register(ctx, producer)
    first = await send_half(ctx, uniq="R1")
    for round_ in range(1, 5):
        clock.now = max(clock.now, ctx.store.clock_ms()) + 10_000
        await service.check()
        await dispatched(ctx.store, HALF, min(round_, 3) + 1)
    await dispatched(ctx.store, TRANS_CHECK_MAX_TIME_TOPIC, 1)
    given_up = stored(ctx, TRANS_CHECK_MAX_TIME_TOPIC, 0)

    def resume(msg_id: str) -> RemotingCommand:
        return RemotingCommand.request(RequestCode.RESUME_CHECK_HALF_MESSAGE, {"msgId": msg_id})

    bad = await service.resume_check_half_message(producer, resume("not-hex"))
    assert (bad.code, bad.remark) == (ResponseCode.SYSTEM_ERROR, service.RESUME_ERROR)
    half = stored(ctx, HALF, 0)  # not a given-up message: Java would copy it, pymq refuses
    refused = await service.resume_check_half_message(producer, resume(half.msg_id))
    assert refused.code == ResponseCode.SYSTEM_ERROR
    assert ctx.store.get_max_offset_in_queue(HALF, 0) == 4

    answer = await service.resume_check_half_message(producer, resume(given_up.msg_id))
    assert (answer.code, answer.remark) == (ResponseCode.SUCCESS, None)
    await dispatched(ctx.store, HALF, 5)
    resumed = stored(ctx, HALF, 4)
    assert resumed.properties["TRANSACTION_CHECK_TIMES"] == "0" and resumed.body == b"tx COMMIT"
    clock.now = max(clock.now, ctx.store.clock_ms()) + 10_000
    await service.check()
    header, body = checks(producer)[-1]
    assert body.properties["UNIQ_KEY"] == "R1" and len(checks(producer)) == 4
    # The producer commits the copy it was asked about: delivered once; a late END of the
    # first half record is the same transaction and writes no second message.
    from_check = end_request(first, 8, uniq="R1", from_check=True)
    from_check.ext_fields["commitLogOffset"] = str(header.commit_log_offset)
    from_check.ext_fields["tranStateTableOffset"] = str(header.tran_state_table_offset)
    assert (await service.end_transaction(producer, from_check)).code == ResponseCode.SUCCESS
    await service.end_transaction(producer, end_request(first, 8, uniq="R1"))
    await dispatched(ctx.store, TOPIC, 1, queue_id=1)
    assert ctx.store.get_max_offset_in_queue(TOPIC, 1) == 1
    assert service.stats.duplicate_ends == 1
