"""The broker's run handler for sends (SendProcessor.send_run, Channel.raw_run_handler): a run
of frames served together answers, stores and counts exactly what the frames served one by one
(send_raw, else the usual path) do; with SYNC_FLUSH the run's answers are held by the group
commit together; and a frame it has put is never served a second time, whatever fails."""

from __future__ import annotations

import collections
import struct
import time

import pytest
import trio

from pymq.broker.stats import BROKER_PUT_NUMS, TOPIC_PUT_NUMS, TOPIC_PUT_SIZE
from pymq.client import topics
from pymq.common.topic import TIMER_TOPIC
from pymq.embedded import Cluster
from pymq.remoting.channel import ANSWER_LATER
from pymq.remoting.codec import FrameDecoder, decode_frame
from pymq.remoting.codes import ResponseCode
from tests.helpers import send_tier_functions
from tests.integration.test_send_raw import (
    PEER,
    UNIQ,
    Answers,
    _items,
    answer_of,
    batch_frame,
    cpp_frame,
    ext_for,
    frame,
    inline,
    stored,
    sync_flush_cluster,
    usual,
)

native_extension = send_tier_functions()


def split(joined: bytes) -> list[bytes]:
    """Whole frames written back to back, apart."""
    frames, pos = [], 0
    while pos < len(joined):
        (length,) = struct.unpack_from(">i", joined, pos)
        frames.append(joined[pos : pos + 4 + length])
        pos += 4 + length
    return frames


def run_of(frames: list[bytes]) -> tuple[bytes, list[int]]:
    """The frames in one read, and their bounds as Channel gives them (length fields off)."""
    bounds, pos = [], 0
    for data in frames:
        bounds += [pos + 4, pos + len(data)]
        pos += len(data)
    return b"".join(frames), bounds


async def as_channel(
    cluster: Cluster, channel: object, frames: list[bytes]
) -> tuple[list[tuple], int]:
    """The frames served as Channel serves a run: send_run first, the frame it stops at by
    the usual path, the rest by send_raw (else the usual path); the answers in order, and
    the frame send_run stopped at."""
    send = cluster.broker.send_processor
    buf, bounds = run_of(frames)
    joined, left, _ = send.send_run(channel, buf, bounds, 0, len(frames))  # type: ignore[arg-type]
    answers = [answer_of(f) for f in split(joined)]
    for i in range(left, len(frames)):
        out = None if i == left else send.send_raw(channel, buf, bounds[2 * i], bounds[2 * i + 1])  # type: ignore[arg-type]
        answers.append(answer_of(out) if out else await usual(cluster, frames[i]))
    return answers, left


async def one_write(cluster: Cluster, frames: list[bytes]) -> list[tuple]:
    """The frames written to the broker in one write (served as a run, send_run first and
    the frames it leaves by the sends' inline handler), their answers in the order read."""
    _host, port = cluster.broker_addr.rsplit(":", 1)
    answers: list[tuple] = []
    decoder = FrameDecoder()
    async with await trio.open_tcp_stream("127.0.0.1", int(port)) as stream:
        await stream.send_all(b"".join(frames))
        with trio.fail_after(10):
            while len(answers) < len(frames):
                data = await stream.receive_some(65536)
                assert data, "the broker closed the connection"
                answers += [answer_of(cmd) for cmd in decoder.feed(data)]
    return answers


async def one_by_one(cluster: Cluster, frames: list[bytes]) -> list[tuple]:
    send = cluster.broker.send_processor
    answers = []
    for data in frames:
        out = send.send_raw(PEER, data, 4, len(data))  # type: ignore[arg-type]
        answers.append(answer_of(out) if out else await usual(cluster, data))
    return answers


def same_words(answers: list[tuple], topic: str) -> list[tuple]:
    """The answers, refusals (which name the topic) worded for either topic."""
    return [(code, remark and remark.replace(topic, "T"), *rest) for code, remark, *rest in answers]


def cases(topic: str) -> list[bytes]:
    """A run of sends of every kind: plain ones, and among them frames send_run leaves to
    send_raw (batches, a queue chosen by the broker), then from the first that send_raw
    leaves to the usual path (a queue out of range) frames served one by one."""
    return [
        frame(ext_for(topic, props=UNIQ.format(1))),
        frame(ext_for(topic, props="TAGS\x01a\x02KEYS\x01k1 k2\x02" + UNIQ.format(2))),
        frame(ext_for(topic, props=None)),
        frame(ext_for(topic, 3, UNIQ.format(3), h="5", f="0")),
        cpp_frame(topic, UNIQ.format(4), queueId=2, reconsumeTimes=1),
        batch_frame(topic, _items(3)),
        frame(ext_for(topic, props="WAIT\x01false\x02" + UNIQ.format(5))),
        frame(ext_for(topic, props=UNIQ.format(7), j="3", l="16")),
        frame(ext_for(topic, props=UNIQ.format(10))),
        batch_frame(topic, _items(1), j="2"),
        frame(ext_for(topic, props=UNIQ.format(12))),
        frame(ext_for(topic, 2, props=UNIQ.format(14))),
        frame(ext_for(topic, 99, UNIQ.format(6))),
        frame(ext_for(topic, props="A\x01\u00e9\x02" + UNIQ.format(8))),
        frame(ext_for(topic, props="TRAN_MSG\x01true\x02" + UNIQ.format(9))),
        frame(ext_for(topic, props=UNIQ.format(15))),
        frame(ext_for(topic + "Nope", props=UNIQ.format(11))),
        frame(ext_for(topic, props=UNIQ.format(16))),
        frame(ext_for("%RETRY%" + topic, props=UNIQ.format(13))),
        frame(ext_for(topic, props=UNIQ.format(17))),
    ]


async def first_sends(cluster: Cluster, *names: str) -> None:
    """Each topic's first send, which the usual path serves (its name is checked there), and
    a second, which send_raw serves (and judges the topic for the sends after)."""
    send = cluster.broker.send_processor
    for topic in names:
        for n in range(2):
            data = frame(ext_for(topic, props=UNIQ.format(90 + n)))
            channel = Answers()
            out = send.send_raw(channel, data, 4, len(data))  # type: ignore[arg-type]
            if n == 0:
                assert out is None
                cmd = decode_frame(data[4:])
                out = inline(cluster, channel, cmd)  # type: ignore[arg-type]
                if out is not ANSWER_LATER:
                    channel.answer(cmd, out)  # type: ignore[arg-type]
            elif out:
                channel.frames.append(answer_of(out))
            with trio.fail_after(10):
                while not channel.frames:
                    await trio.sleep(0.01)
            assert channel.frames[0][0] == ResponseCode.SUCCESS


async def test_a_run_answers_stores_and_counts_as_its_frames_one_by_one(
    pymq_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = pymq_cluster
    for topic in ("RunT", "OneT"):
        await topics.create_topic(cluster.namesrv_addr, topic, brokers=[cluster.broker_addr])
    await first_sends(cluster, "RunT", "OneT")
    store = cluster.broker.store
    put_together: list[int] = []
    real = store._put_singles  # what put_now does with a SendRun

    def counting(*args: object) -> tuple:
        hints, waits = real(*args)  # type: ignore[arg-type]
        put_together.append(len(hints))
        return hints, waits

    monkeypatch.setattr(store, "_put_singles", counting)
    # The runs' answers are written by send_answer_run, never by the loop it replaced (its
    # fallback when the call fails), which answers each with send_answer_frame.
    from pymq.broker.processors import send as send_module

    framed: list[int] = []
    real_frame = send_module.send_answer_frame
    assert real_frame is not None

    def counting_frame(opaque: int, *rest: object) -> bytes:
        framed.append(opaque)
        return real_frame(opaque, *rest)

    run_answered: list[int] = []
    real_run = send_module._send_answer_run
    assert real_run is not None

    def counting_run(parsed: list, hints: list, *rest: object) -> tuple:
        run_answered.append(len(hints))
        return real_run(parsed, hints, *rest)

    monkeypatch.setattr(send_module, "send_answer_frame", counting_frame)
    monkeypatch.setattr(send_module, "send_answer_frame", counting_frame)  # send_raw's writer
    monkeypatch.setattr(send_module, "_send_answer_run", counting_run)
    got, left = await as_channel(cluster, PEER, cases("RunT"))
    assert left == 12  # the queue out of range: the usual path's
    assert run_answered == [5, 3, 2]
    assert len(framed) == 7  # send_raw's own answers only
    want = await one_by_one(cluster, cases("OneT"))
    for answers in (got, want):  # the half messages of both share one system queue
        answers[14][2].pop("queueOffset")
    assert same_words(got, "RunT") == same_words(want, "OneT")
    # The plain sends were put in runs between the frames left to send_raw.
    assert put_together[:3] == [5, 3, 2], put_together  # then send_raw's, one by one
    await store.reput.do_reput()
    run_records, one_records = stored(cluster, "RunT"), stored(cluster, "OneT")
    assert len(run_records) == 20
    assert run_records == one_records
    stats = cluster.broker.context.stats
    for name in (TOPIC_PUT_NUMS, TOPIC_PUT_SIZE):
        run_item, one_item = stats.items[name]["RunT"], stats.items[name]["OneT"]
        assert (run_item.value, run_item.times) == (one_item.value, one_item.times), name
    # The consume queues have what the records say (dispatch of the run's hints).
    for queue_id in range(4):
        assert store.get_max_offset_in_queue("RunT", queue_id) == store.get_max_offset_in_queue(
            "OneT", queue_id
        )


async def test_a_run_stops_at_a_file_s_end_and_the_rest_is_served(pymq_cluster: Cluster) -> None:
    """A run that reaches the end of the commit log's allocated blocks: the sends before are
    put together, the rest frame by frame (the usual path allocates), nothing lost."""
    cluster = pymq_cluster
    await topics.create_topic(cluster.namesrv_addr, "EdgeT", brokers=[cluster.broker_addr])
    await first_sends(cluster, "EdgeT")
    mf = cluster.broker.store.commitlog.queue.files[-1]
    frames = [frame(ext_for("EdgeT", props=UNIQ.format(i % 100))) for i in range(40)]
    record = 200  # about each record's size
    mf.allocated = min(mf.allocated, mf.wrote_position + 10 * record)  # blocks there are kept
    answers, left = await as_channel(cluster, PEER, frames)
    assert 3 <= left <= 15  # the sends that fit were put together
    assert [a[0] for a in answers] == [ResponseCode.SUCCESS] * 40
    offsets = [int(a[2]["queueOffset"]) for a in answers]
    assert offsets == list(range(2, 42))  # queue 1's, after the first two sends
    await cluster.broker.store.reput.do_reput()
    assert len(stored(cluster, "EdgeT")) == 42


@pytest.mark.parametrize("broken", ["broker stats", "store stats"])
async def test_a_put_run_is_answered_once_whatever_fails_after(
    pymq_cluster: Cluster, monkeypatch: pytest.MonkeyPatch, broken: str
) -> None:
    """A defect after the puts (here the broker's or the store's statistics raising) neither
    serves a frame again (Channel serves a run again from its start when the run handler
    raises) nor leaves one unanswered."""
    cluster = pymq_cluster
    await topics.create_topic(cluster.namesrv_addr, "OnceT", brokers=[cluster.broker_addr])
    await first_sends(cluster, "OnceT")

    def raising(*args: object) -> None:
        raise RuntimeError("stats broke")

    if broken == "broker stats":
        monkeypatch.setattr(cluster.broker.context.stats, "on_put", raising)
    else:
        monkeypatch.setattr(cluster.broker.store.put_stats, "record_quick", raising)
    frames = [frame(ext_for("OnceT", props=UNIQ.format(i))) for i in range(1, 7)]
    buf, bounds = run_of(frames)
    send = cluster.broker.send_processor
    joined, left, _ = send.send_run(PEER, buf, bounds, 0, len(frames))  # type: ignore[arg-type]
    assert left == len(frames)
    answers = [answer_of(f) for f in split(joined)]
    assert [a[0] for a in answers] == [ResponseCode.SUCCESS] * 6
    assert [a[3] for a in answers] == [77] * 6
    await cluster.broker.store.reput.do_reput()
    assert len(stored(cluster, "OnceT")) == 8  # the first two sends and the six, once each


class Joined(Answers):
    """Answers whose held frames may come joined, as Channel.answer_frames writes them."""

    def answer_frames(self, frames: list[bytes]) -> None:
        self.calls.append(len(frames))
        self.frames.extend(answer_of(f) for joined in frames for f in split(joined))


async def test_sync_flush_holds_a_run_s_answers_together(tmp_path, monkeypatch) -> None:
    """With SYNC_FLUSH the run's sends are answered once their bytes are on disk, in one
    write, with the answers the usual path gives (SEND_OK; FLUSH_DISK_TIMEOUT when the sync
    hangs past syncFlushTimeout); a WAIT=false send among them is answered at once."""
    from tests.helpers import StuckDisk

    disk = StuckDisk(monkeypatch)
    async with sync_flush_cluster(tmp_path, "RunT", "OneT") as cluster:
        await first_sends(cluster, "RunT", "OneT")
        store = cluster.broker.store
        send = cluster.broker.send_processor

        def sends(topic: str, base: int) -> list[bytes]:
            return [
                frame(ext_for(topic, props=UNIQ.format(base))),
                frame(ext_for(topic, 2, "TAGS\x01a\x02" + UNIQ.format(base + 1))),
                frame(ext_for(topic, props="WAIT\x01false\x02" + UNIQ.format(base + 2))),
                frame(ext_for(topic, props=UNIQ.format(base + 3))),
                frame(ext_for(topic, 3, UNIQ.format(base + 4))),
            ]

        async def answered(channel: Answers, count: int) -> None:
            with trio.fail_after(10):
                while len(channel.frames) < count:
                    await trio.sleep(0.01)
            await trio.sleep(0.1)  # nothing more comes
            assert len(channel.frames) == count

        for base, stuck in ((10, False), (20, True)):
            if stuck:
                store.config.sync_flush_timeout = 200
                disk.stuck = True
                disk.release.clear()
            run_ch = Joined()
            buf, bounds = run_of(sends("RunT", base))
            joined, left, _ = send.send_run(run_ch, buf, bounds, 0, 5)  # type: ignore[arg-type]
            assert left == 5
            now = [answer_of(f) for f in split(joined)]
            assert [a[2]["queueOffset"] for a in now] == [{10: "3", 20: "6"}[base]]  # WAIT=false
            await answered(run_ch, 4)
            assert run_ch.calls == [1]  # the four held answers in one write
            one_ch = Joined()
            want = []
            for data in sends("OneT", base):
                out = send.send_raw(one_ch, data, 4, len(data))  # type: ignore[arg-type]
                if out:
                    want.append(answer_of(out))
            await answered(one_ch, 4)
            assert same_words(now + run_ch.frames, "RunT") == same_words(
                want + one_ch.frames, "OneT"
            )
            code = ResponseCode.FLUSH_DISK_TIMEOUT if stuck else ResponseCode.SUCCESS
            assert {a[0] for a in run_ch.frames} == {code}
            if stuck:
                disk.stuck = False
                disk.release.set()
        await store.reput.do_reput()
        assert stored(cluster, "RunT") == stored(cluster, "OneT")
        assert len(stored(cluster, "RunT")) == 12


async def test_each_frame_of_a_run_is_read_once(
    pymq_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The frame a run of singles stops at (a batch, a send to a topic not judged yet) is
    served from the fields already read, not read again."""
    from pymq.broker.processors import send as send_module

    cluster = pymq_cluster
    await topics.create_topic(cluster.namesrv_addr, "ReadT", brokers=[cluster.broker_addr])
    await first_sends(cluster, "ReadT")
    reads: list[int] = []
    real, real_run = send_module._send_fields, send_module._send_run_fields
    assert real is not None and real_run is not None

    def counting(buf: bytes, start: int, end: int) -> tuple | None:
        reads.append(start)
        return real(buf, start, end)

    def counting_run(buf: bytes, bounds: list[int], first: int, stop: int, *rest: object) -> tuple:
        i, fields = real_run(buf, bounds, first, stop, *rest)
        # The frames it read: those it added, and the one it stopped at.
        reads.extend(bounds[2 * k] for k in range(first, min(i + 1, stop)))
        return i, fields

    monkeypatch.setattr(send_module, "_send_fields", counting)
    monkeypatch.setattr(send_module, "_send_run_fields", counting_run)
    frames = [
        frame(ext_for("ReadT", props=UNIQ.format(1))),
        batch_frame("ReadT", _items(2)),
        frame(ext_for("ReadT", props=UNIQ.format(2))),
        frame(ext_for("ReadT", props=UNIQ.format(3))),
        batch_frame("ReadT", _items(2)),
        batch_frame("ReadT", _items(2)),
        frame(ext_for("ReadT", props=UNIQ.format(4))),
    ]
    buf, bounds = run_of(frames)
    send = cluster.broker.send_processor
    joined, left, _ = send.send_run(PEER, buf, bounds, 0, len(frames))  # type: ignore[arg-type]
    assert left == len(frames)
    assert [answer_of(f)[0] for f in split(joined)] == [ResponseCode.SUCCESS] * 7
    assert sorted(reads) == bounds[0::2]  # each frame's start, once


def counters(cluster: Cluster, topic: str) -> tuple:
    """What puts count: the store's totals and put times, the broker's totals, its item of
    the cluster and the topic's two items (value and times each)."""
    store, stats = cluster.broker.store, cluster.broker.context.stats
    items = stats.items
    return (
        store.put_message_times_total,
        store.put_message_size_total,
        tuple(store.put_stats.distribution),
        stats.put_msgs,
        stats.put_bytes,
        tuple((item.value, item.times) for item in items[BROKER_PUT_NUMS].values()),
        tuple(
            (items[name][topic].value, items[name][topic].times) if topic in items[name] else None
            for name in (TOPIC_PUT_NUMS, TOPIC_PUT_SIZE)
        ),
    )


def counted(before: tuple, after: tuple) -> tuple:
    """What was counted between two readings of :func:`counters` (the topic items whole)."""
    return (
        after[0] - before[0],
        after[1] - before[1],
        # Puts timed, whatever their time (which bucket depends on the machine's load).
        sum(after[2]) - sum(before[2]),
        after[3] - before[3],
        after[4] - before[4],
        tuple((b[0] - a[0], b[1] - a[1]) for a, b in zip(before[5], after[5], strict=True)),
    )


AMONG_SENDS = {
    "transactional sys flag": lambda t: frame(ext_for(t, props=UNIQ.format(50), f="4")),
    "commit sys flag": lambda t: frame(ext_for(t, props=UNIQ.format(51), f="8")),
    "compressed sys flag": lambda t: frame(ext_for(t, props=UNIQ.format(52), f="1")),
    "delay": lambda t: frame(ext_for(t, props="DELAY\x012\x02" + UNIQ.format(53))),
    "TRAN_MSG": lambda t: frame(ext_for(t, props="TRAN_MSG\x01true\x02" + UNIQ.format(54))),
    "non-ASCII properties": lambda t: frame(ext_for(t, props="A\x01\u00e9\x02" + UNIQ.format(55))),
    "queue out of range": lambda t: frame(ext_for(t, 99, UNIQ.format(56))),
    "unknown topic": lambda t: frame(ext_for(t + "Nope", props=UNIQ.format(57))),
    "retry topic": lambda t: frame(ext_for("%RETRY%" + t, props=UNIQ.format(58))),
    "schedule topic": lambda t: frame(ext_for("SCHEDULE_TOPIC_XXXX", props=UNIQ.format(59))),
    "WAIT=false": lambda t: frame(ext_for(t, props="WAIT\x01false\x02" + UNIQ.format(60))),
    "batch": lambda t: batch_frame(t, _items(2)),
    "oneway": lambda t: frame(ext_for(t, props=UNIQ.format(61)), flag=2),
    "reconsumed": lambda t: frame(ext_for(t, props=UNIQ.format(62), j="99999")),
    "C++ client": lambda t: cpp_frame(t, UNIQ.format(63)),
}


@pytest.mark.parametrize("kind", sorted(AMONG_SENDS))
async def test_any_frame_among_sends_is_served_as_one_by_one(
    pymq_cluster: Cluster, kind: str
) -> None:
    """Each kind of frame in the middle of a run of plain sends: the answers, records and
    counts are those of the frames one by one."""
    cluster = pymq_cluster
    for topic in ("RunT", "OneT"):
        await topics.create_topic(cluster.namesrv_addr, topic, brokers=[cluster.broker_addr])
    await first_sends(cluster, "RunT", "OneT")

    def run(topic: str) -> list[bytes]:
        return [
            frame(ext_for(topic, props=UNIQ.format(1))),
            frame(ext_for(topic, 2, props=UNIQ.format(2))),
            AMONG_SENDS[kind](topic),
            frame(ext_for(topic, props=UNIQ.format(3))),
            frame(ext_for(topic, 3, props=UNIQ.format(4))),
        ]

    before = counters(cluster, "RunT")
    got, _ = await as_channel(cluster, PEER, run("RunT"))
    between = counters(cluster, "RunT")
    want = await one_by_one(cluster, run("OneT"))
    after = counters(cluster, "OneT")
    if kind in ("delay", "TRAN_MSG", "transactional sys flag", "schedule topic"):
        for answers in (got, want):  # in one system queue, one after the other
            answers[2][2].pop("queueOffset", None)
    assert same_words(got, "RunT") == same_words(want, "OneT")
    assert counted(before, between) == counted(between, after)
    assert between[6] == after[6]  # the topics' items
    await cluster.broker.store.reput.do_reput()
    assert stored(cluster, "RunT") == stored(cluster, "OneT")


@pytest.mark.parametrize(
    "change",
    ["broker permission", "topic permission", "topic queues", "cluster", "read only",
     "disk full", "reput blocked"],
)  # fmt: skip
async def test_a_run_rechecks_what_changed_since_a_topic_was_judged(
    pymq_cluster: Cluster, change: str
) -> None:
    """The verdicts send_raw keeps per topic are checked against the broker's state for
    each frame of a run, as send_raw checks them: a change since refuses or redirects the
    run's sends as it does the sends one by one."""
    from pymq.common.topic import PERM_READ, TopicConfig

    cluster = pymq_cluster
    for topic in ("RunT", "OneT"):
        await topics.create_topic(cluster.namesrv_addr, topic, brokers=[cluster.broker_addr])
    await first_sends(cluster, "RunT", "OneT")
    bc, store = cluster.broker.broker_config, cluster.broker.store
    manager = cluster.broker.context.topic_config_manager
    if change == "broker permission":
        bc.broker_permission = PERM_READ
    elif change == "topic permission":
        for topic in ("RunT", "OneT"):
            await manager.update(TopicConfig(topic, 4, 4, PERM_READ))
    elif change == "topic queues":
        for topic in ("RunT", "OneT"):
            await manager.update(TopicConfig(topic, 2, 2))
    elif change == "cluster":
        bc.broker_cluster_name = "OtherCluster"
    elif change == "read only":
        store.read_only = True
    elif change == "disk full":
        store.clean_commitlog.disk_full = True
    elif change == "reput blocked":
        store.reput.blocked = OSError(28, "No space left on device")

    def run(topic: str) -> list[bytes]:
        return [frame(ext_for(topic, 2, props=UNIQ.format(i))) for i in range(30, 34)]

    got, _ = await as_channel(cluster, PEER, run("RunT"))
    want = await one_by_one(cluster, run("OneT"))
    assert same_words(got, "RunT") == same_words(want, "OneT")
    store.read_only, store.clean_commitlog.disk_full, store.reput.blocked = False, False, None
    await store.reput.do_reput()
    assert stored(cluster, "RunT") == stored(cluster, "OneT")


async def test_a_stalled_put_in_a_run_is_timed_as_one_by_one(
    pymq_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A put of the run held up past osPageCacheBusyTimeOutMills marks the page cache busy
    and is counted as one slow put among quick ones, as it is one by one (fast failure
    reads both)."""
    import time

    cluster = pymq_cluster
    store = cluster.broker.store
    for topic in ("RunT", "OneT"):
        await topics.create_topic(cluster.namesrv_addr, topic, brokers=[cluster.broker_addr])
    await first_sends(cluster, "RunT", "OneT")
    store.config.os_page_cache_busy_time_out_mills = 100
    real, reads = store.commitlog.clock_ms, [0]

    def stalling() -> int:  # the third put's time read 150 ms late
        reads[0] += 1
        if reads[0] == 3:
            time.sleep(0.15)
        return real()

    monkeypatch.setattr(store.commitlog, "clock_ms", stalling)
    seen = []
    for topic, serve in (("RunT", as_channel), ("OneT", None)):
        reads[0] = 0
        store.os_page_cache_busy_mark = -1.0
        before = list(store.put_stats.distribution)
        frames = [frame(ext_for(topic, props=UNIQ.format(i))) for i in range(6)]
        if serve is not None:
            await serve(cluster, PEER, frames)
        else:
            await one_by_one(cluster, frames)
        counts = [b - a for a, b in zip(before, store.put_stats.distribution, strict=True)]
        seen.append((store.os_page_cache_busy_mark > 0, counts))
    assert seen[0] == seen[1]
    assert seen[0][0] and seen[0][1][0] == 5 and sum(seen[0][1]) == 6


async def test_a_run_s_appends_stand_when_their_bookkeeping_fails(
    pymq_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit log's bookkeeping after a run's appends (the write advice, the chunk ahead)
    failing: the run is answered and stored once, its records dispatched by reading them back."""
    cluster = pymq_cluster
    await topics.create_topic(cluster.namesrv_addr, "BookT", brokers=[cluster.broker_addr])
    await first_sends(cluster, "BookT")
    commitlog = cluster.broker.store.commitlog

    def raising(*args: object) -> None:
        raise RuntimeError("advice broke")

    monkeypatch.setattr(commitlog, "_wrote_through_map", raising)
    frames = [frame(ext_for("BookT", props=UNIQ.format(i))) for i in range(1, 6)]
    buf, bounds = run_of(frames)
    joined, left, _ = cluster.broker.send_processor.send_run(PEER, buf, bounds, 0, 5)  # type: ignore[arg-type]
    assert left == 5
    assert [answer_of(f)[0] for f in split(joined)] == [ResponseCode.SUCCESS] * 5
    await cluster.broker.store.reput.do_reput()
    assert len(stored(cluster, "BookT")) == 7  # the first two sends and the five, once each
    assert cluster.broker.store.get_max_offset_in_queue("BookT", 1) == 7


async def test_frames_left_to_the_general_path_are_read_once_each(
    pymq_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of sends the store leaves to the general path one after another (timer
    messages: the C put leaves their rewrite to Python) is read once a frame (and once more by
    send_raw's read of a frame alone), not again from each frame to the run's end; and the
    plain frames after them are a run again."""
    from pymq.broker.processors import send as send_module

    cluster = pymq_cluster
    await topics.create_topic(cluster.namesrv_addr, "LeftT", brokers=[cluster.broker_addr])
    await first_sends(cluster, "LeftT")
    reads: list[bytes] = []  # the frames read, by their bytes (each is unique)
    real, real_run = send_module._send_fields, send_module._send_run_fields
    assert real is not None and real_run is not None

    def counting(buf: bytes, start: int, end: int) -> tuple | None:
        reads.append(bytes(buf[start:end]))
        return real(buf, start, end)

    def counting_run(buf: bytes, bounds: list[int], first: int, stop: int, *rest: object) -> tuple:
        i, fields = real_run(buf, bounds, first, stop, *rest)
        reads.extend(
            bytes(buf[bounds[2 * k] : bounds[2 * k + 1]]) for k in range(first, min(i + 1, stop))
        )
        return i, fields

    monkeypatch.setattr(send_module, "_send_fields", counting)
    monkeypatch.setattr(send_module, "_send_run_fields", counting_run)
    due = int(time.time() * 1000) + 3_600_000
    timers = [
        frame(ext_for("LeftT", props=f"TIMER_DELIVER_MS\x01{due}\x02" + UNIQ.format(n)))
        for n in range(64)
    ]
    plain = [frame(ext_for("LeftT", props=UNIQ.format(100 + n))) for n in range(3)]
    answers = await one_write(cluster, timers + plain)
    assert [a[0] for a in answers] == [ResponseCode.SUCCESS] * 67
    await cluster.broker.store.reput.do_reput()
    assert cluster.broker.store.get_max_offset_in_queue(TIMER_TOPIC, 0) == 64
    assert max(collections.Counter(reads).values()) <= 2  # was up to 64 (read 2275 times)


async def test_a_transactions_halves_are_built_as_messages_without_a_one_call_try(
    pymq_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of a transaction's halves (sys flag PREPARED, TRAN_MSG=true): each is put as the
    half record the general path builds, stored in the half topic with the real topic and
    queue in its properties, and the store is asked for no SingleSend of it first (the
    one-call put stops at a transaction's flags: asking cost every half an encoder call)."""
    from pymq.common.topic import RMQ_SYS_TRANS_HALF_TOPIC
    from pymq.store.results import SingleSend

    cluster = pymq_cluster
    await topics.create_topic(cluster.namesrv_addr, "HalfT", brokers=[cluster.broker_addr])
    await first_sends(cluster, "HalfT")
    store = cluster.broker.store
    asked: list[type] = []
    real_put_now = store.put_now

    def recording(request: object) -> object:
        asked.append(type(request))
        return real_put_now(request)  # type: ignore[call-overload]

    monkeypatch.setattr(store, "put_now", recording)
    halves = [
        frame(ext_for("HalfT", n % 4, props="TRAN_MSG\x01true\x02PGROUP\x01G\x02" + UNIQ.format(n),
                      f="4"))
        for n in range(6)
    ]  # fmt: skip
    answers = await one_write(cluster, halves)
    assert [a[0] for a in answers] == [ResponseCode.SUCCESS] * len(halves)
    assert SingleSend not in asked and len(asked) == len(halves)
    kept = stored(cluster, RMQ_SYS_TRANS_HALF_TOPIC)
    assert [(m[3]["REAL_TOPIC"], m[3]["REAL_QID"]) for m in kept] == [
        ("HalfT", str(n % 4)) for n in range(6)
    ]
