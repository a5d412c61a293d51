"""``rivven bench cdc`` runs end to end in a tiny configuration (every phase, seconds each):
a Postgres 15 it starts, a broker, ``rivven-connect`` processes, a read_committed reader;
every committed row arrives exactly once in every phase and the figures are filled in.
Correctness only: no timing is asserted (figures live in docs/performance.md)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.integration.connect.test_crash_process import ROOT


def test_bench_cdc_runs_every_phase_exactly_once():
    done = subprocess.run(
        [sys.executable, "-m", "rivven_broker.bench", "cdc", "--sync", "none",
         "--duration", "1", "--warmup", "0.5", "--backlog-max", "2000", "--latency-duration", "1",
         "--latency-rate", "500", "--snapshot-rows", "2000", "--snapshot-chunk", "700",
         "--batch-size", "400", "--restart-rate", "200", "--kills", "1", "--down", "0.2",
         "--wal-duration", "1.5", "--json"],
        cwd=ROOT, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    result = json.loads(done.stdout)
    phases = result["phases"]
    assert set(phases) == {"stream", "latency", "snapshot", "restart", "wal"}
    assert result["failed"] == []
    parts = [phases["stream"], phases["latency"], phases["restart"], *phases["snapshot"]["sizes"]]
    for part in parts:
        assert part["lost"] == part["duplicated"] == part["unknown"] == 0, part
    assert phases["stream"]["events"] > 0 and phases["stream"]["events_per_s"] > 0
    assert 80 <= phases["stream"]["value_bytes_mean"] <= 1000
    assert phases["latency"]["measured"] > 0
    assert [size["rows"] for size in phases["snapshot"]["sizes"]] == [2000]
    assert all(size["connector_peak_rss_mb"] > 0 for size in phases["snapshot"]["sizes"])
    [restart] = phases["restart"]["rounds"]
    assert restart["back_s"] > 0
    assert phases["wal"]["wal_written_mb"] > 0 and phases["wal"]["noise_rows"] > 0
    assert set(result["goals"]) == {"stream_events_per_s", "latency_p50_ms", "latency_p99_ms",
                                    "snapshot_rows_per_s", "restart_back_s",
                                    "wal_retained_max_mb"}
