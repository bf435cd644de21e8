"""The pull read path: Java's ``DefaultMessageStore.getMessage`` rules, as one function.

Given a consume queue and an offset it decides the status and the next begin offset and collects
whole commit-log records (copies, so a concurrent file deletion can never pull memory from under
a reply).  Batches are capped as Java caps them: ``maxTransfer{Bytes,Count}OnMessageInMemory``
for records within ``accessMessageInMemoryMaxRatio`` % of RAM from the commit log's end, and the
``...InDisk`` limits beyond.  A filter is a set of tags codes, or None for every message; a
record filter (the broker's SQL92 evaluation) is then asked about each whole record read.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Collection
from typing import Any

from pymq.common.native import load_native
from pymq.common.record import MESSAGE_MAGIC_CODE, read_record_header
from pymq.store.commitlog import CommitLog
from pymq.store.config import BrokerRole, MessageStoreConfig
from pymq.store.consume_queue import CQ_STORE_UNIT_SIZE, ENTRY, ConsumeQueue
from pymq.store.results import GetMessageResult, GetMessageStatus

native_extension: Any = load_native("pymq.store._dispatchc")

log = logging.getLogger(__name__)


def _record_is_py(data: bytes, size: int) -> bool:
    """Whether ``data`` is ``size`` bytes beginning as a message record of that size (TOTALSIZE,
    then the magic code).  Pure-Python twin of ``_recordc.record_is``."""
    return (
        len(data) == size
        and size >= 8
        and read_record_header(data, 0) == (size, MESSAGE_MAGIC_CODE)
    )


record_is: Callable[[bytes, int], bool] = getattr(native_extension, "record_is", _record_is_py)

RECORD_FILTER_BUDGET = 0.010
"""Seconds one pull may spend in its record filter (SQL92 evaluation) before it answers with
what it found so far, its next offset after the last record evaluated: a consumer whose
expression is slow on the messages it meets is served in several pulls, and no pull holds the
event loop for long (Java evaluates a whole scan on a pull thread)."""

MIN_FILTER_SCAN_BYTES = 16000
"""Java scans at least this many bytes of consume queue per pull when a filter skips entries."""


def total_physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 * 1024**3


TOTAL_PHYSICAL_MEMORY = total_physical_memory()


def in_memory_bytes(config: MessageStoreConfig) -> int:
    """The commit-log bytes behind its end that count as still in memory (Java's
    ``(long) (TOTAL_PHYSICAL_MEMORY_SIZE * (accessMessageInMemoryMaxRatio / 100.0))``): a record
    further back is "in disk" (the smaller ``...InDisk`` batch caps), and a pull whose last
    entry read lies further back suggests a slave (``suggest_pulling_from_slave``)."""
    return int(TOTAL_PHYSICAL_MEMORY * (config.access_message_in_memory_max_ratio / 100.0))


def _next_offset_correction(config: MessageStoreConfig, old: int, new: int) -> int:
    # A slave only moves a consumer's offset when offsetCheckInSlave is on.
    if config.broker_role is not BrokerRole.SLAVE or config.offset_check_in_slave:
        return new
    return old


def _batch_caps(
    config: MessageStoreConfig, max_nums: int
) -> tuple[tuple[int, int], tuple[int, int]]:
    """A pull's batch caps, read once per pull (Java's ``isTheBatchFull``): for a record within
    memory, then for one "in disk", the bytes and the record count a batch may not pass
    (``maxTransfer{Bytes,Count}OnMessage{InMemory,InDisk}``, the count also the request's
    ``maxMsgNums``).  A batch's first record is always taken."""
    return (
        (
            config.max_transfer_bytes_on_message_in_memory,
            min(max_nums, config.max_transfer_count_on_message_in_memory),
        ),
        (
            config.max_transfer_bytes_on_message_in_disk,
            min(max_nums, config.max_transfer_count_on_message_in_disk),
        ),
    )


def get_message(
    config: MessageStoreConfig,
    commitlog: CommitLog,
    cq: ConsumeQueue | None,
    offset: int,
    max_nums: int,
    message_filter: Collection[int] | None,
    record_filter: Callable[[bytes], bool] | None = None,
) -> GetMessageResult:
    result = GetMessageResult()
    if cq is None:
        result.status = GetMessageStatus.NO_MATCHED_LOGIC_QUEUE
        result.next_begin_offset = _next_offset_correction(config, offset, 0)
        return result
    min_offset = result.min_offset = cq.min_offset_in_queue
    max_offset = result.max_offset = cq.max_offset_in_queue
    if max_offset == 0:
        result.status = GetMessageStatus.NO_MESSAGE_IN_QUEUE
        result.next_begin_offset = _next_offset_correction(config, offset, 0)
    elif offset < min_offset:
        result.status = GetMessageStatus.OFFSET_TOO_SMALL
        result.next_begin_offset = _next_offset_correction(config, offset, min_offset)
    elif offset == max_offset:
        result.status = GetMessageStatus.OFFSET_OVERFLOW_ONE
        result.next_begin_offset = _next_offset_correction(config, offset, offset)
    elif offset > max_offset:
        result.status = GetMessageStatus.OFFSET_OVERFLOW_BADLY
        target = min_offset if min_offset == 0 else max_offset
        result.next_begin_offset = _next_offset_correction(config, offset, target)
    else:
        entries = cq.entries_from(offset)
        if entries is None:
            result.status = GetMessageStatus.OFFSET_FOUND_NULL
            result.next_begin_offset = _next_offset_correction(
                config, offset, cq.roll_next_file(offset)
            )
        else:
            _collect(
                config, commitlog, entries, offset, max_nums, message_filter, record_filter, result
            )
    return result


_bad_entries_reported = 0


def _report_bad_entry(queue_offset: int, phy: int, size: int, head8: bytes) -> None:
    """Log a consume-queue entry that does not point at a record of its size (the first
    ten, then one in a thousand: a damaged queue is read again by every pull)."""
    global _bad_entries_reported
    _bad_entries_reported += 1
    if _bad_entries_reported <= 10 or _bad_entries_reported % 1000 == 0:
        head = head8.hex() or "none"
        log.error(
            "consume-queue entry at queue offset %d points to commit-log offset %d, size %d, "
            "where no such record starts (first bytes %s): skipped (%d such so far)",
            queue_offset,
            phy,
            size,
            head,
            _bad_entries_reported,
        )


def _missing_record(commitlog: CommitLog, phy: int) -> bytes | None:
    """For an entry whose record the commit log did not give: b"" when its file is there but
    not the range (a damaged entry), None when its file is gone."""
    return b"" if commitlog.queue.find_by_offset(phy) is not None else None


def _collect(
    config: MessageStoreConfig,
    commitlog: CommitLog,
    entries: bytes,
    offset: int,
    max_nums: int,
    message_filter: Collection[int] | None,
    record_filter: Callable[[bytes], bool] | None,
    result: GetMessageResult,
) -> None:
    # Each skipped entry sets ``status`` to why; a batch holding a record is FOUND whatever
    # it skipped after it (the status is settled at the end).  Run once per record of every
    # pull: no call per record but the reads and the filters.
    status = GetMessageStatus.NO_MATCHED_MESSAGE
    max_phy = commitlog.max_offset
    memory = in_memory_bytes(config)
    in_disk_below = max_phy - memory  # a record before this offset is "in disk"
    in_memory_caps, in_disk_caps = _batch_caps(config, max_nums)
    next_phy_file_start = -1
    max_phy_pulling = 0
    scan_limit = min(len(entries), max(MIN_FILTER_SCAN_BYTES, max_nums * CQ_STORE_UNIT_SIZE))
    messages = result.messages
    queue_offsets = result.queue_offsets
    is_record = record_is
    read = commitlog.get_message
    total = 0
    i = 0
    deadline = time.monotonic() + RECORD_FILTER_BUDGET
    out_of_time = False
    while i < scan_limit:
        phy, size, code = ENTRY.unpack_from(entries, i)
        max_phy_pulling = phy
        if phy < next_phy_file_start:  # its file is gone: skipped up to the next file
            i += CQ_STORE_UNIT_SIZE
            continue
        if total:  # the batch full? (its first record is always taken)
            cap_bytes, cap_count = in_disk_caps if phy < in_disk_below else in_memory_caps
            if total + size > cap_bytes or len(messages) >= cap_count:
                break
        if message_filter is not None and code not in message_filter:
            status = GetMessageStatus.NO_MATCHED_MESSAGE
            i += CQ_STORE_UNIT_SIZE
            continue
        record = read(phy, size)
        if record is None:
            record = _missing_record(commitlog, phy)
            if record is None:
                status = GetMessageStatus.MESSAGE_WAS_REMOVING
                next_phy_file_start = commitlog.roll_next_file(phy)
                i += CQ_STORE_UNIT_SIZE
                continue
        if not is_record(record, size):
            # A damaged entry (a flipped bit, a file changed behind the broker): serving the
            # bytes it points to would hand consumers garbage they cannot decode and stall them
            # at this offset; it is skipped, as a filtered message is.
            _report_bad_entry(offset + i // CQ_STORE_UNIT_SIZE, phy, size, record[:8])
            status = GetMessageStatus.NO_MATCHED_MESSAGE
            i += CQ_STORE_UNIT_SIZE
            continue
        if record_filter is not None:
            matched = record_filter(record)
            # The pull's evaluation budget spent: it answers with what it found so far.
            out_of_time = time.monotonic() > deadline
            if not matched:
                status = GetMessageStatus.NO_MATCHED_MESSAGE
                i += CQ_STORE_UNIT_SIZE
                if out_of_time:
                    break
                continue
        messages.append(record)
        queue_offsets.append(offset + i // CQ_STORE_UNIT_SIZE)
        total += size
        next_phy_file_start = -1
        i += CQ_STORE_UNIT_SIZE
        if out_of_time:
            break
    if total:
        status = GetMessageStatus.FOUND
    result.status = status
    result.buffer_total_size = total
    result.next_begin_offset = offset + i // CQ_STORE_UNIT_SIZE
    result.fall_behind = max_phy - max_phy_pulling
    result.suggest_pulling_from_slave = result.fall_behind > memory
