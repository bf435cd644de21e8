"""A consume queue's files are made in a worker thread: the reput service stops before a
record whose queue lacks the file its entry goes to (a new queue's first, or the next past a
full one), has it made off the event loop, then dispatches on.  Before, a burst of sends to new
topics created one file per topic on the loop (a hostile client's oneway sends to new topics
held the loop 94-160 ms)."""

from __future__ import annotations

import os
import threading

import pytest
import trio
import trio.testing

from pymq.store import PutMessageStatus
from pymq.store.mapped_file import MappedFile
from tests.store.helpers import make_message, running_store, small_config


@pytest.fixture
def creations(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """Every store file created from now on: (path, made on the event loop's thread)."""
    made: list[tuple[str, bool]] = []
    real = MappedFile.create.__func__  # type: ignore[attr-defined]

    def create(cls, path, *args, **kwargs):  # type: ignore[no-untyped-def]
        made.append((path, threading.current_thread() is threading.main_thread()))
        return real(cls, path, *args, **kwargs)

    monkeypatch.setattr(MappedFile, "create", classmethod(create))
    return made


async def dispatched(store, topic: str, queue_id: int, count: int) -> None:  # type: ignore[no-untyped-def]
    with trio.fail_after(10):
        while store.get_max_offset_in_queue(topic, queue_id) < count:
            await trio.sleep(0.005)


async def test_new_queues_and_their_next_files_are_made_off_the_loop(root, creations) -> None:
    # Consume-queue files of 4 entries: the 5th entry of a queue needs its second file.
    config = small_config(root, mapped_file_size_consume_queue=4 * 20)
    async with running_store(config) as store:
        await trio.testing.wait_all_tasks_blocked()
        creations.clear()  # the commit log's first file and the index's, made at start
        store.begin_run()
        for n in range(20):  # a run of sends to 20 new topics, 6 to the first
            result = store.put_now(make_message(topic=f"New{n}", body=b"m"))
            assert result.status is PutMessageStatus.PUT_OK
        for _ in range(5):
            assert store.put_now(make_message(topic="New0")).is_ok
        store.end_run()
        for n in range(20):
            await dispatched(store, f"New{n}", 0, 6 if n == 0 else 1)
        queue_files = [(p, on_loop) for p, on_loop in creations if "consumequeue" in p]
        assert len(queue_files) == 21  # 20 first files and New0's second
        assert not [p for p, on_loop in queue_files if on_loop]
        # A read stops at a queue file's end (as Java's): 4 entries, then the second file's 2.
        assert store.get_message("G", "New0", 0, 0, 32).message_count == 4
        assert store.get_message("G", "New0", 0, 4, 32).message_count == 2


async def test_a_queue_deleted_while_its_file_is_made_keeps_no_file(root, monkeypatch) -> None:
    async with running_store(small_config(root)) as store:
        await trio.testing.wait_all_tasks_blocked()
        table = store.consume_queues
        real = table.find_or_create(  # the queue object exists; its file is being made
            "Gone", 0
        ).queue.create_file

        def create_then_delete(start: int):  # type: ignore[no-untyped-def]
            mf = real(start)
            trio.from_thread.run_sync(table.queues.pop, "Gone")
            return mf

        monkeypatch.setattr(table.queues["Gone"][0].queue, "create_file", create_then_delete)
        cq = table.queues["Gone"][0]
        await table.prepare_file("Gone", 0, 0)
        assert cq.queue.files == []
        assert not os.path.exists(os.path.join(cq.queue.directory, "00000000000000000000"))
