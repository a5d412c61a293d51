"""Rivven's own benchmarks: ``rivven bench produce|consume|e2e|suite`` and ``... storage``.

Theory of operation
-------------------
Two families share this package (docs/performance.md describes both):

- the broker benchmark: a coordinator (``runner``) starts a real broker, or a peer server
  (Redis Streams, NATS JetStream), pinned to one CPU, and load generators as separate
  processes pinned to the other (``workers``, ``rivven_load``, ``peer_load``); it merges their
  HDR histograms (``stats``), checks that nothing acknowledged was lost or duplicated
  (``ledger``) and summarizes (``report``); ``suite`` is the standard run of ``make bench``,
  which rewrites the tables of docs/performance.md (``docs``);
- the storage benchmark (``storage``): one partition log in this process, no sockets.

Results print as a table or, with ``--json``, as one JSON document that includes a
description of the machine, so every figure can be traced to where it came from.
"""

from rivven_broker.bench.ledger import Ledger, Verdict
from rivven_broker.bench.options import BenchOptions, OptionsError
from rivven_broker.bench.stats import Latency
from rivven_broker.bench.storage import (
    StorageCase,
    StorageResult,
    default_storage_cases,
    machine_description,
    run_storage_bench,
)

__all__ = [
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
]
