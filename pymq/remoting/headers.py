"""Typed request headers: one class per header RocketMQ declares, validated once at decode time.

RocketMQ's Java side decodes a request's ``extFields`` into a ``CommandCustomHeader`` class
(``RemotingCommand.decodeCommandCustomHeader``): a field marked ``@CFNotNull`` that is absent
fails the request with ``the custom field <name> is null``; an ``Integer``/``int`` or
``Long``/``long`` field is parsed with ``Integer.parseInt`` / ``Long.parseLong`` (so ``""``,
``"1.5"``, ``" 7"`` or a value outside the Java type fail); a ``boolean`` is
``Boolean.parseBoolean`` (never fails).  The failure reaches the client as ``SYSTEM_ERROR`` with
the exception's text as remark.

Here each header is an attrs class whose fields carry their wire name, Java kind and whether they
are required.  :func:`decode` turns a request's ``ext_fields`` into an instance or raises
:class:`HeaderError` (a :class:`RemotingCommandError`, which the connection answers as
``SYSTEM_ERROR``); nothing downstream of it sees a value Java would have refused.  The servers
decode the header of every request whose code has a class in :data:`REQUEST_HEADERS` before its
processor runs (:func:`decode_request`), so a processor reads ``request.header`` and never the
raw strings.  The send header, on the hottest path, has a hand-written decoder of its own
(:meth:`SendMessageRequestHeader.from_ext`) checked against the generic one in the tests.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from json.encoder import encode_basestring_ascii as _quote
from typing import Any, TypeVar

import attrs

from pymq.common.native import load_native
from pymq.common.topic import AUTO_CREATE_TOPIC_KEY_TOPIC
from pymq.remoting.codes import RequestCode
from pymq.remoting.errors import RemotingCommandError

_native: Any = load_native("pymq.remoting._codecc")

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1

# What Integer.parseInt / Long.parseLong accept: an optional sign and ASCII digits, nothing else.
_JAVA_INTEGER = re.compile(r"[+-]?[0-9]+")
# Long enough for any Java long with a sign and leading zeros of a sane sender; longer is refused
# before int() sees it (int() of a very long string costs quadratic time).
_MAX_NUMBER_CHARS = 40


class HeaderError(RemotingCommandError):
    """A request header that Java's typed decode would refuse; answered as SYSTEM_ERROR."""


class Kind(enum.Enum):
    STRING = "String"
    INT = "int"
    LONG = "long"
    BOOL = "boolean"


_RANGES = {Kind.INT: (INT_MIN, INT_MAX), Kind.LONG: (LONG_MIN, LONG_MAX)}


def _shown(value: str) -> str:
    return repr(value if len(value) <= 48 else value[:48] + "...")


def java_number(name: str, value: str, kind: Kind) -> int:
    """``value`` parsed as Java parses an int or long field, or HeaderError naming ``name``."""
    if len(value) > _MAX_NUMBER_CHARS or not _JAVA_INTEGER.fullmatch(value):
        raise HeaderError(f"the custom field <{name}> is not a Java {kind.value}: {_shown(value)}")
    number = int(value)
    low, high = _RANGES[kind]
    if not low <= number <= high:
        raise HeaderError(
            f"the custom field <{name}> is out of range for a Java {kind.value}: {value}"
        )
    return number


def java_int(name: str, value: str) -> int:
    # The common case first: a plain non-negative number of at most 9 digits is always an int.
    if len(value) < 10 and value.isascii() and value.isdigit():
        return int(value)
    return java_number(name, value, Kind.INT)


def java_long(name: str, value: str) -> int:
    if len(value) < 19 and value.isascii() and value.isdigit():
        return int(value)
    return java_number(name, value, Kind.LONG)


def java_bool(value: str) -> bool:
    """``Boolean.parseBoolean``, plus ``"1"`` (the C++ client writes some flags as 0/1)."""
    return value == "true" or (value != "false" and value.lower() in ("true", "1"))


def _field(
    wire: str, kind: Kind, *, required: bool = False, default: Any = None
) -> Any:  # an attrs field
    return attrs.field(default=default, metadata={"wire": wire, "kind": kind, "required": required})


@attrs.frozen(slots=True)
class _Spec:
    attr: str
    wire: str
    kind: Kind
    required: bool
    default: Any


H = TypeVar("H")


def _specs(cls: type) -> tuple[_Spec, ...]:
    specs = cls.__dict__.get("_pymq_specs")
    if specs is None:
        specs = tuple(
            _Spec(f.name, f.metadata["wire"], f.metadata["kind"], f.metadata["required"], f.default)
            for f in attrs.fields(cls)
            if "wire" in f.metadata
        )
        type.__setattr__(cls, "_pymq_specs", specs)
    return specs


def decode(cls: type[H], ext: dict[str, str]) -> H:
    """An instance of header class ``cls`` from ``ext``, validated as Java's typed decode is."""
    values: dict[str, Any] = {}
    for spec in _specs(cls):
        raw = ext.get(spec.wire)
        if raw is None:
            if spec.required:
                raise HeaderError(f"the custom field <{spec.wire}> is null")
            continue
        kind = spec.kind
        if kind is Kind.STRING:
            values[spec.attr] = raw
        elif kind is Kind.INT:
            values[spec.attr] = java_int(spec.wire, raw)
        elif kind is Kind.LONG:
            values[spec.attr] = java_long(spec.wire, raw)
        else:
            values[spec.attr] = java_bool(raw)
    return cls(**values)


def encode(header: object) -> dict[str, str]:
    """The ``extFields`` of ``header``: its set fields as the strings a Java peer sends."""
    ext: dict[str, str] = {}
    for spec in _specs(type(header)):
        value = getattr(header, spec.attr)
        if value is None:
            continue
        if spec.kind is Kind.BOOL:
            ext[spec.wire] = "true" if value else "false"
        else:
            ext[spec.wire] = str(value)
    return ext


STR, INT, LONG, BOOL = Kind.STRING, Kind.INT, Kind.LONG, Kind.BOOL


def _req(wire: str, kind: Kind) -> Any:
    return _field(wire, kind, required=True)


# -- the send path ---------------------------------------------------------------------------

# SendMessageRequestHeaderV2's one-letter keys, in field order.
V2_NAMES = {
    "a": "producerGroup",
    "b": "topic",
    "c": "defaultTopic",
    "d": "defaultTopicQueueNums",
    "e": "queueId",
    "f": "sysFlag",
    "g": "bornTimestamp",
    "h": "flag",
    "i": "properties",
    "j": "reconsumeTimes",
    "k": "unitMode",
    "l": "maxReconsumeTimes",
    "m": "batch",
}
_SHORT_NAMES = tuple(V2_NAMES)
_LONG_NAMES = tuple(V2_NAMES.values())
_SEND_BATCH_MESSAGE = RequestCode.SEND_BATCH_MESSAGE
# The send codes whose header has the long names (SEND_MESSAGE, SEND_REPLY_MESSAGE), as ints.
_LONG_NAME_CODES = frozenset({int(RequestCode.SEND_MESSAGE), int(RequestCode.SEND_REPLY_MESSAGE)})
_ABSENT: Any = object()


def _plain_number(value: object, max_digits: int) -> int | None:
    """A plain non-negative decimal of at most ``max_digits`` ASCII digits, else None
    (java_int's and java_long's fast case)."""
    if type(value) is not str or not 0 < len(value) <= max_digits or not value.isascii():
        return None
    return int(value) if value.isdigit() else None


# "true" / "false" and the C++ client's "1" / "0": the booleans the common case reads.
_PLAIN_BOOLS = {"true": True, "false": False, "1": True, "0": False}


def _plain_bool(value: object) -> bool | None:
    return _PLAIN_BOOLS.get(value) if type(value) is str else None


def send_header_py(ext: Any, names: Any, cls: Any, batch_code: Any) -> Any:
    """Python twin of ``pymq.remoting._codecc.send_header``: SendMessageRequestHeader.from_ext's
    common case (the eight required fields present, numbers plain decimals, booleans true, false,
    1 or 0) as cls(...); None for anything else, which from_ext judges and words."""
    if type(ext) is not dict or type(names) is not tuple or len(names) != 13:
        return None
    batch = bool(batch_code)
    raw = [ext.get(name, _ABSENT) for name in names]
    if _ABSENT in raw[:8]:
        return None
    if type(raw[0]) is not str or type(raw[1]) is not str or type(raw[2]) is not str:
        return None  # a required str that is null (JSON null) or no str: from_ext words it
    ints = [_plain_number(raw[i], 9) for i in (3, 4, 5, 7)]
    born = _plain_number(raw[6], 18)
    if None in ints or born is None:
        return None
    reconsume = max_reconsume = None
    unit_mode: bool | None = False
    if raw[9] is not _ABSENT and (reconsume := _plain_number(raw[9], 9)) is None:
        return None
    if raw[10] is not _ABSENT and (unit_mode := _plain_bool(raw[10])) is None:
        return None
    if raw[11] is not _ABSENT and (max_reconsume := _plain_number(raw[11], 9)) is None:
        return None
    is_batch: bool | None = True
    if not batch:
        is_batch = False if raw[12] is _ABSENT else _plain_bool(raw[12])
        if is_batch is None:
            return None
    properties = None if raw[8] is _ABSENT else raw[8]
    return cls(
        raw[0], raw[1], raw[2], ints[0], ints[1], ints[2], born, ints[3], properties,
        reconsume, unit_mode, max_reconsume, is_batch,
    )  # fmt: skip


def plain_header_py(ext: Any, spec: Any, cls: Any) -> Any:
    """Python twin of ``pymq.remoting._codecc.plain_header``: a typed header's common case from
    its extFields as cls(*values); spec is (wire name, kind) per field in order, kind "s" (a
    required str), "S" (an optional str), "i" / "l" (a required Java int / long as a plain
    decimal) or "b" (a boolean, False when absent); None when a field is not plain."""
    if type(ext) is not dict or type(spec) is not tuple or len(spec) > 16:
        return None
    values: list[Any] = []
    for pair in spec:
        if type(pair) is not tuple or len(pair) != 2:
            return None
        name, kind = pair
        if type(kind) is not str:
            raise TypeError(f"kind must be str, not {type(kind).__name__}")
        value = ext.get(name, _ABSENT)
        first = kind[:1]
        if first == "s" or first == "S":
            if value is _ABSENT and first == "S":
                value = None
            elif type(value) is not str:
                return None
        elif first == "i" or first == "l":
            value = _plain_number(value, 9 if first == "i" else 18)
            if value is None:
                return None
        elif first == "b":
            value = False if value is _ABSENT else _plain_bool(value)
            if value is None:
                return None
        else:
            return None
        values.append(value)
    return cls(*values)


# from_ext's common case: the C module's when built, else its twin above; a header outside it
# (None) goes on to the general decoder, which judges and words it.
_send_header: Callable[..., Any] = getattr(_native, "send_header", send_header_py)
_plain_header: Callable[..., Any] = getattr(_native, "plain_header", plain_header_py)
# EndTransactionRequestHeader's fields for _plain_header: (wire name, kind) in field order.
_END_SPEC = (
    ("producerGroup", "s"),
    ("tranStateTableOffset", "l"),
    ("commitLogOffset", "l"),
    ("commitOrRollback", "i"),
    ("msgId", "s"),
    ("fromTransactionCheck", "b"),
    ("transactionId", "S"),
)


@attrs.define(slots=True)
class SendMessageRequestHeader:
    """SEND_MESSAGE (10) and SEND_REPLY_MESSAGE (324) with long names; SEND_MESSAGE_V2 (310),
    SEND_BATCH_MESSAGE (320) and SEND_REPLY_MESSAGE_V2 (325) carry the same fields under V2's
    one-letter names (``a``..``m``)."""

    producer_group: str = _req("producerGroup", STR)
    topic: str = _req("topic", STR)
    default_topic: str = _req("defaultTopic", STR)
    default_topic_queue_nums: int = _req("defaultTopicQueueNums", INT)
    queue_id: int = _req("queueId", INT)
    sys_flag: int = _req("sysFlag", INT)
    born_timestamp: int = _req("bornTimestamp", LONG)
    flag: int = _req("flag", INT)
    properties: str | None = _field("properties", STR)
    reconsume_times: int | None = _field("reconsumeTimes", INT)
    unit_mode: bool = _field("unitMode", BOOL, default=False)
    max_reconsume_times: int | None = _field("maxReconsumeTimes", INT)
    batch: bool = _field("batch", BOOL, default=False)

    @classmethod
    def from_ext(cls, code: int, ext: dict[str, str]) -> SendMessageRequestHeader:
        """The send header of a request with ``code``: the hot path's decoder, equivalent to
        :func:`decode` on the long names (the tests check it field by field)."""
        names = _LONG_NAMES if code in _LONG_NAME_CODES else _SHORT_NAMES
        header: SendMessageRequestHeader | None = _send_header(
            ext, names, cls, code == _SEND_BATCH_MESSAGE
        )
        if header is not None:  # the common case
            return header
        get = ext.get
        values: list[Any] = [get(name) for name in names]  # the first 8 checked non-None below
        for index in range(8):  # the @CFNotNull fields come first
            if values[index] is None:
                raise HeaderError(f"the custom field <{names[index]}> is null")
        reconsume = values[9]
        max_reconsume = values[11]
        unit_mode = values[10]
        batch = values[12]
        return cls(
            values[0],
            values[1],
            values[2],
            java_int(names[3], values[3]),
            java_int(names[4], values[4]),
            java_int(names[5], values[5]),
            java_long(names[6], values[6]),
            java_int(names[7], values[7]),
            values[8],
            None if reconsume is None else java_int(names[9], reconsume),
            False if unit_mode is None else java_bool(unit_mode),
            None if max_reconsume is None else java_int(names[11], max_reconsume),
            code == _SEND_BATCH_MESSAGE or (batch is not None and java_bool(batch)),
        )

    @staticmethod
    def v2_ext(
        producer_group: str,
        topic: str,
        queue_id: int,
        sys_flag: int,
        born_timestamp: int,
        flag: int,
        properties: str,
        batch: bool,
        default_topic: str = AUTO_CREATE_TOPIC_KEY_TOPIC,
        default_topic_queue_nums: int = 4,
    ) -> dict[str, str]:
        """The extFields of a producer's SEND_MESSAGE_V2 (reconsumeTimes 0, unitMode false),
        as Java producers write them: the hot path's encoder, equal to ``to_ext(v2=True)`` of
        the same header (the tests compare them)."""
        return {
            "a": producer_group,
            "b": topic,
            "c": default_topic,
            "d": str(default_topic_queue_nums),
            "e": str(queue_id),
            "f": str(sys_flag),
            "g": str(born_timestamp),
            "h": str(flag),
            "i": properties,
            "j": "0",
            "k": "false",
            "m": "true" if batch else "false",
        }

    @staticmethod
    def v2_json_prefix(
        producer_group: str,
        topic: str,
        default_topic: str = AUTO_CREATE_TOPIC_KEY_TOPIC,
        default_topic_queue_nums: int = 4,
    ) -> str:
        """The first members of :meth:`v2_json`, the same for every send to ``topic`` (a
        producer keeps it per topic)."""
        return (
            f'"a":{_quote(producer_group)},"b":{_quote(topic)},"c":{_quote(default_topic)},'
            f'"d":"{default_topic_queue_nums}",'
        )

    @staticmethod
    def v2_json(prefix: str, ext: dict[str, str]) -> str:
        """``ext`` (from :meth:`v2_ext`) as JSON members (``RemotingCommand.ext_json``), after
        ``prefix`` (from :meth:`v2_json_prefix` for the same group and topic): only the
        properties need quoting per message, the rest are numbers and flags."""
        return (
            f'{prefix}"e":"{ext["e"]}","f":"{ext["f"]}","g":"{ext["g"]}","h":"{ext["h"]}",'
            f'"i":{_quote(ext["i"])},"j":"0","k":"false","m":"{ext["m"]}"'
        )

    def to_ext(self, *, v2: bool) -> dict[str, str]:
        """The header as a producer writes it, with V2's short names when ``v2``."""
        ext = encode(self)
        if v2:
            long_to_short = dict(zip(_LONG_NAMES, _SHORT_NAMES, strict=True))
            return {long_to_short[k]: v for k, v in ext.items()}
        return ext


@attrs.define(slots=True)
class SendMessageResponseHeader:
    msg_id: str = _req("msgId", STR)
    queue_id: int = _req("queueId", INT)
    queue_offset: int = _req("queueOffset", LONG)
    transaction_id: str | None = _field("transactionId", STR)
    # RocketMQ 5: a timer message's send (SEND_MESSAGE / SEND_MESSAGE_V2) answers the handle
    # RECALL_MESSAGE takes to cancel it (pymq/broker/processors/recall.py).
    recall_handle: str | None = _field("recallHandle", STR)

    @classmethod
    def from_ext(cls, ext: dict[str, str]) -> SendMessageResponseHeader:
        """The send answer's header, validated as :func:`decode` does (the producer's path)."""
        msg_id, queue_id, queue_offset = (
            ext.get("msgId"),
            ext.get("queueId"),
            ext.get("queueOffset"),
        )
        if msg_id is None or queue_id is None or queue_offset is None:
            return decode(cls, ext)  # names the missing field
        return cls(
            msg_id,
            java_int("queueId", queue_id),
            java_long("queueOffset", queue_offset),
            ext.get("transactionId"),
            ext.get("recallHandle"),
        )

    @staticmethod
    def ext_json(
        msg_id: str, queue_id: int, queue_offset: int, quoted_region: str, trace_on: bool
    ) -> str:
        """The send answer's extFields as JSON members (``RemotingCommand.ext_json``), with the
        broker's MSG_REGION (already JSON-quoted) and TRACE_ON: the hot path's encoder, equal
        to writing the same fields through the codec (the tests compare them).  A hex message
        id and numbers need no escaping."""
        trace = "true" if trace_on else "false"
        return (
            f'"msgId":"{msg_id}","queueId":"{queue_id}","queueOffset":"{queue_offset}",'
            f'"MSG_REGION":{quoted_region},"TRACE_ON":"{trace}"'
        )


@attrs.define(slots=True)
class RecallMessageRequestHeader:
    """RECALL_MESSAGE (370, RocketMQ 5's RecallMessageRequestHeader; ``bname`` is the RPC
    header's broker name, which the Java client sets and the broker does not read)."""

    producer_group: str | None = _field("producerGroup", STR)
    topic: str = _req("topic", STR)
    recall_handle: str = _req("recallHandle", STR)
    broker_name: str | None = _field("bname", STR)


@attrs.define(slots=True)
class RecallMessageResponseHeader:
    """The recalled message's id (its UNIQ_KEY)."""

    msg_id: str = _req("msgId", STR)


@attrs.define(slots=True)
class ConsumerSendMsgBackRequestHeader:
    offset: int = _req("offset", LONG)
    group: str = _req("group", STR)
    delay_level: int = _req("delayLevel", INT)
    origin_msg_id: str | None = _field("originMsgId", STR)
    origin_topic: str | None = _field("originTopic", STR)
    unit_mode: bool = _field("unitMode", BOOL, default=False)
    max_reconsume_times: int | None = _field("maxReconsumeTimes", INT)


@attrs.define(slots=True)
class ReplyMessageRequestHeader:
    """PUSH_REPLY_MESSAGE_TO_CLIENT (326), broker to the requester: the reply's send header
    (as the responder sent it; its properties with PUSH_REPLY_TIME added) and where it came
    from (``bornHost``, ``storeHost`` as ``ip:port``); the body is the reply's."""

    producer_group: str = _req("producerGroup", STR)
    topic: str = _req("topic", STR)
    default_topic: str = _req("defaultTopic", STR)
    default_topic_queue_nums: int = _req("defaultTopicQueueNums", INT)
    queue_id: int = _req("queueId", INT)
    sys_flag: int = _req("sysFlag", INT)
    born_timestamp: int = _req("bornTimestamp", LONG)
    flag: int = _req("flag", INT)
    properties: str | None = _field("properties", STR)
    reconsume_times: int | None = _field("reconsumeTimes", INT)
    unit_mode: bool = _field("unitMode", BOOL, default=False)
    born_host: str = _req("bornHost", STR)
    store_host: str = _req("storeHost", STR)
    store_timestamp: int = _req("storeTimestamp", LONG)


# -- transactions ----------------------------------------------------------------------------

# MessageSysFlag's transaction types, as END_TRANSACTION's commitOrRollback carries them.
TRANSACTION_NOT_TYPE = 0
TRANSACTION_COMMIT_TYPE = 8
TRANSACTION_ROLLBACK_TYPE = 12


@attrs.define(slots=True)
class EndTransactionRequestHeader:
    """END_TRANSACTION (37), a producer's oneway COMMIT (8), ROLLBACK (12) or UNKNOW (0) of the
    half message at ``commitLogOffset`` / ``tranStateTableOffset`` (its half-queue offset)."""

    producer_group: str = _req("producerGroup", STR)
    tran_state_table_offset: int = _req("tranStateTableOffset", LONG)
    commit_log_offset: int = _req("commitLogOffset", LONG)
    commit_or_rollback: int = _req("commitOrRollback", INT)
    msg_id: str = _req("msgId", STR)
    from_transaction_check: bool = _field("fromTransactionCheck", BOOL, default=False)
    transaction_id: str | None = _field("transactionId", STR)

    @classmethod
    def from_ext(cls, ext: dict[str, str]) -> EndTransactionRequestHeader:
        """The header of an END_TRANSACTION, validated as :func:`decode` does (the hot path's
        decoder: one per transaction; the tests compare it with :func:`decode`)."""
        header: EndTransactionRequestHeader | None = _plain_header(ext, _END_SPEC, cls)
        if header is not None:  # the common case
            return header
        get = ext.get
        group = get("producerGroup")
        table_offset = get("tranStateTableOffset")
        log_offset = get("commitLogOffset")
        kind = get("commitOrRollback")
        msg_id = get("msgId")
        if group is None or table_offset is None or log_offset is None or kind is None:
            return decode(cls, ext)  # names the missing field
        if msg_id is None:
            return decode(cls, ext)
        from_check = get("fromTransactionCheck")
        return cls(
            group,
            java_long("tranStateTableOffset", table_offset),
            java_long("commitLogOffset", log_offset),
            java_int("commitOrRollback", kind),
            msg_id,
            False if from_check is None else java_bool(from_check),
            get("transactionId"),
        )

    @staticmethod
    def producer_ext(
        producer_group: str,
        tran_state_table_offset: int,
        commit_log_offset: int,
        commit_or_rollback: int,
        msg_id: str,
    ) -> dict[str, str]:
        """The extFields of a producer's own END_TRANSACTION (not from a check), as the Java
        client writes them: the hot path's encoder, equal to :func:`encode` of the same header
        (the tests compare them)."""
        return {
            "producerGroup": producer_group,
            "tranStateTableOffset": str(tran_state_table_offset),
            "commitLogOffset": str(commit_log_offset),
            "commitOrRollback": str(commit_or_rollback),
            "msgId": msg_id,
            "fromTransactionCheck": "false",
        }

    @staticmethod
    def producer_json(ext: dict[str, str]) -> str:
        """``ext`` (from :meth:`producer_ext`) as JSON members (``RemotingCommand.ext_json``):
        the hot path's writer, equal to the codec's for the same fields (the tests compare
        them); the numbers need no escaping."""
        return (
            f'"producerGroup":{_quote(ext["producerGroup"])},'
            f'"tranStateTableOffset":"{ext["tranStateTableOffset"]}",'
            f'"commitLogOffset":"{ext["commitLogOffset"]}",'
            f'"commitOrRollback":"{ext["commitOrRollback"]}",'
            f'"msgId":{_quote(ext["msgId"])},"fromTransactionCheck":"false"'
        )

    def __attrs_post_init__(self) -> None:
        # EndTransactionRequestHeader.checkFields
        if self.commit_or_rollback not in (
            TRANSACTION_NOT_TYPE,
            TRANSACTION_COMMIT_TYPE,
            TRANSACTION_ROLLBACK_TYPE,
        ):
            raise HeaderError("commitOrRollback field wrong")


@attrs.define(slots=True)
class CheckTransactionStateRequestHeader:
    """CHECK_TRANSACTION_STATE (39), broker to producer (oneway): the half message's offsets;
    the body is the message in the commit-log record layout."""

    tran_state_table_offset: int = _req("tranStateTableOffset", LONG)
    commit_log_offset: int = _req("commitLogOffset", LONG)
    msg_id: str | None = _field("msgId", STR)
    transaction_id: str | None = _field("transactionId", STR)
    offset_msg_id: str | None = _field("offsetMsgId", STR)


# -- pull and consumers ----------------------------------------------------------------------


@attrs.define(slots=True)
class PullMessageRequestHeader:
    consumer_group: str = _req("consumerGroup", STR)
    topic: str = _req("topic", STR)
    queue_id: int = _req("queueId", INT)
    queue_offset: int = _req("queueOffset", LONG)
    max_msg_nums: int = _req("maxMsgNums", INT)
    sys_flag: int = _req("sysFlag", INT)
    commit_offset: int = _req("commitOffset", LONG)
    suspend_timeout_millis: int = _req("suspendTimeoutMillis", LONG)
    subscription: str | None = _field("subscription", STR)
    sub_version: int = _req("subVersion", LONG)
    expression_type: str | None = _field("expressionType", STR)


@attrs.define(slots=True)
class PullMessageResponseHeader:
    suggest_which_broker_id: int = _req("suggestWhichBrokerId", LONG)
    next_begin_offset: int = _req("nextBeginOffset", LONG)
    min_offset: int = _req("minOffset", LONG)
    max_offset: int = _req("maxOffset", LONG)


@attrs.define(slots=True)
class UnregisterClientRequestHeader:
    client_id: str = _req("clientID", STR)
    producer_group: str | None = _field("producerGroup", STR)
    consumer_group: str | None = _field("consumerGroup", STR)


@attrs.define(slots=True)
class ConsumerGroupHeader:
    """GET_CONSUMER_LIST_BY_GROUP and GET_CONSUMER_CONNECTION_LIST."""

    consumer_group: str = _req("consumerGroup", STR)


@attrs.define(slots=True)
class QueryConsumerOffsetRequestHeader:
    consumer_group: str = _req("consumerGroup", STR)
    topic: str = _req("topic", STR)
    queue_id: int = _req("queueId", INT)


@attrs.define(slots=True)
class UpdateConsumerOffsetRequestHeader:
    consumer_group: str = _req("consumerGroup", STR)
    topic: str = _req("topic", STR)
    queue_id: int = _req("queueId", INT)
    commit_offset: int = _req("commitOffset", LONG)


# -- broker admin ------------------------------------------------------------------------------


@attrs.define(slots=True)
class CreateTopicRequestHeader:
    topic: str = _req("topic", STR)
    default_topic: str = _req("defaultTopic", STR)
    read_queue_nums: int = _req("readQueueNums", INT)
    write_queue_nums: int = _req("writeQueueNums", INT)
    perm: int = _req("perm", INT)
    topic_filter_type: str = _req("topicFilterType", STR)
    topic_sys_flag: int | None = _field("topicSysFlag", INT)
    order: bool = _req("order", BOOL)
    # RocketMQ 5: attribute changes, "+message.type=FIFO" (comma-separated; "-key" removes).
    attributes: str | None = _field("attributes", STR)


@attrs.define(slots=True)
class TopicHeader:
    """DELETE_TOPIC_IN_BROKER, GET_TOPIC_STATS_INFO, GET_ROUTEINFO_BY_TOPIC,
    DELETE_TOPIC_IN_NAMESRV: a topic and nothing else."""

    topic: str = _req("topic", STR)


@attrs.define(slots=True)
class TopicQueueHeader:
    """GET_MAX_OFFSET, GET_MIN_OFFSET, GET_EARLIEST_MSG_STORETIME."""

    topic: str = _req("topic", STR)
    queue_id: int = _req("queueId", INT)


@attrs.define(slots=True)
class SearchOffsetRequestHeader:
    topic: str = _req("topic", STR)
    queue_id: int = _req("queueId", INT)
    timestamp: int = _req("timestamp", LONG)


@attrs.define(slots=True)
class ViewMessageRequestHeader:
    offset: int = _req("offset", LONG)


@attrs.define(slots=True)
class QueryMessageRequestHeader:
    topic: str = _req("topic", STR)
    key: str = _req("key", STR)
    max_num: int = _req("maxNum", INT)
    begin_timestamp: int = _req("beginTimestamp", LONG)
    end_timestamp: int = _req("endTimestamp", LONG)
    # Not a field of Java's class: the client adds it to ask for a UNIQ_KEY lookup.
    unique_key_query: bool = _field("_UNIQUE_KEY_QUERY", BOOL, default=False)


@attrs.define(slots=True)
class DeleteSubscriptionGroupRequestHeader:
    group_name: str = _req("groupName", STR)


@attrs.define(slots=True)
class GetConsumeStatsRequestHeader:
    consumer_group: str = _req("consumerGroup", STR)
    topic: str | None = _field("topic", STR)


@attrs.define(slots=True)
class ResetOffsetRequestHeader:
    topic: str = _req("topic", STR)
    group: str = _req("group", STR)
    timestamp: int = _req("timestamp", LONG)
    is_force: bool = _req("isForce", BOOL)


@attrs.define(slots=True)
class ProducerGroupHeader:
    """GET_PRODUCER_CONNECTION_LIST."""

    producer_group: str = _req("producerGroup", STR)


@attrs.define(slots=True)
class QueryConsumeTimeSpanRequestHeader:
    topic: str = _req("topic", STR)
    group: str = _req("group", STR)


@attrs.define(slots=True)
class ViewBrokerStatsDataRequestHeader:
    stats_name: str = _req("statsName", STR)
    stats_key: str = _req("statsKey", STR)


@attrs.define(slots=True)
class GetConsumeStatsInBrokerHeader:
    is_order: bool = _req("isOrder", BOOL)


@attrs.define(slots=True)
class GetConsumerRunningInfoRequestHeader:
    """GET_CONSUMER_RUNNING_INFO, to the broker and relayed by it to the client."""

    consumer_group: str = _req("consumerGroup", STR)
    client_id: str = _req("clientId", STR)
    jstack_enable: bool = _field("jstackEnable", BOOL, default=False)


@attrs.define(slots=True)
class ConsumeMessageDirectlyResultRequestHeader:
    """CONSUME_MESSAGE_DIRECTLY, to the broker and relayed by it (with ``brokerName`` set and
    the message as body) to the client."""

    consumer_group: str = _req("consumerGroup", STR)
    client_id: str | None = _field("clientId", STR)
    msg_id: str | None = _field("msgId", STR)
    broker_name: str | None = _field("brokerName", STR)


@attrs.define(slots=True)
class GetConsumerStatusRequestHeader:
    """INVOKE_BROKER_TO_GET_CONSUMER_STATUS, and GET_CONSUMER_STATUS_FROM_CLIENT (the broker's
    call to each client, without ``clientAddr``: a client id, or blank for all)."""

    topic: str = _req("topic", STR)
    group: str = _req("group", STR)
    client_addr: str | None = _field("clientAddr", STR)


@attrs.define(slots=True)
class CloneGroupOffsetRequestHeader:
    src_group: str = _req("srcGroup", STR)
    dest_group: str = _req("destGroup", STR)
    topic: str | None = _field("topic", STR)
    offline: bool = _field("offline", BOOL, default=False)


@attrs.define(slots=True)
class ResumeCheckHalfMessageRequestHeader:
    """RESUME_CHECK_HALF_MESSAGE (323): the offset message id of a transaction's message that
    the check service gave up (in TRANS_CHECK_MAX_TIME_TOPIC)."""

    msg_id: str = _req("msgId", STR)


@attrs.define(slots=True)
class QueryCorrectionOffsetHeader:
    """QUERY_CORRECTION_OFFSET (308): ``filterGroups`` is a comma-separated list."""

    filter_groups: str | None = _field("filterGroups", STR)
    compare_group: str = _req("compareGroup", STR)
    topic: str = _req("topic", STR)


@attrs.define(slots=True)
class QueryConsumeQueueRequestHeader:
    topic: str = _req("topic", STR)
    queue_id: int = _req("queueId", INT)
    index: int = _req("index", LONG)
    count: int = _req("count", INT)
    consumer_group: str | None = _field("consumerGroup", STR)


# -- name server -------------------------------------------------------------------------------


@attrs.define(slots=True)
class PutKVConfigRequestHeader:
    namespace: str = _req("namespace", STR)
    key: str = _req("key", STR)
    value: str = _req("value", STR)


@attrs.define(slots=True)
class KVConfigRequestHeader:
    """GET_KV_CONFIG and DELETE_KV_CONFIG."""

    namespace: str = _req("namespace", STR)
    key: str = _req("key", STR)


@attrs.define(slots=True)
class NamespaceHeader:
    namespace: str = _req("namespace", STR)


@attrs.define(slots=True)
class GetRouteInfoRequestHeader:
    """GET_ROUTEINFO_BY_TOPIC as the name server reads it (clients send a TopicHeader)."""

    topic: str = _req("topic", STR)
    accept_standard_json_only: bool = _field("acceptStandardJsonOnly", BOOL, default=False)


@attrs.define(slots=True)
class RegisterBrokerRequestHeader:
    broker_name: str = _req("brokerName", STR)
    broker_addr: str = _req("brokerAddr", STR)
    cluster_name: str = _req("clusterName", STR)
    ha_server_addr: str = _req("haServerAddr", STR)
    broker_id: int = _req("brokerId", LONG)
    compressed: bool = _field("compressed", BOOL, default=False)
    body_crc32: int = _field("bodyCrc32", INT, default=0)


@attrs.define(slots=True)
class BrokerIdentityHeader:
    """UNREGISTER_BROKER and QUERY_DATA_VERSION."""

    broker_name: str = _req("brokerName", STR)
    broker_addr: str = _req("brokerAddr", STR)
    cluster_name: str = _req("clusterName", STR)
    broker_id: int = _req("brokerId", LONG)


@attrs.define(slots=True)
class BrokerNameHeader:
    """WIPE_WRITE_PERM_OF_BROKER and ADD_WRITE_PERM_OF_BROKER."""

    broker_name: str = _req("brokerName", STR)


@attrs.define(slots=True)
class ClusterHeader:
    """GET_TOPICS_BY_CLUSTER."""

    cluster: str = _req("cluster", STR)


# -- broker to client ------------------------------------------------------------------------


@attrs.define(slots=True)
class NotifyConsumerIdsChangedRequestHeader:
    consumer_group: str = _req("consumerGroup", STR)


# -- ACL (the broker's admin codes 50-54) -------------------------------------------------------


@attrs.define(slots=True)
class CreateAccessConfigRequestHeader:
    """UPDATE_AND_CREATE_ACL_CONFIG (50); topicPerms / groupPerms are comma lists."""

    access_key: str = _req("accessKey", STR)
    secret_key: str | None = _field("secretKey", STR)
    white_remote_address: str | None = _field("whiteRemoteAddress", STR)
    admin: bool = _field("admin", BOOL, default=False)
    default_topic_perm: str | None = _field("defaultTopicPerm", STR)
    default_group_perm: str | None = _field("defaultGroupPerm", STR)
    topic_perms: str | None = _field("topicPerms", STR)
    group_perms: str | None = _field("groupPerms", STR)


@attrs.define(slots=True)
class DeleteAccessConfigRequestHeader:
    access_key: str = _req("accessKey", STR)


@attrs.define(slots=True)
class UpdateGlobalWhiteAddrsConfigRequestHeader:
    """UPDATE_GLOBAL_WHITE_ADDRS_CONFIG (53): a comma list, and the file (default
    plain_acl.yml)."""

    global_white_addrs: str = _req("globalWhiteAddrs", STR)
    acl_file_full_path: str | None = _field("aclFileFullPath", STR)


@attrs.define(slots=True)
class GetBrokerAclConfigResponseHeader:
    """GET_BROKER_CLUSTER_ACL_INFO's (52) answer."""

    version: str = _req("version", STR)
    all_acl_file_version: str | None = _field("allAclFileVersion", STR)
    broker_name: str = _req("brokerName", STR)
    broker_addr: str = _req("brokerAddr", STR)
    cluster_name: str = _req("clusterName", STR)


def extend_ext_json(ext_json: str, fields: dict[str, str]) -> str:
    """Pre-written extFields JSON (the text between the braces) with ``fields`` appended: the
    client's ACL signature added to the send path's header without writing it again."""
    extra = ",".join(f"{_quote(key)}:{_quote(value)}" for key, value in fields.items())
    if not ext_json:
        return extra
    return f"{ext_json},{extra}" if extra else ext_json


# -- response headers answered with fields (beside the send answer's, above) ---------------


@attrs.define(slots=True)
class OffsetResponseHeader:
    """The answer of SEARCH_OFFSET_BY_TIMESTAMP, GET_MAX_OFFSET, GET_MIN_OFFSET and
    QUERY_CONSUMER_OFFSET (Java's SearchOffset-, GetMaxOffset-, GetMinOffset- and
    QueryConsumerOffsetResponseHeader: one ``offset``)."""

    offset: int = _req("offset", LONG)


@attrs.define(slots=True)
class GetEarliestMsgStoretimeResponseHeader:
    timestamp: int = _req("timestamp", LONG)


@attrs.define(slots=True)
class GetBrokerConfigResponseHeader:
    version: str = _req("version", STR)


@attrs.define(slots=True)
class GetKVConfigResponseHeader:
    value: str | None = _field("value", STR)


@attrs.define(slots=True)
class QueryDataVersionResponseHeader:
    changed: bool | None = _field("changed", BOOL)


@attrs.define(slots=True)
class RegisterBrokerResponseHeader:
    ha_server_addr: str | None = _field("haServerAddr", STR)
    master_addr: str | None = _field("masterAddr", STR)


@attrs.define(slots=True)
class WipeWritePermOfBrokerResponseHeader:
    wipe_topic_count: int = _req("wipeTopicCount", INT)


@attrs.define(slots=True)
class AddWritePermOfBrokerResponseHeader:
    add_topic_count: int = _req("addTopicCount", INT)


_RC = RequestCode

# The header class of each request code served by the broker or the name server.  A code not
# listed carries no header fields (or only a body).
REQUEST_HEADERS: dict[int, type] = {
    _RC.SEND_MESSAGE: SendMessageRequestHeader,
    _RC.SEND_MESSAGE_V2: SendMessageRequestHeader,
    _RC.SEND_BATCH_MESSAGE: SendMessageRequestHeader,
    _RC.SEND_REPLY_MESSAGE: SendMessageRequestHeader,
    _RC.SEND_REPLY_MESSAGE_V2: SendMessageRequestHeader,
    _RC.PUSH_REPLY_MESSAGE_TO_CLIENT: ReplyMessageRequestHeader,
    _RC.QUERY_CORRECTION_OFFSET: QueryCorrectionOffsetHeader,
    _RC.RESUME_CHECK_HALF_MESSAGE: ResumeCheckHalfMessageRequestHeader,
    _RC.CONSUMER_SEND_MSG_BACK: ConsumerSendMsgBackRequestHeader,
    _RC.RECALL_MESSAGE: RecallMessageRequestHeader,
    _RC.END_TRANSACTION: EndTransactionRequestHeader,
    _RC.CHECK_TRANSACTION_STATE: CheckTransactionStateRequestHeader,
    _RC.PULL_MESSAGE: PullMessageRequestHeader,
    _RC.UNREGISTER_CLIENT: UnregisterClientRequestHeader,
    _RC.GET_CONSUMER_LIST_BY_GROUP: ConsumerGroupHeader,
    _RC.QUERY_CONSUMER_OFFSET: QueryConsumerOffsetRequestHeader,
    _RC.UPDATE_CONSUMER_OFFSET: UpdateConsumerOffsetRequestHeader,
    _RC.UPDATE_AND_CREATE_TOPIC: CreateTopicRequestHeader,
    _RC.DELETE_TOPIC_IN_BROKER: TopicHeader,
    _RC.SEARCH_OFFSET_BY_TIMESTAMP: SearchOffsetRequestHeader,
    _RC.GET_MAX_OFFSET: TopicQueueHeader,
    _RC.GET_MIN_OFFSET: TopicQueueHeader,
    _RC.GET_EARLIEST_MSG_STORETIME: TopicQueueHeader,
    _RC.VIEW_MESSAGE_BY_ID: ViewMessageRequestHeader,
    _RC.QUERY_MESSAGE: QueryMessageRequestHeader,
    _RC.DELETE_SUBSCRIPTIONGROUP: DeleteSubscriptionGroupRequestHeader,
    _RC.GET_CONSUMER_CONNECTION_LIST: ConsumerGroupHeader,
    _RC.GET_TOPIC_STATS_INFO: TopicHeader,
    _RC.GET_CONSUME_STATS: GetConsumeStatsRequestHeader,
    _RC.INVOKE_BROKER_TO_RESET_OFFSET: ResetOffsetRequestHeader,
    _RC.GET_PRODUCER_CONNECTION_LIST: ProducerGroupHeader,
    _RC.QUERY_TOPIC_CONSUME_BY_WHO: TopicHeader,
    _RC.QUERY_CONSUME_TIME_SPAN: QueryConsumeTimeSpanRequestHeader,
    _RC.VIEW_BROKER_STATS_DATA: ViewBrokerStatsDataRequestHeader,
    _RC.GET_BROKER_CONSUME_STATS: GetConsumeStatsInBrokerHeader,
    _RC.GET_CONSUMER_RUNNING_INFO: GetConsumerRunningInfoRequestHeader,
    _RC.CONSUME_MESSAGE_DIRECTLY: ConsumeMessageDirectlyResultRequestHeader,
    _RC.RESET_CONSUMER_CLIENT_OFFSET: ResetOffsetRequestHeader,
    _RC.INVOKE_BROKER_TO_GET_CONSUMER_STATUS: GetConsumerStatusRequestHeader,
    _RC.GET_CONSUMER_STATUS_FROM_CLIENT: GetConsumerStatusRequestHeader,
    _RC.CLONE_GROUP_OFFSET: CloneGroupOffsetRequestHeader,
    _RC.QUERY_CONSUME_QUEUE: QueryConsumeQueueRequestHeader,
    _RC.PUT_KV_CONFIG: PutKVConfigRequestHeader,
    _RC.GET_KV_CONFIG: KVConfigRequestHeader,
    _RC.DELETE_KV_CONFIG: KVConfigRequestHeader,
    _RC.GET_KVLIST_BY_NAMESPACE: NamespaceHeader,
    _RC.QUERY_DATA_VERSION: BrokerIdentityHeader,
    _RC.REGISTER_BROKER: RegisterBrokerRequestHeader,
    _RC.UNREGISTER_BROKER: BrokerIdentityHeader,
    _RC.GET_ROUTEINFO_BY_TOPIC: GetRouteInfoRequestHeader,
    _RC.WIPE_WRITE_PERM_OF_BROKER: BrokerNameHeader,
    _RC.ADD_WRITE_PERM_OF_BROKER: BrokerNameHeader,
    _RC.DELETE_TOPIC_IN_NAMESRV: TopicHeader,
    _RC.GET_TOPICS_BY_CLUSTER: ClusterHeader,
    _RC.NOTIFY_CONSUMER_IDS_CHANGED: NotifyConsumerIdsChangedRequestHeader,
    _RC.UPDATE_AND_CREATE_ACL_CONFIG: CreateAccessConfigRequestHeader,
    _RC.DELETE_ACL_CONFIG: DeleteAccessConfigRequestHeader,
    _RC.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG: UpdateGlobalWhiteAddrsConfigRequestHeader,
}


def decode_request(request: Any, cls: type | None = None) -> Any:
    """Decode and validate ``request``'s header once, keep it in ``request.header`` and return
    it (None for a code without header fields); raises :class:`HeaderError`.  ``cls`` is the
    header class the server's route names for the code (RemotingServer.routes); without it,
    the class :data:`REQUEST_HEADERS` names (a client's requests from the server)."""
    header = request.header
    if header is not None:
        return header
    code = request.code
    if cls is None:
        cls = REQUEST_HEADERS.get(code)
        if cls is None:
            return None
    if cls is SendMessageRequestHeader:
        header = SendMessageRequestHeader.from_ext(code, request.ext_fields)
    elif cls is EndTransactionRequestHeader:
        header = EndTransactionRequestHeader.from_ext(request.ext_fields)
    else:
        header = decode(cls, request.ext_fields)
    request.header = header
    return header
