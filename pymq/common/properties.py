"""Java ``.properties`` files, as RocketMQ's ``-c`` config files are written.

Only the parts of the format that config files use are supported: ``key=value``, ``key: value`` and
``key value`` lines, ``#`` and ``!`` comments, backslash line continuations and the usual escapes
(``\\t``, ``\\n``, ``\\uXXXX``, ...).  Pure functions, no I/O beyond :func:`load_properties`.
"""

from __future__ import annotations

import os

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
# What str.splitlines breaks a line at: a value holding one is written escaped.
_LINE_BREAKS = frozenset("\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029")


def _logical_lines(text: str) -> list[str]:
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.lstrip() if pending else raw.strip()
        if not pending and (not line or line[0] in "#!"):
            continue
        # A line ends in a continuation when it ends with an odd number of backslashes.
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            pending += line[:-1]
            continue
        lines.append(pending + line)
        pending = ""
    if pending:
        lines.append(pending)
    return lines


def _unescape(text: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "u" and i + 6 <= len(text):
                try:
                    out.append(chr(int(text[i + 2 : i + 6], 16)))
                    i += 6
                    continue
                except ValueError:
                    pass
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _split_key(line: str) -> tuple[str, str]:
    i = 0
    while i < len(line):
        ch = line[i]
        if ch == "\\":
            i += 2
            continue
        if ch in "=: \t\f":
            break
        i += 1
    key = line[:i]
    rest = line[i:].lstrip(" \t\f")
    if rest[:1] in ("=", ":") and (i >= len(line) or line[i] in " \t\f=:"):
        rest = rest[1:].lstrip(" \t\f")
    return _unescape(key), _unescape(rest)


def parse_properties(text: str) -> dict[str, str]:
    """Parse the text of a Java properties file into an ordered ``dict``; later keys win."""
    return dict(_split_key(line) for line in _logical_lines(text))


def load_properties(path: str | os.PathLike[str]) -> dict[str, str]:
    """Read and parse a properties file (UTF-8; Latin-1 bytes are accepted as a fallback)."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    return parse_properties(text)


def format_properties(items: dict[str, str]) -> str:
    """Render ``key=value`` lines (the form RocketMQ's ``-p`` prints and config bodies carry).

    Values are written with :func:`escape_value`: a backslash doubled, so that a reader (Java's
    ``Properties.load``, mqadmin, :func:`parse_properties`) gets the value back rather than an
    escape (Java 4.9.4 writes it bare, and its own tools then lose it).  Values a line cannot
    carry at all (line breaks, other control characters, lone surrogates) are refused before
    they are set (:func:`pymq.common.config.unwritable`)."""
    return "".join(f"{key}={escape_value(value)}\n" for key, value in items.items())


def escape_value(value: str) -> str:
    """``value`` as a properties file writes it, so that :func:`parse_properties` reads it back
    unchanged: backslashes doubled, whatever would break the line (``\\n``, ``\\r``,
    ``\\u2028``, ...) and blanks at either end (which the reader strips) as ``\\uXXXX``."""
    out = value.replace("\\", "\\\\")
    if any(ch in _LINE_BREAKS for ch in out):
        out = "".join(f"\\u{ord(ch):04x}" if ch in _LINE_BREAKS else ch for ch in out)
    core = out.strip()
    if core == out:
        return out
    head = out[: len(out) - len(out.lstrip())]
    tail = out[len(head) + len(core) :]
    return _as_escapes(head) + core + _as_escapes(tail)


def _as_escapes(text: str) -> str:
    return "".join(f"\\u{ord(ch):04x}" for ch in text)


def _entries(text: str) -> list[tuple[str | None, list[str]]]:
    """``text``'s physical lines grouped as :func:`_logical_lines` groups them: (key, lines)
    per entry, (None, [line]) for a comment or blank line."""
    entries: list[tuple[str | None, list[str]]] = []
    group: list[str] = []
    for raw in text.splitlines():
        line = raw.lstrip() if group else raw.strip()
        if not group and (not line or line[0] in "#!"):
            entries.append((None, [raw]))
            continue
        group.append(raw)
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            continue
        entries.append((parse_properties("\n".join(group)).popitem()[0], group))
        group = []
    if group:
        entries.append((parse_properties("\n".join(group)).popitem()[0], group))
    return entries


def updated_properties_text(text: str, changes: dict[str, str]) -> str:
    """``text`` (a properties file) with each key of ``changes`` set to its new value: the
    key's old lines removed wherever they stand, every other line (comments included) kept as
    written, and the new ``key=value`` lines appended."""
    kept = [line for key, lines in _entries(text) if key not in changes for line in lines]
    body = "".join(f"{line}\n" for line in kept)
    return body + "".join(f"{key}={escape_value(value)}\n" for key, value in changes.items())
