"""The client's raw answer path: ``send_answer_fields`` (C, and its twin) reads a send's plain
successful answer from its frame, and whatever it reads the usual path (decode_frame, then
SendMessageResponseHeader.from_ext) reads the same; every other frame it leaves to the usual
path."""

from __future__ import annotations

import gc
import json
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pymq.remoting import codec
from pymq.remoting.codec import RPC_ONEWAY, RPC_TYPE_RESPONSE, RemotingCommand, decode_frame, encode
from pymq.remoting.headers import SendMessageResponseHeader
from tests.helpers import implementations, mangled, send_tier_functions

native_extension = send_tier_functions()
READERS = pytest.mark.parametrize(
    "reader",
    implementations("pymq.remoting._codecc", "send_answer_fields", codec.send_answer_fields_py),
)

# What the Java 4.9.4 broker answered to a signed SEND_MESSAGE_V2 (java-wire-samples/
# ACL-SEND_MESSAGE_V2-310-signed-normal-ok.response-header.json).
JAVA_ANSWER = (
    '{"code":0,"extFields":{"queueId":"1","TRACE_ON":"true","MSG_REGION":"DefaultRegion",'
    '"msgId":"7F0000010000C30100000000000001AA","queueOffset":"0"},"flag":1,"language":"JAVA",'
    '"opaque":4,"serializeTypeCurrentRPC":"JSON","version":401}'
)
JAVA_ID = "7F0000010000C30100000000000001AA"


def frame_of(header: str | bytes, body: bytes = b"") -> bytes:
    data = header.encode() if isinstance(header, str) else header
    return struct.pack(">ii", 4 + len(data) + len(body), len(data)) + data + body


def read(reader: Any, frame: bytes) -> tuple | None:
    """The raw reader's fields, checked against what the producer's usual path takes from the
    frame (a SUCCESS answer's header fields, with no remark, body or oneway flag)."""
    got = reader(frame, 4, len(frame))
    if got is not None:
        cmd = decode_frame(frame[4:])
        assert cmd.header_error is None and cmd.code == 0 and cmd.flag & RPC_TYPE_RESPONSE
        assert cmd.remark is None and cmd.body == b"" and not cmd.flag & RPC_ONEWAY
        head = SendMessageResponseHeader.from_ext(cmd.ext_fields)
        assert got == (
            cmd.opaque,
            head.msg_id,
            head.queue_id,
            head.queue_offset,
            head.transaction_id,
        )
    return got


def _changed(old: str, new: str) -> bytes:
    assert old in JAVA_ANSWER
    return frame_of(JAVA_ANSWER.replace(old, new))


_rocketmq = bytearray(frame_of(JAVA_ANSWER))
_rocketmq[4] = 1  # the serialize-type byte
ROWS = [
    (native_extension.send_answer_frame(77, "0A0B", 3, 12345, b'"R"', True, 401),
     (77, "0A0B", 3, 12345, None)),
    (frame_of(JAVA_ANSWER), (4, JAVA_ID, 1, 0, None)),
    (_changed('"queueOffset":"0"', '"queueOffset":"0","transactionId":"T"'),
     (4, JAVA_ID, 1, 0, "T")),
    # Left to the usual path:
    (frame_of(JAVA_ANSWER, b"x"), None),
    (bytes(_rocketmq), None),
    *[(frame_of(JAVA_ANSWER)[:cut], None) for cut in (4, 5, 20, len(frame_of(JAVA_ANSWER)) - 1)],
    *[(_changed(*change), None) for change in [
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
        (f'"msgId":"{JAVA_ID}",', ""),
        (f'"msgId":"{JAVA_ID}"', '"msgId":null'),
        ('"opaque":4', '"opaque":4,"opaque":5'),
        ('"opaque":4', '"opaque":2147483648'),
        # A timer message's answer (RocketMQ 5): its recall handle is read by the usual path.
        ('"queueOffset":"0"', '"queueOffset":"0","recallHandle":"djEgVCBiIDEgSUQ="'),
    ]],
]  # fmt: skip


@READERS
@pytest.mark.parametrize("row", range(len(ROWS)))
def test_answers_are_read_or_left_to_the_usual_path(reader: Any, row: int) -> None:
    frame, expected = ROWS[row]
    assert read(reader, frame) == expected
    assert reader(frame_of(JAVA_ANSWER), 4, len(frame_of(JAVA_ANSWER)) + 1) is None  # past the end


text = st.text(max_size=12)
ascii_text = st.text(st.characters(max_codepoint=127), max_size=40)
digits = st.text("0123456789", min_size=1, max_size=20)
numbers = digits | st.integers(-(2**64), 2**64).map(str) | st.sampled_from(["+1", " 1"])


@st.composite
def answers(draw: st.DrawFn) -> tuple[bytes, Any]:
    """(frame, what the reader must give): the broker's own answers (the fields), plain
    answers in any member order and spacing, with any text ("taken"), and answers with any
    field changed (None: either way, as long as the usual path agrees)."""
    kind = draw(st.sampled_from(["broker", "plain", "any"]))
    opaque = draw(st.integers(-(2**31), 2**31 - 1))
    if kind == "broker":
        fields = (opaque, draw(st.text("0123456789ABCDEF,", min_size=1, max_size=70)),
                  draw(st.integers(0, 10**9 - 1)), draw(st.integers(0, 10**18 - 1)),
                  None)  # fmt: skip
        if draw(st.booleans()):  # its C writer, or codec.encode of the command
            return native_extension.send_answer_frame(
                *fields[:4], b'"DefaultRegion"', False, 401
            ), fields
        ext = {"msgId": fields[1], "queueId": str(fields[2]), "queueOffset": str(fields[3])}
        return encode(RemotingCommand(0, ext, b"", opaque, RPC_TYPE_RESPONSE, None)), fields
    plain = kind == "plain"
    ext: dict[str, object] = {}
    for name, values in (
        ("msgId", ascii_text if plain else text | st.text("0123456789ABCDEF", min_size=32)),
        ("queueId", st.text("0123456789", min_size=1, max_size=9) if plain else numbers),
        ("queueOffset", st.text("0123456789", min_size=1, max_size=18) if plain else numbers),
        ("transactionId", ascii_text if plain else text),
        # Members the reader skips are plain ASCII (anything else: the usual path).
        ("MSG_REGION", st.text(st.characters(min_codepoint=32, max_codepoint=126))
         if plain else text),
        ("TRACE_ON", st.just("true") if plain else st.sampled_from(["true", "false"])),
    ):  # fmt: skip
        if (name == "transactionId" or not plain) and not draw(st.integers(0, 1 if plain else 9)):
            continue
        value = draw(values)
        if not plain and draw(st.booleans()):
            value = draw(st.sampled_from([value, None, 7, True]))
        ext[name] = value
    if not plain and draw(st.booleans()):
        ext[draw(text)] = draw(st.one_of(text, st.integers(), st.lists(st.integers(), max_size=2)))
    header: dict[str, object] = {
        "code": 0 if plain else draw(st.sampled_from([0, 0, 0, 1, 10, 17])),
        "extFields": dict(draw(st.permutations(list(ext.items())))),
        "flag": 1 if plain else draw(st.sampled_from([1, 1, 1, 0, 3])),
        "language": "JAVA" if plain else draw(st.sampled_from(["JAVA", "JAVA", "CPP", ""])),
        "opaque": opaque, "serializeTypeCurrentRPC": "JSON", "version": 401,
    }  # fmt: skip
    if draw(st.integers(0, 3)) == 0:
        header["remark"] = None if plain else draw(st.one_of(st.none(), text))
    data = json.dumps(
        {k: header[k] for k in draw(st.permutations(list(header)))},
        ensure_ascii=draw(st.booleans()),
        separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])),
    )  # fmt: skip
    body = b"" if plain else draw(st.sampled_from([b"", b"", b"", b"x"]))
    return frame_of(data.encode("utf-8", "surrogatepass"), body), "taken" if plain else None


@READERS
@settings(max_examples=600)
@given(answers())
def test_what_the_raw_reader_takes_the_usual_path_reads_the_same(
    reader: Any, answer: tuple
) -> None:
    frame, want = answer
    got = read(reader, frame)
    if want == "taken":
        assert got is not None
    elif want is not None:
        assert got == want


@READERS
@settings(max_examples=300)
@given(st.data())
def test_damaged_answers_are_read_as_the_usual_path_reads_them(reader: Any, data) -> None:
    """Answers with bytes of the JSON grammar changed, cut or added: the reader takes only
    what the usual path reads alike (read's checks)."""
    sound = data.draw(st.sampled_from([JAVA_ANSWER.encode(), ROWS[0][0][8:], ROWS[2][0][8:]]))
    read(reader, frame_of(mangled(data, sound, b'"\\{}[],:-.0e19 \x00\x7f\x80tnuabm')))


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
