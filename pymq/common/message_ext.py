"""The message as stored (Java's ``MessageExt``), its SYSFLAG bits, its property keys (Java's
``MessageConst``), the properties string codec and the tags code (Java ``String.hashCode``).

Pure functions and data classes, no I/O.  The record codec that lays a message out on disk is
:mod:`pymq.common.record`.
"""

from __future__ import annotations

import operator
from array import array
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from pymq.common.message_id import Host, create_offset_msg_id
from pymq.common.native import load_native

native_extension: Any = load_native("pymq.common._recordc")


class MessageSysFlag:
    """Bits of the record's SYSFLAG (Java ``MessageSysFlag``)."""

    COMPRESSED_FLAG = 0x1
    MULTI_TAGS_FLAG = 0x2
    TRANSACTION_NOT_TYPE = 0x0
    TRANSACTION_PREPARED_TYPE = 0x4
    TRANSACTION_COMMIT_TYPE = 0x8
    TRANSACTION_ROLLBACK_TYPE = 0xC
    BORNHOST_V6_FLAG = 0x10
    STOREHOSTADDRESS_V6_FLAG = 0x20

    @staticmethod
    def transaction_value(flag: int) -> int:
        return flag & 0xC

    @staticmethod
    def reset_transaction_value(flag: int, tran_type: int) -> int:
        return (flag & ~0xC) | tran_type


# --- property keys (Java MessageConst) ------------------------------------------------------------

PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
PROPERTY_DELAY_TIME_LEVEL = "DELAY"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
# RocketMQ 5's timer messages (MessageConst): what a sender sets...
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
# ...and what the broker records: the due time, when entered, when delivered, re-entries.
PROPERTY_TIMER_OUT_MS = "TIMER_OUT_MS"
PROPERTY_TIMER_ENQUEUE_MS = "TIMER_ENQUEUE_MS"
PROPERTY_TIMER_DEQUEUE_MS = "TIMER_DEQUEUE_MS"
PROPERTY_TIMER_ROLL_TIMES = "TIMER_ROLL_TIMES"
PROPERTY_TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_MIN_OFFSET = "MIN_OFFSET"
PROPERTY_MAX_OFFSET = "MAX_OFFSET"
PROPERTY_BUYER_ID = "BUYER_ID"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_TRANSFER_FLAG = "TRANSFER_FLAG"
PROPERTY_CORRECTION_FLAG = "CORRECTION_FLAG"
PROPERTY_MQ2_FLAG = "MQ2_FLAG"
PROPERTY_RECONSUME_TIME = "RECONSUME_TIME"
PROPERTY_MSG_REGION = "MSG_REGION"
PROPERTY_TRACE_SWITCH = "TRACE_ON"
PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX = "UNIQ_KEY"
PROPERTY_MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
PROPERTY_CONSUME_START_TIMESTAMP = "CONSUME_START_TIME"
PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
PROPERTY_TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_INSTANCE_ID = "INSTANCE_ID"
PROPERTY_CLUSTER = "CLUSTER"
PROPERTY_MESSAGE_REPLY_TO_CLIENT = "REPLY_TO_CLIENT"
PROPERTY_MESSAGE_TTL = "TTL"
PROPERTY_MESSAGE_TYPE = "MSG_TYPE"
PROPERTY_CORRELATION_ID = "CORRELATION_ID"
PROPERTY_REPLY_MESSAGE_ARRIVE_TIME = "ARRIVE_TIME"
PROPERTY_PUSH_REPLY_TIME = "PUSH_REPLY_TIME"
# MixAll.REPLY_MESSAGE_FLAG: MSG_TYPE of a reply (sent with SEND_REPLY_MESSAGE(_V2)).
REPLY_MESSAGE_FLAG = "reply"


# Short aliases used across the code base.
TAGS = PROPERTY_TAGS
KEYS = PROPERTY_KEYS
UNIQ_KEY = PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX
WAIT = PROPERTY_WAIT_STORE_MSG_OK
DELAY = PROPERTY_DELAY_TIME_LEVEL
RETRY_TOPIC = PROPERTY_RETRY_TOPIC
REAL_TOPIC = PROPERTY_REAL_TOPIC
REAL_QID = PROPERTY_REAL_QUEUE_ID
ORIGIN_MESSAGE_ID = PROPERTY_ORIGIN_MESSAGE_ID
MAX_RECONSUME_TIMES = PROPERTY_MAX_RECONSUME_TIMES
CLUSTER = PROPERTY_CLUSTER
TRAN_MSG = PROPERTY_TRANSACTION_PREPARED
PGROUP = PROPERTY_PRODUCER_GROUP

KEY_SEPARATOR = " "
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

# --- properties -----------------------------------------------------------------------------------


def encode_properties(props: Mapping[str, str]) -> str:
    """``name\\x01value\\x02...`` without a trailing separator, as Java 4.9.4 writes it."""
    return PROPERTY_SEPARATOR.join(map(NAME_VALUE_SEPARATOR.join, props.items()))


def _properties_bytes_py(props: Mapping[str, str]) -> bytes:
    """Pure-Python twin of ``_recordc.properties_bytes``; use :func:`properties_bytes`."""
    if not isinstance(props, dict):  # as the C refuses it (a list of pairs has no items())
        raise TypeError("properties must be a dict")
    return encode_properties(props).encode()


def _decode_properties_py(text: str) -> dict[str, str]:
    """Parse a properties string, with or without a trailing ``\\x02``.

    Pure-Python twin of ``_recordc.decode_properties``; use :func:`decode_properties`.

    Like Java's ``string2messageProperties``, an item is kept only when both its name and its value
    are non-empty; anything else is skipped rather than failing the whole message.
    """
    out: dict[str, str] = {}
    if not text:
        return out
    for item in text.split(PROPERTY_SEPARATOR):
        name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if name and sep and value:
            out[name] = value
    return out


# --- Java String.hashCode and tags ----------------------------------------------------------------

_MASK32 = 0xFFFFFFFF
# Powers of 31 modulo 2**32, highest first, so that a string of length n uses the last n of them.
_POW_LEN = 1024
_POW31_DESC = [pow(31, k, 1 << 32) for k in range(_POW_LEN - 1, -1, -1)]


# The powers for each length, sliced once: slicing per call cost more than the sum itself.
_POW31_BY_LEN: dict[int, list[int]] = {}


def _hash_units(units: bytes | array) -> int:
    n = len(units)
    if n <= _POW_LEN:
        powers = _POW31_BY_LEN.get(n)
        if powers is None:
            powers = _POW31_BY_LEN[n] = _POW31_DESC[_POW_LEN - n :]
        h = sum(map(operator.mul, units, powers)) & _MASK32
    else:
        h = 0
        for u in units:
            h = (31 * h + u) & _MASK32
    return h - (1 << 32) if h & 0x80000000 else h


def _java_string_hash_py(s: str) -> int:
    """Java ``String.hashCode``: over UTF-16 code units, as a signed 32-bit int.

    Pure-Python twin of ``_recordc.java_hash``; use :func:`java_string_hash`.
    """
    if s.isascii():
        return _hash_units(s.encode("ascii"))
    units = array("H")
    units.frombytes(s.encode("utf-16-be", "surrogatepass"))  # Java hashes lone surrogates too
    if array("H", b"\x00\x01")[0] != 1:  # little-endian host: UTF-16-BE bytes need a swap
        units.byteswap()
    return _hash_units(units)


_TAGS_CODES: dict[str, int] = {}
_TAGS_CODES_MAX = 65536
"""Tags repeat across messages, so their hashes are memoised (bounded: cleared when full)."""


def tags_code(tags: str | None) -> int:
    """The consume-queue tags code of a TAGS value: its Java hash, or 0 when there are no tags."""
    if not tags:
        return 0
    code = _TAGS_CODES.get(tags)
    if code is None:
        if len(_TAGS_CODES) >= _TAGS_CODES_MAX:
            _TAGS_CODES.clear()
        code = _TAGS_CODES[tags] = java_string_hash(tags)
    return code


def _java_string_hash_after_py(prefix_hash: int, s: str) -> int:
    """``java_string_hash(prefix + s)`` from the prefix's hash, hashing only ``s``.

    Pure-Python twin of ``_recordc.java_hash_after``; use :func:`java_string_hash_after`.
    """
    n = len(s) if s.isascii() else len(s.encode("utf-16-be", "surrogatepass")) // 2
    power = _POW31_DESC[_POW_LEN - 1 - n] if n < _POW_LEN else pow(31, n, 1 << 32)
    h = (prefix_hash * power + _java_string_hash_py(s)) & _MASK32
    return h - (1 << 32) if h & 0x80000000 else h


# --- the message ----------------------------------------------------------------------------------


@attrs.define(slots=True, eq=True)
class MessageExt:
    """A message as stored: what the producer sent plus where and when the broker stored it."""

    topic: str = ""
    body: bytes = b""
    flag: int = 0
    properties: dict[str, str] = attrs.field(factory=dict)
    queue_id: int = 0
    queue_offset: int = 0
    commitlog_offset: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: Host = ("127.0.0.1", 0)
    store_timestamp: int = 0
    store_host: Host = ("127.0.0.1", 0)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    body_crc: int = 0
    store_size: int = 0

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        value = self.properties.get(PROPERTY_KEYS)
        return [k for k in value.split(KEY_SEPARATOR) if k] if value else []

    @property
    def unique_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)

    @property
    def msg_id(self) -> str:
        """The offset message id: store host + commit-log offset."""
        return create_offset_msg_id(self.store_host[0], self.store_host[1], self.commitlog_offset)

    @property
    def tags_code(self) -> int:
        return tags_code(self.tags)

    @property
    def delay_level(self) -> int:
        value = self.properties.get(PROPERTY_DELAY_TIME_LEVEL)
        try:
            return int(value) if value else 0
        except ValueError:
            return 0


_native = native_extension
properties_bytes: Callable[[dict[str, str]], bytes] = (
    _native.properties_bytes if _native is not None else _properties_bytes_py
)
"""The PROPERTIES field of a record: ``encode_properties(props).encode()``, faster."""
decode_properties: Callable[[str], dict[str, str]] = (
    _native.decode_properties if _native is not None else _decode_properties_py
)
"""Parse a properties string, with or without a trailing ``\\x02`` (Java's
``string2messageProperties``: an item without a name or a value is skipped)."""
java_string_hash: Callable[[str], int] = (
    _native.java_hash if _native is not None else _java_string_hash_py
)
"""Java ``String.hashCode``: over UTF-16 code units, as a signed 32-bit int."""
java_string_hash_after: Callable[[int, str], int] = (
    _native.java_hash_after if _native is not None else _java_string_hash_after_py
)
"""``java_string_hash(prefix + s)`` from the prefix's hash, hashing only ``s``."""


# Java HashMap: default capacity and load factor.
_HASHMAP_INITIAL_CAPACITY = 16
_HASHMAP_LOAD_FACTOR = 0.75


def java_hashmap_order(props: Mapping[str, str]) -> dict[str, str]:
    """``props`` in the order a Java ``HashMap`` filled in ``props``' order iterates them.

    The broker serializes a message's properties from a ``HashMap`` wherever it rebuilds a
    property string (a transactional message's half, commit, check and op records), so the stored
    order is the map's bucket order: ``(h ^ (h >>> 16)) & (capacity - 1)`` of ``String.hashCode``,
    keys of one bucket in insertion order, the capacity doubled from 16 whenever the size passes
    three quarters of it.  Buckets large enough for Java to make trees (8 keys in one bucket of a
    table of 64 or more) do not occur in property maps.  The order of a sequence of keys is
    computed once (producers send the same keys again and again) and kept in a bounded cache.
    """
    keys = tuple(props)
    order = _HASHMAP_ORDERS.get(keys)
    if order is None:
        order = _hashmap_order(keys)
        if len(_HASHMAP_ORDERS) >= _HASHMAP_ORDERS_MAX:
            _HASHMAP_ORDERS.clear()
        _HASHMAP_ORDERS[keys] = order
    return {key: props[key] for key in order}


_HASHMAP_ORDERS: dict[tuple[str, ...], tuple[str, ...]] = {}
_HASHMAP_ORDERS_MAX = 4096


def _hashmap_order(keys: tuple[str, ...]) -> tuple[str, ...]:
    capacity = _HASHMAP_INITIAL_CAPACITY
    while len(keys) > capacity * _HASHMAP_LOAD_FACTOR:
        capacity *= 2
    mask = capacity - 1

    def bucket(key: str) -> int:
        h = java_string_hash(key) & 0xFFFFFFFF
        return (h ^ (h >> 16)) & mask

    # sorted() is stable: keys of one bucket keep their insertion order.
    return tuple(sorted(keys, key=bucket))


def moved_to(msg: MessageExt, topic: str, queue_id: int, properties: dict[str, str]) -> MessageExt:
    """A kept message (delayed, or a timer) as it is put to its real topic and queue: the
    producer's fields, the given properties, nothing of where it was stored before."""
    return MessageExt(
        topic=topic,
        body=msg.body,
        flag=msg.flag,
        properties=properties,
        queue_id=queue_id,
        sys_flag=msg.sys_flag,
        born_timestamp=msg.born_timestamp,
        born_host=msg.born_host,
        store_host=msg.store_host,
        reconsume_times=msg.reconsume_times,
    )
