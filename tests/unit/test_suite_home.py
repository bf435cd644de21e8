"""The suite leaves nothing in the user's home: ``HOME`` is a directory of its own
(tests/conftest.py), so the official 5.x client's logs go there."""

from __future__ import annotations

import os

from tests.conftest import REAL_HOME, SUITE_HOME


def test_the_5x_clients_log_directory_is_the_suites_own() -> None:
    from rocketmq.v5.log import log_config

    log_dir = os.path.realpath(getattr(log_config, "__DIR"))
    assert os.path.realpath(SUITE_HOME) != os.path.realpath(REAL_HOME)
    assert log_dir.startswith(os.path.realpath(SUITE_HOME) + os.sep)
    assert os.path.isdir(log_dir)
    assert os.environ["HOME"] == SUITE_HOME  # children the tests start inherit it
