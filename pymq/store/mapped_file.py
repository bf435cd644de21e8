"""``MappedFile``: one fixed-size store file, memory-mapped, with its write and flush positions.

Ownership: a ``MappedFile`` owns its file descriptor and its ``mmap``; :meth:`destroy` releases both
and unlinks the file.  Appends and reads are plain memory copies and run on the event loop; the
blocking calls (:meth:`create`, :meth:`sync`, :meth:`destroy`, :meth:`truncate_from`) are meant
for ``trio.to_thread.run_sync`` and never touch the positions, which the loop alone updates
(:meth:`ensure_allocated` runs during load and recovery, before the loop writes).

Durability: the mapping is ``MAP_SHARED``, so on Linux ``fdatasync`` on the descriptor writes the
pages dirtied through the mapping; we use it rather than ``mmap.flush`` because CPython's
``msync`` call holds the GIL, which would stall the loop from the worker thread.  File sizes never
change after creation, so ``fdatasync`` (no metadata) is enough.

Space: a page is never written through a mapping before its disk blocks exist.  A sparse mapping
would take its blocks at the first write of each page, and on a full disk the kernel answers such
a write with SIGBUS, which kills the process.  So every file knows how far its blocks are
allocated (:attr:`MappedFile.allocated`: every block below it exists), and a writer that is about
to write past that point first calls :meth:`MappedFile.allocate_to`, which allocates the next
:attr:`MappedFile.chunk` bytes (``posix_fallocate``; microseconds on ext4) on the loop.  On a full
disk that call raises ``OSError`` (ENOSPC) and the caller refuses the write with nothing changed,
exactly as when a file cannot be created.  Disk use thus grows with the data, as Java's sparse
files do, instead of taking each file's full size at creation.  A new file gets its first chunk
when it is created (so a creation on a full disk fails as before); a file found on load has
``allocated`` 0 (nothing known), and recovery allocates the last one up to its data end plus a
chunk (:meth:`MappedFile.ensure_allocated`).  With warmMapedFileEnable the commit log also
allocates one chunk ahead of its writer (:meth:`MappedFile.allocate_ahead`), whose pages a
worker thread faults in (:meth:`MappedFile.populate`), so its files go at most two chunks past
their data.  Where the filesystem cannot ``fallocate`` (EOPNOTSUPP), the holes are filled by
writing zeros, with a warning: slower, but just as safe.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import threading
from typing import Any

import trio

from pymq.common.files import drop_cached_from, folio_floor
from pymq.common.native import load_native

native_extension: Any = load_native("pymq.store._commitlogc")

log = logging.getLogger(__name__)

OS_PAGE_SIZE = 4096
"""Flush thresholds ("least pages") are counted in OS pages, as RocketMQ does."""

_ZERO_CHUNK = 8 * 1024 * 1024
"""Dirty-tail zeroing stops at the first all-zero chunk; 8 MiB is more than any record (4 MiB)."""

_ZERO_BLOCK = bytes(64 * 1024)


_PAGE = mmap.PAGESIZE

POPULATE_STEP = 1024 * 1024
"""Bytes faulted in per call by :meth:`MappedFile.populate`: a close waits for one call at most
(a fraction of a millisecond)."""

_MADV_RANDOM: int | None = getattr(mmap, "MADV_RANDOM", None)
_MADV_NORMAL: int | None = getattr(mmap, "MADV_NORMAL", None)

_populate_write: Any = getattr(native_extension, "populate_write", None)
"""``_recordc.populate_write`` (MADV_POPULATE_WRITE with the GIL released); None without the
extension, or once the kernel has refused it (Linux before 5.14)."""


def _all_zero(data: bytes) -> bool:
    """memcmp against a zero block (``strip`` walks byte by byte: 20x slower)."""
    step = len(_ZERO_BLOCK)
    for i in range(0, len(data), step):
        part = data[i : i + step]
        if part != _ZERO_BLOCK[: len(part)]:
            return False
    return True


FILE_NAME_DIGITS = 20
"""Store files are named by their first offset, zero-padded to 20 digits."""


CREATING_SUFFIX = ".creating"
"""Suffix of a file being created (hidden, renamed into place when sized)."""


ALLOCATE_CHUNK = 4 * 1024 * 1024
"""Blocks are allocated ahead of the write position in chunks of this many bytes (never past the
end of the file): one ``posix_fallocate`` per 4 MiB written, and a file takes at most one chunk
more than its data on disk.  The default chunk of commit-log and index files."""

CQ_ALLOCATE_CHUNK = 64 * 1024
"""The chunk of consume-queue files: a broker has one per queue (thousands), each written 20
bytes a message, so 64 KiB (3,276 entries) keeps an idle queue small and costs one
``posix_fallocate`` per 3,276 messages of the queue."""


_FALLOCATE_UNSUPPORTED = frozenset({errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})
_fallback_warned = False


def allocate_blocks(fd: int, size: int, start: int = 0) -> None:
    """Blocking: make the disk blocks of bytes ``start`` to ``size`` of ``fd`` exist, keeping data.

    ``posix_fallocate`` where the filesystem has it; otherwise zeros are written into the holes
    only (found with SEEK_HOLE), so the data of an existing file is never touched.  Raises
    ``OSError`` (ENOSPC on a full disk); blocks already allocated by a failed call stay with
    the file (they are allocated again, at no cost, by the next try).
    """
    global _fallback_warned
    if size <= start:
        return
    try:
        os.posix_fallocate(fd, start, size - start)
        return
    except OSError as exc:
        if exc.errno not in _FALLOCATE_UNSUPPORTED:
            raise
        if not _fallback_warned:
            _fallback_warned = True
            log.warning(
                "the filesystem cannot fallocate (%s): store files are allocated by writing "
                "zeros instead, which is slower",
                os.strerror(exc.errno or 0),
            )
    _fill_holes(fd, size, start)


def _fill_holes(fd: int, size: int, start: int = 0) -> None:
    """Write zeros into every hole between ``start`` and ``size`` (data is left as it is)."""
    pos = start
    while pos < size:
        try:
            hole = os.lseek(fd, pos, os.SEEK_HOLE)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no hole at or after pos
                raise
            hole = size
        hole = min(hole, size)
        if hole >= size:
            break
        try:
            data = os.lseek(fd, hole, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: nothing but a hole from here on
                raise
            data = size
        end = min(data, size)
        p = hole
        while p < end:
            n = min(len(_ZERO_BLOCK), end - p)
            written = os.pwrite(fd, _ZERO_BLOCK[:n], p)
            if written <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            p += written
        pos = end


def sync_directory(directory: str) -> None:
    """Blocking: make renames and deletions in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _log_failure(result: Any) -> None:
    """A background populate's outcome: nothing to deliver, but a bug is logged."""
    error = getattr(result, "error", None)
    if error is not None:
        log.error("prefaulting a store file failed", exc_info=error)


def offset_to_file_name(offset: int) -> str:
    return f"{offset:0{FILE_NAME_DIGITS}d}"


class MappedFile:
    """One store file of ``file_size`` bytes whose name is its first global offset."""

    __slots__ = (
        "_fd",
        "_populate_lock",
        "advise",
        "allocated",
        "chunk",
        "file_from_offset",
        "file_size",
        "flushed_position",
        "last_store_timestamp",
        "mm",
        "path",
        "wrote_position",
    )

    def __init__(
        self, path: str, file_size: int, allocated: int = 0, chunk: int | None = None
    ) -> None:
        """Open (creating and sizing if needed) and map ``path``; blocking.

        Blocks are allocated ``chunk`` bytes at a time (default :data:`ALLOCATE_CHUNK`).  A
        file created here gets its first chunk; for an existing one the caller says how far
        its blocks are known to be allocated (``allocated``, 0: nothing known).
        Raises ``OSError`` when the file cannot be created or mapped, and ``ValueError`` when an
        existing file has another size (a store written with another file size).
        """
        self.path = path
        self.file_size = file_size
        self.file_from_offset = int(os.path.basename(path))
        self.chunk = max(OS_PAGE_SIZE, chunk or ALLOCATE_CHUNK)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                os.ftruncate(fd, file_size)
                allocated = min(file_size, self.chunk)
                try:
                    allocate_blocks(fd, allocated)
                except BaseException:
                    os.ftruncate(fd, 0)  # back to empty: loading removes an empty last file
                    raise
            elif size != file_size:
                raise ValueError(f"{path} is {size} bytes, expected {file_size}")
            self.mm = mmap.mmap(fd, file_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._populate_lock = threading.Lock()
        self.allocated = min(allocated, file_size)
        """Every disk block below this file position exists: writes below it cannot fault."""
        self.advise = False  # advise_writes
        self.wrote_position = 0
        self.flushed_position = 0
        # Store timestamp of the newest record appended (for the checkpoint after a flush).
        self.last_store_timestamp = 0

    @classmethod
    def create(
        cls,
        path: str,
        file_size: int,
        *,
        sync_dir: bool = True,
        chunk: int | None = None,
        allocate: int | None = None,
    ) -> MappedFile:
        """Blocking: create ``path`` (and its directory) at its full size, atomically, and map it.

        The first ``allocate`` bytes (default: one ``chunk``, default :data:`ALLOCATE_CHUNK`;
        at most the file) get their blocks at once, so a full
        disk fails the creation (``OSError``, nothing left behind); the rest is allocated in
        chunks as it is written (:meth:`allocate_to`).  An existing file is only mapped.

        The file is sized under a hidden temporary name and renamed into place (then the
        directory is synced, unless ``sync_dir`` is False and the caller syncs it before it
        relies on the file), so a crash can never leave a store file of the wrong size behind:
        such a file would stop the next start.
        """
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        chunk = chunk or ALLOCATE_CHUNK
        allocate = min(file_size, allocate or chunk)
        allocated = 0
        if not os.path.exists(path):
            # A private temporary name, and link() rather than rename(): two creators racing
            # for the same file (the allocator thread and the loop) both end up on one inode,
            # and neither can replace a file the other already writes into.
            unique = f"{os.getpid()}-{threading.get_ident()}"
            tmp = os.path.join(directory, f".{os.path.basename(path)}.{unique}{CREATING_SUFFIX}")
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.ftruncate(fd, file_size)
                allocate_blocks(fd, allocate)
            except BaseException:
                # No half-made file stays behind (loading would remove it, but a full disk
                # needs the space back now).
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            os.close(fd)
            try:
                os.link(tmp, path)
                allocated = allocate
            except FileExistsError:
                pass  # another creator's file: how far it is allocated is not known here
            finally:
                os.unlink(tmp)
            if sync_dir:
                sync_directory(directory)
        return cls(path, file_size, allocated, chunk)

    def __repr__(self) -> str:
        return (
            f"MappedFile({os.path.basename(self.path)}, wrote={self.wrote_position}, "
            f"flushed={self.flushed_position})"
        )

    # --- positions -----------------------------------------------------------------------------

    @property
    def remaining(self) -> int:
        return self.file_size - self.wrote_position

    @property
    def is_full(self) -> bool:
        return self.wrote_position >= self.file_size

    @property
    def max_offset(self) -> int:
        """Global offset just past the last written byte."""
        return self.file_from_offset + self.wrote_position

    def is_able_to_flush(self, least_pages: int) -> bool:
        """Whether enough is unflushed: ``least_pages`` whole pages, or anything when 0 or full."""
        if self.flushed_position >= self.wrote_position:
            return False
        if self.is_full:
            return True
        if least_pages > 0:
            new_pages = self.wrote_position // OS_PAGE_SIZE - self.flushed_position // OS_PAGE_SIZE
            return new_pages >= least_pages
        return True

    # --- data ----------------------------------------------------------------------------------

    def allocate_to(self, end: int) -> None:
        """Make the blocks below file position ``end`` exist before anything is written there:
        the chunks from :attr:`allocated` up to ``end`` rounded up to :attr:`chunk`
        (at most the file) are allocated, synchronously (microseconds for a chunk on ext4).

        Raises ``OSError`` (ENOSPC on a full disk) with :attr:`allocated` unchanged: the writer
        refuses its write and changes nothing.  Writers call it only when ``end`` is above
        :attr:`allocated`, which is one integer comparison on their path.
        """
        start = self.allocated
        if end <= start:
            return
        chunk = self.chunk
        target = min(self.file_size, -(-end // chunk) * chunk)
        allocate_blocks(self._fd, target, start)
        self.allocated = target
        # From the write position at the lowest: after a recovery that could not allocate (a
        # full disk) ``allocated`` is 0 and the data below the write position is only read.
        self._advise_written(max(start, self.wrote_position), target)

    def allocate_ahead(self) -> bool:
        """Allocate the chunk after :attr:`allocated` before any write needs it, and fault its
        pages in from a worker thread (:meth:`populate`): the commit log calls this once its
        writer has entered its last allocated chunk, so the writes on the event loop find their
        pages mapped (a fault there zeroes the page: a third of a 1 KiB put's time).  The
        populated pages are dirty, so a flush writes them to disk as zeros before their data
        (warmMapedFileEnable's price).  The file's blocks then go at most two chunks past its
        data.  Never raises: False when the
        blocks cannot be had (a full disk), and the write that needs them allocates them itself
        and is refused as before."""
        start = self.allocated
        if start >= self.file_size or self._fd < 0:
            return False
        end = min(self.file_size, start + self.chunk)
        try:
            allocate_blocks(self._fd, end, start)
        except OSError:
            return False
        self.allocated = end
        self._advise_written(start, end)
        if _populate_write is not None:
            trio.lowlevel.start_thread_soon(lambda: self.populate(start, end), _log_failure)
        return True

    def append(self, data: bytes | memoryview) -> bool:
        """Copy ``data`` at the write position; False (nothing written) if it does not fit.

        Raises ``OSError`` (nothing written) when the blocks for it cannot be allocated."""
        pos = self.wrote_position
        end = pos + len(data)
        if end > self.file_size:
            return False
        if end > self.allocated:
            self.allocate_to(end)
        self.mm[pos:end] = data
        self.wrote_position = end
        return True

    def read(self, pos: int, size: int) -> bytes | None:
        """A copy of ``size`` bytes at file position ``pos``, or None if not all written yet."""
        if pos < 0 or size < 0 or pos + size > self.wrote_position:
            return None
        return self.mm[pos : pos + size]

    def read_from(self, pos: int) -> bytes | None:
        """A copy of everything written from ``pos`` on, or None if ``pos`` is out of range."""
        if pos < 0 or pos > self.wrote_position:
            return None
        return self.mm[pos : self.wrote_position]

    def release_resident(self, upto: int) -> None:
        """Drop this map's resident pages below ``upto`` (rounded down to a page) from the
        process: MADV_DONTNEED on a shared file mapping unmaps them, the page cache keeps them
        (dirty ones too), and a later access maps them in again."""
        end = (min(upto, self.file_size) // _PAGE) * _PAGE
        if end <= 0 or self._fd < 0:
            return
        with contextlib.suppress(ValueError, OSError):  # closed meanwhile
            self.mm.madvise(mmap.MADV_DONTNEED, 0, end)
            if self.advise and _MADV_NORMAL is not None:  # written: read ahead again
                self.mm.madvise(_MADV_NORMAL, 0, end)

    def advise_writes(self) -> None:
        """For a file synced often (the commit log under SYNC_FLUSH): from now on the pages
        allocated for writing, from the write position on, are advised MADV_RANDOM, so that a
        write fault there brings in one page, not a readahead window of them as one large
        folio.  A sync writes whole folios: once the group commit's ``fdatasync`` had cleaned
        the large folio at the write position, the next put dirtied all of it again, and each
        sync wrote ~1.8 MB for ~110 KB of records (Linux 6.18, ext4: 19.6 KB of disk writes per
        1 KiB message, 3-4 ms syncs; 1.3 KB and 1.2 ms with the advice).  Under ASYNC_FLUSH
        only where the device reads ahead far (``commitLogWriteAdvice``, MessageStore): with
        512 KiB of readahead or less a page per fault costs more than reading ahead.
        :meth:`release_resident` gives the pages it is done with their readahead back
        (MADV_NORMAL), for readers of old data.  Advice only: nothing changes where the kernel
        lacks it."""
        self.advise = True
        self._advise_written(self.wrote_position, self.allocated)

    def end_write_advice(self) -> None:
        """The file is full (the queue writes the next one), or, under ASYNC_FLUSH, the commit
        log's writes no longer call for the advice (CommitLog._weigh_advice): all of it is
        read ahead again (MADV_NORMAL), for readers of its data, whether or not
        :meth:`release_resident` ever runs (``resident_trim_interval`` 0)."""
        if not self.advise:
            return
        self.advise = False
        if _MADV_NORMAL is None or self._fd < 0:
            return
        with contextlib.suppress(ValueError, OSError):  # closed meanwhile
            self.mm.madvise(_MADV_NORMAL, 0, self.file_size)

    def drop_cached_tail(self, pos: int) -> None:
        """Blocking (recovery, for a file about to be written under :meth:`advise_writes`):
        evict the clean page cache of the file from ``pos`` on (from the largest folio's
        boundary below it: :func:`~pymq.common.files.drop_cached_from`).  Recovery's scan reads
        the data through the map with readahead, and the readahead (and :meth:`truncate_from`'s
        ``pread``) bring the pages past the data end into the page cache as large folios (up to
        18 MiB of them with an 8 MiB ``read_ahead_kb``); MADV_RANDOM does not split cached
        folios, so the first writes after a cold start would dirty them whole again at every
        sync.  Dirty pages are never dropped (``POSIX_FADV_DONTNEED`` leaves them); a page
        dropped is read again when needed.  Advice only: nothing changes where the kernel or
        filesystem (tmpfs) keeps the pages."""
        if self._fd < 0:
            return
        start = folio_floor(pos)  # where drop_cached_from starts
        if start >= self.file_size:
            return
        with contextlib.suppress(ValueError, OSError):
            # Our own mapping's pages first: a mapped page is not evicted.
            self.mm.madvise(mmap.MADV_DONTNEED, start, self.file_size - start)
        drop_cached_from(self._fd, start, self.file_size)

    def _advise_written(self, start: int, end: int) -> None:
        """MADV_RANDOM over the pages of ``[start, end)``, about to be written, if
        :meth:`advise_writes` was called."""
        if not self.advise or _MADV_RANDOM is None or self._fd < 0:
            return
        first = (start // _PAGE) * _PAGE
        end = min(end, self.file_size)
        if end <= first:
            return
        with contextlib.suppress(ValueError, OSError):  # closed meanwhile
            self.mm.madvise(_MADV_RANDOM, first, end - first)

    # --- blocking calls (run in a worker thread) -----------------------------------------------

    def ensure_allocated(self, end: int, *, strict: bool = False) -> None:
        """Blocking (load and recovery): make every block below ``end`` (rounded up to a
        chunk, at most the file) exist, wherever :attr:`allocated` stands.  A file written by an
        older version or by Java is sparse: its holes below the data end are filled and the
        next chunk is allocated, never the whole file (blocks that exist cost nothing).

        On a full disk this logs a warning and leaves :attr:`allocated` as it was (the store
        starts; its writes allocate, and are refused until space is back), or raises the
        ``OSError`` when ``strict``."""
        if self._fd < 0:
            return
        chunk = self.chunk
        target = min(self.file_size, -(-max(end, 0) // chunk) * chunk)
        if target <= self.allocated:
            return
        try:
            allocate_blocks(self._fd, target)  # from 0: blocks that exist cost nothing
        except OSError as exc:
            if strict:
                raise
            log.warning(
                "cannot allocate the blocks of %s now (%s); writes will, and are refused "
                "while they cannot",
                self.path,
                exc,
            )
            return
        log.debug("store file %s is allocated up to %d", self.path, target)
        self.allocated = target
        self._advise_written(max(0, end), target)  # the data below end is read, not written

    def populate(self, start: int, end: int) -> None:
        """Blocking (a worker thread): fault in the pages of ``[start, end)``, whose blocks are
        allocated, as writes would, changing no byte (MADV_POPULATE_WRITE, GIL released), a
        :data:`POPULATE_STEP` at a time under the lock :meth:`close` takes.  Does nothing
        without the C extension or on a kernel without MADV_POPULATE_WRITE."""
        for pos in range(start, end, POPULATE_STEP):
            with self._populate_lock:
                if self._fd < 0:
                    return
                rc = self._populate_locked(pos, min(POPULATE_STEP, end - pos))
            if rc:
                return  # -1: not here; ENOMEM, EFAULT, ...: the writes fault the pages in

    def _populate_locked(self, pos: int, length: int) -> int:
        """MADV_POPULATE_WRITE over ``[pos, pos + length)`` of the open map, the caller holding
        the lock :meth:`close` takes: 0, madvise's errno, or -1 where it is not available (no
        C extension; a kernel without it, which turns it off for every file)."""
        global _populate_write
        populate = _populate_write
        if populate is None:
            return -1
        rc: int = populate(self.mm, pos, length)
        if rc in (errno.EINVAL, errno.ENOSYS):  # no MADV_POPULATE_WRITE in this kernel
            _populate_write = None
            log.info("this kernel cannot prefault store files: %s", os.strerror(rc))
            return -1
        return rc

    def sync(self) -> None:
        """Blocking: make everything written through the mapping durable."""
        os.fdatasync(self._fd)

    def redirty(self, start: int, end: int) -> int:
        """Mark the pages of ``[start, end)`` dirty again, changing no byte; returns how many.

        After a failed sync: Linux reports a writeback error once and leaves the pages it could
        not write clean, so the next sync would succeed without writing them, and what waited
        on it would be acknowledged as durable.  A write fault on each page dirties it again,
        so the next sync writes it or fails in turn.

        Only below :attr:`allocated`: everything written through the mapping lies there, and a
        write fault on a hole would allocate its block (SIGBUS on a full disk).  The faults are
        made by MADV_POPULATE_WRITE (:meth:`_populate_locked`, GIL released), which changes no
        byte, so a writer on the loop is safe meanwhile, and answers an error where a page
        cannot be read back instead of raising SIGBUS; without it (no C extension, Linux before
        5.14), by writing each page's first byte back, which only the writer itself may do (on
        the loop).  A :data:`POPULATE_STEP` at a time under the lock :meth:`close` takes, so a
        worker thread may call it on a file the loop closes meanwhile.
        """
        end = min(end, self.allocated, self.file_size)
        first = start - start % _PAGE
        count = 0
        failed = 0
        for step in range(first, end, POPULATE_STEP):
            step_end = min(end, step + POPULATE_STEP)
            with self._populate_lock:
                if self._fd < 0:
                    return count
                rc = self._populate_locked(step, step_end - step)
                if rc == -1:
                    mm = self.mm
                    for pos in range(step, step_end, _PAGE):
                        mm[pos] = mm[pos]
                elif rc:
                    failed = rc
            count += -(-(step_end - step) // _PAGE)
        if failed:
            log.error(
                "%s: could not mark every page of %d..%d for writing again (%s); data written "
                "there may not reach the disk",
                self.path,
                start,
                end,
                os.strerror(failed),
            )
        return count

    def write_at(self, pos: int, data: memoryview) -> bool:
        """Write ``data`` at ``pos`` with ``pwrite``, not through the map (whose pages show
        it at once: the page cache is the same), within the allocated blocks, for the writer on
        the loop; it does not move :attr:`wrote_position`.  False, logged, when the write
        failed or fell short (an I/O error): the caller commits nothing, and what was written
        lies past the write position, to be written over."""
        if pos + len(data) > self.allocated or self._fd < 0:
            return False
        try:
            written = os.pwrite(self._fd, data, pos)
        except OSError as exc:
            log.error("writing %d bytes at %d of %s failed: %s", len(data), pos, self.path, exc)
            return False
        if written != len(data):
            log.error("writing %d bytes at %d of %s wrote %d", len(data), pos, self.path, written)
            return False
        return True

    def fileno(self) -> int:
        """The file's descriptor (-1 once closed), for a sync made elsewhere
        (:class:`~pymq.store.mapped_file_queue.NativeSyncThread`)."""
        return self._fd

    def truncate_from(self, pos: int) -> None:
        """Blocking: zero the dirty tail from ``pos``, so no stale record can come back later.

        Files are written front to back, so the dirty bytes are one run from ``pos``; zeroing stops
        at the first all-zero chunk, which keeps the untouched (sparse) rest of the file sparse.
        """
        p = pos
        while p < self.file_size:
            end = min(p + _ZERO_CHUNK, self.file_size)
            # pread, not a slice of the map: reading holes through the map faults in every page
            if _all_zero(os.pread(self._fd, end - p, p)):
                break
            allocate_blocks(self._fd, end, p)  # holes among the dirty bytes: no SIGBUS
            self.mm[p:end] = bytes(end - p)
            p = end
        if p > pos:
            os.fdatasync(self._fd)

    def close(self) -> None:
        """Unmap and close; the file stays on disk.  Idempotent."""
        with self._populate_lock:  # not while a worker faults pages in (see populate)
            if self._fd < 0:
                return
            try:
                self.mm.close()
            except BufferError:
                # A view of the map is still alive somewhere; the mapping goes when it does.
                log.warning("%s still has live views; unmapping it later", self.path)
            finally:
                os.close(self._fd)
                self._fd = -1

    def destroy(self) -> None:
        """Blocking: unmap, close and delete the file."""
        self.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        log.info("deleted store file %s", self.path)
