"""Stub of the C module pymq.common._recordc (pymq/common/_recordc.c): the commit-log record
codec's hot loops (pymq.common.record, message_ext, message_id, batch, clock).

Picked once, at import, by :func:`pymq.common.native.load_native`.  When this module is not
built or PYMQ_PURE_PYTHON is set, a function's Python twin (same signature; checked against it
in tests/unit/test_twins.py) runs instead, or, for a function without one yet, the Python
module's own general path.
"""

from typing import Any

from typing_extensions import Buffer

def crc32(data: Buffer, value: int = 0, /) -> int:
    """Zlib-compatible CRC-32."""

def set_clmul(flag: bool, /) -> bool:
    """Use the PCLMULQDQ CRC path where the CPU has it; returns the old state."""

def properties_bytes(props: dict[str, str], /) -> bytes:
    """The UTF-8 PROPERTIES field of a dict of str."""

def decode_batch(data: Any, cls: Any, error_cls: Any, /) -> Any:
    """The items of a batch body as cls(body, flag, props) (batch.decode_batch_body)."""

def decode_properties(text: str, /) -> dict[str, str]:
    """The dict of a properties string (message.decode_properties)."""

def decode_plain(buf: Any, pos: Any, check_crc: Any, cls: Any, /) -> Any:
    """The common record at buf[pos:] as cls(...), or None for the careful parser
    (record._decode_plain_py)."""

def java_hash(s: str, /) -> int:
    """Java's String.hashCode of s."""

def java_hash_after(prefix_hash: int, s: str, /) -> int:
    """Java_hash(prefix + s) from java_hash(prefix)."""

def offset_msg_id(prefix: str, offset: int, /) -> str:
    """Prefix + offset as 16 uppercase hex digits."""

def offset_msg_ids(prefix: Any, rows: Any, /) -> Any:
    """Offset_msg_id of each row's first item, comma-joined."""

def now_ms() -> int:
    """Milliseconds since the epoch (wall clock)."""

def scan(
    buf: Any,
    pos: Any,
    limit: Any,
    check_crc: Any,
    physical_base: Any,
    select: Any,
    selected: Any,
    /,
) -> Any:
    """Walk plain records, return where the walk stopped."""
