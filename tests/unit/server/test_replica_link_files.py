"""A replica link sends records given as a file region: read once for the tag, sent by the
kernel from the file where the stream can, and the frame the follower opens is the same.

Method: a real socket pair and a real file. The leader's side is a ``ReplicaLink`` over an
``EagerStream`` (``sendfile``) or a plain trio stream (the region's bytes); the follower's
side is a ``LinkReader`` fed every byte that arrives. A region the file no longer holds
closes the link, and every region given to ``send`` is closed afterwards either way.
"""

from __future__ import annotations

import os

import pytest
import trio

from rivven_broker.file_region import FileRegion
from rivven_broker.server.cluster.replica_link import LinkClosed, ReplicaLink
from rivven_broker.server.eager_stream import EagerStream
from rivven_cluster.link_frame import Hello, LinkReader, LinkSealer, seal_hello
from rivven_cluster.membership import KeyRing

RING = KeyRing((b"a-cluster-key-of-enough-length",))
LEADER_NONCE, FOLLOWER_NONCE = b"l" * 16, b"f" * 16
RECORDS = bytes(range(256)) * 2048  # 512 KiB: more than a socket takes at once


def _link(eager: bool) -> tuple[ReplicaLink, trio.SocketStream, LinkReader]:
    left, right = trio.socket.socketpair()
    stream: trio.abc.Stream = trio.SocketStream(left)
    if eager:
        stream = EagerStream(stream)  # type: ignore[arg-type]
    reader = LinkReader(lambda: RING, FOLLOWER_NONCE, views=True)
    assert reader.feed(seal_hello(RING, Hello(1, 1, LEADER_NONCE))) == []
    sealer = LinkSealer(lambda: RING, LEADER_NONCE, FOLLOWER_NONCE)
    link = ReplicaLink(stream, LinkReader(lambda: RING, LEADER_NONCE), sealer,
                       Hello(2, 1, FOLLOWER_NONCE), [])
    return link, trio.SocketStream(right), reader


async def _payloads(peer: trio.SocketStream, reader: LinkReader, count: int) -> list[bytes]:
    payloads: list[bytes] = []
    while len(payloads) < count:
        data = await peer.receive_some(1 << 20)
        assert data, "the link closed before the frame arrived"
        payloads.extend(bytes(payload) for payload in reader.feed(data))
    return payloads


def _region(tmp_path, *, position: int = 100) -> FileRegion:
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(b"x" * position + RECORDS)
    handle = os.open(path, os.O_RDONLY)
    try:
        return FileRegion.of(handle, position, len(RECORDS))
    finally:
        os.close(handle)


@pytest.mark.parametrize("eager", [True, False], ids=["sendfile", "bytes"])
async def test_a_region_arrives_as_its_bytes_in_a_frame_that_verifies(tmp_path, eager):
    link, peer, reader = _link(eager)
    region = _region(tmp_path)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(link.send, b"\x00\x00\x00\x03", b"doc", region, b"tail")
        payloads = await _payloads(peer, reader, 1)
    assert payloads == [b"\x00\x00\x00\x03doc" + RECORDS + b"tail"]
    assert region.closed
    await link.send(b"next")  # the sequence went on: the next frame opens too
    assert await _payloads(peer, reader, 1) == [b"next"]


async def test_a_region_the_file_no_longer_holds_closes_the_link(tmp_path):
    link, peer, reader = _link(True)
    region = _region(tmp_path)
    os.truncate(tmp_path / "00000000000000000000.log", 1000)  # cut under the region
    with pytest.raises(LinkClosed):
        await link.send(b"doc", region)
    assert region.closed
