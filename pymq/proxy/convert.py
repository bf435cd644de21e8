"""A 5.x client's message (``apache.rocketmq.v2.Message``) as the properties 4.x stores.

The mapping is RocketMQ 5's proxy's (BuildMessagePropertyUtil), so that a 4.x consumer gets a 5.x
producer's message with the same tag, keys and properties a 4.x producer's would carry: tag ->
``TAGS``, keys -> ``KEYS`` (space-separated), message id -> ``UNIQ_KEY``, message group ->
``__SHARDINGKEY``, delivery timestamp -> ``TIMER_DELIVER_MS`` (the timer store's property),
trace context -> ``TRACE_CONTEXT``, born host -> ``__BORNHOST``, born time -> ``BORN_TIMESTAMP``,
delivery attempt -> ``RECONSUME_TIME``, and the topic as the producer group (``PGROUP``, where
the proxy's transaction checker looks).  Every refusal is a :class:`MessageRefused` with the
``apache.rocketmq.v2.Code`` and text the proxy answers.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping
from typing import Any, NamedTuple

from pymq.common.message_ext import (
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_TAGS,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    MessageExt,
    MessageSysFlag,
)
from pymq.proxy.schema import Code, MessageType, definition

PROPERTY_SHARDING_KEY = "__SHARDINGKEY"
PROPERTY_TRACE_CONTEXT = "TRACE_CONTEXT"
PROPERTY_BORN_HOST = "__BORNHOST"
PROPERTY_BORN_TIMESTAMP = "BORN_TIMESTAMP"

# RocketMQ 5's MessageConst.STRING_HASH_SET: keys a user property may not take.
SYSTEM_PROPERTY_KEYS = frozenset(
    (
        "TRACE_ON", "MSG_REGION", "KEYS", "TAGS", "WAIT", "DELAY", "RETRY_TOPIC", "REAL_TOPIC",
        "REAL_QID", "TRAN_MSG", "PGROUP", "MIN_OFFSET", "MAX_OFFSET", "BUYER_ID",
        "ORIGIN_MESSAGE_ID", "TRANSFER_FLAG", "CORRECTION_FLAG", "MQ2_FLAG", "RECONSUME_TIME",
        "UNIQ_KEY", "MAX_RECONSUME_TIMES", "CONSUME_START_TIME", "POP_CK", "POP_CK_OFFSET",
        "1ST_POP_TIME", "TRAN_PREPARED_QUEUE_OFFSET", "DUP_INFO", "EXTEND_UNIQ_INFO",
        "INSTANCE_ID", "CORRELATION_ID", "REPLY_TO_CLIENT", "TTL", "ARRIVE_TIME",
        "PUSH_REPLY_TIME", "CLUSTER", "MSG_TYPE", "INNER_MULTI_QUEUE_OFFSET",
        "TIMER_DELAY_SEC", "TIMER_DELIVER_MS", "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS",
        "TIMER_ROLL_TIMES", "TIMER_OUT_MS", "TIMER_DEL_UNIQKEY", "TIMER_DELAY_LEVEL",
        "__BORNHOST", "BORN_TIMESTAMP",
    )
)  # fmt: skip

# RocketMQ 5 proxy's defaults (ProxyConfig): user properties per message and their total
# size (keys, values, tag and keys counted), and the longest message group (bytes, exclusive).
USER_PROPERTY_MAX_NUM = 128
MAX_USER_PROPERTY_SIZE = 16 * 1024
MAX_MESSAGE_GROUP_SIZE = 64


class MessageRefused(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class StoredForm(NamedTuple):
    """What the send path stores of one 5.x message."""

    topic: str
    body: bytes
    properties: dict[str, str]
    sys_flag: int
    born_timestamp: int
    reconsume_times: int
    message_id: str
    message_type: str  # NORMAL, FIFO, DELAY or TRANSACTION, read from the properties
    message_group: str


_CONTROL = re.compile("[\x00-\x1f\x7f]")


def _has_control(text: str) -> bool:
    """A control character (below 0x20, or DEL) in ``text``: the proxy's check."""
    return _CONTROL.search(text) is not None


def _check_user_properties(user: Mapping[str, str]) -> int:
    if len(user) > USER_PROPERTY_MAX_NUM:
        raise MessageRefused(
            Code.MESSAGE_PROPERTIES_TOO_LARGE,
            f"too many user properties, max is {USER_PROPERTY_MAX_NUM}",
        )
    size = 0
    for key, value in user.items():
        if key in SYSTEM_PROPERTY_KEYS:
            raise MessageRefused(
                Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property is used by system: {key}"
            )
        if _has_control(key):
            raise MessageRefused(
                Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                "the key of property cannot contain control character",
            )
        if _has_control(value):
            raise MessageRefused(
                Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                "the value of property cannot contain control character",
            )
        size += len(key.encode()) + len(value.encode())
    return size


def _check_tag(tag: str) -> None:
    """A tag (not empty) as the proxy checks it."""
    if not tag.strip():
        raise MessageRefused(
            Code.ILLEGAL_MESSAGE_TAG, "tag cannot be the char sequence of whitespace"
        )
    if "|" in tag:
        raise MessageRefused(Code.ILLEGAL_MESSAGE_TAG, "tag cannot contain '|'")
    if _has_control(tag):
        raise MessageRefused(Code.ILLEGAL_MESSAGE_TAG, "tag cannot contain control character")


def _check_key(key: str) -> None:
    if key and not key.strip():
        raise MessageRefused(
            Code.ILLEGAL_MESSAGE_KEY, "key cannot be the char sequence of whitespace"
        )
    if _has_control(key):
        raise MessageRefused(Code.ILLEGAL_MESSAGE_KEY, "key cannot contain control character")


def _check_group(group: str) -> None:
    if not group.strip():
        raise MessageRefused(
            Code.ILLEGAL_MESSAGE_GROUP, "message group cannot be the char sequence of whitespace"
        )
    if len(group.encode()) >= MAX_MESSAGE_GROUP_SIZE:
        raise MessageRefused(
            Code.ILLEGAL_MESSAGE_GROUP,
            f"message group exceed the max size {MAX_MESSAGE_GROUP_SIZE}",
        )
    if _has_control(group):
        raise MessageRefused(
            Code.ILLEGAL_MESSAGE_GROUP, "message group cannot contain control character"
        )


def message_type_of(props: dict[str, str]) -> str:
    """RocketMQ 5's TopicMessageType.parseFromMessageProperty."""
    if props.get(PROPERTY_TRANSACTION_PREPARED) == "true":
        return "TRANSACTION"
    if (
        PROPERTY_DELAY_TIME_LEVEL in props
        or PROPERTY_TIMER_DELIVER_MS in props
        or PROPERTY_TIMER_DELAY_SEC in props
        or PROPERTY_TIMER_DELAY_MS in props
    ):
        return "DELAY"
    if PROPERTY_SHARDING_KEY in props:
        return "FIFO"
    return "NORMAL"


def _millis(ts: Any) -> int:
    return int(ts.seconds) * 1000 + int(ts.nanos) // 1_000_000


def _user_part(user: Any, system: Any) -> dict[str, str]:
    """The user properties (``user``, the message's map), tag and keys as stored, checked as
    the proxy checks them."""
    if user:  # most messages have none: no copy, no check
        size = _check_user_properties(user)  # before the copy: their number first
        props = dict(user)
    else:
        props, size = {}, 0
    tag = system.tag
    if tag:
        _check_tag(tag)
        props[PROPERTY_TAGS] = tag
        size += len(tag.encode())
    keys = system.keys
    if keys:
        # Each key is stored with a separator: more keys than the size allows are too large
        # however short (empty ones add nothing to ``size``), and are not walked.
        if len(keys) > MAX_USER_PROPERTY_SIZE:
            size += len(keys)
        else:
            for key in keys:
                _check_key(key)
                size += len(key.encode())
                if size > MAX_USER_PROPERTY_SIZE:
                    break
            props[PROPERTY_KEYS] = " ".join(keys)
    if size > MAX_USER_PROPERTY_SIZE:
        raise MessageRefused(
            Code.MESSAGE_PROPERTIES_TOO_LARGE,
            f"the total size of user property is too large, max is {MAX_USER_PROPERTY_SIZE}",
        )
    return props


# Enum values read once (each read through protobuf's enum wrapper is a Python call).
_GZIP = definition.Encoding.GZIP
_IDENTITY = definition.Encoding.IDENTITY
_CRC32 = definition.DigestType.CRC32
_TRANSACTION = MessageType.TRANSACTION


def stored_form(
    msg: Any,
    topic: str,
    *,
    peer: str,
    max_body_size: int,
    max_delay_ms: int,
    now_ms: int,
) -> StoredForm:
    """``msg`` as the send path stores it, or :class:`MessageRefused`."""
    body = bytes(msg.body)
    if not body:
        raise MessageRefused(Code.MESSAGE_BODY_EMPTY, "message body cannot be empty")
    if len(body) > max_body_size:
        raise MessageRefused(
            Code.MESSAGE_BODY_TOO_LARGE, f"message body cannot exceed the max {max_body_size}"
        )
    system = msg.system_properties
    props = _user_part(msg.user_properties, system)
    message_id = system.message_id
    if not message_id.strip():
        raise MessageRefused(Code.ILLEGAL_MESSAGE_ID, "message id cannot be empty")
    props[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = message_id
    sys_flag = 0
    if system.body_encoding == _GZIP:
        sys_flag |= MessageSysFlag.COMPRESSED_FLAG
    if system.message_type == _TRANSACTION:
        sys_flag |= MessageSysFlag.TRANSACTION_PREPARED_TYPE
        props[PROPERTY_TRANSACTION_PREPARED] = "true"
        if system.HasField("orphaned_transaction_recovery_duration"):
            seconds = system.orphaned_transaction_recovery_duration.seconds
            props[PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS] = str(seconds)
    if system.HasField("delivery_timestamp"):
        deliver_ms = _millis(system.delivery_timestamp)
        if deliver_ms - now_ms > max_delay_ms:
            raise MessageRefused(
                Code.ILLEGAL_DELIVERY_TIME,
                f"the max delay time of message is too large, max is {max_delay_ms}",
            )
        props[PROPERTY_TIMER_DELIVER_MS] = str(deliver_ms)
    # Unset optional fields read as their defaults (0, ""): no HasField needed for these.
    attempt = system.delivery_attempt
    props[PROPERTY_RECONSUME_TIME] = str(attempt)
    props[PROPERTY_PRODUCER_GROUP] = topic
    group = system.message_group
    if group:
        _check_group(group)
        props[PROPERTY_SHARDING_KEY] = group
    trace_context = system.trace_context
    if trace_context:
        props[PROPERTY_TRACE_CONTEXT] = trace_context
    born_host = system.born_host.strip() or peer
    if born_host:
        props[PROPERTY_BORN_HOST] = born_host
    born_ms = _millis(system.born_timestamp) if system.HasField("born_timestamp") else now_ms
    props[PROPERTY_BORN_TIMESTAMP] = str(born_ms)
    return StoredForm(
        topic, body, props, sys_flag, born_ms, attempt, message_id, message_type_of(props), group
    )


def consistent_hash(key: int, buckets: int) -> int:
    """Guava's ``Hashing.consistentHash(long, int)``: the bucket RocketMQ 5's proxy picks for
    a message group (``key`` is the group's Java ``String.hashCode``)."""
    state = key & 0xFFFFFFFFFFFFFFFF
    candidate = 0
    while True:
        state = (2862933555777941757 * state + 1) & 0xFFFFFFFFFFFFFFFF
        high = state >> 33  # 31 bits: Java's (int) cast keeps it positive
        following = int((candidate + 1) / ((high + 1) / 2147483648.0))
        if 0 <= following < buckets:
            candidate = following
        else:
            return candidate


# Properties the broker keeps for itself: not handed to a 5.x consumer as user properties.
_NOT_USER = SYSTEM_PROPERTY_KEYS | {PROPERTY_SHARDING_KEY, PROPERTY_TRACE_CONTEXT}


def _timestamp(target: Any, millis: int) -> None:
    """A Timestamp, or a Duration of ``millis`` >= 0, set to ``millis`` (what protobuf's
    FromMilliseconds sets, without its Python-level call chain)."""
    target.seconds, rest = divmod(int(millis), 1000)
    target.nanos = rest * 1_000_000


def to_grpc_message(
    ext: MessageExt,
    *,
    receipt_handle: str,
    invisible_ms: int,
    attempt: int,
    store_host: str,
    into: Any = None,
) -> Any:
    """A stored message as a 5.x consumer receives it (the inverse of :func:`stored_form`),
    written into ``into`` (an empty Message, a response's field: no copy) or a new one."""
    props = ext.properties
    msg = definition.Message() if into is None else into
    msg.topic.name = ext.topic
    msg.body = ext.body
    for key, value in props.items():
        if key not in _NOT_USER:
            msg.user_properties[key] = value
    system = msg.system_properties
    tag = props.get(PROPERTY_TAGS)
    if tag:
        system.tag = tag
    keys = props.get(PROPERTY_KEYS)
    if keys:
        system.keys.extend(k for k in keys.split(" ") if k)
    system.message_id = props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or ""
    # The body's CRC32 as 8 hex digits, as the proxy sends it (the client checks it).
    system.body_digest.type = _CRC32
    system.body_digest.checksum = f"{zlib.crc32(ext.body):08X}"
    system.body_encoding = _GZIP if ext.sys_flag & MessageSysFlag.COMPRESSED_FLAG else _IDENTITY
    system.message_type = _MESSAGE_TYPES[message_type_of(props)]
    _timestamp(system.born_timestamp, int(props.get(PROPERTY_BORN_TIMESTAMP) or ext.born_timestamp))
    system.born_host = props.get(PROPERTY_BORN_HOST) or ext.born_host[0]
    _timestamp(system.store_timestamp, ext.store_timestamp)
    system.store_host = store_host
    deliver = props.get(PROPERTY_TIMER_DELIVER_MS)
    if deliver and deliver.isdigit():
        _timestamp(system.delivery_timestamp, int(deliver))
    system.receipt_handle = receipt_handle
    system.queue_id = ext.queue_id
    system.queue_offset = ext.queue_offset
    _timestamp(system.invisible_duration, invisible_ms)  # never negative
    system.delivery_attempt = attempt
    group = props.get(PROPERTY_SHARDING_KEY)
    if group:
        system.message_group = group
    trace = props.get(PROPERTY_TRACE_CONTEXT)
    if trace:
        system.trace_context = trace
    return msg


_MESSAGE_TYPES = {
    "NORMAL": MessageType.NORMAL,
    "FIFO": MessageType.FIFO,
    "DELAY": MessageType.DELAY,
    "TRANSACTION": MessageType.TRANSACTION,
}
