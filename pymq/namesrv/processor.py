"""The name server's request processor: one method per request code, no I/O of its own.

Each method takes the connection and the decoded request and returns the response; the
remoting server does the rest.  Behaviour and remarks follow RocketMQ 4.9.4's
DefaultRequestProcessor.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import trio

from pymq.common.config import (
    ConfigError,
    RestartOnlyKeyError,
    masked,
    parse_properties_body,
    to_properties,
)
from pymq.common.properties import format_properties
from pymq.common.record import body_crc32
from pymq.common.route import KVTable, RegisterBrokerBody, TopicList
from pymq.common.serde import from_json_body, to_json
from pymq.common.topic import DataVersion
from pymq.namesrv.kvconfig import NAMESPACE_ORDER_TOPIC_CONFIG
from pymq.remoting import headers as H
from pymq.remoting.channel import Channel
from pymq.remoting.codec import (
    RPC_TYPE_RESPONSE,
    RemotingCommand,
    _json_header_at,
    decode_frame_at,
    encode,
)
from pymq.remoting.codes import RequestCode, ResponseCode, SerializeType
from pymq.remoting.errors import ProtocolError
from pymq.remoting.protocol import fastjson
from pymq.remoting.server import Route
from pymq.remoting.tls import TLS_KEYS

if TYPE_CHECKING:
    from pymq.namesrv.controller import NamesrvController
    from pymq.remoting.server import AccessCheck

log = logging.getLogger(__name__)

# Keys a running name server cannot change.
RESTART_ONLY_KEYS = frozenset(
    {"kvConfigPath", "configStorePath", "listenPort", "bindAddress", "serverTaskOrder", *TLS_KEYS}
)
# Config values never shown.
SECRET_KEYS = frozenset({"tls.server.keyPassword"})

# GET_ROUTEINFO_BY_TOPIC: request versions from V4_9_4 on get standard JSON.
STANDARD_JSON_ROUTE_VERSION = 401

_HEADER_FIELD = struct.Struct(">i")
_FRAME_PREFIX = struct.Struct(">ii")
_ROUTE_CODE = int(RequestCode.GET_ROUTEINFO_BY_TOPIC)
_ROUTE_CODE_FIELD = b'"code":%d' % _ROUTE_CODE
# The longest header route_answer_raw reads (a lookup's is some 150 bytes and the topic, at most
# 127 characters, up to 6 bytes each escaped); longer ones take the usual path, with its bounds.
RAW_LOOKUP_HEADER_MAX = 2048
# A REGISTER_BROKER body this large (some 100 topics) is decoded in a worker thread: decoding
# costs about a millisecond per 16 KiB, a thread hop a tenth of that (the same bound as the
# other JSON bodies, serde.JSON_BODY_INLINE_MAX).
THREAD_DECODE_BYTES = 16 * 1024
# The tail Java's name server adds to a remark that has a FAQ entry.
FAQ_TAIL = "See http://rocketmq.apache.org/docs/faq/ for further details."

# TopicSysFlag bits.
FLAG_UNIT = 0x1
FLAG_UNIT_SUB = 0x2


# json_header called with _command_fields as its class gives the fields' tuple.
_plain_header = cast("Callable[..., tuple[Any, ...] | None]", _json_header_at)


def _command_fields(*fields: Any) -> tuple[Any, ...]:
    """What ``_recordc.json_header`` would make a RemotingCommand of, as they are: (code,
    ext_fields, body, opaque, flag, remark, language, version, serialize_type)."""
    return fields


class NamesrvProcessor:
    def __init__(self, controller: NamesrvController) -> None:
        self.controller = controller
        self.routes = controller.routes
        self.kv = controller.kv
        # The JSON header of a route answer, around its opaque (what Channel.answer writes).
        probe = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
        answer = probe.response()
        answer.opaque, answer.flag = 0, answer.flag | RPC_TYPE_RESPONSE
        before, after = encode(answer)[8:].split(b'"opaque":0,', 1)
        self._answer_head = (before + b'"opaque":', b"," + after)

    def route_table(self) -> dict[int, Route]:
        """The name server's registration table."""
        return {
            RequestCode.PUT_KV_CONFIG: Route(self.put_kv_config),
            RequestCode.GET_KV_CONFIG: Route(self.get_kv_config),
            RequestCode.DELETE_KV_CONFIG: Route(self.delete_kv_config),
            RequestCode.QUERY_DATA_VERSION: Route(self.query_data_version),
            RequestCode.REGISTER_BROKER: Route(self.register_broker),
            RequestCode.UNREGISTER_BROKER: Route(self.unregister_broker),
            # Lookups are served in the reader from their bytes, a run at a time.
            RequestCode.GET_ROUTEINFO_BY_TOPIC: Route(
                self.get_route_info_by_topic, run=self.route_answers
            ),
            RequestCode.GET_BROKER_CLUSTER_INFO: Route(self.get_broker_cluster_info),
            RequestCode.WIPE_WRITE_PERM_OF_BROKER: Route(self.wipe_write_perm_of_broker),
            RequestCode.ADD_WRITE_PERM_OF_BROKER: Route(self.add_write_perm_of_broker),
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: Route(self.get_all_topic_list),
            RequestCode.DELETE_TOPIC_IN_NAMESRV: Route(self.delete_topic_in_namesrv),
            RequestCode.GET_KVLIST_BY_NAMESPACE: Route(self.get_kv_list_by_namespace),
            RequestCode.GET_TOPICS_BY_CLUSTER: Route(self.get_topics_by_cluster),
            RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS: Route(self.get_system_topic_list),
            RequestCode.GET_UNIT_TOPIC_LIST: Route(self.get_unit_topic_list),
            RequestCode.GET_HAS_UNIT_SUB_TOPIC_LIST: Route(self.get_has_unit_sub_topic_list),
            RequestCode.GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST: Route(
                self.get_has_unit_sub_ununit_topic_list
            ),
            RequestCode.UPDATE_NAMESRV_CONFIG: Route(self.update_namesrv_config),
            RequestCode.GET_NAMESRV_CONFIG: Route(self.get_namesrv_config),
        }

    # -- KV config ----------------------------------------------------------------------------

    async def put_kv_config(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        head: H.PutKVConfigRequestHeader = H.decode_request(req)
        await self.kv.put(head.namespace, head.key, head.value)
        return req.response()

    async def get_kv_config(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        head: H.KVConfigRequestHeader = H.decode_request(req)
        namespace, key = head.namespace, head.key
        value = self.kv.get(namespace, key)
        if value is None:
            return req.response(
                ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {namespace} Key: {key}"
            )
        return req.response(ext_fields=H.encode(H.GetKVConfigResponseHeader(value)))

    async def delete_kv_config(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        head: H.KVConfigRequestHeader = H.decode_request(req)
        await self.kv.delete(head.namespace, head.key)
        return req.response()

    async def get_kv_list_by_namespace(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        namespace = H.decode_request(req).namespace
        table = self.kv.get_namespace(namespace)
        if table is None:
            return req.response(
                ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {namespace}"
            )
        return req.response(body=to_json(KVTable(table)))

    # -- brokers ------------------------------------------------------------------------------

    async def query_data_version(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        broker_addr = H.decode_request(req).broker_addr
        version = await from_json_body(req.body, DataVersion) if req.body else DataVersion(0, 0)
        changed = self.routes.is_broker_topic_config_changed(broker_addr, version)
        if not changed:
            self.routes.update_broker_info_update_timestamp(broker_addr, trio.current_time())
        ours = self.routes.query_broker_topic_config(broker_addr)
        return req.response(
            ext_fields=H.encode(H.QueryDataVersionResponseHeader(changed)),
            body=to_json(ours) if ours is not None else b"",
        )

    async def register_broker(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        head: H.RegisterBrokerRequestHeader = H.decode_request(req)
        expected_crc = head.body_crc32
        if expected_crc != 0 and body_crc32(req.body) != expected_crc:
            log.warning(
                "receive registerBroker request, crc32 not match, from %s",
                channel.remote_address,
            )
            return req.response(ResponseCode.SYSTEM_ERROR, "crc32 not match")
        compressed = head.compressed
        if req.body:
            try:
                # O(topics) (85 ms for 10,000): a large body is decoded in a worker thread.
                if len(req.body) < THREAD_DECODE_BYTES:
                    body = RegisterBrokerBody.decode(req.body, compressed)
                else:
                    body = await trio.to_thread.run_sync(
                        RegisterBrokerBody.decode, req.body, compressed
                    )
            except ValueError as exc:
                return req.response(ResponseCode.SYSTEM_ERROR, f"bad register body: {exc}")
            wrapper = body.topic_config_serialize_wrapper
            filter_servers: list[str] | None = body.filter_server_list
        else:
            wrapper = None
            filter_servers = None
        result = self.routes.register_broker(
            cluster_name=head.cluster_name,
            broker_addr=head.broker_addr,
            broker_name=head.broker_name,
            broker_id=head.broker_id,
            ha_server_addr=head.ha_server_addr,
            topic_config_wrapper=wrapper,
            filter_server_list=filter_servers,
            channel=channel,
            now=trio.current_time(),
        )
        table = self.kv.get_namespace(NAMESPACE_ORDER_TOPIC_CONFIG)
        return req.response(
            ext_fields=H.encode(
                H.RegisterBrokerResponseHeader(result.ha_server_addr, result.master_addr)
            ),
            body=to_json(KVTable(table)) if table is not None else b"",
        )

    async def unregister_broker(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        head: H.BrokerIdentityHeader = H.decode_request(req)
        self.routes.unregister_broker(
            head.cluster_name, head.broker_addr, head.broker_name, head.broker_id
        )
        return req.response()

    async def wipe_write_perm_of_broker(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        name = H.decode_request(req).broker_name
        count = self.routes.wipe_write_perm_of_broker(name)
        log.info(
            "wipe write perm of broker[%s], client: %s, %d", name, channel.remote_address, count
        )
        return req.response(ext_fields=H.encode(H.WipeWritePermOfBrokerResponseHeader(count)))

    async def add_write_perm_of_broker(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        name = H.decode_request(req).broker_name
        count = self.routes.add_write_perm_of_broker(name)
        log.info(
            "add write perm of broker[%s], client: %s, %d", name, channel.remote_address, count
        )
        return req.response(ext_fields=H.encode(H.AddWritePermOfBrokerResponseHeader(count)))

    # -- routes and topics --------------------------------------------------------------------

    def get_route_info(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        """GET_ROUTEINFO_BY_TOPIC's answer, made at once (it never waits).

        As Java's: standard JSON for clients of 4.9.4 on (or asking for it), fastjson's bare
        integer keys ({0:"host:port"}) for older ones, which expect that form.  Without an
        order config, either form comes from the routes the tables keep encoded until they
        change; with one, the route is built per lookup."""
        head: H.GetRouteInfoRequestHeader = H.decode_request(req)
        topic = head.topic
        standard = req.version >= STANDARD_JSON_ROUTE_VERSION or head.accept_standard_json_only
        order = self.controller.namesrv_config.order_message_enable
        body: bytes | None
        if not order:
            body = self.routes.route_body(topic, standard)
        else:
            route = self.routes.pickup_topic_route_data(topic)
            body = None
            if route is not None:
                if order:
                    route.order_topic_conf = self.kv.get(NAMESPACE_ORDER_TOPIC_CONFIG, topic)
                body = to_json(route) if standard else fastjson.dumps(route)
        if body is None:
            return req.response(
                ResponseCode.TOPIC_NOT_EXIST,
                f"No topic route info in name server for the topic: {topic}\n{FAQ_TAIL}",
            )
        return req.response(body=body)

    def route_answer_raw(
        self, channel: Channel | None, buf: bytes, start: int, end: int
    ) -> bytes | None:
        """A route lookup answered from its frame (``buf[start:end]``, the length field
        stripped) without the typed header, the handler and a response command: the whole
        answer frame, or None for everything but the plain lookup of a known topic (a JSON
        header the codec decodes without fault, no body, a request expecting an answer,
        ``topic`` its one extField), which the usual path then serves.  The answer is the bytes
        the usual path writes (tests/unit/test_namesrv_raw.py compares them).  Order configs
        (``orderMessageEnable``) take the usual path."""
        if end - start < 4 or self.controller.namesrv_config.order_message_enable:
            return None
        (length,) = _HEADER_FIELD.unpack_from(buf, start)
        # Not JSON (a serialize type in the top byte makes the field no header length), a body,
        # or longer than a lookup's header: the usual path (with its own bounds).  Nor anything
        # that does not name the code: not decoded twice.
        if length >> 24 or start + 4 + length != end or length > RAW_LOOKUP_HEADER_MAX:
            return None
        if buf.find(_ROUTE_CODE_FIELD, start + 4, end) < 0:
            return None
        # The usual decoder's plain case (decode_frame_at reads such a header with the same
        # call), as the command's fields rather than the command; the usual decoder and its
        # checks for anything else.
        fields = _plain_header(buf, start + 4, end, _command_fields, SerializeType.JSON)
        if fields is not None:
            code, ext, _, opaque, flag, _, _, version, _ = fields
        else:
            try:
                request = decode_frame_at(buf, start, end)
            except ProtocolError:
                return None
            if request.header_error is not None:
                return None
            code, ext, opaque, flag = request.code, request.ext_fields, request.opaque, request.flag
            version = request.version
        if code != _ROUTE_CODE or flag != 0 or len(ext) != 1:
            return None
        topic = ext.get("topic")
        if topic is None:
            return None
        body = self.routes.route_body(topic, version >= STANDARD_JSON_ROUTE_VERSION)
        if body is None:
            return None
        before, after = self._answer_head
        head = before + str(opaque).encode() + after
        return _FRAME_PREFIX.pack(4 + len(head) + len(body), len(head)) + head + body

    def route_answers(
        self,
        channel: Channel,
        buf: bytes,
        bounds: list[int],
        first: int,
        stop: int,
        check: AccessCheck | None = None,
    ) -> tuple[bytes, int, RemotingCommand | None]:
        """The route lookups' run handler (Channel.raw_run_handler): the lookups leading
        frames ``first..stop-1`` of a run (``bounds``: their starts and ends) answered in the
        connection's reader, each as :meth:`route_answer_raw` answers it from its bytes, else
        decoded and answered by :meth:`get_route_info`.  Stops at the first other frame and
        returns where, with that frame decoded if it was; answers are queued in order.  It
        changes nothing but the routes it keeps.  The name server has no access check: with
        one it serves nothing (it would skip it)."""
        if check is not None:
            return b"", first, None
        answers: list[bytes] = []
        add = answers.append
        one = self.route_answer_raw
        i = first
        while i < stop:
            # The lookups answered from their bytes, in a tight loop.
            before = len(answers)
            edges = iter(bounds[2 * i : 2 * stop])
            for start in edges:
                answer = one(channel, buf, start, next(edges))
                if answer is None:
                    break
                add(answer)
            i += len(answers) - before
            if i >= stop:
                break
            try:
                cmd = decode_frame_at(buf, bounds[2 * i], bounds[2 * i + 1])
            except ProtocolError:  # the channel decodes it again and closes
                return b"".join(answers), i, None
            if (
                cmd.flag & RPC_TYPE_RESPONSE
                or cmd.header_error is not None
                or cmd.code != _ROUTE_CODE
            ):
                return b"".join(answers), i, cmd
            if answers:  # queued before this one's answer
                channel.answer_frames([b"".join(answers)])
                answers.clear()
            channel.serve_inline(self.get_route_info, cmd)
            i += 1
        return b"".join(answers), i, None

    async def get_route_info_by_topic(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        return self.get_route_info(channel, req)

    async def get_broker_cluster_info(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        # Java writes this one in fastjson's form whatever the client's version.
        return req.response(body=fastjson.dumps(self.routes.get_all_cluster_info()))

    async def get_all_topic_list(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        return req.response(body=to_json(self.routes.get_all_topic_list()))

    async def delete_topic_in_namesrv(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        self.routes.delete_topic(H.decode_request(req).topic)
        return req.response()

    async def get_topics_by_cluster(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        cluster = H.decode_request(req).cluster
        return req.response(body=to_json(self.routes.get_topics_by_cluster(cluster)))

    async def get_system_topic_list(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        return req.response(body=to_json(self.routes.get_system_topic_list()))

    def _topics_with_flags(self, want: int, without: int = 0) -> TopicList:
        topics = [
            topic
            for topic, by_broker in sorted(self.routes.topic_queue_table.items())
            if any(
                (q.topic_sys_flag & want) == want and not (q.topic_sys_flag & without)
                for q in by_broker.values()
            )
        ]
        return TopicList(topic_list=topics)

    async def get_unit_topic_list(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        return req.response(body=to_json(self._topics_with_flags(FLAG_UNIT)))

    async def get_has_unit_sub_topic_list(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        return req.response(body=to_json(self._topics_with_flags(FLAG_UNIT_SUB)))

    async def get_has_unit_sub_ununit_topic_list(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        return req.response(body=to_json(self._topics_with_flags(FLAG_UNIT_SUB, FLAG_UNIT)))

    # -- the name server's own config ---------------------------------------------------------

    async def update_namesrv_config(
        self, channel: Channel, req: RemotingCommand
    ) -> RemotingCommand:
        config_file = self.controller.config_file
        try:
            changes = parse_properties_body(req.body)
            props = await config_file.apply(
                self.controller.configs(), changes, RESTART_ONLY_KEYS, "name server"
            )
        except RestartOnlyKeyError as exc:
            return req.response(ResponseCode.NO_PERMISSION, str(exc))
        except ConfigError as exc:
            return req.response(ResponseCode.SYSTEM_ERROR, str(exc))
        log.info("namesrv config updated by %s: %s", channel.remote_address, props)
        return req.response()

    async def get_namesrv_config(self, channel: Channel, req: RemotingCommand) -> RemotingCommand:
        props = masked(to_properties(self.controller.configs()), SECRET_KEYS)
        text = format_properties(props)
        return req.response(body=text.encode("utf-8"))
