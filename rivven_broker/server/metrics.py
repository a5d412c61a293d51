"""Broker metrics: one Prometheus registry per broker, updated per request, never per record.

Theory of operation
-------------------
Each ``Broker`` owns a ``BrokerMetrics`` with its own ``CollectorRegistry`` (never the global
one: several brokers live in one process in tests and in the simulator, and each must report
only itself). The request path calls ``request_done(api, error_code, latency_ms)`` once per
request and ``bytes_in``/``bytes_out`` once per socket read or write. Those hot figures are
plain integers (a dict add, a list index: no prometheus lock per request; the broker is one
trio thread) and a custom collector turns them into counter and histogram families when
``/metrics`` is scraped. Per-partition figures
(log start and end offset, high watermark, size) are not pushed at all: a custom collector
asks the broker for a snapshot when ``/metrics`` is scraped, so an idle partition costs
nothing and the numbers are never stale. The group commit's counters (groups, fsyncs, logs
synced, waiters) are read from the sync worker's ``statistics()`` the same way.

Latencies are given in milliseconds (from ``env.clock``) and exported in seconds, Prometheus'
base unit.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, NamedTuple

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.storage.handle_cache import HandleStatistics
from rivven_broker.storage.sync_worker import SyncWorkerStatistics

if TYPE_CHECKING:
    from rivven_broker.server.produce_lane import LaneStatistics

__all__ = ["BrokerMetrics", "PartitionSnapshot", "CONTENT_TYPE"]

#: The Content-Type of ``/metrics`` (Prometheus text exposition format 0.0.4).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)
_LATENCY_BUCKETS_MS = tuple(bound * 1000 for bound in _LATENCY_BUCKETS_S)


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


class _LatencyHistogram:
    """Bucket counts of latencies in ms; the last bucket is +Inf. Not thread-safe (one thread)."""

    __slots__ = ("counts", "sum_ms")

    def __init__(self) -> None:
        self.counts = [0] * (len(_LATENCY_BUCKETS_MS) + 1)
        self.sum_ms = 0

    def observe(self, latency_ms: int) -> None:
        self.counts[bisect_left(_LATENCY_BUCKETS_MS, latency_ms)] += 1
        self.sum_ms += latency_ms

    def family(self, name: str, documentation: str) -> HistogramMetricFamily:
        buckets = []
        total = 0
        for bound_s, count in zip((*map(str, _LATENCY_BUCKETS_S), "+Inf"), self.counts):
            total += count
            buckets.append((bound_s, float(total)))
        return HistogramMetricFamily(name, documentation, buckets=buckets,
                                     sum_value=self.sum_ms / 1000)


def _error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)


class _HotCollector(Collector):
    """Exports the per-request figures a ``BrokerMetrics`` keeps as plain integers."""

    def __init__(self, metrics: BrokerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
        metrics = self._metrics
        requests = CounterMetricFamily(
            "rivven_requests", "Requests answered, by api and error (its name, NONE for none).",
            labels=["api", "error"],
        )
        for (api, error_code), count in sorted(metrics.request_counts.items()):
            requests.add_metric([api, _error_name(error_code)], float(count))
        yield requests
        by_topic = [
            ("rivven_topic_produced_records", "Records appended by produce requests, by topic.",
             metrics.topic_records_in),
            ("rivven_topic_produced_bytes", "Record batch bytes appended by produce requests, "
             "by topic.", metrics.topic_bytes_in),
            ("rivven_topic_fetched_bytes", "Record batch bytes answered to client fetch "
             "requests, by topic.", metrics.topic_bytes_out),
        ]
        for name, documentation, counts in by_topic:
            family = CounterMetricFamily(name, documentation, labels=["topic"])
            for topic, count in sorted(counts.items()):
                family.add_metric([topic], float(count))
            yield family
        yield CounterMetricFamily("rivven_network_received_bytes", "Bytes received from clients.",
                                  value=float(metrics.bytes_in_total))
        yield CounterMetricFamily("rivven_network_sent_bytes", "Bytes sent to clients.",
                                  value=float(metrics.bytes_out_total))
        yield CounterMetricFamily(
            "rivven_produced_records", "Records appended by produce requests.",
            value=float(metrics.records_in_total),
        )
        yield metrics.produce_latency.family(
            "rivven_produce_latency_seconds",
            "Time from receiving a produce request to its answer being ready.",
        )
        yield metrics.fetch_latency.family(
            "rivven_fetch_latency_seconds",
            "Time from receiving a fetch request to its answer being ready (long polls included).",
        )


class _SyncCollector(Collector):
    """The sync worker's group-commit counters, read when scraped (``statistics`` never blocks)."""

    def __init__(self, statistics: Callable[[], SyncWorkerStatistics]) -> None:
        self._statistics = statistics

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        stats = self._statistics()
        yield CounterMetricFamily(
            "rivven_sync_groups", "Group commits completed (one fsync round each).",
            value=stats.groups,
        )
        yield CounterMetricFamily(
            "rivven_sync_fsyncs", "fsync calls made by group commits (one per file per group).",
            value=stats.fsyncs,
        )
        yield CounterMetricFamily(
            "rivven_sync_logs_synced", "Partition logs made durable (a group covers one or more).",
            value=stats.logs_synced,
        )
        yield GaugeMetricFamily(
            "rivven_sync_waiters", "Requests waiting for a group commit right now.",
            value=stats.waiters,
        )


class _LaneCollector(Collector):
    """The produce lane's counters (``produce_lane.py``), read when scraped."""

    def __init__(self, statistics: Callable[[], LaneStatistics]) -> None:
        self._statistics = statistics

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        stats = self._statistics()
        yield CounterMetricFamily(
            "rivven_produce_lane_passes", "Passes of the produce lane that read or answered.",
            value=stats.passes)
        yield CounterMetricFamily(
            "rivven_produce_lane_requests", "Produce requests the lane took (read and appended).",
            value=stats.requests)
        yield CounterMetricFamily(
            "rivven_produce_lane_handbacks",
            "Connections the lane gave back to their own task (another api, a partial frame, "
            "the in-flight limit, the end of the stream).", value=stats.handbacks)
        yield GaugeMetricFamily(
            "rivven_produce_lane_connections", "Connections the lane watches now.",
            value=stats.connections)


class _FilesCollector(Collector):
    """The segment-file descriptor cache's counts, read when scraped (never blocks)."""

    def __init__(self, statistics: Callable[[], HandleStatistics]) -> None:
        self._statistics = statistics

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        stats = self._statistics()
        yield GaugeMetricFamily(
            "rivven_open_files", "Segment and index files open now (open_files_max bounds them).",
            value=stats.open_now,
        )
        yield CounterMetricFamily(
            "rivven_open_files_reopened", "Files opened again after the cache had closed them.",
            value=stats.reopened,
        )
        yield CounterMetricFamily(
            "rivven_open_files_evicted_unsynced",
            "Files the cache closed before their fsync (written faster than they are synced).",
            value=stats.evicted_unsynced,
        )


class _ReadGauge:
    """One gauge read at scrape time."""

    def __init__(self, name: str, documentation: str, read: Callable[[], float]) -> None:
        self._name, self._documentation, self._read = name, documentation, read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(self._name, self._documentation, value=self._read())


class BrokerMetrics:
    """The metrics of one broker. Methods never block and never raise."""

    def __init__(self, node_id: int) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self.request_counts: dict[tuple[str, int], int] = {}
        self.bytes_in_total = 0
        self.bytes_out_total = 0
        self.records_in_total = 0
        #: topic -> records and batch bytes appended by produce, batch bytes fetched
        self.topic_records_in: dict[str, int] = {}
        self.topic_bytes_in: dict[str, int] = {}
        self.topic_bytes_out: dict[str, int] = {}
        self.produce_latency = _LatencyHistogram()
        self.fetch_latency = _LatencyHistogram()
        registry.register(_HotCollector(self))
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
        self._request_timeouts = Counter(
            "rivven_connections_request_timed_out",
            "Connections closed because a frame (client) or request head (HTTP) was not "
            "complete within request_timeout_ms of its first byte.",
            ["listener"],
            registry=registry,
        )
        self._request_budget_waits = Counter(
            "rivven_request_budget_waits",
            "Times a connection stopped reading because queued_request_bytes_max was spent.",
            registry=registry,
        )
        self._accept_failures = Counter(
            "rivven_accept_failures",
            "Connections the listener could not accept (out of file descriptors or buffers); "
            "it backs off and retries.",
            ["listener", "reason"],
            registry=registry,
        )
        self._corrupt_batches = Counter(
            "rivven_corrupt_batches",
            "Damaged stored batches found (a fetch answered CORRUPT_MESSAGE, or the scrubber).",
            ["topic", "partition", "source"],
            registry=registry,
        )
        self._http_connections_rejected = Counter(
            "rivven_http_connections_rejected",
            "HTTP connections closed at once because http_connections_max was reached.",
            registry=registry,
        )
        info = Gauge("rivven_broker_info", "Constant 1, labelled with the node id.", ["node_id"],
                     registry=registry)
        info.labels(str(node_id)).set(1)
        self.connections_open = 0

    def track_partitions(self, snapshot: Callable[[], Iterable[PartitionSnapshot]]) -> None:
        """Export per-partition gauges read from ``snapshot()`` at every scrape."""
        self.registry.register(_PartitionCollector(snapshot))

    def track_files(self, statistics: Callable[[], HandleStatistics]) -> None:
        """Export the descriptor cache's counts read from ``statistics()`` at every scrape."""
        self.registry.register(_FilesCollector(statistics))

    def track_sync(self, statistics: Callable[[], SyncWorkerStatistics]) -> None:
        """Export the group commit's counters read from ``statistics()`` at every scrape."""
        self.registry.register(_SyncCollector(statistics))

    def track_lane(self, statistics: Callable[[], LaneStatistics]) -> None:
        """Export the produce lane's counters read from ``statistics()`` at every scrape."""
        self.registry.register(_LaneCollector(statistics))

    def request_done(self, api: str, error_code: int, latency_ms: int) -> None:
        """Count one answered request; record its latency for produce and fetch."""
        key = (api, error_code)
        counts = self.request_counts
        counts[key] = counts.get(key, 0) + 1
        if api == "Produce":
            self.produce_latency.observe(latency_ms)
        elif api == "Fetch":
            self.fetch_latency.observe(latency_ms)

    def records_in(self, count: int) -> None:
        self.records_in_total += count

    def topic_in(self, topic: str, records: int, size: int) -> None:
        """A produce appended ``records`` in ``size`` batch bytes to ``topic``."""
        self.topic_records_in[topic] = self.topic_records_in.get(topic, 0) + records
        self.topic_bytes_in[topic] = self.topic_bytes_in.get(topic, 0) + size

    def topic_out(self, topic: str, size: int) -> None:
        """A fetch answered ``size`` batch bytes of ``topic``."""
        self.topic_bytes_out[topic] = self.topic_bytes_out.get(topic, 0) + size

    def track_process(self) -> None:
        """Export the process's CPU, memory, open files and the Python collector's figures
        (prometheus_client's process, platform and GC collectors). For a real broker
        process only: the GC collector hooks the interpreter, and a simulator runs many
        brokers in one process."""
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)

    def bytes_in(self, count: int) -> None:
        self.bytes_in_total += count

    def bytes_out(self, count: int) -> None:
        self.bytes_out_total += count

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

    def connection_request_timed_out(self, listener: str = "clients") -> None:
        self._request_timeouts.labels(listener).inc()

    def request_budget_waited(self) -> None:
        self._request_budget_waits.inc()

    def accept_failed(self, listener: str, reason: str) -> None:
        self._accept_failures.labels(listener, reason).inc()

    def http_connection_rejected(self) -> None:
        self._http_connections_rejected.inc()

    def corrupt_batch(self, topic: str, partition: int, source: str) -> None:
        """A damaged stored batch was found by a fetch or by the scrubber."""
        self._corrupt_batches.labels(topic, str(partition), source).inc()

    def track_gauge(self, name: str, documentation: str, read: Callable[[], float]) -> None:
        """Export a gauge whose value is ``read()`` at every scrape."""
        self.registry.register(_ReadGauge(name, documentation, read))

    def render(self) -> bytes:
        """The Prometheus text exposition of this broker's registry."""
        return generate_latest(self.registry)
