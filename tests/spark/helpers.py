"""Helpers for the Spark tests: stores written by a real broker from varied messages."""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Iterable, Iterator

import attrs
import trio

from pymq.client import Message, Producer, SendResult
from pymq.embedded import open_cluster

FILE_SIZE = 64 * 1024
"""Small commit-log files, so that a few hundred messages make several partitions."""


@attrs.frozen
class Sent:
    message: Message
    result: SendResult


def make_messages(count: int, seed: int, topics: tuple[str, ...] = ("Orders", "Audit")) -> list:
    """Varied messages: two topics, tags, keys, user properties, empty and binary bodies."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        size = 0 if i % 50 == 7 else rng.randrange(1, 900)
        body = bytes(rng.getrandbits(8) for _ in range(size))
        if i % 97 == 13:
            body = b"the client compresses bodies of 4 KiB and more " * 120
        out.append(
            Message(
                topics[i % len(topics)],
                body,
                tags=None if i % 11 == 3 else f"tag{i % 4}",
                keys=[f"id-{seed}-{i}", "all"] if i % 5 else None,
                properties={"seq": str(i), "note": f"ü{i}"} if i % 3 else {},
            )
        )
    return out


def produce(data_dir: str, messages: list[Message], delayed: int = 0) -> list[Sent]:
    """Run a broker on ``data_dir``, send ``messages`` (plus ``delayed`` messages with delay
    level 3, which stay in SCHEDULE_TOPIC_XXXX as the broker stops first) and stop it."""

    async def main() -> list[Sent]:
        async with (
            open_cluster(
                data_dir,
                namesrv_port=0,
                broker_port=0,
                bind_address="127.0.0.1",
                properties={"mappedFileSizeCommitLog": str(FILE_SIZE)},
            ) as cluster,
            Producer("ExportTest", cluster.namesrv_addr) as producer,
        ):
            sent = []
            for msg in messages:
                result = await producer.send(msg)
                assert result.status == "SEND_OK"
                sent.append(Sent(msg, result))
            for i in range(delayed):
                await producer.send(Message("Orders", f"later-{i}".encode(), delay_level=3))
            return sent

    return trio.run(main)


def store_of(data_dir: str) -> str:
    return os.path.join(data_dir, "store")


def java_available() -> bool:
    home = os.environ.get("JAVA_HOME")
    return bool(home and os.path.exists(os.path.join(home, "bin", "java"))) or bool(
        shutil.which("java")
    )


_PYSPARK_MODULES = ("pyspark", "pyspark.worker", "pyspark.daemon")


def worker_imports(_rows: Iterable[object]) -> Iterator[tuple[str, ...]]:
    """For ``mapPartitions``: where the Python worker running the partition got PySpark
    (``pyspark``, ``pyspark.worker``, ``pyspark.daemon``; "" for one not imported as a module,
    as PySpark's own daemon, which runs as ``__main__``) and the module it runs as
    ``__main__`` (the daemon module)."""
    import sys

    spec = sys.modules["__main__"].__spec__
    files = (getattr(sys.modules.get(name), "__file__", "") or "" for name in _PYSPARK_MODULES)
    yield (*(str(f) for f in files), spec.name if spec is not None else "")
