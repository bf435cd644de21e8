"""``StoreCheckpoint`` plus the ``abort`` and ``lock`` files of a store root.

The checkpoint is the file ``checkpoint``: one OS page, mapped, laid out as
:mod:`pymq.common.checkpoint_layout` says (three int64 store timestamps).  Setters change memory
only; :meth:`StoreCheckpoint.flush` (blocking, run it
in a worker thread) writes and syncs them.

``abort`` exists while a store runs; finding it at start means the last exit was not clean.
``lock`` is held with an exclusive ``flock`` for the life of the store; a second store on the same
root gets :class:`StoreLockedError` instead of corrupting the first one's files.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os

from pymq.common.checkpoint_layout import (
    CHECKPOINT_PAGE_SIZE,
    CheckpointTimestamps,
    pack_checkpoint_into,
    unpack_checkpoint,
)
from pymq.common.errors import StartupError
from pymq.store.mapped_file import allocate_blocks

OS_PAGE_SIZE = CHECKPOINT_PAGE_SIZE
RECOVERY_TIME_MARGIN_MS = 3000
"""Java starts abnormal recovery 3 s before the checkpoint's oldest timestamp, to be safe."""


class StoreCheckpoint:
    """The three timestamps recovery starts from; owns the mapped ``checkpoint`` file."""

    def __init__(self, path: str) -> None:
        """Blocking: open or create the file and read the saved timestamps."""
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size < OS_PAGE_SIZE:
                os.ftruncate(fd, OS_PAGE_SIZE)
            # Its one page gets its block now (a no-op once it has one): a write into a sparse
            # mapping on a full disk would be a SIGBUS (see pymq.store.mapped_file).
            allocate_blocks(fd, OS_PAGE_SIZE)
            self._mm = mmap.mmap(fd, OS_PAGE_SIZE)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp = (
            unpack_checkpoint(self._mm)
        )

    @property
    def min_timestamp(self) -> int:
        """Where abnormal recovery may start: the older of physic and logics, less 3 s."""
        return max(
            0, min(self.physic_msg_timestamp, self.logics_msg_timestamp) - RECOVERY_TIME_MARGIN_MS
        )

    @property
    def min_timestamp_index(self) -> int:
        return min(self.min_timestamp, self.index_msg_timestamp)

    def flush(self) -> None:
        """Blocking: write the timestamps and sync them."""
        pack_checkpoint_into(
            self._mm,
            CheckpointTimestamps(
                self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp
            ),
        )
        os.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            self._mm.close()
            os.close(self._fd)
            self._fd = -1


class StoreLockedError(StartupError):
    """Another store already runs on this directory."""


class StoreLock:
    """The exclusive ``lock`` file of a store root, held until :meth:`release`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = -1

    def acquire(self) -> None:
        """Blocking (briefly): take the lock or raise :class:`StoreLockedError` at once."""
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreLockedError(
                f"Lock failed, MQ already started: another store holds {self.path}"
            ) from None
        os.pwrite(fd, b"lock", 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1


def abort_file_exists(path: str) -> bool:
    return os.path.exists(path)


def create_abort_file(path: str) -> None:
    """Blocking: mark the store as running (removed again on a clean shutdown)."""
    with open(path, "wb") as f:
        os.fsync(f.fileno())


def remove_abort_file(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
