"""DLedger mode's keys (RocketMQ 4.9.4's MessageStoreConfig) and the DLedgerConfig built from
them as 4.9.4's DLedgerCommitLog builds it."""

from __future__ import annotations

import os

import pytest

from pymq.broker.__main__ import build_configs
from pymq.broker.controller import BrokerController
from pymq.common.config import ConfigError, to_properties
from pymq.dledger.config import (
    DLedgerConfig,
    from_store_config,
    parse_peers,
    rocketmq_broker_id,
)
from pymq.store.config import MessageStoreConfig

PEERS = "n0-127.0.0.1:40911;n1-127.0.0.1:40912;n2-127.0.0.1:40913"


def _store(**keys: str) -> MessageStoreConfig:
    configs = build_configs(None, keys)
    store = configs[3]
    assert isinstance(store, MessageStoreConfig)
    return store


def test_the_keys_are_read_from_properties_and_left_out_of_the_listing_while_null() -> None:
    assert "dLegerPeers" not in to_properties([MessageStoreConfig()], skip_none=True)
    store = _store(
        dLegerGroup="RaftNode00",
        dLegerPeers=PEERS,
        dLegerSelfId="n1",
        storePathDLedgerCommitLog="/data/dledger",
        preferredLeaderId="n0",
    )
    assert store.d_leger_group == "RaftNode00"
    assert store.d_leger_peers == PEERS
    assert store.d_leger_self_id == "n1"
    assert store.store_path_d_ledger_commit_log == "/data/dledger"
    assert store.preferred_leader_id == "n0"
    listed = to_properties([store], skip_none=True)
    assert listed["dLegerSelfId"] == "n1" and listed["storePathDLedgerCommitLog"] == "/data/dledger"


def test_from_store_config_sets_what_rocketmq_494_sets(tmp_path) -> None:
    store = _store(
        dLegerGroup="g",
        dLegerPeers=PEERS,
        dLegerSelfId="n2",
        storePathRootDir=str(tmp_path),
        mappedFileSizeCommitLog="1048576",
        fileReservedTime="48",
        deleteWhen="03",
        diskMaxUsedSpaceRatio="80",
        cleanFileForciblyEnable="false",
        preferredLeaderId="n0;n1",
    )
    config = from_store_config(store, enable_batch_push=True)
    assert (config.group, config.self_id, config.peers) == ("g", "n2", PEERS)
    assert config.store_base_dir == str(tmp_path)
    assert config.default_path == os.path.join(str(tmp_path), "dledger-n2")
    assert config.data_path == os.path.join(str(tmp_path), "dledger-n2", "data")
    assert config.index_path == os.path.join(str(tmp_path), "dledger-n2", "index")
    assert config.mapped_file_size_for_entry_data == 1048576
    assert config.file_reserved_hours == 49  # fileReservedTime + 1, as 4.9.4
    assert config.delete_when == "03"
    assert config.disk_space_ratio_to_check_expired == pytest.approx(0.80)
    assert config.enable_disk_force_clean is False
    assert config.enable_batch_push is True
    assert config.preferred_leaders() == ["n0", "n1"]
    # the timings are DLedgerConfig's defaults: 4.9.4 reads none of them from the broker
    defaults = DLedgerConfig()
    assert (config.heart_beat_time_interval_ms, config.max_heart_beat_leak) == (2000, 3)
    assert (config.min_vote_interval_ms, config.max_vote_interval_ms) == (300, 1000)
    assert config.max_pending_requests_num == defaults.max_pending_requests_num == 10000
    assert config.max_push_time_out_ms == 1000 and config.max_wait_ack_time_ms == 2500
    assert config.mapped_file_size_for_entry_index == 32 * 5 * 1024 * 1024
    assert DLedgerConfig().mapped_file_size_for_entry_data == 1024**3
    moved = from_store_config(
        _store(
            dLegerGroup="g",
            dLegerPeers=PEERS,
            dLegerSelfId="n0",
            storePathDLedgerCommitLog="/elsewhere",
        )
    )
    assert moved.data_path == "/elsewhere"


def test_parse_peers_keeps_order_and_addresses() -> None:
    peers = parse_peers(PEERS + ";")  # a trailing ';' is dropped, as Java's split does
    assert list(peers) == ["n0", "n1", "n2"]
    assert peers["n1"].address == "127.0.0.1:40912"
    assert parse_peers("a0-[::1]:9")["a0"].host == "[::1]"


@pytest.mark.parametrize(
    ("peers", "fragment"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("n0-127.0.0.1:40911;;n1-h:1", "expected id-host:port"),
        ("n0127.0.0.1:40911", "expected id-host:port"),
        ("-127.0.0.1:40911", "the id must be"),
        ("n 0-127.0.0.1:40911", "the id must be"),
        ("n0-127.0.0.1", "expected id-host:port"),
        ("n0-:40911", "expected id-host:port"),
        ("n0-127.0.0.1:0", "the port must be"),
        ("n0-127.0.0.1:65536", "the port must be"),
        ("n0-127.0.0.1:x", "the port must be"),
        ("n0-127.0.0.1:1;n0-127.0.0.1:2", "twice"),
        (";".join(f"n{i}-h:{i + 1}" for i in range(65)), "at most 64"),
    ],
)
def test_a_malformed_peers_string_is_refused_naming_the_entry(peers, fragment) -> None:
    with pytest.raises(ConfigError, match=fragment):
        parse_peers(peers)
    store = _store(dLegerGroup="g", dLegerSelfId="n0")
    store.d_leger_peers = peers
    with pytest.raises(ConfigError):
        from_store_config(store)


@pytest.mark.parametrize(
    ("keys", "fragment"),
    [
        ({"dLegerPeers": PEERS, "dLegerSelfId": "n0"}, "dLegerGroup must be set"),
        ({"dLegerGroup": "g", "dLegerSelfId": "n0"}, "dLegerPeers must be set"),
        ({"dLegerGroup": "g", "dLegerPeers": PEERS}, "dLegerSelfId must be set"),
        ({"dLegerGroup": "g", "dLegerPeers": PEERS, "dLegerSelfId": "n3"}, "not among"),
        (
            {"dLegerGroup": "g", "dLegerPeers": "a-h:1;bb-h:2", "dLegerSelfId": "bb"},
            "broker id",
        ),
        (
            {
                "dLegerGroup": "g",
                "dLegerPeers": PEERS,
                "dLegerSelfId": "n0",
                "preferredLeaderId": "n9",
            },
            "preferredLeaderId 'n9' is not among",
        ),
    ],
)
def test_missing_or_inconsistent_keys_are_refused(keys, fragment) -> None:
    with pytest.raises(ConfigError, match=fragment):
        from_store_config(_store(**keys))


def test_rocketmq_broker_ids() -> None:
    assert [rocketmq_broker_id(i) for i in ("n0", "n1", "n2", "x10")] == [1, 2, 3, 11]
    for bad in ("n", "nn", "n-1", "n1a", ""):
        with pytest.raises(ConfigError):
            rocketmq_broker_id(bad)


@pytest.mark.parametrize(
    "changes",
    [
        {"min_vote_interval_ms": 1000, "max_vote_interval_ms": 1000},
        {"heart_beat_time_interval_ms": 0},
        {"mapped_file_size_for_entry_index": 33},
        {"mapped_file_size_for_entry_data": 48},
        {"group": ""},
    ],
)
def test_check_refuses_unusable_timings_and_sizes(changes) -> None:
    DLedgerConfig(group="g", peers=PEERS).check()
    with pytest.raises(ConfigError):
        DLedgerConfig(**{"group": "g", "peers": PEERS, **changes}).check()


def test_dledger_mode_without_its_keys_is_refused_at_start_with_one_line(tmp_path) -> None:
    configs = build_configs(
        None,
        {
            "enableDLegerCommitLog": "true",
            "dLegerPeers": PEERS,
            "dLegerSelfId": "n0",
            "storePathRootDir": str(tmp_path),
        },
    )
    with pytest.raises(ConfigError) as info:
        BrokerController(*configs)
    message = str(info.value)
    assert message.startswith("dLegerGroup must be set when enableDLegerCommitLog=true")
    assert "\n" not in message
    assert not (tmp_path / "abort").exists()
