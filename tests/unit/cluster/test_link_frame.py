"""Authenticated link frames: only the next frame of this connection and direction opens."""

from __future__ import annotations

import hmac
import struct

import pytest
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from rivven_cluster.link_frame import (
    LINK_FRAME_BYTES_MAX,
    VIEW_BYTES_MIN,
    Hello,
    LinkError,
    LinkFault,
    LinkReader,
    LinkSealer,
    seal_hello,
)
from rivven_cluster.membership import KeyRing

RING = KeyRing((b"a-cluster-key-of-enough-length",))
OTHER = KeyRing((b"another-key-of-enough-length!!",))
A_NONCE, B_NONCE = b"a" * 16, b"b" * 16


def _connection(ring=RING, *, views=False):
    """A's sealer and B's reader, after both hellos."""
    reader = LinkReader(lambda: ring, B_NONCE, views=views)
    assert reader.feed(seal_hello(ring, Hello(1, 7, A_NONCE))) == []
    assert reader.hello == Hello(1, 7, A_NONCE)
    return LinkSealer(lambda: ring, A_NONCE, B_NONCE), reader


def test_frames_open_in_order_even_split_anywhere():
    sealer, reader = _connection()
    stream = b"".join(sealer.seal(p) for p in (b"one", b"", b"three" * 100))
    received = []
    for i in range(0, len(stream), 7):
        received += reader.feed(stream[i:i + 7])
    assert received == [b"one", b"", b"three" * 100]


@pytest.mark.parametrize("step", [1, 1000, 65536, 1 << 20])
def test_a_views_reader_hands_big_payloads_out_as_views_of_buffers_it_let_go(step):
    """A big payload comes out as a memoryview of the buffer it arrived in (not copied
    again); the reader goes on in a new buffer, so the views keep their bytes while later
    frames arrive, split anywhere."""
    sealer, reader = _connection(views=True)
    big = bytes(range(256)) * (VIEW_BYTES_MIN // 256 + 3)
    payloads = [b"small", big, b"", big[::-1], b"tail"]
    stream = b"".join(sealer.seal_parts((p[:100], p[100:])) for p in payloads)
    received = []
    for i in range(0, len(stream), step):
        received += reader.feed(stream[i:i + step])
    assert received == payloads
    assert [type(p) for p in received] == [bytes, memoryview, bytes, memoryview, bytes]


def test_seal_parts_is_seal_of_the_joined_parts():
    one, _ = _connection()
    two, _ = _connection()
    assert one.seal_parts((b"ab", memoryview(b"cd"), bytearray(b"e"))) == two.seal(b"abcde")


def test_a_views_reader_still_refuses_a_flipped_bit_in_a_big_frame():
    sealer, reader = _connection(views=True)
    frame = bytearray(sealer.seal(b"x" * VIEW_BYTES_MIN))
    frame[-1] ^= 1
    with pytest.raises(LinkError) as caught:
        reader.feed(bytes(frame))
    assert caught.value.fault is LinkFault.BAD_MAC


@pytest.mark.parametrize("damage", ["drop", "repeat", "swap"])
def test_a_lost_repeated_or_reordered_frame_breaks_the_link(damage):
    sealer, reader = _connection()
    frames = [sealer.seal(b"%d" % i) for i in range(3)]
    if damage == "drop":
        frames = [frames[0], frames[2]]
    elif damage == "repeat":
        frames = [frames[0], frames[0]]
    else:
        frames = [frames[1], frames[0]]
    with pytest.raises(LinkError) as caught:
        for frame in frames:
            reader.feed(frame)
    assert caught.value.fault is LinkFault.SEQUENCE


def test_a_frame_replayed_onto_another_connection_fails():
    sealer, _ = _connection()
    frame = sealer.seal(b"vote for me")
    other_reader = LinkReader(lambda: RING, b"c" * 16)
    other_reader.feed(seal_hello(RING, Hello(1, 7, A_NONCE)))
    with pytest.raises(LinkError) as caught:
        other_reader.feed(frame)
    assert caught.value.fault is LinkFault.BAD_MAC


def test_a_frame_reflected_to_its_sender_fails():
    sealer, _ = _connection()
    frame = sealer.seal(b"x")
    back = LinkReader(lambda: RING, A_NONCE)
    back.feed(seal_hello(RING, Hello(2, 1, B_NONCE)))
    with pytest.raises(LinkError) as caught:
        back.feed(frame)
    assert caught.value.fault is LinkFault.BAD_MAC


def test_a_flipped_bit_fails():
    sealer, reader = _connection()
    frame = bytearray(sealer.seal(b"payload"))
    frame[20] ^= 1
    with pytest.raises(LinkError) as caught:
        reader.feed(bytes(frame))
    assert caught.value.fault is LinkFault.BAD_MAC


def test_a_stranger_s_hello_names_an_unknown_key():
    reader = LinkReader(lambda: RING, B_NONCE)
    with pytest.raises(LinkError) as caught:
        reader.feed(seal_hello(OTHER, Hello(1, 1, A_NONCE)))
    assert caught.value.fault is LinkFault.UNKNOWN_KEY
    assert reader.hello is None


def test_a_reflected_hello_is_refused():
    reader = LinkReader(lambda: RING, B_NONCE)
    with pytest.raises(LinkError, match="reflected"):
        reader.feed(seal_hello(RING, Hello(1, 1, B_NONCE)))


def test_oversized_and_undersized_frames_are_refused_before_buffering():
    _, reader = _connection()
    with pytest.raises(LinkError) as caught:
        reader.feed(struct.pack(">I", LINK_FRAME_BYTES_MAX + 1))
    assert caught.value.fault is LinkFault.OVERSIZED
    _, reader = _connection()
    with pytest.raises(LinkError) as caught:
        reader.feed(struct.pack(">I", 3) + b"abc")
    assert caught.value.fault is LinkFault.MALFORMED


def test_key_rotation_verifies_with_any_key_of_the_ring():
    old_key, new_key = RING.secrets[0], b"the-new-cluster-key-0123456789"
    signer = KeyRing((new_key, old_key))   # step 2: signs with the new key
    verifier = KeyRing((old_key, new_key))  # step 1 on the other side: verifies both
    reader = LinkReader(lambda: verifier, B_NONCE)
    reader.feed(seal_hello(signer, Hello(1, 1, A_NONCE)))
    sealer = LinkSealer(lambda: signer, A_NONCE, B_NONCE)
    assert reader.feed(sealer.seal(b"ok")) == [b"ok"]


def test_a_hello_carries_the_voters():
    reader = LinkReader(lambda: RING, B_NONCE)
    reader.feed(seal_hello(RING, Hello(4, 9, A_NONCE, (1, 2, 3))))
    assert reader.hello == Hello(4, 9, A_NONCE, (1, 2, 3))


def test_a_frame_s_tag_is_chacha20_poly1305_under_the_session_key_as_documented():
    # docs/protocol.md and docs/adr/0004: the session key is HMAC-SHA256(ring key, label +
    # key id + sender nonce + receiver nonce); the tag is ChaCha20-Poly1305's with the key id
    # and sequence as the nonce, nothing encrypted and the payload as associated data.
    sealer, reader = _connection()
    payload = b"x" * 1000
    frames = [sealer.seal(payload) for _ in range(2)]
    key_id = RING.signing_key_id
    session_key = hmac.digest(RING.signing_key, b"rivven link session" + key_id + A_NONCE
                              + B_NONCE, "sha256")
    for sequence, frame in enumerate(frames, start=1):
        head = key_id + struct.pack(">Q", sequence)
        assert frame[4:-16] == head + payload
        assert frame[-16:] == ChaCha20Poly1305(session_key).encrypt(head, b"", payload)
    assert frames[0][-16:] != frames[1][-16:]  # a nonce per frame, never reused
    assert reader.feed(b"".join(frames)) == [payload, payload]


@pytest.mark.parametrize("where", [0, VIEW_BYTES_MIN, 3 * VIEW_BYTES_MIN - 1])
def test_a_flipped_bit_anywhere_in_a_big_payload_fails(where):
    sealer, reader = _connection()
    parts = [b"d" * 100, bytes(VIEW_BYTES_MIN), b"r" * (2 * VIEW_BYTES_MIN - 100)]
    frame = bytearray(sealer.seal_parts(parts))
    frame[4 + 12 + where] ^= 0x80
    with pytest.raises(LinkError) as caught:
        reader.feed(bytes(frame))
    assert caught.value.fault is LinkFault.BAD_MAC
