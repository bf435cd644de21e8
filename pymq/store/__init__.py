"""The message store: RocketMQ 4.x's DefaultMessageStore and its on-disk layout, on Trio.

Layout under ``storePathRootDir`` (byte for byte as Java 4.x writes it): ``commitlog/`` (files
named by 20-digit start offset, records of :mod:`pymq.common.record`, BLANK filler at file
ends), ``consumequeue/{topic}/{queueId}/`` (20-byte entries), ``index/{yyyyMMddHHmmssSSS}``,
``checkpoint``, ``abort`` and ``lock``.

Who owns what (one class, one thing): ``MappedFile`` / ``MappedFileQueue`` (files and flush
positions), ``CommitLog`` (appends, offset table, recovery), ``ConsumeQueue`` /
``ConsumeQueueTable`` (queues and dispatch), ``IndexFile`` / ``IndexService`` (keys),
``StoreCheckpoint`` / ``StoreLock`` (checkpoint, abort, lock), ``ReputMessageService``,
``CommitLogFlushService`` / ``ConsumeQueueFlushService``, ``CleanCommitLogService`` /
``CleanConsumeQueueService``, ``get_message`` (the pull rules).  ``DefaultMessageStore`` wires
them and validates puts.

The broker's API (all on the Trio loop, from any task)::

    store = DefaultMessageStore(config, clock_ms=..., disk_ratio=..., mtime=...)
    store.store_host = (ip, port)                       # STOREHOST and offset msg ids
    store.set_arrival_listener(fn)                      # fn(topic, qid, max_offset, tags_code, ts)
    store.replica_waiter = async fn(offset) -> PutMessageStatus   # SYNC_MASTER (HA)
    await nursery.start(store.run)                      # lock, load, recover, serve

    await store.put(msg) -> PutMessageResult            # durable per flushDiskType / role
    await store.put(msgs) -> PutMessageResult           # one topic+queue, all or nothing
    store.put_now(msg | msgs | SingleSend | SendRun | BatchBody)   # no wait: the one sync way in
    store.get_message(group, topic, qid, offset, max_nums, tags_codes_or_None) -> GetMessageResult
    store.get_max_offset_in_queue(topic, qid) / get_min_offset_in_queue(topic, qid)
    store.get_offset_in_queue_by_time(topic, qid, ts) / get_earliest_message_time(topic, qid)
    store.get_message_store_timestamp(topic, qid, offset)
    store.get_commitlog_offset_in_queue(topic, qid, offset)
    store.look_message_by_offset(phy[, size]) -> MessageExt | None
    store.select_one_message_by_offset(phy[, size]) -> bytes | None
    store.query_message(topic, key, max_num, begin_ms, end_ms) -> QueryMessageResult
    store.get_commitlog_data(offset[, max_size=1 MiB]) -> bytes | None     # HA master
    store.append_to_commitlog(start_offset, data) -> bool                   # HA slave
    store.max_phy_offset / min_phy_offset / dispatch_behind_bytes
    await store.delete_topics(topics); await store.clean_files_once()
    store.execute_delete_files_manually(); store.runtime_info() -> dict[str, str]

Deliberate differences from Java 4.x (same files, same records):

* an empty ``storePathCommitLog`` means ``<storePathRootDir>/commitlog``;
* records with a NUL in the topic, or in the properties where a lost write leaves zeros (their
  first or last byte, a 512-byte boundary of the file: ``record.nul_where_torn``), are never
  written (the properties go in another order, ``record.tear_safe_properties``, or the put is
  refused when none avoids it) and are treated as torn at recovery (only the body has a CRC;
  a tail torn after the body would otherwise pass); Java stores them;
* store files are created atomically (sized under a hidden name, renamed), and empty files at
  the end of a queue are dropped at load instead of refusing to start;
* ``get_offset_in_queue_by_time`` returns the first offset stored at or after the time (5.x's
  lower bound) rather than Java 4's nearest message;
* ``get_message`` of a queue that does not exist answers NO_MATCHED_LOGIC_QUEUE (Java creates
  the queue and answers NO_MESSAGE_IN_QUEUE; the pull processor treats both alike);
* records are returned as ``bytes`` copies, so file deletion never races a reply;
* OS_PAGECACHE_BUSY is never returned (a put cannot be blocked by another on one loop).
"""

from pymq.store.config import BrokerRole, FlushDiskType, MessageStoreConfig
from pymq.store.message_store import DefaultMessageStore
from pymq.store.results import (
    GetMessageResult,
    GetMessageStatus,
    PutMessageResult,
    PutMessageStatus,
    QueryMessageResult,
)

__all__ = [
    "BrokerRole",
    "DefaultMessageStore",
    "FlushDiskType",
    "GetMessageResult",
    "GetMessageStatus",
    "MessageStoreConfig",
    "PutMessageResult",
    "PutMessageStatus",
    "QueryMessageResult",
]
