"""The console's Timers view in headless Chromium (issue #41): pending timers per topic and the
next due time, against ``python -m pymq``."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.admin.test_console import (
    ARTIFACTS,
    Server,
    console_page,
    run_cli,
    server,
)

__all__ = ["server"]  # the fixture, imported for the test below

SEND_TIMERS = textwrap.dedent(
    """
    import sys, time, trio
    from pymq.client import Message, Producer

    async def main() -> None:
        due = int(time.time() * 1000) + 600_000
        async with Producer("P", sys.argv[1]) as producer:
            for _ in range(3):
                msg = Message("TimerT", b"t", properties={"TIMER_DELIVER_MS": str(due)})
                await producer.send(msg)

    trio.run(main)
    """
)


@pytest.mark.slow
def test_console_timers_view(server: Server) -> None:
    from playwright.sync_api import expect

    run_cli("pymq.admin", "updateTopic", "-b", server.broker, "-t", "TimerT", "-w", "1")
    sent = subprocess.run(
        [sys.executable, "-c", SEND_TIMERS, server.namesrv], capture_output=True, timeout=60
    )
    assert sent.returncode == 0, sent.stderr
    with console_page(server.console) as (page, errors):
        page.get_by_role("button", name="Timers").click()
        expect(page.get_by_test_id("timer-pending")).to_have_text("3", timeout=10_000)
        expect(page.get_by_test_id("timer-topics")).to_contain_text("TimerT")
        expect(page.get_by_test_id("timer-next-due")).not_to_have_text("none within an hour")
        page.screenshot(path=str(ARTIFACTS / "timers.png"), full_page=True)
        assert errors == []
