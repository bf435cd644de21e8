"""Arrow record batches straight from the C decoder's column buffers (no Python object per row).

``_recordc.export_columns`` (see its comment in ``pymq/common/_recordc.c``) walks a run of valid
records and returns, per column of :data:`pymq.export.datasource.SCHEMA`, the Arrow buffers:
int32 offsets and data for strings, binary and lists, LSB-first validity bitmaps for the two
nullable strings, little-endian values for the fixed-width columns.  :func:`column_batch` wraps
them with ``pyarrow.Array.from_buffers``, zero-copy.

Only records the C walker accepts get here; anything else (corrupt bytes, a record past the
checkpoint bound...) goes through :func:`pymq.common.record.decode_record` one at a time, in
:mod:`pymq.export.scan`.  Both paths give the same rows (tests/spark/test_columns.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from pymq.common.message_id import Host, unpack_ip

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
    native: Any,
    buf: object,
    pos: int,
    stop: int,
    physical_base: int,
    stop_timestamp: int | None,
    max_rows: int,
    max_body_bytes: int,
    inflate: Callable[[bytes, int], bytes] | None,
) -> ColumnRun:
    """One call of the C decoder from ``pos`` (records starting before ``stop``); compressed
    bodies become ``inflate(stored_body, commitlog_offset)`` (None: such a record ends the run).
    """
    end, rows, record_bytes, body_bytes, buffers = native.export_columns(
        buf, pos, stop, physical_base, stop_timestamp, max_rows, max_body_bytes, inflate, _host6
    )
    return ColumnRun(
        end, rows, record_bytes, body_bytes, dict(zip(EXPORT_BUFFER_NAMES, buffers, strict=True))
    )


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
