"""Authenticated datagrams: the frame around a SWIM payload, and the replay guard.

Theory of operation
-------------------
Every datagram between brokers is one frame, all integers big-endian:

| bytes | field |
| --- | --- |
| 4 | magic ``RVSW`` |
| 1 | version (1) |
| 4 | key id (``key_ring.key_id_of``: names the key, never is it) |
| 4 | sender node id (u32) |
| 8 | sender boot id (u64, new at every start; ``members.make_boot_id``) |
| 8 | sequence number (u64, from 1, one per datagram of this boot) |
| 8 | sender's wall-clock time, ms since the epoch (u64) |
| n | payload (msgpack, ``messages.py``) |
| 16 | tag: HMAC-SHA256 under the named key over every byte before it, first 16 bytes |

``seal`` builds one; ``open_frame`` checks one and returns its header and payload, or a
``Rejection`` with its reason — it never raises, whatever the bytes. In order: shorter than
header plus tag (``TRUNCATED``), over ``datagram_bytes_max`` (``OVERSIZED``), wrong magic or
version (``UNKNOWN_VERSION``), a key id the ring lacks (``UNKNOWN_KEY``), a tag that does not
match (``BAD_MAC``, compared in constant time), a timestamp further than ``timestamp_window_ms``
from the receiver's clock (``STALE_TIMESTAMP``), and a replay (``REPLAY``, from the
``ReplayGuard``). Only a frame that passed the MAC reaches the timestamp and replay checks, so
forged frames cannot fill the guard.

``ReplayGuard`` remembers, per sender node, its newest boot id and a sliding window of the last
``window`` sequence numbers of that boot (a bitmap, as IPsec's anti-replay): a sequence already
seen, or older than the window, or any frame of an older boot once a newer one was seen, is a
replay. Network duplicates are absorbed the same way. Senders remembered are bounded
(``senders_max``; the least recently heard is forgotten first).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct
from collections import OrderedDict
from typing import NamedTuple

from rivven_cluster.membership.key_ring import KEY_ID_BYTES, KeyRing

__all__ = [
    "FrameHeader", "Rejection", "Reason", "ReplayGuard", "seal", "open_frame",
    "HEADER_BYTES", "TAG_BYTES", "FRAME_OVERHEAD_BYTES", "DATAGRAM_BYTES_MAX",
]

MAGIC = b"RVSW"
VERSION = 1
_HEADER = struct.Struct(">4sB4sIQQQ")
HEADER_BYTES = _HEADER.size
TAG_BYTES = 16
FRAME_OVERHEAD_BYTES = HEADER_BYTES + TAG_BYTES
#: A datagram stays under a typical path MTU's payload (1,400 bytes: memberlist's budget).
DATAGRAM_BYTES_MAX = 1_400
assert HEADER_BYTES == 4 + 1 + KEY_ID_BYTES + 4 + 8 + 8 + 8


class Reason(enum.Enum):
    TRUNCATED = "truncated"
    OVERSIZED = "oversized"
    UNKNOWN_VERSION = "unknown_version"
    UNKNOWN_KEY = "unknown_key"
    BAD_MAC = "bad_mac"
    STALE_TIMESTAMP = "stale_timestamp"
    REPLAY = "replay"
    MALFORMED_PAYLOAD = "malformed_payload"  # decided by the receiver, after opening


class FrameHeader(NamedTuple):
    key_id: bytes
    node_id: int
    boot_id: int
    seq: int
    timestamp_ms: int


class Rejection(NamedTuple):
    reason: Reason
    detail: str


def seal(ring: KeyRing, node_id: int, boot_id: int, seq: int, timestamp_ms: int,
         payload: bytes) -> bytes:
    """The frame of ``payload``, signed with the ring's first key. Pure."""
    header = _HEADER.pack(MAGIC, VERSION, ring.signing_key_id, node_id, boot_id, seq,
                          timestamp_ms)
    body = header + payload
    assert len(body) + TAG_BYTES <= DATAGRAM_BYTES_MAX, "the core packs payloads to fit"
    tag = hmac.new(ring.signing_key, body, hashlib.sha256).digest()[:TAG_BYTES]
    return body + tag


def open_frame(
    ring: KeyRing,
    data: bytes,
    now_wall_ms: int,
    guard: ReplayGuard,
    *,
    timestamp_window_ms: int,
    datagram_bytes_max: int = DATAGRAM_BYTES_MAX,
) -> tuple[FrameHeader, bytes] | Rejection:
    """Check ``data``; return its header and payload, or why it is rejected. Never raises.
    Records an accepted frame in ``guard``."""
    size = len(data)
    if size < FRAME_OVERHEAD_BYTES:
        return Rejection(Reason.TRUNCATED, f"{size} bytes")
    if size > datagram_bytes_max:
        return Rejection(Reason.OVERSIZED, f"{size} bytes")
    magic, version, key_id, node_id, boot_id, seq, timestamp_ms = _HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        return Rejection(Reason.UNKNOWN_VERSION, f"magic {magic!r} version {version}")
    key = ring.key_for(key_id)
    if key is None:
        return Rejection(Reason.UNKNOWN_KEY, f"key id {key_id.hex()} from node {node_id}")
    body, tag = data[:-TAG_BYTES], data[-TAG_BYTES:]
    expected = hmac.new(key, body, hashlib.sha256).digest()[:TAG_BYTES]
    if not hmac.compare_digest(expected, tag):
        return Rejection(Reason.BAD_MAC, f"claimed node {node_id}")
    if abs(now_wall_ms - timestamp_ms) > timestamp_window_ms:
        return Rejection(Reason.STALE_TIMESTAMP,
                         f"node {node_id}: {timestamp_ms - now_wall_ms:+d} ms off")
    problem = guard.check_and_record(node_id, boot_id, seq)
    if problem is not None:
        return Rejection(Reason.REPLAY, f"node {node_id}: {problem}")
    header = FrameHeader(key_id, node_id, boot_id, seq, timestamp_ms)
    return header, bytes(data[HEADER_BYTES:-TAG_BYTES])


class ReplayGuard:
    """Which (sender, boot, sequence) were seen; bounded. Pure."""

    def __init__(self, window: int = 1024, senders_max: int = 4096) -> None:
        assert window >= 1 and senders_max >= 1
        self.window = window
        self.senders_max = senders_max
        # node id -> [boot id, highest seq, bitmap of the window below and at highest]
        self._senders: OrderedDict[int, list[int]] = OrderedDict()

    def check_and_record(self, node_id: int, boot_id: int, seq: int) -> str | None:
        """None (and remember it) for a fresh frame; why it is a replay otherwise."""
        state = self._senders.get(node_id)
        if state is None or boot_id > state[0]:
            self._remember(node_id, [boot_id, seq, 1])
            return None
        known_boot, highest, bitmap = state
        if boot_id < known_boot:
            return f"boot {boot_id} is older than {known_boot}"
        self._senders.move_to_end(node_id)
        if seq > highest:
            shift = seq - highest
            bitmap = ((bitmap << shift) | 1) & ((1 << self.window) - 1) if shift < self.window else 1
            state[1], state[2] = seq, bitmap
            return None
        age = highest - seq
        if age >= self.window:
            return f"sequence {seq} is older than the window ({highest} - {self.window})"
        if bitmap >> age & 1:
            return f"sequence {seq} seen before"
        state[2] = bitmap | (1 << age)
        return None

    def _remember(self, node_id: int, state: list[int]) -> None:
        self._senders[node_id] = state
        self._senders.move_to_end(node_id)
        while len(self._senders) > self.senders_max:
            self._senders.popitem(last=False)

    def __len__(self) -> int:
        return len(self._senders)
