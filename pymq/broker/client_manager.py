"""Producer and consumer registries, and the rebalance lock table (RocketMQ's ProducerManager,
ConsumerManager and RebalanceLockManager), as plain state fed the trio clock.

A client is known by its connection (``channel``) and its ``clientId``.  Registrations expire 120 s
after the client's last heartbeat and go at once when its connection closes.  Consumer group
membership changes are reported to ``on_ids_changed`` so the broker can send
NOTIFY_CONSUMER_IDS_CHANGED to the group.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs

from pymq.common.consumer import (
    ConsumeFromWhere,
    ConsumeType,
    MessageModel,
    MessageQueue,
    SubscriptionData,
)

log = logging.getLogger(__name__)

# ClientHousekeepingService: a client silent this long is dropped.
CHANNEL_EXPIRED_SECONDS = 120.0
# RebalanceLockManager: rocketmq.broker.rebalance.lockMaxLiveTime default.
REBALANCE_LOCK_MAX_LIVE_SECONDS = 60.0


@attrs.define(eq=False)
class ClientChannelInfo:
    channel: object
    client_id: str
    language: str
    version: int
    last_update: float
    remote_address: str = ""


class ProducerManager:
    def __init__(self) -> None:
        self.groups: dict[str, dict[object, ClientChannelInfo]] = {}
        self._next_channel = 0
        # clientId -> the connection it last registered a producer group on (Java's
        # clientChannelTable): where a reply to the client's request is pushed.  An entry goes
        # when no group is registered on that connection under that id any more, so the table
        # is no larger than the registrations.
        self.clients: dict[str, object] = {}

    def find_channel(self, client_id: str) -> object | None:
        """The connection of the producer client ``client_id`` (ProducerManager.findChannel),
        None when no live connection has registered under that id."""
        channel = self.clients.get(client_id)
        if channel is None or getattr(channel, "closed", False):
            return None
        return channel

    def available_channel(self, group: str) -> object | None:
        """A live connection of a producer of ``group`` (ProducerManager.getAvailableChannel):
        taken in turn among the group's producers, skipping closed ones; None when none is
        left.  The broker asks it the state of a transaction."""
        channels = list(self.groups.get(group, {}))
        if not channels:
            return None
        self._next_channel = (self._next_channel + 1) % (1 << 30)
        for i in range(len(channels)):
            channel = channels[(self._next_channel + i) % len(channels)]
            if not getattr(channel, "closed", False):
                return channel
        return None

    def register(self, group: str, info: ClientChannelInfo) -> None:
        channels = self.groups.setdefault(group, {})
        existing = channels.get(info.channel)
        if existing is None:
            channels[info.channel] = info
            self.clients[info.client_id] = info.channel
            log.info("new producer connected, group: %s channel: %s", group, info.client_id)
        else:
            existing.last_update = info.last_update

    def unregister(self, group: str, channel: object) -> None:
        channels = self.groups.get(group)
        if not channels:
            return
        info = channels.pop(channel, None)
        if info is not None:
            log.info("unregister a producer %s from groupChannelTable", group)
            if not channels:
                del self.groups[group]
            self._forget(info.client_id, channel)

    def _forget(self, client_id: str, channel: object) -> None:
        """Drop ``client_id``'s entry of :attr:`clients` for ``channel`` unless another group
        of that client is still registered on it."""
        if self.clients.get(client_id) is not channel:
            return
        for channels in self.groups.values():
            other = channels.get(channel)
            if other is not None and other.client_id == client_id:
                return
        del self.clients[client_id]

    def channel_closed(self, channel: object) -> None:
        for group in list(self.groups):
            self.unregister(group, channel)

    def scan_expired(self, now: float) -> list[object]:
        expired: list[object] = []
        for group in list(self.groups):
            for channel, info in list(self.groups[group].items()):
                if now - info.last_update > CHANNEL_EXPIRED_SECONDS:
                    log.warning(
                        "producer channel expired, group %s client %s", group, info.client_id
                    )
                    self.unregister(group, channel)
                    expired.append(channel)
        return expired


@attrs.define
class ConsumerGroupInfo:
    group_name: str
    consume_type: ConsumeType
    message_model: MessageModel
    consume_from_where: ConsumeFromWhere
    channels: dict[object, ClientChannelInfo] = attrs.Factory(dict)
    subscriptions: dict[str, SubscriptionData] = attrs.Factory(dict)
    last_update: float = 0.0

    def client_ids(self) -> list[str]:
        return [info.client_id for info in self.channels.values()]

    def find_subscription(self, topic: str) -> SubscriptionData | None:
        return self.subscriptions.get(topic)


class ConsumerManager:
    def __init__(
        self,
        on_ids_changed: Callable[[str, list[object]], None] | None = None,
        on_group_removed: Callable[[str], None] | None = None,
    ) -> None:
        self.groups: dict[str, ConsumerGroupInfo] = {}
        self.on_ids_changed = on_ids_changed or (lambda group, channels: None)
        # Java's UNREGISTER event: the group's last consumer left (its filters die).
        self.on_group_removed = on_group_removed or (lambda group: None)

    def get(self, group: str) -> ConsumerGroupInfo | None:
        return self.groups.get(group)

    def register(
        self,
        group: str,
        info: ClientChannelInfo,
        consume_type: ConsumeType,
        message_model: MessageModel,
        consume_from_where: ConsumeFromWhere,
        subscriptions: list[SubscriptionData],
        notify: bool,
    ) -> bool:
        """Record a heartbeat; returns True when the group's members changed."""
        group_info = self.groups.get(group)
        if group_info is None:
            group_info = ConsumerGroupInfo(group, consume_type, message_model, consume_from_where)
            self.groups[group] = group_info
        group_info.consume_type = consume_type
        group_info.message_model = message_model
        group_info.consume_from_where = consume_from_where
        group_info.last_update = info.last_update
        existing = group_info.channels.get(info.channel)
        changed = False
        if existing is None or existing.client_id != info.client_id:
            group_info.channels[info.channel] = info
            log.info("new consumer connected, group: %s %s", group, info.client_id)
            changed = True
        else:
            existing.last_update = info.last_update
        new_subs = {s.topic: s for s in subscriptions}
        for topic, sub in new_subs.items():
            old = group_info.subscriptions.get(topic)
            if old is None or old.sub_version < sub.sub_version or old.sub_string != sub.sub_string:
                group_info.subscriptions[topic] = sub
        for topic in list(group_info.subscriptions):
            if topic not in new_subs and subscriptions:
                # Java drops a topic the client no longer subscribes to.
                del group_info.subscriptions[topic]
        if changed and notify:
            self.on_ids_changed(group, list(group_info.channels))
        return changed

    def unregister(self, group: str, channel: object, notify: bool) -> None:
        group_info = self.groups.get(group)
        if group_info is None or group_info.channels.pop(channel, None) is None:
            return
        log.info("unregister consumer ok, group %s", group)
        if not group_info.channels:
            del self.groups[group]
            self.on_group_removed(group)
        elif notify:
            self.on_ids_changed(group, list(group_info.channels))

    def channel_closed(self, channel: object, notify: bool = True) -> None:
        for group in list(self.groups):
            self.unregister(group, channel, notify)

    def scan_expired(self, now: float) -> list[object]:
        expired: list[object] = []
        for group in list(self.groups):
            for channel, info in list(self.groups[group].channels.items()):
                if now - info.last_update > CHANNEL_EXPIRED_SECONDS:
                    log.warning(
                        "consumer channel expired, group %s client %s", group, info.client_id
                    )
                    self.unregister(group, channel, notify=True)
                    expired.append(channel)
        return expired

    def groups_of_topic(self, topic: str) -> list[str]:
        return [g for g, info in self.groups.items() if topic in info.subscriptions]


@attrs.define
class _Lock:
    client_id: str
    last_update: float


class RebalanceLockManager:
    """Which client of a group owns each queue, for orderly consumers (LOCK_BATCH_MQ)."""

    def __init__(self, max_live: float = REBALANCE_LOCK_MAX_LIVE_SECONDS) -> None:
        self.max_live = max_live
        self.table: dict[str, dict[MessageQueue, _Lock]] = {}

    def try_lock_batch(
        self, group: str, mqs: list[MessageQueue], client_id: str, now: float
    ) -> list[MessageQueue]:
        locks = self.table.setdefault(group, {})
        locked: list[MessageQueue] = []
        for mq in mqs:
            lock = locks.get(mq)
            if (
                lock is None
                or now - lock.last_update > self.max_live
                or lock.client_id == client_id
            ):
                if lock is not None and lock.client_id != client_id:
                    log.warning(
                        "tryLockBatch: remote lock expired, %s %s -> %s",
                        mq,
                        lock.client_id,
                        client_id,
                    )
                locks[mq] = _Lock(client_id, now)
                locked.append(mq)
        return locked

    def unlock_batch(self, group: str, mqs: list[MessageQueue], client_id: str) -> None:
        locks = self.table.get(group, {})
        for mq in mqs:
            lock = locks.get(mq)
            if lock is not None and lock.client_id == client_id:
                del locks[mq]


# How long after a 4.x client's pull of a queue (after the longest it may be held, when it is
# a long-polling one) the queue still counts as that client's: it pulls again at once, unless
# its consumption falls behind (flow control) for longer.
PULLED_QUEUE_SECONDS = 30.0
# The longest hold of a pull counted (a pull's suspendTimeoutMillis beyond it counts as this).
MAX_PULL_HOLD_SECONDS = 60.0
# The (group, topic, queue) pulls recorded at most; past it stale ones are dropped first, and
# when none is stale a new one is not recorded (its queue may then be received by POP too:
# duplicates, never a loss).
MAX_PULLED_QUEUES = 100_000


class QueuePullers:
    """Which queues of a group its 4.x clients pull (PULL_MESSAGE), on which connection, and
    until when they count as pulled: the 5.x (POP) consumers of the same group leave such a
    queue to them while that connection is still a member of the group (pymq.proxy.pop)."""

    def __init__(self, grace: float = PULLED_QUEUE_SECONDS) -> None:
        self.grace = grace
        self.until: dict[tuple[str, str, int], tuple[float, object]] = {}

    def pulled(
        self,
        group: str,
        topic: str,
        queue_id: int,
        now: float,
        hold: float = 0.0,
        channel: object = None,
    ) -> None:
        """A pull of the queue at ``now`` on ``channel`` that may be held ``hold`` seconds."""
        key = (group, topic, queue_id)
        until = now + min(max(hold, 0.0), MAX_PULL_HOLD_SECONDS) + self.grace
        kept = self.until.get(key)
        if kept is None and len(self.until) >= MAX_PULLED_QUEUES:
            self.until = {k: v for k, v in self.until.items() if v[0] > now}
            if len(self.until) >= MAX_PULLED_QUEUES:
                return
        if kept is not None and kept[1] is channel:
            until = max(until, kept[0])
        self.until[key] = (until, channel)

    def puller(self, group: str, topic: str, queue_id: int, now: float) -> object | None:
        """The connection a 4.x client of ``group`` pulls the queue on (see :meth:`pulled`),
        None when none does now."""
        kept = self.until.get((group, topic, queue_id))
        return kept[1] if kept is not None and kept[0] > now else None
