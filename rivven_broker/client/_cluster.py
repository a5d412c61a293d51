"""Metadata refresh and broker selection for the blocking drivers' background threads.

Theory of operation
-------------------
``ClusterIO`` joins a ``NetworkClient`` (driven by one thread) and a ``MetadataCache`` (shared
with user threads under the driver's lock). The driver thread calls ``refresh_if_due`` each
loop; at most one Metadata request is in flight. "Any broker" means the connected candidate
with the fewest requests in flight, else the next one that may be dialled: known brokers
first, then the bootstrap list starting at a rotating index, so a dead bootstrap address is
skipped on the next try (bootstrap failover). ``ensure_node`` dials a partition leader when a
batch or fetch needs it.

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
        self.in_flight = False
        self._last_error: RivvenError | None = None

    def connect_error(self) -> RivvenError | None:
        return self._last_error

    def candidates(self) -> list[Address]:
        """Addresses to try for "any broker", best first (call under the lock)."""
        known = list(self.metadata.brokers.values())
        start = self.metadata.next_bootstrap()
        boot = list(self.metadata.bootstrap)
        index = boot.index(start)
        ordered = boot[index:] + boot[:index]
        return known + [a for a in ordered if a not in known]

    def any_address(self, now_ms: int) -> Address | None:
        """A connected or dialable broker (dials it), or None while all wait out a backoff."""
        with self.lock:
            candidates = self.candidates()
        address = self.net.least_loaded(candidates, now_ms)
        if address is None:
            return None
        if not self.net.is_connected(address) and not self.net.connect(address):
            self._last_error = self.net.last_error(address)
            return None
        return address

    def dial(self, address: Address) -> Address | None:
        """``address``, connected or being dialled now, or None (it waits out a backoff, or
        the dial failed at once)."""
        if not self.net.is_connected(address) and not self.net.connect(address):
            self._last_error = self.net.last_error(address)
            return None
        return address

    def node_retry_ms(self, node_id: int, now_ms: int) -> int | None:
        """When node ``node_id`` may be dialled again, if it waits out a backoff now."""
        with self.lock:
            address = self.metadata.address_of(node_id)
        if address is None or self.net.is_connected(address):
            return None
        retry_at = self.net.retry_at_ms(address)
        return retry_at if retry_at > now_ms else None

    def ensure_node(self, node_id: int, now_ms: int) -> bool:
        """Whether the leader ``node_id`` can take a request now (dialling it if allowed)."""
        with self.lock:
            address = self.metadata.address_of(node_id)
        if address is None:
            return False
        if self.net.is_connected(address):
            return self.net.is_ready(address)
        if not self.net.can_connect(address, now_ms):
            return False
        if not self.net.connect(address):
            self._last_error = self.net.last_error(address)
            with self.lock:
                self.metadata.request_update()
            return False
        return self.net.is_ready(address)

    def refresh_if_due(self, now_ms: int, force: bool = False) -> None:
        """Send a Metadata request when due (or ``force``) and none is in flight."""
        if self.in_flight:
            return
        with self.lock:
            due = force or (bool(self.metadata.wanted) and self.metadata.needs_update(now_ms))
        if not due:
            return
        address = self.any_address(now_ms)
        if address is None:
            with self.lock:
                self.metadata.on_failure(now_ms)
                self.lock.notify_all()
            return
        with self.lock:
            topics = self.metadata.request_topics()
            self.metadata.on_request_sent(now_ms)
        self.in_flight = True
        request = metadata_request(topics, self.allow_auto_topic_creation)
        self.net.send(address, request, self._on_metadata)

    def _on_metadata(self, response: Any, error: RivvenError | None) -> None:
        self.in_flight = False
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
