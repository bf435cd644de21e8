"""pymq's own version is one number wherever it is shown: the package metadata (from
pyproject.toml), ``pymq.__version__``, every command's ``--version``, and the broker's status
(the console's "Version" row); clients are still told RocketMQ's version."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import pymq
from pymq.broker.runtime_info import BROKER_VERSION_DESC

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_version_is_pyprojects() -> None:
    with open(ROOT / "pyproject.toml", "rb") as f:
        declared = tomllib.load(f)["project"]["version"]
    assert pymq.__version__ == declared


@pytest.mark.parametrize(
    "module", ["pymq", "pymq.broker", "pymq.namesrv", "pymq.client", "pymq.admin"]
)
def test_every_command_prints_it(module: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", module, "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == f"pymq {pymq.__version__}"


def test_clients_are_told_rocketmqs_version() -> None:
    assert BROKER_VERSION_DESC == "V4_9_4"
