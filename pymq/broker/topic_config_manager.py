"""TopicConfigManager: the broker's topics (``config/topics.json``), with auto-creation.

Every change bumps the data version, is persisted before the call returns, and is announced
through ``on_change`` so the broker registers the new topic with the name servers at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pymq.broker.config import BrokerConfig
from pymq.broker.config_manager import JsonConfigManager
from pymq.common.serde import from_plain, to_plain
from pymq.common.topic import (
    AUTO_CREATE_TOPIC_KEY_TOPIC,
    BENCHMARK_TOPIC,
    OFFSET_MOVED_EVENT,
    PERM_INHERIT,
    PERM_READ,
    PERM_WRITE,
    RMQ_SYS_TRACE_TOPIC,
    RMQ_SYS_TRANS_HALF_TOPIC,
    SCHEDULE_TOPIC,
    SELF_TEST_TOPIC,
    DataVersion,
    TopicConfig,
    TopicConfigSerializeWrapper,
    is_inherited,
    reply_topic,
)

log = logging.getLogger(__name__)

# MessageStoreConfig's 18 delay levels: SCHEDULE_TOPIC_XXXX has one queue per level.
SCHEDULE_QUEUE_NUMS = 18


class TopicConfigManager(JsonConfigManager):
    file_name = "topics.json"

    def __init__(self, config_dir: str, broker_config: BrokerConfig) -> None:
        super().__init__(config_dir)
        self.broker_config = broker_config
        self.data_version = DataVersion()
        self.table: dict[str, TopicConfig] = {}
        self.system_topics: set[str] = set()
        self.on_change: Callable[[], None] = lambda: None
        self._add_system_topics()

    def _system(self, config: TopicConfig) -> None:
        self.table[config.topic_name] = config
        self.system_topics.add(config.topic_name)

    def _add_system_topics(self) -> None:
        bc = self.broker_config
        self._system(TopicConfig(SELF_TEST_TOPIC, 1, 1))
        if bc.auto_create_topic_enable:
            self._system(
                TopicConfig(
                    AUTO_CREATE_TOPIC_KEY_TOPIC,
                    bc.default_topic_queue_nums,
                    bc.default_topic_queue_nums,
                    PERM_INHERIT | PERM_READ | PERM_WRITE,
                )
            )
        self._system(TopicConfig(BENCHMARK_TOPIC, 1024, 1024))
        cluster_perm = PERM_INHERIT | (PERM_READ | PERM_WRITE if bc.cluster_topic_enable else 0)
        self._system(TopicConfig(bc.broker_cluster_name, perm=cluster_perm))
        broker_perm = PERM_INHERIT | (PERM_READ | PERM_WRITE if bc.broker_topic_enable else 0)
        self._system(TopicConfig(bc.broker_name, 1, 1, perm=broker_perm))
        self._system(TopicConfig(OFFSET_MOVED_EVENT, 1, 1))
        self._system(TopicConfig(SCHEDULE_TOPIC, SCHEDULE_QUEUE_NUMS, SCHEDULE_QUEUE_NUMS))
        if bc.trace_topic_enable:
            self._system(TopicConfig(bc.msg_trace_topic_name or RMQ_SYS_TRACE_TOPIC, 1, 1))
        self._system(TopicConfig(reply_topic(bc.broker_cluster_name), 1, 1))
        # Transactional half messages (Java 4.9.4 has it from start-up; the op topic and
        # TRANS_CHECK_MAX_TIME_TOPIC are created when first written).
        self._system(TopicConfig(RMQ_SYS_TRANS_HALF_TOPIC, 1, 1))

    # -- persistence --------------------------------------------------------------------------

    def encode(self) -> Any:
        return self._plain(self.table, self.data_version)

    @staticmethod
    def _plain(table: dict[str, TopicConfig], version: DataVersion) -> Any:
        return {
            "dataVersion": to_plain(version),
            "topicConfigTable": {name: to_plain(c) for name, c in sorted(table.items())},
        }

    def snapshot(self) -> Callable[[], bytes]:
        # A TopicConfig is frozen (replaced, never changed): a copy of the table is a snapshot,
        # and the encoding (O(topics), 0.2 s for 10,000) runs in the worker thread.
        table = dict(self.table)
        version = DataVersion(self.data_version.timestamp, self.data_version.counter)
        return lambda: self.dump(self._plain(table, version))

    def decode(self, data: Any) -> None:
        for name, raw in (data.get("topicConfigTable") or {}).items():
            self.table[name] = from_plain(raw, TopicConfig)
        if data.get("dataVersion"):
            self.data_version = from_plain(data["dataVersion"], DataVersion)

    def serialize_wrapper(self) -> TopicConfigSerializeWrapper:
        """A snapshot (the configs are frozen): safe to encode in a worker thread."""
        version = DataVersion(self.data_version.timestamp, self.data_version.counter)
        return TopicConfigSerializeWrapper(dict(self.table), version)

    # -- lookups and changes ------------------------------------------------------------------

    def select(self, topic: str) -> TopicConfig | None:
        return self.table.get(topic)

    async def _changed(self) -> None:
        self.data_version.next_version()
        await self.persist()
        self.on_change()

    async def update(self, config: TopicConfig) -> None:
        old = self.table.get(config.topic_name)
        self.table[config.topic_name] = config
        log.info("%s topic config, old: %s new: %s", "update" if old else "create", old, config)
        await self._changed()

    async def delete(self, topic: str) -> bool:
        old = self.table.pop(topic, None)
        if old is None:
            return False
        log.info("delete topic config OK, topic: %s", old)
        await self._changed()
        return True

    def auto_create_refusal(self) -> str | None:
        """Why a send may not auto-create a topic now (None: it may): the broker holds
        ``autoCreateTopicMaxCount`` topics already."""
        limit = self.broker_config.auto_create_topic_max_count
        if len(self.table) < limit:
            return None
        return (
            f"the broker holds {len(self.table)} topics, and auto-creation stops at "
            f"autoCreateTopicMaxCount ({limit}); create it with updateTopic"
        )

    async def create_in_send_message(
        self, topic: str, default_topic: str, remote: str, client_queue_nums: int, sys_flag: int
    ) -> TopicConfig | None:
        """Auto-create ``topic`` from ``default_topic`` (TBW102), as a SEND to an unknown topic."""
        existing = self.table.get(topic)
        if existing is not None:
            return existing
        template = self.table.get(default_topic)
        if template is None:
            log.warning(
                "create new topic failed, default topic %s does not exist, %s",
                default_topic,
                remote,
            )
            return None
        perm = template.perm
        if (
            default_topic == AUTO_CREATE_TOPIC_KEY_TOPIC
            and not self.broker_config.auto_create_topic_enable
        ):
            perm = PERM_READ | PERM_WRITE
        if not is_inherited(perm):
            log.warning(
                "create new topic failed, no inherit permission on %s (perm %d), %s",
                default_topic,
                perm,
                remote,
            )
            return None
        queue_nums = max(1, min(client_queue_nums, template.write_queue_nums))
        config = TopicConfig(
            topic, queue_nums, queue_nums, perm & ~PERM_INHERIT, topic_sys_flag=sys_flag
        )
        log.info(
            "create new topic by default topic %s: %s, producer %s", default_topic, config, remote
        )
        await self.update(config)
        return config

    async def create_in_send_back(
        self, topic: str, queue_nums: int, perm: int, sys_flag: int
    ) -> TopicConfig:
        """Create a retry or DLQ topic on demand (heartbeat, send-back, retry sends)."""
        existing = self.table.get(topic)
        if existing is not None:
            return existing
        config = TopicConfig(topic, queue_nums, queue_nums, perm, topic_sys_flag=sys_flag)
        await self.update(config)
        return config
