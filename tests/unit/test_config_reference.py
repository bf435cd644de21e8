"""The configuration reference (docs/reference/configuration.md) covers every key and is what
scripts/config_reference.py writes; the keys it calls refused are refused at start."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

from pymq.broker.__main__ import build_configs
from pymq.broker.config import UNSUPPORTED_KEYS
from pymq.broker.controller import BrokerController
from pymq.common.config import ConfigError, refuse_unsupported

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import config_reference  # noqa: E402  (a script, imported from scripts/)


def _data() -> dict:
    with open(config_reference.DATA, "rb") as f:
        return tomllib.load(f)


def test_every_key_has_an_entry_and_the_page_is_current() -> None:
    page, problems = config_reference.build(_data())
    assert problems == []
    assert config_reference.PAGE.read_text() == page, "run scripts/config_reference.py"


def test_a_key_without_an_entry_is_named() -> None:
    data = _data()
    del data["store"]["flushDiskType"]
    data["broker"]["noSuchKey"] = {"effect": "x"}
    _, problems = config_reference.build(data)
    assert any(p.startswith("store.flushDiskType: no entry") for p in problems)
    assert any(p.startswith("broker.noSuchKey: an entry for a key") for p in problems)


def test_the_refused_entries_are_the_keys_the_broker_refuses() -> None:
    refused = {
        key
        for section in ("broker", "store")
        for key, entry in _data()[section].items()
        if entry.get("status") == "refused"
    }
    assert refused == set(UNSUPPORTED_KEYS)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("messageStorePlugIn", "com.example.Plugin"),
        ("fetchNamesrvAddrByAddressServer", "true"),
        ("enableLmq", "true"),
        ("enableMultiDispatch", "true"),
    ],
)
def test_the_broker_refuses_to_start_with_an_unsupported_key(tmp_path, key, value) -> None:
    configs = build_configs(None, {key: value, "storePathRootDir": str(tmp_path)})
    with pytest.raises(ConfigError, match=f"^{key}="):
        BrokerController(*configs)
    assert not (tmp_path / "abort").exists()  # nothing was started


def test_the_defaults_of_those_keys_start() -> None:
    configs = build_configs(None, {"enableDLegerCommitLog": "false", "enableLmq": "false"})
    refuse_unsupported((configs[0], configs[3]), UNSUPPORTED_KEYS)
