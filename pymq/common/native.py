"""The C accelerator of the codecs (``pymq.common._recordc``) and the switch that turns it off.

Every module with a C twin picks its implementation here once, at import: the extension when it
was built and PYMQ_PURE_PYTHON is not set, else the pure-Python function next to it.  Each twin
pair has a test proving both give identical results (tests/unit/test_recordc.py).
"""

from __future__ import annotations

import os
from typing import Any


def pure_python_requested() -> bool:
    """True when PYMQ_PURE_PYTHON (1, true, yes or on) turns the C extension off."""
    return os.environ.get("PYMQ_PURE_PYTHON", "").strip().lower() in ("1", "true", "yes", "on")


def _load_native() -> object | None:
    """``pymq.common._recordc`` when it was built and not turned off (PYMQ_PURE_PYTHON=1)."""
    if pure_python_requested():
        return None
    try:
        # The C extension ships no stub, so mypy cannot see the module.
        from pymq.common import _recordc  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _recordc


_native: Any = _load_native()
NATIVE_CODEC = _native is not None
"""True when the record codec's hot loops run in C (``pymq.common._recordc``)."""
native_extension: Any = _native
"""The ``pymq.common._recordc`` module in use, or None (for the store's index puts)."""
