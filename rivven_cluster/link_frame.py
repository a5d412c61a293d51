"""Authenticated frames on a byte stream between brokers (the Raft link, later replication).

Theory of operation
-------------------
A link is one TCP connection. Each side opens it with a *hello*: its node id, boot id, a
fresh 16-byte nonce, the channel (the Raft link, a replica fetcher's link or a broker-to-broker
call link) and the Raft
voters it knows, MACed under the ring's signing key. After both hellos every frame is

    u32 length | key id (4) | u64 sequence | payload | tag (16)

with ``tag = ChaCha20-Poly1305(session key, nonce = key id | sequence, plaintext = nothing,
associated data = payload)``, under ``session key = HMAC-SHA256(key, label | key id |
session)``, where the session is the sender's nonce followed by the receiver's. So a frame is
valid on one connection, in
one direction, at one position: a frame replayed onto another connection (the receiver's nonce
differs), reflected back to its sender (the nonce order differs), repeated, dropped or
reordered (the sequence is not the next one) fails, and the connection is closed. That is the
channel PySyncObj needs to be safe: FIFO, no duplicates, loss only with a disconnect. Nothing
is unpickled before its tag verifies, so nobody without a key reaches PySyncObj's pickles.

Why Poly1305 and not HMAC over the payload (docs/adr/0004-link-frame-tags.md): a replica
link carries every replicated byte, and HMAC-SHA256 costs 0.5 ms per MB on each side here
(with SHA-NI), in the chain of every follower round; Poly1305 costs 0.07. Its one-time key
must never authenticate two messages, and it does not: the AEAD derives it from the session
key and the nonce, and a session key never sees a nonce twice (the sequence counts the
frames of one direction of one connection). The AEAD is made once per link and key id,
so a frame costs no key derivation of its own. The hellos, which have no session yet, keep
HMAC-SHA256 (``_hello_tag``).

Big payloads are not copied more than they must be: ``LinkSealer.seal_parts`` joins a
payload given in pieces into the frame once and tags it there (``seal_around`` gives the
head and tag of a frame whose payload the caller sends itself, partly from a file:
``replica_link.py``), and a ``LinkReader`` made with
``views=True`` (the replica links) hands a frame of at least ``VIEW_BYTES_MIN`` out as a
``memoryview`` of the buffer it arrived in (the reader goes on in a new buffer), so a megabyte
of replicated batches is copied once on each side, not four times.

The key is chosen by key id (the ring's first key signs, every key verifies), so key rotation
works as for SWIM datagrams. ``LinkError`` names what was wrong; the driver counts it by reason.
Pure: no I/O, no clock; the driver feeds bytes in and writes bytes out.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct
from typing import Callable, Sequence

import attrs
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from rivven_cluster.membership.key_ring import KEY_ID_BYTES, KeyRing

__all__ = [
    "LINK_FRAME_BYTES_MAX",
    "NONCE_BYTES",
    "CHANNEL_RAFT",
    "CHANNEL_REPLICA",
    "CHANNEL_CALL",
    "LinkFault",
    "LinkError",
    "Hello",
    "seal_hello",
    "LinkSealer",
    "LinkReader",
]

LINK_FRAME_BYTES_MAX = 16 * 1024 * 1024
NONCE_BYTES = 16
TAG_BYTES = 16
_MAGIC = b"RVNL"
_VERSION = 5  # 3: replica fetch answers carry their records after the document; 4: Poly1305
#               under per-frame keys; 5: ChaCha20-Poly1305 under a session key
#: A frame at least this big is handed out as a view by a ``views`` reader.
VIEW_BYTES_MIN = 64 * 1024
_HEAD = struct.Struct(">I")
_SEQ = struct.Struct(">Q")
_HELLO = struct.Struct(">4sBiQ16sBH")  # magic, version, node id, boot id, nonce, channel,
#                                        voter count
_VOTER = struct.Struct(">i")
VOTERS_MAX = 64
CHANNEL_RAFT = 0
CHANNEL_REPLICA = 1
CHANNEL_CALL = 2
_HELLO_LABEL = b"rivven link hello"
_SESSION_LABEL = b"rivven link session"
_NO_TAG = bytes(TAG_BYTES)


class LinkFault(enum.Enum):
    OVERSIZED = "oversized"
    MALFORMED = "malformed"
    UNKNOWN_KEY = "unknown_key"
    BAD_MAC = "bad_mac"
    SEQUENCE = "sequence"


class LinkError(Exception):
    def __init__(self, fault: LinkFault, detail: str) -> None:
        super().__init__(f"{fault.value}: {detail}")
        self.fault = fault


@attrs.frozen
class Hello:
    """``voters``: the sender's Raft voters (empty from a broker that does not know them yet),
    so a broker started later learns whether it votes."""

    node_id: int
    boot_id: int
    nonce: bytes
    voters: tuple[int, ...] = ()
    #: What the connection is for: ``CHANNEL_RAFT``, ``CHANNEL_REPLICA`` or ``CHANNEL_CALL``.
    channel: int = 0


def _hello_tag(key: bytes, *parts: bytes) -> bytes:
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        mac.update(part)
    return mac.digest()[:TAG_BYTES]


class _FrameTags:
    """The tags of one direction of one connection: a ChaCha20-Poly1305 AEAD per key id,
    under that key's session key, made on first use."""

    def __init__(self, session: bytes) -> None:
        self._session = session
        self._aeads: dict[bytes, ChaCha20Poly1305] = {}

    def tag(self, key_id: bytes, key: bytes, nonce: bytes | memoryview,
            payload: bytes | memoryview) -> bytes:
        aead = self._aeads.get(key_id)
        if aead is None:
            aead = self._aeads[key_id] = ChaCha20Poly1305(
                hmac.digest(key, _SESSION_LABEL + key_id + self._session, "sha256"))
        return aead.encrypt(bytes(nonce), b"", payload)


def seal_hello(ring: KeyRing, hello: Hello) -> bytes:
    assert len(hello.nonce) == NONCE_BYTES and len(hello.voters) <= VOTERS_MAX
    body = _HELLO.pack(_MAGIC, _VERSION, hello.node_id, hello.boot_id, hello.nonce,
                       hello.channel, len(hello.voters)) + b"".join(_VOTER.pack(v) for v in hello.voters)
    key_id = ring.signing_key_id
    frame = key_id + _SEQ.pack(0) + body
    return _HEAD.pack(len(frame) + TAG_BYTES) + frame + _hello_tag(
        ring.signing_key, _HELLO_LABEL, key_id, body)


class LinkSealer:
    """Seals this side's frames of one connection (sequence 1, 2, ...)."""

    def __init__(self, ring: Callable[[], KeyRing], own_nonce: bytes, peer_nonce: bytes) -> None:
        self._ring = ring
        self._tags = _FrameTags(own_nonce + peer_nonce)
        self._sequence = 0

    def seal(self, payload: bytes) -> bytearray:
        return self.seal_parts((payload,))

    def seal_parts(self, parts: Sequence[bytes | bytearray | memoryview]) -> bytearray:
        """One frame whose payload is ``parts`` joined (copied once, then tagged in place)."""
        size = sum(len(part) for part in parts)
        key_id, key, head = self._next_head(size)
        frame = bytearray().join((_HEAD.pack(len(head) + size + TAG_BYTES), head, *parts,
                                  _NO_TAG))
        payload_start = _HEAD.size + len(head)
        frame[-TAG_BYTES:] = self._tags.tag(key_id, key, head,
                                            memoryview(frame)[payload_start:-TAG_BYTES])
        return frame

    def seal_around(self, payload: bytes | bytearray | memoryview) -> tuple[bytes, bytes]:
        """One frame of ``payload`` in three pieces, for a caller that sends the payload
        itself (partly from a file): what goes before it, and the tag that follows it."""
        key_id, key, head = self._next_head(len(payload))
        return (_HEAD.pack(len(head) + len(payload) + TAG_BYTES) + head,
                self._tags.tag(key_id, key, head, payload))

    def _next_head(self, size: int) -> tuple[bytes, bytes, bytes]:
        """The signing key id, its key and the head (key id, sequence) of the next frame."""
        assert size + 32 <= LINK_FRAME_BYTES_MAX, "a link frame is too large"
        self._sequence += 1
        ring = self._ring()
        key_id = ring.signing_key_id
        return key_id, ring.signing_key, key_id + _SEQ.pack(self._sequence)


class LinkReader:
    """Opens the peer's frames of one connection: first its hello, then payloads in order."""

    def __init__(self, ring: Callable[[], KeyRing], own_nonce: bytes, *,
                 views: bool = False) -> None:
        self._ring = ring
        self._own_nonce = own_nonce
        self._views = views
        self._buffer = bytearray()
        self._tags: _FrameTags | None = None
        self._sequence = 0
        self.hello: Hello | None = None

    def feed(self, data: bytes) -> list[bytes | memoryview]:
        """The complete payloads ``data`` finishes (the hello is kept in ``hello``): ``bytes``,
        or with ``views`` a ``memoryview`` for a frame of ``VIEW_BYTES_MIN`` or more.
        Raises ``LinkError``: the connection must then be closed."""
        buffer = self._buffer
        buffer += data
        payloads: list[bytes | memoryview] = []
        start = 0
        while len(buffer) - start >= _HEAD.size:
            (length,) = _HEAD.unpack_from(buffer, start)
            if length > LINK_FRAME_BYTES_MAX:
                raise LinkError(LinkFault.OVERSIZED, f"a frame of {length} bytes")
            if length < KEY_ID_BYTES + _SEQ.size + TAG_BYTES:
                raise LinkError(LinkFault.MALFORMED, f"a frame of {length} bytes")
            end = start + _HEAD.size + length
            if len(buffer) < end:
                break
            view = memoryview(buffer)[start + _HEAD.size:end]
            body = self._open(view)
            if body is not None and self._views and length >= VIEW_BYTES_MIN:
                # hand this buffer out with the view; go on in a copy of what follows
                payloads.append(body)
                buffer = self._buffer = buffer[end:]
                start = 0
                continue
            if body is not None:
                payloads.append(bytes(body))
            del view, body  # (no view of the buffer may be left when it is cut below)
            start = end
        if start:
            del buffer[:start]
        return payloads

    def _open(self, frame: memoryview) -> memoryview | None:
        key_id = bytes(frame[:KEY_ID_BYTES])
        (sequence,) = _SEQ.unpack_from(frame, KEY_ID_BYTES)
        body = frame[KEY_ID_BYTES + _SEQ.size:-TAG_BYTES]
        key = self._ring().key_for(key_id)
        if key is None:
            raise LinkError(LinkFault.UNKNOWN_KEY, f"key id {key_id.hex()}")
        if sequence != self._sequence:
            raise LinkError(LinkFault.SEQUENCE, f"frame {sequence} where {self._sequence} was due")
        if self._tags is None:
            expected = _hello_tag(key, _HELLO_LABEL, key_id, body)
        else:
            expected = self._tags.tag(key_id, key, frame[:KEY_ID_BYTES + _SEQ.size], body)
        if not hmac.compare_digest(expected, frame[-TAG_BYTES:]):
            raise LinkError(LinkFault.BAD_MAC, f"frame {sequence}")
        self._sequence += 1
        if self._tags is not None:
            return body
        if len(body) < _HELLO.size:
            raise LinkError(LinkFault.MALFORMED, "a hello of the wrong size")
        magic, version, node_id, boot_id, nonce, channel, count = _HELLO.unpack_from(body)
        if magic != _MAGIC or version != _VERSION:
            raise LinkError(LinkFault.MALFORMED, f"not a version {_VERSION} link hello")
        if count > VOTERS_MAX or len(body) != _HELLO.size + count * _VOTER.size:
            raise LinkError(LinkFault.MALFORMED, "a hello of the wrong size")
        voters = tuple(_VOTER.unpack_from(body, _HELLO.size + i * _VOTER.size)[0]
                       for i in range(count))
        if nonce == self._own_nonce:
            raise LinkError(LinkFault.MALFORMED, "our own hello reflected back")
        self.hello = Hello(node_id, boot_id, nonce, voters, channel)
        self._tags = _FrameTags(nonce + self._own_nonce)
        return None
