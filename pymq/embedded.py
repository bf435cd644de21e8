"""A name server and a broker in one process and one nursery: pymq's embedded default.

:func:`open_cluster` is what ``python -m pymq`` runs and what :mod:`pymq.testing` gives tests:
the name server starts first, the broker registers with it, and leaving the context stops both
(the broker unregisters, flushes and checkpoints; the store removes its abort file).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs

from pymq.admin.channel import AdminChannel, attach_admin_channel
from pymq.broker.config import BROKER_DEFAULT_PORT, OWN_CONFIG_FILE, BrokerConfig
from pymq.broker.controller import BrokerController
from pymq.common.config import apply_properties, apply_saved
from pymq.common.nursery import open_nursery_unwrapped
from pymq.namesrv.config import NAMESRV_DEFAULT_PORT, NamesrvConfig
from pymq.namesrv.controller import NamesrvController
from pymq.remoting.config import NettyClientConfig, NettyServerConfig
from pymq.store.config import MessageStoreConfig


@attrs.define
class Cluster:
    namesrv: NamesrvController
    broker: BrokerController
    # The admin websocket + console, when admin_port (adminListenPort) is set.
    admin_channel: AdminChannel | None = None

    @property
    def namesrv_addr(self) -> str:
        return f"127.0.0.1:{self.namesrv.port}"

    @property
    def broker_addr(self) -> str:
        return self.broker.broker_addr


def build_cluster(
    data_dir: str,
    *,
    namesrv_port: int = NAMESRV_DEFAULT_PORT,
    broker_port: int = BROKER_DEFAULT_PORT,
    bind_address: str = "0.0.0.0",
    broker_ip: str = "127.0.0.1",
    properties: dict[str, str] | None = None,
    admin_port: int = 0,
) -> tuple[NamesrvController, list[object]]:
    """The name server, and the four broker config objects, for ``data_dir``.

    ``admin_port`` turns on the admin channel and console (0 leaves it off; ``ADMIN_ANY_PORT``
    is kept out of the config: :func:`open_cluster` binds any free port for it).

    ``properties`` are RocketMQ keys applied to the broker's configs last; unknown keys raise.
    Runtime config changes saved by an earlier run (the name server's ``configStorePath`` and
    the broker's ``broker.properties`` under ``data_dir``) are applied before them.
    """
    namesrv_config = NamesrvConfig(
        kv_config_path=os.path.join(data_dir, "namesrv", "kvConfig.json"),
        config_store_path=os.path.join(data_dir, "namesrv", "namesrv.properties"),
    )
    namesrv_server = NettyServerConfig(listen_port=namesrv_port, bind_address=bind_address)
    apply_saved([namesrv_config, namesrv_server], namesrv_config.config_store_path)
    namesrv = NamesrvController(namesrv_config, namesrv_server)
    broker_config = BrokerConfig(
        broker_ip1=broker_ip,
        broker_ip2=broker_ip,
        broker_name="broker-a",
        namesrv_addr=None,
        admin_listen_port=max(admin_port, 0),
    )
    server_config = NettyServerConfig(listen_port=broker_port, bind_address=bind_address)
    store_config = MessageStoreConfig(store_path_root_dir=os.path.join(data_dir, "store"))
    store_config.ha_listen_port = broker_port + 1 if broker_port else 0
    configs: list[object] = [broker_config, server_config, NettyClientConfig(), store_config]
    apply_saved(configs, os.path.join(store_config.config_dir, OWN_CONFIG_FILE))
    unknown = apply_properties(configs, properties or {})
    if unknown:
        raise ValueError(f"unknown config keys: {', '.join(unknown)}")
    # One process, one task order (the entry point applied it): the name server reports it too.
    namesrv.server_config.server_task_order = server_config.server_task_order
    return namesrv, configs


ADMIN_ANY_PORT = -1
"""``open_cluster(admin_port=ADMIN_ANY_PORT)``: the admin channel on any free port, bound by the
channel itself (``cluster.admin_channel.port`` says which), with no window in which another
process can take a port picked beforehand."""


@asynccontextmanager
async def open_cluster(
    data_dir: str,
    *,
    namesrv_port: int = NAMESRV_DEFAULT_PORT,
    broker_port: int = BROKER_DEFAULT_PORT,
    bind_address: str = "0.0.0.0",
    broker_ip: str = "127.0.0.1",
    properties: dict[str, str] | None = None,
    admin_port: int = 0,
) -> AsyncIterator[Cluster]:
    namesrv, configs = build_cluster(
        data_dir,
        namesrv_port=namesrv_port,
        broker_port=broker_port,
        bind_address=bind_address,
        broker_ip=broker_ip,
        properties=properties,
        admin_port=admin_port,
    )
    async with open_nursery_unwrapped() as nursery:
        port = await nursery.start(namesrv.run)
        broker_config = configs[0]
        assert isinstance(broker_config, BrokerConfig)
        broker_config.namesrv_addr = f"127.0.0.1:{port}"
        # build_cluster returns the four configs in BrokerController's order, as list[object].
        broker = BrokerController(*configs)  # type: ignore[arg-type]
        admin_channel = attach_admin_channel(
            broker, port=0 if admin_port == ADMIN_ANY_PORT else None
        )
        try:
            # The broker stops first, so that it can still unregister from the name server.
            async with open_nursery_unwrapped() as broker_nursery:
                await broker_nursery.start(broker.run)
                try:
                    yield Cluster(namesrv, broker, admin_channel)
                finally:
                    broker_nursery.cancel_scope.cancel()
        finally:
            nursery.cancel_scope.cancel()
