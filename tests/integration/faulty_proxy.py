"""A fault-injecting TCP proxy for the exactly-once tests: duplicated requests, dropped links.

Goal: make the failures idempotence exists for happen on purpose, between a real client and
a real broker on loopback. Method: the proxy cuts both directions into protocol frames
(``u32 length`` · ``u8 format`` · ``u32 correlation id`` · payload) and, from a seeded
``random.Random``, per client frame:

- *duplicates* it (the broker receives and handles the same request twice; the proxy drops
  the second answer, so the client sees a well-formed stream and the broker a true retry);
- *drops the link after delivering it* (the broker handles the request, the client never
  hears the answer and must retry: the retry is a duplicate);
- *drops the link before delivering it* (the request is lost).

Only frames after the first few of a connection are touched (the Handshake goes through),
and the faults stop after ``faults_max`` so a run always finishes. Counters say what was done.
"""

from __future__ import annotations

import random
import struct

import trio

_LENGTH = struct.Struct(">I")
_HEADER = struct.Struct(">IBI")


class _Cutter:
    """Whole frames out of a byte stream."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self.buffer += data
        frames = []
        while len(self.buffer) >= 9:
            (length,) = _LENGTH.unpack_from(self.buffer)
            if len(self.buffer) < 4 + length:
                break
            correlation_id = _HEADER.unpack_from(self.buffer)[2]
            frames.append((correlation_id, bytes(self.buffer[: 4 + length])))
            del self.buffer[: 4 + length]
        return frames


class FaultyProxy:
    """``await nursery.start(proxy.serve)``; clients dial ``proxy.address``."""

    def __init__(
        self,
        upstream_port: int,
        *,
        seed: int,
        duplicate_p: float = 0.0,
        drop_after_p: float = 0.0,
        drop_before_p: float = 0.0,
        faults_max: int = 1_000_000,
        spare_frames: int = 3,
    ) -> None:
        self.upstream_port = upstream_port
        self.rng = random.Random(seed)
        self.duplicate_p = duplicate_p
        self.drop_after_p = drop_after_p
        self.drop_before_p = drop_before_p
        self.faults_max = faults_max
        self.spare_frames = spare_frames
        self.port = 0
        self.duplicated = self.dropped_after = self.dropped_before = self.connections = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def faults(self) -> int:
        return self.duplicated + self.dropped_after + self.dropped_before

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, client: trio.SocketStream) -> None:
        self.connections += 1
        try:
            upstream = await trio.open_tcp_stream("127.0.0.1", self.upstream_port)
        except OSError:
            await client.aclose()
            return
        swallow: set[int] = set()  # correlation ids whose second answer must be dropped
        async with trio.open_nursery() as nursery:

            def cut() -> None:
                nursery.cancel_scope.cancel()

            nursery.start_soon(self._requests, client, upstream, swallow, cut)
            nursery.start_soon(self._answers, upstream, client, swallow, cut)
        await trio.aclose_forcefully(client)
        await trio.aclose_forcefully(upstream)

    def _roll(self, p: float) -> bool:
        return self.faults < self.faults_max and self.rng.random() < p

    async def _requests(self, client, upstream, swallow, cut) -> None:
        cutter, seen = _Cutter(), 0
        try:
            while data := await client.receive_some(1 << 16):
                for correlation_id, frame in cutter.feed(data):
                    seen += 1
                    if seen > self.spare_frames and self._roll(self.drop_before_p):
                        self.dropped_before += 1
                        cut()
                        return
                    # Decided (and the answer marked to swallow) before the first copy
                    # leaves: ``send_all`` is a checkpoint, and the broker's first answer
                    # may come back through ``_answers`` before it returns; marked only
                    # then, both answers would reach the client (one answer twice: a
                    # protocol error that fails every request on the connection for good).
                    duplicate = seen > self.spare_frames and self._roll(self.duplicate_p)
                    if duplicate:
                        self.duplicated += 1
                        swallow.add(correlation_id)
                    await upstream.send_all(frame)
                    if duplicate:
                        await upstream.send_all(frame)
                    if seen > self.spare_frames and self._roll(self.drop_after_p):
                        self.dropped_after += 1
                        await trio.sleep(0.002)  # let the broker take it in
                        cut()
                        return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        cut()

    async def _answers(self, upstream, client, swallow, cut) -> None:
        cutter = _Cutter()
        answered: set[int] = set()
        try:
            while data := await upstream.receive_some(1 << 16):
                out = []
                for correlation_id, frame in cutter.feed(data):
                    if correlation_id in swallow:
                        if correlation_id in answered:
                            swallow.discard(correlation_id)
                            answered.discard(correlation_id)
                            continue  # the duplicate's answer
                        answered.add(correlation_id)
                    out.append(frame)
                if out:
                    await client.send_all(b"".join(out))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        cut()
