"""BrokerOuterAPI: the broker's calls to the name servers (register, unregister, data version).

Registration goes to every name server in parallel and waits at most
``registerBrokerTimeoutMills``; a name server that fails is logged and skipped, so one dead name
server never blocks the others.
"""

from __future__ import annotations

import logging

import attrs
import trio

from pymq.common.record import body_crc32
from pymq.common.route import KVTable, RegisterBrokerBody
from pymq.common.serde import from_json, to_json
from pymq.common.topic import DataVersion, TopicConfigSerializeWrapper
from pymq.remoting import headers as H
from pymq.remoting.client import RemotingClient
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.remoting.errors import RemotingError

log = logging.getLogger(__name__)

# A REGISTER_BROKER body of this many topics or more is encoded in a worker thread.
THREAD_ENCODE_TOPICS = 1000


@attrs.define
class RegisterBrokerResult:
    master_addr: str | None = None
    ha_server_addr: str | None = None
    kv_table: dict[str, str] = attrs.Factory(dict)


@attrs.define
class BrokerIdentity:
    cluster_name: str
    broker_addr: str
    broker_name: str
    broker_id: int
    ha_server_addr: str


class BrokerOuterAPI:
    def __init__(self, client: RemotingClient, namesrv_addrs: list[str]) -> None:
        self.client = client
        self.namesrv_addrs = namesrv_addrs

    async def register_broker_all(
        self,
        identity: BrokerIdentity,
        topics: TopicConfigSerializeWrapper,
        *,
        timeout: float,
        compressed: bool = False,
    ) -> list[RegisterBrokerResult]:
        # O(topics) (0.1 s for 10,000): many are encoded in a worker thread, so the loop goes
        # on serving (``topics`` is a snapshot, serialize_wrapper, that nothing else changes).
        encode = RegisterBrokerBody(topics, []).encode
        if len(topics.topic_config_table) < THREAD_ENCODE_TOPICS:
            body = encode(compressed)
        else:
            body = await trio.to_thread.run_sync(encode, compressed)
        header = H.encode(
            H.RegisterBrokerRequestHeader(
                broker_name=identity.broker_name,
                broker_addr=identity.broker_addr,
                cluster_name=identity.cluster_name,
                ha_server_addr=identity.ha_server_addr,
                broker_id=identity.broker_id,
                compressed=compressed,
                body_crc32=body_crc32(body),
            )
        )
        results: list[RegisterBrokerResult] = []

        async def one(addr: str) -> None:
            request = RemotingCommand.request(RequestCode.REGISTER_BROKER, header, body)
            try:
                response = await self.client.invoke(addr, request, timeout)
            except RemotingError as exc:
                log.warning("registerBroker to name server %s failed: %s", addr, exc)
                return
            if response.code != ResponseCode.SUCCESS:
                log.warning(
                    "registerBroker to name server %s refused: %s %s",
                    addr,
                    response.code,
                    response.remark,
                )
                return
            kv = from_json(response.body, KVTable).table if response.body else {}
            results.append(
                RegisterBrokerResult(
                    response.ext_fields.get("masterAddr"),
                    response.ext_fields.get("haServerAddr"),
                    kv,
                )
            )
            log.debug("register broker[%d] to name server %s OK", identity.broker_id, addr)

        with trio.move_on_after(timeout):
            async with trio.open_nursery() as nursery:
                for addr in self.namesrv_addrs:
                    nursery.start_soon(one, addr)
        return results

    async def unregister_broker_all(self, identity: BrokerIdentity, timeout: float = 3.0) -> None:
        header = H.encode(
            H.BrokerIdentityHeader(
                identity.broker_name,
                identity.broker_addr,
                identity.cluster_name,
                identity.broker_id,
            )
        )
        for addr in self.namesrv_addrs:
            request = RemotingCommand.request(RequestCode.UNREGISTER_BROKER, header)
            try:
                await self.client.invoke(addr, request, timeout)
                log.info("unregisterBroker OK, NamesrvAddr: %s", addr)
            except RemotingError as exc:
                log.warning("unregisterBroker from name server %s failed: %s", addr, exc)

    async def need_register(
        self, identity: BrokerIdentity, version: DataVersion, timeout: float
    ) -> bool:
        """QUERY_DATA_VERSION to every name server; True when any of them has another version."""
        changed = False
        header = H.encode(
            H.BrokerIdentityHeader(
                identity.broker_name,
                identity.broker_addr,
                identity.cluster_name,
                identity.broker_id,
            )
        )

        async def one(addr: str) -> None:
            nonlocal changed
            request = RemotingCommand.request(
                RequestCode.QUERY_DATA_VERSION, header, to_json(version)
            )
            try:
                response = await self.client.invoke(addr, request, timeout)
            except RemotingError:
                changed = True
                return
            flag = response.ext_fields.get("changed")
            theirs = from_json(response.body, DataVersion) if response.body else None
            if response.code != ResponseCode.SUCCESS or flag != "false" or theirs != version:
                changed = True

        with trio.move_on_after(timeout):
            async with trio.open_nursery() as nursery:
                for addr in self.namesrv_addrs:
                    nursery.start_soon(one, addr)
        return changed
