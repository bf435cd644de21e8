"""JSON as RocketMQ's Java side writes and reads it (fastjson), for attrs data classes.

Java names its fields in camelCase; our attrs classes use snake_case and map each field to its Java
name with :func:`java_name` (``metadata={"key": ...}`` overrides the automatic camelCase, e.g. for
``brokerIP1``).  Writing follows fastjson's defaults: keys sorted, ``null`` fields left out.
Reading accepts what fastjson writes by default, including unquoted numeric map keys
(``{0:"127.0.0.1:10911"}``), and ignores unknown keys.
"""

from __future__ import annotations

import enum
import functools
import json
import re
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import cattrs
import trio
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

T = TypeVar("T")

_WORD = re.compile(r"_([a-z0-9])")


def java_name(field: attrs.Attribute) -> str:
    """The camelCase key RocketMQ uses for an attrs field."""
    key = field.metadata.get("key")
    if key:
        return key
    return _WORD.sub(lambda m: m.group(1).upper(), field.name)


def parse_java_bool(value: object) -> bool:
    """``Boolean.parseBoolean`` semantics, plus ``"1"`` (the C++ client writes bools as 0/1)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value != 0
    return str(value).strip().lower() in ("true", "1")


def _structure_enum(value: object, cls: type[enum.Enum]) -> enum.Enum:
    if isinstance(value, cls):
        return value
    try:
        return cls(value)
    except ValueError:
        pass
    if isinstance(value, str):
        if value in cls.__members__:
            return cls.__members__[value]
        if value.isascii() and value.isdigit():  # an ordinal, as the C++ client sends enums
            value = int(value)
    if isinstance(value, int) and 0 <= value < len(cls):
        return list(cls)[value]
    raise ValueError(f"{value!r} is not a valid {cls.__name__}")


def _make_converter() -> cattrs.Converter:
    # Not cattrs' detailed validation: it goes on past the first fault and gathers every one,
    # so that a body of 80,000 faulty items took 4 s to refuse (a bad body is refused at its
    # first fault here, in microseconds; a good one is read in half the time).
    conv = cattrs.Converter(detailed_validation=False)
    conv.register_structure_hook(bool, lambda v, _: parse_java_bool(v))
    conv.register_structure_hook(int, lambda v, _: v if type(v) is int else int(str(v).strip()))
    conv.register_structure_hook(str, lambda v, _: v if isinstance(v, str) else _java_str(v))
    conv.register_structure_hook_func(
        lambda t: isinstance(t, type) and issubclass(t, enum.Enum), _structure_enum
    )
    conv.register_unstructure_hook_func(
        lambda t: isinstance(t, type) and issubclass(t, enum.Enum), lambda e: e.value
    )

    def structure_factory(cls: type) -> Callable[[Any, type], Any]:
        attrs.resolve_types(cls)
        renames: dict[str, Any] = {f.name: override(rename=java_name(f)) for f in attrs.fields(cls)}
        return make_dict_structure_fn(cls, conv, **renames)

    def unstructure_factory(cls: type) -> Callable[[Any], Any]:
        attrs.resolve_types(cls)
        renames: dict[str, Any] = {f.name: override(rename=java_name(f)) for f in attrs.fields(cls)}
        return make_dict_unstructure_fn(cls, conv, **renames)

    conv.register_structure_hook_factory(attrs.has, structure_factory)
    conv.register_unstructure_hook_factory(attrs.has, unstructure_factory)
    return conv


def _java_str(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


converter = _make_converter()


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def to_plain(obj: object) -> Any:
    """An attrs object (or a container of them) as plain JSON-ready data with Java keys."""
    return _drop_nulls(converter.unstructure(obj))


def to_json(obj: object) -> bytes:
    """Compact UTF-8 JSON with sorted keys, as fastjson writes by default (ASCII-escaped)."""
    return json.dumps(to_plain(obj), sort_keys=True, separators=(",", ":")).encode()


def from_plain(data: Any, cls: type[T]) -> T:
    return converter.structure(data, cls)


# Bodies the broker parses as JSON from its peers: requests (HEART_BEAT, LOCK_BATCH_MQ,
# UNLOCK_BATCH_MQ, CHECK_CLIENT_CONFIG, UPDATE_AND_CREATE_SUBSCRIPTIONGROUP; UPDATE_BROKER_CONFIG's
# properties) and clients' answers (GET_CONSUMER_RUNNING_INFO, GET_CONSUMER_STATUS_FROM_CLIENT).
# Bigger ones are refused unread (a Java client's heartbeat is some 500 bytes per subscription:
# this is some 500 subscriptions per client process); ones over JSON_BODY_INLINE_MAX are read in
# a worker thread, one at a time.  At json's slowest (some 50 ns a byte, for ``[{},{},...]``)
# the largest body holds the interpreter for about 13 ms in one call, one read inline for
# under 1 ms; Python-level reading in the thread gives the loop its turn every switch interval.
JSON_BODY_MAX = 256 * 1024
JSON_BODY_INLINE_MAX = 16 * 1024
_body_reader = trio.CapacityLimiter(1)


def check_body_size(data: bytes | None, what: str = "request body") -> None:
    """``ValueError`` for a body over :data:`JSON_BODY_MAX` (nothing of it read)."""
    if data is not None and len(data) > JSON_BODY_MAX:
        raise ValueError(f"{what} of {len(data)} bytes is over the {JSON_BODY_MAX}-byte limit")


async def read_body(parse: Callable[[bytes], T], data: bytes, what: str = "request body") -> T:
    """``parse(data)`` without holding the event loop: over :data:`JSON_BODY_MAX` refused
    unread (``ValueError``), over :data:`JSON_BODY_INLINE_MAX` run in a worker thread."""
    check_body_size(data, what)
    if len(data) <= JSON_BODY_INLINE_MAX:
        return parse(data)
    return await trio.to_thread.run_sync(parse, data, limiter=_body_reader)


async def from_json_body(data: bytes, cls: type[T]) -> T:
    """:func:`from_json` of a request body by :func:`read_body`; ``ValueError``."""
    return await read_body(functools.partial(from_json, cls=cls), data)


def from_json(data: bytes | str, cls: type[T]) -> T:
    """Decode JSON as a Java peer wrote it into ``cls``; raises ``ValueError`` on bad input."""
    try:
        return converter.structure(loads_lenient(data), cls)
    except KeyError as exc:
        raise ValueError(f"cannot decode {cls.__name__}: {exc} missing") from None
    except (cattrs.BaseValidationError, TypeError, IndexError, AttributeError) as exc:
        raise ValueError(f"cannot decode {cls.__name__}: {error_reasons(exc)}") from None


def error_reasons(exc: BaseException) -> str:
    """What went wrong, with the causes cattrs gathers in exception groups spelled out."""
    inner = getattr(exc, "exceptions", None)
    if not inner:
        return str(exc)
    return "; ".join(error_reasons(e) for e in inner)


_NUMERIC_KEY = re.compile(rb"(-?\d+)\s*:")


def _quote_numeric_keys(data: bytes) -> bytes:
    """Quote bare numeric object keys outside strings: ``{0:"a"}`` becomes ``{"0":"a"}``."""
    out = bytearray()
    i = 0
    n = len(data)
    in_string = False
    expect_key = False
    while i < n:
        c = data[i]
        if in_string:
            out.append(c)
            if c == 0x5C:  # backslash: copy the escaped byte too
                if i + 1 < n:
                    out.append(data[i + 1])
                i += 2
                continue
            if c == 0x22:
                in_string = False
            i += 1
            continue
        if c == 0x22:
            in_string = True
            expect_key = False
        elif c in (0x7B, 0x2C):  # '{' or ','
            expect_key = True
        elif expect_key and c not in (0x20, 0x09, 0x0A, 0x0D):
            expect_key = False
            m = _NUMERIC_KEY.match(data, i)
            if m:
                out += b'"' + m.group(1) + b'":'
                i = m.end()
                continue
        out.append(c)
        i += 1
    return bytes(out)


# A bare numeric key where json stopped: after "{" or "," (and blanks), digits, blanks, ":".
_KEY_AT = re.compile(r"-?\d+[ \t\r\n]*:")


def _numeric_key_at(text: str, pos: int) -> bool:
    """Whether json's first error, at ``pos`` of ``text``, is a bare numeric key (fastjson's
    ``{0:"a"}``): the one error the numeric-key pass can mend."""
    if not _KEY_AT.match(text, pos):
        return False
    return text[max(0, pos - 64) : pos].rstrip(" \t\r\n").endswith(("{", ","))


def loads_lenient(data: bytes | str) -> Any:
    """``json.loads`` that also takes fastjson's bare numeric keys and trailing blanks/NULs;
    ``ValueError`` for anything else.

    Bounded: the numeric-key pass (a walk over the text in Python) runs only when json's first
    error is such a key, so a body that is not JSON costs one ``json.loads`` and no more; nesting
    too deep for json is a ``ValueError`` too."""
    if isinstance(data, str):
        data = data.encode()
    data = data.rstrip(b"\x00 \t\r\n")
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        if not _numeric_key_at(exc.doc, exc.pos):
            raise ValueError(f"bad JSON: {exc}") from None
    except RecursionError:
        raise ValueError("bad JSON: nested too deep") from None
    try:
        return json.loads(_quote_numeric_keys(data))
    except json.JSONDecodeError as exc:
        raise ValueError(f"bad JSON: {exc}") from exc
    except RecursionError:
        raise ValueError("bad JSON: nested too deep") from None
