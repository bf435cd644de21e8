"""pymq's Trio client: a Producer and Push/Pull consumers speaking RocketMQ 4.x's protocol."""

from pymq.client.consumer import (
    MessageSelector,
    PullConsumer,
    PullResult,
    PushConsumer,
    allocate_averagely,
)
from pymq.client.instance import MQClientError, RequestTimeoutError
from pymq.client.producer import Message, Producer, SendResult, create_reply_message
from pymq.client.transaction import (
    LocalTransactionState,
    TransactionProducer,
    TransactionSendResult,
)
from pymq.common.consumer import ConsumeFromWhere, MessageModel, MessageQueue
from pymq.common.message_ext import MessageExt

__all__ = [
    "ConsumeFromWhere",
    "LocalTransactionState",
    "MQClientError",
    "Message",
    "MessageExt",
    "MessageModel",
    "MessageQueue",
    "MessageSelector",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PushConsumer",
    "RequestTimeoutError",
    "SendResult",
    "TransactionProducer",
    "TransactionSendResult",
    "allocate_averagely",
    "create_reply_message",
]
