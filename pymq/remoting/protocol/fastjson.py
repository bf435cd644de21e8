"""The JSON dialect RocketMQ's Java side writes its admin bodies in (fastjson's defaults).

Java's tools (mqadmin, the dashboard, the exporter) parse an admin body with fastjson into the
Java class the broker encoded, so a body must be in the form fastjson itself writes, which is not
quite standard JSON (java-wire-samples.md, section 3):

* a bean's fields are written in alphabetical order, ``null`` fields left out;
* a map keeps its own iteration order, and its keys are written by their kind: a string
  quoted, an integer bare (``{0:3}``), an object as the object itself
  (``{{"brokerName":"b","queueId":1,"topic":"T"}:{...}}``, how a map keyed by a
  ``MessageQueue`` comes out);
* a double always carries a decimal point or an exponent (``0.0``, ``1.0E7``) as Java's
  ``Double.toString`` writes it; NaN and infinities are written as ``null`` (so left out);
* booleans bare, enums by name, sets and lists as arrays; compact, no trailing newline.

:func:`dumps` writes that form: attrs instances are beans (their fields named as
:func:`pymq.common.serde.java_name` names them), ``dict`` instances are maps.  :func:`loads`
reads it back for pymq's own tools: a bare integer key becomes an ``int``, an object key a
:class:`KeyObject` (a hashable dict).  Both are bounded: nesting deeper than
:data:`MAX_DEPTH` is refused.
"""

from __future__ import annotations

import decimal
import enum
import json
import math
from typing import Any

import attrs

from pymq.common.serde import java_name

# Deepest nesting of objects and arrays written or read (RocketMQ's bodies use fewer than 8).
MAX_DEPTH = 64

_encode_str = json.JSONEncoder(ensure_ascii=False).encode

# One decoder for every string token (building one per token cost half a token's time).
_raw_decode = json.JSONDecoder().raw_decode


class KeyObject(dict[str, Any]):
    """An object used as a map key (a MessageQueue): a dict that can be hashed and compared."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted((k, _hashable(v)) for k, v in self.items())))


def _hashable(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value


def java_double(value: float) -> str | None:
    """``Double.toString``: ``0.0``, ``0.3``, ``1.0E7``, ``1.0E-4``; None for NaN/infinity."""
    if math.isnan(value) or math.isinf(value):
        return None
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    text = repr(value)  # the shortest digits that read back as ``value``
    if 1e-3 <= abs(value) < 1e7:
        return text if "." in text else text + ".0"
    sign, digits, exponent = decimal.Decimal(text).normalize().as_tuple()
    assert isinstance(exponent, int)
    shown = "".join(map(str, digits))
    mantissa = shown[0] + "." + (shown[1:] or "0")
    return f"{'-' if sign else ''}{mantissa}E{len(digits) - 1 + exponent}"


def dumps(value: Any) -> bytes:
    """``value`` in fastjson's form, UTF-8."""
    out: list[str] = []
    _write(value, out, 0)
    return "".join(out).encode()


def _scalar(value: Any) -> str | None:
    """The text of a scalar, or None if ``value`` is not one (or is written as null)."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return java_double(value)
    if isinstance(value, str):
        return _encode_str(value)
    if isinstance(value, enum.Enum):
        return _encode_str(value.name if not isinstance(value.value, str) else value.value)
    return None


_FIELD_ORDERS: dict[type, list[tuple[str, str]]] = {}


def _field_order(cls: type) -> list[tuple[str, str]]:
    """An attrs class's (Java name, attribute) pairs in fastjson's order (by Java name), worked
    out once per class."""
    order = _FIELD_ORDERS.get(cls)
    if order is None:
        fields = attrs.fields(cls)
        order = sorted(((java_name(f), f.name) for f in fields), key=lambda pair: pair[0])
        _FIELD_ORDERS[cls] = order
    return order


def _write(value: Any, out: list[str], depth: int) -> bool:
    """Append ``value``; False (nothing appended) when fastjson would write null."""
    if depth > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH}")
    if value is None:
        return False
    text = _scalar(value)
    if text is not None:
        out.append(text)
        return True
    if isinstance(value, (float, int, str, enum.Enum)):
        return False  # a NaN or infinite double
    if attrs.has(type(value)):
        entries = ((name, getattr(value, attr)) for name, attr in _field_order(type(value)))
        _write_entries(entries, out, depth)
        return True
    if isinstance(value, dict):
        _write_entries(value.items(), out, depth)
        return True
    if isinstance(value, (list, tuple, set, frozenset)):
        out.append("[")
        first = True
        for item in value:
            if not first:
                out.append(",")
            mark = len(out)
            if not _write(item, out, depth + 1):
                del out[mark:]
                out.append("null")
            first = False
        out.append("]")
        return True
    raise TypeError(f"cannot write {type(value).__name__} in fastjson form")


def _write_entries(entries: Any, out: list[str], depth: int) -> None:
    out.append("{")
    first = True
    for key, item in entries:
        mark = len(out)
        if not first:
            out.append(",")
        _write_key(key, out, depth)
        out.append(":")
        if _write(item, out, depth + 1):
            first = False
        else:
            del out[mark:]  # a null entry is left out
    out.append("}")


def _write_key(key: Any, out: list[str], depth: int) -> None:
    if isinstance(key, str):
        out.append(_encode_str(key))
    elif isinstance(key, bool) or not isinstance(key, int):
        if not _write(key, out, depth + 1):
            raise ValueError("a map key cannot be null")
    else:
        out.append(str(key))


# -- reading ------------------------------------------------------------------------------------

_WS = " \t\r\n"


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, what: str) -> ValueError:
        return ValueError(f"bad fastjson at {self.pos}: {what}")

    def skip(self) -> None:
        text, pos = self.text, self.pos
        while pos < len(text) and text[pos] in _WS:
            pos += 1
        self.pos = pos

    def value(self, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise self.fail(f"nested deeper than {MAX_DEPTH}")
        self.skip()
        if self.pos >= len(self.text):
            raise self.fail("unexpected end")
        c = self.text[self.pos]
        if c == "{":
            return self.object(depth)
        if c == "[":
            return self.array(depth)
        if c == '"':
            return self.string()
        return self.literal()

    def string(self) -> str:
        try:
            value, end = _raw_decode(self.text, self.pos)
        except json.JSONDecodeError as exc:
            raise self.fail(str(exc)) from None
        self.pos = end
        return value

    def literal(self) -> Any:
        start = self.pos
        text = self.text
        while self.pos < len(text) and text[self.pos] not in ",:}] \t\r\n":
            self.pos += 1
        word = text[start : self.pos]
        if word == "true":
            return True
        if word == "false":
            return False
        if word == "null":
            return None
        try:
            if any(c in word for c in ".eE") and not word.lstrip("-").isdigit():
                return float(word)
            return int(word)
        except ValueError:
            raise self.fail(f"unexpected {word[:20]!r}") from None

    def expect(self, char: str) -> None:
        self.skip()
        if self.pos >= len(self.text) or self.text[self.pos] != char:
            raise self.fail(f"expected {char!r}")
        self.pos += 1

    def object(self, depth: int) -> dict[Any, Any]:
        self.pos += 1
        result: dict[Any, Any] = {}
        self.skip()
        if self.text.startswith("}", self.pos):
            self.pos += 1
            return result
        while True:
            key = self.value(depth + 1)
            if isinstance(key, dict):
                key = KeyObject(key)
            elif isinstance(key, list):
                raise self.fail("an array as a map key")
            self.expect(":")
            result[key] = self.value(depth + 1)
            self.skip()
            if self.text.startswith(",", self.pos):
                self.pos += 1
                continue
            self.expect("}")
            return result

    def array(self, depth: int) -> list[Any]:
        self.pos += 1
        result: list[Any] = []
        self.skip()
        if self.text.startswith("]", self.pos):
            self.pos += 1
            return result
        while True:
            result.append(self.value(depth + 1))
            self.skip()
            if self.text.startswith(",", self.pos):
                self.pos += 1
                continue
            self.expect("]")
            return result


def loads(data: bytes | str) -> Any:
    """Read a body in fastjson's form (standard JSON too); raises ``ValueError``."""
    text = data.decode("utf-8") if isinstance(data, (bytes, bytearray, memoryview)) else data
    reader = _Reader(text.rstrip("\x00 \t\r\n"))
    value = reader.value(0)
    reader.skip()
    if reader.pos != len(reader.text):
        raise reader.fail("trailing data")
    return value
