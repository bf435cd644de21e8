"""RECALL_MESSAGE (370): RocketMQ 5's recall (cancel) of a pending timer message.

A timer message's send (SEND_MESSAGE / SEND_MESSAGE_V2, not a batch) is answered with a
*recall handle* (``recallHandle`` in the answer's header): URL-safe Base64 of
``v1 {topic} {brokerName} {timestamp} {uniqId}``, the timestamp being the message's due time.
RocketMQ 5 puts its TIMER_OUT_MS (the due time rounded down to the precision) plus 1 there;
pymq's TIMER_OUT_MS is the exact due time (pymq/store/timer/rewrite.py) and goes as it is:
either way the marker below lands in the wheel slot of the message it cancels.

A recall stores a *marker*: a message to the handle's topic, queue 0, body ``0``, tag
``_RECALL_TAG_``, with UNIQ_KEY the recalled message's id, TIMER_DELIVER_MS the handle's
timestamp and TIMER_DEL_UNIQKEY ``{topic}+{uniqId}`` (RocketMQ 5's
TimerMessageStore.buildDeleteKey).  The put path makes it a timer message like any other, so
it is as durable and crash-safe as the message it cancels; when their slot comes round the
timer service delivers neither (pymq/broker/timer.py).

Refusals, in RocketMQ 5's order, with its codes and remarks: ``recallMessageEnable=false``
(NO_PERMISSION); a slave (SLAVE_NOT_AVAILABLE); before ``startAcceptSendRequestTimeStamp``, or
while the broker is not writeable and ``allowRecallWhenBrokerNotWriteable=false``
(SERVICE_NOT_AVAILABLE); an unknown topic (TOPIC_NOT_EXIST); a handle that does not decode, or
names another topic or broker, or a due time that has passed or lies beyond
``timerMaxDelaySec`` (ILLEGAL_OPERATION).  A refusal stores nothing.

Limits (as RocketMQ 5): the broker cannot tell a handle whose message id was made up from a
real one: a well-formed handle for this broker and topic with a future due time is answered
SUCCESS and its marker cancels nothing.  A recall is honoured when its marker is entered in the
wheel before the message's slot is delivered; one stored in the last moments before the due
time (less than the timer service's enqueue lag, normally milliseconds) may come too late, and
the message is delivered.  After a crash the lag includes the restart: a recall acknowledged
before the crash does not stop a message that falls due before the restarted broker has read
the timer topic again (RocketMQ 5 puts a timer it reads late at once, as pymq does).

:meth:`RecallProcessor.recall` is the one implementation; the remoting handler (and a gRPC
``RecallMessage`` later) only decode and encode around it.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

import attrs

from pymq.common.address import host_of
from pymq.common.message_ext import (
    PROPERTY_MSG_REGION,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TIMER_DEL_UNIQKEY,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_OUT_MS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    MessageExt,
)
from pymq.common.recall_handle import RecallHandle, delete_key
from pymq.common.topic import RETRY_GROUP_TOPIC_PREFIX, TIMER_TOPIC, is_writeable
from pymq.remoting.channel import Channel
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.remoting.headers import (
    RecallMessageRequestHeader,
    RecallMessageResponseHeader,
    decode_request,
    encode,
)
from pymq.store.config import BrokerRole
from pymq.store.results import PutMessageStatus

if TYPE_CHECKING:
    from pymq.broker.context import BrokerContext

RECALL_TAG = "_RECALL_TAG_"
"""The marker's tag (RocketMQ 5's RecallMessageProcessor.RECALL_MESSAGE_TAG)."""
NOT_AVAILABLE = "recall failed, broker service not available"
_JAVA_LONG = re.compile(r"[+-]?[0-9]{1,19}")
_STORED = frozenset(
    {
        PutMessageStatus.PUT_OK,
        PutMessageStatus.FLUSH_DISK_TIMEOUT,
        PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
        PutMessageStatus.SLAVE_NOT_AVAILABLE,
    }
)
_HANDLE_CODES = frozenset({RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2})


def recall_handle_for(code: int, msg: MessageExt, broker_name: str) -> str | None:
    """The handle a send's answer carries (RocketMQ 5's attachRecallHandle): for a single send
    stored as a timer message of a topic other than a retry topic, with a message id."""
    if code not in _HANDLE_CODES or msg.topic != TIMER_TOPIC:
        return None
    props = msg.properties
    due = props.get(PROPERTY_TIMER_OUT_MS)
    real_topic = props.get(PROPERTY_REAL_TOPIC)
    uniq = props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
    if due is None or real_topic is None or not uniq:
        return None
    if real_topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return None
    return RecallHandle(real_topic, broker_name, due, uniq).encode()


@attrs.frozen
class RecallResult:
    code: int
    remark: str | None = None
    msg_id: str | None = None
    """The recalled message's id (SUCCESS only)."""


class RecallProcessor:
    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx

    async def recall(
        self,
        topic: str,
        handle_text: str | None,
        producer_group: str | None,
        born_host: tuple[str, int],
    ) -> RecallResult:
        """Recall the timer message ``handle_text`` names (see the module docstring)."""
        ctx = self.ctx
        bc = ctx.broker_config
        store = ctx.store
        if not bc.recall_message_enable:
            return RecallResult(ResponseCode.NO_PERMISSION, "recall failed, operation is forbidden")
        if store.config.broker_role is BrokerRole.SLAVE:
            return RecallResult(ResponseCode.SLAVE_NOT_AVAILABLE, NOT_AVAILABLE)
        now = store.clock_ms()
        if now < bc.start_accept_send_request_time_stamp or (
            not is_writeable(bc.broker_permission) and not bc.allow_recall_when_broker_not_writeable
        ):
            return RecallResult(ResponseCode.SERVICE_NOT_AVAILABLE, NOT_AVAILABLE)
        if ctx.topic_config_manager.select(topic) is None:
            return RecallResult(
                ResponseCode.TOPIC_NOT_EXIST, f"recall failed, the topic[{topic}] not exist"
            )
        try:
            handle = RecallHandle.decode(handle_text)
        except ValueError as exc:
            return RecallResult(ResponseCode.ILLEGAL_OPERATION, str(exc))
        if handle.topic != topic:
            return RecallResult(ResponseCode.ILLEGAL_OPERATION, "recall failed, topic not match")
        if handle.broker_name != bc.broker_name:
            return RecallResult(ResponseCode.ILLEGAL_OPERATION, NOT_AVAILABLE)
        # Java's NumberUtils.toLong(text, -1): a decimal long, else -1.
        due = int(handle.timestamp) if _JAVA_LONG.fullmatch(handle.timestamp) else -1
        if not -(2**63) <= due < 2**63:
            due = -1
        left = due - now
        if left <= 0 or left >= store.config.timer_max_delay_sec * 1000:
            return RecallResult(ResponseCode.ILLEGAL_OPERATION, "recall failed, timestamp invalid")
        result = await store.put(self.marker(handle, producer_group, born_host))
        if result.status not in _STORED:
            return RecallResult(ResponseCode.SYSTEM_ERROR, "recall failed, execute error")
        if result.status is PutMessageStatus.PUT_OK:
            ctx.stats.on_put(result.msg_num, result.wrote_bytes, TIMER_TOPIC)
        return RecallResult(ResponseCode.SUCCESS, None, handle.message_id)

    def marker(
        self, handle: RecallHandle, producer_group: str | None, born_host: tuple[str, int]
    ) -> MessageExt:
        """The message that cancels ``handle``'s (RocketMQ 5's buildMessage)."""
        born = int(time.time() * 1000)
        props = {
            PROPERTY_TAGS: RECALL_TAG,
            PROPERTY_TIMER_DEL_UNIQKEY: delete_key(handle.topic, handle.message_id),
            PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: handle.message_id,
            PROPERTY_TIMER_DELIVER_MS: handle.timestamp,
            "BORN_TIMESTAMP": str(born),
        }
        if producer_group:
            props[PROPERTY_PRODUCER_GROUP] = producer_group
        return MessageExt(
            topic=handle.topic,
            body=b"0",
            properties=props,
            queue_id=0,
            born_timestamp=born,
            born_host=born_host,
            store_host=self.ctx.store_host,
        )

    async def recall_message(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        header: RecallMessageRequestHeader = decode_request(req)
        result = await self.recall(
            header.topic,
            header.recall_handle,
            header.producer_group,
            host_of(channel.remote_address),
        )
        response = req.response(result.code, result.remark)
        if result.msg_id is not None:
            response.ext_fields.update(encode(RecallMessageResponseHeader(result.msg_id)))
        response.ext_fields[PROPERTY_MSG_REGION] = self.ctx.broker_config.region_id
        return response
