"""Broker-side SQL92 filtering of pulled records (Java's ExpressionMessageFilter and
ExpressionForRetryMessageFilter, the commit-log half).

The pull path hands the store a *record filter*: a function of one whole commit-log record that
says whether the consumer gets it.  It reads the record's properties text in place (no message
object is built) and looks up only the properties the expression names, with the semantics of
Java's ``MessageDecoder.string2messageProperties`` (the last occurrence of a name wins; an empty
value is no value), then runs the compiled expression.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from pymq.broker.consumer_filter_manager import ConsumerFilterData, ConsumerFilterManager
from pymq.common.message_ext import PROPERTY_RETRY_TOPIC
from pymq.common.topic import RETRY_GROUP_TOPIC_PREFIX
from pymq.filter.sql92 import Sql92Filter

RecordFilter = Callable[[bytes], bool]

_INT = struct.Struct(">i")
_SHORT = struct.Struct(">h")
_SYSFLAG_POSITION = 36
_BODY_LENGTH_POSITION = 84  # with IPv4 born and store hosts; +12 for each IPv6 one
_BORNHOST_V6 = 0x10
_STOREHOST_V6 = 0x20
NAME_VALUE = "\x01"
SEPARATOR = "\x02"


def record_properties(record: bytes) -> str:
    """The PROPERTIES text of a whole commit-log record ("" when it has none)."""
    sys_flag = _INT.unpack_from(record, _SYSFLAG_POSITION)[0]
    at = _BODY_LENGTH_POSITION
    if sys_flag & _BORNHOST_V6:
        at += 12
    if sys_flag & _STOREHOST_V6:
        at += 12
    topic_at = at + 4 + _INT.unpack_from(record, at)[0]
    props_at = topic_at + 1 + record[topic_at]
    length = _SHORT.unpack_from(record, props_at)[0]
    if length <= 0:
        return ""
    return record[props_at + 2 : props_at + 2 + length].decode("utf-8", "replace")


def property_of(text: str, name: str) -> str | None:
    """One property of a properties text as Java's decoded map has it."""
    if not name:
        return None  # Java skips an item whose name is empty
    needle = SEPARATOR + name + NAME_VALUE
    end = len(text)
    while True:
        at = text.rfind(needle, 0, end)
        if at >= 0:
            start = at + len(needle)
        elif text.startswith(name + NAME_VALUE) and end > 0:
            start = len(name) + 1
            at = -1
        else:
            return None
        stop = text.find(SEPARATOR, start)
        value = text[start:] if stop < 0 else text[start:stop]
        if value:
            return value
        if at < 0:
            return None
        end = at  # an empty value is skipped: an earlier occurrence may count


FEW_NAMES = 8
"""Up to this many property names an expression reads are looked up one by one in a record's
properties text; more, and the text is split once per record (a lookup scans the whole text:
hundreds of names over 30 KB of properties made one record's evaluation take 80 ms)."""


def properties_map(text: str, names: frozenset[str]) -> dict[str, str]:
    """The properties of ``text`` among ``names``, as :func:`property_of` finds each: the last
    occurrence of a name with a value wins."""
    found: dict[str, str] = {}
    for item in text.split(SEPARATOR):
        name, sep, value = item.partition(NAME_VALUE)
        if sep and value and name in names and name:
            found[name] = value
    return found


def evaluator(compiled: Sql92Filter) -> RecordFilter:
    """A record filter evaluating ``compiled`` on each record's properties."""
    names = tuple(compiled.properties)
    if len(names) > FEW_NAMES:
        wanted = frozenset(names)
        matches_all = compiled.matches

        def many(record: bytes) -> bool:
            return matches_all(properties_map(record_properties(record), wanted).get)

        return many
    matches = compiled.matches
    if len(names) == 1:
        (only,) = names

        def one(record: bytes) -> bool:
            value = property_of(record_properties(record), only)
            return matches(lambda name: value if name == only else None)

        return one

    def several(record: bytes) -> bool:
        text = record_properties(record)
        found = {name: property_of(text, name) for name in names}
        return matches(found.get)

    return several


async def record_filter(
    topic: str,
    group: str,
    filter_data: ConsumerFilterData | None,
    manager: ConsumerFilterManager,
    support_retry: bool,
) -> RecordFilter | None:
    """The commit-log filter of one pull, or None when every record passes.

    ``filter_data`` is the SQL92 filter of the pulled topic (None for a TAG subscription).  With
    ``filterSupportRetry`` a pull of the group's retry topic filters each re-sent message by the
    filter of the topic it came from (its RETRY_TOPIC property).  The filters are compiled
    before the scan (a long one in a worker thread) when they are not kept compiled already.
    """
    if support_retry and topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        retry_group = topic[len(RETRY_GROUP_TOPIC_PREFIX) :]
        cache: dict[str | None, RecordFilter | None] = {}
        for data in manager.by_group(retry_group):
            compiled = await manager.prepare(data)
            cache[data.topic] = evaluator(compiled) if compiled is not None else None

        def by_origin(record: bytes) -> bool:
            origin = property_of(record_properties(record), PROPERTY_RETRY_TOPIC)
            if origin not in cache:  # no filter of the group's for that topic
                cache[origin] = None
            check = cache[origin]
            return check is None or check(record)

        return by_origin
    if filter_data is None:
        return None
    compiled = await manager.prepare(filter_data)
    return None if compiled is None else evaluator(compiled)
