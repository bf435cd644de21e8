"""``ReputMessageService._dispatch_some`` at a record it cannot parse: the blank end of a file
(go on in the next file), a record cut short (wait for the rest, quietly), and a whole but bad
record (stop there, logged once per offset) -- with the hinted dispatch as built (hints read
back, dispatch_hinted) and with the general path alone."""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from pymq.common.record import BLANK_MAGIC_CODE, MESSAGE_MAGIC_CODE
from pymq.store.reput import ReputMessageService
from tests.store.helpers import FakeCommitLog, dispatch_mode

HEADER = struct.Struct(">iI")
FILE_SIZE = 4096


@pytest.fixture(params=["fast", "general"])
def mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each test with the hinted dispatch as built and with the general path alone."""
    with dispatch_mode(request.param):
        yield request.param


def service(data: bytes, mode: str) -> tuple[ReputMessageService, FakeCommitLog, list]:
    cl = FakeCommitLog(data, FILE_SIZE)
    dispatched: list[object] = []
    table = SimpleNamespace(
        dispatch=lambda *a: dispatched.append(a), dispatch_fields=lambda *a: dispatched.append(a)
    )
    reput = ReputMessageService(cl, table)  # type: ignore[arg-type]
    return reput, cl, dispatched


def test_blank_record_rolls_to_the_next_file(mode: str) -> None:
    reput, cl, dispatched = service(HEADER.pack(FILE_SIZE, BLANK_MAGIC_CODE), mode)
    assert reput._dispatch_some(1 << 30) == (True, True)
    assert cl.rolled == [0]
    assert reput.reput_from_offset == FILE_SIZE
    assert dispatched == []


@pytest.mark.parametrize(
    "data",
    [
        HEADER.pack(200, MESSAGE_MAGIC_CODE),  # says 200 bytes, 8 are written
        HEADER.pack(200, MESSAGE_MAGIC_CODE) + bytes(100),
        struct.pack(">i", 200),  # not even the magic yet
    ],
)
def test_a_record_cut_short_waits_quietly(
    data: bytes, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    reput, cl, dispatched = service(data, mode)
    with caplog.at_level(logging.ERROR, logger="pymq.store.reput"):
        assert reput._dispatch_some(1 << 30) == (False, False)
        assert reput._dispatch_some(1 << 30) == (False, False)
    assert reput.reput_from_offset == 0
    assert (cl.rolled, dispatched, caplog.records) == ([], [], [])


@pytest.mark.parametrize(
    "data",
    [
        HEADER.pack(64, 0x12345678) + bytes(56),  # whole, but no magic pymq knows
        HEADER.pack(64, MESSAGE_MAGIC_CODE) + bytes(56),  # a message magic, fields all wrong
    ],
)
def test_a_whole_bad_record_stops_dispatch_logged_once(
    data: bytes, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    reput, cl, dispatched = service(data, mode)
    with caplog.at_level(logging.ERROR, logger="pymq.store.reput"):
        for _ in range(3):
            assert reput._dispatch_some(1 << 30) == (False, False)
    assert reput.reput_from_offset == 0
    assert (cl.rolled, dispatched) == ([], [])
    assert [r.getMessage()[:18] for r in caplog.records] == ["reput stopped at 0"]
