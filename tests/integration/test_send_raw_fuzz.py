"""Differential fuzz of the broker's raw send path: a send frame whose header text is mutated
(field values, types, names, codes, flags, duplicates, escapes, spacing) is answered, and
stored, by SendProcessor.send_raw as the usual path (decode, inline dispatch, task) answers and
stores the same frame to a twin topic; a declined frame changes nothing."""

from __future__ import annotations

import json
import random
import struct
import types

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pymq.client import topics
from pymq.common.batch import BatchItem, encode_batch_body
from pymq.embedded import Cluster
from pymq.remoting.codec import (
    RPC_ONEWAY,
    RPC_TYPE_RESPONSE,
    RemotingCommand,
    decode_frame,
)
from pymq.remoting.codes import ResponseCode
from pymq.remoting.errors import ProtocolError, RemotingCommandError
from tests.helpers import send_tier_functions

from .test_send_raw import answer_of, inline, stored

native_extension = send_tier_functions()


PEER = types.SimpleNamespace(remote_address="10.0.0.9:40123")
TOPIC = "\x00TOPIC\x00"  # replaced by each side's topic
V2 = "abcdefghijklm"
LONG = (
    "producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
    "bornTimestamp", "flag", "properties", "reconsumeTimes", "unitMode", "maxReconsumeTimes",
    "batch",
)  # fmt: skip
RAW_SERVED: list[bytes] = []
UNIQ = "UNIQ_KEY\x010A000009000000000000000000000001"

NUMS = st.sampled_from(
    ["0", "1", "3", "4", "99", "-1", "", "+1", "007", "1.0", "2147483648", "999999999",
     "1000000000", "99999999999", "true", "false", " 1"]
)  # fmt: skip
JSON_ODD = st.sampled_from([0, 1, 2, -1, 2**31, 10**19, True, False, None, 1.5, [], {}, "0"])
PROPS = st.sampled_from(
    [UNIQ, "", "TAGS\x01a\x02" + UNIQ, "WAIT\x01false\x02" + UNIQ, "DELAY\x012\x02" + UNIQ,
     "TRAN_MSG\x01true\x02" + UNIQ, "A\x01\u00e9\x02" + UNIQ, "A\x01\x00\x02" + UNIQ,
     "A\x01\"q\\\x02" + UNIQ, "x" * 40000]
)  # fmt: skip
TOPICS = st.sampled_from(
    [TOPIC, TOPIC, TOPIC, TOPIC + "Nope", "%RETRY%" + TOPIC, "SCHEDULE_TOPIC_XXXX",
     "DefaultCluster", "TBW102", "bad topic"]
)  # fmt: skip


@st.composite
def ext_members(draw: st.DrawFn, near: bool = False) -> list[tuple[str, object]]:
    names = draw(st.sampled_from(["v2", "v2", "long", "long", "mixed"]))
    base: list[object] = [
        "G", draw(TOPICS), "TBW102", "4", draw(st.sampled_from(["0", "1", "2", "3"])),
        draw(st.sampled_from(["0", "0", "1", "2", "4", "8", "12", "16"])),
        "1800000000000", "0", draw(PROPS), "0", "false", "16", "false",
    ]  # fmt: skip
    members = []
    for i, value in enumerate(base):
        choice = draw(st.integers(0, 39))  # 0 (hypothesis's favourite): unchanged
        if near and choice < 39 and draw(st.integers(0, 12)) != i:
            choice = 0  # near a plain send: at most one field changed
        if choice == 39:
            continue  # dropped
        if choice == 38:
            value = draw(NUMS)
        elif choice == 37:
            value = draw(JSON_ODD)
        v2 = names == "v2" or (names == "mixed" and draw(st.booleans()))
        members.append((V2[i] if v2 else LONG[i], value))
    if draw(st.integers(0, 4)) == 4:
        extra_name = draw(st.sampled_from(["n", "z", "AccessKey", "Signature", "b", "topic", "e"]))
        members.insert(draw(st.integers(0, len(members))), (extra_name, draw(JSON_ODD | NUMS)))
    return members


@st.composite
def headers(draw: st.DrawFn) -> tuple[list[tuple[str, object]], dict]:
    near = draw(st.booleans())
    ext = draw(ext_members(near))
    top: list[tuple[str, object]] = []

    def maybe(name: str, usual: object, odd: list[object]) -> None:
        choice = draw(st.integers(0, 15))
        if near and choice < 15 and draw(st.integers(0, 7)) != 0:
            choice = 0
        if choice == 15:
            return
        value = draw(st.sampled_from(odd)) if choice == 14 else usual
        top.append((name, value))

    code = draw(st.sampled_from([310, 310, 10, 10, 320, 320, 36, 11]))
    top.append(("code", code))
    if code == 320 and draw(st.integers(0, 3)) != 0:
        # As producers write a batch (V2 names, batch "true"), mostly to the test's topic with
        # no sys flag: the other fields' mutations then meet the raw batch path.
        plain = {"m": "true", "b": TOPIC, "f": "0"}
        renamed = [(V2[LONG.index(n)] if n in LONG else n, v) for n, v in ext]
        ext = [(n, plain[n] if n in plain and draw(st.integers(0, 4)) else v) for n, v in renamed]
    maybe("language", "JAVA", ["", None, 1, "CPP", "\u00e9"])
    maybe("version", 317, [0, -1, 2**31, None, "x", 1.0])
    maybe("opaque", 77, [0, -1, 2**31 - 1, 2**31, -(2**31) - 1, "1", None])
    maybe("flag", 0, [1, 2, 3, 4, 2**31, 0.0, "0", True, None])
    maybe("remark", None, ["", "r", 1, "\u00e9"])
    top.append(("extFields", ext))
    if not near and draw(st.integers(0, 5)) == 5:
        top.insert(
            draw(st.integers(0, len(top))),
            (draw(st.sampled_from(["code", "flag", "x", "serializeTypeCurrentRPC", "opaque"])),
             draw(JSON_ODD)),
        )  # fmt: skip
    if near:
        return top, {
            "sep": (",", ":"),
            "lead": "",
            "trail": draw(st.sampled_from(["", "\n"])),
            "escape": draw(st.booleans()),
            "ascii": draw(st.booleans()),
        }
    style = {
        "sep": draw(st.sampled_from([(",", ":"), (", ", ": ")])),
        "lead": draw(st.sampled_from(["", "", "", " ", "\n", "\x0c"])),
        "trail": draw(st.sampled_from(["", "", "", "\n", " \t", "\x0b"])),
        "escape": draw(st.booleans()),
        "ascii": draw(st.booleans()),
    }
    return top, style


def _value(value: object, style: dict, topic: str) -> str:
    if isinstance(value, str):
        value = value.replace(TOPIC, topic)
        text = json.dumps(value, ensure_ascii=style["ascii"])
        if style["escape"] and value == topic:  # the topic's letters as \u escapes
            text = '"' + "".join(f"\\u{ord(c):04x}" for c in value) + '"'
        return text
    return json.dumps(value, separators=style["sep"])


def header_text(top: list, style: dict, topic: str) -> bytes:
    comma, colon = style["sep"]
    parts = []
    for name, value in top:
        if name == "extFields" and isinstance(value, list):
            inner = comma.join(json.dumps(k) + colon + _value(v, style, topic) for k, v in value)
            parts.append('"extFields"' + colon + "{" + inner + "}")
        else:
            parts.append(json.dumps(name) + colon + _value(value, style, topic))
    text = style["lead"] + "{" + comma.join(parts) + "}" + style["trail"]
    return text.encode("utf-8", "surrogatepass")


def make_frame(top: list, style: dict, topic: str, pad: int = 0) -> bytes:
    header = header_text(top, style, topic)
    if pad:
        header = header[:-1] + b" " * pad + header[-1:] if header.endswith(b"}") else header
    body = b"fuzz-body"
    if dict(top).get("code") == 320:  # a batch's body: served raw when the header is plain
        body = encode_batch_body(
            [BatchItem(b"fuzz-%d" % i, 0, {"UNIQ_KEY": UNIQ[9:], "TAGS": "t"}) for i in range(2)]
        )
    return struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body


async def usual(cluster: Cluster, data: bytes) -> tuple:
    """What Channel._serve_inbox does with the frame when no raw handler answers it."""
    try:
        cmd = decode_frame(data[4:])
    except ProtocolError:
        return ("protocol error",)
    if cmd.flag & RPC_TYPE_RESPONSE:
        return ("response",)
    if cmd.header_error is not None:
        return ("header_error", cmd.header_error)
    server = cluster.broker.server
    try:
        out = inline(cluster, PEER, cmd)  # type: ignore[arg-type]
        if out is None:
            out = await server.dispatch(PEER, cmd)  # type: ignore[arg-type]
    except RemotingCommandError as exc:
        out = cmd.response(ResponseCode.SYSTEM_ERROR, str(exc))
    except Exception as exc:  # as _serve_inline / _serve_task
        out = cmd.response(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
    if cmd.flag & RPC_ONEWAY:
        return ("oneway",)
    assert out is not None
    if isinstance(out, RemotingCommand):
        out.opaque, out.flag = cmd.opaque, out.flag | RPC_TYPE_RESPONSE
    return answer_of(out)  # opaque and flag among them


def _normal(answer: tuple, side: str) -> tuple:
    if len(answer) < 3:
        return answer
    code, remark, ext, *rest = answer
    ext = dict(ext)
    ext.pop("queueOffset", None)  # DELAY / TRAN_MSG share one system queue
    return (code, remark and remark.replace(side, "T"), ext, *rest)


async def check(cluster: Cluster, top: list, style: dict, pad: int = 0) -> None:
    send = cluster.broker.send_processor
    store = cluster.broker.store
    raw_frame = make_frame(top, style, "RawT", pad)
    usual_frame = make_frame(top, style, "UsualT", pad)
    before = store.commitlog.max_offset
    random.seed(5)
    out = send.send_raw(PEER, raw_frame, 4, len(raw_frame))  # type: ignore[arg-type]
    if out is None:
        assert store.commitlog.max_offset == before, "declined, but the store changed"
        random.seed(5)
        got = await usual(cluster, raw_frame)
    else:
        RAW_SERVED.append(raw_frame[8:200])
        got = answer_of(out)
    random.seed(5)
    want = await usual(cluster, usual_frame)
    assert _normal(got, "RawT") == _normal(want, "UsualT"), (raw_frame[8:300], out is not None)
    assert _records(cluster, "RawT") == _records(cluster, "UsualT")


def _records(cluster: Cluster, topic: str) -> list[tuple]:
    """The topic's records, its name in properties (a delivered DELAY's REAL_TOPIC) as T."""
    return [
        (*r[:3], {k: v.replace(topic, "T") for k, v in r[3].items()}, *r[4:])
        for r in stored(cluster, topic)
    ]


async def _warm(cluster: Cluster) -> tuple[list, dict]:
    for topic in ("RawT", "UsualT"):
        await topics.create_topic(cluster.namesrv_addr, topic, brokers=[cluster.broker_addr])
    plain_top = [("code", 310), ("language", "JAVA"), ("opaque", 1), ("flag", 0),
                 ("extFields", [(V2[i], v) for i, v in enumerate(
                     ["G", TOPIC, "TBW102", "4", "0", "0", "1800000000000", "0", UNIQ, "0",
                      "false", "16", "false"])])]  # fmt: skip
    style = {"sep": (",", ":"), "lead": "", "trail": "", "escape": False, "ascii": True}
    await check(cluster, plain_top, style)  # validates both topics (the usual path)
    return plain_top, style


def _examples(n: int) -> list[tuple]:
    """n headers drawn by hypothesis (collected first: the checks need the running broker)."""
    drawn: list[tuple] = []
    random.seed()

    @settings(max_examples=n, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(header=headers())
    def collect(header: tuple) -> None:
        drawn.append(header)

    collect()
    return drawn


async def test_raw_send_agrees_with_the_usual_path(pymq_cluster: Cluster) -> None:
    plain_top, plain_style = await _warm(pymq_cluster)
    for top, style in _examples(int(__import__("os").environ.get("RAW_FUZZ_N", "400"))):
        await check(pymq_cluster, top, style)
        await check(pymq_cluster, top, style)  # twice: after a first send checked the topic
    batches = sum(b'"code":320' in f or b'"code": 320' in f for f in RAW_SERVED)
    print("raw served", len(RAW_SERVED), "batches among them", batches)
    assert RAW_SERVED  # the raw path was exercised
    # A plain batch as producers write it, whatever the draw held (mostly a few dozen are
    # served raw among the examples, once none): the raw batch path exercised every time.
    served = len(RAW_SERVED)
    batch_top = [
        ("code", 320) if name == "code" else
        ("extFields", [(k, "true" if k == "m" else v) for k, v in value])
        if name == "extFields" else (name, value)
        for name, value in plain_top
    ]  # fmt: skip
    await check(pymq_cluster, batch_top, plain_style)
    assert len(RAW_SERVED) == served + 1 and b'"code":320' in RAW_SERVED[-1]


async def test_a_header_past_the_json_limit_is_not_answered_raw(pymq_cluster: Cluster) -> None:
    """codec refuses a JSON header over MAX_JSON_HEADER_LENGTH (the connection closes): the
    raw path must not store and answer it."""
    from pymq.remoting.codec import MAX_JSON_HEADER_LENGTH

    plain_top, style = await _warm(pymq_cluster)
    await check(pymq_cluster, plain_top, style, pad=MAX_JSON_HEADER_LENGTH)


async def test_a_raw_send_that_fails_after_its_put_is_not_stored_twice(
    pymq_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Channel._serve_inbox serves a frame whose raw handler raised through the usual path: a
    failure after the put must be answered by send_raw (as the inline path answers it), not
    raised, or the message is stored twice."""
    plain_top, style = await _warm(pymq_cluster)
    send = pymq_cluster.broker.send_processor

    def broken(*args: object) -> None:
        raise RuntimeError("stats broke")

    monkeypatch.setattr(pymq_cluster.broker.context.stats, "on_put", broken)
    answers = {}
    for topic in ("RawT", "UsualT"):
        data = make_frame(plain_top, style, topic)
        out = None
        if topic == "RawT":
            try:  # as Channel._serve_inbox
                out = send.send_raw(PEER, data, 4, len(data))  # type: ignore[arg-type]
            except Exception:
                out = None
        if out is None:
            answers[topic] = _normal(await usual(pymq_cluster, data), topic)
        else:
            answers[topic] = _normal(answer_of(out), topic)
    assert answers["RawT"] == answers["UsualT"]
    assert answers["UsualT"][0] == ResponseCode.SYSTEM_ERROR
    assert _records(pymq_cluster, "RawT") == _records(pymq_cluster, "UsualT")


def test_send_fields_reads_headers_up_to_the_codec_limit() -> None:
    from pymq.remoting.codec import MAX_JSON_HEADER_LENGTH

    plain = make_frame(*_plain(), "T")[4:]
    head_len = struct.unpack(">i", plain[:4])[0]
    for size, read in ((MAX_JSON_HEADER_LENGTH, True), (MAX_JSON_HEADER_LENGTH + 1, False)):
        header = plain[4 : 4 + head_len - 1] + b" " * (size - head_len) + b"}"
        data = struct.pack(">i", len(header)) + header + b"body"
        assert (native_extension.send_fields(data, 0, len(data)) is not None) is read, size


def _plain() -> tuple[list, dict]:
    top = [("code", 310), ("language", "JAVA"), ("opaque", 1), ("flag", 0),
           ("extFields", [(V2[i], v) for i, v in enumerate(
               ["G", TOPIC, "TBW102", "4", "0", "0", "1800000000000", "0", UNIQ, "0",
                "false", "16", "false"])])]  # fmt: skip
    return top, {"sep": (",", ":"), "lead": "", "trail": "", "escape": False, "ascii": True}
