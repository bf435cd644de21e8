"""Admin requests: topics, offsets, message lookups, configs, groups and runtime info.

UPDATE_AND_CREATE_TOPIC (17), DELETE_TOPIC_IN_BROKER (215), GET_ALL_TOPIC_CONFIG (21),
UPDATE_BROKER_CONFIG (25), GET_BROKER_CONFIG (26), GET_BROKER_RUNTIME_INFO (28),
GET_TIMER_METRICS (61, RocketMQ 5's), GET_TIMER_CHECK_POINT (60, RocketMQ 5's), GET_GRPC_STATUS
(9001, pymq's own),
SEARCH_OFFSET_BY_TIMESTAMP (29), GET_MAX_OFFSET (30), GET_MIN_OFFSET (31),
GET_EARLIEST_MSG_STORETIME (32), VIEW_MESSAGE_BY_ID (33), QUERY_MESSAGE (12),
GET_ALL_CONSUMER_OFFSET (43), GET_ALL_DELAY_OFFSET (45), UPDATE_AND_CREATE_SUBSCRIPTIONGROUP
(200), GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201), DELETE_SUBSCRIPTIONGROUP (207),
GET_CONSUMER_CONNECTION_LIST (203), GET_PRODUCER_CONNECTION_LIST (204), GET_TOPIC_STATS_INFO
(202), GET_CONSUME_STATS (208), INVOKE_BROKER_TO_RESET_OFFSET (222), QUERY_TOPIC_CONSUME_BY_WHO
(300), QUERY_CONSUME_TIME_SPAN (303), VIEW_BROKER_STATS_DATA (315), GET_BROKER_CONSUME_STATS
(317), GET_SYSTEM_TOPIC_LIST_FROM_BROKER (305), CLONE_GROUP_OFFSET (314), QUERY_CONSUME_QUEUE
(321), QUERY_CORRECTION_OFFSET (308), CLEAN_EXPIRED_CONSUMEQUEUE (306), CLEAN_UNUSED_TOPIC
(316), GET_ALL_PRODUCER_INFO (328), DELETE_EXPIRED_COMMITLOG (329), and the calls relayed to
consumers: GET_CONSUMER_RUNNING_INFO (307), CONSUME_MESSAGE_DIRECTLY (309),
INVOKE_BROKER_TO_GET_CONSUMER_STATUS (223, as GET_CONSUMER_STATUS_FROM_CLIENT to each client).

Bodies are written in fastjson's form (:mod:`pymq.remoting.protocol.fastjson`) from the Java
classes of :mod:`pymq.remoting.protocol.body`, so that mqadmin and the dashboard parse them.

The operations shared with the websocket admin channel live in
:class:`pymq.broker.admin_service.AdminService`; this module turns remoting requests into its calls
and its :class:`~pymq.broker.admin_service.AdminError` into response codes.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import trio

from pymq.acl.plain import SUB
from pymq.broker.admin_service import RESTART_ONLY_KEYS, AdminError
from pymq.broker.subscription_group_manager import SubscriptionGroupConfig
from pymq.broker.timer import DELIVERED_PHY_OFFSET
from pymq.common.consumer import MessageQueue
from pymq.common.message_id import decode_offset_msg_id
from pymq.common.properties import format_properties, parse_properties
from pymq.common.route import KVTable
from pymq.common.serde import check_body_size, from_json_body, read_body, to_json
from pymq.remoting import headers as H
from pymq.remoting.channel import Channel
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.remoting.errors import RemotingError, RemotingTimeoutError
from pymq.remoting.protocol import fastjson
from pymq.remoting.protocol.body import (
    ConsumeQueueData,
    GetConsumerStatusBody,
    ProducerInfo,
    ProducerTableInfo,
    QueryConsumeQueueResponseBody,
    QueryCorrectionOffsetBody,
    TopicListBody,
)

if TYPE_CHECKING:
    from pymq.broker.context import BrokerContext

log = logging.getLogger(__name__)

__all__ = ["RESTART_ONLY_KEYS", "AdminProcessor"]

# Broker2Client.callClient: how long a relayed call waits for the client (seconds).
CALL_CLIENT_TIMEOUT = 10.0
# Broker2Client.getConsumeStatus: how long each client has to answer 221 (seconds).
CONSUMER_STATUS_TIMEOUT = 5.0
# QUERY_CONSUME_QUEUE: most entries one answer carries (Java stops at the mapped file's end).
QUERY_CQ_MAX = 10_000
# CLEAN_UNUSED_TOPIC keeps these queues even though no topic config names them (as Java).
UNUSED_TOPIC_KEEP = frozenset({"SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_OP_HALF_TOPIC"})
# The remark Java's broker leaves on some successful answers (java-wire-samples.md, section 1).
NOT_SET_REMARK = "not set any response code"


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
                attributes=head.attributes,
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
        tcm = self.ctx.topic_config_manager
        body = {"dataVersion": tcm.data_version, "topicConfigTable": dict(tcm.table)}
        return req.response(body=fastjson.dumps(body))

    # -- offsets and messages -----------------------------------------------------------------

    async def search_offset_by_timestamp(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        head: H.SearchOffsetRequestHeader = H.decode_request(req)
        offset = self.ctx.store.get_offset_in_queue_by_time(
            head.topic, head.queue_id, head.timestamp
        )
        return req.response(ext_fields=H.encode(H.OffsetResponseHeader(offset)))

    async def get_max_offset(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        head: H.TopicQueueHeader = H.decode_request(req)
        offset = self.ctx.store.get_max_offset_in_queue(head.topic, head.queue_id)
        return req.response(ext_fields=H.encode(H.OffsetResponseHeader(offset)))

    async def get_min_offset(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        head: H.TopicQueueHeader = H.decode_request(req)
        offset = self.ctx.store.get_min_offset_in_queue(head.topic, head.queue_id)
        return req.response(ext_fields=H.encode(H.OffsetResponseHeader(offset)))

    async def get_earliest_msg_storetime(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        head: H.TopicQueueHeader = H.decode_request(req)
        timestamp = self.ctx.store.get_earliest_message_time(head.topic, head.queue_id)
        return req.response(ext_fields=H.encode(H.GetEarliestMsgStoretimeResponseHeader(timestamp)))

    async def view_message_by_id(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        offset = H.decode_request(req).offset
        raw = self.ctx.store.select_one_message_by_offset(offset)
        found = self.ctx.store.look_message_by_offset(offset) if raw is not None else None
        if raw is None or found is None:
            return req.response(
                ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}"
            )
        if self.ctx.acl is not None:  # SUB on the topic the message is stored in
            refusal = self.ctx.acl.authorize(channel, req, ((found.topic, SUB),))
            if refusal is not None:
                return refusal
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
        # {"offsetTable":{"topic@group":{0:3,...}}}: queue ids as bare integer keys, as Java's.
        table = self.ctx.consumer_offset_manager.offset_table
        body = {"offsetTable": {key: dict(queues) for key, queues in list(table.items())}}
        return req.response(body=fastjson.dumps(body))

    async def get_all_delay_offset(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        return req.response(
            body=fastjson.dumps({"offsetTable": dict(self.ctx.schedule.offset_table)})
        )

    # -- configs ------------------------------------------------------------------------------

    async def get_broker_config(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        props, data_version = self.service.config_properties()
        text = format_properties(props)
        version = to_json(data_version).decode()
        return req.response(
            ext_fields=H.encode(H.GetBrokerConfigResponseHeader(version)), body=text.encode()
        )

    async def update_broker_config(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        try:
            check_body_size(req.body, "config body")
            props = parse_properties(req.body.decode("utf-8"))
        except UnicodeDecodeError:
            return req.response(ResponseCode.SYSTEM_ERROR, "config body is not UTF-8")
        except ValueError as exc:
            return req.response(ResponseCode.SYSTEM_ERROR, str(exc))
        try:
            await self.service.update_broker_config(props)
        except AdminError as exc:
            return req.response(exc.code, exc.message)
        log.info("broker config updated by %s: %s", channel.remote_address, props)
        return req.response()

    async def get_broker_runtime_info(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        return req.response(body=to_json(KVTable(self.service.runtime_info())))

    async def get_timer_metrics(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        try:
            status = await self.service.timer_status()
        except AdminError as exc:
            return req.response(exc.code, exc.message)
        return req.response(body=fastjson.dumps(status))

    async def get_grpc_status(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        """pymq's GET_GRPC_STATUS: the 5.x clients and the POP messages in flight, of the
        ``consumerGroup`` and ``topic`` fields when given (AdminService.grpc_status)."""
        group = req.ext_fields.get("consumerGroup") or None
        topic = req.ext_fields.get("topic") or None
        return req.response(body=fastjson.dumps(self.service.grpc_status(group, topic)))

    async def get_timer_check_point(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        """RocketMQ 5's body; pymq adds ``deliveredPhyOffset`` (the commit-log offset that
        holds the master's deliveries up to the body's lastReadTimeMs), which a pymq slave
        waits to have replicated before it follows (pymq/broker/timer.py)."""
        try:
            body, delivered_at = self.service.timer_checkpoint()
        except AdminError as exc:
            return req.response(exc.code, exc.message)
        return req.response(ext_fields={DELIVERED_PHY_OFFSET: delivered_at}, body=body)

    # -- subscription groups ------------------------------------------------------------------

    async def update_and_create_subscription_group(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        try:
            config = await from_json_body(req.body, SubscriptionGroupConfig)
        except ValueError as exc:
            return req.response(ResponseCode.SYSTEM_ERROR, f"bad subscription group: {exc}")
        await self.ctx.subscription_group_manager.update(config)
        return req.response()

    async def get_all_subscription_group_config(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        sgm = self.ctx.subscription_group_manager
        body = {"dataVersion": sgm.data_version, "subscriptionGroupTable": dict(sgm.table)}
        return req.response(body=fastjson.dumps(body))

    async def delete_subscription_group(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        await self.ctx.subscription_group_manager.delete(H.decode_request(req).group_name)
        return req.response()

    async def get_consumer_connection_list(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        try:
            body = self.service.java_consumer_connection(H.decode_request(req).consumer_group)
        except AdminError as exc:
            return req.response(exc.code, exc.message)
        return req.response(body=fastjson.dumps(body))

    async def get_producer_connection_list(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        try:
            body = self.service.producer_connection(H.decode_request(req).producer_group)
        except AdminError as exc:
            return req.response(exc.code, exc.message)
        return req.response(body=fastjson.dumps(body))

    # -- stats and progress (bodies in fastjson's form, as Java's tools parse them) ------------

    async def get_topic_stats_info(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        try:
            table = self.service.topic_stats_table(H.decode_request(req).topic)
        except AdminError as exc:
            return req.response(exc.code, exc.message)
        return req.response(body=fastjson.dumps(table))

    async def get_consume_stats(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        head: H.GetConsumeStatsRequestHeader = H.decode_request(req)
        stats = self.service.java_consume_stats(head.consumer_group, head.topic or None)
        return req.response(body=fastjson.dumps(stats))

    async def get_broker_consume_stats(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        head: H.GetConsumeStatsInBrokerHeader = H.decode_request(req)
        return req.response(body=fastjson.dumps(self.service.broker_consume_stats(head.is_order)))

    async def query_topic_consume_by_who(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        groups = self.service.topic_consumed_by(H.decode_request(req).topic)
        return req.response(body=fastjson.dumps(groups))

    async def query_consume_time_span(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        head: H.QueryConsumeTimeSpanRequestHeader = H.decode_request(req)
        try:
            body = self.service.consume_time_span(head.topic, head.group)
        except AdminError as exc:
            return req.response(exc.code, exc.message)
        return req.response(body=fastjson.dumps(body))

    async def view_broker_stats_data(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        head: H.ViewBrokerStatsDataRequestHeader = H.decode_request(req)
        data = self.ctx.stats.stats_data(head.stats_name, head.stats_key)
        if data is None:
            return req.response(
                ResponseCode.SYSTEM_ERROR,
                f"The stats <{head.stats_name}> <{head.stats_key}> not exist",
            )
        return req.response(body=fastjson.dumps(data))

    async def invoke_broker_to_reset_offset(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        head: H.ResetOffsetRequestHeader = H.decode_request(req)
        try:
            result, body = self.service.reset_offset(
                head.group, head.topic, head.timestamp, head.is_force
            )
        except AdminError as exc:
            if exc.code == ResponseCode.TOPIC_NOT_EXIST:  # Java's answer and remark
                return req.response(
                    ResponseCode.SYSTEM_ERROR,
                    "[reset-offset] reset offset failed, no topic in this broker. "
                    f"topic={head.topic}",
                )
            return req.response(exc.code, exc.message)
        log.info(
            "resetOffsetByTime called by %s: %s %s -> %s (%d clients told)",
            channel.remote_address,
            head.group,
            head.topic,
            result["offsets"],
            result["notified"],
        )
        return req.response(remark=NOT_SET_REMARK, body=body)

    # -- calls relayed to a consumer ----------------------------------------------------------

    async def _call_consumer(
        self, req: RemotingCommand, group: str, client_id: str | None, body: bytes
    ) -> RemotingCommand:
        """Broker2Client.callClient: the same request (ext fields, body) on the client's
        connection; its answer goes back unchanged."""
        info = self.ctx.consumer_manager.get(group)
        target = None
        if info is not None:
            target = next((c for c in info.channels.values() if c.client_id == client_id), None)
        # A 5.x client's Telemetry stream answers these calls too (pymq.proxy.clients).
        invoke = getattr(target.channel, "invoke", None) if target is not None else None
        if invoke is None:
            return req.response(
                ResponseCode.SYSTEM_ERROR, f"The Consumer <{group}> <{client_id}> not online"
            )
        relayed = RemotingCommand.request(req.code, dict(req.ext_fields), body)
        try:
            answer: RemotingCommand = await invoke(relayed, CALL_CLIENT_TIMEOUT)
            return answer
        except RemotingTimeoutError as exc:
            return req.response(
                ResponseCode.CONSUME_MSG_TIMEOUT,
                f"consumer <{group}> <{client_id}> Timeout: {exc}",
            )
        except RemotingError as exc:
            return req.response(
                ResponseCode.SYSTEM_ERROR,
                f"invoke consumer <{group}> <{client_id}> Exception: {exc}",
            )

    async def invoke_broker_to_get_consumer_status(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        """Broker2Client.getConsumeStatus: ask each online client of the group (or the one
        named) for its offsets of the topic (221), and answer them by client id."""
        head: H.GetConsumerStatusRequestHeader = H.decode_request(req)
        info = self.ctx.consumer_manager.get(head.group)
        if info is None or not info.channels:
            return req.response(
                ResponseCode.SYSTEM_ERROR,
                f"No Any Consumer online in the consumer group: [{head.group}]",
            )
        wanted = (head.client_addr or "").strip()
        body = GetConsumerStatusBody()
        for client in list(info.channels.values()):
            if wanted and client.client_id != wanted:
                continue
            if not isinstance(client.channel, Channel):
                continue
            ask = RemotingCommand.request(
                RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT,
                H.encode(H.GetConsumerStatusRequestHeader(head.topic, head.group)),
            )
            try:
                answer = await client.channel.invoke(ask, CONSUMER_STATUS_TIMEOUT)
            except RemotingError as exc:
                log.warning("consumer status of %s failed: %s", client.client_id, exc)
                continue
            if answer.code != ResponseCode.SUCCESS or not answer.body:
                continue
            try:
                status = await read_body(fastjson.loads, answer.body, "consumer status")
                table = status.get("messageQueueTable", {})
                body.consumer_table[client.client_id] = {
                    MessageQueue(k["topic"], k["brokerName"], int(k["queueId"])): int(v)
                    for k, v in table.items()
                }
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                log.warning("bad consumer status from %s: %s", client.client_id, exc)
        return req.response(remark=NOT_SET_REMARK, body=fastjson.dumps(body))

    async def get_system_topic_list_from_broker(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        topics = sorted(self.ctx.topic_config_manager.system_topics)
        return req.response(body=fastjson.dumps(TopicListBody(topics)))

    async def clone_group_offset(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        head: H.CloneGroupOffsetRequestHeader = H.decode_request(req)
        cloned = self.service.clone_group_offset(
            head.src_group, head.dest_group, head.topic or None, head.offline
        )
        log.info(
            "cloneGroupOffset called by %s: %s -> %s %s",
            channel.remote_address,
            head.src_group,
            head.dest_group,
            cloned,
        )
        return req.response()

    async def query_correction_offset(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        """QUERY_CORRECTION_OFFSET (AdminBrokerProcessor.queryCorrectionOffset): per queue of
        the topic, the lowest offset committed by the groups outside ``filterGroups`` (offsets
        behind the queue's minimum left out); where that is ahead of ``compareGroup``'s own
        offset, Long.MAX_VALUE instead.  Nothing is changed.

        Java 4.9.4 differs in two defects pymq does not copy: it deletes the filtered groups'
        offsets from its table as it reads, and it looks the compare group's offsets up with
        topic and group swapped (so its comparison finds nothing); a queue the compare group
        has but no other group does is left out here, where Java fails with an NPE."""
        head: H.QueryCorrectionOffsetHeader = H.decode_request(req)
        filtered = frozenset((head.filter_groups or "").split(",")) - {""}
        offsets = self.ctx.consumer_offset_manager
        correction = offsets.query_min_offset_in_all_group(
            head.topic, filtered, self.ctx.store.get_min_offset_in_queue
        )
        for queue_id, offset in offsets.query_offsets(head.compare_group, head.topic).items():
            lowest = correction.get(queue_id)
            if lowest is not None and lowest > offset:
                correction[queue_id] = H.LONG_MAX  # Long.MAX_VALUE
        return req.response(body=fastjson.dumps(QueryCorrectionOffsetBody(correction)))

    async def query_consume_queue(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        """QUERY_CONSUME_QUEUE (mqadmin queryCq): raw entries of a consume queue."""
        head: H.QueryConsumeQueueRequestHeader = H.decode_request(req)
        cq = self.ctx.store.consume_queues.find(head.topic, head.queue_id)
        if cq is None:
            return req.response(
                ResponseCode.SYSTEM_ERROR, f"{head.queue_id}@{head.topic} is not exist!"
            )
        body = QueryConsumeQueueResponseBody(
            max_queue_index=cq.max_offset_in_queue, min_queue_index=cq.min_offset_in_queue
        )
        if head.consumer_group is not None:
            info = self.ctx.consumer_manager.get(head.consumer_group)
            sub = info.subscriptions.get(head.topic) if info is not None else None
            body.subscription_data = sub
            body.filter_data = (
                "null" if sub is not None else f"{head.consumer_group}@{head.topic} is not online!"
            )
        first = cq.get_entry(head.index)
        if first is None:
            return req.response(
                remark=f"Index {head.index} of {head.queue_id}@{head.topic} is not exist!",
                body=fastjson.dumps(body),
            )
        entries = [first]
        for index in range(head.index + 1, head.index + min(head.count, QUERY_CQ_MAX)):
            entry = cq.get_entry(index)
            if entry is None:
                break
            entries.append(entry)
        body.queue_data = [ConsumeQueueData(phy, size, tags) for phy, size, tags in entries]
        return req.response(body=fastjson.dumps(body))

    async def clean_expired_consume_queue(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        log.warning("invoke cleanExpiredConsumeQueue function from %s", channel.remote_address)
        await self.ctx.store.clean_consume_queue.run_once()
        return req.response()

    async def clean_unused_topic(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        log.warning("invoke cleanUnusedTopic function from %s", channel.remote_address)
        keep = set(self.ctx.topic_config_manager.table) | UNUSED_TOPIC_KEEP
        unused = [t for t in list(self.ctx.store.consume_queues.queues) if t not in keep]
        deleted = await self.ctx.store.delete_topics(unused)
        log.info("cleanUnusedTopic: %d consume queues of %s deleted", deleted, unused)
        return req.response()

    async def get_all_producer_info(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        """GET_ALL_PRODUCER_INFO (mqadmin producer): every producer group's clients."""
        now, wall = trio.current_time(), int(time.time() * 1000)
        table = ProducerTableInfo(
            {
                group: [
                    ProducerInfo(
                        c.client_id,
                        c.remote_address,
                        c.language,
                        c.version,
                        wall - int((now - c.last_update) * 1000),
                    )
                    for c in list(clients.values())
                ]
                for group, clients in list(self.ctx.producer_manager.groups.items())
            }
        )
        return req.response(body=fastjson.dumps(table))

    async def delete_expired_commit_log(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        log.warning("invoke deleteExpiredCommitLog from %s", channel.remote_address)
        self.ctx.store.execute_delete_files_manually()
        return req.response()

    async def get_consumer_running_info(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        head: H.GetConsumerRunningInfoRequestHeader = H.decode_request(req)
        return await self._call_consumer(req, head.consumer_group, head.client_id, req.body)

    async def consume_message_directly(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        head: H.ConsumeMessageDirectlyResultRequestHeader = H.decode_request(req)
        req.ext_fields["brokerName"] = self.ctx.broker_config.broker_name
        body = b""
        try:
            _ip, _port, offset = decode_offset_msg_id(head.msg_id or "")
        except ValueError:
            offset = -1
        if offset >= 0:
            raw = self.ctx.store.select_one_message_by_offset(offset)
            if raw is not None:
                found = self.ctx.store.look_message_by_offset(offset)
                if self.ctx.acl is not None and found is not None:
                    # The message goes to a client the caller names: SUB on its topic.
                    refusal = self.ctx.acl.authorize(channel, req, ((found.topic, SUB),))
                    if refusal is not None:
                        return refusal
                body = bytes(raw)
        return await self._call_consumer(req, head.consumer_group, head.client_id, body)
