"""Shared fixtures: servers bind 127.0.0.1 on free ports and stop with the test.

The suite runs with ``HOME`` pointed at a directory of its own, removed when it ends: the
clients it drives write there, not in the user's home (the official 5.x client makes
``~/logs/rocketmq_python/`` as soon as it is imported, in the test process and in every broker
child that serves gRPC; the C++ client logs to ``~/logs/rocketmq-cpp/``; a 4.x consumer keeps
local offsets in ``~/.rocketmq_offsets``).  Set here, before any test module imports a client
(the imports above import none).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

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

SUITE_HOME = tempfile.mkdtemp(prefix="pymq-tests-home-")
REAL_HOME = os.path.expanduser("~")
os.environ["HOME"] = SUITE_HOME
atexit.register(shutil.rmtree, SUITE_HOME, True)

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
