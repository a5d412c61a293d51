"""``ReconnectBudget``: when the CDC source tries to get its replication connection back, and
when it gives up.

Theory of operation
-------------------
One budget covers one outage: it is made when the source notices the replication
connection is gone (``lost_at_ms``) and dropped when a reconnect succeeds. Before each
attempt the source asks ``next_delay_ms(now_ms, jitter)``:

- the wait before attempt ``n`` is the runtime's shared ``backoff_delay_ms(n, jitter)``
  (``core.batch_cycle``: 100 ms · 2^(n-1), capped at 30 s, its upper half jitter), so a
  source and a batch cycle back off alike;
- ``None`` means give up: ``attempts_max`` attempts were made, or the outage has lasted
  ``timeout_ms`` (an attempt is never scheduled past the deadline: its wait is cut to end
  there, so the last attempt happens at the deadline at the latest);
- ``attempts_max = 0`` never reconnects: the first loss stops the source.

Pure: time and jitter come in as arguments. ``describe(now_ms)`` says how long and how
many attempts, for the error that stops the source.
"""

from __future__ import annotations

import attrs

from rivven_connect.core.batch_cycle import backoff_delay_ms

__all__ = ["ReconnectBudget", "reconnect_attempts_max_default",
           "reconnect_timeout_ms_default"]

#: The defaults of the source's ``reconnect_attempts_max`` and ``reconnect_timeout_ms``:
#: whichever is reached first ends the outage (about 20 attempts fill 5 minutes).
reconnect_attempts_max_default = 20
reconnect_timeout_ms_default = 300_000


@attrs.define
class ReconnectBudget:
    """The attempts and time left for one outage (see the module docstring)."""

    attempts_max: int
    timeout_ms: int
    lost_at_ms: int
    attempts: int = 0

    def __attrs_post_init__(self) -> None:
        assert self.attempts_max >= 0 and self.timeout_ms > 0, self

    def next_delay_ms(self, now_ms: int, jitter: float) -> int | None:
        """The wait before the next attempt (counted as made), or None: give up."""
        if self.attempts >= self.attempts_max:
            return None
        remaining_ms = self.lost_at_ms + self.timeout_ms - now_ms
        if remaining_ms <= 0:
            return None
        self.attempts += 1
        delay_ms = min(backoff_delay_ms(self.attempts, jitter), remaining_ms)
        self.check_invariants()
        return delay_ms

    def describe(self, now_ms: int) -> str:
        return (f"{self.attempts} attempt(s) in {max(0, now_ms - self.lost_at_ms) / 1000:.1f} s"
                f" (limits: reconnect_attempts_max {self.attempts_max}, "
                f"reconnect_timeout_ms {self.timeout_ms})")

    def check_invariants(self) -> None:
        assert 0 <= self.attempts <= self.attempts_max
