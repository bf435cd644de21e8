"""pymq's HTTP/2 server connection, sans-IO: the part of RFC 9113 a gRPC server needs.

:class:`H2Server` is a plain class: :meth:`H2Server.receive` takes the bytes a socket read
brought and returns the events they mean (:class:`RequestReceived`, :class:`DataReceived`,
:class:`StreamReset`, :class:`WindowOpened`, :class:`ConnectionTerminated`), the send methods
queue frames, and :meth:`H2Server.data_to_send` hands over the bytes to write.  No socket, no
clock, no task: :mod:`pymq.proxy.http2` does the I/O.  A protocol error of the peer's that
concerns one stream resets that stream (RST_STREAM, and a :class:`StreamReset` event if the
stream had been announced); one that concerns the connection queues GOAWAY with its error code
and raises :class:`H2ConnectionError`, after which the connection is done.

What it does (the RFC's sections in brackets):

- the client's connection preface, whose first frame must be SETTINGS (3.4); the server's
  SETTINGS (MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_HEADER_LIST_SIZE) and a
  connection WINDOW_UPDATE raising the connection's receive window to the streams' one;
  the peer's SETTINGS applied and acknowledged (6.5), their values checked (6.5.2);
- frames of up to 16,384 bytes (SETTINGS_MAX_FRAME_SIZE left at its default; a larger one is
  a FRAME_SIZE_ERROR), written no larger than the peer's SETTINGS_MAX_FRAME_SIZE;
- HEADERS and CONTINUATION (6.2, 6.10): a header block is a run of frames on one stream with
  nothing between them; every block is decoded (HPACK state), also on a stream refused or
  closed; its compressed size is bounded (``4 * max_header_list_size + 1024``: past it,
  ENHANCE_YOUR_CALM) and its decoded size by MAX_HEADER_LIST_SIZE (hpack's check);
- a request's header block checked as RFC 9113 8.2 and 8.3 ask (:func:`request_headers`): a
  malformed one resets its stream PROTOCOL_ERROR, the connection goes on (8.1.1);
- stream states (5.1) for client-initiated streams: idle, open, half-closed (either side),
  closed.  A new stream's id must be odd and above every earlier one (5.1.1); DATA,
  WINDOW_UPDATE or RST_STREAM on an idle stream is a PROTOCOL_ERROR; frames on a stream the
  server reset are ignored (the last ``RESET_MEMORY`` such ids are remembered), DATA or HEADERS
  on another closed or half-closed (remote) stream resets it STREAM_CLOSED; trailers (a second
  HEADERS) must end the stream and hold no pseudo-header (8.1);
- SETTINGS_MAX_CONCURRENT_STREAMS enforced at once: a HEADERS past it resets its stream
  REFUSED_STREAM while the peer has not acknowledged the server's SETTINGS (it may not know the
  limit yet), and closes the connection (PROTOCOL_ERROR) after (5.1.2, 5.4.1);
- flow control both ways (5.2, 6.9): the peer's DATA is counted against the connection's and
  the stream's receive windows (past either: FLOW_CONTROL_ERROR) and handed back by
  WINDOW_UPDATE once half a window has been received (pymq bounds what it holds by its own
  limits, not by withholding the window); the server sends no more DATA than the smaller of the
  two send windows allows (:meth:`H2Server.send_data` returns what it took), and a peer's
  WINDOW_UPDATE of zero or past 2**31-1 is an error;
- RST_STREAM, PING (answered with its ACK), GOAWAY (an event), PRIORITY (ignored, its length
  checked; a stream that depends on itself, there or in HEADERS, is reset PROTOCOL_ERROR),
  PUSH_PROMISE from a client (a PROTOCOL_ERROR), unknown frame types (ignored);
- padding on DATA and HEADERS (6.1, 6.2), counted in flow control;
- floods (RFC 9113 10.5): streams the peer resets before the server ended them (its
  RST_STREAM, or a stream error of its making) beyond ``RESET_BURST`` more than the streams the
  server ended (the "rapid reset" of CVE-2023-44487), and more than ``EMPTY_FRAMES`` frames in a
  row that carry nothing the server acts on (empty DATA or header-block fragments, PRIORITY,
  extension frames, answers to nothing, late frames of closed streams: CVE-2019-9518, and the
  endless CONTINUATION of CVE-2024-27316's class) close the connection (GOAWAY
  ENHANCE_YOUR_CALM); PING and SETTINGS are answered, so a peer that floods them and does not
  read stops being read (:mod:`pymq.proxy.http2` writes before it reads again);
- the peer's SETTINGS_HEADER_TABLE_SIZE bounds the encoder's table, which never holds more
  than ``ENCODER_TABLE_SIZE`` bytes, and however many SETTINGS change it between two header
  blocks the next one signals at most two size updates (RFC 7541 4.2).

HPACK is the ``hpack`` package's (pymq.proxy.http2 passes its caching subclasses in).
"""

from __future__ import annotations

import enum
import itertools
import operator
import re
import struct
from collections.abc import Callable, Sequence
from typing import Any, cast

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types (RFC 9113 6).
DATA = 0x0
HEADERS = 0x1
PRIORITY = 0x2
RST_STREAM = 0x3
SETTINGS = 0x4
PUSH_PROMISE = 0x5
PING = 0x6
GOAWAY = 0x7
WINDOW_UPDATE = 0x8
CONTINUATION = 0x9

# Flags.
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# SETTINGS parameters (6.5.2; 8: RFC 8441).
HEADER_TABLE_SIZE = 0x1
ENABLE_PUSH = 0x2
MAX_CONCURRENT_STREAMS = 0x3
INITIAL_WINDOW_SIZE = 0x4
MAX_FRAME_SIZE = 0x5
MAX_HEADER_LIST_SIZE = 0x6
ENABLE_CONNECT_PROTOCOL = 0x8

DEFAULT_WINDOW = 65535
MAX_WINDOW = 2**31 - 1
DEFAULT_MAX_FRAME_SIZE = 16384
MAX_MAX_FRAME_SIZE = 2**24 - 1


class ErrorCode(enum.IntEnum):
    """HTTP/2 error codes (RFC 9113 7)."""

    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    SETTINGS_TIMEOUT = 0x4
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9
    CONNECT_ERROR = 0xA
    ENHANCE_YOUR_CALM = 0xB
    INADEQUATE_SECURITY = 0xC
    HTTP_1_1_REQUIRED = 0xD


_FRAME = struct.Struct(">BHBBL")  # length (high byte, low 16 bits), type, flags, stream id
_U32 = struct.Struct(">L")
_SETTING = struct.Struct(">HL")
_GOAWAY = struct.Struct(">LL")


def frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One frame's bytes (also what the tests write)."""
    n = len(payload)
    return _FRAME.pack(n >> 16, n & 0xFFFF, ftype, flags, stream_id) + payload


# -- events ---------------------------------------------------------------------------------


class Event:
    """What a read meant (the classes below)."""

    __slots__ = ()

    def __repr__(self) -> str:
        names: tuple[str, ...] = self.__slots__
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
        return f"{type(self).__name__}({fields})"


class RequestReceived(Event):
    """A new stream's request headers (checked, decoded); ``ended``: the request has no body."""

    __slots__ = ("ended", "headers", "stream_id")

    def __init__(self, stream_id: int, headers: dict[str, str], ended: bool) -> None:
        self.stream_id = stream_id
        self.headers = headers
        self.ended = ended


class DataReceived(Event):
    """Request body bytes (maybe none) on a stream; ``ended``: the client's side is done."""

    __slots__ = ("data", "ended", "stream_id")

    def __init__(self, stream_id: int, data: bytes, ended: bool) -> None:
        self.stream_id = stream_id
        self.data = data
        self.ended = ended


class StreamReset(Event):
    """An announced stream was reset: by the peer (``remote``) or by this side for a protocol
    error of the peer's (``reason`` says which).  A stream refused before it was announced (a
    malformed request, one too many) gives one too, with ``announced`` False."""

    __slots__ = ("announced", "code", "reason", "remote", "stream_id")

    def __init__(
        self, stream_id: int, code: int, remote: bool, reason: str = "", announced: bool = True
    ) -> None:
        self.stream_id = stream_id
        self.code = code
        self.remote = remote
        self.reason = reason
        self.announced = announced


class WindowOpened(Event):
    """A send window grew (WINDOW_UPDATE, or a larger SETTINGS_INITIAL_WINDOW_SIZE)."""

    __slots__ = ()


class ConnectionTerminated(Event):
    """The peer sent GOAWAY."""

    __slots__ = ("code", "last_stream_id")

    def __init__(self, code: int, last_stream_id: int) -> None:
        self.code = code
        self.last_stream_id = last_stream_id


class H2ConnectionError(Exception):
    """A connection error (RFC 9113 5.4.1): GOAWAY with ``code`` is queued, the connection is
    done."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code


class StreamClosedError(Exception):
    """A send on a stream that is closed (or was never opened) on this side."""


class _StreamError(Exception):
    def __init__(self, stream_id: int, code: ErrorCode, reason: str) -> None:
        super().__init__(reason)
        self.stream_id = stream_id
        self.code = code
        self.reason = reason


class _Stream:
    __slots__ = ("local_closed", "recv_window", "remote_closed", "send_window", "unacked")

    def __init__(self, send_window: int, recv_window: int, remote_closed: bool) -> None:
        self.send_window = send_window
        self.recv_window = recv_window
        self.unacked = 0  # received, not yet handed back by WINDOW_UPDATE
        self.remote_closed = remote_closed
        self.local_closed = False


_WINDOW_OPENED = WindowOpened()

# Not a frame flag (those are a byte): a HEADERS frame whose priority names its own stream
# (RFC 9113 5.3.1), kept with the block's flags until the block is decoded.
_SELF_DEPENDENT = 0x100


class H2Server:
    """The server side of one HTTP/2 connection (see the module docstring)."""

    # Ids of streams this side reset, whose late frames are ignored (5.1, "closed").
    RESET_MEMORY = 1024
    # Streams a peer may have reset before the server ended them (its RST_STREAM, or a stream
    # error of its making), beyond one per stream the server ended: past it, GOAWAY
    # ENHANCE_YOUR_CALM (the "rapid reset" of CVE-2023-44487 opens and resets streams without
    # ever waiting for an answer, past SETTINGS_MAX_CONCURRENT_STREAMS).
    RESET_BURST = 1000
    # Frames in a row that carry nothing the server acts on (empty DATA or header-block
    # fragments, PRIORITY, extension frames): past it, GOAWAY ENHANCE_YOUR_CALM
    # (CVE-2019-9518, and the empty CONTINUATION floods of CVE-2024-27316's class).
    EMPTY_FRAMES = 1000
    # The HPACK table the server's encoder keeps at most, whatever the peer's
    # SETTINGS_HEADER_TABLE_SIZE allows (RFC 7541 4.2 lets the encoder use less).
    ENCODER_TABLE_SIZE = 4096

    def __init__(
        self,
        *,
        max_concurrent_streams: int = 100,
        initial_window_size: int = DEFAULT_WINDOW,
        max_header_list_size: int = 16 * 1024,
        decoder: hpack.Decoder | None = None,
        encoder: hpack.Encoder | None = None,
    ) -> None:
        if not 0 <= initial_window_size <= MAX_WINDOW:
            raise ValueError(f"initial_window_size {initial_window_size} out of range")
        self.max_concurrent_streams = max_concurrent_streams
        self.initial_window_size = initial_window_size
        self.max_header_list_size = max_header_list_size
        self.max_block_size = 4 * max_header_list_size + 1024
        self.decoder = decoder if decoder is not None else hpack.Decoder()
        self.decoder.max_header_list_size = max_header_list_size
        self.encoder = encoder if encoder is not None else hpack.Encoder()
        self.streams: dict[int, _Stream] = {}
        self.highest_stream_id = 0  # the highest a client opened (or tried to)
        # The peer's settings that matter to the server.
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame_size = DEFAULT_MAX_FRAME_SIZE
        self.send_window = DEFAULT_WINDOW  # the connection's
        self.recv_window = max(initial_window_size, DEFAULT_WINDOW)  # the connection's
        self._recv_unacked = 0
        self._in = bytearray()
        self._out = bytearray()
        self._preface_seen = False
        self._settings_seen = False  # the peer's first frame, SETTINGS, arrived
        self.settings_acked = False  # the peer acknowledged the server's SETTINGS
        # A header block in progress: its stream, its HEADERS flags, its bytes so far.
        self._block: tuple[int, int, bytearray] | None = None
        self._reset: dict[int, None] = {}  # ids of streams this side reset (insertion order)
        self._reset_credit = self.RESET_BURST  # see RESET_BURST
        self._empty_frames = 0  # see EMPTY_FRAMES
        self.closed = False  # GOAWAY sent: nothing more is read
        self._handlers: dict[int, Callable[[int, int, bytes, list[Event]], None]] = {
            DATA: self._data,
            HEADERS: self._headers,
            WINDOW_UPDATE: self._window_update,
            SETTINGS: self._settings,
            PING: self._ping,
            RST_STREAM: self._rst_stream,
            PRIORITY: self._priority,
            GOAWAY: self._goaway,
            CONTINUATION: self._refuse,  # outside a header block
            PUSH_PROMISE: self._refuse,
        }
        settings = b"".join(
            _SETTING.pack(key, value)
            for key, value in (
                (MAX_CONCURRENT_STREAMS, max_concurrent_streams),
                (INITIAL_WINDOW_SIZE, initial_window_size),
                (MAX_HEADER_LIST_SIZE, max_header_list_size),
            )
        )
        self._out += frame(SETTINGS, 0, 0, settings)
        if initial_window_size > DEFAULT_WINDOW:
            self._out += frame(WINDOW_UPDATE, 0, 0, _U32.pack(initial_window_size - DEFAULT_WINDOW))

    # -- output ------------------------------------------------------------------------------

    def data_to_send(self) -> bytes | bytearray:
        """The bytes queued to write (handed over: the next call returns only newer ones)."""
        out = self._out
        if not out:
            return b""
        self._out = bytearray()
        return out

    def window(self, stream_id: int) -> int:
        """How many DATA bytes the stream may be sent now (0 if it cannot be sent to)."""
        stream = self.streams.get(stream_id)
        if stream is None or stream.local_closed:
            return 0
        return max(0, min(self.send_window, stream.send_window))

    def _live(self, stream_id: int) -> _Stream:
        stream = self.streams.get(stream_id)
        if stream is None or stream.local_closed or self.closed:
            raise StreamClosedError(f"stream {stream_id} is closed")
        return stream

    def send_headers(self, stream_id: int, headers: Any, end_stream: bool = False) -> None:
        """HEADERS (and CONTINUATION frames if the block is larger than a frame)."""
        stream = self._live(stream_id)
        block = self.encoder.encode(headers)
        flags = END_STREAM if end_stream else 0
        size = self.peer_max_frame_size
        out = self._out
        if len(block) <= size:
            n = len(block)
            out += _FRAME.pack(n >> 16, n & 0xFFFF, HEADERS, flags | END_HEADERS, stream_id)
            out += block
        else:
            pieces = [block[i : i + size] for i in range(0, len(block), size)]
            for k, piece in enumerate(pieces):
                last = END_HEADERS if k == len(pieces) - 1 else 0
                ftype, fflags = (HEADERS, flags | last) if k == 0 else (CONTINUATION, last)
                out += frame(ftype, fflags, stream_id, piece)
        if end_stream:
            self._end_local(stream_id, stream)

    def send_data(self, stream_id: int, data: bytes | memoryview, end_stream: bool = False) -> int:
        """DATA frames of as much of ``data`` as the windows allow; how much that was.
        ``end_stream`` ends the stream if all of ``data`` went (an empty ``data`` may end it)."""
        stream = self._live(stream_id)
        total = len(data)
        n = min(total, self.send_window, stream.send_window)
        if n <= 0 and total:
            return 0
        size = self.peer_max_frame_size
        out = self._out
        ends = end_stream and n == total
        start = 0
        while True:
            piece = min(size, n - start)
            flags = END_STREAM if ends and start + piece == n else 0
            out += _FRAME.pack(piece >> 16, piece & 0xFFFF, DATA, flags, stream_id)
            out += data[start : start + piece]
            start += piece
            if start >= n:
                break
        self.send_window -= n
        stream.send_window -= n
        if ends:
            self._end_local(stream_id, stream)
        return n

    def _end_local(self, stream_id: int, stream: _Stream) -> None:
        stream.local_closed = True
        if self._reset_credit < self.RESET_BURST:  # a stream served: one more reset allowed
            self._reset_credit += 1
        if stream.remote_closed:
            del self.streams[stream_id]

    def reset_stream(self, stream_id: int, code: int = ErrorCode.CANCEL) -> None:
        """RST_STREAM on a stream still open on either side (a closed one: nothing)."""
        if self.streams.pop(stream_id, None) is None or self.closed:
            return
        self._out += frame(RST_STREAM, 0, stream_id, _U32.pack(code))
        self._remember_reset(stream_id)

    def close_connection(self, code: int = ErrorCode.NO_ERROR, message: bytes = b"") -> None:
        """GOAWAY: the server takes no new stream (and reads nothing more)."""
        if not self.closed:
            self.closed = True
            self._out += frame(GOAWAY, 0, 0, _GOAWAY.pack(self.highest_stream_id, code) + message)

    def _remember_reset(self, stream_id: int) -> None:
        reset = self._reset
        reset[stream_id] = None
        if len(reset) > self.RESET_MEMORY:
            del reset[next(iter(reset))]

    # -- input -------------------------------------------------------------------------------

    def receive(self, data: bytes | bytearray) -> list[Event]:
        """The events the bytes mean (frames split across reads are kept until whole).

        Raises :class:`H2ConnectionError` for a connection error (GOAWAY queued)."""
        if self.closed:
            return []
        buf = self._in
        buf += data
        events: list[Event] = []
        pos = 0
        n = len(buf)
        try:
            if not self._preface_seen:
                if n < len(PREFACE):
                    if not PREFACE.startswith(buf):
                        raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "no HTTP/2 preface")
                    return events
                if not buf.startswith(PREFACE):
                    raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "no HTTP/2 preface")
                self._preface_seen = True
                pos = len(PREFACE)
            while n - pos >= 9:
                high, low, ftype, flags, sid = _FRAME.unpack_from(buf, pos)
                length = high << 16 | low
                if length > DEFAULT_MAX_FRAME_SIZE:
                    raise H2ConnectionError(
                        ErrorCode.FRAME_SIZE_ERROR, f"a frame of {length} bytes"
                    )
                end = pos + 9 + length
                if end > n:
                    break
                payload = bytes(buf[pos + 9 : end])
                pos = end
                sid &= 0x7FFFFFFF
                try:
                    self._frame(ftype, flags, sid, payload, events)
                except _StreamError as exc:
                    self._stream_error(exc, events)
            if self._recv_unacked >= self.recv_window:  # half the connection's window or more
                self._out += frame(WINDOW_UPDATE, 0, 0, _U32.pack(self._recv_unacked))
                self.recv_window += self._recv_unacked
                self._recv_unacked = 0
        except H2ConnectionError as exc:
            self.close_connection(exc.code, str(exc).encode()[:256])
            buf.clear()
            raise
        del buf[:pos]
        return events

    def _stream_error(self, exc: _StreamError, events: list[Event]) -> None:
        sid = exc.stream_id
        self._peer_reset()
        announced = self.streams.pop(sid, None) is not None
        self._out += frame(RST_STREAM, 0, sid, _U32.pack(exc.code))
        self._remember_reset(sid)
        events.append(StreamReset(sid, exc.code, False, exc.reason, announced))

    def _frame(self, ftype: int, flags: int, sid: int, payload: bytes, events: list[Event]) -> None:
        if not self._settings_seen:
            if ftype != SETTINGS or flags & ACK:
                raise H2ConnectionError(
                    ErrorCode.PROTOCOL_ERROR, "the client's preface must be a SETTINGS frame"
                )
            self._settings_seen = True
        if self._block is not None:
            self._continuation(ftype, flags, sid, payload, events)
            return
        handler = self._handlers.get(ftype)
        if handler is not None:
            handler(flags, sid, payload, events)
        else:  # other types: extensions, ignored (RFC 9113 5.5)
            self._empty()

    def _continuation(
        self, ftype: int, flags: int, sid: int, payload: bytes, events: list[Event]
    ) -> None:
        assert self._block is not None
        if ftype != CONTINUATION or sid != self._block[0]:
            raise H2ConnectionError(
                ErrorCode.PROTOCOL_ERROR, "a header block interrupted by another frame"
            )
        if not payload and not flags & END_HEADERS:
            self._empty()
        block = self._block[2]
        block += payload
        if len(block) > self.max_block_size:
            raise H2ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, "a header block too large")
        if flags & END_HEADERS:
            first = self._block[1]
            self._block = None
            self._header_block(sid, first, bytes(block), events)

    def _ping(self, flags: int, sid: int, payload: bytes, events: list[Event]) -> None:
        if len(payload) != 8:
            raise H2ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "PING of a wrong length")
        if sid:
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "PING on a stream")
        if not flags & ACK:
            self._out += frame(PING, ACK, 0, payload)
        else:  # the server sends no PING: an answer to nothing
            self._empty()

    def _rst_stream(self, flags: int, sid: int, payload: bytes, events: list[Event]) -> None:
        if len(payload) != 4:
            raise H2ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "RST_STREAM of a wrong length")
        self._idle_check(sid, "RST_STREAM")
        stream = self.streams.pop(sid, None)
        if stream is None:
            self._empty()  # a closed stream's
            return
        if not stream.local_closed:  # reset before the server ended it
            self._peer_reset()
        events.append(StreamReset(sid, _U32.unpack(payload)[0], True))

    def _peer_reset(self) -> None:
        """A stream reset before the server ended it, by the peer or for its error."""
        self._reset_credit -= 1
        if self._reset_credit < 0:
            raise H2ConnectionError(
                ErrorCode.ENHANCE_YOUR_CALM, "too many streams reset before their answer"
            )

    def _empty(self) -> None:
        """A frame that carries nothing the server acts on (see EMPTY_FRAMES)."""
        self._empty_frames += 1
        if self._empty_frames > self.EMPTY_FRAMES:
            raise H2ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, "too many empty frames")

    def _priority(self, flags: int, sid: int, payload: bytes, events: list[Event]) -> None:
        if not sid:
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "PRIORITY on stream 0")
        if len(payload) != 5:
            raise H2ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "PRIORITY of a wrong length")
        if _U32.unpack_from(payload)[0] & 0x7FFFFFFF == sid:
            raise _StreamError(sid, ErrorCode.PROTOCOL_ERROR, "a stream depends on itself")
        self._empty()

    def _goaway(self, flags: int, sid: int, payload: bytes, events: list[Event]) -> None:
        if sid:
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "GOAWAY on a stream")
        if len(payload) < 8:
            raise H2ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "GOAWAY too short")
        last, code = _GOAWAY.unpack_from(payload)
        events.append(ConnectionTerminated(code, last & 0x7FFFFFFF))

    def _refuse(self, flags: int, sid: int, payload: bytes, events: list[Event]) -> None:
        raise H2ConnectionError(
            ErrorCode.PROTOCOL_ERROR, "CONTINUATION outside a header block, or PUSH_PROMISE"
        )

    def _idle_check(self, sid: int, what: str) -> None:
        """A frame that may not open a stream: on stream 0 or an idle stream, a connection
        error."""
        if not sid or sid > self.highest_stream_id or not sid & 1:
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, f"{what} on idle stream {sid}")

    @staticmethod
    def _unpad(flags: int, payload: bytes) -> bytes:
        if flags & PADDED:
            if not payload or payload[0] >= len(payload):
                raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "padding past the frame")
            return payload[1 : len(payload) - payload[0]]
        return payload

    def _data(self, flags: int, sid: int, payload: bytes, events: list[Event]) -> None:
        self._idle_check(sid, "DATA")
        size = len(payload)
        self.recv_window -= size
        if self.recv_window < 0:
            raise H2ConnectionError(
                ErrorCode.FLOW_CONTROL_ERROR, "DATA past the connection's window"
            )
        self._recv_unacked += size  # handed back whatever becomes of the stream
        data = self._unpad(flags, payload)
        stream = self.streams.get(sid)
        if stream is None or stream.remote_closed:
            if sid in self._reset:  # late frames of a stream this side reset
                if not data:  # (bytes may still be in flight: as many frames as they take)
                    self._empty()
                return
            raise _StreamError(sid, ErrorCode.STREAM_CLOSED, "DATA on a closed stream")
        stream.recv_window -= size
        if stream.recv_window < 0:
            raise _StreamError(sid, ErrorCode.FLOW_CONTROL_ERROR, "DATA past the stream's window")
        ended = bool(flags & END_STREAM)
        if data or ended:
            self._empty_frames = 0
        else:
            self._empty()
        if ended:
            stream.remote_closed = True
            if stream.local_closed:
                del self.streams[sid]
        else:
            stream.unacked += size
            if stream.unacked >= stream.recv_window:  # half the stream's window or more
                self._out += frame(WINDOW_UPDATE, 0, sid, _U32.pack(stream.unacked))
                stream.recv_window += stream.unacked
                stream.unacked = 0
        events.append(DataReceived(sid, data, ended))

    def _headers(self, flags: int, sid: int, payload: bytes, events: list[Event]) -> None:
        if not sid:
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "HEADERS on stream 0")
        fragment = self._unpad(flags, payload)
        if flags & PRIORITY_FLAG:
            if len(fragment) < 5:
                raise H2ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "HEADERS priority too short")
            if _U32.unpack_from(fragment)[0] & 0x7FFFFFFF == sid:
                flags |= _SELF_DEPENDENT  # a stream error once its block is decoded
            fragment = fragment[5:]
        if flags & END_HEADERS:
            self._header_block(sid, flags, fragment, events)
        else:
            if len(fragment) > self.max_block_size:
                raise H2ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, "a header block too large")
            if not fragment:
                self._empty()
            self._block = (sid, flags, bytearray(fragment))

    def _header_block(self, sid: int, flags: int, block: bytes, events: list[Event]) -> None:
        # Decoded first, whatever becomes of the stream: the HPACK table must follow the peer's.
        try:
            fields = cast(list[tuple[bytes, bytes]], self.decoder.decode(block, raw=True))
        except hpack.OversizedHeaderListError as exc:
            raise H2ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, str(exc)) from None
        except (hpack.HPACKError, IndexError, ValueError) as exc:
            raise H2ConnectionError(ErrorCode.COMPRESSION_ERROR, str(exc)) from None
        ended = bool(flags & END_STREAM)
        stream = self.streams.get(sid)
        if stream is not None:
            self._trailers(sid, stream, flags, fields, events)
            return
        if not sid & 1:
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, f"a client's stream {sid} is even")
        if sid <= self.highest_stream_id:
            if sid in self._reset:
                return
            raise _StreamError(sid, ErrorCode.STREAM_CLOSED, "HEADERS on a closed stream")
        self.highest_stream_id = sid
        if len(self.streams) >= self.max_concurrent_streams:
            if self.settings_acked:
                raise H2ConnectionError(
                    ErrorCode.PROTOCOL_ERROR,
                    f"more than the {self.max_concurrent_streams} concurrent streams allowed",
                )
            raise _StreamError(sid, ErrorCode.REFUSED_STREAM, "too many concurrent streams")
        if flags & _SELF_DEPENDENT:
            raise _StreamError(sid, ErrorCode.PROTOCOL_ERROR, "a stream depends on itself")
        headers = request_headers(fields)
        if type(headers) is str:
            raise _StreamError(sid, ErrorCode.PROTOCOL_ERROR, headers)
        self.streams[sid] = _Stream(self.peer_initial_window, self.initial_window_size, ended)
        self._empty_frames = 0
        events.append(RequestReceived(sid, cast(dict[str, str], headers), ended))

    def _trailers(
        self,
        sid: int,
        stream: _Stream,
        flags: int,
        fields: list[tuple[bytes, bytes]],
        events: list[Event],
    ) -> None:
        """A second header block on a stream: trailers, which must end it (8.1)."""
        if stream.remote_closed:
            raise _StreamError(sid, ErrorCode.STREAM_CLOSED, "HEADERS on a closed stream")
        if not flags & END_STREAM:
            raise _StreamError(sid, ErrorCode.PROTOCOL_ERROR, "trailers without END_STREAM")
        if flags & _SELF_DEPENDENT:
            raise _StreamError(sid, ErrorCode.PROTOCOL_ERROR, "a stream depends on itself")
        if any(name[:1] == b":" for name, _ in fields):
            raise _StreamError(sid, ErrorCode.PROTOCOL_ERROR, "a pseudo-header in trailers")
        stream.remote_closed = True
        if stream.local_closed:
            del self.streams[sid]
        events.append(DataReceived(sid, b"", True))

    def _window_update(self, flags: int, sid: int, payload: bytes, events: list[Event]) -> None:
        if len(payload) != 4:
            raise H2ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "WINDOW_UPDATE of a wrong length")
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if not sid:
            if not increment:
                raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise H2ConnectionError(
                    ErrorCode.FLOW_CONTROL_ERROR, "the connection's window past 2**31-1"
                )
        else:
            self._idle_check(sid, "WINDOW_UPDATE")
            stream = self.streams.get(sid)
            if stream is None:
                self._empty()  # closed: a late update
                return
            if not increment:
                raise _StreamError(sid, ErrorCode.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
            stream.send_window += increment
            if stream.send_window > MAX_WINDOW:
                raise _StreamError(
                    sid, ErrorCode.FLOW_CONTROL_ERROR, "the stream's window past 2**31-1"
                )
        if not events or events[-1] is not _WINDOW_OPENED:
            events.append(_WINDOW_OPENED)

    def _setting(self, key: int, value: int) -> bool:
        """Apply one of the peer's settings; True if it opened the send windows."""
        if key == HEADER_TABLE_SIZE:
            self._encoder_table_size(value)
        elif key in (ENABLE_PUSH, ENABLE_CONNECT_PROTOCOL):
            if value > 1:
                raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, f"setting {key} = {value}")
        elif key == INITIAL_WINDOW_SIZE:
            if value > MAX_WINDOW:
                raise H2ConnectionError(
                    ErrorCode.FLOW_CONTROL_ERROR, f"SETTINGS_INITIAL_WINDOW_SIZE {value}"
                )
            delta = value - self.peer_initial_window
            self.peer_initial_window = value
            for stream in self.streams.values():
                stream.send_window += delta
                if stream.send_window > MAX_WINDOW:
                    raise H2ConnectionError(
                        ErrorCode.FLOW_CONTROL_ERROR, "a stream's window past 2**31-1"
                    )
            return delta > 0
        elif key == MAX_FRAME_SIZE:
            if not DEFAULT_MAX_FRAME_SIZE <= value <= MAX_MAX_FRAME_SIZE:
                raise H2ConnectionError(
                    ErrorCode.PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value}"
                )
            self.peer_max_frame_size = value
        # MAX_CONCURRENT_STREAMS, MAX_HEADER_LIST_SIZE, unknown ones: nothing to do here.
        return False

    def _encoder_table_size(self, value: int) -> None:
        """The peer's SETTINGS_HEADER_TABLE_SIZE: the encoder's table kept within it and
        within ENCODER_TABLE_SIZE, and of the sizes set since the last block only the
        smallest and the last signalled in the next one (RFC 7541 4.2), however many
        SETTINGS came between (hpack would keep each, and signal none after setting one
        twice)."""
        encoder = self.encoder
        encoder.header_table_size = min(value, self.ENCODER_TABLE_SIZE)
        changes = encoder.table_size_changes
        if len(changes) > 2:
            smallest = min(changes)
            changes[:] = [smallest, changes[-1]] if smallest < changes[-1] else [smallest]
        encoder.header_table.resized = bool(changes)

    def _settings(self, flags: int, sid: int, payload: bytes, events: list[Event]) -> None:
        if sid:
            raise H2ConnectionError(ErrorCode.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise H2ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "a SETTINGS ACK with a body")
            if self.settings_acked:  # the server sent one SETTINGS
                self._empty()
            self.settings_acked = True
            return
        if len(payload) % 6:
            raise H2ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS of a wrong length")
        opened = False
        for offset in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, offset)
            opened = self._setting(key, value) or opened
        self._out += frame(SETTINGS, ACK, 0)
        if opened:
            events.append(_WINDOW_OPENED)


# What a request's header block may hold (RFC 9113 8.2, 8.3): its pseudo-headers; no
# connection-specific field; names of visible ASCII but upper case, a colon only to begin a
# pseudo-header's; values without NUL, CR or LF, not beginning or ending with a blank.
_REQUEST_PSEUDO = frozenset((":method", ":scheme", ":authority", ":path"))
_CONNECTION_SPECIFIC = frozenset(
    ("connection", "proxy-connection", "keep-alive", "transfer-encoding", "upgrade")
)
_BAD_NAME = re.compile(r"[^\x21-\x39\x3b-\x40\x5b-\x7e]")
_BAD_VALUE = re.compile(r"[\x00\n\r]")


def request_headers(fields: Sequence[tuple[bytes, bytes]]) -> dict[str, str] | str:
    """A request's header fields decoded (UTF-8), as a dict (a regular field repeated: its
    last value), or what makes the block malformed (RFC 9113 8.2, 8.3): the first fault in
    the fields' order.  Each field is decoded and checked on its own by :func:`_field`, their
    order and number by :func:`_order` (both answers kept: a client's fields, and its list of
    names, are mostly the same on every call; so a block is read with no Python loop)."""
    kept = _CHECKED
    checked = list(map(kept.get, fields))
    if None in checked:  # fields not seen (lately): checked now, and kept
        for k in itertools.compress(itertools.count(), map(operator.is_, checked, _NONES)):
            field = fields[k]
            if len(kept) >= FIELDS_KEPT:
                kept.clear()
            checked[k] = kept[field] = _field(*field)
    if str in set(map(type, checked)):  # a malformed field, unless the order failed before
        bad = next(k for k, c in enumerate(checked) if isinstance(c, str))
        return _order([c[0] for c in checked[:bad] if c is not None]) or cast(str, checked[bad])
    pairs = cast(list[tuple[str, str]], checked)
    names = tuple(map(_NAME, pairs))
    verdict = _ORDERS.get(names, "")
    if verdict == "":
        verdict = _order(names)
        if len(_ORDERS) >= ORDERS_KEPT:
            _ORDERS.clear()
        _ORDERS[names] = verdict
    if verdict is not None:
        return verdict
    headers = dict(pairs)
    return _missing(headers, headers.get("host")) or headers


def _order(names: Sequence[str]) -> str | None:
    """What is wrong with a request's field names in this order (each already checked alone):
    a pseudo-header after a regular field or repeated, more than one host; or None."""
    regular = False  # a regular field seen (pseudo-headers must all come before)
    pseudo: set[str] = set()
    host = False
    for name in names:
        if name[0] == ":":
            if regular or name in pseudo:
                return f"pseudo-header {name} out of place or repeated"
            pseudo.add(name)
        else:
            regular = True
            if name == "host":
                if host:
                    return "more than one host header"
                host = True
    return None


_NAME = operator.itemgetter(0)
_NONES = itertools.repeat(None)
# Lists of field names whose _order verdict is kept (all dropped at once when full): a
# client sends the same few.
ORDERS_KEPT = 64
_ORDERS: dict[tuple[str, ...], str | None] = {}


# Fields whose check (_field's answer) is kept, for every connection: the fields a server's
# clients repeat on every call, with room for those that change on each (ids, dates); all
# dropped at once when full (the repeated ones are checked again once).
FIELDS_KEPT = 512
_CHECKED: dict[tuple[bytes, bytes], tuple[str, str] | str] = {}


def _field(raw_name: bytes, raw_value: bytes) -> tuple[str, str] | str:
    """One header field decoded (UTF-8) and checked as far as it can be alone (RFC 9113 8.2,
    8.3), or what makes it malformed.  A function of the two byte strings alone, so its
    answers are kept (in ``_CHECKED``, by :func:`request_headers`)."""
    try:
        name = raw_name.decode()
        value = raw_value.decode()
    except UnicodeDecodeError:
        return "a header field that is not UTF-8"
    if not name:
        return "an empty header name"
    if name[0] == ":":
        if name not in _REQUEST_PSEUDO:
            return f"unknown pseudo-header {name}"
    else:
        if name in _CONNECTION_SPECIFIC or (name == "te" and value != "trailers"):
            return f"connection-specific header {name}"
        if _BAD_NAME.search(name):
            return "an illegal character in a header name"
    if value:
        if value[0] in " \t" or value[-1] in " \t":
            return f"the value of {name} begins or ends with a blank"
        if _BAD_VALUE.search(value):
            return "NUL, CR or LF in a header value"
    return name, value


def _missing(headers: dict[str, str], host: str | None) -> str | None:
    """What a request's fields lack (its pseudo-headers, a consistent authority), or None."""
    if ":method" not in headers or ":scheme" not in headers or not headers.get(":path"):
        return "a request needs :method, :scheme and a :path"
    authority = headers.get(":authority")
    if authority is None and host is None:
        return "a request needs :authority or host"
    if authority is not None and host is not None and authority != host:
        return "host and :authority differ"
    return None
