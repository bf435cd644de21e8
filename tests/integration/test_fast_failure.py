"""BrokerFastFailure, protectBroker and printWaterMark.

Waits are simulated with an injected clock that moves on by a fixed step each time it is read:
the receive stamp is one read, the start of a request's task the next, so a request served in a
task waited exactly one step.  Nothing here depends on wall-clock time.
"""

from __future__ import annotations

import logging
import re

import pytest
import trio

from pymq.broker.config import BrokerConfig
from pymq.broker.fast_failure import BrokerFastFailure
from pymq.client import topics
from pymq.common.config import apply_properties
from pymq.common.properties import parse_properties
from pymq.embedded import Cluster
from pymq.remoting.codec import RPC_TYPE_RESPONSE, FrameDecoder, RemotingCommand, encode
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.store.config import MessageStoreConfig

TIMEOUT_RE = re.compile(
    r"^\[TIMEOUT_CLEAN_QUEUE\]broker busy, start flow control for a while, "
    r"period in queue: (\d+)ms, size of queue: (\d+)$"
)
PCBUSY_RE = re.compile(
    r"^\[PCBUSY_CLEAN_QUEUE\]broker busy, start flow control for a while, "
    r"period in queue: (\d+)ms, size of queue: (\d+)$"
)


class SteppingClock:
    """Moves on by ``step`` seconds at every read."""

    def __init__(self, step: float) -> None:
        self.now = 1000.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def use_clock(cluster: Cluster, clock: SteppingClock) -> None:
    cluster.broker.fast_failure.clock = clock
    cluster.broker.store.lock_clock = clock


def send_request(topic: str, opaque: int, body: bytes = b"hello") -> bytes:
    ext = {
        "a": "P",
        "b": topic,
        "c": "TBW102",
        "d": "4",
        "e": "0",
        "f": "0",
        "g": "1700000000000",
        "h": "0",
        "i": "",
        "j": "0",
        "k": "false",
        "m": "false",
    }
    req = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, ext, body)
    req.opaque = opaque
    return encode(req)


async def exchange(cluster: Cluster, frames: list[bytes]) -> dict[int, RemotingCommand]:
    """Write ``frames`` in one write and collect one answer per frame, by opaque."""
    _host, port = cluster.broker_addr.rsplit(":", 1)
    stream = await trio.open_tcp_stream("127.0.0.1", int(port))
    answers: dict[int, RemotingCommand] = {}
    decoder = FrameDecoder()
    async with stream:
        await stream.send_all(b"".join(frames))
        with trio.fail_after(10):
            while len(answers) < len(frames):
                data = await stream.receive_some(65536)
                assert data, "the broker closed the connection"
                for cmd in decoder.feed(data):
                    assert cmd.flag & RPC_TYPE_RESPONSE
                    answers[cmd.opaque] = cmd
    return answers


async def test_send_that_waited_too_long_gets_timeout_clean_queue(pymq_cluster: Cluster) -> None:
    use_clock(pymq_cluster, SteppingClock(0.25))  # waitTimeMillsInSendQueue is 200 ms
    # A topic that does not exist yet is auto-created in a task: its wait is one step.
    answers = await exchange(pymq_cluster, [send_request("FreshTopic", 7)])
    answer = answers[7]
    assert answer.code == ResponseCode.SYSTEM_BUSY == 2
    match = TIMEOUT_RE.match(answer.remark or "")
    assert match, answer.remark
    # One step of the test's clock, plus the time the bytes sat in the socket's buffer (the
    # kernel's receive timestamp, in real time: a millisecond or so on a busy machine).
    waited, size = match.groups()
    assert 250 <= int(waited) < 300 and size == "1", answer.remark
    # Refused before anything was done: no topic, nothing stored.
    assert pymq_cluster.broker.topic_config_manager.select("FreshTopic") is None
    assert pymq_cluster.broker.store.put_message_times_total == 0
    assert pymq_cluster.broker.fast_failure.refused[0] == 1


async def test_a_wait_under_the_limit_is_served(pymq_cluster: Cluster) -> None:
    use_clock(pymq_cluster, SteppingClock(0.15))
    answers = await exchange(pymq_cluster, [send_request("FreshTopic", 8)])
    assert answers[8].code == ResponseCode.SUCCESS, answers[8].remark


async def test_no_fast_failure_when_disabled(pymq_cluster: Cluster) -> None:
    pymq_cluster.broker.broker_config.broker_fast_failure_enable = False
    use_clock(pymq_cluster, SteppingClock(10.0))
    answers = await exchange(pymq_cluster, [send_request("FreshTopic", 9)])
    assert answers[9].code == ResponseCode.SUCCESS, answers[9].remark
    assert pymq_cluster.broker.store.put_message_times_total == 1


async def test_a_long_run_in_the_reader_is_checked_after_its_first_batch(
    pymq_cluster: Cluster,
) -> None:
    cluster = pymq_cluster
    await topics.create_topic(cluster.namesrv_addr, "Known", brokers=[cluster.broker_addr])
    # The first 32 commands of a receive follow it at once; before each further run of 32 the
    # clock is read again.  Puts read it too (twice each), so by the second run the first
    # receive's requests have "waited" far past 200 ms.
    use_clock(cluster, SteppingClock(0.01))
    frames = [send_request("Known", i) for i in range(1, 65)]
    answers = await exchange(cluster, frames)
    codes = [answers[i].code for i in range(1, 65)]
    assert codes[:32] == [ResponseCode.SUCCESS] * 32  # the first run of any receive
    refused = [answers[i] for i in range(1, 65) if answers[i].code == ResponseCode.SYSTEM_BUSY]
    assert all(TIMEOUT_RE.match(a.remark or "") for a in refused)
    assert set(codes) <= {ResponseCode.SUCCESS, ResponseCode.SYSTEM_BUSY}
    assert len(refused) + cluster.broker.store.put_message_times_total == 64


async def test_sends_that_waited_behind_a_slow_put_get_pcbusy_clean_queue(
    pymq_cluster: Cluster,
) -> None:
    cluster = pymq_cluster
    await topics.create_topic(cluster.namesrv_addr, "Known", brokers=[cluster.broker_addr])
    # Each read moves 1.5 s: the put of the first send holds the commit log for 1.5 s, more
    # than osPageCacheBusyTimeOutMills (1000).  The second send, received in the same write
    # and served after that put (in a task: its topic is new), waited behind it.
    clock = SteppingClock(1.5)
    use_clock(cluster, clock)
    answers = await exchange(cluster, [send_request("Known", 1), send_request("Other", 2)])
    assert answers[1].code == ResponseCode.SUCCESS
    assert answers[2].code == ResponseCode.SYSTEM_BUSY
    assert PCBUSY_RE.match(answers[2].remark or ""), answers[2].remark
    assert cluster.broker.fast_failure.pc_busy_refused == 1
    assert cluster.broker.store.os_page_cache_busy_mark > float("-inf")
    # Sends received after the slow put are served again.
    clock.step = 0.0
    answers = await exchange(cluster, [send_request("Known", 3)])
    assert answers[3].code == ResponseCode.SUCCESS


async def test_protect_broker_disables_a_group_that_reads_too_far_behind(
    pymq_cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    from pymq.client import Message, Producer, PullConsumer
    from pymq.common.consumer import MessageQueue

    cluster = pymq_cluster
    broker = cluster.broker
    broker.broker_config.disable_consume_if_consumer_read_slowly = True
    broker.broker_config.consumer_fallbehind_threshold = 1000
    await topics.create_topic(cluster.namesrv_addr, "Lag", queues=1, brokers=[cluster.broker_addr])
    async with Producer("P", cluster.namesrv_addr) as producer:
        for i in range(20):
            await producer.send(Message("Lag", b"x" * 200 + b"%d" % i))
    await broker.store.reput.do_reput()
    mq = MessageQueue("Lag", "broker-a", 0)
    async with PullConsumer("Slow", cluster.namesrv_addr) as puller:
        found = await puller.pull(mq, "*", 0, 1)  # reads 1 of 20: ~19 records behind
        assert len(found.messages) == 1
        with caplog.at_level(logging.INFO, logger="pymq.broker.protection"):
            await broker.protect_broker()
        assert "[PROTECT_BROKER] the consumer[Slow] consume slowly" in caplog.text
        group = broker.subscription_group_manager.table["Slow"]
        assert group.consume_enable is False
        with pytest.raises(Exception, match="subscription group no permission, Slow") as info:
            await puller.pull(mq, "*", 1, 1)
        assert getattr(info.value, "code", ResponseCode.NO_PERMISSION) == ResponseCode.NO_PERMISSION


async def test_protect_broker_does_nothing_by_default(pymq_cluster: Cluster) -> None:
    broker = pymq_cluster.broker
    broker.fall_behind.record("G", "T", 0, 1 << 40)
    await broker.subscription_group_manager.find_or_create("G")
    await broker.protect_broker()  # disableConsumeIfConsumerReadSlowly is false by default
    assert broker.subscription_group_manager.table["G"].consume_enable is True


async def test_water_mark_line(pymq_cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    broker = pymq_cluster.broker
    with caplog.at_level(logging.INFO, logger="pymq.broker.watermark"):
        broker.print_water_mark()
    assert "[WATERMARK] Send Queue Size: 0 SlowTimeMills: 0" in caplog.text
    assert "[WATERMARK] Pull Queue Size: 0 SlowTimeMills: 0" in caplog.text


def test_config_keys_from_a_properties_file() -> None:
    text = (
        "brokerFastFailureEnable=false\n"
        "waitTimeMillsInSendQueue=350\n"
        "waitTimeMillsInPullQueue=6000\n"
        "waitTimeMillsInHeartbeatQueue=32000\n"
        "waitTimeMillsInTransactionQueue=4000\n"
        "osPageCacheBusyTimeOutMills=1500\n"
        "disableConsumeIfConsumerReadSlowly=true\n"
        "consumerFallbehindThreshold=17179869185\n"
    )
    broker, store = BrokerConfig(), MessageStoreConfig()
    assert apply_properties([broker, store], parse_properties(text)) == []
    assert broker.broker_fast_failure_enable is False
    assert broker.wait_time_mills_in_send_queue == 350
    assert broker.wait_time_mills_in_pull_queue == 6000
    assert broker.wait_time_mills_in_heartbeat_queue == 32000
    assert broker.wait_time_mills_in_transaction_queue == 4000
    assert store.os_page_cache_busy_time_out_mills == 1500
    assert broker.disable_consume_if_consumer_read_slowly is True
    assert broker.consumer_fallbehind_threshold == 17179869185


def test_defaults_are_rocketmqs() -> None:
    broker, store = BrokerConfig(), MessageStoreConfig()
    assert broker.broker_fast_failure_enable is True
    assert broker.wait_time_mills_in_send_queue == 200
    assert broker.wait_time_mills_in_pull_queue == 5000
    assert broker.wait_time_mills_in_heartbeat_queue == 31000
    assert broker.wait_time_mills_in_transaction_queue == 3000
    assert store.os_page_cache_busy_time_out_mills == 1000
    assert broker.disable_consume_if_consumer_read_slowly is False
    assert broker.consumer_fallbehind_threshold == 16 * 1024**3
    off = BrokerFastFailure(BrokerConfig(broker_fast_failure_enable=False))
    assert off.min_wait == float("inf")
    assert BrokerFastFailure(BrokerConfig()).min_wait == pytest.approx(0.2)


async def test_requests_refused_in_a_long_run_are_not_decoded(
    pymq_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refusal must cost a fraction of a send: requests past their wait are answered from a
    peek at their header, never decoded (here each is one the decoder would refuse outright)."""
    import pymq.broker.processors.send as send_module
    import pymq.remoting.channel as channel_module

    cluster = pymq_cluster
    await topics.create_topic(cluster.namesrv_addr, "Known", brokers=[cluster.broker_addr])
    decoded: list[int] = []  # their opaques
    real = channel_module.decode_frame_at

    def counting(buf: bytes, start: int, end: int) -> RemotingCommand:
        cmd = real(buf, start, end)
        decoded.append(cmd.opaque)
        return cmd

    monkeypatch.setattr(channel_module, "decode_frame_at", counting)
    monkeypatch.setattr(send_module, "decode_frame_at", counting)  # send_run's decoded way
    use_clock(cluster, SteppingClock(0.5))  # every run after the read's first is stale
    frames = [send_request("Known", i) for i in range(1, 97)]
    answers = await exchange(cluster, frames)
    refused = [a for a in answers.values() if a.code == ResponseCode.SYSTEM_BUSY]
    served = [a for a in answers.values() if a.code == ResponseCode.SUCCESS]
    assert len(refused) + len(served) == 96
    assert len(refused) >= 32 and all(TIMEOUT_RE.match(a.remark or "") for a in refused)
    # The refused were never decoded (the served were, or answered from their bytes).
    assert decoded and set(decoded) <= {a.opaque for a in served}
    assert cluster.broker.fast_failure.refused[0] == len(refused)
