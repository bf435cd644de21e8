"""Stub of the C module pymq.export._columnsc (pymq/export/_columnsc.c): Arrow columns of a run of
commit-log records.

Each function has a Python twin of the same signature, picked by
:func:`pymq.common.native.load_native` when this module is not built or PYMQ_PURE_PYTHON
is set.
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
