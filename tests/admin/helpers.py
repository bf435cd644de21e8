"""Helpers for the admin tests: a client of the admin channel, and the channel's URL."""

from __future__ import annotations

import itertools
import json
from typing import Any

import trio
from trio_websocket import WebSocketConnection

from pymq.embedded import Cluster


class AdminClient:
    """A test client of the admin channel: requests with ids, events collected by stream."""

    def __init__(self, ws: WebSocketConnection) -> None:
        self.ws = ws
        self._ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []

    async def raw(self, text: str) -> dict[str, Any]:
        await self.ws.send_message(text)
        return await self.next_response()

    async def next_response(self) -> dict[str, Any]:
        with trio.fail_after(10):
            while True:
                message = json.loads(await self.ws.get_message())
                if message["type"] == "event":
                    self.events.append(message)
                else:
                    return message

    async def request(self, kind: str, **params: Any) -> dict[str, Any]:
        request_id = next(self._ids)
        await self.ws.send_message(json.dumps({"id": request_id, "type": kind, "params": params}))
        reply = await self.next_response()
        assert reply["id"] == request_id
        return reply

    async def call(self, kind: str, **params: Any) -> Any:
        reply = await self.request(kind, **params)
        assert reply["ok"], reply
        return reply["result"]

    async def next_event(self, subscription: object, timeout: float = 5) -> dict[str, Any]:
        with trio.fail_after(timeout):
            while True:
                for i, event in enumerate(self.events):
                    if event["subscription"] == subscription:
                        return self.events.pop(i)["data"]
                message = json.loads(await self.ws.get_message())
                assert message["type"] == "event", message
                self.events.append(message)


def ws_url(cluster: Cluster, token: str | None = None) -> str:
    channel = cluster.admin_channel
    assert channel is not None
    url = f"ws://127.0.0.1:{channel.port}/ws"
    return url if token is None else f"{url}?token={token}"
