"""Which broker a pull suggests next, and the store's "in memory" line (issue #37, item 3).

Java 4.9.4's PullMessageProcessor: with slaveReadEnable=false every answer suggests the master
(id 0), on a master and on a slave, whatever the store says; with slaveReadEnable=true it
suggests the group's whichBrokerWhenConsumeSlowly when the store says the consumer reads
beyond accessMessageInMemoryMaxRatio % of memory behind the commit log's end, else the group's
brokerId.  A slave answers with the store's code (the PULL_RETRY_IMMEDIATELY Java sets for a
slave without slaveReadEnable is overwritten by the store's code before the answer is sent).
"""

from __future__ import annotations

import pytest

import pymq.store.get_message as get_message_module
from pymq.broker.context import BrokerContext
from pymq.broker.processors.pull import PullProcessor
from pymq.broker.subscription_group_manager import SubscriptionGroupConfig
from pymq.common.record import decode_records
from pymq.remoting.codes import ResponseCode
from pymq.store.config import BrokerRole
from tests.unit import test_processors as processors
from tests.unit.test_processors import GROUP, TOPIC, FakeChannel, pull_request, put

ctx = processors.ctx  # the same broker context fixture: a real store in a temp dir

BROKER_ID = 3  # the group's brokerId and whichBrokerWhenConsumeSlowly, both unlike the defaults
SLOWLY_ID = 5

# role, slaveReadEnable, store suggests a slave -> suggestWhichBrokerId
SUGGESTIONS = [
    (BrokerRole.ASYNC_MASTER, False, False, 0),
    (BrokerRole.ASYNC_MASTER, False, True, 0),
    (BrokerRole.ASYNC_MASTER, True, False, BROKER_ID),
    (BrokerRole.ASYNC_MASTER, True, True, SLOWLY_ID),
    (BrokerRole.SYNC_MASTER, False, True, 0),
    (BrokerRole.SYNC_MASTER, True, True, SLOWLY_ID),
    (BrokerRole.SLAVE, False, False, 0),
    (BrokerRole.SLAVE, False, True, 0),
    (BrokerRole.SLAVE, True, False, BROKER_ID),
    (BrokerRole.SLAVE, True, True, SLOWLY_ID),
]


@pytest.mark.parametrize(("role", "slave_read", "from_slave", "expected"), SUGGESTIONS)
async def test_suggested_broker_by_role_slave_read_and_lag(
    ctx: BrokerContext, role: BrokerRole, slave_read: bool, from_slave: bool, expected: int
) -> None:
    await put(ctx, b"a", b"b", b"c")
    await ctx.subscription_group_manager.update(
        SubscriptionGroupConfig(
            GROUP, broker_id=BROKER_ID, which_broker_when_consume_slowly=SLOWLY_ID
        )
    )
    # 0 %: every byte behind the end is "in disk", so a pull that stops short of the end lags;
    # 100 %: the whole machine's memory, far more than these three records.
    ctx.store.config.access_message_in_memory_max_ratio = 0 if from_slave else 100
    ctx.store.config.broker_role = role  # the messages were written as a master
    ctx.broker_config.slave_read_enable = slave_read
    assert ctx.store.get_message(GROUP, TOPIC, 0, 0, 32).suggest_pulling_from_slave is from_slave

    response = await PullProcessor(ctx).pull_message(FakeChannel(), pull_request(0))

    # A slave serves what it has whether or not slaveReadEnable is on; only the suggestion moves.
    assert response.code == ResponseCode.SUCCESS
    assert [m.body for m in decode_records(response.body)] == [b"a", b"b", b"c"]
    assert response.ext_fields["suggestWhichBrokerId"] == str(expected)


@pytest.mark.parametrize("role", [BrokerRole.ASYNC_MASTER, BrokerRole.SLAVE])
async def test_a_slave_without_slave_read_answers_the_store_code(
    ctx: BrokerContext, role: BrokerRole
) -> None:
    """Nothing new, past the end: the store's code, as on a master, and the master suggested."""
    await put(ctx, b"a", b"b")
    ctx.store.config.broker_role = role
    ctx.store.config.access_message_in_memory_max_ratio = 0
    pull = PullProcessor(ctx)
    at_end = await pull.pull_message(FakeChannel(), pull_request(2))
    assert at_end.code == ResponseCode.PULL_NOT_FOUND
    assert at_end.ext_fields["nextBeginOffset"] == "2"
    assert at_end.ext_fields["suggestWhichBrokerId"] == "0"
    beyond = await pull.pull_message(FakeChannel(), pull_request(100))
    assert beyond.code == ResponseCode.PULL_OFFSET_MOVED
    assert beyond.ext_fields["suggestWhichBrokerId"] == "0"


async def test_default_group_sends_a_lagging_consumer_to_broker_one(ctx: BrokerContext) -> None:
    """The defaults (brokerId 0, whichBrokerWhenConsumeSlowly 1) with slaveReadEnable on."""
    await put(ctx, b"a", b"b")
    ctx.broker_config.slave_read_enable = True
    pull = PullProcessor(ctx)
    ctx.store.config.access_message_in_memory_max_ratio = 100
    response = await pull.pull_message(FakeChannel(), pull_request(0))
    assert response.ext_fields["suggestWhichBrokerId"] == "0"
    ctx.store.config.access_message_in_memory_max_ratio = 0
    response = await pull.pull_message(FakeChannel(), pull_request(0))
    assert response.ext_fields["suggestWhichBrokerId"] == "1"


async def test_suggest_from_slave_at_the_in_memory_line(
    ctx: BrokerContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """suggestPullingFromSlave: the commit-log bytes after the last consume-queue entry the pull
    looked at (here the second, where a batch of one stopped) exceed
    (long) (memory * (accessMessageInMemoryMaxRatio / 100.0)), strictly."""
    await put(ctx, b"a", b"b", b"c")
    store = ctx.store
    behind = store.max_phy_offset - store.get_commitlog_offset_in_queue(TOPIC, 0, 1)
    store.config.access_message_in_memory_max_ratio = 50
    monkeypatch.setattr(get_message_module, "TOTAL_PHYSICAL_MEMORY", 2 * behind + 1)
    result = store.get_message(GROUP, TOPIC, 0, 0, 1)  # memory: behind (the half, truncated)
    assert len(result.messages) == 1
    assert not result.suggest_pulling_from_slave
    monkeypatch.setattr(get_message_module, "TOTAL_PHYSICAL_MEMORY", 2 * behind - 1)
    result = store.get_message(GROUP, TOPIC, 0, 0, 1)  # memory: behind - 1
    assert result.suggest_pulling_from_slave


async def test_records_beyond_the_in_memory_line_take_the_in_disk_caps(
    ctx: BrokerContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """isTheBatchFull: a record more than the in-memory bytes behind the end counts against
    maxTransferCountOnMessageInDisk, one within them against ...InMemory."""
    await put(ctx, b"a", b"b", b"c", b"d")
    store = ctx.store
    store.config.max_transfer_count_on_message_in_disk = 2
    store.config.max_transfer_count_on_message_in_memory = 3
    store.config.access_message_in_memory_max_ratio = 100
    # The batch is judged before each record by that record's distance from the end: the third
    # record one byte beyond the line is in disk, and the in-disk cap (2) stops the batch there.
    third = store.max_phy_offset - store.get_commitlog_offset_in_queue(TOPIC, 0, 2)
    monkeypatch.setattr(get_message_module, "TOTAL_PHYSICAL_MEMORY", third - 1)
    assert len(store.get_message(GROUP, TOPIC, 0, 0, 32).messages) == 2
    # Exactly on the line it is in memory: the in-memory cap (3) stops it at the fourth.
    monkeypatch.setattr(get_message_module, "TOTAL_PHYSICAL_MEMORY", third)
    assert len(store.get_message(GROUP, TOPIC, 0, 0, 32).messages) == 3
