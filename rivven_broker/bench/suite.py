"""The standard suite behind ``make bench``: the issue's targets, measured and written down.

Theory of operation
-------------------
``CASES`` lists the workloads of the performance targets (docs/performance.md), each a
``BenchOptions`` plus the target it is judged against. ``run_suite`` runs them in order with
``runner.run_bench`` (Rivven and its peer alternating round by round), then the latency case
at half of the peak the first case measured (open loop, latency from the intended send time).
Every summary goes to a JSON file; ``docs.rewrite_document`` then replaces the tables between
the ``<!-- bench:NAME -->`` markers of docs/performance.md, leaving the rest of the document
(the storage section, the analysis) as it is.

``--quick`` shrinks durations and fills (for a smoke run); ``--only`` runs the cases whose
name contains a string (the document is then not rewritten unless ``--doc`` is given).
Blocks for about ten minutes at full length.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import attrs

from rivven_broker.bench import docs, report, runner, storage
from rivven_broker.bench.options import BenchOptions
from rivven_broker.bench.servers import server_versions
from rivven_broker.bench.stats import Latency

__all__ = [
    "HELP",
    "SuiteCase",
    "CASES",
    "run_suite",
    "add_arguments",
    "main",
    "environment",
    "fsync_probe",
]

HELP = "the standard suite (make bench): the targets of docs/performance.md, with peers"
_KIB = 1024


@attrs.frozen
class SuiteCase:
    """One workload of the suite and the check of its target."""

    name: str
    title: str
    options: BenchOptions
    target: str  # the target in words
    check: Callable[[dict[str, Any]], bool]


def _produce(**fields: Any) -> BenchOptions:
    base = dict(mode="produce", producers=4, batch=100, window=8, duration_s=5.0, warmup_s=1.0,
                rounds=2, sync="always")
    base.update(fields)
    return BenchOptions(**base)


def _ratio_at_least(value: float) -> Callable[[dict[str, Any]], bool]:
    return lambda s: (s.get("ratio") or 0) >= value


CASES: list[SuiteCase] = [
    SuiteCase(
        "produce-100B-redis", "produce 100 B, batches of 100, 4 producers",
        _produce(record_bytes=100, peer="redis", client_line=True),
        ">= 1,000,000 records/s and >= 3x Redis appendfsync always",
        lambda s: s["records_per_s"] >= 1_000_000 and (s.get("ratio") or 0) >= 3,
    ),
    SuiteCase(
        "produce-100B-b1000-redis", "produce 100 B, batches of 1000 (100 KB), 4 producers",
        _produce(record_bytes=100, batch=1000, peer="redis"),
        "(reported: what bigger batches buy; the client's default batch is 1 MiB)",
        lambda s: s["lost"] == 0 and s["duplicated"] == 0,
    ),
    SuiteCase(
        "produce-1KiB-redis", "produce 1 KiB, batches of 64, 4 producers",
        _produce(record_bytes=_KIB, batch=64, peer="redis"),
        ">= 250 MB/s",
        lambda s: s["mb_per_s"] >= 250,
    ),
    SuiteCase(
        "produce-100B-nats-always", "produce 100 B, batches of 100, 4 producers",
        _produce(record_bytes=100, peer="nats", duration_s=3.0),
        ">= 100x NATS JetStream sync always",
        _ratio_at_least(100),
    ),
    SuiteCase(
        "produce-100B-nats-default", "produce 100 B, batches of 100, 4 producers",
        _produce(record_bytes=100, peer="nats", peer_sync="default"),
        ">= 2x NATS JetStream with its defaults (no fsync)",
        _ratio_at_least(2),
    ),
    SuiteCase(
        "unbatched-16", "16 producers, one record per request, one request in flight",
        _produce(record_bytes=100, batch=1, window=1, producers=4, connections=4, peer="redis"),
        ">= 1x Redis appendfsync always at the same concurrency",
        _ratio_at_least(1),
    ),
    SuiteCase(
        "consume-100B", "consume 100 B records (batches of 100), 1 consumer",
        BenchOptions(mode="consume", record_bytes=100, batch=100, duration_s=5.0, warmup_s=0.5,
                     rounds=1, peer="redis", client_line=True),
        ">= 1,000,000 records/s into one Python consumer (client line)",
        lambda s: s.get("client", {}).get("records_per_s", 0) >= 1_000_000,
    ),
    SuiteCase(
        "consume-1KiB", "consume 1 KiB records (batches of 64), 1 consumer",
        BenchOptions(mode="consume", record_bytes=_KIB, batch=64, duration_s=5.0, warmup_s=0.5,
                     rounds=1, peer="nats", peer_sync="default"),
        ">= 800 MB/s broker side (whole batches on the wire)",
        lambda s: s["rivven"]["wire_mb_per_s"] >= 800,
    ),
    SuiteCase(
        "e2e-100B", "end to end 100 B, batches of 100, 2 producers at 200,000 records/s",
        BenchOptions(mode="e2e", record_bytes=100, batch=100, producers=2, rate=200_000,
                     duration_s=5.0, warmup_s=1.0, rounds=1),
        "(reported: produce-to-consume latency)",
        lambda s: s["lost"] == 0 and s["duplicated"] == 0,
    ),
]
LATENCY_CASE = SuiteCase(
    "latency-half-peak", "produce 100 B at half of the peak (slower round) of produce-100B-redis",
    _produce(record_bytes=100, rounds=1),
    "ack latency p50 <= 1 ms and p99 <= 5 ms",
    lambda s: s["latency_ms"]["p50"] <= 1.0 and s["latency_ms"]["p99"] <= 5.0,
)


def _quick(options: BenchOptions) -> BenchOptions:
    fill = 200_000 if options.record_bytes < 1000 else 50_000
    return attrs.evolve(options, duration_s=1.0, warmup_s=0.3, rounds=1,
                        fill_records=fill if options.mode == "consume" else 0)


def fsync_probe(directory: str, seconds: float = 1.0, write_bytes: int = 4096) -> dict[str, float]:
    """The machine's flush latency: ``pwrite`` + ``fdatasync`` of ``write_bytes`` in a loop for
    ``seconds`` in a temporary file under ``directory``; p50/p99 in ms and syncs/s. Blocks."""
    latency = Latency()
    fd, path = tempfile.mkstemp(prefix="rivven-fsync-probe-", dir=directory)
    count = 0
    try:
        data = b"\x5a" * write_bytes
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            before = time.monotonic()
            os.pwrite(fd, data, count * write_bytes)
            os.fdatasync(fd)
            latency.record_us((time.monotonic() - before) * 1e6)
            count += 1
        elapsed = time.monotonic() - started
    finally:
        os.close(fd)
        os.unlink(path)
    summary = latency.summary_ms()
    return {"p50_ms": summary["p50"], "p99_ms": summary["p99"], "syncs_per_s": round(count / elapsed)}


def environment() -> dict[str, Any]:
    """Date, machine, commit, peer versions and flush latency, for the document's header."""
    machine = storage.machine_description(os.environ.get("TMPDIR", "/tmp"))
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10, check=False).stdout.strip() or "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=False).stdout
        commit += " (+ uncommitted changes)" if dirty.strip() else ""
    except (OSError, subprocess.TimeoutExpired):
        commit = "unknown"
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "unknown"
    return {
        **machine,
        "when": datetime.datetime.now().isoformat(timespec="minutes"),
        "commit": commit,
        "load_average_at_start": load,
        "peers": server_versions(),
        "fsync_4k": fsync_probe(os.environ.get("TMPDIR", "/tmp")),
    }


def run_suite(cases: list[SuiteCase], *, quick: bool = False, log: Callable[[str], None] = print,
              latency: bool = True) -> list[dict[str, Any]]:
    """Run ``cases`` (then the half-peak latency case); return one entry per case. Blocks."""
    results = []
    peak = None
    for case in cases:
        options = _quick(case.options) if quick else case.options
        log(f"== {case.name}: {options.describe()}")
        summary = report.summarize(runner.run_bench(options), options)
        log(report.format_summary(summary))
        if case.name == "produce-100B-redis":
            # The slower round: half of a peak seen only in a quiet moment would overload.
            peak = min(summary["rivven"]["rounds_records_per_s"])
        results.append(_entry(case, summary))
    if latency and peak:
        options = attrs.evolve(LATENCY_CASE.options, rate=max(1.0, peak / 2))
        options = _quick(options) if quick else options
        log(f"== {LATENCY_CASE.name}: {options.describe()}")
        summary = report.summarize(runner.run_bench(options), options)
        log(report.format_summary(summary))
        results.append(_entry(LATENCY_CASE, summary))
    return results


def _entry(case: SuiteCase, summary: dict[str, Any]) -> dict[str, Any]:
    return {"name": case.name, "title": case.title, "target": case.target,
            "met": bool(case.check(summary)), "summary": summary}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="1-second runs, small fills")
    parser.add_argument("--only", default="", help="run only cases whose name contains this")
    parser.add_argument("--doc", default=None,
                        help="rewrite this document's bench tables (default: docs/performance.md "
                             "for a full run)")
    parser.add_argument("--json-out", default="bench-results.json", help="write results here")
    parser.add_argument("--from-json", default=None,
                        help="do not run: rewrite --doc (default docs/performance.md) from this "
                             "results file of an earlier run")


def main(args: argparse.Namespace) -> int:
    """Run the suite, write the JSON and (full runs) the document. Exit 0 even when a target
    is missed (the document says so); 1 when data was lost or duplicated."""
    if args.from_json:
        with open(args.from_json) as source:
            saved = json.load(source)
        docs.rewrite_document(args.doc or "docs/performance.md", saved["environment"], saved["results"])
        return 0
    cases = [case for case in CASES if args.only in case.name]
    env = environment()
    print(f"environment: {json.dumps(env)}", flush=True)
    results = run_suite(cases, quick=args.quick, latency=args.only in LATENCY_CASE.name or not args.only,
                        log=lambda line: print(line, flush=True))
    with open(args.json_out, "w") as out:
        json.dump({"environment": env, "results": results}, out, indent=1)
    document = args.doc
    if document is None and not args.only and not args.quick:
        document = "docs/performance.md"
    if document:
        docs.rewrite_document(document, env, results)
        print(f"rewrote the tables of {document}")
    bad = [r["name"] for r in results
           if r["summary"]["lost"] or r["summary"]["duplicated"]
           or r["summary"].get("peer", {}).get("lost") or r["summary"].get("client", {}).get("lost")]
    if bad:
        print(f"LOSS OR DUPLICATES in {bad}", file=sys.stderr)
        return 1
    erred = [r["name"] for r in results if report.line_errors(r["summary"])]
    if erred:
        print(f"ERRORS in {erred} (see their lines)", file=sys.stderr)
        return 1
    return 0
