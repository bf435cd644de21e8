"""Long polling: held PULL requests wake when a message arrives in their queue.

A held request waits on the queue's current :class:`trio.Event`; the store's arrival listener
(called by reput right after it dispatches a message) sets that event and replaces it, so every
pull waiting on the queue re-runs within milliseconds of the arrival.  A waiter on every queue
of a topic (a 5.x receive reads them all) waits on the event of its :data:`ANY_QUEUE`, which an
arrival in any of its queues sets: one event, and no task, per queue.
"""

from __future__ import annotations

from collections.abc import Iterable

import trio

# The queue id of the event an arrival in any queue of the topic sets (RocketMQ 5's proxy pops
# from queue -1, its broker's every queue).
ANY_QUEUE = -1


class PullRequestHoldService:
    def __init__(self, pinned: Iterable[str] = ()) -> None:
        self._events: dict[tuple[str, int], trio.Event] = {}
        # The topics with a queue that has an event (counted by queue), and the ``pinned`` ones
        # (counted once more, so never dropped): the arrivals anyone may wait for.  The broker
        # gives it to the store as its listener's topics, so reput calls the listener only for
        # them (DefaultMessageStore.set_arrival_listener).
        self.topics: dict[str, int] = dict.fromkeys(pinned, 1)

    def waiter(self, topic: str, queue_id: int) -> trio.Event:
        key = (topic, queue_id)
        event = self._events.get(key)
        if event is None:
            event = self._events[key] = trio.Event()
            self.topics[topic] = self.topics.get(topic, 0) + 1
        return event

    def release(self, topic: str, queue_id: int, event: trio.Event) -> None:
        """A held pull stopped waiting on ``event`` without an arrival (its suspension ran out,
        or its connection closed): the queue's event is dropped if nobody else waits on it, so
        its topic is no longer reported as awaited."""
        key = (topic, queue_id)
        if self._events.get(key) is not event or event.statistics().tasks_waiting:
            return
        del self._events[key]
        self._drop_topic(topic)

    def _drop_topic(self, topic: str) -> None:
        left = self.topics[topic] - 1
        if left:
            self.topics[topic] = left
        else:
            del self.topics[topic]

    def notify_message_arriving(
        self,
        topic: str,
        queue_id: int,
        logic_offset: int = 0,
        tags_code: int = 0,
        store_timestamp: int = 0,
    ) -> None:
        event = self._events.pop((topic, queue_id), None)
        if event is not None:
            self._drop_topic(topic)
            event.set()
        event = self._events.pop((topic, ANY_QUEUE), None)
        if event is not None:
            self._drop_topic(topic)
            event.set()
