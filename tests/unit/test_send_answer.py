"""The client's raw answer path: ``_recordc.send_answer_fields`` reads a send's plain
successful answer from its frame, and whatever it reads the usual path (decode_frame, then
SendMessageResponseHeader.from_ext) reads the same; every other frame it leaves to the usual
path."""

from __future__ import annotations

import gc
import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pymq.remoting.codec import (
    RPC_ONEWAY,
    RPC_TYPE_RESPONSE,
    RemotingCommand,
    decode_frame,
    encode,
)
from pymq.remoting.errors import ProtocolError
from pymq.remoting.headers import HeaderError, SendMessageResponseHeader
from tests.helpers import send_tier_functions

native_extension = send_tier_functions()


# What the Java 4.9.4 broker answered to a signed SEND_MESSAGE_V2 (java-wire-samples/
# ACL-SEND_MESSAGE_V2-310-signed-normal-ok.response-header.json).
JAVA_ANSWER = (
    '{"code":0,"extFields":{"queueId":"1","TRACE_ON":"true","MSG_REGION":"DefaultRegion",'
    '"msgId":"7F0000010000C30100000000000001AA","queueOffset":"0"},"flag":1,"language":"JAVA",'
    '"opaque":4,"serializeTypeCurrentRPC":"JSON","version":401}'
)


def frame_of(header: str | bytes, body: bytes = b"") -> bytes:
    data = header.encode() if isinstance(header, str) else header
    return struct.pack(">ii", 4 + len(data) + len(body), len(data)) + data + body


def fast(frame: bytes) -> tuple | None:
    return native_extension.send_answer_fields(frame, 4, len(frame))


def usual(frame: bytes) -> tuple | None:
    """What the producer's usual path takes from the frame when it is a SUCCESS answer."""
    try:
        cmd = decode_frame(frame[4:])
    except ProtocolError:
        return None
    if cmd.header_error is not None or cmd.code != 0 or not cmd.flag & RPC_TYPE_RESPONSE:
        return None
    try:
        head = SendMessageResponseHeader.from_ext(cmd.ext_fields)
    except HeaderError:
        return None
    return cmd.opaque, head.msg_id, head.queue_id, head.queue_offset, head.transaction_id


def test_the_plain_answers_of_pymq_and_java_are_read() -> None:
    ours = native_extension.send_answer_frame(77, "0A0B", 3, 12345, b'"R"', True, 401)
    assert fast(ours) == usual(ours) == (77, "0A0B", 3, 12345, None)
    java = frame_of(JAVA_ANSWER)
    assert fast(java) == usual(java) == (4, "7F0000010000C30100000000000001AA", 1, 0, None)
    tx = frame_of(JAVA_ANSWER.replace('"queueOffset":"0"', '"queueOffset":"0","transactionId":"T"'))
    assert fast(tx) == usual(tx) == (4, "7F0000010000C30100000000000001AA", 1, 0, "T")


@pytest.mark.parametrize(
    "change",
    [
        ('"code":0', '"code":10'),  # FLUSH_DISK_TIMEOUT: stored, but the usual path words it
        ('"code":0', '"code":1'),
        ('"flag":1', '"flag":0'),  # a request
        ('"flag":1', '"flag":3'),  # oneway
        ('"opaque":4,', ""),
        ('"language":"JAVA",', ""),
        ('"version":401', '"version":401,"remark":"x"'),
        ('"queueId":"1"', '"queueId":1'),  # a number, not a string
        ('"queueId":"1"', '"queueId":"-1"'),
        ('"queueId":"1"', '"queueId":"+1"'),
        ('"queueId":"1"', '"queueId":"1234567890"'),
        ('"queueOffset":"0"', '"queueOffset":"1234567890123456789"'),
        ('"queueOffset":"0"', '"queueOffset":"0","queueOffset":"1"'),
        ('"msgId":"7F0000010000C30100000000000001AA",', ""),
        ('"msgId":"7F0000010000C30100000000000001AA"', '"msgId":null'),
        ('"opaque":4', '"opaque":4,"opaque":5'),
        ('"opaque":4', '"opaque":2147483648'),
        # A timer message's answer (RocketMQ 5): its recall handle is read by the usual path.
        ('"queueOffset":"0"', '"queueOffset":"0","recallHandle":"djEgVCBiIDEgSUQ="'),
    ],
)
def test_other_answers_are_left_to_the_usual_path(change: tuple[str, str]) -> None:
    assert change[0] in JAVA_ANSWER
    frame = frame_of(JAVA_ANSWER.replace(*change))
    assert fast(frame) is None


def test_answers_with_a_body_or_another_serialize_type_are_left_to_the_usual_path() -> None:
    assert fast(frame_of(JAVA_ANSWER, b"x")) is None
    rocketmq = bytearray(frame_of(JAVA_ANSWER))
    rocketmq[4] = 1  # the serialize-type byte
    assert fast(bytes(rocketmq)) is None
    whole = frame_of(JAVA_ANSWER)
    for cut in (4, 5, 20, len(whole) - 1):
        assert fast(whole[:cut]) is None
    assert native_extension.send_answer_fields(whole, 4, len(whole) + 1) is None


digits = st.text("0123456789", min_size=1, max_size=20)
numbers = st.one_of(digits, st.integers(-(2**64), 2**64).map(str), st.sampled_from(["+1", " 1"]))
text = st.text(max_size=12)


@st.composite
def answers(draw: st.DrawFn) -> bytes:
    """Send answers: half of them plain (what the raw reader takes, in any member order and
    spacing, with any text), the rest with any field changed."""
    if draw(st.booleans()):
        return draw(plain_answers())
    ext: dict[str, object] = {}
    for name, values in (
        ("msgId", st.one_of(text, st.text("0123456789ABCDEF", min_size=32, max_size=32))),
        ("queueId", numbers),
        ("queueOffset", numbers),
        ("transactionId", text),
        ("MSG_REGION", text),
        ("TRACE_ON", st.sampled_from(["true", "false"])),
    ):
        if draw(st.integers(0, 9)):  # mostly present
            value = draw(values)
            ext[name] = (
                draw(st.sampled_from([value, value, None, 7, True]))
                if draw(st.booleans())
                else value
            )
    if draw(st.booleans()):
        ext[draw(text)] = draw(st.one_of(text, st.integers(), st.lists(st.integers(), max_size=2)))
    header: dict[str, object] = {
        "code": draw(st.sampled_from([0, 0, 0, 1, 10, 17])),
        "extFields": ext,
        "flag": draw(st.sampled_from([1, 1, 1, 0, 3])),
        "language": draw(st.sampled_from(["JAVA", "JAVA", "CPP", ""])),
        "opaque": draw(st.integers(-(2**31), 2**31 - 1)),
        "serializeTypeCurrentRPC": "JSON",
        "version": 401,
    }
    if draw(st.integers(0, 3)) == 0:
        header["remark"] = draw(st.one_of(st.none(), text))
    keys = draw(st.permutations(list(header)))
    text_json = json.dumps(
        {k: header[k] for k in keys},
        ensure_ascii=draw(st.booleans()),
        separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])),
    )
    body = draw(st.sampled_from([b"", b"", b"", b"x"]))
    return frame_of(text_json.encode("utf-8", "surrogatepass"), body)


@st.composite
def plain_answers(draw: st.DrawFn) -> bytes:
    ascii_text = st.text(st.characters(max_codepoint=127), max_size=40)
    ext: dict[str, object] = {
        "msgId": draw(ascii_text),
        "queueId": draw(st.text("0123456789", min_size=1, max_size=9)),
        "queueOffset": draw(st.text("0123456789", min_size=1, max_size=18)),
        # Members the reader skips are plain ASCII (anything else: the usual path).
        "MSG_REGION": draw(st.text(st.characters(min_codepoint=32, max_codepoint=126))),
        "TRACE_ON": "true",
    }
    if draw(st.booleans()):
        ext["transactionId"] = draw(ascii_text)
    header: dict[str, object] = {
        "code": 0,
        "extFields": dict(draw(st.permutations(list(ext.items())))),
        "flag": 1,
        "language": "JAVA",
        "opaque": draw(st.integers(-(2**31), 2**31 - 1)),
        "serializeTypeCurrentRPC": "JSON",
        "version": 401,
    }
    if draw(st.booleans()):
        header["remark"] = None
    keys = draw(st.permutations(list(header)))
    data = json.dumps(
        {k: header[k] for k in keys},
        ensure_ascii=draw(st.booleans()),
        separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])),
    )
    return frame_of(data.encode("utf-8", "surrogatepass"))


@given(plain_answers())
def test_plain_answers_are_taken(frame: bytes) -> None:
    assert fast(frame) is not None
    assert fast(frame) == usual(frame)


@settings(max_examples=600)
@given(answers())
def test_what_the_raw_reader_takes_the_usual_path_reads_the_same(frame: bytes) -> None:
    got = fast(frame)
    if got is not None:
        assert got == usual(frame)
        cmd = decode_frame(frame[4:])
        assert cmd.remark is None and cmd.body == b"" and not cmd.flag & RPC_ONEWAY


@given(
    opaque=st.integers(-(2**31), 2**31 - 1),
    msg_id=st.text("0123456789ABCDEF,", min_size=1, max_size=70),
    queue_id=st.integers(0, 10**9 - 1),
    queue_offset=st.integers(0, 10**18 - 1),
)
def test_every_plain_answer_of_the_broker_is_taken(opaque, msg_id, queue_id, queue_offset) -> None:
    """The broker's answers (its C writer, and codec.encode of the command) all go raw."""
    ours = native_extension.send_answer_frame(
        opaque, msg_id, queue_id, queue_offset, b'"DefaultRegion"', False, 401
    )
    want = (opaque, msg_id, queue_id, queue_offset, None)
    assert fast(ours) == usual(ours) == want
    ext = {"msgId": msg_id, "queueId": str(queue_id), "queueOffset": str(queue_offset)}
    encoded = encode(RemotingCommand(0, ext, b"", opaque, RPC_TYPE_RESPONSE, None))
    assert fast(encoded) == usual(encoded) == want


def test_raw_send_answers_give_the_fields_to_calls_that_take_them(caplog) -> None:
    import types

    from pymq.remoting.channel import raw_send_answers
    from pymq.remoting.connection import Call, CallTable

    calls = CallTable()
    channel = types.SimpleNamespace(state=types.SimpleNamespace(calls=calls))
    got: list[tuple] = []
    calls.add(1, Call(callback=lambda r, e: None, deadline=10.0, on_fields=got.append))
    calls.add(2, Call(callback=lambda r, e: None, deadline=10.0))  # takes the response command only

    def raising(fields: tuple) -> None:
        raise RuntimeError("the callback's own bug")

    calls.add(3, Call(callback=lambda r, e: None, deadline=10.0, on_fields=raising))
    assert calls.timed == 3

    def answer(opaque: int) -> bytes:
        return native_extension.send_answer_frame(opaque, "AB", 0, 5, b'"R"', True, 401)

    def run(*frames: bytes) -> tuple[bytes, list[int]]:
        """The frames back to back, and their bounds without the length fields."""
        bounds: list[int] = []
        at = 0
        for frame in frames:
            bounds += [at + 4, at + len(frame)]
            at += len(frame)
        return b"".join(frames), bounds

    def serve(buf: bytes, bounds: list[int], first: int) -> int:
        joined, left, decoded = raw_send_answers(channel, buf, bounds, first, len(bounds) // 2)  # type: ignore[arg-type]
        assert joined == b"" and decoded is None  # nothing to write, nothing decoded
        return left

    buf, bounds = run(answer(1), answer(2), answer(9), answer(3))
    assert serve(buf, bounds, 0) == 1  # one taken; it stops at the call without on_fields
    assert got == [(1, "AB", 0, 5, None)] and 1 not in calls.calls
    assert 2 in calls.calls  # left for the usual path's response
    assert serve(buf, bounds, 2) == 2  # an unknown opaque: the usual path's
    assert serve(buf, bounds, 3) == 4
    assert "a response callback raised" in caplog.text  # and the run went on
    assert list(calls.calls) == [2] and calls.timed == 1
    # A task awaiting its answer (Channel.call_frame): the fields kept in the call, the task
    # woken; the call refers to nothing of its own (no cycle left for the collector).
    woken: list[int] = []
    awaited = Call(wake=lambda: woken.append(4), deadline=10.0, awaits_fields=True)
    calls.add(4, awaited)
    buf, bounds = run(answer(4))
    assert serve(buf, bounds, 0) == 1
    assert awaited.fields == (4, "AB", 0, 5, None) and woken == [4] and 4 not in calls.calls
    assert awaited not in gc.get_referents(*gc.get_referents(awaited))
