"""DLedger 0.2.6's file store (``DLedgerMmapFileStore``), byte for byte.

Layout under ``<storeBaseDir>/dledger-<selfId>/`` (:class:`pymq.dledger.config.DLedgerConfig`):

- ``data/`` (or ``storePathDLedgerCommitLog``): files of ``mappedFileSizeForEntryData`` bytes
  (1 GiB; a broker uses ``mappedFileSizeCommitLog``), each named by the absolute offset of its
  first byte in 20 digits, as the commit log's.  Entries follow each other; each is::

      magic    int   1 (MAGIC_1)            pos      long  absolute offset of the entry
      size     int   48 + body length       channel  int   0 (reserved)
      index    long  0, 1, 2, ...           chainCrc int   0 (0.2.6 never computes it)
      term     long  the leader's term      bodyCrc  int   0 (0.2.6 never computes it)
                                            bodyLen  int   then the body

  big-endian, a 44-byte header (:data:`HEADER_SIZE`) and the body length: the body starts at
  :data:`BODY_OFFSET` = 48.  An entry never spans two files: when it does not fit with 8 bytes
  to spare, the rest of the file is a blank (magic -1, then the blank's length) and the entry
  goes to the next file.
- ``index/``: files of ``mappedFileSizeForEntryIndex`` bytes (32 x 5 Mi), one 32-byte entry per
  log index at ``index * 32``: magic int, pos long, size int, index long, term long.
- ``checkpoint``: Java properties ``endIndex=`` and ``committedIndex=`` (written every
  ``checkPointInterval`` ms and at shutdown; only ``committedIndex`` is read back).
- ``currterm``: Java properties ``currTerm=`` and ``voteLeader=`` (empty: no vote), written at
  each term or vote change (:func:`persist_term`).

Both properties files are replaced as DLedger's ``IOUtils.string2File`` does: the new text to
``<name>.tmp``, the old to ``<name>.bak``, then the tmp renamed over the file (pymq also fsyncs
the tmp before the rename).

Recovery (:meth:`DLedgerFileStore.open`) follows 0.2.6's: from the third-last data file whose
first entry agrees with its index entry, entries are read while each is whole and consistent
(magic, ``pos`` equal to its offset, size = 48 + body length, index one more than the last,
term not smaller); index entries that disagree are rewritten from the data; the first entry
that is not whole or consistent ends the log, and the data and index after it are cut off
(and zeroed, so that stale entries past the end can never be read back as new ones).  As in
Java, recovery refuses to drop more than a whole data file (a damaged store is for an
operator to look at).  0.2.6 writes 0 for both CRCs and never checks them, so a body torn
behind a whole header is not detected, by Java nor by pymq.

Limits: an entry's encoded size is at most :data:`MAX_ENTRY_SIZE` (4 MiB: the buffer 0.2.6
encodes an entry in) and must fit in a data file with 8 bytes to spare.  Every member of a
group must use the same data file size: positions are replicated and checked.

The store is synchronous file I/O (``pread``/``pwrite``); callers on the Trio loop keep
appends small or run them in a worker thread.  Role and term checks belong to the caller
(:mod:`pymq.dledger.raft`); this module checks the log's own consistency.
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
import threading
from collections.abc import Callable, Iterator

import attrs

from pymq.common.properties import parse_properties
from pymq.dledger.config import INDEX_UNIT_SIZE, DLedgerConfig
from pymq.dledger.errors import DLedgerError, ResponseCode

MAGIC_1 = 1
CURRENT_MAGIC = MAGIC_1
BLANK_MAGIC_CODE = -1
MIN_BLANK_LEN = 8
POS_OFFSET = 4 + 4 + 8 + 8
HEADER_SIZE = POS_OFFSET + 8 + 4 + 4 + 4
BODY_OFFSET = HEADER_SIZE + 4
MAX_ENTRY_SIZE = 4 * 1024 * 1024
RECENT_BYTES = 16 * 1024 * 1024
RECENT_ENTRIES = 65536
"""Bounds of the newest entries a store keeps in memory besides its files (bodies' bytes,
entries): the entries the leader pushes and acknowledges, read without a pread."""

CHECK_POINT_FILE = "checkpoint"
END_INDEX_KEY = "endIndex"
COMMITTED_INDEX_KEY = "committedIndex"
TERM_PERSIST_FILE = "currterm"
TERM_PERSIST_KEY_TERM = "currTerm"
TERM_PERSIST_KEY_VOTE_FOR = "voteLeader"

_ENTRY_HEADER = struct.Struct(">iiqqqiiii")
_INDEX_ENTRY = struct.Struct(">iqiqq")
_FILE_NAME = re.compile(r"[0-9]{20}")
_READ_WINDOW = 1024 * 1024

assert _ENTRY_HEADER.size == BODY_OFFSET and _INDEX_ENTRY.size == INDEX_UNIT_SIZE


@attrs.frozen
class DLedgerEntry:
    """One log entry (``DLedgerEntry``); ``size`` is the encoded size, 48 + body length."""

    index: int
    term: int
    body: bytes
    pos: int = -1
    magic: int = CURRENT_MAGIC
    channel: int = 0
    chain_crc: int = 0
    body_crc: int = 0

    @property
    def size(self) -> int:
        return BODY_OFFSET + len(self.body)

    def encode(self) -> bytes:
        header = _ENTRY_HEADER.pack(
            self.magic,
            self.size,
            self.index,
            self.term,
            self.pos,
            self.channel,
            self.chain_crc,
            self.body_crc,
            len(self.body),
        )
        return header + self.body

    @classmethod
    def decode(cls, data: bytes) -> DLedgerEntry:
        """The entry at the start of ``data``; DLedgerError(DISK_ERROR) when ``data`` does not
        hold a whole entry whose size agrees with its body length."""
        if len(data) < BODY_OFFSET:
            raise DLedgerError(ResponseCode.DISK_ERROR, f"{len(data)} bytes: not an entry")
        magic, size, index, term, pos, channel, chain, body_crc, body_len = (
            _ENTRY_HEADER.unpack_from(data)
        )
        if body_len < 0 or size != BODY_OFFSET + body_len or len(data) < size:
            raise DLedgerError(
                ResponseCode.DISK_ERROR,
                f"entry size {size}, body {body_len}, {len(data)} bytes at hand",
            )
        body = bytes(data[BODY_OFFSET:size])
        return cls(index, term, body, pos, magic, channel, chain, body_crc)

    def same_as(self, other: DLedgerEntry | None) -> bool:
        """DLedgerEntry.equals: size, magic, index, term, channel, pos and body (not the
        CRCs)."""
        return (
            other is not None
            and (self.size, self.magic, self.index, self.term, self.channel, self.pos)
            == (other.size, other.magic, other.index, other.term, other.channel, other.pos)
            and self.body == other.body
        )


def encode_index(pos: int, size: int, magic: int, index: int, term: int) -> bytes:
    return _INDEX_ENTRY.pack(magic, pos, size, index, term)


def decode_index(data: bytes) -> tuple[int, int, int, int, int]:
    """(magic, pos, size, index, term) of a 32-byte index entry."""
    magic, pos, size, index, term = _INDEX_ENTRY.unpack_from(data)
    return magic, pos, size, index, term


def file_name(offset: int) -> str:
    """A store file's name: its first byte's absolute offset in 20 digits."""
    return f"{offset:020d}"


def rocketmq_wrote_offset(entry_pos: int) -> int:
    """The commit-log offset RocketMQ 4.9.4 gives the message stored in the entry at
    ``entry_pos`` (``DLedgerCommitLog``: ``pos + BODY_OFFSET``): the message record is the
    entry's body, and its PHYSICALOFFSET field (record offset 28) holds this value, written
    by the leader's append hook before the entry is stored.  Consume queues point there."""
    return entry_pos + BODY_OFFSET


# ---------------------------------------------------------------------------------------------
# properties files (checkpoint, currterm)


def _write_properties_file(path: str, values: dict[str, str]) -> None:
    """DLedger's ``IOUtils.string2File``: text to ``.tmp``, the old text to ``.bak``, then the
    tmp renamed over ``path``; the tmp is fsynced first."""
    text = "".join(f"{key}={value}\n" for key, value in values.items())
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    try:
        with open(path, "rb") as old:
            previous = old.read()
    except FileNotFoundError:
        previous = None
    if previous is not None:
        with open(path + ".bak", "wb") as bak:
            bak.write(previous)
    os.replace(tmp, path)


def _read_properties_file(path: str) -> dict[str, str] | None:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    try:
        return parse_properties(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return None


def _java_long(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    if not re.fullmatch(r"[+-]?[0-9]{1,19}", text):
        return None
    value = int(text)
    return value if -(2**63) <= value < 2**63 else None


def load_term(directory: str) -> tuple[int, str | None]:
    """(currTerm, voteLeader or None) from ``<directory>/currterm``; (0, None) when there is
    none, as MemberState starts.  DLedgerError(DISK_ERROR) when the file holds a term that is
    not a number: guessing a term could let this node vote twice in one term."""
    props = _read_properties_file(os.path.join(directory, TERM_PERSIST_FILE))
    if props is None:
        return 0, None
    term = 0
    if TERM_PERSIST_KEY_TERM in props:
        parsed = _java_long(props[TERM_PERSIST_KEY_TERM])
        if parsed is None or parsed < 0:
            raise DLedgerError(
                ResponseCode.DISK_ERROR,
                f"{TERM_PERSIST_FILE}: currTerm={props[TERM_PERSIST_KEY_TERM]!r} is not a term",
            )
        term = parsed
    vote = props.get(TERM_PERSIST_KEY_VOTE_FOR) or None
    return term, vote


def persist_term(directory: str, term: int, vote_for: str | None) -> None:
    """Write ``<directory>/currterm`` as MemberState.persistTerm (the key order is the one a
    Java Properties of these two keys prints)."""
    _write_properties_file(
        os.path.join(directory, TERM_PERSIST_FILE),
        {TERM_PERSIST_KEY_VOTE_FOR: vote_for or "", TERM_PERSIST_KEY_TERM: str(term)},
    )


# ---------------------------------------------------------------------------------------------
# a list of fixed-size files (MmapFileList)


class _File:
    """One data or index file, its descriptor reference-counted as DLedger's MmapFile (a
    ReferenceResource) is: the list holds one reference; a reader (:meth:`hold`, then
    :meth:`release`) another, so that a file expired or cut off while it reads (:meth:`shutdown`)
    stays readable until the last holder lets go, and its descriptor is closed then.  A file
    that is shut down takes no new holder.  Thread-safe (flushes run in worker threads)."""

    __slots__ = ("_lock", "available", "dirty", "fd", "offset", "path", "refs", "wrote")

    def __init__(self, offset: int, path: str, fd: int, wrote: int) -> None:
        self.offset = offset
        self.path = path
        self.fd = fd
        self.wrote = wrote
        self.dirty = False
        self.refs = 1  # the list's own
        self.available = True
        self._lock = threading.Lock()

    def hold(self) -> bool:
        """Take a reference (False, none taken, once the file is shut down)."""
        with self._lock:
            if not self.available:
                return False
            self.refs += 1
            return True

    def release(self) -> None:
        """Let a reference go; the last one closes the descriptor."""
        with self._lock:
            self.refs -= 1
            if self.refs > 0:
                return
            fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def shutdown(self) -> None:
        """The list lets the file go (expired, cut off, closed): no new holders, and the
        descriptor is closed now, or by the last holder's release.  Idempotent."""
        with self._lock:
            if not self.available:
                return
            self.available = False
        self.release()

    def read_at(self, position: int, size: int) -> bytes:
        """``size`` bytes at ``position`` in this file (the caller holds it)."""
        return os.pread(self.fd, size, position)


class _FileList:
    """Files of ``file_size`` bytes named by offset (DLedger's MmapFileList), read and written
    with pread/pwrite.  Each file is created at its full size (sparse), as Java maps it."""

    def __init__(self, directory: str, file_size: int) -> None:
        self.directory = directory
        self.file_size = file_size
        self.files: list[_File] = []

    def load(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        names = sorted(n for n in os.listdir(self.directory) if _FILE_NAME.fullmatch(n))
        for name in names:
            path = os.path.join(self.directory, name)
            size = os.path.getsize(path)
            if size != self.file_size:
                raise DLedgerError(
                    ResponseCode.DISK_ERROR,
                    f"{path} has {size} bytes where the configured file size is "
                    f"{self.file_size}: files cannot change size (as DLedger)",
                )
            fd = os.open(path, os.O_RDWR)
            self.files.append(_File(int(name), path, fd, self.file_size))
        for previous, current in zip(self.files, self.files[1:], strict=False):
            if current.offset - previous.offset != self.file_size:
                raise DLedgerError(
                    ResponseCode.DISK_ERROR,
                    f"{self.directory}: {file_name(previous.offset)} is followed by "
                    f"{file_name(current.offset)}: files missing",
                )
        if self.files and self.files[0].offset % self.file_size:
            raise DLedgerError(
                ResponseCode.DISK_ERROR,
                f"{self.files[0].path}: offset not a multiple of the file size",
            )

    def close(self) -> None:
        for f in self.files:
            f.shutdown()
        self.files.clear()

    @property
    def max_wrote_position(self) -> int:
        if not self.files:
            return 0
        return self.files[-1].offset + self.files[-1].wrote

    @property
    def min_offset(self) -> int:
        return self.files[0].offset if self.files else 0

    def _create(self, offset: int, wrote: int = 0) -> _File:
        path = os.path.join(self.directory, file_name(offset))
        os.makedirs(self.directory, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.ftruncate(fd, self.file_size)
        created = _File(offset, path, fd, wrote)
        self.files.append(created)
        return created

    def _writable(self, start_offset: int) -> _File:
        last = self.files[-1] if self.files else None
        if last is None:
            return self._create(start_offset - start_offset % self.file_size)
        if last.wrote >= self.file_size:
            return self._create(last.offset + self.file_size)
        return last

    def pre_append(self, length: int, use_blank: bool, start_offset: int = 0) -> int:
        """Where ``length`` bytes will go, writing the blank that ends a file that cannot take
        them with ``MIN_BLANK_LEN`` to spare (``use_blank``) and starting the next file."""
        f = self._writable(start_offset)
        blank = MIN_BLANK_LEN if use_blank else 0
        if length + blank > self.file_size - f.wrote:
            if not use_blank:
                raise DLedgerError(ResponseCode.DISK_ERROR, f"{length} bytes do not fit")
            rest = self.file_size - f.wrote
            try:
                if os.pwrite(f.fd, struct.pack(">ii", BLANK_MAGIC_CODE, rest), f.wrote) != 8:
                    raise OSError(28, "the disk took part of the blank")
            except OSError as exc:
                self.truncate(f.offset + f.wrote)
                raise DLedgerError(ResponseCode.DISK_ERROR, f"write failed: {exc}") from None
            f.wrote = self.file_size
            f.dirty = True
            f = self._writable(start_offset)
            if length + blank > self.file_size - f.wrote:
                raise DLedgerError(
                    ResponseCode.DISK_ERROR,
                    f"an entry of {length} bytes does not fit in a file of {self.file_size}",
                )
        return f.offset + f.wrote

    def append(self, data: bytes | memoryview, use_blank: bool, start_offset: int = 0) -> int:
        """Write ``data`` where :meth:`pre_append` says.  A write the disk refuses, or takes
        only in part (a full disk), leaves the file as it was (what it took is zeroed) and
        raises DISK_ERROR: the next append goes where this one would have."""
        position = self.pre_append(len(data), use_blank, start_offset)
        f = self.files[-1]
        try:
            wrote = os.pwrite(f.fd, data, f.wrote)
        except OSError as exc:
            self.truncate(position)
            raise DLedgerError(ResponseCode.DISK_ERROR, f"write failed: {exc}") from None
        if wrote != len(data):
            self.truncate(position)
            raise DLedgerError(
                ResponseCode.DISK_ERROR, f"the disk took {wrote} of {len(data)} bytes"
            )
        f.wrote += len(data)
        f.dirty = True
        return position

    def find(self, offset: int) -> _File | None:
        if not self.files or offset < self.files[0].offset:
            return None
        i = (offset - self.files[0].offset) // self.file_size
        return self.files[i] if i < len(self.files) else None

    def hold(self, offset: int) -> _File | None:
        """The file holding ``offset``, held (the caller releases it), or None."""
        f = self.find(offset)
        if f is None or not f.hold():
            return None
        return f

    def read(self, offset: int, size: int) -> bytes | None:
        """``size`` bytes at ``offset`` within one file and below its written position (the
        file held while it is read: one expired meanwhile is closed after the read)."""
        f = self.hold(offset)
        if f is None:
            return None
        try:
            rel = offset - f.offset
            if rel + size > f.wrote:
                return None
            return f.read_at(rel, size)
        finally:
            f.release()

    def read_raw(self, offset: int, size: int) -> bytes:
        """Up to ``size`` bytes at ``offset`` within its file whatever was written (recovery)."""
        f = self.find(offset)
        if f is None:
            return b""
        rel = offset - f.offset
        return os.pread(f.fd, min(size, self.file_size - rel), rel)

    def truncate(self, offset: int) -> None:
        """Keep the bytes before ``offset``: later files are deleted, the file holding
        ``offset`` ends there and its bytes after it are zeroed (sparse), and when no file
        holds it the list restarts with one that does."""
        keep = [f for f in self.files if f.offset <= offset]
        drop = [f for f in self.files if f.offset > offset]
        if keep and keep[-1].offset + self.file_size < offset:
            drop, keep = self.files, []  # past the end with a gap: start again there
        self.files = keep  # (a flush in a worker thread sees the new list first)
        for f in drop:
            f.shutdown()
            os.unlink(f.path)
        if keep and offset < keep[-1].offset + self.file_size:
            last = keep[-1]
            rel = offset - last.offset
            os.ftruncate(last.fd, rel)
            os.ftruncate(last.fd, self.file_size)
            last.wrote = rel
            last.dirty = True
        if self.max_wrote_position != offset:
            for f in self.files:
                f.shutdown()
                os.unlink(f.path)
            self.files = []
            base = offset - offset % self.file_size
            created = self._create(base, offset - base)
            created.dirty = True

    def drop_first(self, count: int) -> list[_File]:
        """Take the first ``count`` files out of the list (never the last): the caller closes
        and unlinks them (:func:`delete_files`), off the event loop."""
        count = min(count, len(self.files) - 1)
        if count <= 0:
            return []
        dropped, self.files = self.files[:count], self.files[count:]
        return dropped

    def flush(self) -> None:
        """fsync the files written since the last flush.  May run in a worker thread while
        the owner appends: a file is marked clean before its fsync (a write meanwhile marks
        it again), and held while it is synced; one shut down meanwhile (expired, cut off by
        a truncation) is skipped."""
        for f in list(self.files):
            if f.dirty and f.hold():
                f.dirty = False
                try:
                    os.fsync(f.fd)
                except OSError:
                    if f in self.files:
                        f.dirty = True
                        raise
                finally:
                    f.release()

    def windows(self, offset: int) -> Iterator[tuple[int, bytes]]:
        """(absolute offset, bytes) windows of the raw files from ``offset`` on."""
        position = offset
        while True:
            chunk = self.read_raw(position, _READ_WINDOW)
            if not chunk:
                return
            yield position, chunk
            position += len(chunk)


def delete_files(files: list[_File]) -> None:
    """Shut down and unlink files :meth:`_FileList.drop_first` took out (blocking: a worker
    thread's).  A reader holding one reads on from its descriptor, which its release closes
    (the disk space comes back then); a flush in another thread skips them."""
    for f in files:
        f.shutdown()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f.path)


# ---------------------------------------------------------------------------------------------
# the store


class DLedgerFileStore:
    """The log of one member: ``open()`` loads and recovers it; appends as leader or as
    follower, reads by index, truncates, keeps the committed index and the checkpoint.

    ``first_data_offset``: where the first data file starts when there is none (RocketMQ
    starts a DLedger log after an existing commit log: its ``dividedCommitlogOffset``)."""

    def __init__(self, config: DLedgerConfig, *, first_data_offset: int = 0) -> None:
        self.config = config
        self.data = _FileList(config.data_path, config.mapped_file_size_for_entry_data)
        self.index = _FileList(config.index_path, config.mapped_file_size_for_entry_index)
        self.first_data_offset = first_data_offset
        self.ledger_begin_index = -1
        self.ledger_end_index = -1
        self.ledger_end_term = -1
        self.committed_index = -1
        self.committed_pos = -1
        # The entries this store wrote last (a leader pushes each to every follower and
        # acknowledges it, a follower compares against it: reads of the newest entries), by
        # index, at most RECENT_BYTES of bodies; dropped past a truncation.
        self._recent: dict[int, DLedgerEntry] = {}
        self._recent_bytes = 0

    # -- open / close -------------------------------------------------------------------------

    def open(self) -> None:
        self.data.load()
        self.index.load()
        self._recover()

    def close(self) -> None:
        self.flush()
        self.persist_checkpoint()
        self.data.close()
        self.index.close()

    def flush(self) -> None:
        self.data.flush()
        self.index.flush()

    def dirty(self) -> bool:
        """Whether a file was written since its last fsync (a flush would do something)."""
        return any(f.dirty for f in self.data.files) or any(f.dirty for f in self.index.files)

    def _index_entry_agrees(self, pos: int, size: int, magic: int, index: int, term: int) -> bool:
        raw = self.index.read_raw(index * INDEX_UNIT_SIZE, INDEX_UNIT_SIZE)
        if len(raw) < INDEX_UNIT_SIZE:
            return False
        return decode_index(raw) == (magic, pos, size, index, term)

    def _first_entry_agrees(self, start: int) -> bool:
        raw = self.data.read_raw(start, BODY_OFFSET)
        if len(raw) < BODY_OFFSET:
            return False
        magic, size, index, term, pos, _, _, _, body_len = _ENTRY_HEADER.unpack(raw)
        return (
            magic == CURRENT_MAGIC
            and size > HEADER_SIZE
            and pos == start
            and body_len + BODY_OFFSET == size
            and self._index_entry_agrees(pos, size, magic, index, term)
        )

    def _headers(self, offset: int) -> Iterator[tuple[int, tuple[int, ...] | None]]:
        """(offset, header fields) of the entries from ``offset`` on, and (end of the file,
        None) for a blank, after which it goes on in the next file; stops where no whole
        header can be read."""
        window_start, window = offset, b""
        while (f := self.data.find(offset)) is not None:
            if offset + BODY_OFFSET > window_start + len(window):
                window_start, window = offset, self.data.read_raw(offset, _READ_WINDOW)
            at = offset - window_start
            if len(window) - at < 4:
                return
            if struct.unpack_from(">i", window, at)[0] == BLANK_MAGIC_CODE:
                offset = f.offset + self.data.file_size
                yield offset, None
                continue
            if len(window) - at < BODY_OFFSET:
                return
            header = _ENTRY_HEADER.unpack_from(window, at)
            yield offset, header
            offset += max(header[1], BODY_OFFSET)

    def _recover(self) -> None:
        files = self.data.files
        if not files:
            self.index.truncate(0)
            return
        start = max(0, len(files) - 3)
        for i in range(start, -1, -1):
            start = i
            if self._first_entry_agrees(files[i].offset):
                break
        process_offset = files[start].offset
        last_index = last_term = -1
        need_write_index = False
        for offset, header in self._headers(process_offset):
            if header is None:  # a blank: the file is whole up to its end
                process_offset = offset
                continue
            magic, size, index, term, pos, _, _, _, body_len = header
            rel = offset - self.data.min_offset
            consistent = (
                pos == offset
                and body_len >= 0
                and body_len + BODY_OFFSET == size
                and magic == CURRENT_MAGIC
                and (last_index == -1 or index == last_index + 1)
                and index >= 0
                and term >= last_term
                and size > HEADER_SIZE
                and rel % self.data.file_size + size <= self.data.file_size
            )
            if not consistent:
                break
            if not need_write_index and not self._index_entry_agrees(pos, size, magic, index, term):
                self.index.truncate(index * INDEX_UNIT_SIZE)
                need_write_index = True
            if need_write_index:
                self.index.append(
                    encode_index(pos, size, magic, index, term),
                    use_blank=False,
                    start_offset=index * INDEX_UNIT_SIZE,
                )
            last_index, last_term = index, term
            process_offset = offset + size
        last_file = files[-1]
        if last_file.offset - process_offset > self.data.file_size:
            raise DLedgerError(
                ResponseCode.DISK_ERROR,
                f"recovery would drop the data from {process_offset} on, more than a file "
                f"(the last starts at {last_file.offset}): check the store by hand",
            )
        self.data.truncate(process_offset)
        self.index.truncate((last_index + 1) * INDEX_UNIT_SIZE)
        self.ledger_end_index = last_index
        self.ledger_end_term = last_term
        if last_index != -1:
            self._revise_begin_index()
        props = _read_properties_file(os.path.join(self.config.default_path, CHECK_POINT_FILE))
        committed = _java_long(props.get(COMMITTED_INDEX_KEY)) if props else None
        if committed is not None:
            self.update_committed_index(committed)

    def _revise_begin_index(self) -> None:
        first = self.data.files[0]
        raw = os.pread(first.fd, BODY_OFFSET, 0)
        self.ledger_begin_index = _ENTRY_HEADER.unpack(raw)[2]

    # -- appends -------------------------------------------------------------------------------

    def _check_size(self, body: bytes) -> None:
        if BODY_OFFSET + len(body) > MAX_ENTRY_SIZE:
            raise DLedgerError(
                ResponseCode.UNEXPECTED_ARGUMENT,
                f"an entry of {BODY_OFFSET + len(body)} bytes exceeds {MAX_ENTRY_SIZE}",
            )

    def next_pos(self, size: int) -> int:
        """Where the next entry of ``size`` bytes goes (a full file is closed with its blank)."""
        return self.data.pre_append(size, True, self.first_data_offset)

    def leader_room(self) -> tuple[int, int]:
        """Where the leader's next entry goes and how many bytes of entries the data file it
        goes to can still take (with ``MIN_BLANK_LEN`` to spare), the first data file made if
        there is none.  Entries encoded within that room go in with one write
        (:meth:`append_encoded_as_leader`); an entry that does not fit is
        :meth:`next_pos`'s (the file closed with its blank)."""
        f = self.data._writable(self.first_data_offset)
        return f.offset + f.wrote, self.data.file_size - f.wrote - MIN_BLANK_LEN

    def append_encoded_as_leader(
        self, data: bytes | memoryview, entries: list[DLedgerEntry]
    ) -> None:
        """Append ``entries`` as the leader, their bytes (headers and bodies, in order)
        encoded by the caller as ``data`` (pymq.store.dledger_commitlog: the one record
        encoder writes their headers): the next indexes, in one term not below the last, the
        first at :meth:`leader_room`'s position and all within its room, each at most
        :data:`MAX_ENTRY_SIZE`.  One write for the data, one for the index entries; nothing
        is written when a check fails (DLedgerError)."""
        first = entries[0]
        pos, room = self.leader_room()
        expected = first.index
        for entry in entries:
            if entry.index != expected or entry.term != first.term or entry.pos != pos:
                raise DLedgerError(
                    ResponseCode.UNEXPECTED_ARGUMENT,
                    f"entry {entry.index}@{entry.pos} in term {entry.term} where "
                    f"{expected}@{pos} in term {first.term} is next",
                )
            self._check_size(entry.body)
            expected += 1
            pos += entry.size
        if first.index != self.ledger_end_index + 1 or first.term < self.ledger_end_term:
            raise DLedgerError(
                ResponseCode.INCONSISTENT_STATE,
                f"entry {first.index} in term {first.term} after {self.ledger_end_index} in "
                f"term {self.ledger_end_term}",
            )
        if len(data) != pos - first.pos or len(data) > room:
            raise DLedgerError(
                ResponseCode.UNEXPECTED_ARGUMENT,
                f"{len(data)} bytes for entries of {pos - first.pos}, room for {room}",
            )
        self._write_run(entries, data)

    def append_as_leader(self, body: bytes, term: int) -> DLedgerEntry:
        """Append ``body`` as the next entry in ``term``; the caller checked it leads in it."""
        self._check_size(body)
        if term < self.ledger_end_term:
            raise DLedgerError(
                ResponseCode.INCONSISTENT_TERM, f"term {term} < last {self.ledger_end_term}"
            )
        pos = self.next_pos(BODY_OFFSET + len(body))
        entry = DLedgerEntry(self.ledger_end_index + 1, term, body, pos)
        self._write(entry)
        return entry

    def append_as_follower(self, entry: DLedgerEntry) -> DLedgerEntry:
        """Append the leader's ``entry`` as is: its index must be the next one, its position
        where it goes here, its term not below the last.  Nothing is written otherwise."""
        self._check_size(entry.body)
        if entry.index != self.ledger_end_index + 1:
            raise DLedgerError(
                ResponseCode.INCONSISTENT_INDEX,
                f"index {entry.index} where {self.ledger_end_index + 1} is next",
            )
        if entry.term < self.ledger_end_term or entry.magic != CURRENT_MAGIC:
            raise DLedgerError(
                ResponseCode.INCONSISTENT_STATE,
                f"entry {entry.index}: term {entry.term} magic {entry.magic}",
            )
        pos = self.next_pos(entry.size)
        if pos != entry.pos:
            raise DLedgerError(
                ResponseCode.DISK_ERROR,
                f"entry {entry.index} is at {entry.pos} on the leader but would go to {pos} "
                "here: do the members use the same data file size?",
            )
        self._write(entry)
        return entry

    def append_run_as_follower(self, entries: list[DLedgerEntry]) -> None:
        """:meth:`append_as_follower` of each of ``entries`` in order (a batch push), each run
        of them that goes into one data file written with one write (and its index entries
        with one more): the checks are the same, and an entry that fails one ends the call
        with its error, the entries before it appended."""
        i = 0
        while i < len(entries):
            first = entries[i]
            self.append_as_follower(first)  # checked and written alone; its file is open
            f = self.data.files[-1]
            room = self.data.file_size - f.wrote - MIN_BLANK_LEN
            run: list[DLedgerEntry] = []
            last, pos = first, first.pos + first.size
            for entry in entries[i + 1 :]:
                if (
                    entry.index != last.index + 1
                    or entry.term < last.term
                    or entry.magic != CURRENT_MAGIC
                    or entry.pos != pos
                    or entry.size > room
                    or entry.size > MAX_ENTRY_SIZE
                ):
                    break  # left to append_as_follower: its error, or the next file
                run.append(entry)
                room -= entry.size
                pos += entry.size
                last = entry
            if run:
                self._write_run(run)
            i += 1 + len(run)

    def _write_run(
        self,
        run: list[DLedgerEntry],
        data: bytes | memoryview | None = None,
        use_blank: bool = False,
    ) -> None:
        """Write entries that follow each other in the last data file (checked by the
        caller; ``data``: their encoding, when the caller has it; ``use_blank``: a full data
        file may be closed with its blank first, for one entry placed by :meth:`next_pos`):
        one pwrite for their data, one for their index entries when they fit in the index
        file (else one each)."""
        if data is None:
            data = b"".join([e.encode() for e in run])
        data_pos = self.data.append(data, use_blank, self.first_data_offset)
        assert data_pos == run[0].pos
        index_data = b"".join([encode_index(e.pos, e.size, e.magic, e.index, e.term) for e in run])
        start = run[0].index * INDEX_UNIT_SIZE
        try:
            if start // self.index.file_size == (start + len(index_data) - 1) // (
                self.index.file_size
            ):
                index_pos = self.index.append(index_data, use_blank=False, start_offset=start)
            else:
                index_pos = start
                for e in run:
                    self.index.append(
                        encode_index(e.pos, e.size, e.magic, e.index, e.term),
                        use_blank=False,
                        start_offset=e.index * INDEX_UNIT_SIZE,
                    )
            if index_pos != start:
                raise DLedgerError(
                    ResponseCode.DISK_ERROR, f"index entry of {run[0].index} went to {index_pos}"
                )
        except BaseException:
            self._undo_append(data_pos, start)
            raise
        self.ledger_end_index = run[-1].index
        self.ledger_end_term = run[-1].term
        if self.ledger_begin_index == -1:
            self.ledger_begin_index = run[0].index
        recent = self._recent
        for entry in run:
            recent[entry.index] = entry
            self._recent_bytes += len(entry.body)
        while self._recent_bytes > RECENT_BYTES or len(recent) > RECENT_ENTRIES:
            self._recent_bytes -= len(recent.pop(next(iter(recent))).body)

    def _undo_append(self, data_pos: int, index_start: int) -> None:
        """An append whose index write failed: its data (and any index entries it wrote) go,
        so the log ends where it did and the entry can be appended again (the entries are
        numbered by the index; data left behind would hold the number twice, and recovery
        would cut the log there, acknowledged entries after it with it)."""
        self.data.truncate(data_pos)
        self.index.truncate(index_start)

    def _write(self, entry: DLedgerEntry) -> None:
        self._write_run([entry], entry.encode(), use_blank=True)

    # -- reads ---------------------------------------------------------------------------------

    def _index_check(self, index: int) -> None:
        if index < 0 or index > self.ledger_end_index:
            raise DLedgerError(
                ResponseCode.INDEX_OUT_OF_RANGE,
                f"{index} not in {self.ledger_begin_index}..{self.ledger_end_index}",
            )
        if index < self.ledger_begin_index:
            raise DLedgerError(
                ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN,
                f"{index} < begin index {self.ledger_begin_index}",
            )

    def pos_and_size(self, index: int) -> tuple[int, int]:
        self._index_check(index)
        cached = self._recent.get(index)
        if cached is not None:
            return cached.pos, cached.size
        raw = self.index.read(index * INDEX_UNIT_SIZE, INDEX_UNIT_SIZE)
        if raw is None:
            raise DLedgerError(ResponseCode.DISK_ERROR, f"no index entry for {index}")
        _, pos, size, _, _ = decode_index(raw)
        return pos, size

    def get(self, index: int) -> DLedgerEntry:
        cached = self._recent.get(index)
        if cached is not None and self.ledger_begin_index <= index <= self.ledger_end_index:
            return cached
        pos, size = self.pos_and_size(index)
        raw = self.data.read(pos, size)
        if raw is None:
            raise DLedgerError(ResponseCode.DISK_ERROR, f"no data for {index} at {pos}")
        entry = DLedgerEntry.decode(raw)
        if entry.pos != pos or entry.index != index:
            raise DLedgerError(
                ResponseCode.DISK_ERROR, f"entry at {pos} is {entry.index}@{entry.pos}"
            )
        return entry

    def term_at(self, index: int) -> int:
        """The term of the entry at ``index`` (its index entry), -1 for index -1."""
        if index == -1:
            return -1
        self._index_check(index)
        cached = self._recent.get(index)
        if cached is not None:
            return cached.term
        raw = self.index.read(index * INDEX_UNIT_SIZE, INDEX_UNIT_SIZE)
        if raw is None:
            raise DLedgerError(ResponseCode.DISK_ERROR, f"no index entry for {index}")
        return decode_index(raw)[4]

    # -- truncation ----------------------------------------------------------------------------

    def truncate_after(self, index: int) -> None:
        """Drop every entry after ``index`` (-1: all of them), data and index; a committed
        index past it is refused (committed entries are never dropped)."""
        if index > self.ledger_end_index:
            raise DLedgerError(
                ResponseCode.INDEX_OUT_OF_RANGE, f"{index} > end {self.ledger_end_index}"
            )
        if index < self.committed_index:
            raise DLedgerError(
                ResponseCode.INCONSISTENT_STATE,
                f"truncating after {index} would drop committed {self.committed_index}",
            )
        if index == self.ledger_end_index:
            return
        for dropped in [i for i in self._recent if i > index]:
            self._recent_bytes -= len(self._recent.pop(dropped).body)
        if index < self.ledger_begin_index:
            position = self.get(self.ledger_begin_index).pos if self.data.files else 0
            new_term = -1
        else:
            pos, size = self.pos_and_size(index)
            position = pos + size
            new_term = self.term_at(index)
        self.data.truncate(position)
        self.index.truncate((index + 1) * INDEX_UNIT_SIZE)
        self.ledger_end_index = index
        self.ledger_end_term = new_term
        if index < self.ledger_begin_index:
            self.ledger_begin_index = -1

    def truncate(self, entry: DLedgerEntry) -> int:
        """0.2.6's follower ``truncate(entry)``: the log ends with the leader's ``entry``; the
        entries after it are dropped, and when the local entry at its index differs (or is
        missing) it is replaced by ``entry``; a log that ends before ``entry`` (the leader's
        first, its older files expired) starts over with it.  Returns ``entry.index``."""
        try:
            local: DLedgerEntry | None = self.get(entry.index)
        except DLedgerError:
            local = None
        if entry.same_as(local):
            self.truncate_after(entry.index)
            return entry.index
        if entry.index - 1 > self.ledger_end_index:
            # the leader's log begins past this one's end (its older files expired): start
            # over at its first entry, as 0.2.6 rebuilds the file lists at its position
            if not self.data.files or entry.pos < self.data.max_wrote_position:
                raise DLedgerError(
                    ResponseCode.INCONSISTENT_INDEX,
                    f"truncate to {entry.index} at {entry.pos} but the log ends at "
                    f"{self.ledger_end_index} ({self.data.max_wrote_position})",
                )
            self._recent.clear()
            self._recent_bytes = 0
            self.data.truncate(entry.pos)
            self.index.truncate(entry.index * INDEX_UNIT_SIZE)
            self.ledger_begin_index = -1
            self.ledger_end_index, self.ledger_end_term = entry.index - 1, -1
            self.append_as_follower(entry)
            return entry.index
        if entry.index - 1 < self.committed_index:
            raise DLedgerError(
                ResponseCode.INCONSISTENT_STATE,
                f"entry {entry.index} differs but {self.committed_index} is committed",
            )
        self.truncate_after(entry.index - 1)
        self.append_as_follower(entry)
        return entry.index

    # -- expiry (0.2.6's CleanSpaceService) -----------------------------------------------------

    def expired_files(
        self,
        expired_ms: int,
        now_ms: int,
        at_once: bool,
        below: int,
        mtime: Callable[[str], float] = os.path.getmtime,
        limit: int = 10,
    ) -> int:
        """How many data files, from the first, may go (0.2.6's ``deleteExpiredFileByTime``):
        each last modified ``expired_ms`` before ``now_ms`` (any age when ``at_once``), never
        the last file, and (pymq's bound, which 0.2.6 lacks) each wholly below ``below`` (the
        caller's: the committed position and what the broker has dispatched); it stops at the
        first that may not go, and at ``limit``."""
        count = 0
        for f in self.data.files[:-1]:
            if count >= limit or f.offset + self.data.file_size >= below:
                break  # (strictly below: the file after it then starts with a kept entry)
            try:
                modified_ms = int(mtime(f.path) * 1000)
            except FileNotFoundError:
                modified_ms = 0
            if not at_once and now_ms < modified_ms + expired_ms:
                break
            count += 1
        return count

    def drop_first_files(self, count: int) -> list[_File]:
        """Take the first ``count`` data files out of the log (never the last) and move the
        begin index to the first entry left (0.2.6's ``reviseLedgerBeginIndex``); the index
        files stay (their entries below the begin index are never read).  The files are for
        :func:`delete_files`."""
        dropped = self.data.drop_first(count)
        if dropped:
            self._revise_begin_index()
            for gone in [i for i in self._recent if i < self.ledger_begin_index]:
                self._recent_bytes -= len(self._recent.pop(gone).body)
        return dropped

    # -- commit and checkpoint -----------------------------------------------------------------

    def update_committed_index(self, new_committed: int) -> None:
        """0.2.6's rules: -1, an empty log and the same value are ignored, as is a value below
        the committed or the begin index; one past the log's end is cut to the end."""
        if new_committed == -1 or self.ledger_end_index == -1:
            return
        if new_committed == self.committed_index:
            return
        if new_committed < self.committed_index or new_committed < self.ledger_begin_index:
            return
        new_committed = min(new_committed, self.ledger_end_index)
        pos, size = self.pos_and_size(new_committed)
        self.committed_index = new_committed
        self.committed_pos = pos + size

    def distrust_committed_from(self, index: int) -> None:
        """The committed index lowered below ``index`` when it is at or past it: the local
        entry at ``index`` was found to differ from the leader's (a body torn in a crash,
        which recovery cannot see without CRCs), so it and what follows are not committed
        here; the leader's TRUNCATE then replaces them."""
        if index > self.committed_index:
            return
        below = index - 1
        if below < max(self.ledger_begin_index, 0):
            self.committed_index = self.committed_pos = -1
            return
        pos, size = self.pos_and_size(below)
        self.committed_index, self.committed_pos = below, pos + size

    def persist_checkpoint(self) -> None:
        _write_properties_file(
            os.path.join(self.config.default_path, CHECK_POINT_FILE),
            {  # the order Java's Properties prints these two keys in
                COMMITTED_INDEX_KEY: str(self.committed_index),
                END_INDEX_KEY: str(self.ledger_end_index),
            },
        )

    def entries(self, begin: int = 0) -> Iterator[DLedgerEntry]:
        for i in range(max(begin, self.ledger_begin_index), self.ledger_end_index + 1):
            yield self.get(i)
