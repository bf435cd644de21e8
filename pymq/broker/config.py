"""BrokerConfig: RocketMQ 4.x's broker keys and defaults.

Keys that size Java thread pools or queues are accepted (config files load unchanged) and shown
by ``-p``, but pymq runs on one Trio loop and does not use them.
"""

from __future__ import annotations

import os
import socket

import attrs

from pymq.common.topic import PERM_READ, PERM_WRITE

# BrokerStartup: the broker's main port; the fast ("VIP") port is listenPort - 2 and HA + 1.
BROKER_DEFAULT_PORT = 10911


def _local_address() -> str:
    """The host's own IPv4 address by name, else loopback (set brokerIP1 to choose)."""
    try:
        address = socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
    return address if address and not address.startswith("0.") else "127.0.0.1"


def _host_name() -> str:
    return socket.gethostname() or "DEFAULT_BROKER"


def _namesrv_from_env() -> str | None:
    return os.environ.get("NAMESRV_ADDR") or None


# The file a broker started without ``-c`` saves its runtime config changes to, in its store's
# config directory (RocketMQ's default is the same file under ~/store/config), and reads at start.
OWN_CONFIG_FILE = "broker.properties"

# Keys of RocketMQ's whose non-default value asks for a feature pymq does not have: the broker
# refuses to start with them (one line naming the key and why) rather than run without it.
UNSUPPORTED_KEYS: dict[str, str] = {
    "messageStorePlugIn": "pymq cannot load Java message store plug-ins",
    "fetchNamesrvAddrByAddressServer": "pymq has no address-server client; set namesrvAddr",
    "enableLmq": "light message queues (RocketMQ's MQTT support) are not available in pymq",
    "enableMultiDispatch": "dispatching a message to several queues (light message queues) is "
    "not available in pymq",
}


@attrs.define
class BrokerConfig:
    rocketmq_home: str = attrs.Factory(lambda: os.environ.get("ROCKETMQ_HOME", ""))
    namesrv_addr: str | None = attrs.Factory(_namesrv_from_env)
    broker_ip1: str = attrs.field(factory=_local_address, metadata={"key": "brokerIP1"})
    broker_ip2: str = attrs.field(factory=_local_address, metadata={"key": "brokerIP2"})
    broker_name: str = attrs.Factory(_host_name)
    broker_cluster_name: str = "DefaultCluster"
    broker_id: int = 0
    broker_permission: int = PERM_READ | PERM_WRITE
    default_topic_queue_nums: int = 8
    auto_create_topic_enable: bool = True
    # pymq: auto-creation (a send to a topic the broker does not have, from TBW102 or as a
    # %RETRY% topic) is refused, TOPIC_NOT_EXIST with a remark naming this key, once the broker
    # holds this many topics; 0 turns auto-creation off the same way.  Topics made by
    # UPDATE_AND_CREATE_TOPIC, and retry/DLQ topics of subscription groups, are not limited.
    auto_create_topic_max_count: int = 10000
    cluster_topic_enable: bool = True
    broker_topic_enable: bool = True
    auto_create_subscription_group: bool = True
    message_store_plug_in: str = ""
    msg_trace_topic_name: str = "RMQ_SYS_TRACE_TOPIC"
    trace_topic_enable: bool = False
    send_message_thread_pool_nums: int = 1
    pull_message_thread_pool_nums: int = 20
    query_message_thread_pool_nums: int = 10
    admin_broker_thread_pool_nums: int = 16
    client_manage_thread_pool_nums: int = 32
    consumer_manage_thread_pool_nums: int = 32
    heartbeat_thread_pool_nums: int = 2
    end_transaction_thread_pool_nums: int = 12
    flush_consumer_offset_interval: int = 5000
    flush_consumer_offset_history_interval: int = 60000
    reject_transaction_message: bool = False
    fetch_namesrv_addr_by_address_server: bool = False
    send_thread_pool_queue_capacity: int = 10000
    pull_thread_pool_queue_capacity: int = 100000
    query_thread_pool_queue_capacity: int = 20000
    client_manager_thread_pool_queue_capacity: int = 1000000
    consumer_manager_thread_pool_queue_capacity: int = 1000000
    heartbeat_thread_pool_queue_capacity: int = 50000
    filter_server_nums: int = 0
    long_polling_enable: bool = True
    short_polling_time_mills: int = 1000
    notify_consumer_ids_changed_enable: bool = True
    high_speed_mode: bool = False
    transfer_msg_by_heap: bool = True
    max_delay_time: int = 40
    region_id: str = "DefaultRegion"
    register_broker_timeout_mills: int = 6000
    slave_read_enable: bool = False
    disable_consume_if_consumer_read_slowly: bool = False
    consumer_fallbehind_threshold: int = 16 * 1024 * 1024 * 1024
    broker_fast_failure_enable: bool = True
    wait_time_mills_in_send_queue: int = 200
    wait_time_mills_in_pull_queue: int = 5000
    wait_time_mills_in_heartbeat_queue: int = 31000
    wait_time_mills_in_transaction_queue: int = 3000
    filter_support_retry: bool = False
    enable_property_filter: bool = False
    # Accepted for compatibility: pymq does not compute the bloom-filter bit map.
    enable_calc_filter_bit_map: bool = False
    max_error_rate_of_bloom_filter: int = 20
    expect_consumer_num_use_filter: int = 32
    # Dead SQL92 filters (their group gone, or no longer subscribing) are dropped this long after.
    filter_data_clean_time_span: int = 24 * 3600 * 1000
    compressed_register: bool = False
    force_register: bool = True
    register_name_server_period: int = 30000
    transaction_time_out: int = 6000
    transaction_check_max: int = 15
    transaction_check_interval: int = 60000
    acl_enable: bool = False
    # pymq: the ACL account (accessKey/secretKey) this broker signs its own requests with (to the
    # name servers, and a slave's to its master); both empty: unsigned.
    access_key: str = ""
    secret_key: str = ""
    store_reply_message_enable: bool = True
    trace_on: bool = True
    # RocketMQ 5's recall of a pending timer message (RECALL_MESSAGE): refused with
    # NO_PERMISSION unless enabled; and, enabled, refused with SERVICE_NOT_AVAILABLE while the
    # broker is not writeable (brokerPermission) only when the second key is false.
    recall_message_enable: bool = False
    allow_recall_when_broker_not_writeable: bool = True
    # Java's keys pymq accepts with Java's defaults but does not use (commercial statistics,
    # the filter server's bit map, more thread pools and their queues).
    put_message_future_thread_pool_nums: int = 2
    process_reply_message_thread_pool_nums: int = 20
    put_thread_pool_queue_capacity: int = 10000
    reply_thread_pool_queue_capacity: int = 10000
    end_transaction_pool_queue_capacity: int = 100000
    start_accept_send_request_time_stamp: int = 0
    slave_timeout: int = 3000
    commercial_enable: bool = True
    commercial_timer_count: int = 1
    commercial_trans_count: int = 1
    commercial_big_count: int = 1
    commercial_base_count: int = 1
    auto_delete_unused_stats: bool = False
    enable_detail_stat: bool = True
    isolate_log_enable: bool = False
    is_enable_batch_push: bool = False
    # RocketMQ 5.x's metrics keys: PROM serves Prometheus /metrics with rocketmq-exporter's
    # names (pymq.broker.metrics) on metricsPromExporterHost (blank: brokerIP1) and port.
    metrics_exporter_type: str = "DISABLE"
    metrics_prom_exporter_host: str = ""
    metrics_prom_exporter_port: int = 5557
    # RocketMQ 5's gRPC messaging service for the 5.x clients (pymq.proxy), served by the
    # broker itself on this port (RocketMQ 5's proxy listens on 8081); 0 = off.  Needs the
    # ``grpc`` extra.  Its limits are the remoting ports' (serverMaxConnections, the shared
    # buffer budget, the write stall and frame receive timeouts) and maxMessageSize, plus the
    # streams one connection may have open at once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS).
    grpc_server_port: int = 0
    grpc_max_concurrent_streams: int = 100
    # pymq: the admin websocket channel (0 = off); see the admin docs.
    admin_listen_port: int = 0
    admin_bind_address: str = "127.0.0.1"
    admin_token: str = ""
    # pymq: the admin channel's limits (read at start; see AdminLimits in pymq/admin/channel.py).
    # Extra Host names (name, or name:port) and page origins (scheme://host[:port]) accepted
    # besides the console's own, comma-separated.
    admin_allowed_hosts: str = ""
    admin_allowed_origins: str = ""
    # A connection must authenticate within this (HTTP head, handshake and token included).
    admin_auth_timeout_millis: int = 5000
    # The wrong tokens from one client address that start its lockouts; the first lockout,
    # and the longest (each further wrong token doubles it); addresses remembered.
    admin_auth_failures_before_delay: int = 5
    admin_auth_delay_millis: int = 1000
    admin_auth_max_delay_millis: int = 60000
    admin_auth_throttle_max_addresses: int = 4096
    admin_max_connections: int = 64
    admin_max_unauthenticated_connections: int = 16
    admin_max_message_bytes: int = 1024 * 1024
    admin_max_request_head_bytes: int = 16 * 1024

    def namesrv_list(self) -> list[str]:
        return [a.strip() for a in (self.namesrv_addr or "").split(";") if a.strip()]
