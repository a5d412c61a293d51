"""The raw producer's batch template and the generated document sections.

Method: fill the template as a producer does and check the batch is valid for the broker (its
CRC matches, records decode) and carries the mark where the verifier reads it; render the
docs tables from a minimal result and check ``replace_section`` keeps everything outside its
markers and appends missing sections.
"""

from __future__ import annotations

from rivven_broker.bench.docs import render_sections, replace_section
from rivven_broker.bench.ledger import MARK, Ledger
from rivven_broker.bench.rivven_load import batch_template
from rivven_broker.records import decode_records, validate


def test_filled_batches_are_valid_and_marked():
    template = batch_template(100, 10)
    batch = bytes(template.fill(4, 17, 99))
    header = validate(batch)
    assert header.record_count == 10
    records = decode_records(batch)
    assert [len(r.value) for r in records] == [100] * 10
    assert MARK.unpack_from(records[0].value) == (4, 17, 99)
    assert MARK.unpack_from(batch, template.mark_at) == (4, 17, 99)
    other = bytes(template.fill(4, 18, 99))
    assert validate(other).crc != header.crc
    ledger = Ledger()
    ledger.add_producer(4, sent=19, acked=0)
    ledger.observe_value(batch, template.mark_at)
    assert ledger.verdict().ok


def test_replace_section_keeps_the_rest():
    text = "# Perf\n\nintro\n<!-- bench:produce -->\nold\n<!-- /bench:produce -->\n\nanalysis\n"
    out = replace_section(text, "produce", "| new |")
    assert out == "# Perf\n\nintro\n<!-- bench:produce -->\n| new |\n<!-- /bench:produce -->\n\nanalysis\n"
    assert replace_section(out, "produce", "| new |") == out
    added = replace_section(out, "consume", "c")
    assert added.startswith(out.rstrip("\n")) and added.endswith("<!-- bench:consume -->\nc\n<!-- /bench:consume -->\n")


def _figures(rate: float) -> dict:
    return {
        "target": "rivven", "setting": "always", "records_per_s": rate, "rounds_records_per_s": [rate],
        "mb_per_s": rate / 1e4, "wire_mb_per_s": rate / 8e3, "latency_ms": {"p50": 1, "p99": 2, "p999": 3, "max": 4},
        "latency_count": 5, "lost": 0, "duplicated": 0, "broker_cpu_s_per_million": 0.5, "unsteady": False,
    }


def test_render_sections_lists_every_case():
    summary = {"mode": "produce", "workload": "w", "records_per_s": 1e6, "mb_per_s": 100.0,
               "latency_ms": {"p50": 1, "p99": 2, "p999": 3, "max": 4}, "lost": 0, "duplicated": 0,
               "rivven": _figures(1e6), "peer": {**_figures(2e5), "target": "redis"}, "ratio": 5.0}
    results = [{"name": "produce-100B-redis", "target": ">= 1M", "met": True, "summary": summary}]
    sections = render_sections({"when": "now", "commit": "abc", "peers": {}}, results)
    assert set(sections) == {"environment", "targets", "produce", "consume", "latency"}
    assert "produce-100B-redis" in sections["targets"] and "5.0x" in sections["produce"]
    assert "1.00M" in sections["produce"] and "redis always: 200.0k" in sections["produce"]
