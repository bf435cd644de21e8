"""Arrow record batches straight from the column decoder's buffers (no Python object per row).

:func:`export_columns` (``pymq.export._columnsc`` when built, see its comment in
``pymq/export/_columnsc.c``, else its twin :func:`export_columns_py`) walks a run of valid
records and returns, per column of :data:`pymq.export.datasource.SCHEMA`, the Arrow buffers:
int32 offsets and data for strings, binary and lists, LSB-first validity bitmaps for the two
nullable strings, values in the machine's (little-endian) order for the fixed-width columns.
:func:`column_batch` wraps them with ``pyarrow.Array.from_buffers``, zero-copy.

Only records the column decoder accepts get here; anything else (corrupt bytes, a record past
the checkpoint bound...) goes through :func:`pymq.common.record.decode_record` one at a time,
in :mod:`pymq.export.scan`.  Both paths give the same rows (tests/spark/test_columns.py).
"""

from __future__ import annotations

import array
import operator
import struct
import sys
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from pymq.common.message_id import Host, unpack_ip
from pymq.common.native import load_native
from pymq.common.record import MESSAGE_MAGIC_CODE

if TYPE_CHECKING:
    import pyarrow as pa

EXPORT_BUFFER_NAMES = (
    "topic_offsets",
    "topic",
    "queue_id",
    "queue_offset",
    "commitlog_offset",
    "msg_id_offsets",
    "msg_id",
    "unique_key_validity",
    "unique_key_offsets",
    "unique_key",
    "tags_validity",
    "tags_offsets",
    "tags",
    "keys_list_offsets",
    "keys_offsets",
    "keys",
    "flag",
    "born_timestamp",
    "born_host_offsets",
    "born_host",
    "store_timestamp",
    "store_host_offsets",
    "store_host",
    "reconsume_times",
    "sys_flag",
    "properties_offsets",
    "property_names_offsets",
    "property_names",
    "property_values_offsets",
    "property_values",
    "body_offsets",
    "record_sizes",
    "body",
)
"""The order of ``export_columns``'s buffers (its ``B_*`` enum, then the body)."""


class ColumnRun(NamedTuple):
    """What one ``export_columns`` call decoded: records [start, end) of a file."""

    end: int
    """Position just after the run's last record (the start when nothing was decoded)."""
    rows: int
    record_bytes: int
    body_bytes: int
    buffers: dict[str, Any]
    """Buffer name (:data:`EXPORT_BUFFER_NAMES`) to a bytes-like object."""


def decode_run(
    decoder: Callable[..., Any],
    buf: object,
    pos: int,
    stop: int,
    physical_base: int,
    stop_timestamp: int | None,
    max_rows: int,
    max_body_bytes: int,
    inflate: Callable[[bytes, int], bytes] | None,
) -> ColumnRun:
    """One call of the column decoder (:func:`export_columns`) from ``pos`` (records starting
    before ``stop``); compressed bodies become ``inflate(stored_body, commitlog_offset)``
    (None: such a record ends the run)."""
    end, rows, record_bytes, body_bytes, buffers = decoder(
        buf, pos, stop, physical_base, stop_timestamp, max_rows, max_body_bytes, inflate, _host6
    )
    return ColumnRun(
        end, rows, record_bytes, body_bytes, dict(zip(EXPORT_BUFFER_NAMES, buffers, strict=True))
    )


_COMPRESSED_FLAG = 0x1
_BORNHOST_V6, _STOREHOST_V6 = 0x10, 0x20
_EXPORT_MAX_ITEMS = 256  # properties of a record the column decoder takes
_EXPORT_MAX_ROWS = 1 << 20
_EXPORT_MAX_BODY = 1 << 30
_TS_LIMIT = (2**63 - 1) // 1000  # microsecond columns
_I32_MAX = 2**31 - 1
_I64 = (-(2**63), 2**63 - 1)
_HEAD = struct.Struct(">iIIiiqq")  # TOTALSIZE .. PHYSICALOFFSET (28)
_SYS_BORN = struct.Struct(">iq")  # SYSFLAG, BORNTIMESTAMP (36)
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_Q = struct.Struct(">q")


def _arg(value: Any, name: str, lo: int, hi: int) -> int:
    x = operator.index(value)
    if not lo <= x <= hi:
        raise OverflowError(f"{name} = {x} does not fit its record field")
    return x


def _text_ok(raw: bytes) -> bool:
    """Strict UTF-8 (as Python's decoder reads it) without a NUL: the column decoder's text."""
    if b"\x00" in raw:
        return False
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _property_items(props: bytes) -> dict[bytes, bytes] | None:
    """decode_properties' items (name\\x01value, \\x02 between; an item without a name or a
    value dropped; a name again keeps its place and takes the new value), or None past
    _EXPORT_MAX_ITEMS names."""
    items: dict[bytes, bytes] = {}
    for part in props.split(b"\x02") if props else ():
        name, sep, value = part.partition(b"\x01")
        if sep and name and value:
            if name not in items and len(items) == _EXPORT_MAX_ITEMS:
                return None
            items[name] = value
    return items


class _Record(NamedTuple):
    """A record the column decoder takes, as export_columns reads it (positions absolute)."""

    total: int
    crc: int
    queue_id: int
    flag: int
    queue_offset: int
    phy: int
    sys_flag: int
    born_ts: int
    store_ts: int
    born_host: bytes  # ip and port
    store_host: bytes
    reconsume: int
    body: bytes  # as stored
    topic: bytes
    props: bytes


def _valid_record(buf: Any, pos: int, limit: int, base: int, allow_v6: bool) -> _Record | None:
    """The record at buf[pos:limit] when decode_record would take it (CRC checked, at its own
    physical offset base + pos, UTF-8 topic and properties without NUL; IPv6 hosts only when
    ``allow_v6``), else None: the C module's export_record."""
    if limit - pos < 88:
        return None
    total, magic, crc, queue_id, flag, queue_offset, phy = _HEAD.unpack_from(buf, pos)
    sys_flag, born_ts = _SYS_BORN.unpack_from(buf, pos + 36)
    if magic != MESSAGE_MAGIC_CODE or (not allow_v6 and sys_flag & (_BORNHOST_V6 | _STOREHOST_V6)):
        return None
    born_len = 16 if sys_flag & _BORNHOST_V6 else 4
    at_store_ts = pos + 52 + born_len
    at_reconsume = at_store_ts + 12 + (16 if sys_flag & _STOREHOST_V6 else 4)
    header = at_reconsume + 16 - pos
    if total < 91 or total > limit - pos or header + 3 > total:
        return None
    if not _I64[0] <= base + pos <= _I64[1] or phy != base + pos:
        return None
    (body_len,) = _I32.unpack_from(buf, pos + header - 4)
    if body_len < 0 or header + body_len + 3 > total:
        return None
    q = pos + header + body_len
    t1 = q + 1 + buf[q]
    if buf[q] > 127 or t1 + 2 > pos + total or _I16.unpack_from(buf, t1)[0] != pos + total - t1 - 2:
        return None
    topic, props = bytes(buf[q + 1 : t1]), bytes(buf[t1 + 2 : pos + total])
    stored = bytes(buf[pos + header : q])
    if not (_text_ok(topic) and _text_ok(props)) or (
        body_len and zlib.crc32(stored) & 0x7FFFFFFF != crc
    ):
        return None
    return _Record(
        total, crc, queue_id, flag, queue_offset, phy, sys_flag, born_ts,
        _Q.unpack_from(buf, at_store_ts)[0], bytes(buf[pos + 48 : at_store_ts]),
        bytes(buf[at_store_ts + 8 : at_reconsume]), _I32.unpack_from(buf, at_reconsume)[0],
        stored, topic, props,
    )  # fmt: skip


class _Columns:
    """export_columns_py's column buffers, a row at a time."""

    def __init__(self, host6: Any) -> None:
        self.host6 = host6
        self.i32 = {n: array.array("i", [0]) for n in EXPORT_BUFFER_NAMES if "offsets" in n}
        for n in ("queue_id", "flag", "reconsume_times", "sys_flag", "record_sizes"):
            self.i32[n] = array.array("i")
        names = ("queue_offset", "commitlog_offset", "born_timestamp", "store_timestamp")
        self.i64 = {n: array.array("q") for n in names}
        self.data = {n: bytearray() for n in EXPORT_BUFFER_NAMES if n + "_offsets" in self.i32}
        # A variable-length column's data and offsets, by name (put's hot path).
        self.pairs = {n: (data, self.i32[n + "_offsets"]) for n, data in self.data.items()}
        self.valid = {"unique_key": bytearray(), "tags": bytearray()}
        self.hosts: dict[str, tuple[bytes, bytes]] = {}  # the last host's text, per column
        self.rows = 0

    def put(self, name: str, value: bytes) -> None:
        """A variable-length column's next value."""
        data, offsets = self.pairs[name]
        data += value
        if len(data) > _I32_MAX:
            raise OverflowError("export batch column over 2 GiB")
        offsets.append(len(data))

    def put_host(self, name: str, raw: bytes) -> None:
        """A host column's text: a.b.c.d:port, an IPv6 host's from host6 (asked on a change)."""
        last = self.hosts.get(name)
        if last is None or last[0] != raw:
            ip, port = raw[:-4], _I32.unpack_from(raw, len(raw) - 4)[0]
            if len(ip) == 4:
                text = (".".join(str(b) for b in ip) + f":{port}").encode()
            else:
                text = self.host6(ip, port)
                if not isinstance(text, bytes) or len(text) >= 64:
                    raise ValueError("export_columns: host6 must return short bytes")
            self.hosts[name] = last = (raw, text)
        self.put(name, last[1])

    def add(self, r: _Record, items: dict[bytes, bytes], body_end: int) -> None:
        i32, i64 = self.i32, self.i64
        i32["body_offsets"].append(body_end)
        self.put("topic", r.topic)
        i32["queue_id"].append(r.queue_id)
        i64["queue_offset"].append(r.queue_offset)
        i64["commitlog_offset"].append(r.phy)
        self.put("msg_id", (r.store_host + _Q.pack(r.phy)).hex().upper().encode())
        for name, key in (("unique_key", b"UNIQ_KEY"), ("tags", b"TAGS")):
            value = items.get(key)
            self.valid[name].append(value is not None)
            self.put(name, value or b"")
        for key in (items.get(b"KEYS") or b"").split(b" "):
            if key:
                self.put("keys", key)
        i32["keys_list_offsets"].append(len(i32["keys_offsets"]) - 1)
        i32["flag"].append(r.flag)
        i64["born_timestamp"].append(r.born_ts * 1000)
        self.put_host("born_host", r.born_host)
        i64["store_timestamp"].append(r.store_ts * 1000)
        self.put_host("store_host", r.store_host)
        i32["reconsume_times"].append(r.reconsume)
        i32["sys_flag"].append(r.sys_flag)
        for item, value in items.items():
            self.put("property_names", item)
            self.put("property_values", value)
        i32["properties_offsets"].append(len(i32["property_names_offsets"]) - 1)
        i32["record_sizes"].append(r.total)
        self.rows += 1

    def buffers(self, body: bytearray) -> tuple[Any, ...]:
        """The buffers in EXPORT_BUFFER_NAMES order: validity bitmaps LSB first."""
        out: list[Any] = []
        for name in EXPORT_BUFFER_NAMES[:-1]:
            if name.endswith("_validity"):
                bitmap = bytearray((self.rows + 7) // 8)
                for i, bit in enumerate(self.valid[name.removesuffix("_validity")]):
                    bitmap[i >> 3] |= bit << (i & 7)
                out.append(bytes(bitmap))
            elif name in self.i32:
                out.append(self.i32[name].tobytes())
            elif name in self.i64:
                out.append(self.i64[name].tobytes())
            else:
                out.append(bytes(self.data[name]))
        return (*out, body)


def export_columns_py(
    buf: Any, pos: Any, stop: Any, physical_base: Any, stop_timestamp: Any, max_rows: Any,
    max_body_bytes: Any, inflate: Any, host6: Any,
) -> tuple[int, int, int, int, tuple[Any, ...]]:  # fmt: skip
    """Python twin of ``pymq.export._columnsc.export_columns``: the run of records starting at
    buf[pos:] as Arrow column buffers (in :data:`EXPORT_BUFFER_NAMES` order, the body last, a
    bytearray); returns (pos after the run, rows, record bytes, body bytes, buffers).  Each
    record must be valid as decode_record judges it (see :func:`_valid_record`) and start
    before ``stop``.  A compressed body is replaced by inflate(stored_body, physical_offset)
    (bytes), an IPv6 host's text by host6(ip_bytes, port) (bytes, asked again only when the
    host changes).  The run ends, without that record, at the first one that is not so, is
    compressed while inflate is None, has an IPv6 host while host6 is None, was stored after
    stop_timestamp (None: no bound), has a timestamp the microsecond columns cannot hold, has
    more than 256 properties, or would take the rows past max_rows or (after the first row) the
    bodies past max_body_bytes (or 2 GiB)."""
    pos = _arg(pos, "pos", 0, sys.maxsize)
    stop = _arg(stop, "stop", 0, sys.maxsize)
    base = _arg(physical_base, "physical_base", *_I64)
    max_rows = _arg(max_rows, "max_rows", 1, _EXPORT_MAX_ROWS)
    max_body = _arg(max_body_bytes, "max_body_bytes", 1, _EXPORT_MAX_BODY)
    stop_ts = None if stop_timestamp is None else _arg(stop_timestamp, "stop_timestamp", *_I64)
    with memoryview(buf) as view:
        limit = view.nbytes
    stop = min(stop, limit)
    cols = _Columns(host6)
    body = bytearray()
    record_bytes = 0
    while pos < stop and cols.rows < max_rows:
        r = _valid_record(buf, pos, limit, base, host6 is not None)
        compressed = r is not None and r.sys_flag & _COMPRESSED_FLAG
        if (
            r is None
            or (compressed and inflate is None)
            or (stop_ts is not None and r.store_ts > stop_ts)
            or not (-_TS_LIMIT <= r.born_ts <= _TS_LIMIT and -_TS_LIMIT <= r.store_ts <= _TS_LIMIT)
        ):
            break
        stored = r.body
        if compressed:
            stored = inflate(stored, r.phy)
            if not isinstance(stored, bytes):
                raise TypeError("export_columns: inflate must return bytes")
        end = len(body) + len(stored)
        if (cols.rows > 0 and end > max_body) or end > _I32_MAX:
            break
        items = _property_items(r.props)
        if items is None:
            break
        body += stored
        cols.add(r, items, end)
        record_bytes += r.total
        pos += r.total
    return pos, cols.rows, record_bytes, len(body), cols.buffers(body)


_native: Any = load_native("pymq.export._columnsc")
export_columns: Callable[..., tuple[int, int, int, int, tuple[Any, ...]]] = getattr(
    _native, "export_columns", export_columns_py
)
"""The column decoder: the C module's when built, else its twin :func:`export_columns_py`."""


def format_host(host: Host) -> str:
    """A host column's text: ``ip:port``, ``[ip]:port`` for IPv6 (both decoding paths)."""
    ip, port = host
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _host6(ip: bytes, port: int) -> bytes:
    """The C decoder's IPv6 host text: ipaddress's, as the per-record path has it."""
    return format_host((unpack_ip(ip), port)).encode()


def _validity(raw: bytes, rows: int) -> tuple[pa.Buffer | None, int]:
    """(bitmap buffer or None when every row is valid, null count) of a packed bitmap."""
    import pyarrow as pa

    nulls = rows - int.from_bytes(raw, "little").bit_count()
    return (pa.py_buffer(raw) if nulls else None), nulls


def column_batch(run: ColumnRun, schema: pa.Schema) -> pa.RecordBatch:
    """The run as one record batch of ``schema`` (the Arrow form of the export's SCHEMA)."""
    import pyarrow as pa

    n = run.rows
    b = {name: pa.py_buffer(data) for name, data in run.buffers.items()}

    def strings(prefix: str, typ: pa.DataType, validity: str | None = None) -> pa.Array:
        bitmap, nulls = None, 0
        if validity is not None:
            bitmap, nulls = _validity(run.buffers[validity], n)
        return pa.Array.from_buffers(
            typ, n, [bitmap, b[f"{prefix}_offsets"], b[prefix]], null_count=nulls
        )

    def fixed(name: str, typ: pa.DataType) -> pa.Array:
        return pa.Array.from_buffers(typ, n, [None, b[name]], null_count=0)

    keys_type = schema.field("keys").type
    key_items = pa.Array.from_buffers(
        keys_type.value_type,
        len(run.buffers["keys_offsets"]) // 4 - 1,
        [None, b["keys_offsets"], b["keys"]],
        null_count=0,
    )
    map_type = schema.field("properties").type
    items = len(run.buffers["property_names_offsets"]) // 4 - 1
    names = pa.Array.from_buffers(
        map_type.key_type, items, [None, b["property_names_offsets"], b["property_names"]]
    )
    values = pa.Array.from_buffers(
        map_type.item_type, items, [None, b["property_values_offsets"], b["property_values"]]
    )
    entries = pa.StructArray.from_arrays(
        [names, values], fields=[map_type.key_field, map_type.item_field]
    )
    columns = {
        "topic": strings("topic", pa.string()),
        "queue_id": fixed("queue_id", pa.int32()),
        "queue_offset": fixed("queue_offset", pa.int64()),
        "commitlog_offset": fixed("commitlog_offset", pa.int64()),
        "msg_id": strings("msg_id", pa.string()),
        "unique_key": strings("unique_key", pa.string(), "unique_key_validity"),
        "tags": strings("tags", pa.string(), "tags_validity"),
        "keys": pa.Array.from_buffers(
            keys_type, n, [None, b["keys_list_offsets"]], null_count=0, children=[key_items]
        ),
        "flag": fixed("flag", pa.int32()),
        "born_timestamp": fixed("born_timestamp", schema.field("born_timestamp").type),
        "born_host": strings("born_host", pa.string()),
        "store_timestamp": fixed("store_timestamp", schema.field("store_timestamp").type),
        "store_host": strings("store_host", pa.string()),
        "reconsume_times": fixed("reconsume_times", pa.int32()),
        "sys_flag": fixed("sys_flag", pa.int32()),
        "properties": pa.Array.from_buffers(
            map_type, n, [None, b["properties_offsets"]], null_count=0, children=[entries]
        ),
        "body": pa.Array.from_buffers(
            pa.binary(), n, [None, b["body_offsets"], b["body"]], null_count=0
        ),
    }
    return pa.RecordBatch.from_arrays([columns[f.name] for f in schema], schema=schema)
