"""``python -m pymq.client send|consume``: send or receive messages from the command line."""

from __future__ import annotations

import argparse
import os
import ssl
import sys
from collections.abc import Sequence
from typing import Any

import trio

from pymq.client import ConsumeFromWhere, Message, MessageExt, MQClientError, Producer, PushConsumer
from pymq.common.cli import add_version, leaves
from pymq.remoting.errors import RemotingError


def connection_options(args: argparse.Namespace) -> dict[str, Any]:
    """credentials= and tls= from the flags (the secret also from $PYMQ_SECRET_KEY, which a
    process list does not show)."""
    options: dict[str, Any] = {}
    access_key = args.access_key or os.environ.get("PYMQ_ACCESS_KEY")
    secret_key = args.secret_key or os.environ.get("PYMQ_SECRET_KEY")
    if access_key or secret_key:
        if not (access_key and secret_key):
            raise ValueError("an ACL account needs both --access-key and --secret-key")
        options["credentials"] = (access_key, secret_key)
    if args.tls_ca:
        options["tls"] = ssl.create_default_context(cafile=args.tls_ca)
    elif args.tls:
        options["tls"] = True
    return options


async def send(args: argparse.Namespace) -> int:
    async with Producer(
        args.group or "CLI_PRODUCER", args.namesrv, **connection_options(args)
    ) as producer:
        for i in range(args.count):
            body = args.body if args.count == 1 else f"{args.body} #{i}"
            result = await producer.send(
                Message(args.topic, body.encode(), tags=args.tags, keys=args.keys)
            )
            print(
                f"{result.status} msgId={result.msg_id} offsetMsgId={result.offset_msg_id} "
                f"queue={result.queue.queue_id} queueOffset={result.queue_offset}"
            )
    return 0


async def consume(args: argparse.Namespace) -> int:
    received = 0
    done = trio.Event()

    async def handle(msgs: list[MessageExt]) -> bool:
        nonlocal received
        for msg in msgs:
            received += 1
            print(
                f"{msg.topic} queue={msg.queue_id} offset={msg.queue_offset} tags={msg.tags} "
                f"keys={' '.join(msg.keys)} body={msg.body.decode(errors='replace')}",
                flush=True,
            )
        if args.count and received >= args.count:
            done.set()
        return True

    async with PushConsumer(
        args.group,
        args.namesrv,
        handle,
        consume_from=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        **connection_options(args),
    ) as consumer:
        await consumer.subscribe(args.topic, args.tags or "*")
        print(f"consuming {args.topic} as group {args.group} (Ctrl-C to stop)", flush=True)
        with trio.move_on_after(args.timeout or float("inf")):
            await done.wait()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pymq.client")
    add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("send", "consume"):
        p = sub.add_parser(name)
        p.add_argument("--namesrv", "-n", default="127.0.0.1:9876")
        p.add_argument("--topic", "-t", required=True)
        p.add_argument("--tags")
        p.add_argument("--group", "-g", required=name == "consume")
        p.add_argument("--access-key", help="ACL account (default $PYMQ_ACCESS_KEY)")
        p.add_argument("--secret-key", help="its secret (default $PYMQ_SECRET_KEY)")
        p.add_argument("--tls", action="store_true", help="connect with TLS (system CAs)")
        p.add_argument("--tls-ca", help="connect with TLS, trusting this CA file (PEM)")
    send_p, consume_p = sub.choices["send"], sub.choices["consume"]
    send_p.add_argument("--body", "-b", required=True)
    send_p.add_argument("--keys", "-k")
    send_p.add_argument("--count", "-c", type=int, default=1)
    consume_p.add_argument("--count", "-c", type=int, default=0, help="stop after N messages")
    consume_p.add_argument("--timeout", type=float, default=0, help="stop after N seconds")
    args = parser.parse_args(argv)
    try:
        return trio.run(send if args.command == "send" else consume, args)
    except BaseException as exc:
        for leaf in leaves(exc):
            if isinstance(leaf, KeyboardInterrupt):
                return 130
            if isinstance(leaf, (MQClientError, RemotingError, ValueError, OSError)):
                print(f"error: {leaf}", file=sys.stderr)
                return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
