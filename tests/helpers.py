"""Helpers shared by the test modules: polling for a condition, and ports for child processes.

Test modules import from here (or use conftest fixtures), never from one another.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
import random
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import trio

from pymq.admin import cli
from pymq.namesrv.config import NamesrvConfig
from pymq.namesrv.controller import NamesrvController
from pymq.remoting.codec import FrameDecoder, RemotingCommand, encode
from pymq.remoting.config import NettyServerConfig
from pymq.store import mapped_file_queue
from pymq.store.mapped_file import MappedFile

T = TypeVar("T")


async def wait_until(
    predicate: Callable[[], T | Awaitable[T]],
    *,
    timeout: float = 10,
    interval: float = 0.05,
    what: str = "",
) -> T:
    """Call ``predicate`` (plain or async) every ``interval`` seconds until it returns a truthy
    value, and return that value; raise ``trio.TooSlowError`` naming ``what`` (or the predicate)
    after ``timeout`` seconds.

    The first call is immediate. A predicate that raises ends the wait with its exception.
    """
    try:
        with trio.fail_after(timeout):
            while True:
                result = predicate()
                if inspect.isawaitable(result):
                    result = await result
                if result:
                    return cast(T, result)
                await trio.sleep(interval)
    except trio.TooSlowError:
        name = what or getattr(predicate, "__qualname__", repr(predicate))
        raise trio.TooSlowError(f"{name} did not hold within {timeout} s") from None


# In-process servers bind port 0 and report the port the OS chose: use that wherever possible.
# A separate process (a CLI under test, a broker whose neighbour ports must be known up front),
# or a port that must be named in a config (grpcServerPort, where 0 means off), needs its port
# before the bind, so the helpers below pick one and check it binds. They pick it below the
# kernel's ephemeral range (ip_local_port_range), at random: a port the OS handed out for port 0
# could be taken, between the check and the bind, as the source port of any outgoing connection
# (one failed in CI: "Address already in use" for a gRPC port); below the range only another
# explicit pick can take it.

_PORT_FLOOR = 10_000
_PORTS = random.SystemRandom()  # not the random module's state, which tests may seed


def _ephemeral_floor() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port() -> int:
    """A loopback port below the ephemeral range that was free a moment ago."""
    top = max(_ephemeral_floor(), _PORT_FLOOR + 1_000)
    for _ in range(200):
        port = _PORTS.randrange(_PORT_FLOOR, top)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def free_broker_port() -> int:
    """A listenPort whose neighbours a broker also binds (VIP channel at -2, HA at +1) are free
    too: a lone free port can sit next to one a client connection holds. Same race as above."""
    for _ in range(100):
        port = free_port()
        socks = []
        try:
            for p in (port - 2, port, port + 1):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError("no free port block for a broker")


def make_namesrv(tmp_path, **server_overrides: object) -> NamesrvController:
    namesrv_config = NamesrvConfig(
        kv_config_path=str(tmp_path / "namesrv" / "kvConfig.json"),
        config_store_path=str(tmp_path / "namesrv" / "namesrv.properties"),
    )
    server_config = NettyServerConfig(listen_port=0, bind_address="127.0.0.1")
    for key, value in server_overrides.items():
        setattr(server_config, key, value)
    return NamesrvController(namesrv_config, server_config)


def damaged(buf: bytearray, where: int, value: int, truncate: bool) -> bytearray:
    """``buf`` zeroed from ``where`` on (a torn tail), or with the byte at ``where`` set."""
    if truncate:
        return buf[:where] + bytes(len(buf) - where)
    buf[where] = value
    return buf


def start_minute_window(stats: object, wall_ms: int) -> None:
    """Begin the broker stats' minute windows afresh with a snapshot at ``wall_ms`` (the
    broker's own 10 s snapshots may already have started them at any moment)."""
    for table in stats.items.values():  # type: ignore[attr-defined]
        for item in table.values():
            item.minute.clear()
    stats.snapshot("minute", wall_ms)  # type: ignore[attr-defined]


def end_minute_window(stats: object, wall_ms: int) -> None:
    """End the minute windows begun by :func:`start_minute_window` with a snapshot at ``wall_ms``,
    dropping the broker's own 10 s snapshots taken in between (at real times, they would
    stretch the window by however long the test took: a rate then depends on the machine)."""
    for table in stats.items.values():  # type: ignore[attr-defined]
        for item in table.values():
            while len(item.minute) > 1:
                item.minute.pop()
    stats.snapshot("minute", wall_ms)  # type: ignore[attr-defined]


def same_without_native(module: object, name: str, read: Callable[[], object]) -> object:
    """``read()`` with ``module.name`` (a C function) in use and with its Python twin in its
    place (``module.<name without its leading _>_py``, or None where the module falls back on
    None): asserts both give the same, and returns it."""
    with_c = read()
    saved = getattr(module, name)
    setattr(module, name, getattr(module, name.lstrip("_") + "_py", None))
    try:
        assert read() == with_c
    finally:
        setattr(module, name, saved)
    return with_c


def answer_command(answer: object) -> Any:
    """An inline handler's answer as a command: a whole answer frame (what the send path
    returns for a successful put, codec.json_response_frame) is decoded; a command or None
    is returned as it is."""
    from pymq.remoting.codec import decode_frame

    if isinstance(answer, bytes):
        return decode_frame(answer[4:])
    return answer


class StuckDisk:
    """MappedFile.sync that blocks its thread while ``stuck`` is set, or raises ``error``."""

    def __init__(self, monkeypatch) -> None:
        self.release = threading.Event()
        self.stuck = False
        self.error: OSError | None = None
        self.entered = 0
        real_sync = MappedFile.sync

        def sync(mf: MappedFile) -> None:
            self.entered += 1
            if self.error is not None:
                raise self.error
            if self.stuck:
                assert self.release.wait(30), "the test never released the disk"
            real_sync(mf)

        monkeypatch.setattr(MappedFile, "sync", sync)
        # The group commit's C thread calls fdatasync itself: the Python thread calls sync.
        monkeypatch.setattr(mapped_file_queue, "NATIVE_SYNC", False)


def smaps_entries(path: str) -> list[tuple[int, int, dict[str, str]]]:
    """This process's mappings of ``path`` (/proc/self/smaps): for each, the file range it
    maps and its fields (``Private_Dirty``, ``VmFlags``, ...) as the text after the colon."""
    real = os.path.realpath(path)
    entries: list[tuple[int, int, dict[str, str]]] = []
    current: dict[str, str] | None = None
    with open("/proc/self/smaps") as f:
        for line in f:
            # A mapping's header: its path is the sixth field and may hold spaces.
            fields = line.rstrip("\n").split(None, 5)
            if fields and "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:
                current = None
                if len(fields) >= 6 and fields[5] == real:
                    low, high = (int(x, 16) for x in fields[0].split("-"))
                    offset = int(fields[2], 16)
                    current = {}
                    entries.append((offset, offset + high - low, current))
            elif current is not None and ":" in line:
                name, _, value = line.partition(":")
                current[name] = value.strip()
    return entries


async def answers_of_one_write(port: int, requests: list[RemotingCommand]) -> list[RemotingCommand]:
    """The answers to ``requests`` written to 127.0.0.1:``port`` in one write, as they arrive
    (within 5 s)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    decoder = FrameDecoder()
    answers: list[RemotingCommand] = []
    async with stream:
        await stream.send_all(b"".join(encode(r) for r in requests))
        with trio.fail_after(5):
            while len(answers) < len(requests):
                answers += decoder.feed(await stream.receive_some(65536))
    return answers


class LoopSteps(trio.abc.Instrument):
    """What the event loop's own code holds the loop for: the CPU time of the loop's thread in
    each task step (``time.thread_time``), the longest kept in ``worst`` (seconds) with its
    task's name in ``worst_task``; ``steps`` counts them.

    Use as a context manager around hostile traffic served by an in-process server (the test's
    loop is the server's). Unlike a probe's round trip this is not wall-clock time: the
    machine's other load, a descheduled thread or another thread holding the GIL add nothing,
    so a bound on it fails only when a step does too much work.
    """

    def __init__(self) -> None:
        self.worst = 0.0
        self.worst_task = ""
        self.steps = 0
        self._started = 0.0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._started = time.thread_time()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        spent = time.thread_time() - self._started
        self.steps += 1
        if spent > self.worst:
            self.worst = spent
            self.worst_task = task.name

    def __enter__(self) -> LoopSteps:
        self._started = time.thread_time()  # the step this is entered in counts from here
        trio.lowlevel.add_instrument(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        trio.lowlevel.remove_instrument(self)

    def __repr__(self) -> str:
        return f"longest step {self.worst * 1000:.1f} ms CPU ({self.worst_task}) of {self.steps}"


class StallProbe:
    """An attacker's view of event-loop stalls: a thread that keeps one connection to a server
    and sends a cheap request (``code``, GET_BROKER_RUNTIME_INFO by default; a refusal is an
    answer too) every ``interval`` seconds, recording each round trip.

    Use as an async context manager around the hostile traffic; ``worst`` is the longest round
    trip seen (seconds), ``count`` the answers received. A request with no answer within
    ``timeout`` counts as a round trip of ``timeout``.  The probe runs in its own thread with a
    blocking socket, so it measures the server's loop, not the test's.
    """

    def __init__(
        self, port: int, *, code: int = 28, interval: float = 0.005, timeout: float = 10.0
    ) -> None:
        self.port = port
        self.code = code
        self.interval = interval
        self.timeout = timeout
        self.round_trips: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-probe", daemon=True)
        self.error: BaseException | None = None

    @property
    def worst(self) -> float:
        return max(self.round_trips, default=0.0)

    @property
    def count(self) -> int:
        return len(self.round_trips)

    async def __aenter__(self) -> StallProbe:
        self._thread.start()
        # The first answer proves the probe is connected before the hostile traffic starts (the
        # wait sleeps in Trio, so an in-process server can answer it).
        with trio.fail_after(self.timeout):
            while not self.round_trips and self.error is None:
                await trio.sleep(0.005)
        if self.error is not None:
            raise self.error
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._stop.set()
        await trio.to_thread.run_sync(self._thread.join, self.timeout + 1)

    def _run(self) -> None:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=self.timeout) as sock:
                decoder = FrameDecoder()
                while not self._stop.is_set():
                    request = RemotingCommand.request(self.code)
                    started = time.monotonic()
                    sock.sendall(encode(request))
                    answers: list[RemotingCommand] = []
                    try:
                        while not answers:
                            data = sock.recv(65536)
                            if not data:
                                raise ConnectionError("the server closed the probe's connection")
                            answers = decoder.feed(data)
                    except TimeoutError:
                        self.round_trips.append(self.timeout)
                        return
                    self.round_trips.append(time.monotonic() - started)
                    self._stop.wait(self.interval)
        except BaseException as exc:  # reported by __enter__ or read by the test
            self.error = exc


C_MODULES = (
    "pymq.common._recordc",
    "pymq.remoting._codecc",
    "pymq.broker._sendc",
    "pymq.store._commitlogc",
    "pymq.store._dispatchc",
    "pymq.client._producerc",
    "pymq.export._columnsc",
)
"""pymq's C modules, each beside the Python module it speeds up."""


def send_tier_functions() -> Any:
    """The send tier's frame readers and answer writers as pymq picked them: the C modules',
    or with PYMQ_PURE_PYTHON=1 their Python twins (the tests that use them run in both)."""
    import types

    from pymq.broker.processors import send
    from pymq.remoting import codec

    return types.SimpleNamespace(
        send_fields=codec.send_fields,
        send_run_fields=codec.send_run_fields,
        send_answer_fields=codec.send_answer_fields,
        send_answer_frame=send.send_answer_frame,
        send_answer_run=send._send_answer_run,
    )


def c_functions(direct: bool = False) -> Any:
    """Every function of pymq's C modules in one namespace, for tests that call them directly;
    None when any of them was not built or (unless ``direct``: a test of a C function against
    its twin, which runs under PYMQ_PURE_PYTHON=1 too) when PYMQ_PURE_PYTHON is set."""
    import importlib
    import types

    from pymq.common.native import load_native

    merged: dict[str, Any] = {}
    for name in C_MODULES:
        try:
            module = importlib.import_module(name) if direct else load_native(name)
        except ImportError:
            module = None
        if module is None:
            return None
        merged.update({k: v for k, v in vars(module).items() if not k.startswith("__")})
    return types.SimpleNamespace(**merged)


def implementations(module: str, name: str, twin: Any) -> list[Any]:
    """pytest params of the C function ``module.name`` (when built and not turned off by
    PYMQ_PURE_PYTHON=1) and of its Python twin, for a test run once against each."""
    import pytest

    from pymq.common.native import load_native

    c = load_native(module)
    params = [pytest.param(twin, id="twin")]
    return params if c is None else [pytest.param(getattr(c, name), id="c"), *params]


def mangled(draw: Any, data: bytes, alphabet: bytes | None = None) -> bytes:
    """``data`` with one to three bytes changed, cut out or slipped in (hypothesis: ``draw`` is
    a composite strategy's draw or a DataObject's), the new bytes from ``alphabet`` (None:
    any byte)."""
    from hypothesis import strategies as st

    draw = getattr(draw, "draw", draw)
    out = bytearray(data)
    byte = st.sampled_from(list(alphabet)) if alphabet else st.integers(0, 255)
    for _ in range(draw(st.integers(1, 3))):
        if not out:
            break
        at = draw(st.integers(0, len(out) - 1))
        action = draw(st.sampled_from(["set", "cut", "insert"]))
        if action == "cut":
            del out[at]
        else:
            out[at : at + (action == "set")] = bytes([draw(byte)])
    return bytes(out)


async def pymq_admin(*args: str) -> tuple[int, str, str]:
    """``pymq-admin ARGS`` run in this process (``main`` without its own event loop: parse,
    ``run``, ``report``): its exit status, output and errors.  A process start per command
    cost a second or two each; tests/admin/test_cli.py runs the command as a process too."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            parsed = cli.build_parser().parse_args(args)
    except SystemExit as exc:  # argparse's own refusal (status 2) or --help (0)
        return int(exc.code or 0), out.getvalue(), err.getvalue()
    code = cli.report(parsed, await cli.run(parsed), out, err)
    return code, out.getvalue(), err.getvalue()
