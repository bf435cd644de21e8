"""proxy.convert.stored_form: a 5.x message as the send path stores it (RocketMQ 5's proxy's
mapping and checks), field by field and refusal by refusal."""

from __future__ import annotations

from typing import Any

import pytest

from pymq.common.message_ext import MessageExt, MessageSysFlag
from pymq.proxy.convert import (
    MAX_MESSAGE_GROUP_SIZE,
    MAX_USER_PROPERTY_SIZE,
    USER_PROPERTY_MAX_NUM,
    MessageRefused,
    stored_form,
    to_grpc_message,
)
from pymq.proxy.schema import Code, MessageType, definition

NOW = 1_700_000_000_000


def message(**system: Any) -> Any:
    msg = definition.Message()
    msg.topic.name = "T"
    msg.body = b"body"
    msg.system_properties.message_id = "01ABCDEF"
    for name, value in system.items():
        if name == "keys":
            msg.system_properties.keys.extend(value)
        elif name == "user":
            for key, prop in value.items():
                msg.user_properties[key] = prop
        elif name in ("born_timestamp", "delivery_timestamp"):
            getattr(msg.system_properties, name).FromMilliseconds(value)
        elif name == "recovery_seconds":
            msg.system_properties.orphaned_transaction_recovery_duration.seconds = value
        elif name == "body":
            msg.body = value
        else:
            setattr(msg.system_properties, name, value)
    return msg


def form(msg: Any, **limits: Any) -> Any:
    return stored_form(
        msg,
        "T",
        peer="10.0.0.9:4321",
        max_body_size=limits.get("max_body_size", 1024),
        max_delay_ms=limits.get("max_delay_ms", 86_400_000),
        now_ms=NOW,
    )


def test_a_plain_message_maps_to_the_proxys_properties_in_order() -> None:
    stored = form(message())
    assert list(stored.properties.items()) == [
        ("UNIQ_KEY", "01ABCDEF"),
        ("RECONSUME_TIME", "0"),
        ("PGROUP", "T"),
        ("__BORNHOST", "10.0.0.9:4321"),  # no born host given: the peer's address
        ("BORN_TIMESTAMP", str(NOW)),  # none given: now
    ]
    assert (stored.body, stored.sys_flag, stored.born_timestamp) == (b"body", 0, NOW)
    assert (stored.reconsume_times, stored.message_type, stored.message_group) == (0, "NORMAL", "")


def test_every_field_maps_in_the_proxys_order() -> None:
    msg = message(
        user={"color": "blue", "n": "7"},
        tag="TagA",
        keys=["k1", "k2"],
        message_type=MessageType.TRANSACTION,
        recovery_seconds=30,
        delivery_timestamp=NOW + 5000,
        delivery_attempt=3,
        message_group="g",
        trace_context="00-abc-01",
        born_host=" 10.1.1.1 ",
        born_timestamp=NOW - 1000,
        body_encoding=definition.Encoding.GZIP,
    )
    stored = form(msg)
    items = list(stored.properties.items())
    # The user properties first, in the map's order (protobuf's, not the sender's).
    assert sorted(items[:2]) == [("color", "blue"), ("n", "7")]
    assert items[2:] == [
        ("TAGS", "TagA"),
        ("KEYS", "k1 k2"),
        ("UNIQ_KEY", "01ABCDEF"),
        ("TRAN_MSG", "true"),
        ("CHECK_IMMUNITY_TIME_IN_SECONDS", "30"),
        ("TIMER_DELIVER_MS", str(NOW + 5000)),
        ("RECONSUME_TIME", "3"),
        ("PGROUP", "T"),
        ("__SHARDINGKEY", "g"),
        ("TRACE_CONTEXT", "00-abc-01"),
        ("__BORNHOST", "10.1.1.1"),
        ("BORN_TIMESTAMP", str(NOW - 1000)),
    ]
    flags = MessageSysFlag.COMPRESSED_FLAG | MessageSysFlag.TRANSACTION_PREPARED_TYPE
    assert stored.sys_flag == flags
    assert (stored.born_timestamp, stored.reconsume_times) == (NOW - 1000, 3)
    assert (stored.message_type, stored.message_group) == ("TRANSACTION", "g")
    assert form(message(message_group="g")).message_type == "FIFO"
    assert form(message(delivery_timestamp=NOW + 1)).message_type == "DELAY"
    # Characters past DEL (not control characters by the proxy's check) are taken.
    assert form(message(tag="caf\u00e9\u0085")).properties["TAGS"] == "caf\u00e9\u0085"


@pytest.mark.parametrize(
    ("fields", "code", "text"),
    [
        ({"body": b""}, Code.MESSAGE_BODY_EMPTY, "body cannot be empty"),
        ({"body": b"x" * 1025}, Code.MESSAGE_BODY_TOO_LARGE, "cannot exceed the max 1024"),
        (
            {"user": {f"k{i}": "v" for i in range(USER_PROPERTY_MAX_NUM + 1)}},
            Code.MESSAGE_PROPERTIES_TOO_LARGE,
            "too many user properties",
        ),
        ({"user": {"TAGS": "x"}}, Code.ILLEGAL_MESSAGE_PROPERTY_KEY, "used by system: TAGS"),
        ({"user": {"a\x00": "x"}}, Code.ILLEGAL_MESSAGE_PROPERTY_KEY, "key of property"),
        ({"user": {"a": "x\x7f"}}, Code.ILLEGAL_MESSAGE_PROPERTY_KEY, "value of property"),
        (
            {"user": {"a": "x" * MAX_USER_PROPERTY_SIZE}},
            Code.MESSAGE_PROPERTIES_TOO_LARGE,
            "total size of user property",
        ),
        (
            {"user": {"a": "x" * (MAX_USER_PROPERTY_SIZE - 3)}, "tag": "ttt"},
            Code.MESSAGE_PROPERTIES_TOO_LARGE,
            "total size of user property",
        ),
        ({"tag": " \t"}, Code.ILLEGAL_MESSAGE_TAG, "whitespace"),
        ({"tag": "a|b"}, Code.ILLEGAL_MESSAGE_TAG, "cannot contain '|'"),
        ({"tag": "a\x1fb"}, Code.ILLEGAL_MESSAGE_TAG, "control character"),
        ({"keys": ["ok", " "]}, Code.ILLEGAL_MESSAGE_KEY, "whitespace"),
        ({"keys": ["a\nb"]}, Code.ILLEGAL_MESSAGE_KEY, "control character"),
        (  # empty keys, each stored as its separator: not walked past the size they take
            {"keys": [""] * (MAX_USER_PROPERTY_SIZE + 1)},
            Code.MESSAGE_PROPERTIES_TOO_LARGE,
            "total size of user property",
        ),
        (
            {"keys": ["k" * 1024] * 17},
            Code.MESSAGE_PROPERTIES_TOO_LARGE,
            "total size of user property",
        ),
        ({"message_id": " "}, Code.ILLEGAL_MESSAGE_ID, "message id cannot be empty"),
        (
            {"delivery_timestamp": NOW + 86_400_001},
            Code.ILLEGAL_DELIVERY_TIME,
            "max delay time",
        ),
        ({"message_group": "  "}, Code.ILLEGAL_MESSAGE_GROUP, "whitespace"),
        (
            {"message_group": "g" * MAX_MESSAGE_GROUP_SIZE},
            Code.ILLEGAL_MESSAGE_GROUP,
            "exceed the max size",
        ),
        ({"message_group": "g\x01"}, Code.ILLEGAL_MESSAGE_GROUP, "control character"),
    ],
)
def test_each_refusal_has_the_proxys_code_and_text(fields: dict, code: int, text: str) -> None:
    with pytest.raises(MessageRefused) as refused:
        form(message(**fields))
    assert refused.value.code == code
    assert text in refused.value.message


def test_the_limits_themselves_are_taken() -> None:
    user = {f"k{i}": "v" for i in range(USER_PROPERTY_MAX_NUM)}
    assert len(form(message(user=user)).properties) == USER_PROPERTY_MAX_NUM + 5
    full = {"a": "x" * (MAX_USER_PROPERTY_SIZE - 3)}
    assert form(message(user=full, tag="tt"))  # exactly the limit
    assert form(message(message_group="g" * (MAX_MESSAGE_GROUP_SIZE - 1))).message_group
    assert form(message(body=b"x" * 1024)).body == b"x" * 1024
    keys = [""] * MAX_USER_PROPERTY_SIZE
    assert form(message(keys=keys)).properties["KEYS"] == " " * (MAX_USER_PROPERTY_SIZE - 1)


@pytest.mark.parametrize("invisible_ms", [0, 10_000, 30_500, 43_200_000])
def test_a_stored_message_maps_back_as_it_was_sent(invisible_ms: int) -> None:
    """to_grpc_message of what stored_form stored: the sender's fields, and the receipt's
    (the invisible duration as protobuf's FromMilliseconds sets it, present even at 0)."""
    sent = message(
        user={"color": "blue"},
        tag="TagA",
        keys=["k1", "k2"],
        delivery_timestamp=NOW + 5000,
        delivery_attempt=2,
        message_group="g",
        trace_context="00-abc-01",
        born_host="10.1.1.1",
        born_timestamp=NOW - 1000,
    )
    stored = form(sent)
    ext = MessageExt(
        topic="T",
        body=stored.body,
        properties=stored.properties,
        sys_flag=stored.sys_flag,
        born_timestamp=stored.born_timestamp,
        born_host=("10.9.9.9", 1),
        store_timestamp=NOW + 7,
        queue_id=3,
        queue_offset=42,
    )
    got = to_grpc_message(
        ext, receipt_handle="h", invisible_ms=invisible_ms, attempt=3, store_host="1.2.3.4:5"
    )
    system = got.system_properties
    expected = type(system.invisible_duration)()
    expected.FromMilliseconds(invisible_ms)
    assert system.HasField("invisible_duration")
    assert system.invisible_duration == expected
    assert dict(got.user_properties) == {"color": "blue"}
    assert (system.tag, list(system.keys), system.message_group) == ("TagA", ["k1", "k2"], "g")
    assert (system.trace_context, system.born_host) == ("00-abc-01", "10.1.1.1")
    assert system.born_timestamp.ToMilliseconds() == NOW - 1000
    assert system.delivery_timestamp.ToMilliseconds() == NOW + 5000
    assert system.store_timestamp.ToMilliseconds() == NOW + 7
    assert (system.queue_id, system.queue_offset, system.delivery_attempt) == (3, 42, 3)
    assert system.message_type == MessageType.DELAY  # a delivery time comes before a group
