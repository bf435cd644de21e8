"""The frame decoder under hostile input: it returns sound commands or raises ProtocolError.

The contract (issue #12): ``FrameDecoder().feed(data)`` either returns a list of
``RemotingCommand`` or raises :class:`ProtocolError`, never anything else (OverflowError,
RecursionError, MemoryError, TypeError, KeyError, ...); every command it returns has ``code``,
``opaque``, ``flag`` and ``version`` as ints within Java's int32 range and ``ext_fields`` a dict
of str to str; and :func:`encode` of such a command does not raise.  Feeding the same bytes in
any pieces gives the same outcome.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pymq.remoting.codec import FrameDecoder, RemotingCommand, encode
from pymq.remoting.codes import LanguageCode, SerializeType

from .frames import (
    BAD_UTF8,
    INT32_MAX,
    INT32_MIN,
    LITERALS,
    LYING_LENGTHS,
    binary_frames,
    binary_header,
    deep_json_frames,
    deep_nesting,
    feed_checked,
    frame,
    json_frame,
    json_frames,
    json_object,
    valid_header_members,
)

FUZZ = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,  # the same examples every run: a failure reproduces
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_counts: dict[str, int] = {}


def _count(name: str) -> None:
    _counts[name] = _counts.get(name, 0) + 1


@pytest.fixture(scope="module", autouse=True)
def _report_rate():
    start = time.perf_counter()
    yield
    elapsed = time.perf_counter() - start
    total = sum(_counts.values())
    print(f"\ncodec fuzz: {total} cases in {elapsed:.1f} s ({total / elapsed:.0f}/s) {_counts}")


# -- properties -------------------------------------------------------------------------------


@FUZZ
@given(json_frames)
def test_json_header_frames_decode_or_refuse(data: bytes) -> None:
    _count("json")
    feed_checked(data)


@settings(FUZZ, max_examples=100)
@given(deep_json_frames)
def test_deeply_nested_json_headers_decode_or_refuse(data: bytes) -> None:
    _count("json-deep")
    feed_checked(data)


@FUZZ
@given(binary_frames)
def test_binary_header_frames_decode_or_refuse(data: bytes) -> None:
    _count("binary")
    feed_checked(data)


@FUZZ
@given(st.binary(max_size=200))
def test_random_bytes_decode_or_refuse(data: bytes) -> None:
    _count("bytes")
    feed_checked(data)


@settings(FUZZ, max_examples=100)
@given(st.lists(json_frames | binary_frames, min_size=1, max_size=3))
def test_any_split_gives_the_outcome_of_the_whole(frames: list[bytes]) -> None:
    """Whatever the frames, feeding them cut at any byte (or byte by byte) gives the same
    commands as feeding them whole, or a ProtocolError as well."""
    _count("split")
    stream = b"".join(frames)
    whole = feed_checked(stream)
    cuts = range(len(stream) + 1) if len(stream) <= 400 else range(0, len(stream) + 1, 37)
    for cut in cuts:
        decoder = FrameDecoder()
        got: list[RemotingCommand] | None = []
        try:
            got = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:])
        except Exception as exc:
            if whole is not None or type(exc).__name__ != "ProtocolError":
                raise AssertionError(f"cut at {cut}: {exc!r}; whole: {whole!r}") from exc
            got = None
        assert got == whole, f"cut at {cut}"
    if len(stream) <= 2000:
        assert feed_checked(stream, chunk=1) == whole


@settings(FUZZ, max_examples=100)
@given(json_frames | binary_frames)
def test_decoded_commands_reencode_to_themselves(data: bytes) -> None:
    """A command the decoder accepted, written back, decodes to the same command."""
    _count("reencode")
    cmds = feed_checked(data)
    for cmd in cmds or ():
        again = FrameDecoder().feed(encode(cmd))
        assert len(again) == 1
        got = again[0]
        for name in ("code", "opaque", "flag", "version", "ext_fields", "remark", "body"):
            assert getattr(got, name) == getattr(cmd, name), name


# -- the classes of input, one by one (deterministic, so each failure shows on its own) ------


def _field_cases() -> list:
    cases = []
    for field in ("code", "opaque", "flag", "version", "language", "remark"):
        for literal in LITERALS:
            members = valid_header_members()
            for m in members:
                if m[0] == field:
                    m[1] = literal
                    break
            else:
                members.append([field, literal])
            cases.append(pytest.param(json_frame(members), id=f"{field}={literal[:24]}"))
    for literal in LITERALS:
        members = valid_header_members()
        members[5][1] = literal  # extFields itself
        cases.append(pytest.param(json_frame(members), id=f"extFields={literal[:24]}"))
        members = valid_header_members()
        members[5][1] = json_object([("topic", literal)])
        cases.append(pytest.param(json_frame(members), id=f"extFields.topic={literal[:24]}"))
        members = valid_header_members()
        members[5][1] = json_object([(literal, '"x"')])
        cases.append(pytest.param(json_frame(members), id=f"extFields[{literal[:24]}]"))
    return cases


@pytest.mark.parametrize("data", _field_cases())
def test_every_literal_in_every_header_field(data: bytes) -> None:
    _count("fields")
    feed_checked(data)


def _deep_cases() -> list:
    cases = []
    for depth in (100, 1000, 3000, 10_000):
        for kind in ("[", "{", "mixed"):
            for closed in (True, False):
                nest = deep_nesting(depth, kind, closed)
                tag = f"{kind}x{depth}{'' if closed else '-open'}"
                cases.append(pytest.param(json_frame(nest), id=f"header={tag}"))
                for field in ("code", "version", "remark", "extFields"):
                    members = valid_header_members()
                    members.append([field, nest])
                    cases.append(pytest.param(json_frame(members), id=f"{field}={tag}"))
                members = valid_header_members()
                members[5][1] = json_object([("a", nest)])
                cases.append(pytest.param(json_frame(members), id=f"extFields.a={tag}"))
    return cases


@pytest.mark.parametrize("data", _deep_cases())
def test_deep_nesting(data: bytes) -> None:
    _count("deep")
    feed_checked(data)


def _framing_cases() -> list:
    sound = json_frame(valid_header_members())
    header = sound[8:]
    cases = []
    for length in LYING_LENGTHS:
        cases.append(pytest.param(frame(header, length=length), id=f"length={length}"))
    for hlen in (0, 1, len(header) - 1, len(header) + 1, 0xFFFFFF):
        cases.append(pytest.param(frame(header, header_length=hlen), id=f"headerLength={hlen}"))
    for stype in (2, 127, 128, 255):
        cases.append(pytest.param(frame(header, serialize_type=stype), id=f"type={stype}"))
    for bad in BAD_UTF8:
        for at in (1, len(header) // 2, len(header) - 1):
            data = header[:at] + bad + header[at:]
            cases.append(pytest.param(frame(data), id=f"utf8 {bad.hex()} at {at}"))
    for cut in range(0, len(sound), 9):
        cases.append(pytest.param(sound[:cut], id=f"truncated at {cut}"))
    cases.append(pytest.param(frame(b"\xef\xbb\xbf" + header), id="BOM"))
    cases.append(pytest.param(frame(b" \t\n" + header + b"\n"), id="whitespace"))
    cases.append(pytest.param(frame(header + b"{}"), id="two objects"))
    cases.append(pytest.param(frame(b""), id="empty header"))
    cases.append(pytest.param(frame(b"x" * 5000), id="junk header"))
    dup = json_object([("code", "105"), ("code", "1e999"), ("opaque", "1")])
    cases.append(pytest.param(json_frame(dup), id="duplicate code"))
    return cases


@pytest.mark.parametrize("data", _framing_cases())
def test_lying_framing(data: bytes) -> None:
    _count("framing")
    feed_checked(data)


def _binary_cases() -> list:
    cases = []
    ext = [(b"topic", b"TopicTest"), (b"queueId", b"1")]
    for remark_len in (-1, INT32_MIN, 1, 100, INT32_MAX):
        data = binary_header(remark=b"hi", remark_len=remark_len, ext=ext)
        cases.append(pytest.param(frame(data, serialize_type=1), id=f"remarkLen={remark_len}"))
    for ext_len in (-1, INT32_MIN, 1, 3, 7, INT32_MAX):
        data = binary_header(ext=ext, ext_len=ext_len)
        cases.append(pytest.param(frame(data, serialize_type=1), id=f"extLen={ext_len}"))
    for klen, vlen in ((-1, None), (None, -1), (200, None), (None, 200), (-32768, INT32_MIN)):
        data = binary_header(ext=ext, entry_lens=[(klen, vlen)])
        cases.append(pytest.param(frame(data, serialize_type=1), id=f"entry={klen},{vlen}"))
    for bad in BAD_UTF8:
        for where in ("remark", "key", "value"):
            data = binary_header(
                remark=bad if where == "remark" else b"r",
                ext=[(bad if where == "key" else b"k", bad if where == "value" else b"v")],
            )
            cases.append(pytest.param(frame(data, serialize_type=1), id=f"{where} {bad.hex()}"))
    for language in (0, 12, 13, 99, 255):
        data = binary_header(language=language)
        cases.append(pytest.param(frame(data, serialize_type=1), id=f"language={language}"))
    for code in (-(2**15), -1, 2**15 - 1):
        data = binary_header(code=code, version=code, opaque=INT32_MIN, flag=-1)
        cases.append(pytest.param(frame(data, serialize_type=1), id=f"code={code}"))
    data = binary_header()
    for cut in range(len(data)):
        cases.append(pytest.param(frame(data[:cut], serialize_type=1), id=f"cut at {cut}"))
    return cases


@pytest.mark.parametrize("data", _binary_cases())
def test_binary_header_edges(data: bytes) -> None:
    _count("binary-edges")
    feed_checked(data)


def test_sound_frames_still_decode() -> None:
    """The hostile inputs' sound originals decode to what they say (the fuzz is not vacuous)."""
    members = valid_header_members(310, {"a": "G", "b": "T", "e": "1"})
    cmds = feed_checked(json_frame(members, b"body"))
    assert cmds is not None and len(cmds) == 1
    cmd = cmds[0]
    assert (cmd.code, cmd.opaque, cmd.version, cmd.flag) == (310, 7, 399, 0)
    assert (cmd.ext_fields, cmd.body) == ({"a": "G", "b": "T", "e": "1"}, b"body")
    binary = frame(binary_header(code=11, ext=[(b"topic", b"T")]), b"b", serialize_type=1)
    cmd = (feed_checked(binary) or [None])[0]
    assert cmd is not None and cmd.serialize_type == SerializeType.ROCKETMQ
    assert (cmd.code, cmd.ext_fields, cmd.language) == (11, {"topic": "T"}, LanguageCode.JAVA.name)
