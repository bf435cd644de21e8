"""The store's clock: wall-clock milliseconds since the epoch, defined once.

STORETIMESTAMP of every record, the checkpoint's timestamps and config timestamps all read
:func:`now_ms`.  In C when the extension is built (no Python frame on the put path); the twins
are tested against each other (tests/unit/test_recordc.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pymq.common.native import load_native

native_extension: Any = load_native("pymq.common._recordc")


def _now_ms_py() -> int:
    """Pure-Python twin of ``_recordc.now_ms``: ``time.time_ns() // 1_000_000``."""
    return time.time_ns() // 1_000_000


now_ms: Callable[[], int] = native_extension.now_ms if native_extension is not None else _now_ms_py
"""Wall-clock milliseconds (CLOCK_REALTIME), truncated."""
