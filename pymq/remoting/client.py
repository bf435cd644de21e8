"""Trio client shell: one connection per address, reused, with request/response correlation.

:func:`open_remoting_client` owns a nursery in which every connection's :class:`Channel` runs;
leaving the ``async with`` closes them all.  A call to an address connects on first use (at most
one connect per address at a time) and reconnects after the connection died.  A connection that
dies fails the calls waiting on it at once (``RemotingConnectError``), not at their timeouts.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

from pymq.common.address import split_address
from pymq.common.nursery import open_nursery_unwrapped
from pymq.remoting.channel import Channel, RequestHandler, raw_send_answers
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.errors import RemotingConnectError
from pymq.remoting.tls import client_handshake

log = logging.getLogger(__name__)

# RocketMQ NettyClientConfig.connectTimeoutMillis.
CONNECT_TIMEOUT = 3.0

# Called on each request before it is sent (RocketMQ's RPCHook.doBeforeRequest), e.g. the ACL
# signature (:class:`pymq.acl.rpc_hook.AclSigner`); it may change the request's fields.
Signer = Callable[[RemotingCommand], None]


class RemotingClient:
    def __init__(
        self,
        nursery: trio.Nursery,
        *,
        handler: RequestHandler | None = None,
        connect_timeout: float = CONNECT_TIMEOUT,
        signer: Signer | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._nursery = nursery
        # Connect with TLS (handshake within connect_timeout); None: plain TCP.
        self.ssl_context = ssl_context
        self.handler = handler
        self.connect_timeout = connect_timeout
        # Signs every request sent on this client's connections (ACL); None: unsigned.
        self.signer = signer
        self._channels: dict[str, Channel] = {}
        self._locks: dict[str, trio.Lock] = {}

    async def channel(self, address: str) -> Channel:
        """The live connection to ``address``, connecting if there is none."""
        channel = self.open_channel(address)
        if channel is not None:
            return channel
        lock = self._locks.setdefault(address, trio.Lock())
        async with lock:
            channel = self.open_channel(address)
            if channel is not None:
                return channel
            host, port = split_address(address)
            stream: trio.abc.Stream
            try:
                with trio.fail_after(self.connect_timeout):
                    stream = await trio.open_tcp_stream(host, port)
                    if self.ssl_context is not None:
                        stream = await self._handshake(stream, host, address)
            except (OSError, trio.TooSlowError) as exc:
                raise RemotingConnectError(f"cannot connect to {address}: {exc}") from None
            # Plain send answers are given to send_async's callers from the frame.
            channel = Channel(stream, self.handler, raw_run_handler=raw_send_answers)
            channel.signer = self.signer
            self._channels[address] = channel
            self._nursery.start_soon(channel.run)
            return channel

    def open_channel(self, address: str) -> Channel | None:
        """The live connection to ``address`` if there is one (:meth:`channel` connects)."""
        channel = self._channels.get(address)
        if channel is not None and not channel.closed:
            return channel
        return None

    async def _handshake(
        self, stream: trio.SocketStream, host: str, address: str
    ) -> trio.abc.Stream:
        assert self.ssl_context is not None
        try:
            return await client_handshake(stream, self.ssl_context, host)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            await trio.aclose_forcefully(stream)
            cause = exc.__cause__ or exc
            raise RemotingConnectError(f"TLS handshake with {address} failed: {cause}") from None
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise

    async def invoke(
        self, address: str, request: RemotingCommand, timeout: float = 3.0
    ) -> RemotingCommand:
        channel = await self.channel(address)
        return await channel.invoke(request, timeout)

    async def invoke_oneway(self, address: str, request: RemotingCommand) -> None:
        channel = await self.channel(address)
        await channel.invoke_oneway(request)

    def close_channel(self, address: str, reason: str = "closed by client") -> None:
        channel = self._channels.pop(address, None)
        if channel is not None:
            channel.close(reason)

    def close(self) -> None:
        for address in list(self._channels):
            self.close_channel(address)


@asynccontextmanager
async def open_remoting_client(
    *,
    handler: RequestHandler | None = None,
    connect_timeout: float = CONNECT_TIMEOUT,
    signer: Signer | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> AsyncIterator[RemotingClient]:
    async with open_nursery_unwrapped() as nursery:
        client = RemotingClient(
            nursery,
            handler=handler,
            connect_timeout=connect_timeout,
            signer=signer,
            ssl_context=ssl_context,
        )
        try:
            yield client
        finally:
            client.close()
