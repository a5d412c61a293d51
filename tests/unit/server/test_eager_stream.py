"""EagerSendStream: the broker's socket stream whose send_all skips the scheduler when it can.

Method: real connected socket pairs. A small send completes with no checkpoint at all; a
send larger than the kernel buffers falls back to trio and still delivers every byte in
order; closing, a vanished peer and two concurrent senders raise trio's stream errors.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from rivven_broker.server.eager_stream import EagerSendStream


def _pair() -> tuple[EagerSendStream, trio.SocketStream]:
    left, right = trio.socket.socketpair()
    return EagerSendStream(trio.SocketStream(left)), trio.SocketStream(right)


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
