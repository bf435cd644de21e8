"""Crash-test writer: puts messages with SYNC_FLUSH and prints each acknowledged one.

Run as ``python crash_writer.py ROOT RUN``.  Several producer tasks (one of them batching) put
deterministic bodies (see :func:`body_for`); after each PUT_OK it prints, flushed,
``ACK run seq queue_id commitlog_offset size queue_offset``.  The test kills it with SIGKILL at a
random moment and then checks that every acknowledged message survived intact.
"""

from __future__ import annotations

import sys

import trio

from pymq.common.message_ext import MessageExt
from pymq.store import DefaultMessageStore, FlushDiskType, MessageStoreConfig, PutMessageStatus

COMMITLOG_FILE = 64 * 1024
CQ_FILE = 20 * 50
QUEUES = 3
PRODUCERS = 4


def config_for(root: str) -> MessageStoreConfig:
    return MessageStoreConfig(
        store_path_root_dir=root,
        mapped_file_size_commit_log=COMMITLOG_FILE,
        mapped_file_size_consume_queue=CQ_FILE,
        flush_disk_type=FlushDiskType.SYNC_FLUSH,
        max_hash_slot_num=128,
        max_index_num=512,
    )


def body_for(run: int, seq: int) -> bytes:
    head = f"{run}:{seq}:".encode()
    return head + bytes((seq * 7 + i) % 251 for i in range(50 + (seq * 37) % 900))


def message(run: int, seq: int) -> MessageExt:
    return MessageExt(
        topic="CrashTopic",
        body=body_for(run, seq),
        queue_id=seq % QUEUES,
        properties={"TAGS": f"T{seq % 5}", "KEYS": f"k{run}-{seq}"},
        born_timestamp=seq,
        born_host=("127.0.0.1", 1234),
    )


async def main(root: str, run: int) -> None:
    store = DefaultMessageStore(config_for(root))
    out = sys.stdout
    seq_source = iter(range(10**9))

    def ack(seq: int, msg: MessageExt) -> None:
        out.write(
            f"ACK {run} {seq} {msg.queue_id} {msg.commitlog_offset} {msg.store_size} "
            f"{msg.queue_offset}\n"
        )
        out.flush()

    async def producer(batch: bool) -> None:
        while True:
            if batch:
                seqs = [next(seq_source)]
                seqs += [next(seq_source) for _ in range(2)]
                msgs = [message(run, s) for s in seqs]
                for m in msgs:
                    m.queue_id = seqs[0] % QUEUES
                r = await store.put(msgs)
            else:
                seqs = [next(seq_source)]
                msgs = [message(run, seqs[0])]
                r = await store.put(msgs[0])
            if r.status is PutMessageStatus.PUT_OK:
                for s, m in zip(seqs, msgs, strict=True):
                    ack(s, m)

    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        out.write("READY\n")
        out.flush()
        for i in range(PRODUCERS):
            nursery.start_soon(producer, i == 0)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], int(sys.argv[2]))
