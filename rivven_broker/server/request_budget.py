"""``RequestBudget``: a broker-wide bound on the bytes of requests being received.

Theory of operation
-------------------
Kafka's ``queued.max.request.bytes``. A client may announce a frame of up to
``frame_bytes_max`` (64 MiB) and then send it slowly; without a bound, ten such clients hold
600 MB of half-received frames. Every connection's reader therefore *reserves* a frame's
whole size here once the frame turns out not to fit in one receive (its length is known from
its header), before it reads any more of it, and releases the reservation when the frame is
complete and handed on. A frame that arrives whole in one receive (every small request) never
touches the budget.

A reservation is granted while anything is left (``available > 0``), even if the frame is
larger than what is left: the budget may be overdrawn by at most one frame, and a frame
larger than the whole budget still gets through once the others are done. So a reader never
waits forever for a reservation that could never be granted, and the budget is never a reason
to fail a request. When nothing is left, readers wait (``reserve`` blocks) and stop reading
their sockets: TCP backpressure reaches the senders, the requests already received go on.

Worst case held by unfinished frames: ``bytes_max + frame_bytes_max`` plus one receive buffer
per connection (the bytes of the receive that showed the frame to be large).
"""

from __future__ import annotations

import trio

__all__ = ["RequestBudget"]


class RequestBudget:
    """Bytes of unfinished request frames, broker-wide. ``bytes_max`` 0 switches it off."""

    def __init__(self, bytes_max: int) -> None:
        assert bytes_max >= 0
        self.bytes_max = bytes_max
        self.reserved_bytes = 0
        self.waits = 0  # reservations that had to wait
        self._freed = trio.Event()

    def try_reserve(self, frame_bytes: int) -> bool:
        """Reserve ``frame_bytes`` if anything is left; False otherwise. Never blocks."""
        assert frame_bytes > 0
        if self.bytes_max and self.reserved_bytes >= self.bytes_max:
            return False
        self.reserved_bytes += frame_bytes
        return True

    async def reserve(self, frame_bytes: int) -> None:
        """Reserve ``frame_bytes``, waiting while the budget is spent. A checkpoint only when
        it waits."""
        if self.try_reserve(frame_bytes):
            return
        self.waits += 1
        while not self.try_reserve(frame_bytes):
            if self._freed.is_set():
                self._freed = trio.Event()
            await self._freed.wait()

    def release(self, frame_bytes: int) -> None:
        """Give back a reservation. Never blocks."""
        assert 0 < frame_bytes <= self.reserved_bytes, (frame_bytes, self.reserved_bytes)
        self.reserved_bytes -= frame_bytes
        self._freed.set()
