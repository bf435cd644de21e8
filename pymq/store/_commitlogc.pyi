"""Stub of the C module pymq.store._commitlogc (pymq/store/_commitlogc.c): the commit log's puts
(encode_batch, encode_single(s)), page population and the fdatasync thread.

Picked once, at import, by :func:`pymq.common.native.load_native`.  When this module is not
built or PYMQ_PURE_PYTHON is set, a function's Python twin (same signature; checked against it
in tests/unit/test_twins.py) runs instead, or, for a function without one yet, the Python
module's own general path.
"""

from typing import Any

from typing_extensions import Buffer

def sync_worker_new() -> object:
    """A thread for fdatasync that never takes the GIL (a capsule)."""

def sync_worker_fileno(worker: object, /) -> int:
    """Its eventfd, readable once a job has ended."""

def sync_worker_submit(worker: object, fds: list[int], /) -> None:
    """Fdatasync each of fds in order, in the thread."""

def sync_worker_collect(worker: object, /) -> int | None:
    """The errno of the job that ended (0: ok), or None."""

def sync_worker_stop(worker: object, /) -> None:
    """End the thread after the job in hand."""

def populate_write(buf: Buffer, start: int, length: int, /) -> int:
    """Fault in a writable map's pages as writes would, with the GIL released; 0 or madvise's
    errno."""

def encode_batch(
    buf: Any,
    pos: Any,
    limit: Any,
    data: Any,
    first_queue_offset: Any,
    file_from_offset: Any,
    topic_b: Any,
    cluster_b: Any,
    topic: Any,
    queue_id: Any,
    sys_flag: Any,
    born_timestamp: Any,
    born_ip: Any,
    born_port: Any,
    store_timestamp: Any,
    store_ip: Any,
    store_port: Any,
    reconsume_times: Any,
    max_body_properties: Any,
    hint_type: Any = ...,
    /,
) -> Any:
    """A SEND_BATCH_MESSAGE body's records written as the Python path writes them; (end, rows,
    wait) or None."""

def encode_single(
    buf: Any,
    pos: Any,
    limit: Any,
    body: Any,
    properties: Any,
    flag: Any,
    queue_offset: Any,
    file_from_offset: Any,
    topic_b: Any,
    cluster_b: Any,
    topic: Any,
    queue_id: Any,
    sys_flag: Any,
    born_timestamp: Any,
    born_ip: Any,
    born_port: Any,
    store_timestamp: Any,
    store_ip: Any,
    store_port: Any,
    reconsume_times: Any,
    max_body_properties: Any,
    hint_type: Any = ...,
    /,
) -> Any:
    """A single send's record as the Python path writes it; (size, row, wait) or None."""

def encode_singles(
    buf: Any,
    pos: Any,
    limit: Any,
    file_from_offset: Any,
    entries: Any,
    topic_bytes: Any,
    queue_table: Any,
    clock: Any,
    cluster_b: Any,
    born_ip: Any,
    born_port: Any,
    store_ip: Any,
    store_port: Any,
    max_body_properties: Any,
    stop_flags: Any,
    stop_topic: Any,
    hint_type: Any,
    /,
) -> Any:
    """Encode_single of each entry in turn; (end, rows, waits, stamp, error)."""
