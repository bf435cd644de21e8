"""LocalFileOffsetStore: the file's path and shape (Java's OffsetSerializeWrapper in fastjson's
form), atomic writes with a .bak, and reading back (a corrupt file falls back to its .bak)."""

from __future__ import annotations

import os

import pytest

from pymq.client import MessageModel, PushConsumer
from pymq.client.offset_store import (
    DEFAULT_DIR,
    LocalFileOffsetStore,
    decode_offsets,
    encode_offsets,
    offsets_path,
)
from pymq.common.consumer import MessageQueue

Q0 = MessageQueue("T", "broker-a", 0)
Q1 = MessageQueue("T", "broker-a", 1)

# A file in the pretty-printed form Java's LocalFileOffsetStore writes
# (OffsetSerializeWrapper.toJson(true): fastjson's PrettyFormat, tabs and newlines between the
# tokens, the map keyed by the MessageQueue object).
JAVA_PRETTY = b"""{
\t"offsetTable":{{
\t\t\t"brokerName":"broker-a",
\t\t\t"queueId":1,
\t\t\t"topic":"T"
\t\t}:17,{
\t\t\t"brokerName":"broker-a",
\t\t\t"queueId":0,
\t\t\t"topic":"T"
\t\t}:42
\t}
}"""


def test_path_and_default_dir_as_java() -> None:
    home = os.path.expanduser("~")
    assert os.path.join(home, ".rocketmq_offsets") == DEFAULT_DIR
    assert offsets_path("/d", "10.0.0.1@inst", "G") == "/d/10.0.0.1@inst/G/offsets.json"


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "a/b", "a\\b", "a\0b", "é" * 128])
def test_names_that_would_leave_the_directory_are_refused(name: str) -> None:
    with pytest.raises(ValueError):
        offsets_path("/d", name, "G")
    with pytest.raises(ValueError):
        offsets_path("/d", "127.0.0.1@i", name)

    async def handler(msgs: list) -> bool:
        return True

    broadcasting = MessageModel.BROADCASTING
    with pytest.raises(ValueError):
        PushConsumer(name, "127.0.0.1:9876", handler, message_model=broadcasting)
    with pytest.raises(ValueError):
        PushConsumer("G", "127.0.0.1:9876", handler, message_model=broadcasting, instance_name=name)


def test_shape_is_offset_serialize_wrapper_keyed_by_queue() -> None:
    data = encode_offsets({Q1: 17, Q0: 42})
    assert data == (
        b'{"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:42,'
        b'{"brokerName":"broker-a","queueId":1,"topic":"T"}:17}}'
    )
    assert decode_offsets(data) == {Q0: 42, Q1: 17}
    assert decode_offsets(JAVA_PRETTY) == {Q0: 42, Q1: 17}
    assert decode_offsets(b"{}") == {}


@pytest.mark.parametrize(
    "bad",
    [
        b"[1]",
        b'{"offsetTable":[1]}',
        b'{"offsetTable":{"T":1}}',
        b'{"offsetTable":{{"topic":"T","queueId":0}:1}}',  # no brokerName
        b'{"offsetTable":{{"brokerName":"b","queueId":"x","topic":"T"}:1}}',
        b'{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:"1"}}',
        b'{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:true}}',
        b'{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:',
    ],
)
def test_not_an_offsets_file_is_refused(bad: bytes) -> None:
    with pytest.raises(ValueError):
        decode_offsets(bad)


async def test_persist_atomically_keeps_bak_and_load_falls_back(tmp_path) -> None:
    store = LocalFileOffsetStore(str(tmp_path), "127.0.0.1@i", "G")
    store.load()  # no file yet: empty
    assert store.table == {} and store.read(Q0) == -1
    await store.persist({Q0: 3})
    await store.persist({Q1: 9})  # merged with what was recorded before
    with open(store.path, "rb") as f:
        assert decode_offsets(f.read()) == {Q0: 3, Q1: 9}
    with open(store.path + ".bak", "rb") as f:
        assert decode_offsets(f.read()) == {Q0: 3}
    assert not os.path.exists(store.path + ".tmp")

    again = LocalFileOffsetStore(str(tmp_path), "127.0.0.1@i", "G")
    again.load()
    assert again.read(Q1) == 9
    # A torn or empty file: its .bak is read instead.
    for damaged in (b'{"offsetTable":{{"brokerName"', b""):
        with open(store.path, "wb") as f:
            f.write(damaged)
        fallback = LocalFileOffsetStore(str(tmp_path), "127.0.0.1@i", "G")
        fallback.load()
        assert fallback.table == {Q0: 3}
    # Neither readable: refused, not an empty table.
    with open(store.path + ".bak", "wb") as f:
        f.write(b"garbage")
    with pytest.raises(ValueError, match="cannot load"):
        LocalFileOffsetStore(str(tmp_path), "127.0.0.1@i", "G").load()
