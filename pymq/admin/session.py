"""AdminSession: one authenticated conversation on the admin channel.

The session turns parsed requests into :class:`~pymq.broker.admin_service.AdminService` calls and
runs subscriptions: each subscription is a task in the session's nursery that computes its stream
every ``interval`` seconds and pushes an event when the data changed.  Everything the session
says goes through ``send``, which the channel backs with a bounded queue: a client that stops
reading makes its subscriptions wait, it does not make the broker buffer without limit.

Errors are answers: a bad message, an unknown type, a refused operation or a bug in a handler
each produce an error response; only the channel decides to close a connection.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from pymq.acl.plain import AclConfigError, PlainAccessConfig
from pymq.admin import protocol
from pymq.admin.auth import AuthThrottle, token_matches
from pymq.admin.dledger import dledger_groups
from pymq.admin.protocol import ProtocolError, Request
from pymq.broker.acl import AclManager
from pymq.broker.admin_service import TIMER_TOPICS_LISTED, AdminError, AdminService
from pymq.common.serde import loads_lenient
from pymq.remoting import headers as H
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.remoting.errors import RemotingError

if TYPE_CHECKING:
    from pymq.broker.controller import BrokerController

log = logging.getLogger(__name__)

# A connection may hold this many subscriptions at once.
MAX_SUBSCRIPTIONS = 32
# Subscription periods are clamped to this range (seconds).
MIN_INTERVAL, MAX_INTERVAL, DEFAULT_INTERVAL = 0.2, 60.0, 1.0
# Wrong tokens a connection may present before the channel closes it.
MAX_AUTH_FAILURES = 3
# Remote calls (name server, other brokers) made for cluster status.
REMOTE_TIMEOUT = 3.0

Send = Callable[[str], Awaitable[None]]
Handler = Callable[[Request], Awaitable[Any]]


class AdminSession:
    def __init__(
        self,
        broker: BrokerController,
        token: str,
        send: Send,
        nursery: trio.Nursery,
        *,
        authenticated: bool = False,
        throttle: AuthThrottle | None = None,
        peer: str = "",
    ) -> None:
        self.broker = broker
        self.service = AdminService(broker)
        self.token = token
        self.authenticated = authenticated
        # Wrong tokens are counted per client address there, and locked-out addresses refused.
        self.throttle = throttle
        self.peer = peer
        self.auth_failures = 0
        self._send = send
        self._nursery = nursery
        self._subscriptions: dict[object, trio.CancelScope] = {}
        self._handlers: dict[str, Handler] = {
            "ping": self._ping,
            "cluster.status": self._cluster_status,
            "dledger.status": self._dledger_status,
            "broker.status": self._broker_status,
            "broker.runtimeInfo": self._runtime_info,
            "topic.list": self._topic_list,
            "topic.status": self._topic_status,
            "topic.update": self._topic_update,
            "topic.delete": self._topic_delete,
            "group.list": self._group_list,
            "group.progress": self._group_progress,
            "group.connections": self._group_connections,
            "group.update": self._group_update,
            "group.resetOffsetByTime": self._reset_offset,
            "message.byId": self._message_by_id,
            "message.byKey": self._message_by_key,
            "message.byOffset": self._message_by_offset,
            "message.trace": self._message_trace,
            "message.track": self._message_track,
            "producer.list": self._producer_list,
            "group.producers": self._group_producers,
            "dlq.messages": self._dlq_messages,
            "dlq.resend": self._dlq_resend,
            "config.get": self._config_get,
            "config.update": self._config_update,
            "transactions.status": self._transactions_status,
            "timers.status": self._timers_status,
            "grpc.status": self._grpc_status,
            "acl.list": self._acl_list,
            "acl.update": self._acl_update,
            "acl.delete": self._acl_delete,
            "acl.updateGlobalWhiteAddrs": self._acl_white,
        }
        # The request types a client may subscribe to: the same handlers, pushed.
        self.streams = (
            "cluster.status",
            "dledger.status",
            "broker.status",
            "topic.list",
            "topic.status",
            "group.list",
            "group.progress",
            "transactions.status",
            "timers.status",
            "grpc.status",
        )

    @property
    def too_many_auth_failures(self) -> bool:
        return self.auth_failures >= MAX_AUTH_FAILURES

    async def handle_message(self, message: str | bytes) -> None:
        """Answer one client message (always exactly one response)."""
        request_id: object = None
        try:
            request = protocol.parse_request(message)
            request_id = request.id
            result = await self._dispatch(request)
        except ProtocolError as exc:
            await self._send(protocol.error(exc.request_id or request_id, exc.code, exc.message))
        except AdminError as exc:
            await self._send(protocol.error(request_id, exc.code.name, exc.message))
        except Exception as exc:
            log.exception("admin request failed: %r", message[:200])
            await self._send(
                protocol.error(request_id, protocol.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
            )
        else:
            await self._send(protocol.response(request_id, result))

    async def _dispatch(self, request: Request) -> Any:
        if request.type == "auth":
            return self._auth(request)
        if not self.authenticated:
            raise ProtocolError(
                protocol.UNAUTHORIZED, "send {type: auth, params: {token}} first", request.id
            )
        if request.type == "subscribe":
            return self._subscribe(request)
        if request.type == "unsubscribe":
            return self._unsubscribe(request)
        handler = self._handlers.get(request.type)
        if handler is None:
            raise ProtocolError(
                protocol.UNKNOWN_TYPE, f"unknown request type {request.type!r}", request.id
            )
        return await handler(request)

    # -- auth and subscriptions ---------------------------------------------------------------

    def _auth(self, request: Request) -> dict[str, Any]:
        throttle = self.throttle
        wait = throttle.retry_after(self.peer) if throttle is not None else 0.0
        if wait > 0:
            # Locked out: not even checked, so a guess cannot succeed now whatever it is.
            self.auth_failures += 1
            raise ProtocolError(
                protocol.UNAUTHORIZED,
                f"too many wrong admin tokens from this address; retry in {math.ceil(wait)} s",
                request.id,
            )
        if token_matches(self.token, request.params.get("token")):
            if throttle is not None:
                throttle.succeeded(self.peer)
            self.authenticated = True
            return {"authenticated": True, "broker": self.broker.broker_config.broker_name}
        if throttle is not None:
            throttle.failed(self.peer)
        self.auth_failures += 1
        raise ProtocolError(protocol.UNAUTHORIZED, "wrong admin token", request.id)

    def _subscribe(self, request: Request) -> dict[str, Any]:
        stream = request.get_str("stream")
        if stream not in self.streams:
            raise ProtocolError(
                protocol.BAD_REQUEST,
                f"no stream {stream!r}; streams: {', '.join(self.streams)}",
                request.id,
            )
        if request.id is None or request.id in self._subscriptions:
            raise ProtocolError(
                protocol.BAD_REQUEST, "a subscription needs a fresh request id", request.id
            )
        if len(self._subscriptions) >= MAX_SUBSCRIPTIONS:
            raise ProtocolError(
                protocol.BAD_REQUEST, f"at most {MAX_SUBSCRIPTIONS} subscriptions", request.id
            )
        interval = request.params.get("interval", DEFAULT_INTERVAL)
        if not isinstance(interval, int | float) or isinstance(interval, bool):
            raise ProtocolError(protocol.BAD_REQUEST, "interval must be a number", request.id)
        if not math.isfinite(interval):
            raise ProtocolError(protocol.BAD_REQUEST, "interval must be finite", request.id)
        interval = min(max(float(interval), MIN_INTERVAL), MAX_INTERVAL)
        params = request.params.get("params") or {}
        if not isinstance(params, dict):
            raise ProtocolError(protocol.BAD_REQUEST, "params.params must be an object", request.id)
        inner = Request(request.id, stream, params)
        scope = trio.CancelScope()
        self._subscriptions[request.id] = scope
        self._nursery.start_soon(self._push, scope, inner, interval)
        return {"subscription": request.id, "stream": stream, "interval": interval}

    def _unsubscribe(self, request: Request) -> dict[str, Any]:
        subscription = request.params.get("subscription")
        scope = self._subscriptions.pop(subscription, None)
        if scope is None:
            raise ProtocolError(
                protocol.BAD_REQUEST, f"no subscription {subscription!r}", request.id
            )
        scope.cancel()
        return {"unsubscribed": subscription}

    async def _push(self, scope: trio.CancelScope, request: Request, interval: float) -> None:
        """Push ``request``'s result now and whenever it changes, checked every ``interval``."""
        handler = self._handlers[request.type]
        last: object = object()
        with scope:
            while True:
                try:
                    data = await handler(request)
                except (AdminError, ProtocolError) as exc:
                    code = exc.code.name if isinstance(exc, AdminError) else exc.code
                    data = {"error": {"code": code, "message": exc.message}}
                if data != last:
                    last = data
                    await self._send(protocol.event(request.id, request.type, data))
                await trio.sleep(interval)

    def close(self) -> None:
        for scope in self._subscriptions.values():
            scope.cancel()
        self._subscriptions.clear()

    # -- handlers -----------------------------------------------------------------------------

    async def _ping(self, request: Request) -> dict[str, Any]:
        return {"pong": int(time.time() * 1000)}

    async def _broker_status(self, request: Request) -> dict[str, Any]:
        return self.service.broker_status()

    async def _runtime_info(self, request: Request) -> dict[str, str]:
        return self.service.runtime_info()

    async def _cluster_info(self) -> dict[str, Any] | None:
        """GET_BROKER_CLUSTER_INFO from the first name server that answers, or None."""
        api = self.broker.outer_api
        if api is None:
            return None
        for addr in api.namesrv_addrs:
            try:
                reply = await api.client.invoke(
                    addr,
                    RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO),
                    REMOTE_TIMEOUT,
                )
            except RemotingError:
                continue
            if reply.code == ResponseCode.SUCCESS:
                info: dict[str, Any] = loads_lenient(reply.body)
                return info
        return None

    async def _dledger_status(self, request: Request) -> dict[str, Any]:
        """Each DLedger group's members, term, leader, committed index and each follower's
        lag (pymq/admin/dledger.py), from the runtime info of every broker the name servers
        know (this broker's alone when none answers)."""
        me = self.service.broker_status()
        info = await self._cluster_info()
        brokers: list[dict[str, Any]] = []
        if info is None:
            brokers.append(
                {
                    "brokerName": me["brokerName"],
                    "brokerAddr": me["brokerAddr"],
                    "brokerId": me.get("brokerId"),
                    "table": self.service.runtime_info(),
                }
            )
        else:
            for name, data in sorted(info.get("brokerAddrTable", {}).items()):
                for broker_id, addr in sorted(data.get("brokerAddrs", {}).items()):
                    table = (
                        self.service.runtime_info()
                        if addr == me["brokerAddr"]
                        else await self._remote_table(addr)
                    )
                    brokers.append(
                        {
                            "brokerName": name,
                            "brokerAddr": addr,
                            "brokerId": int(broker_id),
                            "table": table,
                        }
                    )
        return {"groups": dledger_groups(brokers), "namesrvReachable": info is not None}

    async def _cluster_status(self, request: Request) -> dict[str, Any]:
        """Every cluster and broker the name servers know, each with its runtime figures."""
        me = self.service.broker_status()
        clusters: dict[str, Any] = {}
        brokers: list[dict[str, Any]] = []
        info = await self._cluster_info()
        if info is None:
            clusters = {me["clusterName"]: [me["brokerName"]]}
            brokers = [dict(me, online=True)]
            return {"clusters": clusters, "brokers": brokers, "namesrvReachable": False}
        clusters = {c: sorted(names) for c, names in info.get("clusterAddrTable", {}).items()}
        for name, data in sorted(info.get("brokerAddrTable", {}).items()):
            for broker_id, addr in sorted(data.get("brokerAddrs", {}).items()):
                row: dict[str, Any] = {
                    "clusterName": data.get("cluster"),
                    "brokerName": name,
                    "brokerId": int(broker_id),
                    "brokerAddr": addr,
                }
                if addr == me["brokerAddr"]:
                    row.update(me, online=True)
                else:
                    row.update(await self._remote_status(addr))
                brokers.append(row)
        return {"clusters": clusters, "brokers": brokers, "namesrvReachable": True}

    async def _remote_table(self, addr: str) -> dict[str, str] | None:
        """A broker's GET_BROKER_RUNTIME_INFO table; None when it does not answer."""
        api = self.broker.outer_api
        assert api is not None
        try:
            reply = await api.client.invoke(
                addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO), REMOTE_TIMEOUT
            )
        except RemotingError as exc:
            log.debug("runtime info of %s: %s", addr, exc)
            return None
        table: dict[str, str] = loads_lenient(reply.body).get("table", {}) if reply.body else {}
        return table

    async def _remote_status(self, addr: str) -> dict[str, Any]:
        table = await self._remote_table(addr)
        if table is None:
            return {"online": False, "error": f"{addr} did not answer"}
        put = table.get("putTps", "0").split()
        get = table.get("getTransferedTps", "0").split()
        return {
            "online": True,
            "brokerRole": table.get("brokerRole"),
            "brokerVersionDesc": table.get("brokerVersionDesc"),
            "putTps": float(put[0]) if put else 0.0,
            "getTps": float(get[0]) if get else 0.0,
            "msgPutTotal": int(table.get("msgPutTotalTodayNow", 0)),
            "msgGetTotal": int(table.get("msgGetTotalTodayNow", 0)),
            "commitLogDiskRatio": float(table.get("commitLogDiskRatio", 0)),
        }

    async def _topic_list(self, request: Request) -> list[dict[str, Any]]:
        topics = self.service.topic_list()
        if not request.get_bool("includeSystem", True):
            topics = [t for t in topics if not t["system"]]
        return topics

    async def _topic_status(self, request: Request) -> dict[str, Any]:
        return self.service.topic_status(request.get_str("topic"))

    async def _topic_update(self, request: Request) -> dict[str, Any]:
        default = self.broker.broker_config.default_topic_queue_nums
        existing = self.broker.topic_config_manager.select(request.get_str("topic"))
        config = self.service.build_topic_config(
            request.get_str("topic"),
            read_queue_nums=request.get_int(
                "readQueueNums", existing.read_queue_nums if existing else default
            ),
            write_queue_nums=request.get_int(
                "writeQueueNums", existing.write_queue_nums if existing else default
            ),
            perm=request.get_int("perm", existing.perm if existing else 6),
            topic_filter_type=request.get_str(
                "topicFilterType",
                existing.topic_filter_type.value if existing else "SINGLE_TAG",
            ),
            order=request.get_bool("order", existing.order if existing else False),
        )
        return await self.service.update_topic(config)

    async def _topic_delete(self, request: Request) -> dict[str, Any]:
        topic = request.get_str("topic")
        self.service.require_topic(topic)
        await self.service.delete_topic(topic)
        # As mqadmin's deleteTopic does: the name servers forget the route too.
        failed = []
        api = self.broker.outer_api
        if api is not None:
            for addr in api.namesrv_addrs:
                forget = RemotingCommand.request(
                    RequestCode.DELETE_TOPIC_IN_NAMESRV, H.encode(H.TopicHeader(topic))
                )
                try:
                    await api.client.invoke(addr, forget, REMOTE_TIMEOUT)
                except RemotingError:
                    failed.append(addr)
        return {"deleted": topic, "namesrvFailed": failed}

    async def _group_list(self, request: Request) -> list[dict[str, Any]]:
        return self.service.group_list()

    async def _group_progress(self, request: Request) -> dict[str, Any]:
        return self.service.consume_stats(request.get_str("group"), request.get_str("topic", None))

    async def _group_connections(self, request: Request) -> dict[str, Any]:
        return self.service.consumer_connection(request.get_str("group"))

    async def _group_update(self, request: Request) -> dict[str, Any]:
        fields = dict(request.params)
        fields.setdefault("groupName", request.get_str("group", ""))
        fields.pop("group", None)
        return await self.service.update_subscription_group(fields)

    async def _reset_offset(self, request: Request) -> dict[str, Any]:
        return self.service.reset_offset_by_time(
            request.get_str("group"), request.get_str("topic"), request.get_int("timestamp")
        )

    async def _message_by_id(self, request: Request) -> dict[str, Any]:
        return self.service.message_by_id(request.get_str("msgId"), request.get_str("topic", None))

    async def _message_by_key(self, request: Request) -> list[dict[str, Any]]:
        return self.service.messages_by_key(
            request.get_str("topic"), request.get_str("key"), request.get_int("maxNum", 64)
        )

    async def _message_trace(self, request: Request) -> list[dict[str, Any]]:
        return self.service.message_trace(
            request.get_str("msgId"), request.get_str("traceTopic", None)
        )

    async def _message_by_offset(self, request: Request) -> dict[str, Any]:
        return self.service.message_by_offset(
            request.get_str("topic"), request.get_int("queueId"), request.get_int("offset")
        )

    async def _transactions_status(self, request: Request) -> dict[str, Any]:
        return self.service.transaction_status()

    async def _timers_status(self, request: Request) -> dict[str, Any]:
        return await self.service.timer_status(request.get_int("limit", TIMER_TOPICS_LISTED))

    async def _grpc_status(self, request: Request) -> dict[str, Any]:
        return self.service.grpc_status(
            request.get_str("group", None) or None, request.get_str("topic", None) or None
        )

    async def _message_track(self, request: Request) -> dict[str, Any]:
        return self.service.message_track(request.get_str("msgId"), request.get_str("topic", None))

    async def _producer_list(self, request: Request) -> list[dict[str, Any]]:
        return self.service.producer_groups()

    async def _group_producers(self, request: Request) -> dict[str, Any]:
        return self.service.producer_connections(request.get_str("group"))

    async def _dlq_messages(self, request: Request) -> dict[str, Any]:
        return self.service.dlq_messages(
            request.get_str("group"), request.get_int("offset", 0), request.get_int("maxNum", 32)
        )

    async def _dlq_resend(self, request: Request) -> dict[str, Any]:
        return await self.service.dlq_resend(request.get_str("group"), request.get_int("offset"))

    async def _config_get(self, request: Request) -> dict[str, Any]:
        return self.service.broker_config()

    # -- ACL (secrets never leave the broker: shown masked, kept when an edit leaves them out) --

    def _acl(self) -> AclManager:
        acl = self.broker.acl
        if acl is None:
            raise AdminError(
                ResponseCode.SYSTEM_ERROR,
                "ACL is off on this broker (aclEnable=false; set it and rocketmqHome, then "
                "restart)",
            )
        return acl

    async def _acl_list(self, request: Request) -> dict[str, Any]:
        acl = self.broker.acl
        if acl is None:
            return {"enabled": False, "globalWhiteAddrs": [], "accounts": [], "files": []}
        return {"enabled": True, **acl.console_view()}

    async def _acl_update(self, request: Request) -> dict[str, Any]:
        acl = self._acl()
        access_key = request.get_str("accessKey")
        secret = request.get_str("secretKey", "")
        if not secret:  # an edit that leaves the secret out keeps it
            existing = acl.state.accounts.get(access_key)
            if existing is None:
                raise ProtocolError(
                    protocol.BAD_REQUEST,
                    "params.secretKey is required for a new account",
                    request.id,
                )
            secret = existing.config.secret_key
        config = PlainAccessConfig(
            access_key=access_key,
            secret_key=secret,
            white_remote_address=request.get_str("whiteRemoteAddress", None) or None,
            admin=request.get_bool("admin", False),
            default_topic_perm=request.get_str("defaultTopicPerm", None) or None,
            default_group_perm=request.get_str("defaultGroupPerm", None) or None,
            topic_perms=_perm_list(request, "topicPerms"),
            group_perms=_perm_list(request, "groupPerms"),
        )
        try:
            await trio.to_thread.run_sync(acl.update_account, config)
        except (AclConfigError, OSError) as exc:
            raise AdminError(ResponseCode.UPDATE_AND_CREATE_ACL_CONFIG_FAILED, str(exc)) from None
        log.info("ACL account %s updated from the admin channel (%s)", access_key, self.peer)
        return {"updated": access_key}

    async def _acl_delete(self, request: Request) -> dict[str, Any]:
        acl = self._acl()
        access_key = request.get_str("accessKey")
        try:
            deleted = await trio.to_thread.run_sync(acl.delete_account, access_key)
        except (AclConfigError, OSError) as exc:
            raise AdminError(ResponseCode.DELETE_ACL_CONFIG_FAILED, str(exc)) from None
        if not deleted:
            raise AdminError(ResponseCode.DELETE_ACL_CONFIG_FAILED, f"no account {access_key!r}")
        log.info("ACL account %s deleted from the admin channel (%s)", access_key, self.peer)
        return {"deleted": access_key}

    async def _acl_white(self, request: Request) -> dict[str, Any]:
        acl = self._acl()
        addresses = request.params.get("globalWhiteAddrs")
        if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
            raise ProtocolError(
                protocol.BAD_REQUEST,
                "params.globalWhiteAddrs must be a list of strings",
                request.id,
            )
        cleaned = [a.strip() for a in addresses if a.strip()]
        try:
            await trio.to_thread.run_sync(acl.update_global_white, cleaned, None)
        except (AclConfigError, OSError) as exc:
            raise AdminError(
                ResponseCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED, str(exc)
            ) from None
        return {"globalWhiteAddrs": cleaned}

    async def _config_update(self, request: Request) -> dict[str, Any]:
        props = request.get_dict("config")
        if not all(isinstance(v, str | int | float | bool) for v in props.values()):
            raise ProtocolError(protocol.BAD_REQUEST, "config values must be scalars", request.id)
        text = {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in props.items()}
        return {"updated": await self.service.update_broker_config(text)}


def _perm_list(request: Request, name: str) -> list[str]:
    """``topicA=PUB,topicB=SUB`` or a list of such items."""
    value = request.params.get(name)
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [v.strip() for v in value if v.strip()]
    raise ProtocolError(
        protocol.BAD_REQUEST, f"params.{name} must be a list of name=PERM strings", request.id
    )
