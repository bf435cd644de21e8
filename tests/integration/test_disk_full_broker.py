"""A real broker on a small real disk (tmpfs): 2 KB sends until the disk is full.  The broker
stays up, refused sends are answered SYSTEM_ERROR or SERVICE_NOT_AVAILABLE with a remark, sends
succeed again once space is freed, and every acknowledged message is read back after a
restart."""

from __future__ import annotations

import os
import pathlib

from pymq.client import MQClientError, Producer, SendResult, topics
from pymq.client.producer import Message
from pymq.common.consumer import MessageQueue
from pymq.common.record import decode_record
from pymq.embedded import open_cluster
from pymq.remoting.codes import ResponseCode
from pymq.store.results import GetMessageStatus
from tests.helpers import wait_until
from tests.store.helpers import small_tmpfs, write_ballast

MIB = 1024 * 1024
PROPERTIES = {
    "mappedFileSizeCommitLog": str(MIB),
    "mappedFileSizeConsumeQueue": str(20 * 4000),
    "maxHashSlotNum": "1000",
    "maxIndexNum": "4000",
    "mappedFileCreateRetryInterval": "20",
}
TOPIC = "DiskFull"


async def test_broker_survives_a_full_disk_and_resumes(tmp_path: pathlib.Path) -> None:
    with small_tmpfs(str(tmp_path / "fs"), 8 * MIB) as fs:
        data = os.path.join(fs, "data")
        ballast = os.path.join(fs, "ballast")
        write_ballast(ballast, 2 * MIB)
        acked: dict[int, bytes] = {}
        refusals: list[MQClientError] = []
        async with open_cluster(
            data, namesrv_port=0, broker_port=0, bind_address="127.0.0.1", properties=PROPERTIES
        ) as cluster:
            await topics.create_topic(
                cluster.namesrv_addr, TOPIC, brokers=[cluster.broker_addr], queues=1
            )
            async with Producer("P", cluster.namesrv_addr) as producer:
                queue = MessageQueue(TOPIC, cluster.broker.broker_config.broker_name, 0)
                for i in range(4000):
                    body = b"%06d" % i + b"x" * 2000
                    try:
                        result = await producer.send(Message(TOPIC, body), queue=queue)
                    except MQClientError as exc:
                        refusals.append(exc)
                        if len(refusals) == 3:
                            break
                        continue
                    assert result.status == "SEND_OK"
                    acked[result.queue_offset] = body
                assert len(refusals) == 3, "the disk never filled"
                for exc in refusals:
                    assert exc.code in (
                        ResponseCode.SYSTEM_ERROR,
                        ResponseCode.SERVICE_NOT_AVAILABLE,
                    )
                    assert exc.remark
                    assert str(tmp_path) not in exc.remark  # no server paths to the client
                assert len(acked) > 1000
                assert sorted(acked) == list(range(len(acked)))  # no hole, nothing twice

                os.unlink(ballast)  # space comes back: sends go through again, no restart

                async def send_back() -> SendResult | None:
                    try:
                        return await producer.send(Message(TOPIC, b"back"), queue=queue)
                    except MQClientError:
                        return None

                result = await wait_until(send_back, timeout=20, interval=0.02)
                assert result.status == "SEND_OK"
                assert result.queue_offset == len(acked)
                acked[result.queue_offset] = b"back"

        async with open_cluster(
            data, namesrv_port=0, broker_port=0, bind_address="127.0.0.1", properties=PROPERTIES
        ) as cluster:
            store = cluster.broker.store
            await store.reput.do_reput()
            assert store.get_max_offset_in_queue(TOPIC, 0) == len(acked)
            read: dict[int, bytes] = {}
            offset = 0
            while offset < len(acked):
                got = store.get_message("G", TOPIC, 0, offset, 32)
                assert got.status is GetMessageStatus.FOUND
                for raw in got.messages:
                    msg = decode_record(raw)
                    read[msg.queue_offset] = msg.body
                offset = got.next_begin_offset
            assert read == acked
