"""The admin channel locked down: Host and Origin, the wrong-token throttle, deadlines, caps.

Most tests run one AdminChannel over a stand-in broker (the token is configured, so nothing but
``broker_config`` is touched) on trio's autojump clock: deadlines and lockouts are asserted in
the clock's time, with no real sleeps.  The last ones run a whole cluster, to check the keys are
broker config keys.
"""

from __future__ import annotations

import contextlib
import json
import logging
import struct
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, open_websocket_url

from pymq.admin.auth import AuthThrottle
from pymq.admin.channel import AdminChannel
from pymq.broker.config import BrokerConfig
from pymq.common.config import ConfigError, set_key
from pymq.embedded import ADMIN_ANY_PORT, open_cluster
from pymq.testing import TEST_PROPERTIES

TOKEN = "the-right-token-0123456789"
# The default adminAuthTimeoutMillis, in seconds: these tests assume the documented defaults.
AUTH_TIMEOUT = 5.0
WS_KEY = b"dGhlIHNhbXBsZSBub25jZQ=="


def make_channel(tmp_path: Any, **keys: str) -> AdminChannel:
    config = BrokerConfig(admin_token=TOKEN, broker_name="broker-h")
    for key, value in keys.items():
        set_key(config, key, value)
    broker = SimpleNamespace(broker_config=config, store_config=SimpleNamespace(config_dir=""))
    return AdminChannel(broker, port=0, host="127.0.0.1")  # type: ignore[arg-type]


@pytest.fixture
async def channel(tmp_path: Any) -> AsyncIterator[Any]:
    # Tests using it also ask for autojump_clock: pytest-trio takes the clock from the test's own
    # arguments only.
    async with trio.open_nursery() as nursery:
        ch = make_channel(tmp_path)
        await nursery.start(ch.run)
        yield ch
        nursery.cancel_scope.cancel()


def url(ch: AdminChannel, token: str | None = None) -> str:
    base = f"ws://127.0.0.1:{ch.port}/ws"
    return base if token is None else f"{base}?token={token}"


def upgrade_request(
    ch: AdminChannel, *, host: str | None = None, origin: str | None = None
) -> bytes:
    lines = [
        "GET /ws HTTP/1.1",
        f"Host: {f'127.0.0.1:{ch.port}' if host is None else host}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {WS_KEY.decode()}",
        "Sec-WebSocket-Version: 13",
    ]
    if origin is not None:
        lines.append(f"Origin: {origin}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def read_until_closed(stream: trio.SocketStream) -> bytes:
    data = b""
    with trio.fail_after(60):
        while True:
            try:
                chunk = await stream.receive_some()
            except trio.BrokenResourceError:
                break
            if not chunk:
                break
            data += chunk
    return data


async def exchange(ch: AdminChannel, request: bytes) -> bytes:
    """Send a raw request; everything the server answers until it closes."""
    stream = await trio.open_tcp_stream("127.0.0.1", ch.port)
    async with stream:
        await stream.send_all(request)
        return await read_until_closed(stream)


async def status_of(ch: AdminChannel, request: bytes) -> int:
    stream = await trio.open_tcp_stream("127.0.0.1", ch.port)
    async with stream:
        await stream.send_all(request)
        data = b""
        with trio.fail_after(30):
            while b"\r\n\r\n" not in data:
                chunk = await stream.receive_some()
                assert chunk, data
                data += chunk
    return int(data.split(b" ", 2)[1])


async def auth(ws: Any, token: str) -> dict[str, Any]:
    await ws.send_message(json.dumps({"id": 1, "type": "auth", "params": {"token": token}}))
    return json.loads(await ws.get_message())


# -- Host and Origin ----------------------------------------------------------------------------


async def test_a_foreign_origin_is_refused_before_the_upgrade(channel, caplog, autojump_clock):
    caplog.set_level(logging.WARNING, "pymq.admin.channel")
    for _ in range(3):
        assert (
            await status_of(channel, upgrade_request(channel, origin="http://evil.example")) == 403
        )
    for origin in ("null", "http://127.0.0.1:1", f"ftp://127.0.0.1:{channel.port}", "x"):
        assert await status_of(channel, upgrade_request(channel, origin=origin)) == 403
    refused = [r for r in caplog.records if "evil.example" in r.getMessage()]
    assert len(refused) == 1  # logged once, not once per attempt


async def test_the_consoles_own_origin_and_no_origin_are_accepted(channel, autojump_clock):
    port = channel.port
    for host, origin in [
        (f"127.0.0.1:{port}", None),
        (f"127.0.0.1:{port}", f"http://127.0.0.1:{port}"),
        (f"localhost:{port}", f"http://localhost:{port}"),
        (f"[::1]:{port}", f"http://[::1]:{port}"),
        (f"127.0.0.1:{port}", f"http://localhost:{port}"),  # one console, two of its names
        (f"LOCALHOST:{port}", f"HTTP://LocalHost:{port}/"),
    ]:
        assert await status_of(channel, upgrade_request(channel, host=host, origin=origin)) == 101


async def test_a_host_that_is_not_this_console_is_refused(channel, autojump_clock):
    port = channel.port
    for host in [
        f"evil.example:{port}",  # DNS rebinding: evil.example resolved to 127.0.0.1
        "evil.example",
        f"localhost:{port + 1}",
        "localhost",
        f"10.1.2.3:{port}",
        f"127.0.0.1:{port}@evil.example",
        "",
    ]:
        assert await status_of(channel, upgrade_request(channel, host=host)) == 403, host
    # The static console is guarded the same way.
    page = f"GET / HTTP/1.1\r\nHost: evil.example:{port}\r\n\r\n".encode()
    assert await status_of(channel, page) == 403
    page = f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: http://evil.example\r\n\r\n"
    assert await status_of(channel, page.encode()) == 403
    page = f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    assert await status_of(channel, page) == 200
    # Host twice is not guessed at.
    twice = f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nHost: evil.example\r\n\r\n".encode()
    assert await status_of(channel, twice) == 400


async def test_the_websocket_client_without_origin_still_works(channel, autojump_clock):
    async with open_websocket_url(url(channel)) as ws:
        assert (await auth(ws, TOKEN))["ok"]


# -- the throttle -------------------------------------------------------------------------------


async def test_many_wrong_url_tokens_are_not_followed_by_instant_success(channel, autojump_clock):
    for i in range(500):
        with pytest.raises(ConnectionRejected) as info:
            async with open_websocket_url(url(channel, f"guess-{i}")):
                pass
        assert info.value.status_code in (403, 429)
    # Right after, even the right token is refused: the address is locked out.
    with pytest.raises(ConnectionRejected) as info:
        async with open_websocket_url(url(channel, TOKEN)):
            pass
    assert info.value.status_code == 429
    assert any(name.lower() == b"retry-after" for name, _ in info.value.headers)
    # Once the lockout has passed, the right token is accepted (and the address forgotten).
    await trio.sleep(60)
    async with open_websocket_url(url(channel, TOKEN)) as ws:
        await ws.send_message(json.dumps({"id": 2, "type": "ping"}))
        assert json.loads(await ws.get_message())["ok"]
    assert len(channel.throttle) == 0


async def test_wrong_tokens_in_messages_lock_the_address_out(channel, autojump_clock):
    # Five wrong tokens (the default adminAuthFailuresBeforeDelay) over two connections...
    for tries in (3, 2):
        async with open_websocket_url(url(channel)) as ws:
            for _ in range(tries):
                assert not (await auth(ws, "guess"))["ok"]
    async with open_websocket_url(url(channel)) as ws:
        reply = await auth(ws, TOKEN)  # ...and the right one right after is refused unchecked
        assert not reply["ok"] and "retry in" in reply["error"]["message"]
        await trio.sleep(1)  # the first lockout is adminAuthDelayMillis (1 s)
        assert (await auth(ws, TOKEN))["ok"]


async def test_a_typo_or_two_costs_nothing(channel, autojump_clock):
    async with open_websocket_url(url(channel)) as ws:
        assert not (await auth(ws, "typo"))["ok"]
        assert (await auth(ws, TOKEN))["ok"]


def test_throttle_delays_double_up_to_the_maximum_and_memory_is_bounded():
    now = [100.0]
    throttle = AuthThrottle(
        failures_before_delay=2,
        base_delay=1.0,
        max_delay=8.0,
        max_addresses=3,
        clock=lambda: now[0],
    )
    assert [throttle.failed("a") for _ in range(7)] == [0, 1, 2, 4, 8, 8, 8]
    assert throttle.retry_after("a") == 8.0
    assert throttle.retry_after("b") == 0.0
    now[0] += 8.0
    assert throttle.retry_after("a") == 0.0
    assert throttle.failed("a") == 8.0  # the count is kept: the next wrong token locks again
    for _ in range(10_000):
        throttle.failed("a")  # no overflow however many
    for address in ("b", "c", "d", "e"):
        throttle.failed(address)
    assert len(throttle) == 3 and throttle.retry_after("a") == 0.0  # the oldest is forgotten
    throttle.succeeded("e")
    assert len(throttle) == 2


# -- deadlines ----------------------------------------------------------------------------------


async def test_half_an_http_request_is_closed_at_the_deadline(channel, autojump_clock):
    stream = await trio.open_tcp_stream("127.0.0.1", channel.port)
    async with stream:
        start = trio.current_time()
        await stream.send_all(b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the rest
        assert await read_until_closed(stream) == b""
        elapsed = trio.current_time() - start
    assert AUTH_TIMEOUT <= elapsed < AUTH_TIMEOUT + 1


async def test_a_slow_drip_of_header_bytes_is_closed_at_the_deadline(channel, autojump_clock):
    stream = await trio.open_tcp_stream("127.0.0.1", channel.port)
    start = trio.current_time()

    async def drip() -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(b"GET / HTTP/1.1\r\n")
            while True:
                await trio.sleep(0.5)
                await stream.send_all(b"X-A: b\r\n")

    async with stream, trio.open_nursery() as nursery:
        nursery.start_soon(drip)
        assert await read_until_closed(stream) == b""
        elapsed = trio.current_time() - start
        nursery.cancel_scope.cancel()
    assert AUTH_TIMEOUT <= elapsed < AUTH_TIMEOUT + 1


async def test_an_unauthenticated_websocket_is_closed_at_the_deadline(channel, autojump_clock):
    async with open_websocket_url(url(channel)) as ws:
        start = trio.current_time()
        with pytest.raises(ConnectionClosed) as info, trio.fail_after(60):
            await ws.get_message()
        assert info.value.reason.code == 1008
        assert AUTH_TIMEOUT - 1 <= trio.current_time() - start <= AUTH_TIMEOUT + 1


async def test_an_authenticated_websocket_outlives_the_deadline(channel, autojump_clock):
    async with open_websocket_url(url(channel)) as ws:
        assert (await auth(ws, TOKEN))["ok"]
        await trio.sleep(AUTH_TIMEOUT * 4)
        await ws.send_message(json.dumps({"id": 2, "type": "ping"}))
        assert json.loads(await ws.get_message())["ok"]


async def test_a_frame_header_claiming_exabytes_is_closed_at_the_deadline(channel, autojump_clock):
    stream = await trio.open_tcp_stream("127.0.0.1", channel.port)
    async with stream:
        await stream.send_all(upgrade_request(channel))
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += await stream.receive_some()
        assert reply.startswith(b"HTTP/1.1 101")
        start = trio.current_time()
        # A masked text frame claiming 4 EiB, then nothing.
        await stream.send_all(b"\x81\xff" + struct.pack(">Q", 4 << 60) + b"mask" + b"{")
        rest = await read_until_closed(stream)
        elapsed = trio.current_time() - start
    assert AUTH_TIMEOUT - 1 <= elapsed < AUTH_TIMEOUT + 5  # + the close handshake's wait
    assert rest.startswith(b"\x88")  # a close frame first
    assert struct.unpack(">H", rest[2:4])[0] == 1008


async def test_a_message_over_the_maximum_closes_the_socket(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        ch = make_channel(tmp_path, adminMaxMessageBytes="1000")
        await nursery.start(ch.run)
        async with open_websocket_url(url(ch, TOKEN)) as ws:
            await ws.send_message("x" * 2000)
            with pytest.raises(ConnectionClosed) as info:
                await ws.get_message()
            assert info.value.reason.code == 1009
        nursery.cancel_scope.cancel()


# -- caps ---------------------------------------------------------------------------------------


async def test_unauthenticated_connections_are_capped(channel, autojump_clock):
    port = channel.port
    page = f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    idle = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(16)]  # the default cap
    await trio.sleep(0.1)
    assert (await exchange(channel, page)).startswith(b"HTTP/1.1 503")
    with pytest.raises(ConnectionRejected) as info:
        async with open_websocket_url(url(channel, TOKEN)):
            pass
    assert info.value.status_code == 503
    assert channel.unauthenticated == 16
    for stream in idle:
        await stream.aclose()
    await trio.sleep(0.1)
    assert channel.connections == 0 and channel.unauthenticated == 0
    assert (await exchange(channel, page)).startswith(b"HTTP/1.1 200")


async def test_authenticated_sockets_do_not_count_as_unauthenticated(tmp_path, autojump_clock):
    async with trio.open_nursery() as nursery:
        ch = make_channel(tmp_path, adminMaxUnauthenticatedConnections="2", adminMaxConnections="4")
        await nursery.start(ch.run)
        page = f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{ch.port}\r\n\r\n".encode()
        async with (
            open_websocket_url(url(ch, TOKEN)),
            open_websocket_url(url(ch, TOKEN)),
            open_websocket_url(url(ch, TOKEN)),
        ):
            assert (ch.connections, ch.unauthenticated) == (3, 0)
            assert (await exchange(ch, page)).startswith(b"HTTP/1.1 200")
            async with open_websocket_url(url(ch)):
                # The total cap (4) is reached.
                assert (await exchange(ch, page)).startswith(b"HTTP/1.1 503")
        nursery.cancel_scope.cancel()


# -- one connection's failure stays with it -----------------------------------------------------


async def test_a_failure_while_serving_closes_that_connection_only(
    channel, monkeypatch, caplog, autojump_clock
):
    async def broken(*args: object) -> None:
        raise RuntimeError("boom")

    page = f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{channel.port}\r\n\r\n".encode()
    monkeypatch.setattr(channel, "_serve_static", broken)
    assert await exchange(channel, page) == b""
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
        "admin connection failed"
    ]
    monkeypatch.undo()
    assert (await exchange(channel, page)).startswith(b"HTTP/1.1 200")
    assert channel.connections == 0 and channel.unauthenticated == 0


# -- config keys --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("adminAuthTimeoutMillis", "0", "must be > 0"),
        ("adminMaxConnections", "-1", "must be > 0"),
        ("adminAuthFailuresBeforeDelay", "0", "must be > 0"),
        ("adminAllowedOrigins", "evil.example", "is not an origin"),
        ("adminAllowedOrigins", "http://a.example/path", "is not an origin"),
        ("adminAllowedHosts", "a.example:http", "is not a host"),
    ],
)
def test_bad_limits_are_refused_at_start(tmp_path, key, value, why):
    with pytest.raises(ConfigError, match=f"{key}.*{why}"):
        make_channel(tmp_path, **{key: value})


async def test_the_limits_are_broker_config_keys(tmp_path):
    properties = dict(TEST_PROPERTIES)
    properties.update(
        adminAllowedHosts="console.example.net, proxy.example.net:8443",
        adminAllowedOrigins="https://console.example.net",
        adminAuthFailuresBeforeDelay="1",
        adminAuthDelayMillis="600000",
    )
    async with open_cluster(
        str(tmp_path),
        namesrv_port=0,
        broker_port=0,
        bind_address="127.0.0.1",
        properties=properties,
        admin_port=ADMIN_ANY_PORT,
    ) as cluster:
        ch = cluster.admin_channel
        assert ch is not None
        assert await status_of(ch, upgrade_request(ch, host="console.example.net")) == 101
        assert await status_of(ch, upgrade_request(ch, host="proxy.example.net:8443")) == 101
        assert await status_of(ch, upgrade_request(ch, host="proxy.example.net:80")) == 403
        ok = upgrade_request(ch, host="console.example.net", origin="https://console.example.net")
        assert await status_of(ch, ok) == 101
        evil = upgrade_request(ch, origin="https://evil.example.net")
        assert await status_of(ch, evil) == 403
        with pytest.raises(ConnectionRejected) as info:
            async with open_websocket_url(url(ch, "wrong")):
                pass
        assert info.value.status_code == 403
        with pytest.raises(ConnectionRejected) as info:  # locked out for 10 minutes
            async with open_websocket_url(url(ch, ch.token)):
                pass
        assert info.value.status_code == 429
