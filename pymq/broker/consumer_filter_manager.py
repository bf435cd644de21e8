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

import functools
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from pymq.broker.config_manager import JsonConfigManager
from pymq.common.consumer import EXPRESSION_TYPE_SQL92, SubscriptionData, is_tag_type
from pymq.common.sql92 import Sql92Error, Sql92Filter, compile_sql92

log = logging.getLogger(__name__)

MS_24_HOURS = 24 * 3600 * 1000
LOADED_DEAD_AGO_MS = 30 * 1000


COMPILE_CACHE_SIZE = 100
"""Compiled expressions kept by text (as Java's SelectorParser cache), so that pulls carrying
their expression (sysFlag bit 4) do not compile it each time."""


@functools.lru_cache(maxsize=COMPILE_CACHE_SIZE)
def _compiled_or_error(expression: str) -> Sql92Filter | Sql92Error:
    try:
        return compile_sql92(expression)
    except Sql92Error as exc:
        return Sql92Error(exc.remark)  # without the compile's frames


def _compile_cached(expression: str) -> Sql92Filter:
    """Failures are kept too: a client repeating a long bad expression in every pull or
    heartbeat costs its compile once."""
    result = _compiled_or_error(expression)
    if isinstance(result, Sql92Error):
        raise Sql92Error(result.remark)  # a new one: a kept exception would grow its traceback
    return result


def compile_expression(expression_type: str, expression: str) -> Sql92Filter:
    """FilterFactory.get(type).compile(expression): only SQL92 is known."""
    if expression_type != EXPRESSION_TYPE_SQL92:
        raise Sql92Error(
            f"java.lang.IllegalArgumentException: no filter for expression type {expression_type}"
        )
    return _compile_cached(expression)


@attrs.define(eq=False)
class ConsumerFilterData:
    consumer_group: str
    topic: str
    expression: str
    expression_type: str
    born_time: int
    dead_time: int = 0
    client_version: int = 0
    compiled: Sql92Filter | None = None

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


def build_filter_data(
    topic: str, group: str, expression: str, expression_type: str, client_version: int, now_ms: int
) -> ConsumerFilterData | None:
    """ConsumerFilterManager.build: None for a TAG subscription or one that does not compile."""
    if is_tag_type(expression_type):
        return None
    try:
        compiled = compile_expression(expression_type, expression)
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
        compiled=compiled,
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
    ) -> None:
        super().__init__(config_dir)
        # topic -> group -> filter
        self.filter_data_by_topic: dict[str, dict[str, ConsumerFilterData]] = {}
        self.clean_time_span_ms = clean_time_span_ms
        self.clock = clock

    # -- registration ---------------------------------------------------------------------------

    def register_group(self, group: str, subscriptions: Iterable[SubscriptionData]) -> None:
        """A heartbeat's subscriptions: register the non-TAG ones, mark dead the group's filters
        of topics it no longer subscribes to."""
        subs = list(subscriptions)
        for sub in subs:
            self.register(sub.topic, group, sub.sub_string, sub.expression_type, sub.sub_version)
        topics = {sub.topic for sub in subs}
        now = self.clock()
        for data in self.by_group(group):
            if data.topic not in topics and not data.is_dead:
                data.dead_time = now

    def register(
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
            data = build_filter_data(topic, group, expression, expression_type, client_version, now)
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
            data = build_filter_data(topic, group, expression, expression_type, client_version, now)
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
        table: dict[str, dict[str, ConsumerFilterData]] = {}
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
                try:
                    loaded.compiled = compile_expression(loaded.expression_type, loaded.expression)
                except Sql92Error as exc:
                    log.error("load filter data error, %s: %s", loaded, exc.remark)
                if loaded.dead_time == 0:
                    loaded.dead_time = max(dead_since, loaded.born_time)
                table.setdefault(topic, {})[group] = loaded
        self.filter_data_by_topic = table
