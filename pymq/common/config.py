"""Config classes as data: attrs classes with RocketMQ's defaults, filled from ``.properties``.

Every config class is an ``@attrs.define`` class whose fields carry RocketMQ's defaults; each field
is known by its Java key (:func:`pymq.common.serde.java_name`).  :func:`apply_properties` sets the
keys a properties mapping names on whichever of several config objects has them (as RocketMQ's
``MixAll.properties2Object`` does for NamesrvConfig + NettyServerConfig) and returns the keys that
none of them knows, so that callers report them instead of dropping them silently.
"""

from __future__ import annotations

import enum
import math
import os
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import attrs

from pymq.common.properties import load_properties, parse_properties
from pymq.common.serde import converter, java_name


class ConfigError(ValueError):
    """A config value that cannot be used; the message names the key and the value."""


def user_home() -> str:
    return os.path.expanduser("~")


def _fields_by_key(obj: object) -> dict[str, attrs.Attribute]:
    cls: Any = type(obj)  # an attrs class: every config object is one
    attrs.resolve_types(cls)
    return {java_name(f): f for f in attrs.fields(cls)}


def _field_type(field: attrs.Attribute) -> type:
    # attrs.resolve_types in _fields_by_key gave every field its type.
    return cast(type, field.type)


def config_keys(obj: object) -> list[str]:
    return list(_fields_by_key(obj))


SHOWN_VALUE_CHARS = 80
"""A refused value is quoted in the error up to this many characters of its ``repr``."""

JAVA_LONG_MIN, JAVA_LONG_MAX = -(2**63), 2**63 - 1
JAVA_INT_MIN, JAVA_INT_MAX = -(2**31), 2**31 - 1
JAVA_INT_KEYS = frozenset(
    """
    accessMessageInMemoryMaxRatio adminBrokerThreadPoolNums bitMapLengthConsumeQueueExt
    brokerPermission cleanResourceInterval clientAsyncSemaphoreValue
    clientCallbackExecutorThreads clientChannelMaxIdleTimeSeconds clientManageThreadPoolNums
    clientManagerThreadPoolQueueCapacity clientOnewaySemaphoreValue clientSocketRcvBufSize
    clientSocketSndBufSize clientWorkerThreads commercialBaseCount commercialBigCount
    commercialTimerCount commercialTransCount commitCommitLogLeastPages
    commitCommitLogThoroughInterval commitIntervalCommitLog connectTimeoutMillis
    consumerManageThreadPoolNums consumerManagerThreadPoolQueueCapacity defaultQueryMaxNum
    defaultTopicQueueNums deleteCommitLogFilesInterval deleteConsumeQueueFilesInterval
    destroyMapedFileIntervalForcibly diskMaxUsedSpaceRatio endTransactionPoolQueueCapacity
    endTransactionThreadPoolNums expectConsumerNumUseFilter fileReservedTime
    filterServerNums flushCommitLogLeastPages flushCommitLogThoroughInterval
    flushConsumeQueueLeastPages flushConsumeQueueThoroughInterval
    flushConsumerOffsetHistoryInterval flushConsumerOffsetInterval flushIntervalCommitLog
    flushIntervalConsumeQueue flushLeastPagesWhenWarmMapedFile haHousekeepingInterval
    haListenPort haSendHeartbeatInterval haSlaveFallbehindMax haTransferBatchSize
    heartbeatThreadPoolNums heartbeatThreadPoolQueueCapacity listenPort
    mappedFileSizeCommitLog mappedFileSizeConsumeQueue mappedFileSizeConsumeQueueExt
    mappedFileSizeTimerLog maxDelayTime maxErrorRateOfBloomFilter maxHashSlotNum maxIndexNum
    maxLmqConsumeQueueNum
    maxMessageSize maxMsgsNumBatch maxTransferBytesOnMessageInDisk
    maxTransferBytesOnMessageInMemory maxTransferCountOnMessageInDisk
    maxTransferCountOnMessageInMemory processReplyMessageThreadPoolNums
    pullMessageThreadPoolNums pullThreadPoolQueueCapacity putMessageFutureThreadPoolNums
    putMsgIndexHightWater putThreadPoolQueueCapacity queryMessageThreadPoolNums
    queryThreadPoolQueueCapacity redeleteHangedFileInterval registerBrokerTimeoutMills
    registerNameServerPeriod replyThreadPoolQueueCapacity
    scheduleAsyncDeliverMaxPendingLimit scheduleAsyncDeliverMaxResendNum2Blocked
    sendMessageThreadPoolNums sendThreadPoolQueueCapacity serverAsyncSemaphoreValue
    serverCallbackExecutorThreads serverChannelMaxIdleTimeSeconds serverOnewaySemaphoreValue
    serverSelectorThreads serverSocketBacklog serverSocketRcvBufSize serverSocketSndBufSize
    serverWorkerThreads slaveTimeout syncFlushTimeout transactionCheckMax
    timerFlushIntervalMs timerMaxDelaySec timerPrecisionMs timerRollWindowSlot
    transientStorePoolSize writeBufferHighWaterMark writeBufferLowWaterMark
    """.split()  # noqa: SIM905  (a list of names, one place)
)
"""The integer keys RocketMQ 4.9.4 declares ``int`` (BrokerConfig, MessageStoreConfig,
NettyServerConfig, NettyClientConfig, NamesrvConfig): a value must fit 32 bits.  Every other
integer key (Java's ``long`` ones and pymq's own) must fit a Java long."""
_INTEGER = re.compile(r"[+-]?\d+")  # Long.parseLong's form (Unicode digits too; no "_")


def _shown(text: str) -> str:
    """``text`` quoted for an error line: escapes for what is not printable, bounded."""
    quoted = repr(text)
    if len(quoted) > SHOWN_VALUE_CHARS:
        quoted = quoted[: SHOWN_VALUE_CHARS - 4] + "...'"
    return quoted


def unwritable(text: str) -> str | None:
    """Why ``text`` cannot be a value (or key) of a config body, or None if it can.

    A config body is UTF-8 ``key=value`` lines (GET_BROKER_CONFIG, GET_NAMESRV_CONFIG, ``-p``),
    so a lone surrogate (no UTF-8 form), a control character (NUL, CR, LF, ..., but not tab) or
    a line or paragraph separator (U+2028, U+2029) would make every later read of the config
    fail or come back different."""
    for i, ch in enumerate(text):
        category = unicodedata.category(ch)
        if category == "Cs":
            return f"a lone surrogate (U+{ord(ch):04X}) at index {i} has no UTF-8 form"
        if (category == "Cc" and ch != "\t") or category in ("Zl", "Zp"):
            return f"the control character U+{ord(ch):04X} at index {i} would break its line"
    return None


def convert_value(key: str, value: str, kind: Any) -> Any:
    """The typed value of one config key from its string form, or :class:`ConfigError` naming
    the key and the value: text a config body cannot carry (:func:`unwritable`), an integer
    not in Long.parseLong's form or outside its key's Java type (:data:`JAVA_INT_KEYS`), a
    float that is not finite, an enum value that is none of its members, or whatever else
    the type refuses."""
    reason = unwritable(value)
    if reason is not None:
        raise ConfigError(f"bad value for {key}: {_shown(value)} ({reason})")
    text = value.strip()
    if kind is int:
        if not _INTEGER.fullmatch(text):
            raise ConfigError(f"bad value for {key}: {_shown(value)} (not an integer)")
        # More digits than any Java long has: out of range without converting (Python refuses
        # int() of over 4300 digits anyway); leading zeros are fine, as for Long.parseLong.
        significant = text.lstrip("+-").lstrip("0")
        number = int(text) if len(significant) <= 19 else JAVA_LONG_MAX + 1
        low, high, java = (
            (JAVA_INT_MIN, JAVA_INT_MAX, "int")
            if key in JAVA_INT_KEYS
            else (JAVA_LONG_MIN, JAVA_LONG_MAX, "long")
        )
        if not low <= number <= high:
            raise ConfigError(
                f"bad value for {key}: {_shown(value)} (outside a Java {java}: {low}..{high})"
            )
        return number
    try:
        typed: Any = converter.structure(text, kind)
    except Exception as exc:
        if isinstance(kind, type) and issubclass(kind, enum.Enum):
            choices = ", ".join(str(member.value) for member in kind)
            raise ConfigError(f"bad value for {key}: {_shown(value)} (one of {choices})") from None
        raise ConfigError(f"bad value for {key}: {_shown(value)} ({exc})") from exc
    if isinstance(typed, float) and not math.isfinite(typed):
        raise ConfigError(f"bad value for {key}: {_shown(value)} (not a finite number)")
    return typed


def set_key(obj: object, key: str, value: str) -> None:
    """Set one Java-named key from its string form, converting to the field's type."""
    field = _fields_by_key(obj).get(key)
    if field is None:
        raise ConfigError(f"unknown config key {_shown(key)}")
    converted = convert_value(key, value, _field_type(field))
    try:
        setattr(obj, field.name, converted)
    except ValueError as exc:  # a field's validator (a range): named by its key
        raise ConfigError(f"{key}={_shown(value)} refused: {exc}") from None


def apply_properties(configs: Sequence[object], props: Mapping[str, str]) -> list[str]:
    """Apply every key to the configs that have it; return the keys no config knows."""
    unknown: list[str] = []
    for key, value in props.items():
        owners = [c for c in configs if key in _fields_by_key(c)]
        if not owners:
            unknown.append(key)
        for owner in owners:
            set_key(owner, key, value)
    return unknown


def apply_saved(configs: Sequence[object], path: str) -> None:
    """Apply the runtime changes an earlier run saved to the properties file ``path``, if it
    exists; ConfigError for a key no config knows (the file was edited by hand)."""
    if not os.path.exists(path):
        return
    unknown = apply_properties(configs, load_properties(path))
    if unknown:
        raise ConfigError(f"unknown config keys in {path}: {', '.join(unknown)}")


def _java_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if value is None:
        return ""
    return str(value)


def masked(props: dict[str, str], secrets: Iterable[str]) -> dict[str, str]:
    """``props`` with each of ``secrets`` that is set shown as ``******`` (config answers
    anyone allowed to read the config may see)."""
    for key in secrets:
        if props.get(key):
            props[key] = "******"
    return props


def to_properties(configs: Iterable[object], *, skip_none: bool = False) -> dict[str, str]:
    """The effective config as Java keys and string values, in declaration order (without the
    keys whose value is None when ``skip_none``, as Java's properties writer leaves nulls out)."""
    out: dict[str, str] = {}
    for obj in configs:
        for key, field in _fields_by_key(obj).items():
            value = getattr(obj, field.name)
            if value is None and skip_none:
                continue
            out[key] = _java_value(value)
    return out


def refuse_unsupported(configs: Iterable[object], unsupported: Mapping[str, str]) -> None:
    """ConfigError for the first key of ``unsupported`` (key -> why) that one of ``configs``
    holds at a value other than its default: such a key asks for a feature pymq does not have,
    and running without it would be running something else than what the operator asked for."""
    for obj in configs:
        fields = _fields_by_key(obj)
        for key, why in unsupported.items():
            field = fields.get(key)
            if field is not None and getattr(obj, field.name) != field.default:
                raise ConfigError(f"{key}={_java_value(getattr(obj, field.name))}: {why}")


class RestartOnlyKeyError(ConfigError):
    """A key that a running server cannot change (paths, ports, names, roles)."""


def parse_properties_body(text: bytes) -> dict[str, str]:
    """The properties body of an UPDATE_*_CONFIG request; ConfigError when not UTF-8."""
    try:
        return parse_properties(text.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError("config body is not UTF-8") from None


def update_at_runtime(
    configs: Sequence[object], props: Mapping[str, str], restart_only: frozenset[str], what: str
) -> dict[str, str]:
    """Apply RocketMQ keys to running configs, all or nothing; returns the new values.

    Raises :class:`RestartOnlyKeyError` for keys in ``restart_only`` and :class:`ConfigError`
    for unknown keys or bad values; nothing is changed then.
    """
    check_runtime_update(configs, props, restart_only, what)
    apply_properties(configs, props)
    current = to_properties(configs)
    return {key: current[key] for key in props}


def check_runtime_update(
    configs: Sequence[object], props: Mapping[str, str], restart_only: frozenset[str], what: str
) -> None:
    """What :func:`update_at_runtime` would raise for ``props``, changing nothing (so that a
    caller can save the change before it applies it)."""
    frozen = sorted(restart_only & props.keys())
    if frozen:
        raise RestartOnlyKeyError(
            f"{', '.join(frozen)} cannot be changed on a running {what}; "
            "edit its config file and restart"
        )
    known = to_properties(configs)
    unknown = sorted(k for k in props if k not in known)
    if unknown:
        raise ConfigError(f"unknown config keys: {', '.join(_shown(k) for k in unknown)}")
    # Convert every value first, so that one bad value leaves the config untouched.
    for key, value in props.items():
        for config in configs:
            field = _fields_by_key(config).get(key)
            if field is not None:
                convert_value(key, value, _field_type(field))
