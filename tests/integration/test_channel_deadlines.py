"""The plain-socket reader's deadlines (Channel._reader_raw and Channel._watch_deadlines): the
idle and frame deadlines end a waiting reader, never a busy one mid-run, and never a connection
that is reading."""

from __future__ import annotations

import itertools
import logging
import math
import socket
import struct

import trio
import trio.testing

from pymq.remoting.channel import Channel
from pymq.remoting.client import RemotingClient
from pymq.remoting.codec import RPC_ONEWAY, FrameDecoder, RemotingCommand, encode
from pymq.remoting.limits import ConnectionLimits, SharedBudget
from pymq.remoting.server import RemotingServer

ONEWAY, ECHO = 3001, 3002


def frame(code: int, opaque: int, *, oneway: bool = False, **ext: str) -> bytes:
    cmd = RemotingCommand.request(code, ext)
    cmd.opaque = opaque
    if oneway:
        cmd.flag |= RPC_ONEWAY
    return encode(cmd)


class NeverShed:
    """An admission check that reads ahead after every run (its wait limit is 0) and refuses
    nothing: only the broker's read-ahead path is wanted."""

    def __init__(self) -> None:
        ticks = itertools.count()
        self.clock = lambda: next(ticks) * 0.001  # moves at every read, so each run "waited"

    @property
    def min_wait(self) -> float:
        return 0.0

    @property
    def busy_mark(self) -> float:
        return -math.inf

    def shed(self, channel, request, received, waited, queued):
        return None

    def shed_remark(self, code: int, received: float, waited: float, queued: int) -> None:
        return None

    def note_shed(self, code: int, count: int, remark: str) -> None:
        raise AssertionError("nothing is shed")


def read_answers(sock: socket.socket, count: int) -> list[RemotingCommand]:
    decoder = FrameDecoder()
    got: list[RemotingCommand] = []
    while len(got) < count:
        data = sock.recv(65536)
        if not data:
            break
        got.extend(decoder.feed(data))
    return got


async def test_reading_ahead_counts_as_reading_for_the_idle_deadline(
    nursery: trio.Nursery, mock_clock: trio.testing.MockClock
) -> None:
    """A broker falling behind reads ahead between runs and may not come back to its wait for a
    long time; those reads are reads: a connection streaming oneway requests (no answers, so
    no writes either) for longer than the idle timeout is not closed as idle."""
    bursts, per_burst = 8, 80  # 80 frames: three runs, so that each burst is read ahead
    client: socket.socket | None = None  # connected below
    served = 0

    def burst(k: int) -> bytes:
        return b"".join(
            frame(ONEWAY, k * per_burst + i, oneway=True, first=str(i == 0))
            for i in range(per_burst)
        )

    def oneway(channel: Channel, req: RemotingCommand) -> RemotingCommand:
        nonlocal served
        served += 1
        if req.ext_fields["first"] == "True":
            k = req.opaque // per_burst
            if k + 1 < bursts:
                assert client is not None
                client.sendall(burst(k + 1))  # read ahead by the end of this run
            mock_clock.jump(30)  # 8 bursts: 240 s of steady reading, idle timeout 120 s
        return req.response()

    def echo(channel: Channel, req: RemotingCommand) -> RemotingCommand:
        return req.response()

    closed: list[Channel] = []
    server = RemotingServer(
        host="127.0.0.1", port=0, idle_timeout=120, on_channel_closed=closed.append
    )
    server.admission = NeverShed()
    server.register(ONEWAY, _no_task, inline=oneway)
    server.register(ECHO, _no_task, inline=echo)
    await nursery.start(server.run)
    client = socket.create_connection(("127.0.0.1", server.port))
    try:
        client.sendall(burst(0))
        with trio.fail_after(1000):  # mock time: the handler moves it 240 s in all
            while served < bursts * per_burst:
                await trio.sleep(0)
        await trio.testing.wait_all_tasks_blocked()
        assert not closed, closed[0].close_reason
        client.sendall(frame(ECHO, 10**6))
        await trio.testing.wait_all_tasks_blocked()
        client.settimeout(5)
        answers = await trio.to_thread.run_sync(read_answers, client, 1)
        assert [a.opaque for a in answers] == [10**6]
        assert not closed
    finally:
        client.close()


async def _no_task(channel: Channel, req: RemotingCommand) -> RemotingCommand:
    raise AssertionError("served inline")


def _ten_second_frames(closed: list[Channel]) -> RemotingServer:
    """A server whose frames must complete within 10 s, its closed channels kept in ``closed``."""
    return RemotingServer(
        host="127.0.0.1",
        port=0,
        limits=ConnectionLimits(frame_receive_timeout=10.0),
        on_channel_closed=closed.append,
    )


async def test_the_frame_deadline_is_each_frames_own(
    nursery: trio.Nursery, mock_clock: trio.testing.MockClock
) -> None:
    """frame_receive_timeout bounds one frame: a peer streaming frames whose reads each end
    in the middle of the next one (pipelined sends, large messages) completes every frame well
    within the deadline and is not closed, however long it streams.  A frame that then stalls
    is closed at its own deadline."""
    closed: list[Channel] = []
    served: list[int] = []

    def echo(channel: Channel, req: RemotingCommand) -> RemotingCommand:
        served.append(req.opaque)
        return req.response()

    server = _ten_second_frames(closed)
    server.register(ECHO, _no_task, inline=echo)
    await nursery.start(server.run)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    frames = [frame(ECHO, n, oneway=True, pad="x" * 100) for n in range(12)]
    await stream.send_all(frames[0][:50])
    for n in range(1, 12):  # each send ends frame n - 1 and begins frame n: 6 s apart
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(6)
        await trio.testing.wait_all_tasks_blocked()
        assert not closed, closed[0].close_reason
        await stream.send_all(frames[n - 1][50:] + frames[n][:50])
    await trio.testing.wait_all_tasks_blocked()
    assert served == list(range(11))
    mock_clock.jump(9)  # frame 11 stalls: closed 10 s after it began (noticed within 10 / 8)
    await trio.testing.wait_all_tasks_blocked()
    assert not closed, closed[0].close_reason
    mock_clock.jump(1 + 10 / 8)
    with trio.fail_after(5):
        assert await stream.receive_some(10) == b""
    await trio.testing.wait_all_tasks_blocked()
    assert len(closed) == 1 and "frame not completed" in (closed[0].close_reason or "")
    await stream.aclose()


async def test_a_deadline_passing_mid_run_ends_the_connection_after_the_run(
    nursery: trio.Nursery, mock_clock: trio.testing.MockClock
) -> None:
    """The deadline watch never cancels a busy reader: a frame deadline that passes while the
    reader serves a read's frames (two runs here) lets it finish them, every answer written and
    every run's hooks closed, and only then closes the connection."""
    events: list[str] = []
    closed: list[Channel] = []

    def echo(channel: Channel, req: RemotingCommand) -> RemotingCommand:
        if req.opaque == 0:
            mock_clock.jump(11)  # past the unfinished frame's deadline, mid-run
        return req.response()

    server = _ten_second_frames(closed)
    server.run_hooks = (lambda: events.append("begin"), lambda: events.append("end"))
    server.register(ECHO, _no_task, inline=echo)
    await nursery.start(server.run)
    sock = socket.create_connection(("127.0.0.1", server.port))
    try:
        unfinished = frame(ECHO, 99)[:20]
        sock.sendall(b"".join(frame(ECHO, n) for n in range(40)) + unfinished)
        with trio.fail_after(1000):  # mock time: the handler moves it 11 s
            while not closed:
                await trio.sleep(0)
        sock.settimeout(5)
        answers = await trio.to_thread.run_sync(read_answers, sock, 41)
    finally:
        sock.close()
    assert [a.opaque for a in answers] == list(range(40))
    assert events == ["begin", "end"] * 2
    assert "frame not completed" in (closed[0].close_reason or "")


async def test_a_frame_held_by_the_budget_is_closed_with_one_log_line(
    nursery: trio.Nursery, mock_clock: trio.testing.MockClock, caplog
) -> None:
    """A frame whose reading is held because the server's partial-frame budget is spent times
    out like any other: the connection closes at its deadline, logged once."""
    closed: list[Channel] = []
    server = RemotingServer(
        host="127.0.0.1",
        port=0,
        limits=ConnectionLimits(frame_receive_timeout=10.0),
        budget=SharedBudget(partial_frame_total_max=64),
        on_channel_closed=closed.append,
    )
    await nursery.start(server.run)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(struct.pack(">i", 1000) + b"x" * 200)  # over the budget: held
    await trio.testing.wait_all_tasks_blocked()
    # The reader polls the budget every BUDGET_POLL_INTERVAL (0.05 s); the watch wakes at the
    # frame's deadline, 10 s: first the watch alone (10.01 s), then the reader's poll (10.04 s).
    for step in (9.99, 0.02, 0.1):
        mock_clock.jump(step)
        await trio.testing.wait_all_tasks_blocked()
    with trio.fail_after(5):
        assert await stream.receive_some(10) == b""
    await trio.testing.wait_all_tasks_blocked()
    assert len(closed) == 1 and "frame not completed" in (closed[0].close_reason or "")
    lines = [r for r in caplog.records if "frame not completed" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    await stream.aclose()


async def test_a_peer_that_closes_or_resets_ends_its_connection_quietly(
    nursery: trio.Nursery, caplog
) -> None:
    """EOF and RST while the reader waits: the connection closes with the reason, no error
    is logged, and the server goes on serving."""
    closed: list[Channel] = []
    server = RemotingServer(host="127.0.0.1", port=0, on_channel_closed=closed.append)
    server.register(ECHO, _no_task, inline=lambda channel, req: req.response())
    await nursery.start(server.run)

    async def round_trip() -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(frame(ECHO, 1))
        sock.settimeout(5)
        assert [a.opaque for a in await trio.to_thread.run_sync(read_answers, sock, 1)] == [1]
        await trio.testing.wait_all_tasks_blocked()  # the reader waits again
        return sock

    (await round_trip()).close()  # FIN
    reset = await round_trip()
    reset.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    reset.close()  # RST
    with trio.fail_after(5):
        while len(closed) < 2:
            await trio.sleep(0.01)
    assert closed[0].close_reason == "peer closed the connection"
    assert (closed[1].close_reason or "").startswith("connection lost")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    (await round_trip()).close()


async def test_a_connection_without_an_idle_timeout_stays_open(
    nursery: trio.Nursery, mock_clock: trio.testing.MockClock
) -> None:
    """With no idle timeout (a client's connections) the deadline watch closes nothing,
    however long nothing happens."""
    server = RemotingServer(host="127.0.0.1", port=0)
    server.register(ECHO, _no_task, inline=lambda channel, req: req.response())
    await nursery.start(server.run)
    client = RemotingClient(nursery)
    channel = await client.channel(f"127.0.0.1:{server.port}")
    for _ in range(3):
        mock_clock.jump(10_000)
        await trio.testing.wait_all_tasks_blocked()
    assert not channel.closed and all(not c.closed for c in server.channels)
    response = await channel.invoke(RemotingCommand.request(ECHO), timeout=5)
    assert response.code == 0


async def test_a_reader_paused_for_a_peer_that_does_not_read_ends_at_the_idle_deadline(
    nursery: trio.Nursery, mock_clock: trio.testing.MockClock, caplog
) -> None:
    """A peer that sends requests and reads none of their answers: the reader pauses above the
    high-water mark, nothing is read or written, and the idle deadline (before the write-stall
    one here) closes the connection, logged once, instead of the held reader waiting on."""
    caplog.set_level(logging.INFO, logger="pymq.remoting.channel")
    closed: list[Channel] = []
    body = b"x" * (1 << 20)

    def big(channel: Channel, req: RemotingCommand) -> RemotingCommand:
        return req.response(body=body)

    server = RemotingServer(
        host="127.0.0.1",
        port=0,
        idle_timeout=10,
        limits=ConnectionLimits(
            write_high_water_mark=1 << 20, write_low_water_mark=1 << 19, write_stall_timeout=60
        ),
        on_channel_closed=closed.append,
    )
    server.register(ECHO, _no_task, inline=big)
    await nursery.start(server.run)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    try:
        sock.sendall(b"".join(frame(ECHO, n) for n in range(40)))  # 40 MiB of answers
        await trio.testing.wait_all_tasks_blocked()
        (channel,) = server.channels
        assert channel._out.paused_since is not None  # the reader is held
        for step in (9, 2, 0.1, 0.1):
            mock_clock.jump(step)
            await trio.testing.wait_all_tasks_blocked()
        assert closed and closed[0].close_reason == "idle for 10 s"
        lines = [r for r in caplog.records if r.levelno >= logging.INFO and "closing" in r.msg]
        assert len(lines) == 1, [r.getMessage() for r in lines]
    finally:
        sock.close()
