"""The switch for pymq's C accelerators, and the one way a module picks its own.

Each C module sits beside the Python module it speeds up, with the same function names as its
Python twins and a ``.pyi`` stub: ``pymq.common._recordc`` (record codec), ``pymq.remoting._codecc``
(frames and request headers), ``pymq.broker._sendc`` (send answers), ``pymq.store._commitlogc``
(commit-log puts, page population, the fdatasync thread), ``pymq.store._dispatchc`` (dispatch to
consume queues and index), ``pymq.client._producerc`` (send frames, batch bodies) and
``pymq.export._columnsc`` (Arrow columns).  A Python module calls :func:`load_native` once, at
import: the extension when it was built and PYMQ_PURE_PYTHON is not set, else None and the
Python twins.  tests/unit/test_twins.py checks each pair agrees.
"""

from __future__ import annotations

import importlib
import os
from typing import Any


def pure_python_requested() -> bool:
    """True when PYMQ_PURE_PYTHON (1, true, yes or on) turns the C extensions off."""
    return os.environ.get("PYMQ_PURE_PYTHON", "").strip().lower() in ("1", "true", "yes", "on")


def load_native(name: str) -> Any:
    """The C module ``name`` (e.g. ``pymq.store._dispatchc``) when it was built and not turned
    off (PYMQ_PURE_PYTHON=1), else None."""
    if pure_python_requested():
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


NATIVE_CODEC = load_native("pymq.common._recordc") is not None
"""True when the record codec's hot loops run in C (``pymq.common._recordc``)."""
