"""``IndexService``: the run of index files, keyed by ``topic#key`` for KEYS and UNIQ_KEY.

Ownership: the service owns its ``IndexFile`` objects.  ``build_index`` runs on the loop from the
reput service (or in the recovery thread); when the newest file is full a new one is needed: the
reput task calls :meth:`prepare` (creation in a worker thread) before dispatching, and
``build_index`` creates one inline only as a fallback.  Full files are queued for a sync, after
which the checkpoint's indexMsgTimestamp may advance (:meth:`flush`).
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Callable

import trio

from pymq.common.message_ext import KEY_SEPARATOR, MessageSysFlag, java_string_hash
from pymq.store.index_file import IndexFile

log = logging.getLogger(__name__)

_PREFIX_CACHE_MAX = 100_000
"""Hashes of "topic#" are cached per topic; dropped if a client invents topics forever."""
_ROLLBACK = MessageSysFlag.TRANSACTION_ROLLBACK_TYPE  # the transaction bits of a rolled-back record
MAX_TRY_IDX_CREATE = 3
"""A put that finds the newest file full retries on a fresh file this many times (as Java)."""


def index_file_name(now_ms: int) -> str:
    """``yyyyMMddHHmmssSSS`` in local time, as Java's ``UtilAll.timeMillisToHumanString``."""
    t = datetime.datetime.fromtimestamp(now_ms / 1000)
    return t.strftime("%Y%m%d%H%M%S") + f"{now_ms % 1000:03d}"


class IndexService:
    def __init__(
        self, directory: str, hash_slot_num: int, index_num: int, clock_ms: Callable[[], int]
    ) -> None:
        self.directory = directory
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self._clock_ms = clock_ms
        self.files: list[IndexFile] = []
        self._unsynced_full: list[IndexFile] = []
        self.flushed_index_timestamp = 0
        self._prefix_hashes: dict[str, int] = {}

    # --- load (blocking) -----------------------------------------------------------------------

    def load(self, last_exit_ok: bool, index_msg_timestamp: int) -> None:
        """Blocking: open the files, oldest first; after a crash drop files newer than the
        checkpoint's index timestamp (they may hold torn entries; recovery re-dispatches)."""
        if not os.path.isdir(self.directory):
            return
        for name in sorted(os.listdir(self.directory)):
            path = os.path.join(self.directory, name)
            if not name.isdigit():
                continue
            f = IndexFile(path, self.hash_slot_num, self.index_num)
            if not last_exit_ok and f.end_timestamp > index_msg_timestamp:
                log.info("dropping index file %s written after the last checkpoint", path)
                f.destroy()
                continue
            self.files.append(f)
        # Oldest first by what the files hold, not by name: names are local times, which go
        # back an hour when daylight saving time ends, so a file made in the repeated hour
        # sorts before the ones made in its first pass.  Entries only come in log order, so
        # the start of a file's records orders the files; an empty one is the newest.
        self.files.sort(key=lambda f: (f.index_count <= 1, f.begin_phy_offset))
        if self.files:
            # The newest file is written to: its blocks up to its data end and the next chunk
            # (it is sparse if Java or an older pymq wrote it; see MappedFile).
            self.files[-1].ensure_allocated()

    def close(self) -> None:
        for f in self.files:
            f.close()

    # --- writing -------------------------------------------------------------------------------

    def _new_file_blocking(self) -> IndexFile:
        os.makedirs(self.directory, exist_ok=True)
        now = self._clock_ms()
        name = index_file_name(now)
        while os.path.exists(os.path.join(self.directory, name)):
            now += 1
            name = index_file_name(now)
        return IndexFile(os.path.join(self.directory, name), self.hash_slot_num, self.index_num)

    def _roll(self, new: IndexFile) -> None:
        if self.files:
            self.files[-1].write_header()
            self._unsynced_full.append(self.files[-1])
        self.files.append(new)

    def already_indexed(self, phy_offset: int) -> bool:
        """True for a record below the newest file's last entry (re-dispatch after recovery)."""
        return bool(self.files) and phy_offset < self.files[-1].end_phy_offset

    def needs_new_file(self) -> bool:
        return not self.files or self.files[-1].is_full

    async def prepare(self) -> None:
        """Create the next file in a worker thread when the newest one is full (or none).

        Raises ``OSError`` when it cannot be created (a full disk); nothing is changed then."""
        if self.needs_new_file():
            new = await trio.to_thread.run_sync(self._new_file_blocking)
            if self.needs_new_file():
                self._roll(new)
            elif any(f.path == new.path for f in self.files):
                new.close()  # rolled meanwhile onto this very file: keep it, drop our mapping
            else:
                await trio.to_thread.run_sync(new.destroy)

    def ensure_writable_file(self) -> None:
        """Blocking: have a file to write into now (at start), so that the first message's
        dispatch, which consumers wait for, does not wait for a 400 MB file to be created."""
        self._writable_file()

    def _writable_file(self) -> IndexFile:
        if self.needs_new_file():
            self._roll(self._new_file_blocking())
        return self.files[-1]

    def build_index(
        self,
        topic: str,
        keys: str | None,
        uniq_key: str | None,
        phy_offset: int,
        store_timestamp: int,
        sys_flag: int,
    ) -> None:
        """Index one dispatched record (skipped when already indexed or rolled back).

        Raises ``OSError`` when a new file is needed and cannot be created; the record is then
        dispatched again later (keys it had already indexed may be indexed twice, which queries
        report once, as after a crash)."""
        if sys_flag & _ROLLBACK == _ROLLBACK:
            return
        files = self.files
        if files and uniq_key and not keys:
            # The common record (a UNIQ_KEY, no KEYS) into a file with room: one put and the
            # header, without the general path's list and calls (a few % of a send's time).
            f = files[-1]
            prefix = self._prefix_hashes.get(topic)
            if (
                prefix is not None
                and f.index_count < f.index_num
                and phy_offset >= f.end_phy_offset
                and f.put_keys(prefix, [uniq_key], phy_offset, store_timestamp)
            ):
                f.write_header()
                return
        if not uniq_key and not keys and not self.needs_new_file():
            # Nothing to index (a transaction's op record, a message without UNIQ_KEY): the
            # header would be written back unchanged.  A full file is still rolled below, as
            # Java's buildIndex gets its file before it looks at the keys.
            return
        f = self._writable_file()
        if phy_offset < f.end_phy_offset:
            return  # re-dispatch after recovery: already indexed
        prefix = self._prefix_hashes.get(topic)
        if prefix is None:
            if len(self._prefix_hashes) >= _PREFIX_CACHE_MAX:
                self._prefix_hashes.clear()
            prefix = self._prefix_hashes[topic] = java_string_hash(topic + "#")
        todo = [uniq_key] if uniq_key else []
        if keys:
            todo += [key for key in keys.split(KEY_SEPARATOR) if key]
        failures = 0  # of the first key of todo: after MAX_TRY_IDX_CREATE it is given up
        while todo:
            done = f.put_keys(prefix, todo, phy_offset, store_timestamp)
            if done:
                todo = todo[done:]
                failures = 0
                if not todo:
                    break
            failures += 1
            log.warning("index file %s is full, rolling to a new one", f.path)
            f.write_header()
            f = self._writable_file()
            if failures >= MAX_TRY_IDX_CREATE:
                log.error("could not index key %s at offset %d", todo.pop(0), phy_offset)
                failures = 0
        f.write_header()

    # --- flush and query -----------------------------------------------------------------------

    async def flush(self) -> int:
        """Sync full files not yet synced; return the newest end timestamp that is durable."""
        while self._unsynced_full:
            f = self._unsynced_full[0]
            try:
                await trio.to_thread.run_sync(f.sync)
            except OSError:
                # The retry must write what this sync could not (see MappedFile.redirty); the
                # file is full, so nothing else writes to it meanwhile.
                await trio.to_thread.run_sync(f.mf.redirty, 0, f.mf.file_size)
                raise
            # Not pop(0): the clean service may have deleted f meanwhile (taking it off this
            # list), and the file now first is one this sync never covered.
            if f in self._unsynced_full:
                self._unsynced_full.remove(f)
            self.flushed_index_timestamp = max(self.flushed_index_timestamp, f.end_timestamp)
        return self.flushed_index_timestamp

    async def flush_all(self) -> None:
        """Sync every file (shutdown)."""
        for f in list(self.files):
            await trio.to_thread.run_sync(f.sync)
        self._unsynced_full.clear()
        if self.files:
            self.flushed_index_timestamp = max(
                self.flushed_index_timestamp, self.files[-1].end_timestamp
            )

    def query(
        self, topic: str, key: str, max_num: int, begin: int, end: int
    ) -> tuple[list[int], int, int]:
        """(commit-log offsets, last update timestamp, last update phy offset) for a key.

        Files are searched newest first and the search stops at a file that begins before
        ``begin``, as Java's ``queryOffset`` does.
        """
        out: list[int] = []
        last_ts = last_phy = 0
        full_key = f"{topic}#{key}"
        for i, f in enumerate(reversed(self.files)):
            if i == 0:
                last_ts, last_phy = f.end_timestamp, f.end_phy_offset
            if f.is_time_matched(begin, end):
                f.select_phy_offsets(out, full_key, max_num, begin, end)
            if f.begin_timestamp < begin or len(out) >= max_num:
                break
        return out, last_ts, last_phy

    def expired_files(self, min_phy_offset: int) -> list[IndexFile]:
        """Files (never the last) wholly below the commit log's min offset."""
        out = []
        for f in self.files[:-1]:
            if f.end_phy_offset < min_phy_offset:
                out.append(f)
            else:
                break
        return out

    async def delete_files(self, doomed: list[IndexFile]) -> None:
        for f in doomed:
            self.files.remove(f)
            if f in self._unsynced_full:
                self._unsynced_full.remove(f)
            await trio.to_thread.run_sync(f.destroy)

    def destroy(self) -> None:
        """Blocking: delete every index file."""
        for f in self.files:
            f.destroy()
        self.files = []
        self._unsynced_full.clear()
