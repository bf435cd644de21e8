"""``python -m pymq --groups N``: a name server and N broker groups, one process per broker.

A pymq broker is one Python process and uses one core; RocketMQ scales by broker groups, and so
does pymq.  This module is the development form of that: the name server runs in this process,
and each group's master runs as ``python -m pymq.broker`` in a child process of its own
(``broker-a``, ``broker-b``, … in cluster ``DefaultCluster``), with its store under
``DATA/broker-X/``.  Group *i* listens on ``broker_port + 10 * i`` (and, as every pymq broker,
on that port - 2 for VIP channels and + 1 for HA).  The first group serves the admin console
when an admin port is given; with a ``metricsPromExporterPort``, group *i* serves Prometheus
metrics on that port + *i*.

Children are stopped with SIGTERM (a clean shutdown: unregister, flush, checkpoint) when the
context ends, killed if they have not stopped after :data:`STOP_TIMEOUT` seconds, and stop by
themselves if this process dies first (``--stop-with-stdin``: their standard input is a pipe
this process holds, which the kernel closes however it ends), so none is left running.  A
child that exits on its own ends the whole group set with its exit status.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import trio

from pymq.common.config import ConfigError, apply_saved
from pymq.common.errors import StartupError
from pymq.common.nursery import open_nursery_unwrapped
from pymq.namesrv.config import NamesrvConfig
from pymq.namesrv.controller import NamesrvController
from pymq.remoting.config import NettyServerConfig, task_order_of

# Ports between two groups: each broker uses its port - 2, the port and + 1.
PORT_STEP = 10
# A broker starting (recovering its store) gets this long to say it booted.
START_TIMEOUT = 120.0
# A broker gets this long to stop cleanly after SIGTERM before it is killed.
STOP_TIMEOUT = 30.0
MAX_GROUPS = 26  # broker-a .. broker-z

_BOOTED = re.compile(r"The broker\[([^,]+), ([^\]]+)\] boot success")


class GroupError(StartupError):
    """A broker group could not start (its exit status and last words in the message)."""


@attrs.define
class BrokerGroup:
    name: str
    addr: str
    process: trio.Process


@attrs.define
class Groups:
    namesrv: NamesrvController
    brokers: list[BrokerGroup]

    @property
    def namesrv_addr(self) -> str:
        return f"127.0.0.1:{self.namesrv.port}"


def free_base_port(groups: int, host: str = "127.0.0.1") -> int:
    """A ``broker_port`` whose groups' ports (each ``port + 10 i``, with its - 2 and + 1) are
    all free now, for tests and benchmarks (another process may still take one before the
    brokers bind it)."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind((host, 0))
            base = probe.getsockname()[1]
        if base < 3 or base + PORT_STEP * groups + 2 > 65535:
            continue
        socks: list[socket.socket] = []
        try:
            for i in range(groups):
                for delta in (-2, 0, 1):
                    sock = socket.socket()
                    socks.append(sock)
                    sock.bind((host, base + PORT_STEP * i + delta))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise OSError("no free block of ports for the broker groups")


def group_name(index: int) -> str:
    return f"broker-{chr(ord('a') + index)}"


def group_store_dir(data_dir: str, index: int) -> str:
    """Group ``index``'s ``storePathRootDir``."""
    return os.path.join(data_dir, group_name(index), "store")


def group_metrics_port(port: str, index: int) -> int | None:
    """Group ``index``'s /metrics port for a ``metricsPromExporterPort`` of ``port``: the port
    + ``index``; None when ``port`` is not a positive number (the broker judges it then)."""
    text = port.strip()
    if not text.isdigit() or int(text) == 0:
        return None
    return int(text) + index


def broker_command(
    index: int,
    data_dir: str,
    namesrv_addr: str,
    port: int,
    bind_address: str,
    properties: dict[str, str],
    admin_port: int,
    log_level: str = "WARNING",
) -> list[str]:
    name = group_name(index)
    cmd = [
        sys.executable,
        "-m",
        "pymq.broker",
        "-n",
        namesrv_addr,
        "--brokerName",
        name,
        "--brokerClusterName",
        "DefaultCluster",
        "--listenPort",
        str(port),
        "--bindAddress",
        bind_address,
        "--brokerIP1",
        "127.0.0.1",
        "--brokerIP2",
        "127.0.0.1",
        "--storePathRootDir",
        group_store_dir(data_dir, index),
        "--log-level",
        log_level,
        # No broker outlives --groups: its standard input is a pipe this process holds.
        "--stop-with-stdin",
    ]
    if index == 0 and admin_port:
        cmd += ["--adminListenPort", str(admin_port)]
    for key, value in properties.items():
        if key == "metricsPromExporterPort":
            metrics_port = group_metrics_port(value, index)  # one /metrics port per group
            value = value if metrics_port is None else str(metrics_port)
        cmd += [f"--{key}", value]
    return cmd


async def _start_broker(
    nursery: trio.Nursery, cmd: list[str], name: str, started: list[BrokerGroup]
) -> BrokerGroup:
    process = await trio.lowlevel.open_process(
        cmd,
        stdin=subprocess.PIPE,  # never written: it closes when this process ends
        stdout=subprocess.PIPE,
    )
    group = BrokerGroup(name, "", process)
    started.append(group)  # stopped by the caller whatever happens next
    assert process.stdout is not None
    buffered = b""
    with trio.move_on_after(START_TIMEOUT):
        while b"\n" not in buffered or not _BOOTED.search(buffered.decode(errors="replace")):
            chunk = await process.stdout.receive_some(4096)
            if not chunk:
                break
            buffered += chunk
    match = _BOOTED.search(buffered.decode(errors="replace"))
    if match is None:
        with trio.move_on_after(5):  # it closed its output: let it finish exiting
            await process.wait()
        status = process.poll()
        said = buffered.decode(errors="replace").strip()[-300:]
        raise GroupError(
            f"broker group {name} did not start"
            + (f" (exit status {status})" if status is not None else " in time")
            + (f": {said}" if said else " (its errors are above)")
        )
    group.addr = match.group(2)
    nursery.start_soon(_drain, process)
    return group


async def _drain(process: trio.Process) -> None:
    """Read what the child prints, so that a full pipe never blocks it."""
    assert process.stdout is not None
    while await process.stdout.receive_some(4096):
        pass


async def _stop(group: BrokerGroup) -> None:
    process = group.process
    if process.returncode is not None:
        return
    process.send_signal(signal.SIGTERM)
    with trio.move_on_after(STOP_TIMEOUT) as scope:
        await process.wait()
    if scope.cancelled_caught:
        process.kill()
        await process.wait()


async def _watch(group: BrokerGroup) -> None:
    status = await group.process.wait()
    raise GroupError(f"broker group {group.name} exited with status {status}")


@asynccontextmanager
async def open_groups(
    data_dir: str,
    groups: int,
    *,
    namesrv_port: int,
    broker_port: int,
    bind_address: str = "0.0.0.0",
    properties: dict[str, str] | None = None,
    admin_port: int = 0,
    log_level: str = "WARNING",
) -> AsyncIterator[Groups]:
    """The name server here and ``groups`` brokers in child processes, all started."""
    if not 1 <= groups <= MAX_GROUPS:
        raise ConfigError(f"--groups must be 1..{MAX_GROUPS}, not {groups}")
    if broker_port <= 2:
        raise ConfigError("--groups needs a broker port (group i listens on port + 10*i)")
    namesrv_config = NamesrvConfig(
        kv_config_path=os.path.join(data_dir, "namesrv", "kvConfig.json"),
        config_store_path=os.path.join(data_dir, "namesrv", "namesrv.properties"),
    )
    namesrv_server = NettyServerConfig(
        listen_port=namesrv_port,
        bind_address=bind_address,
        # The process's (the entry point applied it; each broker process reads its own).
        server_task_order=task_order_of(properties or {}),
    )
    apply_saved([namesrv_config, namesrv_server], namesrv_config.config_store_path)
    namesrv = NamesrvController(namesrv_config, namesrv_server)
    started: list[BrokerGroup] = []
    async with open_nursery_unwrapped() as nursery:
        port = await nursery.start(namesrv.run)
        namesrv_addr = f"127.0.0.1:{port}"
        try:
            async with trio.open_nursery() as starting:
                for i in range(groups):
                    cmd = broker_command(
                        i,
                        data_dir,
                        namesrv_addr,
                        broker_port + PORT_STEP * i,
                        bind_address,
                        properties or {},
                        admin_port,
                        log_level,
                    )
                    starting.start_soon(_start_broker, nursery, cmd, group_name(i), started)
            brokers = sorted(started, key=lambda g: g.name)
            async with open_nursery_unwrapped() as watching:
                for group in brokers:
                    watching.start_soon(_watch, group)
                try:
                    yield Groups(namesrv, brokers)
                finally:
                    watching.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                async with trio.open_nursery() as stopping:
                    for group in started:
                        stopping.start_soon(_stop, group)
            nursery.cancel_scope.cancel()
