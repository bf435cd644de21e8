"""The pymq Producer: sync, oneway, batch, and to a chosen queue, over RocketMQ's protocol.

::

    async with Producer("my-group", "127.0.0.1:9876") as producer:
        result = await producer.send(Message("TopicTest", b"hello", tags="TagA", keys="k1"))

It speaks what a Java 4.x producer speaks: SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320),
bodies of 4 KiB and more zlib-compressed, a UNIQ_KEY per message, and up to three attempts on
other queues when a broker refuses or fails.

Request-reply (RocketMQ 4.6+)::

    reply = await producer.request(Message("Orders", b"question"), timeout=3.0)

    # the responder, in a consumer's handler:
    await producer.send(create_reply_message(request_msg, b"answer"))

A reply (MSG_TYPE ``reply``) goes as SEND_REPLY_MESSAGE_V2 (325), once: the broker pushes it
to the requester, which it names (REPLY_TO_CLIENT), and refuses it when that client is gone.
"""

from __future__ import annotations

import itertools
import logging
import ssl
import time
import uuid
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import trio

from pymq.acl.rpc_hook import AclSigner
from pymq.client.instance import (
    CREATE_REPLY_MESSAGE_EXCEPTION,
    REQUEST_TIMEOUT_EXCEPTION,
    ClientService,
    Credentials,
    MQClientError,
    PendingReply,
    RequestTimeoutError,
)
from pymq.common.batch import BATCH_ITEM_HEAD, BATCH_ITEM_MAGIC, BATCH_PROPS_LEN
from pymq.common.clock import now_ms
from pymq.common.consumer import HeartbeatData, MessageQueue, ProducerData
from pymq.common.message_ext import (
    NAME_VALUE_SEPARATOR,
    PROPERTY_CLUSTER,
    PROPERTY_CORRELATION_ID,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_MESSAGE_REPLY_TO_CLIENT,
    PROPERTY_MESSAGE_TTL,
    PROPERTY_MESSAGE_TYPE,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    PROPERTY_WAIT_STORE_MSG_OK,
    REPLY_MESSAGE_FLAG,
    MessageExt,
    MessageSysFlag,
    encode_properties,
)
from pymq.common.message_id import UniqueIdGenerator
from pymq.common.native import load_native
from pymq.common.recall_handle import RecallHandle
from pymq.common.topic import (
    AUTO_CREATE_TOPIC_KEY_TOPIC,
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    reply_topic,
)
from pymq.remoting.channel import Channel
from pymq.remoting.codec import (
    _FRAME_PREFIX,
    CURRENT_VERSION,
    RPC_ONEWAY,
    RemotingCommand,
    _quote,
    next_opaque,
)
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.remoting.errors import RemotingError
from pymq.remoting.headers import (
    HeaderError,
    RecallMessageRequestHeader,
    RecallMessageResponseHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
)
from pymq.remoting.headers import decode as decode_header
from pymq.remoting.headers import encode as encode_header

native_extension: Any = load_native("pymq.client._producerc")

log = logging.getLogger(__name__)

# DefaultMQProducer defaults.
COMPRESS_OVER = 4096
COMPRESS_LEVEL = 5
RETRY_TIMES_WHEN_SEND_FAILED = 2
DEFAULT_TOPIC_QUEUE_NUMS = 4
HEARTBEAT_PERIOD = 30.0
ROUTE_REFRESH_PERIOD = 30.0


_v2_ext = SendMessageRequestHeader.v2_ext
_v2_json = SendMessageRequestHeader.v2_json
_v2_json_prefix = SendMessageRequestHeader.v2_json_prefix
_SendResponse = SendMessageResponseHeader
_SEND_MESSAGE_V2 = RequestCode.SEND_MESSAGE_V2  # per send: enum reads via the class are slow
_SEND_BATCH_MESSAGE = RequestCode.SEND_BATCH_MESSAGE
_SEND_REPLY_MESSAGE_V2 = RequestCode.SEND_REPLY_MESSAGE_V2
# The start of a SEND_MESSAGE_V2's, SEND_BATCH_MESSAGE's or SEND_REPLY_MESSAGE_V2's header, as
# codec._json_header writes it, up to the opaque; and the end of its extFields
# (reconsumeTimes, unitMode, batch).
_V2_FRAME_HEAD: dict[int, bytes] = {
    code: f'{{"code":{int(code)},"language":"JAVA","version":{CURRENT_VERSION},"opaque":'.encode()
    for code in (_SEND_MESSAGE_V2, _SEND_BATCH_MESSAGE, _SEND_REPLY_MESSAGE_V2)
}
_V2_FRAME_TAIL: dict[int, bytes] = {
    _SEND_MESSAGE_V2: b'"j":"0","k":"false","m":"false"},"serializeTypeCurrentRPC":"JSON"}',
    _SEND_BATCH_MESSAGE: b'"j":"0","k":"false","m":"true"},"serializeTypeCurrentRPC":"JSON"}',
    _SEND_REPLY_MESSAGE_V2: b'"j":"0","k":"false","m":"false"},"serializeTypeCurrentRPC":"JSON"}',
}
# The batch member (m) of each code's tail, as its signature reads it.
_V2_BATCH_VALUE: dict[int, str] = {
    _SEND_MESSAGE_V2: "false",
    _SEND_BATCH_MESSAGE: "true",
    _SEND_REPLY_MESSAGE_V2: "false",
}
_LONG_LONG = (-(2**63), 2**63 - 1)


def _frame_signer(channel: Channel) -> tuple[bool, AclSigner | None]:
    """Whether a send to ``channel`` is written whole (Producer._v2_frame), and signed by which
    AclSigner (None: unsigned); not whole when the channel signs some other way (the request
    command then goes to its signer)."""
    signer = channel.signer
    if signer is None:
        return True, None
    if type(signer) is AclSigner and signer.signs_frames():
        return True, signer
    return False, None


def _frame_of(
    head: bytes, opaque: int, fixed: bytes, queue_id: int, sys_flag: int, born: int, flag: int,
    props: str, tail: bytes, body: bytes,
) -> bytes:  # fmt: skip
    """A producer's send frame: TOTAL and HEADER lengths, then the JSON header head + opaque +
    fixed + "e".."h" (the numbers) + "i" (props quoted) + tail, then body."""
    fields = f'"e":"{queue_id}","f":"{sys_flag}","g":"{born}","h":"{flag}","i":{_quote(props)},'
    header = b"".join((head, str(opaque).encode(), fixed, fields.encode(), tail))
    if len(header) > 0x7FFFFFFF - 4 or len(body) > 0x7FFFFFFF - 4 - len(header):
        raise OverflowError("the frame is too long")
    return _FRAME_PREFIX.pack(4 + len(header) + len(body), len(header)) + header + body


def send_frame_py(
    head: Any, opaque: Any, fixed: Any, queue_id: Any, sys_flag: Any, born: Any, flag: Any,
    props: Any, tail: Any, body: Any,
) -> bytes | None:  # fmt: skip
    """Python twin of ``pymq.client._producerc.send_frame``: the whole frame of a producer's
    send as Producer._v2_frame writes it, for a body of bytes, ASCII properties and five ints
    within a long long; None for anything else (_v2_frame then writes it the general way)."""
    if type(head) is not bytes or type(fixed) is not bytes or type(tail) is not bytes:
        raise TypeError("head, fixed and tail must be bytes")
    if type(body) is not bytes or type(props) is not str or not props.isascii():
        return None
    for value in (opaque, queue_id, sys_flag, born, flag):
        if type(value) is not int or not _LONG_LONG[0] <= value <= _LONG_LONG[1]:
            return None
    return _frame_of(head, opaque, fixed, queue_id, sys_flag, born, flag, props, tail, body)


_send_frame: Callable[..., bytes | None] = getattr(native_extension, "send_frame", send_frame_py)
"""The frame _v2_frame writes for ASCII properties: C when built, else its twin."""

_SEND_OK = "SEND_OK"
STORED_CODES: dict[int, str] = {
    ResponseCode.SUCCESS: _SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: "FLUSH_DISK_TIMEOUT",
    ResponseCode.FLUSH_SLAVE_TIMEOUT: "FLUSH_SLAVE_TIMEOUT",
    ResponseCode.SLAVE_NOT_AVAILABLE: "SLAVE_NOT_AVAILABLE",
}


@attrs.define
class Message:
    topic: str
    body: bytes
    tags: str | None = None
    keys: str | Sequence[str] | None = None
    properties: dict[str, str] = attrs.Factory(dict)
    flag: int = 0
    delay_level: int = 0

    def all_properties(self) -> dict[str, str]:
        props = dict(self.properties)
        if self.tags:
            props[PROPERTY_TAGS] = self.tags
        if self.keys:
            props[PROPERTY_KEYS] = self.keys if isinstance(self.keys, str) else " ".join(self.keys)
        if self.delay_level > 0:
            props[PROPERTY_DELAY_TIME_LEVEL] = str(self.delay_level)
        return props


def _send_code(msg: Message) -> int:
    """The request code a single message goes with: SEND_REPLY_MESSAGE_V2 for a reply
    (MSG_TYPE ``reply``, as Java's MQClientAPIImpl decides), else SEND_MESSAGE_V2."""
    if msg.properties.get(PROPERTY_MESSAGE_TYPE) == REPLY_MESSAGE_FLAG:
        return _SEND_REPLY_MESSAGE_V2
    return _SEND_MESSAGE_V2


def create_reply_message(request: MessageExt | Message, body: bytes) -> Message:
    """The reply to ``request`` (a message a consumer received from ``Producer.request``):
    Java's MessageUtil.createReplyMessage.  It goes to the requester's cluster's reply topic
    with MSG_TYPE ``reply`` and the request's CORRELATION_ID, REPLY_TO_CLIENT and TTL; send it
    with ``Producer.send``.  MQClientError (10007) when the request has no CLUSTER property
    (it did not come through a broker)."""
    props = request.properties
    cluster = props.get(PROPERTY_CLUSTER)
    if cluster is None:
        raise MQClientError(
            CREATE_REPLY_MESSAGE_EXCEPTION,
            f"create reply message fail, requestMessage error, property[{PROPERTY_CLUSTER}] "
            "is null.",
        )
    reply = {PROPERTY_MESSAGE_TYPE: REPLY_MESSAGE_FLAG}
    for key in (PROPERTY_CORRELATION_ID, PROPERTY_MESSAGE_REPLY_TO_CLIENT, PROPERTY_MESSAGE_TTL):
        value = props.get(key)
        if value is not None:
            reply[key] = value
    return Message(reply_topic(cluster), body, properties=reply)


_UNIQ_HEAD = f"{PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX}{NAME_VALUE_SEPARATOR}"
_WAIT_TAIL = f"{PROPERTY_SEPARATOR}{PROPERTY_WAIT_STORE_MSG_OK}{NAME_VALUE_SEPARATOR}true"
_TAGS_HEAD = f"{PROPERTY_TAGS}{NAME_VALUE_SEPARATOR}"


def _is_plain(msg: Message) -> bool:
    """Whether ``msg`` sets no property of its own but its tags (no properties, keys or
    delay): its properties text is then :func:`_plain_properties`'s."""
    return not (msg.properties or msg.keys or msg.delay_level > 0)


def _plain_properties(tags: str | None, uniq: str) -> str:
    """The properties text of a plain message (:func:`_is_plain`) with unique id ``uniq`` and
    WAIT=true: what ``encode_properties`` writes of its ``all_properties()`` with those two
    added, written at once."""
    if tags:
        return f"{_TAGS_HEAD}{tags}{PROPERTY_SEPARATOR}{_UNIQ_HEAD}{uniq}{_WAIT_TAIL}"
    return f"{_UNIQ_HEAD}{uniq}{_WAIT_TAIL}"


_NO_TOPIC: Any = object()
_I32_MAX = 0x7FFFFFFF
# What batch_body_py adds to a plain message's tags and id: TAGS\1..\2, UNIQ_KEY\1 and \2WAIT\1true.
_TAGS_FIXED = len(_TAGS_HEAD) + 1
_UNIQ_FIXED = len(_UNIQ_HEAD) + len(_WAIT_TAIL)


def _plain_item_size(cls: Any, msg: Any, uniq: Any, topic: Any) -> bool:
    """Whether batch_body takes ``msg`` with id ``uniq``: an ASCII str id, a message exactly of
    ``cls`` (of ``topic`` unless _NO_TOPIC) with a bytes body, str or no tags, no keys, no
    properties, no delay, an int32 flag, and an item that fits its fields."""
    if type(uniq) is not str or not uniq.isascii() or type(msg) is not cls:
        return False
    if topic is not _NO_TOPIC:
        t = msg.topic
        if not (t is topic or (type(t) is str and t == topic)):
            return False
    body, tags, keys = msg.body, msg.tags, msg.keys
    props, flag, delay = msg.properties, msg.flag, msg.delay_level
    if not (
        type(body) is bytes
        and (tags is None or type(tags) is str)
        and (keys is None or (type(keys) is str and not keys))
        and type(props) is dict
        and not props
        and type(flag) is int
        and type(delay) is int
        and -(2**31) <= flag <= _I32_MAX
        and delay == 0
        and len(body) <= _I32_MAX
    ):
        return False
    props_len = _UNIQ_FIXED + len(uniq)
    if tags:
        try:
            props_len += _TAGS_FIXED + len(tags.encode())
        except UnicodeEncodeError:  # a lone surrogate: the general writer raises
            return False
    return props_len <= 32767 and 20 + len(body) + 2 + props_len <= _I32_MAX


def batch_body_py(cls: Any, msgs: Any, ids: Any, topic: Any = _NO_TOPIC) -> bytes | None:
    """Python twin of ``pymq.client._producerc.batch_body``: the SEND_BATCH_MESSAGE body
    (:func:`_batch_body_py`'s) of ``msgs``, a list or tuple of plain messages of type ``cls``
    (and ``topic``) with their ids; None when one is not plain (properties, keys, a delay,
    anything not of the expected built-in types) or its text would not fit."""
    if not isinstance(cls, type):
        raise TypeError("cls must be a type")
    if topic is not _NO_TOPIC and type(topic) is not str:
        raise TypeError("topic must be a str")
    if type(msgs) is not list and type(msgs) is not tuple:
        return None
    if type(ids) is not list:
        raise TypeError("ids must be a list")
    if len(ids) != len(msgs):
        raise ValueError(f"{len(msgs)} messages but {len(ids)} ids")
    for msg, uniq in zip(msgs, ids, strict=True):
        if not _plain_item_size(cls, msg, uniq, topic):
            return None
    return _batch_body_py(msgs, ids)


_batch_body: Callable[..., bytes | None] = getattr(native_extension, "batch_body", batch_body_py)
"""_batch_body_py's bytes for plain messages of one topic (none delayed): C when built, else its
twin; None when one is not such."""


def _batch_body_py(msgs: Sequence[Message], ids: list[str]) -> bytes:
    """The SEND_BATCH_MESSAGE body of ``msgs``, each with its unique id (``ids``) and
    WAIT=true: what ``encode_batch_body`` writes for their items (the message's properties,
    then the id's and WAIT's, replacing any the message has), without an item or a
    properties dict per message where the message sets neither key itself."""
    parts: list[bytes] = []
    head = BATCH_ITEM_HEAD.pack
    props_len = BATCH_PROPS_LEN.pack
    fixed = BATCH_ITEM_HEAD.size + 2
    for msg, uniq in zip(msgs, ids, strict=True):
        if _is_plain(msg):  # the common message
            text = _plain_properties(msg.tags, uniq)
        else:
            user = msg.all_properties()
            if PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX in user or PROPERTY_WAIT_STORE_MSG_OK in user:
                user[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = uniq
                user[PROPERTY_WAIT_STORE_MSG_OK] = "true"
                text = encode_properties(user)
            else:
                text = encode_properties(user)
                text = f"{text}{PROPERTY_SEPARATOR}{_UNIQ_HEAD}{uniq}{_WAIT_TAIL}"
        props = text.encode()
        body = msg.body
        size = len(body)
        item = head(fixed + size + len(props), BATCH_ITEM_MAGIC, 0, msg.flag, size)
        parts += (item, body, props_len(len(props)), props)
    return b"".join(parts)


_OTHER_TOPIC = "message's topic not equal mq's topic"  # Java's MQClientException, a send's queue


def _selected(mq: MessageQueue, topic: str) -> MessageQueue:
    """The queue a selector chose, for a send of ``topic``: Java's sendSelectImpl does not
    compare topics, and sendKernelImpl sends the message's topic to the chosen broker and queue
    id, so a queue of another topic must not carry the request there."""
    return mq if mq.topic == topic else MessageQueue(topic, mq.broker_name, mq.queue_id)


def _answer_to_callback(
    response: RemotingCommand | None,
    error: Exception | None,
    uniq: str,
    mq: MessageQueue,
    addr: str,
    callback: Callable[[SendResult | None, Exception | None], None],
) -> None:
    """An asynchronous send's answer as a command (anything but the plain SEND_OK its frame
    gives, or ``error`` when there is none) to the caller's ``callback``."""
    if response is None:
        callback(None, MQClientError(-1, str(error), f"send to {addr}"))
        return
    status = STORED_CODES.get(response.code)
    if status is None:
        callback(None, MQClientError(response.code, response.remark, f"send to {addr}"))
        return
    try:
        head = _SendResponse.from_ext(response.ext_fields)
    except HeaderError as exc:
        callback(None, MQClientError(response.code, str(exc), f"send to {addr}"))
        return
    queue = (
        mq
        if head.queue_id == mq.queue_id
        else MessageQueue(mq.topic, mq.broker_name, head.queue_id)
    )
    callback(
        SendResult(status, uniq, head.msg_id, queue, head.queue_offset, head.recall_handle), None
    )


@attrs.define
class SendResult:
    status: str
    msg_id: str
    offset_msg_id: str
    queue: MessageQueue
    queue_offset: int
    recall_handle: str | None = None
    """A timer message's recall handle (RocketMQ 5): what :meth:`Producer.recall_message`
    takes to cancel it while it is pending; None for other sends."""


class Producer(ClientService):
    is_producer = True

    def __init__(
        self,
        group: str,
        namesrv_addr: str,
        *,
        send_timeout: float = 3.0,
        credentials: Credentials | None = None,
        tls: bool | ssl.SSLContext = False,
    ) -> None:
        super().__init__(group, namesrv_addr, credentials=credentials, tls=tls)
        self.send_timeout = send_timeout
        self._ids = UniqueIdGenerator()
        self._counter = itertools.count()
        self._publish_cache: dict[str, tuple[object, list[MessageQueue], bool]] = {}
        self._header_json: dict[str, str] = {}
        self._frame_json: dict[str, bytes] = {}  # _v2_frame's header text after the opaque

    async def _started(self) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(self._housekeeping)

    async def _housekeeping(self) -> None:
        assert self.client is not None
        while True:
            await trio.sleep(HEARTBEAT_PERIOD)
            for topic in list(self.client.routes):
                try:
                    await self.client.fetch_route(topic)
                except MQClientError as exc:
                    log.warning("route refresh for %s failed: %s", topic, exc)
            await self._heartbeat()

    async def _heartbeat(self) -> None:
        assert self.client is not None
        data = HeartbeatData(self.client.client_id, [ProducerData(self.group)], [])
        await self.client.send_heartbeat(data, all_brokers=False)

    # -- routes and queues ----------------------------------------------------------------

    async def _route_after_failure(self, topic: str, code: int | None = None) -> None:
        """A send to a master that is gone (``code`` None: no answer) or no longer a master
        (``code`` SERVICE_NOT_AVAILABLE; other refusals change nothing) -- a DLedger group's
        failover -- fetches the topic's route again before the next try, rather than at the
        next refresh (every 30 s): the next try goes to the new master once the name server
        knows it."""
        assert self.client is not None
        if code is not None and code != ResponseCode.SERVICE_NOT_AVAILABLE:
            return
        try:
            await self.client.fetch_route(topic)
        except MQClientError as exc:
            log.debug("route of %s after a failed send: %s", topic, exc)

    def _cached_queues(self, topic: str) -> tuple[object, list[MessageQueue], bool] | None:
        """:meth:`publish_queues`' answer kept for ``topic``, while its route is the client's."""
        assert self.client is not None
        cached = self._publish_cache.get(topic)
        if cached is not None and cached[0] is self.client.routes.get(topic):
            return cached
        return None

    async def publish_queues(self, topic: str) -> tuple[list[MessageQueue], bool]:
        """Writable queues of ``topic``; from TBW102 (auto-create) when the topic is unknown."""
        assert self.client is not None
        cached = self._cached_queues(topic)
        if cached is not None:
            return cached[1], cached[2]
        known = set(self.client.broker_addrs)
        route = await self.client.route(topic)
        from_default = False
        if route is None:
            route = await self.client.fetch_route(AUTO_CREATE_TOPIC_KEY_TOPIC)
            if route is None:
                raise MQClientError(
                    ResponseCode.TOPIC_NOT_EXIST,
                    f"No route info of this topic: {topic}, and no TBW102 route for auto-create",
                )
            from_default = True
        if set(self.client.broker_addrs) - known:
            await self._heartbeat()
        queues = []
        per_broker: dict[str, int] = {}
        for name, queue_id in self.client.writable_queues(route):
            if from_default:
                if per_broker.get(name, 0) >= DEFAULT_TOPIC_QUEUE_NUMS:
                    continue
                per_broker[name] = per_broker.get(name, 0) + 1
            if self.client.master_addr(name):
                queues.append(MessageQueue(topic, name, queue_id))
        if not queues:
            # a group without a master now (a DLedger group electing one): the next send
            # asks the name server again rather than waiting for the next route refresh
            self.client.routes.pop(topic, None)
            raise MQClientError(ResponseCode.TOPIC_NOT_EXIST, f"no writable queue for {topic}")
        if not from_default:
            # Valid while the client keeps this route object (a refresh replaces it).
            self._publish_cache[topic] = (route, queues, from_default)
        return queues, from_default

    # -- sending --------------------------------------------------------------------------

    def _encode(self, msg: Message) -> tuple[bytes, int, str, str]:
        if _is_plain(msg):  # the common message: its properties' text written at once
            uniq = self._ids.create()
            text = _plain_properties(msg.tags, uniq)
        else:
            props = msg.all_properties()
            uniq = props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or self._ids.create()
            props[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = uniq
            props.setdefault(PROPERTY_WAIT_STORE_MSG_OK, "true")
            text = encode_properties(props)
        body = msg.body
        sys_flag = 0
        if len(body) >= COMPRESS_OVER:
            body = zlib.compress(body, COMPRESS_LEVEL)
            sys_flag |= MessageSysFlag.COMPRESSED_FLAG
        return body, sys_flag, text, uniq

    def _header(
        self, mq: MessageQueue, sys_flag: int, flag: int, props: str, batch: bool
    ) -> dict[str, str]:
        return _v2_ext(
            self.group, mq.topic, mq.queue_id, sys_flag, int(time.time() * 1000), flag, props, batch
        )

    def _v2_request(
        self, code: int, mq: MessageQueue, sys_flag: int, flag: int, props: str, body: bytes
    ) -> RemotingCommand:
        """A SEND_MESSAGE_V2 or SEND_BATCH_MESSAGE to ``mq``, its header's JSON written once
        (the group and topic quoted once per topic)."""
        header = self._header(mq, sys_flag, flag, props, code == _SEND_BATCH_MESSAGE)
        request = RemotingCommand(code, header, body)
        fixed = self._header_json.get(mq.topic)
        if fixed is None:
            fixed = self._header_json[mq.topic] = _v2_json_prefix(self.group, mq.topic)
        request.ext_json = _v2_json(fixed, header)
        return request

    def _v2_frame(
        self,
        code: int,
        mq: MessageQueue,
        sys_flag: int,
        flag: int,
        props: str,
        body: bytes,
        opaque: int,
        born_timestamp: int,
        signer: AclSigner | None = None,
    ) -> bytes:
        """The whole frame of the SEND_MESSAGE_V2 or SEND_BATCH_MESSAGE (``code``)
        :meth:`_v2_request` makes (with ``opaque`` and ``born_timestamp``), written in one go:
        what ``codec.encode`` writes for that request (tests/unit/test_client_frames.py
        compares them), without the extFields dict, the command or the header writer's steps.
        With ``signer``, signed as the channel's signer signs that request."""
        fixed = self._frame_json.get(mq.topic)
        if fixed is None:
            text = ',"flag":0,"extFields":{' + _v2_json_prefix(self.group, mq.topic)
            fixed = self._frame_json[mq.topic] = text.encode()
        head, tail = _V2_FRAME_HEAD[code], _V2_FRAME_TAIL[code]
        if signer is not None:
            # The extFields' values in Java's key order (AccessKey, then a..m), as
            # acl.plain.signed_content reads them from the request _v2_request makes.
            values = (
                f"{self.group}{mq.topic}{AUTO_CREATE_TOPIC_KEY_TOPIC}4{mq.queue_id}{sys_flag}"
                f"{born_timestamp}{flag}{props}0false{_V2_BATCH_VALUE[code]}"
            )
            tail = signer.send_tail(values, body, tail)
        frame = _send_frame(
            head, opaque, fixed, mq.queue_id, sys_flag, born_timestamp, flag, props, tail, body
        )
        if frame is not None:  # the common send (ASCII properties)
            return frame
        return _frame_of(
            head, opaque, fixed, mq.queue_id, sys_flag, born_timestamp, flag, props, tail, body
        )

    def _batch_body(self, msgs: Sequence[Message]) -> tuple[str, bytes, list[str]]:
        """The topic, SEND_BATCH_MESSAGE body and unique ids of a batch; ValueError for an
        empty one, one of several topics, or one with a delayed message."""
        if not msgs:
            raise ValueError("an empty batch")
        topic = msgs[0].topic
        ids = self._ids.create_many(len(msgs))
        # Plain messages of one topic, none delayed: the body in one C call, checks and all
        # (a topic of a str subclass, an enum member say, goes the Python way).
        body = _batch_body(Message, msgs, ids, topic) if type(topic) is str else None
        if body is None:
            if any(m.topic != topic for m in msgs):
                raise ValueError("every message of a batch must have the same topic")
            if any(m.delay_level for m in msgs):
                raise ValueError("delayed messages cannot be batched")
            body = _batch_body_py(msgs, ids)
        return topic, body, ids

    async def send_async(
        self,
        msg: Message,
        callback: Callable[[SendResult | None, Exception | None], None],
        *,
        queue: MessageQueue | None = None,
        timeout: float | None = None,
    ) -> None:
        """Send without waiting for the answer: ``callback(result, None)`` once the broker
        stored it, or ``callback(None, error)``.  Java's ``send(msg, SendCallback)``.

        Returns as soon as the request is queued for writing (after a route lookup the first
        time a topic is seen).  The callback runs in the connection's reader task and must not
        block.  Unlike :meth:`send`, a failure is reported, not retried on another queue.
        """
        client = self.client
        assert client is not None
        if queue is not None and queue.topic != msg.topic:
            raise MQClientError(-1, _OTHER_TOPIC)
        body = msg.body
        code: int = _SEND_MESSAGE_V2
        if _is_plain(msg) and len(body) < COMPRESS_OVER:
            # _encode's common case (plain and not compressed) read here, without its calls.
            sys_flag, uniq = 0, self._ids.create()
            props = _plain_properties(msg.tags, uniq)
        else:
            body, sys_flag, props, uniq = self._encode(msg)
            code = _send_code(msg)
        # publish_queues' and channel()'s common cases read here, without their coroutines.
        cached = self._cached_queues(msg.topic)
        if cached is not None:
            queues = cached[1]
        else:
            queues, _ = await self.publish_queues(msg.topic)  # learns the broker addresses too
        mq = queue or queues[next(self._counter) % len(queues)]
        addr = client.master_addr(mq.broker_name)
        if addr is None:
            raise MQClientError(-1, f"no master address for broker {mq.broker_name}")
        channel = client.remoting.open_channel(addr) or await client.remoting.channel(addr)

        def on_response(response: RemotingCommand | None, error: Exception | None) -> None:
            _answer_to_callback(response, error, uniq, mq, addr, callback)

        def on_fields(fields: tuple) -> None:
            # The plain SUCCESS answer, read from its frame (remoting.channel.raw_send_answers):
            # the SendResult on_response makes of it.  Written out here, as in _send_request:
            # a shared helper measurably cost the client's publish (scripts/bench_instructions.py).
            _, msg_id, queue_id, queue_offset, _ = fields
            queue = (
                mq if queue_id == mq.queue_id else MessageQueue(mq.topic, mq.broker_name, queue_id)
            )
            callback(SendResult(_SEND_OK, uniq, msg_id, queue, queue_offset), None)

        timeout = self.send_timeout if timeout is None else timeout
        whole, signer = _frame_signer(channel)
        if whole:  # the common send: its frame written in one go
            opaque = next_opaque()
            born = now_ms()
            frame = self._v2_frame(code, mq, sys_flag, msg.flag, props, body, opaque, born, signer)
            channel.invoke_callback_frame(opaque, frame, code, timeout, on_response, on_fields)
            return
        request = self._v2_request(code, mq, sys_flag, msg.flag, props, body)
        channel.invoke_callback(request, timeout, on_response)

    async def send_batch_async(
        self,
        msgs: Sequence[Message],
        callback: Callable[[SendResult | None, Exception | None], None],
        *,
        queue: MessageQueue | None = None,
        timeout: float | None = None,
    ) -> None:
        """Send messages of one topic in one SEND_BATCH_MESSAGE request without waiting for
        the answer: ``callback`` as :meth:`send_async`'s, with the batch's SendResult (as
        :meth:`send_batch`'s).  Java's ``send(Collection<Message>, SendCallback)``.  Raises
        ValueError, sending nothing, for a batch :meth:`send_batch` refuses."""
        # send_async's steps, written out again: a helper shared with send_async measurably cost
        # its publish (scripts/bench_instructions.py).
        client = self.client
        assert client is not None
        topic, body, ids = self._batch_body(msgs)
        if queue is not None and queue.topic != topic:
            raise MQClientError(-1, _OTHER_TOPIC)
        uniq = ",".join(ids)
        cached = self._cached_queues(topic)
        queues = cached[1] if cached is not None else (await self.publish_queues(topic))[0]
        mq = queue or queues[next(self._counter) % len(queues)]
        addr = client.master_addr(mq.broker_name)
        if addr is None:
            raise MQClientError(-1, f"no master address for broker {mq.broker_name}")
        channel = client.remoting.open_channel(addr) or await client.remoting.channel(addr)

        def on_response(response: RemotingCommand | None, error: Exception | None) -> None:
            _answer_to_callback(response, error, uniq, mq, addr, callback)

        def on_fields(fields: tuple) -> None:
            _, msg_id, queue_id, queue_offset, _ = fields
            queue = (
                mq if queue_id == mq.queue_id else MessageQueue(mq.topic, mq.broker_name, queue_id)
            )
            callback(SendResult(_SEND_OK, uniq, msg_id, queue, queue_offset), None)

        timeout = self.send_timeout if timeout is None else timeout
        code = _SEND_BATCH_MESSAGE
        whole, signer = _frame_signer(channel)
        if whole:
            opaque = next_opaque()
            born = int(time.time() * 1000)
            frame = self._v2_frame(code, mq, 0, 0, "", body, opaque, born, signer)
            channel.invoke_callback_frame(opaque, frame, code, timeout, on_response, on_fields)
            return
        channel.invoke_callback(self._v2_request(code, mq, 0, 0, "", body), timeout, on_response)

    async def send(
        self,
        msg: Message,
        *,
        queue: MessageQueue | None = None,
        selector: Callable[[list[MessageQueue]], MessageQueue] | None = None,
        timeout: float | None = None,
    ) -> SendResult:
        """Send and wait for the broker's answer; raises MQClientError when every try failed.
        A reply (:func:`create_reply_message`) is sent once, as SEND_REPLY_MESSAGE_V2: the
        broker's refusal (the requester is gone) would only come again, each try storing the
        reply once more."""
        body, sys_flag, props, uniq = self._encode(msg)
        return await self._send_request(
            msg.topic,
            _send_code(msg),
            body,
            sys_flag,
            msg.flag,
            props,
            uniq,
            queue=queue,
            selector=selector,
            timeout=timeout,
        )

    async def request(self, msg: Message, timeout: float = 3.0) -> MessageExt:
        """Send ``msg`` as a request and wait for its reply: Java's ``request(msg, timeout)``.

        The message goes as an ordinary send with CORRELATION_ID (a new UUID), REPLY_TO_CLIENT
        (this producer's clientId) and TTL (``timeout`` in ms) added (``msg`` itself is not
        changed); a responder answers with :func:`create_reply_message`, which the broker
        pushes here.  Returns the reply (its topic, body and properties; ARRIVE_TIME and
        PUSH_REPLY_TIME added).  Raises the send's MQClientError when the request was not
        stored, RequestTimeoutError (10006) when no reply came within ``timeout`` seconds of
        the call."""
        client = self.client
        assert client is not None
        deadline = trio.current_time() + timeout
        correlation = str(uuid.uuid4())
        props = dict(msg.properties)
        props[PROPERTY_CORRELATION_ID] = correlation
        props[PROPERTY_MESSAGE_REPLY_TO_CLIENT] = client.client_id
        props[PROPERTY_MESSAGE_TTL] = str(int(timeout * 1000))
        request = attrs.evolve(msg, properties=props)
        if msg.topic not in client.routes:
            # As Java's prepareSendRequest: the brokers must know this client (its heartbeat
            # names it as a producer) before a reply can be pushed to it.
            await self.publish_queues(msg.topic)
            await self._heartbeat()
        pending = client.pending_replies[correlation] = PendingReply()
        try:
            await self.send(request, timeout=max(deadline - trio.current_time(), 0.001))
            with trio.move_on_at(deadline):
                await pending.arrived.wait()
            if pending.reply is None:
                raise RequestTimeoutError(
                    REQUEST_TIMEOUT_EXCEPTION,
                    f"send request message to <{msg.topic}> OK, but wait reply message "
                    f"timeout, {int(timeout * 1000)} ms.",
                )
            return pending.reply
        finally:
            client.pending_replies.pop(correlation, None)

    async def send_batch(
        self, msgs: Sequence[Message], *, queue: MessageQueue | None = None
    ) -> SendResult:
        """Send messages of one topic in one SEND_BATCH_MESSAGE request."""
        topic, body, ids = self._batch_body(msgs)
        return await self._send_request(
            topic,
            RequestCode.SEND_BATCH_MESSAGE,
            body,
            0,
            0,
            "",
            ",".join(ids),
            queue=queue,
            selector=None,
            timeout=None,
        )

    async def recall_message(
        self, topic: str, recall_handle: str, *, timeout: float | None = None
    ) -> str:
        """Cancel a pending timer message by the ``recall_handle`` its send returned
        (:attr:`SendResult.recall_handle`): RocketMQ 5's ``recallMessage(topic, handle)``.
        Returns the recalled message's id; raises MQClientError with the broker's code and
        remark when it refuses (ILLEGAL_OPERATION for a bad handle or a message already due,
        NO_PERMISSION when the broker's ``recallMessageEnable`` is false), or when the handle
        does not decode (nothing sent)."""
        client = self.client
        assert client is not None
        if topic.startswith((RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX)):
            raise MQClientError(-1, "topic is not supported")
        try:
            handle = RecallHandle.decode(recall_handle)
        except ValueError as exc:
            raise MQClientError(-1, str(exc)) from None
        addr = client.master_addr(handle.broker_name)
        if addr is None:
            await client.fetch_route(topic)
            addr = client.master_addr(handle.broker_name)
        if addr is None:
            raise MQClientError(-1, "The broker service address not found")
        header = RecallMessageRequestHeader(self.group, topic, recall_handle, handle.broker_name)
        request = RemotingCommand.request(RequestCode.RECALL_MESSAGE, encode_header(header))
        timeout = self.send_timeout if timeout is None else timeout
        response = await client.invoke(addr, request, timeout)
        if response.code != ResponseCode.SUCCESS:
            raise MQClientError(response.code, response.remark, f"recall on {addr}")
        try:
            return decode_header(RecallMessageResponseHeader, response.ext_fields).msg_id
        except HeaderError as exc:
            raise MQClientError(response.code, str(exc), f"recall on {addr}") from None

    async def send_oneway(self, msg: Message, *, queue: MessageQueue | None = None) -> None:
        """Send without waiting for an answer (nothing tells whether it was stored)."""
        assert self.client is not None
        body, sys_flag, props, _ = self._encode(msg)
        queues, _ = await self.publish_queues(msg.topic)
        # Java's sendOneway(msg, mq) does not compare topics: the message's own topic goes to
        # the queue's broker and queue id, as with a selector's queue.
        mq = _selected(queue, msg.topic) if queue else queues[next(self._counter) % len(queues)]
        addr = self.client.master_addr(mq.broker_name)
        if addr is None:
            raise MQClientError(-1, f"no master for {mq.broker_name}")
        request = self._v2_request(_send_code(msg), mq, sys_flag, msg.flag, props, body)
        request.flag = RPC_ONEWAY
        await self.client.remoting.invoke_oneway(addr, request)

    async def _send_request(
        self,
        topic: str,
        code: int,
        body: bytes,
        sys_flag: int,
        flag: int,
        props: str,
        uniq: str,
        *,
        queue: MessageQueue | None,
        selector: Callable[[list[MessageQueue]], MessageQueue] | None,
        timeout: float | None,
    ) -> SendResult:
        client = self.client
        assert client is not None
        if queue is not None and queue.topic != topic:
            raise MQClientError(-1, _OTHER_TOPIC)
        timeout = self.send_timeout if timeout is None else timeout
        once = queue is not None or selector is not None or code == _SEND_REPLY_MESSAGE_V2
        attempts = 1 if once else 1 + RETRY_TIMES_WHEN_SEND_FAILED
        last_broker: str | None = None
        last_error: Exception | None = None
        for _ in range(attempts):
            # publish_queues' and channel()'s common cases read here, without their coroutines.
            cached = self._cached_queues(topic)
            queues = cached[1] if cached is not None else (await self.publish_queues(topic))[0]
            if queue is not None:
                mq = queue
            elif selector is not None:
                mq = _selected(selector(queues), topic)
            else:
                start = next(self._counter)
                candidates = [q for q in queues if q.broker_name != last_broker] or queues
                mq = candidates[start % len(candidates)]
            addr = client.master_addr(mq.broker_name)
            if addr is None:
                await client.fetch_route(topic)
                addr = client.master_addr(mq.broker_name)
                if addr is None:
                    raise MQClientError(-1, f"no master address for broker {mq.broker_name}")
            try:
                channel = client.remoting.open_channel(addr) or await client.remoting.channel(addr)
                whole, signer = _frame_signer(channel)
                if whole:  # the common send: its frame written in one go
                    opaque = next_opaque()
                    born = int(time.time() * 1000)
                    frame = self._v2_frame(
                        code, mq, sys_flag, flag, props, body, opaque, born, signer
                    )
                    answer = await channel.call_frame(opaque, frame, code, timeout)
                else:
                    request = self._v2_request(code, mq, sys_flag, flag, props, body)
                    answer = await channel.invoke(request, timeout)
            except RemotingError as exc:
                last_error, last_broker = exc, mq.broker_name
                await self._route_after_failure(topic)
                continue
            if type(answer) is tuple:  # the plain SUCCESS, read from its frame
                _, msg_id, queue_id, queue_offset, _ = answer
                if queue_id != mq.queue_id or mq.topic != topic:  # as the response's below
                    mq = MessageQueue(topic, mq.broker_name, queue_id)
                return SendResult(_SEND_OK, uniq, msg_id, mq, queue_offset)
            response = answer
            assert isinstance(response, RemotingCommand)
            status = STORED_CODES.get(response.code)
            if status is None:
                last_error = MQClientError(response.code, response.remark, f"send to {addr}")
                last_broker = mq.broker_name
                if response.code in (ResponseCode.MESSAGE_ILLEGAL, ResponseCode.NO_PERMISSION):
                    break  # another queue would refuse it as well
                await self._route_after_failure(topic, response.code)
                continue
            try:
                head = _SendResponse.from_ext(response.ext_fields)
            except HeaderError as exc:
                raise MQClientError(response.code, str(exc), f"send to {addr}") from None
            return SendResult(
                status=status,
                msg_id=uniq,
                offset_msg_id=head.msg_id,
                queue=MessageQueue(topic, mq.broker_name, head.queue_id),
                queue_offset=head.queue_offset,
                recall_handle=head.recall_handle,
            )
        assert last_error is not None
        if isinstance(last_error, MQClientError):
            raise last_error
        raise MQClientError(-1, str(last_error), f"send to {topic}")
