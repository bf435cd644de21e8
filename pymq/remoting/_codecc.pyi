"""Stub of the C module pymq.remoting._codecc (pymq/remoting/_codecc.c): remoting frames and JSON
request headers read without a general JSON decoder.

Picked once, at import, by :func:`pymq.common.native.load_native`.  When this module is not
built or PYMQ_PURE_PYTHON is set, a function's Python twin (same signature; checked against it
in tests/unit/test_twins.py) runs instead, or, for a function without one yet, the Python
module's own general path.
"""

from typing import Any

from typing_extensions import Buffer

def json_command(header: Any, cls: Any, serialize_type: Any, /) -> Any:
    """The plain JSON header dict as cls(...), or None (remoting.codec._decode_json_header's first
    case)."""

def json_header(buf: Any, start: Any, end: Any, cls: Any, serialize_type: Any, /) -> Any:
    """The plain JSON header at buf[start:end] as cls(...), read without a dict, or None
    (json_command's case; twin: remoting.codec.json_header_py)."""

def send_run_fields(
    buf: Any, bounds: Any, first: Any, stop: Any, judge: Any, entries: Any, parsed: Any, /
) -> Any:
    """The leading plain single sends of a run whose queue ids judge(topic)'s queue count bounds,
    added to entries and parsed; (first frame not added, its fields or None)."""

def send_fields(buf: Any, start: Any, end: Any, /) -> Any:
    """A plain single send's or batch's frame's fields for the broker's raw send path, or None."""

def send_answer_fields(buf: Any, start: Any, end: Any, /) -> Any:
    """A send's plain successful answer's fields for the client's raw answer path, or None."""

def send_header(ext: Any, names: Any, cls: Any, batch_code: Any, /) -> Any:
    """SendMessageRequestHeader.from_ext's common case as cls(...), or None."""

def plain_header(ext: Any, spec: Any, cls: Any, /) -> Any:
    """A typed header's common case from its extFields as cls(*values), or None."""

def frame_bounds(buf: Buffer, limit: int, /) -> tuple[list[int], int, int | None]:
    """The whole frames at the start of buf, as feed_frames walks them; (bounds, pos, bad length or
    None)."""

def busy_answers(
    buf: Buffer,
    bounds: list[int],
    first: int,
    stop: int,
    head: bytes,
    tails: dict[int, bytes],
    refused: dict[int, int],
    /,
) -> tuple[bytes, int]:
    """SYSTEM_BUSY answers to a run of JSON requests, without decoding them; returns (answers, next
    index)."""
