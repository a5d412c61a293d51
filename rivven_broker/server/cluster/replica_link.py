"""The replica link: one authenticated connection from a follower to a leader it fetches from.

Theory of operation
-------------------
A follower dials the leader's cluster address (the TCP side of ``--cluster-listen``, the port
the Raft links use) and opens with a ``link_frame`` hello on ``CHANNEL_REPLICA``; the leader's
Raft listener hands such a connection to the replica manager instead of PySyncObj. From then
on every frame is tagged under the cluster key ring and bound to the connection, direction
and sequence, so only a broker holding the cluster key can fetch as a replica (a client
connection never can: it speaks the client protocol on another port), and a tampered,
replayed or reordered frame closes the link. The follower sends one request and reads its
answer before sending the next: requests and answers are strictly alternating.

``send`` takes a payload in parts (a fetch answer's document and the records as read from
the log) and the follower's reader hands big payloads out as views of its receive buffer
(``LinkReader(views=True)``), so replicated batches are copied once on each side. Records
given as a ``FileRegion`` (large batches in a segment file: ``file_region.py``) are read once
into memory for the tag, and then, on a stream that can (``EagerStream.send_file``), sent
by the kernel from the page cache: no copy into the frame, none into the socket. The tag
covers what was read; if the file changed before the kernel sent it (a deposed leader
truncating), the follower's check fails and the link closes, so nothing unverified is
appended.
"""

from __future__ import annotations

from typing import Callable

import trio

from rivven_broker.file_region import FileRegion
from rivven_broker.server.eager_stream import EagerStream
from rivven_broker.server.env import Env
from rivven_cluster.link_frame import (
    CHANNEL_REPLICA,
    NONCE_BYTES,
    Hello,
    LinkError,
    LinkReader,
    LinkSealer,
    seal_hello,
)
from rivven_cluster.membership import KeyRing

__all__ = ["ReplicaLink", "open_replica_link", "LinkClosed"]

_RECEIVE_BYTES = 1 << 20


class LinkClosed(Exception):
    """The link failed (closed, reset, timed out or a frame did not verify)."""


class ReplicaLink:
    """One end of an open replica link: ``send`` a payload, ``receive`` the next one."""

    def __init__(self, stream: trio.abc.Stream, reader: LinkReader, sealer: LinkSealer,
                 peer: Hello, early: list[bytes]) -> None:
        self.stream = stream
        self.peer = peer
        self._reader = reader
        self._sealer = sealer
        self._ready = list(early)

    async def send(self, *parts: bytes | memoryview | FileRegion) -> None:
        """One frame whose payload is ``parts`` joined. Closes every ``FileRegion`` part,
        sent or not."""
        try:
            if not any(type(part) is FileRegion for part in parts):
                await self.stream.send_all(self._sealer.seal_parts(parts))  # type: ignore[arg-type]
            elif isinstance(self.stream, EagerStream):
                await self._send_with_files(self.stream, parts)
            else:  # a stream that cannot send a file: the region's bytes
                await self.stream.send_all(self._sealer.seal_parts(
                    [part.read() if type(part) is FileRegion else part for part in parts]))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise LinkClosed(f"send failed: {exc}") from exc
        finally:
            for part in parts:
                if type(part) is FileRegion:
                    part.close()

    async def _send_with_files(self, stream: EagerStream,
                               parts: tuple[bytes | memoryview | FileRegion, ...]) -> None:
        """The frame of ``parts``: its regions read once for the tag, then sent with
        ``sendfile`` between the rest (module docstring)."""
        payload = memoryview(bytearray(sum(map(len, parts))))
        position = 0
        for part in parts:
            size = len(part)
            if type(part) is FileRegion:
                part.read_into(payload[position:position + size])
            else:
                payload[position:position + size] = part  # type: ignore[assignment]
            position += size
        head, tag = self._sealer.seal_around(payload)
        pending: list[bytes | memoryview] = [head]  # sent before the next region
        position = 0
        for part in parts:
            size = len(part)
            if type(part) is FileRegion:
                await stream.send_all(b"".join(pending))
                pending = []
                await stream.send_file(part)
            else:
                pending.append(payload[position:position + size])
            position += size
        pending.append(tag)
        await stream.send_all(b"".join(pending))

    async def receive(self) -> bytes | memoryview:
        """The next payload (empty keep-alive frames are skipped): a ``memoryview`` for a
        big one on a link this side opened as a replica fetcher."""
        while True:
            while self._ready:
                payload = self._ready.pop(0)
                if payload:
                    return payload
            try:
                data = await self.stream.receive_some(_RECEIVE_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                raise LinkClosed(f"receive failed: {exc}") from exc
            if not data:
                raise LinkClosed("closed by the peer")
            try:
                self._ready.extend(self._reader.feed(data))
            except LinkError as exc:
                raise LinkClosed(str(exc)) from exc

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)


async def open_replica_link(env: Env, address: tuple[str, int], *, node_id: int, boot_id: int,
                            ring: Callable[[], KeyRing], timeout_s: float,
                            channel: int = CHANNEL_REPLICA) -> ReplicaLink:
    """Dial ``address`` and exchange hellos; raises ``LinkClosed`` on any failure. (The same
    link carries broker-to-broker calls with ``channel=CHANNEL_CALL``: ``broker_calls.py``.)"""
    rng = env.rng("replica-link")
    nonce = rng.randbytes(NONCE_BYTES)
    reader = LinkReader(ring, nonce, views=channel == CHANNEL_REPLICA)
    stream: trio.abc.Stream | None = None
    try:
        with trio.fail_after(timeout_s):
            stream = await env.net.open_tcp_stream(*address)
            await stream.send_all(seal_hello(ring(), Hello(node_id, boot_id, nonce,
                                                           channel=channel)))
            early: list[bytes | memoryview] = []
            while reader.hello is None:
                data = await stream.receive_some(_RECEIVE_BYTES)
                if not data:
                    raise LinkClosed("closed during the hello")
                early = reader.feed(data)
    except (OSError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError,
            LinkError) as exc:
        if stream is not None:
            await trio.aclose_forcefully(stream)
        raise LinkClosed(f"could not open a replica link to {address}: {exc}") from exc
    except LinkClosed:
        assert stream is not None
        await trio.aclose_forcefully(stream)
        raise
    return ReplicaLink(stream, reader, LinkSealer(ring, nonce, reader.hello.nonce),
                       reader.hello, early)
