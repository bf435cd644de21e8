"""A channel holds the stdlib socket under its plain stream through public Trio only (no
private attribute): the stream is re-made around a socket the channel owns."""

from __future__ import annotations

import socket

import trio
import trio.testing

from pymq.remoting.channel import Channel, own_socket


async def _pair() -> tuple[trio.SocketStream, trio.SocketStream, list[trio.SocketListener]]:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    accepted: list[trio.SocketStream] = []
    async with trio.open_nursery() as nursery:

        async def accept() -> None:
            accepted.append(await listeners[0].accept())

        nursery.start_soon(accept)
        client = await trio.open_tcp_stream("127.0.0.1", port)
    return client, accepted[0], listeners


async def test_the_stream_is_remade_around_a_socket_the_caller_holds() -> None:
    client, server, listeners = await _pair()
    fd = client.socket.fileno()
    stream, raw = own_socket(client)
    assert isinstance(stream, trio.SocketStream) and isinstance(raw, socket.socket)
    assert raw.fileno() == fd == stream.socket.fileno()  # the same descriptor, not a dup
    assert client.socket.fileno() == -1  # the old wrapper lets go of it
    assert not raw.getblocking()  # a direct send never waits
    assert stream.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    raw.send(b"ping")
    await stream.send_all(b"pong")
    assert await server.receive_some(8) == b"pingpong"
    await server.send_all(b"back")
    with trio.fail_after(5):
        await trio.lowlevel.wait_readable(raw)
    assert raw.recv(8) == b"back"
    await stream.aclose()
    assert raw.fileno() == -1  # closing the stream closes the socket the caller holds
    await server.aclose()
    for listener in listeners:
        await listener.aclose()


async def test_a_channel_writes_directly_to_its_own_socket() -> None:
    client, server, listeners = await _pair()
    channel = Channel(client)
    assert channel._raw is not None and channel.stream is not client
    assert channel._raw.fileno() == channel.stream.socket.fileno()  # type: ignore[attr-defined]
    channel._out.append(b"direct")
    channel._flush_direct()  # one non-blocking send from this task, no writer task running
    assert not channel._out
    assert await server.receive_some(16) == b"direct"
    await channel.stream.aclose()
    await server.aclose()
    for listener in listeners:
        await listener.aclose()


async def test_a_stream_without_a_socket_of_its_own_is_kept() -> None:
    left, _right = trio.testing.memory_stream_pair()
    stream, raw = own_socket(left)
    assert stream is left and raw is None
