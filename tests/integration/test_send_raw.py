"""The broker's raw send path (SendProcessor.send_raw, through send_run): a plain
SEND_MESSAGE_V2 answered from its frame gets the answer, and leaves the record, that the usual
path gives the same frame; every other frame is left to the usual path with nothing changed."""

from __future__ import annotations

import contextlib
import json
import struct
import types
from collections.abc import AsyncIterator
from typing import Any

from pymq.client import topics
from pymq.common.record import decode_records
from pymq.embedded import Cluster
from pymq.remoting.channel import ANSWER_LATER, RAW_ANSWER_LATER
from pymq.remoting.codec import RPC_TYPE_RESPONSE, RemotingCommand, decode_frame, encode
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.remoting.errors import RemotingCommandError
from pymq.remoting.headers import SendMessageRequestHeader
from tests.helpers import send_tier_functions

native_extension = send_tier_functions()


PEER = types.SimpleNamespace(remote_address="10.0.0.9:40123")
UNIQ = "UNIQ_KEY\x010A0000090000000000000000000000{:02d}"


def ext_for(topic: str, queue_id: int = 1, props: str | None = "", **extra: str) -> dict:
    ext = SendMessageRequestHeader.v2_ext(
        "G", topic, queue_id, 0, 1_800_000_000_000, 0, props or "", False
    )
    if props is None:
        del ext["i"]
    ext.update(extra)
    return {k: v for k, v in ext.items() if v != "<drop>"}


def frame(ext: dict, code: int = 310, flag: int = 0, remark: str | None = None) -> bytes:
    return encode(RemotingCommand(code, ext, b"body-%d" % len(ext), 77, flag, remark))


def batch_frame(topic: str, items: list, code: int = 320, body: bytes | None = None, **extra: str):
    """A SEND_BATCH_MESSAGE as pymq's and Java's producers write it (V2 names, batch true)."""
    from pymq.common.batch import BatchItem, encode_batch_body

    ext = ext_for(topic, props="", **{"m": "true", **extra})
    if body is None:
        body = encode_batch_body([BatchItem(b, 0, p) for b, p in items])
    return encode(RemotingCommand(code, ext, body, 78, 0))


def _items(n: int, **props: str) -> list:
    return [(b"item-%d" % i, {"UNIQ_KEY": f"0A00000900000000000000000000{i:04d}", **props})
            for i in range(n)]  # fmt: skip


def cpp_frame(topic: str, props: str, **fields: object) -> bytes:
    """A SEND_MESSAGE as the C++ client writes it: long names, numbers and strings mixed, the
    ACL fields it always adds, keys sorted, remark "" and a trailing newline."""
    ext: dict[str, object] = {
        "AccessKey": "", "OnsChannel": "ALIYUN", "Signature": "qM86", "batch": "0",
        "bornTimestamp": "1800000000000", "defaultTopic": "TBW102", "defaultTopicQueueNums": 4,
        "flag": 0, "producerGroup": "PID_CPP", "properties": props, "queueId": 1,
        "reconsumeTimes": "0", "sysFlag": 0, "topic": topic, "unitMode": "0",
    }  # fmt: skip
    ext.update(fields)
    header = (
        json.dumps(
            {"code": 10, "extFields": dict(sorted(ext.items())), "flag": 0, "language": "CPP",
             "opaque": 14, "remark": "", "version": 63},
            separators=(",", ":"),
        )
        + "\n"
    ).encode()  # fmt: skip
    body = b"cpp-body"
    return struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body


def answer_of(out: RemotingCommand | bytes) -> tuple:
    cmd = decode_frame(out[4:]) if isinstance(out, bytes) else out
    ext = dict(cmd.ext_fields)
    ext.pop("msgId", None)  # the commit-log offset: the two topics' records are apart
    return cmd.code, cmd.remark, ext, cmd.opaque, cmd.flag


SEND_CODES = (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE)


def inline(
    cluster: Cluster, channel: object, cmd: RemotingCommand
) -> RemotingCommand | bytes | None:
    """What the broker serves in the connection's reader for a decoded frame: send_run's way
    with the sends its reading leaves, a route's inline handler otherwise; None: a task's."""
    if cmd.code in SEND_CODES:
        return cluster.broker.send_processor._serve_decoded(channel, cmd)  # type: ignore[arg-type]
    return cluster.broker.inline(cluster, channel, cmd)  # type: ignore[arg-type]


async def usual(cluster: Cluster, data: bytes) -> tuple:
    """What the broker's usual path answers to the frame (inline, or in a task)."""
    cmd = decode_frame(data[4:])
    if cmd.header_error is not None:
        return ("header_error", cmd.header_error)
    server = cluster.broker.server
    try:  # as Channel._serve_inline and _serve_task answer what a handler raises
        out = inline(cluster, PEER, cmd)
        assert out is not ANSWER_LATER
        if out is None:
            out = await server.dispatch(PEER, cmd)  # type: ignore[arg-type]
    except RemotingCommandError as exc:
        out = cmd.response(ResponseCode.SYSTEM_ERROR, str(exc))
    assert out is not None
    if isinstance(out, RemotingCommand):
        out.opaque, out.flag = cmd.opaque, out.flag | RPC_TYPE_RESPONSE
    return answer_of(out)


def stored(cluster: Cluster, topic: str) -> list[tuple]:
    store = cluster.broker.store
    data = store.commitlog.get_data(store.commitlog.min_offset) or b""
    return [
        (m.queue_id, m.queue_offset, m.body, m.properties, m.flag, m.sys_flag, m.born_timestamp,
         m.born_host, m.reconsume_times)
        for m in decode_records(data)
        if m.topic == topic
    ]  # fmt: skip


async def test_raw_sends_answer_and_store_as_the_usual_path(pymq_cluster: Cluster) -> None:
    cluster = pymq_cluster
    for topic in ("RawT", "UsualT"):
        await topics.create_topic(cluster.namesrv_addr, topic, brokers=[cluster.broker_addr])
    send = cluster.broker.send_processor
    store = cluster.broker.store
    # Each case twice: to RawT through send_raw (the usual path where it declines) and to
    # UsualT through the usual path only; then the answers and the records must agree.
    cases: list[tuple[str, object]] = [
        ("first", lambda t: frame(ext_for(t, props=UNIQ.format(0)))),  # topic not yet checked
        ("plain", lambda t: frame(ext_for(t, props=UNIQ.format(1)))),
        ("tags+keys+wait", lambda t: frame(
            ext_for(t, props="TAGS\x01a\x02KEYS\x01k1 k2\x02WAIT\x01true\x02" + UNIQ.format(2))
        )),
        ("no props", lambda t: frame(ext_for(t, props=None))),
        ("queue 3, flag, sys flag", lambda t: frame(ext_for(t, 3, UNIQ.format(3), h="5", f="0"))),
        ("reconsume", lambda t: frame(ext_for(t, props=UNIQ.format(4), j="3", l="16"))),
        ("C++ booleans", lambda t: frame(ext_for(t, props=UNIQ.format(5), k="0", m="0"))),
        ("quoted props", lambda t: frame(ext_for(t, props='A\x01"q\\\x02' + UNIQ.format(6)))),
        ("non-ASCII props", lambda t: frame(ext_for(t, props="A\x01\u00e9\x02" + UNIQ.format(20)))),
        ("delay", lambda t: frame(ext_for(t, props="DELAY\x012\x02" + UNIQ.format(7)))),
        ("transaction", lambda t: frame(ext_for(t, props="TRAN_MSG\x01true\x02" + UNIQ.format(8)))),
        ("queue out of range", lambda t: frame(ext_for(t, 99, UNIQ.format(9)))),
        ("bad number", lambda t: frame(ext_for(t, props=UNIQ.format(10), e="+1"))),
        ("missing h", lambda t: frame(ext_for(t, props=UNIQ.format(11), h="<drop>"))),
        ("unknown field", lambda t: frame(ext_for(t, props=UNIQ.format(12), n="x"))),
        ("batch flag", lambda t: frame(ext_for(t, props=UNIQ.format(13), m="true"))),
        ("remark", lambda t: frame(ext_for(t, props=UNIQ.format(14)), remark="r")),
        ("code 10", lambda t: frame(
            SendMessageRequestHeader(
                "G", t, "TBW102", 4, 1, 0, 1_800_000_000_000, 0, UNIQ.format(15)
            ).to_ext(v2=False),
            code=10,
        )),
        ("C++ client", lambda t: cpp_frame(t, UNIQ.format(21))),
        ("C++ client, queue 2, reconsume", lambda t: cpp_frame(
            t, UNIQ.format(22), queueId=2, reconsumeTimes=1, batch=False
        )),
        ("C++ client, negative sys flag", lambda t: cpp_frame(t, UNIQ.format(23), sysFlag=-1)),
        ("C++ client, batch", lambda t: cpp_frame(t, UNIQ.format(24), batch="1")),
        ("C++ client, null flag", lambda t: cpp_frame(t, UNIQ.format(25), flag=None)),
        ("C++ client, V2 name too", lambda t: cpp_frame(t, UNIQ.format(26), e="1")),
        ("unknown topic", lambda t: frame(ext_for(t + "Nope", props=UNIQ.format(16)))),
        ("retry topic", lambda t: frame(ext_for("%RETRY%" + t, props=UNIQ.format(17)))),
        ("system topic", lambda t: frame(ext_for("SCHEDULE_TOPIC_XXXX", props=UNIQ.format(18)))),
        ("plain again", lambda t: frame(ext_for(t, props=UNIQ.format(19)))),
        ("batch", lambda t: batch_frame(t, _items(3))),
        ("batch, tags, keys, WAIT", lambda t: batch_frame(
            t, _items(2, TAGS="a", KEYS="k1 k2", WAIT="true"), e="2"
        )),
        ("batch of one, reconsume", lambda t: batch_frame(t, _items(1), j="2")),
        ("batch, a delayed item", lambda t: batch_frame(t, _items(2, DELAY="2"))),
        ("batch, cut body", lambda t: batch_frame(t, [], body=batch_frame(t, _items(2))[-30:])),
        ("batch, empty body", lambda t: batch_frame(t, [], body=b"")),
        ("batch, code 320 without batch", lambda t: batch_frame(t, _items(2), m="false")),
        ("batch, queue out of range", lambda t: batch_frame(t, _items(2), e="99")),
        ("batch, transaction flag", lambda t: batch_frame(t, _items(2), f="4")),
    ]  # fmt: skip
    raw_served = []
    for name, make in cases:
        raw_frame, usual_frame = make("RawT"), make("UsualT")  # type: ignore[operator]
        before = store.commitlog.max_offset
        out = send.send_raw(PEER, raw_frame, 4, len(raw_frame))  # type: ignore[arg-type]
        if out is None:
            assert store.commitlog.max_offset == before, name  # declined: nothing changed
            got = await usual(cluster, raw_frame)
        else:
            raw_served.append(name)
            got = answer_of(out)
        want = await usual(cluster, usual_frame)
        if name in ("delay", "transaction"):  # both in one system queue: offsets apart
            got[2].pop("queueOffset"), want[2].pop("queueOffset")
        # Refusals name the topic: the same words otherwise.
        got = (got[0], got[1] and got[1].replace("RawT", "T"), *got[2:])
        want = (want[0], want[1] and want[1].replace("UsualT", "T"), *want[2:])
        assert got == want, (name, got, want)
    # The plain sends went raw (after the topic's first, checked send); the rest did not.
    assert raw_served == [
        "plain", "tags+keys+wait", "no props", "queue 3, flag, sys flag", "reconsume",
        "C++ booleans", "quoted props", "unknown field", "remark", "code 10", "C++ client",
        "C++ client, queue 2, reconsume",
        "plain again", "batch", "batch, tags, keys, WAIT", "batch of one, reconsume",
    ]  # fmt: skip
    raw_records, usual_records = stored(cluster, "RawT"), stored(cluster, "UsualT")
    assert len(raw_records) >= 10
    assert raw_records == usual_records


async def test_a_broker_serves_sends_raw_over_its_connections(pymq_cluster: Cluster) -> None:
    """Through the socket: a pymq producer's sends are answered by the raw path."""
    from pymq.client import Producer
    from pymq.client.producer import Message

    cluster = pymq_cluster
    await topics.create_topic(cluster.namesrv_addr, "RawSock", brokers=[cluster.broker_addr])
    send = cluster.broker.send_processor
    served = []
    real_run = send.send_run  # the connections' run handler (their route's run)

    def counting_run(*args: Any, **kwargs: Any) -> tuple[bytes, int, RemotingCommand | None]:
        joined, left, cmd = real_run(*args, **kwargs)
        served.extend([True] * (left - args[3]))
        return joined, left, cmd

    for server in (cluster.broker.server, cluster.broker.fast_server):
        assert server.routes[RequestCode.SEND_MESSAGE_V2].run == send.send_run
        server._run_handler = counting_run  # what the connections opened next offer their runs
    async with Producer("P", cluster.namesrv_addr) as producer:
        results = [await producer.send(Message("RawSock", b"m%d" % i)) for i in range(20)]
    assert {r.status for r in results} == {"SEND_OK"}
    assert served.count(True) >= 19  # all but the topic's first send


@contextlib.asynccontextmanager
async def sync_flush_cluster(tmp_path, *names: str) -> AsyncIterator[Cluster]:
    """A cluster whose broker flushes SYNC_FLUSH, with topics ``names`` created."""
    from pymq.embedded import open_cluster
    from pymq.testing import TEST_PROPERTIES

    properties = dict(TEST_PROPERTIES, flushDiskType="SYNC_FLUSH")
    async with open_cluster(
        str(tmp_path), namesrv_port=0, broker_port=0, bind_address="127.0.0.1",
        properties=properties,
    ) as cluster:  # fmt: skip
        for name in names:
            await topics.create_topic(cluster.namesrv_addr, name, brokers=[cluster.broker_addr])
        yield cluster


class Answers:
    """A stand-in for the sending channel: collects the answers written later (the usual
    path's Channel.answer, the raw path's Channel.answer_frames) and the calls that wrote
    them."""

    remote_address = PEER.remote_address

    def __init__(self) -> None:
        self.frames: list[tuple] = []
        self.calls: list[int] = []  # answer_frames: how many frames each call wrote

    def answer(self, request: RemotingCommand, response: RemotingCommand | bytes) -> None:
        if isinstance(response, RemotingCommand):
            response.opaque, response.flag = request.opaque, response.flag | RPC_TYPE_RESPONSE
        self.frames.append(answer_of(response))

    def answer_frames(self, frames: list[bytes]) -> None:
        self.calls.append(len(frames))
        self.frames.extend(answer_of(f) for f in frames)


async def test_sync_flush_raw_sends_are_answered_by_the_group_commit(tmp_path, monkeypatch) -> None:
    """With SYNC_FLUSH a plain send is taken by the raw path and answered once the group
    commit has its bytes on disk, with the answer the usual path writes then: SEND_OK, and
    FLUSH_DISK_TIMEOUT when the sync hangs past syncFlushTimeout."""
    import trio

    from tests.helpers import StuckDisk

    disk = StuckDisk(monkeypatch)
    async with sync_flush_cluster(tmp_path, "RawT", "UsualT") as cluster:
        send = cluster.broker.send_processor
        store = cluster.broker.store

        async def both(n: int, props: str) -> tuple[tuple, tuple]:
            """The frame sent to RawT by send_raw and to UsualT by the usual inline path;
            each one's answer once written."""
            puts = cluster.broker.context.stats.put_msgs  # what was sent before is answered
            raw_ch, usual_ch = Answers(), Answers()
            raw_frame = frame(ext_for("RawT", props=props))
            assert send.send_raw(raw_ch, raw_frame, 4, len(raw_frame)) == b""  # type: ignore[arg-type]
            usual_frame = frame(ext_for("UsualT", props=props))
            cmd = decode_frame(usual_frame[4:])
            assert inline(cluster, usual_ch, cmd) is ANSWER_LATER  # type: ignore[arg-type]
            with trio.fail_after(10):
                while len(raw_ch.frames) < 1 or len(usual_ch.frames) < 1:
                    await trio.sleep(0.01)
            await trio.sleep(0.05)  # no second answer comes later
            assert len(raw_ch.frames) == len(usual_ch.frames) == 1
            # Each counted once in the broker's stats.
            assert cluster.broker.context.stats.put_msgs == puts + 2
            return raw_ch.frames[0], usual_ch.frames[0]

        # The topics' first sends are the usual path's (their names are checked there).
        firsts = []
        for topic in ("RawT", "UsualT"):
            first = frame(ext_for(topic, props=UNIQ.format(0)))
            assert send.send_raw(Answers(), first, 4, len(first)) is None  # type: ignore[arg-type]
            firsts.append(Answers())
            assert inline(cluster, firsts[-1], decode_frame(first[4:])) is ANSWER_LATER  # type: ignore[arg-type]
        with trio.fail_after(10):
            while not all(ch.frames for ch in firsts):
                await trio.sleep(0.01)
        for n, props in enumerate(
            [UNIQ.format(1), "TAGS\x01a\x02KEYS\x01k1 k2\x02" + UNIQ.format(2)], start=1
        ):
            got, want = await both(n, props)
            assert got == want and got[0] == ResponseCode.SUCCESS, (got, want)
        # WAIT=false: answered at once, as the usual path answers it.
        no_wait = frame(ext_for("RawT", props="WAIT\x01false\x02" + UNIQ.format(3)))
        out = send.send_raw(Answers(), no_wait, 4, len(no_wait))  # type: ignore[arg-type]
        assert out
        usual_no_wait = frame(ext_for("UsualT", props="WAIT\x01false\x02" + UNIQ.format(3)))
        assert answer_of(out) == await usual(cluster, usual_no_wait)
        assert answer_of(out)[0] == ResponseCode.SUCCESS
        # A sync that hangs: FLUSH_DISK_TIMEOUT, the message stored all the same.
        store.config.sync_flush_timeout = 200
        disk.stuck = True
        try:
            got, want = await both(4, UNIQ.format(4))
        finally:
            disk.stuck = False
            disk.release.set()
        assert got == want and got[0] == ResponseCode.FLUSH_DISK_TIMEOUT, (got, want)
        await store.reput.do_reput()
        raw_records, usual_records = stored(cluster, "RawT"), stored(cluster, "UsualT")
        assert len(raw_records) == 5
        assert raw_records == usual_records


async def test_sync_flush_raw_batches_are_answered_as_the_usual_path(tmp_path) -> None:
    """With SYNC_FLUSH a batch is taken by the raw path too, and answered once its bytes are on
    disk with the usual path's answer (its msgId list, queue offset), the same records."""
    import trio

    async with sync_flush_cluster(tmp_path, "RawT", "UsualT") as cluster:
        send = cluster.broker.send_processor
        answers = {}
        for round_ in range(2):  # the first round checks the topics (the usual path)
            for topic in ("RawT", "UsualT"):
                data = batch_frame(topic, _items(3, TAGS="b"))
                channel = Answers()
                out = send.send_raw(channel, data, 4, len(data)) if topic == "RawT" else None  # type: ignore[arg-type]
                if out is None:
                    assert round_ == 0 or topic == "UsualT"
                    cmd = decode_frame(data[4:])
                    assert inline(cluster, channel, cmd) is ANSWER_LATER  # type: ignore[arg-type]
                else:
                    assert out == RAW_ANSWER_LATER
                with trio.fail_after(10):
                    while not channel.frames:
                        await trio.sleep(0.01)
                answers[round_, topic] = channel.frames
        assert answers[1, "RawT"] == answers[1, "UsualT"]
        assert answers[1, "RawT"][0][0] == ResponseCode.SUCCESS
        await cluster.broker.store.reput.do_reput()
        assert stored(cluster, "RawT") == stored(cluster, "UsualT")
        assert len(stored(cluster, "RawT")) == 6


async def test_sync_flush_answers_each_channel_in_one_call_in_order(tmp_path, monkeypatch) -> None:
    """The group commit writes the raw sends' answers a sync released to a connection in one
    call, in the order they were sent; those that missed syncFlushTimeout likewise, as
    FLUSH_DISK_TIMEOUT, and never again once the disk comes back."""
    import trio

    from tests.helpers import StuckDisk

    disk = StuckDisk(monkeypatch)
    async with sync_flush_cluster(tmp_path, "HeldT") as cluster:
        send = cluster.broker.send_processor
        store = cluster.broker.store
        stats = cluster.broker.context.stats
        count = iter(range(100, 1000))

        def raw(channel: Answers) -> int:
            opaque = next(count)
            ext = ext_for("HeldT", props=UNIQ.format(opaque % 100))
            data = encode(RemotingCommand(310, ext, b"held", opaque, 0))
            assert send.send_raw(channel, data, 4, len(data)) == RAW_ANSWER_LATER  # type: ignore[arg-type]
            return opaque

        first = frame(ext_for("HeldT", props=UNIQ.format(0)))
        assert send.send_raw(Answers(), first, 4, len(first)) is None  # type: ignore[arg-type]
        first_ch = Answers()  # the topic's first send is the usual path's
        assert inline(cluster, first_ch, decode_frame(first[4:])) is ANSWER_LATER  # type: ignore[arg-type]
        with trio.fail_after(10):
            while not first_ch.frames:
                await trio.sleep(0.01)

        async def answered(*channels: Answers, count: int) -> None:
            with trio.fail_after(10):
                while sum(len(ch.frames) for ch in channels) < count:
                    await trio.sleep(0.01)
            await trio.sleep(0.1)  # nothing more comes

        for stuck_past_timeout in (False, True):
            if stuck_past_timeout:
                store.config.sync_flush_timeout = 200
            starter, a, b = Answers(), Answers(), Answers()
            disk.stuck = True
            disk.release.clear()
            entered = disk.entered
            raw(starter)  # begins a sync, which hangs
            with trio.fail_after(10):
                while disk.entered == entered:
                    await trio.sleep(0.01)
            puts = stats.put_msgs
            sent_a = [raw(a) for _ in range(5)]
            sent_b = [raw(b) for _ in range(3)]
            assert stats.put_msgs == puts + 8  # counted once, at the put
            assert a.frames == b.frames == []
            if stuck_past_timeout:
                await answered(a, b, count=8)  # by the deadline, the disk still stuck
                disk.stuck = False
                disk.release.set()
                await answered(starter, count=1)
                code = ResponseCode.FLUSH_DISK_TIMEOUT
            else:
                disk.stuck = False
                disk.release.set()
                await answered(starter, a, b, count=9)
                code = ResponseCode.SUCCESS
            assert a.calls == [5] and b.calls == [3]
            assert [f[3] for f in a.frames] == sent_a and [f[3] for f in b.frames] == sent_b
            assert {f[0] for f in a.frames + b.frames} == {code}
            assert all(f[4] & RPC_TYPE_RESPONSE for f in a.frames + b.frames)
            assert len(starter.frames) == 1 and stats.put_msgs == puts + 8
        await store.reput.do_reput()
        assert len(stored(cluster, "HeldT")) == 1 + 2 * 9


async def test_raw_sends_follow_topic_and_broker_changes(pymq_cluster: Cluster) -> None:
    """send_raw keeps its verdict on a topic's checks only while the topic's config, the
    broker's permission and cluster name stay as they were: after each change the usual path
    answers (and refuses) again."""
    import attrs

    cluster = pymq_cluster
    await topics.create_topic(cluster.namesrv_addr, "Changing", brokers=[cluster.broker_addr])
    send = cluster.broker.send_processor
    tcm = cluster.broker.topic_config_manager
    bc = cluster.broker.broker_config

    def raw(queue_id: int, n: int) -> bytes | None:
        data = frame(ext_for("Changing", queue_id, UNIQ.format(n)))
        return send.send_raw(PEER, data, 4, len(data))  # type: ignore[arg-type]

    first = frame(ext_for("Changing", 0, UNIQ.format(0)))
    assert raw(0, 0) is None  # not yet checked: the usual path's
    await usual(cluster, first)
    assert raw(1, 1) is not None
    config = tcm.select("Changing")
    assert config is not None
    # Fewer queues: queue 3 is out of range now.
    assert raw(3, 2) is not None
    await tcm.update(attrs.evolve(config, write_queue_nums=2, read_queue_nums=2))
    assert raw(3, 3) is None
    assert (await usual(cluster, frame(ext_for("Changing", 3, UNIQ.format(3)))))[0] != 0
    assert raw(1, 4) is not None
    # The topic made read-only: refused by the usual path.
    await tcm.update(attrs.evolve(config, perm=4))
    assert raw(1, 5) is None
    await tcm.update(config)
    assert raw(1, 6) is not None
    # The broker made read-only (updateBrokerConfig brokerPermission=4).
    bc.broker_permission = 4
    try:
        assert raw(1, 7) is None
        code, remark, *_ = await usual(cluster, frame(ext_for("Changing", 1, UNIQ.format(7))))
        assert code == ResponseCode.NO_PERMISSION, remark
    finally:
        bc.broker_permission = 6
    assert raw(1, 8) is not None
    # A cluster named as the topic: sending to it is forbidden.
    name = bc.broker_cluster_name
    bc.broker_cluster_name = "Changing"
    try:
        assert raw(1, 9) is None
    finally:
        bc.broker_cluster_name = name
    assert raw(1, 10) is not None


async def test_a_sync_that_cannot_start_with_the_put_answers_once(tmp_path, monkeypatch) -> None:
    """The group commit's sync begun in the put's step failing (review of 2026-11-27): the
    send is answered once, by the group commit, not also at once with the error."""
    import trio

    from pymq.store import mapped_file_queue

    async with sync_flush_cluster(tmp_path, "Once") as cluster:
        send = cluster.broker.send_processor
        first = frame(ext_for("Once", props=UNIQ.format(0)))
        inline(cluster, Answers(), decode_frame(first[4:]))  # type: ignore[arg-type]
        await trio.sleep(0.2)
        real, failed = mapped_file_queue.MappedFileQueue.begin_flush, []

        def failing(self, syncer):  # type: ignore[no-untyped-def]
            if not failed:
                failed.append(1)
                raise RuntimeError("the sync worker has a job in hand")
            return real(self, syncer)

        monkeypatch.setattr(mapped_file_queue.MappedFileQueue, "begin_flush", failing)
        channel = Answers()
        data = frame(ext_for("Once", props=UNIQ.format(1)))
        assert send.send_raw(channel, data, 4, len(data)) == b""  # type: ignore[arg-type]
        with trio.fail_after(10):
            while not channel.frames:
                await trio.sleep(0.01)
        await trio.sleep(0.3)  # no second answer comes later
        assert failed and len(channel.frames) == 1
        assert channel.frames[0][0] == ResponseCode.SUCCESS
