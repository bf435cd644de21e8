"""TransactionProducer: RocketMQ 4.x transactional messages from Python (TransactionMQProducer).

::

    def execute(msg: Message, arg: object) -> LocalTransactionState:
        ...  # the local transaction; its outcome decides whether consumers see the message
        return LocalTransactionState.COMMIT_MESSAGE

    def check(msg: MessageExt) -> LocalTransactionState:
        ...  # asked by the broker when it got no outcome (UNKNOW, or the END was lost)
        return LocalTransactionState.COMMIT_MESSAGE

    async with TransactionProducer("tx-group", "127.0.0.1:9876", execute=execute,
                                   check=check) as producer:
        result = await producer.send_in_transaction(Message("TopicTx", b"order 42"))

The flow is the Java client's: the message is sent as a *half* message (properties
``TRAN_MSG=true`` and ``PGROUP``, SYSFLAG prepared), which consumers do not see; ``execute`` runs
the local transaction; its state goes to the broker in a oneway END_TRANSACTION (37): COMMIT (8)
makes the message visible, ROLLBACK (12) drops it, UNKNOW (0) leaves it to the broker, which asks
a producer of the group with CHECK_TRANSACTION_STATE (39) every ``transactionCheckInterval`` until
it gets an answer or gives up after ``transactionCheckMax`` checks.  ``check`` answers that
question; the answer goes back as END_TRANSACTION with ``fromTransactionCheck=true`` on the
connection the question came on.  Any producer of the group may be asked, so ``check`` must
find the transaction by the message (its keys, body or ``UNIQ_KEY``), not by local memory.

``execute`` and ``check`` may be plain or ``async`` functions; an exception counts as UNKNOW.
A send the broker did not store (anything but SEND_OK) is rolled back without running
``execute``, as Java does.
"""

from __future__ import annotations

import enum
import inspect
import logging
import ssl
from collections.abc import Awaitable, Callable

import attrs
import trio

from pymq.client.instance import Credentials, MQClientError
from pymq.client.producer import Message, Producer, SendResult
from pymq.common.consumer import MessageQueue
from pymq.common.message_ext import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    MessageExt,
    MessageSysFlag,
)
from pymq.common.message_id import decode_offset_msg_id
from pymq.common.record import RecordError, decode_record
from pymq.remoting import headers as H
from pymq.remoting.channel import Channel
from pymq.remoting.codec import RPC_ONEWAY, RemotingCommand
from pymq.remoting.codes import RequestCode
from pymq.remoting.errors import RemotingError

log = logging.getLogger(__name__)

_end_ext = H.EndTransactionRequestHeader.producer_ext
_end_json = H.EndTransactionRequestHeader.producer_json
_END_TRANSACTION = RequestCode.END_TRANSACTION

# TransactionMQProducer's check executor: at most this many checks run at once; more wait.
CHECK_CONCURRENCY = 1
# ... and at most this many wait (checkRequestHolder's 2000); beyond, a check is dropped (the
# broker asks again at its next round).
CHECK_BACKLOG = 2000


class LocalTransactionState(enum.Enum):
    COMMIT_MESSAGE = H.TRANSACTION_COMMIT_TYPE
    ROLLBACK_MESSAGE = H.TRANSACTION_ROLLBACK_TYPE
    UNKNOW = H.TRANSACTION_NOT_TYPE


ExecuteCallback = Callable[
    [Message, object], LocalTransactionState | Awaitable[LocalTransactionState]
]
CheckCallback = Callable[[MessageExt], LocalTransactionState | Awaitable[LocalTransactionState]]


@attrs.define
class TransactionSendResult(SendResult):
    local_transaction_state: LocalTransactionState = LocalTransactionState.UNKNOW
    transaction_id: str = ""


async def _call(
    callback: Callable[..., LocalTransactionState | Awaitable[LocalTransactionState]],
    *args: object,
) -> LocalTransactionState:
    result = callback(*args)
    if inspect.isawaitable(result):
        result = await result
    if not isinstance(result, LocalTransactionState):
        raise TypeError(f"a transaction callback returned {result!r}, not LocalTransactionState")
    return result


class TransactionProducer(Producer):
    """A :class:`Producer` that also sends messages in transactions (see the module text)."""

    def __init__(
        self,
        group: str,
        namesrv_addr: str,
        *,
        execute: ExecuteCallback,
        check: CheckCallback,
        send_timeout: float = 3.0,
        credentials: Credentials | None = None,
        tls: bool | ssl.SSLContext = False,
    ) -> None:
        super().__init__(
            group, namesrv_addr, send_timeout=send_timeout, credentials=credentials, tls=tls
        )
        self.execute = execute
        self.check = check
        self._check_slots = trio.Semaphore(CHECK_CONCURRENCY)
        self._check_waiting = 0

    async def _started(self) -> None:
        await super()._started()
        assert self.client is not None
        self.client.on_check_transaction = self._on_check

    async def send_in_transaction(
        self, msg: Message, arg: object = None, *, queue: MessageQueue | None = None
    ) -> TransactionSendResult:
        """Send ``msg`` as a half message, run ``execute(msg, arg)`` and end the transaction
        with its outcome.  Raises MQClientError when the half message could not be sent."""
        assert self.client is not None
        # Java clears a transaction's delay and marks it: TRAN_MSG and the producer group.
        properties = dict(msg.properties)
        properties.pop(PROPERTY_DELAY_TIME_LEVEL, None)
        properties[PROPERTY_TRANSACTION_PREPARED] = "true"
        properties[PROPERTY_PRODUCER_GROUP] = self.group
        msg = Message(msg.topic, msg.body, msg.tags, msg.keys, properties, msg.flag)
        body, sys_flag, props, uniq = self._encode(msg)
        sys_flag |= MessageSysFlag.TRANSACTION_PREPARED_TYPE
        sent = await self._send_request(
            msg.topic,
            RequestCode.SEND_MESSAGE_V2,
            body,
            sys_flag,
            msg.flag,
            props,
            uniq,
            queue=queue,
            selector=None,
            timeout=None,
        )
        remark: str | None = None
        if sent.status != "SEND_OK":
            state = LocalTransactionState.ROLLBACK_MESSAGE
        else:
            msg.properties[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = uniq
            try:
                state = await _call(self.execute, msg, arg)
            except Exception as exc:
                log.warning("executeLocalTransaction of %s failed: %r", uniq, exc)
                remark = f"executeLocalTransactionBranch exception: {exc!r}"
                state = LocalTransactionState.UNKNOW
        await self._end(sent, state, remark)
        return TransactionSendResult(
            sent.status,
            sent.msg_id,
            sent.offset_msg_id,
            sent.queue,
            sent.queue_offset,
            local_transaction_state=state,
            transaction_id=uniq,
        )

    async def _end(
        self, sent: SendResult, state: LocalTransactionState, remark: str | None
    ) -> None:
        """END_TRANSACTION to the master that stored the half message (oneway).  A failure is
        logged, not raised: the broker will ask with CHECK_TRANSACTION_STATE."""
        assert self.client is not None
        try:
            _ip, _port, commit_log_offset = decode_offset_msg_id(sent.offset_msg_id)
        except ValueError as exc:
            log.warning("end transaction of %s: %s", sent.msg_id, exc)
            return
        ext = _end_ext(self.group, sent.queue_offset, commit_log_offset, state.value, sent.msg_id)
        request = RemotingCommand(_END_TRANSACTION, ext, b"", flag=RPC_ONEWAY, remark=remark)
        request.ext_json = _end_json(ext)
        addr = self.client.master_addr(sent.queue.broker_name)
        if addr is None:
            log.warning("end transaction of %s: no master of %s", sent.msg_id, sent.queue)
            return
        try:
            await self.client.remoting.invoke_oneway(addr, request)
        except RemotingError as exc:
            log.warning("end transaction of %s to %s failed: %s", sent.msg_id, addr, exc)

    # -- the broker's questions -----------------------------------------------------------

    async def _on_check(self, channel: Channel, req: RemotingCommand) -> None:
        """CHECK_TRANSACTION_STATE: ask ``check`` and answer with END_TRANSACTION on the same
        connection (ClientRemotingProcessor.checkTransactionState)."""
        try:
            header = H.decode(H.CheckTransactionStateRequestHeader, req.ext_fields)
            msg = decode_record(req.body)
        except (H.HeaderError, RecordError) as exc:
            log.warning("a bad CHECK_TRANSACTION_STATE from %s: %s", channel.remote_address, exc)
            return
        group = msg.properties.get(PROPERTY_PRODUCER_GROUP)
        if group != self.group:
            log.debug("checkTransactionState, pick producer by group[%s] failed", group)
            return
        if self._check_waiting >= CHECK_BACKLOG:
            log.warning("too many transaction checks waiting; %s dropped", header.msg_id)
            return
        self._check_waiting += 1
        try:
            async with self._check_slots:
                remark: str | None = None
                try:
                    state = await _call(self.check, msg)
                except Exception as exc:
                    log.warning("checkLocalTransaction of %s failed: %r", header.msg_id, exc)
                    remark = f"checkLocalTransactionState Exception: {exc!r}"
                    state = LocalTransactionState.UNKNOW
        finally:
            self._check_waiting -= 1
        uniq = msg.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or msg.msg_id
        end = H.EndTransactionRequestHeader(
            producer_group=self.group,
            tran_state_table_offset=header.tran_state_table_offset,
            commit_log_offset=header.commit_log_offset,
            commit_or_rollback=state.value,
            msg_id=uniq,
            from_transaction_check=True,
            transaction_id=header.transaction_id,
        )
        request = RemotingCommand.request(RequestCode.END_TRANSACTION, H.encode(end), oneway=True)
        request.remark = remark
        try:
            await channel.invoke_oneway(request)
        except RemotingError as exc:
            log.warning("answering the check of %s failed: %s", header.msg_id, exc)


__all__ = [
    "CheckCallback",
    "ExecuteCallback",
    "LocalTransactionState",
    "MQClientError",
    "TransactionProducer",
    "TransactionSendResult",
]
