"""Creating a topic the way mqadmin's updateTopic does: on every master, then wait for its route."""

from __future__ import annotations

import ssl

import trio

from pymq.acl.rpc_hook import AclSigner
from pymq.client.instance import Credentials, MQClientError, tls_context
from pymq.common.serde import loads_lenient
from pymq.common.topic import AUTO_CREATE_TOPIC_KEY_TOPIC
from pymq.remoting import headers as H
from pymq.remoting.client import open_remoting_client
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode, ResponseCode


async def master_addresses(namesrv_addr: str, tls: bool | ssl.SSLContext = False) -> list[str]:
    """Every master broker's address, from the name server's cluster info."""
    async with open_remoting_client(ssl_context=tls_context(tls)) as client:
        info = await client.invoke(
            namesrv_addr, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
        )
    if info.code != ResponseCode.SUCCESS:
        raise MQClientError(info.code, info.remark, "cluster info")
    masters = []
    for data in loads_lenient(info.body).get("brokerAddrTable", {}).values():
        addr = data.get("brokerAddrs", {}).get("0")
        if addr:
            masters.append(addr)
    return masters


async def create_topic(
    namesrv_addr: str,
    topic: str,
    *,
    queues: int = 4,
    perm: int = 6,
    brokers: list[str] | None = None,
    timeout: float = 10.0,
    order: bool = False,
    credentials: Credentials | None = None,
    tls: bool | ssl.SSLContext = False,
    attributes: str | None = None,
) -> None:
    """UPDATE_AND_CREATE_TOPIC on ``brokers`` (default: every master), then wait until the name
    server serves the topic's route, so clients started next see its queues at once.
    ``credentials``: an admin ACL account's (accessKey, secretKey) for a broker with ACL;
    ``tls``: as the clients' option; ``attributes``: RocketMQ 5's topic attribute changes
    (``"+message.type=FIFO"``)."""
    targets = brokers if brokers is not None else await master_addresses(namesrv_addr, tls)
    if not targets:
        raise MQClientError(-1, "no master broker is registered with the name server")
    signer = AclSigner(*credentials) if credentials is not None else None
    async with open_remoting_client(signer=signer, ssl_context=tls_context(tls)) as client:
        for addr in targets:
            create = RemotingCommand.request(
                RequestCode.UPDATE_AND_CREATE_TOPIC,
                H.encode(
                    H.CreateTopicRequestHeader(
                        topic=topic,
                        default_topic=AUTO_CREATE_TOPIC_KEY_TOPIC,
                        read_queue_nums=queues,
                        write_queue_nums=queues,
                        perm=perm,
                        topic_filter_type="SINGLE_TAG",
                        topic_sys_flag=0,
                        order=order,
                        attributes=attributes,
                    )
                ),
            )
            response = await client.invoke(addr, create)
            if response.code != ResponseCode.SUCCESS:
                raise MQClientError(response.code, response.remark, f"create topic {topic}")
        route = RemotingCommand.request(
            RequestCode.GET_ROUTEINFO_BY_TOPIC, H.encode(H.TopicHeader(topic))
        )
        with trio.fail_after(timeout):
            while (await client.invoke(namesrv_addr, route)).code != ResponseCode.SUCCESS:
                await trio.sleep(0.02)
