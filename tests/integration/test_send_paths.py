"""The broker's fast send paths: answered in the connection's reader (ASYNC_FLUSH), answered by
the group commit once durable (SYNC_FLUSH), and the client's callback-style send_async."""

from __future__ import annotations

import collections
import os
from typing import Any

import pytest
import trio

from pymq.client import MQClientError, Producer, PullConsumer, topics
from pymq.client.producer import Message, SendResult
from pymq.common.consumer import MessageQueue
from pymq.common.message_id import decode_offset_msg_id
from pymq.common.record import decode_records
from pymq.embedded import Cluster, open_cluster
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import ResponseCode
from pymq.testing import TEST_PROPERTIES
from tests.helpers import StuckDisk, c_functions

native_extension = c_functions()


class Results:
    """Collects send_async callbacks; ``wait`` returns once ``n`` arrived."""

    def __init__(self) -> None:
        self.ok: list[SendResult] = []
        self.errors: list[Exception] = []
        self._arrived = trio.Event()

    def __call__(self, result: SendResult | None, error: Exception | None) -> None:
        if error is not None:
            self.errors.append(error)
        else:
            assert result is not None
            self.ok.append(result)
        self._arrived.set()

    async def wait(self, n: int, timeout: float = 30) -> None:
        with trio.fail_after(timeout):
            while len(self.ok) + len(self.errors) < n:
                self._arrived = trio.Event()
                await self._arrived.wait()


def count_raw_answers(monkeypatch) -> list[bool]:  # type: ignore[no-untyped-def]
    """Whether each send answer the client's run handler met was taken from its frame (False
    for the frame it stops at, left to the usual path)."""
    from pymq.remoting import client as client_module

    taken: list[bool] = []
    real = client_module.raw_send_answers

    def counting(channel, buf: bytes, bounds: list[int], first: int, stop: int):  # type: ignore[no-untyped-def]
        joined, left, decoded = real(channel, buf, bounds, first, stop)
        taken.extend([True] * (left - first) + [False] * (left < stop))
        return joined, left, decoded

    monkeypatch.setattr(client_module, "raw_send_answers", counting)
    return taken


async def test_send_async_stores_every_message_once(pymq_cluster: Cluster, monkeypatch) -> None:
    from pymq.remoting import channel as channel_module

    cluster = pymq_cluster
    await topics.create_topic(cluster.namesrv_addr, "Async", brokers=[cluster.broker_addr])
    results = Results()
    # The answers are read from their frames and given to send_async's on_fields (the
    # client's raw answer path) when the C extension is built.
    from pymq.remoting import client as client_module

    read = channel_module._send_answer_fields
    taken: list[bool] = []
    real = client_module.raw_send_answers

    def counting(channel, buf: bytes, bounds: list[int], first: int, stop: int):  # type: ignore[no-untyped-def]
        joined, left, decoded = real(channel, buf, bounds, first, stop)
        taken.extend([joined == b""] * (left - first))
        return joined, left, decoded

    monkeypatch.setattr(client_module, "raw_send_answers", counting)
    async with Producer("P", pymq_cluster.namesrv_addr) as producer:
        for i in range(300):  # all in flight at once: no task per message
            await producer.send_async(Message("Async", b"m-%d" % i, keys=f"k{i}"), results)
        await results.wait(300)
    assert not results.errors
    if read is not None:
        assert taken == [True] * 300
    assert {r.status for r in results.ok} == {"SEND_OK"}
    by_queue: dict[int, list[int]] = collections.defaultdict(list)
    for r in results.ok:
        by_queue[r.queue.queue_id].append(r.queue_offset)
    # Each queue's offsets are 0..n-1: nothing lost, nothing stored twice.
    assert all(sorted(offsets) == list(range(len(offsets))) for offsets in by_queue.values())
    ids = {r.msg_id: r for r in results.ok}
    await cluster.broker.store.reput.do_reput()  # dispatch follows the append asynchronously
    async with PullConsumer("Puller", pymq_cluster.namesrv_addr) as puller:
        pulled = []
        for queue_id in by_queue:
            mq = MessageQueue("Async", "broker-a", queue_id)
            offset = 0
            while offset < len(by_queue[queue_id]):  # a pull returns at most 32
                found = await puller.pull(mq, "*", offset, 32)
                pulled += found.messages
                offset = found.next_begin_offset
    assert sorted(m.body for m in pulled) == sorted(b"m-%d" % i for i in range(300))
    for m in pulled:
        sent = ids[m.unique_key]
        assert m.msg_id == sent.offset_msg_id and m.queue_offset == sent.queue_offset


async def test_send_async_reports_refusals(pymq_cluster: Cluster) -> None:
    await topics.create_topic(pymq_cluster.namesrv_addr, "Few", brokers=[pymq_cluster.broker_addr])
    results = Results()
    async with Producer("P", pymq_cluster.namesrv_addr) as producer:
        await producer.send_async(
            Message("Few", b"x"), results, queue=MessageQueue("Few", "broker-a", 99)
        )
        await results.wait(1)
    (error,) = results.errors
    assert isinstance(error, MQClientError) and error.code == ResponseCode.SYSTEM_ERROR
    assert "queueId[99] is illegal" in str(error)


@pytest.mark.parametrize("size", [4095, 4096, 10_000])
async def test_send_async_compresses_large_bodies_as_send_does(
    pymq_cluster: Cluster, size: int
) -> None:
    """A plain message's body from 4 KiB (COMPRESS_OVER) on is stored zlib-compressed with the
    COMPRESSED sys flag by send_async as by send; below it, as sent."""
    topic = f"Zip{size}"
    await topics.create_topic(pymq_cluster.namesrv_addr, topic, brokers=[pymq_cluster.broker_addr])
    body = b"compressible " * (size // 13) + b"x" * (size % 13)
    results = Results()
    async with Producer("P", pymq_cluster.namesrv_addr) as producer:
        await producer.send_async(Message(topic, body), results)
        await results.wait(1)
        await producer.send(Message(topic, body))
    store = pymq_cluster.broker.store
    records = [
        m
        for m in decode_records(store.commitlog.get_data(store.commitlog.min_offset) or b"")
        if m.topic == topic
    ]
    assert len(records) == 2
    compressed = size >= 4096
    for record in records:
        assert bool(record.sys_flag & 0x1) is compressed
        assert (len(record.body) < size) is compressed


async def test_sync_flush_answers_only_once_durable(tmp_path, monkeypatch) -> None:
    disk = StuckDisk(monkeypatch)
    properties = dict(TEST_PROPERTIES, flushDiskType="SYNC_FLUSH")
    async with open_cluster(
        str(tmp_path), namesrv_port=0, broker_port=0, bind_address="127.0.0.1",
        properties=properties,
    ) as cluster:  # fmt: skip
        await topics.create_topic(cluster.namesrv_addr, "Durable", brokers=[cluster.broker_addr])
        store = cluster.broker.store
        covered: list[bool] = []
        results = Results()
        # The plain sends are taken by the raw path (answered later by the group commit).
        send = cluster.broker.send_processor
        raw_served: list[bool] = []  # each frame: held for the group commit by the raw path

        read_run = send.send_run  # the connections' run handler (their route's run)

        def counting_run(*args: Any, **kwargs: Any) -> tuple[bytes, int, RemotingCommand | None]:
            joined, left, cmd = read_run(*args, **kwargs)
            raw_served.extend([joined == b""] * (left - args[3]))
            return joined, left, cmd

        for server in (cluster.broker.server, cluster.broker.fast_server):
            server._run_handler = counting_run  # what the connections opened next offer runs

        def check(result: SendResult | None, error: Exception | None) -> None:
            if result is not None:
                # Acknowledged means on disk: the flushed position is at or past the record's
                # end (its first four bytes are its size).
                phy = decode_offset_msg_id(result.offset_msg_id)[2]
                head = store.commitlog.get_data(phy, 4) or b""
                size = int.from_bytes(head, "big") if len(head) == 4 else 1 << 62
                covered.append(store.commitlog.queue.flushed_where >= phy + size)
            results(result, error)

        async with Producer("P", cluster.namesrv_addr) as producer:
            # The topic's first send is checked by the usual path (and the frames after it in
            # its read with it): then every send is the raw path's.
            assert (await producer.send(Message("Durable", b"first"))).status == "SEND_OK"
            raw_served.clear()
            for i in range(200):
                await producer.send_async(Message("Durable", b"d-%d" % i), check)
            await results.wait(200)
            assert not results.errors and len(covered) == 200 and all(covered)
            assert {r.status for r in results.ok} == {"SEND_OK"}
            if native_extension is not None:
                assert raw_served.count(True) == 200
            raw_served.clear()

            # A sync that hangs: the answer is FLUSH_DISK_TIMEOUT after syncFlushTimeout, and
            # the message is stored all the same.
            store.config.sync_flush_timeout = 200
            disk.stuck = True
            slow = await producer.send(Message("Durable", b"slow disk"))
            assert slow.status == "FLUSH_DISK_TIMEOUT"
            assert slow.msg_id and slow.offset_msg_id  # stored all the same: its answer says where
            if native_extension is not None:
                assert raw_served == [True]
            disk.stuck = False
            disk.release.set()


async def test_task_path_answers_with_the_queue_asked_for(pymq_cluster: Cluster) -> None:
    """A delayed send to a retry topic goes through the task path and into
    SCHEDULE_TOPIC_XXXX; the answer still names the queue the producer asked for, as Java's."""
    async with Producer("P", pymq_cluster.namesrv_addr) as producer:
        result = await producer.send(
            Message("%RETRY%G", b"later", delay_level=3),
            queue=MessageQueue("%RETRY%G", "broker-a", 0),
        )
    assert result.status == "SEND_OK"
    assert result.queue.queue_id == 0  # not the schedule queue of level 3 (2)


async def test_batches_are_stored_by_the_fast_path_and_read_back(
    pymq_cluster: Cluster, monkeypatch
) -> None:
    """A plain batch is written by the C batch path (the item-by-item decoder is not called);
    one with a non-ASCII tag goes item by item; both read back whole, keys and tags indexed."""
    from pymq.broker.processors.send import SendProcessor

    await topics.create_topic(
        pymq_cluster.namesrv_addr, "FastBatch", brokers=[pymq_cluster.broker_addr]
    )
    decoded: list[int] = []
    general = SendProcessor._batch_messages

    def counting(self, channel, req, header, queue_id):  # type: ignore[no-untyped-def]
        decoded.append(queue_id)
        return general(self, channel, req, header, queue_id)

    monkeypatch.setattr(SendProcessor, "_batch_messages", counting)
    queue = MessageQueue("FastBatch", "broker-a", 1)
    async with Producer("P", pymq_cluster.namesrv_addr) as producer:
        # The topic's first put goes the general way (its name is checked there).
        await producer.send_batch([Message("FastBatch", b"first")], queue=queue)
        decoded.clear()
        plain = [Message("FastBatch", b"p%d" % i, tags="T", keys=f"k{i}") for i in range(8)]
        result = await producer.send_batch(plain, queue=queue)
        assert (result.status, result.queue_offset) == ("SEND_OK", 1)
        assert decoded == []  # served in one C call
        wide = [Message("FastBatch", b"w%d" % i, tags="\u6807\u7b7e") for i in range(3)]
        result = await producer.send_batch(wide, queue=queue)
        assert (result.status, result.queue_offset) == ("SEND_OK", 9)
        assert decoded == [1]
    store = pymq_cluster.broker.store
    await store.reput.do_reput()
    async with PullConsumer("Reader", pymq_cluster.namesrv_addr) as puller:
        found = await puller.pull(queue, "*", 0, 32)
    assert [m.body for m in found.messages] == (
        [b"first"] + [b"p%d" % i for i in range(8)] + [b"w%d" % i for i in range(3)]
    )
    assert [m.queue_offset for m in found.messages] == list(range(12))
    assert all(m.properties.get("CLUSTER") for m in found.messages)
    assert found.messages[3].tags == "T" and found.messages[10].tags == "\u6807\u7b7e"
    hits = store.query_message("FastBatch", "k5", 32, 0, 2**62).messages
    assert [decode_records(raw)[0].body for raw in hits] == [b"p5"]


async def test_a_nul_inside_a_property_is_stored_as_sent(pymq_cluster: Cluster) -> None:
    """The C++ client sometimes sends a UNIQ_KEY with a NUL inside; Java's broker stores it and
    so does pymq (single and batch sends, read back by a pull).  Only a NUL where a torn write
    leaves zeros is refused (tests/store/test_nul_properties.py)."""
    cluster = pymq_cluster
    await topics.create_topic(cluster.namesrv_addr, "Nul", brokers=[cluster.broker_addr])
    odd = "0100007F0000F8D700005B8EA6 \0" + "4C00"
    async with Producer("P", cluster.namesrv_addr) as producer:
        mq = MessageQueue("Nul", "broker-a", 0)
        one = await producer.send(Message("Nul", b"single", properties={"X": odd}), queue=mq)
        many = await producer.send_batch(
            [Message("Nul", b"b%d" % i, properties={"X": odd + str(i)}) for i in range(3)],
            queue=mq,
        )
    assert one.status == many.status == "SEND_OK"
    await cluster.broker.store.reput.do_reput()
    async with PullConsumer("Puller", cluster.namesrv_addr) as puller:
        found = await puller.pull(mq, "*", 0, 32)
    assert [(m.body, m.properties["X"]) for m in found.messages] == [
        (b"single", odd),
        *[(b"b%d" % i, odd + str(i)) for i in range(3)],
    ]


async def test_send_async_follows_a_refreshed_route(pymq_cluster: Cluster) -> None:
    """send_async reads its cached queues only while the topic's route is the client's: once a
    refresh replaces the route (the topic cut to 2 queues), the new queues are used."""
    cluster = pymq_cluster
    await topics.create_topic(
        cluster.namesrv_addr, "Shrinks", queues=8, brokers=[cluster.broker_addr]
    )
    async with Producer("P", cluster.namesrv_addr) as producer:
        first = Results()
        for i in range(16):
            await producer.send_async(Message("Shrinks", b"a%d" % i), first)
        await first.wait(16)
        assert not first.errors
        assert {r.queue.queue_id for r in first.ok} == set(range(8))
        await topics.create_topic(
            cluster.namesrv_addr, "Shrinks", queues=2, brokers=[cluster.broker_addr]
        )
        assert producer.client is not None
        await producer.client.fetch_route("Shrinks")  # as the periodic refresh does
        second = Results()
        for i in range(16):
            await producer.send_async(Message("Shrinks", b"b%d" % i), second)
        await second.wait(16)
        assert not second.errors
        assert {r.queue.queue_id for r in second.ok} == {0, 1}


async def test_awaited_sends_and_batches_are_answered_from_their_frames(
    pymq_cluster: Cluster, monkeypatch
) -> None:
    """send and send_batch write their request as one frame and, with the C extension built,
    take a plain SEND_OK from the answer's frame (no response command); their results say
    what the broker stored, as the usual decoding would."""

    await topics.create_topic(
        pymq_cluster.namesrv_addr, "Awaited", brokers=[pymq_cluster.broker_addr]
    )
    taken = count_raw_answers(monkeypatch)
    results: list[SendResult] = []
    async with Producer("P", pymq_cluster.namesrv_addr) as producer:
        for i in range(6):
            results.append(await producer.send(Message("Awaited", b"s%d" % i, tags="T")))
        batch = [Message("Awaited", b"b%d" % i, keys=f"k{i}") for i in range(5)]
        results.append(
            await producer.send_batch(batch, queue=MessageQueue("Awaited", "broker-a", 2))
        )
        sent = taken.count(True)
        # A refusal still comes back as MQClientError (its answer is not a plain SEND_OK).
        with pytest.raises(MQClientError) as refused:
            await producer.send(Message("Awaited", os.urandom(4 * 1024 * 1024 + 1)))
    assert refused.value.code == ResponseCode.MESSAGE_ILLEGAL
    if native_extension is not None:
        assert sent == 7  # every answer but the refusal's read from its frame
    assert {r.status for r in results} == {"SEND_OK"}
    assert results[-1].queue == MessageQueue("Awaited", "broker-a", 2)
    assert results[-1].msg_id.count(",") == 4  # a batch's ids, as the producer made them
    store = pymq_cluster.broker.store
    await store.reput.do_reput()
    async with PullConsumer("Reader", pymq_cluster.namesrv_addr) as puller:
        for r in results[:6]:
            found = await puller.pull(r.queue, "*", r.queue_offset, 1)
            (m,) = found.messages
            assert (m.unique_key, m.msg_id, m.tags) == (r.msg_id, r.offset_msg_id, "T")
            assert decode_offset_msg_id(r.offset_msg_id)[2] == m.commitlog_offset
        found = await puller.pull(results[-1].queue, "*", results[-1].queue_offset, 32)
    assert [m.body for m in found.messages] == [b"b%d" % i for i in range(5)]


async def test_send_batch_async_stores_each_batch_whole_and_reports_refusals(
    pymq_cluster: Cluster, monkeypatch
) -> None:
    """send_batch_async (Java's send(Collection<Message>, SendCallback)): every batch stored
    once, whole and in order, its answer read from the frame and given to the callback as
    send_batch's SendResult; a batch send_batch refuses raises before anything is sent; the
    broker's refusal reaches the callback."""

    cluster = pymq_cluster
    await topics.create_topic(cluster.namesrv_addr, "AsyncBatch", brokers=[cluster.broker_addr])
    taken = count_raw_answers(monkeypatch)
    results = Results()
    bodies: dict[str, list[bytes]] = {}
    async with Producer("P", cluster.namesrv_addr) as producer:
        for b in range(40):  # all in flight at once
            batch = [
                Message("AsyncBatch", b"b%d-%d" % (b, i), keys=f"k{b}-{i}", tags="T")
                for i in range(8)
            ]
            if b == 7:  # a property the C body writer leaves to Python: the same batch
                batch[3] = Message("AsyncBatch", b"b7-3", properties={"X": "\u00e9"})
            await producer.send_batch_async(batch, results)
            bodies[f"batch-{b}"] = [m.body for m in batch]
        await results.wait(40)
        for refused in (
            [],
            [Message("AsyncBatch", b"a"), Message("Other", b"b")],
            [Message("AsyncBatch", b"a", delay_level=2)],
        ):
            with pytest.raises(ValueError):
                await producer.send_batch_async(refused, results)
        bad = Results()
        await producer.send_batch_async(
            [Message("AsyncBatch", b"x")], bad, queue=MessageQueue("AsyncBatch", "broker-a", 99)
        )
        await bad.wait(1)
    assert not results.errors and len(results.ok) == 40  # the ValueErrors sent nothing
    (error,) = bad.errors
    assert isinstance(error, MQClientError) and error.code == ResponseCode.SYSTEM_ERROR
    assert "queueId[99] is illegal" in str(error)
    if native_extension is not None:
        assert taken.count(True) == 40  # every SEND_OK read from its frame
    by_queue: dict[int, list[int]] = collections.defaultdict(list)
    for r in results.ok:
        assert r.status == "SEND_OK" and r.msg_id.count(",") == 7
        by_queue[r.queue.queue_id].append(r.queue_offset)
    # Each queue holds whole batches, one after another: offsets 0, 8, 16, ...
    assert all(sorted(o) == list(range(0, 8 * len(o), 8)) for o in by_queue.values())
    await cluster.broker.store.reput.do_reput()
    async with PullConsumer("Puller", cluster.namesrv_addr) as puller:
        seen = []
        for r in results.ok:
            found = await puller.pull(r.queue, "*", r.queue_offset, 8)
            assert [m.unique_key for m in found.messages] == r.msg_id.split(",")
            assert [m.msg_id for m in found.messages] == r.offset_msg_id.split(",")
            seen.append([m.body for m in found.messages])
    assert sorted(seen) == sorted(bodies.values())


async def test_a_queue_of_another_topic_is_refused_before_anything_is_sent(
    pymq_cluster: Cluster,
) -> None:
    """As Java's producer (``message's topic not equal mq's topic``): a send or batch, awaited
    or not, given a queue of another topic raises at once and stores nothing (Java reports the
    asynchronous ones to the callback; pymq raises before sending, as for its other checks)."""
    cluster = pymq_cluster
    for topic in ("Mine", "Theirs"):
        await topics.create_topic(cluster.namesrv_addr, topic, brokers=[cluster.broker_addr])
    theirs = MessageQueue("Theirs", "broker-a", 0)
    results = Results()
    async with Producer("P", cluster.namesrv_addr) as producer:
        calls = (
            producer.send(Message("Mine", b"x"), queue=theirs),
            producer.send_batch([Message("Mine", b"x")], queue=theirs),
            producer.send_async(Message("Mine", b"x"), results, queue=theirs),
            producer.send_batch_async([Message("Mine", b"x")], results, queue=theirs),
        )
        for call in calls:
            with pytest.raises(MQClientError) as refused:
                await call
            assert "message's topic not equal mq's topic" in str(refused.value)
        ok = await producer.send(Message("Theirs", b"y"), queue=theirs)
    assert ok.status == "SEND_OK" and not results.ok and not results.errors
    assert cluster.broker.stats.put_msgs == 1


async def test_a_selectors_queue_of_another_topic_carries_the_messages_topic(
    pymq_cluster: Cluster,
) -> None:
    """Java's sendSelectImpl does not compare topics: sendKernelImpl writes the message's topic
    into the request and takes only the broker and queue id of the selected queue.  The message
    must be stored in its own topic, as the SendResult says, not in the selected queue's; so is
    a oneway send's to a queue of another topic."""
    cluster = pymq_cluster
    for topic in ("Mine", "Theirs"):
        await topics.create_topic(cluster.namesrv_addr, topic, brokers=[cluster.broker_addr])
    async with Producer("P", cluster.namesrv_addr) as producer:
        result = await producer.send(
            Message("Mine", b"x"), selector=lambda _: MessageQueue("Theirs", "broker-a", 1)
        )
        # Java's sendOneway(msg, mq) does not compare topics either.
        await producer.send_oneway(
            Message("Mine", b"y"), queue=MessageQueue("Theirs", "broker-a", 1)
        )
        assert result.status == "SEND_OK"
        assert result.queue == MessageQueue("Mine", "broker-a", 1)
        store = cluster.broker.store
        with trio.fail_after(10):
            while store.get_max_offset_in_queue("Mine", 1) < 2:
                await trio.sleep(0.01)
    assert store.get_max_offset_in_queue("Theirs", 1) == 0
