"""HA framing and the SYNC_MASTER waits of HAService, without sockets."""

from __future__ import annotations

import pytest
import trio

from pymq.store.config import MessageStoreConfig
from pymq.store.ha.framing import (
    HAProtocolError,
    ReportDecoder,
    TransferDecoder,
    encode_report,
    encode_transfer,
)
from pymq.store.ha.master import HAService, SlaveConnection
from pymq.store.results import PutMessageStatus


def test_report_decoder_keeps_the_newest_whole_offset() -> None:
    decoder = ReportDecoder()
    stream = encode_report(10) + encode_report(20) + encode_report(30)[:5]
    assert decoder.feed(stream) == 20
    assert decoder.feed(encode_report(30)[5:]) == 30
    assert decoder.feed(b"") is None
    with pytest.raises(HAProtocolError):
        decoder.feed(encode_report(-1))


def test_transfer_decoder_reassembles_frames_cut_anywhere() -> None:
    frames = [(0, b"abc"), (3, b""), (3, b"x" * 1000)]
    stream = b"".join(encode_transfer(o, d) for o, d in frames)
    for cut in range(len(stream) + 1):
        decoder = TransferDecoder(1000)
        assert decoder.feed(stream[:cut]) + decoder.feed(stream[cut:]) == frames
    with pytest.raises(HAProtocolError):
        TransferDecoder(1000).feed(encode_transfer(0)[:8] + b"\xff\xff\xff\xff")


def test_transfer_decoder_refuses_a_frame_beyond_the_batch_size_from_its_header() -> None:
    """A master sends at most haTransferBatchSize bytes a frame: a header announcing one byte
    more is refused at once, before its body is buffered (it was taken up to 64 MiB)."""
    decoder = TransferDecoder(1000)
    assert decoder.feed(encode_transfer(0, b"x" * 1000)) == [(0, b"x" * 1000)]
    with pytest.raises(HAProtocolError, match="haTransferBatchSize"):
        decoder.feed(encode_transfer(1000, b"x" * 1001)[:12])


class FakeStore:
    max_phy_offset = 1000


def service(**config: int) -> HAService:
    return HAService(FakeStore(), MessageStoreConfig(sync_flush_timeout=200, **config))


async def test_no_slave_is_slave_not_available() -> None:
    assert await service().wait_for_replica(100) is PutMessageStatus.SLAVE_NOT_AVAILABLE


async def test_slave_too_far_behind_is_slave_not_available() -> None:
    ha = service(ha_slave_fallbehind_max=500)
    ha.connections.add(SlaveConnection("s:1", request_offset=0, ack_offset=0))
    assert await ha.wait_for_replica(600) is PutMessageStatus.SLAVE_NOT_AVAILABLE


async def test_ack_completes_the_wait_and_silence_times_out() -> None:
    ha = service()
    conn = SlaveConnection("s:1", request_offset=0, start_offset=0, sent_end=1000)
    ha.connections.add(conn)
    results = []

    async def wait(end: int) -> None:
        results.append(await ha.wait_for_replica(end))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait, 100)
        await trio.sleep(0.01)
        ha._on_report(conn, 100)
    assert results == [PutMessageStatus.PUT_OK]
    assert await ha.wait_for_replica(200) is PutMessageStatus.FLUSH_SLAVE_TIMEOUT
    assert ha.status() == [{"address": "s:1", "ackOffset": 100, "lagBytes": 900}]


async def test_new_data_wakes_writers_only_when_a_slave_is_connected() -> None:
    ha = service()
    event = ha._new_data
    ha.notify_new_data()  # nobody can be waiting: the event is kept, not set
    assert ha._new_data is event and not event.is_set()
    ha.connections.add(SlaveConnection("s:1", request_offset=0))
    ha.notify_new_data()
    assert event.is_set() and ha._new_data is not event


class BrokenStore:
    """A store whose reads fail: stands for any bug met while serving one slave."""

    max_phy_offset = 1000
    min_phy_offset = 0

    def get_commitlog_data(self, offset: int, size: int) -> bytes:
        raise ValueError("a bug while reading the commit log")


async def test_an_error_serving_one_slave_closes_that_connection_only(nursery) -> None:
    ha = HAService(BrokenStore(), MessageStoreConfig(ha_listen_port=0), host="127.0.0.1")
    port = await nursery.start(ha.run)
    for _ in range(2):  # the service accepts again after the first connection failed
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(encode_report(0))
        with trio.fail_after(5):
            assert await stream.receive_some(100) == b""  # closed by the master
        await stream.aclose()
    assert ha.connections == set()
