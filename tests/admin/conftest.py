"""Fixtures for the admin tests: a cluster with the admin channel on, and a channel client.

The client class and URL helper are in tests/admin/helpers.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from trio_websocket import open_websocket_url

from pymq.embedded import ADMIN_ANY_PORT, Cluster, open_cluster
from pymq.testing import TEST_PROPERTIES
from tests.admin.helpers import AdminClient, ws_url


@pytest.fixture
async def admin_cluster(tmp_path) -> AsyncIterator[Cluster]:
    async with open_cluster(
        str(tmp_path),
        namesrv_port=0,
        broker_port=0,
        bind_address="127.0.0.1",
        properties=dict(TEST_PROPERTIES),
        admin_port=ADMIN_ANY_PORT,
    ) as cluster:
        yield cluster


@pytest.fixture
async def admin(admin_cluster: Cluster) -> AsyncIterator[AdminClient]:
    channel = admin_cluster.admin_channel
    assert channel is not None
    async with open_websocket_url(ws_url(admin_cluster)) as ws:
        client = AdminClient(ws)
        await client.call("auth", token=channel.token)
        yield client
