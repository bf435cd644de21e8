"""A broadcasting consumer's offsets in a local file (RocketMQ's LocalFileOffsetStore).

In broadcasting mode every consumer reads every queue, so the broker keeps no offsets for it:
each consumer keeps its own, in ``<dir>/<clientId>/<group>/offsets.json``, where ``<dir>`` is
:data:`DEFAULT_DIR` (Java's ``rocketmq.client.localOffsetStoreDir``, ``~/.rocketmq_offsets``)
unless the consumer is given another.  The client id is ``<ip>@<instanceName>``: give the
consumer a fixed ``instance_name`` for its offsets to be found again after a restart (Java's
default instance name, like pymq's, changes with every process).

The file is Java's ``OffsetSerializeWrapper`` in fastjson's form, its ``offsetTable`` keyed by
the queue itself::

    {"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:42}}

It is written atomically (a ``.tmp`` renamed over it, the previous file kept as ``.bak``) and
read at start; a file that cannot be parsed falls back to its ``.bak``, and when neither parses
the consumer refuses to start (ValueError) rather than silently consume from elsewhere.
Entries of queues the consumer no longer owns are kept, as Java keeps them.  A file larger than
:data:`MAX_FILE_BYTES` is refused as corrupt.  The client id and the group each name one
directory: one that is empty, ``.`` or ``..``, longer than :data:`MAX_NAME_BYTES` or holding a
path separator or NUL is refused (ValueError) rather than written outside the directory.
"""

from __future__ import annotations

import logging
import os

import trio

from pymq.common.config import user_home
from pymq.common.consumer import MessageQueue
from pymq.common.files import read_file_with_backup, write_file_atomic
from pymq.remoting.protocol import fastjson

log = logging.getLogger(__name__)

# LocalFileOffsetStore.LOCAL_OFFSET_STORE_DIR's default.
DEFAULT_DIR = os.path.join(user_home(), ".rocketmq_offsets")
FILE_NAME = "offsets.json"
# An offsets file is a few dozen bytes a queue: anything this large is not one.
MAX_FILE_BYTES = 64 * 1024 * 1024
# A directory name's longest (NAME_MAX of common file systems), in UTF-8 bytes.
MAX_NAME_BYTES = 255


def check_path_name(what: str, name: str) -> None:
    """ValueError unless ``name`` can be one directory's name under the store's directory."""
    if name in ("", ".", "..") or any(c in name for c in ("/", "\\", "\0")):
        raise ValueError(f"{what} {name!r} cannot name a directory of the offsets store")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise ValueError(f"{what} is longer than {MAX_NAME_BYTES} bytes")


def offsets_path(directory: str, client_id: str, group: str) -> str:
    """``<directory>/<clientId>/<group>/offsets.json``."""
    check_path_name("client id", client_id)
    check_path_name("consumer group", group)
    return os.path.join(directory, client_id, group, FILE_NAME)


def encode_offsets(table: dict[MessageQueue, int]) -> bytes:
    """The file's content: OffsetSerializeWrapper as fastjson writes it."""
    return fastjson.dumps({"offsetTable": dict(sorted(table.items()))})


def decode_offsets(data: bytes) -> dict[MessageQueue, int]:
    """Read an offsets file (compact, or pretty-printed as Java writes it); ValueError when it
    is not one."""
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"{len(data)} bytes, more than {MAX_FILE_BYTES}")
    wrapper = fastjson.loads(data)
    if not isinstance(wrapper, dict):
        raise ValueError("not an object")
    table = wrapper.get("offsetTable") or {}
    if not isinstance(table, dict):
        raise ValueError("offsetTable is not a map")
    offsets: dict[MessageQueue, int] = {}
    for key, value in table.items():
        if not isinstance(key, dict):
            raise ValueError(f"offsetTable key {key!r} is not a message queue")
        try:
            mq = MessageQueue(str(key["topic"]), str(key["brokerName"]), int(key["queueId"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"offsetTable key {key!r}: {exc}") from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"offset of {mq} is not an integer: {value!r}")
        offsets[mq] = value
    return offsets


class LocalFileOffsetStore:
    """The offsets of one consumer group of one client, kept in memory and in its file."""

    def __init__(self, directory: str, client_id: str, group: str) -> None:
        self.path = offsets_path(directory, client_id, group)
        self.table: dict[MessageQueue, int] = {}
        self._write_lock = trio.Lock()

    def load(self) -> None:
        """Blocking: read the file (else its ``.bak``); a missing file is an empty table."""
        loaded = read_file_with_backup(self.path, decode_offsets)
        if loaded is not None:
            self.table.update(loaded)
            for mq, offset in sorted(loaded.items()):
                log.info("load consumer's offset, %s %s", mq, offset)

    def read(self, mq: MessageQueue) -> int:
        """The stored offset of ``mq``, or -1 when it has none."""
        return self.table.get(mq, -1)

    async def persist(self, offsets: dict[MessageQueue, int]) -> None:
        """Record ``offsets`` (the queues owned now) and write the whole table."""
        self.table.update(offsets)
        data = encode_offsets(self.table)
        async with self._write_lock:
            await trio.to_thread.run_sync(write_file_atomic, self.path, data)
