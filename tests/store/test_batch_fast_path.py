"""The one-call puts (``DefaultMessageStore.put_now`` of a ``BatchBody`` or ``SingleSend``,
``_commitlogc.encode_run``, or its twin) write what the general path writes for the same request:
``SendProcessor._batch_messages`` decoding the items into messages with the broker's stored
properties, then ``put_now`` of the decoded messages.  Same commit-log bytes, answer, queue
offsets, dispatch hints and WAIT; and every case it leaves to the general path changes nothing."""

from __future__ import annotations

import os
import types
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pymq.broker.processors.send import SendProcessor
from pymq.common.batch import (
    BATCH_ITEM_HEAD,
    BATCH_ITEM_MAGIC,
    BATCH_PROPS_LEN,
    BatchItem,
    encode_batch_body,
)
from pymq.common.message_ext import MessageSysFlag
from pymq.common.record import decode_records
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode
from pymq.remoting.headers import SendMessageRequestHeader
from pymq.store import DefaultMessageStore, PutMessageStatus, commitlog
from pymq.store.commitlog import DispatchHint
from pymq.store.results import BatchBody, SingleSend
from tests.helpers import c_functions
from tests.store.helpers import running_store, small_config

native_extension = c_functions()  # the C module (its leak test), None under PYMQ_PURE_PYTHON=1

NOW = 1_800_000_000_123


@pytest.fixture(autouse=True, scope="module", params=["pwrite", "map"])
def batch_write(request):
    """Every test with batches written by pwrite (CommitLog.append_run's way for large
    ones) and through the map (small ones)."""
    saved = commitlog.PWRITE_BATCH_MIN
    commitlog.PWRITE_BATCH_MIN = 0 if request.param == "pwrite" else 1 << 62
    yield request.param
    commitlog.PWRITE_BATCH_MIN = saved


TOPIC = "BatchTopic"
CLUSTER = "DefaultCluster"
BORN = ("10.0.0.9", 40123)


def _processor() -> SendProcessor:
    ctx = types.SimpleNamespace(
        broker_config=types.SimpleNamespace(broker_cluster_name=CLUSTER),
        store_host=("192.168.0.1", 10911),
    )
    return SendProcessor(ctx)  # type: ignore[arg-type]


def _header(sys_flag: int = 0, reconsume: int | None = None) -> SendMessageRequestHeader:
    return SendMessageRequestHeader(
        producer_group="P", topic=TOPIC, default_topic="TBW102", default_topic_queue_nums=4,
        queue_id=2, sys_flag=sys_flag, born_timestamp=NOW - 5, flag=0, properties=None,
        reconsume_times=reconsume, batch=True,
    )  # fmt: skip


def _decoded(body: bytes, header: SendMessageRequestHeader) -> Any:
    """What the general path makes of the send: its messages, or the refusal."""
    channel = types.SimpleNamespace(remote_address=f"{BORN[0]}:{BORN[1]}")
    if header.batch:
        req = RemotingCommand(int(RequestCode.SEND_BATCH_MESSAGE), body=body)
        return _processor()._batch_messages(channel, req, header, 2)  # type: ignore[arg-type]
    req = RemotingCommand(int(RequestCode.SEND_MESSAGE_V2), body=body)
    return _processor()._single_message(channel, req, header, 2)  # type: ignore[arg-type]


def _general(store: DefaultMessageStore, body: bytes, header: SendMessageRequestHeader):
    """The general path's put of the send (a batch when its header says so), and its WAIT."""
    msgs = _decoded(body, header)
    assert not isinstance(msgs, RemotingCommand), msgs.remark
    return store.put_now(msgs), (msgs[0] if header.batch else msgs).properties.get("WAIT")


def _fast(store: DefaultMessageStore, body: bytes, header: SendMessageRequestHeader):
    """The one-call put of the send (a batch when its header says so)."""
    if header.batch:
        return store.put_now(
            BatchBody(
                TOPIC,
                2,
                body,
                CLUSTER,
                header.sys_flag,
                header.born_timestamp,
                BORN,
                header.reconsume_times or 0,
            )
        )
    return store.put_now(SingleSend(
        TOPIC, 2, body, header.properties or "", header.flag, CLUSTER, header.sys_flag,
        header.born_timestamp, BORN, header.reconsume_times or 0,
    ))  # fmt: skip


def _state(store: DefaultMessageStore) -> tuple:
    cl = store.commitlog
    hints = list(cl.dispatch_hints)
    assert all(type(h) is DispatchHint for h in hints)  # read by name (reput)
    return (
        cl.get_data(0),
        dict(cl.topic_queue_table),
        hints,
        cl.queue.files[-1].wrote_position if cl.queue.files else 0,
    )


def _result(result) -> tuple:
    return (
        result.status,
        result.wrote_offset,
        result.wrote_bytes,
        result.msg_id,
        result.store_timestamp,
        result.logic_offset,
        result.msg_num,
    )


def _prime(store: DefaultMessageStore) -> None:
    """The topic known (its first put checks its name) and a first file made: the general
    path's work, which the fast path leaves to it."""
    store.reput.woken = True  # keep the hints where the test can read them
    result, _ = _general(store, encode_batch_body([BatchItem(b"first", 0, {})]), _header())
    assert result.status is PutMessageStatus.PUT_OK


async def _compare(tmp_path, sends: list[tuple[bytes, SendMessageRequestHeader, bool]]):
    """Each send (body, header, damaged: a batch when its header says so, else a single send)
    put by the fast path into one store and by the general path into another: the same answers,
    WAIT, stores and statistics after each.  A damaged send the fast path may leave to the
    general path (changing nothing); whatever it takes, the general path must store alike."""
    config = small_config(str(tmp_path / "fast")), small_config(str(tmp_path / "general"))
    async with (
        running_store(config[0], clock_ms=lambda: NOW) as fast,
        running_store(config[1], clock_ms=lambda: NOW) as general,
    ):
        for store in (fast, general):
            _prime(store)
        for body, header, damaged in sends:
            before = _state(fast)
            out = _fast(fast, body, header)
            if out is None and damaged:
                assert _state(fast) == before
                continue
            assert out is not None, f"the fast path left a plain send to Python: {header}"
            msgs = _decoded(body, header)
            assert not isinstance(msgs, RemotingCommand), f"fast took what Python refuses: {msgs}"
            expected, expected_wait = _general(general, body, header)
            assert out[0].status is PutMessageStatus.PUT_OK
            assert _result(out[0]) == _result(expected)
            assert out[1] == expected_wait
            assert _state(fast) == _state(general)
            assert (fast.put_message_times_total, fast.put_message_size_total) == (
                general.put_message_times_total,
                general.put_message_size_total,
            )


_NAME = st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", "WAIT", "a", "userKey", "x1"])
_VALUE = st.text(alphabet=st.characters(min_codepoint=3, max_codepoint=126), max_size=12)
_PROPS = st.dictionaries(_NAME, _VALUE, max_size=6)
_ITEM = st.builds(
    BatchItem,
    body=st.binary(max_size=300),
    flag=st.integers(-(2**31), 2**31 - 1),
    properties=_PROPS,
)


def _raw_item(body: bytes, props: bytes, flag: int = 0) -> bytes:
    """One batch item with its properties bytes as given (encode_batch_body normalises them)."""
    total = BATCH_ITEM_HEAD.size + len(body) + 2 + len(props)
    head = BATCH_ITEM_HEAD.pack(total, BATCH_ITEM_MAGIC, 0, flag, len(body))
    return head + body + BATCH_PROPS_LEN.pack(len(props)) + props


_PLAIN = encode_batch_body([BatchItem(b"body", 0, {"TAGS": "t"})])
_MANY = b"\x02".join(b"p%d\x01v" % i for i in range(40))


@pytest.mark.parametrize(
    ("why", "body", "sys_flag", "born"),
    [
        ("not ASCII", _raw_item(b"b", "TAGS\x01\u6807\u7b7e".encode()), 0, BORN),
        ("not UTF-8", _raw_item(b"b", b"TAGS\x01\xff"), 0, BORN),
        ("a NUL", _raw_item(b"b", b"TAGS\x01a\x00b"), 0, BORN),
        ("a name twice", _raw_item(b"b", b"TAGS\x01a\x02TAGS\x01b"), 0, BORN),
        ("its own CLUSTER", _raw_item(b"b", b"CLUSTER\x01other"), 0, BORN),
        ("a delay", _raw_item(b"b", b"DELAY\x013"), 0, BORN),
        ("a delay of 00", _raw_item(b"b", b"DELAY\x0100"), 0, BORN),
        (
            "too many properties",
            _raw_item(b"b", b"\x02".join(b"p%d\x01v" % i for i in range(40))),
            0,
            BORN,
        ),
        ("an empty batch", b"", 0, BORN),
        ("a cut item", _PLAIN[:-1], 0, BORN),
        ("a wrong total", b"\x00\x00\x00\x63" + _PLAIN[4:], 0, BORN),
        ("a transaction", _PLAIN, int(MessageSysFlag.TRANSACTION_PREPARED_TYPE), BORN),
        ("an IPv6 born host", _PLAIN, 0, ("::1", 5)),
        ("a born host that is no address", _PLAIN, 0, ("not an address", 5)),
    ],
)
def test_what_the_fast_path_leaves_to_python_changes_nothing(tmp_path, why, body, sys_flag, born):
    async def main() -> None:
        async with running_store(small_config(str(tmp_path)), clock_ms=lambda: NOW) as store:
            _prime(store)
            assert _fast(store, _PLAIN, _header()) is not None  # a plain batch goes fast
            before = _state(store)
            out = store.put_now(BatchBody(TOPIC, 2, body, CLUSTER, sys_flag, NOW, born, 0))
            assert out is None, why
            assert _state(store) == before

    trio.run(main)


def test_a_batch_past_the_allocated_blocks_or_the_file_end_goes_the_general_way(tmp_path):
    async def main() -> None:
        config = small_config(str(tmp_path))
        async with running_store(config, clock_ms=lambda: NOW) as store:
            _prime(store)
            big = encode_batch_body([BatchItem(b"x" * 3000, 0, {"TAGS": "t"})] * 4)
            files_before = len(store.commitlog.queue.files)
            went_general = 0
            for _ in range(2 * config.mapped_file_size_commit_log // len(big) + 2):
                out = _fast(store, big, _header())
                if out is None:  # the general path allocates, or rolls to a new file
                    went_general += 1
                    result, _ = _general(store, big, _header())
                else:
                    result, _ = out
                assert result.status is PutMessageStatus.PUT_OK
            assert went_general >= 2
            assert len(store.commitlog.queue.files) > files_before
            # Everything written reads back in order, each record whole.
            offsets = [h.queue_offset for h in store.commitlog.dispatch_hints]
            assert offsets == list(range(len(offsets)))

    trio.run(main)


def test_unknown_topic_or_a_refusing_store_goes_the_general_way(tmp_path):
    async def main() -> None:
        async with running_store(small_config(str(tmp_path)), clock_ms=lambda: NOW) as store:
            assert _fast(store, _PLAIN, _header()) is None  # no file, the topic not yet checked
            _prime(store)
            store.read_only = True
            assert _fast(store, _PLAIN, _header()) is None  # the general path words the refusal
            store.read_only = False
            assert _fast(store, _PLAIN, _header()) is not None

    trio.run(main)


@pytest.mark.skipif(native_extension is None, reason="the C code's references")
def test_no_reference_leaks_over_many_calls(tmp_path):
    import gc
    import mmap
    import sys

    encode = native_extension.encode_run
    buf = mmap.mmap(-1, 1 << 20)
    body = encode_batch_body(
        [BatchItem(b"x" * 100, 0, {"TAGS": "t", "KEYS": "a b", "UNIQ_KEY": "U", "WAIT": "no"})] * 4
    )
    topic = "LeakTopic"
    topics, table = {topic: b"LeakTopic"}, {}

    def once(data: bytes, limit: int = 1 << 20) -> object:
        return encode(
            buf, 0, limit, 0, [(topic, 0, data, None, 0, 0, 1, 0)], topics, table, lambda: 2,
            b"C", b"\x7f\x00\x00\x01", 9, b"\x7f\x00\x00\x01", 10911, 1 << 20, 0, "S", None,
        )  # fmt: skip

    for data, limit in ((body, 1 << 20), (body[:-1], 1 << 20), (body, 300)):
        once(data, limit)
        gc.collect()
        refs = sys.getrefcount(topic), sys.getrefcount(data), sys.getrefcount(None)
        blocks = sys.getallocatedblocks()
        for _ in range(2000):
            once(data, limit)
        gc.collect()
        # A leak per call would be thousands of blocks (rows, strings, tuples).
        assert sys.getallocatedblocks() - blocks < 200
        assert (sys.getrefcount(topic), sys.getrefcount(data)) == refs[:2]
        assert abs(sys.getrefcount(None) - refs[2]) < 200
    buf.close()


# --- single sends (put_now of a SingleSend, a run of one through encode_run) ------------------


def _single_header(props: str, flag: int = 0, sys_flag: int = 0, reconsume: int | None = None):
    return SendMessageRequestHeader(
        producer_group="P", topic=TOPIC, default_topic="TBW102", default_topic_queue_nums=4,
        queue_id=2, sys_flag=sys_flag, born_timestamp=NOW - 5, flag=flag, properties=props,
        reconsume_times=reconsume,
    )  # fmt: skip


def _props_text(props: dict[str, str]) -> str:
    return "\x02".join(f"{k}\x01{v}" for k, v in props.items())


def _damaged(items: list[BatchItem], flips: list[tuple[int, int]], cut: int) -> bytes:
    body = bytearray(encode_batch_body(items))
    for at, value in flips:
        body[at % len(body)] = value
    return bytes(body[: len(body) - cut])


_SEND = st.one_of(
    st.builds(lambda items, again: (encode_batch_body(items), _header(reconsume=again), False),
              st.lists(_ITEM, min_size=1, max_size=8), st.none() | st.integers(0, 16)),
    st.builds(lambda body, props, flag, reconsume: (
        body, _single_header(_props_text(props), flag, reconsume=reconsume), False),
        st.binary(max_size=300), _PROPS, st.integers(-(2**31), 2**31 - 1),
        st.none() | st.integers(0, 16)),
    st.builds(lambda *args: (_damaged(*args), _header(), True),
              st.lists(_ITEM, min_size=1, max_size=4),
              st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4),
              st.integers(0, 8)),
)  # fmt: skip


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sends=st.lists(_SEND, min_size=1, max_size=5))
def test_fast_and_general_paths_store_the_same(tmp_path_factory, sends):
    """Single sends, batches and damaged batches, interleaved: the one encoder's records are
    the general path's."""
    trio.run(_compare, tmp_path_factory.mktemp("sends"), sends)


def test_plain_cases_byte_for_byte(tmp_path):
    items = [
        BatchItem(b"x" * 1024, 0, {"UNIQ_KEY": "AC1", "TAGS": "TagA", "WAIT": "true"}),
        BatchItem(b"", 7, {"KEYS": "k1 k2", "WAIT": "TRUE"}),
        BatchItem(b"y", -1, {"WAIT": "false", "DELAY": "0", "a": "b\x01c"}),
        BatchItem(b"z", 0, {}),
    ]
    # Items without a name or a value are skipped (as Java's string2messageProperties skips
    # them), and a trailing separator is no item.
    skips = _raw_item(b"q", b"\x01v\x02n\x01\x02TAGS\x01tt\x02\x02") + _raw_item(b"r", b"\x02")
    sends = [
        (encode_batch_body(items), _header()), (encode_batch_body(items[:1]), _header(reconsume=3)),
        (encode_batch_body(items[1:]), _header()), (skips, _header()),
        (b"x" * 1024, _single_header("UNIQ_KEY\x01AC1\x02TAGS\x01TagA\x02WAIT\x01true")),
        (b"", _single_header("KEYS\x01k1 k2\x02WAIT\x01TRUE", flag=7, reconsume=2)),
        (b"y", _single_header("WAIT\x01false\x02a\x01b\x01c")), (b"z", _single_header("")),
        (b"q", _single_header("\x01v\x02n\x01\x02TAGS\x01tt\x02\x02")),
    ]  # fmt: skip
    trio.run(_compare, tmp_path, [(body, header, False) for body, header in sends])


@pytest.mark.parametrize(
    ("why", "props", "sys_flag", "born"),
    [
        ("not ASCII", "TAGS\x01\u6807\u7b7e", 0, BORN),
        ("a NUL", "TAGS\x01a\x00b", 0, BORN),
        ("a name twice", "TAGS\x01a\x02TAGS\x01b", 0, BORN),
        ("its own CLUSTER", "CLUSTER\x01other", 0, BORN),
        ("a delay", "DELAY\x013", 0, BORN),
        ("a delay of 0", "DELAY\x010", 0, BORN),
        ("a transaction's half", "TRAN_MSG\x01true", 0, BORN),
        ("a transaction's flag", "TAGS\x01t", int(MessageSysFlag.TRANSACTION_PREPARED_TYPE), BORN),
        ("an IPv6 born host", "TAGS\x01t", 0, ("::1", 5)),
        ("too many properties", _MANY.decode(), 0, BORN),
    ],
)
def test_what_the_single_fast_path_leaves_to_python_changes_nothing(
    tmp_path, why, props, sys_flag, born
):
    async def main() -> None:
        async with running_store(small_config(str(tmp_path)), clock_ms=lambda: NOW) as store:
            _prime(store)
            assert _fast(store, b"b", _single_header("TAGS\x01t")) is not None
            before = _state(store), store.put_message_times_total
            out = store.put_now(
                SingleSend(TOPIC, 2, b"b", props, 0, CLUSTER, sys_flag, NOW, born, 0)
            )
            assert out is None, why
            assert (_state(store), store.put_message_times_total) == before

    trio.run(main)


def test_single_sends_up_to_the_file_end_then_the_general_way(tmp_path):
    async def main() -> None:
        config = small_config(str(tmp_path))
        async with running_store(config, clock_ms=lambda: NOW) as store:
            _prime(store)
            header = _single_header("TAGS\x01t")
            went_general = 0
            for _ in range(2 * config.mapped_file_size_commit_log // 3000 + 2):
                out = _fast(store, b"x" * 3000, header)
                if out is None:
                    went_general += 1
                    result, _ = _general(store, b"x" * 3000, header)
                else:
                    result, _ = out
                assert result.status is PutMessageStatus.PUT_OK
            assert went_general >= 2
            offsets = [h.queue_offset for h in store.commitlog.dispatch_hints]
            assert offsets == list(range(len(offsets)))

    trio.run(main)


def test_a_failed_pwrite_changes_nothing(tmp_path, monkeypatch):
    """A batch whose pwrite fails (an I/O error) or falls short is left to the general path,
    having committed nothing."""
    monkeypatch.setattr(commitlog, "PWRITE_BATCH_MIN", 0)

    async def main() -> None:
        async with running_store(small_config(str(tmp_path)), clock_ms=lambda: NOW) as store:
            _prime(store)
            for failure in ("error", "short"):
                before = _state(store)

                def pwrite(fd: int, data, pos: int, failure=failure) -> int:
                    if failure == "error":
                        raise OSError(5, "Input/output error")
                    return len(data) - 1

                with monkeypatch.context() as patch:
                    patch.setattr(os, "pwrite", pwrite)
                    assert _fast(store, _PLAIN, _header()) is None
                assert _state(store) == before
            out = _fast(store, _PLAIN, _header())  # written, once pwrite works again
            assert out is not None and out[0].status is PutMessageStatus.PUT_OK

    trio.run(main)


def test_large_batches_are_written_with_pwrite(tmp_path, monkeypatch):
    """A batch of 32 messages of 1 KiB takes the pwrite path by default (PWRITE_BATCH_MIN),
    and its records read back through the map."""
    from pymq.store.mapped_file import MappedFile

    monkeypatch.setattr(commitlog, "PWRITE_BATCH_MIN", 16 * 1024)
    writes: list[int] = []
    real = MappedFile.write_at

    def write_at(self, pos, data):
        writes.append(len(data))
        return real(self, pos, data)

    monkeypatch.setattr(MappedFile, "write_at", write_at)

    async def main() -> None:
        config = small_config(str(tmp_path), mapped_file_size_commit_log=1 << 20)
        async with running_store(config, clock_ms=lambda: NOW) as store:
            _prime(store)
            body = encode_batch_body([BatchItem(b"m" * 1024, 0, {"TAGS": "t"})] * 32)
            out = _fast(store, body, _header())
            assert out is not None
            result = out[0]
            assert writes == [result.wrote_bytes] and result.msg_num == 32
            data = store.commitlog.get_message(result.wrote_offset, result.wrote_bytes)
            assert data is not None
            records = decode_records(data)
            assert [r.body for r in records] == [b"m" * 1024] * 32
            assert [r.queue_offset for r in records] == list(range(1, 33))
            small = encode_batch_body([BatchItem(b"s", 0, {})])
            assert _fast(store, small, _header()) is not None
            assert len(writes) == 1  # a small batch is written through the map

    trio.run(main)


@pytest.mark.parametrize(
    "bad",
    [
        encode_batch_body([BatchItem(b"B", 0, {"DELAY": "3"})]),  # refused: a delayed item
        _PLAIN[:-1],  # refused: a cut item
    ],
)
def test_a_refused_batch_leaves_no_record_a_restart_recovers(tmp_path, bad):
    """A batch whose first items the C code encodes before it meets one the general path
    refuses: the refused items must not come back as messages after a restart (found by
    helper-34: recovery scans whole records past the write position)."""
    config = small_config(str(tmp_path))
    body = encode_batch_body([BatchItem(b"A" * 100, 0, {"TAGS": "t"})] * 2) + bad

    async def main() -> None:
        async with running_store(config, clock_ms=lambda: NOW) as store:
            _prime(store)
            assert _fast(store, body, _header()) is None
            channel = types.SimpleNamespace(remote_address=f"{BORN[0]}:{BORN[1]}")
            req = RemotingCommand(int(RequestCode.SEND_BATCH_MESSAGE), body=body)
            refused = _processor()._batch_messages(channel, req, _header(), 2)  # type: ignore[arg-type]
            assert isinstance(refused, RemotingCommand)  # the general path refuses it
            end = store.commitlog.max_offset
        async with running_store(config, clock_ms=lambda: NOW) as store:
            assert store.commitlog.max_offset == end
            assert store.get_max_offset_in_queue(TOPIC, 2) == 1  # the first put's item only

    trio.run(main)


def test_a_refused_general_put_leaves_no_record_a_restart_recovers(tmp_path):
    """The general path refusing a batch at its third message (a field the encoder cannot
    write) after encoding two: a restart recovers none of them, even once a later record ends
    where a refused one began."""
    from tests.store.helpers import make_message

    config = small_config(str(tmp_path))

    async def main() -> None:
        async with running_store(config, clock_ms=lambda: NOW) as store:
            first = store.put_now(make_message("T", 0, body=b"kept"))
            assert first.status is PutMessageStatus.PUT_OK
            msgs = [make_message("T", 0, body=b"x" * 50) for _ in range(2)]
            bad = make_message("T", 0, body=b"y")
            bad.reconsume_times = 2**40  # the encoder refuses it, after the first two
            msgs.append(bad)
            refused = store.put_now(msgs)
            assert refused.status is not PutMessageStatus.PUT_OK
            # A record as long as the first refused one lands where it began: the second
            # refused record would follow it, whole, if nothing had zeroed it.
            again = store.put_now(make_message("T", 0, body=b"x" * 50))
            assert again.status is PutMessageStatus.PUT_OK
            end = store.commitlog.max_offset
        async with running_store(config, clock_ms=lambda: NOW) as store:
            assert store.commitlog.max_offset == end
            assert store.get_max_offset_in_queue("T", 0) == 2

    trio.run(main)
