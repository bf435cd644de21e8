"""put_now of a SingleSend (CommitLog.append_run underneath): it keeps
warmMapedFileEnable's chunk ahead of the writer as CommitLog.append_stored does, and stores
each sender's own born host (packed once per peer)."""

from __future__ import annotations

import pytest
import trio

from pymq.remoting.headers import SendMessageRequestHeader
from pymq.store import mapped_file as mapped_file_module
from pymq.store.message_store import DefaultMessageStore
from pymq.store.results import SingleSend
from tests.store.helpers import running_store, small_config
from tests.store.test_batch_fast_path import (
    BORN,
    CLUSTER,
    NOW,
    TOPIC,
    _prime,
    _single_header,
)


def _fast_single(store: DefaultMessageStore, body: bytes, header: SendMessageRequestHeader):
    return store.put_now(SingleSend(
        TOPIC, 2, body, header.properties or "", header.flag, CLUSTER, header.sys_flag,
        header.born_timestamp, BORN, header.reconsume_times or 0,
    ))  # fmt: skip


@pytest.mark.skipif(
    getattr(mapped_file_module, "ALLOCATE_CHUNK", None) is None, reason="no chunked allocation"
)
def test_fast_single_puts_allocate_ahead_when_warm(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(mapped_file_module, "ALLOCATE_CHUNK", 8192)

    async def main() -> None:
        config = small_config(str(tmp_path), warm_maped_file_enable=True)
        async with running_store(config, clock_ms=lambda: NOW) as store:
            _prime(store)
            header = _single_header("TAGS\x01t")
            mf = store.commitlog.queue.files[-1]
            assert store.commitlog.warm and mf.chunk == 8192
            for _ in range(8):  # 24 KB of a 64 KB file: every put fits
                out = _fast_single(store, b"x" * 3000, header)
                assert out is not None  # never left to the general path for want of blocks
                # The ahead chunk: one more than the writer's, as append_stored keeps it.
                assert mf.allocated - mf.wrote_position > mf.chunk or mf.allocated >= mf.file_size

    trio.run(main)


def test_fast_single_puts_store_each_senders_born_host(tmp_path) -> None:
    from pymq.common.record import decode_records

    async def main() -> None:
        config = small_config(str(tmp_path))
        async with running_store(config, clock_ms=lambda: NOW) as store:
            _prime(store)
            header = _single_header("TAGS\x01t")
            hosts = [("10.0.0.1", 1111), ("10.0.0.2", 2222), ("10.0.0.1", 3333), ("10.0.0.3", 1)]
            for host in hosts + hosts:
                out = store.put_now(
                    SingleSend(
                        TOPIC, 2, b"b", header.properties or "", 0, CLUSTER, 0, NOW - 5, host, 0
                    )
                )
                assert out is not None
            assert (
                store.put_now(
                    SingleSend(TOPIC, 2, b"b", "", 0, CLUSTER, 0, NOW - 5, ("not an address", 1), 0)
                )
                is None
            )  # the general path words the refusal
            data = store.commitlog.get_data(store.commitlog.min_offset) or b""
            born = [m.born_host for m in decode_records(data)][1:]  # after _prime's
            assert born == hosts + hosts
            # Each peer packed once, kept with _prime's (the general path's put keeps it too);
            # not the host that is no address.
            assert set(store.commitlog._born_ips) == {"10.0.0.1", "10.0.0.2", "10.0.0.3", BORN[0]}

    trio.run(main)


def test_a_body_of_any_buffer_takes_the_one_call_put(tmp_path) -> None:
    """The inline path hands the request's body as the frame's slice (bytes, bytearray or a
    memoryview): each is put in one call, as bytes are, and stored alike."""
    from pymq.common.message_ext import MessageExt

    async def main() -> None:
        async with running_store(small_config(str(tmp_path))) as store:
            first = MessageExt(topic="T", body=b"first", born_host=("10.0.0.1", 1))
            assert store.put_now(first).status.name == "PUT_OK"  # the topic checked, a file
            for body in (b"body", bytearray(b"body"), memoryview(b"xbodyx")[1:5]):
                send = SingleSend("T", 0, body, "TAGS\x01t", 0, "C", 0, 1, ("10.0.0.1", 1), 0)
                out = store.put_now(send)
                assert out is not None, type(body)
                result = out[0]
                stored = store.commitlog.get_message(result.wrote_offset, result.wrote_bytes)
                assert stored is not None and b"body" in stored

    trio.run(main)
