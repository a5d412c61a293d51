"""Smoke test of ``rivven bench``: a short real run against a broker the tool starts itself.

Goal: the whole tool works end to end (the broker subprocess, spawned worker processes, the
merged histogram, the final loss/duplicate read, the JSON summary, the ``rivven bench``
wiring), and a peer side by side when redis-server is installed. Method: run the command as
a user would, with about two seconds of load, and check the JSON has the promised fields and
that nothing was lost or duplicated. No figure is asserted: the machine is shared and noisy.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rivven_broker.bench.servers import find_executable

pytestmark = pytest.mark.slow

_LATENCY_KEYS = {"p50", "p99", "p999", "max"}


def _bench(*argv: str) -> dict:
    command = [sys.executable, "-m", "rivven_broker.cli.rivven_main", "bench", *argv, "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    return json.loads(done.stdout)


def _check_line(figures: dict) -> None:
    assert figures["records_per_s"] > 0
    assert figures["mb_per_s"] > 0
    assert set(figures["latency_ms"]) == _LATENCY_KEYS
    assert figures["lost"] == 0 and figures["duplicated"] == 0 and figures["unknown"] == 0
    assert figures["acked_units"] > 0
    assert not figures["errors"], figures["errors"]


def test_produce_bench_with_a_peer_if_installed():
    peer = ["--peer", "redis"] if find_executable("redis-server") else []
    summary = _bench("produce", "--duration", "1.5", "--warmup", "0.3", "--producers", "2",
                     "--batch", "50", *peer)
    for key in ("records_per_s", "mb_per_s", "latency_ms", "lost", "duplicated"):
        assert key in summary
    _check_line(summary["rivven"])
    assert summary["latency_ms"]["p50"] > 0
    assert summary["rivven"]["broker_cpu_s_per_million"] is not None
    assert summary["rivven"]["load_cpu_s_per_million"] > 0  # the load processes' own CPU
    if peer:
        _check_line(summary["peer"])
        assert summary["peer"]["load_cpu_s_per_million"] > 0
        assert summary["ratio"] > 0 and len(summary["ratios"]) == 1


def test_topic_configs_reach_the_topics_the_bench_creates():
    """``--topic-config``: a bad value is the broker's refusal, not ignored."""
    command = [sys.executable, "-m", "rivven_broker.cli.rivven_main", "bench", "produce",
               "--duration", "0.5", "--warmup", "0", "--topic-config", "segment.bytes=1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode != 0
    assert "segment.bytes" in done.stderr + done.stdout, done.stderr[-3000:]
    summary = _bench("consume", "--duration", "0.5", "--warmup", "0", "--fill-records", "20000",
                     "--topic-config", "segment.bytes=65536")
    assert summary["options"]["topic_config"] == ["segment.bytes=65536"]
    _check_line(summary["rivven"])


def test_consume_bench_with_the_client_line():
    summary = _bench("consume", "--duration", "1", "--warmup", "0.2", "--fill-records", "20000",
                     "--client")
    assert summary["rivven"]["records_per_s"] > 0 and summary["rivven"]["wire_mb_per_s"] > 0
    assert summary["rivven"]["lost"] == 0 and summary["rivven"]["duplicated"] == 0
    assert summary["client"]["records_per_s"] > 0 and not summary["client"]["errors"]


def test_membership_bench_kills_and_detects():
    summary = _bench("membership", "--brokers", "3", "--rounds", "2")
    assert summary["brokers"] == 3 and summary["rounds"] == 2 and len(summary["all_s"]) == 2
    assert 0 < summary["detection_s"]["p50"] <= summary["detection_s"]["max"]


def test_controller_bench_commits_and_fails_over():
    summary = _bench("controller", "--commits", "20", "--proposers", "4", "--duration", "0.5",
                     "--rounds", "1")
    commits = summary["commits"]
    assert 0 < commits["commit_on_leader"]["p50_ms"] <= commits["commit_on_leader"]["max_ms"]
    assert commits["commit_via_follower"]["p50_ms"] > 0 and commits["commands_per_s"] > 0
    failover = summary["failover"]
    assert failover["rounds"] == 1
    assert 0 < failover["new_controller"]["p50_s"] <= failover["admin_call_succeeds"]["p50_s"]
    assert failover["restarted_broker_ready"]["p50_s"] > 0


def test_failover_bench_kills_a_leader_and_loses_nothing():
    summary = _bench("failover", "--rounds", "1", "--interval", "0.5")
    assert summary["rounds"] == 1 and summary["acked"] > 0
    assert 0 < summary["failover_s"]["p50"] <= summary["failover_s"]["max"]
    assert summary["lost"] == 0 and summary["duplicated"] == 0 and summary["leader_epochs_grew"]


def test_produce_bench_cluster_line():
    summary = _bench("produce", "--duration", "1", "--warmup", "0.5", "--cluster", "3")
    _check_line(summary["cluster"])
    assert summary["cluster_vs_single"] > 0
    assert summary["cluster"]["broker_cpu_s_per_million"] > 0  # the three brokers' CPU


def test_produce_bench_cluster_line_of_several_partitions():
    """Each connection sends to one partition at its leader (the single broker's line too),
    and the read-back reads each partition from its leader."""
    summary = _bench("produce", "--duration", "1", "--warmup", "0.5", "--cluster", "3",
                     "--partitions", "3", "--connections", "3", "--window", "2")
    _check_line(summary["cluster"])
    _check_line(summary["rivven"])
    assert len(summary["cluster"]["extra"]["leaders"]) == 3
    assert len(set(summary["rivven"]["extra"]["leaders"])) == 1
    assert summary["cluster"]["extra"]["verified_records"] > 0
