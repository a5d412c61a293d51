"""EagerStream: the broker's socket stream that skips the scheduler when the kernel can serve.

Method: real connected socket pairs. A small send completes with no checkpoint at all; a
send larger than the kernel buffers falls back to trio and still delivers every byte in
order; a receive that finds bytes returns them with no checkpoint (but yields once in every
run of ``_YIELD_EVERY``), one that finds none waits; closing, a vanished peer, end of stream
and two concurrent senders or receivers behave as trio's streams do. ``send_file`` sends a
``FileRegion`` of a real file the same ways, and breaks the stream if the file shrank.
"""

from __future__ import annotations

import os

import pytest
import trio
import trio.testing

from rivven_broker.file_region import FileRegion
from rivven_broker.server.eager_stream import _YIELD_EVERY, EagerStream


def _pair() -> tuple[EagerStream, trio.SocketStream]:
    left, right = trio.socket.socketpair()
    return EagerStream(trio.SocketStream(left)), trio.SocketStream(right)


async def _receive_exactly(stream: trio.abc.ReceiveStream, count: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < count:
        data = await stream.receive_some(1 << 20)
        assert data, "EOF before every byte arrived"
        chunks += data
    return bytes(chunks)


async def test_a_send_the_kernel_takes_at_once_is_not_a_checkpoint():
    eager, peer = _pair()
    with trio.testing.assert_no_checkpoints():
        await eager.send_all(b"hello")
        await eager.send_all(memoryview(b"-world"))
    assert await _receive_exactly(peer, 11) == b"hello-world"


async def test_a_send_larger_than_the_socket_buffers_delivers_every_byte():
    eager, peer = _pair()
    payload = bytes(range(256)) * (64 * 1024)  # 16 MiB: far beyond the kernel's buffers
    received = []
    async with trio.open_nursery() as nursery:

        async def drain() -> None:
            received.append(await _receive_exactly(peer, len(payload)))

        nursery.start_soon(drain)
        await eager.send_all(payload)
    assert received == [payload]


async def test_an_empty_send_is_a_checkpoint_and_sends_nothing():
    eager, peer = _pair()
    with trio.testing.assert_checkpoints():
        await eager.send_all(b"")
    await eager.send_all(b"x")
    assert await _receive_exactly(peer, 1) == b"x"


async def test_sending_on_a_closed_stream_raises_closed():
    eager, _ = _pair()
    await eager.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await eager.send_all(b"late")


async def test_sending_to_a_vanished_peer_raises_broken():
    eager, peer = _pair()
    await peer.aclose()
    with pytest.raises(trio.BrokenResourceError):
        for _ in range(100):  # the first write may still be accepted by the kernel
            await eager.send_all(b"x" * 65536)


async def test_two_concurrent_senders_are_refused():
    eager, peer = _pair()
    payload = b"y" * (32 * 1024 * 1024)  # blocks until the peer reads
    async with trio.open_nursery() as nursery:
        nursery.start_soon(eager.send_all, payload)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(trio.BusyResourceError):
            await eager.send_all(b"z")
        assert await _receive_exactly(peer, len(payload)) == payload


async def test_a_receive_that_finds_bytes_is_not_a_checkpoint():
    eager, peer = _pair()
    await peer.send_all(b"ready")
    await trio.testing.wait_all_tasks_blocked()
    with trio.testing.assert_no_checkpoints():
        assert await eager.receive_some(3) == b"rea"
        assert await eager.receive_some() == b"dy"


async def test_a_run_of_eager_receives_yields_once_in_a_while(monkeypatch):
    yields = []
    real_yield = trio.lowlevel.cancel_shielded_checkpoint

    async def counted_yield() -> None:
        yields.append(1)
        await real_yield()

    eager, peer = _pair()
    await peer.send_all(b"z" * (2 * _YIELD_EVERY))
    await trio.testing.wait_all_tasks_blocked()
    monkeypatch.setattr(trio.lowlevel, "cancel_shielded_checkpoint", counted_yield)
    for _ in range(_YIELD_EVERY - 1):
        assert await eager.receive_some(1) == b"z"
    assert yields == []
    assert await eager.receive_some(1) == b"z"
    assert yields == [1]  # the last of the run yields, and the count starts again
    for _ in range(_YIELD_EVERY):
        assert await eager.receive_some(1) == b"z"
    assert yields == [1, 1]


async def test_a_receive_waits_for_bytes_and_sees_the_end_of_the_stream():
    eager, peer = _pair()
    received = []
    async with trio.open_nursery() as nursery:

        async def receive() -> None:
            received.append(await eager.receive_some(100))
            received.append(await eager.receive_some(100))

        nursery.start_soon(receive)
        await trio.testing.wait_all_tasks_blocked()
        assert received == []  # nothing there yet: it waits
        await peer.send_all(b"late")
        await trio.testing.wait_all_tasks_blocked()
        await peer.aclose()
    assert received == [b"late", b""]


async def test_receiving_on_a_closed_stream_raises_closed():
    eager, _ = _pair()
    await eager.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await eager.receive_some(10)


async def test_a_receive_interrupted_by_close_raises_closed():
    eager, _peer = _pair()
    async with trio.open_nursery() as nursery:

        async def receive() -> None:
            with pytest.raises(trio.ClosedResourceError):
                await eager.receive_some(10)

        nursery.start_soon(receive)
        await trio.testing.wait_all_tasks_blocked()
        await eager.aclose()


async def test_a_receive_from_a_reset_peer_raises_broken():
    left, right = trio.socket.socketpair()
    eager = EagerStream(trio.SocketStream(left))
    import socket
    import struct

    right.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await trio.SocketStream(right).send_all(b"unread")
    right.close()  # unread bytes + linger 0: the peer resets
    with pytest.raises((trio.BrokenResourceError)):
        for _ in range(3):
            if not await eager.receive_some(10):
                raise trio.BrokenResourceError("end of stream instead of a reset")


async def test_two_concurrent_receivers_are_refused():
    eager, peer = _pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(eager.receive_some, 10)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(trio.BusyResourceError):
            await eager.receive_some(10)
        await peer.send_all(b"x")


async def test_a_receive_of_nothing_is_refused():
    eager, _ = _pair()
    with pytest.raises(ValueError):
        await eager.receive_some(0)


def _region(tmp_path, data: bytes, position: int = 0, size: int | None = None) -> FileRegion:
    path = tmp_path / "segment"
    path.write_bytes(data)
    handle = os.open(path, os.O_RDWR)
    try:
        return FileRegion.of(handle, position, len(data) - position if size is None else size)
    finally:
        os.close(handle)


async def test_a_file_region_is_sent_by_the_kernel_byte_for_byte(tmp_path):
    eager, peer = _pair()
    data = bytes(range(256)) * (64 * 1024)  # 16 MiB: sendfile must wait for room many times
    region = _region(tmp_path, data, 1000, len(data) - 2000)
    received = []
    async with trio.open_nursery() as nursery:

        async def drain() -> None:
            received.append(await _receive_exactly(peer, region.size))

        nursery.start_soon(drain)
        await eager.send_file(region)
    assert received == [data[1000:-1000]]
    assert not region.closed  # the caller closes it
    region.close()


async def test_a_small_region_the_kernel_takes_at_once_is_not_a_checkpoint(tmp_path):
    eager, peer = _pair()
    region = _region(tmp_path, b"0123456789", 2, 5)
    with trio.testing.assert_no_checkpoints():
        await eager.send_file(region)
    assert await _receive_exactly(peer, 5) == b"23456"
    region.close()


async def test_a_region_whose_file_shrank_breaks_the_stream(tmp_path):
    eager, peer = _pair()
    region = _region(tmp_path, b"z" * 100_000)
    os.ftruncate(region.fd, 40_000)  # truncated between the read and the send
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_receive_exactly, peer, 40_000)
        with pytest.raises(trio.BrokenResourceError, match="ends inside"):
            await eager.send_file(region)
    region.close()


async def test_sending_a_region_on_a_closed_stream_raises_closed(tmp_path):
    eager, _ = _pair()
    region = _region(tmp_path, b"late")
    await eager.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await eager.send_file(region)
    region.close()
