"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310), SEND_BATCH_MESSAGE (320), CONSUMER_SEND_MSG_BACK (36).

The produce path: decode the header, check the topic (auto-creating it from ``defaultTopic``),
build the message, put it into the store, answer with the offset message id, queue id and queue
offset.  Checks and remarks follow RocketMQ 4.9.4's SendMessageProcessor; every refusal names
what to change.
"""

from __future__ import annotations

import logging
import operator
import random
import struct
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from pymq.acl.plain import SUB
from pymq.broker.processors.recall import recall_handle_for
from pymq.broker.transaction import to_half_message
from pymq.common.address import host_of
from pymq.common.batch import decode_batch_body
from pymq.common.message_ext import (
    PROPERTY_CLUSTER,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_WAIT_STORE_MSG_OK,
    MessageExt,
    MessageSysFlag,
    decode_properties,
)
from pymq.common.native import load_native
from pymq.common.record import RecordError
from pymq.common.serde import parse_java_bool
from pymq.common.topic import (
    PERM_READ,
    PERM_WRITE,
    RETRY_GROUP_TOPIC_PREFIX,
    RMQ_SYS_TRANS_HALF_TOPIC,
    RMQ_SYS_TRANS_OP_HALF_TOPIC,
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
    TopicConfig,
    dlq_topic,
    is_writeable,
    retry_topic,
    validate_topic,
)
from pymq.remoting.channel import ANSWER_LATER, RAW_ANSWER_LATER, Channel
from pymq.remoting.codec import (
    RPC_TYPE_RESPONSE,
    RemotingCommand,
    decode_frame_at,
    encode,
    json_response_frame,
    quote_json,
    send_fields,
    send_run_fields,
)
from pymq.remoting.codes import CURRENT_VERSION, RequestCode, ResponseCode, SerializeType
from pymq.remoting.errors import ProtocolError
from pymq.remoting.headers import (
    ConsumerSendMsgBackRequestHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    decode_request,
)
from pymq.store.clean_service import disk_used_ratio
from pymq.store.config import BrokerRole
from pymq.store.results import BatchBody, PutMessageResult, PutMessageStatus, SendRun, SingleSend

if TYPE_CHECKING:
    from pymq.broker.context import BrokerContext
    from pymq.remoting.server import AccessCheck
    from pymq.store.commitlog import DispatchHint
    from pymq.store.message_store import DefaultMessageStore


log = logging.getLogger(__name__)

# TopicValidator.NOT_ALLOWED_SEND_TOPIC_SET: producers may not write these directly.
NOT_ALLOWED_SEND_TOPICS = frozenset(
    {
        SCHEDULE_TOPIC,
        RMQ_SYS_TRANS_HALF_TOPIC,
        RMQ_SYS_TRANS_OP_HALF_TOPIC,
        "TRANS_CHECK_MAX_TIME_TOPIC",
    }
)

# MixAll.DLQ_NUMS_PER_GROUP
DLQ_NUMS_PER_GROUP = 1

# MQVersion.Version.V3_4_9: from this client version on, the header's maxReconsumeTimes counts.
V3_4_9 = 111

ILLEGAL_REMARK = (
    "the message is illegal, maybe msg body or properties length not matched. "
    "msg body length limit {body} bytes, msg properties length limit 32767 bytes, "
    "topic length limit 127 bytes."
)

SERVICE_NOT_AVAILABLE_REMARK = (
    "service not available now. It may be caused by one of the following reasons: "
    "the broker's disk is full [{disks}], messages are put to the slave, "
    "message store has been shut down, etc."
)


def disk_util(store: DefaultMessageStore) -> str:
    """SendMessageProcessor.diskUtil (4.9.4): the used fraction of the partitions of the
    commit log (in DLedger mode its data directory), the consume queues and the index files,
    as ``CL:  0.42 CQ:  0.42 INDEX:  0.42`` (-1.00 for a path that cannot be read)."""
    config = store.config
    dledger = store.dledger
    physic = config.store_path_commitlog if dledger is None else dledger.dledger_config.data_path
    cl = disk_used_ratio(physic)
    cq = disk_used_ratio(config.consume_queue_dir)
    index = disk_used_ratio(config.index_dir)
    return f"CL: {cl:5.2f} CQ: {cq:5.2f} INDEX: {index:5.2f}"


def service_not_available_remark(store: DefaultMessageStore) -> str:
    """Java's one remark for a put refused SERVICE_NOT_AVAILABLE, whatever the cause (a slave
    or DLedger follower, a full disk, a stopped store): the store's own reason is logged."""
    return SERVICE_NOT_AVAILABLE_REMARK.format(disks=disk_util(store))


STATUS_RESPONSES: dict[PutMessageStatus, tuple[int, str | None]] = {
    PutMessageStatus.PUT_OK: (ResponseCode.SUCCESS, None),
    PutMessageStatus.FLUSH_DISK_TIMEOUT: (ResponseCode.FLUSH_DISK_TIMEOUT, None),
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT: (ResponseCode.FLUSH_SLAVE_TIMEOUT, None),
    PutMessageStatus.SLAVE_NOT_AVAILABLE: (ResponseCode.SLAVE_NOT_AVAILABLE, None),
    PutMessageStatus.CREATE_MAPEDFILE_FAILED: (
        ResponseCode.SYSTEM_ERROR,
        "create mapped file failed, server is busy or broken.",
    ),
    # the remark is Java's with the disks' use filled in: service_not_available_remark
    PutMessageStatus.SERVICE_NOT_AVAILABLE: (ResponseCode.SERVICE_NOT_AVAILABLE, None),
    PutMessageStatus.OS_PAGECACHE_BUSY: (
        ResponseCode.SYSTEM_ERROR,
        "[PC_SYNCHRONIZED]broker busy, start flow control for a while",
    ),
    PutMessageStatus.UNKNOWN_ERROR: (ResponseCode.SYSTEM_ERROR, "UNKNOWN_ERROR"),
    # RocketMQ 5's codes; the remark (with the config's values) is the store's reason.
    PutMessageStatus.WHEEL_TIMER_MSG_ILLEGAL: (ResponseCode.MESSAGE_ILLEGAL, None),
    PutMessageStatus.WHEEL_TIMER_NOT_ENABLE: (ResponseCode.SYSTEM_ERROR, None),
}


# Enum members read through their class are slow attribute lookups: the send path reads these
# module constants instead.
_SEND_BATCH_MESSAGE = RequestCode.SEND_BATCH_MESSAGE
# The codes send_run serves (the reply codes have their own processor).
_SEND_CODES = frozenset(
    {RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE}
)
_SUCCESS = ResponseCode.SUCCESS
_PUT_OK = PutMessageStatus.PUT_OK
_send_response_json = SendMessageResponseHeader.ext_json
_SYNC_MASTER = BrokerRole.SYNC_MASTER
_TRANSACTION_FLAGS = MessageSysFlag.TRANSACTION_ROLLBACK_TYPE  # PREPARED's and ROLLBACK's bits
_SERIALIZE_JSON = SerializeType.JSON
_WAIT_KEY = PROPERTY_WAIT_STORE_MSG_OK + "\x01"
_SEPARATED_WAIT_KEY = "\x02" + _WAIT_KEY
_sendc: Any = load_native("pymq.broker._sendc")
# The store's put requests made without their NamedTuple's Python-level __new__ (a frame per
# send on the hottest path).
_new: Any = tuple.__new__
_I32 = (-(2**31), 2**31 - 1)
_I64 = (-(2**63), 2**63 - 1)


def send_answer_frame_py(
    opaque: int,
    msg_id: str,
    queue_id: int,
    queue_offset: int,
    quoted_region: bytes,
    trace_on: bool,
    version: int,
) -> bytes:
    """Python twin of ``pymq.broker._sendc.send_answer_frame``: a successful send's whole JSON
    answer frame, byte for byte what codec.json_response_frame writes for the members of
    SendMessageResponseHeader.ext_json (``quoted_region`` already a JSON string, in UTF-8).
    A number outside its Java type raises OverflowError, a message id that is not ASCII or a
    header past 16 MiB ValueError (the caller then writes the frame the general way)."""
    for name, value, (lo, hi) in (
        ("opaque", opaque, _I32),
        ("queue_id", queue_id, _I32),
        ("queue_offset", queue_offset, _I64),
        ("version", version, _I32),
    ):
        if not lo <= operator.index(value) <= hi:
            raise OverflowError(f"{name} = {value} does not fit its record field")
    if type(msg_id) is not str or type(quoted_region) is not bytes:
        raise TypeError("send_answer_frame: msg_id str, region bytes")
    if not msg_id.isascii():
        raise ValueError("send_answer_frame: the message id is not ASCII")
    header = b"".join(
        (
            b'{"code":0,"language":"JAVA","version":%d,"opaque":%d,"flag":1,"extFields":'
            b'{"msgId":"' % (version, opaque),
            msg_id.encode("ascii"),
            b'","queueId":"%d","queueOffset":"%d","MSG_REGION":' % (queue_id, queue_offset),
            quoted_region,
            b',"TRACE_ON":"true"}' if trace_on else b',"TRACE_ON":"false"}',
            b',"serializeTypeCurrentRPC":"JSON"}',
        )
    )
    if len(header) > 0xFFFFFF:
        raise ValueError("send_answer_frame: too long")
    return _ANSWER_PREFIX.pack(4 + len(header), len(header)) + header


_ANSWER_PREFIX = struct.Struct(">ii")
send_answer_frame: Callable[..., bytes] = getattr(_sendc, "send_answer_frame", send_answer_frame_py)
"""A successful send's answer frame: in C when built, else :func:`send_answer_frame_py`."""


def _java_number(value: Any, name: str, lo: int, hi: int) -> int:
    """``value`` as an int within [lo, hi], else OverflowError (TypeError: not an int)."""
    x = operator.index(value)
    if not lo <= x <= hi:
        raise OverflowError(f"{name} = {x} does not fit its record field")
    return x


def send_answer_run_py(
    parsed: Any, hints: Any, prefix: Any, quoted_region: Any, trace_on: Any, version: Any
) -> tuple[bytes, list[tuple[Any, int, int]]]:
    """Python twin of ``pymq.broker._sendc.send_answer_run``: the answers of a run of single
    sends put together, joined: for each hint (DispatchHint) and the fields send_fields read of
    its frame (at the same index of ``parsed``, the opaque first), send_answer_frame's frame
    with the message id offset_msg_id(prefix, physical offset).  Returns (frames, totals):
    (topic, count, size) per run of hints of one topic, in order, as BrokerStats.on_put counts
    them.  ``parsed`` may be longer than ``hints``."""
    if (
        type(parsed) is not list
        or type(hints) is not list
        or not isinstance(prefix, str)
        or not isinstance(quoted_region, bytes)
    ):
        raise TypeError("send_answer_run: parsed and hints lists, prefix str, region bytes")
    if not prefix.isascii() or len(prefix) > 64:
        raise ValueError("send_answer_run: the prefix must be short ASCII")
    version = _java_number(version, "version", *_I32)
    trace = bool(trace_on)
    if len(parsed) < len(hints):
        raise ValueError("send_answer_run: fewer fields than hints")
    region = bytes(quoted_region)
    if len(region) > 0xFFFFFF:
        raise ValueError("send_answer_run: the region is too long")
    frames: list[bytes] = []
    totals: list[tuple[Any, int, int]] = []
    topic: Any = None
    run_count = run_size = 0
    for k in range(len(hints)):
        if k >= len(hints) or k >= len(parsed):  # emptied by an item's __index__ or __eq__
            raise ValueError("send_answer_run: hints or parsed changed")
        hint, fields = hints[k], parsed[k]
        if not isinstance(hint, tuple) or len(hint) < 5:
            raise TypeError("send_answer_run: a hint or fields not a tuple")
        if not isinstance(fields, tuple) or len(fields) < 1:
            raise TypeError("send_answer_run: a hint or fields not a tuple")
        opaque = _java_number(fields[0], "opaque", *_I32)
        phy = _java_number(hint[0], "offset", 0, _I64[1])
        size = _java_number(hint[1], "size", 0, _I32[1])
        queue_id = _java_number(hint[3], "queue_id", *_I32)
        queue_offset = _java_number(hint[4], "queue_offset", *_I64)
        msg_id = f"{prefix}{phy:016X}"
        try:
            frames.append(
                send_answer_frame_py(opaque, msg_id, queue_id, queue_offset, region, trace, version)
            )
        except ValueError:
            raise ValueError("send_answer_run: an answer too long") from None
        if topic is None or not (hint[2] is topic or hint[2] == topic):
            if topic is not None:
                totals.append((topic, run_count, run_size))
            topic, run_count, run_size = hint[2], 0, 0
        run_count += 1
        run_size += size
    if topic is not None:
        totals.append((topic, run_count, run_size))
    return b"".join(frames), totals


# send_fields reads a frame for send_raw; send_run_fields(buf, bounds, first, stop, judge,
# entries, parsed) a run's frames for _send_singles, in one call; the answers of the singles
# it puts and _count_puts' totals in one call of send_answer_run.  Each the C module's, or its
# Python twin.
_send_fields = send_fields
_send_run_fields = send_run_fields
_send_answer_run: Callable[..., tuple[bytes, list[tuple[Any, int, int]]]] = getattr(
    _sendc, "send_answer_run", send_answer_run_py
)


def _response(
    opaque: int, serialize_type: SerializeType, code: int, remark: str | None
) -> RemotingCommand:
    """``RemotingCommand.response(code, remark)`` of a request with ``opaque`` and
    ``serialize_type``: the answers the raw path writes without a request command."""
    return RemotingCommand(
        int(code), {}, b"", opaque, RPC_TYPE_RESPONSE, remark, serialize_type=serialize_type
    )


def _queue_count(config: TopicConfig) -> int:
    """The queue ids a send to the topic may name: the larger of its write and read counts."""
    return max(config.write_queue_nums, config.read_queue_nums)


def _checked(check: AccessCheck, channel: Channel, cmd: RemotingCommand) -> RemotingCommand | None:
    """The access check's verdict on ``cmd``; a check that raises refuses it (SYSTEM_ERROR):
    send_run must not raise once it has served a frame (the server would serve it again)."""
    try:
        return check(channel, cmd)
    except Exception as exc:
        log.exception("the access check failed on a send from %s", channel.remote_address)
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"access check failed: {exc}")


def _is_send(cmd: RemotingCommand) -> bool:
    """``cmd`` is a send request send_run serves (not a response, its header readable)."""
    return not cmd.flag & RPC_TYPE_RESPONSE and cmd.header_error is None and cmd.code in _SEND_CODES


def _error_frame(opaque: int, exc: Exception) -> bytes:
    """The SYSTEM_ERROR answer frame to a JSON request with ``opaque`` that ``exc`` stopped,
    worded as Channel._serve_inline words what a handler raises."""
    return encode(
        _response(
            opaque, _SERIALIZE_JSON, ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}"
        )
    )


class SendProcessor:
    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx
        # The broker's regionId, then quoted as a JSON string, and that as UTF-8 (_region).
        self._region_json: tuple[str, str, bytes] = ("", '""', b'""')
        self._born_hosts: dict[str, tuple[str, int]] = {}
        # send_raw's verdict on a topic by the inline path's checks (_known_topic): (the
        # topic's config, the broker's permission and cluster name it was made with, the
        # topic's queue count).  Valid while those three are the same objects and values
        # (a TopicConfig is replaced, never changed, on an update); the queue id is checked
        # per send.  A check that depends on more than these must be added to the key.
        self._raw_verdicts: dict[str, tuple[TopicConfig, int, str, int]] = {}
        self._valid_topics: set[str] = set()  # names validate_topic passed (bounded)

    # -- checks -------------------------------------------------------------------------------

    def _check_known_topic(
        self, channel: Channel, req: RemotingCommand, header: SendMessageRequestHeader
    ) -> tuple[RemotingCommand | None, TopicConfig | None]:
        """The checks that need no wait: a refusal, or the topic's config (None: the topic does
        not exist yet and may be auto-created)."""
        refusal, config = self._known_topic(header.topic, header.queue_id, channel.remote_address)
        return (None if refusal is None else req.response(*refusal)), config

    def _known_topic(
        self, topic: str, queue_id: int, peer: str
    ) -> tuple[tuple[int, str] | None, TopicConfig | None]:
        """:meth:`_check_known_topic` for the send path and the raw send path alike: a refusal
        as (code, remark), or the topic's config (None: not there yet)."""
        bc = self.ctx.broker_config
        if not is_writeable(bc.broker_permission):
            refusal = f"the broker[{bc.broker_ip1}] sending message is forbidden"
            return (ResponseCode.NO_PERMISSION, refusal), None
        if topic not in self._valid_topics:  # Java validates every send's topic
            problem = validate_topic(topic)
            if problem:
                return (ResponseCode.MESSAGE_ILLEGAL, problem), None
            if len(self._valid_topics) >= 65536:
                self._valid_topics.clear()
            self._valid_topics.add(topic)
        config = self.ctx.topic_config_manager.select(topic)
        if topic in NOT_ALLOWED_SEND_TOPICS or topic == bc.broker_cluster_name:
            refusal = f"Sending message to topic[{topic}] is forbidden."
            return (ResponseCode.NO_PERMISSION, refusal), None
        if config is None:
            return None, None
        return self._config_refusal(topic, queue_id, config, peer), config

    @staticmethod
    def _check_config(
        channel: Channel,
        req: RemotingCommand,
        header: SendMessageRequestHeader,
        config: TopicConfig,
    ) -> RemotingCommand | None:
        refusal = SendProcessor._config_refusal(
            header.topic, header.queue_id, config, channel.remote_address
        )
        return None if refusal is None else req.response(*refusal)

    @staticmethod
    def _config_refusal(
        topic: str, queue_id: int, config: TopicConfig, peer: str
    ) -> tuple[int, str] | None:
        if not is_writeable(config.perm):
            return (
                ResponseCode.NO_PERMISSION,
                f"the topic[{topic}] sending message is forbidden (perm {config.perm})",
            )
        valid = _queue_count(config)
        if queue_id >= valid:
            return (
                ResponseCode.SYSTEM_ERROR,
                f"request queueId[{queue_id}] is illegal, topic {topic} has "
                f"{valid} queues, producer: {peer}",
            )
        return None

    async def _check_topic(
        self, channel: Channel, req: RemotingCommand, header: SendMessageRequestHeader
    ) -> tuple[RemotingCommand | None, TopicConfig | None]:
        refused, config = self._check_known_topic(channel, req, header)
        if refused is not None or config is not None:
            return refused, config
        topics = self.ctx.topic_config_manager
        full = topics.auto_create_refusal()
        if full is not None:
            return req.response(
                ResponseCode.TOPIC_NOT_EXIST, f"topic[{header.topic}] not exist: {full}"
            ), None
        sys_flag = 1 if header.unit_mode else 0
        config = await topics.create_in_send_message(
            header.topic,
            header.default_topic,
            channel.remote_address,
            header.default_topic_queue_nums,
            sys_flag,
        )
        if config is None and header.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            config = await topics.create_in_send_back(
                header.topic, 1, PERM_READ | PERM_WRITE, sys_flag
            )
        if config is None:
            return req.response(
                ResponseCode.TOPIC_NOT_EXIST,
                f"topic[{header.topic}] not exist, apply first please! "
                "(create it with updateTopic, or enable autoCreateTopicEnable)",
            ), None
        return self._check_config(channel, req, header, config), config

    async def _retry_and_dlq(
        self, req: RemotingCommand, header: SendMessageRequestHeader, msg: MessageExt
    ) -> RemotingCommand | None:
        """A retry-topic send past its maximum reconsume times goes to the group's DLQ."""
        if not header.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return None
        group = header.topic[len(RETRY_GROUP_TOPIC_PREFIX) :]
        group_config = await self.ctx.subscription_group_manager.find_or_create(group)
        if group_config is None:
            return req.response(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group not exist, {group}",
            )
        max_times = group_config.retry_max_times
        if req.version >= V3_4_9 and header.max_reconsume_times is not None:
            max_times = header.max_reconsume_times
        if (header.reconsume_times or 0) >= max_times:
            dlq = dlq_topic(group)
            await self.ctx.topic_config_manager.create_in_send_back(
                dlq, DLQ_NUMS_PER_GROUP, PERM_WRITE, 0
            )
            msg.topic = dlq
            msg.queue_id = random.randrange(DLQ_NUMS_PER_GROUP)
        return None

    # -- building messages --------------------------------------------------------------------

    def _properties(self, raw: str | dict[str, str]) -> dict[str, str]:
        return self._stored_properties(
            decode_properties(raw) if isinstance(raw, str) else dict(raw)
        )

    def _stored_properties(self, props: dict[str, str]) -> dict[str, str]:
        """``props`` (changed in place) as the broker stores them: WAIT=true out, CLUSTER in."""
        if props.get(PROPERTY_WAIT_STORE_MSG_OK, "").lower() == "true":
            del props[PROPERTY_WAIT_STORE_MSG_OK]  # Java does not store WAIT=true
        props[PROPERTY_CLUSTER] = self.ctx.broker_config.broker_cluster_name
        return props

    def _message(
        self,
        channel: Channel,
        header: SendMessageRequestHeader,
        queue_id: int,
        body: bytes,
        props: dict,
        flag: int | None = None,
    ) -> MessageExt:
        return MessageExt(
            topic=header.topic,
            body=body,
            flag=header.flag if flag is None else flag,
            properties=props,
            queue_id=queue_id,
            sys_flag=header.sys_flag,
            born_timestamp=header.born_timestamp,
            born_host=self._born_host(channel),
            store_host=self.ctx.store_host,
            reconsume_times=header.reconsume_times or 0,
        )

    def _born_host(self, channel: Channel) -> tuple[str, int]:
        return self._born_host_of(channel.remote_address)

    def _born_host_of(self, peer: str) -> tuple[str, int]:
        born_host = self._born_hosts.get(peer)
        if born_host is None:  # parsed once per peer address
            if len(self._born_hosts) >= 65536:
                self._born_hosts.clear()
            born_host = self._born_hosts[peer] = host_of(peer)
        return born_host

    def _answer(
        self, req: RemotingCommand, result: PutMessageResult, queue_id: int
    ) -> RemotingCommand:
        return self._answer_to(req.opaque, req.serialize_type, req.header.topic, result, queue_id)

    def _answer_to(
        self,
        opaque: int,
        serialize_type: SerializeType,
        topic: str,
        result: PutMessageResult,
        queue_id: int,
        *,
        counted: bool = False,
    ) -> RemotingCommand:
        """The answer to a send with ``opaque`` to ``topic`` whose put gave ``result``: what
        :meth:`_answer` answers, from the request's fields alone (the raw path has no request
        command).  The put is counted in the broker's statistics unless ``counted``."""
        if result.status is _PUT_OK:  # the common case without the enum's Python hash
            code, remark = _SUCCESS, None
        else:
            if result.status in (
                PutMessageStatus.MESSAGE_ILLEGAL,
                PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
            ):
                remark = result.reason or ILLEGAL_REMARK.format(
                    body=self.ctx.store.config.max_message_size
                )
                return _response(opaque, serialize_type, ResponseCode.MESSAGE_ILLEGAL, remark)
            code, remark = STATUS_RESPONSES.get(
                result.status, (ResponseCode.SYSTEM_ERROR, result.status.value)
            )
            if code == ResponseCode.SERVICE_NOT_AVAILABLE:
                log.debug("a put was refused: %s", result.reason)
                remark = service_not_available_remark(self.ctx.store)
            elif not result.appended:
                remark = result.reason or remark
            if not result.appended:
                self.ctx.store.put_stats.failed_times += 1
                return _response(opaque, serialize_type, code, remark)
        if not counted:
            self.ctx.stats.on_put(result.msg_num, result.wrote_bytes, topic)
        bc = self.ctx.broker_config
        ext = {
            "msgId": result.msg_id,
            "queueId": str(queue_id),
            "queueOffset": str(result.logic_offset),
            "MSG_REGION": bc.region_id,
            "TRACE_ON": "true" if bc.trace_on else "false",
        }
        response = RemotingCommand(
            code, ext, b"", opaque, RPC_TYPE_RESPONSE, remark, serialize_type=serialize_type
        )
        if code == _SUCCESS:
            # The hot path's answer, its JSON written by the header's encoder.
            response.ext_json = self._success_json(result, queue_id)
        return response

    def _success_json(self, result: PutMessageResult, queue_id: int) -> str:
        """A successful send's answer extFields as JSON members (the region quoted once per
        value)."""
        bc = self.ctx.broker_config
        return _send_response_json(
            result.msg_id, queue_id, result.logic_offset, self._region()[1], bc.trace_on
        )

    def _answer_timer(
        self, req: RemotingCommand, result: PutMessageResult, queue_id: int, handle: str
    ) -> RemotingCommand:
        """:meth:`_answer` of a stored timer message, with its recall handle (RocketMQ 5)."""
        response = self._answer(req, result, queue_id)
        if result.appended:
            response.ext_fields["recallHandle"] = handle
            response.ext_json = None  # written from ext_fields, the handle included
        return response

    def _recall_handle(self, req: RemotingCommand, msg: MessageExt) -> str | None:
        if msg.topic != TIMER_TOPIC:  # the common send: no property looked at
            return None
        return recall_handle_for(req.code, msg, self.ctx.broker_config.broker_name)

    def _answer_now(
        self,
        req: RemotingCommand,
        result: PutMessageResult,
        queue_id: int,
        recall_handle: str | None = None,
    ) -> RemotingCommand | bytes:
        """:meth:`_answer` for the reader's inline path and the group commit's deferred answers
        (SYNC_FLUSH): a successful put to a JSON request is answered with its whole frame
        written at once (codec.json_response_frame), which costs a quarter of building and
        encoding the command; anything else as :meth:`_answer` (a timer message's with its
        ``recall_handle``)."""
        if recall_handle is not None:
            return self._answer_timer(req, result, queue_id, recall_handle)
        if result.status is not _PUT_OK or req.serialize_type is not _SERIALIZE_JSON:
            return self._answer(req, result, queue_id)
        self.ctx.stats.on_put(result.msg_num, result.wrote_bytes, req.header.topic)
        return self._success_frame(req.opaque, result, queue_id)

    def _region(self) -> tuple[str, str, bytes]:
        """The broker's regionId, quoted as a JSON string (MSG_REGION of a send's answer), and
        that in UTF-8: kept until the regionId changes."""
        region_id = self.ctx.broker_config.region_id
        region = self._region_json
        if region[0] != region_id:
            quoted = quote_json(region_id)
            region = self._region_json = (region_id, quoted, quoted.encode())
        return region

    def _success_frame(self, opaque: int, result: PutMessageResult, queue_id: int) -> bytes:
        """The whole answer frame of a successful put to a JSON request with ``opaque``, as
        codec.json_response_frame writes it (in one C call when the extension is built)."""
        try:
            return send_answer_frame(
                opaque, result.msg_id, queue_id, result.logic_offset, self._region()[2],
                self.ctx.broker_config.trace_on, CURRENT_VERSION,
            )  # fmt: skip
        except ValueError:  # not a plain message id: the general writer quotes it
            pass
        return json_response_frame(_SUCCESS, opaque, self._success_json(result, queue_id))

    # -- request handlers ---------------------------------------------------------------------

    def _serve_decoded(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand | bytes | None:
        """The sends' inline handler, given the frames :meth:`send_run` leaves (``req``,
        decoded; their route's ``inline``): a message
        or a batch to a topic that exists, not as the master of a SYNC_MASTER pair, served in
        the connection's reader with no task.  With SYNC_FLUSH the answer is sent by the group
        commit once the bytes are on disk, in DLedger mode once a majority of the group has
        the entries (``ANSWER_LATER``: store.defer_durable).  None hands the request to
        :meth:`send_message` (auto-create, retry topics, slave waits)."""
        store = self.ctx.store
        if store.config.broker_role is _SYNC_MASTER and store.dledger is None:
            return None
        done = self._decode_and_put(channel, req)
        if done is None or isinstance(done, RemotingCommand):
            return done
        queue_id, (result, wait, handle) = done
        if store.must_wait and store.defer_durable(
            result,
            wait,
            lambda durable: channel.answer(req, self._answer_now(req, durable, queue_id, handle)),
        ):
            return ANSWER_LATER
        return self._answer_now(req, result, queue_id, handle)

    def _decode_and_put(
        self, channel: Channel, req: RemotingCommand
    ) -> tuple[int, tuple[PutMessageResult, str | None, str | None]] | RemotingCommand | None:
        """The inline sends' common step (:meth:`_serve_decoded`, :meth:`send_now`): the
        request decoded, its topic checked and the send put synchronously (:meth:`_put_inline`);
        the queue id and the put, or the refusal, or None (nothing changed) for a send that
        :meth:`send_message` must serve (a retry topic, a topic still to create)."""
        header = decode_request(req)
        if header.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return None
        refused, config = self._check_known_topic(channel, req, header)
        if refused is not None:
            return refused
        if config is None:
            return None
        queue_id = self._queue_id(header, config)
        put = self._put_inline(channel, req, header, queue_id)
        if isinstance(put, RemotingCommand):
            return put
        return queue_id, put

    def _put_inline(
        self,
        channel: Channel,
        req: RemotingCommand,
        header: SendMessageRequestHeader,
        queue_id: int,
    ) -> tuple[PutMessageResult, str | None, str | None] | RemotingCommand:
        """The synchronous put of a send to a topic that exists (checked, not a retry topic):
        the store's one-call path (SingleSend, BatchBody) where it can, else the message(s)
        built and put by ``put_now``; the result, the stored WAIT property and a timer
        message's recall handle, or the request's refusal.  Nothing here waits for the disk or
        a slave: the caller does, as its store must."""
        store = self.ctx.store
        handle: str | None = None
        if header.batch:  # a batch of a topic that exists: inline too
            # The common batch in one C call, with no object per item; anything unusual (and
            # every refusal) is decoded item by item below.
            fast = store.put_now(_new(BatchBody, (
                header.topic, queue_id, req.body, self.ctx.broker_config.broker_cluster_name,
                header.sys_flag, header.born_timestamp, self._born_host(channel),
                header.reconsume_times or 0,
            )))  # fmt: skip
            if fast is not None:
                result, wait = fast
            else:
                msgs_or_refusal = self._batch_messages(channel, req, header, queue_id)
                if isinstance(msgs_or_refusal, RemotingCommand):
                    return msgs_or_refusal
                result = store.put_now(msgs_or_refusal)
                wait = msgs_or_refusal[0].properties.get(PROPERTY_WAIT_STORE_MSG_OK)
        else:
            # A transaction's half or rollback (sys flag 0x4 or 0xC) is put as the message
            # _single_message builds (the store's one-call put stops at it): built at once.
            fast = None if header.sys_flag & _TRANSACTION_FLAGS else store.put_now(_new(
                SingleSend, (
                    header.topic, queue_id, req.body, header.properties or "", header.flag,
                    self.ctx.broker_config.broker_cluster_name, header.sys_flag,
                    header.born_timestamp, self._born_host(channel), header.reconsume_times or 0,
                ),
            ))  # fmt: skip
            if fast is not None:
                result, wait = fast
            else:
                msg_or_refusal = self._single_message(channel, req, header, queue_id)
                if isinstance(msg_or_refusal, RemotingCommand):
                    return msg_or_refusal
                result = store.put_now(msg_or_refusal)
                wait = msg_or_refusal.properties.get(PROPERTY_WAIT_STORE_MSG_OK)
                handle = self._recall_handle(req, msg_or_refusal)
        return result, wait, handle

    def send_now(self, channel: Channel, req: RemotingCommand) -> RemotingCommand | None:
        """A send answered without waiting, for a caller that wants the answer command (the
        gRPC service's SendMessage, for what :meth:`send_fields_now` leaves, its refusals
        included): :meth:`_serve_decoded`'s way (a message or a batch to a
        topic that exists, put synchronously) on a store that waits for nothing (not
        SYNC_FLUSH, not SYNC_MASTER, not DLedger).  None, with nothing changed, hands the
        request to :meth:`send_message` (auto-create, retry topics, durable waits)."""
        if self.ctx.store.must_wait:
            return None
        done = self._decode_and_put(channel, req)
        if done is None or isinstance(done, RemotingCommand):
            return done
        queue_id, (result, _, handle) = done
        if handle is not None:
            return self._answer_timer(req, result, queue_id, handle)
        return self._answer(req, result, queue_id)

    def send_raw(self, channel: Channel, buf: bytes, start: int, end: int) -> bytes | None:
        """The common send answered from its frame (``buf[start:end]``, the length field
        stripped; :meth:`send_run` serves a frame alone through it), without the request
        command, its typed header or
        the inline dispatch: the plain single send (SEND_MESSAGE_V2, or the C++ client's
        SEND_MESSAGE) or batch (SEND_BATCH_MESSAGE) that ``_recordc.send_fields`` reads, to a
        topic already checked and writable, put by the store's one-call paths on a broker that
        is not the master of a SYNC_MASTER pair (a DLedger leader is one of those paths').
        Returns the answer frame :meth:`_serve_decoded` writes for it, or, with
        SYNC_FLUSH, RAW_ANSWER_LATER: the group commit writes that frame (or
        FLUSH_DISK_TIMEOUT's) through ``Channel.answer_frames`` once the bytes are on disk
        (tests/integration/test_send_raw.py compares the answers and the stores); in DLedger
        mode, RAW_ANSWER_LATER too: that frame once a majority of the group has the entry, or
        the answer of its failed outcome (store.hold_answer).  None,
        having changed nothing, for every other frame, which the usual path then decodes,
        checks and answers (refusals included)."""
        fields = _send_fields(buf, start, end)
        if fields is None:
            return None
        return self._send_parsed(channel, buf, end, fields)

    def _send_parsed(self, channel: Channel, buf: bytes, end: int, fields: tuple) -> bytes | None:
        """:meth:`send_raw` of the frame ending at ``end`` whose ``send_fields`` are
        ``fields``."""
        (opaque, topic, queue_id, sys_flag, born_timestamp, flag, props, reconsume, body_at,
         batch) = fields  # fmt: skip
        store = self.ctx.store
        put = self._put_raw(
            channel.remote_address, topic, queue_id,
            memoryview(buf)[body_at:end] if batch else buf[body_at:end], props or "", flag,
            sys_flag, born_timestamp, reconsume or 0, batch,
        )  # fmt: skip
        if put is None:
            return None
        # Stored: from here on the frame must be answered here, never handed to the usual
        # path (Channel serves a frame whose raw handler raised as usual: a second put).
        try:
            (result, wait), queue_id = put
            frame = self._raw_answer(opaque, topic, result, queue_id)
            if store.must_wait and store.hold_answer(
                result, wait, channel, frame, partial(self._raw_late, opaque, topic, queue_id)
            ):
                return RAW_ANSWER_LATER  # the group commit answers once the bytes are on disk
            return frame
        except Exception as exc:  # as Channel._serve_inline answers what the inline path raises
            log.exception("error serving a raw send from %s", channel.remote_address)
            return _error_frame(opaque, exc)

    def _put_raw(
        self,
        peer: str,
        topic: str,
        queue_id: int,
        body: bytes | memoryview,
        properties: str,
        flag: int,
        sys_flag: int,
        born_timestamp: int,
        reconsume_times: int,
        batch: bool,
    ) -> tuple[tuple[PutMessageResult, str | None], int] | None:
        """The raw sends' checks and put (:meth:`send_raw`, :meth:`send_fields_now`): a send
        from ``peer`` given by its fields (``batch``: ``body`` is a batch's), to a topic
        already validated and judged writable (its verdict kept), put by the store's one-call
        paths (SingleSend, BatchBody) on a broker that is not the master of a SYNC_MASTER
        pair.  The put's result and stored WAIT, and the queue id it went to; None, having
        changed nothing, for a send the usual path must serve (and word any refusal of)."""
        store = self.ctx.store
        if (
            (store.config.broker_role is _SYNC_MASTER and store.dledger is None)
            or topic not in self._valid_topics  # validated (and refused) by the usual path
            or topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
        ):
            return None
        # The inline path's checks, by their verdict on the topic; any refusal is the usual
        # path's to word.
        verdict = self._kept_verdict(topic) or self._raw_verdict(topic, peer)
        if verdict is None:
            return None
        if queue_id >= verdict[3]:
            return None
        if queue_id < 0:
            queue_id = random.randrange(max(1, verdict[0].write_queue_nums))
        cluster = self.ctx.broker_config.broker_cluster_name
        born_host = self._born_hosts.get(peer) or self._born_host_of(peer)
        if batch:  # the common batch in one C call, as the inline path puts it
            fast = store.put_now(_new(BatchBody, (
                topic, queue_id, body, cluster, sys_flag, born_timestamp, born_host,
                reconsume_times,
            )))  # fmt: skip
        else:
            fast = store.put_now(_new(SingleSend, (
                topic, queue_id, body, properties, flag, cluster, sys_flag, born_timestamp,
                born_host, reconsume_times,
            )))  # fmt: skip
        return None if fast is None else (fast, queue_id)

    def send_fields_now(
        self,
        peer: str,
        topic: str,
        queue_id: int,
        body: bytes,
        properties: str,
        sys_flag: int,
        born_timestamp: int,
        reconsume_times: int,
    ) -> PutMessageResult | None:
        """A single send given by its fields (the gRPC service's SendMessage: no request
        command, header or answer command), served as :meth:`send_raw` serves a frame's, on a
        store that waits for nothing (not SYNC_FLUSH, not SYNC_MASTER, not DLedger): the
        put's result (appended, counted in the broker's statistics).  None, having changed
        nothing, for a send the caller must then serve by the request's usual path
        (:meth:`send_now`, then :meth:`send_message`): a topic not yet validated or judged,
        a refusal to word, whatever the store's one-call put leaves to the general path (a
        timer or transactional message, properties it cannot take as they are)."""
        if self.ctx.store.must_wait:
            return None
        put = self._put_raw(
            peer, topic, queue_id, body, properties, 0, sys_flag, born_timestamp,
            reconsume_times, False,
        )  # fmt: skip
        if put is None:
            return None
        result = put[0][0]  # appended (a one-call put gives PUT_OK or nothing)
        self.ctx.stats.on_put(result.msg_num, result.wrote_bytes, topic)
        return result

    def send_run(
        self,
        channel: Channel,
        buf: bytes,
        bounds: list[int],
        first: int,
        stop: int,
        check: AccessCheck | None = None,
    ) -> tuple[bytes, int, RemotingCommand | None]:
        """The sends' run handler (their route's ``run``, Channel.raw_run_handler): the sends
        leading frames ``first..stop-1`` of a run (``bounds``: their starts and ends) served
        from their bytes in the connection's reader, each as :meth:`send_raw` serves it, the
        plain single sends among them put and answered together (:meth:`_send_singles`);
        with an access check, once decoded and checked (:meth:`_send_run_checked`).  Stops at
        the first other frame, or a send those leave (a transaction's half, a timer message,
        one that must wait): returns the answers joined, where it stopped, and that frame
        decoded if it was (a frame the check refuses is answered here in its turn, and the
        reading goes on; without a check none is decoded).  The connection gives that frame
        to the route's inline handler (:meth:`_serve_decoded`) or a task, then offers the
        rest here again (answers keep the requests' order).  A frame it has put is answered
        here or by the group commit, never served again.  Never raises."""
        if check is not None:
            return self._send_run_checked(channel, buf, bounds, first, stop, check)
        if stop - first == 1:  # a frame alone (a sync sender's usual read): send_raw's
            end = bounds[2 * first + 1]
            try:  # send_raw's two steps, here: a call fewer for each frame read alone
                fields = _send_fields(buf, bounds[2 * first], end)
                answer = None if fields is None else self._send_parsed(channel, buf, end, fields)
            except Exception:  # as Channel does: the usual path serves it
                log.exception("raw handler failed; frame decoded instead")
                return b"", first, None
            return (b"", first, None) if answer is None else (answer or b"", stop, None)
        answers: list[bytes] = []
        i = first
        read = _send_fields
        while i < stop:
            try:
                if stop - i > 1:  # a frame alone costs send_raw less
                    i, fields = self._send_singles(channel, buf, bounds, i, stop, answers)
                    if i >= stop:
                        break
                else:
                    fields = read(buf, bounds[2 * i], bounds[2 * i + 1])
            except Exception:  # a defect: what it put is answered; the rest one by one
                log.exception("serving a run of sends from %s", channel.remote_address)
                break
            if fields is None:  # no send send_raw takes: the usual path's
                break
            try:
                answer = self._send_parsed(channel, buf, bounds[2 * i + 1], fields)
            except Exception:  # as Channel does: the usual path serves it
                log.exception("raw handler failed; frame decoded instead")
                answer = None
            if answer is None:
                break
            if answer and answer is not RAW_ANSWER_LATER:
                answers.append(answer)
            i += 1
        return b"".join(answers), i, None

    def _send_run_checked(
        self,
        channel: Channel,
        buf: bytes,
        bounds: list[int],
        first: int,
        stop: int,
        check: AccessCheck,
    ) -> tuple[bytes, int, RemotingCommand | None]:
        """:meth:`send_run` with an access check: runs of the sends it passes
        (:meth:`_read_checked`), each one it refuses answered in its turn."""
        i = first
        while True:
            joined, i, cmd, refusal = self._read_checked(channel, buf, bounds, i, stop, check)
            if refusal is None:
                return joined, i, cmd
            assert cmd is not None
            if joined:  # queued before the refusal
                channel.answer_frames([joined])
            channel.answer(cmd, refusal)  # refused here, in its turn; then the rest
            i += 1
            if i >= stop:
                return b"", i, None

    def _read_checked(
        self,
        channel: Channel,
        buf: bytes,
        bounds: list[int],
        first: int,
        stop: int,
        check: AccessCheck,
    ) -> tuple[bytes, int, RemotingCommand | None, RemotingCommand | None]:
        """:meth:`send_run` with an access check: the sends leading frames ``first..stop-1``
        decoded and checked (the check reads every field and the body), those it passes then
        served from their bytes as without one.  Returns their answers joined, the first
        frame not served, that frame decoded (None if it does not decode), and the check's
        refusal of it, if that is why it stopped."""
        passed: list[RemotingCommand] = []
        j = first
        stopped_at: RemotingCommand | None = None
        refusal: RemotingCommand | None = None
        while j < stop:
            try:
                cmd = decode_frame_at(buf, bounds[2 * j], bounds[2 * j + 1])
            except ProtocolError:
                break
            if not _is_send(cmd):
                stopped_at = cmd
                break
            refusal = _checked(check, channel, cmd)
            cmd.access_checked = refusal is None
            if refusal is not None:
                stopped_at = cmd
                break
            passed.append(cmd)
            j += 1
        if j == first:
            return b"", first, stopped_at, refusal
        joined, left, _ = self.send_run(channel, buf, bounds, first, j)
        if left < j:  # left to the decoded way: checked already
            return joined, left, passed[left - first], None
        return joined, j, stopped_at, refusal

    def _send_singles(
        self,
        channel: Channel,
        buf: bytes,
        bounds: list[int],
        first: int,
        stop: int,
        answers: list[bytes],
    ) -> tuple[int, tuple | None]:
        """The plain single sends leading frames ``first..stop-1``, to topics send_raw has
        judged (its verdicts, checked as it checks them), put in one store call
        (``put_now`` of a ``SendRun``) and answered as send_raw answers each: the answers added to
        ``answers`` or, with SYNC_FLUSH, held by the group commit together.  Returns the
        first frame not served (the first that is no such send, or that the store leaves to
        the general path) and its ``send_fields``, None when it has none (send_raw leaves it
        to the usual path) or was not read."""
        store = self.ctx.store
        run_fields = _send_run_fields
        if store.config.broker_role is _SYNC_MASTER and store.dledger is None:
            return first, None
        entries: list[tuple[str, int, bytes, str, int, int, int, int]] = []
        parsed: list[tuple] = []  # the entries' fields
        # Read in C (send_fields' reading of each frame, its entry built), a topic judged by
        # _queue_count_for when it changes: nothing between a run's frames changes a verdict.
        _, fields = run_fields(buf, bounds, first, stop, self._queue_count_for, entries, parsed)
        if not entries:
            return first, fields
        hints, waits = store.put_now(
            _new(
                SendRun,
                (entries, self.ctx.broker_config.broker_cluster_name, self._born_host(channel)),
            )
        )
        if hints:
            # Stored: from here on each is answered here (or by the group commit), never
            # served again, whatever fails.
            try:
                self._answer_singles(channel, parsed, hints, waits, answers)
            except Exception:
                log.exception("error answering a run of sends from %s", channel.remote_address)
        put = len(hints)
        return first + put, parsed[put] if put < len(parsed) else fields

    def _answer_singles(
        self,
        channel: Channel,
        parsed: list[tuple],
        hints: list[DispatchHint],
        waits: list[str | None],
        answers: list[bytes],
    ) -> None:
        """_send_singles' answers to the sends ``hints`` describes (send_raw's, each), added
        to ``answers``, or with SYNC_FLUSH held by the group commit in one entry; then the
        puts counted (statistics that fail are logged and change no answer, where send_raw
        would answer SYSTEM_ERROR)."""
        store = self.ctx.store
        trace_on = self.ctx.broker_config.trace_on
        must_wait = store.must_wait
        if not must_wait:
            # Every answer now: written in one call, the frames the loop below writes.
            try:
                joined, totals = _send_answer_run(
                    parsed, hints, store.commitlog.msg_id_prefix, self._region()[2], trace_on,
                    CURRENT_VERSION,
                )  # fmt: skip
            except Exception:  # a defect: the loop below answers each
                log.exception("answering a run of sends in one call failed")
            else:
                answers.append(joined)
                on_put = self.ctx.stats.on_put
                for topic, count, size in totals:
                    on_put(count, size, topic, count)
                return
        answer_frame, msg_id = send_answer_frame, store.commitlog.msg_id
        each = must_wait and store.dledger is not None  # each answered by its own entry
        held: list[tuple[int, DispatchHint]] = []
        held_frames: list[bytes] = []
        region: bytes | None = None  # read at the first answer, inside its error handling
        # parsed may be longer than hints: the entries the store left to the general path.
        for fields, hint, wait in zip(parsed, hints, waits, strict=False):
            opaque = fields[0]
            try:
                if region is None:
                    region = self._region()[2]
                try:
                    frame = answer_frame(
                        opaque, msg_id(hint.physical_offset), hint.queue_id, hint.queue_offset,
                        region, trace_on, CURRENT_VERSION,
                    )  # fmt: skip
                except ValueError:  # an id it refuses: the Python writer says the same
                    result = self._hint_result(hint)
                    frame = self._success_frame(opaque, result, hint.queue_id)
                if each:  # once a majority has its entry, whatever WAIT says (send_raw's)
                    late = partial(self._raw_late, opaque, hint.topic, hint.queue_id)
                    if store.hold_answer(self._hint_result(hint), wait, channel, frame, late):
                        continue
                elif must_wait and store.waits_for_disk(wait):
                    held.append((opaque, hint))
                    held_frames.append(frame)
                    continue
            except Exception as exc:  # the request must still be answered
                log.exception("error answering a raw send")
                frame = _error_frame(opaque, exc)
            answers.append(frame)
        if held:
            last = held[-1][1]
            joined = b"".join(held_frames)
            try:
                if not store.hold_answers(
                    last.physical_offset + last.size, channel, joined, partial(self._late_run, held)
                ):
                    answers.append(joined)
            except Exception as exc:  # as send_raw answers a hold that raised
                log.exception("error holding the answers of a run of sends")
                answers.extend(_error_frame(opaque, exc) for opaque, _ in held)
        self._count_puts(hints)

    def _count_puts(self, hints: list[DispatchHint]) -> None:
        """The broker's put statistics of a run's puts (``stats.on_put`` per message as
        send_raw counts them), a call per topic in a row."""
        on_put = self.ctx.stats.on_put
        topic = hints[0].topic
        count = size = 0
        for hint in hints:
            if hint.topic != topic:
                on_put(count, size, topic, count)
                topic, count, size = hint.topic, 0, 0
            count += 1
            size += hint.size
        on_put(count, size, topic, count)

    def _hint_result(
        self, hint: DispatchHint, status: PutMessageStatus = _PUT_OK
    ) -> PutMessageResult:
        """The PutMessageResult put_now of a SingleSend gives for the put ``hint`` describes."""
        phy = hint.physical_offset
        return PutMessageResult(
            status, phy, hint.size, self.ctx.store.commitlog.msg_id(phy), hint.store_timestamp,
            hint.queue_offset,
        )  # fmt: skip

    def _late_run(self, held: list[tuple[int, DispatchHint]]) -> bytes:
        """The answers of a run's held sends whose bytes missed syncFlushTimeout: each
        FLUSH_DISK_TIMEOUT, as :meth:`_raw_late` words it."""
        log.warning(
            "sync flush of offset %d timed out (%d sends)",
            held[-1][1].physical_offset + held[-1][1].size,
            len(held),
        )
        frames = []
        for opaque, hint in held:
            result = self._hint_result(hint, PutMessageStatus.FLUSH_DISK_TIMEOUT)
            frames.append(self._raw_late(opaque, hint.topic, hint.queue_id, result))
        return b"".join(frames)

    def _raw_late(self, opaque: int, topic: str, queue_id: int, result: PutMessageResult) -> bytes:
        """The answer to a raw send whose bytes missed syncFlushTimeout (``result``'s status
        FLUSH_DISK_TIMEOUT; in DLedger mode the failed outcome of its entry): its put was
        counted with the SEND_OK frame made at put time."""
        try:
            return encode(
                self._answer_to(opaque, _SERIALIZE_JSON, topic, result, queue_id, counted=True)
            )
        except Exception as exc:  # the group commit must still answer
            log.exception("error answering a raw send")
            return _error_frame(opaque, exc)

    def _queue_count_for(self, topic: str) -> int | None:
        """The queues of ``topic`` a run of plain single sends may put to (_send_singles): its
        kept verdict's, None when send_raw has not judged it or its verdict no longer holds."""
        if topic not in self._valid_topics:
            return None
        verdict = self._kept_verdict(topic)
        return None if verdict is None else verdict[3]

    def _kept_verdict(self, topic: str) -> tuple[TopicConfig, int, str, int] | None:
        """The verdict :meth:`_raw_verdict` kept on ``topic`` while it still holds (the
        topic's config, the broker's permission and cluster name unchanged since); None
        otherwise."""
        verdict = self._raw_verdicts.get(topic)
        if verdict is None:
            return None
        bc = self.ctx.broker_config
        if (
            verdict[0] is not self.ctx.topic_config_manager.select(topic)
            or verdict[1] != bc.broker_permission
            or verdict[2] != bc.broker_cluster_name
        ):
            return None
        return verdict

    def _raw_verdict(self, topic: str, peer: str) -> tuple[TopicConfig, int, str, int] | None:
        """The inline path's checks (:meth:`_known_topic`) of ``topic`` for send_raw, kept:
        None when they refuse or the topic does not exist (the usual path words it)."""
        refusal, config = self._known_topic(topic, 0, peer)
        if refusal is not None or config is None:
            return None
        bc = self.ctx.broker_config
        if len(self._raw_verdicts) >= 65536:
            self._raw_verdicts.clear()
        verdict = self._raw_verdicts[topic] = (
            config,
            bc.broker_permission,
            bc.broker_cluster_name,
            _queue_count(config),
        )
        return verdict

    def _raw_answer(
        self, opaque: int, topic: str, result: PutMessageResult, queue_id: int
    ) -> bytes:
        """The answer frame of a raw send (a JSON request) whose put gave ``result``: what
        :meth:`_answer_now` writes for the usual path's request."""
        try:
            if result.status is _PUT_OK:
                self.ctx.stats.on_put(result.msg_num, result.wrote_bytes, topic)
                return self._success_frame(opaque, result, queue_id)
            return encode(self._answer_to(opaque, _SERIALIZE_JSON, topic, result, queue_id))
        except Exception as exc:  # the group commit's callback must still answer
            log.exception("error answering a raw send")
            return _error_frame(opaque, exc)

    async def send_message(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        header = decode_request(req)
        refused, config = await self._check_topic(channel, req, header)
        if refused is not None:
            return refused
        assert config is not None
        if header.batch:
            return await self._send_batch(channel, req, header, self._queue_id(header, config))
        # The answer names the queue the producer asked for, as Java's does, even when the
        # message goes to the DLQ, delayed to SCHEDULE_TOPIC_XXXX, or as a transaction's half
        # to RMQ_SYS_TRANS_HALF_TOPIC.
        queue_id = self._queue_id(header, config)
        msg_or_refusal = self._single_message(channel, req, header, queue_id)
        if isinstance(msg_or_refusal, RemotingCommand):
            return msg_or_refusal
        refused = await self._retry_and_dlq(req, header, msg_or_refusal)
        if refused is not None:
            return refused
        result = await self.ctx.store.put(msg_or_refusal)
        handle = self._recall_handle(req, msg_or_refusal)
        if handle is not None:
            return self._answer_timer(req, result, queue_id, handle)
        return self._answer(req, result, queue_id)

    @staticmethod
    def _queue_id(header: SendMessageRequestHeader, config: TopicConfig) -> int:
        if header.queue_id < 0:
            return random.randrange(max(1, config.write_queue_nums))
        return header.queue_id

    def _single_message(
        self,
        channel: Channel,
        req: RemotingCommand,
        header: SendMessageRequestHeader,
        queue_id: int,
    ) -> MessageExt | RemotingCommand:
        """The message to store (a transaction's half record for ``TRAN_MSG=true``), or the
        refusal of a transactional message when ``rejectTransactionMessage`` is set."""
        props = self._properties(header.properties or "")
        msg = self._message(channel, header, queue_id, req.body, props)
        prepared = props.get(PROPERTY_TRANSACTION_PREPARED)
        if prepared is not None and (prepared == "true" or parse_java_bool(prepared)):
            bc = self.ctx.broker_config
            if bc.reject_transaction_message:
                return req.response(
                    ResponseCode.NO_PERMISSION,
                    f"the broker[{bc.broker_ip1}] sending transaction message is forbidden",
                )
            # Java takes WAIT out of the properties and puts it back after CLUSTER.
            raw = header.properties or ""
            if PROPERTY_WAIT_STORE_MSG_OK not in props and (
                raw.startswith(_WAIT_KEY) or _SEPARATED_WAIT_KEY in raw
            ):
                props[PROPERTY_WAIT_STORE_MSG_OK] = "true"
            to_half_message(msg, props)
        return msg

    async def _send_batch(
        self,
        channel: Channel,
        req: RemotingCommand,
        header: SendMessageRequestHeader,
        queue_id: int,
    ) -> RemotingCommand:
        msgs_or_refusal = self._batch_messages(channel, req, header, queue_id)
        if isinstance(msgs_or_refusal, RemotingCommand):
            return msgs_or_refusal
        result = await self.ctx.store.put(msgs_or_refusal)
        return self._answer(req, result, queue_id)

    def _batch_messages(
        self,
        channel: Channel,
        req: RemotingCommand,
        header: SendMessageRequestHeader,
        queue_id: int,
    ) -> list[MessageExt] | RemotingCommand:
        """The messages of a batch request, or its refusal."""
        if header.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return req.response(
                ResponseCode.MESSAGE_ILLEGAL,
                "batch request does not support retry group " + header.topic,
            )
        try:
            items = decode_batch_body(req.body)
        except RecordError as exc:
            return req.response(ResponseCode.MESSAGE_ILLEGAL, f"bad batch body: {exc}")
        if not items:
            return req.response(ResponseCode.MESSAGE_ILLEGAL, "the batch is empty")
        msgs = []
        for item in items:
            props = self._stored_properties(item.properties)  # the item's own dict
            if props.get(PROPERTY_DELAY_TIME_LEVEL, "0") not in ("", "0"):
                return req.response(
                    ResponseCode.MESSAGE_ILLEGAL, "TimeDelayLevel is not supported for batch"
                )
            msgs.append(self._message(channel, header, queue_id, item.body, props, item.flag))
        return msgs

    async def consumer_send_msg_back(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        ctx = self.ctx
        head: ConsumerSendMsgBackRequestHeader = decode_request(req)
        group, offset, delay_level = head.group, head.offset, head.delay_level
        original = ctx.store.look_message_by_offset(offset)
        if ctx.acl is not None and original is not None:
            # The offset may name any topic's message: the caller needs SUB on the topic it is
            # stored in (its own group's retry topic for a message already retried), as a
            # consumer of that topic has, before anything is created or copied.
            refusal = ctx.acl.authorize(channel, req, ((original.topic, SUB),))
            if refusal is not None:
                return refusal
        group_config = await ctx.subscription_group_manager.find_or_create(group)
        if group_config is None:
            return req.response(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                f"subscription group not exist, {group}",
            )
        if not is_writeable(ctx.broker_config.broker_permission):
            return req.response(
                ResponseCode.NO_PERMISSION,
                f"the broker[{ctx.broker_config.broker_ip1}] sending message is forbidden",
            )
        if group_config.retry_queue_nums <= 0:
            return req.response()
        new_topic = retry_topic(group)
        queue_id = random.randrange(group_config.retry_queue_nums)
        sys_flag = 1 if head.unit_mode else 0
        config = await ctx.topic_config_manager.create_in_send_back(
            new_topic, group_config.retry_queue_nums, PERM_READ | PERM_WRITE, sys_flag
        )
        if not is_writeable(config.perm):
            return req.response(
                ResponseCode.NO_PERMISSION, f"the topic[{new_topic}] sending message is forbidden"
            )
        if original is None:
            return req.response(
                ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {offset}"
            )
        props = dict(original.properties)
        props.setdefault(PROPERTY_RETRY_TOPIC, original.topic)
        props.pop(PROPERTY_WAIT_STORE_MSG_OK, None)
        max_times = group_config.retry_max_times
        header_max = head.max_reconsume_times
        if req.version >= V3_4_9 and header_max is not None:
            max_times = header_max
        props.pop(PROPERTY_DELAY_TIME_LEVEL, None)
        if original.reconsume_times >= max_times or delay_level < 0:
            new_topic = dlq_topic(group)
            queue_id = random.randrange(DLQ_NUMS_PER_GROUP)
            await ctx.topic_config_manager.create_in_send_back(
                new_topic, DLQ_NUMS_PER_GROUP, PERM_WRITE, 0
            )
        else:
            if delay_level == 0:
                delay_level = 3 + original.reconsume_times
            props[PROPERTY_DELAY_TIME_LEVEL] = str(delay_level)
        props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, original.msg_id)
        msg = MessageExt(
            topic=new_topic,
            body=original.body,
            flag=original.flag,
            properties=props,
            queue_id=queue_id,
            sys_flag=original.sys_flag,
            born_timestamp=original.born_timestamp,
            born_host=original.born_host,
            store_host=ctx.store_host,
            reconsume_times=original.reconsume_times + 1,
        )
        result = await ctx.store.put(msg)
        if result.is_ok:
            ctx.stats.on_send_back(group, props[PROPERTY_RETRY_TOPIC])
            return req.response()
        if result.status is PutMessageStatus.SERVICE_NOT_AVAILABLE:
            # Java answers the status's name (a slave's refusal included), not pymq's reason
            log.debug("a send-back was refused: %s", result.reason)
            return req.response(ResponseCode.SYSTEM_ERROR, result.status.value)
        return req.response(ResponseCode.SYSTEM_ERROR, result.reason or result.status.value)
