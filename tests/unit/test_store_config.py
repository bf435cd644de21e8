"""MessageStoreConfig: Java keys, defaults, derived paths, properties round trip."""

from __future__ import annotations

import os

from pymq.common.config import apply_properties, config_keys, to_properties
from pymq.store.config import BrokerRole, FlushDiskType, MessageStoreConfig


def test_defaults_and_java_keys():
    c = MessageStoreConfig(store_path_root_dir="/data/store")
    keys = set(config_keys(c))
    for key in (
        "storePathRootDir",
        "storePathCommitLog",
        "mappedFileSizeCommitLog",
        "mappedFileSizeConsumeQueue",
        "flushDiskType",
        "flushIntervalCommitLog",
        "flushCommitLogLeastPages",
        "flushCommitLogThoroughInterval",
        "flushIntervalConsumeQueue",
        "flushConsumeQueueLeastPages",
        "flushConsumeQueueThoroughInterval",
        "syncFlushTimeout",
        "fileReservedTime",
        "deleteWhen",
        "diskMaxUsedSpaceRatio",
        "cleanResourceInterval",
        "destroyMapedFileIntervalForcibly",
        "maxMessageSize",
        "maxHashSlotNum",
        "maxIndexNum",
        "messageIndexEnable",
        "messageIndexSafe",
        "brokerRole",
        "haListenPort",
        "haMasterAddress",
        "haSlaveFallbehindMax",
        "messageDelayLevel",
        "checkCRCOnRecover",
        "maxTransferBytesOnMessageInMemory",
        "maxTransferCountOnMessageInDisk",
    ):
        assert key in keys, key
    assert c.mapped_file_size_commit_log == 1024**3
    assert c.mapped_file_size_consume_queue == 6_000_000
    assert c.flush_disk_type is FlushDiskType.ASYNC_FLUSH
    assert c.broker_role is BrokerRole.ASYNC_MASTER
    assert c.max_message_size == 4 * 1024 * 1024
    assert (c.max_hash_slot_num, c.max_index_num) == (5_000_000, 20_000_000)
    assert c.store_path_commitlog == os.path.join("/data/store", "commitlog")
    assert c.consume_queue_dir == os.path.join("/data/store", "consumequeue")
    assert c.index_dir == os.path.join("/data/store", "index")
    assert c.checkpoint_path.endswith("/data/store/checkpoint")
    assert c.abort_path.endswith("abort") and c.lock_path.endswith("lock")
    assert c.delay_levels_ms()[:4] == [1000, 5000, 10000, 30000]
    assert c.delay_levels_ms()[-1] == 2 * 3600 * 1000 and len(c.delay_levels_ms()) == 18


def test_properties_apply_and_round_trip():
    c = MessageStoreConfig()
    unknown = apply_properties(
        [c],
        {
            "storePathRootDir": "/x",
            "flushDiskType": "SYNC_FLUSH",
            "brokerRole": "SLAVE",
            "mappedFileSizeCommitLog": "65536",
            "checkCRCOnRecover": "false",
            "bogusKey": "1",
        },
    )
    assert unknown == ["bogusKey"]
    assert c.store_path_root_dir == "/x" and c.store_path_commitlog == "/x/commitlog"
    assert c.flush_disk_type is FlushDiskType.SYNC_FLUSH
    assert c.broker_role is BrokerRole.SLAVE
    assert c.mapped_file_size_commit_log == 65536 and c.check_crc_on_recover is False
    props = to_properties([c])
    assert props["flushDiskType"] == "SYNC_FLUSH" and props["checkCRCOnRecover"] == "false"
