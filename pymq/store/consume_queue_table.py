"""``ConsumeQueueTable``: all consume queues of a store, and the dispatch of records into them
and into the index (Java's consumeQueueTable plus its CommitLogDispatchers).

Ownership: the table owns every ``ConsumeQueue``; the ``IndexService`` is shared with the store.
Dispatch is synchronous (loop or recovery thread); load, recovery and truncation are blocking.
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Callable, Iterator

import trio

from pymq.common.message_ext import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    tags_code,
)
from pymq.common.record import RecordInfo, property_value
from pymq.common.topic import SCHEDULE_TOPIC  # delayed messages: tags code is the due time
from pymq.store.consume_queue import ConsumeQueue
from pymq.store.index_service import IndexService
from pymq.store.mapped_file import MappedFile

log = logging.getLogger(__name__)

ArrivalListener = Callable[[str, int, int, int, int], None]


class ConsumeQueueTable:
    def __init__(
        self,
        root_dir: str,
        file_size: int,
        index: IndexService | None,
        delay_levels_ms: list[int],
    ) -> None:
        self.root_dir = root_dir
        self.file_size = file_size
        self.index = index
        self.delay_levels_ms = delay_levels_ms
        self.queues: dict[str, dict[int, ConsumeQueue]] = {}
        # Store timestamp of the newest record put into a consume queue (checkpoint logics).
        self.logics_msg_timestamp = 0

    def __iter__(self) -> Iterator[ConsumeQueue]:
        for by_id in self.queues.values():
            yield from by_id.values()

    def find(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        by_id = self.queues.get(topic)
        return by_id.get(queue_id) if by_id else None

    def find_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        by_id = self.queues.get(topic)
        if by_id is None:
            by_id = self.queues[topic] = {}
        cq = by_id.get(queue_id)
        if cq is None:
            cq = by_id[queue_id] = ConsumeQueue(topic, queue_id, self.root_dir, self.file_size)
        return cq

    def file_wanted(
        self, topic: str, queue_id: int, phy_offset: int, size: int, cq_offset: int, sys_flag: int
    ) -> int | None:
        """Where the consume-queue file that this record's entry needs starts, when its queue
        lacks it (see :meth:`ConsumeQueue.file_wanted`), else None."""
        if sys_flag & 0x4:  # PREPARED or ROLLBACK: no entry
            return None
        return self.find_or_create(topic, queue_id).file_wanted(phy_offset, size, cq_offset)

    async def prepare_file(self, topic: str, queue_id: int, start: int) -> None:
        """Create the queue's file that starts at ``start`` in a worker thread, and add it to
        the queue if it is still wanted then (else it is let go: the queue was deleted, or
        has it already).  Raises ``OSError`` when it cannot be created; nothing is changed."""
        cq = self.find_or_create(topic, queue_id)
        mf = await trio.to_thread.run_sync(_create_populated, cq, start)
        current = self.queues.get(topic, {}).get(queue_id)
        if current is cq and cq.queue.next_file_start(start) == start:
            cq.queue.add_file(mf)
        elif any(f.path == mf.path for f in cq.queue.files):
            mf.close()  # made meanwhile on the loop: keep it, drop this mapping
        else:
            await trio.to_thread.run_sync(mf.destroy)

    # --- load and recovery (blocking) ----------------------------------------------------------

    def load(self) -> None:
        if not os.path.isdir(self.root_dir):
            return
        for topic in sorted(os.listdir(self.root_dir)):
            topic_dir = os.path.join(self.root_dir, topic)
            if not os.path.isdir(topic_dir):
                continue
            for qid in sorted(os.listdir(topic_dir)):
                try:
                    queue_id = int(qid)
                except ValueError:
                    log.warning("ignoring %s: not a queue id", os.path.join(topic_dir, qid))
                    continue
                self.find_or_create(topic, queue_id).load()

    def recover(self) -> int:
        """Recover every queue; return the largest commit-log end any of them points to."""
        max_phy = 0
        for cq in self:
            cq.recover()
            max_phy = max(max_phy, cq.max_physic_offset)
        return max_phy

    def truncate_dirty(self, phy_offset: int) -> None:
        for cq in self:
            cq.truncate_dirty(phy_offset)

    def destroy_all(self) -> None:
        for cq in self:
            cq.destroy()
        self.queues.clear()

    def max_physic_offset(self) -> int:
        return max((cq.max_physic_offset for cq in self), default=-1)

    def rebuild_topic_queue_table(self, min_phy_offset: int) -> dict[tuple[str, int], int]:
        table = {}
        for cq in self:
            table[(cq.topic, cq.queue_id)] = cq.max_offset_in_queue
            cq.correct_min_offset(min_phy_offset)
        return table

    def close(self) -> None:
        for cq in self:
            cq.queue.close()

    # --- dispatch ------------------------------------------------------------------------------

    def selector(self) -> Callable[[bytes, int, int, int], bool]:
        """For recovery: a cheap test of whether a record still needs :meth:`dispatch`, from a
        snapshot of each queue's end (valid for one file's scan: dispatching a record only moves
        its queue's end up to that record, never past a later one)."""
        ends = {(cq.topic.encode(), cq.queue_id): cq.max_physic_offset for cq in self}
        index = self.index
        index_end = index.files[-1].end_phy_offset if index is not None and index.files else -1
        if index is None:
            index_end = 1 << 62

        def select(topic: bytes, queue_id: int, phy_offset: int, size: int) -> bool:
            return phy_offset + size > ends.get((topic, queue_id), -1) or phy_offset >= index_end

        return select

    def dispatch(self, info: RecordInfo, listener: ArrivalListener | None = None) -> None:
        """Put one record into its consume queue and the index; notify ``listener`` of an arrival.

        Prepared and rolled-back transactional records get no consume-queue entry (Java's
        CommitLogDispatcherBuildConsumeQueue); rolled-back ones are not indexed either.
        """
        props = info.properties
        self.dispatch_fields(
            info.topic,
            info.queue_id,
            info.physical_offset,
            info.size,
            self._tags_code(info),
            info.queue_offset,
            info.store_timestamp,
            info.sys_flag,
            property_value(props, PROPERTY_KEYS),
            property_value(props, PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX),
            listener,
        )

    def dispatch_fields(
        self,
        topic: str,
        queue_id: int,
        phy_offset: int,
        size: int,
        code: int,
        queue_offset: int,
        store_timestamp: int,
        sys_flag: int,
        keys: str | None,
        uniq_key: str | None,
        listener: ArrivalListener | None = None,
    ) -> None:
        """:meth:`dispatch` from the fields themselves (``code`` is the consume-queue tags code),
        for the put path's dispatch hints, which spare parsing the record back."""
        if not sys_flag & 0x4:  # not PREPARED (0x4) nor ROLLBACK (0xC)
            cq = self.find_or_create(topic, queue_id)
            if cq.needs(phy_offset, size):
                cq.put(phy_offset, size, code, queue_offset)
                self.logics_msg_timestamp = store_timestamp
                if listener is not None:
                    listener(topic, queue_id, queue_offset + 1, code, store_timestamp)
        index = self.index
        if index is not None and not index.already_indexed(phy_offset):
            index.build_index(topic, keys, uniq_key, phy_offset, store_timestamp, sys_flag)

    def _tags_code(self, info: RecordInfo) -> int:
        if info.topic == SCHEDULE_TOPIC:
            level_text = property_value(info.properties, PROPERTY_DELAY_TIME_LEVEL)
            if level_text:
                try:
                    level = min(int(level_text), len(self.delay_levels_ms))
                except ValueError:
                    level = 0
                if level > 0:
                    return info.store_timestamp + self.delay_levels_ms[level - 1]
        return tags_code(property_value(info.properties, PROPERTY_TAGS))


def _create_populated(cq: ConsumeQueue, start: int) -> MappedFile:
    """Blocking (a worker thread): the queue's file at ``start``, its first page faulted in.
    The first write into a fresh file faults for milliseconds (ext4 converts its allocated
    blocks; the file's later pages fault in microseconds), a cost that would otherwise fall on
    the event loop's dispatch.  One page, not the allocated chunk: thousands of idle queues
    would each keep 64 KiB resident."""
    mf = cq.queue.create_file(start)
    mf.populate(0, min(mf.allocated, mmap.PAGESIZE))
    return mf
