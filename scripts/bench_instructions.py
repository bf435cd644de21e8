#!/usr/bin/env python3
"""The broker's CPU instructions per message, counted by valgrind (callgrind): a figure a busy
machine moves far less than throughput (its timers add a few percent), for comparing two
versions of the broker where throughput is noise.

    scripts/bench_instructions.py                       # this checkout's broker
    scripts/bench_instructions.py --pymq-root /tmp/old  # another checkout's broker, same client
    scripts/bench_instructions.py --scenarios publish,batch -q 4000

The embedded broker (``python -m pymq``) runs under ``valgrind --tool=callgrind`` with
instrumentation off; the client (this checkout's, run natively) creates the topic and warms the
path up, then instrumentation is switched on (``callgrind_control -i on``) for exactly the
measured load and off again.  Each scenario gets a fresh broker.  Printed: instructions (Ir) of
the broker process per message, and one JSON line.  Counts include what the broker's own
background tasks (flush, reput, timers) ran during the window, as they would under load.

Scenarios: ``publish`` (send_async, window -w), ``sync`` (one send at a time), ``batch``
(-b messages per request), ``consume`` (a push consumer reads what was published before the
window opened), ``grpcsync`` and ``grpcreceive`` (RocketMQ 5.x's official client on the broker's
gRPC port, as ``benchmark.py --grpc`` runs it: sync sends from --threads threads, and
receive+ack of what was published before the window opened; not in the default list),
``transaction`` (TransactionProducer.send_in_transaction by -w tasks: a half
message and a oneway COMMIT per message, as ``benchmark.py --transaction`` sends them; not in
the default list), ``syncflush`` (publish against a broker with ``flushDiskType=SYNC_FLUSH``: the
group commit's waiters and deferred answers; not in the default list either, since under valgrind
the syncs are fast beside the broker's work and a group holds fewer messages than at full speed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import benchmark  # noqa: E402  (the publish and consume loops of scripts/benchmark.py)
import trio  # noqa: E402

from pymq.acl.rpc_hook import AclSigner  # noqa: E402
from pymq.client.topics import create_topic, master_addresses  # noqa: E402
from pymq.common.topic import RMQ_SYS_TRANS_OP_HALF_TOPIC  # noqa: E402
from pymq.remoting import headers as H  # noqa: E402
from pymq.remoting.client import open_remoting_client  # noqa: E402
from pymq.remoting.codec import RemotingCommand  # noqa: E402
from pymq.remoting.codes import RequestCode  # noqa: E402

SCENARIOS = ("publish", "sync", "batch", "consume")
EXTRA_SCENARIOS = ("transaction", "syncflush", "grpcsync", "grpcreceive")


def start_broker(
    pymq_root: str, tmp: str, out_file: str, extra: list[str], grpc_port: int = 0
) -> tuple[subprocess.Popen, str]:
    python = sys.executable  # the venv's own path: Python finds its site-packages from it
    ns_port, broker_port = benchmark.free_port(), benchmark.free_port()
    env = dict(os.environ, PYTHONPATH=pymq_root)
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out_file}",
        python,
        *benchmark.embedded_args(tmp, ns_port, broker_port, grpc_port),
        # Under valgrind every request waits far past the send-queue limit: no fast failure.
        "--brokerFastFailureEnable",
        "false",
        *extra,
    ]
    proc = subprocess.Popen(
        cmd, cwd=pymq_root, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if "running" in line or "success" in line:
            return proc, f"127.0.0.1:{ns_port}"
    proc.kill()
    raise SystemExit("the broker did not start under valgrind")


def instrument(proc: subprocess.Popen, on: bool) -> None:
    subprocess.run(
        ["callgrind_control", "-i", "on" if on else "off", str(proc.pid)],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def total_ir(out_file: str) -> int:
    """The Ir total of every callgrind output file of the run (one per dump or thread)."""
    total = 0
    directory, base = os.path.split(out_file)
    for name in os.listdir(directory):
        if name.startswith(base):
            with open(os.path.join(directory, name)) as f:
                for line in f:  # "totals:" closes the file ("summary:" is 0 with -i toggling)
                    match = re.match(r"totals:\s+(\d+)", line)
                    if match:
                        total += int(match.group(1))
    return total


class Instrumented(benchmark.Meter):
    """benchmark.py's meter for the 5.x client's loops, switching instrumentation on at its
    start and off at its stop."""

    def __init__(self, proc: subprocess.Popen) -> None:
        super().__init__([])
        self.proc = proc

    def start(self) -> None:
        instrument(self.proc, True)
        super().start()

    def stop(self, count: int, failures: int = 0) -> dict[str, float]:
        instrument(self.proc, False)
        return super().stop(count, failures)


async def run_grpc(
    scenario: str, args: argparse.Namespace, proc: subprocess.Popen, namesrv: str
) -> int:
    """The 5.x client's sync sends (grpcsync) or receive+ack (grpcreceive, of messages a 4.x
    producer put before), warmed up first by the same loop on another topic."""
    load = load_args(args, args.topic, args.count, threads=args.threads)
    warm = load_args(args, args.topic + "_warm", args.warmup, threads=args.threads)
    for ns in (load, warm):  # under valgrind a call takes far longer than the client's 3 s
        ns.grpc_endpoint, ns.grpc_timeout = args.grpc_endpoint, 120
    meter = Instrumented(proc)
    for ns in (warm, load):
        await create_topic(namesrv, ns.topic, queues=8)
    if scenario == "grpcsync":
        unmeasured = benchmark.Meter([])
        await trio.to_thread.run_sync(
            lambda: benchmark.grpc_publish(warm, warm.topic, unmeasured, asynchronous=False)
        )
        result = await trio.to_thread.run_sync(
            lambda: benchmark.grpc_publish(load, load.topic, meter, asynchronous=False)
        )
    else:
        for ns in (warm, load):
            await benchmark.publish(ns, namesrv)
        await trio.to_thread.run_sync(
            benchmark.grpc_receive, warm, warm.topic, warm.count, benchmark.Meter([])
        )
        result = await trio.to_thread.run_sync(
            benchmark.grpc_receive, load, load.topic, load.count, meter
        )
    if result["failures"] or result["count"] < load.count - load.count % args.threads:
        raise SystemExit(f"scenario {scenario}: {result}")
    return int(result["count"])


def load_args(
    args: argparse.Namespace, topic: str, count: int, **changes: object
) -> argparse.Namespace:
    ns = argparse.Namespace(
        topic=topic, size=args.size, window=args.window, batch=1, count=count, sync=False
    )
    for key, value in changes.items():
        setattr(ns, key, value)
    return ns


async def run_scenario(
    scenario: str, args: argparse.Namespace, proc: subprocess.Popen, namesrv: str
) -> int:
    """Load the broker for ``scenario`` with instrumentation on only for the measured part;
    returns how many messages that part moved."""
    if scenario.startswith("grpc"):
        return await run_grpc(scenario, args, proc, namesrv)
    topic = args.topic
    creds = benchmark.ACL_PRODUCER if args.acl else None
    admin = benchmark.ACL_ADMIN if args.acl else None
    await create_topic(namesrv, topic, queues=8, credentials=admin)
    warm = load_args(args, topic, args.warmup)
    if scenario == "transaction":
        return await run_transactions(args, proc, namesrv)
    await benchmark.publish(warm, namesrv, creds)
    # The window opens and closes on a dispatched store (each message in its consume queue), as
    # the transaction scenario's does: the warm-up's records still in dispatch when the load
    # began were counted against it, and the load's own left out.
    async with queue_watch(namesrv, topic, admin) as queued:
        await queued(args.warmup)
        if scenario == "consume":
            await benchmark.publish(load_args(args, topic, args.count), namesrv, creds)
            await queued(args.warmup + args.count)
            instrument(proc, True)
            # The warm-up messages are consumed too: they are counted.
            rate, _ = await benchmark.consume(warm, namesrv, args.count + args.warmup)
            instrument(proc, False)
            return args.count + args.warmup if rate > 0 else 0
        if scenario in ("publish", "syncflush"):
            load = load_args(args, topic, args.count)
        elif scenario == "sync":
            load = load_args(args, topic, args.count // 4, window=1, sync=True)
        else:
            load = load_args(args, topic, args.count * 4, batch=args.batch, window=args.window)
        instrument(proc, True)
        _, _, failures = await benchmark.publish(load, namesrv, creds)
        if not failures:
            await queued(args.warmup + load.count)
        instrument(proc, False)
    if failures:
        raise SystemExit(f"{failures} sends failed in scenario {scenario}")
    return load.count


async def run_transactions(args: argparse.Namespace, proc: subprocess.Popen, namesrv: str) -> int:
    """Transactional sends (half message + oneway COMMIT), warmed up then measured; the
    window stays open until the broker has served every COMMIT (the op queue is full)."""
    body = os.urandom(args.size // 2).hex().encode()[: args.size]
    msg = benchmark.Message(args.topic, body)
    async with benchmark.TransactionProducer(
        "InstrBenchTxProducer",
        namesrv,
        execute=lambda m, a: benchmark.LocalTransactionState.COMMIT_MESSAGE,
        check=lambda m: benchmark.LocalTransactionState.COMMIT_MESSAGE,
        send_timeout=60,
    ) as producer:
        await producer.publish_queues(args.topic)

        async def send() -> None:
            await producer.send_in_transaction(msg)

        _, _, failures = await benchmark.timed_sends(args.warmup, args.window, send, "warm-up")
        await ops_reached(namesrv, args.warmup)
        instrument(proc, True)
        _, _, failures2 = await benchmark.timed_sends(args.count, args.window, send, "measured")
        await ops_reached(namesrv, args.warmup + args.count)
        instrument(proc, False)
    if failures or failures2:
        raise SystemExit(f"{failures + failures2} transactional sends failed")
    return args.count


async def ops_reached(namesrv: str, count: int) -> None:
    """Wait until the op queue holds ``count`` records: every oneway COMMIT was served."""
    (master,) = await master_addresses(namesrv)
    header = H.encode(H.TopicQueueHeader(RMQ_SYS_TRANS_OP_HALF_TOPIC, 0))
    async with open_remoting_client() as client:
        with trio.fail_after(600):
            while True:
                reply = await client.invoke(
                    master, RemotingCommand.request(RequestCode.GET_MAX_OFFSET, header)
                )
                if int(reply.ext_fields.get("offset", 0)) >= count:
                    return
                await trio.sleep(0.2)


@contextlib.asynccontextmanager
async def queue_watch(
    namesrv: str, topic: str, credentials: tuple[str, str] | None = None
) -> AsyncIterator[Callable[[int], Awaitable[None]]]:
    """A wait until ``topic``'s 8 consume queues hold a number of messages (each dispatched),
    on a connection opened here, before the measured window: the waits inside it cost eight
    GET_MAX_OFFSET requests when dispatch has caught up already."""
    (master,) = await master_addresses(namesrv)
    headers = [H.encode(H.TopicQueueHeader(topic, q)) for q in range(8)]
    signer = AclSigner(*credentials) if credentials is not None else None
    async with open_remoting_client(signer=signer) as client:

        async def reached(count: int) -> None:
            with trio.fail_after(600):
                while True:
                    total = 0
                    for header in headers:
                        reply = await client.invoke(
                            master, RemotingCommand.request(RequestCode.GET_MAX_OFFSET, header)
                        )
                        if reply.code != 0:
                            raise SystemExit(f"GET_MAX_OFFSET refused: {reply.remark}")
                        total += int(reply.ext_fields.get("offset", 0))
                    if total >= count:
                        return
                    await trio.sleep(0.2)

        yield reached


def measure(scenario: str, args: argparse.Namespace) -> float:
    tmp = tempfile.mkdtemp(prefix="pymq-instr-")
    out_file = os.path.join(tmp, "callgrind.out")
    extra: list[str] = []
    if args.acl:  # a producer account with PUB on the topic, as benchmark.py --acl has it
        home = os.path.join(tmp, "home")
        os.makedirs(os.path.join(home, "conf"))
        with open(os.path.join(home, "conf", "plain_acl.yml"), "w") as f:
            f.write(benchmark.acl_file(args.topic))
        extra = ["--aclEnable", "true", "--rocketmqHome", home]
    if scenario == "syncflush":
        extra += ["--flushDiskType", "SYNC_FLUSH"]
    grpc_port = benchmark.free_port() if scenario.startswith("grpc") else 0
    args.grpc_endpoint = f"127.0.0.1:{grpc_port}"
    proc, namesrv = start_broker(
        os.path.abspath(args.pymq_root), os.path.join(tmp, "data"), out_file, extra, grpc_port
    )
    try:
        messages = trio.run(run_scenario, scenario, args, proc, namesrv)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    try:
        ir = total_ir(out_file)
        if args.save_dir:  # for callgrind_annotate
            os.makedirs(args.save_dir, exist_ok=True)
            shutil.copy(out_file, os.path.join(args.save_dir, f"callgrind.{scenario}.out"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ir / max(1, messages)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pymq-root", default=ROOT, help="checkout whose broker is measured")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("-q", dest="count", type=int, default=3000, help="messages measured")
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("-s", dest="size", type=int, default=1024)
    parser.add_argument("-w", dest="window", type=int, default=256)
    parser.add_argument("-b", dest="batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=4, help="the 5.x client's threads")
    parser.add_argument("--save-dir", help="keep each scenario's callgrind output here")
    parser.add_argument(
        "--acl", action="store_true", help="aclEnable=true, the client signing (not consume)"
    )
    args = parser.parse_args()
    if args.acl and "transaction" in args.scenarios.split(","):
        raise SystemExit("--acl does not apply to the transaction scenario")
    args.topic = f"InstrBench_{uuid.uuid4().hex[:6]}"
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("needs valgrind (Debian: apt-get install valgrind)")
    results: dict[str, float] = {}
    for scenario in args.scenarios.split(","):
        if scenario not in SCENARIOS + EXTRA_SCENARIOS:
            known = ", ".join(SCENARIOS + EXTRA_SCENARIOS)
            raise SystemExit(f"unknown scenario {scenario!r} (one of {known})")
        results[scenario] = measure(scenario, args)
        print(f"{scenario:8s} {results[scenario]:12,.0f} broker instructions per message")
    print(
        json.dumps(
            {"pymq_root": args.pymq_root, "ir_per_msg": {k: round(v) for k, v in results.items()}}
        )
    )


if __name__ == "__main__":
    main()
