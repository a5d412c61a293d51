"""Broker metrics: one Prometheus registry per broker, updated per request, never per record.

Theory of operation
-------------------
Each ``Broker`` owns a ``BrokerMetrics`` with its own ``CollectorRegistry`` (never the global
one: several brokers live in one process in tests and in the simulator, and each must report
only itself). The request path calls ``request_done(api, error_code, latency_ms)`` once per
request and ``bytes_in``/``bytes_out`` once per socket read or write; labelled children are
cached in dicts so the hot path is one dict lookup and one locked add. Per-partition figures
(log start and end offset, high watermark, size) are not pushed at all: a custom collector
asks the broker for a snapshot when ``/metrics`` is scraped, so an idle partition costs
nothing and the numbers are never stale.

Latencies are given in milliseconds (from ``env.clock``) and exported in seconds, Prometheus'
base unit.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["BrokerMetrics", "PartitionSnapshot", "CONTENT_TYPE"]

#: The Content-Type of ``/metrics`` (Prometheus text exposition format 0.0.4).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)


class PartitionSnapshot(NamedTuple):
    """The figures of one partition at scrape time."""

    topic: str
    partition: int
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    size_bytes: int


class _PartitionCollector(Collector):
    """Reads the logs when scraped (``snapshot`` is a broker method; it does not block)."""

    def __init__(self, snapshot: Callable[[], Iterable[PartitionSnapshot]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["topic", "partition"]
        families = {
            "log_start_offset": GaugeMetricFamily(
                "rivven_log_start_offset", "First offset kept in the partition.", labels=labels
            ),
            "log_end_offset": GaugeMetricFamily(
                "rivven_log_end_offset", "Next offset the partition will assign.", labels=labels
            ),
            "high_watermark": GaugeMetricFamily(
                "rivven_high_watermark", "Offsets below this are visible to consumers.",
                labels=labels,
            ),
            "size_bytes": GaugeMetricFamily(
                "rivven_log_size_bytes", "Bytes of the partition's segments.", labels=labels
            ),
        }
        for row in self._snapshot():
            values = [row.topic, str(row.partition)]
            for name, family in families.items():
                family.add_metric(values, getattr(row, name))
        yield from families.values()


class BrokerMetrics:
    """The metrics of one broker. Methods never block and never raise."""

    def __init__(self, node_id: int) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self._requests = Counter(
            "rivven_requests", "Requests answered, by api and error code.",
            ["api", "error_code"], registry=registry,
        )
        self._bytes_in = Counter(
            "rivven_network_received_bytes", "Bytes received from clients.", registry=registry
        )
        self._bytes_out = Counter(
            "rivven_network_sent_bytes", "Bytes sent to clients.", registry=registry
        )
        self._records_in = Counter(
            "rivven_produced_records", "Records appended by produce requests.", registry=registry
        )
        self._produce_latency = Histogram(
            "rivven_produce_latency_seconds",
            "Time from receiving a produce request to its answer being ready.",
            buckets=_LATENCY_BUCKETS_S, registry=registry,
        )
        self._fetch_latency = Histogram(
            "rivven_fetch_latency_seconds",
            "Time from receiving a fetch request to its answer being ready (long polls included).",
            buckets=_LATENCY_BUCKETS_S, registry=registry,
        )
        self._connections = Gauge(
            "rivven_connections", "Client connections open now.", registry=registry
        )
        self._connections_accepted = Counter(
            "rivven_connections_accepted", "Client connections accepted.", registry=registry
        )
        self._connections_rejected = Counter(
            "rivven_connections_rejected",
            "Client connections closed at once because connections_max was reached.",
            registry=registry,
        )
        self._connections_idle_closed = Counter(
            "rivven_connections_idle_closed",
            "Client connections closed after idle_timeout_ms without a whole request.",
            registry=registry,
        )
        info = Gauge("rivven_broker_info", "Constant 1, labelled with the node id.", ["node_id"],
                     registry=registry)
        info.labels(str(node_id)).set(1)
        self._request_children: dict[tuple[str, int], Counter] = {}
        self.connections_open = 0

    def track_partitions(self, snapshot: Callable[[], Iterable[PartitionSnapshot]]) -> None:
        """Export per-partition gauges read from ``snapshot()`` at every scrape."""
        self.registry.register(_PartitionCollector(snapshot))

    def request_done(self, api: str, error_code: int, latency_ms: int) -> None:
        """Count one answered request; record its latency for produce and fetch."""
        key = (api, error_code)
        child = self._request_children.get(key)
        if child is None:
            child = self._requests.labels(api, str(error_code))
            self._request_children[key] = child
        child.inc()
        if api == "Produce":
            self._produce_latency.observe(latency_ms / 1000)
        elif api == "Fetch":
            self._fetch_latency.observe(latency_ms / 1000)

    def records_in(self, count: int) -> None:
        self._records_in.inc(count)

    def bytes_in(self, count: int) -> None:
        self._bytes_in.inc(count)

    def bytes_out(self, count: int) -> None:
        self._bytes_out.inc(count)

    def connection_opened(self) -> None:
        self.connections_open += 1
        self._connections.set(self.connections_open)
        self._connections_accepted.inc()

    def connection_closed(self) -> None:
        self.connections_open -= 1
        assert self.connections_open >= 0
        self._connections.set(self.connections_open)

    def connection_rejected(self) -> None:
        self._connections_rejected.inc()

    def connection_idle_closed(self) -> None:
        self._connections_idle_closed.inc()

    def render(self) -> bytes:
        """The Prometheus text exposition of this broker's registry."""
        return generate_latest(self.registry)
