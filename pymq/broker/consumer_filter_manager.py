"""ConsumerFilterManager: the compiled SQL92 filters of the consumer groups (consumerFilter.json).

Each heartbeat registers its group's non-TAG subscriptions: an expression is compiled once per
(topic, group, client version) and kept with the data Java keeps (born and dead times, the client
version).  A group that stops subscribing to a topic, or leaves, has its filter marked dead; dead
filters are dropped ``filterDataCleanTimeSpan`` ms after their death when the table is persisted
(every 10 s, with ``.bak``, as Java does).  Filters read from the file start dead (30 s ago) and
come back to life when the group's next heartbeat registers the same version.

The file has RocketMQ's shape (``filterDataByTopic`` -> topic -> ``groupFilterData`` -> group ->
ConsumerFilterData).  pymq does not compute the bloom-filter bit map (``enableCalcFilterBitMap``),
so ``bloomFilterData`` is written as null and ignored when read.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import trio

from pymq.broker.config_manager import JsonConfigManager
from pymq.common.consumer import EXPRESSION_TYPE_SQL92, SubscriptionData, is_tag_type
from pymq.filter.sql92 import Sql92Error, Sql92Filter, compile_sql92

log = logging.getLogger(__name__)

MS_24_HOURS = 24 * 3600 * 1000
LOADED_DEAD_AGO_MS = 30 * 1000


COMPILED_TEXT_MAX = 1 << 20
"""Compiled expressions (and refusals) are kept by text, most recently used first, up to this
many characters of expression text in all (a compiled expression takes some twenty times its
text: about 22 MB at most).  Filters are compiled when first needed, not at start, and one
that was dropped is compiled again when a pull or heartbeat needs it."""

INLINE_COMPILE_MAX = 1024
"""Expressions up to this many characters are compiled on the event loop; a longer one (up to
sql92.MAX_EXPRESSION_LENGTH, 64 KiB, about a second of compiling) in a worker thread, one at a
time, so that no client's expression holds everybody else's requests."""

_compiled: OrderedDict[str, Sql92Filter | Sql92Error] = OrderedDict()
_compiled_chars = 0
_compile_slot = trio.CapacityLimiter(1)


def _compiled_or_error(expression: str) -> Sql92Filter | Sql92Error:
    try:
        return compile_sql92(expression)
    except Sql92Error as exc:
        return Sql92Error(exc.remark)  # without the compile's frames


def _keep(expression: str, result: Sql92Filter | Sql92Error) -> None:
    global _compiled_chars
    if expression in _compiled:
        return
    _compiled[expression] = result
    _compiled_chars += len(expression)
    while _compiled_chars > COMPILED_TEXT_MAX and len(_compiled) > 1:
        dropped, _ = _compiled.popitem(last=False)
        _compiled_chars -= len(dropped)


def _kept(expression: str) -> Sql92Filter | Sql92Error | None:
    result = _compiled.get(expression)
    if result is not None:
        _compiled.move_to_end(expression)
    return result


def _unwrapped(result: Sql92Filter | Sql92Error) -> Sql92Filter:
    """Failures are kept too: a client repeating a long bad expression in every pull or
    heartbeat costs its compile once."""
    if isinstance(result, Sql92Error):
        raise Sql92Error(result.remark)  # a new one: a kept exception would grow its traceback
    return result


def _check_type(expression_type: str) -> None:
    """FilterFactory.get(type): only SQL92 is known."""
    if expression_type != EXPRESSION_TYPE_SQL92:
        raise Sql92Error(
            f"java.lang.IllegalArgumentException: no filter for expression type {expression_type}"
        )


def compile_expression(expression_type: str, expression: str) -> Sql92Filter:
    """FilterFactory.get(type).compile(expression), on the caller's thread (the kept result
    when there is one)."""
    _check_type(expression_type)
    result = _kept(expression)
    if result is None:
        result = _compiled_or_error(expression)
        _keep(expression, result)
    return _unwrapped(result)


async def compile_expression_async(expression_type: str, expression: str) -> Sql92Filter:
    """:func:`compile_expression`, a long expression compiled in a worker thread."""
    _check_type(expression_type)
    if len(expression) > INLINE_COMPILE_MAX and _kept(expression) is None:
        compiled = await trio.to_thread.run_sync(
            _compiled_or_error, expression, limiter=_compile_slot
        )
        _keep(expression, compiled)
    return compile_expression(expression_type, expression)


@attrs.define(eq=False)
class ConsumerFilterData:
    consumer_group: str
    topic: str
    expression: str
    expression_type: str
    born_time: int
    dead_time: int = 0
    client_version: int = 0

    @property
    def is_dead(self) -> bool:
        return self.dead_time >= self.born_time

    def how_long_after_death(self, now_ms: int) -> int:
        return now_ms - self.dead_time if self.is_dead else -1

    def to_json(self) -> dict[str, Any]:
        return {
            "bloomFilterData": None,
            "bornTime": self.born_time,
            "clientVersion": self.client_version,
            "consumerGroup": self.consumer_group,
            "deadTime": self.dead_time,
            "expression": self.expression,
            "expressionType": self.expression_type,
            "topic": self.topic,
        }


async def build_filter_data(
    topic: str, group: str, expression: str, expression_type: str, client_version: int, now_ms: int
) -> ConsumerFilterData | None:
    """ConsumerFilterManager.build: None for a TAG subscription or one that does not compile
    (the compiled expression is kept by :func:`compile_expression`, not in the data)."""
    if is_tag_type(expression_type):
        return None
    try:
        await compile_expression_async(expression_type, expression)
    except Sql92Error as exc:
        log.error(
            "parse error: expr=%s, topic=%s, group=%s, error=%s",
            expression,
            topic,
            group,
            exc.remark,
        )
        return None
    return ConsumerFilterData(
        consumer_group=group,
        topic=topic,
        expression=expression,
        expression_type=expression_type,
        born_time=now_ms,
        client_version=client_version,
    )


def _now_ms() -> int:
    return int(time.time() * 1000)


class ConsumerFilterManager(JsonConfigManager):
    file_name = "consumerFilter.json"

    def __init__(
        self,
        config_dir: str,
        clean_time_span_ms: int = MS_24_HOURS,
        clock: Callable[[], int] = _now_ms,
        *,
        enabled: Callable[[], bool] = lambda: True,
    ) -> None:
        """``enabled``: whether the broker's ``enablePropertyFilter`` is on; without it no
        filter is kept (nothing registered, nothing loaded)."""
        super().__init__(config_dir)
        self.enabled = enabled
        # topic -> group -> filter
        self.filter_data_by_topic: dict[str, dict[str, ConsumerFilterData]] = {}
        self.clean_time_span_ms = clean_time_span_ms
        self.clock = clock

    # -- registration ---------------------------------------------------------------------------

    async def register_group(self, group: str, subscriptions: Iterable[SubscriptionData]) -> None:
        """A heartbeat's subscriptions: register the non-TAG ones, mark dead the group's filters
        of topics it no longer subscribes to."""
        if not self.enabled():
            return
        subs = list(subscriptions)
        for sub in subs:
            await self.register(
                sub.topic, group, sub.sub_string, sub.expression_type, sub.sub_version
            )
        topics = {sub.topic for sub in subs}
        now = self.clock()
        for data in self.by_group(group):
            if data.topic not in topics and not data.is_dead:
                data.dead_time = now

    async def register(
        self, topic: str, group: str, expression: str, expression_type: str, client_version: int
    ) -> bool:
        """FilterDataMapByTopic.register: a newer version replaces the filter (recompiled only
        when the expression changed); an older one is ignored; the same version revives a dead
        filter.  Returns True when the table changed."""
        if is_tag_type(expression_type) or not expression:
            return False
        now = self.clock()
        groups = self.filter_data_by_topic.setdefault(topic, {})
        old = groups.get(group)
        if old is None:
            data = await build_filter_data(
                topic, group, expression, expression_type, client_version, now
            )
            if data is None:
                if not groups:
                    del self.filter_data_by_topic[topic]
                return False
            groups[group] = data
            return True
        if client_version <= old.client_version:
            if old.expression_type != expression_type or old.expression != expression:
                log.warning(
                    "ignore consumer(%s : %s) filter, version %d <= %d, but it changed: "
                    "old=%s:%s, ignored=%s:%s",
                    group,
                    topic,
                    client_version,
                    old.client_version,
                    old.expression_type,
                    old.expression,
                    expression_type,
                    expression,
                )
            if client_version == old.client_version and old.is_dead:
                old.dead_time = 0
                return True
            return False
        if old.expression != expression or old.expression_type != expression_type:
            data = await build_filter_data(
                topic, group, expression, expression_type, client_version, now
            )
            if data is None:
                del groups[group]
                return False
            groups[group] = data
            return True
        old.client_version = client_version
        if old.is_dead:
            old.dead_time = 0
        return True

    def unregister_group(self, group: str) -> None:
        """The group has no consumer left: its filters die (cleaned later)."""
        now = self.clock()
        for groups in self.filter_data_by_topic.values():
            data = groups.get(group)
            if data is not None and not data.is_dead:
                data.dead_time = now

    # -- queries --------------------------------------------------------------------------------

    @staticmethod
    async def prepare(data: ConsumerFilterData) -> Sql92Filter | None:
        """``data``'s compiled expression (kept, or compiled now: a long one in a worker
        thread); None when it does not compile."""
        try:
            return await compile_expression_async(data.expression_type, data.expression)
        except Sql92Error:
            return None

    def get(self, topic: str, group: str) -> ConsumerFilterData | None:
        groups = self.filter_data_by_topic.get(topic)
        return groups.get(group) if groups else None

    def by_group(self, group: str) -> list[ConsumerFilterData]:
        return [groups[group] for groups in self.filter_data_by_topic.values() if group in groups]

    # -- persistence ----------------------------------------------------------------------------

    def clean(self) -> None:
        """Drop the filters dead for ``filterDataCleanTimeSpan`` or longer."""
        now = self.clock()
        for topic in list(self.filter_data_by_topic):
            groups = self.filter_data_by_topic[topic]
            for group in list(groups):
                if groups[group].how_long_after_death(now) >= self.clean_time_span_ms:
                    del groups[group]
            if not groups:
                del self.filter_data_by_topic[topic]

    def encode(self) -> Any:
        self.clean()
        return {
            "filterDataByTopic": {
                topic: {
                    "groupFilterData": {g: d.to_json() for g, d in groups.items()},
                    "topic": topic,
                }
                for topic, groups in self.filter_data_by_topic.items()
            }
        }

    def decode(self, data: Any) -> None:
        """The table as the file has it; nothing is compiled (filters are compiled when a pull
        first needs them) and, without ``enabled``, nothing is kept."""
        table: dict[str, dict[str, ConsumerFilterData]] = {}
        if not self.enabled():
            self.filter_data_by_topic = table
            return
        by_topic = data.get("filterDataByTopic") or {}
        dead_since = self.clock() - LOADED_DEAD_AGO_MS
        for topic, entry in by_topic.items():
            if not isinstance(entry, dict):
                continue
            for group, raw in (entry.get("groupFilterData") or {}).items():
                if not isinstance(raw, dict):
                    continue
                loaded = ConsumerFilterData(
                    consumer_group=str(raw.get("consumerGroup") or group),
                    topic=str(raw.get("topic") or topic),
                    expression=str(raw.get("expression") or ""),
                    expression_type=str(raw.get("expressionType") or ""),
                    born_time=int(raw.get("bornTime") or 0),
                    dead_time=int(raw.get("deadTime") or 0),
                    client_version=int(raw.get("clientVersion") or 0),
                )
                if loaded.dead_time == 0:
                    loaded.dead_time = max(dead_since, loaded.born_time)
                table.setdefault(topic, {})[group] = loaded
        self.filter_data_by_topic = table
