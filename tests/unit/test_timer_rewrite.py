"""The put path's timer rewrite (pymq/store/timer/rewrite.py), RocketMQ 5's rules."""

from __future__ import annotations

import pytest

from pymq.common.config import ConfigError, set_key
from pymq.common.message_ext import MessageExt
from pymq.common.topic import TIMER_TOPIC
from pymq.store.config import MessageStoreConfig
from pymq.store.results import PutMessageResult, PutMessageStatus
from pymq.store.timer.rewrite import rewrite_timer

NOW = 1_800_000_000_000
MAX_SEC = 3 * 86400


def message(**props: str) -> MessageExt:
    return MessageExt(topic="T", body=b"x", queue_id=3, properties=dict(props))


def rewrite(msg: MessageExt, enabled: bool = True) -> PutMessageResult | None:
    return rewrite_timer(msg, now_ms=NOW, enabled=enabled, max_delay_sec=MAX_SEC)


@pytest.mark.parametrize(
    ("props", "due"),
    [
        ({"TIMER_DELIVER_MS": str(NOW + 1)}, NOW + 1),
        ({"TIMER_DELAY_MS": "1500"}, NOW + 1500),
        ({"TIMER_DELAY_SEC": "7"}, NOW + 7000),
        # SEC first, then MS, then DELIVER_MS (RocketMQ 5's order)
        ({"TIMER_DELAY_SEC": "2", "TIMER_DELAY_MS": "1", "TIMER_DELIVER_MS": "5"}, NOW + 2000),
        ({"TIMER_DELAY_MS": "9", "TIMER_DELIVER_MS": str(NOW + 5)}, NOW + 9),
        ({"TIMER_DELAY_SEC": str(MAX_SEC)}, NOW + MAX_SEC * 1000),  # the limit itself
    ],
)
def test_a_timer_goes_to_the_timer_topic(props: dict[str, str], due: int) -> None:
    msg = message(**props)
    assert rewrite(msg) is None
    assert (msg.topic, msg.queue_id) == (TIMER_TOPIC, 0)
    assert msg.properties["TIMER_OUT_MS"] == str(due)
    assert msg.properties["REAL_TOPIC"] == "T" and msg.properties["REAL_QID"] == "3"


@pytest.mark.parametrize(
    "props",
    [
        {"TIMER_DELAY_SEC": str(MAX_SEC + 1)},
        {"TIMER_DELIVER_MS": str(NOW + MAX_SEC * 1000 + 1)},
        {"TIMER_DELAY_MS": "ten"},
        {"TIMER_DELAY_MS": " 10"},
        {"TIMER_DELAY_MS": "1_0"},
        {"TIMER_DELIVER_MS": ""},
        {"TIMER_DELIVER_MS": str(2**63)},  # not a Java long
        {"TIMER_DELIVER_MS": str(NOW - 1), "TIMER_DEL_UNIQKEY": "k"},  # a recall in the past
    ],
)
def test_illegal_timers_are_refused_unchanged(props: dict[str, str]) -> None:
    msg = message(**props)
    refused = rewrite(msg)
    assert refused is not None and refused.status is PutMessageStatus.WHEEL_TIMER_MSG_ILLEGAL
    assert "max delay 259200000ms" in refused.reason
    assert msg.topic == "T" and msg.properties == props


def test_past_or_now_is_stored_as_it_is() -> None:
    for deliver in (NOW, NOW - 10_000, -5):
        msg = message(TIMER_DELIVER_MS=str(deliver))
        assert rewrite(msg) is None
        assert msg.topic == "T" and "TIMER_OUT_MS" not in msg.properties
    msg = message(TIMER_DELAY_SEC="-3")
    assert rewrite(msg) is None and msg.topic == "T"


def test_delay_level_wins_and_drops_the_timer_properties() -> None:
    msg = message(DELAY="2", TIMER_DELAY_SEC="60", TIMER_DELAY_MS="5", TIMER_DELIVER_MS="9")
    assert rewrite(msg) is None
    assert msg.properties == {"DELAY": "2"} and msg.topic == "T"


def test_delivered_or_disabled() -> None:
    delivered = message(TIMER_DELAY_SEC="60", TIMER_OUT_MS=str(NOW))
    assert rewrite(delivered) is None and delivered.topic == "T"  # a delivered one stays
    msg = message(TIMER_DELAY_SEC="60")
    refused = rewrite(msg, enabled=False)
    assert refused is not None and refused.status is PutMessageStatus.WHEEL_TIMER_NOT_ENABLE
    assert refused.reason == "accurate timer message is not enabled, timerWheelEnable is false"
    assert msg.topic == "T"
    plain = message(KEYS="k")
    assert rewrite(plain, enabled=False) is None


@pytest.mark.parametrize(
    "key", ["timerPrecisionMs", "timerMaxDelaySec", "timerRollWindowSlot", "timerFlushIntervalMs"]
)
def test_timer_keys_refuse_zero(key: str) -> None:
    config = MessageStoreConfig()
    with pytest.raises(ConfigError, match=key):
        set_key(config, key, "0")
    set_key(config, key, "5")
