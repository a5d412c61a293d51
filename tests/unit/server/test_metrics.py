"""Broker metrics kept as plain integers are exported correctly at scrape time.

Method: record requests, latencies and byte counts on a fresh ``BrokerMetrics`` and read them
back through its Prometheus registry (``get_sample_value``), as a scrape would: counters by
label, cumulative histogram buckets (a latency equal to a bound counts in that bound's
bucket), sums in seconds, and separate brokers not sharing figures.
"""

from __future__ import annotations

from rivven_broker.server.metrics import BrokerMetrics


def test_requests_bytes_and_records_are_exported_at_scrape_time() -> None:
    metrics = BrokerMetrics(1)
    for _ in range(3):
        metrics.request_done("Produce", 0, 2)
    metrics.request_done("Produce", 6, 0)
    metrics.request_done("Metadata", 0, 1)
    metrics.bytes_in(100)
    metrics.bytes_in(23)
    metrics.bytes_out(7)
    metrics.records_in(500)
    value = metrics.registry.get_sample_value
    assert value("rivven_requests_total", {"api": "Produce", "error": "NONE"}) == 3
    assert value("rivven_requests_total", {"api": "Produce", "error": "NOT_LEADER"}) == 1
    assert value("rivven_requests_total", {"api": "Metadata", "error": "NONE"}) == 1
    assert value("rivven_network_received_bytes_total") == 123
    assert value("rivven_network_sent_bytes_total") == 7
    assert value("rivven_produced_records_total") == 500
    assert b'rivven_requests_total{api="Produce",error="NONE"} 3.0' in metrics.render()
    assert BrokerMetrics(2).registry.get_sample_value("rivven_produced_records_total") == 0
    metrics.topic_in("orders", 10, 900)
    metrics.topic_in("orders", 5, 400)
    metrics.topic_out("orders", 650)
    assert value("rivven_topic_produced_records_total", {"topic": "orders"}) == 15
    assert value("rivven_topic_produced_bytes_total", {"topic": "orders"}) == 1300
    assert value("rivven_topic_fetched_bytes_total", {"topic": "orders"}) == 650
    assert value("process_cpu_seconds_total") is None  # only a real broker process tracks it
    metrics.track_process()
    assert value("process_cpu_seconds_total") > 0 and value("python_gc_objects_collected_total",
                                                            {"generation": "0"}) is not None


def test_latency_histograms_are_cumulative_in_seconds() -> None:
    metrics = BrokerMetrics(1)
    for latency_ms in (0, 1, 1, 7, 40_000):
        metrics.request_done("Fetch", 0, latency_ms)
    metrics.request_done("Produce", 0, 3)

    def bucket(name: str, le: str) -> float | None:
        return metrics.registry.get_sample_value(f"{name}_bucket", {"le": le})

    fetch = "rivven_fetch_latency_seconds"
    assert bucket(fetch, "0.0005") == 1  # 0 ms
    assert bucket(fetch, "0.001") == 3  # 1 ms is at the bound: counted in it
    assert bucket(fetch, "0.005") == 3
    assert bucket(fetch, "0.01") == 4
    assert bucket(fetch, "30.0") == 4
    assert bucket(fetch, "+Inf") == 5
    assert metrics.registry.get_sample_value(f"{fetch}_count") == 5
    assert metrics.registry.get_sample_value(f"{fetch}_sum") == 40.009
    produce = "rivven_produce_latency_seconds"
    assert bucket(produce, "0.0025") == 0 and bucket(produce, "0.005") == 1
    assert metrics.registry.get_sample_value(f"{produce}_count") == 1


def test_group_commit_counters_are_read_from_the_sync_worker_when_scraped() -> None:
    from rivven_broker.storage.sync_worker import SyncWorkerStatistics

    metrics = BrokerMetrics(1)
    figures = {"groups": 0}

    def statistics() -> SyncWorkerStatistics:
        return SyncWorkerStatistics(
            policy="always", groups=figures["groups"], fsyncs=7, logs_synced=5, waits=9,
            waiters=2, dirty_logs=1, failed=False,
        )

    metrics.track_sync(statistics)
    value = metrics.registry.get_sample_value
    assert value("rivven_sync_groups_total") == 0
    figures["groups"] = 4  # read at scrape time, never stale
    assert value("rivven_sync_groups_total") == 4
    assert value("rivven_sync_fsyncs_total") == 7
    assert value("rivven_sync_logs_synced_total") == 5
    assert value("rivven_sync_waiters") == 2


def test_the_descriptor_cache_is_read_when_scraped() -> None:
    from rivven_broker.storage.handle_cache import BoundedHandles
    from rivven_broker.storage.memory_store import MemoryFileStore

    store = MemoryFileStore()
    store.makedirs("d")
    files = BoundedHandles(store, 4)
    metrics = BrokerMetrics(1)
    metrics.track_files(files.statistics)
    value = metrics.registry.get_sample_value
    handles = []
    for i in range(6):  # six written, none synced: the bound still holds
        handles.append(files.open(f"d/f{i}"))
        files.pwrite(handles[-1], b"x", 0)
    assert value("rivven_open_files") == 4
    assert value("rivven_open_files_evicted_unsynced_total") == 2
    assert value("rivven_open_files_reopened_total") == 0
    files.pread(handles[0], 1, 0)
    assert value("rivven_open_files_reopened_total") == 1
