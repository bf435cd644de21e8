"""BrokerFastFailure, protectBroker and printWaterMark, as RocketMQ 4.9.4 has them, for pymq.

Java queues every request in a thread pool's queue, and a task running every 10 ms answers
``SYSTEM_BUSY`` to the sends at the head of the send queue that waited longer than
``waitTimeMillsInSendQueue`` (``[TIMEOUT_CLEAN_QUEUE]``), or to every queued send while a put has
held the commit log longer than ``osPageCacheBusyTimeOutMills`` (``[PCBUSY_CLEAN_QUEUE]``).

pymq has no executor queue: a connection's reader decodes what one ``receive_some`` returned and
serves it, most sends inline, the rest in a task each.  Its "time in the queue" is therefore:

* for a request served in the reader: from the moment its bytes were received (one clock read
  per receive) to the moment the reader starts the run of up to ``SERVE_BATCH`` commands holding
  it (one clock read per run after the first, which follows the receive at once);
* for a request served in a task: from its receive to the start of its task.

A request whose wait passed its queue's limit is answered ``SYSTEM_BUSY`` without being served:
the check is made per run of commands, and only when the run waited too long is each request
looked at.  The commit log's lock is the store's put, which runs on the loop: a put that held
it longer than ``osPageCacheBusyTimeOutMills`` marks the time it ended, and the sends received
before that mark (they waited behind it) are refused with ``[PCBUSY_CLEAN_QUEUE]``.

Requests sitting in the kernel's socket buffers are not seen by the broker (they have not been
received); they wait at most the time those buffers take to drain.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode

if TYPE_CHECKING:
    from pymq.broker.config import BrokerConfig
    from pymq.broker.subscription_group_manager import SubscriptionGroupManager
    from pymq.remoting.channel import Channel
    from pymq.store.message_store import DefaultMessageStore

log = logging.getLogger(__name__)
# Java writes these to their own files (LoggerName.WATER_MARK_LOGGER_NAME, PROTECTION_LOGGER_NAME).
water_mark_log = logging.getLogger("pymq.broker.watermark")
protection_log = logging.getLogger("pymq.broker.protection")

TIMEOUT_CLEAN_QUEUE = (
    "[TIMEOUT_CLEAN_QUEUE]broker busy, start flow control for a while, "
    "period in queue: {waited}ms, size of queue: {size}"
)
PCBUSY_CLEAN_QUEUE = (
    "[PCBUSY_CLEAN_QUEUE]broker busy, start flow control for a while, "
    "period in queue: {waited}ms, size of queue: {size}"
)

# BrokerController: protectBroker every 3 minutes, printWaterMark every second (after 10 s).
PROTECT_BROKER_PERIOD = 180.0
WATER_MARK_PERIOD = 1.0
WATER_MARK_INITIAL_DELAY = 10.0

# Java's queues, by the request codes its BrokerController puts on each executor.
SEND_CODES = frozenset(
    {
        RequestCode.SEND_MESSAGE,
        RequestCode.SEND_MESSAGE_V2,
        RequestCode.SEND_BATCH_MESSAGE,
        RequestCode.CONSUMER_SEND_MSG_BACK,
    }
)
PULL_CODES = frozenset({RequestCode.PULL_MESSAGE})
HEARTBEAT_CODES = frozenset({RequestCode.HEART_BEAT})
TRANSACTION_CODES = frozenset({RequestCode.END_TRANSACTION})

_SEND, _PULL, _HEARTBEAT, _TRANSACTION = range(4)
_QUEUE_OF: dict[int, int] = {
    **{int(c): _SEND for c in SEND_CODES},
    **{int(c): _PULL for c in PULL_CODES},
    **{int(c): _HEARTBEAT for c in HEARTBEAT_CODES},
    **{int(c): _TRANSACTION for c in TRANSACTION_CODES},
}


class BrokerFastFailure:
    """The admission check a :class:`~pymq.remoting.channel.Channel` calls before serving.

    ``min_wait`` (seconds) is the smallest queue limit, ``inf`` when fast failure is off: the
    channel calls :meth:`shed` only for runs that waited longer than it, or that were received
    before ``busy_mark`` (the end of a put that held the commit log too long).
    ``clock`` is the clock the channel stamps receives with and the store times puts with.
    """

    def __init__(
        self,
        config: BrokerConfig,
        store: DefaultMessageStore | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.refused = [0, 0, 0, 0]  # SYSTEM_BUSY answers per queue (send, pull, ...)
        self.pc_busy_refused = 0
        if store is not None:
            store.lock_clock = clock

    # -- the check ----------------------------------------------------------------------------

    def limits(self) -> tuple[float, float, float, float]:
        """Each queue's limit in seconds (send, pull, heartbeat, transaction), read from the
        config every time, so UPDATE_BROKER_CONFIG takes effect at once; inf when off."""
        c = self.config
        if not c.broker_fast_failure_enable:
            return (math.inf,) * 4
        return (
            max(0, c.wait_time_mills_in_send_queue) / 1000,
            max(0, c.wait_time_mills_in_pull_queue) / 1000,
            max(0, c.wait_time_mills_in_heartbeat_queue) / 1000,
            max(0, c.wait_time_mills_in_transaction_queue) / 1000,
        )

    @property
    def min_wait(self) -> float:
        # min(self.limits()) without building the tuple: read once per run of requests.
        c = self.config
        if not c.broker_fast_failure_enable:
            return math.inf
        least = min(
            c.wait_time_mills_in_send_queue,
            c.wait_time_mills_in_pull_queue,
            c.wait_time_mills_in_heartbeat_queue,
            c.wait_time_mills_in_transaction_queue,
        )
        return max(0, least) / 1000

    @property
    def busy_mark(self) -> float:
        """Requests received at or before this time waited behind a put that held the commit
        log longer than osPageCacheBusyTimeOutMills (-inf: none did, or fast failure is off)."""
        if self.store is None or not self.config.broker_fast_failure_enable:
            return -math.inf
        return self.store.os_page_cache_busy_mark

    def shed(
        self,
        channel: Channel,
        request: RemotingCommand,
        received: float,
        waited: float,
        queued: int,
    ) -> RemotingCommand | None:
        """SYSTEM_BUSY for ``request`` (received at ``received``, started ``waited`` s later)
        if it waited past its queue's limit or behind a busy commit log, else None (serve it).
        ``queued``: requests of this connection received and not yet started, this one
        included."""
        remark = self.shed_remark(request.code, received, waited, queued)
        if remark is None:
            return None
        self.note_shed(request.code, 1, remark)
        return request.response(ResponseCode.SYSTEM_BUSY, remark)

    def note_shed(self, code: int, count: int, remark: str) -> None:
        """Count ``count`` requests of ``code`` refused with ``remark`` (from
        :meth:`shed_remark`)."""
        queue = _QUEUE_OF.get(code)
        if queue is not None:
            self.refused[queue] += count
            if remark.startswith("[PCBUSY"):
                self.pc_busy_refused += count

    def shed_remark(self, code: int, received: float, waited: float, queued: int) -> str | None:
        """The SYSTEM_BUSY remark for a request of ``code`` that waited ``waited`` s, or None
        to serve it (see :meth:`shed`); the caller counts the refusals with
        :meth:`note_shed`."""
        queue = _QUEUE_OF.get(code)
        config = self.config
        if queue is None or not config.broker_fast_failure_enable:
            return None
        store = self.store
        if queue == _SEND:
            if store is not None and received <= store.os_page_cache_busy_mark:
                return PCBUSY_CLEAN_QUEUE.format(waited=int(waited * 1000), size=queued)
            # Read here rather than through limits(): this runs for every request refused.
            if waited * 1000 < config.wait_time_mills_in_send_queue:
                return None
        elif waited < self.limits()[queue]:
            return None
        return TIMEOUT_CLEAN_QUEUE.format(waited=int(waited * 1000), size=queued)

    # -- printWaterMark -----------------------------------------------------------------------

    def water_mark(self, channels: Iterable[Channel]) -> tuple[int, int, int, int]:
        """(send queue size, its slowest wait in ms, pull queue size, its slowest wait in ms):
        the requests received and not yet started, over ``channels``."""
        now = self.clock()
        send_size = pull_size = 0
        send_slow = pull_slow = 0.0
        for channel in channels:
            backlog = channel.backlog
            if backlog:
                send_size += backlog
                send_slow = max(send_slow, now - channel.backlog_since)
            for code, received in channel.waiting_tasks.values():
                if _QUEUE_OF.get(code) == _PULL:
                    pull_size += 1
                    pull_slow = max(pull_slow, now - received)
                else:
                    send_size += 1
                    send_slow = max(send_slow, now - received)
        return send_size, int(send_slow * 1000), pull_size, int(pull_slow * 1000)

    def print_water_mark(self, channels: Iterable[Channel]) -> None:
        send, send_slow, pull, pull_slow = self.water_mark(channels)
        water_mark_log.info("[WATERMARK] Send Queue Size: %d SlowTimeMills: %d", send, send_slow)
        water_mark_log.info("[WATERMARK] Pull Queue Size: %d SlowTimeMills: %d", pull, pull_slow)


class ConsumerFallBehind:
    """protectBroker: the bytes each group's last pull left unread in the commit log (Java's
    GROUP_GET_FALL_SIZE moment stats, keyed queueId@topic@group), and the periodic check that
    disables consumption for a group past ``consumerFallbehindThreshold``."""

    def __init__(self) -> None:
        self.table: dict[tuple[int, str, str], int] = {}

    def record(self, group: str, topic: str, queue_id: int, fall_behind: int) -> None:
        self.table[(queue_id, topic, group)] = fall_behind

    def slow_groups(self, threshold: int) -> dict[str, int]:
        """Groups whose fall-behind passed ``threshold`` in some queue, with the largest."""
        slow: dict[str, int] = {}
        for (_, _, group), size in self.table.items():
            if size > threshold and size > slow.get(group, -1):
                slow[group] = size
        return slow


async def protect_broker(
    config: BrokerConfig, fall_behind: ConsumerFallBehind, groups: SubscriptionGroupManager
) -> list[str]:
    """BrokerController.protectBroker: with disableConsumeIfConsumerReadSlowly, disable
    consumption for every group whose last pull left more than consumerFallbehindThreshold bytes
    behind; its pulls are then answered NO_PERMISSION "subscription group no permission, <group>"
    until it is enabled again (updateSubGroup with consumeEnable=true).  Returns those groups."""
    if not config.disable_consume_if_consumer_read_slowly:
        return []
    disabled = []
    for group, size in fall_behind.slow_groups(config.consumer_fallbehind_threshold).items():
        protection_log.info(
            "[PROTECT_BROKER] the consumer[%s] consume slowly, %d bytes, disable it", group, size
        )
        if await groups.disable_consume(group):
            disabled.append(group)
    return disabled
