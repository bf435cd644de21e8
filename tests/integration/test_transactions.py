"""Transactional messages end to end: pymq's TransactionProducer against a pymq broker (issue #13).

The broker's check interval and timeout are shortened (``transactionCheckInterval`` 200 ms,
``transactionTimeOut`` 1000 ms, ``transactionCheckMax`` 3) so that the check-back service's
rounds happen within a test; what the broker stored is read from its store.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

from pymq.broker.controller import BrokerController
from pymq.client import (
    LocalTransactionState,
    Message,
    MessageExt,
    TransactionProducer,
)
from pymq.common.consumer import HeartbeatData, ProducerData
from pymq.common.message_id import create_offset_msg_id, decode_offset_msg_id
from pymq.common.record import decode_record
from pymq.common.serde import to_json
from pymq.common.topic import (
    CID_RMQ_SYS_TRANS,
    RMQ_SYS_TRANS_HALF_TOPIC,
    RMQ_SYS_TRANS_OP_HALF_TOPIC,
    TRANS_CHECK_MAX_TIME_TOPIC,
)
from pymq.embedded import Cluster, build_cluster, open_cluster
from pymq.remoting import headers as H
from pymq.remoting.channel import Channel
from pymq.remoting.client import open_remoting_client
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.testing import TEST_PROPERTIES
from tests.helpers import wait_until

TOPIC = "TopicTx"
GROUP = "PG_TX"
COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW
FAST_CHECKS = {
    "transactionCheckInterval": "200",
    "transactionTimeOut": "1000",
    "transactionCheckMax": "3",
}


@asynccontextmanager
async def cluster_at(data_dir: str, extra: dict[str, str] | None = None) -> AsyncIterator[Cluster]:
    properties = {**TEST_PROPERTIES, **FAST_CHECKS, **(extra or {})}
    async with open_cluster(
        data_dir,
        namesrv_port=0,
        broker_port=0,
        bind_address="127.0.0.1",
        properties=properties,
    ) as cluster:
        yield cluster


def delivered(broker: BrokerController, topic: str = TOPIC) -> list[MessageExt]:
    """Every message in ``topic``'s consume queues: what consumers of the topic would get."""
    store = broker.store
    out = []
    for queue_id in range(8):
        for offset in range(store.get_max_offset_in_queue(topic, queue_id)):
            msg = store.message_at(topic, queue_id, offset)
            assert msg is not None
            out.append(msg)
    return out


def bodies(broker: BrokerController, topic: str = TOPIC) -> list[bytes]:
    return sorted(m.body for m in delivered(broker, topic))


def by_body(states: dict[bytes, LocalTransactionState]) -> Callable[..., LocalTransactionState]:
    def decide(msg: Message | MessageExt, _arg: object = None) -> LocalTransactionState:
        return states[msg.body]

    return decide


async def test_commit_rollback_and_unknown_then_check(tmp_path) -> None:
    executed = {b"commit": COMMIT, b"rollback": ROLLBACK, b"later": UNKNOW, b"never": UNKNOW}
    checked: list[bytes] = []

    def check(msg: MessageExt) -> LocalTransactionState:
        checked.append(msg.body)
        return COMMIT if msg.body == b"later" else UNKNOW

    async with cluster_at(str(tmp_path)) as cluster:
        broker = cluster.broker
        async with TransactionProducer(
            GROUP, cluster.namesrv_addr, execute=by_body(executed), check=check
        ) as producer:
            results = {}
            for body in executed:
                result = await producer.send_in_transaction(Message(TOPIC, body, tags="TagTx"))
                assert result.status == "SEND_OK"
                assert result.local_transaction_state is executed[body]
                results[body] = result
            # The commit is visible at once, the rollback never; the half messages are not.
            await wait_until(lambda: bodies(broker) == [b"commit"], what="the commit")
            # UNKNOW: asked by the check service, committed at the first check.
            await wait_until(lambda: bodies(broker) == [b"commit", b"later"], what="the check")
            # Asked three times, then given up and moved to TRANS_CHECK_MAX_TIME_TOPIC.
            await wait_until(
                lambda: bodies(broker, TRANS_CHECK_MAX_TIME_TOPIC) == [b"never"],
                what="the discard",
            )
            # Once, unless the answer to the first check was not served before the next round
            # (a loaded machine): then asked again, and still delivered once.
            assert checked.count(b"later") >= 1 and checked.count(b"never") == 3
            assert b"commit" not in checked and b"rollback" not in checked
            await trio.sleep(0.5)  # more rounds change nothing
            assert bodies(broker) == [b"commit", b"later"] and checked.count(b"never") == 3
        committed = {m.body: m for m in delivered(broker)}
        half = broker.store.look_message_by_offset(
            decode_offset_msg_id(results[b"commit"].offset_msg_id)[2]
        )
        assert half is not None and half.topic == RMQ_SYS_TRANS_HALF_TOPIC
        assert committed[b"commit"].prepared_transaction_offset == half.commitlog_offset
        assert committed[b"commit"].queue_id == results[b"commit"].queue.queue_id
        assert committed[b"later"].properties["TRANSACTION_CHECK_TIMES"] == "1"
        assert committed[b"commit"].properties["UNIQ_KEY"] == results[b"commit"].msg_id
        stats = broker.transactions.stats
        assert (stats.committed, stats.rolled_back, stats.discarded) == (2, 1, 1)
        # The progress offsets of CID_RMQ_SYS_TRANS went past everything.
        offsets = broker.consumer_offset_manager
        half_end = broker.store.get_max_offset_in_queue(RMQ_SYS_TRANS_HALF_TOPIC, 0)
        assert offsets.query_offset(CID_RMQ_SYS_TRANS, RMQ_SYS_TRANS_HALF_TOPIC, 0) == half_end
        assert offsets.query_offset(CID_RMQ_SYS_TRANS, RMQ_SYS_TRANS_OP_HALF_TOPIC, 0) == 3


async def test_a_gone_producer_is_replaced_by_another_of_its_group(tmp_path) -> None:
    asked: list[str] = []

    def check_by(name: str) -> Callable[[MessageExt], LocalTransactionState]:
        def check(msg: MessageExt) -> LocalTransactionState:
            asked.append(name)
            return COMMIT

        return check

    async with (
        cluster_at(str(tmp_path), {"transactionTimeOut": "1500"}) as cluster,
        TransactionProducer(
            GROUP, cluster.namesrv_addr, execute=lambda m, a: UNKNOW, check=check_by("stays")
        ) as stays,
    ):
        await stays.publish_queues(TOPIC)  # heartbeat: the broker knows this producer
        async with TransactionProducer(
            GROUP, cluster.namesrv_addr, execute=lambda m, a: UNKNOW, check=check_by("goes")
        ) as goes:
            await goes.send_in_transaction(Message(TOPIC, b"orphan"))
        # ``goes`` unregistered and closed its connection before any check came.
        await wait_until(lambda: bodies(cluster.broker) == [b"orphan"], what="the commit")
        assert asked == ["stays"]


async def test_restart_between_half_and_commit(tmp_path) -> None:
    """The half message outlives a restart; the commit after it delivers it once."""
    slow = {"transactionCheckInterval": "3600000"}  # no round runs unless called
    async with (
        cluster_at(str(tmp_path), slow) as cluster,
        TransactionProducer(
            GROUP, cluster.namesrv_addr, execute=lambda m, a: UNKNOW, check=lambda m: UNKNOW
        ) as producer,
    ):
        sent = await producer.send_in_transaction(Message(TOPIC, b"survivor"))
    offset = decode_offset_msg_id(sent.offset_msg_id)[2]
    async with cluster_at(str(tmp_path), slow) as cluster:
        broker = cluster.broker
        assert bodies(broker) == []
        end = H.EndTransactionRequestHeader(
            producer_group=GROUP,
            tran_state_table_offset=sent.queue_offset,
            commit_log_offset=offset,
            commit_or_rollback=8,
            msg_id=sent.msg_id,
        )
        async with open_remoting_client() as client:
            for _ in range(2):  # the second END of the same transaction changes nothing
                await client.invoke_oneway(
                    cluster.broker_addr,
                    RemotingCommand.request(RequestCode.END_TRANSACTION, H.encode(end)),
                )
            await wait_until(lambda: bodies(broker) == [b"survivor"], what="the commit")
        await wait_until(
            lambda: broker.store.get_max_offset_in_queue(RMQ_SYS_TRANS_OP_HALF_TOPIC, 0) == 2
        )
        await trio.sleep(1.1)  # older than transactionTimeOut
        await broker.transactions.check()
        assert broker.transactions.stats.checks == 0
    async with cluster_at(str(tmp_path), slow) as cluster:
        broker = cluster.broker
        await trio.sleep(1.1)
        await broker.transactions.check()
        assert bodies(broker) == [b"survivor"] and broker.transactions.stats.checks == 0


async def test_a_thousand_concurrent_transactions(tmp_path) -> None:
    count = 1000
    states = {str(n).encode(): (COMMIT if n % 3 else ROLLBACK) for n in range(count)}
    async with (
        cluster_at(str(tmp_path), {"transactionCheckInterval": "3600000"}) as cluster,
        TransactionProducer(
            GROUP, cluster.namesrv_addr, execute=by_body(states), check=lambda m: UNKNOW
        ) as producer,
    ):
        await producer.publish_queues(TOPIC)

        async def one(body: bytes) -> None:
            result = await producer.send_in_transaction(Message(TOPIC, body))
            assert result.status == "SEND_OK"

        async with trio.open_nursery() as nursery:
            for body in states:
                nursery.start_soon(one, body)
        expected = sorted(b for b, s in states.items() if s is COMMIT)
        broker = cluster.broker
        await wait_until(lambda: len(delivered(broker)) == len(expected), timeout=30)
        assert bodies(broker) == expected
        await wait_until(
            lambda: broker.store.get_max_offset_in_queue(RMQ_SYS_TRANS_OP_HALF_TOPIC, 0) == count
        )
        await trio.sleep(1.1)
        await broker.transactions.check()
        assert broker.transactions.stats.checks == 0
        assert (
            broker.consumer_offset_manager.query_offset(
                CID_RMQ_SYS_TRANS, RMQ_SYS_TRANS_HALF_TOPIC, 0
            )
            == count
        )


async def test_slave_refuses_and_replicates_transactions(tmp_path) -> None:
    async with cluster_at(str(tmp_path / "master")) as cluster:
        master = cluster.broker
        _namesrv, configs = build_cluster(
            str(tmp_path / "slave"),
            broker_port=0,
            bind_address="127.0.0.1",
            properties={
                **TEST_PROPERTIES,
                **FAST_CHECKS,
                "brokerRole": "SLAVE",
                "brokerId": "1",
                "haMasterAddress": f"127.0.0.1:{master.ha_port}",
                "namesrvAddr": cluster.namesrv_addr,
            },
        )
        slave = BrokerController(*configs)  # type: ignore[arg-type]
        async with trio.open_nursery() as nursery:
            await nursery.start(slave.run)
            async with TransactionProducer(
                GROUP, cluster.namesrv_addr, execute=lambda m, a: COMMIT, check=lambda m: UNKNOW
            ) as producer:
                sent = await producer.send_in_transaction(Message(TOPIC, b"replicated"))
            await wait_until(lambda: bodies(master) == [b"replicated"])
            # The slave has the half, the commit and the op, and serves the commit.
            await wait_until(lambda: bodies(slave) == [b"replicated"], timeout=15)
            assert slave.store.get_max_offset_in_queue(RMQ_SYS_TRANS_HALF_TOPIC, 0) == 1
            assert slave.transactions.stats.rounds == 0  # no check service on a slave
            # A slave refuses END_TRANSACTION and half messages.
            end = H.EndTransactionRequestHeader(
                producer_group=GROUP,
                tran_state_table_offset=sent.queue_offset,
                commit_log_offset=decode_offset_msg_id(sent.offset_msg_id)[2],
                commit_or_rollback=8,
                msg_id=sent.msg_id,
            )
            async with open_remoting_client() as client:
                answer = await client.invoke(
                    slave.broker_addr,
                    RemotingCommand.request(RequestCode.END_TRANSACTION, H.encode(end)),
                )
                assert answer.code == ResponseCode.SLAVE_NOT_AVAILABLE
                half = H.SendMessageRequestHeader(
                    producer_group=GROUP,
                    topic=TOPIC,
                    default_topic="TBW102",
                    default_topic_queue_nums=4,
                    queue_id=0,
                    sys_flag=4,
                    born_timestamp=0,
                    flag=0,
                    properties="TRAN_MSG\x01true\x02PGROUP\x01PG_TX",
                )
                answer = await client.invoke(
                    slave.broker_addr,
                    RemotingCommand.request(RequestCode.SEND_MESSAGE, H.encode(half), b"x"),
                )
                assert answer.code == ResponseCode.SERVICE_NOT_AVAILABLE
            assert bodies(slave) == [b"replicated"]
            nursery.cancel_scope.cancel()


SAMPLES = "/work/shared/reference/java-wire-samples"


def sample(name: str) -> dict:
    with open(f"{SAMPLES}/{name}") as f:
        return json.load(f)


async def test_a_java_producer_s_frames_unknown_then_commit_at_the_check(tmp_path) -> None:
    """The captured Java frames replayed on a raw connection: the half send's answer, the
    oneway END UNKNOW, the broker's CHECK_TRANSACTION_STATE on that connection (header fields,
    oneway flag, body), and the END COMMIT from the check, as the real 4.9.4 pair exchanged."""
    checks: list[RemotingCommand] = []

    async def on_request(channel: Channel, req: RemotingCommand) -> RemotingCommand | None:
        checks.append(req)
        head = H.decode(H.CheckTransactionStateRequestHeader, req.ext_fields)
        end = dict(
            sample("TX-END_TRANSACTION-37-from-check-COMMIT.request-header.json")["extFields"]
        )
        end.update(
            commitLogOffset=str(head.commit_log_offset),
            tranStateTableOffset=str(head.tran_state_table_offset),
            msgId=head.msg_id or "",
            transactionId=head.transaction_id or "",
        )
        await channel.invoke_oneway(RemotingCommand(RequestCode.END_TRANSACTION, end))
        return None

    async with (
        cluster_at(str(tmp_path)) as cluster,
        open_remoting_client(handler=on_request) as client,
    ):
        addr = cluster.broker_addr
        beat = HeartbeatData("192.0.2.2@java", [ProducerData(GROUP)], [])
        answer = await client.invoke(
            addr, RemotingCommand(RequestCode.HEART_BEAT, {}, to_json(beat))
        )
        assert answer.code == ResponseCode.SUCCESS
        half = sample("TX-SEND_MESSAGE_V2-310-half-COMMIT.request-header.json")
        ext = {**half["extFields"], "g": str(int(time.time() * 1000))}
        answer = await client.invoke(
            addr, RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext, b"tx UNKNOW")
        )
        want = sample("TX-SEND_MESSAGE_V2-310-half-COMMIT.response-header.json")
        assert answer.code == 0 and set(answer.ext_fields) == set(want["extFields"])
        assert answer.ext_fields["queueId"] == "1" and answer.ext_fields["queueOffset"] == "0"
        unknown = dict(sample("TX-END_TRANSACTION-37-UNKNOW.request-header.json")["extFields"])
        unknown.update(
            commitLogOffset=str(decode_offset_msg_id(answer.ext_fields["msgId"])[2]),
            tranStateTableOffset=answer.ext_fields["queueOffset"],
            msgId=ext["i"].split("UNIQ_KEY\x01")[1].split("\x02")[0],
        )
        await client.invoke_oneway(addr, RemotingCommand(RequestCode.END_TRANSACTION, unknown))
        broker = cluster.broker
        await wait_until(lambda: bodies(broker) == [b"tx UNKNOW"], what="the commit at the check")
        [check] = checks
        captured = sample("TX-CHECK_TRANSACTION_STATE-39-check1.request-header.json")
        assert check.flag == captured["flag"] == 2 and check.code == 39
        assert set(check.ext_fields) == set(captured["extFields"])
        assert (check.language, check.version) == ("JAVA", 401)
        body = decode_record(check.body)
        with open(f"{SAMPLES}/TX-CHECK_TRANSACTION_STATE-39-check1.request-body.hex.txt") as f:
            java_body = decode_record(bytes.fromhex(f.read().strip()))
        assert (body.topic, body.queue_id, body.sys_flag) == ("TopicTx", 1, 0)
        assert list(body.properties) == list(java_body.properties)  # Java's HashMap order
        assert body.properties["WAIT"] == "false" and body.properties["REAL_QID"] == "1"
        assert body.properties["TRANSACTION_CHECK_TIMES"] == "1"
        assert check.ext_fields["offsetMsgId"] == create_offset_msg_id(
            "127.0.0.1", broker.port, body.commitlog_offset
        )
        [real] = delivered(broker)
        assert real.queue_id == 1 and real.sys_flag == 8
        assert real.prepared_transaction_offset == body.commitlog_offset


async def test_a_transaction_clears_the_message_delay(tmp_path) -> None:
    async with (
        cluster_at(str(tmp_path)) as cluster,
        TransactionProducer(
            GROUP, cluster.namesrv_addr, execute=lambda m, a: COMMIT, check=lambda m: UNKNOW
        ) as producer,
    ):
        msg = Message(TOPIC, b"now", delay_level=3, properties={"DELAY": "2"})
        await producer.send_in_transaction(msg)
        await wait_until(lambda: bodies(cluster.broker) == [b"now"], what="the commit")
        [real] = delivered(cluster.broker)
        assert "DELAY" not in real.properties
        assert msg.delay_level == 3 and msg.properties == {"DELAY": "2"}  # the caller's
