"""PULL_MESSAGE (11) with long polling.

A pull that finds nothing new, from a client that allows suspension (sysFlag bit 1), is held until
a message arrives in its queue (woken by the store's reput within milliseconds) or the client's
``suspendTimeoutMillis`` runs out, then runs once more and answers.  Status mapping, checks and
remarks follow RocketMQ 4.9.4's PullMessageProcessor; every answer carries nextBeginOffset,
minOffset, maxOffset and suggestWhichBrokerId, which the C++ client needs on every code.

The broker to pull from next (``suggestWhichBrokerId``), on masters and slaves alike, is Java
4.9.4's (:func:`suggest_broker_id`):

=================  ===================================  ======================================
slaveReadEnable    the store's suggestPullingFromSlave  suggestWhichBrokerId
=================  ===================================  ======================================
false (default)    either                               0, the master
true               false                                the group's ``brokerId`` (default 0)
true               true                                 the group's ``whichBrokerWhenConsumeSlowly``
                                                        (default 1)
=================  ===================================  ======================================

The store suggests a slave when the commit-log bytes after the last consume-queue entry the pull
read exceed ``accessMessageInMemoryMaxRatio`` % of the machine's memory (the consumer reads what
the page cache no longer holds).  A slave with slaveReadEnable=false answers as a master does,
with the store's code and the messages found, and sends the consumer back to the master: Java
4.9.4 sets PULL_RETRY_IMMEDIATELY there but overwrites it with the store's code a few lines on,
and that is how consumers keep consuming from a slave while their master is down.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from pymq.broker.consumer_filter_manager import ConsumerFilterData, build_filter_data
from pymq.broker.message_filter import RecordFilter, record_filter
from pymq.common.consumer import MessageModel, SubscriptionData
from pymq.common.route import MASTER_ID
from pymq.common.topic import RETRY_GROUP_TOPIC_PREFIX, is_readable
from pymq.remoting.channel import Channel
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import ResponseCode
from pymq.remoting.headers import PullMessageRequestHeader, decode_request
from pymq.store.config import BrokerRole
from pymq.store.results import GetMessageResult, GetMessageStatus

if TYPE_CHECKING:
    from pymq.broker.context import BrokerContext
    from pymq.broker.subscription_group_manager import SubscriptionGroupConfig

log = logging.getLogger(__name__)

# PullSysFlag bits.
FLAG_COMMIT_OFFSET = 0x1
FLAG_SUSPEND = 0x2
FLAG_SUBSCRIPTION = 0x4
FLAG_CLASS_FILTER = 0x8

NOT_FOUND = ResponseCode.PULL_NOT_FOUND


def _code_for(result: GetMessageResult, offset: int) -> int:
    status = result.status
    if status is GetMessageStatus.FOUND:
        return ResponseCode.SUCCESS
    if status in (GetMessageStatus.MESSAGE_WAS_REMOVING, GetMessageStatus.NO_MATCHED_MESSAGE):
        return ResponseCode.PULL_RETRY_IMMEDIATELY
    if status in (GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, GetMessageStatus.NO_MESSAGE_IN_QUEUE):
        return ResponseCode.PULL_OFFSET_MOVED if offset != 0 else NOT_FOUND
    if status in (GetMessageStatus.OFFSET_FOUND_NULL, GetMessageStatus.OFFSET_OVERFLOW_ONE):
        return NOT_FOUND
    return ResponseCode.PULL_OFFSET_MOVED  # OFFSET_OVERFLOW_BADLY, OFFSET_TOO_SMALL


def suggest_broker_id(
    slave_read_enable: bool, group_config: SubscriptionGroupConfig, from_slave: bool
) -> int:
    """suggestWhichBrokerId as Java 4.9.4 decides it (the table in the module docstring); the
    broker's role plays no part."""
    if not slave_read_enable:
        return MASTER_ID
    if from_slave:
        return group_config.which_broker_when_consume_slowly
    return group_config.broker_id


Filters = tuple[frozenset[int] | None, RecordFilter | None]
"""A pull's tag-code filter and record filter (see PullProcessor.pull_message's select)."""


class PullProcessor:
    """PULL_MESSAGE in its steps: access checks, the subscription, the offset commit, the get
    (held while the queue has nothing new), the response."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx

    async def pull_message(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        head: PullMessageRequestHeader = decode_request(req)
        checked = await self._check_access(channel, req, head)
        if isinstance(checked, RemotingCommand):
            return checked
        group_config = checked

        async def select() -> Filters | RemotingCommand:
            """The subscription and its filters as they are now: a held pull looks again
            with the group's current ones when it wakes, as Java's wake-up runs the whole
            request again (a consumer that narrowed its SQL92 filter meanwhile must not be
            served by the one it had when the pull was held)."""
            selected = await self._subscription(req, head, group_config)
            if isinstance(selected, RemotingCommand):
                return selected
            subscription, filter_data = selected
            tag_filter = None
            if subscription.is_tag_type and not head.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                tag_filter = subscription.tag_filter()
            records = await record_filter(
                head.topic,
                head.consumer_group,
                filter_data,
                self.ctx.consumer_filter_manager,
                self.ctx.broker_config.filter_support_retry,
            )
            return tag_filter, records

        filters = await select()
        if isinstance(filters, RemotingCommand):
            return filters
        # This group's 5.x (POP) consumers leave the queue to the 4.x client pulling it.
        hold = head.suspend_timeout_millis / 1000 if head.sys_flag & FLAG_SUSPEND else 0.0
        self.ctx.queue_pullers.pulled(
            head.consumer_group, head.topic, head.queue_id, trio.current_time(), hold, channel
        )
        is_slave = self.ctx.store.config.broker_role is BrokerRole.SLAVE
        if head.sys_flag & FLAG_COMMIT_OFFSET and not is_slave:
            self._commit_offset(channel, head)
        got = await self._get_message(head, filters, select)
        if isinstance(got, RemotingCommand):
            return got
        result, code = got
        return self._response(req, head, group_config, result, code)

    # -- the steps ----------------------------------------------------------------------------

    async def _check_access(
        self, channel: Channel, req: RemotingCommand, head: PullMessageRequestHeader
    ) -> SubscriptionGroupConfig | RemotingCommand:
        """The group's config, or the refusal: broker or topic not readable, group missing or
        disabled, topic missing, queue id out of range."""
        ctx = self.ctx
        bc = ctx.broker_config
        group, topic, queue_id = head.consumer_group, head.topic, head.queue_id
        if not is_readable(bc.broker_permission):
            return req.response(
                ResponseCode.NO_PERMISSION,
                f"the broker[{bc.broker_ip1}] pulling message is forbidden",
            )
        group_config = await ctx.subscription_group_manager.find_or_create(group)
        if group_config is None:
            return req.response(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group [{group}] does not exist; create it with updateSubGroup "
                "or enable autoCreateSubscriptionGroup",
            )
        if not group_config.consume_enable:
            return req.response(
                ResponseCode.NO_PERMISSION, f"subscription group no permission, {group}"
            )
        config = ctx.topic_config_manager.select(topic)
        if config is None:
            return req.response(
                ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!"
            )
        if not is_readable(config.perm):
            return req.response(
                ResponseCode.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden"
            )
        if queue_id < 0 or queue_id >= config.read_queue_nums:
            return req.response(
                ResponseCode.SYSTEM_ERROR,
                f"queueId[{queue_id}] is illegal, topic:[{topic}] "
                f"topicConfig.readQueueNums:[{config.read_queue_nums}] "
                f"consumer:[{channel.remote_address}]",
            )
        return group_config

    async def _subscription(
        self,
        req: RemotingCommand,
        head: PullMessageRequestHeader,
        group_config: SubscriptionGroupConfig,
    ) -> tuple[SubscriptionData, ConsumerFilterData | None] | RemotingCommand:
        """The subscription the pull filters by, the request's own (sysFlag bit 4) or the one
        the group's heartbeat registered, with its SQL92 filter; or the refusal: missing, stale,
        not parsable, or by SQL92 on a broker without enablePropertyFilter."""
        filter_data: ConsumerFilterData | None = None
        if head.sys_flag & FLAG_SUBSCRIPTION:
            try:
                subscription = SubscriptionData.build(
                    head.topic, head.subscription, head.sub_version, head.expression_type
                )
            except ValueError:
                return req.response(
                    ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                    "parse the consumer's subscription failed",
                )
            if not subscription.is_tag_type:
                if not self.ctx.broker_config.enable_property_filter:
                    return self._no_property_filter(req, subscription)  # nothing compiled
                # Java 4.9.4 answers a bad expression here unfiltered; pymq refuses it.
                filter_data = await build_filter_data(
                    head.topic,
                    head.consumer_group,
                    subscription.sub_string,
                    subscription.expression_type,
                    head.sub_version,
                    0,
                )
                if filter_data is None:
                    return req.response(
                        ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                        "parse the consumer's subscription failed",
                    )
        else:
            registered = self._registered_subscription(req, head, group_config)
            if isinstance(registered, RemotingCommand):
                return registered
            subscription = registered
            if not subscription.is_tag_type:
                filter_data = self.ctx.consumer_filter_manager.get(head.topic, head.consumer_group)
                if filter_data is None:
                    return req.response(
                        ResponseCode.FILTER_DATA_NOT_EXIST,
                        "The broker's consumer filter data is not exist!"
                        "Your expression may be wrong!",
                    )
                if filter_data.client_version < head.sub_version:
                    return req.response(
                        ResponseCode.FILTER_DATA_NOT_LATEST,
                        "the consumer's consumer filter data not latest",
                    )
        if not subscription.is_tag_type and not self.ctx.broker_config.enable_property_filter:
            return self._no_property_filter(req, subscription)
        return subscription, filter_data

    @staticmethod
    def _no_property_filter(
        req: RemotingCommand, subscription: SubscriptionData
    ) -> RemotingCommand:
        return req.response(
            ResponseCode.SYSTEM_ERROR,
            f"The broker does not support consumer to filter message by "
            f"{subscription.expression_type}",
        )

    def _registered_subscription(
        self,
        req: RemotingCommand,
        head: PullMessageRequestHeader,
        group_config: SubscriptionGroupConfig,
    ) -> SubscriptionData | RemotingCommand:
        group = head.consumer_group
        group_info = self.ctx.consumer_manager.get(group)
        if group_info is None:
            return req.response(
                ResponseCode.SUBSCRIPTION_NOT_EXIST, "the consumer's group info not exist"
            )
        if (
            not group_config.consume_broadcast_enable
            and group_info.message_model is MessageModel.BROADCASTING
        ):
            return req.response(
                ResponseCode.NO_PERMISSION,
                f"the consumer group[{group}] can not consume by broadcast way",
            )
        found = group_info.find_subscription(head.topic)
        if found is None:
            return req.response(
                ResponseCode.SUBSCRIPTION_NOT_EXIST, "the consumer's subscription not exist"
            )
        if found.sub_version < head.sub_version:
            return req.response(
                ResponseCode.SUBSCRIPTION_NOT_LATEST, "the consumer's subscription not latest"
            )
        return found

    def _commit_offset(self, channel: Channel, head: PullMessageRequestHeader) -> None:
        """The offset the client piggybacks on its pull (sysFlag bit 1; masters only)."""
        if head.commit_offset >= 0:
            self.ctx.consumer_offset_manager.commit_offset(
                channel.remote_address,
                head.consumer_group,
                head.topic,
                head.queue_id,
                head.commit_offset,
            )

    async def _get_message(
        self,
        head: PullMessageRequestHeader,
        filters: Filters,
        select: Callable[[], Awaitable[Filters | RemotingCommand]],
    ) -> tuple[GetMessageResult, int] | RemotingCommand:
        """The store's answer and its response code.  With sysFlag bit 2 a pull that finds
        nothing new is held until a message arrives in the queue or the suspend time runs out;
        each look after a wake-up takes the filters ``select`` gives then (or its refusal)."""
        tag_filter, records = filters
        ctx = self.ctx
        group, topic, queue_id = head.consumer_group, head.topic, head.queue_id
        offset, max_nums = head.queue_offset, head.max_msg_nums
        store = ctx.store
        result = store.get_message(group, topic, queue_id, offset, max_nums, tag_filter, records)
        code = _code_for(result, offset)
        if code != NOT_FOUND or not head.sys_flag & FLAG_SUSPEND:
            return result, code
        bc = ctx.broker_config
        timeout_ms = (
            head.suspend_timeout_millis if bc.long_polling_enable else bc.short_polling_time_mills
        )
        deadline = trio.current_time() + max(0, timeout_ms) / 1000
        while code == NOT_FOUND:
            event = ctx.pull_hold.waiter(topic, queue_id)
            try:
                with trio.move_on_at(deadline) as scope:
                    await event.wait()
            finally:  # not woken by an arrival: the queue is no longer awaited by this pull
                ctx.pull_hold.release(topic, queue_id, event)
            # Woken by an arrival, or one last look at the timeout as Java's wake-up does.
            now = await select()
            if isinstance(now, RemotingCommand):
                return now
            tag_filter, records = now
            result = store.get_message(
                group, topic, queue_id, offset, max_nums, tag_filter, records
            )
            code = _code_for(result, offset)
            if scope.cancelled_caught:
                break
        return result, code

    def _response(
        self,
        req: RemotingCommand,
        head: PullMessageRequestHeader,
        group_config: SubscriptionGroupConfig,
        result: GetMessageResult,
        code: int,
    ) -> RemotingCommand:
        """The answer: messages on SUCCESS (counted, and the group's fall-behind recorded),
        otherwise a remark; every code carries the offsets and the broker to pull from next."""
        ctx = self.ctx
        suggest = suggest_broker_id(
            ctx.broker_config.slave_read_enable, group_config, result.suggest_pulling_from_slave
        )
        header = {
            "nextBeginOffset": result.next_begin_offset,
            "minOffset": result.min_offset,
            "maxOffset": result.max_offset,
            "suggestWhichBrokerId": suggest,
        }
        ctx.stats.on_pull(code == ResponseCode.SUCCESS)
        if code == ResponseCode.SUCCESS:
            ctx.stats.on_get(
                result.message_count, result.buffer_total_size, head.topic, head.consumer_group
            )
            if result.queue_offsets:  # protectBroker: the bytes this group left behind
                ctx.fall_behind.record(
                    head.consumer_group, head.topic, head.queue_id, result.fall_behind
                )
            return req.response(code, None, header, result.body())
        remarks: dict[int, str] = {
            NOT_FOUND: "no new message in this queue",
            ResponseCode.PULL_RETRY_IMMEDIATELY: result.status.name,
            ResponseCode.PULL_OFFSET_MOVED: f"the offset {head.queue_offset} is out of range "
            f"[{result.min_offset}, {result.max_offset}]",
        }
        return req.response(code, remarks.get(code), header)
