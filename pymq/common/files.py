"""Crash-safe config files, as RocketMQ's ``MixAll.string2File`` writes them, and page-cache
housekeeping for store files (:func:`drop_cached_from`).

A file is written to ``<path>.tmp``, synced, the previous version is kept as ``<path>.bak``, and the
temporary file is renamed over ``<path>``.  Reading falls back to ``.bak`` when the main file is
missing, empty or fails to parse.  These are blocking calls: Trio code runs them in a worker
thread (``trio.to_thread.run_sync``), as :class:`PropertiesFile` does for a server's config file.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import trio

from pymq.common.config import ConfigError, check_runtime_update, update_at_runtime
from pymq.common.properties import updated_properties_text

log = logging.getLogger(__name__)

T = TypeVar("T")

LARGEST_FOLIO = 2 * 1024 * 1024
"""The largest page-cache folio Linux makes on x86-64 (a PMD): :func:`drop_cached_from` starts
at a multiple of it, so that no large folio straddles its start and stays cached."""

_FADV_DONTNEED: int | None = getattr(os, "POSIX_FADV_DONTNEED", None)


def folio_floor(pos: int) -> int:
    """The :data:`LARGEST_FOLIO` boundary at or below ``pos`` (0 for a negative one)."""
    return (max(0, pos) // LARGEST_FOLIO) * LARGEST_FOLIO


def drop_cached_from(fd: int, pos: int, size: int) -> None:
    """Blocking: evict the clean, unmapped page cache of ``fd`` from ``pos`` (from the
    :data:`LARGEST_FOLIO` boundary below it) to ``size`` (POSIX_FADV_DONTNEED).  For the tail
    of a commit-log file past its data, which readers' readahead fills with large folios of
    zeros: a SYNC_FLUSH broker that later writes there would dirty, and sync, whole folios
    (see MappedFile.advise_writes).  Dirty or mapped pages stay; a page dropped is read again
    when needed.  Advice only: errors are ignored, and nothing changes where the kernel or the
    filesystem (tmpfs) keeps the pages."""
    if _FADV_DONTNEED is None:
        return
    start = folio_floor(pos)
    if start >= size:
        return
    with contextlib.suppress(OSError):
        os.posix_fadvise(fd, start, size - start, _FADV_DONTNEED)


LARGE_READAHEAD_KB = 1024
"""A device readahead (``read_ahead_kb``) from which a fault in a mapped file reads ahead
windows large enough for the kernel to fill them with large folios (2 MiB and up): the
commit log's writes through its map are then better faulted a page at a time (see
:func:`readahead_kb` and MessageStore)."""


def readahead_kb(path: str) -> int | None:
    """The readahead (``read_ahead_kb``) of the block device under the filesystem holding
    ``path`` (or its nearest existing parent): its backing device's, or for a partition its
    disk's; None when it cannot be told (a filesystem with no block device, such as tmpfs or
    overlayfs, or no sysfs)."""
    path = os.path.abspath(path)
    while True:  # the nearest directory that exists: a store's may not yet
        try:
            dev = os.stat(path).st_dev
            break
        except OSError:
            parent = os.path.dirname(path)
            if parent == path:
                return None
            path = parent
    major, minor = os.major(dev), os.minor(dev)
    candidates = [f"/sys/class/bdi/{major}:{minor}/read_ahead_kb"]
    block = f"/sys/dev/block/{major}:{minor}"
    candidates.append(os.path.join(block, "queue", "read_ahead_kb"))
    candidates.append(os.path.join(block, "..", "queue", "read_ahead_kb"))  # a partition
    for candidate in candidates:
        try:
            with open(candidate) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            continue
    return None


def write_file_atomic(path: str, data: bytes) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    if os.path.exists(path):
        os.replace(path, path + ".bak")
    os.replace(tmp, path)
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_properties(path: str, changes: dict[str, str]) -> None:
    """Set ``changes`` (key -> value) in the properties file ``path`` (made when missing),
    keeping its other lines and comments as written; crash-safe as :func:`write_file_atomic`."""
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", errors="surrogateescape")
    except FileNotFoundError:
        text = ""
    updated = updated_properties_text(text, changes)
    write_file_atomic(path, updated.encode("utf-8", errors="surrogateescape"))


class PropertiesFile:
    """The properties file a server's runtime config changes are saved to, so that a restart
    keeps them (RocketMQ's ``Configuration.persist``); one save at a time, in a worker thread."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = trio.Lock()

    async def save(self, changes: dict[str, str]) -> None:
        """Set ``changes`` in the file; OSError or UnicodeError when it cannot be written (the
        file is then as it was)."""
        async with self._lock:
            await trio.to_thread.run_sync(save_properties, self.path, dict(changes))

    async def apply(
        self,
        configs: Sequence[object],
        props: Mapping[str, str],
        restart_only: frozenset[str],
        what: str,
    ) -> dict[str, str]:
        """A running server's config change (UPDATE_BROKER_CONFIG, UPDATE_NAMESRV_CONFIG):
        checked, saved to this file, then applied, so that a restart keeps whatever is in force.
        Raises as :func:`~pymq.common.config.update_at_runtime` does, or ConfigError when the
        file cannot be written (a remark that names no path); nothing is changed then.  Returns
        the new values."""
        check_runtime_update(configs, props, restart_only, what)
        try:
            await self.save({key: value.strip() for key, value in props.items()})
        except (OSError, UnicodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else "a value cannot be written as text"
            raise ConfigError(
                f"the change could not be saved to the config file ({why}); nothing was changed"
            ) from None
        return update_at_runtime(configs, props, restart_only, what)


class CoalescedWriter:
    """Atomic writes of one file's latest state, in a worker thread, one at a time, coalesced.

    :meth:`write` returns once the state as it was at the call (or later) is on disk.  A call
    that arrives while a write is under way waits, and the next write, which takes its snapshot
    when it starts, covers every call that waited: at most one encoded copy of the state exists
    at a time, however many changes wait for a slow disk (#37: each waiting change used to hold
    its own copy), and a burst of N changes costs two writes, not N.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = trio.Lock()
        self._calls = 0  # write() calls so far
        self._covered = 0  # the calls the last completed write covered

    async def write(self, snapshot: Callable[[], Callable[[], bytes]]) -> None:
        """``snapshot()`` is called on the loop when a write starts; the function it returns is
        called in the worker thread for the bytes to write."""
        self._calls += 1
        mine = self._calls
        async with self._lock:
            if self._covered >= mine:
                return  # a write that started after this call covered it
            covers = self._calls
            encode = snapshot()
            await trio.to_thread.run_sync(lambda: write_file_atomic(self.path, encode()))
            self._covered = covers


def read_file_with_backup(path: str, parse: Callable[[bytes], T]) -> T | None:
    """Parse ``path``, else its ``.bak``; None when neither exists.

    Raises ``ValueError`` when a file exists but neither it nor its backup parses: starting with
    an empty table would silently drop the operator's data.
    """
    problems: list[str] = []
    for candidate in (path, path + ".bak"):
        try:
            with open(candidate, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            continue
        if not data.strip():
            log.warning("%s is empty, trying its backup", candidate)
            problems.append(f"{candidate} is empty")
            continue
        try:
            return parse(data)
        except Exception as exc:
            log.error("%s is corrupt (%s), trying its backup", candidate, exc)
            problems.append(f"{candidate}: {exc}")
    if problems and os.path.exists(path):
        raise ValueError("cannot load " + "; ".join(problems))
    return None
