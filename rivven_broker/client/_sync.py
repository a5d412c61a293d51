"""Raw request/response calls for blocking callers: a ``Cluster`` through a portal.

Theory of operation
-------------------
``SyncClient`` hosts one ``Cluster`` (``_aio_net.py``: connections, metadata, and ``call``,
whose retries are the core's ``CallRetry``) on a ``LoopThread``; ``call``, ``fetch_metadata``
and ``leader_for`` run it there and block the caller until the answer. For callers that move
record batches as bytes themselves (the Spark executors) and the CLI. Thread-safe (the portal
serialises nothing: concurrent calls run concurrently on the loop).
"""

from __future__ import annotations

import functools
from typing import Any

from rivven_broker.client._aio_net import open_cluster
from rivven_broker.client._loop_thread import start_loop_thread
from rivven_broker.client.config import ConnectionConfig
from rivven_broker.client.errors import ClosedError
from rivven_broker.client.metadata import MetadataCache

__all__ = ["SyncClient"]


class SyncClient:
    """Blocking request/response over a private ``Cluster``."""

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
        self._loop = start_loop_thread("rivven-sync")
        try:
            self._cluster = self._loop.host(
                open_cluster, bootstrap, config, bridge=self._loop.bridge,
                connect_attempts_max=connect_attempts_max,
                allow_auto_topic_creation=allow_auto_topic_creation)
        except BaseException:
            self._loop.close()
            raise
        self._closed = False

    @property
    def metadata(self) -> MetadataCache:
        """The metadata cache (read it, or ``request_update``; under ``lock`` to change it)."""
        return self._cluster.metadata

    @property
    def lock(self) -> Any:
        return self._cluster.bridge.lock

    def call(self, request: Any, *, node_id: int | None = None,
             timeout_ms: int | None = None) -> Any:
        """Send ``request`` (to ``node_id`` or any broker) and return the answer.

        Raises:
            ConnectionFailedError (also at once, retriably, for a ``node_id`` the metadata
            does not list), ClientTimeoutError, BrokerError for an ErrorResponse, ClosedError.
        """
        return self._run(self._cluster.call, request, node_id=node_id, timeout_ms=timeout_ms)

    def fetch_metadata(self, topics: list[str] | None, *, timeout_ms: int | None = None) -> Any:
        """A Metadata answer for ``topics`` (None: all); also refreshes the cache."""
        return self._run(self._cluster.fetch_metadata, topics, timeout_ms=timeout_ms)

    def leader_for(self, topic: str, partition: int, *, timeout_ms: int | None = None) -> int:
        """The leader node of a partition (refreshing metadata if needed).

        Raises:
            BrokerError: the topic's error (unknown topic ...), or
                ``UnknownTopicOrPartitionError`` for a partition out of range / leaderless.
        """
        return self._run(self._cluster.leader_for, topic, partition, timeout_ms=timeout_ms)

    def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self._closed:
            raise ClosedError("the client is closed")
        return self._loop.call(functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._loop.close()
