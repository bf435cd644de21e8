"""The console's 5.x clients view in headless Chromium (issue #40): the gRPC clients connected
to ``python -m pymq`` and the messages their POP consumers hold in flight."""

from __future__ import annotations

import time

import pytest
from rocketmq.v5.client import ClientConfiguration, Credentials
from rocketmq.v5.consumer import SimpleConsumer
from rocketmq.v5.model import FilterExpression, Message
from rocketmq.v5.producer import Producer

from tests.admin.test_console import ARTIFACTS, Server, console_page, run_cli
from tests.helpers import free_port


@pytest.mark.slow
def test_console_grpc_view(tmp_path) -> None:
    from playwright.sync_api import expect

    port = free_port()
    server = Server(tmp_path / "data", "--grpc-port", str(port))
    consumer = None
    try:
        run_cli("pymq.admin", "updateTopic", "-b", server.broker, "-t", "Grpc5", "-w", "1")
        config = ClientConfiguration(f"127.0.0.1:{port}", Credentials())
        producer = Producer(config, ("Grpc5",))
        producer.startup()
        try:
            message = Message()
            message.topic = "Grpc5"
            message.body = b"held"
            producer.send(message)
        finally:
            producer.shutdown()
        consumer = SimpleConsumer(config, "GConsole", {"Grpc5": FilterExpression()}, 1)
        consumer.startup()
        got: list = []
        deadline = time.monotonic() + 60  # a loaded machine: each receive long-polls
        while not got and time.monotonic() < deadline:
            got = consumer.receive(1, 120)  # received, not acked: in flight for 2 minutes
        assert got
        with console_page(server.console) as (page, errors):
            page.get_by_role("button", name="5.x clients").click()
            clients = page.get_by_test_id("grpc-clients")
            expect(clients).to_contain_text("SIMPLE_CONSUMER", timeout=10_000)
            expect(clients).to_contain_text("GConsole")
            expect(clients).to_contain_text("PYTHON")
            inflight = page.get_by_test_id("grpc-inflight")
            expect(inflight).to_contain_text("GConsole", timeout=10_000)
            expect(inflight).to_contain_text("Grpc5")
            page.screenshot(path=str(ARTIFACTS / "grpc.png"), full_page=True)
            assert errors == []
    finally:
        if consumer is not None:
            consumer.shutdown()
        server.stop()
