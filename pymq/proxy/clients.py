"""A 5.x client's Telemetry stream, as the broker's services see a client's connection.

Every client that opens a Telemetry stream and sends its settings is one
:class:`TelemetryChannel`, registered as RocketMQ 5's proxy registers its gRPC clients
(ClientActivity): a producer in the broker's ProducerManager under each topic it publishes
(the proxy uses the topic as the producer group: a 5.x message's ``PGROUP``), so that the
transaction check service finds it as it finds a 4.x producer's connection; a SimpleConsumer or
PushConsumer in the ConsumerManager under its group, with its subscriptions (consume type
CONSUME_ACTIVELY for a SimpleConsumer, CONSUME_PASSIVELY for a PushConsumer, CLUSTERING), so
that consumerConnection, consumerStatus, the console and the group's 4.x members see it.  The
registrations live while the stream is open and the client heartbeats (the broker's 120 s
expiry, as for a 4.x client), and go when the stream ends.

The broker's calls to a client become TelemetryCommands on the stream, as the proxy's
GrpcClientChannel makes them: CHECK_TRANSACTION_STATE a RecoverOrphanedTransactionCommand
(oneway); GET_CONSUMER_RUNNING_INFO a PrintThreadStackTraceCommand and CONSUME_MESSAGE_DIRECTLY
a VerifyMessageCommand, each with a nonce, answered when the client's ThreadStackTrace or
VerifyMessageResult with that nonce comes back on the stream (see :meth:`TelemetryChannel.
answered` for how the answers map onto the 4.x bodies), or refused with a timeout after the
caller's timeout.  Commands wait in a queue of :data:`MAX_QUEUED_COMMANDS` (past it a
transaction check is dropped: the next check round asks again; a call is refused at once), and
at most :data:`MAX_PENDING_CALLS` calls per stream wait for an answer, so a client that does not
read its stream, or never answers, holds a bounded amount.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import attrs
import trio

from pymq.common.consumer import ConsumeType, SubscriptionData
from pymq.common.record import RecordError, decode_record
from pymq.proxy.convert import to_grpc_message
from pymq.proxy.schema import Code, service
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.remoting.errors import RemotingError, RemotingSendError, RemotingTimeoutError
from pymq.remoting.protocol import fastjson
from pymq.remoting.protocol.body import ConsumeMessageDirectlyResult, ConsumerRunningInfo

log = logging.getLogger(__name__)

MAX_QUEUED_COMMANDS = 64
MAX_PENDING_CALLS = 16
# The remark the proxy puts on a verification's result (ClientActivity.buildConsumeResult).
VERIFY_REMARK = "from gRPC client"
# A VerifyMessageResult's status -> ConsumeMessageDirectlyResult.consumeResult (the proxy's).
_VERIFY_RESULTS = {
    Code.OK: "CR_SUCCESS",
    Code.FAILED_TO_CONSUME_MESSAGE: "CR_LATER",
    Code.MESSAGE_CORRUPTED: "CR_RETURN_NULL",
}


@attrs.define
class _Call:
    code: int
    done: trio.Event = attrs.Factory(trio.Event)
    answer: Any = None


class TelemetryChannel:
    """What the broker's services need of a client's connection (``closed``,
    ``invoke_oneway``, ``invoke``), over a Telemetry stream; and what the tools show of it."""

    def __init__(
        self,
        client_id: str,
        remote_address: str,
        store_host: str,
        language: str = "",
        version: str = "",
    ) -> None:
        self.client_id = client_id
        self.remote_address = remote_address
        self.store_host = store_host
        self.language = language
        self.version = version
        self.client_type = ""  # the ClientType name its settings gave
        self.closed = False
        self.dropped = 0
        self.outgoing, self.queued = trio.open_memory_channel[bytes](MAX_QUEUED_COMMANDS)
        self.groups: set[str] = set()  # a producer's topics (its groups, for the proxy)
        self.consumer_group = ""  # a consumer's group
        self.topics: set[str] = set()  # the topics it publishes or subscribes
        self.subscriptions: list[SubscriptionData] = []
        self.consume_type = ConsumeType.CONSUME_ACTIVELY
        now = int(time.time() * 1000)
        self.connected_ms = now
        self.last_heartbeat_ms = now
        self._calls: dict[str, _Call] = {}

    def __repr__(self) -> str:
        return f"<TelemetryChannel {self.client_id} {self.remote_address}>"

    def view(self) -> dict[str, Any]:
        """The client as the console and pymq-admin show it."""
        return {
            "clientId": self.client_id,
            "clientAddr": self.remote_address,
            "language": self.language,
            "version": self.version,
            "clientType": self.client_type,
            "group": self.consumer_group,
            "producerGroups": sorted(self.groups),
            "topics": sorted(self.topics),
            "connectedAt": self.connected_ms,
            "lastHeartbeat": self.last_heartbeat_ms,
        }

    def command(self, request: RemotingCommand) -> Any | None:
        """The TelemetryCommand a oneway remoting request to the client becomes (None:
        none)."""
        if request.code != RequestCode.CHECK_TRANSACTION_STATE:
            return None
        try:
            message = decode_record(request.body)
        except RecordError as exc:
            log.warning("grpc: a transaction check for %s is unreadable: %s", self, exc)
            return None
        ext = request.ext_fields
        recover = service.RecoverOrphanedTransactionCommand(
            message=to_grpc_message(
                message,
                receipt_handle="",
                invisible_ms=0,
                attempt=0,
                store_host=self.store_host,
            ),
            # The renewed half record's offset id: what EndTransaction finds it by.
            transaction_id=ext.get("offsetMsgId", ""),
        )
        return service.TelemetryCommand(recover_orphaned_transaction_command=recover)

    async def invoke_oneway(self, request: RemotingCommand) -> None:
        command = self.command(request)
        if command is None or self.closed:
            return
        try:
            self.outgoing.send_nowait(command.SerializeToString())
        except (trio.WouldBlock, trio.ClosedResourceError):
            self.dropped += 1

    # -- calls answered on the stream ---------------------------------------------------------

    def _call_command(self, request: RemotingCommand, nonce: str) -> Any:
        if request.code == RequestCode.GET_CONSUMER_RUNNING_INFO:
            ask = service.PrintThreadStackTraceCommand(nonce=nonce)
            return service.TelemetryCommand(print_thread_stack_trace_command=ask)
        if request.code == RequestCode.CONSUME_MESSAGE_DIRECTLY:
            try:
                message = decode_record(request.body)
            except (RecordError, ValueError, IndexError) as exc:
                raise RemotingError(f"the message to verify is unreadable: {exc}") from None
            verify = service.VerifyMessageCommand(
                nonce=nonce,
                message=to_grpc_message(
                    message,
                    receipt_handle="",
                    invisible_ms=0,
                    attempt=1,
                    store_host=self.store_host,
                ),
            )
            return service.TelemetryCommand(verify_message_command=verify)
        raise RemotingError(f"request {request.code} cannot be relayed to a gRPC client")

    async def invoke(self, request: RemotingCommand, timeout: float) -> RemotingCommand:
        """The broker's call to the client (GET_CONSUMER_RUNNING_INFO, CONSUME_MESSAGE_
        DIRECTLY) as a command on the stream; its answer as the 4.x client's would be.
        RemotingTimeoutError when the client does not answer within ``timeout`` seconds."""
        if self.closed:
            raise RemotingSendError(f"the Telemetry stream of {self.client_id} is closed")
        if len(self._calls) >= MAX_PENDING_CALLS:
            raise RemotingSendError(
                f"{MAX_PENDING_CALLS} calls already wait for {self.client_id} to answer"
            )
        nonce = os.urandom(8).hex()
        command = self._call_command(request, nonce)
        call = self._calls[nonce] = _Call(request.code)
        try:
            try:
                self.outgoing.send_nowait(command.SerializeToString())
            except (trio.WouldBlock, trio.ClosedResourceError):
                raise RemotingSendError(
                    f"the Telemetry stream of {self.client_id} is not being read"
                ) from None
            with trio.move_on_after(timeout):
                await call.done.wait()
        finally:
            del self._calls[nonce]
        if call.answer is None:
            raise RemotingTimeoutError(f"{self.client_id} did not answer within {timeout} s")
        return self._response(request, call.answer)

    def answered(self, command: Any) -> bool:
        """A ThreadStackTrace or VerifyMessageResult from the client: the call with its nonce
        is answered (an unknown or late nonce is ignored, as the proxy ignores it).  False for
        any other command."""
        kind = command.WhichOneof("command")
        if kind not in ("thread_stack_trace", "verify_message_result"):
            return False
        nonce = getattr(command, kind).nonce
        call = self._calls.get(nonce)
        expected = {
            "thread_stack_trace": RequestCode.GET_CONSUMER_RUNNING_INFO,
            "verify_message_result": RequestCode.CONSUME_MESSAGE_DIRECTLY,
        }[kind]
        if call is not None and call.code == expected and call.answer is None:
            call.answer = command
            call.done.set()
        return True

    @staticmethod
    def _response(request: RemotingCommand, command: Any) -> RemotingCommand:
        """The client's answer as the broker relays a 4.x client's (the proxy's mapping):
        a thread stack with status OK is a ConsumerRunningInfo whose ``jstack`` it is,
        VERIFY_FIFO_MESSAGE_UNSUPPORTED is NO_PERMISSION, any other status SYSTEM_ERROR; a
        verification is a ConsumeMessageDirectlyResult (OK -> CR_SUCCESS,
        FAILED_TO_CONSUME_MESSAGE -> CR_LATER, MESSAGE_CORRUPTED -> CR_RETURN_NULL, any other
        status CR_THROW_EXCEPTION with the status in the remark)."""
        code = command.status.code
        if command.HasField("thread_stack_trace"):
            if code == Code.OK:
                info = ConsumerRunningInfo(jstack=command.thread_stack_trace.thread_stack_trace)
                return request.response(remark="success", body=fastjson.dumps(info))
            if code == Code.VERIFY_FIFO_MESSAGE_UNSUPPORTED:
                return request.response(ResponseCode.NO_PERMISSION, "forbidden to verify message")
            return request.response(ResponseCode.SYSTEM_ERROR, "verify message failed")
        outcome = _VERIFY_RESULTS.get(code)
        result = ConsumeMessageDirectlyResult(
            consume_result=outcome or "CR_THROW_EXCEPTION",
            remark=VERIFY_REMARK
            if outcome is not None
            else f"{VERIFY_REMARK}: {Code.Name(code) if code in Code.values() else code} "
            f"{command.status.message}".rstrip(),
        )
        return request.response(remark="success", body=fastjson.dumps(result))
