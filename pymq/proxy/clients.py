"""A 5.x client's Telemetry stream, as the broker's services see a client's connection.

A producer's stream is registered in the broker's ProducerManager under each topic it publishes
(RocketMQ 5's proxy uses the topic as the producer group: a 5.x message's ``PGROUP``), so the
transaction check service finds it as it finds a 4.x producer's connection, and its
CHECK_TRANSACTION_STATE goes to the client as a RecoverOrphanedTransactionCommand on the stream.
Commands wait in a queue of :data:`MAX_QUEUED_COMMANDS`; past it a check is dropped (the next
check round asks again), so a client that does not read its stream holds a bounded amount.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from pymq.common.record import RecordError, decode_record
from pymq.proxy.convert import to_grpc_message
from pymq.proxy.schema import service
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode

log = logging.getLogger(__name__)

MAX_QUEUED_COMMANDS = 64


class TelemetryChannel:
    """What the transaction check service needs of a producer's connection (``closed``,
    ``invoke_oneway``), over a Telemetry stream."""

    def __init__(self, client_id: str, remote_address: str, store_host: str) -> None:
        self.client_id = client_id
        self.remote_address = remote_address
        self.store_host = store_host
        self.closed = False
        self.dropped = 0
        self.outgoing, self.queued = trio.open_memory_channel[bytes](MAX_QUEUED_COMMANDS)
        self.groups: set[str] = set()

    def __repr__(self) -> str:
        return f"<TelemetryChannel {self.client_id} {self.remote_address}>"

    def command(self, request: RemotingCommand) -> Any | None:
        """The TelemetryCommand a remoting request to the client becomes (None: none)."""
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
