"""``MappedFileQueue``: the ordered run of equally sized files that make one log.

Ownership: the queue owns its ``MappedFile`` objects and is the only one to create, destroy or
flush them.  Files are named by their 20-digit start offset and are contiguous.  Creating the next
file takes a pre-allocated one when the :class:`MappedFileAllocator` has it ready and otherwise
creates it on the spot (open + ftruncate + fallocate of the first chunk + mmap: a few syscalls,
hence the allocator; :mod:`pymq.store.mapped_file` says how blocks are allocated).  Flushing
and deletion take ``io_lock`` so that a worker thread never syncs a file that is being closed;
the loop alone changes positions and the file list.  ``io_lock`` is a semaphore, not a
``trio.Lock``, so that a sync started without a checkpoint (:meth:`MappedFileQueue.begin_flush`)
can release it from the callback that reports the worker thread's end.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, Protocol

import trio

from pymq.common.native import load_native
from pymq.store.mapped_file import (
    CREATING_SUFFIX,
    MappedFile,
    offset_to_file_name,
    sync_directory,
)

native_extension: Any = load_native("pymq.store._commitlogc")

log = logging.getLogger(__name__)

DELETE_FILES_BATCH_MAX = 10
"""At most this many files are deleted per clean round, as in RocketMQ, to bound the I/O burst."""


class StoreLoadError(RuntimeError):
    """The files on disk cannot be loaded as this queue (wrong size, bad name, gap)."""


class CreateFileError(OSError):
    """A store file could not be created (typically ENOSPC: the disk is full)."""


DEFAULT_CREATE_RETRY_INTERVAL_S = 1.0
"""Default of ``mappedFileCreateRetryInterval`` (ms in the config): how long a failed creation
is not tried again on the put path while the allocator retries it in its thread."""


class MappedFileAllocator:
    """Pre-creates the next file of a queue off the hot path (Java's AllocateMappedFileService).

    ``request(path, size)`` is called on the loop; :meth:`run` creates requested files in a worker
    thread; ``take(path)`` hands a ready file over, or None.  Files never taken are deleted at
    shutdown: an empty file left in the directory would otherwise load as part of the queue.

    A creation that fails (a full disk) is logged and retried every ``retry_interval`` seconds
    until it succeeds; meanwhile :meth:`failure` tells the put path not to try it again itself,
    so a full disk costs a refused put nothing but a dictionary lookup.
    """

    def __init__(
        self,
        retry_interval: float = DEFAULT_CREATE_RETRY_INTERVAL_S,
        *,
        warm: bool = False,
        advise_writes: bool = False,
    ) -> None:
        self.retry_interval = retry_interval
        # warmMapedFileEnable: a file's first chunk is faulted in as it is made (see CommitLog).
        self.warm = warm
        # The queue advises its files' writes (MappedFile.advise_writes): a warm file is
        # advised before its first chunk is faulted in, or the faults could make large folios.
        self.advise_writes = advise_writes
        self._wanted: dict[str, int] = {}
        self._ready: dict[str, MappedFile] = {}
        # path -> (trio time of the failed attempt, why): creations that failed lately.
        self._failed: dict[str, tuple[float, str]] = {}
        self._wake = trio.Event()

    def request(self, path: str, size: int) -> None:
        if path not in self._ready and path not in self._wanted:
            self._wanted[path] = size
            self._wake.set()

    def take(self, path: str) -> MappedFile | None:
        self._wanted.pop(path, None)
        return self._ready.pop(path, None)

    def failure(self, path: str) -> str | None:
        """Why the creation of ``path`` failed, while the allocator has yet to retry it."""
        failed = self._failed.get(path)
        if failed is None:
            return None
        if trio.current_time() - failed[0] >= self.retry_interval:
            return None  # due for another try: the caller may try too
        return failed[1]

    def note_failure(self, path: str, size: int, exc: OSError) -> None:
        """A creation of ``path`` failed on the put path: retry it here, off the loop."""
        self._failed[path] = (trio.current_time(), _describe(exc))
        self._wanted[path] = size
        self._wake.set()

    def note_success(self, path: str) -> None:
        if self._failed.pop(path, None) is not None:
            log.warning("created store file %s: writes can resume", path)

    @property
    def failing(self) -> bool:
        """True while some creation keeps failing (cleared by its first success)."""
        return bool(self._failed)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                if self._failed and self._wanted:
                    with trio.move_on_after(self.retry_interval):
                        await trio.sleep_forever()
                else:
                    await self._wake.wait()
                self._wake = trio.Event()
                for path, size in list(self._wanted.items()):
                    if path not in self._wanted:
                        continue  # taken meanwhile
                    try:
                        if self.warm:
                            mf = await trio.to_thread.run_sync(
                                _create_populated, path, size, self.advise_writes
                            )
                        else:
                            mf = await trio.to_thread.run_sync(MappedFile.create, path, size)
                    except OSError as exc:
                        if path not in self._failed:
                            log.error(
                                "cannot create store file %s (%s); retrying every %.1f s",
                                path,
                                _describe(exc),
                                self.retry_interval,
                            )
                        self._failed[path] = (trio.current_time(), _describe(exc))
                        continue
                    self.note_success(path)
                    if self._wanted.pop(path, None) is None:
                        # The queue made this file itself meanwhile and writes into it: unmap
                        # our mapping, never delete the file.
                        mf.close()
                    else:
                        self._ready[path] = mf
        finally:
            with trio.CancelScope(shield=True):
                for mf in self._ready.values():
                    await trio.to_thread.run_sync(mf.destroy)
                self._ready.clear()


def _create_populated(path: str, size: int, advise_writes: bool = False) -> MappedFile:
    """Blocking (the allocator's worker thread, warmMapedFileEnable): the next commit-log file,
    its first chunk's pages already faulted in (MappedFile.populate), so that its first writes
    do not fault; advised first when the queue advises its writes."""
    mf = MappedFile.create(path, size)
    if advise_writes:
        mf.advise_writes()
    mf.populate(0, mf.allocated)
    return mf


def _describe(exc: OSError) -> str:
    if exc.errno == errno.ENOSPC:
        return "no space left on device (disk full)"
    return exc.strerror or str(exc)


class MappedFileQueue:
    """Files of ``file_size`` bytes under ``directory``; global offsets span all of them."""

    def __init__(
        self,
        directory: str,
        file_size: int,
        allocator: MappedFileAllocator | None = None,
        *,
        lazy_directory_sync: bool = False,
        chunk: int | None = None,
    ) -> None:
        self.directory = directory
        # Blocks of this queue's files are allocated this many bytes at a time (None: the
        # default, mapped_file.ALLOCATE_CHUNK; see MappedFile).
        self.chunk = chunk
        # With lazy_directory_sync a file this queue creates on the event loop is not followed by
        # a directory sync there (milliseconds on a busy disk, on the path of a consume queue's
        # first entry); the next flush syncs the directory, in its worker thread, before the
        # files' data, so nothing durable ever depends on an entry that is not.
        self.lazy_directory_sync = lazy_directory_sync
        self._directory_dirty = False
        # Files synced often (the commit log under SYNC_FLUSH): the part being written is
        # faulted in a page at a time (MappedFile.advise_writes); set before load.
        self.advise_writes = False
        self.file_size = file_size
        self.allocator = allocator
        self.files: list[MappedFile] = []
        self.flushed_where = 0
        self.sync_failures = 0  # failed syncs in a row (see _sync_failed)
        # Store timestamp of the newest record covered by the last flush (for the checkpoint).
        self.store_timestamp = 0
        self.io_lock = trio.Semaphore(1, max_value=1)

    # --- loading -------------------------------------------------------------------------------

    def load(self) -> None:
        """Blocking: map every file in the directory, oldest first, as full files.

        Recovery then sets the real write position.  Raises :class:`StoreLoadError` when a file has
        another size or a name that is not a 20-digit offset matching its place in the run.
        """
        if not os.path.isdir(self.directory):
            return
        names = sorted(os.listdir(self.directory))
        for name in [n for n in names if n.startswith(".") and n.endswith(CREATING_SUFFIX)]:
            log.warning("removing %s, left by a file creation that did not finish", name)
            os.unlink(os.path.join(self.directory, name))
        names = [n for n in names if not n.startswith(".")]
        # An empty file at the end can only be a creation cut short (by a crash or by a store
        # written elsewhere): it holds nothing, so it goes rather than blocking the start.
        while names and os.path.getsize(os.path.join(self.directory, names[-1])) == 0:
            log.warning("removing empty store file %s", os.path.join(self.directory, names[-1]))
            os.unlink(os.path.join(self.directory, names.pop()))
        expected: int | None = None
        for name in names:
            path = os.path.join(self.directory, name)
            if not name.isdigit() or len(name) != 20:
                raise StoreLoadError(f"unexpected file {path} in a store directory")
            size = os.path.getsize(path)
            if size != self.file_size:
                raise StoreLoadError(
                    f"{path} is {size} bytes but the configured file size is {self.file_size}; "
                    "was the store written with another mappedFileSize?"
                )
            start = int(name)
            if start % self.file_size:
                raise StoreLoadError(f"{path}: start offset is not a multiple of the file size")
            if expected is not None and start != expected:
                log.warning("gap before %s (expected start %d)", path, expected)
            mf = MappedFile(path, self.file_size, chunk=self.chunk)
            mf.wrote_position = mf.flushed_position = self.file_size
            self.files.append(mf)
            expected = start + self.file_size
        # How far the blocks of these files exist is not known (``allocated`` 0): recovery
        # allocates the last one up to its data end plus a chunk (truncate_dirty_files), and a
        # write into any other would allocate from 0 first (see MappedFile).

    def close(self) -> None:
        for mf in self.files:
            mf.close()

    # --- lookups -------------------------------------------------------------------------------

    @property
    def last_file(self) -> MappedFile | None:
        return self.files[-1] if self.files else None

    @property
    def first_file(self) -> MappedFile | None:
        return self.files[0] if self.files else None

    @property
    def min_offset(self) -> int:
        return self.files[0].file_from_offset if self.files else -1

    @property
    def max_offset(self) -> int:
        """Global offset just past the last written byte (0 for an empty queue): the last
        file's max_offset, read here (dispatch asks for it with each put)."""
        files = self.files
        if not files:
            return 0
        last = files[-1]
        return last.file_from_offset + last.wrote_position

    def find_by_offset(
        self, offset: int, return_first_on_not_found: bool = False
    ) -> MappedFile | None:
        """The file holding global ``offset``, or None (or the first file) when none does."""
        files = self.files
        if files:
            first = files[0].file_from_offset
            index = (offset - first) // self.file_size
            if 0 <= index < len(files):
                mf = files[index]
                if mf.file_from_offset <= offset < mf.file_from_offset + self.file_size:
                    return mf
            for mf in files:  # a gap in the run: fall back to a scan
                if mf.file_from_offset <= offset < mf.file_from_offset + self.file_size:
                    return mf
            if return_first_on_not_found:
                return files[0]
        return None

    def _new_file(self, start: int) -> MappedFile:
        path = os.path.join(self.directory, offset_to_file_name(start))
        allocator = self.allocator
        if allocator is not None:
            # A file the allocator failed to make lately is not tried on the loop: refused at
            # once, and left wanted for the allocator's next try.
            why = allocator.failure(path)
            if why is not None:
                raise CreateFileError(errno.ENOSPC, f"cannot create {path}: {why}")
        mf = allocator.take(path) if allocator else None
        if mf is None:
            try:
                mf = MappedFile.create(
                    path,
                    self.file_size,
                    sync_dir=not self.lazy_directory_sync,
                    chunk=self.chunk,
                )
            except OSError as exc:
                if allocator is not None:
                    allocator.note_failure(path, self.file_size, exc)
                raise CreateFileError(
                    exc.errno or errno.EIO, f"cannot create {path}: {_describe(exc)}"
                ) from exc
            if allocator is not None:
                allocator.note_success(path)
            if self.lazy_directory_sync:
                self._directory_dirty = True
        if self.advise_writes:
            mf.advise_writes()
        if self.allocator:
            nxt = os.path.join(self.directory, offset_to_file_name(start + self.file_size))
            self.allocator.request(nxt, self.file_size)
        return mf

    def create_next_file(self) -> MappedFile:
        """The file that follows the last one, created but not yet part of the queue (the
        caller appends it with :meth:`add_file` once it has closed the last one).  Raises
        :class:`CreateFileError`; nothing is changed then."""
        last = self.files[-1]
        return self._new_file(last.file_from_offset + self.file_size)

    def add_file(self, mf: MappedFile) -> None:
        if self.files:
            self.files[-1].end_write_advice()  # full now: read ahead again
        self.files.append(mf)

    def get_last_mapped_file(self, start_offset: int = 0) -> MappedFile:
        """The file to write into: the last one, or a new one when it is full or none exists.

        A new first file starts at ``start_offset`` rounded down to the file size.  Raises
        :class:`CreateFileError` (an ``OSError``) when the file cannot be created
        (CREATE_MAPEDFILE_FAILED for a put); nothing is changed then.
        """
        start = self.next_file_start(start_offset)
        if start is None:
            return self.files[-1]
        mf = self._new_file(start)
        self.add_file(mf)
        return mf

    def next_file_start(self, start_offset: int = 0) -> int | None:
        """Where the file :meth:`get_last_mapped_file` would create starts, or None when the
        last file still has room."""
        last = self.files[-1] if self.files else None
        if last is not None and not last.is_full:
            return None
        if last is None:
            return start_offset - start_offset % self.file_size
        return last.file_from_offset + self.file_size

    def create_file(self, start: int) -> MappedFile:
        """Blocking (a worker thread): the file that starts at ``start``, created but not yet
        part of the queue (see :meth:`add_file`).  Raises :class:`CreateFileError`."""
        return self._new_file(start)

    # --- flushing ------------------------------------------------------------------------------

    def is_able_to_flush(self, least_pages: int) -> bool:
        mf = self.find_by_offset(self.flushed_where, self.flushed_where == 0)
        if mf is None:
            return False
        return mf.is_able_to_flush(least_pages) or (mf is not self.files[-1])

    async def flush(self, least_pages: int) -> bool:
        """Sync what is written but not yet durable, in a worker thread.

        With ``least_pages > 0`` a partially written file is synced only once that many new pages
        are dirty (full files are always synced).  Returns True when everything written before the
        call is now durable.
        """
        async with self.io_lock:
            todo: list[tuple[MappedFile, int, int]] = []
            for mf in self.files:
                if mf.max_offset <= self.flushed_where or mf.flushed_position >= mf.wrote_position:
                    continue
                if mf is self.files[-1] and not mf.is_able_to_flush(least_pages):
                    continue
                todo.append((mf, mf.wrote_position, mf.last_store_timestamp))
            target = self.max_offset
            if self._directory_dirty:
                self._directory_dirty = False
                try:
                    await trio.to_thread.run_sync(sync_directory, self.directory)
                except FileNotFoundError:
                    return True  # the queue was deleted meanwhile: nothing left to make durable
                except BaseException:
                    self._directory_dirty = True
                    raise
            if not todo:
                return self.flushed_where >= target
            try:
                await trio.to_thread.run_sync(_sync_all, [mf for mf, _, _ in todo])
            except OSError:
                self._sync_failed(todo)
                raise
            self._flushed(todo)
            return self.flushed_where >= target

    def _unflushed(self) -> list[tuple[MappedFile, int, int]]:
        """Every file with written bytes that are not durable yet: (file, write position, store
        timestamp of its newest record), as :meth:`flush` with ``least_pages`` 0 takes them."""
        return [
            (mf, mf.wrote_position, mf.last_store_timestamp)
            for mf in self.files
            if mf.max_offset > self.flushed_where and mf.flushed_position < mf.wrote_position
        ]

    def _flushed(self, todo: list[tuple[MappedFile, int, int]]) -> None:
        self.sync_failures = 0
        for mf, wrote, ts in todo:
            mf.flushed_position = max(mf.flushed_position, wrote)
            self.flushed_where = max(self.flushed_where, mf.file_from_offset + wrote)
            if ts:
                self.store_timestamp = max(self.store_timestamp, ts)

    def _sync_failed(self, todo: list[tuple[MappedFile, int, int]]) -> None:
        """A sync of ``todo`` failed: its unflushed pages are dirtied again, so that the next
        sync writes them rather than succeeding over pages the kernel gave up on (see
        :meth:`MappedFile.redirty`).  Up to each file's write position now, not the one the
        sync began at: ``fdatasync`` writes back every dirty page of the file, so the pages
        the loop wrote while it ran were cleaned by its failure too, and the next sync covers
        them."""
        pages = 0
        for mf, wrote, _ in todo:
            pages += mf.redirty(mf.flushed_position, max(wrote, mf.wrote_position))
        self.sync_failures += 1
        if self.sync_failures == 1 or self.sync_failures % 60 == 0:  # a failing disk: not a flood
            log.warning(
                "sync of %s failed (%d in a row): %d unflushed pages marked for writing again; "
                "nothing written since offset %d is acknowledged until a sync succeeds",
                self.directory,
                self.sync_failures,
                pages,
                self.flushed_where,
            )

    def begin_flush(self, syncer: Syncer) -> FlushJob | None:
        """:meth:`flush` (``least_pages`` 0) started at once, without a checkpoint: the group
        commit's sync.  Awaiting ``flush`` yields twice before its worker thread starts (the lock,
        then ``to_thread``'s limiter), and each yield waits for every runnable connection to
        serve its run: 1.3 ms at the median under a SYNC_FLUSH benchmark, longer than the
        ``fdatasync`` itself.  Here the sync is handed to ``syncer``'s thread before this
        returns (:class:`NativeSyncThread`, or :class:`SyncThread`).

        Returns None when it cannot start now (the lock is held by another flush or a deletion,
        or a new file's directory entry must be synced first): the caller awaits :meth:`flush`.
        The lock is held until the thread ends, and released by the callback that reports it."""
        if self._directory_dirty:
            return None
        try:
            self.io_lock.acquire_nowait()
        except trio.WouldBlock:
            return None
        try:
            return FlushJob(self, self._unflushed(), syncer)
        except BaseException:
            self.io_lock.release()
            raise

    # --- truncation and deletion ---------------------------------------------------------------

    def truncate_dirty_files(self, offset: int) -> None:
        """Blocking (recovery only): drop every byte at or after global ``offset``.

        The file holding ``offset`` keeps its head and has its tail zeroed; later files go.
        It is now the last file, the one written to: its blocks up to ``offset`` and the next
        chunk are allocated (it is sparse if Java or an older pymq wrote it; see MappedFile).
        """
        keep: list[MappedFile] = []
        for mf in self.files:
            tail = mf.file_from_offset + self.file_size
            if tail <= offset:
                keep.append(mf)
            elif mf.file_from_offset <= offset:
                pos = offset - mf.file_from_offset
                mf.truncate_from(pos)
                mf.wrote_position = mf.flushed_position = pos
                if self.advise_writes:
                    # Recovery read the data with readahead: the large folios it cached past
                    # the data end would be written whole at every sync (see MappedFile).
                    mf.drop_cached_tail(pos)
                    mf.advise_writes()
                mf.ensure_allocated(pos)
                keep.append(mf)
            else:
                mf.destroy()
        self.files = keep
        self.flushed_where = min(self.flushed_where, offset) if self.flushed_where else offset

    def destroy_all(self) -> None:
        """Blocking: delete every file (e.g. consume queues of a deleted topic)."""
        for mf in self.files:
            mf.destroy()
        self.files = []
        self.flushed_where = 0

    async def delete_files(self, doomed: list[MappedFile], interval_ms: int = 0) -> int:
        """Remove ``doomed`` (a prefix of the run) from the queue and delete them in a thread."""
        if not doomed:
            return 0
        async with self.io_lock:
            ids = {id(mf) for mf in doomed}
            self.files = [mf for mf in self.files if id(mf) not in ids]
            for i, mf in enumerate(doomed):
                await trio.to_thread.run_sync(mf.destroy)
                if interval_ms and i + 1 < len(doomed):
                    await trio.sleep(interval_ms / 1000)
        return len(doomed)

    def expired_by_time(
        self, expired_ms: int, now_ms: int, clean_immediately: bool, mtime: Callable[[str], float]
    ) -> list[MappedFile]:
        """Files (never the last) whose last modification is ``expired_ms`` old, oldest first.

        Stops at the first file that is not yet expired, as RocketMQ does, and returns at most
        :data:`DELETE_FILES_BATCH_MAX`.
        """
        out: list[MappedFile] = []
        for mf in self.files[:-1]:
            try:
                modified_ms = int(mtime(mf.path) * 1000)
            except FileNotFoundError:
                modified_ms = 0
            if now_ms >= modified_ms + expired_ms or clean_immediately:
                out.append(mf)
                if len(out) >= DELETE_FILES_BATCH_MAX:
                    break
            else:
                break
        return out


def _sync_all(files: list[MappedFile]) -> None:
    for mf in files:
        mf.sync()


class Syncer(Protocol):
    """What a :class:`FlushJob` hands its files to: :class:`SyncThread` or
    :class:`NativeSyncThread`."""

    def sync_files(
        self, files: list[MappedFile], done: Callable[[BaseException | None], None]
    ) -> None:
        """Make ``files`` durable away from the event loop, then call ``done(error)`` on it."""


class FlushJob:
    """One sync started by :meth:`MappedFileQueue.begin_flush`, with the queue's ``io_lock``
    held.  Its syncer reports back on the loop; the report advances the queue's flushed
    positions (only on success), releases the lock and wakes :meth:`wait`.  A job outlives a
    cancelled waiter: the lock is released when the sync ends, whoever waits."""

    def __init__(
        self,
        queue: MappedFileQueue,
        todo: list[tuple[MappedFile, int, int]],
        syncer: Syncer,
    ) -> None:
        self._queue = queue
        self._todo = todo
        self._done = trio.Event()
        self._error: BaseException | None = None
        self.target = queue.max_offset
        if not todo:
            self._complete(None)
            return
        syncer.sync_files([mf for mf, _, _ in todo], self._complete)

    def _complete(self, error: BaseException | None) -> None:
        # The lock is released and the waiter woken whatever happens here (a defect raising
        # is also the waiter's error): NativeSyncThread logs a report that raises and goes on,
        # and a lock left held would stall the group commit and the final flush for good.
        try:
            if error is None:
                self._queue._flushed(self._todo)
            elif isinstance(error, OSError):
                self._queue._sync_failed(self._todo)
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._error = error
            self._queue.io_lock.release()
            self._done.set()

    async def wait(self) -> bool:
        """Wait for the sync; True when everything written before it began is durable.  Raises
        what the sync raised (``OSError``: nothing was advanced)."""
        await self._done.wait()
        if self._error is not None:
            raise self._error
        return self._queue.flushed_where >= self.target


class SyncThread:
    """A thread of its own for one service's syncs, fed through a ``SimpleQueue``.

    Trio's thread cache would serve, but a worker joins the idle list only once it gets the GIL
    back after its job, and a busy loop usually asks for the next one before that: a new thread
    was started for most group commits, each start costing more than the sync's hand-over."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def run(self, work: Callable[[], None]) -> None:
        """Call ``work()`` in the thread, after the work handed over before it."""
        self._jobs.put(work)

    def sync_files(
        self, files: list[MappedFile], done: Callable[[BaseException | None], None]
    ) -> None:
        """:meth:`Syncer.sync_files`: ``MappedFile.sync`` of each, in the thread; ``done`` is
        called through the Trio token (not at all once the run is over)."""
        token = trio.lowlevel.current_trio_token()

        def work() -> None:  # in the thread
            error: BaseException | None = None
            try:
                _sync_all(files)
            except BaseException as exc:  # reported to the loop, never raised in the thread
                error = exc
            # A run that is over has nobody left waiting for the lock.
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(done, error)

        self.run(work)

    def stop(self) -> None:
        """The thread ends after the work handed over so far (not waited for)."""
        self._jobs.put(None)

    def _serve(self) -> None:
        while (work := self._jobs.get()) is not None:
            try:
                work()
            except Exception:  # work reports its own errors; this is a defect in it
                log.exception("a sync thread's work raised")


class NativeSyncThread:
    """:class:`SyncThread`'s file syncs in a C thread that never takes the GIL
    (``_recordc.sync_worker_*``): ``fdatasync`` of each file's descriptor, the end reported
    through an eventfd that a Trio system task waits on.  A Python thread needed the GIL to
    start each sync and again to report it; on a busy loop each took 0.6-0.9 ms on average,
    about as long as the ``fdatasync`` itself.  The system task outlives the service that
    stops the thread, so a sync in flight at shutdown still releases its queue's lock.  One job
    at a time (the queue's ``io_lock`` makes it so).  Needs the C extension
    (:data:`NATIVE_SYNC`); ``MappedFile.sync`` is not called on this path."""

    def __init__(self, name: str) -> None:
        assert _native is not None
        self._worker: Any = _native.sync_worker_new()
        self._fd: int = _native.sync_worker_fileno(self._worker)
        self._waiting: collections.deque[Callable[[BaseException | None], None]] = (
            collections.deque()
        )
        self._stopped = False
        trio.lowlevel.spawn_system_task(self._reap, name=name)

    def sync_files(
        self, files: list[MappedFile], done: Callable[[BaseException | None], None]
    ) -> None:
        """:meth:`Syncer.sync_files`.  The thread syncs duplicates of the descriptors made
        here, so a file closed meanwhile (at a shutdown past its deadline) is still the one
        synced, never a file that took its number; a closed file's descriptor (-1) fails the
        job (EBADF)."""
        assert _native is not None
        _native.sync_worker_submit(self._worker, [mf.fileno() for mf in files])
        self._waiting.append(done)

    def stop(self) -> None:
        """The thread ends after the sync in flight (not waited for); its report is still
        delivered."""
        assert _native is not None
        self._stopped = True
        if self._worker is not None:  # None once the reaper has ended (the run is over)
            _native.sync_worker_stop(self._worker)

    async def _reap(self) -> None:
        assert _native is not None
        try:
            while self._waiting or not self._stopped:
                await trio.lowlevel.wait_readable(self._fd)
                rc = _native.sync_worker_collect(self._worker)
                if rc is None:
                    continue  # woken by stop()
                done = self._waiting.popleft()
                error = None if rc == 0 else OSError(rc, f"fdatasync: {os.strerror(rc)}")
                try:
                    done(error)
                except Exception:
                    log.exception("a sync's report raised")
        finally:
            # The capsule's destructor stops the thread; the last of the two frees the state.
            self._worker = None


_native: Any = getattr(native_extension, "sync_worker_new", None) and native_extension
NATIVE_SYNC = _native is not None
"""Whether services sync through :class:`NativeSyncThread` (the C extension has it); tests that
stand in for ``MappedFile.sync`` turn it off."""


def sync_thread(name: str) -> SyncThread | NativeSyncThread:
    """The syncer for a service's own thread: :class:`NativeSyncThread` when
    :data:`NATIVE_SYNC`, else :class:`SyncThread`.  Call it in the Trio run."""
    return NativeSyncThread(name) if NATIVE_SYNC else SyncThread(name)
