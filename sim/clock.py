"""``SimClock``: one node's clock over trio's virtual time, with an offset and a drift.

Theory of operation
-------------------
The whole simulation runs in one ``trio.run`` on a ``trio.testing.MockClock`` with autojump:
when every task is blocked, virtual time jumps to the next deadline, so a simulated minute
costs only the CPU the tasks use. That shared virtual time is *true time*; no node sees it
directly. Each node gets a ``SimClock`` that maps true time to what the node's own clock says:

    local_ms(true_s) = anchor_local_ms + (true_s - anchor_true_s) * 1000 * rate

``monotonic_ms`` is ``local_ms``; ``wall_ms`` adds the epoch and a wall offset. A *drift* is a
``rate`` other than 1 (a clock that runs 0.1 % fast has rate 1.001); ``set_rate`` re-anchors so
the clock stays continuous. A *clock jump* (an NTP step, an operator's mistake) moves only the
wall clock, forward or back: a monotonic clock never goes backwards, so ``jump_wall_ms`` never
touches it. ``sleep_until_ms`` converts a local deadline to true time at the current rate (a
rate change during the sleep makes it wake a little early or late, which callers that re-check
their deadline tolerate, as they must with a real clock).

The clock outlives a node's crashes: a rebooted machine keeps its clock, skew included.
"""

from __future__ import annotations

from typing import Callable

import trio

__all__ = ["SimClock", "WALL_EPOCH_MS"]

#: Wall time at virtual time zero: 2026-01-01T00:00:00Z, so timestamps look plausible.
WALL_EPOCH_MS = 1_767_225_600_000


def _true_now_s() -> float:
    return trio.current_time()


class SimClock:
    """A node's clock (the ``Clock`` protocol of ``rivven_broker.server.env``)."""

    def __init__(
        self,
        *,
        offset_ms: int = 0,
        rate: float = 1.0,
        true_now_s: Callable[[], float] = _true_now_s,
    ) -> None:
        assert rate > 0, rate
        self._true_now_s = true_now_s
        self._anchor_true_s = true_now_s()
        self._anchor_local_ms = float(offset_ms)
        self._rate = rate
        self._wall_offset_ms = 0

    @property
    def rate(self) -> float:
        return self._rate

    def _local_ms(self, true_s: float) -> float:
        return self._anchor_local_ms + (true_s - self._anchor_true_s) * 1000.0 * self._rate

    def monotonic_ms(self) -> int:
        """Milliseconds on this node's monotonic clock. Never blocks."""
        return int(self._local_ms(self._true_now_s()))

    def wall_ms(self) -> int:
        """Milliseconds since the Unix epoch on this node's wall clock. Never blocks."""
        return WALL_EPOCH_MS + self._wall_offset_ms + self.monotonic_ms()

    def true_s_of(self, local_ms: float) -> float:
        """The true (virtual) time at which this clock will read ``local_ms``."""
        return self._anchor_true_s + (local_ms - self._anchor_local_ms) / 1000.0 / self._rate

    async def sleep_until_ms(self, deadline_ms: int) -> None:
        """Sleep until this clock reads ``deadline_ms``. Always a checkpoint."""
        await trio.sleep_until(max(self.true_s_of(deadline_ms), self._true_now_s()))

    async def sleep_ms(self, duration_ms: int) -> None:
        """Sleep for ``duration_ms`` of this clock's time. Always a checkpoint."""
        await trio.sleep(max(duration_ms, 0) / 1000.0 / self._rate)

    # --- faults -----------------------------------------------------------------------------

    def set_rate(self, rate: float) -> None:
        """Make the clock run at ``rate`` from now on, continuously. Never blocks."""
        assert rate > 0, rate
        now_s = self._true_now_s()
        self._anchor_local_ms = self._local_ms(now_s)
        self._anchor_true_s = now_s
        self._rate = rate

    def jump_wall_ms(self, delta_ms: int) -> None:
        """Step the wall clock by ``delta_ms`` (either sign); monotonic time is unaffected."""
        self._wall_offset_ms += delta_ms
