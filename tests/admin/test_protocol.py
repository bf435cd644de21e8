"""The channel's message shapes, without sockets."""

from __future__ import annotations

import json

import pytest

from pymq.admin import protocol
from pymq.admin.protocol import ProtocolError, Request, parse_request


def test_parse_a_request():
    request = parse_request('{"id": 3, "type": "topic.status", "params": {"topic": "T"}}')
    assert request == Request(3, "topic.status", {"topic": "T"})
    assert parse_request(b'{"type": "ping"}') == Request(None, "ping", {})
    assert parse_request('{"id": "a", "type": "ping", "params": null}').params == {}


@pytest.mark.parametrize(
    "text",
    [
        "",
        "nope",
        "[]",
        "3",
        '{"id": 1}',
        '{"id": 1, "type": ""}',
        '{"id": 1, "type": 5}',
        '{"id": true, "type": "ping"}',
        '{"id": [1], "type": "ping"}',
        '{"id": 1, "type": "ping", "params": [1]}',
        b"\xff\xfe",
    ],
)
def test_bad_requests_are_protocol_errors(text):
    with pytest.raises(ProtocolError) as info:
        parse_request(text)
    assert info.value.code == protocol.BAD_REQUEST and info.value.message


def test_typed_parameters():
    request = Request(1, "x", {"s": "v", "n": 5, "ns": "7", "b": True, "d": {"k": 1}, "z": ""})
    assert request.get_str("s") == "v"
    assert request.get_str("missing", None) is None
    assert request.get_str("z", "default") == "default"
    assert request.get_int("n") == 5 and request.get_int("ns") == 7
    assert request.get_bool("b") is True and request.get_bool("missing") is False
    assert request.get_dict("d") == {"k": 1}
    for getter, name in [
        (request.get_str, "n"),
        (request.get_str, "missing"),
        (request.get_int, "s"),
        (request.get_int, "b"),
        (request.get_int, "missing"),
        (request.get_bool, "s"),
        (request.get_dict, "s"),
    ]:
        with pytest.raises(ProtocolError) as info:
            getter(name)
        assert info.value.request_id == 1 and name in info.value.message


def test_replies_and_events():
    assert json.loads(protocol.response(1, {"a": 1})) == {
        "id": 1,
        "type": "response",
        "ok": True,
        "result": {"a": 1},
    }
    assert json.loads(protocol.error("x", "BAD_REQUEST", "why")) == {
        "id": "x",
        "type": "response",
        "ok": False,
        "error": {"code": "BAD_REQUEST", "message": "why"},
    }
    assert json.loads(protocol.event(4, "broker.status", [1])) == {
        "type": "event",
        "subscription": 4,
        "stream": "broker.status",
        "data": [1],
    }
