"""Metadata refresh and broker selection for the blocking drivers' background threads.

Theory of operation
-------------------
``ClusterIO`` joins a ``NetworkClient`` (driven by one thread) and a ``MetadataCache`` (shared
with user threads under the driver's lock). The driver thread calls ``refresh_if_due`` each
loop; the cache decides whether a Metadata request is due (``refresh_due``: at most one in
flight). "Any broker" means the connected candidate with the fewest requests in flight, else
the next one that may be dialled, in the cache's order (``candidates``: known brokers first,
then the bootstrap list round robin, so a dead bootstrap address is skipped on the next try).
``ensure_node`` dials a partition leader when a batch or fetch needs it; ``dial_waiting``
dials the leaders a core's step named, and says when to step again for those still in their
reconnect backoff.

``connect_error()`` is the most recent connection failure, so a caller that waited for
metadata in vain can say *why* (nothing listening at ...).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from rivven_broker.client.errors import RivvenError
from rivven_broker.client.metadata import Address, MetadataCache
from rivven_broker.client.requests import metadata_request
from rivven_broker.client._network import NetworkClient, monotonic_ms
from rivven_broker.protocol import messages as m

__all__ = ["ClusterIO"]


class ClusterIO:
    """Metadata over a ``NetworkClient``; called only from the driver thread."""

    def __init__(
        self,
        net: NetworkClient,
        metadata: MetadataCache,
        lock: threading.Condition,
        *,
        allow_auto_topic_creation: bool,
        on_update: Callable[[], None] | None = None,
    ) -> None:
        self.net = net
        self.metadata = metadata
        self.lock = lock
        self.allow_auto_topic_creation = allow_auto_topic_creation
        self.on_update = on_update
        self._last_error: RivvenError | None = None

    def connect_error(self) -> RivvenError | None:
        return self._last_error

    def any_address(self, now_ms: int) -> Address | None:
        """A connected or dialable broker (dials it), or None while all wait out a backoff."""
        with self.lock:
            candidates = self.metadata.candidates()
        address = self.net.least_loaded(candidates, now_ms)
        if address is None:
            return None
        return self.dial(address)

    def dial(self, address: Address) -> Address | None:
        """``address``, connected or being dialled now, or None (it waits out a backoff, or
        the dial failed at once)."""
        if not self.net.is_connected(address) and not self.net.connect(address):
            self._last_error = self.net.backoff.error_of(address)
            return None
        return address

    def ensure_node(self, node_id: int, now_ms: int) -> bool:
        """Whether the leader ``node_id`` can take a request now (dialling it if allowed)."""
        with self.lock:
            address = self.metadata.address_of(node_id)
        if address is None:
            return False
        if self.net.is_connected(address):
            return self.net.is_ready(address)
        if not self.net.backoff.can_dial(address, now_ms):
            return False
        if not self.net.connect(address):
            self._last_error = self.net.backoff.error_of(address)
            with self.lock:
                self.metadata.request_update()
            return False
        return self.net.is_ready(address)

    def dial_waiting(self, nodes: list[int], now_ms: int) -> tuple[bool, int | None]:
        """Dial the leaders a step named (those out of their backoff). Returns whether one
        is ready now, and the earliest end of a backoff among the others (None: none)."""
        ready, wake_at = False, None
        for node_id in nodes:
            if self.ensure_node(node_id, now_ms):
                ready = True
                continue
            with self.lock:
                address = self.metadata.address_of(node_id)
            if address is None or self.net.is_connected(address):
                continue
            retry_at = self.net.backoff.retry_at_ms(address)
            if retry_at > now_ms:
                wake_at = retry_at if wake_at is None else min(wake_at, retry_at)
        return ready, wake_at

    def refresh_if_due(self, now_ms: int, force: bool = False) -> None:
        """Send a Metadata request when the cache says one is due (or ``force``)."""
        with self.lock:
            if not self.metadata.refresh_due(now_ms, force=force):
                return
            self.metadata.on_refresh_started()
        address = self.any_address(now_ms)
        if address is None:
            with self.lock:
                self.metadata.on_failure(now_ms)
                self.lock.notify_all()
            return
        with self.lock:
            topics = self.metadata.request_topics()
            self.metadata.on_request_sent(now_ms)
        request = metadata_request(topics, self.allow_auto_topic_creation)
        self.net.send(address, request, self._on_metadata)

    def _on_metadata(self, response: Any, error: RivvenError | None) -> None:
        now_ms = monotonic_ms()
        with self.lock:
            if error is None and isinstance(response, m.MetadataResponse):
                self.metadata.on_update(response, now_ms)
            else:
                if error is not None:
                    self._last_error = error
                self.metadata.on_failure(now_ms)
            self.lock.notify_all()
        if self.on_update is not None:
            self.on_update()
