"""SEND_REPLY_MESSAGE (324) and SEND_REPLY_MESSAGE_V2 (325): a responder's reply to a request
message, pushed to the requester as PUSH_REPLY_MESSAGE_TO_CLIENT (326).

Request-reply (RocketMQ 4.6+): a requester sends an ordinary message carrying CORRELATION_ID,
REPLY_TO_CLIENT (its clientId) and TTL; a responder consumes it and sends the reply (MSG_TYPE
``reply``, to ``<cluster>_REPLY_TOPIC``) with code 324/325.  The broker, as Java 4.9.4's
ReplyMessageProcessor does:

* runs the send's checks on the reply's topic (SendProcessor's, Java's ``msgCheck``);
* finds the requester's connection by REPLY_TO_CLIENT in the producer table (the clientIds of
  producer heartbeats), adds PUSH_REPLY_TIME to the properties and calls the requester with 326
  (the send header's fields, ``bornHost``, ``storeHost``, ``storeTimestamp``; the reply's body),
  waiting up to :data:`PUSH_REPLY_TIMEOUT` for its answer;
* answers SUCCESS (``msgId`` "0", queue offset 0) when the requester took it, else
  SYSTEM_ERROR with Java's remark: no REPLY_TO_CLIENT, no connection for that clientId, or the
  push failed or was refused;
* with ``storeReplyMessageEnable`` (default true) also stores the reply in its topic, whatever
  the push gave; a stored reply's answer carries its real ``msgId`` and queue offset.

Nothing ties a reply to the connection that sent the request: any client may name any
clientId, as in Java (the request may have gone through another broker, so no broker could
check it).  A requester accepts only replies whose CORRELATION_ID it is waiting for
(pymq.client drops the rest).  Each reply holds its connection's request task while the push
waits, so the connection's task limit bounds how many wait at once.

Where pymq differs: Java stores the reply with SYSFLAG 0 whatever the sender's; pymq keeps the
sender's (a compressed reply stays readable from the reply topic).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pymq.common.clock import now_ms
from pymq.common.message_ext import (
    PROPERTY_MESSAGE_REPLY_TO_CLIENT,
    PROPERTY_MSG_REGION,
    PROPERTY_PUSH_REPLY_TIME,
    PROPERTY_TRACE_SWITCH,
    MessageExt,
    decode_properties,
    encode_properties,
    java_hashmap_order,
)
from pymq.remoting import headers as H
from pymq.remoting.channel import Channel
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.remoting.errors import RemotingError

if TYPE_CHECKING:
    from pymq.broker.context import BrokerContext
    from pymq.broker.processors.send import SendProcessor

log = logging.getLogger(__name__)

# Broker2Client.callClient: how long the broker waits for the requester to take a reply (s).
PUSH_REPLY_TIMEOUT = 10.0


class ReplyProcessor:
    def __init__(self, ctx: BrokerContext, send: SendProcessor) -> None:
        self.ctx = ctx
        self.send = send  # its topic checks are the reply's (Java's AbstractSendMessageProcessor)

    async def send_reply_message(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        header: H.SendMessageRequestHeader = H.decode_request(req)
        refused, config = await self.send._check_topic(channel, req, header)
        if refused is not None:
            return refused
        assert config is not None
        queue_id = self.send._queue_id(header, config)
        props = decode_properties(header.properties or "")
        msg = MessageExt(
            topic=header.topic,
            body=req.body,
            flag=header.flag,
            properties=props,
            queue_id=queue_id,
            sys_flag=header.sys_flag,
            born_timestamp=header.born_timestamp,
            born_host=self.send._born_host(channel),
            store_host=self.ctx.store_host,
            reconsume_times=header.reconsume_times or 0,
        )
        bc = self.ctx.broker_config
        fields = {
            PROPERTY_MSG_REGION: bc.region_id,
            PROPERTY_TRACE_SWITCH: "true" if bc.trace_on else "false",
        }
        problem = await self._push(channel, header, props, req.body)
        if problem is None:
            code, remark = ResponseCode.SUCCESS, None
            # Java's zeros "to avoid client decoding exception" when nothing is stored.
            fields.update(msgId="0", queueId=str(queue_id), queueOffset="0")
        else:
            code, remark = ResponseCode.SYSTEM_ERROR, problem
        if bc.store_reply_message_enable:
            result = await self.ctx.store.put(msg)
            if result.appended:
                self.ctx.stats.on_put(result.msg_num, result.wrote_bytes, msg.topic)
                fields.update(
                    msgId=result.msg_id, queueId=str(queue_id), queueOffset=str(result.logic_offset)
                )
            else:
                log.warning(
                    "storing a reply to %s failed: %s %s",
                    msg.topic,
                    result.status.value,
                    result.reason,
                )
        return req.response(code, remark, fields)

    async def _push(
        self,
        channel: Channel,
        header: H.SendMessageRequestHeader,
        props: dict[str, str],
        body: bytes,
    ) -> str | None:
        """Push the reply to the requester REPLY_TO_CLIENT names: None when it took it, else
        the remark Java answers the responder with."""
        requester = props.get(PROPERTY_MESSAGE_REPLY_TO_CLIENT)
        if requester is None:
            remark = f"reply message properties[{PROPERTY_MESSAGE_REPLY_TO_CLIENT}] is null"
            log.warning("%s is null, can not reply message", PROPERTY_MESSAGE_REPLY_TO_CLIENT)
            return remark
        target = self.ctx.producer_manager.find_channel(requester)
        if not isinstance(target, Channel):
            remark = f"push reply message fail, channel of <{requester}> not found."
            log.warning(remark)
            return remark
        pushed = dict(props)
        pushed_at = now_ms()  # one clock read: the push's time and its store timestamp agree
        pushed[PROPERTY_PUSH_REPLY_TIME] = str(pushed_at)
        store_host = self.ctx.store_host
        push = H.ReplyMessageRequestHeader(
            producer_group=header.producer_group,
            topic=header.topic,
            default_topic=header.default_topic,
            default_topic_queue_nums=header.default_topic_queue_nums,
            queue_id=header.queue_id,
            sys_flag=header.sys_flag,
            born_timestamp=header.born_timestamp,
            flag=header.flag,
            properties=encode_properties(java_hashmap_order(pushed)),  # Java's HashMap order
            reconsume_times=header.reconsume_times,
            unit_mode=header.unit_mode,
            born_host=channel.remote_address,
            store_host=f"{store_host[0]}:{store_host[1]}",
            store_timestamp=pushed_at,
        )
        request = RemotingCommand.request(
            RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT, H.encode(push), body
        )
        failed = f"push reply message to {requester}fail."  # sic: Java's remark
        try:
            answer = await target.invoke(request, PUSH_REPLY_TIMEOUT)
        except RemotingError as exc:
            log.warning("push reply message to <%s> failed: %s", requester, exc)
            return failed
        if answer.code != ResponseCode.SUCCESS:
            log.warning(
                "push reply message to <%s> refused: %s %s", requester, answer.code, answer.remark
            )
            return failed
        return None
