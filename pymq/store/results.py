"""Statuses and results of the store API (Java's PutMessageStatus, GetMessageStatus and friends)."""

from __future__ import annotations

import enum
from typing import NamedTuple

import attrs


class PutMessageStatus(enum.Enum):
    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPEDFILE_FAILED = "CREATE_MAPEDFILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGECACHE_BUSY = "OS_PAGECACHE_BUSY"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"
    WHEEL_TIMER_MSG_ILLEGAL = "WHEEL_TIMER_MSG_ILLEGAL"
    WHEEL_TIMER_NOT_ENABLE = "WHEEL_TIMER_NOT_ENABLE"


PUT_OK = PutMessageStatus.PUT_OK
"""For hot paths: an enum member read through its class is a slow lookup in CPython 3.11 (no
specialisation for EnumType), a module constant is not."""


@attrs.define(slots=True)
class PutMessageResult:
    """The outcome of a put.  On PUT_OK (and the flush/slave timeouts, where the message *is*
    stored) the offsets describe where it went; ``reason`` explains a refusal in words."""

    status: PutMessageStatus
    wrote_offset: int = 0
    wrote_bytes: int = 0
    msg_id: str = ""
    store_timestamp: int = 0
    logic_offset: int = 0
    msg_num: int = 1
    reason: str = ""

    @property
    def is_ok(self) -> bool:
        return self.status is PutMessageStatus.PUT_OK

    @property
    def appended(self) -> bool:
        """True when the message is in the commit log (even if a flush or slave timed out)."""
        return self.status in (
            PutMessageStatus.PUT_OK,
            PutMessageStatus.FLUSH_DISK_TIMEOUT,
            PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
            PutMessageStatus.SLAVE_NOT_AVAILABLE,
        )


class SingleSend(NamedTuple):
    """A put request (DefaultMessageStore.put_now): one send from its request's fields, put as
    the general path puts the message the broker builds from them (WAIT=true left out, CLUSTER
    added), its record written by the store's one record encoder (commitlog.encode_run) as a
    run of one.  The body may be any bytes-like object (the request frame's slice)."""

    topic: str
    queue_id: int
    body: bytes | bytearray | memoryview
    properties: str
    flag: int
    cluster: str
    sys_flag: int
    born_timestamp: int
    born_host: tuple[str, int]
    reconsume_times: int


class SendRun(NamedTuple):
    """A put request: a run of single sends from one peer, each entry (topic, queue id, body,
    properties, flag, sys flag, born timestamp, reconsume times), put together."""

    entries: list[tuple[str, int, bytes, str, int, int, int, int]]
    cluster: str
    born_host: tuple[str, int]


class BatchBody(NamedTuple):
    """A put request: a SEND_BATCH_MESSAGE's body put as the general path puts its decoded
    items, by the store's one record encoder as a run of one entry whose records are the items."""

    topic: str
    queue_id: int
    body: bytes | memoryview
    cluster: str
    sys_flag: int
    born_timestamp: int
    born_host: tuple[str, int]
    reconsume_times: int


class GetMessageStatus(enum.Enum):
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


@attrs.define(slots=True)
class GetMessageResult:
    """Records selected by a pull: ``messages`` are whole commit-log records (bytes), ready to be
    concatenated into a PULL response body; ``queue_offsets`` are their logical offsets."""

    status: GetMessageStatus = GetMessageStatus.NO_MESSAGE_IN_QUEUE
    next_begin_offset: int = 0
    min_offset: int = 0
    max_offset: int = 0
    messages: list[bytes] = attrs.field(factory=list)
    queue_offsets: list[int] = attrs.field(factory=list)
    buffer_total_size: int = 0
    suggest_pulling_from_slave: bool = False
    # Commit-log bytes past the last entry the pull scanned (Java's disk fall-behind).
    fall_behind: int = 0

    @property
    def message_count(self) -> int:
        return len(self.messages)

    def body(self) -> bytes:
        return b"".join(self.messages)


@attrs.define(slots=True)
class QueryMessageResult:
    """Records found by key: whole records plus the index's last update time and offset."""

    messages: list[bytes] = attrs.field(factory=list)
    index_last_update_timestamp: int = 0
    index_last_update_phyoffset: int = 0
