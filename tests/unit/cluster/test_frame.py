"""Authenticated datagrams: every rejection reason, the replay window, and garbage.

Method: frames are sealed with real rings and opened by ``open_frame``; each test names one
rule of ``frame.py``'s docstring. Hypothesis then throws random bytes, bit flips and
truncations of real frames at it: every one is rejected with a reason, none raises, and only
an untouched frame opens.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rivven_cluster.membership import (
    FRAME_OVERHEAD_BYTES,
    KeyRing,
    Reason,
    ReplayGuard,
    open_frame,
    seal,
)
from rivven_cluster.membership.frame import HEADER_BYTES

RING = KeyRing((b"the-first-secret-of-the-ring", b"an-older-secret-still-verifying"))
NOW_MS = 1_800_000_000_000
WINDOW_MS = 30_000


def _open(data: bytes, guard: ReplayGuard | None = None, ring: KeyRing = RING, now: int = NOW_MS):
    guard = guard if guard is not None else ReplayGuard()
    return open_frame(ring, data, now, guard, timestamp_window_ms=WINDOW_MS)


def _frame(seq: int = 1, *, node: int = 7, boot: int = 99, at: int = NOW_MS,
           payload: bytes = b"\x90", ring: KeyRing = RING) -> bytes:
    return seal(ring, node, boot, seq, at, payload)


def test_a_sealed_frame_opens_to_its_header_and_payload():
    header, payload = _open(_frame(5, payload=b"\x91\x92\x02\x05"))
    assert (header.node_id, header.boot_id, header.seq, header.timestamp_ms) == (7, 99, 5, NOW_MS)
    assert header.key_id == RING.signing_key_id and payload == b"\x91\x92\x02\x05"


@pytest.mark.parametrize("data,reason", [
    (b"", Reason.TRUNCATED),
    (_frame()[: FRAME_OVERHEAD_BYTES - 1], Reason.TRUNCATED),
    (b"XXXX" + _frame()[4:], Reason.UNKNOWN_VERSION),
    (_frame()[:4] + b"\x02" + _frame()[5:], Reason.UNKNOWN_VERSION),
    (_frame()[:5] + b"\x00\x00\x00\x00" + _frame()[9:], Reason.UNKNOWN_KEY),
    (_frame()[:-1] + bytes([_frame()[-1] ^ 1]), Reason.BAD_MAC),
    (_frame()[:HEADER_BYTES] + b"\x91" + _frame()[HEADER_BYTES + 1 :], Reason.BAD_MAC),
    (_frame(payload=b"\x00" * 1300) + b"\x00" * 100, Reason.OVERSIZED),
])
def test_each_rejection_has_its_reason(data, reason):
    rejected = _open(data)
    assert rejected.reason is reason, rejected


def test_a_frame_signed_with_a_key_the_ring_lacks_is_unknown_key():
    stranger = KeyRing((b"somebody-elses-secret-key",))
    assert _open(_frame(ring=stranger)).reason is Reason.UNKNOWN_KEY


def test_timestamps_outside_the_window_are_stale():
    assert _open(_frame(at=NOW_MS - WINDOW_MS - 1)).reason is Reason.STALE_TIMESTAMP
    assert _open(_frame(at=NOW_MS + WINDOW_MS + 1)).reason is Reason.STALE_TIMESTAMP
    assert isinstance(_open(_frame(at=NOW_MS - WINDOW_MS))[0], tuple)


def test_replays_duplicates_and_old_boots_are_rejected():
    guard = ReplayGuard(window=64)
    assert not hasattr(_open(_frame(10), guard), "reason")
    assert _open(_frame(10), guard).reason is Reason.REPLAY  # a duplicate
    assert not hasattr(_open(_frame(8), guard), "reason")  # late but inside the window
    assert _open(_frame(8), guard).reason is Reason.REPLAY
    assert not hasattr(_open(_frame(100), guard), "reason")
    assert _open(_frame(100 - 64), guard).reason is Reason.REPLAY  # slid out of the window
    assert not hasattr(_open(_frame(100 - 63), guard), "reason")
    assert not hasattr(_open(_frame(1, boot=100), guard), "reason")  # a restart: new boot
    assert _open(_frame(500, boot=99), guard).reason is Reason.REPLAY  # the old process
    assert not hasattr(_open(_frame(1, node=8), guard), "reason")  # senders are separate


def test_forged_frames_never_reach_the_replay_guard():
    guard = ReplayGuard(senders_max=2)
    for node in range(100):
        forged = _frame(1, node=node)[:-1] + bytes([_frame(1, node=node)[-1] ^ 0xFF])
        assert _open(forged, guard).reason is Reason.BAD_MAC
    assert len(guard) == 0


def test_the_guard_remembers_a_bounded_number_of_senders():
    guard = ReplayGuard(senders_max=3)
    for node in range(10):
        assert guard.check_and_record(node, 1, 1) is None
    assert len(guard) == 3


def test_rotation_old_and_new_keys_both_verify_while_the_new_one_signs():
    old_ring = KeyRing((b"the-old-secret-0123456789",))
    added = KeyRing((b"the-old-secret-0123456789", b"the-new-secret-0123456789"))
    switched = KeyRing((b"the-new-secret-0123456789", b"the-old-secret-0123456789"))
    new_ring = KeyRing((b"the-new-secret-0123456789",))
    # step 1 everywhere: old signs, both verify; step 2 on some nodes: new signs
    for sender, receiver in ((old_ring, added), (added, switched), (switched, added),
                             (switched, new_ring), (new_ring, switched)):
        assert isinstance(_open(_frame(ring=sender), ring=receiver)[0], tuple)
    assert _open(_frame(ring=old_ring), ring=new_ring).reason is Reason.UNKNOWN_KEY


@settings(max_examples=300)
@given(data=st.binary(max_size=1500))
def test_random_bytes_are_rejected_never_raised(data):
    rejected = _open(data)
    assert rejected.reason in Reason


@settings(max_examples=300)
@given(cut=st.integers(0, 200), flip=st.integers(0, 8 * 200), payload=st.binary(max_size=150))
def test_truncations_and_bit_flips_of_real_frames_are_rejected(cut, flip, payload):
    frame = _frame(payload=payload)
    truncated = frame[: min(cut, len(frame) - 1)]
    assert _open(truncated).reason in (Reason.TRUNCATED, Reason.BAD_MAC)
    position = flip % (len(frame) * 8)
    flipped = bytearray(frame)
    flipped[position // 8] ^= 1 << (position % 8)
    assert _open(bytes(flipped)).reason in (
        Reason.UNKNOWN_VERSION, Reason.UNKNOWN_KEY, Reason.BAD_MAC)
