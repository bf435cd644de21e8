"""Stub of the C module pymq.client._producerc (pymq/client/_producerc.c): the producer's send
frames and batch bodies.

Picked once, at import, by :func:`pymq.common.native.load_native`.  When this module is not
built or PYMQ_PURE_PYTHON is set, a function's Python twin (same signature; checked against it
in tests/unit/test_twins.py) runs instead, or, for a function without one yet, the Python
module's own general path.
"""

from typing import Any

def send_frame(
    head: Any,
    opaque: Any,
    fixed: Any,
    queue_id: Any,
    sys_flag: Any,
    born: Any,
    flag: Any,
    props: Any,
    tail: Any,
    body: Any,
    /,
) -> Any:
    """A producer's send frame as Producer._v2_frame writes it; None when props is not ASCII."""

def batch_body(cls: Any, msgs: Any, ids: Any, topic: Any = ..., /) -> Any:
    """The client's SEND_BATCH_MESSAGE body of plain messages of type cls (and topic) with their
    ids; None when one is not plain."""
