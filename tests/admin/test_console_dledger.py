"""The console's DLedger groups table in headless Chromium (issue #42): ``python -m pymq`` in
DLedger mode, a group of one member, shows the group, its term, its leader and committed
index, and the member's row."""

from __future__ import annotations

import pytest

from tests.admin.test_console import ARTIFACTS, Server, console_page
from tests.helpers import free_port


@pytest.mark.slow
def test_console_dledger_groups(tmp_path) -> None:
    from playwright.sync_api import expect

    server = Server(
        tmp_path / "data",
        "--enableDLegerCommitLog",
        "true",
        "--dLegerGroup",
        "dl-console",
        "--dLegerPeers",
        f"n0-127.0.0.1:{free_port()}",
        "--dLegerSelfId",
        "n0",
    )
    try:
        with console_page(server.console) as (page, errors):
            summary = page.get_by_test_id("dledger-summary")
            expect(summary).to_contain_text("dl-console", timeout=15_000)
            expect(summary).to_contain_text("leader n0", timeout=15_000)
            expect(summary).to_contain_text("committed index")
            expect(page.get_by_test_id("dledger-panel")).to_be_visible()
            row = page.locator('#dledger-table tr[data-member="n0"]')
            expect(row).to_contain_text("LEADER", timeout=15_000)
            cells = row.locator("td")
            expect(cells.nth(4)).to_have_text("0")  # brokerId 0: the group's master
            expect(cells.nth(9)).to_have_text("0")  # the leader lags nothing
            page.screenshot(path=str(ARTIFACTS / "dledger.png"), full_page=True)
            assert errors == []
    finally:
        server.stop()
