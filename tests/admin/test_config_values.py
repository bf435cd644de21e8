"""The admin channel's config.update with values a config body cannot carry: refused, nothing
changed, config.get still answers (issue #37, item 11)."""

from __future__ import annotations

import pytest

from pymq.embedded import Cluster
from tests.admin.helpers import AdminClient


@pytest.mark.parametrize(
    ("value", "why"),
    [("\ud800", "lone surrogate"), ("a\nb", "U+000A"), ("a\x00b", "U+0000")],
)
async def test_config_update_refuses_unwritable_text(
    admin_cluster: Cluster, admin: AdminClient, value: str, why: str
) -> None:
    before = (await admin.call("config.get"))["config"]
    reply = await admin.request(
        "config.update", config={"maxDelayTime": 41, "msgTraceTopicName": value}
    )
    assert reply["ok"] is False
    assert reply["error"]["code"] == "SYSTEM_ERROR"
    assert "msgTraceTopicName" in reply["error"]["message"] and why in reply["error"]["message"]
    assert admin_cluster.broker.broker_config.max_delay_time != 41
    assert (await admin.call("config.get"))["config"] == before
