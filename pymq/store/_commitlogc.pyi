"""Stub of the C module pymq.store._commitlogc (pymq/store/_commitlogc.c): the commit log's puts
(encode_run, the one record encoder), page population and the fdatasync thread.

Picked once, at import, by :func:`pymq.common.native.load_native`.  When this module is not
built or PYMQ_PURE_PYTHON is set, a function's Python twin (same signature; checked against it
in tests/unit/test_twins.py) runs instead, or, for a function without one yet, the Python
module's own general path.
"""

from collections.abc import Callable, Sequence
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

def encode_run(
    buf: Buffer,
    pos: int,
    limit: int,
    file_from_offset: int,
    entries: list[tuple[Any, ...]],
    topic_bytes: dict[str, bytes],
    queue_table: dict[tuple[str, int], int],
    clock: Callable[[], int] | None,
    cluster_b: bytes,
    born_ip: bytes,
    born_port: int,
    store_ip: bytes,
    store_port: int,
    max_body_properties: int,
    stop_flags: int,
    stop_topic: str,
    hint_type: type[tuple[Any, ...]] | None,
    entry_header: tuple[int, int] | None = None,
    /,
) -> tuple[int, list[tuple[Any, ...]], list[str | None], int, BaseException | None]:
    """The store's one record encoder: a run of sends' records (each entry (topic, queue_id,
    body, properties, flag, sys_flag, born_timestamp, reconsume_times) a single send, or with
    properties None a SEND_BATCH_MESSAGE body) written into buf from pos below limit, buf[0]
    being physical offset file_from_offset, queue offsets taken from and committed to
    queue_table; (end, rows, waits, stamp, error).  Or a run of stored messages, all or
    nothing (each entry (topic, queue_id, body, properties bytes, flag, sys_flag,
    born_timestamp, reconsume_times, born_ip, born_port, prepared_transaction_offset): its
    properties as given, IPv4 or IPv6 hosts, no queue offset when prepared or rolled back;
    its waits None).
    With entry_header (first index, term): each record the body of a DLedger entry of its
    own, after its 48-byte header (DLedger mode's records).
    Twin: pymq.store.commitlog.encode_run_py."""

def stored_entries(
    msgs: Sequence[Any],
    encoded: Sequence[tuple[bytes, bytes]],
    fixed: tuple[int, int],
    pack_ip: Callable[[str], bytes],
    born_ips: dict[str, bytes],
    /,
) -> tuple[list[tuple[Any, ...]], int, dict[str, bytes], bool]:
    """encode_run's entries of stored messages, the bytes their records take, their topics'
    bytes and whether any properties hold a NUL (commitlog.stored_entries_py)."""
