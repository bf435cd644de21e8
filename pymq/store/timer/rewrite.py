"""The put path's rewrite of a timer message (RocketMQ 5's HookUtils.handleScheduleMessage).

A message whose transaction type is none or commit, and that is not already a timer-topic
message or a delivered one (TIMER_OUT_MS set), is a timer message when it carries
TIMER_DELIVER_MS (absolute epoch ms), TIMER_DELAY_SEC or TIMER_DELAY_MS (relative; read in
that order of precedence, SEC first, as RocketMQ 5).  A message with a delay level as well
keeps its delay level and loses the timer properties (RocketMQ 5's rule).

- ``timerWheelEnable=false``: refused, WHEEL_TIMER_NOT_ENABLE (SYSTEM_ERROR);
- a value that is not a Java long, or a due time more than ``timerMaxDelaySec`` ahead:
  WHEEL_TIMER_MSG_ILLEGAL (MESSAGE_ILLEGAL), with RocketMQ 5's remark;
- due now or in the past: stored as it is, to its own topic (delivered at once);
- else: TIMER_OUT_MS (the due time), REAL_TOPIC and REAL_QID are added and the message goes to
  ``rmq_sys_wheel_timer`` queue 0, where the timer service enters it in the wheel.

One difference from RocketMQ 5: RocketMQ records TIMER_OUT_MS rounded down to the precision
(one precision less on a boundary) and delivers the slot that starts there when it ends; pymq
records the exact due time and enters it in that same slot (pymq/store/timer/store.py), so the
delivery time is the same and the recorded due time is the one the producer asked for.
"""

from __future__ import annotations

import re

from pymq.common.message_ext import (
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_DEL_UNIQKEY,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_OUT_MS,
    MessageExt,
)
from pymq.common.topic import TIMER_TOPIC
from pymq.store.results import PutMessageResult, PutMessageStatus

TIMER_KEYS = (PROPERTY_TIMER_DELAY_SEC, PROPERTY_TIMER_DELAY_MS, PROPERTY_TIMER_DELIVER_MS)
_JAVA_LONG = re.compile(r"[+-]?[0-9]{1,19}")
_LONG_MAX = 2**63 - 1

ILLEGAL_REMARK = (
    "timer message illegal, the delay time should not be bigger than the max delay {max_ms}ms; "
    "or if set del msg, the delay time should be bigger than the current time"
)
NOT_ENABLED_REMARK = "accurate timer message is not enabled, timerWheelEnable is false"


_TIMER_KEY_SET = frozenset(TIMER_KEYS)


def has_timer(properties: dict[str, str]) -> bool:
    return not _TIMER_KEY_SET.isdisjoint(properties)


def _long(text: str) -> int | None:
    if not _JAVA_LONG.fullmatch(text):
        return None
    value = int(text)
    return value if -_LONG_MAX - 1 <= value <= _LONG_MAX else None


def rewrite_timer(
    msg: MessageExt, *, now_ms: int, enabled: bool, max_delay_sec: int
) -> PutMessageResult | None:
    """Rewrite ``msg`` in place as the module docstring says; a refusal (``msg`` unchanged)
    or None.  The caller has checked the transaction type."""
    props = msg.properties
    if msg.delay_level > 0:
        for key in TIMER_KEYS:
            props.pop(key, None)
        return None
    if msg.topic == TIMER_TOPIC or PROPERTY_TIMER_OUT_MS in props or not has_timer(props):
        return None
    max_ms = max_delay_sec * 1000
    if not enabled:
        return PutMessageResult(PutMessageStatus.WHEEL_TIMER_NOT_ENABLE, reason=NOT_ENABLED_REMARK)
    if PROPERTY_TIMER_DELAY_SEC in props:
        value = _long(props[PROPERTY_TIMER_DELAY_SEC])
        deliver_ms = None if value is None else now_ms + value * 1000
    elif PROPERTY_TIMER_DELAY_MS in props:
        value = _long(props[PROPERTY_TIMER_DELAY_MS])
        deliver_ms = None if value is None else now_ms + value
    else:
        deliver_ms = _long(props[PROPERTY_TIMER_DELIVER_MS])
    if (
        deliver_ms is None
        or deliver_ms - now_ms > max_ms
        or (deliver_ms <= now_ms and PROPERTY_TIMER_DEL_UNIQKEY in props)
    ):
        return PutMessageResult(
            PutMessageStatus.WHEEL_TIMER_MSG_ILLEGAL, reason=ILLEGAL_REMARK.format(max_ms=max_ms)
        )
    if deliver_ms <= now_ms:
        return None
    props[PROPERTY_TIMER_OUT_MS] = str(deliver_ms)
    props[PROPERTY_REAL_TOPIC] = msg.topic
    props[PROPERTY_REAL_QUEUE_ID] = str(msg.queue_id)
    msg.topic = TIMER_TOPIC
    msg.queue_id = 0
    return None
