"""DLedger 0.2.6's peer protocol: request codes and the JSON bodies of its requests and
responses, as ``DLedgerRpcNettyService`` exchanges them in RocketMQ remoting frames.

A request is a RocketMQ remoting request whose code is a :class:`RequestCode`, with no header
fields and the request object as its body, written by fastjson (``JSON.toJSONBytes``); the
answer is a remoting response whose code is always 200 (``DLedgerResponseCode.SUCCESS``) and
whose body is the response object: the outcome is its ``code`` field
(:class:`pymq.dledger.errors.ResponseCode`).  A Java peer answers nothing to a request code it
does not know (it logs it), so a caller must time out.

fastjson writes a bean's getters, in alphabetical order, nulls left out; ``byte[]`` as base64;
enums by name.  So a ``PushEntryRequest`` also carries its derived getters (``batch``,
``count``, ``firstEntryIndex``, ``lastEntryIndex``, ``totalSize``), which fastjson does not
read back (they have no setters): :func:`encode` writes them, :func:`decode` ignores them, as
it ignores every field it does not know.

:func:`decode` checks every field it reads: its JSON type, that a number fits its Java type
(int or long), that base64 is well-formed, that an entry's ``size`` agrees with its body,
and the limits (:data:`MAX_BATCH_ENTRIES` entries, :data:`MAX_LIST_ITEMS` indexes or peers);
a body that fails is a :class:`ProtocolError` (``UNEXPECTED_ARGUMENT``) naming the field,
never an exception of another kind.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import enum
import json
from typing import Any, ClassVar, TypeVar

import attrs

from pymq.dledger.errors import DLedgerError, ResponseCode
from pymq.dledger.store import BODY_OFFSET, MAX_ENTRY_SIZE, DLedgerEntry
from pymq.remoting.protocol.fastjson import MAX_DEPTH as FASTJSON_MAX_DEPTH
from pymq.remoting.protocol.fastjson import dumps, loads

MAX_BATCH_ENTRIES = 4096
"""Entries one push or one answer may carry (DLedger batches by ``maxBatchPushSize``, 4 KiB of
entries by default)."""
MAX_LIST_ITEMS = 4096
"""Indexes of a GET request, or peers of a METADATA answer."""

_INT = (-(2**31), 2**31 - 1)
_LONG = (-(2**63), 2**63 - 1)


class RequestCode(enum.IntEnum):
    """``DLedgerRequestCode`` (0.2.6)."""

    UNKNOWN = -1
    METADATA = 50000
    APPEND = 50001
    GET = 50002
    VOTE = 51001
    HEART_BEAT = 51002
    PULL = 51003
    PUSH = 51004
    LEADERSHIP_TRANSFER = 51005


class VoteResult(enum.Enum):
    """``VoteResponse.RESULT``, written by name."""

    UNKNOWN = "UNKNOWN"
    ACCEPT = "ACCEPT"
    REJECT_UNKNOWN_LEADER = "REJECT_UNKNOWN_LEADER"
    REJECT_UNEXPECTED_LEADER = "REJECT_UNEXPECTED_LEADER"
    REJECT_EXPIRED_VOTE_TERM = "REJECT_EXPIRED_VOTE_TERM"
    REJECT_ALREADY_VOTED = "REJECT_ALREADY_VOTED"
    REJECT_ALREADY_HAS_LEADER = "REJECT_ALREADY_HAS_LEADER"
    REJECT_TERM_NOT_READY = "REJECT_TERM_NOT_READY"
    REJECT_TERM_SMALL_THAN_LEDGER = "REJECT_TERM_SMALL_THAN_LEDGER"
    REJECT_EXPIRED_LEDGER_TERM = "REJECT_EXPIRED_LEDGER_TERM"
    REJECT_SMALL_LEDGER_END_INDEX = "REJECT_SMALL_LEDGER_END_INDEX"
    REJECT_TAKING_LEADERSHIP = "REJECT_TAKING_LEADERSHIP"


class ParseResult(enum.Enum):
    """``VoteResponse.ParseResult``: how a candidate reads one round of votes."""

    WAIT_TO_REVOTE = "WAIT_TO_REVOTE"
    REVOTE_IMMEDIATELY = "REVOTE_IMMEDIATELY"
    PASSED = "PASSED"
    WAIT_TO_VOTE_NEXT = "WAIT_TO_VOTE_NEXT"


class PushType(enum.Enum):
    """``PushEntryRequest.Type``."""

    APPEND = "APPEND"
    COMMIT = "COMMIT"
    COMPARE = "COMPARE"
    TRUNCATE = "TRUNCATE"


class ProtocolError(DLedgerError):
    """A body that is not the message it should be; the message names the field."""

    def __init__(self, message: str) -> None:
        super().__init__(ResponseCode.UNEXPECTED_ARGUMENT, message)


def _m(key: str, kind: str) -> dict[str, str]:
    """A field's metadata: its Java name and how it is written and read."""
    return {"key": key, "kind": kind}


@attrs.define
class Message:
    """``RequestOrResponse``: the fields every request and response has."""

    group: str | None = attrs.field(default=None, metadata=_m("group", "str"))
    remote_id: str | None = attrs.field(default=None, metadata=_m("remoteId", "str"))
    local_id: str | None = attrs.field(default=None, metadata=_m("localId", "str"))
    code: int = attrs.field(default=ResponseCode.SUCCESS.value, metadata=_m("code", "int"))
    leader_id: str | None = attrs.field(default=None, metadata=_m("leaderId", "str"))
    term: int = attrs.field(default=-1, metadata=_m("term", "long"))

    REQUEST_CODE: ClassVar[RequestCode] = RequestCode.UNKNOWN


@attrs.define
class MetadataRequest(Message):
    REQUEST_CODE: ClassVar[RequestCode] = RequestCode.METADATA


@attrs.define
class MetadataResponse(Message):
    peers: dict[str, str] | None = attrs.field(default=None, metadata=_m("peers", "peers"))


@attrs.define
class AppendEntryRequest(Message):
    body: bytes | None = attrs.field(default=None, metadata=_m("body", "bytes"))
    REQUEST_CODE: ClassVar[RequestCode] = RequestCode.APPEND


@attrs.define
class AppendEntryResponse(Message):
    index: int = attrs.field(default=-1, metadata=_m("index", "long"))
    pos: int = attrs.field(default=-1, metadata=_m("pos", "long"))


@attrs.define
class GetEntriesRequest(Message):
    begin_index: int | None = attrs.field(default=None, metadata=_m("beginIndex", "long?"))
    max_size: int = attrs.field(default=0, metadata=_m("maxSize", "int"))
    index_list: list[int] | None = attrs.field(default=None, metadata=_m("indexList", "longs"))
    REQUEST_CODE: ClassVar[RequestCode] = RequestCode.GET


@attrs.define
class GetEntriesResponse(Message):
    entries: list[DLedgerEntry] = attrs.field(factory=list, metadata=_m("entries", "entries"))


@attrs.define
class VoteRequest(Message):
    ledger_end_index: int = attrs.field(default=-1, metadata=_m("ledgerEndIndex", "long"))
    ledger_end_term: int = attrs.field(default=-1, metadata=_m("ledgerEndTerm", "long"))
    REQUEST_CODE: ClassVar[RequestCode] = RequestCode.VOTE


@attrs.define
class VoteResponse(Message):
    vote_result: VoteResult = attrs.field(
        default=VoteResult.UNKNOWN, metadata=_m("voteResult", "vote")
    )


@attrs.define
class HeartBeatRequest(Message):
    REQUEST_CODE: ClassVar[RequestCode] = RequestCode.HEART_BEAT


@attrs.define
class HeartBeatResponse(Message):
    pass


@attrs.define
class PullEntriesRequest(Message):
    node_id: str | None = attrs.field(default=None, metadata=_m("nodeId", "str"))
    begin_index: int | None = attrs.field(default=None, metadata=_m("beginIndex", "long?"))
    REQUEST_CODE: ClassVar[RequestCode] = RequestCode.PULL


@attrs.define
class PullEntriesResponse(Message):
    entries: list[DLedgerEntry] = attrs.field(factory=list, metadata=_m("entries", "entries"))


@attrs.define
class PushEntryRequest(Message):
    commit_index: int = attrs.field(default=-1, metadata=_m("commitIndex", "long"))
    type: PushType = attrs.field(default=PushType.APPEND, metadata=_m("type", "push"))
    entry: DLedgerEntry | None = attrs.field(default=None, metadata=_m("entry", "entry"))
    batch_entry: list[DLedgerEntry] = attrs.field(
        factory=list, metadata=_m("batchEntry", "entries")
    )
    REQUEST_CODE: ClassVar[RequestCode] = RequestCode.PUSH

    # the getters fastjson writes (and never reads back)
    @property
    def batch(self) -> bool:
        return bool(self.batch_entry)

    @property
    def first_entry_index(self) -> int:
        if self.batch_entry:
            return self.batch_entry[0].index
        return self.entry.index if self.entry is not None else -1

    @property
    def last_entry_index(self) -> int:
        if self.batch_entry:
            return self.batch_entry[-1].index
        return self.entry.index if self.entry is not None else -1

    @property
    def count(self) -> int:
        if self.batch_entry:
            return len(self.batch_entry)
        return 1 if self.entry is not None else 0

    @property
    def total_size(self) -> int:
        return sum(e.size for e in self.batch_entry)

    def entries(self) -> list[DLedgerEntry]:
        """The entries pushed: the batch, or the one entry, or none."""
        if self.batch_entry:
            return list(self.batch_entry)
        return [self.entry] if self.entry is not None else []


@attrs.define
class PushEntryResponse(Message):
    index: int | None = attrs.field(default=None, metadata=_m("index", "long?"))
    begin_index: int = attrs.field(default=0, metadata=_m("beginIndex", "long"))
    end_index: int = attrs.field(default=0, metadata=_m("endIndex", "long"))
    count: int = attrs.field(default=0, metadata=_m("count", "int"))


@attrs.define
class LeadershipTransferRequest(Message):
    transfer_id: str | None = attrs.field(default=None, metadata=_m("transferId", "str"))
    transferee_id: str | None = attrs.field(default=None, metadata=_m("transfereeId", "str"))
    take_leadership_ledger_index: int = attrs.field(
        default=0, metadata=_m("takeLeadershipLedgerIndex", "long")
    )
    REQUEST_CODE: ClassVar[RequestCode] = RequestCode.LEADERSHIP_TRANSFER


@attrs.define
class LeadershipTransferResponse(Message):
    pass


REQUESTS: dict[RequestCode, type[Message]] = {
    cls.REQUEST_CODE: cls
    for cls in (
        MetadataRequest,
        AppendEntryRequest,
        GetEntriesRequest,
        VoteRequest,
        HeartBeatRequest,
        PullEntriesRequest,
        PushEntryRequest,
        LeadershipTransferRequest,
    )
}
RESPONSES: dict[RequestCode, type[Message]] = {
    RequestCode.METADATA: MetadataResponse,
    RequestCode.APPEND: AppendEntryResponse,
    RequestCode.GET: GetEntriesResponse,
    RequestCode.VOTE: VoteResponse,
    RequestCode.HEART_BEAT: HeartBeatResponse,
    RequestCode.PULL: PullEntriesResponse,
    RequestCode.PUSH: PushEntryResponse,
    RequestCode.LEADERSHIP_TRANSFER: LeadershipTransferResponse,
}

_PUSH_GETTERS = ("batch", "count", "firstEntryIndex", "lastEntryIndex", "totalSize")

# -- writing ------------------------------------------------------------------------------------


def _entry_json(entry: DLedgerEntry) -> dict[str, Any]:
    return {
        "body": base64.b64encode(entry.body).decode("ascii"),
        "bodyCrc": entry.body_crc,
        "chainCrc": entry.chain_crc,
        "channel": entry.channel,
        "index": entry.index,
        "magic": entry.magic,
        "pos": entry.pos,
        "size": entry.size,
        "term": entry.term,
    }


def _to_json(kind: str, value: Any) -> Any:
    if value is None:
        return None
    if kind == "bytes":
        return base64.b64encode(value).decode("ascii")
    if kind == "entry":
        return _entry_json(value)
    if kind == "entries":
        return [_entry_json(e) for e in value]
    if kind in ("vote", "push"):
        return value.value
    if kind == "peers":
        return dict(value)
    if kind == "longs":
        return list(value)
    return value


_FIELDS: dict[type, tuple[tuple[str, str, str], ...]] = {}


def _fields(cls: type) -> tuple[tuple[str, str, str], ...]:
    """(attribute, JSON key, kind) of a message class's fields, worked out once."""
    fields = _FIELDS.get(cls)
    if fields is None:
        fields = _FIELDS[cls] = tuple(
            (f.name, f.metadata["key"], f.metadata["kind"]) for f in attrs.fields(cls)
        )
    return fields


ENTRY_TEXTS_BYTES = 8 * 1024 * 1024
"""The JSON text of entries an :class:`EntryTexts` keeps, in bytes (at least the last entry
written is kept, whatever its size)."""


class EntryTexts:
    """The JSON text of the entries a leader pushes, each written once and reused for every
    follower it goes to (a batch push is mostly its entries' base64 bodies): by log index,
    valid while the log hands out the same entry object for that index (a truncated and
    rewritten index is a new object, so it is written anew).  The newest entries are kept,
    up to :data:`ENTRY_TEXTS_BYTES` of text."""

    def __init__(self, limit: int = ENTRY_TEXTS_BYTES) -> None:
        self.limit = limit
        self._texts: dict[int, tuple[DLedgerEntry, str]] = {}
        self._bytes = 0

    def text(self, entry: DLedgerEntry) -> str:
        """``entry`` as fastjson writes it inside a push (no escape is ever needed: base64
        and numbers)."""
        texts = self._texts
        kept = texts.get(entry.index)
        if kept is not None and kept[0] is entry:
            return kept[1]
        text = json.dumps(_entry_json(entry), separators=(",", ":"))
        if kept is not None:
            self._bytes -= len(texts.pop(entry.index)[1])
        texts[entry.index] = (entry, text)
        self._bytes += len(text)
        while self._bytes > self.limit and len(texts) > 1:
            self._bytes -= len(texts.pop(next(iter(texts)))[1])
        return text


def encode(message: Message, texts: EntryTexts | None = None) -> bytes:
    """``message`` as fastjson writes it (``JSON.toJSONBytes``); a push's entries from
    ``texts`` when given (the same bytes, each entry's text written once for all followers)."""
    if texts is not None and isinstance(message, PushEntryRequest):
        pushed = _encode_push(message, texts)
        if pushed is not None:
            return pushed
    fields: dict[str, Any] = {}
    for name, key, kind in _fields(type(message)):
        value = getattr(message, name)
        if value is not None:
            fields[key] = _to_json(kind, value)
    if isinstance(message, PushEntryRequest):
        fields.update(_push_getters(message))
    return _dumps({key: fields[key] for key in sorted(fields)})


def _push_getters(message: PushEntryRequest) -> dict[str, Any]:
    """What fastjson writes of a push's derived getters (isBatch, getCount, ...)."""
    return {
        "batch": message.batch,
        "count": message.count,
        "firstEntryIndex": message.first_entry_index,
        "lastEntryIndex": message.last_entry_index,
        "totalSize": message.total_size,
    }


def _encode_push(message: PushEntryRequest, texts: EntryTexts) -> bytes | None:
    """:func:`encode` of a push with its entries' text from ``texts``: the fields written
    one by one in fastjson's order (sorted keys, nulls left out), the entries' kept text
    spliced in; None when a field needs an escape (fastjson's writer is then the one)."""
    parts: list[str] = []
    fields: dict[str, Any] = {}
    for name, key, kind in _fields(PushEntryRequest):
        value = getattr(message, name)
        if value is not None and kind not in ("entry", "entries"):
            fields[key] = _to_json(kind, value)
    fields.update(_push_getters(message))
    if message.entry is not None:
        fields["entry"] = None  # spliced in below
    fields["batchEntry"] = None
    dumps_value = json.dumps
    for key in sorted(fields):
        if key == "entry":
            assert message.entry is not None
            parts.append(f'"entry":{texts.text(message.entry)}')
        elif key == "batchEntry":
            text = texts.text
            parts.append('"batchEntry":[' + ",".join([text(e) for e in message.batch_entry]) + "]")
        else:
            value = dumps_value(fields[key], separators=(",", ":"), allow_nan=False)
            if "\\" in value:
                return None
            parts.append(f'"{key}":{value}')
    return ("{" + ",".join(parts) + "}").encode("ascii")


def _dumps(value: dict[str, Any]) -> bytes:
    """fastjson's form of a message's fields (none null: entries have no null field, lists
    no null item; keys in the given order): the standard library's C encoder writes the same
    text when nothing in it needs an escape (ids, base64 bodies, numbers: every message in
    practice); anything else goes through fastjson's writer
    (pymq.remoting.protocol.fastjson), whose escapes are fastjson's."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    if "\\" in text:
        return dumps(value)
    return text.encode("ascii")


# -- reading ------------------------------------------------------------------------------------


def _number(key: str, value: Any, bounds: tuple[int, int]) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"{key}: expected a number, got {_shown(value)}")
    if not bounds[0] <= value <= bounds[1]:
        java = "int" if bounds == _INT else "long"
        raise ProtocolError(f"{key}: {value} is outside a Java {java}")
    return value


def _string(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ProtocolError(f"{key}: expected a string, got {_shown(value)}")
    return value


def _base64(key: str, value: Any) -> bytes:
    text = _string(key, value)
    if len(text) > (MAX_ENTRY_SIZE // 3 + 1) * 4:
        raise ProtocolError(f"{key}: more than {MAX_ENTRY_SIZE} bytes")
    try:
        # b64decode(validate=True)'s checks in C (its regular expression cost as much as the
        # decoding): the same bodies taken and refused
        return binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError):
        raise ProtocolError(f"{key}: not base64") from None


def _list(key: str, value: Any, limit: int) -> list[Any]:
    if not isinstance(value, list):
        raise ProtocolError(f"{key}: expected an array, got {_shown(value)}")
    if len(value) > limit:
        raise ProtocolError(f"{key}: {len(value)} items; at most {limit}")
    return value


def _entry(key: str, value: Any) -> DLedgerEntry:
    if not isinstance(value, dict):
        raise ProtocolError(f"{key}: expected an entry object, got {_shown(value)}")
    if value.get("body") is None:
        raise ProtocolError(f"{key}.body: missing")
    body = _base64(f"{key}.body", value["body"])
    get = value.get
    fields: tuple[Any, ...] = (get("index"), get("term"), get("pos"), get("magic"), get("channel"),
              get("chainCrc"), get("bodyCrc"), get("size"))  # fmt: skip
    if all(type(v) is int for v in fields):  # what members write: checked at once
        index, term, pos, magic, channel, chain, crc, size = fields
        if (
            _LONG[0] <= min(index, term, pos) and max(index, term, pos) <= _LONG[1]
            and _INT[0] <= min(magic, channel, chain, crc) and max(magic, channel, chain, crc)
            <= _INT[1] and size == BODY_OFFSET + len(body)
        ):  # fmt: skip
            return DLedgerEntry(index, term, body, pos, magic, channel, chain, crc)

    def num(name: str, default: int, bounds: tuple[int, int]) -> int:
        raw = value.get(name)
        return default if raw is None else _number(f"{key}.{name}", raw, bounds)

    size = num("size", BODY_OFFSET + len(body), _INT)
    if size != BODY_OFFSET + len(body):
        raise ProtocolError(f"{key}.size: {size} but the body makes {BODY_OFFSET + len(body)}")
    return DLedgerEntry(
        index=num("index", 0, _LONG),
        term=num("term", 0, _LONG),
        body=body,
        pos=num("pos", 0, _LONG),
        magic=num("magic", 0, _INT),
        channel=num("channel", 0, _INT),
        chain_crc=num("chainCrc", 0, _INT),
        body_crc=num("bodyCrc", 0, _INT),
    )


def _enum(key: str, value: Any, cls: type[enum.Enum]) -> Any:
    text = _string(key, value)
    try:
        return cls(text)
    except ValueError:
        names = ", ".join(m.value for m in cls)
        raise ProtocolError(f"{key}: {_shown(text)} is none of {names}") from None


def _from_json(key: str, kind: str, value: Any) -> Any:
    if kind == "int":
        return _number(key, value, _INT)
    if kind in ("long", "long?"):
        return _number(key, value, _LONG)
    if kind == "str":
        return _string(key, value)
    if kind == "bytes":
        return _base64(key, value)
    if kind == "entry":
        return _entry(key, value)
    if kind == "entries":
        items = _list(key, value, MAX_BATCH_ENTRIES)
        return [_entry(f"{key}[{i}]", item) for i, item in enumerate(items)]
    if kind == "longs":
        items = _list(key, value, MAX_LIST_ITEMS)
        return [_number(f"{key}[{i}]", item, _LONG) for i, item in enumerate(items)]
    if kind == "peers":
        if not isinstance(value, dict) or len(value) > MAX_LIST_ITEMS:
            raise ProtocolError(f"{key}: expected a map of at most {MAX_LIST_ITEMS} peers")
        return {_string(f"{key} id", k): _string(f"{key}[{k}]", v) for k, v in value.items()}
    if kind == "vote":
        return _enum(key, value, VoteResult)
    assert kind == "push"
    return _enum(key, value, PushType)


_M = TypeVar("_M", bound=Message)
_NOT_READ = object()
_SHALLOW_OPENINGS = 64
"""A body opening at most this many objects and arrays cannot nest deeper than fastjson's
``MAX_DEPTH`` (64): the C parser's reading of it is fastjson's."""
_FAST_OPENINGS = MAX_BATCH_ENTRIES + _SHALLOW_OPENINGS
"""A body opening at most this many (a push of up to :data:`MAX_BATCH_ENTRIES` entries:
base64 bodies open none) is read by the C parser first, then checked to nest no deeper than
fastjson's ``MAX_DEPTH``; one nested deeper, or opening more, is read by fastjson's reader,
whose refusal is the answer."""


def _nested_within(data: Any, limit: int) -> bool:
    """Whether ``data`` (parsed JSON) nests objects and arrays at most ``limit`` deep."""
    level: list[Any] = [data]
    for _ in range(limit):
        deeper: list[Any] = []
        for value in level:
            if isinstance(value, dict):
                deeper += [v for v in value.values() if isinstance(v, dict | list)]
            elif isinstance(value, list):
                deeper += [v for v in value if isinstance(v, dict | list)]
        if not deeper:
            return True
        level = deeper
    return False


def decode(cls: type[_M], body: bytes) -> _M:
    """The ``cls`` message in ``body``; :class:`ProtocolError` naming the field for a body that
    is not a JSON object, a field of the wrong type or out of its Java type's range, bad
    base64, an entry whose size disagrees with its body, or a list over its limit.  Fields
    ``cls`` does not have are ignored (as fastjson does); a missing or null field keeps its
    Java default."""
    data: Any = _NOT_READ
    text = bytes(body)
    openings = text.count(b"{") + text.count(b"[")
    if openings <= _FAST_OPENINGS:
        # the standard library's C parser for standard JSON (what members write: a message
        # opens a handful of objects, a batch push one per entry); fastjson's reader, with
        # its nesting limit, for the rest
        with contextlib.suppress(ValueError, UnicodeDecodeError, RecursionError):
            data = json.loads(text.decode("utf-8"))
        if openings > _SHALLOW_OPENINGS and not _nested_within(data, FASTJSON_MAX_DEPTH):
            data = _NOT_READ
    if data is _NOT_READ:
        try:
            data = loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ProtocolError(f"{cls.__name__}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ProtocolError(f"{cls.__name__}: expected a JSON object, got {_shown(data)}")
    values: dict[str, Any] = {}
    for name, key, kind in _fields(cls):
        raw = data.get(key)
        if raw is None:
            continue
        values[name] = _from_json(key, kind, raw)
    return cls(**values)


def decode_request(code: int, body: bytes) -> Message:
    """The request of ``code`` in ``body``; ProtocolError for a code 0.2.6 does not have."""
    try:
        cls = REQUESTS[RequestCode(code)]
    except (ValueError, KeyError):
        raise ProtocolError(f"request code {code} is not DLedger's") from None
    return decode(cls, body)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
