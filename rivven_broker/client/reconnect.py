"""Reconnect backoff: when the client may dial each broker address again.

Theory of operation
-------------------
A failed dial (refused, timed out, a handshake that failed, or a connection lost later) puts
its address on hold: the n-th failure in a row waits ``reconnect_backoff_ms * 2**(n-1)``, capped
at ``reconnect_backoff_max_ms``, times a jitter factor in [0.8, 1.2] from the injected
``random.Random`` (``retry.reconnect_backoff_ms``), so that clients of a restarted broker do not
all come back in the same millisecond. A successful handshake clears the address's count.

Both drivers keep one ``ReconnectBackoff`` and ask it, never decide themselves:
``can_dial(address, now_ms)``, ``next_dial_ms(candidates, now_ms)`` (when "any broker" may be
tried again), ``failed_dials`` (dials failed ever: a call counts the real failures among its
attempts, as opposed to waits for a backoff) and ``last_error`` (why the last dial failed, for
the message of a call that gives up). The tables hold one entry per address that ever failed:
bounded by the broker addresses the client was told about.

Pure: ``now_ms`` is an argument; the jitter comes from the injected ``random.Random``.
"""

from __future__ import annotations

import random
from typing import Hashable, Iterable

from rivven_broker.client.errors import RivvenError
from rivven_broker.client.retry import reconnect_backoff_ms

__all__ = ["ReconnectBackoff"]


class ReconnectBackoff:
    """Dial failures per address and when each may be dialled again. Never blocks."""

    def __init__(self, base_ms: int, max_ms: int, rng: random.Random) -> None:
        assert 0 <= base_ms <= max_ms
        self.base_ms = base_ms
        self.max_ms = max_ms
        self.rng = rng
        self.failed_dials = 0  # dials refused, lost or timed out, ever
        self.last_error: RivvenError | None = None  # of the most recent failure, any address
        self._failures: dict[Hashable, int] = {}
        self._retry_at_ms: dict[Hashable, int] = {}
        self._errors: dict[Hashable, RivvenError] = {}

    def can_dial(self, address: Hashable, now_ms: int) -> bool:
        """Whether ``address`` is out of its backoff at ``now_ms``."""
        return self._retry_at_ms.get(address, 0) <= now_ms

    def retry_at_ms(self, address: Hashable) -> int:
        """When ``address`` may be dialled again (0: at once)."""
        return self._retry_at_ms.get(address, 0)

    def failures(self, address: Hashable) -> int:
        """Failed dials of ``address`` in a row."""
        return self._failures.get(address, 0)

    def error_of(self, address: Hashable) -> RivvenError | None:
        """Why the last dial of ``address`` failed (None after a success)."""
        return self._errors.get(address)

    def next_dial_ms(self, candidates: Iterable[Hashable], now_ms: int) -> int:
        """The earliest moment one of ``candidates`` may be dialled (``now_ms`` if any can)."""
        times = [self._retry_at_ms.get(a, 0) for a in candidates]
        return max(min(times), now_ms) if times else now_ms

    def on_dial_failed(self, address: Hashable, error: RivvenError, now_ms: int) -> int:
        """Record a failed dial (or a lost connection); returns when to dial again."""
        self.failed_dials += 1
        failures = self._failures.get(address, 0) + 1
        self._failures[address] = failures
        retry_at = now_ms + reconnect_backoff_ms(self.base_ms, self.max_ms, failures, self.rng)
        self._retry_at_ms[address] = retry_at
        self._errors[address] = error
        self.last_error = error
        return retry_at

    def on_connected(self, address: Hashable) -> None:
        """The broker at ``address`` accepted our handshake: its count starts again."""
        self._failures.pop(address, None)
        self._errors.pop(address, None)

    def check_invariants(self) -> None:
        assert set(self._errors) == set(self._failures) <= set(self._retry_at_ms), "keys"
        assert all(count >= 1 for count in self._failures.values())
        assert self.failed_dials >= max(self._failures.values(), default=0)
