"""Stub of the C module pymq.store._dispatchc (pymq/store/_dispatchc.c): the reput's dispatch
(consume queues, index) and record checks.

Picked once, at import, by :func:`pymq.common.native.load_native`.  When this module is not
built or PYMQ_PURE_PYTHON is set, each function's Python twin (same signature) runs instead:
``pymq.store.index_file.index_put_py``, ``pymq.store.reput.dispatch_hinted_py``,
``pymq.store.get_message._record_is_py`` and ``pymq.store.reput.record_hints_py``; the C
functions are checked against them in tests/unit/test_twins.py (dispatch_hinted, a stateful run,
in tests/store/test_dispatch_hinted_diff.py).
"""

from typing import Any

from typing_extensions import Buffer

def index_put(
    buf: Any,
    slot_num: Any,
    index_num: Any,
    entries_at: Any,
    count: Any,
    slot_count: Any,
    begin_timestamp: Any,
    prefix_hash: Any,
    keys: Any,
    phy_offset: Any,
    store_timestamp: Any,
    /,
) -> Any:
    """Index keys into one index file."""

def dispatch_hinted(
    hints: Any,
    log: Any,
    pos: Any,
    end: Any,
    offset: Any,
    limit: Any,
    queues: Any,
    listener: Any,
    index: Any,
    /,
) -> Any:
    """A run of hinted records dispatched to their consume queues and the index; (done, pos,
    offset, last_store_timestamp, exception or None)."""

def record_is(data: Buffer, size: int, /) -> bool:
    """Whether data is size bytes beginning as a message record of that size (TOTALSIZE, magic
    code)."""

def record_hints(
    buf: Any,
    pos: Any,
    end: Any,
    file_from_offset: Any,
    max_rows: Any,
    skip_topic: Any,
    hint_type: Any,
    /,
) -> Any:
    """The dispatch hints of the records at buf[pos:end], read back; (rows, stop)."""
