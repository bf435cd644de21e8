"""The producer's common send and batch written as one frame (Producer._v2_frame) is byte for
byte the frame the codec writes for the request Producer._v2_request builds, and reads back as
it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pymq.client import producer as producer_module
from pymq.client.producer import Producer
from pymq.common.consumer import MessageQueue
from pymq.remoting.codec import RemotingCommand, decode_frame, encode
from pymq.remoting.codes import RequestCode
from pymq.remoting.headers import SendMessageRequestHeader
from tests.helpers import implementations

_text = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs",)) | st.sampled_from('"\\\x01\x02\n'),
    max_size=12,
)
_int32 = st.integers(-(2**31), 2**31 - 1)
# The frame writer: C's and its twin (the twin alone under PYMQ_PURE_PYTHON=1).
WRITERS = implementations("pymq.client._producerc", "send_frame", producer_module.send_frame_py)


@given(
    code=st.sampled_from([RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE]),
    group=_text,
    topic=_text,
    queue_id=st.integers(0, 2**31 - 1),
    sys_flag=_int32,
    flag=_int32,
    props=_text | st.text(st.characters(max_codepoint=127), max_size=30),
    body=st.binary(max_size=40),
    opaque=st.integers(0, 2**31 - 1),
    born=st.integers(0, 2**62),
    access_key=st.none() | _text.filter(bool),
)
@settings(max_examples=200)
def test_the_send_frame_is_what_the_codec_writes(
    code: int, group: str, topic: str, queue_id: int, sys_flag: int, flag: int, props: str,
    body: bytes, opaque: int, born: int, access_key: str | None,
) -> None:  # fmt: skip
    """The frame written whole is the request _v2_request builds, through the codec; with
    credentials, its extFields are the request's as the channel's AclSigner signs it
    (AccessKey, and the same Signature), and the broker's check passes it."""
    from pymq.acl.plain import SigningKey
    from pymq.acl.rpc_hook import AclSigner

    signer = None if access_key is None else AclSigner(access_key, "s3cret")
    producer = Producer(group, "127.0.0.1:9876")
    mq = MessageQueue(topic, "broker-a", queue_id)
    frame = producer._v2_frame(code, mq, sys_flag, flag, props, body, opaque, born, signer)
    # The request as _v2_request builds it (with the same born timestamp), through the codec:
    # once with its extFields JSON written by the header's encoder, once from the dict alone.
    ext = SendMessageRequestHeader.v2_ext(
        group, topic, queue_id, sys_flag, born, flag, props, code == RequestCode.SEND_BATCH_MESSAGE
    )
    request = RemotingCommand(int(code), ext, body, opaque)
    back = decode_frame(frame[4:])
    assert (back.code, back.opaque, back.flag, back.body) == (code, opaque, 0, body)
    if signer is not None:
        signer(request)
        assert back.ext_fields == request.ext_fields
        key, sign = SigningKey(b"s3cret"), back.ext_fields["Signature"]
        assert key.verify(back.ext_fields, body, sign)
        assert not SigningKey(b"other").verify(back.ext_fields, body, sign)
        return
    assert frame == encode(request) and back.ext_fields == ext
    request.ext_json = SendMessageRequestHeader.v2_json(
        SendMessageRequestHeader.v2_json_prefix(group, topic), ext
    )
    assert frame == encode(request)
    # A second send to the topic uses the kept text.
    assert producer._v2_frame(code, mq, sys_flag, flag, props, body, opaque, born) == frame
    # The frame writer (C's and its twin) writes the frame of ASCII properties.
    for writer in [p.values[0] for p in WRITERS] if props.isascii() else []:
        assert writer(
            producer_module._V2_FRAME_HEAD[code], opaque,
            producer._frame_json[topic], queue_id, sys_flag, born, flag, props,
            producer_module._V2_FRAME_TAIL[code], body,
        ) == frame  # fmt: skip


@pytest.mark.parametrize("native", WRITERS)
def test_the_c_frame_writer_declines_what_python_writes(native) -> None:
    """Properties that are not ASCII, or numbers past a long long, are left to Python."""
    head, tail = b'{"opaque":', b"}"
    assert native(head, 1, b",", 0, 0, 0, 0, "\u00e9", tail, b"") is None
    assert native(head, 2**63, b",", 0, 0, 0, 0, "a", tail, b"") is None
    assert native(head, True, b",", 0, 0, 0, 0, "a", tail, b"") is None
    with pytest.raises(TypeError):  # the frame's fixed parts are the caller's bytes
        native(head, 1, bytearray(b","), 0, 0, 0, 0, "a", tail, b"")
    frame = native(head, -(2**63), b",", 1, -2, 3, -4, '"\\\x01\x1f\x7f\n', tail, b"B")
    assert frame is not None
    assert frame[8:] == (
        b'{"opaque":-9223372036854775808,"e":"1","f":"-2","g":"3","h":"-4",'
        b'"i":"\\"\\\\\\u0001\\u001f\\u007f\\n",}B'
    )


@pytest.mark.parametrize("body_type", [bytearray, memoryview])
def test_the_send_frame_takes_a_body_of_any_bytes_like_type(body_type) -> None:
    """The frame writer (and the codec) take any bytes-like body (b"" + body): a message whose
    body is a bytearray or a memoryview is sent as before (the writer in use, C or its twin,
    may decline it but not raise)."""
    producer = Producer("G", "127.0.0.1:9876")
    mq = MessageQueue("T", "broker-a", 0)
    code = RequestCode.SEND_MESSAGE_V2
    want = producer._v2_frame(code, mq, 0, 0, "a\x01b", b"xyz", 7, 1)
    assert producer._v2_frame(code, mq, 0, 0, "a\x01b", body_type(b"xyz"), 7, 1) == want
