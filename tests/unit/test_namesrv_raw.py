"""The name server's route lookups answered from the raw frame (NamesrvProcessor.route_answer_raw)
give the very bytes the usual path (decode, typed header, inline handler, encode) gives, and
leave everything else to it."""

from __future__ import annotations

import json
import pathlib
import struct

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pymq.common.topic import TopicConfig
from pymq.namesrv.controller import NamesrvController
from pymq.remoting.channel import Channel
from pymq.remoting.client import RemotingClient
from pymq.remoting.codec import (
    RPC_TYPE_RESPONSE,
    RemotingCommand,
    decode_frame,
    encode,
)
from pymq.remoting.codes import RequestCode, ResponseCode
from pymq.remoting.errors import ProtocolError, RemotingCommandError
from tests.helpers import answers_of_one_write, make_namesrv
from tests.unit.test_routes import register, wrapper

_ABSENT = object()


@pytest.fixture(scope="module")
def namesrv(tmp_path_factory: pytest.TempPathFactory) -> NamesrvController:
    controller = make_namesrv(tmp_path_factory.mktemp("raw"))
    register(
        controller.routes,
        topics=wrapper(TopicConfig("Known", 8, 4, 6), TopicConfig("Ünïcode", 2, 2, 6), counter=1),
    )
    register(controller.routes, name="broker-b", addr="127.0.0.1:10921", cluster="Other")
    return controller


def usual_answer(controller: NamesrvController, frame: bytes) -> bytes | None:
    """What a connection writes for ``frame`` by the usual path (None: nothing, or it closes)."""
    try:
        request = decode_frame(frame)
    except ProtocolError:
        return None
    if request.header_error is not None:
        response = request.response(ResponseCode.SYSTEM_ERROR, request.header_error)
    elif request.code == RequestCode.GET_ROUTEINFO_BY_TOPIC:  # route_answers' decoded way
        try:  # as Channel.serve_inline answers what it raises
            response = controller.processor.get_route_info(None, request)  # type: ignore[arg-type]
        except RemotingCommandError as exc:
            response = request.response(ResponseCode.SYSTEM_ERROR, str(exc))
    else:
        response = None
    if response is None or request.flag & 2:  # oneway: no answer
        return None
    response.opaque = request.opaque
    response.flag |= RPC_TYPE_RESPONSE
    response.serialize_type = request.serialize_type
    return encode(response)


def frame_of(header: dict[str, object], body: bytes = b"", order: list[int] | None = None) -> bytes:
    items = list(header.items())
    if order is not None:
        items = [items[i % len(items)] for i in order] if items else items
        items = list(dict(items).items())
    text = json.dumps(dict(items), ensure_ascii=False, separators=(",", ":")).encode()
    return struct.pack(">i", len(text)) + text + body


def value(*choices: object) -> st.SearchStrategy[object]:
    return st.sampled_from(choices)


_FIELD_VALUES: dict[str, st.SearchStrategy[object]] = {
    "code": value(105, 105.0, "105", True, 104, None),
    "opaque": st.one_of(st.integers(-(2**33), 2**33), value(1.5, "7", None)),
    "flag": value(0, 1, 2, 3, 0.0, "0", None, False),
    "version": value(0, 399, 400, 401, 500, 2**31, -1, "401", None),
    "language": value("JAVA", "CPP", "", 5, None),
    "remark": value(None, "x", 5),
    "serializeTypeCurrentRPC": value("JSON", "ROCKETMQ"),
    "other": value(1, "x", [1]),
    "extFields": st.one_of(
        value(None, [], "topic"),
        st.fixed_dictionaries(
            {},
            optional={
                "topic": value("Known", "Ünïcode", "Missing", "", 5, None, True),
                "acceptStandardJsonOnly": value("true", "false", True),
                "extra": value("x", 1),
            },
        ),
    ),
}


@st.composite
def _headers(draw: st.DrawFn) -> dict[str, object]:
    """A plain lookup's header with a few of its fields changed, added or left out."""
    header: dict[str, object] = {
        "code": 105,
        "opaque": draw(st.integers(-(2**31), 2**31 - 1)),
        "flag": 0,
        "language": "JAVA",
        "version": draw(value(0, 317, 401, 433)),
        "extFields": {"topic": draw(value("Known", "Ünïcode"))},
        "serializeTypeCurrentRPC": "JSON",
    }
    for name in draw(st.lists(st.sampled_from(sorted(_FIELD_VALUES)), max_size=3)):
        if draw(st.booleans()):
            header[name] = draw(_FIELD_VALUES[name])
        else:
            header.pop(name, None)
    return header


@settings(
    max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    header=_headers(),
    body=value(b"", b"x"),
    order=st.one_of(st.none(), st.lists(st.integers(0, 20), max_size=10)),
)
def test_raw_answers_are_the_usual_answers(
    namesrv: NamesrvController, header: dict[str, object], body: bytes, order: list[int] | None
) -> None:
    frame = frame_of(header, body, order)
    raw = namesrv.processor.route_answer_raw(None, frame, 0, len(frame))
    if raw is not None:
        assert raw == usual_answer(namesrv, frame)
    numbers = [header.get(name, 0) for name in ("code", "flag", "opaque", "version")]
    plain = (
        order is None  # (an order may drop or repeat members)
        and not body
        and all(type(n) is int and -(2**31) <= n < 2**31 for n in numbers)  # type: ignore[operator]
        and header.get("code") == 105
        and header.get("flag", 0) == 0
        and header.get("language") == "JAVA"
        and header.get("remark") is None
        and "other" not in header
        and header.get("serializeTypeCurrentRPC", "JSON") == "JSON"
        and header.get("extFields") in ({"topic": "Known"}, {"topic": "Ünïcode"})
    )
    if plain:  # the plain lookup of a known topic is answered raw (a non-ASCII one too)
        assert raw is not None, header


def test_the_plain_lookups_are_answered_raw(namesrv: NamesrvController) -> None:
    """The lookups the clients send (Java's and pymq's own) do take the raw path, both route
    forms, and answer what the usual path does; an unknown topic takes the usual path."""
    for version in (0, 317, 401, 433):
        request = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Known"})
        request.version, request.opaque = version, 123456
        frame = encode(request)[4:]
        raw = namesrv.processor.route_answer_raw(None, frame, 0, len(frame))
        assert raw is not None and raw == usual_answer(namesrv, frame)
        # Inside a bigger buffer, as a connection's reads hold them.
        padded = b"junk" + frame + b"more"
        assert namesrv.processor.route_answer_raw(None, padded, 4, 4 + len(frame)) == raw
    java = (
        b'{"code":105,"extFields":{"topic":"Known"},"flag":0,"language":"JAVA",'
        b'"opaque":-5,"serializeTypeCurrentRPC":"JSON","version":401}'
    )
    frame = struct.pack(">i", len(java)) + java
    raw = namesrv.processor.route_answer_raw(None, frame, 0, len(frame))
    assert raw is not None and raw == usual_answer(namesrv, frame)
    missing = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Missing"})
    frame = encode(missing)[4:]
    assert namesrv.processor.route_answer_raw(None, frame, 0, len(frame)) is None
    assert b"No topic route info" in (usual_answer(namesrv, frame) or b"")
    # An order config asks for the usual path (the answer carries it).
    namesrv.namesrv_config.order_message_enable = True
    try:
        frame = encode(
            RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Known"})
        )[4:]
        assert namesrv.processor.route_answer_raw(None, frame, 0, len(frame)) is None
    finally:
        namesrv.namesrv_config.order_message_enable = False


async def test_a_running_name_server_answers_lookups_raw_and_usual(tmp_path: pathlib.Path) -> None:
    """Over connections: raw answers and usual ones (an unknown topic) each reach their caller,
    and on one connection the answers keep the requests' order (a frame behind one that waits
    for the usual path is not answered ahead of it, the run's leading lookups answered
    together)."""
    controller = make_namesrv(tmp_path)
    register(controller.routes, topics=wrapper(TopicConfig("Known", 8, 4, 6), counter=1))
    calls = 0
    raw_handler = controller.processor.route_answer_raw

    def counting(channel: Channel, buf: bytes, start: int, end: int) -> bytes | None:
        nonlocal calls
        answer = raw_handler(channel, buf, start, end)
        calls += answer is not None
        return answer

    # The run handler (route_answers) answers each lookup through route_answer_raw.
    controller.processor.route_answer_raw = counting  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        port = await nursery.start(controller.run)
        addr = f"127.0.0.1:{port}"
        client = RemotingClient(nursery)
        results: dict[int, RemotingCommand] = {}

        async def call(i: int) -> None:
            topic = "Known" if i % 3 else "Missing"
            request = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
            results[i] = await client.invoke(addr, request, 5)

        async with trio.open_nursery() as calls_nursery:
            for i in range(60):
                calls_nursery.start_soon(call, i)
        for i, reply in results.items():
            if i % 3:
                assert reply.code == ResponseCode.SUCCESS
                assert json.loads(reply.body)["queueDatas"][0]["readQueueNums"] == 8
            else:
                assert reply.code == ResponseCode.TOPIC_NOT_EXIST
        assert calls > 0
        client.close()

        # One write: known, unknown, known, known.  Answers in the requests' order.
        topics = ["Known", "Missing", "Known", "Known"]
        requests = [
            RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": t})
            for t in topics
        ]
        answers = await answers_of_one_write(port, requests)
        assert [a.opaque for a in answers] == [r.opaque for r in requests]
        assert [a.code for a in answers] == [0, ResponseCode.TOPIC_NOT_EXIST, 0, 0]
        nursery.cancel_scope.cancel()


def test_long_or_unnamed_headers_are_left_to_the_usual_path(namesrv: NamesrvController) -> None:
    """The raw path reads no header longer than a lookup's (the usual path bounds headers at
    1 MiB and refuses longer ones): not a lookup with a 2 MB remark, which the usual path
    refuses, nor 15 MB of JSON, which it must not parse; nor a header without the code."""
    from pymq.namesrv.processor import RAW_LOOKUP_HEADER_MAX

    base = {"code": 105, "opaque": 7, "flag": 0, "language": "JAVA", "version": 401}
    lookup = {**base, "extFields": {"topic": "Known"}}
    fits = frame_of({**lookup, "remark": "x" * (RAW_LOOKUP_HEADER_MAX - 200)})
    assert namesrv.processor.route_answer_raw(None, fits, 0, len(fits)) is not None
    long_remark = frame_of({**lookup, "remark": "x" * 2_000_000})
    assert namesrv.processor.route_answer_raw(None, long_remark, 0, len(long_remark)) is None
    assert usual_answer(namesrv, long_remark) is None  # refused: the connection closes
    hostile = b'{"x":[' + b"[]," * 5_000_000 + b'[]],"code":105}'
    frame = struct.pack(">i", len(hostile)) + hostile
    assert namesrv.processor.route_answer_raw(None, frame, 0, len(frame)) is None
    spaced = json.dumps(lookup).encode()  # '"code": 105': not named as the raw path looks
    frame = struct.pack(">i", len(spaced)) + spaced
    assert namesrv.processor.route_answer_raw(None, frame, 0, len(frame)) is None
    assert usual_answer(namesrv, frame) is not None


class Recorder:
    """A connection's side of a run handler: the answers it queues, in order."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def answer_frames(self, frames: list[bytes]) -> None:
        self.frames.extend(frames)

    def serve_inline(self, inline, request: RemotingCommand) -> bool:  # type: ignore[no-untyped-def]
        response = inline(self, request)
        response.opaque, response.flag = request.opaque, response.flag | RPC_TYPE_RESPONSE
        self.frames.append(encode(response))
        return True


def test_a_run_of_lookups_is_answered_as_each_one_is(namesrv: NamesrvController) -> None:
    """route_answers answers the lookups of a run in order: those route_answer_raw answers
    from their bytes exactly as it answers each (joined), one it leaves decoded as the usual
    path answers it; it stops at the first frame of another code, decoded."""
    topics = ["Known", "Ünïcode", "Known", "Missing", "Known"]
    frames = []
    for i, topic in enumerate(topics):
        request = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        request.opaque = 100 + i
        frames.append(encode(request))
    other = RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO)
    frames.append(encode(other))
    buf = b"".join(frames)
    bounds: list[int] = []
    pos = 0
    for frame in frames:
        bounds += [pos + 4, pos + len(frame)]
        pos += len(frame)
    one = namesrv.processor.route_answer_raw
    each = [one(None, buf, bounds[2 * i], bounds[2 * i + 1]) for i in range(len(topics))]
    assert each[3] is None and all(a is not None for a in each[:3])
    missing = usual_answer(namesrv, frames[3][4:])
    assert missing is not None and decode_frame(missing[4:]).code == ResponseCode.TOPIC_NOT_EXIST
    run = namesrv.processor.route_answers
    ch = Recorder()
    assert run(ch, buf, bounds, 0, 3) == (b"".join(each[:3]), 3, None)  # type: ignore[arg-type]
    assert ch.frames == []
    joined, left, cmd = run(ch, buf, bounds, 1, 6)  # type: ignore[arg-type]
    # Queued in order: the raw answers before the decoded one's, then the one after it.
    assert ch.frames == [b"".join(each[1:3]), missing]  # type: ignore[arg-type]
    assert (joined, left) == (each[4], 5)
    assert cmd is not None and cmd.code == RequestCode.GET_BROKER_CLUSTER_INFO
    # With an access check it serves nothing (it would skip it).
    assert run(ch, buf, bounds, 0, 5, lambda c, r: None) == (b"", 0, None)  # type: ignore[arg-type]


def test_frames_the_raw_path_must_leave(namesrv: NamesrvController) -> None:
    """A serialize type in the header length's top byte (ROCKETMQ, or a negative length),
    acceptStandardJsonOnly beside the topic: the usual path's; a lookup inside a bytearray at
    an offset is answered as at the start of bytes."""
    lookup = {"code": 105, "opaque": 3, "flag": 0, "language": "JAVA", "version": 401}
    frame = frame_of({**lookup, "extFields": {"topic": "Known"}})
    answer = namesrv.processor.route_answer_raw(None, frame, 0, len(frame))
    assert answer is not None and answer == usual_answer(namesrv, frame)
    for top in (1, 0x80):
        marked = bytes([top]) + frame[1:]
        assert namesrv.processor.route_answer_raw(None, marked, 0, len(marked)) is None
    both = frame_of(
        {
            **lookup,
            "version": 317,
            "extFields": {"topic": "Known", "acceptStandardJsonOnly": "true"},
        }
    )
    assert namesrv.processor.route_answer_raw(None, both, 0, len(both)) is None
    assert usual_answer(namesrv, both) is not None
    padded = bytearray(b"xyz" + frame + b"tail")
    assert namesrv.processor.route_answer_raw(None, padded, 3, 3 + len(frame)) == answer


async def test_a_checking_name_server_answers_no_lookup_raw(tmp_path: pathlib.Path) -> None:
    """With an access check (ACL) every request is checked: no raw answer, and no run of
    them, bypasses it."""
    controller = make_namesrv(tmp_path)
    register(controller.routes, topics=wrapper(TopicConfig("Known", 8, 4, 6), counter=1))

    def refuse(channel: Channel, request: RemotingCommand) -> RemotingCommand:
        return request.response(ResponseCode.NO_PERMISSION, "refused")

    controller.server.access_check = refuse
    async with trio.open_nursery() as nursery:
        port = await nursery.start(controller.run)
        requests = [
            RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Known"})
            for _ in range(3)
        ]
        answers = await answers_of_one_write(port, requests)
        assert [a.code for a in answers] == [ResponseCode.NO_PERMISSION] * 3
        nursery.cancel_scope.cancel()
