"""The body of SEND_BATCH_MESSAGE: messages laid end to end as Java's
``MessageDecoder.encodeMessage`` writes them (totalSize, magic, bodyCRC, flag, body, properties).

Pure functions and data classes, no I/O."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import attrs

from pymq.common.message_ext import decode_properties, properties_bytes
from pymq.common.native import load_native
from pymq.common.record import RecordError

native_extension: Any = load_native("pymq.common._recordc")

BATCH_PROPS_LEN = struct.Struct(">h")  # an item's properties length

BATCH_ITEM_HEAD = struct.Struct(">iIiii")  # totalSize, magic, bodyCRC, flag, bodyLen
# Java's MessageDecoder.encodeMessage writes magic 0 and bodyCRC 0 for batch items; readers ignore
# both, so we write the same and accept anything.
BATCH_ITEM_MAGIC = 0


@attrs.define(slots=True)
class BatchItem:
    """One message of a SEND_BATCH_MESSAGE body."""

    body: bytes
    flag: int = 0
    properties: dict[str, str] = attrs.field(factory=dict)


def encode_batch_body(items: list[BatchItem]) -> bytes:
    parts: list[bytes] = []
    for item in items:
        props = properties_bytes(item.properties)
        total = BATCH_ITEM_HEAD.size + len(item.body) + 2 + len(props)
        parts.append(BATCH_ITEM_HEAD.pack(total, BATCH_ITEM_MAGIC, 0, item.flag, len(item.body)))
        parts.append(item.body)
        parts.append(BATCH_PROPS_LEN.pack(len(props)))
        parts.append(props)
    return b"".join(parts)


def decode_batch_body(data: bytes | memoryview) -> list[BatchItem]:
    """Items of a batch body; raises :class:`RecordError` on truncated or inconsistent bytes
    (properties that are no UTF-8 are read with U+FFFD for the bad bytes, as Java's
    ``new String(bytes, UTF_8)`` reads them).  In C when the extension is
    built (``_recordc.decode_batch``, a tenth of the cost: a broker's batch path spent a tenth
    of its time here), else :func:`decode_batch_py`."""
    items: list[BatchItem] = _decode_batch(data, BatchItem, RecordError)
    return items


def decode_batch_py(data: Any, cls: Any, error_cls: Any) -> list[Any]:
    """Python twin of ``pymq.common._recordc.decode_batch``: the items of a batch body as
    cls(body, flag, properties); error_cls on truncated or inconsistent bytes."""
    items: list[Any] = []
    pos, end = 0, len(data)
    while pos < end:
        if pos + BATCH_ITEM_HEAD.size > end:
            raise error_cls(f"batch item at {pos} truncated")
        total, _magic, _crc, flag, body_len = BATCH_ITEM_HEAD.unpack_from(data, pos)
        p = pos + BATCH_ITEM_HEAD.size
        if body_len < 0 or p + body_len + 2 > end:
            raise error_cls(f"batch item at {pos}: body length {body_len} overruns")
        body = bytes(data[p : p + body_len])
        p += body_len
        props_len = BATCH_PROPS_LEN.unpack_from(data, p)[0]
        p += 2
        if props_len < 0 or p + props_len > end:
            raise error_cls(f"batch item at {pos}: properties length {props_len} overruns")
        raw = bytes(data[p : p + props_len])
        props = decode_properties(raw.decode(errors="replace")) if props_len else {}
        p += props_len
        if total != p - pos:
            raise error_cls(f"batch item at {pos}: totalSize {total} != {p - pos}")
        items.append(cls(body, flag, props))
        pos = p
    return items


_decode_batch: Callable[..., Any] = getattr(native_extension, "decode_batch", decode_batch_py)
