"""``rivven bench codecs``: every codec measured on the same batches, ratios that mean it."""

from __future__ import annotations

import json
import subprocess
import sys

from rivven_broker.bench.codecs import run


def test_every_codec_is_measured_on_the_same_batches() -> None:
    result = run(records=200, value_bytes=100, seconds=0.01, rounds=1)
    codecs = result["codecs"]
    assert list(codecs) == ["none", "gzip", "snappy", "lz4", "zstd"]
    assert codecs["none"]["ratio"] == 1.0
    assert all(codecs[c]["ratio"] > 1.5 for c in ("gzip", "snappy", "lz4", "zstd"))
    assert all(row["build_records_per_s"] > 0 and row["decode_records_per_s"] > 0
               for row in codecs.values())


def test_the_command_prints_one_json_document() -> None:
    done = subprocess.run([sys.executable, "-m", "rivven_broker.bench", "codecs", "--records",
                           "50", "--seconds", "0.01", "--rounds", "1", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert set(json.loads(done.stdout)["codecs"]) == {"none", "gzip", "snappy", "lz4", "zstd"}
