"""Command-line plumbing shared by ``python -m pymq.namesrv``, ``pymq.broker`` and ``pymq``.

Config comes from the defaults, then a RocketMQ ``-c`` properties file, then ``--key value`` (or
``--key=value``) flags named by any config key, as RocketMQ's startup classes layer them.
Unknown keys are reported on stderr, never silently dropped.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence

import trio

import pymq
from pymq.common.config import ConfigError, apply_properties, to_properties
from pymq.common.errors import StartupError
from pymq.common.properties import format_properties, load_properties
from pymq.common.scheduling import TaskOrder, task_order

log = logging.getLogger(__name__)


def parse_overrides(extra: Sequence[str]) -> dict[str, str]:
    """``--key value`` / ``--key=value`` pairs left over by argparse, as a properties dict."""
    props: dict[str, str] = {}
    i = 0
    while i < len(extra):
        arg = extra[i]
        if not arg.startswith("--") or len(arg) < 3:
            raise ConfigError(f"unexpected argument {arg!r} (config keys are given as --key value)")
        key, sep, value = arg[2:].partition("=")
        if not sep:
            if i + 1 >= len(extra):
                raise ConfigError(f"--{key} needs a value")
            i += 1
            value = extra[i]
        props[key] = value
        i += 1
    return props


def load_configs(
    configs: Sequence[object], config_file: str | None, overrides: dict[str, str]
) -> None:
    """Layer the config file and the overrides onto ``configs``; report unknown keys."""
    layers: list[tuple[str, dict[str, str]]] = []
    if config_file:
        try:
            layers.append((config_file, load_properties(config_file)))
        except OSError as exc:
            raise ConfigError(f"cannot read config file {config_file}: {exc.strerror}") from None
    layers.append(("command line", overrides))
    for source, props in layers:
        try:
            unknown = apply_properties(configs, props)
        except ConfigError as exc:
            if source == config_file:  # which file holds the bad value
                raise ConfigError(f"{source}: {exc}") from None
            raise
        for key in unknown:
            print(f"warning: unknown config key {key!r} in {source}, ignored", file=sys.stderr)


def print_config(configs: Sequence[object]) -> None:
    sys.stdout.write(format_properties(to_properties(configs)))


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)-5s %(name)s - %(message)s",
    )


def add_version(parser: argparse.ArgumentParser) -> None:
    """``--version``: pymq's own version (clients are told RocketMQ's, V4_9_4)."""
    parser.add_argument("--version", action="version", version=f"pymq {pymq.__version__}")


def base_parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_version(parser)
    parser.add_argument("-c", "--configFile", dest="config_file", help="RocketMQ properties file")
    parser.add_argument(
        "-p",
        "--printConfigItem",
        dest="print_config",
        action="store_true",
        help="print the effective config and exit",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    return parser


async def run_until_signalled(
    service: Callable[..., Awaitable[object]], banner: str, *, stop_with_stdin: bool = False
) -> None:
    """Run ``service(task_status=...)`` until SIGINT or SIGTERM, then cancel it cleanly.
    ``stop_with_stdin``: also when standard input reaches its end (see :func:`stop_at_eof`)."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            if stop_with_stdin:
                nursery.start_soon(stop_at_eof, nursery.cancel_scope)
            started = await nursery.start(service)
            print(banner.format(started=started), flush=True)
            async for signum in signals:
                log.info("received %s, shutting down", signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                break


async def stop_at_eof(scope: trio.CancelScope) -> None:
    """Cancel ``scope`` once standard input reaches its end: how ``python -m pymq --groups``
    ties each broker process to itself. The parent holds the pipe's other end and never
    writes; however it ends (SIGKILL included) the kernel closes that end. Unlike Linux's
    parent-death signal, which follows the *thread* that forked the child (Trio forks in a
    worker thread that retires after 10 idle seconds), this follows the process."""
    async with trio.lowlevel.FdStream(os.dup(sys.stdin.fileno())) as stdin:
        while await stdin.receive_some(4096):
            pass
    log.info("standard input closed (the parent has gone), shutting down")
    scope.cancel()


def leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


def run_main(
    async_fn: Callable[..., Awaitable[object]],
    *args: object,
    what: str,
    order: TaskOrder = TaskOrder.TRIO,
) -> int:
    """``trio.run`` for a server's main, its ready tasks run in ``order`` (the
    ``serverTaskOrder`` key): startup failures become one line and an exit status.

    Config errors exit 2, a port in use, a locked store or another startup error exits 1; a
    real bug still shows its traceback.
    """
    try:
        with task_order(order):
            trio.run(async_fn, *args)
    except BaseException as exc:
        for leaf in leaves(exc):
            if isinstance(leaf, (ConfigError, ValueError)):
                print(f"error: {leaf}", file=sys.stderr)
                return 2
            if isinstance(leaf, (OSError, StartupError)):
                print(f"error: cannot start {what}: {leaf}", file=sys.stderr)
                return 1
            if isinstance(leaf, KeyboardInterrupt):
                return 130
        raise
    return 0
