"""DLedgerConfig: DLedger 0.2.6's settings with their defaults, and how RocketMQ 4.9.4 fills
them from the broker's keys.

RocketMQ 4.9.4's ``DLedgerCommitLog`` constructor builds a ``new DLedgerConfig()`` and sets only
these from the broker's ``MessageStoreConfig`` (:func:`from_store_config` does the same):

=============================  ===========================================================
DLedgerConfig                  from the broker's key
=============================  ===========================================================
selfId / group / peers         ``dLegerSelfId`` / ``dLegerGroup`` / ``dLegerPeers``
storeBaseDir                   ``storePathRootDir``
dataStorePath                  ``storePathDLedgerCommitLog`` (null: ``<base>/dledger-<id>/data``)
mappedFileSizeForEntryData     ``mappedFileSizeCommitLog`` (1 GiB)
deleteWhen                     ``deleteWhen``
fileReservedHours              ``fileReservedTime`` + 1
preferredLeaderIds             ``preferredLeaderId`` (ids separated by ``;``)
enableBatchPush                ``enableBatchPush`` (listed as ``isEnableBatchPush``)
enableDiskForceClean           ``cleanFileForciblyEnable``
diskSpaceRatioToCheckExpired   ``diskMaxUsedSpaceRatio`` / 100
=============================  ===========================================================

``enableBatchPush``/``maxBatchPushSize`` only choose how a Java leader pushes; a pymq leader
always pushes the entries ready at a push as one batch (0.2.6's ``batchEntry``, which every
0.2.6 follower takes whatever its own setting), of up to 256 KiB or ``maxBatchPushSize`` when
larger (pymq.dledger.raft.PUSH_BATCH_BYTES).

Everything else (the heartbeat and vote timings, the pending-request limit, the push timeouts,
the index file size) is DLedgerConfig's default in a Java broker: 4.9.4 reads none of them from
the broker's properties, so pymq does not either (a group must agree on them).
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

import attrs

from pymq.common.config import ConfigError

if TYPE_CHECKING:  # the store imports this package once DLedger mode is wired, not the reverse
    from pymq.store.config import MessageStoreConfig

INDEX_UNIT_SIZE = 32
"""DLedgerMmapFileStore.INDEX_UNIT_SIZE: one index entry's bytes."""

MAX_PEERS = 64
"""pymq's bound on the members of one group (a Raft group of 3 or 5 is usual)."""

# A peer id: DLedger splits "id-host:port" at the first "-", so the id cannot hold one; pymq
# also keeps ";", ":" and spaces out of it.  RocketMQ reads a broker id from it (below).
_PEER_ID = re.compile(r"[A-Za-z0-9_.]{1,64}")
# RocketMQ 4.9.4: a follower's brokerId is Integer.parseInt(selfId.substring(1)) + 1.
_ROCKETMQ_SELF_ID = re.compile(r".([0-9]{1,9})")


@attrs.frozen
class Peer:
    id: str
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def parse_peers(text: str) -> dict[str, Peer]:
    """``dLegerPeers`` (``n0-host:port;n1-host:port;...``) as id -> Peer, in the order given.

    ConfigError naming the entry for: an empty string or entry (a ``;`` at the very end is
    allowed, as Java's split drops it), an entry without ``-``, an id with other characters
    than letters, digits, ``_`` and ``.``, an address that is not ``host:port`` with a port in
    1..65535, a repeated id (Java's map would keep the last silently), or more than
    :data:`MAX_PEERS` entries."""
    if not text or not text.strip():
        raise ConfigError("dLegerPeers is empty: expected n0-host:port;n1-host:port;...")
    entries = text.split(";")
    if entries[-1] == "":
        entries.pop()
    if len(entries) > MAX_PEERS:
        raise ConfigError(f"dLegerPeers names {len(entries)} peers; at most {MAX_PEERS}")
    peers: dict[str, Peer] = {}
    for entry in entries:
        peer = _parse_peer(entry)
        if peer.id in peers:
            raise ConfigError(f"dLegerPeers names the id {peer.id!r} twice")
        peers[peer.id] = peer
    return peers


def _parse_peer(entry: str) -> Peer:
    where = f"dLegerPeers entry {entry!r}"
    peer_id, dash, address = entry.partition("-")
    if not dash:
        raise ConfigError(f"{where}: expected id-host:port (e.g. n0-127.0.0.1:40911)")
    if not _PEER_ID.fullmatch(peer_id):
        raise ConfigError(f"{where}: the id must be 1..64 letters, digits, '_' or '.'")
    host, colon, port_text = address.rpartition(":")
    if not colon or not host or any(c.isspace() for c in host):
        raise ConfigError(f"{where}: expected id-host:port (e.g. n0-127.0.0.1:40911)")
    if not port_text.isdigit() or not 0 < int(port_text) <= 65535:
        raise ConfigError(f"{where}: the port must be a number in 1..65535")
    return Peer(peer_id, host, int(port_text))


def rocketmq_broker_id(self_id: str) -> int:
    """The brokerId RocketMQ 4.9.4 gives a follower (``DLedgerCommitLog.id``): the number after
    the id's first character, plus one (``n0`` -> 1, ``n2`` -> 3); the leader registers as 0."""
    match = _ROCKETMQ_SELF_ID.fullmatch(self_id)
    if match is None:
        raise ConfigError(
            f"dLegerSelfId={self_id!r}: RocketMQ reads a broker id from the digits after the "
            "first character, e.g. n0, n1, n2"
        )
    return int(match.group(1)) + 1


@attrs.frozen
class DLedgerConfig:
    """DLedger 0.2.6's ``DLedgerConfig`` (field names are Java's, snake_case; defaults are
    Java's).  Build it with :func:`from_store_config`, which checks it; tests build it directly
    with shorter timings."""

    group: str = "default"
    self_id: str = "n0"
    peers: str = "n0-localhost:20911"
    store_base_dir: str = os.path.join(os.sep, "tmp", "dledgerstore")
    data_store_path: str | None = None
    peer_push_throttle_point: int = 300 * 1024 * 1024
    peer_push_quota: int = 20 * 1024 * 1024
    max_pending_requests_num: int = 10000
    max_wait_ack_time_ms: int = 2500
    max_push_time_out_ms: int = 1000
    enable_leader_elector: bool = True
    heart_beat_time_interval_ms: int = 2000
    max_heart_beat_leak: int = 3
    min_vote_interval_ms: int = 300
    max_vote_interval_ms: int = 1000
    file_reserved_hours: int = 72
    delete_when: str = "04"
    disk_space_ratio_to_check_expired: float = 0.70
    disk_space_ratio_to_force_clean: float = 0.85
    enable_disk_force_clean: bool = True
    flush_file_interval: int = 10
    check_point_interval: int = 3000
    mapped_file_size_for_entry_data: int = 1024 * 1024 * 1024
    mapped_file_size_for_entry_index: int = INDEX_UNIT_SIZE * 5 * 1024 * 1024
    enable_push_to_follower: bool = True
    preferred_leader_ids: str | None = None
    max_leadership_transfer_wait_index: int = 1000
    min_take_leadership_vote_interval_ms: int = 30
    max_take_leadership_vote_interval_ms: int = 100
    enable_batch_push: bool = False
    max_batch_push_size: int = 4 * 1024
    leadership_transfer_wait_timeout: int = 1000

    @property
    def default_path(self) -> str:
        """``<storeBaseDir>/dledger-<selfId>``: where ``checkpoint``, ``currterm`` and the
        ``index`` directory live."""
        return os.path.join(self.store_base_dir, f"dledger-{self.self_id}")

    @property
    def data_path(self) -> str:
        return self.data_store_path or os.path.join(self.default_path, "data")

    @property
    def index_path(self) -> str:
        return os.path.join(self.default_path, "index")

    def peer_map(self) -> dict[str, Peer]:
        return parse_peers(self.peers)

    def preferred_leaders(self) -> list[str]:
        if not self.preferred_leader_ids:
            return []
        return [i for i in self.preferred_leader_ids.split(";") if i]

    def check(self) -> None:
        """ConfigError naming the first problem: the peers string (:func:`parse_peers`), the
        self id not among the peers, a preferred leader not among them, an empty group, vote
        intervals not ``0 < min < max``, heartbeat timings not positive, a data file size not
        above an entry header, or an index file size not a positive multiple of
        :data:`INDEX_UNIT_SIZE`."""
        if not self.group:
            raise ConfigError("dLegerGroup is empty: every member of a group names it")
        peers = parse_peers(self.peers)
        if self.self_id not in peers:
            raise ConfigError(
                f"dLegerSelfId={self.self_id!r} is not among dLegerPeers ({', '.join(peers)})"
            )
        for leader in self.preferred_leaders():
            if leader not in peers:
                raise ConfigError(
                    f"preferredLeaderId {leader!r} is not among dLegerPeers ({', '.join(peers)})"
                )
        if not 0 < self.min_vote_interval_ms < self.max_vote_interval_ms:
            raise ConfigError("vote intervals: expected 0 < minVoteIntervalMs < maxVoteIntervalMs")
        if (
            not 0
            < self.min_take_leadership_vote_interval_ms
            < (self.max_take_leadership_vote_interval_ms)
        ):
            raise ConfigError(
                "take-leadership vote intervals: expected 0 < min < max"
                " (min/maxTakeLeadershipVoteIntervalMs)"
            )
        if self.heart_beat_time_interval_ms <= 0 or self.max_heart_beat_leak <= 0:
            raise ConfigError("heartBeatTimeIntervalMs and maxHeartBeatLeak must be positive")
        if self.mapped_file_size_for_entry_data <= 64:
            raise ConfigError("mappedFileSizeForEntryData must exceed an entry header (48 bytes)")
        index_size = self.mapped_file_size_for_entry_index
        if index_size <= 0 or index_size % INDEX_UNIT_SIZE:
            raise ConfigError(
                f"mappedFileSizeForEntryIndex must be a positive multiple of {INDEX_UNIT_SIZE}"
            )


def from_store_config(
    store: MessageStoreConfig, *, enable_batch_push: bool = False
) -> DLedgerConfig:
    """The DLedgerConfig RocketMQ 4.9.4's DLedgerCommitLog builds from the broker's store keys
    (see the module's table), checked: ConfigError naming the key for a missing
    ``dLegerGroup``/``dLegerPeers``/``dLegerSelfId``, a malformed peers string, a self id not
    among the peers or one RocketMQ cannot read a broker id from (:func:`rocketmq_broker_id`).
    ``enable_batch_push``: the broker's ``isEnableBatchPush`` (a BrokerConfig field in pymq)."""
    for key, value in (
        ("dLegerGroup", store.d_leger_group),
        ("dLegerPeers", store.d_leger_peers),
        ("dLegerSelfId", store.d_leger_self_id),
    ):
        if not value:
            raise ConfigError(f"{key} must be set when enableDLegerCommitLog=true")
    assert store.d_leger_group and store.d_leger_peers and store.d_leger_self_id
    rocketmq_broker_id(store.d_leger_self_id)
    config = DLedgerConfig(
        group=store.d_leger_group,
        self_id=store.d_leger_self_id,
        peers=store.d_leger_peers,
        store_base_dir=store.store_path_root_dir,
        data_store_path=store.store_path_d_ledger_commit_log or None,
        mapped_file_size_for_entry_data=store.mapped_file_size_commit_log,
        delete_when=store.delete_when,
        file_reserved_hours=store.file_reserved_time + 1,
        preferred_leader_ids=store.preferred_leader_id or None,
        enable_batch_push=enable_batch_push,
        enable_disk_force_clean=store.clean_file_forcibly_enable,
        disk_space_ratio_to_check_expired=store.disk_max_used_space_ratio / 100,
    )
    config.check()
    return config
