"""Rivven's own benchmarks: ``python -m rivven_broker.bench storage`` (see docs/performance.md).

Theory of operation
-------------------
Each benchmark is a small driver over the real code (no mocks), run in this process, pinned to
one CPU where the OS allows, with its data in a temporary directory that is removed at the end.
Results print as a table or, with ``--json``, as one JSON document that includes a description
of the machine, so figures in ``docs/performance.md`` can be traced to where they came from.
"""

from rivven_broker.bench.storage import (
    StorageCase,
    StorageResult,
    default_storage_cases,
    machine_description,
    run_storage_bench,
)

__all__ = [
    "StorageCase",
    "StorageResult",
    "default_storage_cases",
    "machine_description",
    "run_storage_bench",
]
