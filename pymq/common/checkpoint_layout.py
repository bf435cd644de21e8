"""The layout of a store's ``checkpoint`` file, defined once for the store and for export.

As Java 4.x writes it: the first bytes of one OS page hold three big-endian int64 store
timestamps (milliseconds, see :mod:`pymq.common.clock`) at offsets 0, 8 and 16::

    physicMsgTimestamp i8 | logicsMsgTimestamp i8 | indexMsgTimestamp i8

The store (:class:`pymq.store.checkpoint.StoreCheckpoint`) maps and writes it; export
(:func:`pymq.export.scan.read_checkpoint_timestamp`) reads it to stop at what was flushed.
"""

from __future__ import annotations

import mmap
import struct
from typing import NamedTuple

CHECKPOINT_FILE = "checkpoint"
"""Its name under ``storePathRootDir``."""
CHECKPOINT_PAGE_SIZE = 4096
"""The file is one OS page."""
CHECKPOINT_LAYOUT = struct.Struct(">qqq")
"""physicMsgTimestamp, logicsMsgTimestamp, indexMsgTimestamp."""


class CheckpointTimestamps(NamedTuple):
    physic_msg_timestamp: int
    """The store timestamp of the newest commit-log record flushed."""
    logics_msg_timestamp: int
    """... of the newest record flushed into a consume queue."""
    index_msg_timestamp: int
    """... of the newest record in a flushed index file."""


def unpack_checkpoint(buf: bytes | bytearray | memoryview | mmap.mmap) -> CheckpointTimestamps:
    """The timestamps at the start of ``buf`` (at least ``CHECKPOINT_LAYOUT.size`` bytes)."""
    return CheckpointTimestamps._make(CHECKPOINT_LAYOUT.unpack_from(buf, 0))


def pack_checkpoint_into(
    buf: bytearray | memoryview | mmap.mmap, stamps: CheckpointTimestamps
) -> None:
    CHECKPOINT_LAYOUT.pack_into(buf, 0, *stamps)
