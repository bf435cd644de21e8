"""The console's message-trace view in real headless Chromium: the captured Java trace
messages sent to ``python -m pymq --traceTopicEnable true``, then a message's trace shown."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import trio

from pymq.remoting.client import open_remoting_client
from pymq.remoting.codes import ResponseCode
from tests.admin.test_console import ARTIFACTS, Server, console_page
from tests.integration.test_trace_topic import CONSUMED, PUB, PUBLISHED, SUB, send_captured

pytestmark = pytest.mark.slow  # a browser and a pymq process


@pytest.fixture
def trace_server(tmp_path) -> Iterator[Server]:
    srv = Server(tmp_path / "data", "--traceTopicEnable", "true")
    try:
        yield srv
    finally:
        srv.stop()


async def send_traces(broker: str) -> None:
    async with open_remoting_client() as client:
        for sample in (PUB, SUB):
            response = await send_captured(client, broker, sample)
            assert response.code == ResponseCode.SUCCESS, response.remark


def test_console_shows_a_message_trace(trace_server):
    from playwright.sync_api import expect

    trio.run(send_traces, trace_server.broker)
    with console_page(trace_server.console) as (page, errors):
        page.get_by_role("button", name="Messages").click()
        page.get_by_test_id("search-by").select_option("trace")
        page.get_by_test_id("search-key").fill(PUBLISHED)
        page.get_by_role("button", name="Search").click()
        table = page.get_by_test_id("trace-results")
        expect(table).to_contain_text("Publish", timeout=10_000)
        expect(table).to_contain_text("PG_TRACE")
        expect(table).to_contain_text("20 ms")
        expect(table).to_contain_text("127.0.0.1:49911")
        page.get_by_test_id("search-key").fill(CONSUMED)
        page.get_by_role("button", name="Search").click()
        expect(table).to_contain_text("Consume (before)", timeout=10_000)
        expect(table).to_contain_text("Consume (after)")
        expect(table).to_contain_text("CG_TRACE")
        page.screenshot(path=str(ARTIFACTS / "6-trace.png"), full_page=True)
        page.get_by_test_id("search-key").fill("NO_SUCH_ID")
        page.get_by_role("button", name="Search").click()
        expect(page.get_by_test_id("search-error")).to_contain_text("QUERY_NOT_FOUND")
        assert not errors, errors
