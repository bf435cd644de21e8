"""Admin requests: topics, offsets, message lookups, configs, groups and runtime info.

UPDATE_AND_CREATE_TOPIC (17), DELETE_TOPIC_IN_BROKER (215), GET_ALL_TOPIC_CONFIG (21),
UPDATE_BROKER_CONFIG (25), GET_BROKER_CONFIG (26), GET_BROKER_RUNTIME_INFO (28),
SEARCH_OFFSET_BY_TIMESTAMP (29), GET_MAX_OFFSET (30), GET_MIN_OFFSET (31),
GET_EARLIEST_MSG_STORETIME (32), VIEW_MESSAGE_BY_ID (33), QUERY_MESSAGE (12),
GET_ALL_CONSUMER_OFFSET (43), GET_ALL_DELAY_OFFSET (45), UPDATE_AND_CREATE_SUBSCRIPTIONGROUP
(200), GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201), DELETE_SUBSCRIPTIONGROUP (207),
GET_CONSUMER_CONNECTION_LIST (203), GET_TOPIC_STATS_INFO (202), GET_CONSUME_STATS (208),
INVOKE_BROKER_TO_RESET_OFFSET (222).

The operations shared with the websocket admin channel live in
:class:`pymq.broker.admin_service.AdminService`; this module turns remoting requests into its calls
and its :class:`~pymq.broker.admin_service.AdminError` into response codes.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from pymq.broker.admin_service import RESTART_ONLY_KEYS, AdminError
from pymq.broker.subscription_group_manager import SubscriptionGroupConfig
from pymq.common.properties import format_properties, parse_properties
from pymq.common.route import KVTable
from pymq.common.serde import from_json, to_json
from pymq.remoting import headers as H
from pymq.remoting.channel import Channel
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import ResponseCode

if TYPE_CHECKING:
    from pymq.broker.context import BrokerContext

log = logging.getLogger(__name__)

__all__ = ["RESTART_ONLY_KEYS", "AdminProcessor"]


class AdminProcessor:
    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx
        self.service = ctx.admin

    # -- topics -------------------------------------------------------------------------------

    async def update_and_create_topic(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        head: H.CreateTopicRequestHeader = H.decode_request(req)
        try:
            config = self.service.build_topic_config(
                head.topic,
                read_queue_nums=head.read_queue_nums,
                write_queue_nums=head.write_queue_nums,
                perm=head.perm,
                topic_filter_type=head.topic_filter_type,
                topic_sys_flag=head.topic_sys_flag or 0,
                order=head.order,
            )
        except AdminError as exc:
            return req.response(exc.code, exc.message)
        log.info("updateAndCreateTopic called by %s: %s", channel.remote_address, config)
        await self.service.update_topic(config)
        return req.response()

    async def delete_topic_in_broker(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        topic = H.decode_request(req).topic
        log.info("deleteTopic called by %s: %s", channel.remote_address, topic)
        await self.service.delete_topic(topic)
        return req.response()

    async def get_all_topic_config(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        return req.response(body=self.ctx.topic_config_manager.encode_bytes())

    # -- offsets and messages -----------------------------------------------------------------

    async def search_offset_by_timestamp(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        head: H.SearchOffsetRequestHeader = H.decode_request(req)
        offset = self.ctx.store.get_offset_in_queue_by_time(
            head.topic, head.queue_id, head.timestamp
        )
        return req.response(ext_fields={"offset": offset})

    async def get_max_offset(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        head: H.TopicQueueHeader = H.decode_request(req)
        offset = self.ctx.store.get_max_offset_in_queue(head.topic, head.queue_id)
        return req.response(ext_fields={"offset": offset})

    async def get_min_offset(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        head: H.TopicQueueHeader = H.decode_request(req)
        offset = self.ctx.store.get_min_offset_in_queue(head.topic, head.queue_id)
        return req.response(ext_fields={"offset": offset})

    async def get_earliest_msg_storetime(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        head: H.TopicQueueHeader = H.decode_request(req)
        timestamp = self.ctx.store.get_earliest_message_time(head.topic, head.queue_id)
        return req.response(ext_fields={"timestamp": timestamp})

    async def view_message_by_id(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        offset = H.decode_request(req).offset
        raw = self.ctx.store.select_one_message_by_offset(offset)
        if raw is None or self.ctx.store.look_message_by_offset(offset) is None:
            return req.response(
                ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}"
            )
        return req.response(body=bytes(raw))

    async def query_message(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        head: H.QueryMessageRequestHeader = H.decode_request(req)
        max_num = head.max_num
        if head.unique_key_query:
            max_num = self.ctx.store.config.default_query_max_num
        result = self.ctx.store.query_message(
            head.topic, head.key, max_num, head.begin_timestamp, head.end_timestamp
        )
        header = {
            "indexLastUpdateTimestamp": result.index_last_update_timestamp,
            "indexLastUpdatePhyoffset": result.index_last_update_phyoffset,
        }
        if not result.messages:
            return req.response(
                ResponseCode.QUERY_NOT_FOUND,
                "can not find message, maybe time range not correct",
                header,
            )
        return req.response(ext_fields=header, body=b"".join(result.messages))

    async def get_all_consumer_offset(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        return req.response(body=self.ctx.consumer_offset_manager.encode_bytes())

    async def get_all_delay_offset(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        return req.response(body=self.ctx.schedule.encode_bytes())

    # -- configs ------------------------------------------------------------------------------

    async def get_broker_config(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        props, data_version = self.service.config_properties()
        text = format_properties(props)
        version = to_json(data_version).decode()
        return req.response(ext_fields={"version": version}, body=text.encode())

    async def update_broker_config(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        try:
            props = parse_properties(req.body.decode("utf-8"))
        except UnicodeDecodeError:
            return req.response(ResponseCode.SYSTEM_ERROR, "config body is not UTF-8")
        try:
            self.service.update_broker_config(props)
        except AdminError as exc:
            return req.response(exc.code, exc.message)
        log.info("broker config updated by %s: %s", channel.remote_address, props)
        return req.response()

    async def get_broker_runtime_info(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        return req.response(body=to_json(KVTable(self.service.runtime_info())))

    # -- subscription groups ------------------------------------------------------------------

    async def update_and_create_subscription_group(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        try:
            config = from_json(req.body, SubscriptionGroupConfig)
        except ValueError as exc:
            return req.response(ResponseCode.SYSTEM_ERROR, f"bad subscription group: {exc}")
        await self.ctx.subscription_group_manager.update(config)
        return req.response()

    async def get_all_subscription_group_config(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        return req.response(body=self.ctx.subscription_group_manager.encode_bytes())

    async def delete_subscription_group(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        await self.ctx.subscription_group_manager.delete(H.decode_request(req).group_name)
        return req.response()

    async def get_consumer_connection_list(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        try:
            body = self.service.consumer_connection(H.decode_request(req).consumer_group)
        except AdminError as exc:
            return req.response(exc.code, exc.message)
        return req.response(body=json.dumps(body, sort_keys=True).encode())

    # -- pymq additions for the admin CLI (JSON bodies; see docs/admin-protocol.md) -----------

    async def get_topic_stats_info(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        try:
            status = self.service.topic_status(H.decode_request(req).topic)
        except AdminError as exc:
            return req.response(exc.code, exc.message)
        topic = status["topic"]
        body = {"offsetTable": [{"topic": topic, **q} for q in status["queues"]]}
        return req.response(body=json.dumps(body).encode())

    async def get_consume_stats(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        head: H.GetConsumeStatsRequestHeader = H.decode_request(req)
        try:
            stats = self.service.consume_stats(head.consumer_group, head.topic or None)
        except AdminError as exc:
            return req.response(exc.code, exc.message)
        body = {"offsetTable": stats["queues"], "consumeTps": stats["consumeTps"]}
        return req.response(body=json.dumps(body).encode())

    async def invoke_broker_to_reset_offset(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        head: H.ResetOffsetRequestHeader = H.decode_request(req)
        try:
            result = self.service.reset_offset_by_time(head.group, head.topic, head.timestamp)
        except AdminError as exc:
            return req.response(exc.code, exc.message)
        log.info("resetOffsetByTime called by %s: %s", channel.remote_address, result)
        body = {"offsetTable": result["offsets"], "online": result["online"]}
        return req.response(body=json.dumps(body).encode())
