"""``rivven bench codecs``: each compression codec's speed and ratio on the same batches.

Theory of operation
-------------------
Builds record batches of one shape (``--records`` records of ``--value-bytes`` each: JSON-like
values with a few varying fields, so they compress as real events do, not as zeros) with
every codec the clients offer (none, gzip, snappy, lz4, zstd), through the real
``BatchBuilder`` and ``decode_records`` — what a producer and a consumer spend. For each codec
it reports the stored batch bytes against the plain ones (the ratio), and records/s and MB/s
(of plain record bytes) to build and to decode, each the best of ``--rounds`` timed rounds of
``--seconds``. One process, one core: a measure of CPU cost, not of a broker.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

from rivven_broker.records import BatchBuilder, decode_records
from rivven_broker.records.builder import COMPRESSIONS

__all__ = ["HELP", "add_arguments", "main", "run"]

HELP = "each codec's build and decode speed and its ratio on the same record batches"
_BATCH_BYTES_MAX = 16 * 1024 * 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--records", type=int, default=1000, help="records per batch")
    parser.add_argument("--value-bytes", type=int, default=100, help="bytes per value")
    parser.add_argument("--seconds", type=float, default=1.0, help="length of a timed round")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (the best counts)")
    parser.add_argument("--json", action="store_true", help="one JSON document")


def _values(count: int, size: int, rng: random.Random) -> list[bytes]:
    values = []
    for i in range(count):
        event = (b'{"id":%d,"user":"u%04d","kind":"%s","amount":%d.%02d,"note":"'
                 % (i, rng.randrange(5000), rng.choice([b"view", b"cart", b"buy"]),
                    rng.randrange(1000), rng.randrange(100)))
        pad = max(size - len(event) - 2, 0)
        values.append((event + b"x" * pad + b'"}')[:size])
    return values


def _build(codec: str, values: list[bytes]) -> bytes:
    builder = BatchBuilder(batch_bytes_max=_BATCH_BYTES_MAX, compression=codec)
    for i, value in enumerate(values):
        builder.append(1_700_000_000_000 + i, None, value)
    return builder.build()


def _rate(work: Any, seconds: float, rounds: int) -> float:
    """Calls of ``work`` per second, the best of ``rounds`` rounds."""
    best = 0.0
    for _ in range(rounds):
        calls, start = 0, time.perf_counter()
        while True:
            work()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                break
        best = max(best, calls / elapsed)
    return best


def run(records: int, value_bytes: int, seconds: float, rounds: int) -> dict[str, Any]:
    values = _values(records, value_bytes, random.Random(1))
    plain_bytes = sum(len(v) for v in values)
    plain_batch = len(_build("none", values))
    results = {}
    for codec in COMPRESSIONS:
        batch = _build(codec, values)
        assert len(decode_records(batch)) == records
        builds = _rate(lambda: _build(codec, values), seconds, rounds)
        decodes = _rate(lambda: decode_records(batch), seconds, rounds)
        results[codec] = {
            "batch_bytes": len(batch),
            "ratio": round(plain_batch / len(batch), 2),
            "build_records_per_s": round(builds * records),
            "build_mb_per_s": round(builds * plain_bytes / 1e6, 1),
            "decode_records_per_s": round(decodes * records),
            "decode_mb_per_s": round(decodes * plain_bytes / 1e6, 1),
        }
    return {"records_per_batch": records, "value_bytes": value_bytes,
            "plain_batch_bytes": plain_batch, "codecs": results}


def main(args: argparse.Namespace) -> int:
    if args.records < 1 or args.value_bytes < 1 or args.seconds <= 0 or args.rounds < 1:
        raise SystemExit("rivven bench codecs: --records, --value-bytes, --rounds >= 1, "
                         "--seconds > 0")
    result = run(args.records, args.value_bytes, args.seconds, args.rounds)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{result['records_per_batch']} records of {result['value_bytes']} B per batch "
          f"({result['plain_batch_bytes']} B plain)")
    print(f"{'codec':8} {'batch B':>9} {'ratio':>6} {'build rec/s':>12} {'MB/s':>7} "
          f"{'decode rec/s':>13} {'MB/s':>7}")
    for codec, row in result["codecs"].items():
        print(f"{codec:8} {row['batch_bytes']:>9} {row['ratio']:>6} "
              f"{row['build_records_per_s']:>12} {row['build_mb_per_s']:>7} "
              f"{row['decode_records_per_s']:>13} {row['decode_mb_per_s']:>7}")
    return 0
