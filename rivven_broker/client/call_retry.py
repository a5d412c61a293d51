"""One request/response call with retries: the decisions of ``SyncClient.call`` and ``TrioCluster.call``.

Theory of operation
-------------------
A call sends one request (to a named broker, or to any broker) and returns its answer. The
driver loops, asking a ``CallRetry`` at each turn:

- ``target_known(node_id)`` before it looks for a connection: a broker the metadata does not
  list (a broker with a stale view answered the last refresh) fails the call at once with a
  retriable ``ConnectionFailedError`` and asks for a metadata refresh, so the caller finds its
  target again (a group its coordinator). It is a connection problem, not a topic one: a Kafka
  client user who catches ``UnknownTopicOrPartitionError`` expects it to mean "no such topic",
  and a retriable ``ConnectionFailedError`` is what retry loops around calls already handle.
- ``no_connection(...)`` when no connection could be had: a real dial that failed counts
  towards ``connect_attempts_max`` (then ``ConnectionFailedError``, so "nothing listening" is
  reported fast), a wait for a backoff does not; the answer is how long to wait for the next
  dial, never past the deadline.
- ``attempt(now_ms)`` before sending: counts the attempt, returns the time left (>= 1 ms).
- ``answer(response)``: an ``ErrorResponse`` becomes its typed error (raised), anything else
  is the call's result.
- ``failed(error, now_ms)`` after a failure: the wait before the next attempt (exponential
  backoff with jitter, ``RetryPolicy``), or the error raised: not retriable, out of attempts,
  or out of time (a request that timed out at the call's deadline is raised as
  ``ClientTimeoutError``). Errors that say the cluster view is stale ask for a refresh.

Pure: ``now_ms`` is an argument, the jitter comes from the injected ``random.Random``.
"""

from __future__ import annotations

import random
from typing import Any

from rivven_broker.client.errors import (
    ClientTimeoutError,
    ConnectionFailedError,
    RequestTimedOutError,
    RivvenError,
    error_for,
)
from rivven_broker.client.metadata import MetadataCache
from rivven_broker.client.retry import RetryPolicy
from rivven_broker.protocol import messages as m

__all__ = ["CallRetry"]


class CallRetry:
    """The retry state of one call. Not thread-safe (one caller); never blocks."""

    def __init__(
        self,
        *,
        now_ms: int,
        timeout_ms: int,
        policy: RetryPolicy,
        rng: random.Random,
        metadata: MetadataCache,
        connect_attempts_max: int = 3,
    ) -> None:
        assert timeout_ms >= 0 and connect_attempts_max >= 1
        self.timeout_ms = timeout_ms
        self.deadline_ms = now_ms + timeout_ms
        self.policy = policy
        self.rng = rng
        self.metadata = metadata
        self.connect_attempts_max = connect_attempts_max
        self.attempts = 0
        self.dial_failures = 0
        self.last_error: RivvenError | None = None

    def target_known(self, node_id: int | None) -> None:
        """Raise (retriably, asking for a refresh) when ``node_id`` is not in the metadata."""
        if node_id is not None and self.metadata.address_of(node_id) is None:
            self.metadata.request_update()
            raise ConnectionFailedError(f"broker {node_id} is not in the metadata")

    def no_connection(
        self, now_ms: int, *, dial_failed: bool, next_dial_ms: int, error: RivvenError | None
    ) -> int:
        """No connection now: the ms to wait before looking again (>= 1).

        Raises:
            ConnectionFailedError: ``connect_attempts_max`` dials failed, or the deadline passed.
        """
        if dial_failed:
            self.dial_failures += 1
        if error is not None:
            self.last_error = error
        if self.dial_failures >= self.connect_attempts_max or now_ms >= self.deadline_ms:
            reason = self.last_error.message if self.last_error is not None else ""
            raise ConnectionFailedError(f"cannot reach a broker: {reason}")
        return max(1, min(next_dial_ms, self.deadline_ms) - now_ms + 1)

    def attempt(self, now_ms: int) -> int:
        """Count an attempt; the ms left for its answer (>= 1)."""
        self.attempts += 1
        return max(self.deadline_ms - now_ms, 1)

    @staticmethod
    def answer(response: Any) -> Any:
        """The call's result; an ``ErrorResponse`` is raised as its typed error."""
        if isinstance(response, m.ErrorResponse):
            raise error_for(response.error_code, response.message)
        return response

    def failed(self, error: RivvenError, now_ms: int) -> int:
        """An attempt failed: the ms to wait before the next one. Raises when it is final."""
        assert self.attempts >= 1, "failed() follows attempt()"
        self.last_error = error
        decision = self.policy.decide(
            retriable=error.retriable,
            error_code=error.error_code,
            attempts=self.attempts,
            now_ms=now_ms,
            deadline_ms=self.deadline_ms,
            rng=self.rng,
        )
        if decision.refresh_metadata:
            self.metadata.request_update()
        if decision.retry:
            return max(0, decision.retry_at_ms - now_ms)
        if isinstance(error, RequestTimedOutError) and now_ms >= self.deadline_ms:
            raise ClientTimeoutError(f"no answer within {self.timeout_ms} ms") from error
        raise error
