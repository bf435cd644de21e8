"""Fixtures for store tests (the helpers they use are in tests/store/helpers.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def root(tmp_path) -> str:
    return str(tmp_path / "store")
