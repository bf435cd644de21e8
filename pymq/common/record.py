"""The one commit-log record codec (RocketMQ 4.x): store, pull path, HA and export share it.

Pure functions and data classes, no I/O.  A record is laid out as Java's
``CommitLog.MessageExtEncoder`` writes it (all integers big-endian)::

    TOTALSIZE i4 | MAGICCODE i4 | BODYCRC i4 | QUEUEID i4 | FLAG i4 | QUEUEOFFSET i8 |
    PHYSICALOFFSET i8 | SYSFLAG i4 | BORNTIMESTAMP i8 | BORNHOST (4|16 + i4) | STORETIMESTAMP i8 |
    STOREHOSTADDRESS (4|16 + i4) | RECONSUMETIMES i4 | PREPAREDTRANSACTIONOFFSET i8 |
    BODYLENGTH i4 + BODY | TOPICLENGTH i1 + TOPIC | PROPERTIESLENGTH i2 + PROPERTIES

Decoding never trusts a length field: a record whose lengths disagree with TOTALSIZE, whose magic
is unknown or whose body fails its CRC raises :class:`RecordError`; the end-of-file filler raises
:class:`BlankRecord` (carrying its size) so that scanners can move to the next file.

The message type, its properties and flags are :mod:`pymq.common.message_ext`; ids are
:mod:`pymq.common.message_id`.
"""

from __future__ import annotations

import mmap
import struct
import zlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

from pymq.common.message_ext import (
    NAME_VALUE_SEPARATOR,
    PROPERTY_SEPARATOR,
    MessageExt,
    MessageSysFlag,
    decode_properties,
    properties_bytes,
)
from pymq.common.message_id import unpack_ip
from pymq.common.native import load_native

native_extension: Any = load_native("pymq.common._recordc")

# --- magic codes and limits ----------------------------------------------------------------------

MESSAGE_MAGIC_CODE = 0xDAA320A7
"""Magic of a message record (Java's ``-626843481``)."""
BLANK_MAGIC_CODE = 0xCBD43194
"""Magic of the filler that closes a commit-log file (Java's ``-875286124``)."""
END_FILE_MIN_BLANK_LENGTH = 8
"""A file always keeps room for a blank header: TOTALSIZE + MAGICCODE."""

MAX_TOPIC_LENGTH = 127
"""TOPICLENGTH is one signed byte in the 4.x record (the C++ client reads it signed)."""
MAX_PROPERTIES_LENGTH = 32767
"""PROPERTIESLENGTH is a signed short."""


class RecordError(ValueError):
    """Bytes that are not a whole, valid commit-log record; the message says what is wrong."""


class BlankRecord(Exception):
    """The end-of-file filler: the rest of this file (``size`` bytes) holds no message."""

    def __init__(self, size: int) -> None:
        super().__init__(f"blank end-of-file record of {size} bytes")
        self.size = size


# --- record layout --------------------------------------------------------------------------------


def _header_struct(born_v6: bool, store_v6: bool) -> struct.Struct:
    born = "16si" if born_v6 else "4si"
    store = "16si" if store_v6 else "4si"
    # total, magic, crc, queueId, flag, queueOffset, physOffset, sysFlag, bornTs, bornHost,
    # storeTs, storeHost, reconsumeTimes, preparedTxOffset, bodyLength
    return struct.Struct(f">iIiiiqqiq{born}q{store}iqi")


# Indexed by (sysFlag >> 4) & 3, i.e. by the two host flags.
_HEADERS = tuple(_header_struct(bool(i & 1), bool(i & 2)) for i in range(4))
_HOST_FLAGS = MessageSysFlag.BORNHOST_V6_FLAG | MessageSysFlag.STOREHOSTADDRESS_V6_FLAG
_INT = struct.Struct(">i")
_TWO_INTS = struct.Struct(">iI")
_SHORT = struct.Struct(">h")
_BYTE = struct.Struct(">b")
_LONG = struct.Struct(">q")

# Offsets of fields that scanners read without decoding a record (Java MessageDecoder).
MAGIC_POSITION = 4
QUEUE_ID_POSITION = 12
FLAG_POSITION = 16
QUEUE_OFFSET_POSITION = 20
PHYSICAL_OFFSET_POSITION = 28
SYSFLAG_POSITION = 36
BORN_TIMESTAMP_POSITION = 40
BORN_HOST_POSITION = 48


def store_timestamp_position(sys_flag: int) -> int:
    """Offset of STORETIMESTAMP: 56 with an IPv4 born host, 68 with IPv6."""
    return 68 if sys_flag & MessageSysFlag.BORNHOST_V6_FLAG else 56


def record_length(sys_flag: int, body_len: int, topic_len: int, props_len: int) -> int:
    """TOTALSIZE of a record (Java ``calMsgLength``)."""
    return _HEADERS[(sys_flag >> 4) & 3].size + body_len + 1 + topic_len + 2 + props_len


def body_crc32(body: bytes | memoryview) -> int:
    """BODYCRC: CRC-32 of the stored body, masked to a non-negative int as Java does."""
    return zlib.crc32(body) & 0x7FFFFFFF


def host_flags(born_ip: bytes, store_ip: bytes) -> int:
    """The IPv6 sysFlag bits implied by the packed host addresses."""
    flags = 0
    if len(born_ip) == 16:
        flags |= MessageSysFlag.BORNHOST_V6_FLAG
    if len(store_ip) == 16:
        flags |= MessageSysFlag.STOREHOSTADDRESS_V6_FLAG
    return flags


def has_nul(data: bytes) -> bool:
    """Whether ``data`` holds a NUL byte.  A topic may not (recovery takes one for a torn
    record); properties may, except where :func:`nul_where_torn` says."""
    return 0 in data  # the byte value: much cheaper than a b"\0" subsequence search


TEAR_ALIGN = 512
"""The granularity of a torn write: a sector.  A write lost in a power cut (a sparse or
preallocated file's zeros where the data should be) starts at a multiple of this in the file."""


def nul_where_torn(
    buf: bytes | bytearray | memoryview | mmap.mmap, start: int, length: int, origin: int = 0
) -> int:
    """The offset in ``buf`` of a NUL among the properties ``buf[start:start + length]`` that
    recovery must take for a torn write, or -1.

    Only the body has a CRC, so a record whose tail was lost (zeros from a sector boundary on)
    would still add up.  A lost stretch that reaches the properties zeroes their first byte (it
    began before them) or the byte at a sector boundary inside them (it began there), and one
    reaching the end zeroes their last byte.  A NUL anywhere else is data: Java's broker stores
    it, and the C++ client sometimes sends one in a message id.  ``origin`` is the file offset
    of ``buf[0]`` (the sector boundaries are the file's).
    """
    if length <= 0:
        return -1
    end = start + length
    if buf[start] == 0:
        return start
    if buf[end - 1] == 0:
        return end - 1
    at = start + (-(origin + start) % TEAR_ALIGN)
    while at < end:
        if buf[at] == 0:
            return at
        at += TEAR_ALIGN
    return -1


_TEAR_SAFE_PICKS = 4
"""How many first items, last items and rotations of the rest :func:`tear_safe_properties`
tries (at most 64 orders, so a hostile message costs a bounded amount of work)."""


def tear_safe_properties(props: Mapping[str, str], origin: int | None = None) -> bytes | None:
    """``props`` as properties bytes in an order with no NUL where :func:`nul_where_torn` takes
    one for a torn write, or None when none of the orders tried has one.

    Without ``origin``, only the first and last bytes count (a NUL at the start of a name, at
    the end of a value); with it (the file offset the properties start at), the sector
    boundaries too.  Properties are a map (Java's broker keeps them in a HashMap, consumers
    read them by name), so the store may write them in any order; it picks one rather than
    refuse a message whose NUL is data, and rather than refuse a message it re-puts itself
    (a delayed message's delivery, a half message put back for a check), which would be tried
    again for ever.  The bytes have the length of ``properties_bytes(props)``.
    """
    items = list(props.items())
    n = len(items)
    # A NUL character is the byte 0 in UTF-8, and no other character's first or last byte is.
    heads = [i for i, (k, _) in enumerate(items) if k[:1] != "\0"][:_TEAR_SAFE_PICKS]
    tails = [i for i, (_, v) in enumerate(items) if v[-1:] != "\0"][:_TEAR_SAFE_PICKS]
    for h in heads:
        for t in tails:
            if h == t and n > 1:
                continue
            rest = [items[i] for i in range(n) if i != h and i != t]
            for r in range(min(max(len(rest), 1), _TEAR_SAFE_PICKS)):
                order = [items[h], *rest[r:], *rest[:r], items[t]] if n > 1 else items
                data = properties_bytes(dict(order))
                if origin is None or nul_where_torn(data, 0, len(data), origin) < 0:
                    return data
    return None


def read_record_header(
    buf: bytes | bytearray | memoryview | mmap.mmap, pos: int
) -> tuple[int, int]:
    """(TOTALSIZE, MAGICCODE) at ``pos``; :class:`RecordError` if fewer than 8 bytes remain."""
    if pos + 8 > len(buf):
        raise RecordError(f"only {len(buf) - pos} bytes left at {pos}, no record header")
    return _TWO_INTS.unpack_from(buf, pos)


_V4_HEADER = _HEADERS[0]
_V4_HEADER_SIZE = _V4_HEADER.size


class RecordInfo(NamedTuple):
    """What dispatch and recovery need from a record, without building a message object."""

    size: int
    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    sys_flag: int
    store_timestamp: int
    properties: str
    prepared_transaction_offset: int


def _parse(
    buf: bytes | bytearray | memoryview | mmap.mmap,
    pos: int,
    check_crc: bool,
    read_body: bool,
    tears: bool = False,
) -> tuple[tuple, bytes, str, str]:
    """Validate the record at ``pos``: (header fields, body, topic, properties text).  With
    ``tears`` (``buf`` is a commit-log file from its first byte: recovery, the export), a NUL
    in the properties where a torn write leaves zeros is an error too."""
    limit = len(buf)
    total, magic = read_record_header(buf, pos)
    if magic == BLANK_MAGIC_CODE:
        if total < END_FILE_MIN_BLANK_LENGTH:
            raise RecordError(f"blank record of impossible size {total} at {pos}")
        raise BlankRecord(total)
    if magic != MESSAGE_MAGIC_CODE:
        raise RecordError(f"bad magic code 0x{magic:08X} at {pos}")
    if total < _HEADERS[0].size + 3 or pos + total > limit:
        raise RecordError(f"record at {pos} claims {total} bytes, {limit - pos} available")
    end = pos + total
    sys_flag = _INT.unpack_from(buf, pos + SYSFLAG_POSITION)[0]
    header = _HEADERS[(sys_flag >> 4) & 3]
    if header.size + 3 > total:
        raise RecordError(f"record at {pos} of {total} bytes is shorter than its header")
    fields = header.unpack_from(buf, pos)
    body_len = fields[-1]
    p = pos + header.size
    if body_len < 0 or p + body_len + 3 > end:
        raise RecordError(f"record at {pos}: body length {body_len} overruns the record")
    body = b""
    if body_len > 0:
        if read_body:
            body = bytes(buf[p : p + body_len])
            if check_crc and (zlib.crc32(body) & 0x7FFFFFFF) != fields[2]:
                raise RecordError(f"record at {pos}: body CRC mismatch")
        # No local name for the slice: a traceback kept by a logger must not pin the buffer
        # (a memory map cannot be closed while a view of it is alive).
        elif (
            check_crc and (zlib.crc32(memoryview(buf)[p : p + body_len]) & 0x7FFFFFFF) != fields[2]
        ):
            raise RecordError(f"record at {pos}: body CRC mismatch")
    p += body_len
    topic_len = buf[p]
    if topic_len > MAX_TOPIC_LENGTH or p + 1 + topic_len + 2 > end:
        raise RecordError(f"record at {pos}: topic length {topic_len} overruns the record")
    topic_raw = bytes(buf[p + 1 : p + 1 + topic_len])
    p += 1 + topic_len
    props_len = _SHORT.unpack_from(buf, p)[0]
    p += 2
    if props_len < 0 or p + props_len != end:
        raise RecordError(
            f"record at {pos}: TOTALSIZE {total} disagrees with its fields "
            f"(body {body_len}, topic {topic_len}, properties {props_len})"
        )
    props_raw = bytes(buf[p:end]) if props_len else b""
    topic, props = _texts(buf, pos, topic_raw, p, props_raw, tears)
    return fields, body, topic, props


def _texts(
    buf: bytes | bytearray | memoryview | mmap.mmap,
    pos: int,
    topic_raw: bytes,
    props_at: int,
    props_raw: bytes,
    tears: bool,
) -> tuple[str, str]:
    """The topic and properties text of the record at ``pos`` (properties read from
    ``buf[props_at:]``), checked as :func:`_parse` says."""
    # Only the body has a CRC.  A record torn inside its topic or properties (a sparse file's
    # zeros after a power cut) would still add up, but shows NUL bytes where the store never
    # writes them (see :func:`has_nul` and :func:`nul_where_torn`).
    if 0 in topic_raw:
        raise RecordError(f"record at {pos}: NUL byte in the topic (torn record?)")
    if tears and 0 in props_raw:
        where = nul_where_torn(buf, props_at, len(props_raw))
        if where >= 0:
            raise RecordError(
                f"record at {pos}: NUL byte in the properties at {where} (torn record?)"
            )
    try:
        return topic_raw.decode(), props_raw.decode()
    except UnicodeDecodeError as exc:
        raise RecordError(f"record at {pos}: undecodable text ({exc})") from exc


def read_record_info(
    buf: bytes | bytearray | memoryview | mmap.mmap,
    pos: int = 0,
    *,
    check_crc: bool = True,
    tears: bool = False,
) -> RecordInfo:
    """Validate the record at ``pos`` as :func:`decode_record` does and return its dispatch info.

    The body is CRC-checked (when ``check_crc``) but not copied.  Plain IPv4 records take a fast
    path; anything else (or anything wrong) goes through the careful parser, which also words
    the error.  ``tears`` as for :func:`decode_record`.
    """
    limit = len(buf)
    if pos + _V4_HEADER_SIZE <= limit:
        fields = _V4_HEADER.unpack_from(buf, pos)
        total = fields[0]
        end = pos + total
        body_len = fields[16]
        q = pos + _V4_HEADER_SIZE + body_len
        if (
            fields[1] == MESSAGE_MAGIC_CODE
            and not fields[7] & _HOST_FLAGS
            and total >= _V4_HEADER_SIZE + 3
            and end <= limit
            and body_len >= 0
            and q + 3 <= end
            and (
                not check_crc
                or not body_len
                or zlib.crc32(buf[q - body_len : q]) & 0x7FFFFFFF == fields[2]
            )
        ):
            t1 = q + 1 + buf[q]
            if buf[q] <= MAX_TOPIC_LENGTH and t1 + 2 <= end:
                props_len = _SHORT.unpack_from(buf, t1)[0]
                if t1 + 2 + props_len == end:
                    topic = bytes(buf[q + 1 : t1])
                    props = bytes(buf[t1 + 2 : end])
                    if b"\0" not in topic and b"\0" not in props:
                        try:
                            return RecordInfo(
                                total,
                                topic.decode(),
                                fields[3],
                                fields[5],
                                fields[6],
                                fields[7],
                                fields[11],
                                props.decode(),
                                fields[15],
                            )
                        except UnicodeDecodeError:
                            pass
    fields, _body, topic_s, props_s = _parse(buf, pos, check_crc, False, tears)
    return RecordInfo(
        fields[0], topic_s, fields[3], fields[5], fields[6], fields[7], fields[11], props_s,
        fields[15],
    )  # fmt: skip


def property_value(properties: str, name: str) -> str | None:
    """One property from a properties string without building the whole dict (dispatch path).

    Same as ``decode_properties(properties).get(name)`` except when a name occurs twice: this
    returns the first value, the dict keeps the last.
    """
    if properties.startswith(name + NAME_VALUE_SEPARATOR):
        start = len(name) + 1
    else:
        at = properties.find(PROPERTY_SEPARATOR + name + NAME_VALUE_SEPARATOR)
        if at < 0:
            return None
        start = at + len(name) + 2
    stop = properties.find(PROPERTY_SEPARATOR, start)
    value = properties[start:] if stop < 0 else properties[start:stop]
    return value or None


def _scan_plain(
    buf: bytes | bytearray | mmap.mmap,
    pos: int,
    limit: int,
    check_crc: bool,
    physical_base: int | None,
    select: Callable[[bytes, int, int, int], bool] | None,
    selected: list[int],
) -> int:
    """Walk plain records (IPv4 hosts, ASCII topic and properties without NUL) from ``pos`` and
    return where the walk stopped: ``limit``, or the first record that is not plain or not
    valid, for the careful parser to judge.  Positions of records for which
    ``select(topic_bytes, queue_id, physical_offset, size)`` is true go to ``selected``.

    Pure-Python twin of ``_recordc.scan`` (used when the extension is missing).
    """
    header = _V4_HEADER
    hsize = _V4_HEADER_SIZE
    short = _SHORT
    crc32 = zlib.crc32
    while pos + hsize <= limit:
        fields = header.unpack_from(buf, pos)
        total = fields[0]
        end = pos + total
        body_len = fields[16]
        p = pos + hsize
        q = p + body_len
        if not (
            fields[1] == MESSAGE_MAGIC_CODE
            and not fields[7] & _HOST_FLAGS
            and total >= hsize + 3
            and end <= limit
            and (physical_base is None or fields[6] == physical_base + pos)
            and body_len >= 0
            and q + 3 <= end
            and (not check_crc or not body_len or crc32(buf[p:q]) & 0x7FFFFFFF == fields[2])
        ):
            break
        topic_len = buf[q]
        t1 = q + 1 + topic_len
        if not (
            topic_len <= MAX_TOPIC_LENGTH
            and t1 + 2 <= end
            and t1 + 2 + short.unpack_from(buf, t1)[0] == end
        ):
            break
        topic = buf[q + 1 : t1]
        props = buf[t1 + 2 : end]
        if 0 in topic or 0 in props or not topic.isascii() or not props.isascii():
            break
        # The store and the export pass bytes or an mmap, whose slices are bytes.
        if select is not None and select(topic, fields[3], fields[6], total):  # type: ignore[arg-type]
            selected.append(pos)
        pos = end
    return pos


def scan_records(
    buf: bytes | bytearray | mmap.mmap,
    pos: int,
    limit: int,
    *,
    check_crc: bool = True,
    physical_base: int | None = None,
    select: Callable[[bytes, int, int, int], bool] | None = None,
) -> tuple[int, str, list[int]]:
    """Walk the valid records of ``buf[pos:limit]`` as fast as possible (recovery).

    Returns ``(end, why, selected)``: ``end`` is where valid data stops, ``why`` is ``"blank"``
    (a blank record starts at ``end``), ``"end"`` (``limit`` reached) or the reason the record at
    ``end`` is invalid; ``selected`` lists the positions of records for which
    ``select(topic_bytes, queue_id, physical_offset, size)`` returned True.  Validation is the
    same as :func:`decode_record`'s: plain records take the fast walker (C when built), anything
    else the careful parser.  With ``physical_base`` each record's PHYSICALOFFSET must equal
    ``physical_base`` + its position.  ``buf`` may be bytes, a bytearray or an mmap, holding a
    commit-log file from its first byte (torn writes are judged by the file's sector
    boundaries: see :func:`nul_where_torn`).
    """
    selected: list[int] = []
    walk = _scan_fast
    limit = min(limit, len(buf))
    while True:
        pos = walk(buf, pos, limit, check_crc, physical_base, select, selected)
        if pos >= limit:
            return pos, "end", selected
        try:
            info = read_record_info(buf, pos, check_crc=check_crc, tears=True)
        except BlankRecord:
            return pos, "blank", selected
        except RecordError as exc:
            return pos, str(exc), selected
        if physical_base is not None and info.physical_offset != physical_base + pos:
            return pos, f"record at {pos} has physical offset {info.physical_offset}", selected
        if pos + info.size > limit:
            return pos, f"record at {pos} runs past {limit}", selected
        if select is not None and select(
            info.topic.encode(), info.queue_id, info.physical_offset, info.size
        ):
            selected.append(pos)
        pos += info.size


def _decode_plain_py(
    buf: bytes | bytearray | memoryview | mmap.mmap,
    pos: int,
    check_crc: bool,
    cls: Callable[..., MessageExt],
) -> MessageExt | None:
    """The common record at ``buf[pos:]`` (IPv4 hosts, lengths that add up, a body matching
    its CRC when asked, UTF-8 topic and properties without NUL) as ``cls(...)``, read inline as
    decode_records does; None for anything else, which the careful parser judges and words.

    Pure-Python twin of ``_recordc.decode_plain``; :func:`decode_record` uses whichever is in
    use.
    """
    limit = len(buf)
    if pos < 0 or pos + _V4_HEADER_SIZE > limit:
        return None
    f = _V4_HEADER.unpack_from(buf, pos)
    total = f[0]
    end = pos + total
    p = pos + _V4_HEADER_SIZE
    q = p + f[16]
    if not (
        f[1] == MESSAGE_MAGIC_CODE
        and not f[7] & _HOST_FLAGS
        and total >= _V4_HEADER_SIZE + 3
        and end <= limit
        and f[16] >= 0
        and q + 3 <= end
    ):
        return None
    body = bytes(buf[p:q])
    if check_crc and body and zlib.crc32(body) & 0x7FFFFFFF != f[2]:
        return None
    t1 = q + 1 + buf[q]
    if buf[q] > MAX_TOPIC_LENGTH or t1 + 2 > end or t1 + 2 + _SHORT.unpack_from(buf, t1)[0] != end:
        return None
    topic_raw = bytes(buf[q + 1 : t1])
    props_raw = bytes(buf[t1 + 2 : end])
    if 0 in topic_raw or 0 in props_raw:
        return None
    try:
        topic = topic_raw.decode()
        props_text = props_raw.decode()
    except UnicodeDecodeError:
        return None
    return cls(
        topic, body, f[4], decode_properties(props_text), f[3], f[5], f[6], f[7], f[8],
        (unpack_ip(f[9]), f[10]), f[11], (unpack_ip(f[12]), f[13]), f[14], f[15], f[2], total,
    )  # fmt: skip


def decode_record(
    buf: bytes | bytearray | memoryview | mmap.mmap,
    pos: int = 0,
    *,
    check_crc: bool = True,
    read_body: bool = True,
    tears: bool = False,
) -> MessageExt:
    """Decode the record at ``buf[pos:]``.

    Raises :class:`BlankRecord` for the end-of-file filler and :class:`RecordError` for anything
    that is not a whole, valid record: truncated bytes, a bad magic, lengths that disagree with
    TOTALSIZE, a body failing its CRC (when ``check_crc``), a NUL in the topic, or undecodable
    topic/properties text.  With ``read_body=False`` the body is left empty (its CRC is still
    checked if asked).  With ``tears`` (``buf`` is a commit-log file from its first byte), a NUL
    in the properties where a torn write leaves zeros is refused too (:func:`nul_where_torn`).
    """
    if read_body:
        msg = _decode_plain(buf, pos, check_crc, MessageExt)
        if msg is not None:
            return msg
    return _decode_record_careful(buf, pos, check_crc, read_body, tears)


def _decode_record_careful(
    buf: bytes | bytearray | memoryview | mmap.mmap,
    pos: int,
    check_crc: bool,
    read_body: bool,
    tears: bool = False,
) -> MessageExt:
    """:func:`decode_record` by the careful parser alone (the tests compare the two)."""
    fields, body, topic, props = _parse(buf, pos, check_crc, read_body, tears)
    (
        total,
        _magic,
        crc,
        queue_id,
        flag,
        queue_offset,
        physical_offset,
        sys_flag,
        born_ts,
        born_ip,
        born_port,
        store_ts,
        store_ip,
        store_port,
        reconsume,
        prepared,
        _body_len,
    ) = fields
    return MessageExt(
        topic,
        body,
        flag,
        decode_properties(props),
        queue_id,
        queue_offset,
        physical_offset,
        sys_flag,
        born_ts,
        (unpack_ip(born_ip), born_port),
        store_ts,
        (unpack_ip(store_ip), store_port),
        reconsume,
        prepared,
        crc,
        total,
    )


def decode_records(buf: bytes, *, check_crc: bool = False) -> list[MessageExt]:
    """Every record of ``buf`` (a PULL_MESSAGE body), as :func:`iter_records` would give them,
    stopping at a blank record; raises :class:`RecordError` on the first bad one.

    The consumer's hot path (each record by :func:`decode_record`, whose common case is one C
    call when the extension is built).  The body CRC is not checked unless asked (Java's
    client does not check it on pull either: the broker checked what it recovered).
    """
    out: list[MessageExt] = []
    append = out.append
    n = len(buf)
    pos = 0
    while pos < n:
        msg = _decode_plain(buf, pos, check_crc, MessageExt)
        if msg is None:  # anything but the common record: the careful parser
            try:
                msg = _decode_record_careful(buf, pos, check_crc, True)
            except BlankRecord:
                break
        append(msg)
        pos += msg.store_size
    return out


def iter_records(
    buf: bytes | bytearray | memoryview,
    pos: int = 0,
    end: int | None = None,
    *,
    check_crc: bool = True,
) -> Iterator[MessageExt]:
    """Records laid end to end in ``buf[pos:end]`` (a pull body, or one commit-log file).

    Stops at a blank record or at the end; raises :class:`RecordError` on the first bad record.
    """
    view = memoryview(buf)[: len(buf) if end is None else end]
    while pos < len(view):
        try:
            msg = decode_record(view, pos, check_crc=check_crc)
        except BlankRecord:
            return
        yield msg
        pos += msg.store_size


_native = native_extension
_decode_plain: Callable[..., MessageExt | None] = (
    _native.decode_plain if _native is not None else _decode_plain_py
)
_scan_fast: Callable[..., int] = _native.scan if _native is not None else _scan_plain
