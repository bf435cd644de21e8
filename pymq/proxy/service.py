"""``apache.rocketmq.v2.MessagingService`` served from the broker's own services.

The RPCs a 5.x producer needs: QueryRoute (this broker's queues of the topic, at this broker's
gRPC endpoint, and the other groups' from the name servers: :mod:`pymq.proxy.routes`),
Heartbeat, SendMessage (through the broker's send path: SendProcessor.send_fields_now, then
:func:`send_via_broker`),
EndTransaction (through END_TRANSACTION: :func:`end_via_broker`), Telemetry (the settings
handshake; a producer's stream receives the broker's transaction checks), QueryAssignment and
NotifyClientTermination, RecallMessage (the broker's RECALL_MESSAGE logic:
:meth:`MessagingService.recall_message`);
a SimpleConsumer's and PushConsumer's: ReceiveMessage (server streaming, long polling),
AckMessage, ChangeInvisibleDuration and ForwardMessageToDeadLetterQueue (POP consumption,
:mod:`pymq.proxy.pop`); a PullConsumer's: PullMessage, UpdateOffset, GetOffset, QueryOffset.
Every other method (SyncLiteSubscription) is answered ``UNIMPLEMENTED`` by the
transport (:mod:`pymq.proxy.http2`), never left waiting.  With ``aclEnable`` every RPC checks
the client's signature and permissions (:meth:`MessagingService._refused`).

Status codes are the proxy's (ResponseBuilder): a broker answer maps SUCCESS -> OK, SYSTEM_BUSY
-> TOO_MANY_REQUESTS, TOPIC_NOT_EXIST -> TOPIC_NOT_FOUND, SUBSCRIPTION_GROUP_NOT_EXIST ->
CONSUMER_GROUP_NOT_FOUND, REQUEST_CODE_NOT_SUPPORTED -> NOT_IMPLEMENTED, anything else ->
INTERNAL_SERVER_ERROR with the broker's remark; a send's FLUSH_DISK_TIMEOUT,
FLUSH_SLAVE_TIMEOUT and SLAVE_NOT_AVAILABLE -> MASTER_PERSISTENCE_TIMEOUT,
SLAVE_PERSISTENCE_TIMEOUT and HA_NOT_AVAILABLE.  A message of a type its topic does not take
(the topic's ``message.type`` attribute, NORMAL when unset; MIXED takes all) is refused
MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, as the proxy's TopicMessageTypeValidator refuses it.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable
from itertools import islice
from typing import TYPE_CHECKING, Any, cast

import trio

from pymq.broker.acl import AclRefused
from pymq.broker.client_manager import ClientChannelInfo
from pymq.broker.consumer_filter_manager import compile_expression_async
from pymq.broker.message_filter import RecordFilter, evaluator
from pymq.common.address import host_of
from pymq.common.consumer import (
    EXPRESSION_TYPE_SQL92,
    SUB_ALL,
    ConsumeFromWhere,
    ConsumeType,
    MessageModel,
    SubscriptionData,
)
from pymq.common.message_ext import encode_properties, java_string_hash
from pymq.common.message_id import decode_offset_msg_id
from pymq.common.record import RecordError, decode_record
from pymq.common.topic import (
    DLQ_GROUP_TOPIC_PREFIX,
    PERM_READ,
    PERM_WRITE,
    RETRY_GROUP_TOPIC_PREFIX,
    TopicConfig,
    topic_message_type,
    validate_topic,
)
from pymq.filter.sql92 import Sql92Error
from pymq.proxy.clients import TelemetryChannel
from pymq.proxy.convert import MessageRefused, consistent_hash, stored_form, to_grpc_message
from pymq.proxy.http2 import INVALID_ARGUMENT, Call, GrpcError, GrpcLimits, Handler
from pymq.proxy.pop import (
    MAX_INVISIBLE_MS,
    MIN_INVISIBLE_MS,
    HandleError,
    PopService,
)
from pymq.proxy.routes import RouteCache, master_hosts
from pymq.proxy.schema import SERVICE_NAME, ClientType, Code, DecodeError, MessageType
from pymq.proxy.schema import definition as d
from pymq.proxy.schema import service as s
from pymq.remoting.channel import Channel
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import CURRENT_VERSION, RequestCode, ResponseCode
from pymq.remoting.headers import EndTransactionRequestHeader, SendMessageRequestHeader
from pymq.store.results import GetMessageStatus

if TYPE_CHECKING:
    from pymq.broker.controller import BrokerController

log = logging.getLogger(__name__)

# The proxy's producer settings (ProxyConfig): send attempts and their exponential backoff.
PRODUCER_MAX_ATTEMPTS = 3
PRODUCER_BACKOFF_INITIAL_MS = 10
PRODUCER_BACKOFF_MAX_MS = 1000
PRODUCER_BACKOFF_MULTIPLIER = 2.0
# The proxy's consumer settings: messages per receive of a PushConsumer.
RECEIVE_BATCH_SIZE = 32
# The topics (producer groups) one producer's stream is registered under, and the
# subscriptions of one consumer's, at most.
MAX_TOPICS_PER_PRODUCER = 1024
# The longest language and client version a client's metadata is kept with.
MAX_CLIENT_TEXT = 64
# The most messages one PullMessage answers.
MAX_PULL_BATCH = 32
# Entries one AckMessage may carry (the 5.x clients ack one message a call): more are refused
# BAD_REQUEST before any is looked at, so a request of a million empty entries (4 MiB) costs
# neither seconds of the loop nor an answer of a million results.
MAX_ACK_ENTRIES = 1024
# A batch send yields to the loop after this many messages (each is a put): a 4 MiB batch of
# tiny messages is 200,000 of them.
SEND_YIELD_EVERY = 64
# TBW102 and its queue count, as a 4.x producer names them in a send (auto-creation).
DEFAULT_TOPIC = "TBW102"
DEFAULT_TOPIC_QUEUE_NUMS = 4

_BROKER_CODES: dict[int, int] = {
    ResponseCode.SUCCESS: Code.OK,
    ResponseCode.SYSTEM_BUSY: Code.TOO_MANY_REQUESTS,
    ResponseCode.REQUEST_CODE_NOT_SUPPORTED: Code.NOT_IMPLEMENTED,
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: Code.CONSUMER_GROUP_NOT_FOUND,
    ResponseCode.TOPIC_NOT_EXIST: Code.TOPIC_NOT_FOUND,
}
_SEND_STATUS_CODES: dict[int, int] = {
    ResponseCode.FLUSH_DISK_TIMEOUT: Code.MASTER_PERSISTENCE_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: Code.SLAVE_PERSISTENCE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: Code.HA_NOT_AVAILABLE,
}
# END_TRANSACTION's commitOrRollback values for a 5.x resolution (unspecified: UNKNOWN).
_COMMIT, _ROLLBACK, _NOT_DECIDED = 8, 12, 0
_RESOLUTIONS = {
    d.TransactionResolution.COMMIT: _COMMIT,
    d.TransactionResolution.ROLLBACK: _ROLLBACK,
}
_ILLEGAL_OFFSETS = frozenset(
    (GetMessageStatus.OFFSET_TOO_SMALL, GetMessageStatus.OFFSET_OVERFLOW_BADLY)
)
_TYPES = {
    "NORMAL": MessageType.NORMAL,
    "FIFO": MessageType.FIFO,
    "DELAY": MessageType.DELAY,
    "TRANSACTION": MessageType.TRANSACTION,
}


_OK = Code.OK  # read once: each read through protobuf's enum wrapper is a Python call
_RETRY_OR_DLQ = (RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX)


_CODE_NAMES = {value: Code.Name(value) for value in Code.values()}


def status(code: int, message: str | None = None) -> Any:
    if message is None:
        message = _CODE_NAMES.get(code) or Code.Name(code)  # an unknown code: its error
    return d.Status(code=code, message=message)


def set_status(target: Any, code: int, message: str | None = None) -> None:
    """``target.status`` set in place to what :func:`status` makes: the answers a call
    makes per message (a send's, an ack's) are filled field by field, as protobuf's keyword
    construction of nested messages copies each one (about four times the cost)."""
    if message is None:
        message = _CODE_NAMES.get(code) or Code.Name(code)
    result = target.status
    result.code = code
    result.message = message


class _Peer:
    """What the send path reads of a connection: the client's address."""

    def __init__(self, remote_address: str) -> None:
        self.remote_address = remote_address


async def send_via_broker(
    broker: BrokerController, peer: str, header: SendMessageRequestHeader, body: bytes
) -> RemotingCommand:
    """One message through the broker's send path (SEND_MESSAGE's processor: topic checks and
    auto-creation, retry/DLQ, transactions' half messages, the store's put), as a 4.x client's
    send with ``header`` and ``body`` from ``peer`` would go; returns the broker's answer.

    The request's usual way, as the remoting reader's: a send the broker can put without
    waiting (a topic that exists, a store that waits for neither disk nor slave) is put
    synchronously (:meth:`SendProcessor.send_now`, the inline put), and the rest takes the
    awaited path (:meth:`SendProcessor.send_message`).  SendMessage tries the raw sends' way
    first (:meth:`SendProcessor.send_fields_now`, from the message's fields) and comes here
    with what that leaves, as the remoting reader decodes the frames send_raw leaves."""
    request = RemotingCommand(code=RequestCode.SEND_MESSAGE, body=body, header=header)
    channel = cast(Channel, _Peer(peer))
    processor = broker.send_processor
    answer = processor.send_now(channel, request)
    if answer is None:
        answer = await processor.send_message(channel, request)
    return answer


async def end_via_broker(
    broker: BrokerController, peer: str, header: EndTransactionRequestHeader
) -> RemotingCommand | None:
    """A transaction's end through the broker's END_TRANSACTION processor, as a 4.x producer's
    (answered, not oneway); None for an end that leaves it pending (UNKNOWN)."""
    request = RemotingCommand(code=RequestCode.END_TRANSACTION, header=header)
    return await broker.transactions.end_transaction(_Peer(peer), request)


def _unary(
    request_type: Any, serve: Callable[[Call, Any], Awaitable[Any]], limits: GrpcLimits
) -> Handler:
    name = request_type.DESCRIPTOR.name

    async def handler(call: Call) -> None:
        data = await call.receive(timeout=limits.receive_timeout, last=True)
        if data is None:
            raise GrpcError(INVALID_ARGUMENT, f"the call ended without a {name}")
        try:
            request = request_type.FromString(data)
        except DecodeError as exc:
            raise GrpcError(INVALID_ARGUMENT, f"malformed {name}: {exc}") from None
        response = await serve(call, request)
        await call.send(response.SerializeToString(), last=True)

    return handler


_CONSUMER_TYPES = frozenset(
    (ClientType.PUSH_CONSUMER, ClientType.SIMPLE_CONSUMER, ClientType.LITE_PUSH_CONSUMER)
)


def _check_pub_sub(settings: Any, client_type: str) -> None:
    """Raise GrpcError INVALID_ARGUMENT for Telemetry settings the proxy's ClientActivity
    refuses (ending the stream): publishing settings of a client other than a PRODUCER,
    subscription settings of one that is no consumer (validateSettingsClientType), and
    settings with neither (``there is no publishing or subscription data in settings``)."""
    kind = settings.WhichOneof("pub_sub")
    if kind is None:
        raise GrpcError(INVALID_ARGUMENT, "there is no publishing or subscription data in settings")
    if kind == "publishing" and settings.client_type != ClientType.PRODUCER:
        wrong = f"publishing settings require PRODUCER client type, actual: {client_type}"
    elif kind == "subscription" and settings.client_type not in _CONSUMER_TYPES:
        wrong = f"subscription settings require consumer client type, actual: {client_type}"
    else:
        return
    raise GrpcError(INVALID_ARGUMENT, f"process client telemetryCommand failed. {wrong}")


class MessagingService:
    def __init__(
        self, broker: BrokerController, limits: GrpcLimits, port: Callable[[], int]
    ) -> None:
        self.broker = broker
        self.limits = limits
        self.port = port  # the gRPC port, once bound (the routes name it)
        self.pop = PopService(broker)
        self.routes = RouteCache(broker)
        # Producers' Telemetry streams by client id (at most one per open stream).
        self.telemetry_channels: dict[str, TelemetryChannel] = {}

    def handlers(self) -> dict[str, Handler]:
        prefix = f"/{SERVICE_NAME}/"
        unary = {
            "QueryRoute": (s.QueryRouteRequest, self.query_route),
            "Heartbeat": (s.HeartbeatRequest, self.heartbeat),
            "SendMessage": (s.SendMessageRequest, self.send_message),
            "QueryAssignment": (s.QueryAssignmentRequest, self.query_assignment),
            "NotifyClientTermination": (
                s.NotifyClientTerminationRequest,
                self.notify_client_termination,
            ),
            "EndTransaction": (s.EndTransactionRequest, self.end_transaction),
            "RecallMessage": (s.RecallMessageRequest, self.recall_message),
            "AckMessage": (s.AckMessageRequest, self.ack_message),
            "UpdateOffset": (s.UpdateOffsetRequest, self.update_offset),
            "GetOffset": (s.GetOffsetRequest, self.get_offset),
            "QueryOffset": (s.QueryOffsetRequest, self.query_offset),
            "ForwardMessageToDeadLetterQueue": (
                s.ForwardMessageToDeadLetterQueueRequest,
                self.forward_message_to_dead_letter_queue,
            ),
            "ChangeInvisibleDuration": (
                s.ChangeInvisibleDurationRequest,
                self.change_invisible_duration,
            ),
        }
        table: dict[str, Handler] = {
            prefix + name: _unary(kind, serve, self.limits) for name, (kind, serve) in unary.items()
        }
        table[prefix + "Telemetry"] = self.telemetry
        table[prefix + "ReceiveMessage"] = self.receive_message
        table[prefix + "PullMessage"] = self.pull_message
        return table

    # -- routes -------------------------------------------------------------------------------

    def _broker(self, name: str | None = None, host: str | None = None) -> Any:
        """A broker group as a route names it: this broker's, or group ``name``'s master on
        ``host``, at this broker's gRPC port (as the proxy's local mode names them)."""
        bc = self.broker.broker_config
        endpoints = d.Endpoints(
            scheme=d.AddressScheme.IPv4,
            addresses=[d.Address(host=host or bc.broker_ip1, port=self.port())],
        )
        return d.Broker(name=name or bc.broker_name, id=0, endpoints=endpoints)

    @staticmethod
    def _accepts(config: TopicConfig) -> list[int]:
        kind = topic_message_type(config)
        if kind == "MIXED":
            return list(_TYPES.values())
        return [_TYPES[kind]] if kind in _TYPES else []

    @staticmethod
    def _queues(
        broker: Any, reads: int, writes: int, perm: int, accepts: list[int], topic: Any
    ) -> list[Any]:
        """A broker group's queues of the topic as the proxy lists them
        (genMessageQueueFromQueueData): by id, each with what the counts and perm allow."""
        queues = []
        for qid in range(max(reads, writes)):
            readable = qid < reads and perm & PERM_READ
            writable = qid < writes and perm & PERM_WRITE
            if readable and writable:
                permission = d.Permission.READ_WRITE
            elif readable:
                permission = d.Permission.READ
            elif writable:
                permission = d.Permission.WRITE
            else:
                permission = d.Permission.NONE
            queues.append(
                d.MessageQueue(
                    topic=topic,
                    id=qid,
                    permission=permission,
                    broker=broker,
                    accept_message_types=accepts,
                )
            )
        return queues

    @staticmethod
    def _topic_name(resource: Any) -> str:
        namespace = resource.resource_namespace
        return f"{namespace}%{resource.name}" if namespace else resource.name

    async def query_route(self, call: Call, request: Any) -> Any:
        refusal = self._refused(call, RequestCode.HEART_BEAT)
        if refusal is not None:
            return s.QueryRouteResponse(status=refusal)
        name = self._topic_name(request.topic)
        topic = request.topic
        config = self.broker.topic_config_manager.select(name)
        accepts = self._accepts(config) if config is not None else [MessageType.NORMAL]
        queues = []
        own = self.broker.broker_config.broker_name
        if config is not None:  # this broker's own queues, as it has them now
            perm = config.perm & self.broker.broker_config.broker_permission
            reads, writes = config.read_queue_nums, config.write_queue_nums
            queues += self._queues(self._broker(), reads, writes, perm, accepts, topic)
        route = await self.routes.route(name)
        if route is not None:  # the other groups', as the name servers have them
            hosts = master_hosts(route)
            for data in sorted(route.queue_datas, key=lambda q: q.broker_name):
                if data.broker_name == own or data.broker_name not in hosts:
                    continue
                broker = self._broker(data.broker_name, hosts[data.broker_name])
                reads, writes = data.read_queue_nums, data.write_queue_nums
                queues += self._queues(broker, reads, writes, data.perm, accepts, topic)
        if not queues:
            return s.QueryRouteResponse(
                status=status(
                    Code.TOPIC_NOT_FOUND,
                    f"No topic route info in name server for the topic: {name}",
                )
            )
        return s.QueryRouteResponse(status=status(Code.OK), message_queues=queues)

    async def query_assignment(self, call: Call, request: Any) -> Any:
        """The proxy's answer for a non-FIFO group: one assignment per readable broker, with
        queue id -1 (the broker picks the queue when the consumer receives)."""
        refusal = self._refused(call, RequestCode.HEART_BEAT)
        if refusal is not None:
            return s.QueryAssignmentResponse(status=refusal)
        name = self._topic_name(request.topic)
        config = self.broker.topic_config_manager.select(name)
        if config is None:
            return s.QueryAssignmentResponse(
                status=status(Code.TOPIC_NOT_FOUND, f"topic not found: {name}")
            )
        perm = config.perm & self.broker.broker_config.broker_permission
        assignments = []
        if perm & PERM_READ and config.read_queue_nums > 0:
            queue = d.MessageQueue(
                topic=request.topic,
                id=-1,
                permission=d.Permission.READ_WRITE if perm & PERM_WRITE else d.Permission.READ,
                broker=self._broker(),
                accept_message_types=self._accepts(config),
            )
            assignments.append(d.Assignment(message_queue=queue))
        return s.QueryAssignmentResponse(status=status(Code.OK), assignments=assignments)

    # -- clients ------------------------------------------------------------------------------

    @staticmethod
    def _client_id(call: Call) -> str | None:
        return call.metadata.get("x-mq-client-id") or None

    def _refused(self, call: Call, code: int, fields: dict[str, str] | None = None) -> Any:
        """With aclEnable, the status refusing the call (None to serve it): the 5.x client's
        ``authorization`` (``MQv2-HMAC-SHA1 Credential=<accessKey>, SignedHeaders=
        x-mq-date-time, Signature=<hex HMAC-SHA1 of x-mq-date-time>``) checked against the
        plain_acl.yml accounts, with the permissions of the 4.x request ``code`` (SEND_MESSAGE:
        PUB on the topic; PULL_MESSAGE: SUB on the topic and the group; HEART_BEAT: a valid
        signature).  UNAUTHORIZED for who the caller is, FORBIDDEN for what it may do.

        As RocketMQ 5's proxy (PlainAccessResource.parse for gRPC, and ACL 2.0's
        DefaultAuthenticationContextBuilder), the signed ``x-mq-date-time`` is not compared
        with the clock: a signature over any date is the account's, and no window bounds the
        client's clock skew; an ``authorization`` without an ``x-mq-date-time`` is refused
        UNAUTHORIZED (``datetime is null``), before the white addresses are consulted."""
        acl = self.broker.acl
        if acl is None:
            return None
        if "authorization" in call.metadata and not call.metadata.get("x-mq-date-time"):
            log.info("grpc: ACL refused %s from %s: datetime is null", call.path, call.peer)
            return status(Code.UNAUTHORIZED, "datetime is null")
        access_key = signature = None
        text = call.metadata.get("authorization", "")
        _, _, parameters = text.partition(" ")
        for part in parameters.split(","):
            name, _, value = part.strip().partition("=")
            if name == "Credential":
                access_key = value.split("/")[0]
            elif name == "Signature":
                signature = value
        signed = call.metadata.get("x-mq-date-time", "")
        try:
            acl.validate_signed(call.peer, access_key, signed, signature, code, fields or {})
        except AclRefused as refused:
            log.info("grpc: ACL refused %s from %s: %s", call.path, call.peer, refused.remark)
            unknown = refused.reason in ("no-key", "unknown-key", "signature")
            return status(Code.UNAUTHORIZED if unknown else Code.FORBIDDEN, refused.remark)
        return None

    async def heartbeat(self, call: Call, request: Any) -> Any:
        refusal = self._refused(call, RequestCode.HEART_BEAT)
        if refusal is not None:
            return s.HeartbeatResponse(status=refusal)
        if self._client_id(call) is None:
            return s.HeartbeatResponse(
                status=status(Code.CLIENT_ID_REQUIRED, "clientId is required")
            )
        if request.client_type not in ClientType.values() or request.client_type == 0:
            return s.HeartbeatResponse(
                status=status(Code.UNRECOGNIZED_CLIENT_TYPE, "unrecognized client type")
            )
        channel = self.telemetry_channels.get(self._client_id(call) or "")
        if channel is None:  # no accepted settings: the proxy's answer
            return s.HeartbeatResponse(
                status=status(
                    Code.UNRECOGNIZED_CLIENT_TYPE, "cannot find client settings for this client"
                )
            )
        self._refresh(channel)  # keeps the client's registrations alive
        return s.HeartbeatResponse(status=status(Code.OK))

    async def notify_client_termination(self, call: Call, request: Any) -> Any:
        refusal = self._refused(call, RequestCode.HEART_BEAT)
        if refusal is not None:
            return s.NotifyClientTerminationResponse(status=refusal)
        client_id = self._client_id(call)
        if client_id is None:
            return s.NotifyClientTerminationResponse(
                status=status(Code.CLIENT_ID_REQUIRED, "clientId is required")
            )
        channel = self.telemetry_channels.get(client_id)
        if channel is not None:  # the proxy unregisters the client at once
            self._unregister(channel)
        return s.NotifyClientTerminationResponse(status=status(Code.OK))

    def _settings(self, client: Any) -> Any:
        """The server's settings for a client's (the proxy's GrpcClientSettingsManager): the
        client's own, with the producer's backoff and the broker's limits on publishing."""
        settings = d.Settings()
        settings.CopyFrom(client)
        if client.client_type == ClientType.PRODUCER:
            policy = d.RetryPolicy(max_attempts=PRODUCER_MAX_ATTEMPTS)
            backoff = policy.exponential_backoff
            backoff.initial.FromMilliseconds(PRODUCER_BACKOFF_INITIAL_MS)
            backoff.max.FromMilliseconds(PRODUCER_BACKOFF_MAX_MS)
            backoff.multiplier = PRODUCER_BACKOFF_MULTIPLIER
            settings.backoff_policy.CopyFrom(policy)
            settings.publishing.max_body_size = self.broker.store_config.max_message_size
            settings.publishing.validate_message_type = True
        elif settings.HasField("subscription"):
            group = settings.subscription.group.name
            config = self.broker.subscription_group_manager.table.get(group)
            attempts = (config.retry_max_times if config is not None else 16) + 1
            policy = d.RetryPolicy(max_attempts=attempts)
            policy.exponential_backoff.initial.FromMilliseconds(1000)
            policy.exponential_backoff.max.FromMilliseconds(60000)
            policy.exponential_backoff.multiplier = 2.0
            settings.backoff_policy.CopyFrom(policy)
            subscription = settings.subscription
            subscription.fifo = bool(config is not None and config.consume_message_orderly)
            subscription.receive_batch_size = RECEIVE_BATCH_SIZE
            subscription.long_polling_timeout.FromMilliseconds(self.MAX_LONG_POLLING_MS)
        settings.metric.on = False
        return settings

    async def telemetry(self, call: Call) -> None:
        """The bidi stream: each settings command is answered with the server's settings; a
        producer's stream is registered (see :mod:`pymq.proxy.clients`) so that the broker's
        transaction checks reach it as RecoverOrphanedTransactionCommands."""
        client_id = self._client_id(call)
        if client_id is None:
            raise GrpcError(INVALID_ARGUMENT, "x-mq-client-id is required")
        refusal = self._refused(call, RequestCode.HEART_BEAT)
        if refusal is not None:
            await call.send(s.TelemetryCommand(status=refusal).SerializeToString(), last=True)
            return
        bc = self.broker.broker_config
        channel = TelemetryChannel(
            client_id,
            call.peer,
            f"{bc.broker_ip1}:{self.broker.port}",
            language=call.metadata.get("x-mq-language", "")[:MAX_CLIENT_TEXT],
            version=call.metadata.get("x-mq-client-version", "")[:MAX_CLIENT_TEXT],
        )
        failure: GrpcError | None = None
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write_commands, call, channel, nursery.cancel_scope)
                try:
                    await self._read_commands(call, channel)
                except GrpcError as exc:
                    failure = exc
                    nursery.cancel_scope.cancel()
                else:  # the client ended its side: what is queued is sent, then the call ends
                    channel.closed = True
                    channel.outgoing.close()
        finally:
            channel.closed = True
            self._unregister(channel)
        if failure is not None:
            raise failure

    async def _read_commands(self, call: Call, channel: TelemetryChannel) -> None:
        while True:
            data = await call.receive()
            if data is None:
                return
            try:
                command = s.TelemetryCommand.FromString(data)
            except DecodeError as exc:
                raise GrpcError(INVALID_ARGUMENT, f"malformed TelemetryCommand: {exc}") from None
            if channel.answered(command):  # a thread stack or a verification result
                continue
            if command.HasField("settings"):
                refusal = await self._register(call, channel, command.settings)
                if refusal is not None:
                    reply = s.TelemetryCommand(status=refusal)
                else:
                    reply = s.TelemetryCommand(
                        status=status(Code.OK), settings=self._settings(command.settings)
                    )
                # Through the writer, so that the stream's messages never interleave.
                await channel.outgoing.send(reply.SerializeToString())

    @staticmethod
    async def _write_commands(
        call: Call, channel: TelemetryChannel, scope: trio.CancelScope
    ) -> None:
        try:
            async for message in channel.queued:
                await call.send(message)
        except Exception:  # the connection is gone: the call ends
            scope.cancel()

    async def _register(self, call: Call, channel: TelemetryChannel, settings: Any) -> Any:
        """A client's stream, registered as the proxy registers it (see
        :mod:`pymq.proxy.clients`): a producer under each topic it publishes (its group, for
        the proxy), a consumer in its group with its subscriptions.  None, or the status
        refusing the settings (a subscription not allowed); GrpcError INVALID_ARGUMENT (the
        proxy's answer: it ends the stream) for an empty SQL92 expression and for settings
        without publishing or subscription, or whose kind is not the client type's
        (:func:`_check_pub_sub`), before anything is registered."""
        kind = settings.client_type
        name = ClientType.Name(kind) if kind in ClientType.values() else str(kind)
        _check_pub_sub(settings, name)
        channel.client_type = name
        if kind == ClientType.PRODUCER:
            for resource in islice(settings.publishing.topics, MAX_TOPICS_PER_PRODUCER):
                channel.groups.add(self._topic_name(resource))
            channel.topics = set(channel.groups)
        elif settings.HasField("subscription"):
            group = self._topic_name(settings.subscription.group)
            subscriptions = []
            for entry in islice(settings.subscription.subscriptions, MAX_TOPICS_PER_PRODUCER):
                topic = self._topic_name(entry.topic)
                found = self._subscription(topic, entry.expression)
                if not isinstance(found, SubscriptionData):  # the proxy ends the stream
                    raise GrpcError(
                        INVALID_ARGUMENT,
                        f"process client telemetryCommand failed. {found.message}",
                    )
                refusal = self._refused(
                    call, RequestCode.PULL_MESSAGE, {"topic": topic, "consumerGroup": group}
                )
                if refusal is not None:
                    return refusal
                subscriptions.append(found)
            if not group:
                return status(Code.ILLEGAL_CONSUMER_GROUP, "consumer group cannot be empty")
            if channel.consumer_group and channel.consumer_group != group:
                self.broker.consumer_manager.unregister(channel.consumer_group, channel, True)
            channel.consumer_group = group
            channel.topics = {sub.topic for sub in subscriptions}
            channel.subscriptions = subscriptions
            if kind == ClientType.SIMPLE_CONSUMER:
                channel.consume_type = ConsumeType.CONSUME_ACTIVELY
            else:
                channel.consume_type = ConsumeType.CONSUME_PASSIVELY
            # The group's SQL92 subscriptions compiled and kept, as a 4.x heartbeat's are.
            await self.broker.consumer_filter_manager.register_group(group, subscriptions)
        else:
            return None
        old = self.telemetry_channels.get(channel.client_id)
        if old is not None and old is not channel:  # the client's earlier stream
            self._unregister(old)
        self.telemetry_channels[channel.client_id] = channel
        self._refresh(channel)
        return None

    @staticmethod
    def _subscription(topic: str, expression: Any) -> SubscriptionData | Any:
        """A 5.x filter expression as the 4.x subscription it is (FilterAPI.build: a SQL92
        one is not compiled here), or the status refusing it: ILLEGAL_FILTER_EXPRESSION for an
        empty SQL92 one (``expression format is not correct``, the proxy's)."""
        if expression.type != d.FilterType.SQL:
            return SubscriptionData.build(topic, expression.expression or SUB_ALL)
        text = expression.expression
        if not text.strip():
            return status(Code.ILLEGAL_FILTER_EXPRESSION, "expression format is not correct")
        return SubscriptionData.build(topic, text, expression_type=EXPRESSION_TYPE_SQL92)

    async def _filter(self, topic: str, expression: Any) -> tuple[str, RecordFilter | None] | Any:
        """A receive's or pull's filter expression: (the tag expression, the SQL92 record
        filter), one of them ``*``/None; or the status refusing it.  A SQL92 expression is
        run by the broker's SQL92 engine on each record, as a 4.x SQL92 subscription's pull
        runs it, and refused as the broker's POP refuses it: without ``enablePropertyFilter``
        INTERNAL_SERVER_ERROR (the broker's SYSTEM_ERROR and remark), one that does not
        compile ILLEGAL_FILTER_EXPRESSION (the parser's message)."""
        found = self._subscription(topic, expression)
        if not isinstance(found, SubscriptionData):
            return found
        if found.is_tag_type:
            return found.sub_string, None
        if not self.broker.broker_config.enable_property_filter:
            return status(
                Code.INTERNAL_SERVER_ERROR,
                "The broker does not support consumer to filter message by "
                + EXPRESSION_TYPE_SQL92,
            )
        try:
            compiled = await compile_expression_async(found.expression_type, found.sub_string)
        except Sql92Error as exc:
            return status(
                Code.ILLEGAL_FILTER_EXPRESSION,
                f"parse the consumer's subscription failed: {exc.remark}",
            )
        return SUB_ALL, evaluator(compiled)

    def _refresh(self, channel: TelemetryChannel) -> None:
        """The client's registrations, renewed (a heartbeat, or new settings)."""
        channel.last_heartbeat_ms = int(time.time() * 1000)
        info = ClientChannelInfo(
            channel,
            channel.client_id,
            channel.language or "OTHER",
            CURRENT_VERSION,  # the proxy's version for a client's it cannot name
            trio.current_time(),
            channel.remote_address,
        )
        for group in channel.groups:
            self.broker.producer_manager.register(group, info)
        group = channel.consumer_group
        if group:
            config = self.broker.subscription_group_manager.table.get(group)
            notify = config.notify_consumer_ids_changed_enable if config is not None else True
            subscriptions = list(channel.subscriptions)
            members = self.broker.consumer_manager.get(group)
            if members is not None and any(
                not isinstance(c, TelemetryChannel) for c in members.channels
            ):
                # A 4.x member's pulls are checked against the group's subscriptions (its
                # retry topic among them): a 5.x member's registration keeps them.
                mine = {sub.topic for sub in subscriptions}
                subscriptions += [
                    sub for topic, sub in members.subscriptions.items() if topic not in mine
                ]
            self.broker.consumer_manager.register(
                group,
                info,
                channel.consume_type,
                MessageModel.CLUSTERING,
                ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                subscriptions,
                notify and self.broker.broker_config.notify_consumer_ids_changed_enable,
            )

    def _unregister(self, channel: TelemetryChannel) -> None:
        """The client's stream ended (or it said it terminates): its registrations go."""
        self.broker.producer_manager.channel_closed(channel)
        self.broker.consumer_manager.channel_closed(channel)
        if self.telemetry_channels.get(channel.client_id) is channel:
            del self.telemetry_channels[channel.client_id]

    def clients_view(self, group: str | None = None) -> list[dict[str, Any]]:
        """The 5.x clients with an open Telemetry stream (of consumer group ``group``, or
        producing to topic ``group``, when given), as the tools show them."""
        return [
            c.view()
            for _, c in sorted(self.telemetry_channels.items())
            if not group or c.consumer_group == group or group in c.groups
        ]

    # -- sending ------------------------------------------------------------------------------

    async def send_message(self, call: Call, request: Any) -> Any:
        messages = request.messages
        count = len(messages)
        if not count:
            return s.SendMessageResponse(
                status=status(Code.MESSAGE_CORRUPTED, "no message to send")
            )
        resource = messages[0].topic
        if count > 1 and any(m.topic != resource for m in messages):
            return s.SendMessageResponse(
                status=status(Code.MESSAGE_CORRUPTED, "topic in message is not same")
            )
        topic = self._topic_name(resource)
        refusal = self._refused(call, RequestCode.SEND_MESSAGE, {"topic": topic})
        if refusal is not None:
            return s.SendMessageResponse(status=refusal)
        response = s.SendMessageResponse()
        entries = response.entries
        codes = set()
        single = count == 1
        for k, message in enumerate(messages):
            if k % SEND_YIELD_EVERY == SEND_YIELD_EVERY - 1:
                await trio.lowlevel.checkpoint()
            try:
                code = await self._send_one(call, topic, message, single, entries.add())
            except MessageRefused as exc:
                return s.SendMessageResponse(status=status(exc.code, exc.message))
            if isinstance(code, tuple):  # the broker refused it: the call's status
                return s.SendMessageResponse(status=status(*code))
            codes.add(code)
        set_status(response, codes.pop() if len(codes) == 1 else Code.MULTIPLE_RESULTS)
        return response

    async def _send_one(
        self, call: Call, topic: str, message: Any, single: bool, entry: Any
    ) -> int | tuple[int, str]:
        """One message sent, its result filled in ``entry`` (a SendResultEntry) and its code
        returned; or the broker's refusal of it, for the whole call."""
        broker = self.broker
        store_config = broker.store_config
        now_ms = int(time.time() * 1000)
        form = stored_form(
            message,
            topic,
            peer=call.peer,
            max_body_size=store_config.max_message_size,
            max_delay_ms=store_config.timer_max_delay_sec * 1000,
            now_ms=now_ms,
        )
        config = broker.topic_config_manager.select(topic)
        queue_id = -1
        if config is not None:
            self._check_type(topic, config, form.message_type)
            writes = config.write_queue_nums
            if single and form.message_group and writes > 0:
                queue_id = consistent_hash(java_string_hash(form.message_group), writes)
            elif writes > 0:
                queue_id = random.randrange(writes)
        properties = encode_properties(form.properties)
        # send_raw's way first, from the fields (no request command, header or answer); what
        # it leaves (nothing changed) goes the request's usual way.
        put = broker.send_processor.send_fields_now(
            call.peer, topic, queue_id, form.body, properties, form.sys_flag,
            form.born_timestamp, form.reconsume_times,
        )  # fmt: skip
        if put is not None:
            set_status(entry, _OK)
            entry.message_id = form.message_id
            entry.offset = put.logic_offset
            return _OK
        header = SendMessageRequestHeader(
            producer_group=topic,
            topic=topic,
            default_topic=DEFAULT_TOPIC,
            default_topic_queue_nums=DEFAULT_TOPIC_QUEUE_NUMS,
            queue_id=queue_id,
            sys_flag=form.sys_flag,
            born_timestamp=form.born_timestamp,
            flag=0,
            properties=properties,
            reconsume_times=form.reconsume_times,
        )
        answer = await send_via_broker(broker, call.peer, header, form.body)
        code = answer.code
        if code in _SEND_STATUS_CODES:
            result = _SEND_STATUS_CODES[code]
            set_status(entry, result, f"send message failed, sendStatus={code}")
            return result
        if code != ResponseCode.SUCCESS:
            return (
                _BROKER_CODES.get(code, Code.INTERNAL_SERVER_ERROR),
                answer.remark or str(code),
            )
        ext = answer.ext_fields
        set_status(entry, _OK)
        entry.message_id = form.message_id
        if form.message_type == "TRANSACTION":
            # A transaction's id is its half message's offset id (what EndTransaction needs).
            entry.transaction_id = ext.get("msgId", "")
        entry.offset = int(ext.get("queueOffset", "0"))
        recall_handle = ext.get("recallHandle")
        if recall_handle:  # a timer message's (RocketMQ 5)
            entry.recall_handle = recall_handle
        return _OK

    async def recall_message(self, call: Call, request: Any) -> Any:
        """RecallMessage: cancel the pending timer message the recall handle names, by the
        broker's RECALL_MESSAGE logic (:meth:`RecallProcessor.recall`, the one implementation:
        the same refusals, durable marker and limits).  As RocketMQ 5's proxy answers: a topic
        name that is not valid ILLEGAL_TOPIC, a topic that takes no DELAY messages
        MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, an unknown topic TOPIC_NOT_FOUND, any other
        refusal of the broker (recall disabled, a handle that does not decode or names another
        topic or broker, a due time passed or too far) INTERNAL_SERVER_ERROR with its remark;
        OK with the recalled message's id."""
        topic = self._topic_name(request.topic)
        invalid = validate_topic(request.topic.name)
        if invalid is not None:
            return s.RecallMessageResponse(status=status(Code.ILLEGAL_TOPIC, invalid))
        refusal = self._refused(call, RequestCode.RECALL_MESSAGE, {"topic": topic})
        if refusal is not None:
            return s.RecallMessageResponse(status=refusal)
        config = self.broker.topic_config_manager.select(topic)
        if config is not None:
            try:
                self._check_type(topic, config, "DELAY")
            except MessageRefused as exc:
                return s.RecallMessageResponse(status=status(exc.code, exc.message))
        result = await self.broker.recall_processor.recall(
            topic, request.recall_handle, None, host_of(call.peer)
        )
        if result.code != ResponseCode.SUCCESS:
            code = _BROKER_CODES.get(result.code, Code.INTERNAL_SERVER_ERROR)
            return s.RecallMessageResponse(status=status(code, result.remark or str(result.code)))
        return s.RecallMessageResponse(status=status(Code.OK), message_id=result.msg_id or "")

    async def end_transaction(self, call: Call, request: Any) -> Any:
        """EndTransaction: the transaction id is its half record's offset message id (the send
        answered it, or the recovery command named it); the end goes through the broker's
        END_TRANSACTION processor (:func:`end_via_broker`)."""
        topic = self._topic_name(request.topic)
        refusal = self._refused(call, RequestCode.SEND_MESSAGE, {"topic": topic})
        if refusal is not None:
            return s.EndTransactionResponse(status=refusal)
        try:
            _, _, commit_log_offset = decode_offset_msg_id(request.transaction_id)
            if commit_log_offset < 0:
                raise ValueError(request.transaction_id)
        except ValueError:
            return s.EndTransactionResponse(
                status=status(Code.INVALID_TRANSACTION_ID, "transaction id is invalid")
            )
        half = self.broker.store.look_message_by_offset(commit_log_offset)
        kind = _RESOLUTIONS.get(request.resolution, _NOT_DECIDED)
        header = EndTransactionRequestHeader(
            producer_group=topic,
            tran_state_table_offset=half.queue_offset if half is not None else -1,
            commit_log_offset=commit_log_offset,
            commit_or_rollback=kind,
            msg_id=request.message_id,
            from_transaction_check=request.source == d.TransactionSource.SOURCE_SERVER_CHECK,
            transaction_id=request.message_id,
        )
        answer = await end_via_broker(self.broker, call.peer, header)
        if answer is None or answer.code == ResponseCode.SUCCESS:
            return s.EndTransactionResponse(status=status(Code.OK))
        if answer.remark and "prepared transaction message" in answer.remark:
            code = Code.INVALID_TRANSACTION_ID
        else:
            code = _BROKER_CODES.get(answer.code, Code.INTERNAL_SERVER_ERROR)
        return s.EndTransactionResponse(status=status(code, answer.remark or str(answer.code)))

    @staticmethod
    def _check_type(topic: str, config: TopicConfig, message_type: str) -> None:
        if topic.startswith(_RETRY_OR_DLQ):
            return  # the proxy checks neither retry nor DLQ topics
        kind = topic_message_type(config)
        if kind == "MIXED" or kind == message_type:
            return
        raise MessageRefused(
            Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
            f"TopicMessageType validate failed, topic type is {kind}, "
            f"message type is {message_type}",
        )

    # -- POP consumption (SimpleConsumer) -----------------------------------------------------

    # What a receive without an invisible duration (a PushConsumer's, auto-renewed) gets.
    DEFAULT_INVISIBLE_MS = 60_000
    MAX_LONG_POLLING_MS = 20_000  # the proxy's grpcClientConsumerMaxLongPollingTimeoutMillis

    async def _consumable(self, group: str, topic: str) -> tuple[TopicConfig, int, bool] | Any:
        """The topic's config, the group's max delivery attempts and whether it receives the
        topic in order (an orderly group on a FIFO topic), or the refusing status."""
        if not group:
            return status(Code.ILLEGAL_CONSUMER_GROUP, "consumer group cannot be empty")
        config = self.broker.topic_config_manager.select(topic)
        if config is None:
            return status(Code.TOPIC_NOT_FOUND, f"topic not found: {topic}")
        perm = config.perm & self.broker.broker_config.broker_permission
        if not perm & PERM_READ:
            return status(Code.FORBIDDEN, f"the topic[{topic}] is not readable")
        group_config = await self.broker.subscription_group_manager.find_or_create(group)
        if group_config is None:
            return status(Code.CONSUMER_GROUP_NOT_FOUND, f"consumer group not found: {group}")
        if not group_config.consume_enable:
            return status(Code.FORBIDDEN, f"the consumer group[{group}] may not consume")
        fifo = bool(group_config.consume_message_orderly) and topic_message_type(config) == "FIFO"
        return config, group_config.retry_max_times + 1, fifo

    async def receive_message(self, call: Call) -> None:
        """ReceiveMessage (server streaming): the messages, or MESSAGE_NOT_FOUND once the long
        polling time passed without one."""
        data = await call.receive(timeout=self.limits.receive_timeout, last=True)
        if data is None:
            raise GrpcError(INVALID_ARGUMENT, "the call ended without a ReceiveMessageRequest")
        try:
            request = s.ReceiveMessageRequest.FromString(data)
        except DecodeError as exc:
            raise GrpcError(INVALID_ARGUMENT, f"malformed ReceiveMessageRequest: {exc}") from None
        found = self._refused(
            call,
            RequestCode.PULL_MESSAGE,
            {
                "topic": self._topic_name(request.message_queue.topic),
                "consumerGroup": self._topic_name(request.group),
            },
        ) or await self._receive(request)
        if not isinstance(found, list):
            await call.send(s.ReceiveMessageResponse(status=found).SerializeToString(), last=True)
            return
        stamp = s.ReceiveMessageResponse()
        stamp.delivery_timestamp.FromMilliseconds(int(time.time() * 1000))
        # The batch in one write: each message but the last sent ``more``.
        await call.send(stamp.SerializeToString(), more=True)
        ok = s.ReceiveMessageResponse(status=status(Code.OK)).SerializeToString()
        await call.send(ok, more=True)
        bc = self.broker.broker_config
        store_host = f"{bc.broker_ip1}:{self.broker.port}"
        for i, item in enumerate(found):
            response = s.ReceiveMessageResponse()
            to_grpc_message(
                item.message,
                receipt_handle=item.handle,
                invisible_ms=item.invisible_ms,
                attempt=item.attempt,
                store_host=store_host,
                into=response.message,
            )
            last = i == len(found) - 1
            await call.send(response.SerializeToString(), last=last, more=not last)

    async def _receive(self, request: Any) -> list[Any] | Any:
        group = self._topic_name(request.group)
        topic = self._topic_name(request.message_queue.topic)
        checked = await self._consumable(group, topic)
        if not isinstance(checked, tuple):
            return checked
        config, max_attempts, fifo = checked
        if request.HasField("invisible_duration"):
            invisible_ms = request.invisible_duration.ToMilliseconds()
        else:
            invisible_ms = self.DEFAULT_INVISIBLE_MS
        if not MIN_INVISIBLE_MS <= invisible_ms <= MAX_INVISIBLE_MS:
            return status(
                Code.ILLEGAL_INVISIBLE_TIME,
                f"the invisible time {invisible_ms} ms is not within "
                f"[{MIN_INVISIBLE_MS}, {MAX_INVISIBLE_MS}] ms",
            )
        found = await self._filter(topic, request.filter_expression)
        if not isinstance(found, tuple):
            return found
        tags, record_filter = found
        polling_ms = 0
        if request.HasField("long_polling_timeout"):
            polling_ms = min(
                request.long_polling_timeout.ToMilliseconds(), self.MAX_LONG_POLLING_MS
            )
        # Every readable queue from a random one on, whichever queue the client named: the
        # 5.x proxy pops from its broker's "acting" queue -1 (the broker then reads each of the
        # topic's queues in turn), so a receive is not held on one empty queue while others
        # have messages.
        reads = config.read_queue_nums
        start = random.randrange(reads) if reads else 0
        queue_ids = [(start + i) % reads for i in range(reads)]
        found = await self.pop.receive(
            group,
            topic,
            queue_ids,
            batch=request.batch_size or 1,
            invisible_ms=invisible_ms,
            long_polling_ms=max(0, polling_ms),
            expression=tags,
            max_attempts=max_attempts,
            fifo=fifo,
            record_filter=record_filter,
        )
        return found or status(Code.MESSAGE_NOT_FOUND, "no new message")

    async def ack_message(self, call: Call, request: Any) -> Any:
        group = self._topic_name(request.group)
        topic = self._topic_name(request.topic)
        fields = {"topic": topic, "consumerGroup": group}
        refusal = self._refused(call, RequestCode.PULL_MESSAGE, fields)
        if refusal is not None:
            return s.AckMessageResponse(status=refusal)
        if len(request.entries) > MAX_ACK_ENTRIES:
            text = f"too many entries to ack, max is {MAX_ACK_ENTRIES}"
            return s.AckMessageResponse(status=status(Code.BAD_REQUEST, text))
        response = s.AckMessageResponse()
        results = response.entries
        codes = set()
        for entry in request.entries:
            handle = entry.receipt_handle
            result = results.add()
            result.message_id = entry.message_id
            result.receipt_handle = handle
            try:
                self.pop.ack(group, topic, handle)
            except HandleError as exc:
                set_status(result, Code.INVALID_RECEIPT_HANDLE, str(exc))
                codes.add(Code.INVALID_RECEIPT_HANDLE)
            else:
                set_status(result, _OK)
                codes.add(_OK)
        if not codes:
            return s.AckMessageResponse(status=status(Code.BAD_REQUEST, "no entry to ack"))
        set_status(response, codes.pop() if len(codes) == 1 else Code.MULTIPLE_RESULTS)
        return response

    async def forward_message_to_dead_letter_queue(self, call: Call, request: Any) -> Any:
        """A received message straight into the group's DLQ (a FIFO PushConsumer gives up on
        it), acked."""
        group = self._topic_name(request.group)
        topic = self._topic_name(request.topic)
        fields = {"topic": topic, "consumerGroup": group}
        refusal = self._refused(call, RequestCode.PULL_MESSAGE, fields)
        if refusal is None:
            try:
                moved = await self.pop.forward_to_dlq(group, topic, request.receipt_handle)
            except HandleError as exc:
                refusal = status(Code.INVALID_RECEIPT_HANDLE, str(exc))
            else:
                refusal = None if moved else status(Code.INTERNAL_SERVER_ERROR, "DLQ refused it")
        return s.ForwardMessageToDeadLetterQueueResponse(status=refusal or status(Code.OK))

    async def change_invisible_duration(self, call: Call, request: Any) -> Any:
        group = self._topic_name(request.group)
        topic = self._topic_name(request.topic)
        fields = {"topic": topic, "consumerGroup": group}
        refusal = self._refused(call, RequestCode.PULL_MESSAGE, fields)
        if refusal is not None:
            return s.ChangeInvisibleDurationResponse(status=refusal)
        invisible_ms = request.invisible_duration.ToMilliseconds()
        if not 0 <= invisible_ms <= MAX_INVISIBLE_MS:
            return s.ChangeInvisibleDurationResponse(
                status=status(
                    Code.ILLEGAL_INVISIBLE_TIME,
                    f"the invisible time {invisible_ms} ms is not within [0, {MAX_INVISIBLE_MS}]",
                )
            )
        try:
            handle = self.pop.change_invisible(group, topic, request.receipt_handle, invisible_ms)
        except HandleError as exc:
            return s.ChangeInvisibleDurationResponse(
                status=status(Code.INVALID_RECEIPT_HANDLE, str(exc))
            )
        return s.ChangeInvisibleDurationResponse(status=status(Code.OK), receipt_handle=handle)

    # -- offsets and pulls (a 5.x PullConsumer) -----------------------------------------------

    def _queue(self, queue: Any) -> tuple[str, int, TopicConfig] | Any:
        """A request's message queue: (topic, queue id, config), or the refusing status."""
        topic = self._topic_name(queue.topic)
        config = self.broker.topic_config_manager.select(topic)
        if config is None:
            return status(Code.TOPIC_NOT_FOUND, f"topic not found: {topic}")
        if not 0 <= queue.id < config.read_queue_nums:
            return status(
                Code.BAD_REQUEST,
                f"queue {queue.id} is not one of the {config.read_queue_nums} queues of {topic}",
            )
        return topic, queue.id, config

    def _group_queue(self, call: Call, request: Any) -> tuple[str, int, str] | Any:
        """The (topic, queue id, group) of an offset or pull request whose caller may read the
        queue for the group (PULL_MESSAGE's permissions), or the refusing status."""
        found = self._queue(request.message_queue)
        group = self._topic_name(request.group)
        if not isinstance(found, tuple):
            return found
        topic, queue_id, _ = found
        fields = {"topic": topic, "consumerGroup": group}
        refusal = self._refused(call, RequestCode.PULL_MESSAGE, fields)
        return (topic, queue_id, group) if refusal is None else refusal

    async def update_offset(self, call: Call, request: Any) -> Any:
        """UpdateOffset: the group's consumer offset of the queue (UPDATE_CONSUMER_OFFSET)."""
        found = self._group_queue(call, request)
        if not isinstance(found, tuple):
            return s.UpdateOffsetResponse(status=found)
        topic, queue_id, group = found
        if not group or request.offset < 0:
            refusal = status(Code.BAD_REQUEST, "a group and an offset of 0 or more are needed")
            return s.UpdateOffsetResponse(status=refusal)
        self.broker.consumer_offset_manager.commit_offset(
            self._client_id(call) or call.peer, group, topic, queue_id, request.offset
        )
        return s.UpdateOffsetResponse(status=status(Code.OK))

    async def get_offset(self, call: Call, request: Any) -> Any:
        """GetOffset: the group's consumer offset of the queue; OFFSET_NOT_FOUND when none."""
        found = self._group_queue(call, request)
        if not isinstance(found, tuple):
            return s.GetOffsetResponse(status=found)
        topic, queue_id, group = found
        offset = self.broker.consumer_offset_manager.query_offset(group, topic, queue_id)
        if offset < 0:
            return s.GetOffsetResponse(
                status=status(Code.OFFSET_NOT_FOUND, f"no offset of {group} for the queue")
            )
        return s.GetOffsetResponse(status=status(Code.OK), offset=offset)

    async def query_offset(self, call: Call, request: Any) -> Any:
        """QueryOffset: the queue's first or next offset, or the first stored at a time."""
        found = self._queue(request.message_queue)
        if not isinstance(found, tuple):
            return s.QueryOffsetResponse(status=found)
        topic, queue_id, _ = found
        refusal = self._refused(call, RequestCode.HEART_BEAT)
        if refusal is not None:
            return s.QueryOffsetResponse(status=refusal)
        store = self.broker.store
        policy = request.query_offset_policy
        if policy == d.QueryOffsetPolicy.BEGINNING:
            offset = store.get_min_offset_in_queue(topic, queue_id)
        elif policy == d.QueryOffsetPolicy.END:
            offset = store.get_max_offset_in_queue(topic, queue_id)
        else:
            millis = request.timestamp.ToMilliseconds()
            offset = store.get_offset_in_queue_by_time(topic, queue_id, millis)
        return s.QueryOffsetResponse(status=status(Code.OK), offset=offset)

    async def pull_message(self, call: Call) -> None:
        """PullMessage (server streaming): messages of one queue from an offset, then the next
        offset; MESSAGE_NOT_FOUND after the long polling time when there are none, and
        ILLEGAL_OFFSET (with the offset to use) for one outside the queue."""
        data = await call.receive(timeout=self.limits.receive_timeout, last=True)
        if data is None:
            raise GrpcError(INVALID_ARGUMENT, "the call ended without a PullMessageRequest")
        try:
            request = s.PullMessageRequest.FromString(data)
        except DecodeError as exc:
            raise GrpcError(INVALID_ARGUMENT, f"malformed PullMessageRequest: {exc}") from None
        answer: list[Any] = []
        found = self._group_queue(call, request)
        refusal = found if not isinstance(found, tuple) else None
        if refusal is None:
            topic, queue_id, group = found
            chosen = await self._filter(topic, request.filter_expression)
            refusal = chosen if not isinstance(chosen, tuple) else None
        if refusal is not None:
            answer.append(s.PullMessageResponse(status=refusal))
        else:
            tags, record_filter = chosen
            answer = await self._pull(request, group, topic, queue_id, tags, record_filter)
        for i, response in enumerate(answer):
            last = i == len(answer) - 1
            await call.send(response.SerializeToString(), last=last, more=not last)

    async def _pull(
        self,
        request: Any,
        group: str,
        topic: str,
        queue_id: int,
        tags: str,
        record_filter: RecordFilter | None,
    ) -> list[Any]:
        store = self.broker.store
        sub = SubscriptionData.build(topic, tags)
        codes = None if sub.matches_all else list(sub.code_set)
        batch = max(1, min(request.batch_size or 32, MAX_PULL_BATCH))
        polling_ms = 0
        if request.HasField("long_polling_timeout"):
            polling_ms = request.long_polling_timeout.ToMilliseconds()
        until = trio.current_time() + max(0, min(polling_ms, self.MAX_LONG_POLLING_MS)) / 1000
        while True:
            result = store.get_message(
                group, topic, queue_id, request.offset, batch, codes, record_filter
            )
            if result.status in _ILLEGAL_OFFSETS:
                return [
                    s.PullMessageResponse(
                        status=status(Code.ILLEGAL_OFFSET, f"offset {request.offset} is illegal")
                    ),
                    # The nearest offset inside the queue.
                    s.PullMessageResponse(
                        next_offset=max(result.min_offset, min(request.offset, result.max_offset))
                    ),
                ]
            if result.messages or trio.current_time() >= until:
                break
            event = self.broker.pull_hold.waiter(topic, queue_id)
            try:
                with trio.move_on_at(until):
                    await event.wait()
            finally:
                self.broker.pull_hold.release(topic, queue_id, event)
        bc = self.broker.broker_config
        store_host = f"{bc.broker_ip1}:{self.broker.port}"
        messages = []
        for record, offset in zip(result.messages, result.queue_offsets, strict=True):
            try:
                ext = decode_record(record)
            except RecordError:
                continue
            if sub.tags_set and ext.tags not in sub.tags_set:
                continue
            ext.queue_offset = offset
            response = s.PullMessageResponse()
            to_grpc_message(
                ext,
                receipt_handle="",
                invisible_ms=0,
                attempt=1,
                store_host=store_host,
                into=response.message,
            )
            messages.append(response)
        code = Code.OK if messages else Code.MESSAGE_NOT_FOUND
        return [
            s.PullMessageResponse(status=status(code)),
            *messages,
            s.PullMessageResponse(next_offset=result.next_begin_offset),
        ]
