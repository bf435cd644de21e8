"""Topics: TopicConfig as RocketMQ writes it, permission bits, names and validation rules."""

from __future__ import annotations

import enum
import re

import attrs

from pymq.common.clock import now_ms

# PermName bits.
PERM_PRIORITY = 8
PERM_READ = 4
PERM_WRITE = 2
PERM_INHERIT = 1

# Well-known topics and groups (MixAll / TopicValidator).
AUTO_CREATE_TOPIC_KEY_TOPIC = "TBW102"
SELF_TEST_TOPIC = "SELF_TEST_TOPIC"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
BENCHMARK_TOPIC = "BenchmarkTest"
OFFSET_MOVED_EVENT = "OFFSET_MOVED_EVENT"
RMQ_SYS_TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
RMQ_SYS_TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
RMQ_SYS_TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
# The internal group whose consumer offsets of the half and op topics are the transaction
# check service's progress.
CID_RMQ_SYS_TRANS = "CID_RMQ_SYS_TRANS"
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
SYSTEM_TOPIC_PREFIX = "rmq_sys_"
TIMER_TOPIC = SYSTEM_TOPIC_PREFIX + "wheel_timer"
"""RocketMQ 5's topic of timer messages before they are due (TimerMessageStore.TIMER_TOPIC)."""

# TopicValidator: at most 127 characters of letters, digits, '%', '|', '-' and '_'.
TOPIC_MAX_LENGTH = 127
_VALID_TOPIC = re.compile(r"^[%|a-zA-Z0-9_-]+$")


def is_readable(perm: int) -> bool:
    return bool(perm & PERM_READ)


def is_writeable(perm: int) -> bool:
    return bool(perm & PERM_WRITE)


def is_inherited(perm: int) -> bool:
    return bool(perm & PERM_INHERIT)


def perm_to_string(perm: int) -> str:
    return (
        ("R" if perm & PERM_READ else "-")
        + ("W" if perm & PERM_WRITE else "-")
        + ("X" if perm & PERM_INHERIT else "-")
    )


def validate_topic(topic: str) -> str | None:
    """Why ``topic`` is not a valid topic name, or None when it is."""
    if not topic or not topic.strip():
        return "the specified topic is blank"
    if len(topic) > TOPIC_MAX_LENGTH:
        return f"the specified topic is longer than topic max length {TOPIC_MAX_LENGTH}"
    if not _VALID_TOPIC.match(topic):
        return (
            f"the specified topic {topic!r} contains illegal characters, "
            "allowing only ^[%|a-zA-Z0-9_-]+$"
        )
    return None


SYSTEM_TOPIC_NAMES = frozenset(
    {
        AUTO_CREATE_TOPIC_KEY_TOPIC,
        SELF_TEST_TOPIC,
        SCHEDULE_TOPIC,
        OFFSET_MOVED_EVENT,
        TRANS_CHECK_MAX_TIME_TOPIC,
    }
)
"""Broker-internal topics by name; with the prefixes below they make :func:`is_system_topic`."""
SYSTEM_TOPIC_PREFIXES = (
    "RMQ_SYS_",
    SYSTEM_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    DLQ_GROUP_TOPIC_PREFIX,
)


def is_system_topic(topic: str) -> bool:
    """Whether ``topic`` holds broker plumbing rather than what producers sent to it.

    SCHEDULE_TOPIC_XXXX (delayed messages before they are due), ``RMQ_SYS_*`` and ``rmq_sys_*``
    (transaction half/op messages, traces), ``%RETRY%`` (re-sent copies of consumed messages),
    ``%DLQ%`` (messages that exhausted their retries), TBW102, SELF_TEST_TOPIC,
    OFFSET_MOVED_EVENT and TRANS_CHECK_MAX_TIME_TOPIC.  A delayed or transactional message is
    stored again under its real topic when due or committed, so leaving these out exports each
    message once.  BenchmarkTest, which Java also calls a system topic, is left to the user.
    """
    return topic in SYSTEM_TOPIC_NAMES or topic.startswith(SYSTEM_TOPIC_PREFIXES)


# MixAll.REPLY_TOPIC_POSTFIX
REPLY_TOPIC_POSTFIX = "REPLY_TOPIC"


def retry_topic(group: str) -> str:
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_GROUP_TOPIC_PREFIX + group


def reply_topic(cluster: str) -> str:
    """MixAll.getReplyTopic: ``<cluster>_REPLY_TOPIC``, where replies to requests go; each
    broker of the cluster creates it at start-up (1 queue, a system topic)."""
    return f"{cluster}_{REPLY_TOPIC_POSTFIX}"


class TopicFilterType(enum.Enum):
    SINGLE_TAG = "SINGLE_TAG"
    MULTI_TAG = "MULTI_TAG"


MAX_QUEUE_NUMS = 1024
"""The most queues a topic may have on one broker (read or write), and the most retry queues a
subscription group may ask for.  Java 4.9.4 takes any int, and a topic of 2^31-1 queues
(UPDATE_AND_CREATE_TOPIC with no ACL, a careless operator) made the first walk over its
queues (stats, consume stats, offsets) exhaust the broker's memory (#37).  pymq refuses more
than this wherever a count enters: topic and group updates (SYSTEM_ERROR with a remark),
topics.json / subscriptionGroup.json at start (the broker does not start), a name-server
registration (refused), and any TopicConfig or SubscriptionGroupConfig built in between, so
that every walk over a topic's queues is bounded by it.  1,024 is the count of Java's own
largest topic (BenchmarkTest)."""


def queue_nums_problem(name: str, value: object, *, least: int = 0) -> str | None:
    """Why ``value`` is not an acceptable queue count for field ``name``, or None."""
    if type(value) is not int:
        return f"{name} must be an integer, not {value!r}"
    if not least <= value <= MAX_QUEUE_NUMS:
        return f"{name} {value} is out of range: {least} to {MAX_QUEUE_NUMS}"
    return None


def _java_name(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def check_queue_nums(instance: object, attribute: attrs.Attribute, value: object) -> None:
    """An attrs validator: the field's value is a queue count within MAX_QUEUE_NUMS."""
    problem = queue_nums_problem(_java_name(attribute.name), value)
    if problem:
        raise ValueError(problem)


@attrs.define(frozen=True)
class TopicConfig:
    topic_name: str
    read_queue_nums: int = attrs.field(default=16, validator=check_queue_nums)
    write_queue_nums: int = attrs.field(default=16, validator=check_queue_nums)
    perm: int = PERM_READ | PERM_WRITE
    topic_filter_type: TopicFilterType = TopicFilterType.SINGLE_TAG
    topic_sys_flag: int = 0
    order: bool = False
    # RocketMQ 5's topic attributes (``message.type``: NORMAL, FIFO, DELAY, TRANSACTION or
    # MIXED; see TOPIC_MESSAGE_TYPE); None (no attributes) is left out of the JSON, as 4.x
    # writes a topic config.
    attributes: dict[str, str] | None = attrs.field(default=None, hash=False)


# RocketMQ 5's topic attribute that says which messages a topic takes (TopicAttributes).
TOPIC_MESSAGE_TYPE = "message.type"
TOPIC_MESSAGE_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED")


def alter_topic_attributes(
    current: dict[str, str] | None, changes: str | None
) -> dict[str, str] | None:
    """``current`` attributes with RocketMQ 5's ``changes`` applied (AttributeParser:
    ``+key=value`` sets, ``-key`` removes, comma-separated); ValueError naming what is wrong.
    Only ``message.type`` is known (its values: :data:`TOPIC_MESSAGE_TYPES`)."""
    altered = dict(current or {})
    for item in (changes or "").split(","):
        item = item.strip()
        if not item:
            continue
        sign, body = item[0], item[1:]
        key, equals, value = body.partition("=")
        if sign not in "+-" or not key or (sign == "+") != bool(equals):
            raise ValueError(f"attribute {item!r} is not +key=value or -key")
        if key != TOPIC_MESSAGE_TYPE:
            raise ValueError(f"attribute {key} is not supported (pymq knows {TOPIC_MESSAGE_TYPE})")
        if sign == "-":
            altered.pop(key, None)
        elif value not in TOPIC_MESSAGE_TYPES:
            raise ValueError(f"{key}={value}: the value is not in {list(TOPIC_MESSAGE_TYPES)}")
        else:
            altered[key] = value
    return altered or None


def topic_message_type(config: TopicConfig) -> str:
    """The topic's message type attribute; NORMAL when it has none (RocketMQ 5's default)."""
    attributes = config.attributes
    return (attributes or {}).get(TOPIC_MESSAGE_TYPE) or "NORMAL"


@attrs.define
class DataVersion:
    """RocketMQ's DataVersion: equal when both timestamp and counter are equal."""

    timestamp: int = attrs.Factory(now_ms)
    counter: int = 0

    def next_version(self) -> None:
        self.timestamp = now_ms()
        self.counter += 1


@attrs.define
class TopicConfigSerializeWrapper:
    topic_config_table: dict[str, TopicConfig] = attrs.Factory(dict)
    data_version: DataVersion = attrs.Factory(DataVersion)
