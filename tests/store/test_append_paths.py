"""Stored messages one at a time and as a batch (``CommitLog.append_stored``, a run of stored
messages through the one record encoder, ``encode_run``): whichever way a message goes, the
commit log holds the same bytes, the messages the same stored fields and reput the same dispatch
hints, and those bytes are what the record codec's :func:`~pymq.store.commitlog.encode_record`
makes of the stored message.  Each test runs with the C encoder (where built) and its Python
twin."""

from __future__ import annotations

import attrs
import pytest

from pymq.common.message_ext import MessageExt, MessageSysFlag, properties_bytes
from pymq.common.native import load_native
from pymq.common.topic import SCHEDULE_TOPIC
from pymq.store import commitlog as commitlog_module
from pymq.store.commitlog import CommitLog, DispatchHint, encode_record, encode_run_py

_C = load_native("pymq.store._commitlogc")
ENCODERS = [pytest.param(encode_run_py, id="python")]
if _C is not None:
    ENCODERS.append(pytest.param(_C.encode_run, id="c"))


@pytest.fixture(autouse=True, params=ENCODERS)
def encoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The commit log's encoder: the C function, then its twin."""
    monkeypatch.setattr(commitlog_module, "encode_run", request.param)


NOW = 1_700_000_000_123


def _messages() -> list[MessageExt]:
    return [
        MessageExt(topic="T", body=b"a" * 10, properties={"TAGS": "x", "KEYS": "k1 k2"}),
        MessageExt(topic="T", body=b"", queue_id=1, flag=7, born_host=("10.1.2.3", 99)),
        MessageExt(
            topic="U",
            body=b"b" * 300,
            born_host=("::1", 5),
            born_timestamp=42,
            properties={"UNIQ_KEY": "ABC", "TAGS": "y"},
        ),
        MessageExt(
            topic="T",
            body=b"c",
            sys_flag=MessageSysFlag.TRANSACTION_PREPARED_TYPE,
            reconsume_times=3,
            prepared_transaction_offset=77,
        ),
        MessageExt(topic=SCHEDULE_TOPIC, body=b"d", properties={"DELAY": "3"}),
        MessageExt(topic="T", body=b"e", properties={"TAGS": "x"}),
    ]


def _log(tmp_path, name: str, store_ip: str = "192.168.0.7") -> CommitLog:
    cl = CommitLog(str(tmp_path / name), 64 * 1024, clock_ms=lambda: NOW)
    cl.set_store_host(store_ip, 10911)
    return cl


def _encoded(msg: MessageExt) -> tuple[bytes, bytes]:
    return msg.topic.encode(), properties_bytes(msg.properties)


def _stored(msg: MessageExt) -> tuple:
    return (
        msg.sys_flag,
        msg.queue_offset,
        msg.commitlog_offset,
        msg.store_timestamp,
        msg.store_size,
    )


def test_single_and_batch_appends_write_identical_records(tmp_path):
    for store_ip in ("192.168.0.7", "fe80::1"):
        single, batch = (_log(tmp_path, f"{n}-{store_ip}", store_ip) for n in "ab")
        a, c = _messages(), _messages()
        for msg in a:
            assert single.append_stored([msg], [_encoded(msg)]).status.name == "PUT_OK"
        assert batch.append_stored(c, [_encoded(m) for m in c]).status.name == "PUT_OK"
        data = single.get_data(0)
        assert data and data == batch.get_data(0)
        assert [_stored(m) for m in a] == [_stored(m) for m in c]
        hints = list(single.dispatch_hints)
        assert hints == list(batch.dispatch_hints)
        assert all(type(h) is DispatchHint for h in hints)
        # Every record is the codec's encoding of the stored message (STOREHOST: the log's) ...
        assert data == b"".join(
            encode_record(attrs.evolve(m, store_host=single.store_host)) for m in a
        )
        # ... and every hint (none for SCHEDULE_TOPIC) says what the message says.
        want = [
            DispatchHint(
                m.commitlog_offset,
                m.store_size,
                m.topic,
                m.queue_id,
                m.queue_offset,
                m.properties.get("TAGS"),
                NOW,
                m.sys_flag,
                m.properties.get("KEYS"),
                m.properties.get("UNIQ_KEY"),
            )
            for m in a
            if m.topic != SCHEDULE_TOPIC
        ]
        assert hints == want
        for cl in (single, batch):
            cl.close()


def test_dispatch_hint_field_order_is_what_reput_unpacks() -> None:
    """reput unpacks a hint positionally on its hot loop: a reordered or added field must be
    caught here, not by misfiled consume-queue entries."""
    from pymq.store.commitlog import DispatchHint

    assert DispatchHint._fields == (
        "physical_offset",
        "size",
        "topic",
        "queue_id",
        "queue_offset",
        "tags",
        "store_timestamp",
        "sys_flag",
        "keys",
        "uniq_key",
    )
