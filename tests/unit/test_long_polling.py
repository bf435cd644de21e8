"""PullRequestHoldService: held pulls' events, and the topics the broker's arrival listener
is asked for (the store calls the listener only for those: DefaultMessageStore.
set_arrival_listener)."""

from __future__ import annotations

from pymq.broker.long_polling import ANY_QUEUE, PullRequestHoldService


def test_topics_are_those_with_a_waiting_queue_and_the_pinned_ones() -> None:
    hold = PullRequestHoldService(pinned=("SCHEDULE_TOPIC_XXXX",))
    assert hold.topics == {"SCHEDULE_TOPIC_XXXX": 1}
    a0 = hold.waiter("A", 0)
    assert hold.waiter("A", 0) is a0  # one event per queue, counted once
    a1 = hold.waiter("A", 1)
    b0 = hold.waiter("B", 0)
    hold.waiter("SCHEDULE_TOPIC_XXXX", 3)
    assert hold.topics == {"SCHEDULE_TOPIC_XXXX": 2, "A": 2, "B": 1}
    hold.notify_message_arriving("A", 0)
    assert a0.is_set() and not a1.is_set() and not b0.is_set()
    assert hold.topics == {"SCHEDULE_TOPIC_XXXX": 2, "A": 1, "B": 1}
    hold.notify_message_arriving("A", 0)  # nobody waits there now: nothing changes
    hold.notify_message_arriving("C", 0)
    assert hold.topics == {"SCHEDULE_TOPIC_XXXX": 2, "A": 1, "B": 1}
    hold.notify_message_arriving("A", 1)
    hold.notify_message_arriving("B", 0)
    hold.notify_message_arriving("SCHEDULE_TOPIC_XXXX", 3)
    assert a1.is_set() and b0.is_set()
    assert hold.topics == {"SCHEDULE_TOPIC_XXXX": 1}  # pinned: never dropped
    again = hold.waiter("A", 0)  # a new event after an arrival
    assert again is not a0 and hold.topics["A"] == 1


async def test_a_pull_that_stops_waiting_releases_its_queue() -> None:
    import trio
    import trio.testing

    hold = PullRequestHoldService(pinned=("SCHEDULE_TOPIC_XXXX",))
    event = hold.waiter("A", 0)
    hold.release("A", 0, event)  # nobody waits on it: dropped
    assert hold.topics == {"SCHEDULE_TOPIC_XXXX": 1}
    hold.release("A", 0, event)  # twice: nothing more
    assert hold.topics == {"SCHEDULE_TOPIC_XXXX": 1}

    shared = hold.waiter("B", 1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(shared.wait)  # another pull still waits on the queue
        await trio.testing.wait_all_tasks_blocked()
        hold.release("B", 1, shared)
        assert hold.topics["B"] == 1  # kept for the other pull
        hold.release("B", 2, hold.waiter("B", 2))  # an event nobody waits on: dropped
        assert hold.topics["B"] == 1
        hold.notify_message_arriving("B", 1)
    assert hold.topics == {"SCHEDULE_TOPIC_XXXX": 1}
    stale = hold.waiter("C", 0)
    hold.notify_message_arriving("C", 0)
    fresh = hold.waiter("C", 0)
    hold.release("C", 0, stale)  # an older event than the queue's: the queue's stays
    assert hold.topics["C"] == 1 and not fresh.is_set()


def test_a_topic_waiter_is_set_by_an_arrival_in_any_queue_and_released_like_a_queues() -> None:
    """The 5.x receive's wait (every queue of the topic): one event for the topic, counted in
    ``topics`` as a queue's is, set and replaced by an arrival in any of its queues."""
    hold = PullRequestHoldService()
    any_queue = hold.waiter("A", ANY_QUEUE)
    assert hold.waiter("A", ANY_QUEUE) is any_queue
    q3 = hold.waiter("A", 3)
    assert hold.topics == {"A": 2}
    hold.notify_message_arriving("B", 0)
    assert not any_queue.is_set()
    hold.notify_message_arriving("A", 7)  # a queue nobody waits on by itself
    assert any_queue.is_set() and not q3.is_set()
    assert hold.topics == {"A": 1}
    again = hold.waiter("A", ANY_QUEUE)
    assert again is not any_queue
    hold.release("A", ANY_QUEUE, any_queue)  # an older event: the topic's stays
    assert hold.topics == {"A": 2}
    hold.release("A", ANY_QUEUE, again)  # nobody waits on it: dropped
    assert hold.topics == {"A": 1}
    hold.release("A", 3, q3)
    assert hold.topics == {}
