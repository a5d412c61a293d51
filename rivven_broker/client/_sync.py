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
retrying to its full timeout (the CLI turns that into exit code 2). Every such decision (and
the backoff between attempts) is the core's ``CallRetry`` (``call_retry.py``), which the trio
driver's ``TrioCluster.call`` follows too.

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
from rivven_broker.client.call_retry import CallRetry
from rivven_broker.client.errors import ClientTimeoutError, ClosedError, RivvenError
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

        An ``ErrorResponse`` with a non-retriable code is raised as its ``BrokerError``. The
        retry decisions are the core's ``CallRetry``.

        Raises:
            ConnectionFailedError: no broker reachable (``connect_attempts_max`` dials failed),
                or ``node_id`` is not in the metadata (retriable; a refresh is asked for).
            ClientTimeoutError: no answer within ``timeout_ms`` (default request_timeout_ms).
            BrokerError: the broker refused the request as a whole.
            ClosedError: the client is closed.
        """
        timeout_ms = self.config.request_timeout_ms if timeout_ms is None else timeout_ms
        backoff = self._net.backoff
        with self._lock:
            retry = CallRetry(
                now_ms=monotonic_ms(), timeout_ms=timeout_ms, policy=self._retry, rng=self._rng,
                metadata=self.metadata, connect_attempts_max=self.connect_attempts_max,
            )
            while True:
                if self._closed:
                    raise ClosedError("the client is closed")
                retry.target_known(node_id)
                now = monotonic_ms()
                failed_before = backoff.failed_dials
                address, candidates = self._address(node_id, now)
                if address is None:
                    self._net.poll(retry.no_connection(
                        now, dial_failed=backoff.failed_dials > failed_before,
                        next_dial_ms=backoff.next_dial_ms(candidates, now),
                        error=backoff.last_error,
                    ))
                    continue
                try:
                    return retry.answer(self._once(address, request, retry.attempt(now)))
                except RivvenError as error:
                    self._net.poll(retry.failed(error, monotonic_ms()))

    def _address(self, node_id: int | None, now: int) -> tuple[Address | None, list[Address]]:
        """A connection's address (dialled if needed), or None; and the addresses it was
        chosen from (their backoffs say when to look again)."""
        if node_id is None:
            return self._cluster.any_address(now), self.metadata.addresses()
        address = self.metadata.address_of(node_id)
        assert address is not None, "CallRetry.target_known checked it"
        if self._net.is_connected(address) or (
            self._net.backoff.can_dial(address, now) and self._net.connect(address)
        ):
            return address, [address]
        return None, [address]

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
            with self._lock:
                node = self.metadata.leader_or_raise(topic, partition)
        return node

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._net.close()
