"""Stub of the C module pymq.broker._sendc (pymq/broker/_sendc.c): the send processor's answer
frames.

Each function has a Python twin of the same signature, picked by
:func:`pymq.common.native.load_native` when this module is not built or PYMQ_PURE_PYTHON
is set.
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
