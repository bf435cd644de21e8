"""The Trio server and client shells over real loopback sockets."""

from __future__ import annotations

import gc
import struct

import pytest
import trio
import trio.testing

from pymq.remoting.channel import ANSWER_LATER, Channel
from pymq.remoting.client import RemotingClient
from pymq.remoting.codec import RemotingCommand, encode, next_opaque
from pymq.remoting.codes import ResponseCode, SerializeType
from pymq.remoting.connection import Call
from pymq.remoting.errors import RemotingConnectError, RemotingTimeoutError
from pymq.remoting.limits import ConnectionLimits
from pymq.remoting.server import RemotingServer
from tests.helpers import answers_of_one_write

SLOW, FAST, DROP, BOOM, SILENT = 1001, 1002, 1003, 1004, 1005


@pytest.fixture
async def server(nursery: trio.Nursery) -> RemotingServer:
    release = trio.Event()
    server = RemotingServer(host="127.0.0.1", port=0, name="test")
    server.release = release  # type: ignore[attr-defined]

    async def slow(channel: Channel, req: RemotingCommand) -> RemotingCommand:
        await release.wait()
        return req.response(ext_fields={"who": "slow"})

    async def fast(channel: Channel, req: RemotingCommand) -> RemotingCommand:
        return req.response(ext_fields={"who": "fast", "echo": req.ext_fields.get("x")})

    async def drop(channel: Channel, req: RemotingCommand) -> RemotingCommand:
        channel.close("dropped on purpose")
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def boom(channel: Channel, req: RemotingCommand) -> RemotingCommand:
        raise RuntimeError("processor failed")

    async def silent(channel: Channel, req: RemotingCommand) -> RemotingCommand:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    for code, handler in [(SLOW, slow), (FAST, fast), (DROP, drop), (BOOM, boom), (SILENT, silent)]:
        server.register(code, handler)
    await nursery.start(server.run)
    return server


def addr(server: RemotingServer) -> str:
    return f"127.0.0.1:{server.port}"


async def test_requests_on_one_connection_are_served_concurrently(
    server: RemotingServer, client: RemotingClient
) -> None:
    channel = await client.channel(addr(server))
    results: dict[str, str] = {}

    async def call(code: int, key: str) -> None:
        response = await channel.invoke(RemotingCommand.request(code), timeout=10)
        results[key] = response.ext_fields["who"]

    async with trio.open_nursery() as n:
        n.start_soon(call, SLOW, "slow")
        await trio.testing.wait_all_tasks_blocked()
        # The held request does not block the fast one on the same socket.
        await call(FAST, "fast")
        assert results == {"fast": "fast"}
        server.release.set()  # type: ignore[attr-defined]
    assert results == {"fast": "fast", "slow": "slow"}


async def test_many_calls_in_flight_are_matched_by_opaque(
    server: RemotingServer, client: RemotingClient
) -> None:
    answers: dict[int, str] = {}

    async def call(i: int) -> None:
        request = RemotingCommand.request(FAST, {"x": i})
        answers[i] = (await client.invoke(addr(server), request)).ext_fields["echo"]

    async with trio.open_nursery() as n:
        for i in range(200):
            n.start_soon(call, i)
    assert answers == {i: str(i) for i in range(200)}
    assert len(server.channels) == 1  # one connection per address, reused


async def test_dead_connection_fails_pending_calls_at_once(
    server: RemotingServer, client: RemotingClient
) -> None:
    with trio.fail_after(2):  # far less than the call's own timeout
        with pytest.raises(RemotingConnectError, match="closed"):
            await client.invoke(addr(server), RemotingCommand.request(DROP), timeout=60)
    # The client reconnects for the next call.
    response = await client.invoke(addr(server), RemotingCommand.request(FAST))
    assert response.code == ResponseCode.SUCCESS


async def test_timeout_and_handler_errors(server: RemotingServer, client: RemotingClient) -> None:
    with pytest.raises(RemotingTimeoutError):
        await client.invoke(addr(server), RemotingCommand.request(SILENT), timeout=0.2)
    failed = await client.invoke(addr(server), RemotingCommand.request(BOOM))
    assert failed.code == ResponseCode.SYSTEM_ERROR
    assert "processor failed" in failed.remark
    unknown = await client.invoke(addr(server), RemotingCommand.request(4242))
    assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED


async def test_binary_request_gets_binary_answer(
    server: RemotingServer, client: RemotingClient
) -> None:
    request = RemotingCommand.request(FAST, {"x": "binary"})
    request.serialize_type = SerializeType.ROCKETMQ
    response = await client.invoke(addr(server), request)
    assert response.serialize_type == SerializeType.ROCKETMQ
    assert response.ext_fields == {"who": "fast", "echo": "binary"}


INLINE = 1006
RUN = 1008


@pytest.mark.parametrize("fails", [False, True])
async def test_a_raw_run_handler_answers_a_runs_lead_in_order(
    server: RemotingServer, fails: bool
) -> None:
    """A run handler (its code's route) answers the leading frames of a run in one call; the
    frame it leaves (another code) is decoded and served as usual (inline here), then it is
    offered the next frame alone and, once it serves one, the rest; once it has left two
    frames in a row, the rest of the run is decoded and served as usual without it (a task
    here): the answers in the requests' order, no frame read again and again up to the
    run's end.  One that raises has the rest of the run served frame by frame from where
    that call began, every request answered once."""
    from pymq.remoting.codec import RPC_TYPE_RESPONSE, decode_frame_at

    runs: list[tuple[int, int]] = []

    def run_handler(
        channel: Channel,
        buf: bytes,
        bounds: list[int],
        first: int,
        stop: int,
        check: object = None,
    ) -> tuple[bytes, int, RemotingCommand | None]:
        runs.append((first, stop))
        answers = []
        i = first
        while i < stop:
            request = decode_frame_at(buf, bounds[2 * i], bounds[2 * i + 1])
            if request.code != RUN:
                break
            answer = request.response(ext_fields={"who": "run"})
            answer.opaque, answer.flag = request.opaque, answer.flag | RPC_TYPE_RESPONSE
            answers.append(encode(answer))
            i += 1
        if fails:
            raise RuntimeError("a bug in the run handler")
        return b"".join(answers), i, None

    async def task(channel: Channel, req: RemotingCommand) -> RemotingCommand:
        if req.code == RUN:  # the run handler failed: its frames are served by tasks
            return req.response(ext_fields={"who": "task"})
        raise AssertionError("served inline")

    def inline(channel: Channel, req: RemotingCommand) -> RemotingCommand:
        return req.response(ext_fields={"who": "inline"})

    server.register(INLINE, task, inline=inline)
    server.register(RUN, task, run=run_handler)
    kinds = ["raw", "raw", "usual", "raw", "usual", "raw", "usual", "usual", "raw", "raw"]
    codes = {"raw": RUN, "usual": INLINE}
    requests = [RemotingCommand.request(codes[kind], {"x": kind}) for kind in kinds]
    answers = await answers_of_one_write(server.port, requests)
    in_turn = [a.opaque for a in answers][:8]  # those answered in the reader, in turn
    answers.sort(key=lambda a: a.opaque)  # each once; tasks answer when they are done
    assert [a.opaque for a in answers] == [r.opaque for r in requests]
    who = [a.ext_fields["who"] for a in answers]
    if fails:
        assert who == ["task", "task", "inline", "task", "inline", "task", "inline", "inline",
                       "task", "task"]  # fmt: skip
        assert runs[0] == (0, len(kinds))
    else:
        # After a frame it left, the next alone; after one it served alone, the rest; after
        # two left in a row, none: the last two are decoded and served by tasks.
        assert who == ["run", "run", "inline", "run", "inline", "run", "inline", "inline",
                       "task", "task"]  # fmt: skip
        assert runs == [(0, 10), (3, 4), (4, 10), (5, 6), (6, 10), (7, 8)]
        assert in_turn == [r.opaque for r in requests][:8]


@pytest.mark.parametrize("between", [0, 1])
async def test_frames_a_run_handler_leaves_are_not_read_again_to_the_runs_end(
    server: RemotingServer, between: int
) -> None:
    """A run handler that reads the run's leading frames of its code before it judges them
    (as the sends' handler does) and leaves each (a transaction's half, say: a task serves
    it), with or without other frames between them: each frame is read at most twice, not
    again up to the run's end after each one left (quadratic in the run's length)."""
    from pymq.remoting.codec import decode_frame_at

    reads = 0

    def run_handler(
        channel: Channel,
        buf: bytes,
        bounds: list[int],
        first: int,
        stop: int,
        check: object = None,
    ) -> tuple[bytes, int, RemotingCommand | None]:
        nonlocal reads
        i = first
        while i < stop:  # read ahead, then judge the first: each one is left
            reads += 1
            if decode_frame_at(buf, bounds[2 * i], bounds[2 * i + 1]).code != RUN:
                break
            i += 1
        return b"", first, None

    async def task(channel: Channel, req: RemotingCommand) -> RemotingCommand:
        return req.response(ext_fields={"who": "task"})

    def inline(channel: Channel, req: RemotingCommand) -> RemotingCommand:
        return req.response(ext_fields={"who": "inline"})

    server.register(INLINE, task, inline=inline)
    server.register(RUN, task, run=run_handler)
    codes = [RUN, *[INLINE] * between] * 40
    requests = [RemotingCommand.request(code, {"x": "y"}) for code in codes]
    answers = await answers_of_one_write(server.port, requests)
    assert sorted(a.opaque for a in answers) == sorted(r.opaque for r in requests)
    assert reads <= 2 * len(requests)


async def test_a_run_handler_stopping_outside_its_run_is_not_believed(
    server: RemotingServer,
) -> None:
    def run_handler(
        channel: Channel,
        buf: bytes,
        bounds: list[int],
        first: int,
        stop: int,
        check: object = None,
    ) -> tuple[bytes, int, RemotingCommand | None]:
        return b"", stop + 1, None  # claims a frame the run does not have

    server.register(FAST, server.routes[FAST].handler, run=run_handler)
    requests = [RemotingCommand.request(FAST, {"x": str(i)}) for i in range(3)]
    answers = await answers_of_one_write(server.port, requests)
    assert sorted(a.ext_fields["echo"] for a in answers) == ["0", "1", "2"]


async def test_flagged_oneway_gets_no_answer(server: RemotingServer) -> None:
    async with trio.open_nursery() as n:
        seen: list[int] = []
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        channel = Channel(stream)
        place = channel.state.place

        def record(cmd: RemotingCommand) -> object:
            if cmd.flag & 1:  # a response
                seen.append(cmd.opaque)
            return place(cmd)

        channel.state.place = record  # type: ignore[method-assign]
        n.start_soon(channel.run)
        await channel.invoke_oneway(RemotingCommand.request(FAST))
        answered = await channel.invoke(RemotingCommand.request(FAST), timeout=5)
        assert answered.code == ResponseCode.SUCCESS
        channel.close()
    # The one response that came back is the second request's; the oneway got none.
    assert seen == [answered.opaque]


async def test_connect_failure_is_a_clear_error(client: RemotingClient) -> None:
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound but not listening: connection refused
        with pytest.raises(RemotingConnectError, match=f"127.0.0.1:{port}"):
            await client.invoke(f"127.0.0.1:{port}", RemotingCommand.request(FAST))


async def test_idle_connections_are_closed_and_activity_keeps_them_open(
    nursery: trio.Nursery, mock_clock
) -> None:
    """The idle deadline counts from the last read or write, not from when the connection
    opened: the plain-socket reader has no timeout of its own, its deadline watch moves on."""
    closed: list[Channel] = []
    server = RemotingServer(
        host="127.0.0.1", port=0, idle_timeout=120, on_channel_closed=closed.append
    )
    await nursery.start(server.run)
    client = RemotingClient(nursery)
    channel = await client.channel(addr(server))
    for _ in range(4):  # 400 s in all, never 120 s without a request
        await client.invoke(addr(server), RemotingCommand.request(FAST))
        mock_clock.jump(100)
        await trio.testing.wait_all_tasks_blocked()
        assert not channel.closed
    mock_clock.jump(21)
    with trio.fail_after(5):
        await channel.wait_closed()
    await trio.testing.wait_all_tasks_blocked()
    # server.channels drops closed channels: the server side's own reason says who closed it.
    assert not server.channels
    assert [c.close_reason for c in closed] == ["idle for 120 s"]


async def test_an_unfinished_frame_closes_its_connection_at_the_deadline(
    nursery: trio.Nursery, mock_clock
) -> None:
    """A frame started and never finished closes the connection once frame_receive_timeout
    has passed (noticed within an eighth of it), with no idle timeout set."""
    closed: list[Channel] = []
    server = RemotingServer(
        host="127.0.0.1",
        port=0,
        limits=ConnectionLimits(frame_receive_timeout=10.0),
        on_channel_closed=closed.append,
    )
    await nursery.start(server.run)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(struct.pack(">i", 100) + b"x" * 10)
    await trio.testing.wait_all_tasks_blocked()
    mock_clock.jump(9)
    await trio.testing.wait_all_tasks_blocked()
    assert not closed
    mock_clock.jump(1 + 10 / 8)
    with trio.fail_after(5):
        assert await stream.receive_some(10) == b""  # closed by the server
    await trio.testing.wait_all_tasks_blocked()
    assert len(closed) == 1 and "frame not completed" in (closed[0].close_reason or "")
    await stream.aclose()


# -- inline handlers and callback calls -------------------------------------------------------

INLINE, INLINE_LATER, INLINE_BOOM = 2001, 2002, 2003


@pytest.fixture
async def inline_server(nursery: trio.Nursery) -> RemotingServer:
    """Codes with an inline handler: answered in the reader, handed to a task (None), raising,
    or answered later through Channel.answer."""
    server = RemotingServer(host="127.0.0.1", port=0, name="inline")
    later: list[tuple[Channel, RemotingCommand]] = []
    server.later = later  # type: ignore[attr-defined]

    async def by_task(channel: Channel, req: RemotingCommand) -> RemotingCommand:
        await trio.lowlevel.checkpoint()
        return req.response(ext_fields={"by": "task"})

    def inline(channel: Channel, req: RemotingCommand) -> RemotingCommand | None:
        if req.ext_fields.get("hard") == "true":
            return None
        return req.response(ext_fields={"by": "inline"})

    def inline_later(channel: Channel, req: RemotingCommand) -> RemotingCommand:
        later.append((channel, req))
        return ANSWER_LATER

    def inline_boom(channel: Channel, req: RemotingCommand) -> RemotingCommand:
        raise RuntimeError("inline handler failed")

    server.register(INLINE, by_task, inline=inline)
    server.register(INLINE_LATER, by_task, inline=inline_later)
    server.register(INLINE_BOOM, by_task, inline=inline_boom)
    await nursery.start(server.run)
    return server


async def test_inline_handler_answers_or_hands_over_to_a_task(
    inline_server: RemotingServer, client: RemotingClient
) -> None:
    easy = await client.invoke(addr(inline_server), RemotingCommand.request(INLINE))
    assert easy.ext_fields["by"] == "inline"
    hard = await client.invoke(addr(inline_server), RemotingCommand.request(INLINE, {"hard": True}))
    assert hard.ext_fields["by"] == "task"
    failed = await client.invoke(addr(inline_server), RemotingCommand.request(INLINE_BOOM))
    assert failed.code == ResponseCode.SYSTEM_ERROR
    assert "inline handler failed" in failed.remark
    # The connection survived the failing handler.
    again = await client.invoke(addr(inline_server), RemotingCommand.request(INLINE))
    assert again.code == ResponseCode.SUCCESS


async def test_inline_handler_can_answer_later(
    inline_server: RemotingServer, client: RemotingClient
) -> None:
    later: list[tuple[Channel, RemotingCommand]] = inline_server.later  # type: ignore[attr-defined]
    got: list[RemotingCommand] = []

    async def call() -> None:
        got.append(await client.invoke(addr(inline_server), RemotingCommand.request(INLINE_LATER)))

    async with trio.open_nursery() as n:
        n.start_soon(call)
        await trio.testing.wait_all_tasks_blocked()
        assert len(later) == 1 and not got  # held: no answer yet
        channel, req = later.pop()
        channel.answer(req, req.response(ext_fields={"by": "later"}))
    assert got[0].ext_fields["by"] == "later"


async def test_callback_calls_get_answers_timeouts_and_closes(
    server: RemotingServer, client: RemotingClient
) -> None:
    channel = await client.channel(addr(server))
    answers: dict[int, str] = {}
    errors: list[Exception] = []
    done = trio.Event()

    def on_answer(i: int, response: RemotingCommand | None, error: Exception | None) -> None:
        if error is not None:
            errors.append(error)
        else:
            assert response is not None
            answers[i] = response.ext_fields["echo"]
        if len(answers) + len(errors) == 100:
            done.set()

    for i in range(100):
        channel.invoke_callback(
            RemotingCommand.request(FAST, {"x": i}),
            10,
            lambda r, e, i=i: on_answer(i, r, e),
        )
    with trio.fail_after(5):
        await done.wait()
    assert answers == {i: str(i) for i in range(100)} and not errors

    # No answer within the timeout: the callback gets a timeout error, soon after it.
    timed_out: list[Exception | None] = []
    finished = trio.Event()

    def on_silent(response: RemotingCommand | None, error: Exception | None) -> None:
        timed_out.append(error)
        finished.set()

    start = trio.current_time()
    channel.invoke_callback(RemotingCommand.request(SILENT), 0.2, on_silent)
    with trio.fail_after(5):
        await finished.wait()
    assert isinstance(timed_out[0], RemotingTimeoutError)
    assert 0.2 <= trio.current_time() - start < 2

    # A closed connection fails the pending callbacks at once.
    closed: list[Exception | None] = []
    channel.invoke_callback(RemotingCommand.request(SILENT), 60, lambda r, e: closed.append(e))
    channel.close("closed by the test")
    assert isinstance(closed[0], RemotingConnectError)
    with pytest.raises(RemotingConnectError):
        channel.invoke_callback(RemotingCommand.request(FAST), 1, lambda r, e: None)


async def test_a_callback_that_closes_the_channel_does_not_break_the_sweep(
    server: RemotingServer, client: RemotingClient
) -> None:
    channel = await client.channel(addr(server))
    errors: list[Exception | None] = []

    def close_on_error(response: RemotingCommand | None, error: Exception | None) -> None:
        errors.append(error)
        channel.close("closed by a callback")

    for _ in range(3):  # expire in the same sweep; the first callback closes the channel
        channel.invoke_callback(RemotingCommand.request(SILENT), 0.1, close_on_error)
    with trio.fail_after(5):
        await channel.wait_closed()
    assert len(errors) == 3
    assert isinstance(errors[0], RemotingTimeoutError)
    assert all(isinstance(e, RemotingConnectError) for e in errors[1:])


async def test_awaited_frame_calls_get_answers_timeouts_cancels_and_closes(
    server: RemotingServer, client: RemotingClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Channel.call_frame: a request written as its frame, awaited without a cancel scope of
    its own; the channel's sweep times it out, and a call given up leaves nothing behind."""
    from pymq.remoting import channel as channel_module

    made: list[Call] = []

    def recording_call(**kwargs: object) -> Call:
        made.append(Call(**kwargs))  # type: ignore[arg-type]
        return made[-1]

    monkeypatch.setattr(channel_module, "Call", recording_call)
    channel = await client.channel(addr(server))
    calls = channel.state.calls

    def frame(code: int, **ext: str) -> tuple[int, bytes]:
        request = RemotingCommand.request(code, ext)
        request.opaque = next_opaque()
        return request.opaque, encode(request)

    # Answered: not a send answer, so the response command (not the raw path's fields).
    answers = []
    for i in range(3):
        opaque, data = frame(FAST, x=str(i))
        answers.append(await channel.call_frame(opaque, data, FAST, 10))
    assert [a.ext_fields["echo"] for a in answers] == ["0", "1", "2"]  # type: ignore[union-attr]
    assert len(calls) == 0 and calls.timed == 0
    # No call refers back to itself (a cycle only the collector would free, answer and all).
    assert len(made) == 3 and all(c not in gc.get_referents(*gc.get_referents(c)) for c in made)

    # No answer: a timeout error soon after the deadline, from the sweep.
    start = trio.current_time()
    opaque, data = frame(SILENT)
    with pytest.raises(RemotingTimeoutError, match="no response in time"):
        await channel.call_frame(opaque, data, SILENT, 0.2)
    assert 0.2 <= trio.current_time() - start < 2
    assert len(calls) == 0 and calls.timed == 0

    # Given up by its caller: the call is forgotten; a late answer finds nobody.
    opaque, data = frame(SILENT)
    with trio.move_on_after(0.05):
        await channel.call_frame(opaque, data, SILENT, 60)
    assert len(calls) == 0 and calls.timed == 0

    # Closed while waiting: the error at once; a closed channel refuses new calls.
    async def close_soon() -> None:
        await trio.sleep(0.05)
        channel.close("closed by the test")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(close_soon)
        opaque, data = frame(SILENT)
        with trio.fail_after(5), pytest.raises(RemotingConnectError):
            await channel.call_frame(opaque, data, SILENT, 60)
    opaque, data = frame(FAST)
    with pytest.raises(RemotingConnectError):
        await channel.call_frame(opaque, data, FAST, 1)
