"""Dispatch at the end of a connection's run (MessageStore.begin_run / end_run): the run's puts
are dispatched by end_run in the calling task, without waking the reput task, unless that task
is busy or dispatch is blocked; puts outside a run wake it as before."""

from __future__ import annotations

import pytest
import trio

from pymq.store import PutMessageStatus
from pymq.store.reput import TURN_BUDGET
from tests.store.helpers import make_message, running_store, small_config


async def settle() -> None:
    for _ in range(5):
        await trio.lowlevel.checkpoint()


async def started(store) -> None:  # type: ignore[no-untyped-def]
    """The store running, its test queue's first file made (a new queue's first entry is the
    reput task's: the file is created in a worker thread first)."""
    await settle()
    await store.consume_queues.prepare_file("TopicTest", 0, 0)


def count_wakeups(store) -> list[int]:  # type: ignore[no-untyped-def]
    """The reput task's wakeups from now on, one entry each."""
    wakes: list[int] = []
    real_wakeup = store.reput.wakeup

    def counted() -> None:
        wakes.append(1)
        real_wakeup()

    store.reput.wakeup = counted
    return wakes


def put(store, i: int = 0):  # type: ignore[no-untyped-def]
    result = store.put_now(make_message(queue_id=0, body=b"m%d" % i))
    assert result.status is PutMessageStatus.PUT_OK
    return result


async def test_a_runs_puts_are_dispatched_at_its_end_without_the_reput_task(root) -> None:
    async with running_store(small_config(root, resident_trim_interval=0)) as store:
        await started(store)
        wakes = count_wakeups(store)
        store.begin_run()
        for i in range(3):
            put(store, i)
        # Deferred: nothing dispatched yet, nobody woken.
        assert store.get_max_offset_in_queue("TopicTest", 0) == 0
        store.end_run()
        assert store.get_max_offset_in_queue("TopicTest", 0) == 3
        assert not wakes  # nobody woken
        got = store.get_message("G", "TopicTest", 0, 0, 32)
        assert got.message_count == 3
        # Outside a run a put wakes the reput task, which dispatches it.
        put(store, 3)
        assert len(wakes) == 1
        await settle()
        assert store.get_max_offset_in_queue("TopicTest", 0) == 4


async def test_a_busy_or_blocked_reput_is_woken_instead(root) -> None:
    async with running_store(small_config(root, resident_trim_interval=0)) as store:
        await started(store)
        # The reput task in a dispatch (it holds the lock across its yields): left to it.
        async with store.reput._lock:
            store.begin_run()
            put(store, 0)
            store.end_run()
            assert store.reput.woken
            assert store.get_max_offset_in_queue("TopicTest", 0) == 0
        await settle()
        assert store.get_max_offset_in_queue("TopicTest", 0) == 1
        # A run whose records go on in the next commit-log file: end_run stops at the file's
        # end, the rest is the reput task's.
        store.begin_run()
        for i in range(600):
            put(store, i)
        assert len(store.commitlog.queue.files) > 1
        store.end_run()
        assert store.reput.woken
        assert 1 < store.get_max_offset_in_queue("TopicTest", 0) < 601
        await settle()
        with trio.fail_after(5):
            while store.get_max_offset_in_queue("TopicTest", 0) < 601:
                await trio.sleep(0.01)


async def test_a_run_cut_short_by_a_bad_frame_still_dispatches(pymq_cluster) -> None:
    """The broker's connections call end_run in a finally: a send followed, in the same read,
    by a frame that does not decode (which closes the connection) is still dispatched."""
    import struct

    from pymq.remoting.codec import RemotingCommand, encode
    from pymq.remoting.codes import RequestCode
    from pymq.remoting.headers import SendMessageRequestHeader

    store = pymq_cluster.broker.store
    topic = "RunEndTopic"
    ext = SendMessageRequestHeader.v2_ext("G", topic, 0, 0, 1_700_000_000_000, 0, "", False)
    send = encode(RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, ext, b"hello"))
    garbage = struct.pack(">ii", 8, 4) + b"\xff\xff\xff\xff"  # JSON header of no JSON

    async def exchange(data: bytes) -> bytes:
        stream = await trio.open_tcp_stream("127.0.0.1", pymq_cluster.broker.port)
        answer = b""
        async with stream:
            await stream.send_all(data)
            with trio.move_on_after(1):  # the answer; a bad frame then closes the connection
                while chunk := await stream.receive_some(65536):
                    answer += chunk
        return answer

    assert await exchange(send)  # the topic is created (by a task), later sends are inline
    with trio.fail_after(5):
        while store.get_max_offset_in_queue(topic, 0) < 1:
            await trio.sleep(0.01)
    before = store.get_max_offset_in_queue(topic, 0)
    stream = await trio.open_tcp_stream("127.0.0.1", pymq_cluster.broker.port)
    async with stream:
        await stream.send_all(send + garbage)
        answer = b""
        with trio.move_on_after(1):  # the answer; the connection is closed after it
            while chunk := await stream.receive_some(65536):
                answer += chunk
        assert answer  # the send was served before the bad frame ended the connection
    with trio.fail_after(5):
        while store.get_max_offset_in_queue(topic, 0) <= before:
            await trio.sleep(0.01)
    assert not store._in_run


async def test_a_blocked_or_failing_dispatch_is_left_to_the_reput_task(root, monkeypatch) -> None:
    """Dispatch stopped (a file that could not be made) or a dispatch that raises: end_run
    wakes the reput task, which retries, and the reader that called it is not failed."""
    async with running_store(small_config(root, resident_trim_interval=0)) as store:
        await started(store)
        store.reput.blocked = "no space left (simulated)"
        store.begin_run()
        store.put_message_times_total += 1  # as a put in the run would count it
        store.end_run()
        assert store.reput.woken
        store.reput.blocked = None
        await settle()
        store.reput.woken = False

        def broken(limit: int) -> tuple[bool, bool]:
            raise RuntimeError("a dispatch bug (simulated)")

        monkeypatch.setattr(store.reput, "_dispatch_some", broken)
        store.begin_run()
        store.put_message_times_total += 1
        store.end_run()  # does not raise into the connection's reader
        assert store.reput.woken
        monkeypatch.undo()  # before the woken reput task runs: it dispatches for real
        await settle()


def big_files(root, commit_log: int = 16 * 1024 * 1024):  # type: ignore[no-untyped-def]
    """Files that hold every record of these tests (no file's end stops a dispatch)."""
    return small_config(
        root,
        resident_trim_interval=0,
        mapped_file_size_commit_log=commit_log,
        mapped_file_size_consume_queue=20 * 300_000,  # Java's: no queue rolls in a run
        max_hash_slot_num=4096,
        max_index_num=65536,
    )


@pytest.mark.parametrize("per_run", ["full batches", "past a turn"])
async def test_a_runs_records_are_dispatched_whole_at_its_end(root, per_run: str) -> None:
    """A connection's run is at most SERVE_BATCH requests; of batches of 32 that is 1,024
    hinted records, all dispatched by end_run in the same turn, and so are a run's records
    past a turn's budget (batches of any size: 32 of 100 messages are 3,200 records).  A
    smaller budget let dispatch fall behind the puts turn after turn until its hints
    overflowed and every later record was parsed (a batch publish fell from 160k to 60-70k
    msgs/s)."""
    from pymq.remoting.channel import SERVE_BATCH

    records = SERVE_BATCH * 32 if per_run == "full batches" else TURN_BUDGET + 500
    async with running_store(big_files(root)) as store:
        await started(store)
        wakes = count_wakeups(store)
        for run in range(3):
            store.begin_run()
            for i in range(records):
                put(store, run * records + i)
            store.end_run()
            assert store.reput.reput_from_offset == store.commitlog.max_offset, run
        assert not wakes  # nobody woken
        assert store.get_max_offset_in_queue("TopicTest", 0) == 3 * records


async def test_runs_keep_up_while_the_reput_task_is_in_a_dispatch(root) -> None:
    """While the reput task is in a dispatch (a backlog past a turn's budget: a commit-log file
    rolled in a run, a put outside a run), end_run leaves its records to it.  Runs bigger than a
    turn's budget (32 batches of 100) must not outpace it turn after turn: each turn takes on
    the records the runs left to it, so the backlog shrinks instead of growing until the put
    path's hints overflow."""
    async with running_store(big_files(root, 64 * 1024 * 1024)) as store:
        await started(store)
        backlog = TURN_BUDGET * 2
        for i in range(backlog):  # outside a run: left to the reput task, woken
            put(store, i)
        assert store.reput.woken
        per_run = 32 * 100
        total = backlog
        for _ in range(30):
            # The reput task takes its turn (one: Trio runs tasks in a random order within a
            # batch, so a fixed count of checkpoints gives it none, one or two).
            with trio.fail_after(5):
                while store.reput._owed:
                    await trio.lowlevel.checkpoint()
            store.begin_run()
            for _ in range(32):
                batch = [make_message(queue_id=0, body=b"x") for _ in range(100)]
                assert store.put_now(batch).status is PutMessageStatus.PUT_OK
            store.end_run()
            total += per_run
        behind = total - store.get_max_offset_in_queue("TopicTest", 0)
        assert behind <= per_run, behind
        await settle()
        with trio.fail_after(10):
            while store.get_max_offset_in_queue("TopicTest", 0) < total:
                await trio.sleep(0.01)
