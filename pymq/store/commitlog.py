"""``CommitLog``: every message of every topic, appended in order to one run of mapped files.

Ownership: the commit log owns its ``MappedFileQueue`` and the topic-queue offset table (the next
logical offset of each ``topic-queueId``).  Appends are synchronous and run on the loop, so a put
is atomic without a lock: the offset is taken, the record is encoded straight into the mapping and
the positions move, all in one step.  A record never spans two files; when a record plus the
8-byte blank header does not fit, the file is closed with a BLANK record and the write moves on.

Recovery (blocking, run before the store serves) scans records with their CRC and stops at the
first one that is not whole and valid; everything after it is truncated.  Records served later
come only from below that point or from appends made since, so nothing corrupt is ever served.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import itertools
import logging
import operator
import os
import struct
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

from pymq.common.clock import now_ms
from pymq.common.message_ext import (
    MessageExt,
    MessageSysFlag,
)
from pymq.common.message_id import offset_msg_id, offset_msg_ids, pack_ip
from pymq.common.native import load_native
from pymq.common.record import (
    BLANK_MAGIC_CODE,
    END_FILE_MIN_BLANK_LENGTH,
    MAX_PROPERTIES_LENGTH,
    MAX_TOPIC_LENGTH,
    MESSAGE_MAGIC_CODE,
    PHYSICAL_OFFSET_POSITION,
    QUEUE_OFFSET_POSITION,
    SYSFLAG_POSITION,
    TEAR_ALIGN,
    RecordError,
    RecordInfo,
    has_nul,
    host_flags,
    nul_where_torn,
    properties_bytes,
    read_record_info,
    record_length,
    scan_records,
    store_timestamp_position,
    tear_safe_properties,
)
from pymq.common.topic import SCHEDULE_TOPIC
from pymq.store.mapped_file import MappedFile
from pymq.store.mapped_file_queue import (
    DEFAULT_CREATE_RETRY_INTERVAL_S,
    MappedFileAllocator,
    MappedFileQueue,
)
from pymq.store.results import PUT_OK, PutMessageResult, PutMessageStatus

native_extension: Any = load_native("pymq.store._commitlogc")

log = logging.getLogger(__name__)

RECOVER_FROM_LAST_FILES = 3
"""Normal recovery rescans the last three files, as RocketMQ does."""

_BLANK = struct.Struct(">iI")
_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")
_HOST_FLAGS = MessageSysFlag.BORNHOST_V6_FLAG | MessageSysFlag.STOREHOSTADDRESS_V6_FLAG
_PREPARED = MessageSysFlag.TRANSACTION_PREPARED_TYPE
# Record header size by the two host flags ((sysFlag >> 4) & 3): record_length without a call.
_HEADER_SIZES = tuple(record_length(i << 4, 0, 0, 0) - 3 for i in range(4))
_ROLLBACK = MessageSysFlag.TRANSACTION_ROLLBACK_TYPE


class RecoveryDispatcher(Protocol):
    """What abnormal recovery re-dispatches into (the consume-queue table)."""

    def selector(self) -> Callable[[bytes, int, int, int], bool]:
        """A fast test: does the record (topic bytes, queue id, offset, size) need dispatch?"""
        ...

    def dispatch(self, info: RecordInfo) -> None: ...


_ENCODE_ERRORS = (OverflowError, ValueError, TypeError, struct.error)
"""What the encoders raise for a field they cannot write (the message is illegal)."""

_INT_FIELDS = (
    # (MessageExt attribute, RocketMQ's name, bits of its Java type)
    ("queue_id", "queueId", 32),
    ("flag", "flag", 32),
    ("sys_flag", "sysFlag", 32),
    ("born_timestamp", "bornTimestamp", 64),
    ("reconsume_times", "reconsumeTimes", 32),
    ("prepared_transaction_offset", "preparedTransactionOffset", 64),
)


def _tear_safe(msg: MessageExt, props_b: bytes, at: int) -> bytes | PutMessageResult:
    """``props_b``, to be written from file offset ``at``, or the same properties in another
    order if a NUL of theirs would land where recovery takes it for a torn write
    (:func:`nul_where_torn`; see :func:`tear_safe_properties`); the refusal when no order tried
    avoids it.  Nothing is written: the caller has committed nothing yet.  The bytes returned
    have the length of ``props_b``, so the record's size and layout stay as computed."""
    if 0 not in props_b:  # the common case
        return props_b
    where = nul_where_torn(props_b, 0, len(props_b), at)
    if where < 0:
        return props_b
    safe = tear_safe_properties(msg.properties, at)
    if safe is not None and len(safe) == len(props_b):
        return safe
    return PutMessageResult(
        PutMessageStatus.MESSAGE_ILLEGAL,
        reason=f"a NUL character in the properties would land at commit-log file offset "
        f"{at + where}, a {TEAR_ALIGN}-byte sector boundary, where recovery would take it for a "
        "torn write",
    )


def field_error(msg: MessageExt) -> str | None:
    """Why ``msg`` cannot be written as a record (a field outside its Java type), or None.

    The record holds each field in the width of its Java type (int32 or int64, signed); a value
    outside it would make the encoder fail.  Checked before anything changes.
    """
    for attr, name, bits in _INT_FIELDS:
        value = getattr(msg, attr)
        if type(value) is not int:
            return f"{name} must be an integer, not {type(value).__name__}"
        if not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
            kind = "int" if bits == 32 else "long"
            return f"{name} {value} is out of the range of a Java {kind}"
    port = msg.born_host[1] if len(msg.born_host) > 1 else None
    if type(port) is not int or not 0 <= port <= 0xFFFF:
        return f"bornHost port {port!r} is not a port number"
    return None


# Dispatch hints kept at most (reput normally takes them within milliseconds).
DISPATCH_HINTS_MAX = 1 << 16


class DispatchHint(NamedTuple):
    """What the put path leaves for reput about a record it just wrote, so that reput need not
    parse the record back (see ``CommitLog.dispatch_hints``).  Read by name everywhere."""

    physical_offset: int
    size: int
    topic: str
    queue_id: int
    queue_offset: int
    tags: str | None
    """The TAGS property as the put had it (reput works out the tags code)."""
    store_timestamp: int
    sys_flag: int
    keys: str | None
    uniq_key: str | None


_new_hint = tuple.__new__
"""``_new_hint(DispatchHint, (...))``: a hint without the Python frame of NamedTuple's
``__new__`` (half the cost on the put path); the fields in declaration order."""


# --- encode_run's Python twin (pymq.store._commitlogc): the store's one record encoder ---------

_PROPS_MAX = 32
"""Properties an item may have for the one-call puts (more: the general path)."""
_FAST_RECORD = struct.Struct(">IIIIIQQIQ4sIQ4sIIQI")  # the 88-byte header with IPv4 hosts
_HOSTS_V6 = 0x10 | 0x20  # BORNHOST_V6 | STOREHOST_V6


def _arg_int(value: Any, name: str, lo: int, hi: int) -> int:
    x = operator.index(value)
    if not lo <= x <= hi:
        raise OverflowError(f"{name} = {x} does not fit its record field")
    return x


_I32 = (-(2**31), 2**31 - 1)
_I64 = (-(2**63), 2**63 - 1)
_HALF = (0, (2**63 - 1) // 2)


def _split_plain_properties(props: bytes) -> list[tuple[bytes, bytes]] | None:
    """The properties split as decode_properties splits them (items without a name or a value
    skipped); None when the one-call puts leave them to the general path: a byte that is NUL
    or not ASCII, more than _PROPS_MAX items, or a name given twice."""
    if not props.isascii() or b"\x00" in props:
        return None
    items: list[tuple[bytes, bytes]] = []
    if not props:
        return items
    names: set[bytes] = set()
    for part in props.split(b"\x02"):
        sep = part.find(b"\x01")
        if sep > 0 and len(part) > sep + 1:
            name = part[:sep]
            if len(items) == _PROPS_MAX or name in names:
                return None
            names.add(name)
            items.append((name, part[sep + 1 :]))
    return items


class _FastPut(NamedTuple):
    """What every record of one fast put shares."""

    topic_b: bytes
    cluster_b: bytes
    topic: str
    queue_id: int
    sys_flag: int
    born_timestamp: int
    born_ip: bytes
    born_port: int
    store_timestamp: int
    store_ip: bytes
    store_port: int
    reconsume_times: int
    max_body_properties: int


def _write_stored_record(
    buf: Any, pos: int, room: int, fp: _FastPut, single: bool, body: bytes, flag: int,
    props: bytes, queue_offset: int, phy: int,
) -> tuple[int, dict[bytes, str]] | None:  # fmt: skip
    """Write at buf[pos:] (room bytes left) the record the general path stores for a message
    with this body, flag and properties: its properties as the broker stores them (WAIT=true
    left out, CLUSTER added last), the rest from fp.  Returns the record's size and the stored
    TAGS, KEYS, UNIQ_KEY and WAIT values found; None (nothing written) when the general path
    must judge it: see _split_plain_properties, an own CLUSTER, a DELAY other than "0" (any
    DELAY or TRAN_MSG for a single send), any TIMER_ property, a body and properties over
    max_body_properties, or no room."""
    items = _split_plain_properties(props)
    if items is None:
        return None
    found: dict[bytes, str] = {}
    kept: list[bytes] = []
    for name, value in items:
        if name == b"CLUSTER" or (name == b"DELAY" and (single or value != b"0")):
            return None
        if (single and name == b"TRAN_MSG") or (len(name) > 6 and name[:6] == b"TIMER_"):
            return None
        if name == b"WAIT" and value.lower() == b"true":
            continue
        if name in (b"WAIT", b"TAGS", b"KEYS", b"UNIQ_KEY"):
            found[name] = value.decode("ascii")
        kept.append(name + b"\x01" + value + b"\x02")
    kept.append(b"CLUSTER\x01" + fp.cluster_b)
    stored = b"".join(kept)
    if len(stored) > MAX_PROPERTIES_LENGTH or len(body) + len(stored) > fp.max_body_properties:
        return None
    topic_b = fp.topic_b
    size = _FAST_RECORD.size + len(body) + 1 + len(topic_b) + 2 + len(stored)
    if size > room:
        return None
    header = _FAST_RECORD.pack(
        size, MESSAGE_MAGIC_CODE, zlib.crc32(body) & 0x7FFFFFFF, fp.queue_id & 0xFFFFFFFF,
        flag & 0xFFFFFFFF, queue_offset, phy, fp.sys_flag & 0xFFFFFFFF,
        fp.born_timestamp & 0xFFFFFFFFFFFFFFFF, fp.born_ip, fp.born_port & 0xFFFFFFFF,
        fp.store_timestamp & 0xFFFFFFFFFFFFFFFF, fp.store_ip, fp.store_port & 0xFFFFFFFF,
        fp.reconsume_times & 0xFFFFFFFF, 0, len(body),
    )  # fmt: skip
    tail = bytes((len(topic_b),)) + topic_b + len(stored).to_bytes(2, "big") + stored
    buf[pos : pos + size] = header + body + tail
    return size, found


def _hint_type(hint_type: Any) -> Any:
    if hint_type is None:
        return None
    if not isinstance(hint_type, type) or not issubclass(hint_type, tuple) or hint_type is tuple:
        raise TypeError("hint_type must be a subclass of tuple, or None")
    return hint_type


def _hint_row(
    hint_type: Any, phy: int, size: int, fp: _FastPut, queue_offset: int, found: dict[bytes, str]
) -> tuple[Any, ...]:
    row = (
        phy, size, fp.topic, fp.queue_id, queue_offset, found.get(b"TAGS"), fp.store_timestamp,
        fp.sys_flag, found.get(b"KEYS"), found.get(b"UNIQ_KEY"),
    )  # fmt: skip
    return row if hint_type is None else tuple.__new__(hint_type, row)


def _writable_size(buf: Any) -> int:
    """The size of the writable buffer ``buf`` (BufferError: read-only), its view let go at
    once (a map with a view left cannot close)."""
    with memoryview(buf) as view:
        if view.readonly:
            raise BufferError("Object is not writable.")
        return view.nbytes


_BATCH_ITEM = struct.Struct(">iiiii")  # TOTALSIZE, MAGICCODE, BODYCRC, FLAG, BODYLENGTH
ENTRY_HEADER = struct.Struct(">iiqqqiiii")
"""encode_run's entry_header: DLedger 0.2.6's entry header before each record (magic 1, size,
index, term, pos, channel 0, chain CRC 0, body CRC 0, body length; pymq.dledger.store)."""


def _entry_header_arg(entry_header: Any) -> list[int] | None:
    """encode_run's entry_header as [next index, term] (None: none)."""
    if entry_header is None:
        return None
    if not isinstance(entry_header, tuple) or len(entry_header) != 2:
        raise TypeError("encode_run: entry_header must be None or (index, term)")
    return [
        _arg_int(entry_header[0], "entry index", *_HALF),
        _arg_int(entry_header[1], "entry term", 0, _I64[1]),
    ]


def _put_entry_header(buf: Any, at: int, size: int, eh: list[int], index: int, pos: int) -> None:
    """The entry header of a record of ``size`` bytes at buf[at + 48], its entry at ``pos``."""
    ENTRY_HEADER.pack_into(buf, at, 1, ENTRY_HEADER.size + size, index, eh[1], pos, 0, 0, 0, size)


def _write_batch_body(
    buf: Any, pos: int, limit: int, file_from: int, fp: _FastPut, d: bytes, queue_offset: int,
    hint_type: Any, rows: list[tuple[Any, ...]], eh: list[int] | None = None,
) -> tuple[int, str | None] | None:  # fmt: skip
    """The records of the SEND_BATCH_MESSAGE body ``d``, one per item, written from buf[pos]
    below limit with consecutive queue offsets: their hint rows appended to ``rows``.  Returns
    the write position after the last record and the first item's stored WAIT value; None when
    Python must judge the batch (a body that does not parse, no item, an item
    _write_stored_record leaves to it, no room).  On None or an exception, ``rows`` is as it
    was and the records written are zeroed, as CommitLog._scrub would."""
    first, w, at, n = len(rows), pos, 0, len(d)
    written = pos  # the end of what was written
    wait: str | None = None
    prefix = 0 if eh is None else ENTRY_HEADER.size
    index = 0 if eh is None else eh[0]
    try:
        while at < n:
            if at + 20 > n:
                break
            total, _, _, flag, body_len = _BATCH_ITEM.unpack_from(d, at)
            q = at + 20
            if body_len < 0 or q + body_len + 2 > n:
                break
            body = d[q : q + body_len]
            q += body_len
            props_len = int.from_bytes(d[q : q + 2], "big", signed=True)
            q += 2
            if (
                props_len < 0
                or q + props_len > n
                or total != q + props_len - at
                or w + prefix > limit
            ):
                break
            props = d[q : q + props_len]
            at = q + props_len
            out = _write_stored_record(
                buf, w + prefix, limit - w - prefix, fp, False, body, flag, props, queue_offset,
                file_from + w + prefix,
            )  # fmt: skip
            if out is None:
                break
            size, found = out
            written = w + prefix + size
            if eh is not None:
                _put_entry_header(buf, w, size, eh, index, file_from + w)
                index += 1
            if len(rows) == first:
                wait = found.get(b"WAIT")
            rows.append(_hint_row(hint_type, file_from + w + prefix, size, fp, queue_offset, found))
            w += prefix + size
            queue_offset += 1
        else:
            if len(rows) > first:
                return w, wait
    except BaseException:
        del rows[first:]
        buf[pos:written] = bytes(written - pos)
        raise
    del rows[first:]
    buf[pos:written] = bytes(written - pos)
    return None


_ABSENT: Any = object()


def _run_entry(
    entry: Any, topic_bytes: dict[Any, Any], stop_flags: int, stop_topic: str, stored: bool,
    store_len: int,
) -> tuple[Any, ...] | None:  # fmt: skip
    """encode_run's checks of one entry, in the C code's order: (topic, queue id as given,
    topic bytes, body, properties, queue id, flag, sys flag, born timestamp, reconsume times,
    and for a stored message its born IP, born port and prepared transaction offset), or None
    where the run stops (the stops first, in CommitLog's order, then what the general path
    judges); raises for an entry of the wrong types.  A stored message's sys flag comes back
    with the host flags its born IP and the store IP's length (``store_len``) imply."""
    if not isinstance(entry, tuple) or len(entry) != (11 if stored else 8):
        raise TypeError(f"encode_run: an entry is not an {11 if stored else 8}-tuple")
    topic, queue_id_obj, body, props, flag, sys_flag, born_ts, reconsume = entry[:8]
    if not isinstance(topic, str):
        raise TypeError("encode_run: the topic is not a str")
    topic_b = dict.get(topic_bytes, topic, _ABSENT)
    if topic_b is _ABSENT:
        return None
    sys_flag = _arg_int(sys_flag, "sys_flag", *_I32)
    if sys_flag & stop_flags or topic == stop_topic:
        return None
    batch = props is None
    if stored:
        if not isinstance(props, bytes) or not isinstance(entry[8], bytes):
            raise TypeError("encode_run: a stored message's properties and born host must be bytes")
    elif not batch and not isinstance(props, str):
        raise TypeError("encode_run: properties must be a str or None")
    queue_id = _arg_int(queue_id_obj, "queue_id", *_I32)
    flag = _arg_int(flag, "flag", *_I32)
    born_ts = _arg_int(born_ts, "born_timestamp", *_I64)
    reconsume = _arg_int(reconsume, "reconsume_times", *_I32)
    extra: tuple[Any, ...] = ()
    if stored:
        born_port = _arg_int(entry[9], "born_port", *_I32)
        prepared = _arg_int(entry[10], "prepared_transaction_offset", *_I64)
        born_ip = entry[8]
        if len(born_ip) not in (4, 16) or not isinstance(topic_b, bytes):
            return None
        sys_flag = (sys_flag & ~_HOSTS_V6) | (0x10 if len(born_ip) == 16 else 0)
        sys_flag |= 0x20 if store_len == 16 else 0
        extra = (bytes(born_ip), born_port, prepared)
    elif (
        sys_flag & _HOSTS_V6
        or not isinstance(topic_b, bytes)
        or (not batch and (not props.isascii() or len(props) > 65535))
    ):
        return None
    if len(topic_b) > MAX_TOPIC_LENGTH or b"\x00" in topic_b:
        return None
    return (topic, queue_id_obj, topic_b, body, props, queue_id, flag, sys_flag, born_ts,
            reconsume, *extra)  # fmt: skip


def _find_names(props: bytes) -> dict[bytes, str]:
    """The TAGS, KEYS and UNIQ_KEY values of stored properties (the hint row's) as
    decode_properties reads them (an item without a name or a value skipped, the last of a name
    kept; bytes that are no UTF-8 read as U+FFFD)."""
    found: dict[bytes, str] = {}
    if not props:
        return found
    for part in props.split(b"\x02"):
        sep = part.find(b"\x01")
        if sep > 0 and len(part) > sep + 1 and part[:sep] in (b"TAGS", b"KEYS", b"UNIQ_KEY"):
            found[part[:sep]] = part[sep + 1 :].decode(errors="replace")
    return found


def _write_as_given(
    buf: Any, pos: int, room: int, fp: _FastPut, body: bytes, flag: int, props: bytes,
    prepared: int, queue_offset: int, phy: int,
) -> int:  # fmt: skip
    """Write at buf[pos:] (room bytes left) a stored message's record: its properties exactly
    as given, hosts of 4 or 16 bytes (fp.sys_flag carrying their flags), the prepared
    transaction offset.  Returns its size, or -1 (nothing written) for properties over
    MAX_PROPERTIES_LENGTH or no room."""
    born, store = len(fp.born_ip), len(fp.store_ip)
    size = _FAST_RECORD.size + born + store - 8 + len(body) + 1 + len(fp.topic_b) + 2 + len(props)
    if len(props) > MAX_PROPERTIES_LENGTH or size > room:
        return -1
    header = struct.pack(
        f">IIIIIQQIQ{born}sIQ{store}sIIQI", size, MESSAGE_MAGIC_CODE,
        zlib.crc32(body) & 0x7FFFFFFF, fp.queue_id & 0xFFFFFFFF, flag & 0xFFFFFFFF,
        queue_offset, phy, fp.sys_flag & 0xFFFFFFFF, fp.born_timestamp & 0xFFFFFFFFFFFFFFFF,
        fp.born_ip, fp.born_port & 0xFFFFFFFF, fp.store_timestamp & 0xFFFFFFFFFFFFFFFF,
        fp.store_ip, fp.store_port & 0xFFFFFFFF, fp.reconsume_times & 0xFFFFFFFF,
        prepared & 0xFFFFFFFFFFFFFFFF, len(body),
    )  # fmt: skip
    tail = bytes((len(fp.topic_b),)) + fp.topic_b + len(props).to_bytes(2, "big") + props
    buf[pos : pos + size] = header + body + tail
    return size


def _write_entry(
    buf: Any, pos: int, limit: int, file_from: int, fp: _FastPut, body: Any,
    props: str | bytes | None, flag: int, queue_offset: int, hint_type: Any,
    rows: list[tuple[Any, ...]], prepared: int | None, eh: list[int] | None = None,
) -> tuple[int, str | None] | None:  # fmt: skip
    """One entry's records written from buf[pos] below limit, their hint rows appended to
    ``rows``: the write position after them and the stored WAIT value (a batch's first
    item's; a stored message's None); None when the general path judges the entry (nothing
    added to rows).  A stored message (``prepared`` not None) is written as given
    (_write_as_given).  With ``eh``
    ([next index, term]), each record after its DLedger entry header (encode_run_py)."""
    with memoryview(body) as view:
        data = bytes(view)
    prefix = 0 if eh is None else ENTRY_HEADER.size
    at = pos + prefix  # the record's
    if isinstance(props, bytes):
        size = -1
        if at <= limit and len(data) <= _I32[1]:
            size = _write_as_given(
                buf, at, limit - at, fp, data, flag, props, prepared or 0, queue_offset,
                file_from + at,
            )  # fmt: skip
        if size < 0:
            return None
        try:
            if eh is not None:
                _put_entry_header(buf, pos, size, eh, eh[0], file_from + pos)
            found = _find_names(props)
            rows.append(_hint_row(hint_type, file_from + at, size, fp, queue_offset, found))
        except BaseException:
            buf[pos : at + size] = bytes(at + size - pos)
            raise
        return at + size, None  # a stored run reports no WAIT value
    if props is None:
        return _write_batch_body(
            buf, pos, limit, file_from, fp, data, queue_offset, hint_type, rows, eh
        )
    out = None
    if at <= limit and len(data) <= _I32[1]:
        out = _write_stored_record(
            buf, at, limit - at, fp, True, data, flag, props.encode("ascii"),
            queue_offset, file_from + at,
        )  # fmt: skip
    if out is None:
        return None
    size, found = out
    try:
        if eh is not None:
            _put_entry_header(buf, pos, size, eh, eh[0], file_from + pos)
        rows.append(_hint_row(hint_type, file_from + at, size, fp, queue_offset, found))
    except BaseException:
        buf[pos : at + size] = bytes(at + size - pos)
        raise
    return at + size, found.get(b"WAIT")


def _run_args(
    entries: Any, topic_bytes: Any, queue_table: Any, clock: Any, cluster_b: Any, born_ip: Any,
    store_ip: Any, stop_topic: Any, stored: bool,
) -> bool:  # fmt: skip
    """encode_run's type checks (TypeError); whether a run may be encoded at all (a run of
    sends: not with IPv6 hosts or an odd cluster name, the general path's; a run of stored
    messages: a store IP of 4 or 16 bytes)."""
    if not (
        isinstance(entries, list)
        and isinstance(topic_bytes, dict)
        and isinstance(queue_table, dict)
        and isinstance(cluster_b, bytes)
        and isinstance(born_ip, bytes)
        and isinstance(store_ip, bytes)
        and isinstance(stop_topic, str)
        and (clock is None or callable(clock))
    ):
        raise TypeError("encode_run: bad argument types")
    if stored:
        return len(store_ip) in (4, 16)
    return (
        len(born_ip) == 4
        and len(store_ip) == 4
        and bool(cluster_b)
        and all(3 <= c < 0x80 for c in cluster_b)
    )


def encode_run_py(
    buf: Any, pos: Any, limit: Any, file_from_offset: Any, entries: Any, topic_bytes: Any,
    queue_table: Any, clock: Any, cluster_b: Any, born_ip: Any, born_port: Any, store_ip: Any,
    store_port: Any, max_body_properties: Any, stop_flags: Any, stop_topic: Any, hint_type: Any,
    entry_header: Any = None,
) -> tuple[int, list[tuple[Any, ...]], list[str | None], int, BaseException | None]:  # fmt: skip
    """Python twin of ``pymq.store._commitlogc.encode_run``, the store's one record encoder:
    a run of sends' records written into the writable buffer ``buf`` from buf[pos] (below
    limit), buf[0] being the commit log's physical offset ``file_from_offset``, each as the
    general path (SendProcessor._single_message or _batch_messages, then
    CommitLog.append_stored) stores it: the broker's stored properties (WAIT=true left out,
    CLUSTER added last).  Each of ``entries`` is (topic, queue_id, body, properties, flag,
    sys_flag, born_timestamp, reconsume_times), the body any buffer: a single send
    (properties its request's str; any DELAY or TRAN_MSG is the general path's), or, with
    properties None, a SEND_BATCH_MESSAGE body (flag unused) whose items become records of
    that topic and queue with consecutive queue offsets, all or none (a DELAY other than "0"
    is the general path's).  Its topic's bytes come from ``topic_bytes``, its queue offset from
    ``queue_table`` keyed by (topic, queue_id) (0 when absent; set past the entry's records
    once they are written: the commit), its store time from ``clock()`` (None: the wall
    clock).  Stops at the first entry whose topic is missing from topic_bytes, whose sys_flag
    has a bit of stop_flags, whose topic is stop_topic (in that order, before its other fields
    are read), or that the general path must judge (_write_stored_record's refusals, IPv6
    hosts, properties not ASCII or over 65535, a batch body that does not parse or is empty,
    no room below limit).  Returns (end, rows, waits, stamp, error): the write position after
    the last record, their hint rows (one per record) and stored WAIT values (one per entry),
    the last entry's store time (0 if none), and None, or the exception that stopped it after
    entries were committed.  Raises only when nothing was committed.

    A run of stored messages (CommitLog.append_stored: the first entry an 11-tuple, as all
    must be) is (topic, queue_id, body, properties bytes, flag, sys_flag, born_timestamp,
    reconsume_times, born_ip, born_port, prepared_transaction_offset): each record written
    with its properties exactly as given (no refusal of theirs but a length over
    MAX_PROPERTIES_LENGTH; no size limit), its own born host, the host flags its born IP's
    and store_ip's lengths (4 or 16) imply in place of sys_flag's, and the prepared
    transaction offset; cluster_b, born_ip, born_port and max_body_properties are unused; the
    clock is read once, for the first entry, whose store time every record shares; its WAIT
    values are None (its callers hold the messages' properties: no decode per put).  It is
    all or nothing: the queue offsets go to queue_table once every entry is written, and
    a stop leaves buf zeroed from pos and returns (pos, [], [], 0, None); an error is raised.
    Any entry whose sys_flag is a prepared or rolled-back transaction's (bit 0x4) takes queue
    offset 0 and leaves queue_table as it is (RocketMQ's CommitLog).

    ``entry_header`` (None, or (first index, term)): each record written as the body of a
    DLedger 0.2.6 entry of its own (pymq.store.dledger_commitlog), after that entry's 48-byte
    header (:data:`ENTRY_HEADER`) at the entry's position: the record's physical offset (its
    PHYSICALOFFSET and its hint row's) is its entry's + 48, the indexes run from the first
    index, one a record (each batch item's too) in the rows' order, and the room below limit
    counts the headers."""
    hint_type = _hint_type(hint_type)
    pos = _arg_int(pos, "pos", 0, sys.maxsize)
    limit = _arg_int(limit, "limit", 0, sys.maxsize)
    file_from = _arg_int(file_from_offset, "file_from_offset", *_HALF)
    born_port = _arg_int(born_port, "born_port", *_I32)
    store_port = _arg_int(store_port, "store_port", *_I32)
    max_bp = _arg_int(max_body_properties, "max_body_properties", 0, _I32[1])
    stop_flags = _arg_int(stop_flags, "stop_flags", *_I32)
    eh = _entry_header_arg(entry_header)
    head = entries[0] if isinstance(entries, list) and entries else None
    stored = isinstance(head, tuple) and len(head) == 11  # all or nothing
    usable = _run_args(
        entries, topic_bytes, queue_table, clock, cluster_b, born_ip, store_ip, stop_topic, stored
    )
    limit = min(limit, _writable_size(buf))
    rows: list[tuple[Any, ...]] = []
    waits: list[str | None] = []
    stamp = 0
    e = 0
    start = pos
    # Where queue offsets are committed: a stored run's go to the table at its end.
    pending: dict[Any, Any] = {} if stored and len(entries) > 1 else queue_table
    try:
        while usable and e < len(entries):
            fields = _run_entry(
                entries[e], topic_bytes, stop_flags, stop_topic, stored, len(store_ip)
            )
            e += 1
            if fields is None:
                break
            (topic, queue_id_obj, topic_b, body, props, queue_id, flag, sys_flag, born_ts,
             reconsume) = fields[:10]  # fmt: skip
            entry_born, entry_port, prepared = fields[10:] if stored else (born_ip, born_port, None)
            # A prepared or rolled-back transaction message takes no queue offset.
            key = None if sys_flag & _PREPARED else (topic, queue_id_obj)
            known = _ABSENT if key is None else dict.get(pending, key, _ABSENT)
            if known is _ABSENT and key is not None and pending is not queue_table:
                known = dict.get(queue_table, key, _ABSENT)
            queue_offset = 0 if known is _ABSENT else _arg_int(known, "queue_offset", *_HALF)
            if not (stored and waits):  # a stored run's records share its first's time
                now = time.time_ns() // 1_000_000 if clock is None else clock()
                store_ts = _arg_int(now, "store_timestamp", *_I64)
            fp = _FastPut(
                bytes(topic_b), bytes(cluster_b), topic, queue_id, sys_flag, born_ts,
                bytes(entry_born), entry_port, store_ts, bytes(store_ip), store_port, reconsume,
                max_bp,
            )  # fmt: skip
            first, count = len(rows), len(waits)
            placed = _write_entry(
                buf, pos, limit, file_from, fp, body, props, flag, queue_offset, hint_type, rows,
                prepared, eh,
            )  # fmt: skip
            if placed is None:
                break  # the general path judges it; bytes past pos are junk
            end, wait = placed
            try:  # the table's entry is the commit
                waits.append(wait)
                if key is not None:
                    pending[key] = queue_offset + len(rows) - first
            except BaseException:
                del rows[first:], waits[count:]
                buf[pos:end] = bytes(end - pos)  # no whole record past the write position
                raise
            if eh is not None:
                eh[0] += len(rows) - first  # one entry a record
            pos = end
            stamp = store_ts
        if stored and len(waits) < len(entries):  # all or nothing: none
            buf[start:pos] = bytes(pos - start)
            return start, [], [], 0, None
        if pending is not queue_table:
            queue_table.update(pending)
    except BaseException as exc:
        if stored and pos > start:
            buf[start:pos] = bytes(pos - start)
        if not rows or stored:
            raise  # nothing committed
        return pos, rows, waits, stamp, exc
    return pos, rows, waits, stamp, None


encode_run: Callable[..., Any] = getattr(native_extension, "encode_run", encode_run_py)
"""The store's one record encoder as pymq picked it (the C function, or encode_run_py): a run of
sends' records into any writable buffer at a given physical offset (see encode_run_py)."""


BORN_IPS_MAX = 65536
"""Peers' packed addresses a commit log keeps (``CommitLog._born_ips``) before it empties them."""


def packed_born_ip(born_ips: dict[str, bytes], host: str, pack_ip: Callable[[str], bytes]) -> bytes:
    """``host`` packed by ``pack_ip`` and kept in ``born_ips`` (a commit log's dict of its peers'
    addresses, emptied at :data:`BORN_IPS_MAX`); raises ``pack_ip``'s error for no address."""
    born_ip = pack_ip(host)
    if len(born_ips) >= BORN_IPS_MAX:
        born_ips.clear()
    born_ips[host] = born_ip
    return born_ip


def stored_entries_py(
    msgs: Sequence[MessageExt],
    encoded: Sequence[tuple[bytes, bytes]],
    fixed: tuple[int, int],
    pack_ip: Callable[[str], bytes],
    born_ips: dict[str, bytes],
) -> tuple[list[tuple[Any, ...]], int, dict[str, bytes], bool]:
    """Python twin of ``pymq.store._commitlogc.stored_entries``: the :data:`encode_run`
    entries of stored messages ``msgs`` (``encoded``: each one's (topic, properties) bytes,
    a pair), the bytes their records take (``fixed``: a record's fixed part with a 4- and a
    16-byte born host), their topics' bytes, and whether any properties hold a NUL.  A born
    host is packed by ``pack_ip`` once and kept in ``born_ips`` (CommitLog's dict of its
    peers' addresses, emptied at :data:`BORN_IPS_MAX`).  Raises for a born host that is no
    address (``pack_ip``'s error) or a body that is no bytes (see CommitLog._encode_failed)."""
    if not isinstance(fixed, tuple) or len(fixed) != 2 or not isinstance(born_ips, dict):
        raise TypeError("stored_entries: bad argument types")
    sizes = (operator.index(fixed[0]), operator.index(fixed[1]))
    entries: list[tuple[Any, ...]] = []
    topics: dict[str, bytes] = {}
    total = 0
    nul = False
    i = 0
    for msg in msgs:
        pair = encoded[i]
        i += 1  # noqa: SIM113 (encoded is indexed, as the C function reads it)
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise ValueError("stored_entries: an encoded item is no pair")
        topic_b, props_b = pair
        born_host = msg.born_host
        born_ip = born_ips.get(born_host[0]) or packed_born_ip(born_ips, born_host[0], pack_ip)
        body = msg.body
        topic = msg.topic
        total += sizes[len(born_ip) == 16] + len(body) + len(topic_b) + len(props_b)
        entries.append(
            (topic, msg.queue_id, body, props_b, msg.flag, msg.sys_flag,
             msg.born_timestamp, msg.reconsume_times, born_ip, born_host[1],
             msg.prepared_transaction_offset)
        )  # fmt: skip
        topics[topic] = topic_b
        if 0 in props_b:  # rare: data, unless where a torn write leaves zeros
            nul = True
    return entries, total, topics, nul


stored_entries: Callable[..., Any] = getattr(native_extension, "stored_entries", stored_entries_py)
"""The encode_run entries of stored messages (:func:`stored_entries_py`), in one C call when
the extension is built."""


# Batch bodies from this size on are written with pwrite, not through the map: for a batch,
# pwrite costs a fraction of the page faults (and readahead zeroing large folios of new memory)
# that writing it through the map takes; for a single record the two cost the same.
PWRITE_BATCH_MIN = 16 * 1024
# The encoding buffer kept for the next batch; a larger batch's is dropped after its write.
SCRATCH_KEPT_MAX = 1 << 20
# ASYNC_FLUSH: the file's pages ahead of the writer are advised MADV_RANDOM (as SYNC_FLUSH's
# always are: MappedFile.advise_writes) once batches written with pwrite have outweighed
# records written through the map by this many bytes, and read ahead again once records
# written through the map outweigh the batches by as much.  Reads of a pwritten batch through
# the map (dispatch's check of each record, consumers) faulted with readahead, which zeroed
# large folios of the unwritten blocks ahead, a large share of the broker's time under
# batches.  A record written through the map into advised pages faults a page at a time
# instead, which costs more than a small readahead and less than a large one:
# commitLogWriteAdvice=auto advises every write on a device that reads ahead 1 MiB or more,
# and this balance decides elsewhere.
ADVICE_SWITCH_BYTES = 4 << 20


def _scrub(mf: MappedFile, start: int, end: int) -> None:
    """Zero ``[start, end)`` of ``mf``, past its write position, where a put that was refused
    or failed wrote records before giving up.  They are junk to the store until a record is
    committed over them, but whole records there are valid ones to a recovery after a restart
    (which scans to the first record that is not), and a later record that ends where one of
    them begins would make it the next: a refused message would come back as stored."""
    end = min(end, mf.allocated, mf.file_size)
    if end > start:
        with contextlib.suppress(ValueError, OSError):  # closed meanwhile
            mf.mm[start:end] = bytes(end - start)


class CommitLog:
    def __init__(
        self,
        directory: str,
        file_size: int,
        allocator: MappedFileAllocator | None = None,
        clock_ms: Callable[[], int] = now_ms,
        *,
        warm: bool = False,
        advise_writes: bool = False,
    ) -> None:
        self.queue = MappedFileQueue(directory, file_size, allocator)
        # SYNC_FLUSH: its tail faulted in a page at a time (MappedFile.advise_writes), or each
        # group commit's sync writes a whole large folio again.
        self.queue.advise_writes = advise_writes
        # ASYNC_FLUSH's advice follows the writes (ADVICE_SWITCH_BYTES); SYNC_FLUSH's is fixed.
        self._advice_follows_writes = not advise_writes
        # Bytes written with pwrite minus bytes written through the map, kept within
        # +-ADVICE_SWITCH_BYTES: the advice changes at either bound.
        self._advice_balance = 0
        self.file_size = file_size
        # warmMapedFileEnable: one chunk allocated ahead of the writer and its pages faulted in
        # by a worker thread, so that puts take no page faults; the cost is that those pages
        # are dirty, so a flush writes them to disk as zeros before their data (as Java's
        # warm-up writes zeros over each new file).
        self.warm = warm
        # Next logical offset per (topic, queueId): Java's "topic-queueId" table, keyed by tuple
        # because building the string key cost more than the rest of a put's bookkeeping.
        self.topic_queue_table: dict[tuple[str, int], int] = {}
        # What dispatch needs of each record just appended, oldest first.  Reput uses a hint
        # instead of parsing the record back when the hint's offset and size match the record
        # it reaches; anything else it parses.  None for SCHEDULE_TOPIC_XXXX, whose tags code
        # is a delivery time reput works out itself.
        self.dispatch_hints: collections.deque[DispatchHint] = collections.deque()
        self._born_ips: dict[str, bytes] = {}  # peers' addresses packed by the one-call appends
        # Where a large batch's records are encoded before one pwrite (see _append_aside).
        self._scratch = bytearray()
        self.clock_ms = clock_ms
        # True from a failed file creation (or block allocation) until the next append that
        # succeeds.
        self.create_failing = False
        # A failed block allocation (a full disk): the error, and when (time.monotonic) the
        # put path may try again; until then puts needing blocks are refused without a syscall.
        self._allocate_error: OSError | None = None
        self._allocate_retry_at = 0.0
        self._ahead_retry_at = 0.0  # when the next chunk may be allocated ahead again
        self.allocate_retry_interval = (
            allocator.retry_interval if allocator is not None else DEFAULT_CREATE_RETRY_INTERVAL_S
        )
        self.set_store_host("127.0.0.1", 0)

    def set_store_host(self, ip: str, port: int) -> None:
        """The broker's advertised address: STOREHOST of new records and their message ids."""
        self.store_host = (ip, port)
        self._store_ip = pack_ip(ip)
        self._store_port = port
        # A record's bytes beside its body, topic and properties, by its born host's address
        # (index: whether IPv6) with this store host: per put, two lookups fewer.
        store_v6 = 2 if len(self._store_ip) == 16 else 0
        self._record_fixed = (_HEADER_SIZES[store_v6] + 3, _HEADER_SIZES[store_v6 | 1] + 3)
        # What msg_id puts before a record's offset: the store host's address and port in hex.
        self.msg_id_prefix = (self._store_ip + _INT.pack(port)).hex().upper()

    # --- offsets -------------------------------------------------------------------------------

    @property
    def max_offset(self) -> int:
        return self.queue.max_offset

    @property
    def min_offset(self) -> int:
        """The first offset still stored (0 for an empty log)."""
        files = self.queue.files
        return files[0].file_from_offset if files else 0

    def holds_no_data(self) -> bool:
        """True when the log has no file (recovery then drops the consume queues)."""
        return not self.queue.files

    def roll_next_file(self, offset: int) -> int:
        return offset + self.file_size - offset % self.file_size

    def msg_id(self, phy_offset: int) -> str:
        return offset_msg_id(self.msg_id_prefix, phy_offset)

    # --- appends -------------------------------------------------------------------------------

    def _writable_file(self, needed: int) -> MappedFile:
        """The file to append ``needed`` bytes to, closing the current one with a blank if the
        bytes plus a blank header would not fit.  Raises ``OSError`` if a file cannot be made;
        then nothing has changed: the next file is made before the current one is closed."""
        queue = self.queue
        mf = queue.get_last_mapped_file(0)
        if needed + END_FILE_MIN_BLANK_LENGTH > mf.remaining:
            if mf.wrote_position + END_FILE_MIN_BLANK_LENGTH > mf.allocated:
                self._allocate(mf, mf.wrote_position + END_FILE_MIN_BLANK_LENGTH)
            nxt = queue.create_next_file()
            if needed > nxt.allocated:  # a record larger than the first chunk
                try:
                    self._allocate(nxt, needed)
                except OSError:
                    nxt.close()  # the file stays; the next try maps it again
                    raise
            _BLANK.pack_into(mf.mm, mf.wrote_position, mf.remaining, BLANK_MAGIC_CODE)
            mf.wrote_position = mf.file_size
            queue.add_file(nxt)
            mf = nxt
        return mf

    def _weigh_advice(self, mf: MappedFile, written: int) -> None:
        """ASYNC_FLUSH: ``written`` bytes went to ``mf`` with pwrite (positive) or through the
        map (negative: every put path but append_run's large batches (_append_aside); not the HA
        slave's append_data, which never writes with pwrite, so its advice never begins).
        At +ADVICE_SWITCH_BYTES the pages ahead of the writer are advised
        MADV_RANDOM, at -ADVICE_SWITCH_BYTES read ahead again, for this file and the files the
        queue makes next."""
        balance = self._advice_balance + written
        if balance >= ADVICE_SWITCH_BYTES:
            balance = ADVICE_SWITCH_BYTES
            if not mf.advise:
                self.queue.advise_writes = True
                mf.advise_writes()
        elif balance <= -ADVICE_SWITCH_BYTES:
            balance = -ADVICE_SWITCH_BYTES
            if mf.advise:
                self.queue.advise_writes = False
                mf.end_write_advice()
        self._advice_balance = balance

    def _wrote_through_map(self, mf: MappedFile, size: int) -> None:
        """A put (append_stored, append_run) wrote ``size`` bytes through
        ``mf``'s map and committed them: weighed against the advice (ASYNC_FLUSH), and the
        next chunk allocated ahead (warmMapedFileEnable)."""
        if self._advice_follows_writes:
            # _weigh_advice(mf, -size), inline while the advice stays: this is every put's.
            balance = self._advice_balance - size
            if balance > -ADVICE_SWITCH_BYTES:
                self._advice_balance = balance
            else:
                self._weigh_advice(mf, -size)
        if self.warm and mf.allocated - mf.wrote_position <= mf.chunk:
            self._allocate_ahead(mf)

    def _allocate(self, mf: MappedFile, end: int) -> None:
        """Allocate ``mf``'s blocks up to ``end`` before a write there (see MappedFile).

        Raises ``OSError`` (nothing changed) on a full disk; after a failure the put path does
        not try again for ``allocate_retry_interval`` seconds: puts needing blocks are refused
        at once meanwhile (CREATE_MAPEDFILE_FAILED, as when a file cannot be created)."""
        failed = self._allocate_error
        if failed is not None and time.monotonic() < self._allocate_retry_at:
            raise OSError(failed.errno, failed.strerror)
        try:
            mf.allocate_to(end)
        except OSError as exc:
            self._allocate_error = exc
            self._allocate_retry_at = time.monotonic() + self.allocate_retry_interval
            raise
        self._allocate_error = None

    def _born_ip(self, host: str) -> bytes | None:
        """``host`` packed (once per peer address), or None when it is no address."""
        born_ip = self._born_ips.get(host)
        if born_ip is None:
            try:
                born_ip = packed_born_ip(self._born_ips, host, pack_ip)
            except (ValueError, OSError, TypeError, IndexError):
                return None
        return born_ip

    def _allocate_ahead(self, mf: MappedFile) -> None:
        """warmMapedFileEnable: the writer has entered ``mf``'s last allocated chunk, so the
        next one is allocated now and its pages faulted in off the event loop
        (MappedFile.allocate_ahead).  A failure (a full disk) changes nothing: the write that
        needs those blocks allocates them, and is refused, as before; the next try waits
        ``allocate_retry_interval``."""
        if mf.allocated >= mf.file_size or time.monotonic() < self._ahead_retry_at:
            return
        if not mf.allocate_ahead():
            self._ahead_retry_at = time.monotonic() + self.allocate_retry_interval

    def _create_failed(self, exc: OSError) -> PutMessageResult:
        """CREATE_MAPEDFILE_FAILED for a put (logged once per run of failures).  Also the
        answer when the blocks of a commit-log file cannot be allocated."""
        if not self.create_failing:
            self.create_failing = True
            log.error(
                "cannot create or allocate a commit-log file, puts are refused until it can be: %s",
                exc,
            )
        # The sender learns the cause, not the server's paths (the log has those).
        cause = os.strerror(exc.errno) if exc.errno else type(exc).__name__
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            cause += " (disk full)"
        return PutMessageResult(
            PutMessageStatus.CREATE_MAPEDFILE_FAILED,
            reason=f"create mapped file failed, server is busy or broken: {cause}",
        )

    def _encode_failed(self, msgs: Sequence[MessageExt], exc: Exception) -> PutMessageResult:
        """The answer to records that could not be encoded (nothing was changed): the first
        field a message's record cannot hold, else the error."""
        for msg in msgs:
            why = field_error(msg)
            if why is not None:
                return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, reason=why)
        if not isinstance(exc, _ENCODE_ERRORS):
            log.exception("encoding a record of %s failed", msgs[0].topic)
            return PutMessageResult(
                PutMessageStatus.UNKNOWN_ERROR,
                reason=f"the record could not be encoded: {type(exc).__name__}: {exc}",
            )
        return PutMessageResult(
            PutMessageStatus.MESSAGE_ILLEGAL, reason=f"{type(exc).__name__}: {exc}"
        )

    def _roll_refusal(self, size: int, msgs: Sequence[MessageExt]) -> PutMessageResult | None:
        """Before a file is closed and a new one made for ``size`` bytes of records: why the
        put is refused (too large for a file, a field its encoder would refuse), or None."""
        if size + END_FILE_MIN_BLANK_LENGTH > self.file_size:
            return PutMessageResult(
                PutMessageStatus.MESSAGE_ILLEGAL,
                reason=f"{size} bytes do not fit in a commit-log file of {self.file_size}",
            )
        for msg in msgs:
            why = field_error(msg)
            if why is not None:
                return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, reason=why)
        return None

    def _space_back(self) -> None:
        """A file was made or blocks allocated: end a run of CREATE_MAPEDFILE_FAILED."""
        if self.create_failing:
            self.create_failing = False
            log.warning("commit-log space is back: puts are accepted again")

    def _tear_safe_entries(
        self, msgs: Sequence[MessageExt], entries: list[tuple[Any, ...]],
        topics: dict[str, bytes], pos: int,
    ) -> PutMessageResult | None:  # fmt: skip
        """Properties holding a NUL, of records to be written from file offset ``pos``, put in
        an order that recovery cannot take for a torn write (:func:`_tear_safe`), in place in
        ``entries``; the refusal when no order avoids it."""
        fixed = self._record_fixed
        for i, entry in enumerate(entries):
            props_b = entry[3]
            size = fixed[len(entry[8]) == 16] + len(entry[2]) + len(topics[entry[0]]) + len(props_b)
            if 0 in props_b:
                safe = _tear_safe(msgs[i], props_b, pos + size - len(props_b))
                if isinstance(safe, PutMessageResult):
                    return safe
                entries[i] = (*entry[:3], safe, *entry[4:])
            pos += size
        return None

    def append_stored(
        self, msgs: Sequence[MessageExt], encoded: Sequence[tuple[bytes, bytes]]
    ) -> PutMessageResult:
        """Append stored messages' records (one message, or a batch: one file, consecutive
        queue offsets when of one queue) through the one record encoder (:data:`encode_run`,
        a run of stored messages): each record as given (``encoded``: each message's topic and
        properties bytes, already checked against the layout limits by the caller; the
        properties written as they are, in another order only where a NUL of theirs would
        land where recovery takes it for a torn write), its host flags those its born host's
        and the store host's addresses imply, no queue offset for a prepared or rolled-back
        transaction message.  Store timestamp (one for all), physical and queue offsets are
        assigned here; the messages are updated in place with them.

        All or nothing: a refusal (status and reason, never an exception for a bad message)
        leaves the offset table, the write position and the dispatch hints as they were.
        Fields are checked up front before a file is closed and a new one made (the only other
        change a put makes)."""
        try:
            entries, total, topics, nul = stored_entries(
                msgs, encoded, self._record_fixed, pack_ip, self._born_ips
            )
        except Exception as exc:  # a born host that is no address, a body that is no bytes
            return self._encode_failed(msgs, exc)
        files = self.queue.files
        mf = files[-1] if files else None
        if mf is None or total + END_FILE_MIN_BLANK_LENGTH > mf.file_size - mf.wrote_position:
            refused = self._roll_refusal(total, msgs)
            if refused is not None:
                return refused
            try:
                mf = self._writable_file(total)
            except OSError as exc:
                return self._create_failed(exc)
            self._space_back()
        pos = mf.wrote_position
        if pos + total > mf.allocated:  # the next chunk's blocks, before the encoder writes
            try:
                self._allocate(mf, pos + total)
            except OSError as exc:
                return self._create_failed(exc)
            self._space_back()
        if nul:
            refused = self._tear_safe_entries(msgs, entries, topics, pos)
            if refused is not None:
                return refused
        try:
            end, hints, _, now, _ = encode_run(
                mf.mm, pos, pos + total, mf.file_from_offset, entries, topics,
                self.topic_queue_table, None if self.clock_ms is now_ms else self.clock_ms,
                b"", b"", 0, self._store_ip, self._store_port, 0, 0, "", DispatchHint,
            )  # fmt: skip
        except Exception as exc:  # nothing is committed (the encoder zeroed what it wrote)
            return self._encode_failed(msgs, exc)
        if not hints:  # a field the record layout cannot hold (the caller checks them)
            return self._encode_failed(msgs, ValueError("the records do not fit their layout"))
        # Encoded (the queue table already says so): commit.
        mf.wrote_position = end
        mf.last_store_timestamp = now
        self._wrote_through_map(mf, total)
        queued = self.dispatch_hints
        # A hint is a tuple subclass, which the interpreter subscripts by its generic path
        # (~115 instructions an item): each field is read once, the topic and the result's
        # fields from the (slotted) messages instead (7 subscripts a put before, 4 now).
        i = 0  # an index, not zip (an object per put); as long: all or nothing
        for hint in hints:
            msg = msgs[i]
            i += 1  # noqa: SIM113 (see above)
            msg.sys_flag = hint[7]
            msg.queue_offset = hint[4]
            msg.commitlog_offset = hint[0]
            msg.store_timestamp = now
            msg.store_size = hint[1]
            if len(queued) < DISPATCH_HINTS_MAX and msg.topic != SCHEDULE_TOPIC:
                queued.append(hint)
        first = msgs[0]
        return PutMessageResult(
            PUT_OK, first.commitlog_offset, total, offset_msg_ids(self.msg_id_prefix, hints),
            now, first.queue_offset, len(hints),
        )  # fmt: skip

    def append_run(
        self,
        entries: Sequence[tuple[str, int, Any, str | None, int, int, int, int]],
        topic_bytes: dict[str, bytes],
        cluster_b: bytes,
        born_host: tuple[str, int],
        max_body_properties: int,
        stop_flags: int,
    ) -> tuple[list[DispatchHint], list[str | None], int]:
        """Append a run of sends from one peer through the one record encoder
        (:data:`encode_run`): each of ``entries``, (topic, queue id, body, properties, flag,
        sys flag, born timestamp, reconsume times), is a single send (properties its
        request's str) or, with properties None, a SEND_BATCH_MESSAGE body whose items are
        its records: the records, offsets and hints the general path
        (:meth:`append_stored` of the messages the send path builds) makes, without a
        message object or a properties dict.
        Stops at the first entry the encoder leaves to the general path (or whose topic is not
        in ``topic_bytes``, the store's checked topics, or whose sys flag has a bit of
        ``stop_flags``), or at a file's end (or its allocated blocks); returns the dispatch
        hints (one per record) and stored WAIT properties (one per entry: a batch's first
        item's) of the entries appended, in order, and the bytes they took.  A batch body of
        PWRITE_BATCH_MIN bytes or more at the head of the run is appended alone, encoded aside
        and written with one pwrite."""
        files = self.queue.files
        if not files or not entries:
            return [], [], 0
        if type(entries) is not list:
            entries = list(entries)
        mf = files[-1]
        born_ip = self._born_ips.get(born_host[0]) or self._born_ip(born_host[0])
        if born_ip is None:
            return [], [], 0
        start = mf.wrote_position
        in_file = mf.file_size - END_FILE_MIN_BLANK_LENGTH  # where the records must end
        first = entries[0]
        if first[3] is None and len(first[2]) >= PWRITE_BATCH_MIN:
            return self._append_aside(
                mf, first, topic_bytes, cluster_b, born_ip, born_host[1], max_body_properties,
                stop_flags,
            )  # fmt: skip
        try:
            end, hints, waits, stamp, error = encode_run(
                mf.mm, start, min(mf.allocated, in_file), mf.file_from_offset, entries,
                topic_bytes, self.topic_queue_table,
                None if self.clock_ms is now_ms else self.clock_ms, cluster_b, born_ip,
                born_host[1], self._store_ip, self._store_port, max_body_properties, stop_flags,
                SCHEDULE_TOPIC, DispatchHint,
            )  # fmt: skip
        except Exception:  # a defect before anything was appended: the general path decides
            log.exception("appending a run of sends failed")
            return [], [], 0
        # Appended (the queue table already says so): commit, whatever the error.  The write
        # position first: the rest (the write advice, the chunk allocated ahead, the dispatch
        # hints, which reput does without) must not undo the commit if it fails.
        if end != start:
            mf.wrote_position = end
            mf.last_store_timestamp = stamp
            try:
                if self._advice_follows_writes:  # _wrote_through_map's, inline: every put's
                    balance = self._advice_balance - (end - start)
                    if balance > -ADVICE_SWITCH_BYTES:
                        self._advice_balance = balance
                    else:
                        self._weigh_advice(mf, start - end)
                # The next chunk allocated ahead (warmMapedFileEnable) and the run's dispatch
                # hints queued for reput (which does without them past DISPATCH_HINTS_MAX).
                if self.warm and mf.allocated - end <= mf.chunk:
                    self._allocate_ahead(mf)
                queued = self.dispatch_hints
                room = DISPATCH_HINTS_MAX - len(queued)
                if room > 0:
                    queued.extend(hints if room >= len(hints) else hints[:room])
            except Exception:  # bookkeeping
                log.exception("the bookkeeping of a run of %d appends failed", len(hints))
        if error is not None:  # a defect: what was appended stands, the rest go one by one
            if not isinstance(error, Exception):
                raise error  # KeyboardInterrupt and the like, once the appends are committed
            log.error("appending a run of sends failed after %d", len(waits), exc_info=error)
        return hints, waits, end - start

    def _append_aside(
        self, mf: MappedFile, entry: tuple[str, int, Any, str | None, int, int, int, int],
        topic_bytes: dict[str, bytes], cluster_b: bytes, born_ip: bytes, born_port: int,
        max_body_properties: int, stop_flags: int,
    ) -> tuple[list[DispatchHint], list[str | None], int]:  # fmt: skip
        """append_run of a large batch body: its records encoded aside, then written with one
        pwrite: a write through the map faults in each new page of the file (and, read ahead,
        zeroes a large folio around it), which cost a fifth of the broker's time on batches of
        32 (see PWRITE_BATCH_MIN).  The records land in the page cache the map reads, so
        readers see them as usual.  The queue offsets are committed once the write is done."""
        pos = mf.wrote_position
        buf = self._scratch_for(len(entry[2]))
        limit = max(0, min(mf.file_size - END_FILE_MIN_BLANK_LENGTH - pos, len(buf)))
        key = (entry[0], entry[1])
        table = self.topic_queue_table
        pending = {key: table[key]} if key in table else {}
        try:
            stop, hints, waits, stamp, _ = encode_run(
                buf, 0, limit, mf.file_from_offset + pos, [entry], topic_bytes, pending,
                None if self.clock_ms is now_ms else self.clock_ms, cluster_b, born_ip,
                born_port, self._store_ip, self._store_port, max_body_properties, stop_flags,
                SCHEDULE_TOPIC, DispatchHint,
            )  # fmt: skip
        except Exception:  # a defect before anything was encoded: the general path decides
            log.exception("encoding a batch of %s failed", entry[0])
            return [], [], 0
        if not hints:
            return [], [], 0
        end = pos + stop
        if end > mf.allocated:
            # The next chunk's blocks, here rather than by the general path, whose write
            # through the map would read ahead (zero) a large folio of the chunk.
            try:
                self._allocate(mf, end)
            except OSError:
                return [], [], 0  # refused by the general path, as ever
            self._space_back()
        if not mf.write_at(pos, memoryview(buf)[:stop]):
            _scrub(mf, pos, end)  # whatever of the records it wrote
            return [], [], 0
        # Written: commit.
        table.update(pending)
        mf.wrote_position = end
        mf.last_store_timestamp = stamp
        if self._advice_follows_writes:
            self._weigh_advice(mf, stop)
        if self.warm and mf.allocated - end <= mf.chunk:  # as append_run's bookkeeping
            self._allocate_ahead(mf)
        queued = self.dispatch_hints
        room = DISPATCH_HINTS_MAX - len(queued)
        if room > 0:
            queued.extend(hints if room >= len(hints) else hints[:room])
        return hints, waits, stop

    def put_result(self, hints: list[DispatchHint]) -> PutMessageResult:
        """The PutMessageResult of one entry :meth:`append_run` appended, from its records'
        ``hints`` (a single send's one, a batch's all): what :meth:`append_stored` returns
        for the same messages."""
        first = hints[0]
        phy = first.physical_offset
        prefix = self.msg_id_prefix
        if len(hints) == 1:
            return PutMessageResult(
                PUT_OK, phy, first.size, offset_msg_id(prefix, phy), first.store_timestamp,
                first.queue_offset,
            )  # fmt: skip
        last = hints[-1]
        return PutMessageResult(
            PUT_OK,
            wrote_offset=phy,
            wrote_bytes=last.physical_offset + last.size - phy,
            msg_id=offset_msg_ids(prefix, hints),  # type: ignore[arg-type]
            store_timestamp=first.store_timestamp,
            logic_offset=first.queue_offset,
            msg_num=len(hints),
        )

    def _scratch_for(self, body_size: int) -> bytearray:
        """A buffer for the records of a batch body of ``body_size`` bytes (an item's record is
        its item plus ~100 bytes), kept for the next batch up to SCRATCH_KEPT_MAX."""
        room = body_size * 2 + 65536
        scratch = self._scratch
        if len(scratch) < room:
            scratch = bytearray(room)
            if room <= SCRATCH_KEPT_MAX:
                self._scratch = scratch
        return scratch

    def append_data(self, start_offset: int, data: bytes | memoryview) -> bool:
        """Append raw commit-log bytes replicated from a master (HA slave).

        ``start_offset`` must be exactly the current max offset; data that crosses a file
        boundary is split at it.  Returns False (nothing written) on a mismatch or a failure.
        """
        if start_offset != self.max_offset:
            log.warning("HA append at %d but commit log ends at %d", start_offset, self.max_offset)
            return False
        view = memoryview(data)
        offset = start_offset
        while view:
            try:
                mf = self.queue.get_last_mapped_file(offset)
            except OSError:
                log.exception("cannot create a commit-log file for replicated data")
                return False
            chunk = view[: mf.remaining]
            try:
                mf.append(chunk)  # allocates its blocks first
            except OSError as exc:
                log.error("cannot allocate commit-log blocks for replicated data: %s", exc)
                return False
            offset += len(chunk)
            view = view[len(chunk) :]
            if self.warm and mf.allocated - mf.wrote_position <= mf.chunk:
                self._allocate_ahead(mf)
        return True

    # --- reads ---------------------------------------------------------------------------------

    def get_message(self, offset: int, size: int) -> bytes | None:
        """A copy of ``size`` bytes at ``offset``, or None when not (or no longer) stored."""
        mf = self.queue.find_by_offset(offset)
        if mf is None:
            return None
        return mf.read(offset - mf.file_from_offset, size)

    def get_record(self, offset: int) -> bytes | None:
        """A copy of the record at ``offset``, its size read from its TOTALSIZE; None when no
        record of a positive size is wholly stored there (one lookup and one copy: what
        ``get_message(offset, 4)`` and then ``get_message(offset, size)`` would give)."""
        mf = self.queue.find_by_offset(offset)
        if mf is None:
            return None
        pos = offset - mf.file_from_offset
        if pos < 0 or pos + 4 > mf.wrote_position:
            return None
        size = _INT.unpack_from(mf.mm, pos)[0]
        if size <= 0:
            return None
        return mf.read(pos, size)

    def get_data(self, offset: int, max_size: int | None = None) -> bytes | None:
        """Bytes from ``offset`` to the end of what its file holds (for HA and reput)."""
        mf = self.queue.find_by_offset(offset, offset == 0)
        if mf is None:
            return None
        pos = offset - mf.file_from_offset
        if pos < 0:
            return None
        end = mf.wrote_position if max_size is None else min(mf.wrote_position, pos + max_size)
        return mf.read(pos, end - pos) if end >= pos else None

    def pickup_store_timestamp(self, offset: int, size: int) -> int:
        """STORETIMESTAMP of the record at ``offset``, or -1 when it is not stored."""
        mf = self.queue.find_by_offset(offset)
        if mf is None:
            return -1
        pos = offset - mf.file_from_offset
        if pos + min(size, 76) > mf.wrote_position:
            return -1
        sys_flag = _INT.unpack_from(mf.mm, pos + SYSFLAG_POSITION)[0]
        return _LONG.unpack_from(mf.mm, pos + store_timestamp_position(sys_flag))[0]

    # --- recovery (blocking) -------------------------------------------------------------------

    def load(self) -> None:
        self.queue.load()

    def _scan_file(
        self, mf: MappedFile, check_crc: bool, dispatcher: RecoveryDispatcher | None
    ) -> tuple[int, bool]:
        """(end of valid data in the file, whether the scan may go on into the next file)."""
        select = dispatcher.selector() if dispatcher is not None else None
        end, why, selected = scan_records(
            mf.mm,
            0,
            mf.file_size,
            check_crc=check_crc,
            physical_base=mf.file_from_offset,
            select=select,
        )
        if dispatcher is not None:
            for pos in selected:
                dispatcher.dispatch(read_record_info(mf.mm, pos, check_crc=False))
        if why == "end":
            return end, True
        if why == "blank":
            total = _BLANK.unpack_from(mf.mm, end)[0]
            if total != mf.file_size - end:
                log.warning("blank record at %d of %s has a wrong size", end, mf.path)
                return end, False
            return end, True
        if mf.mm[end : end + END_FILE_MIN_BLANK_LENGTH].strip(b"\0"):
            log.warning("recovery stops in %s: %s", mf.path, why)
        return end, False

    def _recover_from(
        self, start: int, check_crc: bool, dispatcher: RecoveryDispatcher | None
    ) -> int:
        files = self.queue.files
        process_offset = files[start].file_from_offset
        for i in range(start, len(files)):
            mf = files[i]
            pos, go_on = self._scan_file(mf, check_crc, dispatcher)
            process_offset = mf.file_from_offset + pos
            if not go_on:
                break
        self.queue.flushed_where = process_offset
        self.queue.truncate_dirty_files(process_offset)
        return process_offset

    def recover_normally(self, check_crc: bool) -> int:
        """Blocking: rescan the last three files; return the end of valid data."""
        files = self.queue.files
        if not files:
            self.queue.flushed_where = 0
            return 0
        return self._recover_from(max(0, len(files) - RECOVER_FROM_LAST_FILES), check_crc, None)

    def recover_abnormally(
        self, check_crc: bool, min_timestamp: int, dispatcher: RecoveryDispatcher
    ) -> int:
        """Blocking: re-dispatch from the newest file whose first record is older than
        ``min_timestamp`` (the checkpoint), or from the first file; return the end of valid data.
        """
        files = self.queue.files
        if not files:
            self.queue.flushed_where = 0
            return 0
        start = 0
        for i in range(len(files) - 1, -1, -1):
            if self._first_record_older_than(files[i], min_timestamp):
                start = i
                log.info("abnormal recovery starts at %s", files[i].path)
                break
        return self._recover_from(start, check_crc, dispatcher)

    @staticmethod
    def _first_record_older_than(mf: MappedFile, min_timestamp: int) -> bool:
        mm = mf.mm
        if _BLANK.unpack_from(mm, 0)[1] != MESSAGE_MAGIC_CODE:
            return False
        sys_flag = _INT.unpack_from(mm, SYSFLAG_POSITION)[0]
        stamp = _LONG.unpack_from(mm, store_timestamp_position(sys_flag))[0]
        return stamp != 0 and stamp <= min_timestamp

    def close(self) -> None:
        self.queue.close()


def encode_record(msg: MessageExt) -> bytes:
    """The whole record of ``msg`` as bytes, by the one encoder (:func:`encode_run`); body CRC
    and host flags are computed here.

    Raises :class:`RecordError` when the topic or properties are too long for the layout.
    """
    topic = msg.topic.encode()
    props = properties_bytes(msg.properties)
    if len(topic) > MAX_TOPIC_LENGTH:
        raise RecordError(f"topic is {len(topic)} bytes, more than {MAX_TOPIC_LENGTH}")
    if len(props) > MAX_PROPERTIES_LENGTH:
        raise RecordError(f"properties are {len(props)} bytes, more than {MAX_PROPERTIES_LENGTH}")
    if has_nul(topic):
        raise RecordError("a topic may not contain NUL characters")
    born_ip = pack_ip(msg.born_host[0])
    store_ip = pack_ip(msg.store_host[0])
    sys_flag = (msg.sys_flag & ~_HOST_FLAGS) | host_flags(born_ip, store_ip)
    buf = bytearray(record_length(sys_flag, len(msg.body), len(topic), len(props)))
    entry = (
        msg.topic, msg.queue_id, msg.body, props, msg.flag, sys_flag, msg.born_timestamp,
        msg.reconsume_times, born_ip, msg.born_host[1], msg.prepared_transaction_offset,
    )  # fmt: skip
    _, rows, _, _, _ = encode_run(
        buf, 0, len(buf), 0, [entry], {msg.topic: topic}, {},
        itertools.repeat(msg.store_timestamp).__next__, b"", b"", 0, store_ip,
        msg.store_host[1], 0, 0, "", None,
    )  # fmt: skip
    if not rows:
        raise RecordError("the message does not fit the record layout")
    # Its offsets as the message has them (a prepared message's queue offset too).
    _LONG.pack_into(buf, QUEUE_OFFSET_POSITION, msg.queue_offset)
    _LONG.pack_into(buf, PHYSICAL_OFFSET_POSITION, msg.commitlog_offset)
    return bytes(buf)
