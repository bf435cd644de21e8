"""Client and consumer management: HEART_BEAT (34), UNREGISTER_CLIENT (35), CHECK_CLIENT_CONFIG
(46), GET_CONSUMER_LIST_BY_GROUP (38), QUERY_CONSUMER_OFFSET (14), UPDATE_CONSUMER_OFFSET (15),
LOCK_BATCH_MQ (41) and UNLOCK_BATCH_MQ (42)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from pymq.broker.acl import heartbeat_resources
from pymq.broker.client_manager import ClientChannelInfo
from pymq.broker.consumer_filter_manager import compile_expression_async
from pymq.common.consumer import (
    CheckClientRequestBody,
    ConsumerList,
    HeartbeatData,
    LockBatchRequestBody,
    LockBatchResponseBody,
    UnlockBatchRequestBody,
)
from pymq.common.serde import from_json_body, to_json
from pymq.common.topic import PERM_READ, PERM_WRITE, retry_topic
from pymq.filter.sql92 import Sql92Error
from pymq.remoting.channel import Channel
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import ResponseCode
from pymq.remoting.headers import (
    ConsumerGroupHeader,
    OffsetResponseHeader,
    QueryConsumerOffsetRequestHeader,
    UnregisterClientRequestHeader,
    UpdateConsumerOffsetRequestHeader,
    decode_request,
    encode,
)

if TYPE_CHECKING:
    from pymq.broker.context import BrokerContext

log = logging.getLogger(__name__)


class ConsumerProcessor:
    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx

    def _channel_info(
        self, channel: Channel, req: RemotingCommand, client_id: str
    ) -> ClientChannelInfo:
        return ClientChannelInfo(
            channel=channel,
            client_id=client_id,
            language=req.language,
            version=req.version,
            last_update=trio.current_time(),
            remote_address=channel.remote_address,
        )

    async def heart_beat(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        try:
            data = await from_json_body(req.body, HeartbeatData)
        except ValueError as exc:
            return req.response(ResponseCode.SYSTEM_ERROR, f"bad heartbeat body: {exc}")
        ctx = self.ctx
        if ctx.acl is not None:
            refusal = ctx.acl.authorize(channel, req, heartbeat_resources(data))
            if refusal is not None:
                return refusal
        info = self._channel_info(channel, req, data.client_id)
        for consumer in data.consumer_data_set:
            group_config = await ctx.subscription_group_manager.find_or_create(consumer.group_name)
            notify = True
            if group_config is not None:
                notify = group_config.notify_consumer_ids_changed_enable
                sys_flag = 1 if consumer.unit_mode else 0
                await ctx.topic_config_manager.create_in_send_back(
                    retry_topic(consumer.group_name),
                    group_config.retry_queue_nums,
                    PERM_READ | PERM_WRITE,
                    sys_flag,
                )
            subscriptions = [s.normalised() for s in consumer.subscription_data_set]
            changed = ctx.consumer_manager.register(
                consumer.group_name,
                info,
                consumer.consume_type,
                consumer.message_model,
                consumer.consume_from_where,
                subscriptions,
                notify and ctx.broker_config.notify_consumer_ids_changed_enable,
            )
            # Java's REGISTER event: (re)compile the group's SQL92 subscriptions.
            await ctx.consumer_filter_manager.register_group(consumer.group_name, subscriptions)
            if changed:
                log.info(
                    "registerConsumer info changed, group %s client %s",
                    consumer.group_name,
                    data.client_id,
                )
        for producer in data.producer_data_set:
            ctx.producer_manager.register(producer.group_name, info)
        return req.response()

    async def unregister_client(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        head: UnregisterClientRequestHeader = decode_request(req)
        producer_group, consumer_group = head.producer_group, head.consumer_group
        if producer_group:
            self.ctx.producer_manager.unregister(producer_group, channel)
        if consumer_group:
            group_config = self.ctx.subscription_group_manager.table.get(consumer_group)
            notify = group_config.notify_consumer_ids_changed_enable if group_config else True
            self.ctx.consumer_manager.unregister(consumer_group, channel, notify)
        return req.response()

    async def check_client_config(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        """A consumer asks, before it starts, whether this broker can filter its subscription:
        TAG always; SQL92 only with enablePropertyFilter and an expression that compiles (the
        refusal's remark is Java's parser message)."""
        if not req.body:
            return req.response()
        try:
            body = await from_json_body(req.body, CheckClientRequestBody)
        except ValueError as exc:
            return req.response(ResponseCode.SYSTEM_ERROR, f"bad check client body: {exc}")
        sub = body.subscription_data
        if sub is None or sub.is_tag_type:
            return req.response()
        if not self.ctx.broker_config.enable_property_filter:
            return req.response(
                ResponseCode.SYSTEM_ERROR,
                f"The broker does not support consumer to filter message by {sub.expression_type}",
            )
        try:
            await compile_expression_async(sub.expression_type, sub.sub_string)
        except Sql92Error as exc:
            log.warning(
                "Client %s@%s filter message, but failed to compile expression! sub=%s, error=%s",
                body.client_id,
                body.group,
                sub.sub_string,
                exc.remark,
            )
            return req.response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, exc.remark)
        return req.response()

    async def get_consumer_list_by_group(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        head: ConsumerGroupHeader = decode_request(req)
        group = head.consumer_group
        info = self.ctx.consumer_manager.get(group)
        if info is None or not info.channels:
            return req.response(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return req.response(body=to_json(ConsumerList(info.client_ids())))

    async def query_consumer_offset(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        head: QueryConsumerOffsetRequestHeader = decode_request(req)
        group, topic, queue_id = head.consumer_group, head.topic, head.queue_id
        offset = self.ctx.consumer_offset_manager.query_offset(group, topic, queue_id)
        if offset >= 0:
            return req.response(ext_fields=encode(OffsetResponseHeader(offset)))
        if self.ctx.store.get_min_offset_in_queue(topic, queue_id) <= 0:
            return req.response(ext_fields=encode(OffsetResponseHeader(0)))
        return req.response(
            ResponseCode.QUERY_NOT_FOUND,
            "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first",
        )

    async def update_consumer_offset(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        head: UpdateConsumerOffsetRequestHeader = decode_request(req)
        offset = head.commit_offset
        if offset >= 0:  # -1 means "unknown" on the client side: never overwrite a real offset
            self.ctx.consumer_offset_manager.commit_offset(
                channel.remote_address, head.consumer_group, head.topic, head.queue_id, offset
            )
        return req.response()

    async def lock_batch_mq(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        try:
            body = await from_json_body(req.body, LockBatchRequestBody)
        except ValueError as exc:
            return req.response(ResponseCode.SYSTEM_ERROR, f"bad lock body: {exc}")
        locked = self.ctx.rebalance_lock_manager.try_lock_batch(
            body.consumer_group, body.mq_set, body.client_id, trio.current_time()
        )
        return req.response(body=to_json(LockBatchResponseBody(locked)))

    async def unlock_batch_mq(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        try:
            body = await from_json_body(req.body, UnlockBatchRequestBody)
        except ValueError as exc:
            return req.response(ResponseCode.SYSTEM_ERROR, f"bad unlock body: {exc}")
        self.ctx.rebalance_lock_manager.unlock_batch(
            body.consumer_group, body.mq_set, body.client_id
        )
        return req.response()
