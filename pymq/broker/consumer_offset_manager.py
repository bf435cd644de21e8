"""ConsumerOffsetManager: committed offsets per ``topic@group`` and queue (consumerOffset.json)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from typing import Any

from pymq.broker.config_manager import JsonConfigManager

log = logging.getLogger(__name__)

TOPIC_GROUP_SEPARATOR = "@"


class ConsumerOffsetManager(JsonConfigManager):
    file_name = "consumerOffset.json"

    def __init__(self, config_dir: str) -> None:
        super().__init__(config_dir)
        self.offset_table: dict[str, dict[int, int]] = {}

    def encode(self) -> Any:
        return {
            "offsetTable": {
                key: {str(q): o for q, o in sorted(queues.items())}
                for key, queues in sorted(self.offset_table.items())
            }
        }

    def decode(self, data: Any) -> None:
        for key, queues in (data.get("offsetTable") or {}).items():
            self.offset_table[key] = {int(q): int(o) for q, o in queues.items()}

    def commit_offset(
        self, client: str, group: str, topic: str, queue_id: int, offset: int
    ) -> None:
        key = topic + TOPIC_GROUP_SEPARATOR + group
        queues = self.offset_table.setdefault(key, {})
        previous = queues.get(queue_id)
        if previous is not None and offset < previous:
            log.debug(
                "update consumer offset less than store. client=%s key=%s queue=%d %d < %d",
                client,
                key,
                queue_id,
                offset,
                previous,
            )
        queues[queue_id] = offset

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        queues = self.offset_table.get(topic + TOPIC_GROUP_SEPARATOR + group)
        if queues is None:
            return -1
        return queues.get(queue_id, -1)

    def query_offsets(self, group: str, topic: str) -> dict[int, int]:
        return dict(self.offset_table.get(topic + TOPIC_GROUP_SEPARATOR + group, {}))

    def query_min_offset_in_all_group(
        self, topic: str, filter_groups: Collection[str], min_offset: Callable[[str, int], int]
    ) -> dict[int, int]:
        """Per queue of ``topic``, the smallest offset a group has committed, over the groups
        not in ``filter_groups`` and the offsets not behind the queue's ``min_offset(topic,
        queue_id)`` (ConsumerOffsetManager.queryMinOffsetInAllGroup, without its side effect:
        Java removes the filtered groups' offsets from its table while it reads)."""
        lowest: dict[int, int] = {}
        for key, queues in self.offset_table.items():
            key_topic, _, group = key.partition(TOPIC_GROUP_SEPARATOR)
            if key_topic != topic or group in filter_groups:
                continue
            for queue_id, offset in queues.items():
                if offset >= min_offset(topic, queue_id):
                    known = lowest.get(queue_id)
                    lowest[queue_id] = offset if known is None else min(known, offset)
        return dict(sorted(lowest.items()))

    def groups_of_topic(self, topic: str) -> set[str]:
        return {
            key.split(TOPIC_GROUP_SEPARATOR, 1)[1]
            for key in self.offset_table
            if key.split(TOPIC_GROUP_SEPARATOR, 1)[0] == topic
        }

    def topics_of_group(self, group: str) -> set[str]:
        return {
            key.rsplit(TOPIC_GROUP_SEPARATOR, 1)[0]
            for key in self.offset_table
            if key.rsplit(TOPIC_GROUP_SEPARATOR, 1)[-1] == group
        }

    def remove_topic(self, topic: str) -> None:
        for key in [k for k in self.offset_table if k.split(TOPIC_GROUP_SEPARATOR, 1)[0] == topic]:
            del self.offset_table[key]
