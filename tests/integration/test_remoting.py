"""The Trio server and client shells over real loopback sockets."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from pymq.remoting.channel import Channel
from pymq.remoting.client import RemotingClient, split_address
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import ResponseCode, SerializeType
from pymq.remoting.errors import RemotingConnectError, RemotingTimeoutError
from pymq.remoting.server import RemotingServer

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


async def test_flagged_oneway_gets_no_answer(server: RemotingServer) -> None:
    async with trio.open_nursery() as n:
        seen: list[int] = []
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        channel = Channel(stream)
        deliver = channel._on_response

        def record(cmd: RemotingCommand) -> None:
            seen.append(cmd.opaque)
            deliver(cmd)

        channel._on_response = record  # type: ignore[method-assign]
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


async def test_idle_connections_are_closed(nursery: trio.Nursery, mock_clock) -> None:
    server = RemotingServer(host="127.0.0.1", port=0, idle_timeout=120)
    await nursery.start(server.run)
    client = RemotingClient(nursery)
    channel = await client.channel(addr(server))
    await client.invoke(addr(server), RemotingCommand.request(FAST))
    mock_clock.jump(60)
    await trio.testing.wait_all_tasks_blocked()
    assert not channel.closed
    mock_clock.jump(61)
    with trio.fail_after(5):
        await channel.wait_closed()


def test_split_address() -> None:
    assert split_address("127.0.0.1:9876") == ("127.0.0.1", 9876)
    assert split_address("[::1]:9876") == ("::1", 9876)
    for bad in ("127.0.0.1", ":9876", "host:port"):
        with pytest.raises(ValueError):
            split_address(bad)
