"""The DLedger leader's one put path (pymq.store.dledger_commitlog): sends go through the one
record encoder with DLedger's entry headers (DLedgerCommitLog.append_run), no message object
per send, and store byte for byte what the general path (the messages the send path builds,
DLedgerCommitLog.append_stored) stores: the same data files (entries, their headers, the
blanks that close full files), answers, queue offsets and acknowledgements."""

from __future__ import annotations

import os

import trio
import trio.testing

from pymq.common.batch import BatchItem, encode_batch_body
from pymq.remoting.codec import RemotingCommand
from pymq.store import PutMessageStatus
from pymq.store.message_store import DefaultMessageStore
from pymq.store.results import PutMessageResult
from tests.helpers import free_port
from tests.store.helpers import running_store
from tests.store.test_batch_fast_path import (
    NOW,
    _decoded,
    _fast,
    _general,
    _header,
    _prime,
    _result,
    _single_header,
)
from tests.store.test_dledger_commitlog import dledger_config, kwargs, leading


def _data_files(store: DefaultMessageStore) -> list[tuple[str, bytes]]:
    """The DLedger data files, by name, up to what each holds."""
    assert store.dledger is not None
    data = store.dledger.dledger.data
    out = []
    for f in data.files:
        with open(f.path, "rb") as fh:
            out.append((os.path.basename(f.path), fh.read(f.wrote)))
    return out


def _sends() -> list[tuple[bytes, object]]:
    """Single sends and batches, enough to fill a few 64 KiB data files."""
    batch = encode_batch_body([
        BatchItem(b"x" * 700, 0, {"TAGS": "a", "WAIT": "true", "KEYS": "k1 k2"}),
        BatchItem(b"", 7, {"UNIQ_KEY": "U1", "WAIT": "false"}),
        BatchItem(b"y" * 3000, -1, {}),
    ])  # fmt: skip
    sends: list[tuple[bytes, object]] = []
    for i in range(120):
        sends.append((b"s%d" % i * (1 + i * 37 % 500), _single_header(f"TAGS\x01t{i % 3}")))
        if i % 4 == 0:
            sends.append((batch, _header()))
        if i % 9 == 0:
            sends.append((b"w", _single_header("WAIT\x01true\x02KEYS\x01a b")))
    return sends


async def _compare(tmp_path) -> int:
    """Each send put by the one-call path (the general path where that stops, at a data
    file's end) into one single-member group's leader, by the general path into another's."""
    configs = [dledger_config(str(tmp_path / name), free_port()) for name in ("fast", "general")]
    fast_puts = 0
    async with (
        running_store(configs[0], clock_ms=lambda: NOW, **kwargs(configs[0])) as fast,  # type: ignore[arg-type]
        running_store(configs[1], clock_ms=lambda: NOW, **kwargs(configs[1])) as general,  # type: ignore[arg-type]
    ):
        for store in (fast, general):
            await leading(store)
            _prime(store)
        for body, header in _sends():
            out = _fast(fast, body, header)  # type: ignore[arg-type]
            if out is None:  # the data file's end: the general path rolls to the next
                out = _general(fast, body, header)  # type: ignore[arg-type]
            else:
                fast_puts += 1
            msgs = _decoded(body, header)  # type: ignore[arg-type]
            assert not isinstance(msgs, RemotingCommand)
            expected = _general(general, body, header)  # type: ignore[arg-type]
            assert out[0].status is PutMessageStatus.PUT_OK
            assert _result(out[0]) == _result(expected[0]) and out[1] == expected[1]
            for store, result in ((fast, out[0]), (general, expected[0])):
                assert store.dledger is not None
                end = result.wrote_offset + result.wrote_bytes
                assert await store.dledger.wait_quorum(end) is PutMessageStatus.PUT_OK
        assert fast.commitlog.topic_queue_table == general.commitlog.topic_queue_table
        fast_files, general_files = _data_files(fast), _data_files(general)
        assert len(general_files) >= 3  # full files closed with their blanks
        assert fast_files == general_files
    return fast_puts


def test_sends_store_what_the_general_path_stores(tmp_path) -> None:
    fast_puts = trio.run(_compare, tmp_path)
    assert fast_puts >= len(_sends()) - 10  # every send but those at a file's end


def test_a_leader_that_cannot_append_leaves_the_send_to_the_general_path(tmp_path) -> None:
    """A leader that takes no appends now (handing the leadership over here; any refusal of
    the node): the one-call put changes nothing, and the general path answers
    OS_PAGECACHE_BUSY, as Java's DLedgerCommitLog does."""

    async def main() -> None:
        config = dledger_config(str(tmp_path), free_port())
        async with running_store(config, clock_ms=lambda: NOW, **kwargs(config)) as store:  # type: ignore[arg-type]
            await leading(store)
            _prime(store)
            assert store.dledger is not None
            node = store.dledger.server.node
            assert node is not None
            body, header = b"m", _single_header("TAGS\x01t")
            assert _fast(store, body, header) is not None  # the first send, too
            table = dict(store.commitlog.topic_queue_table)
            files = _data_files(store)
            node.transferee = "n1"  # LEADER_TRANSFERRING
            assert _fast(store, body, header) is None
            assert _data_files(store) == files and store.commitlog.topic_queue_table == table
            result: PutMessageResult = _general(store, body, header)[0]
            assert result.status is PutMessageStatus.OS_PAGECACHE_BUSY
            node.transferee = None
            assert _fast(store, body, header) is not None

    trio.run(main)


class _Sink:
    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def answer_frames(self, frames: list[bytes]) -> None:
        self.frames += frames


def test_hold_answer_writes_a_raw_sends_frame_once_a_majority_has_its_entry(tmp_path) -> None:
    """The raw sends' hold (send_raw, a run's singles) in DLedger mode: the answer frame once
    the entry is committed, whatever WAIT says (Java's DLedgerCommitLog); a put whose entry
    is not known (or failed) is answered with its outcome's status instead."""

    async def main() -> None:
        config = dledger_config(str(tmp_path), free_port())
        async with running_store(config, clock_ms=lambda: NOW, **kwargs(config)) as store:  # type: ignore[arg-type]
            await leading(store)
            _prime(store)
            late_of = lambda r: b"late:" + r.status.name.encode()  # noqa: E731
            for wait in ("false", None):
                sink = _Sink()
                out = _fast(store, b"m", _single_header("TAGS\x01t"))
                assert out is not None
                assert store.hold_answer(out[0], wait, sink, b"frame", late_of)
                await trio.testing.wait_all_tasks_blocked()
                assert sink.frames == [b"frame"]
                # taken: asked again, the entry is unknown
                sink = _Sink()
                assert store.hold_answer(out[0], wait, sink, b"frame", late_of)
                assert sink.frames == [b"late:UNKNOWN_ERROR"]

    trio.run(main)
