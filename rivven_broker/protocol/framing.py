"""Frames: cutting a byte stream into ``(format, correlation id, payload)`` and back.

Theory of operation
-------------------
A frame is ``u32 BE length`` · ``u8 format`` · ``u32 BE correlation id`` · payload, where
``length`` counts every byte after itself (so ``length = 5 + len(payload)``). The framing layer
never looks inside the payload; the format byte says which codec may (``FORMAT_MSGPACK`` is
ours; ``FORMAT_POSTCARD`` and ``FORMAT_PROTOBUF`` are Rivven's Rust codecs, known but not
implemented; anything else is unknown).

``FrameDecoder`` is incremental and sans-I/O: the driver ``feed``s whatever the socket gave it,
in any split, and takes complete frames with ``next_frame``. ``feed`` does the cutting work
eagerly: complete frames go to a ready queue; an incomplete frame keeps either its partial
9-byte header (a small bytearray) or the list of body pieces seen so far. Two costs are
designed out:

- thousands of tiny frames in one chunk: each is sliced straight out of the chunk (one copy,
  its payload) with ``struct.unpack_from``; nothing is ever re-sliced from the front of a
  growing buffer;
- a multi-MiB frame in 64 KiB pieces: the pieces are kept by reference (memoryview slices of
  the chunks) and joined once when the last one arrives, so each byte is copied exactly once.
  A driver that can receive into a buffer does better: while at least
  ``DIRECT_BODY_BYTES_MIN`` of a body are missing, ``receive_buffer`` offers the rest of the
  body's own buffer (the pieces kept so far copied in once), the driver ``recv_into``s it and
  reports the count with ``received``, and no received byte is copied again. ``body_missing``
  tells such a driver how many bytes to wait for (``SO_RCVLOWAT``) before waking at all.

The size limit is checked on the 4-byte length prefix, the moment those four bytes are in and
before any body byte is kept. A prefix announcing more than ``frame_bytes_max`` (or fewer than
the 5 bytes of format and correlation id) poisons the decoder: the body bytes are dropped, the
frames completed before it are still delivered, then ``next_frame`` raises the error every time
it is called and ``feed`` ignores further data. The stream has lost its framing, so the
connection must close.
"""

from __future__ import annotations

import struct
from collections import deque
from typing import NamedTuple, Sequence

from rivven_broker.file_region import FileRegion
from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode, LocalProtocolError, RemoteProtocolError

__all__ = [
    "DIRECT_BODY_BYTES_MIN",
    "REFERENCE_BYTES_MIN",
    "FORMAT_POSTCARD",
    "FORMAT_PROTOBUF",
    "FORMAT_MSGPACK",
    "KNOWN_FORMATS",
    "Frame",
    "FrameDecoder",
    "FramePieces",
    "encode_frame",
    "encode_frame_parts",
    "encode_small_msgpack_frame",
    "describe_format",
]

FORMAT_POSTCARD = 0x00
FORMAT_PROTOBUF = 0x01
FORMAT_MSGPACK = 0x02
#: Formats we recognise by name. Only FORMAT_MSGPACK is implemented.
KNOWN_FORMATS = {
    FORMAT_POSTCARD: "postcard",
    FORMAT_PROTOBUF: "protobuf",
    FORMAT_MSGPACK: "msgpack",
}

#: A frame as bytes, large pieces kept by reference (``memoryview``) and ``FileRegion``s, in
#: order (see ``encode_frame_parts``).
FramePieces = list[bytes | memoryview | FileRegion]
#: A payload piece of at least this many bytes may be kept by reference instead of joined
#: (``encode_frame_parts``'s ``reference_bytes_min``; the broker's answers use it).
REFERENCE_BYTES_MIN = 64 * 1024

_PREFIX = struct.Struct(">I")
_HEADER = struct.Struct(">IBI")  # length, format, correlation id
_HEADER_BYTES = _HEADER.size
_LENGTH_MIN = _HEADER_BYTES - _PREFIX.size  # format + correlation id
_U32_MAX = 0xFFFF_FFFF
_NEVER = 1 << 62  # no reference_bytes_min: every buffer piece is joined
#: Missing body bytes from which ``FrameDecoder.receive_buffer`` offers the body's own buffer.
DIRECT_BODY_BYTES_MIN = 64 * 1024

assert _HEADER_BYTES == limits.frame_header_bytes
assert _LENGTH_MIN == 5


#: ``Frame(...)`` without the Python frame of its ``__new__``: ``(format, correlation_id,
#: payload)``.
_new_frame = tuple.__new__


class Frame(NamedTuple):
    """One decoded frame. A NamedTuple: one is built per request on the hot path. The payload
    is a ``bytearray`` when it was received through ``FrameDecoder.receive_buffer``."""

    format: int
    correlation_id: int
    payload: bytes | bytearray


def describe_format(format: int) -> str:
    """A human-readable name for a format byte, saying whether it is known and implemented."""
    name = KNOWN_FORMATS.get(format)
    if name is None:
        return f"unknown format 0x{format:02x}"
    if format == FORMAT_MSGPACK:
        return "msgpack"
    return f"format 0x{format:02x} ({name}) is known but not implemented; use msgpack (0x02)"


def _check_header(format: int, correlation_id: int) -> None:
    if type(format) is not int or not 0 <= format <= 0xFF:
        raise LocalProtocolError(f"format {format!r} is not a u8")
    if type(correlation_id) is not int or not 0 <= correlation_id <= _U32_MAX:
        raise LocalProtocolError(f"correlation id {correlation_id!r} is not a u32")


def encode_frame(
    format: int,
    correlation_id: int,
    payload: bytes,
    *,
    frame_bytes_max: int = limits.frame_bytes_max,
) -> bytes:
    """Return the bytes of one frame. Does not block.

    Raises:
        LocalProtocolError: ``format`` is not a u8 or ``correlation_id`` not a u32
            (INVALID_REQUEST), or the frame would exceed ``frame_bytes_max``
            (MESSAGE_TOO_LARGE).
    """
    return encode_frame_parts(format, correlation_id, (payload,), frame_bytes_max=frame_bytes_max)


def encode_small_msgpack_frame(correlation_id: int, payload: bytes) -> bytes:
    """``encode_frame(FORMAT_MSGPACK, correlation_id, payload)`` without its checks, for a
    caller that knows them true: ``correlation_id`` came from a received frame (a u32) and
    ``payload`` is far below every frame limit (a produce answer from its template). Pure."""
    length = _LENGTH_MIN + len(payload)
    assert length <= limits.response_bytes_max and 0 <= correlation_id <= _U32_MAX
    return _HEADER.pack(length, FORMAT_MSGPACK, correlation_id) + payload


def encode_frame_parts(
    format: int,
    correlation_id: int,
    parts: Sequence[bytes | bytearray | memoryview | FileRegion],
    *,
    frame_bytes_max: int = limits.frame_bytes_max,
    reference_bytes_min: int | None = None,
) -> bytes | FramePieces:
    """Like ``encode_frame`` for a payload given as pieces, joined with a single copy.

    The codec hands record-carrying payloads over in pieces (the record bytes by reference),
    so a multi-MiB fetch response is copied at most once, here. Pieces must be byte buffers
    (memoryviews of item size 1) or ``FileRegion``s. With a region among them the frame is
    returned as ``FramePieces``: the bytes before, between and after the regions joined, the
    regions in their places, for the writer to send in order (the region's bytes never enter
    the process). With ``reference_bytes_min``, a buffer piece of at least that many bytes is
    kept the same way, as a ``memoryview`` in its place, and never copied: a fetch answer's
    record bytes read into memory then go to the socket from the read's own buffer (no
    second multi-MiB allocation per answer, which is also what keeps its pages from being
    fresh ones each time). Raises as ``encode_frame``.
    """
    _check_header(format, correlation_id)
    payload_bytes = 0
    for part in parts:
        payload_bytes += len(part)
    length = _LENGTH_MIN + payload_bytes
    if length > frame_bytes_max:
        raise LocalProtocolError(
            f"frame of {length} bytes exceeds the maximum of {frame_bytes_max}",
            ErrorCode.MESSAGE_TOO_LARGE,
        )
    header = _HEADER.pack(length, format, correlation_id)
    reference_min = _NEVER if reference_bytes_min is None else reference_bytes_min
    if not any(type(part) is FileRegion or len(part) >= reference_min for part in parts):
        return b"".join([header, *parts])
    pieces: FramePieces = []
    run: list[bytes | bytearray | memoryview] = [header]
    for part in parts:
        if type(part) is FileRegion:
            pieces += [b"".join(run), part]
            run = []
        elif len(part) >= reference_min:
            pieces += [b"".join(run), memoryview(part)]  # type: ignore[arg-type]
            run = []
        else:
            run.append(part)  # type: ignore[arg-type]
    if run:
        pieces.append(b"".join(run))
    return pieces


class FrameDecoder:
    """Cuts a byte stream into ``Frame``s. Pure: never blocks, holds no socket.

    ``frame_bytes_max`` bounds ``length`` (the bytes after the prefix); it may be lowered by
    configuration, never raised above ``limits.frame_bytes_max``.
    """

    __slots__ = (
        "_frame_bytes_max",
        "_ready",
        "_ready_bytes",
        "_head",
        "_parts",
        "_parts_bytes",
        "_body",
        "_body_missing",
        "_format",
        "_correlation_id",
        "_error",
    )

    def __init__(self, frame_bytes_max: int = limits.frame_bytes_max) -> None:
        assert _LENGTH_MIN <= frame_bytes_max <= limits.frame_bytes_max, frame_bytes_max
        self._frame_bytes_max = frame_bytes_max
        self._ready: deque[Frame] = deque()
        self._ready_bytes = 0
        self._head = bytearray()  # header bytes of the current frame (fewer than 9)
        self._parts: list[bytes | memoryview] = []  # body pieces of the current frame
        self._parts_bytes = 0  # body bytes received so far (in _parts or _body)
        self._body: bytearray | None = None  # the body's own buffer, once receive_buffer made it
        self._body_missing = -1  # -1: reading a header; else body bytes still to come
        self._format = 0
        self._correlation_id = 0
        self._error: RemoteProtocolError | None = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes fed and not yet returned by ``next_frame`` (dropped bytes not counted)."""
        in_body = _HEADER_BYTES + self._parts_bytes if self._body_missing >= 0 else 0
        return self._ready_bytes + len(self._head) + in_body

    @property
    def body_missing(self) -> int:
        """Bytes of the frame body being read that have not arrived yet; 0 between frames."""
        return max(self._body_missing, 0)

    @property
    def frame_bytes(self) -> int:
        """Size (header + body) of the frame being read, once its header is in and until its
        body is complete; 0 otherwise."""
        if self._body_missing < 0:
            return 0
        return _HEADER_BYTES + self._parts_bytes + self._body_missing

    @property
    def poisoned(self) -> bool:
        """True once a framing error was found; the connection must then close."""
        return self._error is not None

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Take the next bytes of the stream, in any split. Does not block or raise.

        After a framing error the decoder ignores further data. ``data`` is kept by reference
        when it is ``bytes``; other buffers are copied first, so callers may reuse them.
        """
        if self._error is not None or not data:
            return
        if type(data) is not bytes:
            data = bytes(data)
        pos = 0
        end = len(data)
        while pos < end and self._error is None:
            if self._body_missing >= 0:
                pos = self._take_body(data, pos, end)
            elif not self._head and end - pos >= _HEADER_BYTES:
                pos = self._take_whole_header(data, pos, end)
            else:
                pos = self._take_partial_header(data, pos, end)

    def receive_buffer(self) -> memoryview | None:
        """A writable view of the rest of the current frame body, to receive into directly
        (``socket.recv_into``), or None: between frames, after a framing error, or with fewer
        than ``DIRECT_BODY_BYTES_MIN`` body bytes missing (then ``feed`` as usual). Report what
        was written with ``received``. Does not block.

        The first call for a body allocates its buffer, of its final size, and copies in the
        pieces fed so far; every byte received into it afterwards is never copied again.
        """
        missing = self._body_missing
        if missing < DIRECT_BODY_BYTES_MIN or self._error is not None:
            return None
        body = self._body
        if body is None:
            body = self._body = bytearray(self._parts_bytes + missing)
            at = 0
            for part in self._parts:
                body[at : at + len(part)] = part
                at += len(part)
            self._parts = []
        return memoryview(body)[len(body) - missing :]

    def received(self, count: int) -> None:
        """``count`` bytes were written at the start of the last ``receive_buffer`` view (and
        nothing was fed since). Does not block or raise."""
        assert self._body is not None and 0 <= count <= self._body_missing, count
        self._parts_bytes += count
        self._body_missing -= count
        if self._body_missing == 0:
            self._finish_body()

    def peek_frame(self) -> Frame | None:
        """The next complete frame without taking it (``next_frame`` takes it), or None
        when none is complete or after a framing error. Never blocks or raises."""
        ready = self._ready
        return ready[0] if ready else None

    def next_frame(self) -> Frame | None:
        """Return the next complete frame, or None when more data is needed. Never blocks.

        Raises:
            RemoteProtocolError: after every frame before it was returned, the stream
                announced a frame larger than ``frame_bytes_max`` (MESSAGE_TOO_LARGE) or
                shorter than 5 bytes (INVALID_REQUEST). Raised again on every later call.
        """
        if self._ready:
            frame = self._ready.popleft()
            self._ready_bytes -= _HEADER_BYTES + len(frame.payload)
            return frame
        if self._error is not None:
            raise self._error
        return None

    # --- the cutting, one state each ------------------------------------------------------

    def _length_ok(self, length: int) -> bool:
        if length < _LENGTH_MIN:
            message = f"frame length {length} is shorter than the {_LENGTH_MIN}-byte header"
            self._poison(RemoteProtocolError(message, ErrorCode.INVALID_REQUEST))
            return False
        if length > self._frame_bytes_max:
            message = f"frame of {length} bytes exceeds the maximum of {self._frame_bytes_max}"
            self._poison(RemoteProtocolError(message, ErrorCode.MESSAGE_TOO_LARGE))
            return False
        return True

    def _poison(self, error: RemoteProtocolError) -> None:
        self._error = error
        self._head = bytearray()
        self._parts = []
        self._parts_bytes = 0
        self._body = None
        self._body_missing = -1

    def _take_whole_header(self, data: bytes, pos: int, end: int) -> int:
        length, format, correlation_id = _HEADER.unpack_from(data, pos)
        if not _LENGTH_MIN <= length <= self._frame_bytes_max and not self._length_ok(length):
            return end
        pos += _HEADER_BYTES
        body_bytes = length - _LENGTH_MIN
        if end - pos >= body_bytes:  # the whole frame is here (``_push``, inline: the common)
            self._ready.append(_new_frame(Frame, (format, correlation_id,
                                                  data[pos : pos + body_bytes])))
            self._ready_bytes += _HEADER_BYTES + body_bytes
            return pos + body_bytes
        self._start_body(format, correlation_id, body_bytes)
        return pos

    def _take_partial_header(self, data: bytes, pos: int, end: int) -> int:
        head = self._head
        had = len(head)
        take = min(_HEADER_BYTES - had, end - pos)
        head += data[pos : pos + take]
        pos += take
        if had < _PREFIX.size <= len(head):
            (length,) = _PREFIX.unpack_from(head)
            if not self._length_ok(length):
                return end
        if len(head) < _HEADER_BYTES:
            return pos
        length, format, correlation_id = _HEADER.unpack_from(head)
        self._head = bytearray()
        body_bytes = length - _LENGTH_MIN
        if body_bytes == 0:
            self._push(Frame(format, correlation_id, b""))
        else:
            self._start_body(format, correlation_id, body_bytes)
        return pos

    def _start_body(self, format: int, correlation_id: int, body_bytes: int) -> None:
        assert body_bytes > 0
        self._format = format
        self._correlation_id = correlation_id
        self._body_missing = body_bytes
        self._parts = []
        self._parts_bytes = 0
        self._body = None

    def _take_body(self, data: bytes, pos: int, end: int) -> int:
        take = min(self._body_missing, end - pos)
        body = self._body
        if body is not None:  # receive_buffer made the body's buffer: copy into it
            body[self._parts_bytes : self._parts_bytes + take] = memoryview(data)[pos : pos + take]
        else:
            self._parts.append(
                data if take == end and pos == 0 else memoryview(data)[pos : pos + take]
            )
        self._parts_bytes += take
        self._body_missing -= take
        if self._body_missing == 0:
            self._finish_body()
        return pos + take

    def _finish_body(self) -> None:
        payload: bytes | bytearray
        if self._body is not None:
            payload = self._body
        else:
            parts = self._parts
            payload = parts[0] if len(parts) == 1 and type(parts[0]) is bytes else b"".join(parts)
        self._parts = []
        self._parts_bytes = 0
        self._body = None
        self._body_missing = -1
        self._push(Frame(self._format, self._correlation_id, payload))

    def _push(self, frame: Frame) -> None:
        self._ready.append(frame)
        self._ready_bytes += _HEADER_BYTES + len(frame.payload)
