"""The pull read loop's cost per record (issue #38, "Keep": the consume figure within 5 % of the
tree before the issue).  Every pull of every consumer runs ``get_message._collect`` once per
record it serves, and in CPython a Python call there costs more than the rest of the record's
work: the loop calls no Python helper of its own per record, only the commit log's read (and the
record check, a Python function only in PYMQ_PURE_PYTHON mode).  Its helpers run once per pull.
"""

from __future__ import annotations

import sys
from types import CodeType, FrameType
from typing import Any

import pymq.store.get_message as get_message_module
from pymq.broker.context import BrokerContext
from tests.unit import test_processors as processors
from tests.unit.test_processors import GROUP, TOPIC, put

ctx = processors.ctx  # a broker context over a real store in a temp dir


def _own_calls(ctx: BrokerContext, max_nums: int) -> tuple[int, list[str]]:
    """Serve a pull of ``max_nums`` records; how many it served and the Python functions the
    read loop itself called, but the commit log's read and the record check."""
    store = ctx.store
    per_record: set[CodeType] = {type(store.commitlog).get_message.__code__}
    record_is = get_message_module.record_is
    if hasattr(record_is, "__code__"):  # the pure-Python twin
        per_record.add(record_is.__code__)
    loop = get_message_module._collect.__code__
    called: list[str] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        caller = frame.f_back
        if event != "call" or caller is None or frame.f_code in per_record:
            return
        if caller.f_code is loop:
            called.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        result = store.get_message(GROUP, TOPIC, 0, 0, max_nums)
    finally:
        sys.setprofile(None)
    return len(result.messages), called


async def test_the_read_loop_calls_no_helper_per_record(ctx: BrokerContext) -> None:
    await put(ctx, *[b"m%d" % n for n in range(32)])
    served_few, few = _own_calls(ctx, 4)
    served_many, many = _own_calls(ctx, 32)
    assert (served_few, served_many) == (4, 32)
    # The same helpers, once per pull, whether it serves 4 records or 32.
    assert many == few
    assert len(many) <= 3, many
