"""Summaries of benchmark rounds: the JSON document and the human-readable lines.

Theory of operation
-------------------
``summarize(rounds, options)`` turns the ``LineResult``s of every round into one JSON-ready
dict. For each target (Rivven's raw line, the client line, the peer): the median and best
records/s over rounds, MB/s of record values (1 MB = 10**6 bytes) and, for consume, of whole
batches on the wire ("broker side"), the latency percentiles of the histograms of all rounds
merged, lost/duplicated/unknown summed over rounds, and the broker's CPU seconds per million
records. With a peer: the per-round ratio Rivven/peer and its median (``ratio``). A spread of
more than 25 % between rounds is flagged (``unsteady``): the host is noisy, rerun.

Pure: no I/O.
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

from rivven_broker.bench.options import BenchOptions
from rivven_broker.bench.runner import LineResult
from rivven_broker.bench.stats import Latency, spread

__all__ = ["summarize", "format_summary", "line_summary"]

_SPREAD_FLAG = 0.25


def line_summary(lines: Sequence[LineResult]) -> dict[str, Any]:
    """The figures of one target over its rounds."""
    rates = [line.records_per_s for line in lines]
    median_index = _median_index(rates)
    middle = lines[median_index]
    latency = Latency.merged(line.latency for line in lines if line.latency)
    cpu = [value for line in lines if (value := line.cpu_s_per_million) is not None]
    load_cpu = [value for line in lines if (value := line.load_cpu_s_per_million) is not None]
    out: dict[str, Any] = {
        "target": middle.target,
        "setting": middle.setting,
        "records_per_s": round(statistics.median(rates)),
        "records_per_s_best": round(max(rates)),
        "rounds_records_per_s": [round(rate) for rate in rates],
        "mb_per_s": round(statistics.median(line.mb_per_s for line in lines), 1),
        "wire_mb_per_s": round(statistics.median(line.wire_mb_per_s for line in lines), 1),
        "requests_per_s": round(statistics.median(
            line.requests / line.seconds if line.seconds else 0.0 for line in lines)),
        "latency_ms": latency.summary_ms(),
        "latency_count": latency.count,
        "lost": sum(line.lost for line in lines),
        "duplicated": sum(line.duplicated for line in lines),
        "unknown": sum(line.unknown for line in lines),
        "acked_units": sum(line.acked_units for line in lines),
        "broker_cpu_s_per_million": round(statistics.median(cpu), 3) if cpu else None,
        "load_cpu_s_per_million": round(statistics.median(load_cpu), 3) if load_cpu else None,
        "spread": round(spread(rates), 3),
        "unsteady": spread(rates) > _SPREAD_FLAG,
        "per_second": _per_second(middle.buckets),
        "errors": [error for line in lines for error in line.errors][:20],
    }
    extra = {k: v for k, v in middle.extra.items() if k != "lost_examples"}
    if extra:
        out["extra"] = extra
    examples = [line.extra["lost_examples"] for line in lines if "lost_examples" in line.extra]
    if examples:
        out["lost_examples"] = examples[0]
    return out


def line_errors(summary: dict[str, Any]) -> list[str]:
    """Every target line's errors in a ``summarize`` result. A line with any measured
    something besides the workload it names (a refused request, a dead connection): the run
    fails (exit 1), whatever its figures."""
    return [error for line in summary.values() if isinstance(line, dict)
            for error in line.get("errors", ())]


def _median_index(values: Sequence[float]) -> int:
    order = sorted(range(len(values)), key=values.__getitem__)
    return order[(len(order) - 1) // 2]


def _per_second(buckets: Sequence[int]) -> dict[str, float] | None:
    if len(buckets) < 2:
        return None
    return {
        "mean": round(statistics.mean(buckets)),
        "stddev": round(statistics.pstdev(buckets)),
        "min": min(buckets),
        "max": max(buckets),
    }


def summarize(rounds: Sequence[dict[str, LineResult]], options: BenchOptions,
              machine: dict[str, Any] | None = None) -> dict[str, Any]:
    """One JSON-ready summary of a whole run (see the module docstring)."""
    rivven = line_summary([r["rivven"] for r in rounds])
    summary: dict[str, Any] = {
        "workload": options.describe(),
        "mode": options.mode,
        **{k: rivven[k] for k in ("records_per_s", "mb_per_s", "latency_ms", "lost", "duplicated")},
        "rivven": rivven,
        "options": options.to_json(),
    }
    if machine is not None:
        summary["machine"] = machine
    if all("client" in r for r in rounds) and rounds and "client" in rounds[0]:
        summary["client"] = line_summary([r["client"] for r in rounds])
    if rounds and all("cluster" in r for r in rounds):
        cluster = summary["cluster"] = line_summary([r["cluster"] for r in rounds])
        single = rivven["records_per_s"]
        summary["cluster_vs_single"] = round(cluster["records_per_s"] / single, 2) if single else None
        if options.peer is not None:
            peer_rate = line_summary([r[options.peer] for r in rounds])["records_per_s"]
            summary["cluster_vs_peer"] = (round(cluster["records_per_s"] / peer_rate, 2)
                                          if peer_rate else None)
    if options.peer is not None:
        peer_lines = [r[options.peer] for r in rounds]
        peer = line_summary(peer_lines)
        ratios = [
            r["rivven"].records_per_s / r[options.peer].records_per_s
            for r in rounds
            if r[options.peer].records_per_s
        ]
        summary["peer"] = peer
        summary["ratios"] = [round(x, 2) for x in ratios]
        summary["ratio"] = round(statistics.median(ratios), 2) if ratios else None
    return summary


def _line_text(name: str, figures: dict[str, Any], mode: str) -> str:
    latency = figures["latency_ms"]
    rate = figures["records_per_s"]
    parts = [
        f"{name:<16} {rate:>12,} rec/s",
        f"{figures['mb_per_s']:>8,.1f} MB/s",
    ]
    if mode == "consume":
        parts.append(f"(wire {figures['wire_mb_per_s']:,.1f} MB/s)")
    if figures["latency_count"]:
        parts.append(
            f"p50 {latency['p50']:.2f} p99 {latency['p99']:.2f} p99.9 {latency['p999']:.2f} "
            f"max {latency['max']:.2f} ms"
        )
    if figures["broker_cpu_s_per_million"] is not None:
        parts.append(f"cpu {figures['broker_cpu_s_per_million']:.2f} s/M")
    if figures["load_cpu_s_per_million"] is not None:
        parts.append(f"(load {figures['load_cpu_s_per_million']:.2f})")
    parts.append(f"lost {figures['lost']} dup {figures['duplicated']}")
    if len(figures["rounds_records_per_s"]) > 1:
        parts.append(f"rounds {figures['rounds_records_per_s']}")
    if figures["unsteady"]:
        parts.append("UNSTEADY")
    return "  ".join(parts)


def format_summary(summary: dict[str, Any]) -> str:
    """Human-readable lines: the workload, one line per target, the ratio, errors."""
    mode = summary["mode"]
    rows = [summary["workload"]]
    rivven = summary["rivven"]
    rows.append(_line_text(f"rivven ({rivven['setting']})", rivven, mode))
    if "client" in summary:
        rows.append(_line_text("rivven client", summary["client"], mode))
    if "cluster" in summary:
        rows.append(_line_text("rivven cluster", summary["cluster"], mode))
    if "peer" in summary:
        peer = summary["peer"]
        rows.append(_line_text(f"{peer['target']} ({peer['setting']})", peer, mode))
        rows.append(f"ratio rivven/{peer['target']}: {summary['ratio']}x (rounds {summary['ratios']})")
    if "cluster" in summary:
        text = f"ratio cluster/single broker: {summary['cluster_vs_single']}x"
        if "cluster_vs_peer" in summary:
            text += f"; cluster/{summary['peer']['target']}: {summary['cluster_vs_peer']}x"
        rows.append(text)
    if "extra" in rivven and "produce_latency" in rivven["extra"]:
        rows.append(f"produce ack latency: {rivven['extra']['produce_latency']} ms")
    for name in ("rivven", "client", "cluster", "peer"):
        for error in summary.get(name, {}).get("errors", [])[:5]:
            rows.append(f"error ({name}): {error.strip()[:300]}")
    return "\n".join(rows)
