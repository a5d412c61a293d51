"""The executor's Python worker: freeze its long-lived heap once, so per-task collections stay cheap.

Theory of operation
-------------------
Spark reuses a Python worker process for task after task (``spark.python.worker.reuse``, on by
default), and after every task its daemon runs a full garbage collection (``gc.collect()`` in
``pyspark/daemon.py``). That collection walks every object the worker holds: pyspark, pyarrow,
numpy and this package, about 60,000 objects, 15-30 ms of CPU per task on the benchmark
machine, while the task's own work on a 250,000-record range is about 40 ms. Those objects
live as long as the process.

So the first time a read or write task runs in a reused worker process, ``freeze_worker_heap``
collects once and then freezes what is left (``gc.freeze()``: the objects move to a permanent
generation the collector no longer scans). Every later collection in that process only walks
what later tasks allocate. Measured with ``python -m rivven_spark.bench``: the Python
workers' CPU per 1,000,000-record read fell from 0.30 to 0.19 s (docs/performance.md, Spark).

It does nothing outside a reused Spark worker (``SPARK_REUSE_WORKER`` is how Spark tells the
worker; a worker that is not reused exits after its task and is never collected) and nothing
after the first call in a process. What it freezes is garbage-free (it collects first) and
lives for the process anyway; a forked child inherits the frozen state, and freezes its own
heap on its own first call.
"""

from __future__ import annotations

import gc
import os

__all__ = ["freeze_worker_heap"]

_frozen_in_pid: int | None = None


def freeze_worker_heap() -> bool:
    """Collect and freeze the heap, once per reused Spark worker process; True if it did now."""
    global _frozen_in_pid
    if _frozen_in_pid == os.getpid() or os.environ.get("SPARK_REUSE_WORKER") != "1":
        return False
    _frozen_in_pid = os.getpid()
    gc.collect()
    gc.freeze()
    return True
