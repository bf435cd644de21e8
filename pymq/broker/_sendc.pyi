"""Stub of the C module pymq.broker._sendc (pymq/broker/_sendc.c): the send processor's answer
frames.

Picked once, at import, by :func:`pymq.common.native.load_native`.  When this module is not
built or PYMQ_PURE_PYTHON is set, a function's Python twin (same signature; checked against it
in tests/unit/test_twins.py) runs instead, or, for a function without one yet, the Python
module's own general path.
"""

from typing import Any

def send_answer_frame(
    opaque: int,
    msg_id: str,
    queue_id: int,
    queue_offset: int,
    quoted_region: bytes,
    trace_on: bool,
    version: int,
    /,
) -> bytes:
    """A successful send's JSON answer frame, as codec.json_response_frame writes it."""

def send_answer_run(
    parsed: Any, hints: Any, prefix: Any, quoted_region: Any, trace_on: Any, version: Any, /
) -> Any:
    """A run's answers joined, and [topic, count, size] per run of one topic."""
