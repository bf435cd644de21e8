"""``python -m pymq.namesrv``: run a RocketMQ-compatible name server."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

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
from pymq.namesrv.config import NAMESRV_DEFAULT_PORT, NamesrvConfig
from pymq.namesrv.controller import NamesrvController
from pymq.remoting.config import NettyServerConfig


def main(argv: Sequence[str] | None = None) -> int:
    parser = base_parser("python -m pymq.namesrv", "pymq name server (RocketMQ 4.x compatible)")
    args, extra = parser.parse_known_args(argv)
    namesrv_config = NamesrvConfig()
    server_config = NettyServerConfig(listen_port=NAMESRV_DEFAULT_PORT)
    try:
        overrides = parse_overrides(extra)
        # Without -c, the file earlier runtime changes were saved to (configStorePath), if any.
        own = overrides.get("configStorePath") or namesrv_config.config_store_path
        config_file = args.config_file or (own if os.path.exists(own) else None)
        load_configs([namesrv_config, server_config], config_file, overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print_config([namesrv_config, server_config])
        return 0
    setup_logging(args.log_level)
    try:
        controller = NamesrvController(
            namesrv_config, server_config, config_path=args.config_file
        )  # TLS settings read here
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return run_main(
        run_until_signalled,
        controller.run,
        "The Name Server boot success. serializeType=JSON, listening on port {started}",
        what="the name server",
        order=server_config.server_task_order,
    )


if __name__ == "__main__":
    sys.exit(main())
