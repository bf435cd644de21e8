"""Helpers for store tests: small files in a temp dir, a running store, a small real disk."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import os
import subprocess
import types
from collections.abc import AsyncIterator, Iterator
from typing import Any

import trio

from pymq.common.message_ext import MessageExt
from pymq.store import DefaultMessageStore, MessageStoreConfig

SMALL_COMMITLOG = 64 * 1024
SMALL_CQ = 20 * 100


def small_config(root: str, **overrides: object) -> MessageStoreConfig:
    config = MessageStoreConfig(
        store_path_root_dir=root,
        mapped_file_size_commit_log=SMALL_COMMITLOG,
        mapped_file_size_consume_queue=SMALL_CQ,
        max_hash_slot_num=64,
        max_index_num=256,
    )
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def make_message(
    topic: str = "TopicTest",
    queue_id: int = 0,
    body: bytes = b"hello",
    tags: str | None = "TagA",
    keys: str | None = None,
    **props: str,
) -> MessageExt:
    properties = dict(props)
    if tags:
        properties["TAGS"] = tags
    if keys:
        properties["KEYS"] = keys
    return MessageExt(
        topic=topic,
        body=body,
        queue_id=queue_id,
        properties=properties,
        born_timestamp=1_700_000_000_000,
        born_host=("10.0.0.9", 40000),
    )


@contextlib.asynccontextmanager
async def running_store(
    config: MessageStoreConfig, **kwargs: object
) -> AsyncIterator[DefaultMessageStore]:
    """A started store; leaving the block cancels it and waits for its clean shutdown."""
    store = DefaultMessageStore(config, **kwargs)
    store.store_host = ("192.168.0.1", 10911)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        try:
            yield store
        finally:
            nursery.cancel_scope.cancel()


@contextlib.contextmanager
def small_tmpfs(path: str, size: int) -> Iterator[str]:
    """A real filesystem of ``size`` bytes mounted at ``path`` (tmpfs: CI runs as root), so a
    test can fill a disk for real; unmounted when the block ends."""
    os.makedirs(path, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], check=True)


def fill_disk(path: str) -> int:
    """Write a ballast file at ``path`` until the filesystem is full; returns its size."""
    chunk = bytes(range(256)) * 256
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        while True:
            try:
                n = os.write(fd, chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                return written
            written += n
            if n < len(chunk):  # the last few bytes fitted: the next write fails
                continue
    finally:
        os.close(fd)


def write_ballast(path: str, size: int) -> None:
    with open(path, "wb") as f:
        f.write(b"\xa5" * size)


def _nothing_hinted(hints: object, log: object, pos: int, end: int, offset: int, *rest: object):
    return 0, pos, offset, -1, None


def _nothing_read(buf: object, pos: int, *rest: object) -> tuple[list, int]:
    return [], pos


DISPATCH_MODES = ("fast", "general", "twin", "c")


@contextlib.contextmanager
def dispatch_mode(mode: str) -> Iterator[None]:
    """The reput's hinted dispatch, while in the block: ``fast`` as built (dispatch_hinted and
    record_hints, C or their twins); ``general`` neither, the reference the others are compared
    with (every hinted record through ``_hint_for`` and ``dispatch_fields``, every other one
    parsed); ``twin`` the Python twins; ``c`` the C functions (skips the test if not built)."""
    import pytest

    from pymq.common.native import load_native
    from pymq.store import reput

    if mode == "c":
        c = load_native("pymq.store._dispatchc")
        if c is None:
            pytest.skip("needs the C extension")
        functions = (c.dispatch_hinted, c.record_hints)
    else:
        functions = {
            "fast": (reput._dispatch_hinted, reput._record_hints),
            "general": (_nothing_hinted, _nothing_read),
            "twin": (reput.dispatch_hinted_py, reput.record_hints_py),
        }[mode]
    saved = reput._dispatch_hinted, reput._record_hints
    reput._dispatch_hinted, reput._record_hints = functions
    try:
        yield
    finally:
        reput._dispatch_hinted, reput._record_hints = saved


@dataclasses.dataclass
class FakeFile:
    mm: bytearray
    file_from_offset: int
    wrote_position: int
    file_size: int


class FakeCommitLog:
    """What ``ReputMessageService._dispatch_some`` reads of a commit log: one file of
    ``file_size`` bytes from ``base``, ``data`` written at its start; the hints the test gives."""

    def __init__(self, data: bytes, file_size: int, base: int = 0) -> None:
        mm = bytearray(file_size)
        mm[: len(data)] = data
        self.file = FakeFile(mm, base, len(data), file_size)
        self.queue = types.SimpleNamespace(find_by_offset=self.find_by_offset)
        self.dispatch_hints: collections.deque[Any] = collections.deque()
        self.min_offset = base
        self.rolled: list[int] = []

    def find_by_offset(self, offset: int) -> FakeFile | None:
        f = self.file
        return f if f.file_from_offset <= offset < f.file_from_offset + f.file_size else None

    @property
    def max_offset(self) -> int:
        return self.file.file_from_offset + self.file.wrote_position

    def roll_next_file(self, offset: int) -> int:
        self.rolled.append(offset)
        return self.file.file_from_offset + self.file.file_size
