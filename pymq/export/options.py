"""``ExportOptions``: what an export reads, parsed once from Spark-style string options.

The Spark data source gets its options as strings (``.option("topics", "a,b")``); the export job
and the benchmark build the same object from command-line flags.  Parsing lives here and only
here; a bad value raises :class:`OptionError` with the option's name in the message.

Options (Spark option names, case-insensitive as Spark passes them):

``path``                the store root (holding ``commitlog/``) or the commit-log directory itself
``topics``              comma-separated topics; when given, only these (system topics included if
                        named), otherwise every topic except system ones
``includeSystemTopics`` ``true`` to export system topics too (see ``is_system_topic``)
``fromTime``            store time, inclusive: epoch milliseconds or ISO-8601 (naive means UTC)
``toTime``              store time, exclusive; the scan stops at the first record at or after it
``fromOffset``          commit-log offset, inclusive (records starting before it are skipped)
``toOffset``            commit-log offset, exclusive (records starting at or after it)
``untilCheckpoint``     ``true``: never read a record stored after the checkpoint's
                        physicMsgTimestamp (what the broker has flushed); ``false``: read every
                        valid record; ``auto`` (default): ``true`` when the store's ``abort`` file
                        exists, i.e. a broker is running on it or did not shut down cleanly
``mode``                ``permissive`` (default): skip corrupt ranges, report them, go on;
                        ``failfast``: fail the task at the first corrupt range
``reportDir``           a directory where each task writes a JSON report of what it read
"""

from __future__ import annotations

import datetime
import enum
from typing import TypeVar

import attrs

_E = TypeVar("_E", bound=enum.Enum)


class OptionError(ValueError):
    """An export option with a value that cannot be used; the message names the option."""


class Mode(enum.Enum):
    PERMISSIVE = "permissive"
    FAILFAST = "failfast"


class CheckpointBound(enum.Enum):
    AUTO = "auto"
    YES = "true"
    NO = "false"


def parse_time_ms(name: str, value: str) -> int:
    """Epoch milliseconds from ``value``: an integer, or ISO-8601 (a naive time means UTC)."""
    text = value.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        stamp = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise OptionError(
            f"{name}: {value!r} is neither epoch milliseconds nor an ISO-8601 time"
        ) from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=datetime.UTC)
    return int(stamp.timestamp() * 1000)


def _parse_int(name: str, value: str) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        raise OptionError(f"{name}: {value!r} is not an integer") from None
    if number < 0:
        raise OptionError(f"{name}: {number} is negative")
    return number


def _parse_bool(name: str, value: str) -> bool:
    text = value.strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off", ""):
        return False
    raise OptionError(f"{name}: {value!r} is not true or false")


def _parse_enum(name: str, value: str, kind: type[_E]) -> _E:
    text = value.strip().lower()
    if text == "yes":
        text = "true"
    elif text == "no":
        text = "false"
    for member in kind:
        if member.value == text:
            return member
    allowed = ", ".join(m.value for m in kind)
    raise OptionError(f"{name}: {value!r} is not one of {allowed}")


@attrs.frozen
class ExportOptions:
    """A validated export request; every bound is optional."""

    path: str
    topics: frozenset[str] | None = None
    include_system_topics: bool = False
    from_time: int | None = None
    to_time: int | None = None
    from_offset: int | None = None
    to_offset: int | None = None
    until_checkpoint: CheckpointBound = CheckpointBound.AUTO
    mode: Mode = Mode.PERMISSIVE
    report_dir: str | None = None

    @classmethod
    def from_options(cls, options: dict[str, str]) -> ExportOptions:
        """Parse Spark options (names matched case-insensitively); raises :class:`OptionError`."""
        opts = {k.lower(): v for k, v in options.items() if v is not None}
        path = opts.get("path", "").strip()
        if not path:
            raise OptionError('path: the store directory is required (.option("path", DIR))')
        topics = None
        if opts.get("topics", "").strip():
            topics = frozenset(t.strip() for t in opts["topics"].split(",") if t.strip())
        result = cls(
            path=path,
            topics=topics,
            include_system_topics=_parse_bool(
                "includeSystemTopics", opts.get("includesystemtopics", "false")
            ),
            from_time=parse_time_ms("fromTime", opts["fromtime"]) if "fromtime" in opts else None,
            to_time=parse_time_ms("toTime", opts["totime"]) if "totime" in opts else None,
            from_offset=_parse_int("fromOffset", opts["fromoffset"])
            if "fromoffset" in opts
            else None,
            to_offset=_parse_int("toOffset", opts["tooffset"]) if "tooffset" in opts else None,
            until_checkpoint=_parse_enum(
                "untilCheckpoint", opts.get("untilcheckpoint", "auto"), CheckpointBound
            ),
            mode=_parse_enum("mode", opts.get("mode", "permissive"), Mode),
            report_dir=opts.get("reportdir") or None,
        )
        result.check()
        return result

    def check(self) -> None:
        """Raise :class:`OptionError` when the bounds contradict each other."""
        if (
            self.from_time is not None
            and self.to_time is not None
            and self.from_time > self.to_time
        ):
            raise OptionError(f"fromTime {self.from_time} is after toTime {self.to_time}")
        if (
            self.from_offset is not None
            and self.to_offset is not None
            and self.from_offset > self.to_offset
        ):
            raise OptionError(f"fromOffset {self.from_offset} is after toOffset {self.to_offset}")

    def to_spark_options(self) -> dict[str, str]:
        """The same request as Spark option strings (the inverse of :meth:`from_options`)."""
        out = {
            "path": self.path,
            "includeSystemTopics": str(self.include_system_topics).lower(),
            "untilCheckpoint": self.until_checkpoint.value,
            "mode": self.mode.value,
        }
        if self.topics is not None:
            out["topics"] = ",".join(sorted(self.topics))
        for key, value in (
            ("fromTime", self.from_time),
            ("toTime", self.to_time),
            ("fromOffset", self.from_offset),
            ("toOffset", self.to_offset),
        ):
            if value is not None:
                out[key] = str(value)
        if self.report_dir:
            out["reportDir"] = self.report_dir
        return out
