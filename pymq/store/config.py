"""``MessageStoreConfig``: RocketMQ 4.x's store keys and defaults, as data.

Field names are snake_case; each is known by its Java key (``storePathRootDir``,
``mappedFileSizeCommitLog``, ``flushDiskType``...).  Paths under the root are derived properties so
that changing ``storePathRootDir`` moves everything.  One difference from Java, on purpose: an empty
``storePathCommitLog`` (the default) means ``<storePathRootDir>/commitlog``; Java defaults it to
``~/store/commitlog`` whatever the root, which surprises everyone who moves the root.
"""

from __future__ import annotations

import enum
import os

import attrs

from pymq.common.checkpoint_layout import CHECKPOINT_FILE
from pymq.common.config import user_home


class FlushDiskType(enum.Enum):
    ASYNC_FLUSH = "ASYNC_FLUSH"
    SYNC_FLUSH = "SYNC_FLUSH"


class WriteAdvice(enum.Enum):
    """pymq only (``commitLogWriteAdvice``): how the commit log's pages ahead of its writer are
    faulted under ASYNC_FLUSH (SYNC_FLUSH's always a page at a time)."""

    AUTO = "auto"  # RANDOM where the store's device reads ahead LARGE_READAHEAD_KB or more
    RANDOM = "random"  # a page at a time (MADV_RANDOM), as SYNC_FLUSH's
    FOLLOW = "follow"  # the advice follows the writes (commitlog.ADVICE_SWITCH_BYTES)


class BrokerRole(enum.Enum):
    ASYNC_MASTER = "ASYNC_MASTER"
    SYNC_MASTER = "SYNC_MASTER"
    SLAVE = "SLAVE"


def _default_root() -> str:
    return os.path.join(user_home(), "store")


@attrs.define
class MessageStoreConfig:
    store_path_root_dir: str = attrs.field(factory=_default_root)
    store_path_commit_log: str = ""
    mapped_file_size_commit_log: int = 1024 * 1024 * 1024
    mapped_file_size_consume_queue: int = 300_000 * 20
    flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH
    flush_interval_commit_log: int = 500
    flush_commit_log_least_pages: int = 4
    flush_commit_log_thorough_interval: int = 1000 * 10
    flush_interval_consume_queue: int = 1000
    flush_consume_queue_least_pages: int = 2
    flush_consume_queue_thorough_interval: int = 1000 * 60
    sync_flush_timeout: int = 1000 * 5
    file_reserved_time: int = 72
    delete_when: str = "04"
    disk_max_used_space_ratio: int = 75
    clean_resource_interval: int = 10_000
    delete_commit_log_files_interval: int = 100
    delete_consume_queue_files_interval: int = 100
    destroy_maped_file_interval_forcibly: int = 1000 * 120
    redelete_hanged_file_interval: int = 1000 * 120
    clean_file_forcibly_enable: bool = True
    max_message_size: int = 1024 * 1024 * 4
    max_hash_slot_num: int = 5_000_000
    max_index_num: int = 5_000_000 * 4
    message_index_enable: bool = True
    message_index_safe: bool = False
    check_crc_on_recover: bool = attrs.field(default=True, metadata={"key": "checkCRCOnRecover"})
    broker_role: BrokerRole = BrokerRole.ASYNC_MASTER
    ha_listen_port: int = 10912
    ha_send_heartbeat_interval: int = 1000 * 5
    ha_housekeeping_interval: int = 1000 * 20
    # A master's frames carry at most this many bytes; a slave refuses a frame announcing more
    # (pymq.store.ha.framing), so a slave's value must be at least its master's.
    ha_transfer_batch_size: int = 1024 * 32
    ha_master_address: str | None = None
    ha_slave_fallbehind_max: int = 1024 * 1024 * 256
    # pymq only (pymq.store.ha.auth): on a master, the hosts that may connect to the HA port,
    # RocketMQ white-address patterns separated by ";" (empty: any host, as RocketMQ).
    ha_slave_allow_list: str = ""
    # pymq only (pymq.store.ha.auth): a secret shared by a master and its slaves.  On the
    # master, every slave must prove it (RocketMQ's slaves cannot); on a slave, what it proves,
    # and what its master must prove back before the slave takes any of its commit log.
    ha_secret: str = ""
    message_delay_level: str = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    flush_delay_offset_interval: int = 1000 * 10
    # Timer messages (RocketMQ 5's timer message store; pymq/store/timer, pymq/broker/timer.py):
    # a send with TIMER_DELIVER_MS, TIMER_DELAY_SEC or TIMER_DELAY_MS is kept until due.
    # timerWheelEnable false refuses such sends (SYSTEM_ERROR, as RocketMQ 5).
    timer_wheel_enable: bool = True
    # The wheel's slot length: a timer is delivered at most this late (never early).
    timer_precision_ms: int = attrs.field(default=1000, validator=attrs.validators.gt(0))
    # A timer further out than this many seconds is refused (MESSAGE_ILLEGAL).
    timer_max_delay_sec: int = attrs.field(default=3600 * 24 * 3, validator=attrs.validators.gt(0))
    # Slots ahead of the delivery point a timer is entered in at most; one further out is
    # entered in the window's last slot and re-entered when it comes round.  At most the
    # wheel's 7 days of slots less one.
    timer_roll_window_slot: int = attrs.field(
        default=3600 * 24 * 2, validator=attrs.validators.gt(0)
    )
    # How often (ms) the timer log, its checkpoint and the wheel are made durable.
    timer_flush_interval_ms: int = attrs.field(default=1000, validator=attrs.validators.gt(0))
    # The size of one timer-log file (rounded down to whole 48-byte entries).
    mapped_file_size_timer_log: int = attrs.field(
        default=100 * 1024 * 1024, validator=attrs.validators.ge(48)
    )
    # Stop entering timers from the timer topic / stop delivering due ones (operations).
    timer_stop_enqueue: bool = False
    timer_stop_dequeue: bool = False
    max_transfer_bytes_on_message_in_memory: int = 1024 * 256
    max_transfer_count_on_message_in_memory: int = 32
    max_transfer_bytes_on_message_in_disk: int = 1024 * 64
    max_transfer_count_on_message_in_disk: int = 8
    access_message_in_memory_max_ratio: int = 40
    max_msgs_num_batch: int = 64
    default_query_max_num: int = 32
    offset_check_in_slave: bool = False
    # pymq only: every this many ms, pages of the mapped files that the broker no longer needs
    # close at hand are dropped from its resident set (madvise DONTNEED; the page cache keeps
    # them).  0 turns it off.
    resident_trim_interval: int = 10_000
    # pymq only: how the commit log's pages ahead of its writer are faulted under ASYNC_FLUSH.
    # auto: a page at a time (MADV_RANDOM) where the store's block device reads ahead 1 MiB or
    # more (read_ahead_kb), where a write fault would read ahead (zero) large folios of the
    # blocks ahead, a stall each; elsewhere, as "follow".  random: always a page at a time.
    # follow: a page at a time only while batches written with pwrite outweigh records written
    # through the map (with a small readahead, reading ahead costs less than a fault per page).
    commit_log_write_advice: WriteAdvice = WriteAdvice.AUTO
    # pymq only: after a store file could not be created (a full disk), how long (ms) before
    # it is tried again: the allocator retries a commit-log file in its thread, the reput
    # service a consume-queue or index file.  Puts that need the file are refused meanwhile.
    mapped_file_create_retry_interval: int = 1000
    disk_fall_recorded: bool = True
    os_page_cache_busy_time_out_mills: int = 1000
    # pymq's reading of Java's warm-up: the commit log allocates the chunk after the one being
    # written and a worker thread faults its pages in (MADV_POPULATE_WRITE), so puts take no
    # page faults; those pages
    # are dirty, so each chunk goes to disk twice, first as zeros (Java's warm-up too writes
    # zeros over each new file).  Off by default, as in Java.
    warm_maped_file_enable: bool = False
    duplication_enable: bool = False
    # Java's keys for features pymq does not have (the transient store pool, the consume-queue
    # extension and its bit map, DLedger, LMQ and multi-dispatch, asynchronous schedule
    # delivery, the commit service of the transient pool): accepted with Java's defaults so
    # that config files load and GET_BROKER_CONFIG lists every key Java's does; no effect.
    flush_commit_log_timed: bool = True
    flush_least_pages_when_warm_maped_file: int = 4096
    commit_interval_commit_log: int = 200
    commit_commit_log_least_pages: int = 4
    commit_commit_log_thorough_interval: int = 200
    use_reentrant_lock_when_put_message: bool = True
    put_msg_index_hight_water: int = 600_000
    transient_store_pool_enable: bool = False
    transient_store_pool_size: int = 5
    fast_fail_if_no_buffer_in_store_pool: bool = False
    enable_consume_queue_ext: bool = False
    mapped_file_size_consume_queue_ext: int = 48 * 1024 * 1024
    bit_map_length_consume_queue_ext: int = 112
    enable_d_leger_commit_log: bool = attrs.field(
        default=False, metadata={"key": "enableDLegerCommitLog"}
    )
    # DLedger mode's keys (RocketMQ 4.9.4's MessageStoreConfig; null by default, so left out
    # of GET_BROKER_CONFIG until set).  Read and checked by pymq.dledger.config.from_store_config
    # (the group, the peers "n0-host:port;n1-host:port;...", this broker's id among them, the
    # data directory (default <storePathRootDir>/dledger-<selfId>/data) and the peer ids that
    # should lead); used only with enableDLegerCommitLog (pymq.store.dledger_commitlog).
    d_leger_group: str | None = attrs.field(default=None, metadata={"key": "dLegerGroup"})
    d_leger_peers: str | None = attrs.field(default=None, metadata={"key": "dLegerPeers"})
    d_leger_self_id: str | None = attrs.field(default=None, metadata={"key": "dLegerSelfId"})
    store_path_d_ledger_commit_log: str | None = attrs.field(
        default=None, metadata={"key": "storePathDLedgerCommitLog"}
    )
    preferred_leader_id: str | None = attrs.field(
        default=None, metadata={"key": "preferredLeaderId"}
    )
    debug_lock_enable: bool = False
    enable_schedule_async_deliver: bool = False
    schedule_async_deliver_max_pending_limit: int = 2000
    schedule_async_deliver_max_resend_num2_blocked: int = attrs.field(
        default=3, metadata={"key": "scheduleAsyncDeliverMaxResendNum2Blocked"}
    )
    enable_schedule_message_stats: bool = True
    enable_lmq: bool = False
    enable_multi_dispatch: bool = False
    max_lmq_consume_queue_num: int = 20_000

    @property
    def store_path_commitlog(self) -> str:
        return self.store_path_commit_log or os.path.join(self.store_path_root_dir, "commitlog")

    @property
    def consume_queue_dir(self) -> str:
        return os.path.join(self.store_path_root_dir, "consumequeue")

    @property
    def index_dir(self) -> str:
        return os.path.join(self.store_path_root_dir, "index")

    @property
    def checkpoint_path(self) -> str:
        return os.path.join(self.store_path_root_dir, CHECKPOINT_FILE)

    @property
    def timer_dir(self) -> str:
        """Where the timer store keeps ``timerlog/``, ``timerwheel`` and ``config/timercheck``."""
        return self.store_path_root_dir

    @property
    def abort_path(self) -> str:
        return os.path.join(self.store_path_root_dir, "abort")

    @property
    def lock_path(self) -> str:
        return os.path.join(self.store_path_root_dir, "lock")

    @property
    def config_dir(self) -> str:
        return os.path.join(self.store_path_root_dir, "config")

    @property
    def consume_queue_file_size(self) -> int:
        """Java rounds the consume-queue file size down to whole 20-byte entries."""
        return self.mapped_file_size_consume_queue // 20 * 20

    @property
    def disk_max_used_space_ratio_clamped(self) -> int:
        """Java clamps the ratio to 10..95 when it reads it."""
        return min(95, max(10, self.disk_max_used_space_ratio))

    def delay_levels_ms(self) -> list[int]:
        """Milliseconds of each delay level (level 1 first), parsed from ``messageDelayLevel``."""
        units = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
        return [int(item[:-1]) * units[item[-1]] for item in self.message_delay_level.split()]
