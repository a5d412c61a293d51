"""The public surface of ``rivven_broker.bench``: ``__all__`` is pinned, and every name in it
exists and is documented (so an accidental addition or removal is a visible change)."""

from __future__ import annotations

import rivven_broker.bench as bench

EXPECTED = {
    "BenchOptions",
    "OptionsError",
    "Latency",
    "Ledger",
    "Verdict",
    "StorageCase",
    "StorageResult",
    "default_storage_cases",
    "machine_description",
    "run_storage_bench",
}


def test_all_is_pinned_and_documented():
    assert set(bench.__all__) == EXPECTED
    for name in bench.__all__:
        assert getattr(bench, name).__doc__, name
