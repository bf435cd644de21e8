"""RocketMQ 5's recall handle (pymq/common/recall_handle.py): the encoding Java's
RecallMessageHandle.HandleV1.buildHandle writes, and decodeHandle's tolerance and refusals."""

from __future__ import annotations

import base64

import pytest

from pymq.common.recall_handle import INVALID_HANDLE, RecallHandle, delete_key


def test_encoding_is_url_safe_base64_of_five_fields_with_padding() -> None:
    handle = RecallHandle("T?>", "broker-a", "1700000000001", "7F0000010001")
    text = handle.encode()
    raw = "v1 T?> broker-a 1700000000001 7F0000010001"
    assert text == base64.urlsafe_b64encode(raw.encode()).decode()  # Java's getUrlEncoder
    assert "+" not in text and "/" not in text
    assert RecallHandle.decode(text) == handle
    assert RecallHandle.decode(text.rstrip("=")) == handle  # Java's decoder: padding optional


def test_extra_fields_are_ignored_and_trailing_spaces_dropped_as_java_split() -> None:
    raw = "v1 T b 5 id extra more   "
    text = base64.urlsafe_b64encode(raw.encode()).decode()
    assert RecallHandle.decode(text) == RecallHandle("T", "b", "5", "id")


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "not base64!",
        "dj E",  # a space is not in the alphabet
        base64.b64encode(b"v1 T b 5 id\xff\xfe>>??").decode(),  # '+' or '/': not URL-safe
        base64.urlsafe_b64encode(b"v2 T b 5 id").decode(),
        base64.urlsafe_b64encode(b"v1 T b 5").decode(),
        base64.urlsafe_b64encode(b"v1 T b 5 ").decode(),
        "é",
    ],
)
def test_anything_else_is_invalid(text: str | None) -> None:
    with pytest.raises(ValueError, match=INVALID_HANDLE):
        RecallHandle.decode(text)


def test_delete_key_is_rocketmq_5s() -> None:
    assert delete_key("Topic", "ABC") == "Topic+ABC"
