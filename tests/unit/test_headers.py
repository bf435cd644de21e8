"""Typed request headers: Java's typed decode (required fields, number forms and ranges)."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pymq.remoting.codec import RemotingCommand
from pymq.remoting.codes import RequestCode
from pymq.remoting.headers import (
    INT_MAX,
    INT_MIN,
    LONG_MAX,
    LONG_MIN,
    REQUEST_HEADERS,
    V2_NAMES,
    EndTransactionRequestHeader,
    HeaderError,
    PullMessageRequestHeader,
    SendMessageRequestHeader,
    decode,
    decode_request,
    encode,
    java_bool,
    java_int,
    java_long,
)

SEND_V2 = {
    "a": "pg",
    "b": "TopicTest",
    "c": "TBW102",
    "d": "4",
    "e": "1",
    "f": "0",
    "g": "1700000000000",
    "h": "0",
    "i": "KEYS\x01k1\x02",
    "j": "0",
    "k": "false",
    "m": "false",
}


@pytest.mark.parametrize("missing", list("abcdefgh"))
def test_send_v2_without_a_required_field_is_refused(missing: str) -> None:
    ext = {k: v for k, v in SEND_V2.items() if k != missing}
    with pytest.raises(HeaderError, match=f"the custom field <{missing}> is null"):
        SendMessageRequestHeader.from_ext(RequestCode.SEND_MESSAGE_V2, ext)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("e", ""),  # Integer.parseInt("") fails: an empty queueId is no queue 0
        ("e", " 1"),
        ("e", "1.0"),
        ("e", "0x1"),
        ("e", "1_000"),
        ("e", "\u0661"),  # an Arabic-Indic one: int() takes it, Java does not
        ("e", "2147483648"),
        ("h", "-2147483649"),
        ("f", "99999999999999999999999999"),
        ("j", "2147483648"),
        ("g", "9223372036854775808"),
        ("g", "1e3"),
        ("l", "x"),
    ],
)
def test_send_numbers_as_java_parses_them(key: str, value: str) -> None:
    with pytest.raises(HeaderError, match=f"<{key}>"):
        SendMessageRequestHeader.from_ext(RequestCode.SEND_MESSAGE_V2, {**SEND_V2, key: value})


def test_send_header_values() -> None:
    header = SendMessageRequestHeader.from_ext(
        RequestCode.SEND_MESSAGE_V2,
        {**SEND_V2, "g": "-9223372036854775808", "h": "+2147483647", "e": "-1"},
    )
    assert header.born_timestamp == LONG_MIN
    assert header.flag == INT_MAX
    assert header.queue_id == -1
    assert header.reconsume_times == 0
    assert header.max_reconsume_times is None
    assert header.batch is False
    batch = SendMessageRequestHeader.from_ext(RequestCode.SEND_BATCH_MESSAGE, SEND_V2)
    assert batch.batch is True


def test_send_long_names_decode_like_v2() -> None:
    long = {V2_NAMES[k]: v for k, v in SEND_V2.items()}
    assert SendMessageRequestHeader.from_ext(
        RequestCode.SEND_MESSAGE, long
    ) == SendMessageRequestHeader.from_ext(RequestCode.SEND_MESSAGE_V2, SEND_V2)


numberish = st.one_of(
    st.integers(LONG_MIN - 10, LONG_MAX + 10).map(str),
    st.integers(INT_MIN - 10, INT_MAX + 10).map(str),
    st.sampled_from(["", " 1", "+0", "-0", "007", "1.5", "true", "TRUE", "1", "0"]),
    st.text(max_size=6),
)


_plain_or_odd = st.one_of(
    st.integers(0, 10**12).map(str),
    numberish,
    st.sampled_from(["true", "false", "True", "1", "0"]),
    st.sampled_from([5, 7, None, "\u0661", "1" * 19]),  # not text, or not Java's digits
)
_flag = st.sampled_from(["1", "0", "true", "false", "True", "TRUE", "", " 1", "01", "2"])
_digits9 = st.integers(0, 10**9 - 1).map(str)
_SOUND_SEND = st.fixed_dictionaries(
    {k: st.text(max_size=3) for k in "abc"}
    | {k: _digits9 for k in "defh"}
    | {"g": st.integers(0, 10**18 - 1).map(str)},
    optional={"i": st.text(max_size=3), "j": _digits9, "k": _flag, "l": _digits9, "m": _flag},
)


def _outcome(decode: Any) -> object:
    """The header, or the refusal: a HeaderError, or an error at a value that is no text
    (which the codec never hands on: where two fields are wrong, either may be met first)."""
    try:
        return decode()
    except HeaderError:
        return "refused"
    except (TypeError, AttributeError):
        return "not text"


def _same(got: object, generic: object, ext: dict) -> bool:
    if isinstance(got, str) and not all(isinstance(v, str) for v in ext.values()):
        return isinstance(generic, str)
    return got == generic


_SOME_ODD = st.dictionaries(st.sampled_from(list(V2_NAMES)), _plain_or_odd, max_size=3)


@settings(max_examples=300)
@given(
    st.one_of(
        _SOUND_SEND,
        st.tuples(_SOUND_SEND, _SOME_ODD).map(lambda sound_odd: sound_odd[0] | sound_odd[1]),
        st.dictionaries(st.sampled_from(list(V2_NAMES)), _plain_or_odd),
    ),
    st.sampled_from(
        [RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE, RequestCode.SEND_MESSAGE]
    ),
)
# A required str that is JSON null: refused by both (the hot path took it as present).
@example(dict(a=None, b="", c="", d="0", e="0", f="0", g="0", h="0"), RequestCode.SEND_MESSAGE_V2)
def test_the_send_header_reads_as_the_generic_decoder(short: dict[str, str], code: int) -> None:
    """from_ext (send_header, C or its twin) is the hot path's twin of decode(): same header,
    same refusals (sound headers, some of their members odd, or any members); unitMode and
    batch read as java_bool reads them, "1" / "0" as Java and the C++ client write them
    included."""
    long = {V2_NAMES[k]: v for k, v in short.items()}
    got = _outcome(
        lambda: SendMessageRequestHeader.from_ext(
            code, long if code == RequestCode.SEND_MESSAGE else short
        )
    )
    if code == RequestCode.SEND_BATCH_MESSAGE:  # batch by its code, as Java's: "m" not read
        long.pop(V2_NAMES["m"], None)
    generic = _outcome(lambda: decode(SendMessageRequestHeader, long))
    assert _same(got, generic, short) if isinstance(got, str) else type(got) is type(generic)
    if isinstance(got, SendMessageRequestHeader) and isinstance(generic, SendMessageRequestHeader):
        unit_mode, batch = short.get("k"), short.get("m")
        assert got.unit_mode is (unit_mode is not None and java_bool(unit_mode))
        batch_code = code == RequestCode.SEND_BATCH_MESSAGE
        assert got.batch is (batch_code or (batch is not None and java_bool(batch)))
        assert got == attrs.evolve(generic, batch=got.batch)


_END = {
    "producerGroup": st.text(max_size=3),
    "tranStateTableOffset": st.integers(0, 10**18 - 1).map(str),
    "commitLogOffset": st.integers(0, 10**18 - 1).map(str),
    "commitOrRollback": st.sampled_from(["0", "8", "12"]),
    "msgId": st.text(max_size=3),
}
_END_MORE = {"fromTransactionCheck": _flag, "transactionId": st.text(max_size=3)}
_ODD = st.one_of(_plain_or_odd, st.sampled_from(["0", "8", "12", "G", "2", "-8", "08"]))


@settings(max_examples=300)
@given(
    st.fixed_dictionaries(_END, optional=_END_MORE)
    | st.tuples(
        st.fixed_dictionaries(_END, optional=_END_MORE),
        st.dictionaries(st.sampled_from([*_END, *_END_MORE]), _ODD, max_size=3),
    ).map(lambda sound_odd: sound_odd[0] | sound_odd[1])
    | st.fixed_dictionaries({}, optional={name: _ODD for name in [*_END, *_END_MORE]})
)
def test_the_end_transaction_header_reads_as_the_generic_decoder(ext: dict[str, str]) -> None:
    """plain_header (C or its twin) reads END_TRANSACTION's header as decode() does: same
    header, or the same refusal; fromTransactionCheck as java_bool reads it."""
    got = _outcome(lambda: EndTransactionRequestHeader.from_ext(ext))
    generic = _outcome(lambda: decode(EndTransactionRequestHeader, ext))
    assert _same(got, generic, ext)
    if not isinstance(got, str):
        flag = ext.get("fromTransactionCheck")
        assert got.from_transaction_check is (flag is not None and java_bool(flag))


@given(st.integers(INT_MIN, INT_MAX))
def test_java_int_accepts_its_range(n: int) -> None:
    assert java_int("x", str(n)) == n
    assert java_long("x", str(n)) == n


@given(st.integers().filter(lambda n: not INT_MIN <= n <= INT_MAX))
def test_java_int_refuses_beyond_its_range(n: int) -> None:
    with pytest.raises(HeaderError):
        java_int("x", str(n))


def test_every_header_round_trips_through_encode() -> None:
    pull = PullMessageRequestHeader(
        consumer_group="g",
        topic="t",
        queue_id=3,
        queue_offset=LONG_MAX,
        max_msg_nums=32,
        sys_flag=2,
        commit_offset=-1,
        suspend_timeout_millis=15000,
        subscription="*",
        sub_version=0,
        expression_type="TAG",
    )
    assert decode(PullMessageRequestHeader, encode(pull)) == pull
    send = SendMessageRequestHeader.from_ext(RequestCode.SEND_MESSAGE_V2, SEND_V2)
    assert SendMessageRequestHeader.from_ext(RequestCode.SEND_MESSAGE_V2, send.to_ext(v2=True)) == (
        send
    )


def test_every_registered_header_names_its_required_fields() -> None:
    """An empty request of each code with a header class is refused, naming a field."""
    for code, cls in REQUEST_HEADERS.items():
        request = RemotingCommand.request(code)
        try:
            decode_request(request)
        except HeaderError as exc:
            assert "the custom field <" in str(exc), cls
        else:  # only headers without a required field decode from nothing
            assert request.header is not None


def test_decode_request_keeps_the_header() -> None:
    request = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
    first = decode_request(request)
    assert first.topic == "T"
    assert decode_request(request) is first
    assert decode_request(RemotingCommand.request(RequestCode.HEART_BEAT)) is None


@given(
    st.text(alphabet="0123456789ABCDEF", min_size=32, max_size=32),
    st.integers(0, INT_MAX),
    st.integers(0, LONG_MAX),
    st.text(max_size=12),
    st.booleans(),
)
def test_send_answer_json_is_what_the_codec_writes(
    msg_id: str, queue_id: int, offset: int, region: str, trace: bool
) -> None:
    """The send answer's hand-written extFields JSON decodes to exactly the fields the codec
    would have written for the same answer."""
    import json

    from pymq.remoting.codec import FrameDecoder, encode, quote_json
    from pymq.remoting.headers import SendMessageResponseHeader

    ext = {
        "msgId": msg_id,
        "queueId": str(queue_id),
        "queueOffset": str(offset),
        "MSG_REGION": region,
        "TRACE_ON": "true" if trace else "false",
    }
    fast = RemotingCommand(0, dict(ext), opaque=3, flag=1)
    fast.ext_json = SendMessageResponseHeader.ext_json(
        msg_id, queue_id, offset, quote_json(region), trace
    )
    [decoded] = FrameDecoder().feed(encode(fast))
    assert decoded.ext_fields == ext
    assert json.loads("{" + fast.ext_json + "}") == ext
    header = decode(SendMessageResponseHeader, decoded.ext_fields)
    assert (header.msg_id, header.queue_id, header.queue_offset) == (msg_id, queue_id, offset)


@given(
    st.text(max_size=10),
    st.text(min_size=1, max_size=10),
    st.integers(0, INT_MAX),
    st.integers(0, INT_MAX),
    st.integers(0, LONG_MAX),
    st.integers(INT_MIN, INT_MAX),
    st.text(max_size=30),
    st.booleans(),
)
def test_the_producers_v2_header_is_the_header_class_encoded(
    group, topic, queue_id, sys_flag, born, flag, props, batch
) -> None:
    """The producer's hand-written V2 fields and their JSON say what the header class does."""
    import json

    header = SendMessageRequestHeader(
        group, topic, "TBW102", 4, queue_id, sys_flag, born, flag, props, 0, False, None, batch
    )
    ext = SendMessageRequestHeader.v2_ext(
        group, topic, queue_id, sys_flag, born, flag, props, batch
    )
    assert ext == header.to_ext(v2=True)
    prefix = SendMessageRequestHeader.v2_json_prefix(group, topic)
    assert json.loads("{" + SendMessageRequestHeader.v2_json(prefix, ext) + "}") == ext
    assert SendMessageRequestHeader.from_ext(RequestCode.SEND_MESSAGE_V2, ext) == header


def test_the_send_answer_decodes_as_java_would() -> None:
    from pymq.remoting.headers import SendMessageResponseHeader

    ok = SendMessageResponseHeader.from_ext({"msgId": "AB", "queueId": "3", "queueOffset": "9"})
    assert (ok.msg_id, ok.queue_id, ok.queue_offset) == ("AB", 3, 9)
    with pytest.raises(HeaderError, match="<queueOffset> is null"):
        SendMessageResponseHeader.from_ext({"msgId": "AB", "queueId": "3"})
    with pytest.raises(HeaderError, match="<queueId>"):
        SendMessageResponseHeader.from_ext({"msgId": "AB", "queueId": "x", "queueOffset": "9"})


def test_response_headers_round_trip_as_java_strings() -> None:
    from pymq.remoting import headers as H

    cases = [
        (H.OffsetResponseHeader(LONG_MAX), {"offset": str(LONG_MAX)}),
        (H.GetEarliestMsgStoretimeResponseHeader(1732380000000), {"timestamp": "1732380000000"}),
        (H.GetBrokerConfigResponseHeader('{"counter":1}'), {"version": '{"counter":1}'}),
        (H.GetKVConfigResponseHeader("v"), {"value": "v"}),
        (H.QueryDataVersionResponseHeader(True), {"changed": "true"}),
        (H.RegisterBrokerResponseHeader(None, "10.0.0.1:10911"), {"masterAddr": "10.0.0.1:10911"}),
        (H.WipeWritePermOfBrokerResponseHeader(3), {"wipeTopicCount": "3"}),
        (H.AddWritePermOfBrokerResponseHeader(4), {"addTopicCount": "4"}),
    ]
    for header, ext in cases:
        assert encode(header) == ext  # extFields hold strings, as a Java peer's HashMap
        assert decode(type(header), ext) == header
