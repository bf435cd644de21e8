"""SlaveSynchronize: a slave copies its master's metadata every 10 s (after 3 s).

Topic configs and subscription groups are replaced only when the master's data version differs
from the slave's; consumer offsets and delay offsets are taken as the master has them.  Each
applied table is persisted, so a slave restarted while its master is down still knows them.
"""

from __future__ import annotations

import logging
import struct
from typing import TYPE_CHECKING

from pymq.broker.subscription_group_manager import SubscriptionGroupConfig
from pymq.broker.timer import CHECKPOINT_BODY, DELIVERED_PHY_OFFSET
from pymq.common.serde import from_plain, loads_lenient
from pymq.common.topic import DataVersion, TopicConfig
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.remoting.errors import RemotingError

if TYPE_CHECKING:
    from pymq.broker.controller import BrokerController

log = logging.getLogger(__name__)

# BrokerController.initialize(): a slave syncs first after 3 s, then every 10 s.
SLAVE_SYNC_INITIAL_DELAY = 3.0
SLAVE_SYNC_PERIOD = 10.0
# The master's timer checkpoint, more often (RocketMQ 5: every 3 s): what a promoted slave may
# deliver a second time is what its master delivered since the last one it followed.
TIMER_CHECKPOINT_SYNC_PERIOD = 1.0


class SlaveSynchronize:
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker

    async def _fetch(self, code: int) -> dict | None:
        broker = self.broker
        if not broker.master_addr or broker.client is None:
            return None
        try:
            response = await broker.client.invoke(
                broker.master_addr, RemotingCommand.request(code), 5.0
            )
        except RemotingError as exc:
            log.warning("slave sync %s from %s failed: %s", code, broker.master_addr, exc)
            return None
        if response.code != ResponseCode.SUCCESS or not response.body:
            return None
        return loads_lenient(response.body)

    async def sync_all(self) -> None:
        await self.sync_topic_config()
        await self.sync_consumer_offset()
        await self.sync_delay_offset()
        await self.sync_subscription_group_config()

    async def sync_topic_config(self) -> None:
        data = await self._fetch(RequestCode.GET_ALL_TOPIC_CONFIG)
        if data is None:
            return
        manager = self.broker.topic_config_manager
        version = from_plain(data.get("dataVersion") or {}, DataVersion)
        if version == manager.data_version:
            return
        manager.table = {
            name: from_plain(raw, TopicConfig)
            for name, raw in (data.get("topicConfigTable") or {}).items()
        }
        manager.data_version = version
        await manager.persist()
        log.info("update slave topic config from master, %s", self.broker.master_addr)

    async def sync_consumer_offset(self) -> None:
        data = await self._fetch(RequestCode.GET_ALL_CONSUMER_OFFSET)
        if data is None:
            return
        manager = self.broker.consumer_offset_manager
        manager.offset_table = {}
        manager.decode(data)
        await manager.persist()

    async def sync_delay_offset(self) -> None:
        data = await self._fetch(RequestCode.GET_ALL_DELAY_OFFSET)
        if data is None:
            return
        schedule = self.broker.schedule
        schedule.offset_table = {}
        schedule.decode(data)
        await schedule.persist()

    async def sync_timer_checkpoint(self) -> None:
        """The master's timer delivery point (GET_TIMER_CHECK_POINT, RocketMQ 5's
        syncTimerCheckPoint), for the slave's timer store to follow (pymq/broker/timer.py)."""
        broker = self.broker
        if not broker.master_addr or broker.client is None or broker.timer.timers is None:
            return
        request = RemotingCommand.request(RequestCode.GET_TIMER_CHECK_POINT)
        try:
            response = await broker.client.invoke(broker.master_addr, request, 3.0)
        except RemotingError as exc:
            log.debug("timer checkpoint from %s failed: %s", broker.master_addr, exc)
            return
        delivered_at = response.ext_fields.get(DELIVERED_PHY_OFFSET)
        if response.code != ResponseCode.SUCCESS or delivered_at is None:
            return  # no timer store there, or not a pymq master: nothing safe to follow
        try:
            read_ms = CHECKPOINT_BODY.unpack_from(response.body)[0]
            broker.timer.follow_master(read_ms, int(delivered_at))
        except (ValueError, struct.error) as exc:
            log.warning("bad timer checkpoint from %s: %s", broker.master_addr, exc)

    async def sync_subscription_group_config(self) -> None:
        data = await self._fetch(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
        if data is None:
            return
        manager = self.broker.subscription_group_manager
        version = from_plain(data.get("dataVersion") or {}, DataVersion)
        if version == manager.data_version:
            return
        manager.table = {
            name: from_plain(raw, SubscriptionGroupConfig)
            for name, raw in (data.get("subscriptionGroupTable") or {}).items()
        }
        manager.data_version = version
        await manager.persist()
        log.info("update slave subscription group from master, %s", self.broker.master_addr)
