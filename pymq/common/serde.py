"""JSON as RocketMQ's Java side writes and reads it (fastjson), for attrs data classes.

Java names its fields in camelCase; our attrs classes use snake_case and map each field to its Java
name with :func:`java_name` (``metadata={"key": ...}`` overrides the automatic camelCase, e.g. for
``brokerIP1``).  Writing follows fastjson's defaults: keys sorted, ``null`` fields left out.
Reading accepts what fastjson writes by default, including unquoted numeric map keys
(``{0:"127.0.0.1:10911"}``), and ignores unknown keys.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import cattrs
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
    conv = cattrs.Converter()
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


def from_json(data: bytes | str, cls: type[T]) -> T:
    """Decode JSON as a Java peer wrote it into ``cls``; raises ``ValueError`` on bad input."""
    try:
        return converter.structure(loads_lenient(data), cls)
    except (cattrs.BaseValidationError, KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"cannot decode {cls.__name__}: {error_reasons(exc)}") from exc


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


def loads_lenient(data: bytes | str) -> Any:
    """``json.loads`` that also takes fastjson's bare numeric keys and trailing blanks/NULs."""
    if isinstance(data, str):
        data = data.encode()
    data = data.rstrip(b"\x00 \t\r\n")
    try:
        return json.loads(data)
    except json.JSONDecodeError:
        pass
    try:
        return json.loads(_quote_numeric_keys(data))
    except json.JSONDecodeError as exc:
        raise ValueError(f"bad JSON: {exc}") from exc
