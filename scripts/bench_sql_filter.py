"""SQL92 filter benchmark: a filtered pull (1 message in 4 matches) against an unfiltered one.

Stores ``--count`` messages (``--body`` bytes, six properties each, ``a`` cycling 0..3) in one
queue of a temporary store, then drains the queue with the broker's own PullProcessor (no socket:
the broker-side cost of a pull) three ways: unfiltered (TAG ``*``), by SQL92 ``a = 0`` with the
expression in each pull (as a pull consumer sends it), and by the same expression registered by a
heartbeat (as a push consumer pulls).  Prints messages scanned and returned per second and the
filtered scan rate as a fraction of the unfiltered rate (the target is at least 0.5).

    python scripts/bench_sql_filter.py [--count N] [--body BYTES] [--rounds N] [--expression SQL]

(``--expression`` replaces ``a = 0``; the messages' properties are a, region and amount.)
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import attrs
import trio

from pymq.broker.client_manager import (
    ClientChannelInfo,
    ConsumerManager,
    ProducerManager,
    RebalanceLockManager,
)
from pymq.broker.config import BrokerConfig
from pymq.broker.consumer_filter_manager import ConsumerFilterManager
from pymq.broker.consumer_offset_manager import ConsumerOffsetManager
from pymq.broker.context import BrokerContext
from pymq.broker.fast_failure import ConsumerFallBehind
from pymq.broker.long_polling import PullRequestHoldService
from pymq.broker.processors.pull import FLAG_SUBSCRIPTION, PullProcessor
from pymq.broker.schedule import ScheduleMessageService
from pymq.broker.stats import BrokerStats
from pymq.broker.subscription_group_manager import SubscriptionGroupManager
from pymq.broker.topic_config_manager import TopicConfigManager
from pymq.common.consumer import ConsumeFromWhere, ConsumeType, MessageModel, SubscriptionData
from pymq.common.message_ext import MessageExt
from pymq.common.message_id import UniqueIdGenerator
from pymq.common.topic import TopicConfig
from pymq.remoting import headers as H
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.store import DefaultMessageStore, MessageStoreConfig, PutMessageStatus

TOPIC = "BenchSql"
GROUP = "bench-group"
BATCH = 32


@attrs.define(eq=False)
class Channel:
    remote_address: str = "127.0.0.1:1"

    def answer(self, request: Any, response: Any) -> None:
        pass


def messages(count: int, body_size: int) -> list[MessageExt]:
    ids = UniqueIdGenerator("10.0.0.1")
    body = os.urandom(body_size)
    return [
        MessageExt(
            topic=TOPIC,
            body=body,
            queue_id=0,
            properties={
                "KEYS": f"order-{i}",
                "TAGS": "TagA",
                "UNIQ_KEY": ids.create(),
                "a": str(i % 4),
                "region": "eu" if i % 3 else "us",
                "amount": str(i % 1000),
            },
            born_timestamp=1_700_000_000_000,
            born_host=("10.0.0.1", 50000),
        )
        for i in range(count)
    ]


def pull_request(expression: str | None, expression_type: str, sub_version: int) -> Any:
    def build(offset: int) -> RemotingCommand:
        header = H.PullMessageRequestHeader(
            consumer_group=GROUP,
            topic=TOPIC,
            queue_id=0,
            queue_offset=offset,
            max_msg_nums=BATCH,
            sys_flag=FLAG_SUBSCRIPTION if expression is not None else 0,
            commit_offset=0,
            suspend_timeout_millis=0,
            subscription=expression,
            sub_version=sub_version,
            expression_type=expression_type,
        )
        return RemotingCommand.request(RequestCode.PULL_MESSAGE, H.encode(header))

    return build


async def drain(
    pull: PullProcessor, stats: BrokerStats, build: Any, count: int
) -> tuple[float, int, int]:
    """Pull the whole queue; (seconds, scanned, returned)."""
    offset = 0
    returned = stats.get_msgs  # the broker counts the messages it returns
    channel = Channel()
    start = time.perf_counter()
    while offset < count:
        response = await pull.pull_message(channel, build(offset))
        if response.code not in (ResponseCode.SUCCESS, ResponseCode.PULL_RETRY_IMMEDIATELY):
            raise SystemExit(f"pull answered {response.code} {response.remark}")
        offset = int(response.ext_fields["nextBeginOffset"])
    return time.perf_counter() - start, offset, stats.get_msgs - returned


async def main(args: argparse.Namespace) -> None:
    root = tempfile.mkdtemp(prefix="pymq-bench-sql-")
    try:
        store_config = MessageStoreConfig(
            store_path_root_dir=os.path.join(root, "store"),
            mapped_file_size_commit_log=256 * 1024 * 1024,
        )
        broker_config = BrokerConfig(broker_name="bench", broker_ip1="127.0.0.1")
        broker_config.enable_property_filter = True
        config_dir = store_config.config_dir
        store = DefaultMessageStore(store_config)
        store.store_host = ("127.0.0.1", 10911)
        consumer_manager = ConsumerManager()
        filters = ConsumerFilterManager(config_dir)
        ctx = BrokerContext(
            broker_config=broker_config,
            store=store,
            topic_config_manager=TopicConfigManager(config_dir, broker_config),
            subscription_group_manager=SubscriptionGroupManager(config_dir),
            consumer_offset_manager=ConsumerOffsetManager(config_dir),
            consumer_filter_manager=filters,
            consumer_manager=consumer_manager,
            producer_manager=ProducerManager(),
            rebalance_lock_manager=RebalanceLockManager(),
            pull_hold=PullRequestHoldService(),
            stats=BrokerStats(),
            fall_behind=ConsumerFallBehind(),
            schedule=ScheduleMessageService(config_dir, store),
            admin=None,  # type: ignore[arg-type]
            store_host=store.store_host,
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(store.run)
            await ctx.topic_config_manager.update(TopicConfig(TOPIC, 1, 1))
            msgs = messages(args.count, args.body)
            for i in range(0, len(msgs), BATCH):
                r = await store.put(msgs[i : i + BATCH])
                assert r.status is PutMessageStatus.PUT_OK, r
            await store.reput.do_reput()
            del msgs
            # The group's heartbeat: its SQL92 subscription, registered and compiled.
            version = 1
            expression = args.expression
            sub = SubscriptionData(TOPIC, expression, sub_version=version, expression_type="SQL92")
            info = ClientChannelInfo(Channel(), "bench-client", "JAVA", 401, trio.current_time())
            consumer_manager.register(
                GROUP,
                info,
                ConsumeType.CONSUME_PASSIVELY,
                MessageModel.CLUSTERING,
                ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                [sub],
                False,
            )
            filters.register_group(GROUP, [sub])
            gc.collect()
            gc.freeze()
            pull = PullProcessor(ctx)
            runs = {
                "unfiltered (TAG *)": pull_request("*", "TAG", 0),
                "SQL92, in the pull": pull_request(expression, "SQL92", version),
                "SQL92, registered": pull_request(None, "SQL92", version),
            }
            results: dict[str, list[tuple[float, int, int]]] = {name: [] for name in runs}
            for _ in range(args.rounds):
                for name, build in runs.items():
                    results[name].append(await drain(pull, ctx.stats, build, args.count))
            print(
                f"{args.count} messages of {args.body} B, SQL92 {expression!r}; "
                f"median of {args.rounds} rounds"
            )
            base = 0.0
            for name, rounds in results.items():
                seconds = statistics.median(r[0] for r in rounds)
                scanned, returned = rounds[0][1], rounds[0][2]
                scan_rate, return_rate = scanned / seconds, returned / seconds
                base = base or scan_rate
                print(
                    f"  {name:20s} scanned {scan_rate:>10,.0f}/s  returned {return_rate:>10,.0f}/s"
                    f"  ({scan_rate / base:.2f}x the unfiltered scan rate)"
                )
            nursery.cancel_scope.cancel()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--body", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--expression", default="a = 0", help="1 message in 4 has a = 0")
    trio.run(main, parser.parse_args())
