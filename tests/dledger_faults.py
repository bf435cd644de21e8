"""The DLedger fault harness (issue #42): three brokers of one DLedger group and two name
servers, each a separate process (``python -m pymq.broker -c conf``, ``python -m
pymq.namesrv``) in its own network namespace on this machine, joined by veth pairs to a bridge
that has no route anywhere else (nothing leaves the machine); a workload from the root
namespace over the bridge (producers that record every SEND_OK, pull consumers that read
everything); faults; and a checker.

Faults (:data:`FAULTS`):

- ``kill-leader`` / ``kill-follower`` / ``kill-two``: ``kill -9`` of the leader, of a follower,
  of the leader and a follower (no majority: nothing may be acknowledged until one is back);
- ``pause-leader`` / ``pause-follower``: SIGSTOP, then SIGCONT;
- ``isolate-leader``: the leader cut from both peers (clients and name servers still reach it:
  it must acknowledge nothing sent to it from then on), then healed;
  ``isolate-leader-all``: cut from every other address (peers, name servers, clients);
  ``split-follower``: one follower cut from the other two (a 1-2 split), then healed;
- ``loss``: every broker drops a share of its packets both ways; ``delay``: every broker's
  packets delayed (only with ``tc netem``);
- ``torn-restart``: a follower killed with ``-9``, the last bytes of its log zeroed and its
  checkpoint set back (a crash that lost the page cache), restarted.

How: partitions are blackhole routes in the namespaces (``ip route add blackhole``: packets to
the peer are dropped, both sides), which needs only iproute2.  Loss is ``tc qdisc netem`` where
the kernel has sch_netem, else iptables' ``-m statistic --mode random`` DROP rules in the
namespace (INPUT and OUTPUT); delay needs netem (there is no other kernel delay here), so
without it the fault is skipped and the report says so.

The checker proves, over the whole run: every acknowledged message is in the final read at the
queue offset its SEND_OK named (none lost); every message any consumer was served was sent and
is still at the same queue offset at the end (nothing served that the group later dropped:
only entries a majority stored are served); no acknowledgement came from a leader cut off from
its majority, nor while two of three members were down; every queue is dense; and, from the
brokers' DLedger data files read after they stopped, every follower's log is a prefix of the
leader's, and after each round, from the logs as they are, every member's committed entries
are whole and are the ones every member had at those indexes before (committed entries never
change).  Failover time is the time from the fault on the leader (killed, paused, cut off) to
the first SEND_OK from another member, for a send started after the fault.

Namespaces, links and processes carry a random run id and are removed in ``close()`` (also at
exit, and by :func:`cleanup_stale` for the leftovers of a killed run).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import itertools
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

import pymq
from pymq.client import Message, MQClientError, Producer, PullConsumer
from pymq.client import topics as topic_admin
from pymq.client.producer import SendResult
from pymq.common.consumer import MessageQueue
from pymq.common.message_id import decode_offset_msg_id
from pymq.common.serde import loads_lenient
from pymq.dledger.store import BLANK_MAGIC_CODE, CURRENT_MAGIC, DLedgerEntry
from pymq.remoting.client import RemotingClient, open_remoting_client
from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode
from pymq.remoting.errors import RemotingError

PREFIX = "pqf"
"""Namespaces are ``pqf<run>-<node>``, links ``pqf<run><k>`` and the bridge ``pqf<run>br``."""
BROKERS = ("b0", "b1", "b2")
NAMESRVS = ("ns0", "ns1")
TOPIC = "FaultTopic"
GROUP = "RaftFaults"
QUEUES = 4
BROKER_PORT = 10911
DLEDGER_PORT = 40911
NAMESRV_PORT = 9876
FILE_SIZE = 4 << 20  # mappedFileSizeCommitLog: small data files, so that rolls happen
FAULTS = (
    "kill-leader",
    "kill-follower",
    "kill-two",
    "pause-leader",
    "pause-follower",
    "isolate-leader",
    "isolate-leader-all",
    "split-follower",
    "loss",
    "delay",
    "torn-restart",
)
FAILOVER_FAULTS = {"kill-leader", "pause-leader", "isolate-leader", "isolate-leader-all"}
"""Faults on the leader alone, whose time to the first SEND_OK from another member is the
failover time; ``kill-two`` also counts its time (up to a SEND_OK once the killed follower is
restarted) but apart: it includes the outage it holds and a process start."""
LEADER_FAULTS = FAILOVER_FAULTS | {"kill-two"}


# the children import the pymq this module imported
_PYTHONPATH = os.pathsep.join(
    [str(Path(pymq.__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")]
).rstrip(os.pathsep)


class HarnessError(Exception):
    """The harness could not do what it needed (no namespaces, a process that did not come
    up, a group that did not converge)."""


def namespaces_unavailable() -> str | None:
    """Why network namespaces cannot be made here (None when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no `ip` (iproute2) on PATH"
    name = f"{PREFIX}probe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def cleanup_stale() -> list[str]:
    """Remove every namespace and bridge this harness names (``pqf...``): the leftovers of a
    run that was killed before its cleanup.  Not for use while another run is going on."""
    gone = []
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listed.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(PREFIX):
            subprocess.run(["ip", "netns", "pids", name], capture_output=True)
            _kill_namespace_pids(name)
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            gone.append(name)
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    for match in re.finditer(rf"^\d+: ({PREFIX}[0-9a-f]{{6}}(?:br|\d+))[:@]", links, re.M):
        subprocess.run(["ip", "link", "del", match.group(1)], capture_output=True)
        gone.append(match.group(1))
    return gone


def _kill_namespace_pids(name: str) -> None:
    pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout
    for pid in pids.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(args), capture_output=True, text=True)
    if check and done.returncode:
        raise HarnessError(f"{' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done


# ---------------------------------------------------------------------------------------------
# the network


class Net:
    """A bridge in the root namespace (``<subnet>.1``) and one namespace per node, each with a
    veth into the bridge and no other route: nodes reach each other and the root namespace,
    nothing else."""

    def __init__(self, nodes: Sequence[str]) -> None:
        self.run_id = f"{random.getrandbits(24):06x}"
        self.nodes = list(nodes)
        self.subnet = ""  # 10.x.y, chosen by up()
        self.bridge = f"{PREFIX}{self.run_id}br"
        self.made: list[str] = []  # namespaces made, for close()
        self.blackholes: set[tuple[str, str]] = set()  # (node, address) routes
        self.lossy: set[str] = set()
        self.delayers: list[subprocess.Popen[bytes]] = []
        self.netem = False

    @staticmethod
    def _free_subnet() -> str:
        used = _run("ip", "-o", "-4", "addr", "show").stdout + _run("ip", "-4", "route").stdout
        for _ in range(200):
            subnet = f"10.{random.randrange(200, 255)}.{random.randrange(0, 256)}"
            if f" {subnet}." not in used and f"\n{subnet}." not in used:
                return subnet
        raise HarnessError("no free 10.x.y.0/24 for the bridge")

    def ns(self, node: str) -> str:
        return f"{PREFIX}{self.run_id}-{node}"

    def ip(self, node: str) -> str:
        if node == "root":
            return f"{self.subnet}.1"
        return f"{self.subnet}.{11 + self.nodes.index(node)}"

    def up(self) -> None:
        self.subnet = self._free_subnet()
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{self.ip('root')}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for k, node in enumerate(self.nodes):
            ns, veth = self.ns(node), f"{PREFIX}{self.run_id}{k}"
            _run("ip", "netns", "add", ns)
            self.made.append(ns)
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", veth + "p")
            _run("ip", "link", "set", veth + "p", "netns", ns)
            _run("ip", "-n", ns, "link", "set", veth + "p", "name", "eth0")
            _run("ip", "-n", ns, "addr", "add", f"{self.ip(node)}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "link", "set", veth, "master", self.bridge)
            _run("ip", "link", "set", veth, "up")
        ns0 = self.ns(self.nodes[0])
        probe = _run("ip", "netns", "exec", ns0, "tc", "qdisc", "add", "dev", "lo", "root",
                     "netem", "delay", "0ms", check=False)  # fmt: skip
        if probe.returncode == 0:
            self.netem = True
            _run("ip", "netns", "exec", ns0, "tc", "qdisc", "del", "dev", "lo", "root")

    def close(self) -> None:
        for delayer in self.delayers:
            delayer.kill()
            delayer.wait()
        self.delayers.clear()
        for k, ns in enumerate(self.made):
            _kill_namespace_pids(ns)
            # the pair at once (a namespace's own links go when the kernel gets to it)
            _run("ip", "link", "del", f"{PREFIX}{self.run_id}{k}", check=False)
            _run("ip", "netns", "del", ns, check=False)
        self.made.clear()
        _run("ip", "link", "del", self.bridge, check=False)

    # -- partitions: blackhole routes on both sides ---------------------------------------------

    def cut(self, node: str, others: Sequence[str]) -> None:
        """Drop every packet between ``node`` and each of ``others`` (nodes or "root")."""
        for other in others:
            for here, there in ((node, other), (other, node)):
                if here == "root":
                    continue  # the root's side: the node's route drops its answers
                self._blackhole(here, self.ip(there))

    def _blackhole(self, node: str, address: str) -> None:
        if (node, address) not in self.blackholes:
            _run("ip", "-n", self.ns(node), "route", "add", "blackhole", f"{address}/32")
            self.blackholes.add((node, address))

    def heal(self) -> None:
        for node, address in sorted(self.blackholes):
            _run("ip", "-n", self.ns(node), "route", "del", "blackhole", f"{address}/32",
                 check=False)  # fmt: skip
        self.blackholes.clear()

    # -- loss and delay -------------------------------------------------------------------------

    def impair(self, node: str, *, loss: float = 0.0, delay_ms: int = 0) -> str:
        """Packets ``node`` sends dropped with probability ``loss`` and delayed by
        ``delay_ms``; returns how.  ``tc netem`` where the kernel has it; else iptables in the
        namespace: ``-m statistic --mode random`` DROP for loss (INPUT and OUTPUT), and for
        delay NFQUEUE with :func:`delay_packets` giving each packet its verdict late.
        HarnessError when the machine has neither."""
        ns = self.ns(node)
        if self.netem:
            args = ["netem"]
            if delay_ms:
                args += ["delay", f"{delay_ms}ms"]
            if loss:
                args += ["loss", f"{loss * 100:.2f}%"]
            _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", *args)
            self.lossy.add(node)
            return "tc netem"
        if shutil.which("iptables") is None:
            raise HarnessError("packet loss and delay need tc netem or iptables; neither is here")
        self.lossy.add(node)
        how = []
        if loss:
            for chain in ("INPUT", "OUTPUT"):
                _run("ip", "netns", "exec", ns, "iptables", "-A", chain, "-m", "statistic",
                     "--mode", "random", "--probability", f"{loss}", "-j", "DROP")  # fmt: skip
            how.append("iptables -m statistic DROP")
        if delay_ms:
            argv = [sys.executable, "-m", "tests.dledger_faults", "delay", "0", str(delay_ms)]
            delayer = subprocess.Popen(
                ["ip", "netns", "exec", ns, *argv],
                stdout=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "PYTHONPATH": _PYTHONPATH},
            )
            self.delayers.append(delayer)
            assert delayer.stdout is not None
            if delayer.stdout.readline().strip() != b"bound":
                raise HarnessError("the NFQUEUE delayer did not start")
            _run("ip", "netns", "exec", ns, "iptables", "-A", "OUTPUT", "-j", "NFQUEUE",
                 "--queue-num", "0", "--queue-bypass")  # fmt: skip
            how.append("iptables NFQUEUE + userspace delayer")
        return ", ".join(how)

    def unimpair(self) -> None:
        for node in sorted(self.lossy):
            ns = self.ns(node)
            if self.netem:
                _run("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "eth0", "root",
                     check=False)  # fmt: skip
            else:
                _run("ip", "netns", "exec", ns, "iptables", "-F", check=False)
        self.lossy.clear()
        for delayer in self.delayers:  # after the flush: no packet is left queued to it
            delayer.kill()
            delayer.wait()
        self.delayers.clear()


# ---------------------------------------------------------------------------------------------
# the processes


class Cluster:
    """Two name servers and three DLedger brokers, each a process in its namespace."""

    def __init__(self, workdir: Path, *, python: str = sys.executable) -> None:
        self.workdir = workdir
        self.python = python
        self.net = Net(BROKERS + NAMESRVS)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.paused: set[str] = set()
        self.self_ids = {b: f"n{i}" for i, b in enumerate(BROKERS)}
        self._closed = False

    @property
    def namesrv_addr(self) -> str:
        return ";".join(f"{self.net.ip(n)}:{NAMESRV_PORT}" for n in NAMESRVS)

    def addr(self, broker: str) -> str:
        return f"{self.net.ip(broker)}:{BROKER_PORT}"

    def broker_of(self, addr: str) -> str | None:
        return next((b for b in BROKERS if self.addr(b) == addr), None)

    def store_dir(self, broker: str) -> Path:
        return self.workdir / broker

    def data_dir(self, broker: str) -> Path:
        return self.store_dir(broker) / f"dledger-{self.self_ids[broker]}" / "data"

    def up(self) -> None:
        atexit.register(self.close)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.net.up()
        peers = ";".join(f"{self.self_ids[b]}-{self.net.ip(b)}:{DLEDGER_PORT}" for b in BROKERS)
        for b in BROKERS:
            conf = {
                "brokerClusterName": "FaultCluster",
                "brokerName": GROUP,
                "brokerIP1": self.net.ip(b),
                "listenPort": BROKER_PORT,
                "namesrvAddr": self.namesrv_addr,
                "storePathRootDir": self.store_dir(b),
                "mappedFileSizeCommitLog": FILE_SIZE,
                "enableDLegerCommitLog": "true",
                "dLegerGroup": GROUP,
                "dLegerPeers": peers,
                "dLegerSelfId": self.self_ids[b],
            }
            text = "".join(f"{k}={v}\n" for k, v in conf.items())
            (self.workdir / f"{b}.conf").write_text(text)
        for n in NAMESRVS:
            self.start(n)
        for b in BROKERS:
            self.start(b)

    def start(self, node: str) -> None:
        if node in NAMESRVS:
            d = self.workdir / node
            args = [
                "-m", "pymq.namesrv",
                "--listenPort", str(NAMESRV_PORT),
                "--kvConfigPath", str(d / "kvConfig.json"),
                "--configStorePath", str(d / "namesrv.properties"),
            ]  # fmt: skip
        else:
            args = ["-m", "pymq.broker", "-c", str(self.workdir / f"{node}.conf")]
        log = open(self.workdir / f"{node}.log", "ab")  # noqa: SIM115 (the child keeps it)
        try:
            self.procs[node] = subprocess.Popen(
                ["ip", "netns", "exec", self.net.ns(node), self.python, *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "PYTHONPATH": _PYTHONPATH},
            )
        finally:
            log.close()

    def alive(self, node: str) -> bool:
        proc = self.procs.get(node)
        return proc is not None and proc.poll() is None

    def kill(self, node: str) -> None:
        """``kill -9``, and wait until the process is gone."""
        proc = self.procs.pop(node)
        self.paused.discard(node)
        proc.kill()
        proc.wait()

    def pause(self, node: str) -> None:
        self.procs[node].send_signal(signal.SIGSTOP)
        self.paused.add(node)
        pid = self.procs[node].pid
        for _ in range(1000):  # stopped once /proc says so
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "T":
                    return
            time.sleep(0.001)

    def resume(self, node: str) -> None:
        self.procs[node].send_signal(signal.SIGCONT)
        self.paused.discard(node)

    def stop_all(self, timeout: float = 5) -> None:
        """SIGTERM to every process (a graceful stop: the brokers write their checkpoints),
        SIGKILL for one that is not gone in ``timeout`` seconds."""
        for node in list(self.paused):
            self.resume(node)
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        deadline = time.monotonic() + timeout
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        self.procs.clear()
        self.net.close()
        with contextlib.suppress(ValueError):
            atexit.unregister(self.close)


# ---------------------------------------------------------------------------------------------
# the DLedger log on disk


def read_log(data_dir: Path) -> list[DLedgerEntry]:
    """The entries of a member's DLedger data files, read only, as 0.2.6's recovery reads
    them: file after file, entry after entry while each is whole and consistent (magic, its
    own position, index one more than the last, term not smaller); a blank ends a file; the
    first entry that is not whole ends the log."""
    entries: list[DLedgerEntry] = []
    if not data_dir.is_dir():
        return entries
    header = struct.Struct(">ii")
    for path in sorted(p for p in data_dir.iterdir() if re.fullmatch(r"[0-9]{20}", p.name)):
        data = path.read_bytes()
        base, at = int(path.name), 0
        while at + header.size <= len(data):
            magic, size = header.unpack_from(data, at)
            if magic == BLANK_MAGIC_CODE:
                break
            if magic != CURRENT_MAGIC:
                return entries
            try:
                entry = DLedgerEntry.decode(data[at : at + size])
            except Exception:
                return entries
            last = entries[-1] if entries else None
            if entry.pos != base + at or (
                last is not None and (entry.index != last.index + 1 or entry.term < last.term)
            ):
                return entries
            entries.append(entry)
            at += size
    return entries


def tear_tail(
    data_dir: Path, checkpoint: Path, nbytes: int = 300, *, committed_torn: bool = False
) -> tuple[int, int]:
    """A crash that lost the newest writes: the last ``nbytes`` of the log's written bytes
    (at most half of the last file's) zeroed, and a checkpoint written before them: its
    committedIndex two entries before the last that stays whole (whose body may be torn
    behind a whole header, which recovery cannot see: 0.2.6 writes no CRC).
    ``committed_torn``: the checkpoint written after them instead, its committedIndex 10
    entries before the old end, which may name that torn entry committed -- a member then
    never catches up (see tests/unit/test_dledger_torn_committed.py).  Returns (entries
    before, entries left whole)."""
    entries = read_log(data_dir)
    if not entries:
        return 0, 0
    last = entries[-1]
    end = last.pos + last.size
    files = sorted(p for p in data_dir.iterdir() if re.fullmatch(r"[0-9]{20}", p.name))
    (path,) = [p for p in files if int(p.name) <= last.pos][-1:]
    in_file = end - int(path.name)
    cut = min(nbytes, in_file // 2)  # a tail: at most half of what the file holds
    with open(path, "r+b") as f:
        f.seek(in_file - cut)
        f.write(bytes(cut))
    left = len(read_log(data_dir))
    committed = last.index - 10 if committed_torn else left - 3
    checkpoint.write_text(f"committedIndex={max(-1, committed)}\nendIndex={last.index}\n")
    return len(entries), left


# ---------------------------------------------------------------------------------------------
# the workload


@attrs.define
class Ack:
    body: bytes
    started: float
    done: float
    broker: str | None  # the member that stored it (from the offset message id)
    queue_id: int
    queue_offset: int


@attrs.define
class Workload:
    """Producers that record every SEND_OK (with the member that stored it, from the offset
    message id) and every send tried; consumers that pull every queue from offset 0 and
    record what each queue offset held."""

    cluster: Cluster
    producers: int = 6
    attempted: set[bytes] = attrs.field(factory=set)
    acks: list[Ack] = attrs.field(factory=list)
    failed: int = 0
    served: dict[tuple[int, int], bytes] = attrs.field(factory=dict)
    problems: list[str] = attrs.field(factory=list)
    stopped: trio.Event = attrs.field(factory=trio.Event)
    _serial: Iterator[int] = attrs.field(factory=itertools.count)

    async def produce(self, producer: Producer, k: int) -> None:
        while not self.stopped.is_set():
            body = b"m%d-%d" % (k, next(self._serial))
            self.attempted.add(body)
            started = time.monotonic()
            try:
                result = await producer.send(Message(TOPIC, body), timeout=3)
            except MQClientError:
                self.failed += 1
                await trio.sleep(0.05)
                continue
            self.record(body, started, result)

    def record(self, body: bytes, started: float, result: SendResult) -> None:
        if result.status != "SEND_OK":
            self.failed += 1
            return
        host, port, _ = decode_offset_msg_id(result.offset_msg_id)
        broker = self.cluster.broker_of(f"{host}:{port}")
        self.acks.append(
            Ack(body, started, time.monotonic(), broker, result.queue.queue_id, result.queue_offset)
        )

    async def consume(self, consumer: PullConsumer, queue: int, until: dict[int, int]) -> None:
        """Pull ``queue`` from 0 until stopped and caught up with ``until[queue]``."""
        mq = MessageQueue(TOPIC, GROUP, queue)
        offset = 0
        while not (self.stopped.is_set() and offset >= until.get(queue, 1 << 62)):
            try:
                result = await consumer.pull(mq, "*", offset, 32, timeout=3)
            except (MQClientError, RemotingError, OSError):
                await trio.sleep(0.1)
                continue
            for m in result.messages:
                key = (queue, m.queue_offset)
                seen = self.served.setdefault(key, m.body)
                if seen != m.body:
                    self.problems.append(f"queue {queue} offset {m.queue_offset} served "
                                         f"{seen!r} and later {m.body!r}")  # fmt: skip
            if result.messages:
                if result.next_begin_offset < offset:
                    self.problems.append(
                        f"queue {queue}: next offset {result.next_begin_offset} < {offset}"
                    )
                offset = max(offset, result.next_begin_offset)
            else:
                await trio.sleep(0.05)

    def acks_since(self, t: float) -> Iterator[Ack]:
        """The SEND_OK of sends started at ``t`` or later, newest first (acks are recorded in
        the order they came: the walk stops at the first that came before ``t``)."""
        for a in reversed(self.acks):
            if a.done < t:
                return
            if a.started >= t:
                yield a

    def first_ack_after(self, t: float, *, not_from: str | None = None) -> Ack | None:
        return min(
            (a for a in self.acks_since(t) if a.broker != not_from),
            key=lambda a: a.done,
            default=None,
        )


# ---------------------------------------------------------------------------------------------
# the harness


@attrs.define
class Round:
    fault: str
    victims: list[str]
    leader: str
    started: float
    failover: float | None = None
    skipped: str | None = None
    how: str = ""
    acked: int = 0  # SEND_OK for sends started while the fault held
    latency_p50: float | None = None  # their send latency

    def line(self) -> str:
        text = f"{self.fault:<18} victims {','.join(self.victims):<6} leader {self.leader}"
        if self.skipped:
            return f"{text}  skipped: {self.skipped}"
        if self.failover is not None:
            text += f"  failover {self.failover:5.2f} s"
        text += f"  SEND_OK while held {self.acked}"
        if self.latency_p50 is not None:
            text += f" (p50 {self.latency_p50 * 1000:.0f} ms)"
        return text + (f"  [{self.how}]" if self.how else "")


class Harness:
    """A cluster, its workload and the faults; ``rounds`` records what each did."""

    def __init__(
        self,
        workdir: Path,
        *,
        seed: int | None = None,
        hold: float = 3.0,
        committed_torn: bool = False,
    ) -> None:
        self.committed_torn = committed_torn
        self.cluster = Cluster(workdir)
        self.workload = Workload(self.cluster)
        self.rounds: list[Round] = []
        self.random = random.Random(seed)
        self.hold = hold
        self.client: RemotingClient | None = None
        self.log_lines: list[str] = []
        self.kills = 0
        self.committed: dict[int, tuple[int, int, int]] = {}

    def log(self, text: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {text}"
        self.log_lines.append(line)
        print(line, flush=True)

    # -- status --------------------------------------------------------------------------------

    async def info(self, broker: str) -> dict[str, str] | None:
        if not self.cluster.alive(broker) or broker in self.cluster.paused:
            return None
        assert self.client is not None
        try:
            with trio.move_on_after(1.5):
                reply = await self.client.invoke(
                    self.cluster.addr(broker),
                    RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO),
                    1.0,
                )
                table: dict[str, str] = loads_lenient(reply.body).get("table", {})
                return table
        except (RemotingError, OSError, ValueError):
            pass
        return None

    async def infos(self) -> dict[str, dict[str, str]]:
        out: dict[str, dict[str, str]] = {}

        async def one(b: str) -> None:
            got = await self.info(b)
            if got is not None:
                out[b] = got

        async with trio.open_nursery() as nursery:
            for b in BROKERS:
                nursery.start_soon(one, b)
        return out

    async def leader(self, timeout: float = 60) -> str:
        """The member that says it leads with the highest term, once one does and every
        member that answers names it (or has not yet heard of it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            infos = await self.infos()
            leaders = [b for b, i in infos.items() if i.get("dLedgerRole") == "LEADER"]
            if leaders:
                best = max(leaders, key=lambda b: int(infos[b].get("dLedgerTerm", "-1")))
                if best in self.cluster.procs and best not in self.cluster.paused:
                    return best
            await trio.sleep(0.1)
        raise HarnessError(f"no leader within {timeout} s")

    async def converged(self, timeout: float = 90, *, exact: bool = False) -> str:
        """Wait until every member runs, one leads, and every member has committed what the
        leader had committed when they all first answered (``exact``: the whole of the
        leader's log, everywhere, for a group without load); return the leader.  Under load
        it sends nothing itself; without, it sends a message now and then (an idle DLedger
        leader does not look at a follower that came back)."""
        deadline = time.monotonic() + timeout
        target: int | None = None
        nudge = itertools.count()
        while time.monotonic() < deadline:
            infos = await self.infos()
            leaders = [b for b, i in infos.items() if i.get("dLedgerRole") == "LEADER"]
            if len(infos) == len(BROKERS) and len(leaders) == 1:
                (leader,) = leaders
                ends = {int(i.get("dLedgerLedgerEndIndex", "-2")) for i in infos.values()}
                commits = {int(i.get("dLedgerCommittedIndex", "-2")) for i in infos.values()}
                if exact:
                    if len(ends) == 1 and ends == commits:
                        return leader
                    if next(nudge) % 10 == 9:
                        await self.nudge()
                else:
                    if target is None:
                        target = int(infos[leader].get("dLedgerCommittedIndex", "-1"))
                    if min(commits) >= target:
                        return leader
            await trio.sleep(0.3)
        raise HarnessError(
            f"the group did not converge within {timeout} s: "
            + str(
                {
                    b: {k: v for k, v in i.items() if k.startswith("dLedger")}
                    for b, i in (await self.infos()).items()
                }
            )
        )

    async def nudge(self) -> None:
        """One message more (recorded as any other)."""
        producer = Producer("fault-nudge", self.cluster.namesrv_addr)
        async with producer:
            body = b"nudge-%d" % next(self.workload._serial)
            self.workload.attempted.add(body)
            started = time.monotonic()
            with contextlib.suppress(MQClientError):
                result = await producer.send(Message(TOPIC, body), timeout=3)
                self.workload.record(body, started, result)

    async def wait_acks(self, count: int, timeout: float = 60, *, after: float = 0.0) -> None:
        deadline = time.monotonic() + timeout
        while sum(1 for _ in self.workload.acks_since(after)) < count:
            if time.monotonic() > deadline:
                raise HarnessError(f"fewer than {count} SEND_OK within {timeout} s")
            await trio.sleep(0.05)

    # -- the run ---------------------------------------------------------------------------------

    async def start(self, nursery: trio.Nursery) -> None:
        self.client = await nursery.start(_remoting_client)
        await trio.to_thread.run_sync(self.cluster.up)
        self.log(f"namespaces {self.cluster.net.ns('*')} on {self.cluster.net.subnet}.0/24; "
                 f"netem: {'yes' if self.cluster.net.netem else 'no'}")  # fmt: skip
        leader = await self.converged(exact=True)
        self.log(f"leader {leader}")
        addrs = [self.cluster.addr(b) for b in BROKERS]
        ns = self.cluster.namesrv_addr.split(";")[0]
        await topic_admin.create_topic(ns, TOPIC, queues=QUEUES, brokers=addrs)

    async def workload_running(self, nursery: trio.Nursery) -> tuple[Producer, PullConsumer]:
        producer = Producer("fault-producer", self.cluster.namesrv_addr, send_timeout=3)
        consumer = PullConsumer("fault-consumer", self.cluster.namesrv_addr)
        await nursery.start(_serve, producer)
        await nursery.start(_serve, consumer)
        for k in range(self.workload.producers):
            nursery.start_soon(self.workload.produce, producer, k)
        self._until: dict[int, int] = {}
        for q in range(QUEUES):
            nursery.start_soon(self.workload.consume, consumer, q, self._until)
        await self.wait_acks(20)
        return producer, consumer

    async def run_fault(self, fault: str) -> Round:
        """One round: wait for a healthy group under load, inject ``fault``, measure, heal,
        restart what was killed, wait until the group has caught up."""
        leader = await self.converged()
        await self.wait_acks(10, after=time.monotonic())
        follower = self.random.choice([b for b in BROKERS if b != leader])
        if fault in LEADER_FAULTS:
            victims = [leader, follower] if fault == "kill-two" else [leader]
        else:
            victims = list(BROKERS) if fault in ("loss", "delay") else [follower]
        r = Round(fault, victims, leader, 0.0)
        self.rounds.append(r)
        try:
            await self._inject(r)
        except HarnessError as exc:  # a fault this machine cannot make
            await trio.to_thread.run_sync(self.cluster.net.unimpair)
            r.skipped = str(exc)
            self.log(f"{fault}: skipped ({exc})")
            return r
        self.log(f"{fault}: {', '.join(victims)} (leader {leader}) {r.how}".rstrip())
        if fault in LEADER_FAULTS:
            await self._failover(r, follower)
        else:  # the other two keep acknowledging
            await trio.sleep(self.hold)
            await self.wait_acks(10, after=time.monotonic())
        held = list(self.workload.acks_since(r.started))
        r.acked = len(held)
        if held:
            r.latency_p50 = percentile([a.done - a.started for a in held], 50)
        healed_at = await self._heal(r)
        await self.converged()
        await self.check_committed()
        if fault in ("isolate-leader", "isolate-leader-all", "pause-leader"):
            # the old leader, cut off or paused, acknowledged nothing sent from then on
            stale = [
                a
                for a in self.workload.acks
                if a.broker == leader and r.started <= a.started < healed_at
            ]
            if stale:
                self.workload.problems.append(
                    f"{fault}: {len(stale)} SEND_OK from the cut-off leader, e.g. {stale[0]}"
                )
        return r

    async def check_committed(self) -> None:
        """Read every member's log as it is now: the entries up to the committed index it
        reports must be whole, and each committed entry (term, position, body) must be the
        one every member had at that index at every earlier check (committed entries never
        change, on any member)."""
        for b, info in (await self.infos()).items():
            committed = int(info.get("dLedgerCommittedIndex", "-1"))
            entries = await trio.to_thread.run_sync(read_log, self.cluster.data_dir(b))
            upto = [e for e in entries if e.index <= committed]
            if committed >= 0 and (not upto or upto[-1].index != committed):
                self.workload.problems.append(
                    f"{b} reports committed index {committed}; its log has {len(entries)} "
                    "whole entries"
                )
            for e in upto:
                key = (e.term, e.pos, zlib.crc32(e.body))
                seen = self.committed.setdefault(e.index, key)
                if seen != key:
                    self.workload.problems.append(
                        f"{b}'s committed entry {e.index} is (term, pos, crc) {key}, was {seen}"
                    )
                    break

    async def _inject(self, r: Round) -> None:
        c, net = self.cluster, self.cluster.net
        if r.fault in ("kill-leader", "kill-follower", "kill-two", "torn-restart"):
            for v in r.victims:
                await trio.to_thread.run_sync(c.kill, v)
        elif r.fault in ("pause-leader", "pause-follower"):
            await trio.to_thread.run_sync(c.pause, r.victims[0])
        elif r.fault in ("isolate-leader", "isolate-leader-all", "split-follower"):
            others = [b for b in BROKERS if b != r.victims[0]]
            if r.fault == "isolate-leader-all":
                others += [*NAMESRVS, "root"]
            await trio.to_thread.run_sync(net.cut, r.victims[0], others)
        else:  # loss, delay
            loss = 0.1 if r.fault == "loss" else 0.0
            delay_ms = 40 if r.fault == "delay" else 0
            for b in BROKERS:
                r.how = await trio.to_thread.run_sync(
                    functools.partial(net.impair, b, loss=loss, delay_ms=delay_ms)
                )
        r.started = time.monotonic()

    async def _failover(self, r: Round, follower: str) -> None:
        """Wait for the first SEND_OK from another member than the old leader, of a send
        started after the fault.  ``kill-two``: first ``hold`` seconds without a majority, in
        which nothing may be acknowledged, then the follower restarted."""
        w = self.workload
        if r.fault == "kill-two":
            await trio.sleep(self.hold)
            late = list(w.acks_since(r.started))
            if late:
                w.problems.append(f"kill-two: {len(late)} SEND_OK with two of three down")
            self.cluster.start(follower)  # the majority back: a leader can be elected
        deadline = r.started + 60
        while (a := w.first_ack_after(r.started, not_from=r.leader)) is None:
            if time.monotonic() > deadline:
                raise HarnessError(f"{r.fault}: no SEND_OK from another member in 60 s")
            await trio.sleep(0.02)
        r.failover = a.done - r.started
        self.log(f"{r.fault}: failover {r.failover:.2f} s (first SEND_OK from {a.broker})")

    async def _heal(self, r: Round) -> float:
        """Partitions and impairments removed, the paused resumed, the killed restarted (a
        ``torn-restart``'s, and every other ``kill-leader``'s, with a torn tail)."""
        c = self.cluster
        await trio.to_thread.run_sync(c.net.heal)
        await trio.to_thread.run_sync(c.net.unimpair)
        for v in r.victims:
            if v in c.paused:
                c.resume(v)
        self.kills += r.fault == "kill-leader"
        torn = r.fault == "torn-restart" or (r.fault == "kill-leader" and self.kills % 2 == 1)
        for v in r.victims:
            if not c.alive(v):
                if torn:
                    data = c.data_dir(v)
                    nbytes = self.random.randrange(200, 64 << 10)
                    before, left = await trio.to_thread.run_sync(
                        functools.partial(
                            tear_tail,
                            data,
                            data.parent / "checkpoint",
                            nbytes,
                            committed_torn=self.committed_torn,
                        )
                    )
                    self.log(f"{v}: last {nbytes} bytes zeroed ({before} entries, {left} whole)")
                c.start(v)
        return time.monotonic()

    async def finish(self) -> Report:
        """Stop the producers, let the group converge, read everything once more, stop the
        brokers and check."""
        w = self.workload
        w.stopped.set()
        leader = await self.converged(exact=True)
        final = await self.read_all()
        for q in range(QUEUES):
            self._until[q] = max((o + 1 for (qq, o) in final if qq == q), default=0)
        with trio.move_on_after(30):
            while any(
                max((o + 1 for (qq, o) in w.served if qq == q), default=0) < self._until[q]
                for q in range(QUEUES)
            ):
                await trio.sleep(0.1)
        self.log("final read done; stopping the processes")
        await trio.to_thread.run_sync(self.cluster.stop_all)
        logs = {b: read_log(self.cluster.data_dir(b)) for b in BROKERS}
        return check(w, final, logs, leader, self.rounds)

    async def read_all(self) -> dict[tuple[int, int], bytes]:
        out: dict[tuple[int, int], bytes] = {}
        consumer = PullConsumer("fault-final", self.cluster.namesrv_addr)
        async with consumer:
            for q in range(QUEUES):
                mq = MessageQueue(TOPIC, GROUP, q)
                offset = 0
                with trio.fail_after(60):
                    while True:
                        try:
                            result = await consumer.pull(mq, "*", offset, 32, timeout=3)
                        except (MQClientError, RemotingError, OSError):
                            await trio.sleep(0.2)
                            continue
                        if not result.messages:
                            break
                        for m in result.messages:
                            out[(q, m.queue_offset)] = m.body
                        offset = result.next_begin_offset
        return out


async def _remoting_client(*, task_status: trio.TaskStatus[RemotingClient]) -> None:
    async with open_remoting_client() as client:
        task_status.started(client)
        await trio.sleep_forever()


async def _serve(service: Any, *, task_status: trio.TaskStatus[None]) -> None:
    async with service:
        task_status.started()
        await trio.sleep_forever()


# ---------------------------------------------------------------------------------------------
# the checker


@attrs.define
class Report:
    violations: list[str]
    acked: int
    attempted: int
    served: int
    final: int
    unacked_committed: int
    duplicates: int
    log_lengths: dict[str, int]
    failovers: dict[str, list[float]]

    def summary(self) -> str:
        lines = [
            f"sends tried {self.attempted}, SEND_OK {self.acked}, in the final read "
            f"{self.final} ({self.unacked_committed} stored without a SEND_OK: a timed-out "
            f"send the group kept; {self.duplicates} stored twice: a retried send), served to "
            f"the live consumers {self.served}",
            "log entries: " + ", ".join(f"{b} {n}" for b, n in self.log_lengths.items()),
        ]
        every = sorted(t for k, ts in self.failovers.items() if k in FAILOVER_FAULTS for t in ts)
        for kind, ts in [*sorted(self.failovers.items()), ("(leader killed/paused/cut)", every)]:
            if ts:
                lines.append(
                    f"failover {kind}: n={len(ts)} p50={percentile(ts, 50):.2f} s "
                    f"p99={percentile(ts, 99):.2f} s max={max(ts):.2f} s"
                )
        lines.append(
            "checker: " + ("OK" if not self.violations else f"{len(self.violations)} violations")
        )
        lines += [f"  VIOLATION {v}" for v in self.violations[:50]]
        return "\n".join(lines)


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))
    return ordered[int(rank) - 1]


def check(
    w: Workload,
    final: dict[tuple[int, int], bytes],
    logs: dict[str, list[DLedgerEntry]],
    leader: str,
    rounds: Sequence[Round],
) -> Report:
    """Every violation of the properties in the module's docstring, and the figures."""
    violations = list(w.problems) + check_queues(w, final) + check_logs(logs, leader, final)
    failovers: dict[str, list[float]] = {}
    for r in rounds:
        if r.failover is not None:
            failovers.setdefault(r.fault, []).append(r.failover)
    acked = {a.body for a in w.acks}
    bodies = list(final.values())
    return Report(
        violations,
        len(w.acks),
        len(w.attempted),
        len(w.served),
        len(final),
        sum(1 for body in set(bodies) if body not in acked),
        len(bodies) - len(set(bodies)),
        {b: len(e) for b, e in logs.items()},
        failovers,
    )


def check_queues(w: Workload, final: dict[tuple[int, int], bytes]) -> list[str]:
    """Dense queues; every SEND_OK's message at the queue offset it named; everything served
    still where it was served; nothing that was never sent."""
    violations = []
    for q in range(QUEUES):
        offsets = sorted(o for (qq, o) in final if qq == q)
        if offsets != list(range(len(offsets))):
            holes = sorted(set(range(max(offsets, default=-1) + 1)) - set(offsets))
            violations.append(f"queue {q} not dense: missing offsets {holes[:10]}")
    for a in w.acks:
        got = final.get((a.queue_id, a.queue_offset))
        if got != a.body:
            violations.append(
                f"SEND_OK {a.body!r} (queue {a.queue_id} offset {a.queue_offset}, from "
                f"{a.broker}) lost: the final read has {got!r} there"
            )
    for key, body in w.served.items():
        if final.get(key) != body:
            violations.append(f"served {body!r} at {key}, final read has {final.get(key)!r}")
    violations += [f"{b!r} at {k} was never sent" for k, b in final.items() if b not in w.attempted]
    return violations


def check_logs(
    logs: dict[str, list[DLedgerEntry]], leader: str, final: dict[tuple[int, int], bytes]
) -> list[str]:
    """Every member's log a prefix of the leader's (the same entries: index, term, position,
    body), and the leader's log holding an entry for every message in the queues."""
    violations = []
    theirs = logs[leader]
    for b, entries in logs.items():
        if len(entries) > len(theirs):
            violations.append(f"{b}'s log ({len(entries)}) is longer than the leader's")
        for mine, lead in zip(entries, theirs, strict=False):
            if not mine.same_as(lead):
                violations.append(
                    f"{b}'s entry {mine.index} (term {mine.term}) differs from the leader "
                    f"{leader}'s (term {lead.term}): not a prefix"
                )
                break
    if len(theirs) < len(final):
        violations.append(f"the leader's log has {len(theirs)} entries, the queues {len(final)}")
    return violations


async def run(
    workdir: Path,
    faults: Sequence[str],
    *,
    seed: int | None = None,
    hold: float = 3.0,
    producers: int = 6,
    committed_torn: bool = False,
) -> tuple[Report, Harness]:
    """Start everything, run ``faults`` in order, check; always clean up."""
    harness = Harness(workdir, seed=seed, hold=hold, committed_torn=committed_torn)
    harness.workload.producers = producers
    try:
        async with trio.open_nursery() as nursery:
            await harness.start(nursery)
            await harness.workload_running(nursery)
            for fault in faults:
                await harness.run_fault(fault)
            report = await harness.finish()
            nursery.cancel_scope.cancel()
    finally:
        harness.cluster.close()
    return report, harness


# ---------------------------------------------------------------------------------------------
# packet delay without netem: an NFQUEUE reader that gives each packet its verdict late

NETLINK_NETFILTER = 12
_NFNL_SUBSYS_QUEUE = 3
_NFQNL_MSG_PACKET, _NFQNL_MSG_VERDICT, _NFQNL_MSG_CONFIG = 0, 1, 2
_NFQA_PACKET_HDR, _NFQA_VERDICT_HDR = 1, 2
_NFQA_CFG_CMD, _NFQA_CFG_PARAMS = 1, 2
_NFQNL_CFG_CMD_BIND = 1
_NFQNL_COPY_META = 1
_NF_ACCEPT = 1
_NLM_F_REQUEST = 1
_NLMSG_HDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid (host order)
_NFGENMSG = struct.Struct("!BBH")  # family, version, res_id (network order)
_NLA = struct.Struct("=HH")


def _nl_message(msg_type: int, queue: int, attrs: list[tuple[int, bytes]]) -> bytes:
    body = _NFGENMSG.pack(socket.AF_UNSPEC, 0, queue)
    for kind, payload in attrs:
        nla = _NLA.pack(_NLA.size + len(payload), kind) + payload
        body += nla + bytes(-len(nla) % 4)
    kind = (_NFNL_SUBSYS_QUEUE << 8) | msg_type
    return _NLMSG_HDR.pack(_NLMSG_HDR.size + len(body), kind, _NLM_F_REQUEST, 0, 0) + body


def _packet_ids(data: bytes) -> Iterator[int]:
    """The packet ids of the NFQNL_MSG_PACKET messages in one netlink read."""
    at = 0
    while at + _NLMSG_HDR.size <= len(data):
        length, kind, _, _, _ = _NLMSG_HDR.unpack_from(data, at)
        if length < _NLMSG_HDR.size:
            return
        if kind == (_NFNL_SUBSYS_QUEUE << 8) | _NFQNL_MSG_PACKET:
            a, end = at + _NLMSG_HDR.size + _NFGENMSG.size, at + length
            while a + _NLA.size <= end:
                nla_len, nla_type = _NLA.unpack_from(data, a)
                if nla_len < _NLA.size:
                    break
                if nla_type & 0x3FFF == _NFQA_PACKET_HDR:
                    yield struct.unpack_from("!I", data, a + _NLA.size)[0]
                a += (nla_len + 3) & ~3
        at += (length + 3) & ~3


def delay_packets(queue: int, delay_ms: float) -> None:
    """Accept every packet netfilter queues to NFQUEUE ``queue`` ``delay_ms`` after it came, in
    order (what ``tc netem delay`` does, from userspace): run inside the namespace whose
    iptables rules queue the packets (``-j NFQUEUE --queue-num Q --queue-bypass``: packets pass
    untouched while no reader is bound).  Runs until killed."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind((0, 0))
    cmd = struct.pack("!BBH", _NFQNL_CFG_CMD_BIND, 0, socket.AF_INET)
    params = struct.pack("!IB", 0, _NFQNL_COPY_META)
    sock.send(_nl_message(_NFQNL_MSG_CONFIG, queue, [(_NFQA_CFG_CMD, cmd)]))
    sock.send(_nl_message(_NFQNL_MSG_CONFIG, queue, [(_NFQA_CFG_PARAMS, params)]))
    print("bound", flush=True)
    held: collections.deque[tuple[float, int]] = collections.deque()
    delay = delay_ms / 1000
    while True:
        now = time.monotonic()
        while held and held[0][0] <= now:
            _, packet_id = held.popleft()
            verdict = struct.pack("!II", _NF_ACCEPT, packet_id)
            sock.send(_nl_message(_NFQNL_MSG_VERDICT, queue, [(_NFQA_VERDICT_HDR, verdict)]))
        sock.settimeout(max(0.0005, held[0][0] - now) if held else None)
        try:
            data = sock.recv(1 << 16)
        except TimeoutError:
            continue
        came = time.monotonic()
        held.extend((came + delay, packet_id) for packet_id in _packet_ids(data))


if __name__ == "__main__":  # python -m tests.dledger_faults delay QUEUE MS
    if sys.argv[1:2] == ["delay"] and len(sys.argv) == 4:
        delay_packets(int(sys.argv[2]), float(sys.argv[3]))
    else:
        sys.exit("usage: python -m tests.dledger_faults delay QUEUE MS")
