"""RouteInfoManager: the name server's five route tables, as a pure state machine.

No I/O and no clock of its own: callers pass ``now`` (seconds on trio's clock) and an opaque
``channel`` object for the broker's connection, so every rule is unit-testable and the Trio layer
decides what closing a channel means.  Behaviour follows RocketMQ 4.9.4's RouteInfoManager.

Unlike Java's, which rebuilds a topic's route on every lookup, the encoded route of a topic is
kept (:meth:`RouteInfoManager.route_body`) until something it is made of changes: the topic's
queue data (one entry dropped), or a broker's addresses, filter servers or write permission, a
broker's removal (all dropped: these are rare; a broker's periodic re-registration changes
nothing and drops nothing).  At most :data:`ROUTE_CACHE_MAX_ENTRIES` routes are kept.  A route
names no topic, so the topics whose routes are made of the same queue data on the same brokers
(the topics of a broker group, mostly) share one encoded body.
"""

from __future__ import annotations

import json
import logging
import time
from json.encoder import encode_basestring_ascii as _quote

import attrs

from pymq.common.route import (
    MASTER_ID,
    BrokerData,
    ClusterInfo,
    QueueData,
    TopicList,
    TopicRouteData,
)
from pymq.common.serde import to_json
from pymq.common.topic import (
    PERM_WRITE,
    DataVersion,
    TopicConfig,
    TopicConfigSerializeWrapper,
)
from pymq.remoting.protocol import fastjson

log = logging.getLogger(__name__)

# RouteInfoManager.BROKER_CHANNEL_EXPIRED_TIME: a broker silent this long is removed.
BROKER_CHANNEL_EXPIRED_SECONDS = 120.0
# Encoded routes kept (some 300 bytes each for a topic on one broker group); past this the cache
# starts again empty, so its memory stays bounded whatever the number of topics looked up.
ROUTE_CACHE_MAX_ENTRIES = 200_000


@attrs.define
class BrokerLiveInfo:
    last_update: float  # trio clock, seconds
    last_update_wall_ms: int
    data_version: DataVersion
    channel: object
    ha_server_addr: str | None


@attrs.define
class RegisterBrokerResult:
    ha_server_addr: str | None = None
    master_addr: str | None = None


class RouteInfoManager:
    def __init__(self, expired_seconds: float = BROKER_CHANNEL_EXPIRED_SECONDS) -> None:
        self.expired_seconds = expired_seconds
        self.topic_queue_table: dict[str, dict[str, QueueData]] = {}
        self.broker_addr_table: dict[str, BrokerData] = {}
        self.cluster_addr_table: dict[str, set[str]] = {}
        self.broker_live_table: dict[str, BrokerLiveInfo] = {}
        self.filter_server_table: dict[str, list[str]] = {}
        # topic -> its encoded TopicRouteData (see the module docstring)
        self._route_bodies: dict[str, bytes] = {}
        # the same in fastjson's form, for clients older than 4.9.4
        self._old_route_bodies: dict[str, bytes] = {}
        # broker name -> its BrokerData's JSON in a standard route (the same in every topic's
        # route that lists the broker); forgotten with every route, as any change of a
        # broker's data forgets them all
        self._broker_json: dict[str, str] = {}
        # what a standard route is made of (see _route_shape) -> its encoded body: the topics of
        # a broker group with the same queue counts share one route, written once
        self._shape_bodies: dict[tuple, bytes] = {}

    def _routes_changed(self, topic: str | None = None) -> None:
        """Forget the cached route of ``topic``, or of every topic."""
        if topic is None:
            self._route_bodies.clear()
            self._old_route_bodies.clear()
            self._broker_json.clear()
            self._shape_bodies.clear()
        else:
            self._route_bodies.pop(topic, None)
            self._old_route_bodies.pop(topic, None)

    # -- registration -----------------------------------------------------------------------

    def register_broker(
        self,
        *,
        cluster_name: str,
        broker_addr: str,
        broker_name: str,
        broker_id: int,
        ha_server_addr: str | None,
        topic_config_wrapper: TopicConfigSerializeWrapper | None,
        filter_server_list: list[str] | None,
        channel: object,
        now: float,
    ) -> RegisterBrokerResult:
        result = RegisterBrokerResult()
        self.cluster_addr_table.setdefault(cluster_name, set()).add(broker_name)

        register_first = False
        broker_data = self.broker_addr_table.get(broker_name)
        if broker_data is None:
            register_first = True
            broker_data = BrokerData(cluster_name, broker_name, {})
            self.broker_addr_table[broker_name] = broker_data
        addrs = broker_data.broker_addrs
        # One ip:port has one record: a slave switched to master drops its old id first.
        stale = [b for b, a in addrs.items() if a == broker_addr and b != broker_id]
        for bid in stale:
            del addrs[bid]
        old_addr = addrs.get(broker_id)
        addrs[broker_id] = broker_addr
        register_first = register_first or old_addr is None
        if stale or old_addr != broker_addr:
            self._routes_changed()  # every route of this broker lists its addresses

        wrapper = topic_config_wrapper or TopicConfigSerializeWrapper(
            data_version=DataVersion(timestamp=0, counter=0)
        )
        if topic_config_wrapper is not None and broker_id == MASTER_ID:
            changed = self.is_broker_topic_config_changed(broker_addr, wrapper.data_version)
            if changed or register_first:
                for config in wrapper.topic_config_table.values():
                    self._create_and_update_queue_data(broker_name, config)

        previous = self.broker_live_table.get(broker_addr)
        self.broker_live_table[broker_addr] = BrokerLiveInfo(
            last_update=now,
            last_update_wall_ms=int(time.time() * 1000),
            data_version=wrapper.data_version,
            channel=channel,
            ha_server_addr=ha_server_addr,
        )
        if previous is None:
            log.info("new broker registered, %s HAServer: %s", broker_addr, ha_server_addr)

        if filter_server_list is not None:
            before = self.filter_server_table.get(broker_addr)
            if filter_server_list:
                self.filter_server_table[broker_addr] = list(filter_server_list)
            else:
                self.filter_server_table.pop(broker_addr, None)
            if before != self.filter_server_table.get(broker_addr):
                self._routes_changed()

        if broker_id != MASTER_ID:
            master_addr = addrs.get(MASTER_ID)
            if master_addr is not None:
                master_live = self.broker_live_table.get(master_addr)
                if master_live is not None:
                    result.ha_server_addr = master_live.ha_server_addr
                    result.master_addr = master_addr
        return result

    def _create_and_update_queue_data(self, broker_name: str, config: TopicConfig) -> None:
        by_broker = self.topic_queue_table.setdefault(config.topic_name, {})
        old = by_broker.get(broker_name)
        if (
            old is not None
            and old.read_queue_nums == config.read_queue_nums
            and old.write_queue_nums == config.write_queue_nums
            and old.perm == config.perm
            and old.topic_sys_flag == config.topic_sys_flag
        ):
            # Unchanged, the common case of a re-registration: nothing made.  Every
            # registration walks all the broker's topics on the loop, which making and
            # comparing a QueueData each made about eight times slower.
            return
        queue_data = QueueData(
            broker_name=broker_name,
            read_queue_nums=config.read_queue_nums,
            write_queue_nums=config.write_queue_nums,
            perm=config.perm,
            topic_sys_flag=config.topic_sys_flag,
        )
        if old is None:
            log.info("new topic registered, %s %s", config.topic_name, queue_data)
        elif old != queue_data:
            log.info("topic changed, %s OLD: %s NEW: %s", config.topic_name, old, queue_data)
        by_broker[broker_name] = queue_data
        if old != queue_data:
            self._routes_changed(config.topic_name)

    def is_broker_topic_config_changed(self, broker_addr: str, version: DataVersion) -> bool:
        live = self.broker_live_table.get(broker_addr)
        return live is None or live.data_version != version

    def query_broker_topic_config(self, broker_addr: str) -> DataVersion | None:
        live = self.broker_live_table.get(broker_addr)
        return None if live is None else live.data_version

    def update_broker_info_update_timestamp(self, broker_addr: str, now: float) -> None:
        live = self.broker_live_table.get(broker_addr)
        if live is not None:
            live.last_update = now
            live.last_update_wall_ms = int(time.time() * 1000)

    def unregister_broker(
        self, cluster_name: str, broker_addr: str, broker_name: str, broker_id: int
    ) -> None:
        live = self.broker_live_table.pop(broker_addr, None)
        log.info(
            "unregisterBroker, remove from brokerLiveTable %s, %s",
            "OK" if live else "Failed",
            broker_addr,
        )
        self._routes_changed()
        self.filter_server_table.pop(broker_addr, None)
        remove_broker_name = False
        broker_data = self.broker_addr_table.get(broker_name)
        if broker_data is not None:
            broker_data.broker_addrs.pop(broker_id, None)
            if not broker_data.broker_addrs:
                del self.broker_addr_table[broker_name]
                remove_broker_name = True
        if remove_broker_name:
            names = self.cluster_addr_table.get(cluster_name)
            if names is not None:
                names.discard(broker_name)
                if not names:
                    del self.cluster_addr_table[cluster_name]
            self._remove_topic_by_broker_name(broker_name)

    def _remove_topic_by_broker_name(self, broker_name: str) -> None:
        for topic in list(self.topic_queue_table):
            by_broker = self.topic_queue_table[topic]
            if by_broker.pop(broker_name, None) is not None:
                log.info("removeTopicByBrokerName, remove one broker's topic %s", topic)
            if not by_broker:
                del self.topic_queue_table[topic]

    # -- expiry and connection loss ---------------------------------------------------------

    def scan_not_active_broker(self, now: float) -> list[tuple[str, object]]:
        """Remove brokers silent for ``expired_seconds``; returns their (addr, channel) to close."""
        expired = [
            (addr, live.channel)
            for addr, live in self.broker_live_table.items()
            if live.last_update + self.expired_seconds < now
        ]
        for addr, channel in expired:
            log.warning("The broker channel expired, %s %.0fms", addr, self.expired_seconds * 1000)
            self.broker_live_table.pop(addr, None)
            self.on_channel_destroy(addr, channel)
        return expired

    def on_channel_destroy(self, remote_addr: str, channel: object) -> None:
        """Forget the broker that was on ``channel`` (or, failing that, at ``remote_addr``)."""
        broker_addr = next(
            (addr for addr, live in self.broker_live_table.items() if live.channel is channel),
            remote_addr,
        )
        known = broker_addr in self.broker_live_table or any(
            broker_addr in data.broker_addrs.values() for data in self.broker_addr_table.values()
        )
        if not known:
            return  # a client's connection, or a broker already forgotten
        log.info("the broker's channel destroyed, %s, cleaning its routes at once", broker_addr)
        self._routes_changed()
        self.broker_live_table.pop(broker_addr, None)
        self.filter_server_table.pop(broker_addr, None)

        removed_names: list[str] = []
        for name in list(self.broker_addr_table):
            data = self.broker_addr_table[name]
            for bid in [b for b, a in data.broker_addrs.items() if a == broker_addr]:
                del data.broker_addrs[bid]
            if not data.broker_addrs:
                del self.broker_addr_table[name]
                removed_names.append(name)
        for name in removed_names:
            for cluster in list(self.cluster_addr_table):
                names = self.cluster_addr_table[cluster]
                names.discard(name)
                if not names:
                    del self.cluster_addr_table[cluster]
            self._remove_topic_by_broker_name(name)

    # -- queries ----------------------------------------------------------------------------

    def pickup_topic_route_data(self, topic: str) -> TopicRouteData | None:
        by_broker = self.topic_queue_table.get(topic)
        if not by_broker:
            return None
        queue_datas = [attrs.evolve(q) for _, q in sorted(by_broker.items())]
        broker_datas: list[BrokerData] = []
        filter_table: dict[str, list[str]] = {}
        for name in sorted(by_broker):
            data = self.broker_addr_table.get(name)
            if data is None:
                continue
            broker_datas.append(
                BrokerData(data.cluster, data.broker_name, dict(sorted(data.broker_addrs.items())))
            )
            for addr in data.broker_addrs.values():
                servers = self.filter_server_table.get(addr)
                if servers is not None:
                    filter_table[addr] = list(servers)
        if not broker_datas:
            return None
        return TopicRouteData(
            queue_datas=queue_datas, broker_datas=broker_datas, filter_server_table=filter_table
        )

    def standard_route_body(self, topic: str) -> bytes | None:
        """``to_json(pickup_topic_route_data(topic))`` written straight from the tables, without
        the attrs copies, their unstructuring or a dict for ``json.dumps`` (a lookup's route is
        built this way the first time; the tests compare the two): the fields in their sorted
        order, strings quoted as ``json.dumps`` quotes them."""
        try:
            return self._standard_route_body(topic)
        except TypeError:  # a field not of the type a registration gives it (None, say)
            return self._route_body_by_dumps(topic)

    def _standard_route_body(self, topic: str) -> bytes | None:
        by_broker = self.topic_queue_table.get(topic)
        if not by_broker:
            return None
        names = sorted(by_broker)
        brokers: list[str] = []
        filter_table: dict[str, list[str]] = {}
        filter_servers = self.filter_server_table
        broker_json = self._broker_json
        for name in names:
            written = broker_json.get(name)
            if written is not None and not filter_servers:
                brokers.append(written)  # a broker of 1,000 topics is written once
                continue
            data = self.broker_addr_table.get(name)
            if data is None:
                continue
            addrs = data.broker_addrs
            if written is None:
                if any(type(broker_id) is not int for broker_id in addrs):
                    raise TypeError("a broker id that is not an int")
                pairs = ",".join(f'"{i}":{_quote(a)}' for i, a in sorted(addrs.items()))
                written = broker_json[name] = (
                    f'{{"brokerAddrs":{{{pairs}}},"brokerName":{_quote(data.broker_name)},'
                    f'"cluster":{_quote(data.cluster)}}}'
                )
            brokers.append(written)
            if filter_servers:
                for addr in addrs.values():
                    servers = filter_servers.get(addr)
                    if servers is not None:
                        filter_table[addr] = list(servers)
        if not brokers:
            return None
        queues: list[str] = []
        for name in names:
            q = by_broker[name]
            numbers = (q.perm, q.read_queue_nums, q.topic_sys_flag, q.write_queue_nums)
            if any(type(n) is not int for n in numbers):
                raise TypeError("a queue count or flag that is not an int")
            queues.append(
                f'{{"brokerName":{_quote(q.broker_name)},"perm":{q.perm},'
                f'"readQueueNums":{q.read_queue_nums},"topicSysFlag":{q.topic_sys_flag},'
                f'"writeQueueNums":{q.write_queue_nums}}}'
            )
        filters = "{}"
        if filter_table:
            filters = json.dumps(filter_table, sort_keys=True, separators=(",", ":"))
        return (
            f'{{"brokerDatas":[{",".join(brokers)}],"filterServerTable":{filters},'
            f'"queueDatas":[{",".join(queues)}]}}'
        ).encode()

    def _route_body_by_dumps(self, topic: str) -> bytes | None:
        """:meth:`standard_route_body` through the route data's JSON (``to_json``), for a
        table entry whose fields are not of the types a registration gives them."""
        route = self.pickup_topic_route_data(topic)
        return None if route is None else to_json(route)

    def route_body(self, topic: str, standard: bool = True) -> bytes | None:
        """``topic``'s TopicRouteData (no order config) as standard JSON, or in fastjson's form
        when not ``standard``; None when it has no route.  Built by
        :meth:`pickup_topic_route_data` once, then kept until a change drops it.  A route
        names no topic, so topics whose routes are made of the same things (:meth:`_route_shape`)
        share one standard body."""
        kept = self._route_bodies if standard else self._old_route_bodies
        body = kept.get(topic)
        if body is None:
            if standard:
                shape = self._route_shape(topic)
                if shape is not None:
                    body = self._shape_bodies.get(shape)
                if body is None:
                    body = self.standard_route_body(topic)
                    if body is None:
                        return None
                    if shape is not None:
                        if len(self._shape_bodies) >= ROUTE_CACHE_MAX_ENTRIES:
                            self._shape_bodies.clear()
                        self._shape_bodies[shape] = body
            else:
                route = self.pickup_topic_route_data(topic)
                if route is None:
                    return None
                body = fastjson.dumps(route)
            if len(kept) >= ROUTE_CACHE_MAX_ENTRIES:
                kept.clear()
            kept[topic] = body
        return body

    def _route_shape(self, topic: str) -> tuple | None:
        """Everything of ``topic``'s standard route that the tables hold per topic: for each of
        its brokers in name order, the name and the queue data's fields.  The rest (the
        brokers' data) is the same for every topic until a change forgets every route.  None,
        and no sharing, with filter servers or a queue field not of its registered type (a
        bool would equal an int in the key but not in the JSON)."""
        by_broker = self.topic_queue_table.get(topic)
        if not by_broker or self.filter_server_table:
            return None
        shape: list[object] = []
        for name, q in sorted(by_broker.items()) if len(by_broker) > 1 else by_broker.items():
            perm, reads, flag, writes = (
                q.perm,
                q.read_queue_nums,
                q.topic_sys_flag,
                q.write_queue_nums,
            )
            if type(perm) is not int or type(reads) is not int:
                return None
            if type(flag) is not int or type(writes) is not int or type(q.broker_name) is not str:
                return None
            shape.append((name, q.broker_name, perm, reads, flag, writes))
        return tuple(shape)

    def get_all_cluster_info(self) -> ClusterInfo:
        return ClusterInfo(
            broker_addr_table={
                name: BrokerData(d.cluster, d.broker_name, dict(sorted(d.broker_addrs.items())))
                for name, d in sorted(self.broker_addr_table.items())
            },
            cluster_addr_table={
                cluster: sorted(names) for cluster, names in sorted(self.cluster_addr_table.items())
            },
        )

    def get_all_topic_list(self) -> TopicList:
        return TopicList(topic_list=sorted(self.topic_queue_table))

    def get_topics_by_cluster(self, cluster: str) -> TopicList:
        names = self.cluster_addr_table.get(cluster, set())
        topics = [
            topic
            for topic, by_broker in sorted(self.topic_queue_table.items())
            if any(name in names for name in by_broker)
        ]
        return TopicList(topic_list=topics)

    def get_system_topic_list(self) -> TopicList:
        """Cluster and broker names (RocketMQ's system topics), with one master address."""
        topics: list[str] = []
        broker_addr: str | None = None
        for cluster, names in sorted(self.cluster_addr_table.items()):
            topics.append(cluster)
            topics.extend(sorted(names))
        for data in self.broker_addr_table.values():
            broker_addr = data.broker_addrs.get(MASTER_ID) or broker_addr
        return TopicList(topic_list=topics, broker_addr=broker_addr)

    def delete_topic(self, topic: str) -> None:
        self.topic_queue_table.pop(topic, None)
        self._routes_changed(topic)

    def _set_write_perm(self, broker_name: str, writeable: bool) -> int:
        count = 0
        for by_broker in self.topic_queue_table.values():
            queue_data = by_broker.get(broker_name)
            if queue_data is None:
                continue
            if writeable:
                queue_data.perm |= PERM_WRITE
            else:
                queue_data.perm &= ~PERM_WRITE
            count += 1
        if count:
            self._routes_changed()
        return count

    def wipe_write_perm_of_broker(self, broker_name: str) -> int:
        return self._set_write_perm(broker_name, False)

    def add_write_perm_of_broker(self, broker_name: str) -> int:
        return self._set_write_perm(broker_name, True)
