"""The one place pymq reads a Trio private attribute: the stdlib socket under a SocketStream."""

from __future__ import annotations

import socket

import trio

from pymq.remoting.channel import raw_socket


async def test_a_trio_socket_stream_still_has_its_stdlib_socket() -> None:
    """If Trio renames or drops ``SocketStream.socket._sock``, this fails: the channel's
    direct writes and read-ahead would otherwise quietly stop (every write through the
    writer task, fast failure blind to the backlog)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        accepted: list[trio.SocketStream] = []

        async def accept() -> None:
            accepted.append(await listeners[0].accept())

        nursery.start_soon(accept)
        client = await trio.open_tcp_stream("127.0.0.1", port)
    raw = raw_socket(client)
    assert isinstance(raw, socket.socket)
    assert raw.fileno() == client.socket.fileno()
    assert not raw.getblocking()  # Trio's sockets are non-blocking: a send never waits
    raw.send(b"ping")
    assert await accepted[0].receive_some(4) == b"ping"
    for stream in (client, *accepted):
        await stream.aclose()
    for listener in listeners:
        await listener.aclose()
