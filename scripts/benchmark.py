#!/usr/bin/env python3
"""Producer/consumer benchmark in the manner of RocketMQ's own, with its option letters.

    scripts/benchmark.py                      # starts pymq (name server + broker) in a temp dir
    scripts/benchmark.py -n 127.0.0.1:9876    # against a running name server
    scripts/benchmark.py --flush SYNC_FLUSH --ha SYNC_MASTER -q 20000
    scripts/benchmark.py --server-set serverTaskOrder=trio   # a config key for the servers

Publishes -q messages of -s bytes with at most -w unacknowledged (Producer.send_async with a
window; --sync: -w tasks each awaiting send(); -b: batch requests),
printing send TPS, average and max RT and failures every second; then consumes everything it
sent with a push consumer.  When it started the servers it also prints their resident memory
idle (after the topic is created) and at its most through the publish.  Ends with one JSON
line in the format of ../shared/bench (EXTRA_BENCH), so pymq can run beside Redis, NATS and
RabbitMQ in one rotation.

``--real-client cpp`` publishes with rocketmq-client-cpp (PyPI ``rocketmq==0.4.4``) instead:
``--threads`` threads (4) each sending synchronously, one request at a time, as a real
application's sync producers do; the broker's CPU per message is the figure to watch.

    scripts/benchmark.py --transaction -q 20000

compares transactional sends (TransactionProducer: half message + oneway COMMIT, -w tasks in
flight) with plain sync sends (the same -w tasks awaiting send()) on the same broker and prints
the ratio, then measures the transaction check service in process: one check round over
--pending (100,000) due half messages, one over as many committed ones, one over as many young
ones.

    scripts/benchmark.py --dledger -q 20000   # a 3-broker DLedger group beside SYNC_MASTER

With --dledger: the publish runs against a SYNC_MASTER master/slave pair, then against a
group of three brokers in DLedger mode (``enableDLegerCommitLog``: a send is answered once two
of the three have it), each started fresh; a JSON line for each and the ratio of the rates.

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
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import trio

from pymq.client import (
    ConsumeFromWhere,
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    PushConsumer,
    TransactionProducer,
)
from pymq.client.topics import create_topic
from pymq.common.serde import loads_lenient
from pymq.remoting.client import open_remoting_client
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def memory_mb(pids: list[int], field: str = "VmRSS") -> float | None:
    """Resident memory of processes in MB (Linux /proc): ``VmRSS`` now, or ``VmHWM`` (the
    most the process has had resident since it started)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith(field + ":"):
                        total += int(line.split()[1])  # kB
        except OSError:
            return None
    return round(total / 1024, 1)


def cpu_seconds(pids: list[int], *, loop_only: bool = False) -> float:
    """User + system CPU time of processes (Linux /proc), robust to a busy machine; with
    ``loop_only``, of their main threads alone (the event loop, which bounds throughput: the
    rest is worker threads, such as the commit log's flush and prefault)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/task/{pid}/stat" if loop_only else f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def server_settings(settings: list[str]) -> list[str]:
    """``--server-set KEY=VALUE`` options as the servers' ``--KEY VALUE`` flags."""
    flags: list[str] = []
    for setting in settings:
        key, sep, value = setting.partition("=")
        if not sep or not key:
            raise SystemExit(f"--server-set wants KEY=VALUE, not {setting!r}")
        flags += [f"--{key}", value]
    return flags


START_ATTEMPTS = 3


def embedded_args(data: str, ns_port: int, broker_port: int, grpc_port: int = 0) -> list[str]:
    """``python -m pymq``'s arguments for a benchmark: the store in ``data``, loopback ports,
    no console, no metrics port and the gRPC port only when ``grpc_port`` is given (two
    benchmarks must not share port 8080, 5557 or 8081), errors only in the log."""
    return [
        "-m",
        "pymq",
        "--data",
        data,
        "--bind",
        "127.0.0.1",
        "--namesrv-port",
        str(ns_port),
        "--broker-port",
        str(broker_port),
        "--admin-port",
        "0",
        "--metrics-port",
        "0",
        "--grpc-port",
        str(grpc_port),
        "--log-level",
        "ERROR",
    ]


class StartFailed(Exception):
    """A server process ended before it said it was running."""


def start_servers(args: argparse.Namespace, tmp: str) -> tuple[str, list[subprocess.Popen]]:
    """The embedded default, or a name server + master + slave when --ha is given; SystemExit
    when one cannot start, the ones started before it stopped."""
    procs: list[subprocess.Popen] = []
    try:
        return _start_servers(args, tmp, procs)
    except BaseException as exc:
        for proc in reversed(procs):
            proc.kill()
            proc.wait()
        if isinstance(exc, StartFailed):
            raise SystemExit(str(exc)) from None
        raise


def _start_servers(
    args: argparse.Namespace, tmp: str, procs: list[subprocess.Popen]
) -> tuple[str, list[subprocess.Popen]]:
    py = sys.executable

    def spawn(cmd: list[str]) -> subprocess.Popen:
        name = cmd[2]  # the module run: pymq, pymq.namesrv or pymq.broker
        profile = getattr(args, "profile", None)
        if profile:  # --profile: cProfile in the server process, written when it stops
            cmd = [cmd[0], "-m", "cProfile", "-o", f"{profile}.{len(procs)}", *cmd[1:]]
        # Its errors kept in a file of the data directory, for the message of a failed start.
        with open(os.path.join(tmp, f"{name}-{len(procs)}.stderr"), "w+") as errors:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errors, text=True)
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if "success" not in line and "running" not in line:
                proc.kill()
                proc.wait()
                errors.seek(0)
                why = errors.read().strip().splitlines()[-1:] or [line.strip() or "no output"]
                raise StartFailed(f"could not start {name}: {why[0]}")
        procs.append(proc)
        return proc

    common = ["--flushDiskType", args.flush, "--mappedFileSizeCommitLog", str(args.file_size)]
    common += getattr(args, "extra_server_args", [])
    common += server_settings(getattr(args, "server_set", []))
    if getattr(args, "group", False):
        return _start_group(py, common, tmp, spawn), procs
    if not args.ha:
        for attempt in range(START_ATTEMPTS):
            # Ports found free may be taken before the server binds them (by another process's
            # connection, say): a start that fails is tried again on other ports.
            ns_port = free_port()
            # --grpc: the 5.x clients' port too, its address kept for them.
            grpc_port = free_port() if getattr(args, "grpc", False) else 0
            if grpc_port:
                args.grpc_endpoint = f"127.0.0.1:{grpc_port}"
            try:
                spawn([py, *embedded_args(tmp, ns_port, free_port(), grpc_port), *common])
            except StartFailed as exc:
                if attempt + 1 == START_ATTEMPTS:
                    raise
                print(f"{exc}; trying again on other ports", file=sys.stderr)
                continue
            break
        return f"127.0.0.1:{ns_port}", procs
    ns_port = _start_namesrv(py, tmp, spawn)
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


def _start_namesrv(py: str, tmp: str, spawn: Callable[[list[str]], object]) -> int:
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
    return ns_port


def _start_group(py: str, common: list[str], tmp: str, spawn: Callable[[list[str]], object]) -> str:
    """A name server and three brokers of one DLedger group (--dledger)."""
    ns_port = _start_namesrv(py, tmp, spawn)
    peers = ";".join(f"n{i}-127.0.0.1:{free_port()}" for i in range(3))
    for i in range(3):
        spawn(
            [
                py,
                "-m",
                "pymq.broker",
                "-n",
                f"127.0.0.1:{ns_port}",
                "--brokerName",
                "broker-a",
                "--enableDLegerCommitLog",
                "true",
                "--dLegerGroup",
                "broker-a",
                "--dLegerPeers",
                peers,
                "--dLegerSelfId",
                f"n{i}",
                "--listenPort",
                str(free_port()),
                "--brokerIP1",
                "127.0.0.1",
                "--brokerIP2",
                "127.0.0.1",
                "--bindAddress",
                "127.0.0.1",
                "--storePathRootDir",
                os.path.join(tmp, f"n{i}"),
                "--log-level",
                "ERROR",
                *common,
            ]
        )
    return f"127.0.0.1:{ns_port}"


async def wait_for_master(namesrv: str) -> None:
    """Until the name server routes the group to a master (brokerId 0) that says it is one."""
    async with open_remoting_client() as client:
        with trio.fail_after(60):
            while True:
                info = await client.invoke(
                    namesrv, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
                )
                tables: dict[str, Any] = loads_lenient(info.body)["brokerAddrTable"]
                data: dict[str, Any] = next(iter(tables.values()), {})
                master = data.get("brokerAddrs", {}).get("0")
                if master:
                    runtime = await client.invoke(
                        master, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO)
                    )
                    if json.loads(runtime.body)["table"].get("brokerRole") == "SYNC_MASTER":
                        return
                await trio.sleep(0.2)


async def wait_for_slave(namesrv: str) -> None:
    async with open_remoting_client() as client:
        with trio.fail_after(20):
            while True:
                info = await client.invoke(
                    namesrv, RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
                )
                data: dict[str, Any] = next(
                    iter(loads_lenient(info.body)["brokerAddrTable"].values()), {}
                )
                master = data.get("brokerAddrs", {}).get("0")
                if master and len(data.get("brokerAddrs", {})) > 1:
                    runtime = await client.invoke(
                        master, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO)
                    )
                    if json.loads(runtime.body)["table"].get("haConnections") == "1":
                        return
                await trio.sleep(0.2)


async def publish(  # noqa: C901
    args: argparse.Namespace,
    namesrv: str,
    credentials: tuple[str, str] | None = None,
    on_start: Callable[[], object] | None = None,
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
            # Java's async send with a window: no task per request, the answer arrives in a
            # callback, and the loop waits only when -w messages are unanswered.  Batches go
            # as send_batch_async (Java's send(Collection<Message>, SendCallback)).
            nonlocal sent, failures
            in_flight = 0
            slot = trio.Event()
            drained = trio.Event()
            msg = Message(args.topic, body)
            size = args.batch

            def done(t0: float, result: object, error: Exception | None) -> None:
                nonlocal in_flight, sent, failures
                in_flight -= size
                if error is not None:
                    failures += 1
                    if failures == 1:
                        print(f"first failed send: {error}", file=sys.stderr)
                else:
                    rt = (time.perf_counter() - t0) * 1000
                    latencies.append(rt)
                    window_stats.append(rt)
                    sent += size
                slot.set()
                if in_flight == 0 and finished_sending:
                    drained.set()

            finished_sending = False
            for _ in range(total_requests):
                while in_flight >= args.window:
                    slot = trio.Event()
                    await slot.wait()
                in_flight += size
                t0 = time.perf_counter()
                try:
                    if size > 1:
                        await producer.send_batch_async(
                            [Message(args.topic, body) for _ in range(size)],
                            functools.partial(done, t0),
                        )
                    else:
                        await producer.send_async(msg, functools.partial(done, t0))
                except Exception:
                    in_flight -= size
                    failures += 1
            finished_sending = True
            if in_flight:
                await drained.wait()

        if on_start is not None:  # the route is known and the connection open
            on_start()
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reporter)
            if not args.sync:
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


def publish_cpp(args: argparse.Namespace, namesrv: str) -> tuple[float, list[float], int]:
    """Sync sends from --threads threads through the C++ client (its calls release the GIL,
    so the threads send concurrently, one request per thread at a time, as Java's sync
    producers do)."""
    import threading

    from rocketmq.client import Message as CppMessage
    from rocketmq.client import Producer as CppProducer
    from rocketmq.client import SendStatus

    body = os.urandom(args.size // 2).hex()[: args.size]
    producer = CppProducer(f"BenchmarkCpp_{uuid.uuid4().hex[:6]}")
    producer.set_namesrv_addr(namesrv)
    producer.start()
    latencies: list[float] = []
    failures = 0
    lock = threading.Lock()
    per_thread = args.count // args.threads

    ready = threading.Barrier(args.threads + 1)

    def worker() -> None:
        nonlocal failures
        mine: list[float] = []
        failed = 0
        msg = CppMessage(args.topic)
        msg.set_body(body)
        for _ in range(50):  # the route and connections first: not part of the timing
            try:
                if producer.send_sync(msg).status == SendStatus.OK:
                    break
            except Exception:
                time.sleep(0.1)
        ready.wait()
        for _ in range(per_thread):
            t0 = time.perf_counter()
            try:
                status = producer.send_sync(msg).status
                ok = status == SendStatus.OK
                if not ok and not failed:
                    print(f"a C++ client send was answered {status}", file=sys.stderr)
            except Exception as exc:
                ok = False
                if not failed:
                    print(f"a C++ client send failed: {exc}", file=sys.stderr)
            if ok:
                mine.append((time.perf_counter() - t0) * 1000)
            else:
                failed += 1
        with lock:
            latencies.extend(mine)
            failures += failed

    try:
        threads = [threading.Thread(target=worker) for _ in range(args.threads)]
        for thread in threads:
            thread.start()
        ready.wait()
        start = time.perf_counter()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - start
    finally:
        producer.shutdown()
    return len(latencies) / elapsed, latencies, failures


async def consume(args: argparse.Namespace, namesrv: str, expected: int) -> tuple[float, int]:
    """The rate at which a push consumer reads ``expected`` messages, and how many it read."""
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
    return received / elapsed, received


async def timed_sends(
    count: int, window: int, send: object, label: str
) -> tuple[float, list[float], int]:
    """``count`` awaited sends by ``window`` tasks: (rate, latencies in ms, failures)."""
    latencies: list[float] = []
    failures = 0
    next_request = 0

    async def worker() -> None:
        nonlocal next_request, failures
        while next_request < count:
            next_request += 1
            t0 = time.perf_counter()
            try:
                await send()  # type: ignore[operator]
            except Exception:
                failures += 1
                continue
            latencies.append((time.perf_counter() - t0) * 1000)

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(window):
            nursery.start_soon(worker)
    rate = len(latencies) / (time.perf_counter() - start)
    print(f"{label}: {rate:9.1f} msg/s  p50 {percentile(latencies, 0.5):.3f} ms", file=sys.stderr)
    return rate, latencies, failures


async def publish_transactions(args: argparse.Namespace, namesrv: str, pids: list[int]) -> dict:
    """Plain sync sends, then transactional sends (half + COMMIT), on the same broker, with
    the CPU time per message of the servers (``pids``) and of this client."""
    body = os.urandom(args.size // 2).hex().encode()[: args.size]
    msg = Message(args.topic, body)

    def cpu() -> tuple[float, float]:
        return cpu_seconds(pids), time.process_time()

    def per_msg(before: tuple[float, float], count: int) -> tuple[float, float]:
        after = cpu()
        return (
            (after[0] - before[0]) * 1e6 / max(1, count),
            (after[1] - before[1]) * 1e6 / max(1, count),
        )

    async with Producer("BenchmarkProducer", namesrv, send_timeout=10) as producer:
        await producer.publish_queues(args.topic)
        before = cpu()
        plain, _, plain_failures = await timed_sends(
            args.count, args.window, lambda: producer.send(msg), "plain sync send"
        )
        plain_cpu = per_msg(before, args.count)
    async with TransactionProducer(
        "BenchmarkTxProducer",
        namesrv,
        execute=lambda m, a: LocalTransactionState.COMMIT_MESSAGE,
        check=lambda m: LocalTransactionState.COMMIT_MESSAGE,
        send_timeout=10,
    ) as tx_producer:
        await tx_producer.publish_queues(args.topic)
        before = cpu()
        tx, latencies, tx_failures = await timed_sends(
            args.count,
            args.window,
            lambda: tx_producer.send_in_transaction(msg),
            "transactional send (half + commit)",
        )
        tx_cpu = per_msg(before, args.count)
    print(
        f"transactional / plain: {tx / plain:.2f}; CPU us per message, server/client: "
        f"plain {plain_cpu[0]:.0f}/{plain_cpu[1]:.0f}, transactional {tx_cpu[0]:.0f}/"
        f"{tx_cpu[1]:.0f}",
        file=sys.stderr,
    )
    return {
        "plain_sync_msgs_per_s": round(plain, 1),
        "transaction_msgs_per_s": round(tx, 1),
        "transaction_ratio": round(tx / plain, 3),
        "transaction_p50_ms": round(percentile(latencies, 0.5), 3),
        "transaction_p99_ms": round(percentile(latencies, 0.99), 3),
        "plain_server_cpu_us_per_msg": round(plain_cpu[0], 1) if pids else None,
        "plain_client_cpu_us_per_msg": round(plain_cpu[1], 1),
        "transaction_server_cpu_us_per_msg": round(tx_cpu[0], 1) if pids else None,
        "transaction_client_cpu_us_per_msg": round(tx_cpu[1], 1),
        "failures": plain_failures + tx_failures,
    }


async def check_service_cost(pending: int) -> dict:
    """One transaction check round over ``pending`` half messages, in process."""
    from pymq.broker.client_manager import (
        ClientChannelInfo,
        ConsumerManager,
        ProducerManager,
        RebalanceLockManager,
    )
    from pymq.broker.config import BrokerConfig
    from pymq.broker.consumer_filter_manager import ConsumerFilterManager
    from pymq.broker.consumer_offset_manager import ConsumerOffsetManager
    from pymq.broker.context import BrokerContext
    from pymq.broker.fast_failure import ConsumerFallBehind
    from pymq.broker.long_polling import PullRequestHoldService
    from pymq.broker.schedule import ScheduleMessageService
    from pymq.broker.stats import BrokerStats
    from pymq.broker.subscription_group_manager import SubscriptionGroupManager
    from pymq.broker.topic_config_manager import TopicConfigManager
    from pymq.broker.transaction import TransactionService, to_half_message
    from pymq.common.message_ext import MessageExt as StoredMessage
    from pymq.common.topic import RMQ_SYS_TRANS_HALF_TOPIC
    from pymq.store import DefaultMessageStore, MessageStoreConfig

    class Sink:
        closed = False
        sent = 0

        async def invoke_oneway(self, request: RemotingCommand) -> None:
            self.sent += 1

    tmp = tempfile.mkdtemp(prefix="pymq-txcheck-")
    clock_now = [int(time.time() * 1000)]
    try:
        async with trio.open_nursery() as nursery:
            store_config = MessageStoreConfig(store_path_root_dir=tmp)
            broker_config = BrokerConfig(broker_ip1="127.0.0.1")
            store = DefaultMessageStore(store_config)
            store.store_host = ("127.0.0.1", 10911)
            config_dir = store_config.config_dir
            ctx = BrokerContext(
                broker_config=broker_config,
                store=store,
                topic_config_manager=TopicConfigManager(config_dir, broker_config),
                subscription_group_manager=SubscriptionGroupManager(config_dir),
                consumer_offset_manager=ConsumerOffsetManager(config_dir),
                consumer_filter_manager=ConsumerFilterManager(config_dir),
                consumer_manager=ConsumerManager(),
                producer_manager=ProducerManager(),
                rebalance_lock_manager=RebalanceLockManager(),
                pull_hold=PullRequestHoldService(),
                stats=BrokerStats(),
                fall_behind=ConsumerFallBehind(),
                schedule=ScheduleMessageService(config_dir, store),
                admin=None,  # type: ignore[arg-type]
                store_host=store.store_host,
            )
            await nursery.start(store.run)
            sink = Sink()
            ctx.producer_manager.register(
                "PG", ClientChannelInfo(sink, "bench", "PYTHON", 401, 0.0)
            )
            service = TransactionService(ctx, clock_ms=lambda: clock_now[0])

            def put_halves(n: int) -> None:
                for k in range(n):
                    msg = StoredMessage(
                        topic="TopicTx",
                        body=b"x" * 256,
                        queue_id=k % 4,
                        born_timestamp=int(time.time() * 1000),
                        born_host=("127.0.0.1", 40000),
                        store_host=store.store_host,
                    )
                    sent = {
                        "TRAN_MSG": "true",
                        "PGROUP": "PG",
                        "UNIQ_KEY": f"K{k:08d}",
                        "CLUSTER": "DefaultCluster",
                    }
                    to_half_message(msg, sent)
                    assert store.put_now(msg).is_ok

            async def dispatched(n: int) -> None:
                while store.get_max_offset_in_queue(RMQ_SYS_TRANS_HALF_TOPIC, 0) < n:
                    await trio.sleep(0.01)

            async def timed_round() -> float:
                t0 = time.perf_counter()
                await service.check()
                return time.perf_counter() - t0

            # Young: the round stops at the first record.
            put_halves(pending)
            await dispatched(pending)
            young = await timed_round()
            # Due: every one re-put with TRANSACTION_CHECK_TIMES=1 and sent a check.
            clock_now[0] = int(time.time() * 1000) + 3_600_000
            due = await timed_round()
            checked = sink.sent
            # Done: ops for every re-put one (as if the producers answered ROLLBACK).
            base = store.get_max_offset_in_queue(RMQ_SYS_TRANS_HALF_TOPIC, 0)
            await dispatched(base)
            for offset in range(pending, base):
                half = store.message_at(RMQ_SYS_TRANS_HALF_TOPIC, 0, offset)
                assert half is not None
                service._put_op(half)
            while store.dispatch_behind_bytes:
                await trio.sleep(0.01)
            done = await timed_round()
            nursery.cancel_scope.cancel()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"check round, {pending} pending half messages: all young {young * 1000:.1f} ms, "
        f"all due {due:.2f} s ({due / pending * 1e6:.1f} us each, {checked} checks sent), "
        f"all ended {done:.2f} s ({done / pending * 1e6:.1f} us each)",
        file=sys.stderr,
    )
    return {
        "check_pending": pending,
        "check_round_young_ms": round(young * 1000, 1),
        "check_round_due_s": round(due, 3),
        "check_round_ended_s": round(done, 3),
        "checks_sent": checked,
    }


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
            if getattr(args, "group", False):
                await wait_for_master(namesrv)
            elif args.ha:
                await wait_for_slave(namesrv)
        await create_topic(namesrv, args.topic, queues=args.queues)
        if args.transaction:
            result = {"system": args.name, "n": args.count, "size": args.size}
            result.update(await publish_transactions(args, namesrv, [p.pid for p in procs]))
            if args.pending:
                result.update(await check_service_cost(args.pending))
            return result
        pids = [p.pid for p in procs]
        idle_rss = memory_mb(pids) if pids else None
        for pid in pids:  # VmHWM from here on: the peak of the publish, not of the start-up
            try:
                with open(f"/proc/{pid}/clear_refs", "w") as f:
                    f.write("5")
            except OSError:
                pass
        cpu0, loop0 = cpu_seconds(pids), cpu_seconds(pids, loop_only=True)
        each0 = [cpu_seconds([pid]) for pid in pids]
        client_cpu0 = time.process_time()
        if args.real_client == "cpp":
            publish_rate, latencies, failures = await trio.to_thread.run_sync(
                publish_cpp, args, namesrv
            )
        else:
            publish_rate, latencies, failures = await publish(args, namesrv)
        client_cpu_us = (time.process_time() - client_cpu0) * 1e6
        sent = len(latencies) * args.batch
        server_cpu_us = (cpu_seconds(pids) - cpu0) * 1e6 / max(1, sent)
        # each server's share (the name server first, then the brokers in start order)
        each_us = [
            round((cpu_seconds([pid]) - c0) * 1e6 / max(1, sent), 1)
            for pid, c0 in zip(pids, each0, strict=True)
        ]
        loop_cpu_us = (cpu_seconds(pids, loop_only=True) - loop0) * 1e6 / max(1, sent)
        client_cpu_us /= max(1, sent)
        publish_rss = memory_mb(pids, "VmHWM") if pids else None
        if pids:
            print(
                f"server resident memory: {idle_rss} MB idle (topic created), at most "
                f"{publish_rss} MB through the publish (VmHWM)",
                file=sys.stderr,
            )
        consume_rate = (await consume(args, namesrv, sent))[0] if not args.no_consume else 0.0
        return {
            "system": (
                f"{args.name}-dledger3"
                if getattr(args, "group", False)
                else args.name
                if not args.ha
                else f"{args.name}-{args.ha.lower()}"
            ),
            "n": sent,
            "size": args.size,
            "publish_msgs_per_s": round(publish_rate, 1),
            "consume_msgs_per_s": round(consume_rate, 1),
            "publish_p50_ms": round(percentile(latencies, 0.5), 3),
            "publish_p99_ms": round(percentile(latencies, 0.99), 3),
            "failures": failures,
            "server_cpu_us_per_msg": round(server_cpu_us, 1) if procs else None,
            "server_cpu_us_per_msg_each": each_us if procs else None,
            "server_loop_cpu_us_per_msg": round(loop_cpu_us, 1) if procs else None,
            "client_cpu_us_per_msg": round(client_cpu_us, 1),
            "server_rss_mb_idle": idle_rss,
            "server_rss_mb_publish_peak": publish_rss,
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
    from pymq.acl.plain import SigningKey, sign_request
    from pymq.broker.acl import AclManager

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

    class Peer:  # what the check reads of a connection
        remote_address = "127.0.0.1:50000"

    peer = Peer()
    request = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, fields, body)
    assert acl.check(peer, request) is None, "the benchmark's account may not send"
    # CPU time, not wall time: other processes on the machine do not count.
    start = time.process_time()
    for _ in range(rounds):
        acl.check(peer, request)  # the broker's own entry point, fast path included
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
    # Each off/on pair ran back to back: the median of the pairs' costs is the figure a
    # moment's load moves least (one fast or slow run moves a best-of a long way).
    pair_costs = sorted((1 - b[0] / a[0]) * 100 for a, b in zip(off, on, strict=True) if a[0])
    median_cost = percentile(pair_costs, 0.5) if pair_costs else 0.0
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
    print(
        "off/on pairs, publish rate lost: "
        + ", ".join(f"{c:.1f} %" for c in pair_costs)
        + f"; median {median_cost:.1f} % (target <= 15 %)",
        file=sys.stderr,
    )
    return {
        "system": f"{args.name}-acl",
        "size": args.size,
        "n": args.count,
        "publish_msgs_per_s_acl_off": round(best_off, 1),
        "publish_msgs_per_s_acl_on": round(best_on, 1),
        "acl_cost_percent_rate": round(rate_cost, 1),
        "acl_cost_percent_rate_median_pair": round(median_cost, 1),
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


# -- --grpc: RocketMQ 5.x's official client on the broker's gRPC port, beside the remoting path


class Meter:
    """The CPU time the servers (``pids``, read from /proc: this process's client threads are
    not counted) and this process spend between :meth:`start` and :meth:`stop`, per message."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.begin = (0.0, 0.0, 0.0, 0.0)

    def start(self) -> None:
        self.begin = (
            time.perf_counter(),
            cpu_seconds(self.pids),
            cpu_seconds(self.pids, loop_only=True),
            time.process_time(),
        )

    def stop(self, count: int, failures: int = 0) -> dict[str, float]:
        t0, server0, loop0, client0 = self.begin
        elapsed = time.perf_counter() - t0
        per = 1e6 / max(1, count)
        return {
            "msgs_per_s": count / elapsed if elapsed > 0 else 0.0,
            "count": count,
            "failures": failures,
            "server_us": (cpu_seconds(self.pids) - server0) * per,
            "loop_us": (cpu_seconds(self.pids, loop_only=True) - loop0) * per,
            "client_us": (time.process_time() - client0) * per,
        }


def grpc_timeout(args: argparse.Namespace) -> int:
    """The 5.x client's RPC timeout in whole seconds (it puts them in a protobuf Duration's
    seconds): its default (3) unless the caller set ``grpc_timeout`` (bench_instructions.py
    does: a broker under valgrind is slow)."""
    return int(getattr(args, "grpc_timeout", 3))


def grpc_publish(
    args: argparse.Namespace, topic: str, meter: Meter, *, asynchronous: bool
) -> dict[str, float]:
    """-q messages through the official 5.x Producer (blocking: run in a thread): --threads
    threads each sending one message at a time (send()), or, ``asynchronous``, send_async()
    with at most -w unanswered.  One message first, outside the measure (the connection)."""
    import threading

    from rocketmq.v5.client import ClientConfiguration, Credentials
    from rocketmq.v5.model import Message as Message5
    from rocketmq.v5.producer import Producer as Producer5

    body = os.urandom(args.size // 2).hex().encode()[: args.size]

    def message() -> Message5:
        msg = Message5()
        msg.topic = topic
        msg.body = body
        return msg

    producer = Producer5(
        ClientConfiguration(args.grpc_endpoint, Credentials(), request_timeout=grpc_timeout(args)),
        (topic,),
    )
    producer.startup()
    lock = threading.Lock()
    sent = failures = 0
    try:
        producer.send(message())
        meter.start()
        if asynchronous:
            window = threading.Semaphore(args.window)
            all_done = threading.Event()
            answered = 0

            def done(future: object) -> None:
                nonlocal sent, failures, answered
                with lock:
                    if future.exception() is None:  # type: ignore[attr-defined]
                        sent += 1
                    else:
                        failures += 1
                    answered += 1
                    if answered == args.count:
                        all_done.set()
                window.release()

            for _ in range(args.count):
                window.acquire()
                producer.send_async(message()).add_done_callback(done)
            all_done.wait(timeout=max(60, args.count / 100))
        else:
            per_thread = args.count // args.threads

            def worker() -> None:
                nonlocal sent, failures
                ok = bad = 0
                for _ in range(per_thread):
                    try:
                        producer.send(message())
                        ok += 1
                    except Exception as exc:
                        if not bad:
                            print(f"a 5.x client send failed: {exc}", file=sys.stderr)
                        bad += 1
                with lock:
                    sent += ok
                    failures += bad

            threads = [threading.Thread(target=worker) for _ in range(args.threads)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        result = meter.stop(sent, failures)
    finally:
        producer.shutdown()
    result["published"] = sent + 1
    return result


def grpc_receive(
    args: argparse.Namespace, topic: str, expected: int, meter: Meter
) -> dict[str, float]:
    """Receive + ack ``expected`` messages with the official 5.x SimpleConsumer (blocking: run
    in a thread): --threads threads each receiving up to 32 messages at a time and acking each
    (ack(), one AckMessage per message, as the client's API has it)."""
    import threading

    from rocketmq.v5.client import ClientConfiguration, Credentials
    from rocketmq.v5.consumer import SimpleConsumer
    from rocketmq.v5.model import FilterExpression

    consumer = SimpleConsumer(
        ClientConfiguration(args.grpc_endpoint, Credentials(), request_timeout=grpc_timeout(args)),
        f"BenchmarkGrpc_{uuid.uuid4().hex[:8]}",
        {topic: FilterExpression("*")},
        await_duration=1,
    )
    consumer.startup()
    lock = threading.Lock()
    received = failures = 0
    finished = threading.Event()
    deadline = time.monotonic() + max(60, expected / 10)
    result: dict[str, float] = {}

    def worker() -> None:
        nonlocal received, failures
        while not finished.is_set() and time.monotonic() < deadline:
            try:
                messages = consumer.receive(32, 30)
            except Exception:
                messages = []
            for msg in messages:
                try:
                    consumer.ack(msg)
                except Exception:
                    with lock:
                        failures += 1
                    continue
                with lock:
                    received += 1
                    if received == expected:
                        result.update(meter.stop(received, failures))
                        finished.set()

    try:
        meter.start()
        threads = [threading.Thread(target=worker) for _ in range(args.threads)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        consumer.shutdown()
    if not result:
        print(f"received and acked only {received} of {expected}", file=sys.stderr)
        result = meter.stop(received, failures)
    return result


async def remoting_publish(
    args: argparse.Namespace, namesrv: str, topic: str, meter: Meter, *, asynchronous: bool
) -> dict[str, float]:
    """-q messages through pymq's 4.x Producer on the remoting port: --threads tasks each
    awaiting send() (as many requests in flight as the 5.x client's threads), or send_async()
    with a window of -w."""
    run = argparse.Namespace(**vars(args))
    run.topic, run.batch, run.sync = topic, 1, not asynchronous
    run.window = args.window if asynchronous else args.threads
    _, latencies, failures = await publish(run, namesrv, on_start=meter.start)
    return meter.stop(len(latencies), failures)


async def remoting_consume(
    args: argparse.Namespace, namesrv: str, topic: str, expected: int, meter: Meter
) -> dict[str, float]:
    """What the remoting publishes put in ``topic``, by pymq's 4.x PushConsumer (pulls of 32,
    acked by the consumer offsets it commits)."""
    run = argparse.Namespace(**vars(args))
    run.topic = topic
    meter.start()
    _, received = await consume(run, namesrv, expected)
    return meter.stop(received)


GRPC_PAIRS = (
    ("sync publish", "remoting_sync", "grpc_sync"),
    ("async publish", "remoting_async", "grpc_async"),
    ("receive+ack", "remoting_consume", "grpc_receive"),
)


async def grpc_run(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """One fresh pymq serving both protocols: the remoting publishes, the gRPC publishes, then
    each protocol consumes what it published, each phase measured alone."""
    tmp = tempfile.mkdtemp(prefix="pymq-bench-grpc-")
    procs: list[subprocess.Popen] = []
    try:
        namesrv, procs = await trio.to_thread.run_sync(start_servers, args, tmp)
        pids = [p.pid for p in procs]
        topic_r, topic_g = f"{args.topic}_R", f"{args.topic}_G"
        for topic in (topic_r, topic_g):
            await create_topic(namesrv, topic, queues=args.queues)
        meter = Meter(pids)
        out: dict[str, dict[str, float]] = {}
        out["remoting_sync"] = await remoting_publish(
            args, namesrv, topic_r, meter, asynchronous=False
        )
        out["grpc_sync"] = await trio.to_thread.run_sync(
            functools.partial(grpc_publish, args, topic_g, meter, asynchronous=False)
        )
        out["remoting_async"] = await remoting_publish(
            args, namesrv, topic_r, meter, asynchronous=True
        )
        out["grpc_async"] = await trio.to_thread.run_sync(
            functools.partial(grpc_publish, args, topic_g, meter, asynchronous=True)
        )
        stored_r = int(out["remoting_sync"]["count"] + out["remoting_async"]["count"])
        stored_g = int(out["grpc_sync"]["published"] + out["grpc_async"]["published"])
        out["remoting_consume"] = await remoting_consume(args, namesrv, topic_r, stored_r, meter)
        out["grpc_receive"] = await trio.to_thread.run_sync(
            grpc_receive, args, topic_g, stored_g, meter
        )
        for label, remoting, grpc in GRPC_PAIRS:
            r, g = out[remoting], out[grpc]
            print(
                f"{label:14s} remoting {r['msgs_per_s']:8.0f} msg/s {r['server_us']:7.1f} us/msg"
                f" | gRPC {g['msgs_per_s']:8.0f} msg/s {g['server_us']:7.1f} us/msg "
                f"(loop {g['loop_us']:.1f}) | broker CPU ratio "
                f"{g['server_us'] / max(r['server_us'], 1e-9):.2f}",
                file=sys.stderr,
            )
        return out
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


async def grpc_main(args: argparse.Namespace) -> dict:
    """--grpc-rounds fresh brokers; per phase the least broker CPU per message and the best
    rate, and per pair the median of the rounds' CPU ratios (the steadier figure on a shared
    machine: both sides of a ratio ran on the same broker, minutes apart)."""
    runs = [await grpc_run(args) for _ in range(args.grpc_rounds)]
    result: dict[str, object] = {
        "system": f"{args.name}-grpc",
        "n": args.count,
        "size": args.size,
        "threads": args.threads,
        "window": args.window,
    }
    for _, remoting, grpc in GRPC_PAIRS:
        for phase in (remoting, grpc):
            result[f"{phase}_msgs_per_s"] = round(max(r[phase]["msgs_per_s"] for r in runs), 1)
            for key in ("server_us", "loop_us", "client_us"):
                result[f"{phase}_{key}_per_msg"] = round(min(r[phase][key] for r in runs), 1)
            result[f"{phase}_failures"] = sum(int(r[phase]["failures"]) for r in runs)
        ratios = [r[grpc]["server_us"] / max(r[remoting]["server_us"], 1e-9) for r in runs]
        result[f"{grpc}_cpu_ratio_median"] = round(statistics.median(ratios), 2)
    for label, remoting, grpc in GRPC_PAIRS:
        print(
            f"{label}: broker CPU per message remoting {result[f'{remoting}_server_us_per_msg']}"
            f" us, gRPC {result[f'{grpc}_server_us_per_msg']} us (least of "
            f"{len(runs)}); median ratio {result[f'{grpc}_cpu_ratio_median']} "
            "(target <= 1.5)",
            file=sys.stderr,
        )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", dest="namesrv", help="name server address (none: start pymq)")
    parser.add_argument("-t", dest="topic", default=f"BenchmarkTest_{uuid.uuid4().hex[:6]}")
    parser.add_argument("-s", dest="size", type=int, default=1024, help="message size in bytes")
    parser.add_argument("-w", dest="window", type=int, default=256, help="messages in flight")
    parser.add_argument("-b", dest="batch", type=int, default=1, help="messages per request")
    parser.add_argument(
        "-q", dest="count", type=int, help="messages to send (default 50000; 5000 with --grpc)"
    )
    parser.add_argument("--queues", type=int, default=8, help="queues of the topic")
    parser.add_argument("--flush", default="ASYNC_FLUSH", choices=["ASYNC_FLUSH", "SYNC_FLUSH"])
    parser.add_argument("--ha", choices=["ASYNC_MASTER", "SYNC_MASTER"], help="add a slave")
    parser.add_argument("--file-size", type=int, default=256 * 1024 * 1024)
    parser.add_argument("--no-consume", action="store_true")
    parser.add_argument(
        "--server-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config key for the servers it starts (repeatable; e.g. serverTaskOrder=trio)",
    )
    parser.add_argument(
        "--name", default="pymq", help='"system" in the JSON line (to tell variants apart)'
    )
    parser.add_argument(
        "--sync",
        action="store_true",
        help="one task per in-flight request with the awaited send() or send_batch() "
        "(default: send_async or send_batch_async, with a window)",
    )
    parser.add_argument(
        "--real-client",
        choices=["cpp"],
        help="publish with a real RocketMQ client instead (cpp: rocketmq-client-cpp through "
        "PyPI rocketmq==0.4.4, --threads threads each sending synchronously)",
    )
    parser.add_argument("--threads", type=int, default=4, help="--real-client sending threads")
    parser.add_argument(
        "--transaction",
        action="store_true",
        help="transactional sends against plain sync sends, and the check service's cost",
    )
    parser.add_argument(
        "--pending",
        type=int,
        default=100_000,
        help="with --transaction: half messages for the check-service round (0: skip)",
    )
    parser.add_argument(
        "--acl", action="store_true", help="measure the cost of ACL (aclEnable) on publishing"
    )
    parser.add_argument("--acl-rounds", type=int, default=2, help="off/on pairs with --acl")
    parser.add_argument(
        "--grpc",
        action="store_true",
        help="RocketMQ 5.x's official client (rocketmq-python-client) on the broker's gRPC port "
        "beside pymq's 4.x client on the remoting port, --threads at a time: publish and "
        "receive+ack rates and the broker's CPU per message (-q defaults to 5000 here)",
    )
    parser.add_argument("--grpc-rounds", type=int, default=2, help="fresh brokers with --grpc")
    parser.add_argument(
        "--profile",
        metavar="FILE",
        help="run the servers it starts under cProfile, writing FILE.0 (FILE.1, ...) at their "
        "stop (read with python -m pstats; the CPU figures then include the profiler's)",
    )
    parser.add_argument(
        "--dledger",
        action="store_true",
        help="a SYNC_MASTER pair, then a 3-broker DLedger group: their publish rates",
    )
    args = parser.parse_args()
    if args.count is None:
        args.count = 5000 if args.grpc else 50000
    if args.grpc:
        if args.namesrv or args.ha:
            parser.error("--grpc starts its own pymq: not with -n or --ha")
        result = trio.run(grpc_main, args)
        print(json.dumps(result), flush=True)
        return 0
    if args.dledger:
        if args.namesrv or args.ha or args.acl or args.transaction:
            parser.error(
                "--dledger starts its own servers: not with -n, --ha, --acl or --transaction"
            )
        rates = []
        for group in (False, True):
            run = argparse.Namespace(**vars(args))
            run.ha, run.group = (None, True) if group else ("SYNC_MASTER", False)
            result = trio.run(main_async, run)
            print(json.dumps(result), flush=True)
            rates.append(result["publish_msgs_per_s"])
        print(
            f"DLedger group / SYNC_MASTER publish rate: {rates[1] / max(rates[0], 1e-9):.2f}x",
            file=sys.stderr,
        )
        return 0
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
