"""The summary's CPU figures: the server's and the load's own, per million records.

Method: two rounds of made-up line results go through ``report.summarize`` and
``format_summary``; the medians of both CPU figures come out in the JSON and in the text
line, and a line without a load figure (the consumers) shows none.
"""

from __future__ import annotations

from rivven_broker.bench.options import BenchOptions
from rivven_broker.bench.report import format_summary, summarize
from rivven_broker.bench.runner import LineResult


def _line(records: int, server_cpu_s: float, load_cpu_s: float) -> LineResult:
    return LineResult("rivven", "always", records=records, seconds=1.0,
                      server_cpu_s=server_cpu_s, load_cpu_s=load_cpu_s)


def test_server_and_load_cpu_per_million_records():
    rounds = [{"rivven": _line(1_000_000, 0.5, 0.25)}, {"rivven": _line(2_000_000, 1.2, 0.3)}]
    summary = summarize(rounds, BenchOptions(mode="produce"))
    assert summary["rivven"]["broker_cpu_s_per_million"] == 0.55  # median of 0.5 and 0.6
    assert summary["rivven"]["load_cpu_s_per_million"] == 0.2  # median of 0.25 and 0.15
    assert "cpu 0.55 s/M  (load 0.20)" in format_summary(summary)


def test_a_line_without_load_cpu_shows_none():
    summary = summarize([{"rivven": _line(1_000_000, 0.5, 0.0)}], BenchOptions(mode="consume"))
    assert summary["rivven"]["load_cpu_s_per_million"] is None
    assert "(load" not in format_summary(summary)
