#!/usr/bin/env python3
"""Producer/consumer benchmark in the manner of RocketMQ's own, with its option letters.

    scripts/benchmark.py                      # starts pymq (name server + broker) in a temp dir
    scripts/benchmark.py -n 127.0.0.1:9876    # against a running name server
    scripts/benchmark.py --flush SYNC_FLUSH --ha SYNC_MASTER -q 20000

Publishes -q messages of -s bytes with at most -w unacknowledged (Producer.send_async with a
window; --sync: -w tasks each awaiting send(); -b: batch requests),
printing send TPS, average and max RT and failures every second; then consumes everything it
sent with a push consumer.  Ends with one JSON line in the format of ../shared/bench
(EXTRA_BENCH), so pymq can run beside Redis, NATS and RabbitMQ in one rotation.

    scripts/benchmark.py --acl                # what access control costs

With --acl: the broker's check of one signed send and the client's signing are timed alone
(microseconds per request), then the publish runs twice against a fresh pymq, with aclEnable
false and true (a signing producer), and the cost of ACL on the publish rate is printed.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import trio

from pymq.client import ConsumeFromWhere, Message, MessageExt, Producer, PushConsumer
from pymq.client.topics import create_topic
from pymq.remoting.client import open_remoting_client
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of processes (Linux /proc), robust to a busy machine."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def start_servers(args: argparse.Namespace, tmp: str) -> tuple[str, list[subprocess.Popen]]:
    """The embedded default, or a name server + master + slave when --ha is given."""
    py = sys.executable
    procs: list[subprocess.Popen] = []

    def spawn(cmd: list[str]) -> subprocess.Popen:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "success" not in line and "running" not in line:
            proc.kill()
            raise SystemExit(f"could not start {cmd[2]}: {line.strip()}")
        procs.append(proc)
        return proc

    common = ["--flushDiskType", args.flush, "--mappedFileSizeCommitLog", str(args.file_size)]
    common += getattr(args, "extra_server_args", [])
    if not args.ha:
        ns_port = free_port()
        spawn(
            [
                py,
                "-m",
                "pymq",
                "--data",
                tmp,
                "--bind",
                "127.0.0.1",
                "--namesrv-port",
                str(ns_port),
                "--broker-port",
                str(free_port()),
                "--log-level",
                "ERROR",
                *getattr(args, "embedded_args", []),
                *common,
            ]
        )
        return f"127.0.0.1:{ns_port}", procs
    ns_port = free_port()
    spawn(
        [
            py,
            "-m",
            "pymq.namesrv",
            "--listenPort",
            str(ns_port),
            "--bindAddress",
            "127.0.0.1",
            "--kvConfigPath",
            os.path.join(tmp, "kv.json"),
            "--log-level",
            "ERROR",
        ]
    )
    for role, broker_id in ((args.ha, 0), ("SLAVE", 1)):
        spawn(
            [
                py,
                "-m",
                "pymq.broker",
                "-n",
                f"127.0.0.1:{ns_port}",
                "--brokerName",
                "broker-a",
                "--brokerId",
                str(broker_id),
                "--brokerRole",
                role,
                "--listenPort",
                str(free_port()),
                "--haListenPort",
                str(free_port()),
                "--brokerIP1",
                "127.0.0.1",
                "--brokerIP2",
                "127.0.0.1",
                "--bindAddress",
                "127.0.0.1",
                "--storePathRootDir",
                os.path.join(tmp, role),
                "--log-level",
                "ERROR",
                *common,
            ]
        )
    return f"127.0.0.1:{ns_port}", procs


async def wait_for_slave(namesrv: str) -> None:
    async with open_remoting_client() as client:
        with trio.fail_after(20):
            while True:
                info = await client.invoke(
                    namesrv, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
                )
                data = next(iter(json.loads(info.body)["brokerAddrTable"].values()), {})
                master = data.get("brokerAddrs", {}).get("0")
                if master and len(data.get("brokerAddrs", {})) > 1:
                    runtime = await client.invoke(
                        master, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO)
                    )
                    if json.loads(runtime.body)["table"].get("haConnections") == "1":
                        return
                await trio.sleep(0.2)


async def publish(  # noqa: C901
    args: argparse.Namespace, namesrv: str, credentials: tuple[str, str] | None = None
) -> tuple[float, list[float], int]:
    body = os.urandom(args.size // 2).hex().encode()[: args.size]
    latencies: list[float] = []
    failures = 0
    sent = 0
    window_stats: list[float] = []
    done = trio.Event()

    async with Producer(
        "BenchmarkProducer", namesrv, send_timeout=10, credentials=credentials
    ) as producer:
        await producer.publish_queues(args.topic)  # route first: not part of the timing
        total_requests = (args.count + args.batch - 1) // args.batch
        next_request = 0

        async def worker() -> None:
            nonlocal next_request, sent, failures
            while next_request < total_requests:
                next_request += 1
                t0 = time.perf_counter()
                try:
                    if args.batch > 1:
                        await producer.send_batch(
                            [Message(args.topic, body) for _ in range(args.batch)]
                        )
                    else:
                        await producer.send(Message(args.topic, body))
                except Exception:
                    failures += 1
                    continue
                rt = (time.perf_counter() - t0) * 1000
                latencies.append(rt)
                window_stats.append(rt)
                sent += args.batch

        async def reporter() -> None:
            last = 0
            while not done.is_set():
                with trio.move_on_after(1.0):
                    await done.wait()
                rts, window_stats[:] = list(window_stats), []
                avg = statistics.fmean(rts) if rts else 0.0
                print(
                    f"Send TPS: {sent - last:7d} Max RT(ms): {max(rts, default=0):8.3f} "
                    f"Average RT(ms): {avg:7.3f} Send Failed: {failures} Sent: {sent}",
                    file=sys.stderr,
                )
                last = sent

        async def windowed_async() -> None:
            # Java's async send with a window: no task per message, the answer arrives in a
            # callback, and the loop waits only when -w messages are unanswered.
            nonlocal sent, failures
            in_flight = 0
            slot = trio.Event()
            drained = trio.Event()
            msg = Message(args.topic, body)

            def done(t0: float, result: object, error: Exception | None) -> None:
                nonlocal in_flight, sent, failures
                in_flight -= 1
                if error is not None:
                    failures += 1
                    if failures == 1:
                        print(f"first failed send: {error}", file=sys.stderr)
                else:
                    rt = (time.perf_counter() - t0) * 1000
                    latencies.append(rt)
                    window_stats.append(rt)
                    sent += 1
                slot.set()
                if in_flight == 0 and finished_sending:
                    drained.set()

            finished_sending = False
            for _ in range(args.count):
                while in_flight >= args.window:
                    slot = trio.Event()
                    await slot.wait()
                in_flight += 1
                t0 = time.perf_counter()
                try:
                    await producer.send_async(msg, functools.partial(done, t0))
                except Exception:
                    in_flight -= 1
                    failures += 1
            finished_sending = True
            if in_flight:
                await drained.wait()

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reporter)
            if args.batch == 1 and not args.sync:
                await windowed_async()
            else:
                async with trio.open_nursery() as workers:
                    for _ in range(
                        max(1, args.window // max(1, args.batch) if args.batch > 1 else args.window)
                    ):
                        workers.start_soon(worker)
            elapsed = time.perf_counter() - start
            done.set()
    return sent / elapsed, latencies, failures


async def consume(args: argparse.Namespace, namesrv: str, expected: int) -> float:
    received = 0
    finished = trio.Event()

    async def handle(msgs: list[MessageExt]) -> bool:
        nonlocal received
        received += len(msgs)
        if received >= expected:
            finished.set()
        return True

    group = f"BenchmarkConsumer_{uuid.uuid4().hex[:8]}"
    async with PushConsumer(
        group,
        namesrv,
        handle,
        consume_from=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        batch_size=32,
    ) as consumer:
        start = time.perf_counter()
        await consumer.subscribe(args.topic)
        with trio.move_on_after(max(60, expected / 1000)):
            await finished.wait()
        elapsed = time.perf_counter() - start
    if received < expected:
        print(f"consumed only {received} of {expected}", file=sys.stderr)
    return received / elapsed


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main_async(args: argparse.Namespace) -> dict:
    tmp = tempfile.mkdtemp(prefix="pymq-bench-")
    procs: list[subprocess.Popen] = []
    try:
        namesrv = args.namesrv
        if not namesrv:
            namesrv, procs = await trio.to_thread.run_sync(start_servers, args, tmp)
            if args.ha:
                await wait_for_slave(namesrv)
        await create_topic(namesrv, args.topic, queues=args.queues)
        pids = [p.pid for p in procs]
        cpu0 = cpu_seconds(pids)
        client_cpu0 = time.process_time()
        publish_rate, latencies, failures = await publish(args, namesrv)
        client_cpu_us = (time.process_time() - client_cpu0) * 1e6
        sent = len(latencies) * args.batch
        server_cpu_us = (cpu_seconds(pids) - cpu0) * 1e6 / max(1, sent)
        client_cpu_us /= max(1, sent)
        consume_rate = await consume(args, namesrv, sent) if not args.no_consume else 0.0
        return {
            "system": args.name if not args.ha else f"{args.name}-{args.ha.lower()}",
            "n": sent,
            "size": args.size,
            "publish_msgs_per_s": round(publish_rate, 1),
            "consume_msgs_per_s": round(consume_rate, 1),
            "publish_p50_ms": round(percentile(latencies, 0.5), 3),
            "publish_p99_ms": round(percentile(latencies, 0.99), 3),
            "failures": failures,
            "server_cpu_us_per_msg": round(server_cpu_us, 1) if procs else None,
            "client_cpu_us_per_msg": round(client_cpu_us, 1),
            "flush": args.flush,
            "window": args.window,
            "batch": args.batch,
        }
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


ACL_ADMIN = ("BenchmarkAdmin", "BenchmarkAdminSecret")
ACL_PRODUCER = ("BenchmarkUser", "BenchmarkUserSecret")


def acl_file(topic: str) -> str:
    return (
        "accounts:\n"
        f"  - accessKey: {ACL_ADMIN[0]}\n    secretKey: {ACL_ADMIN[1]}\n    admin: true\n"
        f"  - accessKey: {ACL_PRODUCER[0]}\n    secretKey: {ACL_PRODUCER[1]}\n"
        f"    defaultTopicPerm: DENY\n    defaultGroupPerm: DENY\n    topicPerms: [{topic}=PUB]\n"
    )


def acl_micro(args: argparse.Namespace, tmp: str, rounds: int = 20000) -> dict[str, float]:
    """Microseconds per request: the broker's check of a signed send, and the client's signing."""
    from pymq.broker.acl import AclManager
    from pymq.common.acl import SigningKey, sign_request

    home = os.path.join(tmp, "acl-micro")
    os.makedirs(os.path.join(home, "conf"))
    with open(os.path.join(home, "conf", "plain_acl.yml"), "w") as f:
        f.write(acl_file(args.topic))
    acl = AclManager(home)
    body = b"x" * args.size
    header = {
        "a": "BenchmarkProducer",
        "b": args.topic,
        "c": "TBW102",
        "d": "4",
        "e": "0",
        "f": "0",
        "g": str(int(time.time() * 1000)),
        "h": "0",
        "i": "UNIQ_KEY\u00017F00000100002A9F0000000000000000\u0002WAIT\u0001true",
        "j": "0",
        "k": "false",
        "m": "false",
    }
    fields = dict(header)
    sign_request(fields, body, *ACL_PRODUCER)
    # CPU time, not wall time: other processes on the machine do not count.
    start = time.process_time()
    for _ in range(rounds):
        acl.validate("127.0.0.1", RequestCode.SEND_MESSAGE_V2, fields, body)
    check_us = (time.process_time() - start) / rounds * 1e6
    key = SigningKey(ACL_PRODUCER[1].encode())  # as the client's AclSigner keeps it
    start = time.process_time()
    for _ in range(rounds):
        sign_request(dict(header), body, ACL_PRODUCER[0], key)
    sign_us = (time.process_time() - start) / rounds * 1e6
    return {"check_us_per_request": round(check_us, 2), "sign_us_per_request": round(sign_us, 2)}


async def acl_run(args: argparse.Namespace, enabled: bool) -> tuple[float, float, float]:
    """The publish rate against a fresh embedded pymq with aclEnable ``enabled``, and the CPU
    microseconds per message of the server and of this client."""
    tmp = tempfile.mkdtemp(prefix="pymq-bench-acl-")
    procs: list[subprocess.Popen] = []
    try:
        credentials = None
        admin = None
        args.extra_server_args = []
        args.embedded_args = ["--admin-port", "0"]  # runs back to back: no fixed port to wait for
        if enabled:
            home = os.path.join(tmp, "home")
            os.makedirs(os.path.join(home, "conf"))
            with open(os.path.join(home, "conf", "plain_acl.yml"), "w") as f:
                f.write(acl_file(args.topic))
            args.extra_server_args = ["--aclEnable", "true", "--rocketmqHome", home]
            credentials, admin = ACL_PRODUCER, ACL_ADMIN
        namesrv, procs = await trio.to_thread.run_sync(start_servers, args, tmp)
        await create_topic(namesrv, args.topic, queues=args.queues, credentials=admin)
        pids = [p.pid for p in procs]
        cpu0, client0 = cpu_seconds(pids), time.process_time()
        rate, latencies, failures = await publish(args, namesrv, credentials)
        sent = max(1, len(latencies))
        server_us = (cpu_seconds(pids) - cpu0) * 1e6 / sent
        client_us = (time.process_time() - client0) * 1e6 / sent
        if failures:
            print(f"ACL {'on' if enabled else 'off'}: {failures} sends failed", file=sys.stderr)
        print(
            f"ACL {'on ' if enabled else 'off'}: {rate:8.0f} msg/s, CPU per message: server "
            f"{server_us:.1f} us, client {client_us:.1f} us",
            file=sys.stderr,
        )
        return rate, server_us, client_us
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


async def acl_main(args: argparse.Namespace) -> dict:
    tmp = tempfile.mkdtemp(prefix="pymq-bench-")
    try:
        micro = acl_micro(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"ACL check: {micro['check_us_per_request']:.2f} us per request on the broker; "
        f"signing: {micro['sign_us_per_request']:.2f} us per request on the client",
        file=sys.stderr,
    )
    # Alternate the two runs (off, on, off, on, ...) and keep each side's best rate and least
    # CPU: the machine's load changes between runs more than ACL costs.  The CPU per message
    # is the steadier figure on a shared machine: the publish rate is bounded by the busier of
    # the two processes, so the cost on the rate is estimated from the CPU of that one.
    off: list[tuple[float, float, float]] = []
    on: list[tuple[float, float, float]] = []
    for _ in range(args.acl_rounds):
        off.append(await acl_run(args, False))
        on.append(await acl_run(args, True))
    best_off, best_on = max(r[0] for r in off), max(r[0] for r in on)
    server_off, server_on = min(r[1] for r in off), min(r[1] for r in on)
    client_off, client_on = min(r[2] for r in off), min(r[2] for r in on)
    rate_cost = (1 - best_on / best_off) * 100 if best_off else 0.0
    bound_off = max(server_off, client_off)
    bound_on = max(server_on, client_on)
    cpu_cost = (1 - bound_off / bound_on) * 100 if bound_on else 0.0
    # The check itself against what a message costs the broker without ACL.
    check_share = micro["check_us_per_request"] / server_off * 100 if server_off else 0.0
    print(
        f"publish rate: ACL off {best_off:.0f} msg/s, ACL on {best_on:.0f} msg/s "
        f"({rate_cost:.1f} % less); CPU per message: server {server_off:.1f} -> "
        f"{server_on:.1f} us, client {client_off:.1f} -> {client_on:.1f} us: ACL costs "
        f"{cpu_cost:.1f} % of the publish rate by CPU (target <= 15 %); the check alone is "
        f"{check_share:.1f} % of the broker's CPU per message",
        file=sys.stderr,
    )
    return {
        "system": f"{args.name}-acl",
        "size": args.size,
        "n": args.count,
        "publish_msgs_per_s_acl_off": round(best_off, 1),
        "publish_msgs_per_s_acl_on": round(best_on, 1),
        "acl_cost_percent_rate": round(rate_cost, 1),
        "acl_cost_percent_cpu": round(cpu_cost, 1),
        "acl_check_percent_of_broker_cpu": round(check_share, 1),
        "server_cpu_us_per_msg_off": round(server_off, 1),
        "server_cpu_us_per_msg_on": round(server_on, 1),
        "client_cpu_us_per_msg_off": round(client_off, 1),
        "client_cpu_us_per_msg_on": round(client_on, 1),
        **micro,
        "flush": args.flush,
        "window": args.window,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", dest="namesrv", help="name server address (none: start pymq)")
    parser.add_argument("-t", dest="topic", default=f"BenchmarkTest_{uuid.uuid4().hex[:6]}")
    parser.add_argument("-s", dest="size", type=int, default=1024, help="message size in bytes")
    parser.add_argument("-w", dest="window", type=int, default=256, help="messages in flight")
    parser.add_argument("-b", dest="batch", type=int, default=1, help="messages per request")
    parser.add_argument("-q", dest="count", type=int, default=50000, help="messages to send")
    parser.add_argument("--queues", type=int, default=8, help="queues of the topic")
    parser.add_argument("--flush", default="ASYNC_FLUSH", choices=["ASYNC_FLUSH", "SYNC_FLUSH"])
    parser.add_argument("--ha", choices=["ASYNC_MASTER", "SYNC_MASTER"], help="add a slave")
    parser.add_argument("--file-size", type=int, default=256 * 1024 * 1024)
    parser.add_argument("--no-consume", action="store_true")
    parser.add_argument(
        "--name", default="pymq", help='"system" in the JSON line (to tell variants apart)'
    )
    parser.add_argument(
        "--sync",
        action="store_true",
        help="one task per in-flight send with the awaited send() (default: send_async)",
    )
    parser.add_argument(
        "--acl", action="store_true", help="measure the cost of ACL (aclEnable) on publishing"
    )
    parser.add_argument("--acl-rounds", type=int, default=2, help="off/on pairs with --acl")
    args = parser.parse_args()
    if args.acl:
        if args.namesrv or args.ha:
            parser.error("--acl starts its own pymq: not with -n or --ha")
        result = trio.run(acl_main, args)
        print(json.dumps(result), flush=True)
        return 0
    result = trio.run(main_async, args)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
