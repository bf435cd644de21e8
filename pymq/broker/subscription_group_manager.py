"""SubscriptionGroupManager: consumer group settings (subscriptionGroup.json), auto-created."""

from __future__ import annotations

import logging
from typing import Any

import attrs

from pymq.broker.config_manager import JsonConfigManager
from pymq.common.serde import from_plain, to_plain
from pymq.common.topic import DataVersion, check_queue_nums

log = logging.getLogger(__name__)

# MixAll's system consumer groups, present on every broker.
SYSTEM_GROUPS = (
    "TOOLS_CONSUMER",
    "FILTERSRV_CONSUMER",
    "SELF_TEST_C_GROUP",
    "CID_ONS-HTTP-PROXY",
    "CID_ONSAPI_PULL",
    "CID_ONSAPI_PERMISSION",
    "CID_ONSAPI_OWNER",
    "CID_SYS_RMQ_TRANS",
)


@attrs.define
class SubscriptionGroupConfig:
    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = attrs.field(default=1, validator=check_queue_nums)
    retry_max_times: int = 16
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True
    # RocketMQ 5's consumeMessageOrderly: the group's 5.x consumers receive a FIFO topic's
    # queues in order, one batch in flight per queue (pymq.proxy.pop).  None (4.x's configs,
    # which lack it) is left out of the JSON and means false.
    consume_message_orderly: bool | None = None


class SubscriptionGroupManager(JsonConfigManager):
    file_name = "subscriptionGroup.json"

    def __init__(self, config_dir: str, auto_create: bool = True) -> None:
        super().__init__(config_dir)
        self.auto_create = auto_create
        self.data_version = DataVersion()
        self.table: dict[str, SubscriptionGroupConfig] = {
            name: SubscriptionGroupConfig(name) for name in SYSTEM_GROUPS
        }

    def encode(self) -> Any:
        return {
            "dataVersion": to_plain(self.data_version),
            "subscriptionGroupTable": {n: to_plain(c) for n, c in sorted(self.table.items())},
        }

    def decode(self, data: Any) -> None:
        for name, raw in (data.get("subscriptionGroupTable") or {}).items():
            self.table[name] = from_plain(raw, SubscriptionGroupConfig)
        if data.get("dataVersion"):
            self.data_version = from_plain(data["dataVersion"], DataVersion)

    async def find_or_create(self, group: str) -> SubscriptionGroupConfig | None:
        config = self.table.get(group)
        if config is None and self.auto_create:
            config = SubscriptionGroupConfig(group)
            self.table[group] = config
            log.info("auto create a subscription group, %s", config)
            self.data_version.next_version()
            await self.persist()
        return config

    async def update(self, config: SubscriptionGroupConfig) -> None:
        old = self.table.get(config.group_name)
        self.table[config.group_name] = config
        log.info(
            "%s subscription group config, old: %s new: %s",
            "update" if old else "create",
            old,
            config,
        )
        self.data_version.next_version()
        await self.persist()

    async def disable_consume(self, group: str) -> bool:
        """Java's disableConsume (protectBroker): the group may no longer pull; True if it
        could until now."""
        config = self.table.get(group)
        if config is None or not config.consume_enable:
            return False
        config.consume_enable = False
        self.data_version.next_version()
        await self.persist()
        return True

    async def delete(self, group: str) -> bool:
        if self.table.pop(group, None) is None:
            return False
        self.data_version.next_version()
        await self.persist()
        return True
