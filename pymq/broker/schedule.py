"""ScheduleMessageService: delayed delivery through SCHEDULE_TOPIC_XXXX.

The store rewrites a message with a DELAY level into queue ``level - 1`` of SCHEDULE_TOPIC_XXXX,
its consume-queue tag code being the delivery time.  One task per level walks its queue in order,
waits until each entry is due, and puts the message back into its real topic and queue.
Progress per level is kept in ``config/delayOffset.json``.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from pymq.broker.config_manager import JsonConfigManager
from pymq.common.message_ext import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    MessageExt,
    moved_to,
)
from pymq.common.topic import SCHEDULE_TOPIC
from pymq.store.message_store import DefaultMessageStore

log = logging.getLogger(__name__)

# ScheduleMessageService: wait before retrying a level whose queue is empty or whose put failed.
IDLE_RECHECK_SECONDS = 0.1
FAILED_PUT_RETRY_SECONDS = 10.0


class ScheduleMessageService(JsonConfigManager):
    file_name = "delayOffset.json"

    def __init__(self, config_dir: str, store: DefaultMessageStore) -> None:
        super().__init__(config_dir)
        self.store = store
        self.delay_levels_ms = store.config.delay_levels_ms()
        self.offset_table: dict[int, int] = {}
        self._arrivals: dict[int, trio.Event] = {}

    def encode(self) -> Any:
        return {"offsetTable": {str(level): o for level, o in sorted(self.offset_table.items())}}

    def decode(self, data: Any) -> None:
        for level, offset in (data.get("offsetTable") or {}).items():
            self.offset_table[int(level)] = int(offset)

    def notify_arrival(self, topic: str, queue_id: int) -> None:
        if topic != SCHEDULE_TOPIC:
            return
        event = self._arrivals.pop(queue_id + 1, None)
        if event is not None:
            event.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            for level in range(1, len(self.delay_levels_ms) + 1):
                nursery.start_soon(self._deliver_level, level)
            task_status.started()

    async def _wait(self, level: int, seconds: float) -> None:
        event = self._arrivals.setdefault(level, trio.Event())
        with trio.move_on_after(max(0.0, seconds)):
            await event.wait()

    async def _deliver_level(self, level: int) -> None:
        queue_id = level - 1
        delay_ms = self.delay_levels_ms[level - 1]
        store = self.store
        while True:
            cq = store.consume_queues.find(SCHEDULE_TOPIC, queue_id)
            offset = self.offset_table.get(level, 0)
            if cq is None or offset >= cq.max_offset_in_queue:
                await self._wait(level, 1.0)
                continue
            if offset < cq.min_offset_in_queue:
                offset = self.offset_table[level] = cq.min_offset_in_queue
            entry = cq.get_entry(offset)
            if entry is None:
                await self._wait(level, IDLE_RECHECK_SECONDS)
                continue
            phy_offset, size, deliver_at = entry
            now = store.clock_ms()
            # A deliver time further out than the level's delay is a clock jump: correct it.
            deliver_at = min(deliver_at, now + delay_ms)
            if deliver_at > now:
                await trio.sleep((deliver_at - now) / 1000)
                continue
            msg = store.look_message_by_offset(phy_offset, size)
            if msg is None:
                log.error(
                    "delayed message at %d is gone, skipping level %d offset %d",
                    phy_offset,
                    level,
                    offset,
                )
                self.offset_table[level] = offset + 1
                continue
            result = await store.put(self._real_message(msg))
            if not result.appended:
                log.error(
                    "delivering delayed message failed: %s %s, retrying in %.0f s",
                    result.status.value,
                    result.reason,
                    FAILED_PUT_RETRY_SECONDS,
                )
                await trio.sleep(FAILED_PUT_RETRY_SECONDS)
                continue
            self.offset_table[level] = offset + 1

    @staticmethod
    def _real_message(msg: MessageExt) -> MessageExt:
        props = dict(msg.properties)
        props.pop(PROPERTY_DELAY_TIME_LEVEL, None)
        topic = props.get(PROPERTY_REAL_TOPIC, msg.topic)
        queue_id = int(props.get(PROPERTY_REAL_QUEUE_ID, "0") or 0)
        return moved_to(msg, topic, queue_id, props)
