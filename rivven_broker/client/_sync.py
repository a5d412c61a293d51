"""Request/response calls on the caller's thread: the engine under ``Admin``.

Theory of operation
-------------------
``SyncClient.call(request)`` sends one request to a chosen broker (a partition leader, or any
broker) and drives its ``NetworkClient`` until the answer arrives. Retriable failures (a lost
connection, a request timeout, an ``ErrorResponse`` with a retriable code) are retried with
exponential backoff and jitter until ``timeout_ms``; others are raised at once. Answers'
*per-item* error codes are the caller's business (``requests.py`` turns them into errors).

"Cannot connect" is reported fast: when ``connect_attempts_max`` dial attempts in a row found
nothing listening at any candidate address, ``call`` raises ``ConnectionFailedError`` instead of
retrying to its full timeout (the CLI turns that into exit code 2).

Thread-safety: one lock serialises calls; a ``SyncClient`` belongs to one object (an
``Admin``, or a ``Consumer`` for its offset look-ups).
"""

from __future__ import annotations

import random
import threading
from typing import Any

from rivven_broker.client._cluster import ClusterIO
from rivven_broker.client._network import NetworkClient, monotonic_ms
from rivven_broker.client.config import ConnectionConfig
from rivven_broker.client.errors import (
    ClientTimeoutError,
    ClosedError,
    ConnectionFailedError,
    RivvenError,
    UnknownTopicOrPartitionError,
    error_for,
)
from rivven_broker.client.metadata import Address, MetadataCache, parse_bootstrap
from rivven_broker.client.requests import check_response, metadata_request
from rivven_broker.client.retry import RetryPolicy
from rivven_broker.protocol import messages as m

__all__ = ["SyncClient"]


class SyncClient:
    """Blocking request/response over a private ``NetworkClient``. Thread-safe (one lock)."""

    def __init__(
        self,
        bootstrap: str,
        config: ConnectionConfig,
        *,
        connect_attempts_max: int = 3,
        allow_auto_topic_creation: bool = False,
    ) -> None:
        assert connect_attempts_max >= 1
        self.config = config
        self.connect_attempts_max = connect_attempts_max
        self._lock = threading.Condition(threading.RLock())
        self._rng = random.Random()
        self.metadata = MetadataCache(
            parse_bootstrap(bootstrap),
            metadata_max_age_ms=config.metadata_max_age_ms,
            refresh_backoff_ms=0,
        )
        self._net = NetworkClient(config, in_flight_max=8, rng=self._rng)
        self._cluster = ClusterIO(
            self._net,
            self.metadata,
            self._lock,
            allow_auto_topic_creation=allow_auto_topic_creation,
        )
        self._retry = RetryPolicy(
            retry_backoff_ms=config.retry_backoff_ms,
            retry_backoff_max_ms=config.retry_backoff_max_ms,
        )
        self._closed = False

    def call(
        self, request: Any, *, node_id: int | None = None, timeout_ms: int | None = None
    ) -> Any:
        """Send ``request`` (to ``node_id``, or any broker) and return the answer. Blocks.

        An ``ErrorResponse`` with a non-retriable code is raised as its ``BrokerError``.

        Raises:
            ConnectionFailedError: no broker reachable (``connect_attempts_max`` dials failed).
            ClientTimeoutError: no answer within ``timeout_ms`` (default request_timeout_ms).
            BrokerError: the broker refused the request as a whole.
            ClosedError: the client is closed.
        """
        timeout_ms = self.config.request_timeout_ms if timeout_ms is None else timeout_ms
        deadline = monotonic_ms() + timeout_ms
        attempts = 0
        dial_failures = 0
        last_error: RivvenError | None = None
        with self._lock:
            while True:
                if self._closed:
                    raise ClosedError("the client is closed")
                now = monotonic_ms()
                failed_before = self._net.failed_dials
                address = self._address(node_id, now)
                if address is None:
                    if self._net.failed_dials > failed_before:
                        dial_failures += 1  # a real dial failed (not just a backoff wait)
                    last_error = self._cluster.connect_error() or last_error
                    if dial_failures >= self.connect_attempts_max or now >= deadline:
                        raise ConnectionFailedError(
                            f"cannot reach a broker: {last_error.message if last_error else ''}"
                        )
                    self._net.poll(max(0, min(self._wait_for_dial(now), deadline - now)))
                    continue
                attempts += 1
                try:
                    return self._once(address, request, deadline - now)
                except RivvenError as error:
                    last_error = error
                    decision = self._retry.decide(
                        retriable=error.retriable,
                        error_code=error.error_code,
                        attempts=attempts,
                        now_ms=monotonic_ms(),
                        deadline_ms=deadline,
                        rng=self._rng,
                    )
                    if decision.refresh_metadata:
                        self.metadata.request_update()
                    if not decision.retry:
                        raise
                    self._net.poll(max(0, decision.retry_at_ms - monotonic_ms()))

    def _address(self, node_id: int | None, now: int) -> Address | None:
        if node_id is None:
            return self._cluster.any_address(now)
        address = self.metadata.address_of(node_id)
        if address is None:
            raise UnknownTopicOrPartitionError(f"broker {node_id} is not in the metadata")
        if self._net.is_connected(address) or (
            self._net.can_connect(address, now) and self._net.connect(address)
        ):
            return address
        return None

    def _wait_for_dial(self, now: int) -> int:
        with self._lock:
            candidates = self._cluster.candidates()
        times = [self._net.retry_at_ms(a) - now for a in candidates]
        return max(1, min(times) + 1) if times else self.config.retry_backoff_ms

    def _once(self, address: Address, request: Any, timeout_ms: int) -> Any:
        result: list = []

        def on_answer(response: Any, error: RivvenError | None) -> None:
            result.append((response, error))

        deadline = monotonic_ms() + timeout_ms
        while not self._net.is_ready(address) and self._net.is_connected(address):
            remaining = deadline - monotonic_ms()
            if remaining <= 0:
                break
            self._net.poll(remaining)  # the handshake is on its way
        self._net.send(address, request, on_answer, timeout_ms=max(timeout_ms, 1))
        while not result:
            remaining = deadline - monotonic_ms()
            if remaining <= 0:
                self._net.close_connection(
                    address, ClientTimeoutError("request abandoned at its deadline")
                )
                break
            self._net.poll(remaining)
        if not result:
            raise ClientTimeoutError(f"no answer from {address} within {timeout_ms} ms")
        response, error = result[0]
        if error is not None:
            raise error
        if isinstance(response, m.ErrorResponse):
            raise error_for(response.error_code, response.message)
        return response

    # --- metadata helpers --------------------------------------------------------------------
    def fetch_metadata(self, topics: list[str] | None, *, timeout_ms: int | None = None) -> Any:
        """A Metadata answer for ``topics`` (None: all); also refreshes the cache."""
        response = check_response(
            self.call(metadata_request(topics, False), timeout_ms=timeout_ms), m.MetadataResponse
        )
        with self._lock:
            self.metadata.on_update(response, monotonic_ms())
        return response

    def leader_for(self, topic: str, partition: int, *, timeout_ms: int | None = None) -> int:
        """The leader node of a partition (refreshing metadata if needed).

        Raises:
            BrokerError: the topic's error (unknown topic ...), or
                ``UnknownTopicOrPartitionError`` for a partition out of range / leaderless.
        """
        with self._lock:
            self.metadata.add_topics([topic])
            node = self.metadata.leader_for(topic, partition)
        if node is None:
            self.fetch_metadata(sorted(self.metadata.wanted), timeout_ms=timeout_ms)
            code = self.metadata.topic_error(topic)
            if code is not None:
                raise error_for(code, f"topic {topic!r}")
            node = self.metadata.leader_for(topic, partition)
            if node is None:
                raise UnknownTopicOrPartitionError(f"{topic}-{partition} has no known leader")
        return node

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._net.close()
