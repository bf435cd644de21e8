"""Sans-IO codec of RocketMQ remoting frames (``RemotingCommand``), in the style of h11.

A frame, all integers big-endian::

    int32 length = 4 + header length + body length   (the length field does not count itself)
    int32 (serialize type << 24) | header length
    header (JSON, type 0; or the ROCKETMQ binary form, type 1)
    body

:class:`FrameDecoder` is fed bytes and returns whole commands; it never touches a socket.  Bad
input raises :class:`~pymq.remoting.errors.ProtocolError`, after which the decoder is spent and
the connection must be closed.  :func:`encode` writes a command back in its own serialize type
(a response carries the request's type, as RocketMQ's broker answers in kind).
"""

from __future__ import annotations

import itertools
import json
import operator
import re
import struct
import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeGuard

import attrs
import orjson

from pymq.common.native import load_native
from pymq.common.serde import parse_java_bool
from pymq.remoting.codes import CURRENT_VERSION, LanguageCode, ResponseCode, SerializeType
from pymq.remoting.errors import ProtocolError, RemotingCommandError
from pymq.remoting.headers import INT_MAX, INT_MIN

_native: Any = load_native("pymq.remoting._codecc")

# NettyDecoder's FRAME_MAX_LENGTH default: a frame claiming more is refused, not buffered.
FRAME_MAX_LENGTH = 16 * 1024 * 1024

RPC_TYPE_RESPONSE = 1  # flag bit 0
RPC_ONEWAY = 2  # flag bit 1

_INT = struct.Struct(">i")
_FRAME_PREFIX = struct.Struct(">ii")
_BIN_FIXED = struct.Struct(">hbhii")  # code, language, version, opaque, flag
_SHORT = struct.Struct(">h")

_MISSING: Any = object()

# One encoder, built once: json.dumps with non-default arguments builds a new one every call.
_JSON_ENCODER = json.JSONEncoder(separators=(",", ":"))
_JSON_DECODER = json.JSONDecoder()
_fast_loads = orjson.loads
# The C string quoter json.dumps uses (ASCII-escaped, quotes included).
_quote = json.encoder.encode_basestring_ascii
quote_json = _quote

_opaque_counter = itertools.count(1)


def next_opaque() -> int:
    """A process-wide request id, as Java's ``RemotingCommand.requestId`` counter hands out."""
    return next(_opaque_counter) & 0x7FFFFFFF


def java_string(value: object) -> str | None:
    """Normalise one extFields value to the string a Java peer would have sent (None: absent)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(value, separators=(",", ":"))


@attrs.define(slots=True)
class RemotingCommand:
    """One request or response.  ``ext_fields`` always holds strings, as Java's map does."""

    code: int
    ext_fields: dict[str, str] = attrs.Factory(dict)
    body: bytes = b""
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    language: str = "JAVA"
    version: int = CURRENT_VERSION
    serialize_type: SerializeType = SerializeType.JSON
    # extFields already written as JSON members (the text between the braces), used by the
    # JSON writer instead of ``ext_fields``; whoever sets it fills ``ext_fields`` identically.
    # The send path's answer uses it: its five fields are known to need no escaping.
    ext_json: str | None = None
    # The typed request header (pymq.remoting.headers), decoded and validated once.
    header: Any = None
    # Set by the decoder when the frame was sound but a header field is not what Java's typed
    # decode accepts (a number out of its Java type, a string where a number is due, ...): the
    # connection answers such a request SYSTEM_ERROR with this text and never serves it.
    header_error: str | None = None
    # Set by a server's access check (ACL) once it let the request through, so that a request
    # the inline path handed on to a task is not checked twice.
    access_checked: bool = False

    @classmethod
    def request(
        cls,
        code: int,
        ext_fields: Mapping[str, object] | None = None,
        body: bytes = b"",
        *,
        oneway: bool = False,
    ) -> RemotingCommand:
        fields = {
            k: v if type(v) is str else s
            for k, v in (ext_fields or {}).items()
            if type(v) is str or (s := java_string(v)) is not None
        }
        return cls(
            code=int(code),
            ext_fields=fields,  # type: ignore[arg-type]  # s is a str whenever v is not
            body=body,
            opaque=next_opaque(),
            flag=RPC_ONEWAY if oneway else 0,
        )

    @property
    def is_response(self) -> bool:
        return bool(self.flag & RPC_TYPE_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & RPC_ONEWAY)

    def response(
        self,
        code: int = ResponseCode.SUCCESS,
        remark: str | None = None,
        ext_fields: Mapping[str, object] | None = None,
        body: bytes = b"",
    ) -> RemotingCommand:
        """The answer to this request: same opaque and serialize type, response flag set."""
        fields = {k: s for k, v in (ext_fields or {}).items() if (s := java_string(v)) is not None}
        return RemotingCommand(
            code=int(code),
            ext_fields=fields,
            body=body,
            opaque=self.opaque,
            flag=RPC_TYPE_RESPONSE,
            remark=remark,
            serialize_type=self.serialize_type,
        )

    # -- typed access to extFields; a missing or malformed field raises RemotingCommandError --

    def ext_str(self, name: str, default: Any = _MISSING) -> Any:
        value = self.ext_fields.get(name)
        if value is None:
            if default is _MISSING:
                raise RemotingCommandError(f"the custom field <{name}> is null")
            return default
        return value

    def ext_int(self, name: str, default: Any = _MISSING) -> Any:
        value = self.ext_fields.get(name)
        if value is None or value == "":
            if default is _MISSING:
                raise RemotingCommandError(f"the custom field <{name}> is null")
            return default
        try:
            return int(value.strip())
        except ValueError:
            raise RemotingCommandError(
                f"the custom field <{name}> is not a number: {value!r}"
            ) from None

    def ext_bool(self, name: str, default: bool = False) -> bool:
        value = self.ext_fields.get(name)
        if value is None or value == "":
            return default
        return parse_java_bool(value)


# -- encoding ---------------------------------------------------------------------------------


def _json_value(value: object) -> str:
    # extFields hold strings; anything else a caller slipped in is written as JSON would.
    return _quote(value) if type(value) is str else _JSON_ENCODER.encode(value)


def _json_header(cmd: RemotingCommand) -> bytes:
    """The JSON header, written directly: the fields are known, so no dict is built for it.

    Strings are written ASCII-escaped, as ``json.dumps`` writes them by default.
    """
    ext = cmd.ext_json
    if ext is None:
        ext = ",".join([_quote(k) + ":" + _json_value(v) for k, v in cmd.ext_fields.items()])
    # extFields is always present: the C++ client dereferences it.
    remark = "" if cmd.remark is None else ',"remark":' + _quote(cmd.remark)
    return (
        f'{{"code":{int(cmd.code)},"language":{_quote(cmd.language)},'
        f'"version":{int(cmd.version)},"opaque":{int(cmd.opaque)},"flag":{int(cmd.flag)}'
        f'{remark},"extFields":{{{ext}}},"serializeTypeCurrentRPC":"JSON"}}'
    ).encode()


_frame_bounds: Callable[..., tuple[list[int], int, int | None]] | None = getattr(
    _native, "frame_bounds", None
)
"""``_recordc.frame_bounds``: FrameDecoder.feed_frames' walk over whole frames, in C (None:
its twin, _walk_frames)."""

# Read per frame: an enum member read through its class is a slow attribute lookup.
_SERIALIZE_JSON = SerializeType.JSON
_SERIALIZE_ROCKETMQ = SerializeType.ROCKETMQ


def _language_number(language: str) -> int:
    try:
        return LanguageCode[language].value
    except KeyError:
        return LanguageCode.OTHER.value


def _binary_header(cmd: RemotingCommand) -> bytes:
    parts = [
        _BIN_FIXED.pack(cmd.code, _language_number(cmd.language), cmd.version, cmd.opaque, cmd.flag)
    ]
    remark = cmd.remark.encode() if cmd.remark else b""
    parts.append(_INT.pack(len(remark)))
    parts.append(remark)
    ext = bytearray()
    for key, value in cmd.ext_fields.items():
        k = key.encode()
        v = value.encode()
        ext += _SHORT.pack(len(k)) + k + _INT.pack(len(v)) + v
    parts.append(_INT.pack(len(ext)))
    parts.append(bytes(ext))
    return b"".join(parts)


def encode(cmd: RemotingCommand) -> bytes:
    """The whole frame for ``cmd``, length prefix included."""
    rocketmq = cmd.serialize_type == _SERIALIZE_ROCKETMQ
    header = _binary_header(cmd) if rocketmq else _json_header(cmd)
    body = cmd.body or b""
    return (
        _FRAME_PREFIX.pack(
            4 + len(header) + len(body), (int(cmd.serialize_type) << 24) | len(header)
        )
        + header
        + body
    )


# -- decoding ---------------------------------------------------------------------------------


# A JSON header longer than this is refused (the frame's connection closes).  A sound header is a
# few hundred bytes, a send's at most some 32 KiB of properties; the cap bounds what one frame can
# make the JSON parser build (a megabyte of "[]," is some 40 MB of Python lists).  Nesting needs no
# check of its own: the parser gives up past the interpreter's recursion limit (~1,000 levels)
# with a RecursionError, refused like any other malformed header.
MAX_JSON_HEADER_LENGTH = 1 << 20

INT32_MIN, INT32_MAX = INT_MIN, INT_MAX  # Java's int, as the header module reads it
# extFields values a Java peer could mean as a string; containers are refused.
_SCALARS = (str, int, float, bool)


def _describe(value: object) -> str:
    """A short, safe description of a decoded JSON value (no repr of deep containers)."""
    if value is None or isinstance(value, (int, float, str)):
        text = repr(value)
        return text if len(text) <= 40 else text[:40] + "..."
    return f"a JSON {'array' if type(value) is list else 'object'}"


def _int32(value: object) -> TypeGuard[int]:
    return type(value) is int and INT32_MIN <= value <= INT32_MAX


def _decode_json_header(data: bytes) -> RemotingCommand:
    """The command of a JSON header.  A header that is no JSON object, or whose opaque cannot be
    echoed, is a ProtocolError (the connection closes, as Java's decoder closes it); a sound
    header with a field Java's typed decode would refuse comes back with ``header_error`` set.

    orjson parses first (half the cost of ``json``'s parser); a header it refuses, or one with
    anything but the plain shape (Java ints, string extFields, string remark and language), is
    parsed again by ``json`` and judged by :func:`_checked_command`, so every answer is the
    one ``json`` alone would give (orjson turns integers past 64 bits into floats and refuses
    lone surrogates, where ``json`` keeps them)."""
    if len(data) > MAX_JSON_HEADER_LENGTH:
        raise ProtocolError(f"JSON header of {len(data)} bytes (at most {MAX_JSON_HEADER_LENGTH})")
    try:
        header = _fast_loads(data)
    except ValueError:  # orjson.JSONDecodeError; RecursionError cannot happen (depth 1024)
        return _checked_command(_json_loads(data))
    cmd = _json_command(header, RemotingCommand, _SERIALIZE_JSON)
    if cmd is not None:  # the plain case
        return cmd
    return _checked_command(_json_loads(data))


def json_command_py(header: Any, cls: Any, serialize_type: Any) -> Any:
    """Python twin of ``pymq.remoting._codecc.json_command``: _decode_json_header's plain case
    after orjson, a header dict whose code, opaque, flag and version are Java ints (opaque, flag
    and version 0 when absent), extFields a dict of str (absent or null: empty; the C++ client's
    booleans, integers and nulls normalised as strings), remark absent or a str, language a
    non-empty str, as cls(code, ext, b"", opaque, flag, remark, language, version,
    serialize_type); None for anything else, which _checked_command judges."""
    if type(header) is dict:
        get = header.get
        opaque, code, flag = get("opaque", 0), get("code"), get("flag", 0)
        version, ext = get("version", 0), get("extFields")
        if ext is None:  # fastjson leaves out a null map: requests without a custom header
            ext = {}
        remark, language = get("remark"), get("language")
        # Java's int range as literals (constants, not global loads: every frame passes here).
        if (
            type(opaque) is int
            and -0x80000000 <= opaque <= 0x7FFFFFFF
            and type(code) is int
            and -0x80000000 <= code <= 0x7FFFFFFF
            and type(flag) is int
            and -0x80000000 <= flag <= 0x7FFFFFFF
            and type(version) is int
            and -0x80000000 <= version <= 0x7FFFFFFF
            and type(ext) is dict
            and (remark is None or type(remark) is str)
            and type(language) is str
            and language
        ):
            for value in ext.values():
                if type(value) is not str:
                    break
            else:
                return cls(code, ext, b"", opaque, flag, remark, language, version, serialize_type)
            # The C++ client writes numbers and booleans in extFields: normalised here when
            # both parsers read them alike (booleans, nulls, integers).
            plain = {}
            for key, value in ext.items():
                kind = type(value)
                if kind is str:
                    plain[key] = value
                elif kind is bool:
                    plain[key] = "true" if value else "false"
                elif kind is int:  # exact: orjson makes floats of what does not fit 64 bits
                    plain[key] = str(value)
                elif value is not None:
                    break
            else:
                return cls(
                    code, plain, b"", opaque, flag, remark, language, version, serialize_type
                )
    return None


# _decode_json_header's plain case: the C module's when built, else its twin above.
_json_command: Callable[..., RemotingCommand | None] = getattr(
    _native, "json_command", json_command_py
)

# json_header_py's plain JSON header: JSON's whitespace, strings of printable ASCII and escapes
# (no surrogate escape), member names without escapes, integers of at most 18 digits, only
# extFields an object (of strings) and no other container.  Possessive quantifiers: a damaged
# header fails in linear time.
_J_WS = rb"[ \t\n\r]*+"
_J_STR = (
    rb'"(?:[\x20\x21\x23-\x5b\x5d-\x7f]++|\\["\\/bfnrt]|\\u(?![dD][89a-fA-F])[0-9a-fA-F]{4})*+"'
)
_J_PAIR = _J_STR + _J_WS + rb":" + _J_WS + _J_STR + _J_WS
_J_OBJECT = rb"\{" + _J_WS + rb"(?:" + _J_PAIR + rb"(?:," + _J_WS + _J_PAIR + rb")*+)?\}"
_J_MEMBER = (
    rb'(?:"extFields"' + _J_WS + rb":" + _J_WS + rb"(?:null|" + _J_OBJECT + rb")"
    + rb'|"(?!extFields")[\x20\x21\x23-\x5b\x5d-\x7f]*+"' + _J_WS + rb":" + _J_WS
    + rb"(?:-?(?:0|[1-9][0-9]{0,17})(?![0-9])|" + _J_STR + rb"|true|false|null))" + _J_WS
)  # fmt: skip
_J_HEADER = re.compile(
    _J_WS + rb"\{" + _J_WS + _J_MEMBER + rb"(?:," + _J_WS + _J_MEMBER + rb")*+\}" + _J_WS
)
# One member of a header _J_HEADER matched and the separator after it, its name captured:
# findall from just inside the braces walks the members in turn.
_J_NAMES = re.compile(
    _J_WS + rb'"([^"]*+)"' + _J_WS + rb":" + _J_WS + rb"(?:" + _J_OBJECT + rb"|" + _J_STR
    + rb"|[-0-9a-z]++)" + _J_WS + rb"[,}]"
)  # fmt: skip
# The names json_header reads, each at most once, as string tokens anywhere in the header: a
# header holding one twice (as a name or in a value) has its members' names counted.
_J_KNOWN = re.compile(rb'"(?:code|opaque|flag|version|extFields|remark|language)"')
_J_READ = frozenset((b"code", b"opaque", b"flag", b"version", b"extFields", b"remark", b"language"))


def _index_arg(value: Any, name: str) -> int:
    """An index argument as the C module's arg_int reads it (0 up to the largest size)."""
    x = operator.index(value)
    if not 0 <= x <= sys.maxsize:
        raise OverflowError(f"{name} = {x} does not fit its record field")
    return x


def json_header_py(buf: Any, start: Any, end: Any, cls: Any, serialize_type: Any) -> Any:
    """Python twin of ``pymq.remoting._codecc.json_header``: _decode_json_header's plain case
    read from the header's bytes buf[start:end]: a JSON object whose members have plain
    (escape-free ASCII) names, code, opaque, flag and version Java ints (opaque, flag and
    version 0 when absent, code required), extFields an object of strings or null, remark a
    string or null, language a non-empty string, each of these once, and any other member a
    string, integer (at most 18 digits), true, false or null; strings of printable ASCII and
    escapes other than surrogates.  Returns cls(code, ext, b"", opaque, flag, remark,
    language, version, serialize_type), or None for anything else (judged by the general
    decoder)."""
    start = _index_arg(start, "start")
    end = _index_arg(end, "end")
    if type(buf) is bytes:
        if end > len(buf) or start > end:
            return None
        data = buf[start:end]
    else:  # any other buffer, read as its bytes (the C module's PyBUF_SIMPLE)
        with memoryview(buf) as view, view.cast("B") as raw:
            if end > raw.nbytes or start > end:
                return None
            data = raw[start:end].tobytes()
    if not data.isascii() or _J_HEADER.fullmatch(data) is None:
        return None
    known = _J_KNOWN.findall(data)
    if len(set(known)) != len(known):  # a name twice: as two members, or also in a value?
        names = [n for n in _J_NAMES.findall(data, data.index(b"{") + 1) if n in _J_READ]
        if len(set(names)) != len(names):
            return None
    header = _fast_loads(data)  # sound JSON: _J_HEADER matched
    get = header.get
    code, opaque, flag = get("code"), get("opaque", 0), get("flag", 0)
    version, ext = get("version", 0), get("extFields")
    remark, language = get("remark"), get("language")
    if (
        type(code) is int
        and -0x80000000 <= code <= 0x7FFFFFFF
        and type(opaque) is int
        and -0x80000000 <= opaque <= 0x7FFFFFFF
        and type(flag) is int
        and -0x80000000 <= flag <= 0x7FFFFFFF
        and type(version) is int
        and -0x80000000 <= version <= 0x7FFFFFFF
        and (remark is None or type(remark) is str)
        and type(language) is str
        and language
    ):
        if ext is None:
            ext = {}
        return cls(code, ext, b"", opaque, flag, remark, language, version, serialize_type)
    return None


_json_header_at: Callable[..., RemotingCommand | None] = getattr(
    _native, "json_header", json_header_py
)
"""The plain JSON header read straight from the frame (the C module's, else its twin above);
None for the general decoder, _decode_json_header."""


# -- the send tier's readers: send_fields, send_run_fields, send_answer_fields ---------------
#
# The C module reads these headers with one scanner (j_header); the twins check the same
# grammar with a regular expression, then read the values with json.  The grammar: JSON's
# whitespace; member names of printable ASCII without escapes; strings of printable ASCII and
# escapes (no surrogate escape); integers of at most 18 digits without fraction or exponent;
# every value a string, integer, true, false or null, but extFields, a non-empty object of such.
_S_NAME = rb'"[\x20\x21\x23-\x5b\x5d-\x7f]*+"'
_S_SCALAR = rb"(?:" + _J_STR + rb"|true|false|null|-?(?:0|[1-9][0-9]{0,17})(?![0-9.eE]))"
_S_EXT_MEMBER = _S_NAME + _J_WS + rb":" + _J_WS + _S_SCALAR + _J_WS
_S_EXT = rb"\{" + _J_WS + _S_EXT_MEMBER + rb"(?:," + _J_WS + _S_EXT_MEMBER + rb")*+\}"
_S_MEMBER = _S_NAME + _J_WS + rb":" + _J_WS + rb"(?:" + _S_SCALAR + rb"|" + _S_EXT + rb")" + _J_WS
_S_HEADER = re.compile(
    _J_WS + rb"\{" + _J_WS + rb"(?:" + _S_MEMBER + rb"(?:," + _J_WS + _S_MEMBER + rb")*+)?\}"
    + _J_WS
)  # fmt: skip
_S_READ_INTS = frozenset(("code", "opaque", "flag", "version"))
_S_READ = _S_READ_INTS | {"extFields", "remark", "language"}
_S_DIGITS = re.compile(r"[0-9]+")
_S_LONG_NAMES = (
    "producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag",
    "bornTimestamp", "flag", "properties", "reconsumeTimes", "unitMode", "maxReconsumeTimes",
    "batch",
)  # fmt: skip
_S_SLOTS = {chr(ord("a") + i): (i, 1) for i in range(13)} | {
    name: (i, 2) for i, name in enumerate(_S_LONG_NAMES)
}
_ANSWER_SLOTS = {"msgId": 0, "queueId": 1, "queueOffset": 2, "transactionId": 3}


def _pairs(pairs: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    return pairs


def _frame_header(buf: Any, start: Any, end: Any) -> tuple[bytes, int] | None:
    """The JSON header's bytes of the frame buf[start:end] (its length field stripped) and
    where it ends, as the C module's json_frame_header finds them; None when the frame is
    shorter than its header, the header is not JSON, or it is past MAX_JSON_HEADER_LENGTH."""
    start = _index_arg(start, "start")
    end = _index_arg(end, "end")
    with memoryview(buf) as view, view.cast("B") as raw:
        if end > raw.nbytes or start > end or end - start < 4:
            return None
        (field,) = _INT.unpack_from(raw, start)
        header_end = start + 4 + (field & 0xFFFFFF)
        if field >> 24 or header_end > end or field & 0xFFFFFF > MAX_JSON_HEADER_LENGTH:
            return None
        return raw[start + 4 : header_end].tobytes(), header_end


def _scan_header(data: bytes) -> tuple[dict[str, Any], list[tuple[str, Any]]] | None:
    """The header's members the C scanner reads (code, opaque, flag, version as Java ints,
    remark, language, each once; language a non-empty string) and extFields' members in
    order, or None where j_header returns 0 (outside the grammar, a member read twice, a
    value of the wrong kind, no extFields object)."""
    if not data.isascii() or _S_HEADER.fullmatch(data) is None:
        return None
    top = json.loads(data, object_pairs_hook=_pairs)  # sound: the grammar matched
    read: dict[str, Any] = {}
    ext: list[tuple[str, Any]] | None = None
    for name, value in top:
        if name in _S_READ:
            if name in read:
                return None
            read[name] = value
            if name in _S_READ_INTS:
                if type(value) is not int or not -0x80000000 <= value <= 0x7FFFFFFF:
                    return None
            elif name == "extFields":
                if type(value) is not list:
                    return None
                ext = value
            elif name == "remark":
                if value is not None and type(value) is not str:
                    return None
            elif type(value) is not str:  # language
                return None
        elif type(value) is list:  # an object outside extFields
            return None
    language = read.get("language")
    if not language or ext is None:
        return None
    return read, ext


def _plain_number(value: Any, digits: int) -> int | None:
    """The C module's plain_number: a plain non-negative decimal of at most ``digits`` ASCII
    digits as an int, else None."""
    if type(value) is not str or not 0 < len(value) <= digits or not value.isascii():
        return None
    return int(value) if _S_DIGITS.fullmatch(value) else None


def _plain_bool(value: Any) -> bool | None:
    return {"true": True, "false": False, "1": True, "0": False}.get(value)


def _send_slots(members: list[tuple[str, Any]]) -> tuple[list[str | None], int] | None:
    """SendMessageRequestHeader's fields among extFields' ``members`` by slot (a..m order) as
    the C module's ext_slots reads them, and which kind of names gave them (1 V2's one-letter
    names, 2 the long ones); None for a slot given twice or a negative number."""
    ext: list[str | None] = [None] * 13
    seen = names = 0
    for name, value in members:
        slot = _S_SLOTS.get(name)
        if slot is None:
            continue  # another name (AccessKey, Signature, OnsChannel, ...): skipped
        index, kind = slot
        names |= kind
        if seen & 1 << index:
            return None
        seen |= 1 << index
        if value is True or value is False:
            ext[index] = "true" if value else "false"
        elif type(value) is int:
            if value < 0:
                return None
            ext[index] = str(value)
        else:
            ext[index] = value  # a string, or None (null: absent)
    return ext, names


def _send_typed(ext: list[str | None]) -> list[Any] | None:
    """The typed values of the send header's common case (the C module's send_header rules:
    the first eight present, plain decimals, booleans true/false/1/0), else None."""
    if any(value is None for value in ext[:8]):
        return None
    typed: list[Any] = [None] * 13
    for index, digits in ((3, 9), (4, 9), (5, 9), (6, 18), (7, 9)):
        typed[index] = _plain_number(ext[index], digits)
        if typed[index] is None:
            return None
    for index in (9, 10, 11, 12):
        value = ext[index]
        if value is not None:
            typed[index] = _plain_bool(value) if index in (10, 12) else _plain_number(value, 9)
            if typed[index] is None:
                return None
    return typed


def send_fields_py(buf: Any, start: Any, end: Any) -> tuple | None:
    """Python twin of ``pymq.remoting._codecc.send_fields``: a plain single send's or batch's
    frame buf[start:end] (its length field stripped) read for the broker's raw send path;
    see the C module's comment.  Returns (opaque, topic, queue_id, sys_flag, born_timestamp,
    flag, properties or None, reconsume_times or None, body_start, batch), or None (also for
    a transaction's half or rollback, sys flag 0x4 or 0xC: the store puts those as messages)."""
    found = _frame_header(buf, start, end)
    scanned = None if found is None else _scan_header(found[0])
    if scanned is None or scanned[0].get("flag", 0) != 0:
        return None
    read, members = scanned
    code = read.get("code", 0)
    slots = _send_slots(members)
    if slots is None:
        return None
    ext, names = slots
    if not (((code == 310 or code == 320) and names == 1) or (code == 10 and names == 2)):
        return None
    typed = _send_typed(ext)
    if typed is None or (typed[12] is True) != (code == 320):
        return None
    if typed[5] & 0xC:  # a transaction's half or rollback: the store puts it as a message
        return None
    assert found is not None
    return (
        read.get("opaque", 0), ext[1], typed[4], typed[5], typed[6], typed[7], ext[8],
        typed[9], found[1], code == 320,
    )  # fmt: skip


def send_run_fields_py(
    buf: Any, bounds: Any, first: Any, stop: Any, judge: Any, entries: Any, parsed: Any
) -> tuple[int, tuple | None]:
    """Python twin of ``pymq.remoting._codecc.send_run_fields``: send_fields of frames first,
    first+1, ... of a run, each plain single send added to ``entries`` (topic, queue id, body,
    properties or "", flag, sys flag, born timestamp, reconsume times or 0) and its fields to
    ``parsed``, while its topic's queue count (``judge(topic)``, called again only when the
    topic changes; None stops) bounds its queue id.  Returns the first frame not
    added and its fields (None when it has none or is ``stop``)."""
    if (
        type(bounds) is not list
        or not callable(judge)
        or type(entries) is not list
        or type(parsed) is not list
    ):
        raise TypeError("send_run_fields: bounds list, judge callable, entries and parsed lists")
    first = operator.index(first)
    stop = operator.index(stop)
    if not 0 <= first <= sys.maxsize // 2 or not 0 <= stop <= sys.maxsize // 2:
        raise OverflowError("send_run_fields: first or stop out of range")
    fields: tuple | None = None
    last: Any = None
    count = -1
    i = first
    with memoryview(buf) as view, view.cast("B") as raw:
        while i < stop:
            if 2 * i + 1 >= len(bounds):
                raise ValueError("send_run_fields: stop past the bounds")
            # Both held before either is read: an item's __index__ runs Python, which could
            # change the list.
            start_item, end_item = bounds[2 * i], bounds[2 * i + 1]
            start = _index_arg(start_item, "start")
            end = _index_arg(end_item, "end")
            fields = send_fields_py(raw, start, end)
            if fields is None or fields[9] is True:
                break
            topic = fields[1]
            if last is None or topic != last:
                verdict = judge(topic)
                count = -1 if verdict is None else max(0, operator.index(verdict))
                last = topic
            queue_id = fields[2]
            if count < 0 or queue_id < 0 or queue_id >= count:
                break
            body_at = fields[8]
            props, reconsume = fields[6], fields[7]
            entries.append(
                (topic, queue_id, raw[body_at:end].tobytes(), "" if props is None else props,
                 fields[5], fields[3], fields[4], 0 if reconsume is None else reconsume)
            )  # fmt: skip
            parsed.append(fields)
            fields = None
            i += 1
    if i >= stop:
        fields = None
    return i, fields


def send_answer_fields_py(buf: Any, start: Any, end: Any) -> tuple | None:
    """Python twin of ``pymq.remoting._codecc.send_answer_fields``: a send's plain successful
    answer (code 0, a response, no remark, no body, extFields with msgId and the plain decimals
    queueId and queueOffset as strings, no recallHandle) read for the client's raw answer path;
    (opaque, msg_id, queue_id, queue_offset, transaction_id or None), or None."""
    found = _frame_header(buf, start, end)
    if found is None or found[1] != _index_arg(end, "end"):
        return None
    scanned = _scan_header(found[0])
    if scanned is None:
        return None
    read, members = scanned
    if not {"code", "opaque", "flag"} <= read.keys():
        return None
    if read["code"] != 0 or read["flag"] != 1 or read.get("remark") is not None:
        return None
    values: list[Any] = [None] * 4
    seen = 0
    for name, value in members:
        slot = _ANSWER_SLOTS.get(name)
        if slot is None:
            if name == "recallHandle":  # a timer message's: the usual path reads it
                return None
            continue
        if seen & 1 << slot or type(value) is not str:
            return None
        seen |= 1 << slot
        values[slot] = value
    if values[0] is None or values[1] is None or values[2] is None:
        return None
    queue_id = _plain_number(values[1], 9)
    offset = _plain_number(values[2], 18)
    if queue_id is None or offset is None:
        return None
    return read["opaque"], values[0], queue_id, offset, values[3]


send_fields: Callable[..., tuple | None] = getattr(_native, "send_fields", send_fields_py)
send_run_fields: Callable[..., tuple[int, tuple | None]] = getattr(
    _native, "send_run_fields", send_run_fields_py
)
send_answer_fields: Callable[..., tuple | None] = getattr(
    _native, "send_answer_fields", send_answer_fields_py
)


def _json_loads(data: bytes) -> object:
    """``json``'s reading of a header (the reference the fast path agrees with)."""
    try:
        text = data.decode()
        if text[:1].isspace():
            text = text.lstrip()  # raw_decode, unlike decode, does not skip it
        # raw_decode, not decode: the header is one object, and the trailing-whitespace regex
        # decode() runs costs a measurable share of a small request.
        header, end = _JSON_DECODER.raw_decode(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ProtocolError(f"bad JSON header: {str(exc)[:200]}") from None
    if end != len(text) and not text[end:].isspace():
        raise ProtocolError(f"bad JSON header: extra data at {end}")
    return header


def _checked_command(header: object) -> RemotingCommand:
    """The command of a parsed header, every field checked as Java's typed decode would.

    A field Java would refuse is reset (to 0, {}, None or JAVA) and the first of them, in the
    order read here, is named in ``header_error``.  The rare cases are judged in helpers, so a
    sound header costs no more calls than the checks themselves."""
    if type(header) is not dict:
        raise ProtocolError("JSON header is not an object")
    get = header.get
    opaque = get("opaque", 0)
    if not _int32(opaque):
        raise ProtocolError(f"JSON header: opaque is not a Java int: {_describe(opaque)}")
    code, flag, version = get("code"), get("flag", 0), get("version", 0)
    problem = None
    if not (_int32(code) and _int32(flag) and _int32(version)):
        code, flag, version, problem = _checked_ints(code, flag, version)
    ext = get("extFields")
    if type(ext) is not dict:
        if ext is not None:
            problem = problem or "extFields is not an object"
        ext = {}
    else:
        for value in ext.values():
            if type(value) is not str:  # Java peers send strings; normalise numbers and bools
                ext, problem = _java_ext_fields(ext, problem)
                break
    remark = get("remark")
    if remark is not None and type(remark) is not str:
        problem = problem or "remark is not a string"
        remark = None
    language = get("language")
    if type(language) is not str or not language:
        if language is not None:
            problem = problem or "language is not a string"
        language = "JAVA"
    cmd = RemotingCommand(code, ext, b"", opaque, flag, remark, language, version, _SERIALIZE_JSON)
    if problem is not None:
        cmd.header_error = f"bad request header: {problem}"
    return cmd


def _checked_ints(code: object, flag: object, version: object) -> tuple[int, int, int, str | None]:
    """code, flag and version as :func:`_checked_command` keeps them (a null version is 0; any
    other value that is no Java int is 0), and the problem with the first refused, or None."""
    problem = None
    if not _int32(code):
        problem = f"code is not a Java int: {_describe(code)}"
        code = 0
    if not _int32(flag):
        problem = problem or f"flag is not a Java int: {_describe(flag)}"
        flag = 0
    if version is None:
        version = 0
    elif not _int32(version):
        problem = problem or f"version is not a Java int: {_describe(version)}"
        version = 0
    return code, flag, version, problem


def _java_ext_fields(
    ext: dict[str, object], problem: str | None
) -> tuple[dict[str, str], str | None]:
    """extFields with a value that is not a string: scalars read as Java strings (nulls
    dropped), or nothing kept if any value is an array or object (``problem`` names it unless
    it already names an earlier field)."""
    if all(v is None or isinstance(v, _SCALARS) for v in ext.values()):
        return {k: s for k, v in ext.items() if (s := java_string(v)) is not None}, problem
    return {}, problem or "extFields values must be strings"


def _decode_binary_header(data: bytes) -> RemotingCommand:
    try:
        code, lang, version, opaque, flag = _BIN_FIXED.unpack_from(data, 0)
        pos = _BIN_FIXED.size
        (remark_len,) = _INT.unpack_from(data, pos)
        pos += 4
        if remark_len < 0 or pos + remark_len > len(data):
            raise ProtocolError("binary header: bad remark length")
        remark = data[pos : pos + remark_len].decode() if remark_len else None
        pos += remark_len
        (ext_len,) = _INT.unpack_from(data, pos)
        pos += 4
        end = pos + ext_len
        if ext_len < 0 or end > len(data):
            raise ProtocolError("binary header: bad extFields length")
        ext: dict[str, str] = {}
        while pos < end:
            (klen,) = _SHORT.unpack_from(data, pos)
            pos += 2
            key = data[pos : pos + klen].decode()
            pos += klen
            (vlen,) = _INT.unpack_from(data, pos)
            pos += 4
            if klen < 0 or vlen < 0 or pos + vlen > end:
                raise ProtocolError("binary header: bad extFields entry")
            ext[key] = data[pos : pos + vlen].decode()
            pos += vlen
    except (struct.error, UnicodeDecodeError) as exc:
        raise ProtocolError(f"bad binary header: {exc}") from None
    try:
        language = LanguageCode(lang).name
    except ValueError:
        language = LanguageCode.OTHER.name
    return RemotingCommand(
        code=code,
        ext_fields=ext,
        opaque=opaque,
        flag=flag,
        remark=remark,
        language=language,
        version=version,
        serialize_type=SerializeType.ROCKETMQ,
    )


def decode_frame(frame: bytes) -> RemotingCommand:
    """Decode one frame *without* its leading length field."""
    return _decode_at(frame, 0, len(frame))


def _decode_at(buf: bytes, start: int, end: int) -> RemotingCommand:
    """Decode the frame in ``buf[start:end]`` (its length field already stripped)."""
    if end - start < 4:
        raise ProtocolError(f"frame of {end - start} bytes has no header length")
    (field,) = _INT.unpack_from(buf, start)
    serialize_type = (field >> 24) & 0xFF
    header_end = start + 4 + (field & 0xFFFFFF)
    if header_end > end:
        raise ProtocolError(
            f"header length {field & 0xFFFFFF} exceeds frame of {end - start} bytes"
        )
    if serialize_type == _SERIALIZE_JSON:
        cmd = None
        if header_end - start - 4 <= MAX_JSON_HEADER_LENGTH:
            # The plain header read straight from the frame (in C: no copy, no dict);
            # anything else is judged below.
            cmd = _json_header_at(buf, start + 4, header_end, RemotingCommand, _SERIALIZE_JSON)
        if cmd is None:
            cmd = _decode_json_header(buf[start + 4 : header_end])
    elif serialize_type == _SERIALIZE_ROCKETMQ:
        cmd = _decode_binary_header(buf[start + 4 : header_end])
    else:
        raise ProtocolError(f"unknown serialize type {serialize_type}")
    cmd.body = buf[header_end:end]
    return cmd


class FrameDecoder:
    """Turns a byte stream into commands.  Feed it whatever ``receive_some`` returned.

    Whole frames are decoded straight out of the received bytes; only the unfinished tail is
    kept, in a bytearray that grows until its frame is complete (so a large frame arriving in
    many pieces is copied once, not once per piece).
    """

    def __init__(self, max_frame_length: int = FRAME_MAX_LENGTH) -> None:
        self._partial = bytearray()
        self._need = 0  # bytes the partial tail must reach before it can be decoded
        self._max = max_frame_length
        # Why the stream stopped making sense (the connection must close), or None.
        self.broken: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        return len(self._partial)

    def feed(self, data: bytes | bytearray | memoryview) -> list[RemotingCommand]:
        """The commands whose frames ``data`` completes; ProtocolError when the stream is bad."""
        buf, bounds = self.feed_frames(data)
        try:
            out = [_decode_at(buf, bounds[i], bounds[i + 1]) for i in range(0, len(bounds), 2)]
        except ProtocolError as exc:
            self.broken = exc
            raise
        if self.broken is not None:
            raise self.broken
        return out

    def feed_frames(self, data: bytes | bytearray | memoryview) -> tuple[bytes, list[int]]:
        """The frames ``data`` completes, not decoded: the buffer they are in and their
        bounds, ``[start, end, start, end, ...]`` (each without its length field), for
        :func:`decode_frame_at` or :func:`peek_request`.  A bad frame length ends the stream:
        the frames before it are returned, :attr:`broken` is set and the next call raises."""
        if self.broken is not None:
            raise self.broken
        partial = self._partial
        if partial:
            if len(partial) + len(data) < self._need:
                partial += data
                return b"", []
            buf = b"".join((partial, data))  # one copy of each
            self._partial = bytearray()
        else:
            buf = data if type(data) is bytes else bytes(data)
        limit = self._max
        bounds, pos, bad = (_frame_bounds or _walk_frames)(buf, limit)
        if bad is not None:
            self.broken = ProtocolError(f"frame length {bad} outside 4..{limit} bytes")
            if not bounds:
                raise self.broken
            return buf, bounds
        n = len(buf)
        if pos < n:
            self._partial = bytearray(memoryview(buf)[pos:])
            self._need = 4 + _INT.unpack_from(buf, pos)[0] if n - pos >= 4 else 4
        return buf, bounds


def _walk_frames(buf: bytes, limit: int) -> tuple[list[int], int, int | None]:
    """The whole frames at the start of ``buf`` (``_recordc.frame_bounds``' twin): their bounds
    ``[start, end, ...]`` without the length fields, where the walk stopped (an unfinished
    frame's start, or a bad length's), and that bad length when outside 4..``limit``."""
    bounds: list[int] = []
    pos = 0
    n = len(buf)
    unpack = _INT.unpack_from
    while n - pos >= 4:
        (length,) = unpack(buf, pos)
        if length < 4 or length > limit:
            return bounds, pos, length
        end = pos + 4 + length
        if end > n:
            break
        bounds.append(pos + 4)
        bounds.append(end)
        pos = end
    return bounds, pos, None


decode_frame_at = _decode_at

# The start of a JSON header as pymq's and RocketMQ's Go/C++-style writers order it, and any
# top-level number field, for peek_request.
JSON_REQUEST_PREFIX = re.compile(
    rb'[ \t\n\r\f\v]*\{"code":(-?\d{1,10})(?!\d),"language":"[A-Z_]{1,16}",'
    rb'"version":-?\d{1,10}(?!\d),"opaque":(-?\d{1,10})(?!\d),"flag":(\d{1,10})(?!\d)'
)
_JSON_NUMBER_FIELD = re.compile(rb'"(code|opaque|flag)":(-?\d{1,10})[,}]')


def peek_request(buf: bytes, start: int, end: int) -> tuple[int, int, int, int] | None:
    """(code, opaque, flag, serialize type) of the frame in ``buf[start:end]``, read without
    decoding its header (a fraction of the cost), or None when they cannot be read that way
    (the frame is then decoded in full).  For shedding load: the values are only as good as
    the frame, which is decoded and validated if it is served at all."""
    if end - start < 4:
        return None
    (field,) = _INT.unpack_from(buf, start)
    header_end = start + 4 + (field & 0xFFFFFF)
    if header_end > end:
        return None
    serialize_type = (field >> 24) & 0xFF
    if serialize_type == 1:  # ROCKETMQ: fixed fields first
        if header_end - start - 4 < _BIN_FIXED.size:
            return None
        code, _lang, _version, opaque, flag = _BIN_FIXED.unpack_from(buf, start + 4)
        return code, opaque, flag, 1
    if serialize_type != 0:
        return None
    match = JSON_REQUEST_PREFIX.match(buf, start + 4, header_end)
    if match is not None:
        code, opaque, flag = match.groups()
        return int(code), int(opaque), int(flag), 0
    # Another writer's key order (Java writes them alphabetically): find the three anywhere.
    found = dict(_JSON_NUMBER_FIELD.findall(buf, start + 4, header_end))
    if len(found) < 2 or b"code" not in found or b"opaque" not in found:
        return None
    return int(found[b"code"]), int(found[b"opaque"]), int(found.get(b"flag", b"0")), 0


def busy_answer(serialize_type: int, opaque: int, remark: str) -> bytes:
    """The whole SYSTEM_BUSY answer frame to the request ``opaque``, built without a command."""
    if serialize_type == 1:
        return encode(
            RemotingCommand(
                ResponseCode.SYSTEM_BUSY,
                opaque=opaque,
                flag=RPC_TYPE_RESPONSE,
                remark=remark,
                serialize_type=_SERIALIZE_ROCKETMQ,
            )
        )
    return busy_json_answer(opaque, busy_json_tail(remark))


def busy_json_tail(remark: str) -> bytes:
    """The part of a JSON SYSTEM_BUSY answer after its opaque: many answers share one."""
    return b',"flag":1,"remark":' + _quote(remark).encode() + _BUSY_TAIL


def busy_json_answer(opaque: int, tail: bytes) -> bytes:
    """A JSON SYSTEM_BUSY answer frame from :func:`busy_json_tail` (refusing a request must
    cost a small fraction of serving it, so no command is built)."""
    header = (_BUSY_HEAD % opaque) + tail
    return _FRAME_PREFIX.pack(4 + len(header), len(header)) + header


def json_response_frame(code: int, opaque: int, ext_json: str) -> bytes:
    """The frame :func:`encode` writes for a JSON response (flag RPC_TYPE_RESPONSE, no remark,
    no body, the default language and version) whose extFields are the JSON members
    ``ext_json``: the same bytes without a command object (the send answer's hot path; the
    tests compare the two)."""
    header = (_RESPONSE_HEAD % (code, opaque) + ext_json + _RESPONSE_TAIL).encode()
    return _FRAME_PREFIX.pack(4 + len(header), len(header)) + header


_RESPONSE_HEAD = (
    '{"code":%d,"language":"JAVA",'
    f'"version":{CURRENT_VERSION},"opaque":%d,"flag":{RPC_TYPE_RESPONSE},"extFields":{{'
)
_RESPONSE_TAIL = '},"serializeTypeCurrentRPC":"JSON"}'

# busy_json_answer's header, laid out as _json_header writes every answer.
_BUSY_HEAD = (
    f'{{"code":{int(ResponseCode.SYSTEM_BUSY)},"language":"JAVA","version":{CURRENT_VERSION},'
    '"opaque":%d'
).encode()
_BUSY_TAIL = b',"extFields":{},"serializeTypeCurrentRPC":"JSON"}'


def busy_answers_py(
    buf: bytes,
    bounds: list[int],
    first: int,
    stop: int,
    head: bytes,
    tails: dict[int, bytes | None],
    refused: dict[int, int],
) -> tuple[bytes, int]:
    """SYSTEM_BUSY answers to frames ``first``, ``first+1``, ... while each is a JSON request
    in the usual key order (:data:`JSON_REQUEST_PREFIX`) whose code has a tail in ``tails``
    (:func:`busy_json_tail`) and no response flag: each answer is ``head``, the opaque, the
    tail (none for a oneway), each refusal counted in ``refused``.  Returns the answers joined
    and the index of the first frame not answered so.  The C extension's ``busy_answers`` is
    this function's twin (fast failure's hot loop); the tests check they agree."""
    answers = []
    i = first
    while i < stop:
        start, end = bounds[2 * i], bounds[2 * i + 1]
        if start < 0 or end > len(buf) or end - start < 4:  # outside buf: as the C twin, stop
            break
        (field,) = _INT.unpack_from(buf, start)
        if field >> 24:
            break
        found = JSON_REQUEST_PREFIX.match(buf, start + 4, min(start + 4 + field, end))
        if found is None:
            break
        code, opaque, flag = (int(g) for g in found.groups())
        tail = tails.get(code)
        if flag & RPC_TYPE_RESPONSE or tail is None:
            break
        refused[code] = refused.get(code, 0) + 1
        i += 1
        if flag & RPC_ONEWAY:
            continue
        header = head + b"%d" % opaque + tail
        answers.append(_FRAME_PREFIX.pack(4 + len(header), len(header)) + header)
    return b"".join(answers), i


busy_answers = getattr(_native, "busy_answers", None) or busy_answers_py
"""The C ``busy_answers`` when the extension is built, else :func:`busy_answers_py`."""
BUSY_JSON_HEAD_PREFIX = _BUSY_HEAD[: -len(b"%d")]
"""The JSON SYSTEM_BUSY answer's header up to its opaque (for :func:`busy_answers`)."""
