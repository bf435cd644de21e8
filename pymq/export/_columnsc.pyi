"""Stub of the C module pymq.export._columnsc (pymq/export/_columnsc.c): Arrow columns of a run of
commit-log records.

Picked once, at import, by :func:`pymq.common.native.load_native` (in pymq.export.columns).
When this module is not built or PYMQ_PURE_PYTHON is set, its Python twin
``pymq.export.columns.export_columns_py`` (same signature; checked against it in
tests/unit/test_twins.py) runs instead.
"""

from typing import Any

def export_columns(
    buf: Any,
    pos: Any,
    stop: Any,
    physical_base: Any,
    stop_timestamp: Any,
    max_rows: Any,
    max_body_bytes: Any,
    inflate: Any,
    host6: Any,
    /,
) -> Any:
    """A run of valid records as Arrow column buffers; returns (pos, rows, record_bytes,
    body_bytes, buffers)."""
