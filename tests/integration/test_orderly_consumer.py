"""PushConsumer(orderly=True) against an in-process pymq, as Java's MessageListenerOrderly:
queues locked at the broker and relocked, one batch of a queue at a time and in order (queues
concurrently), failures retried in place then sent to the DLQ, unlocks on shutdown and on
rebalance; and a broadcasting consumer's offsets in its local file across restarts."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import trio

from pymq.client import (
    ConsumeFromWhere,
    Message,
    MessageExt,
    MessageModel,
    Producer,
    PushConsumer,
    topics,
)
from pymq.client.instance import MQClientError
from pymq.client.offset_store import encode_offsets, offsets_path
from pymq.common.consumer import LockBatchRequestBody, LockBatchResponseBody, MessageQueue
from pymq.common.record import decode_record
from pymq.common.serde import from_json, to_json
from pymq.embedded import Cluster, open_cluster
from pymq.remoting.client import open_remoting_client
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode
from pymq.remoting.protocol import fastjson
from pymq.testing import TEST_PROPERTIES
from tests.helpers import wait_until

FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
BROKER = "broker-a"


@pytest.fixture
async def cluster(tmp_path) -> AsyncIterator[Cluster]:
    async with open_cluster(
        str(tmp_path / "cluster"),
        namesrv_port=0,
        broker_port=0,
        bind_address="127.0.0.1",
        properties=dict(TEST_PROPERTIES),
    ) as cluster:
        yield cluster


async def produce(
    cluster: Cluster, topic: str, queues: int, per_queue: int, start: int = 0
) -> None:
    """``per_queue`` messages ``q<queue>-<n>`` into each queue, n counting from ``start``."""
    async with Producer("P", cluster.namesrv_addr) as producer:
        for n in range(start, start + per_queue):
            for q in range(queues):
                msg = Message(topic, f"q{q}-{n}".encode())
                await producer.send(msg, queue=MessageQueue(topic, BROKER, q))
    # Dispatch follows the append: a new queue's first entry waits for its file (made in a
    # thread). A consumer that pulls a stored offset before that is told the offset moved to 0.
    await cluster.broker.store.reput.do_reput()


def parse(msg: MessageExt) -> tuple[int, int]:
    q, n = msg.body.decode()[1:].split("-")
    return int(q), int(n)


class OrderlyRecorder:
    """Records each batch it is handed (in the order handed, across consumers sharing it) and
    checks that no two batches of one queue ever run at the same time."""

    def __init__(self, delay: float = 0.002) -> None:
        self.delay = delay
        self.handled: list[tuple[str, int, int, int]] = []  # (who, queue, n, reconsume times)
        self.in_flight: dict[int, int] = defaultdict(int)
        self.overlaps: list[int] = []  # queues seen running twice at once
        self.running = 0
        self.most_running = 0  # queues running at once, at most
        self.fail: dict[tuple[int, int], int] = {}  # (queue, n) -> failures left (-1: always)
        self.interrupted = 0  # handlers cancelled midway

    def handler(self, who: str) -> Callable[[list[MessageExt]], Awaitable[bool]]:
        async def handle(msgs: list[MessageExt]) -> bool:
            queue = msgs[0].queue_id
            self.in_flight[queue] += 1
            if self.in_flight[queue] > 1:
                self.overlaps.append(queue)
            self.running += 1
            self.most_running = max(self.most_running, self.running)
            try:
                ok = True
                for msg in msgs:
                    q, n = parse(msg)
                    assert q == msg.queue_id == queue
                    self.handled.append((who, q, n, msg.reconsume_times))
                    left = self.fail.get((q, n), 0)
                    if left:
                        self.fail[(q, n)] = left - 1 if left > 0 else left
                        ok = False
                # Recorded before the work it stands for, so that a handler interrupted
                # midway (its batch handed over again) shows as a duplicate.
                await trio.sleep(self.delay)
                return ok
            except trio.Cancelled:
                self.interrupted += 1
                raise
            finally:
                self.running -= 1
                self.in_flight[queue] -= 1

        return handle

    def sequence(self, queue: int) -> list[int]:
        return [n for _, q, n, _ in self.handled if q == queue]

    async def wait_for(self, count: int, timeout: float = 30) -> None:
        await wait_until(lambda: len(self.handled) >= count, timeout=timeout, interval=0.01)


def broker_locks(cluster: Cluster, group: str) -> dict[MessageQueue, str]:
    table = cluster.broker.rebalance_lock_manager.table.get(group, {})
    return {mq: lock.client_id for mq, lock in table.items()}


async def try_lock(cluster: Cluster, group: str, client_id: str, mqs: list[MessageQueue]) -> set:
    """LOCK_BATCH_MQ as another member of the group would send it."""
    body = to_json(LockBatchRequestBody(group, client_id, mqs))
    async with open_remoting_client() as client:
        response = await client.invoke(
            cluster.broker_addr, RemotingCommand.request(RequestCode.LOCK_BATCH_MQ, body=body)
        )
    return set(from_json(response.body, LockBatchResponseBody).lock_ok_mq_set)


async def unlock(cluster: Cluster, group: str, client_id: str, mqs: list[MessageQueue]) -> None:
    body = to_json(LockBatchRequestBody(group, client_id, mqs))
    async with open_remoting_client() as client:
        await client.invoke(
            cluster.broker_addr, RemotingCommand.request(RequestCode.UNLOCK_BATCH_MQ, body=body)
        )


async def test_each_queue_in_order_one_batch_at_a_time_queues_concurrently(
    cluster: Cluster,
) -> None:
    await topics.create_topic(cluster.namesrv_addr, "Ord", queues=4, brokers=[cluster.broker_addr])
    await produce(cluster, "Ord", 4, 25)
    rec = OrderlyRecorder()
    async with PushConsumer(
        "G", cluster.namesrv_addr, rec.handler("a"), consume_from=FIRST, orderly=True, batch_size=3
    ) as consumer:
        await consumer.subscribe("Ord")
        await rec.wait_for(100)
        # Every queue of the topic (and the group's retry queue) is locked for this client.
        assert consumer.client is not None
        me = consumer.client.client_id
        locks = broker_locks(cluster, "G")
        assert {mq for mq, cid in locks.items() if cid == me} >= {
            MessageQueue("Ord", BROKER, q) for q in range(4)
        }
        assert all(consumer.orderly_queues[MessageQueue("Ord", BROKER, q)].locked for q in range(4))
    for q in range(4):
        assert rec.sequence(q) == list(range(25))
    assert rec.overlaps == [] and rec.interrupted == 0
    assert rec.most_running >= 2  # different queues ran at the same time
    # Leaving unlocked every queue at the broker.
    assert broker_locks(cluster, "G") == {}


@pytest.mark.slow
async def test_failed_batch_suspends_its_queue_retries_in_place_then_dlq(cluster: Cluster) -> None:
    await topics.create_topic(cluster.namesrv_addr, "Ret", queues=2, brokers=[cluster.broker_addr])
    await produce(cluster, "Ret", 2, 5)
    rec = OrderlyRecorder(delay=0)
    rec.fail = {(0, 1): 2, (0, 3): -1}  # q0-1 fails twice, q0-3 always
    async with PushConsumer(
        "G",
        cluster.namesrv_addr,
        rec.handler("a"),
        consume_from=FIRST,
        orderly=True,
        max_reconsume_times=2,
        suspend_current_queue_ms=300,
    ) as consumer:
        await consumer.subscribe("Ret")
        await wait_until(lambda: rec.sequence(0)[-1:] == [4], timeout=30, interval=0.01)
        store = cluster.broker.store
        await wait_until(
            lambda: store.get_max_offset_in_queue("%DLQ%G", 0) >= 1, timeout=10, interval=0.02
        )
        mq0 = MessageQueue("Ret", BROKER, 0)
        await wait_until(lambda: consumer.offsets[mq0] == 5, timeout=10, interval=0.02)
    queue0 = [(n, times) for _, q, n, times in rec.handled if q == 0]
    assert queue0 == [(0, 0), (1, 0), (1, 1), (1, 2), (2, 0), (3, 0), (3, 1), (3, 2), (4, 0)]
    # While queue 0 was suspended, queue 1 went on: it was done before queue 0's retries.
    assert rec.sequence(1) == list(range(5))
    last_of_q1 = max(i for i, h in enumerate(rec.handled) if h[1] == 1)
    first_q0_4 = next(i for i, h in enumerate(rec.handled) if h[1:3] == (0, 4))
    assert last_of_q1 < first_q0_4
    # Only the message that kept failing went to the DLQ, and only once.
    assert store.get_max_offset_in_queue("%DLQ%G", 0) == 1
    dead = decode_record(store.get_message("G", "%DLQ%G", 0, 0, 1).messages[0])
    assert dead.body == b"q0-3"
    assert dead.properties["RETRY_TOPIC"] == "Ret"
    # The offset was committed past every message, the DLQ'd one included.
    assert cluster.broker.consumer_offset_manager.query_offset("G", "Ret", 0) == 5


@pytest.mark.slow
async def test_locks_renewed_and_consumption_only_under_a_held_lock(cluster: Cluster) -> None:
    await topics.create_topic(cluster.namesrv_addr, "Lk", queues=1, brokers=[cluster.broker_addr])
    mq = MessageQueue("Lk", BROKER, 0)
    rec = OrderlyRecorder(delay=0)
    async with PushConsumer(
        "G",
        cluster.namesrv_addr,
        rec.handler("a"),
        consume_from=FIRST,
        orderly=True,
        lock_interval=0.2,
        lock_max_live=0.6,
    ) as consumer:
        await consumer.subscribe("Lk")
        assert consumer.client is not None
        me = consumer.client.client_id
        await wait_until(lambda: broker_locks(cluster, "G").get(mq) == me, timeout=10)
        # Another member of the group cannot lock the queue while this one holds it.
        assert await try_lock(cluster, "G", "10.0.0.9@other", [mq]) == set()
        # The lock is renewed every lock_interval.
        manager = cluster.broker.rebalance_lock_manager
        first = manager.table["G"][mq].last_update
        await trio.sleep(0.7)
        assert manager.table["G"][mq].last_update > first
        await produce(cluster, "Lk", 1, 3)
        await rec.wait_for(3)

        # The broker forgets the lock; another client takes it and this consumer's own lock
        # grows too old: it consumes nothing more until it holds the queue again.
        async def no_renewal() -> None:
            pass

        consumer.lock_all = no_renewal  # type: ignore[method-assign]
        await trio.sleep(0.3)  # a renewal under way has ended
        manager.max_live = 0.1
        with trio.fail_after(5):
            while await try_lock(cluster, "G", "10.0.0.9@other", [mq]) != {mq}:
                await trio.sleep(0.05)
        manager.max_live = 60.0
        state = consumer.orderly_queues[mq]
        await wait_until(lambda: not consumer._lock_valid(state), timeout=5)  # lock_max_live
        await produce(cluster, "Lk", 1, 3, start=3)
        await trio.sleep(1.0)
        assert rec.sequence(0) == [0, 1, 2]
        await unlock(cluster, "G", "10.0.0.9@other", [mq])
        await rec.wait_for(6, timeout=10)  # relocked within LOCK_RETRY_DELAY, then consumed
        assert broker_locks(cluster, "G").get(mq) == me
    assert rec.sequence(0) == list(range(6))
    assert broker_locks(cluster, "G") == {}
    # Unlocked at shutdown: another member locks it at once.
    assert await try_lock(cluster, "G", "10.0.0.9@other", [mq]) == {mq}


@pytest.mark.slow
async def test_rebalance_moves_queues_in_order_never_two_consumers_at_once(
    cluster: Cluster,
) -> None:
    await topics.create_topic(cluster.namesrv_addr, "Mv", queues=4, brokers=[cluster.broker_addr])
    rec = OrderlyRecorder(delay=0.005)
    per_queue = 60
    options = dict(consume_from=FIRST, orderly=True, rebalance_interval=0.3, lock_interval=0.3)
    async with PushConsumer("G", cluster.namesrv_addr, rec.handler("a"), **options) as a:
        await a.subscribe("Mv")
        await produce(cluster, "Mv", 4, 20)
        await rec.wait_for(20)
        async with PushConsumer("G", cluster.namesrv_addr, rec.handler("b"), **options) as b:
            await b.subscribe("Mv")
            await produce(cluster, "Mv", 4, 20, start=20)
            assert a.client is not None and b.client is not None
            ids = {a.client.client_id: "a", b.client.client_id: "b"}
            # The queues moved: each consumer holds two, locked at the broker for it.
            await wait_until(
                lambda: sorted(broker_locks(cluster, "G").values()).count(b.client.client_id) >= 2,
                timeout=20,
            )
            await produce(cluster, "Mv", 4, 20, start=40)
            await rec.wait_for(4 * per_queue, timeout=30)
            owners = {
                mq.queue_id: ids[cid]
                for mq, cid in broker_locks(cluster, "G").items()
                if mq.topic == "Mv"
            }
            assert sorted(owners.values()) == ["a", "a", "b", "b"]
        # b left: its queues come back to a, in order again.
        await produce(cluster, "Mv", 4, 10, start=per_queue)
        await rec.wait_for(4 * (per_queue + 10), timeout=30)
    assert rec.overlaps == []  # no queue ever ran in two handlers at once
    assert rec.interrupted == 0  # no queue was given up in the middle of a batch
    for q in range(4):
        # Each queue in order, every message once: the offsets were committed before unlocking.
        assert rec.sequence(q) == list(range(per_queue + 10))
    handled_by = {who for who, q, _, _ in rec.handled}
    assert handled_by == {"a", "b"}
    for q, owner in owners.items():
        if owner == "b":
            whos = [who for who, qq, _, _ in rec.handled if qq == q]
            # a, then b, then a again: never interleaved.
            changes = [w for i, w in enumerate(whos) if i == 0 or whos[i - 1] != w]
            assert changes == ["a", "b", "a"]


async def test_offset_reset_lets_the_running_batch_end(cluster: Cluster) -> None:
    await topics.create_topic(cluster.namesrv_addr, "Rs", queues=1, brokers=[cluster.broker_addr])
    await produce(cluster, "Rs", 1, 4)
    rec = OrderlyRecorder(delay=0.2)
    async with PushConsumer(
        "G", cluster.namesrv_addr, rec.handler("a"), consume_from=FIRST, orderly=True
    ) as consumer:
        await consumer.subscribe("Rs")
        await rec.wait_for(1)  # the first batch is running
        await consumer.reset_offsets({MessageQueue("Rs", BROKER, 0): 0})
        await rec.wait_for(5)
        await trio.sleep(0.3)
    assert rec.sequence(0) == [0, 0, 1, 2, 3]
    assert rec.interrupted == 0


async def test_broadcasting_offsets_kept_in_local_file_across_restarts(
    cluster: Cluster, tmp_path
) -> None:
    await topics.create_topic(cluster.namesrv_addr, "Bc", queues=2, brokers=[cluster.broker_addr])
    await produce(cluster, "Bc", 2, 5)
    store_dir = str(tmp_path / "offsets")
    options = dict(
        message_model=MessageModel.BROADCASTING,
        consume_from=FIRST,
        local_offset_store_dir=store_dir,
        instance_name="bc-1",
        persist_interval=0.2,
    )
    path = offsets_path(store_dir, "127.0.0.1@bc-1", "G")
    first = OrderlyRecorder(delay=0)
    async with PushConsumer("G", cluster.namesrv_addr, first.handler("1"), **options) as c:
        await c.subscribe("Bc")
        await first.wait_for(10)
        # Written periodically, not only at shutdown.
        await wait_until(lambda: os.path.exists(path), timeout=5)
    mqs = [MessageQueue("Bc", BROKER, q) for q in range(2)]
    with open(path, "rb") as f:
        written = f.read()
    # Java's OffsetSerializeWrapper: offsetTable keyed by the MessageQueue object itself.
    assert written == encode_offsets({mqs[0]: 5, mqs[1]: 5})
    assert written.startswith(
        b'{"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"Bc"}:5,'
    )
    table = fastjson.loads(written)["offsetTable"]
    assert {(k["topic"], k["queueId"], v) for k, v in table.items()} == {("Bc", 0, 5), ("Bc", 1, 5)}
    await produce(cluster, "Bc", 2, 3, start=5)
    # Restarted (orderly this time): it goes on from the file, not from the first offset.
    second = OrderlyRecorder(delay=0)
    async with PushConsumer(
        "G", cluster.namesrv_addr, second.handler("2"), orderly=True, **options
    ) as c:
        await c.subscribe("Bc")
        await second.wait_for(6)
        await trio.sleep(0.3)
    assert sorted((q, n) for _, q, n, _ in second.handled) == [
        (q, n) for q in range(2) for n in range(5, 8)
    ]
    for q in range(2):
        assert second.sequence(q) == [5, 6, 7]
    with open(path, "rb") as f:
        assert f.read() == encode_offsets({mqs[0]: 8, mqs[1]: 8})
    # The file it replaced is kept as the .bak.
    with open(path + ".bak", "rb") as f:
        assert fastjson.loads(f.read())["offsetTable"]


async def test_corrupt_offsets_file_falls_back_to_bak(cluster: Cluster, tmp_path) -> None:
    await topics.create_topic(cluster.namesrv_addr, "Bk", queues=1, brokers=[cluster.broker_addr])
    await produce(cluster, "Bk", 1, 6)
    store_dir = str(tmp_path / "offsets")
    path = offsets_path(store_dir, "127.0.0.1@bk-1", "G")
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as f:
        f.write(b'{"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"Bk"}:')  # torn
    with open(path + ".bak", "wb") as f:
        f.write(encode_offsets({MessageQueue("Bk", BROKER, 0): 4}))
    options = dict(
        message_model=MessageModel.BROADCASTING,
        consume_from=FIRST,
        local_offset_store_dir=store_dir,
        instance_name="bk-1",
    )
    rec = OrderlyRecorder(delay=0)
    async with PushConsumer("G", cluster.namesrv_addr, rec.handler("1"), **options) as c:
        await c.subscribe("Bk")
        await rec.wait_for(2)
        await trio.sleep(0.3)
    assert rec.sequence(0) == [4, 5]
    # Both unreadable: the consumer refuses to start rather than consume from elsewhere.
    for name in (path, path + ".bak"):
        with open(name, "wb") as f:
            f.write(b"not json")
    with pytest.raises(ValueError, match="cannot load"):
        async with PushConsumer("G", cluster.namesrv_addr, rec.handler("1"), **options):
            pass


async def test_an_undecodable_answer_is_a_failed_call_not_a_crash(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker answering LOCK_BATCH_MQ or GET_CONSUMER_LIST_BY_GROUP with SUCCESS and a body
    that is not one (a buggy or hostile broker) fails that call: the queue is not locked by it,
    the rebalance is tried again, and the consumer keeps running (it used to end on the
    decoding error).  So is a route that is not one, and an offset answer without an offset."""
    await topics.create_topic(cluster.namesrv_addr, "Ub", queues=1, brokers=[cluster.broker_addr])
    mq = MessageQueue("Ub", BROKER, 0)
    rec = OrderlyRecorder(delay=0)
    async with PushConsumer(
        "G",
        cluster.namesrv_addr,
        rec.handler("a"),
        consume_from=FIRST,
        orderly=True,
        lock_interval=0.1,
    ) as consumer:
        await consumer.subscribe("Ub")
        assert consumer.client is not None
        client = consumer.client
        await wait_until(lambda: broker_locks(cluster, "G").get(mq) == client.client_id, timeout=10)
        real_invoke = client.invoke
        garbled: list[int] = []

        async def invoke(addr: str, request: RemotingCommand, timeout: float) -> RemotingCommand:
            response = await real_invoke(addr, request, timeout)
            if request.code in (RequestCode.LOCK_BATCH_MQ, RequestCode.GET_CONSUMER_LIST_BY_GROUP):
                garbled.append(request.code)
                response.body = b'{"lockOKMQSet":7,"consumerIdList":"x"'
            return response

        monkeypatch.setattr(client, "invoke", invoke)
        consumer._rebalance_now.set()
        await wait_until(
            lambda: (
                {RequestCode.LOCK_BATCH_MQ, RequestCode.GET_CONSUMER_LIST_BY_GROUP} <= set(garbled)
            ),
            timeout=5,
        )
        with pytest.raises(MQClientError, match="lock batch mq"):
            await consumer._lock_batch([mq])
        monkeypatch.setattr(client, "invoke", real_invoke)
        # The same of a name server's route answer (the heartbeat loop refreshes routes).
        real_remoting_invoke = client.remoting.invoke

        async def garbled_route(
            addr: str, request: RemotingCommand, timeout: float
        ) -> RemotingCommand:
            response = await real_remoting_invoke(addr, request, timeout)
            if request.code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
                response.body = b"[1,"
            return response

        monkeypatch.setattr(client.remoting, "invoke", garbled_route)
        with pytest.raises(MQClientError, match="route of Ub"):
            await client.fetch_route("Ub")
        monkeypatch.setattr(client.remoting, "invoke", real_remoting_invoke)

        # An offset answer without a number in its offset header.
        async def no_offset(addr: str, request: RemotingCommand, timeout: float) -> RemotingCommand:
            response = await real_invoke(addr, request, timeout)
            response.ext_fields.pop("offset", None)
            if request.code == RequestCode.GET_MAX_OFFSET:
                response.ext_fields["offset"] = "many"
            return response

        monkeypatch.setattr(client, "invoke", no_offset)
        for call in (
            consumer.query_offset(mq),
            consumer.max_offset(mq),
            consumer.search_offset(mq, 0),
        ):
            with pytest.raises(MQClientError, match="no offset in the answer"):
                await call
        monkeypatch.setattr(client, "invoke", real_invoke)
        await produce(cluster, "Ub", 1, 3)
        await rec.wait_for(3, timeout=10)
    assert rec.sequence(0) == [0, 1, 2]


@pytest.mark.slow
async def test_a_queue_relocked_after_a_loss_resumes_after_what_the_group_consumed_meanwhile(
    cluster: Cluster,
) -> None:
    """This consumer's lock lapses; another member locks the queue, consumes messages and
    commits past them; when this consumer holds the queue again it goes on from that commit,
    not from where it stopped (it consumed the other member's messages a second time: even the
    batch it had pulled before the loss is checked again)."""
    await topics.create_topic(cluster.namesrv_addr, "Rl", queues=1, brokers=[cluster.broker_addr])
    mq = MessageQueue("Rl", BROKER, 0)
    rec = OrderlyRecorder(delay=0)
    async with PushConsumer(
        "G",
        cluster.namesrv_addr,
        rec.handler("a"),
        consume_from=FIRST,
        orderly=True,
        lock_interval=0.2,
        lock_max_live=0.6,
    ) as consumer:
        await consumer.subscribe("Rl")
        assert consumer.client is not None
        me = consumer.client.client_id
        await wait_until(lambda: broker_locks(cluster, "G").get(mq) == me, timeout=10)
        await produce(cluster, "Rl", 1, 3)
        await rec.wait_for(3)
        await consumer.persist_offsets()

        async def no_renewal() -> None:
            pass

        real_lock_all = consumer.lock_all
        consumer.lock_all = no_renewal  # type: ignore[method-assign]
        await trio.sleep(0.3)
        manager = cluster.broker.rebalance_lock_manager
        manager.max_live = 0.1
        with trio.fail_after(5):
            while await try_lock(cluster, "G", "10.0.0.9@other", [mq]) != {mq}:
                await trio.sleep(0.05)
        manager.max_live = 60.0
        state = consumer.orderly_queues[mq]
        await wait_until(lambda: not consumer._lock_valid(state), timeout=5)
        # The other member consumes 3..5 (this consumer has them pulled, and waits for the
        # lock) and commits offset 6.
        await produce(cluster, "Rl", 1, 3, start=3)
        await trio.sleep(0.5)
        await consumer.update_offset(mq, 6)
        await unlock(cluster, "G", "10.0.0.9@other", [mq])
        consumer.lock_all = real_lock_all  # type: ignore[method-assign]
        await wait_until(lambda: broker_locks(cluster, "G").get(mq) == me, timeout=10)
        await produce(cluster, "Rl", 1, 3, start=6)
        await rec.wait_for(6, timeout=10)
        await trio.sleep(0.3)
    assert rec.sequence(0) == [0, 1, 2, 6, 7, 8]
