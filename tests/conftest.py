"""Shared fixtures: servers bind 127.0.0.1 on free ports and stop with the test."""

from __future__ import annotations

import os

# The official 5.x client's grpcio keeps threads in the test process after the gRPC tests. With
# its fork support on, a fork while one of them is inside gRPC can break the child before it
# execs (measured: 9 forks in 200 failed), and the Spark tests' Java gateway is started through
# such a fork (Popen with preexec_fn): every Spark test then failed at setup in one CI run.
# Read by grpcio when it is imported, so set before any test module imports it.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import pytest
import trio
from hypothesis import settings

from pymq.namesrv.controller import NamesrvController
from pymq.remoting.client import RemotingClient, open_remoting_client
from pymq.testing import pymq_cluster  # noqa: F401  (the fixture users get)
from tests.helpers import make_namesrv

# Timing is not what these properties test: a loaded 2-core CI machine must not fail them.
settings.register_profile("pymq", deadline=None)
settings.load_profile("pymq")


@pytest.fixture
async def namesrv(nursery: trio.Nursery, tmp_path) -> NamesrvController:
    controller = make_namesrv(tmp_path)
    await nursery.start(controller.run)
    return controller


@pytest.fixture
async def client(nursery: trio.Nursery) -> RemotingClient:
    return RemotingClient(nursery)


__all__ = ["make_namesrv", "open_remoting_client"]
