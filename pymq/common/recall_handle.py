"""RocketMQ 5's recall handle (RecallMessageHandle.HandleV1): what a timer message's send
answers and RECALL_MESSAGE takes back (pymq/broker/processors/recall.py), shared by the broker
and the client.

The handle is URL-safe Base64 (with padding, as Java's ``Base64.getUrlEncoder``) of
``v1 {topic} {brokerName} {timestamp} {uniqId}``; decoding accepts it with or without padding
(as Java's decoder) and refuses anything else with ``recall handle is invalid``.
"""

from __future__ import annotations

import base64
import binascii
import re

import attrs

HANDLE_VERSION = "v1"
INVALID_HANDLE = "recall handle is invalid"
_URL_SAFE = re.compile(r"[A-Za-z0-9_-]*={0,2}")


@attrs.frozen
class RecallHandle:
    """RocketMQ 5's RecallMessageHandle.HandleV1."""

    topic: str
    broker_name: str
    timestamp: str
    message_id: str

    def encode(self) -> str:
        raw = " ".join((HANDLE_VERSION, self.topic, self.broker_name, self.timestamp))
        raw += " " + self.message_id
        return base64.urlsafe_b64encode(raw.encode()).decode("ascii")

    @classmethod
    def decode(cls, text: str | None) -> RecallHandle:
        """As Java's decodeHandle: ValueError(``recall handle is invalid``) for anything but
        URL-safe Base64 (padding optional) of ``v1`` and at least four more fields."""
        if not text:
            raise ValueError(INVALID_HANDLE)
        if not _URL_SAFE.fullmatch(text):  # '+' and '/' are not in Java's URL alphabet
            raise ValueError(INVALID_HANDLE)
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (binascii.Error, ValueError):
            raise ValueError(INVALID_HANDLE) from None
        items = raw.decode("utf-8", errors="replace").split(" ")
        while items and not items[-1]:  # Java's String.split drops trailing empty strings
            items.pop()
        if len(items) < 5 or items[0] != HANDLE_VERSION:
            raise ValueError(INVALID_HANDLE)
        return cls(items[1], items[2], items[3], items[4])


def delete_key(real_topic: str, uniq_id: str) -> str:
    """TIMER_DEL_UNIQKEY of a marker cancelling ``uniq_id`` of ``real_topic`` (RocketMQ 5's
    TimerMessageStore.buildDeleteKey)."""
    return f"{real_topic}+{uniq_id}"
