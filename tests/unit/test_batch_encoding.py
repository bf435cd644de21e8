"""The producer's batch body (``producer._batch_body_py``, and the C writer send_batch tries
first) and a message's properties text (``Producer._encode``) against the reference writers
(what the producer did before), and
``UniqueIdGenerator.create`` and ``create_many`` against the id layout."""

from __future__ import annotations

import datetime
import struct
import zlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pymq.client import producer as producer_module
from pymq.client.producer import (
    COMPRESS_LEVEL,
    COMPRESS_OVER,
    Message,
    Producer,
    _batch_body_py,
)
from pymq.common.batch import BatchItem, decode_batch_body, encode_batch_body
from pymq.common.message_ext import (
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    PROPERTY_WAIT_STORE_MSG_OK,
    MessageSysFlag,
    encode_properties,
)
from pymq.common.message_id import UniqueIdGenerator
from tests.helpers import implementations


def reference(msgs: list[Message], ids: list[str]) -> bytes:
    """What send_batch wrote before _batch_body_py: an item per message, its properties dict
    with the unique id and WAIT=true set last."""
    items = []
    for msg, uniq in zip(msgs, ids, strict=True):
        props = msg.all_properties()
        props[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = uniq
        props[PROPERTY_WAIT_STORE_MSG_OK] = "true"
        items.append(BatchItem(msg.body, msg.flag, props))
    return encode_batch_body(items)


_text = st.text(
    st.characters(blacklist_characters="\x00\x01\x02", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=12,
)
_props = st.dictionaries(
    st.one_of(
        _text,
        st.sampled_from(
            [PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, PROPERTY_WAIT_STORE_MSG_OK, "TAGS", "KEYS"]
        ),
    ),
    _text,
    max_size=4,
)
_messages = st.builds(
    Message,
    topic=st.just("T"),
    body=st.binary(max_size=40),
    tags=st.none() | _text,
    keys=st.none() | _text | st.lists(_text, max_size=3),
    properties=_props,
    flag=st.integers(-(2**31), 2**31 - 1),
)


_plain = st.builds(
    Message,
    topic=st.just("T"),
    body=st.binary(max_size=40),
    tags=st.none() | st.just("") | _text,
    keys=st.none() | st.just(""),
    flag=st.integers(-(2**31), 2**31 - 1),
    delay_level=st.just(0),
)
WRITERS = pytest.mark.parametrize(
    "native_batch_body",
    implementations("pymq.client._producerc", "batch_body", producer_module.batch_body_py),
)  # C's and its twin (the twin alone under PYMQ_PURE_PYTHON=1)


@WRITERS
@given(st.lists(_messages | _plain, max_size=8), st.booleans())
def test_batch_body_is_the_reference_writers(
    native_batch_body: Any, msgs: list[Message], as_tuple: bool
) -> None:
    """_batch_body_py writes what the reference writes, leaving the messages as they were;
    the picked writer (C, or its twin) writes the same of plain messages (only tags, flag
    and body of their own), and declines (None) or writes the same of the others."""
    ids = UniqueIdGenerator("10.1.2.3", pid=7).create_many(len(msgs))
    before = [dict(m.properties) for m in msgs]
    body = _batch_body_py(msgs, ids)
    assert body == reference(msgs, ids)
    assert [m.properties for m in msgs] == before  # the messages are left as they were
    for item, uniq in zip(decode_batch_body(body), ids, strict=True):
        assert item.properties[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] == uniq
        assert item.properties[PROPERTY_WAIT_STORE_MSG_OK] == "true"
    native = native_batch_body(Message, tuple(msgs) if as_tuple else msgs, ids)
    assert native in (None, body)
    assert native is not None or any(m.keys not in (None, "") or m.properties for m in msgs)
    assert native_batch_body(Message, msgs, ids, "T") == native  # all of the batch's topic


@WRITERS
def test_the_c_batch_body_leaves_what_is_not_plain_to_python(native_batch_body: Any) -> None:
    ids = ["A" * 32, "B" * 32]
    ok = Message("T", b"x", tags="t")

    class Sub(Message):
        pass

    others = [
        Message("T", b"x", keys="k"),
        Message("T", b"x", keys=["k"]),
        Message("T", b"x", properties={"a": "b"}),
        Message("T", b"x", delay_level=2),
        Message("T", b"x", delay_level=-1),  # send_batch refuses it
        Message("T", bytearray(b"x")),  # type: ignore[arg-type]
        Message("T", b"x", tags=b"t"),  # type: ignore[arg-type]
        Message("T", b"x", flag=2**31),
        Message("T", b"x", flag=True),
        Message("T", b"x", tags="\ud800"),  # a lone surrogate: the Python writer raises
        Message("T", b"x", tags="t" * 40000),  # properties past int16: the Python writer raises
        Sub("T", b"x"),
    ]
    for other in others:
        assert native_batch_body(Message, [ok, other], ids) is None, other
        assert native_batch_body(Message, [ok, other], ids, "T") is None, other
    # Of another topic than the batch's: left to send_batch's checks, which refuse it.
    assert native_batch_body(Message, [ok, Message("U", b"x")], ids, "T") is None
    assert native_batch_body(Message, [ok, Message("U", b"x")], ids) is not None
    with pytest.raises(TypeError, match="topic must be a str"):
        native_batch_body(Message, [ok, ok], ids, b"T")
    with pytest.raises(TypeError):
        native_batch_body("Message", [ok, ok], ids)  # no class
    with pytest.raises(TypeError):
        native_batch_body(Message, [ok, ok], tuple(ids))  # ids not a list
    assert native_batch_body(Message, [ok, ok], ["A" * 32, "\u00e9" * 32]) is None
    assert native_batch_body(Message, iter([ok, ok]), ids) is None
    # What the C writer declines, the Python writer still writes (or refuses).
    assert _batch_body_py([ok, Message("T", b"y", keys="k")], ids) == reference(
        [ok, Message("T", b"y", keys="k")], ids
    )
    with pytest.raises(UnicodeEncodeError):
        _batch_body_py([ok, Message("T", b"x", tags="\ud800")], ids)
    with pytest.raises(struct.error):
        _batch_body_py([ok, Message("T", b"x", flag=2**31)], ids)
    with pytest.raises(ValueError, match="2 messages but 1 ids"):
        native_batch_body(Message, [ok, ok], ids[:1])
    with pytest.raises(ValueError):
        _batch_body_py([ok, ok], ids[:1])


async def test_send_batch_refuses_mixed_topics_and_delays_before_sending() -> None:
    """Refused before anything is sent (the producer is not even started)."""
    producer = Producer("P", "127.0.0.1:1")
    with pytest.raises(ValueError, match="an empty batch"):
        await producer.send_batch([])
    with pytest.raises(ValueError, match="same topic"):
        await producer.send_batch([Message("T", b"a"), Message("U", b"b")])
    for delay in (2, -1):
        with pytest.raises(ValueError, match="delayed messages cannot be batched"):
            await producer.send_batch([Message("T", b"a"), Message("T", b"b", delay_level=delay)])


def test_batch_body_golden() -> None:
    msgs = [Message("T", b"abc", tags="x", flag=1), Message("T", b"")]
    body = _batch_body_py(msgs, ["A" * 32, "B" * 32])
    first_props = b"TAGS\x01x\x02UNIQ_KEY\x01" + b"A" * 32 + b"\x02WAIT\x01true"
    second_props = b"UNIQ_KEY\x01" + b"B" * 32 + b"\x02WAIT\x01true"
    want = struct.pack(">iiiii", 20 + 3 + 2 + len(first_props), 0, 0, 1, 3) + b"abc"
    want += struct.pack(">h", len(first_props)) + first_props
    want += struct.pack(">iiiii", 20 + 2 + len(second_props), 0, 0, 0, 0)
    want += struct.pack(">h", len(second_props)) + second_props
    assert body == want


def counter_of(uniq: str) -> int:
    return int(uniq[28:], 16)


def test_create_many_is_create_at_one_moment() -> None:
    gen = UniqueIdGenerator("10.1.2.3", pid=77)
    now = 1_700_000_000_000
    before = gen.create(now)
    many = gen.create_many(3, now)
    after = gen.create(now)
    assert [u[:28] for u in many] == [before[:28]] * 3  # ip, pid, "class loader", time
    assert [counter_of(u) for u in [*many, after]] == [
        (counter_of(before) + i) & 0xFFFF for i in range(1, 5)
    ]
    assert all(len(u) == 32 and u == u.upper() for u in many)
    assert gen.create_many(0, now) == []


def test_create_many_late_in_a_month() -> None:
    """The milliseconds since the month began, past 2**31 from the 25th on, wrap as
    :meth:`create` wraps them."""
    now_ms = int(datetime.datetime(2026, 10, 27, 23, 59, 59, 999).timestamp() * 1000)
    gen = UniqueIdGenerator("10.1.2.3", pid=77)
    (uniq,) = gen.create_many(1, now_ms)
    span = struct.unpack(">I", bytes.fromhex(uniq[20:28]))[0]
    assert gen.begin_of_month_ms + span == now_ms
    assert uniq[:28] == gen.create(now_ms)[:28]


def test_create_heads_follow_the_clock_across_milliseconds_and_months() -> None:
    """create keeps an id's head for its millisecond: ids made at other moments, the next
    month's included, carry their own time, and the counter runs on."""
    gen = UniqueIdGenerator("10.1.2.3", pid=77)
    month = int(datetime.datetime(2026, 11, 1).timestamp() * 1000)
    moments = [month - 2, month - 2, month - 1, month, month, month + 5, month - 1]
    ids = [gen.create(now) for now in moments]
    for uniq, now in zip(ids, moments, strict=True):
        start = int(
            datetime.datetime.fromtimestamp(now / 1000)
            .replace(day=1, hour=0, minute=0, second=0, microsecond=0)
            .timestamp()
            * 1000
        )
        assert struct.unpack(">I", bytes.fromhex(uniq[20:28]))[0] == (now - start) & 0xFFFFFFFF
        assert uniq[:20] == ids[0][:20]
    first = counter_of(ids[0])
    assert [counter_of(u) for u in ids] == [(first + i) & 0xFFFF for i in range(len(ids))]


def _encode_reference(msg: Message, uniq: str) -> str:
    """The properties text Producer._encode wrote before its common-message shortcut."""
    props = msg.all_properties()
    props[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = (
        props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or uniq
    )
    props.setdefault(PROPERTY_WAIT_STORE_MSG_OK, "true")
    return encode_properties(props)


@given(
    _messages,
    st.integers(0, 3),
    st.sampled_from([b"", b"x" * 10, b"y" * (COMPRESS_OVER + 1)]),
)
def test_encode_writes_the_reference_properties(msg: Message, delay: int, body: bytes) -> None:
    msg.delay_level = delay
    msg.body = body
    producer = Producer("g", "127.0.0.1:9876")
    before = dict(msg.properties)
    out_body, sys_flag, text, uniq = producer._encode(msg)
    assert text == _encode_reference(msg, uniq)
    assert msg.properties == before
    compressed = len(body) >= COMPRESS_OVER
    assert bool(sys_flag & MessageSysFlag.COMPRESSED_FLAG) == compressed
    assert out_body == (zlib.compress(body, COMPRESS_LEVEL) if compressed else body)
    if msg.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX):
        assert uniq == msg.properties[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX]
    else:
        assert len(uniq) == 32


def test_create_many_runs_across_byte_and_counter_wraps() -> None:
    """create_many writes the counter a byte at a time in runs: runs that cross a high byte's
    end, and the counter's wrap at 0xFFFF, give what create gives for each value."""
    import itertools

    now = 1_700_000_000_000
    for start, count in [(0xFFF0, 40), (0x12F5, 300), (0x00FF, 2), (7, 1), (0xFFFF, 600)]:
        gen = UniqueIdGenerator("10.1.2.3", pid=77)
        gen._counter = itertools.count(start)
        many = gen.create_many(count, now)
        twin = UniqueIdGenerator("10.1.2.3", pid=77)
        twin._prefix = gen._prefix  # the same "class loader" bytes
        twin._counter = itertools.count(start)
        assert many == [twin.create(now) for _ in range(count)], (start, count)
        assert counter_of(gen.create(now)) == (start + count) & 0xFFFF  # the counter ran on


async def test_send_batch_takes_a_topic_that_is_a_str_subclass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A topic given as a str subclass (an enum.StrEnum member, say) is a str: send_batch
    sends it as send() does (the batch writer may decline it, not raise)."""
    import enum

    class Topics(enum.StrEnum):
        ORDERS = "Orders"

    sent: list[bytes] = []

    async def fake_send_request(topic, code, body, *args, **kwargs):  # type: ignore[no-untyped-def]
        sent.append(body)
        return None

    producer = Producer("P", "127.0.0.1:1")
    monkeypatch.setattr(producer, "_send_request", fake_send_request)
    msgs = [Message(Topics.ORDERS, b"a"), Message(Topics.ORDERS, b"b", tags="t")]
    await producer.send_batch(msgs)
    assert [item.body for item in decode_batch_body(sent[0])] == [b"a", b"b"]
