"""Topic routes for QueryRoute: the name server's, kept a while, so that a 5.x client of a
multi-group cluster is told every group's queues.

As RocketMQ 5's proxy in local mode (LocalTopicRouteService) does, every broker group is taken
to serve gRPC on its master's host at this broker's own ``grpcServerPort``: run the brokers of a
cluster with the same gRPC port, one broker per host.  A route is asked of the name servers at
most every :data:`ROUTE_TTL` seconds per topic (at most :data:`MAX_ROUTES` topics kept; a
failed lookup is not kept), each ask bounded by :data:`ROUTE_TIMEOUT`.
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING

import trio

from pymq.common.route import MASTER_ID, TopicRouteData
from pymq.common.serde import from_json
from pymq.remoting import headers as H
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.remoting.errors import RemotingError

if TYPE_CHECKING:
    from pymq.broker.controller import BrokerController

log = logging.getLogger(__name__)

ROUTE_TTL = 20.0
ROUTE_TIMEOUT = 3.0
MAX_ROUTES = 10_000


class RouteCache:
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker
        self._routes: dict[str, tuple[float, TopicRouteData | None]] = {}

    async def route(self, topic: str) -> TopicRouteData | None:
        """The name servers' route of ``topic`` (None: none known, or none answered)."""
        now = trio.current_time()
        kept = self._routes.get(topic)
        if kept is not None and kept[0] > now:
            return kept[1]
        route, answered = await self._ask(topic)
        if answered:
            if len(self._routes) >= MAX_ROUTES:
                self._routes.clear()
            self._routes[topic] = (now + ROUTE_TTL, route)
        return route

    async def _ask(self, topic: str) -> tuple[TopicRouteData | None, bool]:
        client = self.broker.client
        addrs = self.broker.broker_config.namesrv_list()
        if client is None or not addrs:
            return None, False
        for addr in random.sample(addrs, len(addrs)):
            request = RemotingCommand.request(
                RequestCode.GET_ROUTEINFO_BY_TOPIC, H.encode(H.TopicHeader(topic))
            )
            try:
                response = await client.invoke(addr, request, ROUTE_TIMEOUT)
            except RemotingError as exc:
                log.debug("grpc: route of %s from %s failed: %s", topic, addr, exc)
                continue
            if response.code == ResponseCode.TOPIC_NOT_EXIST:
                return None, True
            if response.code != ResponseCode.SUCCESS:
                continue
            try:
                return from_json(response.body or b"", TopicRouteData), True
            except ValueError as exc:
                log.warning("grpc: route of %s from %s is unreadable: %s", topic, addr, exc)
        return None, False


def master_hosts(route: TopicRouteData) -> dict[str, str]:
    """Each broker group's master host (groups without a master are left out)."""
    hosts = {}
    for data in route.broker_datas:
        addr = data.broker_addrs.get(MASTER_ID)
        if addr:
            hosts[data.broker_name] = addr.rpartition(":")[0]
    return hosts
