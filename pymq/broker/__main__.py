"""``python -m pymq.broker -c broker.conf [-n namesrvAddr]``: run a RocketMQ-compatible broker.

An entry point, not part of the broker's layer: it wires the broker with what builds on it (the
admin channel, when adminListenPort is set).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Sequence

from pymq.admin.channel import attach_admin_channel
from pymq.broker.config import BROKER_DEFAULT_PORT, OWN_CONFIG_FILE, BrokerConfig
from pymq.broker.controller import BrokerController
from pymq.common.cli import (
    base_parser,
    load_configs,
    parse_overrides,
    print_config,
    run_main,
    run_until_signalled,
    setup_logging,
)
from pymq.common.config import ConfigError
from pymq.remoting.config import NettyClientConfig, NettyServerConfig
from pymq.store.config import BrokerRole, MessageStoreConfig


def own_config_file(overrides: dict[str, str]) -> str | None:
    """The file a broker started without ``-c`` saved its runtime changes to, if there is one:
    ``broker.properties`` in the config directory of the store the overrides name."""
    root = overrides.get("storePathRootDir") or MessageStoreConfig().store_path_root_dir
    path = os.path.join(root, "config", OWN_CONFIG_FILE)
    return path if os.path.exists(path) else None


def build_configs(
    config_file: str | None, overrides: dict[str, str]
) -> tuple[BrokerConfig, NettyServerConfig, NettyClientConfig, MessageStoreConfig]:
    """Defaults, then the file (``-c``, or else the broker's own saved changes), then flags;
    then BrokerStartup's own rules."""
    broker = BrokerConfig()
    server = NettyServerConfig(listen_port=BROKER_DEFAULT_PORT)
    client = NettyClientConfig()
    store = MessageStoreConfig()
    load_configs(
        [broker, server, client, store], config_file or own_config_file(overrides), overrides
    )
    if store.broker_role is BrokerRole.SLAVE:
        if broker.broker_id <= 0:
            raise ConfigError("Slave's brokerId must be > 0 (set brokerId in broker.conf)")
    else:
        broker.broker_id = 0  # a master is always brokerId 0
    if "haListenPort" not in overrides:
        store.ha_listen_port = server.listen_port + 1
    return broker, server, client, store


def main(argv: Sequence[str] | None = None) -> int:
    parser = base_parser("python -m pymq.broker", "pymq broker (RocketMQ 4.x compatible)")
    parser.add_argument("-n", "--namesrvAddr", dest="namesrv_addr", help="name servers, a;b")
    parser.add_argument(
        "--stop-with-stdin",
        action="store_true",
        help="also stop when standard input closes (python -m pymq --groups starts its brokers so)",
    )
    args, extra = parser.parse_known_args(argv)
    try:
        overrides = parse_overrides(extra)
        if args.namesrv_addr:
            overrides["namesrvAddr"] = args.namesrv_addr
        configs = build_configs(args.config_file, overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print_config(configs)
        return 0
    setup_logging(args.log_level)
    try:
        # Reads the ACL files when aclEnable=true; saves runtime changes to the -c file.
        controller = BrokerController(*configs, config_path=args.config_file)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    attach_admin_channel(controller)
    return run_main(
        functools.partial(run_until_signalled, stop_with_stdin=args.stop_with_stdin),
        controller.run,
        f"The broker[{configs[0].broker_name}, {configs[0].broker_ip1}:{{started}}] boot "
        f"success. serializeType=JSON and name server is {configs[0].namesrv_addr}",
        what="the broker",
        order=configs[1].server_task_order,
    )


if __name__ == "__main__":
    sys.exit(main())
