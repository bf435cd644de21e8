"""ClientInstance: what producers and consumers share (RocketMQ's MQClientInstance).

It owns the remoting connections (in the nursery it is given), the topic-route cache fetched
from the name servers, and the heartbeats to brokers.  Brokers' requests to the client
(NOTIFY_CONSUMER_IDS_CHANGED) are handed to ``on_ids_changed``, a broker's question about a
transaction (CHECK_TRANSACTION_STATE) to ``on_check_transaction``.  A reply to one of the
instance's requests (PUSH_REPLY_MESSAGE_TO_CLIENT) goes to the request waiting for its
CORRELATION_ID (:attr:`ClientInstance.pending_replies`, filled by ``Producer.request``); a
reply nobody waits for is dropped, as Java's client drops it.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import secrets
import ssl
import zlib
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Self, TypeVar

import trio

from pymq.acl.rpc_hook import AclSigner
from pymq.common.address import host_of
from pymq.common.clock import now_ms
from pymq.common.consumer import HeartbeatData
from pymq.common.message_ext import (
    PROPERTY_CORRELATION_ID,
    PROPERTY_REPLY_MESSAGE_ARRIVE_TIME,
    MessageExt,
    MessageSysFlag,
    decode_properties,
)
from pymq.common.nursery import open_nursery_unwrapped
from pymq.common.route import MASTER_ID, TopicRouteData
from pymq.common.serde import from_json, to_json
from pymq.common.topic import is_readable, is_writeable
from pymq.remoting import headers as H
from pymq.remoting.channel import Channel
from pymq.remoting.client import RemotingClient
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.remoting.errors import RemotingError

log = logging.getLogger(__name__)

_instance_ids = itertools.count(1)

# ClientErrorCode: a request's reply did not come in time; a reply cannot be made.
REQUEST_TIMEOUT_EXCEPTION = 10006
CREATE_REPLY_MESSAGE_EXCEPTION = 10007
# The largest body a compressed reply may inflate to (bytes): a bigger one is refused (the
# broker then tells the responder the push failed), not inflated without end.
MAX_REPLY_BODY = 64 * 1024 * 1024
# Java's answer to a push it could not turn into a reply.
REPLY_FAILED_REMARK = "process reply message fail"


class MQClientError(Exception):
    """A broker or name server answered a request with an error code."""

    def __init__(self, code: int, remark: str | None, what: str = "") -> None:
        self.code = code
        self.remark = remark or ""
        super().__init__(f"{what}: CODE {code} DESC {remark}" if what else f"CODE {code} {remark}")


_Body = TypeVar("_Body")


def decode_answer(body: bytes | None, cls: type[_Body], what: str) -> _Body:
    """A SUCCESS answer's body as ``cls``; MQClientError (a failed call, which the caller's
    loop retries) when it is not one: a peer's bad body must not end a client's task."""
    try:
        return from_json(body or b"", cls)
    except ValueError as exc:
        raise MQClientError(-1, f"undecodable answer: {exc}", what) from None


class RequestTimeoutError(MQClientError):
    """``Producer.request``: the request was sent, but no reply came in time (Java's
    RequestTimeoutException)."""


class PendingReply:
    """One ``Producer.request`` waiting for its reply."""

    __slots__ = ("arrived", "reply")

    def __init__(self) -> None:
        self.arrived = trio.Event()
        self.reply: MessageExt | None = None

    def deliver(self, reply: MessageExt) -> None:
        if self.reply is None:
            self.reply = reply
            self.arrived.set()


def inflate_body(body: bytes, limit: int) -> bytes:
    """A compressed message body (zlib, as Java's UtilAll.compress) inflated to at most
    ``limit`` bytes: ValueError for one that does not inflate or would inflate further (4 MiB
    of zeros compress to 4 KiB: a consumer must not be made to hold what a sender chooses)."""
    inflater = zlib.decompressobj()
    try:
        inflated = inflater.decompress(body, limit)
    except zlib.error as exc:
        raise ValueError(f"compressed body does not inflate: {exc}") from None
    if inflater.unconsumed_tail:
        raise ValueError(f"compressed body inflates past {limit} bytes")
    return inflated


def reply_message(head: H.ReplyMessageRequestHeader, body: bytes, arrived_ms: int) -> MessageExt:
    """The reply a PUSH_REPLY_MESSAGE_TO_CLIENT carries (ClientRemotingProcessor's
    receiveReplyMessage): the header's fields, the body inflated when its sysFlag says it is
    compressed, ARRIVE_TIME added.  ValueError for a body that does not inflate (or inflates
    past :data:`MAX_REPLY_BODY`)."""
    if head.sys_flag & MessageSysFlag.COMPRESSED_FLAG:
        body = inflate_body(body, MAX_REPLY_BODY)
    props = decode_properties(head.properties or "")
    props[PROPERTY_REPLY_MESSAGE_ARRIVE_TIME] = str(arrived_ms)
    return MessageExt(
        topic=head.topic,
        body=body,
        flag=head.flag,
        properties=props,
        queue_id=head.queue_id,
        born_timestamp=head.born_timestamp,
        born_host=host_of(head.born_host),
        store_timestamp=head.store_timestamp,
        store_host=host_of(head.store_host),
        reconsume_times=head.reconsume_times or 0,
    )


Credentials = tuple[str, str]


def tls_context(tls: bool | ssl.SSLContext) -> ssl.SSLContext | None:
    """A client's ``tls=`` option as the context to connect with (None: plain TCP)."""
    if isinstance(tls, ssl.SSLContext):
        return tls
    return ssl.create_default_context() if tls else None


class ClientInstance:
    def __init__(
        self,
        nursery: trio.Nursery,
        namesrv_addr: str,
        credentials: Credentials | None = None,
        tls: ssl.SSLContext | None = None,
        instance_name: str | None = None,
    ) -> None:
        self.namesrv_addrs = [a.strip() for a in namesrv_addr.split(";") if a.strip()]
        if not self.namesrv_addrs:
            raise ValueError("no name server address given (host:port[;host:port])")
        # ip@instanceName, as Java's buildMQClientId.  A given instance name stays (a
        # broadcasting consumer's offsets file is found by it); the default is unique beyond
        # this host: a broker pushes a request's reply to the connection that registered the
        # clientId last, and processes elsewhere (containers: often pid 1) may have this pid and
        # this instance number too.
        default_name = f"{os.getpid()}#{next(_instance_ids)}#{secrets.token_hex(4)}"
        self.client_id = f"127.0.0.1@{instance_name or default_name}"
        # credentials=(accessKey, secretKey): every request signed for a broker with ACL.
        signer = AclSigner(*credentials) if credentials is not None else None
        self.remoting = RemotingClient(nursery, handler=self._serve, signer=signer, ssl_context=tls)
        self.routes: dict[str, TopicRouteData] = {}
        self.broker_addrs: dict[str, dict[int, str]] = {}
        self.on_ids_changed: Callable[[str], None] = lambda group: None
        # A transactional producer's answer to CHECK_TRANSACTION_STATE (oneway: no response),
        # which needs the connection the check came on.
        self.on_check_transaction: Callable[[Channel, RemotingCommand], Awaitable[None]] | None = (
            None
        )
        # The broker's other calls a consumer answers (offset resets, running info, ...).
        self.request_handlers: dict[
            int, Callable[[RemotingCommand], Awaitable[RemotingCommand | None]]
        ] = {}
        # CORRELATION_ID -> the request waiting for its reply; each entry lives no longer
        # than its Producer.request call.
        self.pending_replies: dict[str, PendingReply] = {}

    async def _serve(self, channel: Channel, req: RemotingCommand) -> RemotingCommand | None:
        if req.code == RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT:
            return self._receive_reply(channel, req)
        if req.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            self.on_ids_changed(req.ext_fields.get("consumerGroup", ""))
            return None
        if req.code == RequestCode.CHECK_TRANSACTION_STATE and self.on_check_transaction:
            await self.on_check_transaction(channel, req)
            return None
        handler = self.request_handlers.get(req.code)
        if handler is not None:
            return await handler(req)
        return req.response(
            ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f"request type {req.code} not supported"
        )

    def _receive_reply(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        """PUSH_REPLY_MESSAGE_TO_CLIENT: hand the reply to the request waiting for its
        CORRELATION_ID and answer SUCCESS, or drop it (logged) when none waits, as Java does.
        A header Java would refuse raises HeaderError (answered SYSTEM_ERROR with its text); a
        body that cannot be read is answered SYSTEM_ERROR "process reply message fail"."""
        head: H.ReplyMessageRequestHeader = H.decode_request(req)
        try:
            reply = reply_message(head, req.body, now_ms())
        except ValueError as exc:
            log.warning("reply from %s not usable: %s", channel.remote_address, exc)
            return req.response(ResponseCode.SYSTEM_ERROR, REPLY_FAILED_REMARK)
        correlation = reply.properties.get(PROPERTY_CORRELATION_ID)
        pending = self.pending_replies.pop(correlation, None) if correlation else None
        if pending is None:
            log.warning(
                "receive reply message, but not matched any request, CorrelationId: %s, "
                "reply from host: %s",
                correlation,
                head.born_host,
            )
        else:
            pending.deliver(reply)
        return req.response()

    # -- name servers ---------------------------------------------------------------------

    async def fetch_route(self, topic: str, timeout: float = 3.0) -> TopicRouteData | None:
        """The topic's route from the first name server that answers; None if it has none."""
        last_error: Exception | None = None
        for addr in random.sample(self.namesrv_addrs, len(self.namesrv_addrs)):
            request = RemotingCommand.request(
                RequestCode.GET_ROUTEINFO_BY_TOPIC, H.encode(H.TopicHeader(topic))
            )
            try:
                response = await self.remoting.invoke(addr, request, timeout)
            except RemotingError as exc:
                last_error = exc
                continue
            if response.code == ResponseCode.TOPIC_NOT_EXIST:
                return None
            if response.code != ResponseCode.SUCCESS:
                raise MQClientError(response.code, response.remark, f"route of {topic}")
            route = decode_answer(response.body, TopicRouteData, f"route of {topic}")
            self.routes[topic] = route
            for data in route.broker_datas:
                self.broker_addrs[data.broker_name] = dict(data.broker_addrs)
            return route
        raise MQClientError(-1, f"no name server answered: {last_error}", f"route of {topic}")

    async def route(self, topic: str) -> TopicRouteData | None:
        return self.routes.get(topic) or await self.fetch_route(topic)

    def master_addr(self, broker_name: str) -> str | None:
        return self.broker_addrs.get(broker_name, {}).get(MASTER_ID)

    def broker_addr(self, broker_name: str, broker_id: int = MASTER_ID) -> str | None:
        addrs = self.broker_addrs.get(broker_name, {})
        return addrs.get(broker_id) or addrs.get(MASTER_ID) or next(iter(addrs.values()), None)

    @staticmethod
    def writable_queues(route: TopicRouteData) -> list[tuple[str, int]]:
        queues = []
        for q in sorted(route.queue_datas, key=lambda q: q.broker_name):
            if is_writeable(q.perm):
                queues += [(q.broker_name, i) for i in range(q.write_queue_nums)]
        return queues

    @staticmethod
    def readable_queues(route: TopicRouteData) -> list[tuple[str, int]]:
        queues = []
        for q in sorted(route.queue_datas, key=lambda q: q.broker_name):
            if is_readable(q.perm):
                queues += [(q.broker_name, i) for i in range(q.read_queue_nums)]
        return queues

    # -- brokers --------------------------------------------------------------------------

    async def invoke(self, addr: str, request: RemotingCommand, timeout: float) -> RemotingCommand:
        return await self.remoting.invoke(addr, request, timeout)

    async def send_heartbeat(self, data: HeartbeatData, all_brokers: bool) -> None:
        body = to_json(data)
        for name, addrs in list(self.broker_addrs.items()):
            for broker_id, addr in addrs.items():
                if broker_id != MASTER_ID and not all_brokers:
                    continue
                request = RemotingCommand.request(RequestCode.HEART_BEAT, body=body)
                try:
                    response = await self.remoting.invoke(addr, request, 3.0)
                except RemotingError as exc:
                    log.warning("heartbeat to %s (%s) failed: %s", name, addr, exc)
                    continue
                if response.code != ResponseCode.SUCCESS:
                    log.warning("heartbeat to %s refused: %s", addr, response.remark)

    async def unregister(self, producer_group: str = "", consumer_group: str = "") -> None:
        for addrs in list(self.broker_addrs.values()):
            for addr in addrs.values():
                request = RemotingCommand.request(
                    RequestCode.UNREGISTER_CLIENT,
                    H.encode(
                        H.UnregisterClientRequestHeader(
                            self.client_id, producer_group, consumer_group
                        )
                    ),
                )
                try:
                    await self.remoting.invoke(addr, request, 3.0)
                except RemotingError as exc:
                    log.debug("unregister from %s failed: %s", addr, exc)

    def close(self) -> None:
        self.remoting.close()


class ClientService(AbstractAsyncContextManager):
    """The lifecycle producers and consumers share: ``async with`` opens a nursery and a
    :class:`ClientInstance` in it, calls :meth:`_started`; leaving calls :meth:`_stopping` and
    unregisters from the brokers (shielded, bounded), then closes every connection."""

    # Producers register their group as a producer group, consumers as a consumer group.
    is_producer = False
    # How long leaving may take for the shutdown work above.
    STOP_DEADLINE = 5.0

    def __init__(
        self,
        group: str,
        namesrv_addr: str,
        *,
        credentials: Credentials | None = None,
        tls: bool | ssl.SSLContext = False,
        instance_name: str | None = None,
    ) -> None:
        self.group = group
        self.namesrv_addr = namesrv_addr
        # tls=True: TLS to name servers and brokers, their certificates verified against the
        # system's CAs; or the ssl.SSLContext to use (a private CA, a client certificate).
        self.tls = tls_context(tls)
        # (accessKey, secretKey) of an ACL account; checked here, never logged.
        if credentials is not None:
            AclSigner(*credentials)
        self.credentials = credentials
        # Java's instanceName: the client id's part after the '@' (default: pid#counter).
        self.instance_name = instance_name
        self.client: ClientInstance | None = None
        self._nursery_manager: AbstractAsyncContextManager[trio.Nursery] | None = None
        self._nursery: trio.Nursery | None = None

    async def __aenter__(self) -> Self:
        self._nursery_manager = open_nursery_unwrapped()
        self._nursery = await self._nursery_manager.__aenter__()
        self.client = ClientInstance(
            self._nursery, self.namesrv_addr, self.credentials, self.tls, self.instance_name
        )
        try:
            await self._started()
        except BaseException:
            # Starting failed (a broker refused the consumer's subscription, say): close what
            # was opened, then raise the failure itself.
            self.client.close()
            self._nursery.cancel_scope.cancel()
            await self._nursery_manager.__aexit__(None, None, None)
            raise
        return self

    async def _started(self) -> None:
        pass

    async def _stopping(self) -> None:
        pass

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._nursery is not None and self._nursery_manager is not None and self.client
        with trio.move_on_after(self.STOP_DEADLINE) as scope:
            scope.shield = True
            await self._stopping()
            if self.is_producer:
                await self.client.unregister(producer_group=self.group)
            else:
                await self.client.unregister(consumer_group=self.group)
        self.client.close()
        self._nursery.cancel_scope.cancel()
        return await self._nursery_manager.__aexit__(exc_type, exc, tb)
