"""Retry decisions: exponential backoff with jitter, bounded by attempts and a deadline.

Theory of operation
-------------------
A failed request is retried when, and only when, its error is retriable, the attempt count is
below ``retries_max`` and the retry can start before the operation's deadline (the producer's
``delivery_timeout_ms`` after the record was accepted). The n-th retry waits
``retry_backoff_ms * 2**(n-1)`` capped at ``retry_backoff_max_ms``, times a jitter factor drawn
uniformly from ``[1 - jitter, 1 + jitter]`` (an injected ``random.Random``), so that many clients
failing together do not come back together. Errors that mean "your view of the cluster is
stale" (``NOT_LEADER``, ``UNKNOWN_TOPIC_OR_PARTITION``, a lost connection ...) also ask for a
metadata refresh before the retry.

Pure: no clock reads (``now_ms`` is an argument), no global randomness.
"""

from __future__ import annotations

import random
from typing import NamedTuple

import attrs

from rivven_broker.protocol.errors import ErrorCode

__all__ = ["RetryPolicy", "RetryDecision", "REFRESH_METADATA_CODES", "needs_metadata_refresh"]

#: Codes after which the client refreshes metadata before trying again.
REFRESH_METADATA_CODES = frozenset(
    {
        ErrorCode.NOT_LEADER,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.BROKER_SHUTTING_DOWN,
        ErrorCode.KAFKA_STORAGE_ERROR,
        ErrorCode.NOT_ENOUGH_REPLICAS,
    }
)


def needs_metadata_refresh(code: ErrorCode | None) -> bool:
    """Whether an error code means the client's cluster view may be stale."""
    return code in REFRESH_METADATA_CODES


class RetryDecision(NamedTuple):
    """What to do after a failure: ``retry`` at ``retry_at_ms`` (and maybe refresh metadata)."""

    retry: bool
    retry_at_ms: int
    refresh_metadata: bool
    reason: str


@attrs.frozen
class RetryPolicy:
    """Backoff and retry bounds. Defaults follow Kafka's client (100 ms -> 1 s, 20 % jitter)."""

    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 1000
    retries_max: int = 2_147_483_647
    jitter: float = 0.2

    def __attrs_post_init__(self) -> None:
        if self.retry_backoff_ms < 0 or self.retry_backoff_max_ms < self.retry_backoff_ms:
            raise ValueError("need 0 <= retry_backoff_ms <= retry_backoff_max_ms")
        if self.retries_max < 0:
            raise ValueError("retries_max must be >= 0")
        if not 0.0 <= self.jitter < 1.0:
            raise ValueError("jitter must be in [0, 1)")

    def backoff_ms(self, attempt: int, rng: random.Random) -> int:
        """Wait before retry number ``attempt`` (1 = the first retry). Never blocks."""
        assert attempt >= 1
        exponent = min(attempt - 1, 32)  # 2**32 * anything is past every cap
        base = min(self.retry_backoff_ms * (1 << exponent), self.retry_backoff_max_ms)
        if self.jitter:
            base = base * rng.uniform(1.0 - self.jitter, 1.0 + self.jitter)
        return max(int(base), 0)

    def decide(
        self,
        *,
        retriable: bool,
        error_code: ErrorCode | None,
        attempts: int,
        now_ms: int,
        deadline_ms: int,
        rng: random.Random,
    ) -> RetryDecision:
        """Decide about a failure after ``attempts`` tries (>= 1). Never blocks or raises."""
        assert attempts >= 1
        refresh = needs_metadata_refresh(error_code)
        if not retriable:
            return RetryDecision(False, now_ms, refresh, "not retriable")
        if attempts > self.retries_max:
            return RetryDecision(False, now_ms, refresh, f"gave up after {attempts} attempts")
        retry_at_ms = now_ms + self.backoff_ms(attempts, rng)
        if retry_at_ms >= deadline_ms:
            return RetryDecision(False, now_ms, refresh, "deadline passed")
        return RetryDecision(True, retry_at_ms, refresh, "retriable")


def reconnect_backoff_ms(base_ms: int, max_ms: int, failures: int, rng: random.Random) -> int:
    """Wait before redialling a broker after ``failures`` failed dials in a row (the same
    exponential backoff with 20 % jitter as request retries). Never blocks."""
    return RetryPolicy(retry_backoff_ms=base_ms, retry_backoff_max_ms=max_ms).backoff_ms(
        failures, rng
    )
