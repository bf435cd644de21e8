"""NamesrvController: wires the name server's services into one nursery (DESIGN.md section 3).

::

    NamesrvController.run()
    └─ nursery
       ├─ remoting server (task per connection)
       ├─ scan_not_active_broker  (first after 5 s, then every 10 s)
       └─ print_kv                (first after 1 min, then every 10 min)

``run`` reports the bound port through ``task_status.started`` once the server listens, and
returns only when cancelled.  A broker whose connection closes is forgotten at once; one that
stops registering is forgotten by the scan after 120 s.
"""

from __future__ import annotations

import logging

import trio

from pymq.common.files import PropertiesFile
from pymq.common.periodic import every
from pymq.namesrv.config import NamesrvConfig
from pymq.namesrv.kvconfig import KVConfigManager
from pymq.namesrv.processor import NamesrvProcessor
from pymq.namesrv.routes import RouteInfoManager
from pymq.remoting.channel import Channel
from pymq.remoting.config import NettyServerConfig
from pymq.remoting.server import RemotingServer

log = logging.getLogger(__name__)

# NamesrvController.initialize(): the scan's initial delay and period, and the KV print's.
SCAN_INITIAL_DELAY = 5.0
SCAN_PERIOD = 10.0
PRINT_KV_INITIAL_DELAY = 60.0
PRINT_KV_PERIOD = 600.0


class NamesrvController:
    def __init__(
        self,
        namesrv_config: NamesrvConfig,
        server_config: NettyServerConfig,
        *,
        config_path: str | None = None,
    ) -> None:
        """``config_path``: the file runtime config changes are saved to (the ``-c`` file the
        name server was started with; by default ``configStorePath``, as in RocketMQ)."""
        self.namesrv_config = namesrv_config
        self.server_config = server_config
        self.config_file = PropertiesFile(config_path or namesrv_config.config_store_path)
        self.routes = RouteInfoManager()
        self.kv = KVConfigManager(namesrv_config.kv_config_path)
        self.server = RemotingServer(
            host=server_config.bind_address,
            port=server_config.listen_port,
            name="namesrv",
            on_channel_closed=self._on_channel_closed,
            budget=server_config.shared_budget(),
            **server_config.server_limits(),
        )
        self.processor = NamesrvProcessor(self)
        self.server.add_routes(self.processor.route_table())

    def configs(self) -> list[object]:
        return [self.namesrv_config, self.server_config]

    @property
    def port(self) -> int:
        return self.server.port

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        await trio.to_thread.run_sync(self.kv.load)
        async with trio.open_nursery() as nursery:
            port = await nursery.start(self.server.run)
            nursery.start_soon(
                lambda: every(
                    SCAN_PERIOD,
                    self.scan_not_active_broker,
                    initial_delay=SCAN_INITIAL_DELAY,
                    name="scan_not_active_broker",
                )
            )
            nursery.start_soon(
                lambda: every(
                    PRINT_KV_PERIOD,
                    self.kv.print_all,
                    initial_delay=PRINT_KV_INITIAL_DELAY,
                    name="print_kv",
                )
            )
            log.info("The Name Server boot success. serializeType=JSON, port %d", port)
            task_status.started(port)

    def scan_not_active_broker(self) -> None:
        for addr, channel in self.routes.scan_not_active_broker(trio.current_time()):
            if isinstance(channel, Channel):
                channel.close(f"broker {addr} expired")

    def _on_channel_closed(self, channel: Channel) -> None:
        self.routes.on_channel_destroy(channel.remote_address, channel)
