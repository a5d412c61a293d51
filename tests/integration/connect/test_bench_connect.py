"""``rivven bench connect`` runs end to end: a broker, the runtime, a read_committed reader;
records arrive routed over the destinations, once each, and the figures are filled in."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.integration.connect.test_crash_process import ROOT


def test_bench_connect_runs_and_checks_exactly_once():
    done = subprocess.run(
        [sys.executable, "-m", "rivven_broker.bench", "connect", "--duration", "1.5",
         "--warmup", "0.5", "--destinations", "3", "--sync", "none", "--json"],
        cwd=ROOT, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    result = json.loads(done.stdout)
    assert result["destinations"] == 3 and result["records_per_s"] > 0, result
    assert result["lost"] == result["duplicated"] == result["unknown"] == 0
    assert result["records_committed"] >= result["records_per_s"]
    assert 0 < result["latency_ms"]["p50"] <= result["latency_ms"]["p99"]
    assert 80 <= result["value_bytes_mean"] <= 120, result["value_bytes_mean"]
