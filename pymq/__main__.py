"""``python -m pymq``: the embedded default — a name server and a broker in one process.

Data lives in ``~/.pymq`` unless ``--data DIR`` says otherwise; RocketMQ broker keys can be given
as ``--key value`` (for example ``--flushDiskType SYNC_FLUSH``).  Ctrl-C stops it cleanly.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence

import trio

from pymq.admin.auth import TOKEN_FILE_NAME
from pymq.broker.config import BROKER_DEFAULT_PORT
from pymq.common.cli import add_version, parse_overrides, run_main, setup_logging
from pymq.common.config import ConfigError
from pymq.embedded import Cluster, open_cluster
from pymq.groups import group_metrics_port, group_store_dir, open_groups
from pymq.namesrv.config import NAMESRV_DEFAULT_PORT
from pymq.proxy import grpc_available
from pymq.remoting.config import task_order_of

# The embedded default's admin channel port (rocketmq-dashboard also defaults to 8080).
ADMIN_DEFAULT_PORT = 8080
# RocketMQ 5.x's metricsPromExporterPort default.
METRICS_DEFAULT_PORT = 5557
# RocketMQ 5.x's proxy gRPC port: the embedded default serves the 5.x clients there.
GRPC_DEFAULT_PORT = 8081

WELCOME = """\
pymq is running: name server {namesrv}, broker {broker}, data in {data}

Send and receive a first message (in another terminal, from this directory):
  .venv/bin/python -m pymq.client send --namesrv {namesrv} --topic TopicTest --body "hello pymq"
  .venv/bin/python -m pymq.client consume --namesrv {namesrv} --topic TopicTest --group demo
Any RocketMQ 4.x client works too: point it at name server {namesrv}.
{grpc}{admin}{metrics}Press Ctrl-C to stop.
"""

METRICS_WELCOME = """\
Prometheus:    {url}   (rocketmq-exporter's metric names; its Grafana dashboard works)
"""

ADMIN_WELCOME = """\
Admin console: {console}
Admin token:   {token}   (websocket ws://127.0.0.1:{port}/ws; see docs/admin-protocol.md)
Admin CLI:     .venv/bin/python -m pymq.admin clusterList -n {namesrv}
"""


async def serve(args: argparse.Namespace, overrides: dict[str, str]) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_cluster(
            args.data,
            namesrv_port=args.namesrv_port,
            broker_port=args.broker_port,
            bind_address=args.bind,
            properties=overrides,
            admin_port=args.admin_port,
        ) as cluster:
            print(
                WELCOME.format(
                    namesrv=cluster.namesrv_addr,
                    broker=cluster.broker_addr,
                    data=args.data,
                    admin=_admin_text(cluster),
                    metrics=_metrics_text(cluster),
                    grpc=_grpc_text(cluster),
                ),
                flush=True,
            )
            async for _ in signals:
                break


GROUPS_WELCOME = """\
pymq is running: name server {namesrv}, {count} broker groups in cluster DefaultCluster:
{brokers}
Data in {data}.  Each broker is a process of its own; create topics on all of them with
  .venv/bin/python -m pymq.admin updateTopic -n {namesrv} -c DefaultCluster -t TopicTest
{admin}Press Ctrl-C to stop.
"""


async def serve_groups(args: argparse.Namespace, overrides: dict[str, str]) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_groups(
            args.data,
            args.groups,
            namesrv_port=args.namesrv_port,
            broker_port=args.broker_port,
            bind_address=args.bind,
            properties=overrides,
            admin_port=args.admin_port,
            log_level=args.log_level,
        ) as groups:
            ports = [
                group_metrics_port(overrides.get("metricsPromExporterPort", ""), i)
                for i in range(len(groups.brokers))
            ]
            metrics = ""
            if overrides.get("metricsExporterType", "").upper() == "PROM" and None not in ports:
                urls = ", ".join(f"http://127.0.0.1:{port}/metrics" for port in ports)
                metrics = f"Prometheus:    {urls}\n"
            token = (
                "the adminToken given"
                if overrides.get("adminToken")
                else f"in {os.path.join(group_store_dir(args.data, 0), 'config', TOKEN_FILE_NAME)}"
            )
            admin = metrics + (
                f"Admin console: http://127.0.0.1:{args.admin_port}/ (served by broker-a)\n"
                f"Admin token:   {token}\n"
                if args.admin_port
                else ""
            )
            print(
                GROUPS_WELCOME.format(
                    namesrv=groups.namesrv_addr,
                    count=len(groups.brokers),
                    brokers="\n".join(f"  {g.name} {g.addr}" for g in groups.brokers),
                    data=args.data,
                    admin=admin,
                ),
                flush=True,
            )
            async for _ in signals:
                break


def _grpc_text(cluster: Cluster) -> str:
    server = cluster.broker.grpc_server
    if server is None:
        return ""
    return f"RocketMQ 5.x clients (gRPC): endpoints 127.0.0.1:{server.port}\n"


def _metrics_text(cluster: Cluster) -> str:
    metrics = cluster.broker.metrics
    return METRICS_WELCOME.format(url=metrics.url) if metrics is not None else ""


def _admin_text(cluster: Cluster) -> str:
    channel = cluster.admin_channel
    if channel is None:
        return ""
    return ADMIN_WELCOME.format(
        console=channel.console_url,
        token=channel.token,
        namesrv=cluster.namesrv_addr,
        port=channel.port,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pymq", description="pymq: name server + broker in one process"
    )
    add_version(parser)
    parser.add_argument("--data", default=os.path.join(os.path.expanduser("~"), ".pymq"))
    parser.add_argument("--namesrv-port", type=int, default=NAMESRV_DEFAULT_PORT)
    parser.add_argument("--broker-port", type=int, default=BROKER_DEFAULT_PORT)
    parser.add_argument("--bind", default="0.0.0.0", help="address to listen on")
    parser.add_argument(
        "--admin-port",
        type=int,
        default=ADMIN_DEFAULT_PORT,
        help="admin websocket + console port on 127.0.0.1 (0 disables it)",
    )
    parser.add_argument(
        "--groups",
        type=int,
        help="run N broker groups, one process each (default: one broker in this process)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=METRICS_DEFAULT_PORT,
        help="Prometheus /metrics port on the broker's address (0 disables it; with --groups, "
        "group i serves it on this port + i)",
    )
    parser.add_argument(
        "--grpc-port",
        type=int,
        default=GRPC_DEFAULT_PORT,
        help="RocketMQ 5.x clients' gRPC port (grpcServerPort; 0 disables it; needs the grpc "
        "extra, and is off without it; not with --groups)",
    )
    parser.add_argument("--log-level", default="WARNING")
    args, extra = parser.parse_known_args(argv)
    try:
        overrides = parse_overrides(extra)
        order = task_order_of(overrides)  # the process's, read before its loop starts
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # The embedded default serves Prometheus metrics (--metrics-port 0 turns them off; the
    # RocketMQ keys, when given, win).
    if args.metrics_port:
        overrides.setdefault("metricsExporterType", "PROM")
        overrides.setdefault("metricsPromExporterPort", str(args.metrics_port))
    else:
        overrides.setdefault("metricsExporterType", "DISABLE")
    # The embedded default serves the 5.x clients too, when the grpc extra is installed.
    if args.groups is None and args.grpc_port and grpc_available():
        overrides.setdefault("grpcServerPort", str(args.grpc_port))
    setup_logging(args.log_level)
    if args.groups is not None:
        status = run_main(serve_groups, args, overrides, what="pymq", order=order)
    else:
        status = run_main(serve, args, overrides, what="pymq", order=order)
    if status == 0:
        print("pymq stopped.")
    return status


if __name__ == "__main__":
    sys.exit(main())
