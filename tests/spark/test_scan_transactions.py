"""The export and transactional messages: a committed message is exported once, under its real
topic; half, op and discarded records stay in system topics, left out unless asked for."""

from __future__ import annotations

import trio

from pymq.client import LocalTransactionState, Message, TransactionProducer
from pymq.common.topic import RMQ_SYS_TRANS_HALF_TOPIC, RMQ_SYS_TRANS_OP_HALF_TOPIC
from pymq.embedded import open_cluster
from pymq.export.options import ExportOptions
from pymq.export.scan import SegmentScan, plan_store
from tests.helpers import wait_until
from tests.spark.helpers import FILE_SIZE, store_of

STATES = {
    b"committed": LocalTransactionState.COMMIT_MESSAGE,
    b"rolled-back": LocalTransactionState.ROLLBACK_MESSAGE,
    b"pending": LocalTransactionState.UNKNOW,
}


def write_transactions(data_dir: str) -> None:
    async def main() -> None:
        async with (
            open_cluster(
                data_dir,
                namesrv_port=0,
                broker_port=0,
                bind_address="127.0.0.1",
                properties={"mappedFileSizeCommitLog": str(FILE_SIZE)},
            ) as cluster,
            TransactionProducer(
                "ExportTx",
                cluster.namesrv_addr,
                execute=lambda msg, arg: STATES[msg.body],
                check=lambda msg: LocalTransactionState.UNKNOW,
            ) as producer,
        ):
            for body in STATES:
                await producer.send_in_transaction(Message("Payments", body))
            store = cluster.broker.store
            await wait_until(
                lambda: store.get_max_offset_in_queue(RMQ_SYS_TRANS_OP_HALF_TOPIC, 0) == 2
            )

    trio.run(main)


def scanned(opts: ExportOptions) -> list:
    out = []
    for segment in plan_store(opts).segments:
        out.extend(SegmentScan(segment, opts))
    return out


def test_committed_message_is_exported_once_under_its_real_topic(tmp_path) -> None:
    write_transactions(str(tmp_path))
    store = store_of(str(tmp_path))
    rows = scanned(ExportOptions(path=store))
    assert [(m.topic, m.body) for m in rows] == [("Payments", b"committed")]
    everything = scanned(ExportOptions(path=store, include_system_topics=True))
    halves = [m for m in everything if m.topic == RMQ_SYS_TRANS_HALF_TOPIC]
    assert sorted(m.body for m in halves) == sorted(STATES)
    assert sum(m.topic == RMQ_SYS_TRANS_OP_HALF_TOPIC for m in everything) == 2
