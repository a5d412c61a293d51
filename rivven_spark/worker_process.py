"""The executor's Python worker process, tuned once for task after task of reading or writing.

Theory of operation
-------------------
Spark reuses a Python worker process for task after task (``spark.python.worker.reuse``, on by
default). Two process-wide costs then recur on every task, and neither is the task's work:

- **Garbage collection.** After every task Spark's daemon runs a full collection
  (``gc.collect()`` in ``pyspark/daemon.py``). It walks every object the worker holds:
  pyspark, pyarrow, numpy and this package, about 60,000 objects that live as long as the
  process; 15-30 ms of CPU per task on the benchmark machine, where reading a
  250,000-record range takes about 40 ms.
- **Fresh pages.** A read moves MiB-sized byte strings (fetch answers, Arrow columns); with
  glibc's default thresholds each one is served with freshly mapped pages, about 1,400 page
  faults per 2 MiB fetch (a quarter of the read's CPU).

So the first read or write task in a reused worker process calls ``tune_worker_process``: it
collects once and freezes what is left (``gc.freeze()``: later collections in the process only
walk what later tasks allocate), and makes the C allocator keep freed blocks for reuse
(``rivven_broker.process_memory``). Measured with the benchmark's 1,000,000-record read
(docs/performance.md, Spark): the Python workers' CPU per read fell from 0.34 to 0.20 s with
the freeze, and a reader's from 0.17-0.19 to 0.13 s with the allocator setting.

It does nothing outside a reused Spark worker (``SPARK_REUSE_WORKER`` is how Spark tells the
worker; a worker that is not reused exits after its task and is never collected) and nothing
after the first call in a process. What it freezes is garbage-free (it collects first) and
lives for the process anyway; a forked child inherits the frozen state and the allocator
setting, and tunes itself again on its own first call (harmless).
"""

from __future__ import annotations

import gc
import os

from rivven_broker.process_memory import keep_freed_memory

__all__ = ["tune_worker_process"]

_tuned_in_pid: int | None = None


def tune_worker_process() -> bool:
    """Freeze the heap and keep freed memory, once per reused Spark worker process; True if it
    did now."""
    global _tuned_in_pid
    if _tuned_in_pid == os.getpid() or os.environ.get("SPARK_REUSE_WORKER") != "1":
        return False
    _tuned_in_pid = os.getpid()
    keep_freed_memory()
    gc.collect()
    gc.freeze()
    return True
