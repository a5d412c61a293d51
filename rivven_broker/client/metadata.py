"""Bootstrap addresses and the client's metadata cache (topics -> partitions -> leaders).

Theory of operation
-------------------
A client starts from a bootstrap list (``"host:port,host:port"``) and learns the cluster from
``Metadata`` answers: brokers (node id -> address) and, per topic, its partitions with their
leader. The cache keeps the topics the client has asked about (``wanted``) and refreshes them

- when something marked it stale (``request_update``: a ``NOT_LEADER``, an unknown topic, a
  lost connection, a leader it cannot find);
- when it is older than ``metadata_max_age_ms``;

but never more often than every ``refresh_backoff_ms``, so a broken cluster is not hammered.
``refresh_due(now_ms)`` is the one question both drivers ask before sending a Metadata request:
there are topics to ask for, the request is due, and no other is in flight (a driver calls
``on_refresh_started`` when it starts one; its answer or failure ends it).
``version`` grows with every accepted answer; drivers that wait for metadata wait for it to move.
A topic whose answer carried an error keeps that error (``topic_error``) so a waiting ``send``
can fail with it instead of waiting for its whole ``max_block_ms``.

Bootstrap failover: ``candidates()`` lists the addresses to try for "any broker", best first:
the brokers the last answer named, then the bootstrap list starting one further round robin
each time (``next_bootstrap``), so a dead bootstrap address is skipped on the next try.

Pure: ``now_ms`` is always an argument.
"""

from __future__ import annotations

from typing import Any, Iterable, NamedTuple

from rivven_broker.client.errors import error_for
from rivven_broker.protocol.errors import ErrorCode

__all__ = ["parse_bootstrap", "Address", "PartitionView", "TopicView", "MetadataCache"]

DEFAULT_PORT = 9092


class Address(NamedTuple):
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_bootstrap(bootstrap: str | Iterable[str]) -> tuple[Address, ...]:
    """Parse ``"h:p,h:p"`` (or a list of ``"h:p"``) into addresses. Never blocks.

    A missing port means 9092; IPv6 hosts are written ``[::1]:9092``.

    Raises:
        ValueError: empty list, bad port, or a malformed entry.
    """
    items = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
    addresses = []
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        if item.startswith("["):
            host, sep, rest = item[1:].partition("]")
            if not sep or (rest and not rest.startswith(":")):
                raise ValueError(f"malformed bootstrap address {item!r}")
            port_text = rest[1:] if rest else ""
        elif item.count(":") > 1:
            raise ValueError(f"write IPv6 bootstrap addresses as [host]:port, not {item!r}")
        else:
            host, _, port_text = item.partition(":")
        if not host:
            raise ValueError(f"bootstrap address {item!r} has no host")
        port = DEFAULT_PORT
        if port_text:
            if not port_text.isdigit() or not 0 < int(port_text) < 65536:
                raise ValueError(f"bad port in bootstrap address {item!r}")
            port = int(port_text)
        addresses.append(Address(host, port))
    if not addresses:
        raise ValueError("the bootstrap list is empty")
    return tuple(addresses)


class PartitionView(NamedTuple):
    partition: int
    leader: int | None  # None: no leader known
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    error_code: ErrorCode


class TopicView(NamedTuple):
    name: str
    error_code: ErrorCode
    is_internal: bool
    partitions: tuple[PartitionView, ...]  # indexed by partition number


class MetadataCache:
    """What the client knows of the cluster. Not thread-safe: drivers hold their own lock."""

    def __init__(
        self,
        bootstrap: tuple[Address, ...],
        *,
        metadata_max_age_ms: int = 300_000,
        refresh_backoff_ms: int = 100,
    ) -> None:
        assert bootstrap, "at least one bootstrap address"
        assert metadata_max_age_ms > 0 and refresh_backoff_ms >= 0
        self.bootstrap = bootstrap
        self.metadata_max_age_ms = metadata_max_age_ms
        self.refresh_backoff_ms = refresh_backoff_ms
        self.brokers: dict[int, Address] = {}
        self.topics: dict[str, TopicView] = {}
        #: Partition counts of healthy topics: what ``send`` reads on every record.
        self.partition_counts: dict[str, int] = {}
        self.wanted: set[str] = set()
        self.cluster_id: str | None = None
        self.controller_id: int | None = None
        self.version = 0
        self._bootstrap_index = -1
        self._stale = True
        self._refreshed_ms: int | None = None
        self._attempted_ms: int | None = None
        self.refresh_in_flight = False

    # --- what the client wants ----------------------------------------------------------
    def add_topics(self, topics: Iterable[str]) -> bool:
        """Track more topics; returns True (and marks the cache stale) if any is new."""
        new = set(topics) - self.wanted
        if new:
            self.wanted |= new
            self._stale = True
        return bool(new)

    def request_update(self) -> None:
        """Mark the cache stale: the next ``needs_update`` after the backoff says yes."""
        self._stale = True

    def needs_update(self, now_ms: int) -> bool:
        """Whether a Metadata request should be sent now."""
        return self.update_due_ms(now_ms) <= now_ms

    def update_due_ms(self, now_ms: int) -> int:
        """When the next Metadata request is due (``now_ms`` or earlier means now)."""
        earliest = now_ms
        if self._attempted_ms is not None:
            earliest = self._attempted_ms + self.refresh_backoff_ms
        if self._stale or self._refreshed_ms is None:
            return earliest
        return max(earliest, self._refreshed_ms + self.metadata_max_age_ms)

    def refresh_due(self, now_ms: int, *, force: bool = False) -> bool:
        """Whether a driver should start a Metadata request now: none is in flight and it is
        forced, or there are wanted topics and the request is due."""
        if self.refresh_in_flight:
            return False
        return force or (bool(self.wanted) and self.needs_update(now_ms))

    def on_refresh_started(self) -> None:
        """A driver started a refresh (it may still have to dial): no other until it ends."""
        self.refresh_in_flight = True

    def request_topics(self) -> tuple[str, ...]:
        """The topics to ask for (sorted for stable requests)."""
        return tuple(sorted(self.wanted))

    def on_request_sent(self, now_ms: int) -> None:
        self._attempted_ms = now_ms

    def on_failure(self, now_ms: int) -> None:
        """A Metadata request failed (connection lost or an error answer)."""
        self._attempted_ms = now_ms
        self._stale = True
        self.refresh_in_flight = False

    def candidates(self) -> list[Address]:
        """Addresses to try for "any broker", best first (see the module docstring)."""
        known = list(self.brokers.values())
        start = self.next_bootstrap()
        boot = list(self.bootstrap)
        index = boot.index(start)
        return known + [a for a in boot[index:] + boot[:index] if a not in known]

    def addresses(self) -> list[Address]:
        """Every address "any broker" may be: the known brokers and the bootstrap list."""
        known = list(self.brokers.values())
        return known + [a for a in self.bootstrap if a not in known]

    def next_bootstrap(self) -> Address:
        """The next bootstrap address, round robin."""
        self._bootstrap_index = (self._bootstrap_index + 1) % len(self.bootstrap)
        return self.bootstrap[self._bootstrap_index]

    # --- answers ------------------------------------------------------------------------
    def on_update(self, response: Any, now_ms: int) -> None:
        """Take a ``MetadataResponse``; topics missing from it keep their previous view."""
        self.brokers = {b.node_id: Address(b.host, b.port) for b in response.brokers}
        self.cluster_id = response.cluster_id
        controller = response.controller_id
        self.controller_id = controller if controller is not None and controller >= 0 else None
        stale = False
        for topic in response.topics:
            code = ErrorCode.from_wire(topic.error_code)
            partitions = tuple(
                PartitionView(
                    p.partition,
                    p.leader if p.leader is not None and p.leader >= 0 else None,
                    p.leader_epoch,
                    tuple(p.replicas),
                    tuple(p.isr),
                    ErrorCode.from_wire(p.error_code),
                )
                for p in sorted(topic.partitions, key=lambda p: p.partition)
            )
            if any(p.partition != i for i, p in enumerate(partitions)):
                code, partitions = ErrorCode.UNKNOWN_SERVER_ERROR, ()
            self.topics[topic.name] = TopicView(topic.name, code, topic.is_internal, partitions)
            if code == ErrorCode.NONE and partitions:
                self.partition_counts[topic.name] = len(partitions)
            else:
                self.partition_counts.pop(topic.name, None)
            if topic.name in self.wanted:
                if code != ErrorCode.NONE and not code.retriable:
                    self.wanted.discard(topic.name)  # e.g. a bad name: stop asking for it
                elif code.retriable or any(p.leader is None for p in partitions):
                    stale = True
        self.version += 1
        self._refreshed_ms = now_ms
        self._attempted_ms = now_ms
        self._stale = stale
        self.refresh_in_flight = False

    # --- queries ------------------------------------------------------------------------
    def partition_count(self, topic: str) -> int | None:
        """Partitions of a known, healthy topic; None while unknown or in error."""
        return self.partition_counts.get(topic)

    def topic_error(self, topic: str) -> ErrorCode | None:
        """The error the last answer gave for ``topic`` (None if fine or never asked)."""
        view = self.topics.get(topic)
        if view is None or view.error_code == ErrorCode.NONE:
            return None
        return view.error_code

    def leader_epoch_for(self, topic: str, partition: int) -> int:
        """The partition's leader epoch as last seen (-1: unknown)."""
        view = self.topics.get(topic)
        if view is None or not 0 <= partition < len(view.partitions):
            return -1
        return view.partitions[partition].leader_epoch

    def leader_for(self, topic: str, partition: int) -> int | None:
        """Node id leading the partition, if known and addressable."""
        view = self.topics.get(topic)
        if view is None or not 0 <= partition < len(view.partitions):
            return None
        leader = view.partitions[partition].leader
        if leader is None or leader not in self.brokers:
            return None
        return leader

    def address_of(self, node_id: int) -> Address | None:
        return self.brokers.get(node_id)

    def leader_or_raise(self, topic: str, partition: int) -> int:
        """The partition's leader after a fresh answer about ``topic``.

        Raises:
            BrokerError: the topic's error (unknown topic ...), or
                ``UnknownTopicOrPartitionError`` for a partition out of range or leaderless.
        """
        code = self.topic_error(topic)
        if code is not None:
            raise error_for(code, f"topic {topic!r}")
        node = self.leader_for(topic, partition)
        if node is None:
            raise error_for(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic}-{partition} has no known leader"
            )
        return node
