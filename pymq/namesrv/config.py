"""NamesrvConfig: RocketMQ's name-server keys and defaults."""

from __future__ import annotations

import os

import attrs

from pymq.common.config import user_home


def _home() -> str:
    return os.environ.get("ROCKETMQ_HOME", "")


@attrs.define
class NamesrvConfig:
    rocketmq_home: str = attrs.Factory(_home)
    kv_config_path: str = attrs.Factory(
        lambda: os.path.join(user_home(), "namesrv", "kvConfig.json")
    )
    config_store_path: str = attrs.Factory(
        lambda: os.path.join(user_home(), "namesrv", "namesrv.properties")
    )
    product_env_name: str = "center"
    cluster_test: bool = False
    order_message_enable: bool = False


# The name server's own port; NettyServerConfig's class default (8888) is always overridden.
NAMESRV_DEFAULT_PORT = 9876
