"""The message store: RocketMQ 4.x's DefaultMessageStore and its on-disk layout."""

from pymq.store.config import BrokerRole, FlushDiskType, MessageStoreConfig
from pymq.store.message_store import DefaultMessageStore
from pymq.store.results import (
    GetMessageResult,
    GetMessageStatus,
    PutMessageResult,
    PutMessageStatus,
    QueryMessageResult,
)

__all__ = [
    "BrokerRole",
    "DefaultMessageStore",
    "FlushDiskType",
    "GetMessageResult",
    "GetMessageStatus",
    "MessageStoreConfig",
    "PutMessageResult",
    "PutMessageStatus",
    "QueryMessageResult",
]
