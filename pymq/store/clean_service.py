"""Clean services: expire commit-log files, then consume-queue and index files below them.

``CleanCommitLogService`` runs every ``cleanResourceInterval`` ms.  Files older than
``fileReservedTime`` hours (by modification time) are deleted when it is the ``deleteWhen`` hour
(e.g. "04", or "04;05"), when disk use is above ``diskMaxUsedSpaceRatio``, or after a manual
request; above 85 % every file but the newest is deleted whatever its age, and above 90 % the
store refuses writes (``disk_full``) until use falls again.  Use is Java's (and ``df``'s): used
over used + available, so the blocks a filesystem reserves for root count as neither
(:func:`disk_used_ratio`).  At most 10 files go per round.

``CleanConsumeQueueService`` follows: once the commit log's min offset has moved, consume-queue
files and index files wholly below it are deleted and each queue's min offset is corrected.

Clock, disk usage and file ages are injectable so tests can drive them.
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Callable
from typing import NamedTuple

from pymq.store.commitlog import CommitLog
from pymq.store.config import MessageStoreConfig
from pymq.store.consume_queue_table import ConsumeQueueTable
from pymq.store.index_service import IndexService

log = logging.getLogger(__name__)

DISK_SPACE_WARNING_LEVEL_RATIO = 0.90
"""Above this the disk counts as full and puts are refused (Java's diskSpaceWarningLevelRatio)."""
DISK_SPACE_CLEAN_FORCIBLY_RATIO = 0.85
"""Above this files are deleted whatever their age (Java's diskSpaceCleanForciblyRatio)."""
MANUAL_DELETE_ROUNDS = 20
"""A manual delete request (admin command) keeps deletion allowed for this many rounds."""


class DiskSpace(NamedTuple):
    """A partition's space as Java's ``File`` reports it (statvfs blocks times ``f_frsize``)."""

    total: int
    """``f_blocks``: File.getTotalSpace."""
    free: int
    """``f_bfree``, including the blocks reserved for root: File.getFreeSpace."""
    available: int
    """``f_bavail``, what an unprivileged process can still write: File.getUsableSpace."""

    @property
    def used(self) -> int:
        return self.total - self.free

    @property
    def used_ratio(self) -> float:
        """UtilAll.getDiskPartitionSpaceUsedPercent (4.9.4), as ``df`` reports Use%: used over
        used + available (the root-reserved blocks count as neither), rounded up to a whole
        per cent, as a fraction (0.4 for 39.2 %); -1 for a partition with no blocks."""
        used, entire = self.used, self.used + self.available
        if self.total <= 0 or entire <= 0:
            return -1.0
        percent = -(-used * 100 // entire)  # the ceiling
        return percent / 100


def disk_space(path: str) -> DiskSpace | None:
    """The space of the partition holding ``path``, or None when it cannot be read (no such
    path).  Every disk figure of the store and the broker (the clean services' ratios, the
    runtime-info keys, the metrics, the console) is read through this one function."""
    try:
        st = os.statvfs(path)
    except (OSError, ValueError):
        return None
    unit = st.f_frsize
    return DiskSpace(st.f_blocks * unit, st.f_bfree * unit, st.f_bavail * unit)


def disk_used_ratio(path: str) -> float:
    """Used fraction of the partition holding ``path`` as Java computes it
    (:attr:`DiskSpace.used_ratio`); -1 when it cannot be read."""
    space = disk_space(path)
    return -1.0 if space is None else space.used_ratio


class CleanCommitLogService:
    def __init__(
        self,
        commitlog: CommitLog,
        config: MessageStoreConfig,
        clock_ms: Callable[[], int],
        disk_ratio: Callable[[str], float] = disk_used_ratio,
        mtime: Callable[[str], float] = os.path.getmtime,
    ) -> None:
        self.commitlog = commitlog
        self.config = config
        self.clock_ms = clock_ms
        self.disk_ratio = disk_ratio
        self.mtime = mtime
        self.disk_full = False
        self.clean_immediately = False
        self.manual_delete_rounds = 0
        self.last_ratio = 0.0

    def execute_delete_files_manually(self) -> None:
        self.manual_delete_rounds = MANUAL_DELETE_ROUNDS

    def is_time_to_delete(self, delete_when: str | None = None) -> bool:
        """Whether it is the ``deleteWhen`` hour (``delete_when``: another list of hours)."""
        hour = datetime.datetime.fromtimestamp(self.clock_ms() / 1000).hour
        hours = self.config.delete_when if delete_when is None else delete_when
        for when in hours.split(";"):
            when = when.strip()
            if when.isdigit() and int(when) == hour:
                return True
        return False

    def used_ratio(self) -> float:
        """The used fraction of the disk the commit log is on (-1: unknown)."""
        return self.disk_ratio(self.config.store_path_commitlog)

    def check_space(self) -> bool:
        """Update the disk-full and clean-immediately flags; True if space calls for deleting."""
        ratio = self.used_ratio()
        self.last_ratio = ratio
        self.clean_immediately = False
        if ratio > DISK_SPACE_WARNING_LEVEL_RATIO:
            if not self.disk_full:
                log.error(
                    "disk %.0f%% used: the store refuses writes until files are deleted",
                    ratio * 100,
                )
            self.disk_full = True
            self.clean_immediately = True
        elif ratio > DISK_SPACE_CLEAN_FORCIBLY_RATIO:
            self.clean_immediately = True
            self.disk_full = False
        else:
            if self.disk_full:
                log.info("disk %.0f%% used: writes allowed again", ratio * 100)
            self.disk_full = False
        max_ratio = self.config.disk_max_used_space_ratio_clamped / 100
        return ratio < 0 or ratio > max_ratio

    async def run_once(self) -> int:
        """One cleaning round; returns the number of files deleted."""
        time_up = self.is_time_to_delete()
        space = self.check_space()
        manual = self.manual_delete_rounds > 0
        if not (time_up or space or manual):
            return 0
        if manual:
            self.manual_delete_rounds -= 1
        at_once = self.config.clean_file_forcibly_enable and self.clean_immediately
        expired_ms = self.config.file_reserved_time * 3600 * 1000
        queue = self.commitlog.queue
        doomed = queue.expired_by_time(expired_ms, self.clock_ms(), at_once, self.mtime)
        if doomed:
            log.info(
                "deleting %d commit-log files (time up %s, space %s, manual %s, at once %s)",
                len(doomed),
                time_up,
                space,
                manual,
                at_once,
            )
        return await queue.delete_files(doomed, self.config.delete_commit_log_files_interval)


class CleanConsumeQueueService:
    def __init__(
        self,
        commitlog: CommitLog,
        table: ConsumeQueueTable,
        index: IndexService | None,
        config: MessageStoreConfig,
    ) -> None:
        self.commitlog = commitlog
        self.table = table
        self.index = index
        self.config = config
        self.last_phy_offset = 0

    async def run_once(self) -> int:
        min_offset = self.commitlog.min_offset
        if min_offset <= self.last_phy_offset:
            return 0
        self.last_phy_offset = min_offset
        deleted = 0
        for cq in list(self.table):
            doomed = cq.expired_files(min_offset)
            deleted += await cq.queue.delete_files(
                doomed, self.config.delete_consume_queue_files_interval
            )
            cq.correct_min_offset(min_offset)
        if self.index is not None:
            doomed_index = self.index.expired_files(min_offset)
            await self.index.delete_files(doomed_index)
            deleted += len(doomed_index)
        return deleted
