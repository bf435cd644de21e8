"""The admin channel's JSON messages, sans-IO: parse a request, format a reply, an error, an event.

Every client message is one JSON object ``{"id": ..., "type": "...", "params": {...}}``; the
server answers each with ``{"id", "type": "response", "ok": true, "result"}`` or
``{"id", "type": "response", "ok": false, "error": {"code", "message"}}`` and pushes subscription
updates as ``{"type": "event", "subscription", "stream", "data"}``.  docs/admin-protocol.md has
the whole catalogue.  Nothing here touches a socket.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

# Error codes of the channel itself; failed operations use RocketMQ response-code names.
BAD_REQUEST = "BAD_REQUEST"
UNAUTHORIZED = "UNAUTHORIZED"
UNKNOWN_TYPE = "UNKNOWN_TYPE"
INTERNAL_ERROR = "INTERNAL_ERROR"

_MISSING: Any = object()


class ProtocolError(Exception):
    """A message the channel refuses; answered with ``code`` and ``message``, never a close."""

    def __init__(self, code: str, message: str, request_id: object = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


@attrs.frozen
class Request:
    id: object
    type: str
    params: dict[str, Any]

    def get_str(self, name: str, default: Any = _MISSING) -> Any:
        value = self.params.get(name)
        if value is None or value == "":
            if default is _MISSING:
                raise ProtocolError(BAD_REQUEST, f"params.{name} is required", self.id)
            return default
        if not isinstance(value, str):
            raise ProtocolError(BAD_REQUEST, f"params.{name} must be a string", self.id)
        return value

    def get_int(self, name: str, default: Any = _MISSING) -> Any:
        value = self.params.get(name)
        if value is None:
            if default is _MISSING:
                raise ProtocolError(BAD_REQUEST, f"params.{name} is required", self.id)
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, str) and value.strip().lstrip("-").isdigit():
                return int(value)
            raise ProtocolError(BAD_REQUEST, f"params.{name} must be an integer", self.id)
        return value

    def get_bool(self, name: str, default: bool = False) -> bool:
        value = self.params.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ProtocolError(BAD_REQUEST, f"params.{name} must be true or false", self.id)
        return value

    def get_dict(self, name: str) -> dict[str, Any]:
        value = self.params.get(name)
        if not isinstance(value, dict):
            raise ProtocolError(BAD_REQUEST, f"params.{name} must be an object", self.id)
        return value


def parse_request(message: str | bytes) -> Request:
    """The request in one websocket message; ProtocolError(BAD_REQUEST) when it is not one."""
    try:
        data = json.loads(message)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(BAD_REQUEST, f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProtocolError(BAD_REQUEST, "a message must be a JSON object")
    request_id = data.get("id")
    if request_id is not None and (
        isinstance(request_id, bool) or not isinstance(request_id, int | str)
    ):
        raise ProtocolError(BAD_REQUEST, "id must be a number or a string")
    kind = data.get("type")
    if not isinstance(kind, str) or not kind:
        raise ProtocolError(BAD_REQUEST, "type must be a non-empty string", request_id)
    params = data.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ProtocolError(BAD_REQUEST, "params must be an object", request_id)
    return Request(request_id, kind, params)


def _dumps(message: dict[str, Any]) -> str:
    return json.dumps(message, separators=(",", ":"), default=str)


def response(request_id: object, result: Any) -> str:
    return _dumps({"id": request_id, "type": "response", "ok": True, "result": result})


def error(request_id: object, code: str, message: str) -> str:
    return _dumps(
        {
            "id": request_id,
            "type": "response",
            "ok": False,
            "error": {"code": code, "message": message},
        }
    )


def event(subscription: object, stream: str, data: Any) -> str:
    return _dumps({"type": "event", "subscription": subscription, "stream": stream, "data": data})
