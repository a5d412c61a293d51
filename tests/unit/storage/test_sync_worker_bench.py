"""Smoke test of the storage benchmark: SyncWorker + PartitionLog on real files, end to end.

Method: run two tiny cases of ``run_storage_bench`` (an ``always`` append case with two
appenders sharing the worker, and a read case) for a fraction of a second in ``tmp_path`` and
check the counters add up and the temporary data is gone. No timing assertions.
"""

from __future__ import annotations

from pathlib import Path

from rivven_broker.bench.storage import (
    StorageCase,
    _seal_segments,
    build_pool,
    format_table,
    machine_description,
    run_storage_bench,
)
from rivven_broker.records.header import parse_header
from rivven_broker.storage.file_store import OsFileStore
from rivven_broker.storage.log_config import LogConfig
from rivven_broker.storage.partition_log import PartitionLog


def test_storage_bench_runs_and_cleans_up(tmp_path: Path) -> None:
    cases = [
        StorageCase("append", 100, 64 * 1024, "always", 2),
        StorageCase("append", 1024, 64 * 1024, "none", 1),
        StorageCase("read", 100, 64 * 1024),
    ]
    results = run_storage_bench(cases, 0.05, str(tmp_path), read_fill_bytes=1 << 20)
    always, none, read = results
    assert always.batches > 0 and always.fsyncs > 0 and always.groups > 0
    per_batch = parse_header(build_pool(100, 64 * 1024, 1)[0]).record_count
    assert per_batch > 500 and always.records == always.batches * per_batch
    assert always.bytes <= always.batches * 64 * 1024
    assert none.batches > 0 and none.fsyncs == 0
    assert read.bytes > 0 and read.records > 0
    assert list(tmp_path.iterdir()) == []
    assert "append 100B/64KiB sync=always x2" in format_table(results)
    assert machine_description(str(tmp_path))["cpus"]


def test_append_cases_can_start_on_a_long_lived_log(tmp_path: Path) -> None:
    """``--sealed-segments``: the log holds that many sealed segments, all durable, before the
    timing; its own segment size is back for the appends that are timed."""
    store = OsFileStore(str(tmp_path))
    store.makedirs("log")
    config = LogConfig()
    log, _ = PartitionLog.open(store, "log", config, 0)
    try:
        _seal_segments(log, 30)
        assert len(log.sealed_segment_bases()) == 30
        assert not log.dirty and log.config is config
        log.check_invariants()
    finally:
        log.close()
    case = StorageCase("append", 100, 64 * 1024, "always", 1, sealed_segments=5)
    (tmp_path / "bench").mkdir()
    [result] = run_storage_bench([case], 0.05, str(tmp_path / "bench"))
    assert result.batches > 0 and "sealed=5" in format_table([result])
