"""A small reader of fastjson's form, independent of pymq's, for the tests.

It keeps everything the text says: an object is an ``Obj`` (its entries in order, keys as read:
``str``, ``int`` or ``Obj``), so tests can check key order, key kinds and structure against the
bodies the Java broker wrote (java-wire-samples/).
"""

from __future__ import annotations

import re
from typing import Any

_TOKEN = re.compile(
    r'\s*(?:(?P<punct>[{}\[\]:,])|(?P<str>"(?:[^"\\]|\\.)*")|(?P<num>-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)'
    r"|(?P<word>true|false|null))"
)


class Obj:
    def __init__(self, entries: list[tuple[Any, Any]]) -> None:
        self.entries = entries

    def keys(self) -> list[Any]:
        return [k for k, _ in self.entries]

    def get(self, key: str) -> Any:
        for k, v in self.entries:
            if k == key:
                return v
        raise KeyError(key)

    def __repr__(self) -> str:
        return f"Obj({self.entries!r})"


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"cannot read at {pos}: {text[pos : pos + 20]!r}")
        kind = m.lastgroup
        assert kind is not None
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def read(data: bytes | str) -> Any:
    text = data.decode() if isinstance(data, bytes) else data
    tokens = _tokens(text)
    value, end = _value(tokens, 0)
    if end != len(tokens):
        raise ValueError("trailing tokens")
    return value


def _value(tokens: list[tuple[str, str]], i: int) -> tuple[Any, int]:
    kind, text = tokens[i]
    if kind == "str":
        return bytes(text[1:-1], "utf-8").decode("unicode_escape"), i + 1
    if kind == "num":
        return (float(text) if any(c in text for c in ".eE") else int(text)), i + 1
    if kind == "word":
        return {"true": True, "false": False, "null": None}[text], i + 1
    if text == "[":
        items: list[Any] = []
        i += 1
        if tokens[i][1] == "]":
            return items, i + 1
        while True:
            item, i = _value(tokens, i)
            items.append(item)
            if tokens[i][1] == "]":
                return items, i + 1
            assert tokens[i][1] == ",", tokens[i]
            i += 1
    assert text == "{", tokens[i]
    entries: list[tuple[Any, Any]] = []
    i += 1
    if tokens[i][1] == "}":
        return Obj(entries), i + 1
    while True:
        key, i = _value(tokens, i)
        assert tokens[i][1] == ":", tokens[i]
        value, i = _value(tokens, i + 1)
        entries.append((key, value))
        if tokens[i][1] == "}":
            return Obj(entries), i + 1
        assert tokens[i][1] == ",", tokens[i]
        i += 1


# Fields whose value is a map with string keys chosen by the data (topics, groups, names).
STRING_KEYED_MAPS = frozenset(
    {
        "subscriptionTable",
        "table",
        "properties",
        "statusTable",
        "consumerTable",
        "topicConfigTable",
        "subscriptionGroupTable",
        "offsetTable",
        "brokerAddrTable",
        "clusterAddrTable",
        "filterServerTable",
        "data",
    }
)


def shape(value: Any, field: str = "") -> Any:
    """The structure of a value: beans as their keys (checked alphabetical) and their fields'
    shapes, maps as the kind of their keys and the merged shape of their values, lists as the
    merged shape of their items, scalars as their type."""
    if isinstance(value, Obj):
        keys = value.keys()
        if keys and all(isinstance(k, Obj) for k in keys):
            return (
                "map<MQ>",
                _merged([shape(k) for k in keys]),
                _merged([shape(v) for v in (v for _, v in value.entries)]),
            )
        if keys and all(isinstance(k, int) for k in keys):
            return ("map<int>", _merged([shape(v) for _, v in value.entries]))
        if field in STRING_KEYED_MAPS or field == "map":
            return ("map<str>", _merged([shape(v) for _, v in value.entries]))
        assert keys == sorted(keys), f"bean keys not alphabetical: {keys}"
        return tuple((k, shape(v, k)) for k, v in value.entries)
    if isinstance(value, list):
        return (
            "list",
            _merged([shape(v, "map" if field == "consumeStatsList" else "") for v in value]),
        )
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    return "null"


def _merged(shapes: list[Any]) -> Any:
    distinct = []
    for s in shapes:
        if s not in distinct:
            distinct.append(s)
    if not distinct:
        return "empty"
    return distinct[0] if len(distinct) == 1 else ("any", *distinct)


def compatible(ours: Any, theirs: Any) -> bool:
    """Whether a body's shape fits the captured one (empty collections fit anything)."""
    if ours == theirs or "empty" in (ours, theirs):
        return True
    if isinstance(ours, tuple) and ours and ours[0] == "any":
        return all(compatible(o, theirs) for o in ours[1:])
    if isinstance(theirs, tuple) and theirs and theirs[0] == "any":
        return any(compatible(ours, t) for t in theirs[1:])
    if not (isinstance(ours, tuple) and isinstance(theirs, tuple)) or len(ours) != len(theirs):
        return False
    if ours and isinstance(ours[0], str):  # ("map<..>", ...) or ("list", ...)
        return ours[0] == theirs[0] and all(
            compatible(o, t) for o, t in zip(ours[1:], theirs[1:], strict=True)
        )
    return all(  # beans: the same fields, each compatible
        o[0] == t[0] and compatible(o[1], t[1]) for o, t in zip(ours, theirs, strict=True)
    )
