"""Client-side data the broker and clients exchange: heartbeats, subscriptions, queues, locks.

Field names and JSON follow RocketMQ 4.x.  Enums are written by name (as Java clients send them)
and read by name or by ordinal (as the C++ client sends them).
"""

from __future__ import annotations

import enum

import attrs

from pymq.common.message_ext import java_string_hash

SUB_ALL = "*"
EXPRESSION_TYPE_TAG = "TAG"
EXPRESSION_TYPE_SQL92 = "SQL92"


def is_tag_type(expression_type: str | None) -> bool:
    """ExpressionType.isTagType: no type, an empty one or exactly ``TAG``."""
    return not expression_type or expression_type == EXPRESSION_TYPE_TAG


class ConsumeType(enum.Enum):
    CONSUME_ACTIVELY = "CONSUME_ACTIVELY"
    CONSUME_PASSIVELY = "CONSUME_PASSIVELY"


class MessageModel(enum.Enum):
    BROADCASTING = "BROADCASTING"
    CLUSTERING = "CLUSTERING"


class ConsumeFromWhere(enum.Enum):
    CONSUME_FROM_LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST = (
        "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST"
    )
    CONSUME_FROM_MIN_OFFSET = "CONSUME_FROM_MIN_OFFSET"
    CONSUME_FROM_MAX_OFFSET = "CONSUME_FROM_MAX_OFFSET"
    CONSUME_FROM_FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    CONSUME_FROM_TIMESTAMP = "CONSUME_FROM_TIMESTAMP"


@attrs.define(frozen=True, order=True)
class MessageQueue:
    topic: str
    broker_name: str
    queue_id: int


@attrs.define
class SubscriptionData:
    topic: str
    sub_string: str = SUB_ALL
    tags_set: list[str] = attrs.Factory(list)
    code_set: list[int] = attrs.Factory(list)
    sub_version: int = 0
    expression_type: str = EXPRESSION_TYPE_TAG
    class_filter_mode: bool = False

    @classmethod
    def build(
        cls,
        topic: str,
        expression: str | None,
        sub_version: int = 0,
        expression_type: str | None = None,
    ) -> SubscriptionData:
        """FilterAPI.build: by tag, ``"*"`` or ``"TagA || TagB"``; any other type keeps the
        expression as it is (ValueError when it is empty, as Java refuses it)."""
        if not is_tag_type(expression_type):
            assert expression_type is not None
            if not expression:
                raise ValueError(f"Expression can't be null! {expression_type}")
            return cls(
                topic=topic,
                sub_string=expression,
                sub_version=sub_version,
                expression_type=expression_type,
            )
        data = cls(topic=topic, sub_version=sub_version)
        if not expression or expression.strip() in ("", SUB_ALL):
            data.sub_string = SUB_ALL
            return data
        data.sub_string = expression
        for tag in expression.split("||"):
            tag = tag.strip()
            if tag and tag not in data.tags_set:
                data.tags_set.append(tag)
                data.code_set.append(java_string_hash(tag))
        return data

    def normalised(self) -> SubscriptionData:
        """The same subscription with the tag hashes recomputed from the tags (the C++ client
        sends garbage in codeSet); a subscription by SQL92 is kept as it is."""
        if not self.is_tag_type:
            return self
        if self.sub_string.strip() == SUB_ALL or not self.tags_set:
            return SubscriptionData.build(self.topic, self.sub_string, self.sub_version)
        return attrs.evolve(self, code_set=[java_string_hash(t) for t in self.tags_set])

    @property
    def is_tag_type(self) -> bool:
        return is_tag_type(self.expression_type)

    @property
    def matches_all(self) -> bool:
        return self.sub_string.strip() == SUB_ALL or not self.code_set

    def tag_filter(self) -> frozenset[int] | None:
        """The tag hash codes a consume-queue entry must carry, or None for every message."""
        return None if self.matches_all else frozenset(self.code_set)


@attrs.define
class ConsumerData:
    group_name: str
    consume_type: ConsumeType = ConsumeType.CONSUME_PASSIVELY
    message_model: MessageModel = MessageModel.CLUSTERING
    consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    subscription_data_set: list[SubscriptionData] = attrs.Factory(list)
    unit_mode: bool = False


@attrs.define
class ProducerData:
    group_name: str


@attrs.define
class HeartbeatData:
    client_id: str = attrs.field(default="", metadata={"key": "clientID"})
    producer_data_set: list[ProducerData] = attrs.Factory(list)
    consumer_data_set: list[ConsumerData] = attrs.Factory(list)


@attrs.define
class CheckClientRequestBody:
    """CHECK_CLIENT_CONFIG's body: a consumer's subscription for the broker to validate."""

    client_id: str = ""
    group: str = ""
    subscription_data: SubscriptionData | None = None


@attrs.define
class ConsumerList:
    consumer_id_list: list[str] = attrs.Factory(list)


@attrs.define
class LockBatchRequestBody:
    consumer_group: str = ""
    client_id: str = ""
    mq_set: list[MessageQueue] = attrs.Factory(list)


@attrs.define
class LockBatchResponseBody:
    lock_ok_mq_set: list[MessageQueue] = attrs.field(factory=list, metadata={"key": "lockOKMQSet"})


@attrs.define
class UnlockBatchRequestBody:
    consumer_group: str = ""
    client_id: str = ""
    mq_set: list[MessageQueue] = attrs.Factory(list)
