"""Test helpers for pymq users: an in-process name server + broker on free loopback ports.

In a ``conftest.py``::

    from pymq.testing import pymq_cluster  # noqa: F401  (a pytest-trio fixture)

    async def test_roundtrip(pymq_cluster):
        async with Producer("my-group", pymq_cluster.namesrv_addr) as producer:
            ...

The fixture's servers bind 127.0.0.1 on ports the OS picks, keep their files under the test's
``tmp_path``, and stop when the test ends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from pymq.embedded import Cluster, open_cluster

# Small commit-log files keep a test's store cheap to create and to recover.
TEST_PROPERTIES = {"mappedFileSizeCommitLog": str(16 * 1024 * 1024)}


@pytest.fixture
async def pymq_cluster(tmp_path) -> AsyncIterator[Cluster]:  # noqa: ANN001
    async with open_cluster(
        str(tmp_path),
        namesrv_port=0,
        broker_port=0,
        bind_address="127.0.0.1",
        properties=dict(TEST_PROPERTIES),
    ) as cluster:
        yield cluster
