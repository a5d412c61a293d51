"""Storage benchmark: appends and reads on one real partition log, with and without fsync.

Theory of operation
-------------------
Measures the storage layer alone (no sockets, no protocol): ``PartitionLog`` over
``OsFileStore`` in a temporary directory, driven by trio tasks sharing one ``SyncWorker`` (with
the production thread runner), exactly as the broker drives them.

- Append cases: record size (100 B, 1 KiB) x batch size (64 KiB, 1 MiB) x sync policy (``none``,
  ``always``) x concurrent appenders (1, 4) x preallocation. Each appender loops ``append`` ->
  ``mark_dirty`` -> ``wait_durable`` for ``--seconds``. Under ``always`` the appenders share
  group commits, so fsyncs/s shows how many appends each fsync covered.
- Read cases: a log is filled (not timed) and then read front to back in 1 MiB fetches, again and
  again, from the page cache.
- ``--sealed-segments N``: every append case starts on a log that already holds N sealed
  segments (made first, not timed, each one small batch in a segment of its own), as a
  long-lived partition does: what the group commit costs should not grow with them.

Page cache: on a virtual machine whose balloon driver reports free pages to the host, a write
that needs NEW page-cache memory costs far more than the copy (the host backs each page again
on first touch); a log that only grows pays that on every byte. docs/performance.md shows how
much, next to raw ``os.pwrite`` figures taken the same way.

Batches are built ONCE up front with ``BatchBuilder`` (a small pool, reused round-robin), so the
figures are of storage, not of batch building. MB/s counts batch bytes (header included; 1 MB =
10**6 bytes), records/s counts records in those batches. The process pins itself to one CPU
(``--cpu``) where ``os.sched_setaffinity`` exists; the fsync thread inherits the pin. Each case
gets a fresh directory, removed afterwards, like the whole temporary root at the end. Unless
``--no-malloc-tuning``, glibc is told to keep freed buffers (``tune_malloc``): a fetch returns
a fresh ~1 MiB ``bytes``, and glibc's default of returning such memory to the kernel after each
one made reads page-fault their buffers in again and again.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import datetime
import itertools
import json
import os
import platform
import shutil
import tempfile
import time
from typing import Any, Sequence

import attrs
import trio

from rivven_broker.protocol import limits
from rivven_broker.records.builder import BatchBuilder
from rivven_broker.storage.file_store import OsFileStore
from rivven_broker.storage.log_config import LogConfig
from rivven_broker.storage.partition_log import PartitionLog
from rivven_broker.server.sync_thread import InlineWhileFast, SyncThread
from rivven_broker.storage.sync_worker import SyncPolicy, SyncWorker

__all__ = [
    "StorageCase",
    "StorageResult",
    "default_storage_cases",
    "run_storage_bench",
    "machine_description",
    "format_table",
    "tune_malloc",
    "add_arguments",
    "main",
]

HELP = "append/read throughput of one partition log (sync none/always, 1 and 4 appenders)"
_KIB = 1024
_MIB = 1024 * 1024
_POOL_BATCHES = 8
_READ_BYTES_MAX = _MIB  # one fetch, like Kafka's max.partition.fetch.bytes default
_READ_FILL_BYTES = 512 * _MIB
_LOG_DIR = "bench-0"


@attrs.frozen
class StorageCase:
    """One benchmark case."""

    kind: str  # "append" | "read"
    record_bytes: int
    batch_bytes: int
    sync: str = "none"  # "none" | "always" (append only)
    appenders: int = 1
    preallocate_bytes: int = 0
    sealed_segments: int = 0  # (append only) made before the timing starts

    @property
    def name(self) -> str:
        size = f"{self.record_bytes}B/{self.batch_bytes // _KIB}KiB"
        if self.kind == "read":
            return f"read {size}"
        name = f"append {size} sync={self.sync} x{self.appenders}"
        if self.preallocate_bytes:
            name += f" prealloc={self.preallocate_bytes // _MIB}MiB"
        if self.sealed_segments:
            name += f" sealed={self.sealed_segments}"
        return name


@attrs.frozen
class StorageResult:
    """What one case achieved."""

    case: StorageCase
    seconds: float
    bytes: int
    records: int
    batches: int
    fsyncs: int
    groups: int

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e6

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def fsyncs_per_s(self) -> float:
        return self.fsyncs / self.seconds

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.case.name,
            **attrs.asdict(self.case),
            "seconds": round(self.seconds, 3),
            "bytes": self.bytes,
            "records": self.records,
            "batches": self.batches,
            "fsyncs": self.fsyncs,
            "groups": self.groups,
            "mb_per_s": round(self.mb_per_s, 1),
            "records_per_s": round(self.records_per_s),
            "fsyncs_per_s": round(self.fsyncs_per_s, 1),
        }


def default_storage_cases(preallocate: Sequence[int] = (0,),
                          sealed_segments: int = 0) -> list[StorageCase]:
    """The brief's matrix: every append case once per preallocation (on a log holding
    ``sealed_segments`` sealed segments), then the read cases."""
    cases = [
        StorageCase("append", record, batch, sync, appenders, prealloc, sealed_segments)
        for prealloc in preallocate
        for sync in ("none", "always")
        for batch in (64 * _KIB, _MIB)
        for record in (100, _KIB)
        for appenders in (1, 4)
    ]
    for batch in (64 * _KIB, _MIB):
        cases += [StorageCase("read", record, batch) for record in (100, _KIB)]
    return cases


def build_pool(record_bytes: int, batch_bytes: int, count: int = _POOL_BATCHES) -> list[bytes]:
    """``count`` distinct batches of records of ``record_bytes`` values, each <= ``batch_bytes``."""
    pool = []
    for number in range(count):
        builder = BatchBuilder(batch_bytes_max=batch_bytes)
        value = bytes([number % 251]) * record_bytes
        timestamp_ms = 1_700_000_000_000
        while builder.append(timestamp_ms, None, value):
            pass
        pool.append(builder.build())
    return pool


def _records_in(batch: bytes) -> int:
    return int.from_bytes(batch[57:61], "big")  # header.record_count


def _open_log(root: str, preallocate_bytes: int) -> tuple[OsFileStore, PartitionLog]:
    store = OsFileStore(root)
    store.makedirs(_LOG_DIR)
    config = LogConfig(preallocate_bytes=preallocate_bytes)
    log, _ = PartitionLog.open(store, _LOG_DIR, config, _now_ms())
    return store, log


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _seal_segments(log: PartitionLog, count: int) -> None:
    """Roll ``log`` until it holds ``count`` sealed segments, each one small batch, synced
    (not timed; ``flush`` fsyncs what the rolls left)."""
    config = log.config
    log.config = attrs.evolve(config, segment_bytes=limits.segment_bytes_min)
    builder = BatchBuilder(batch_bytes_max=limits.segment_bytes_min)
    builder.append(1_700_000_000_000, None, bytes(limits.segment_bytes_min // 2))
    batch = builder.build()
    try:
        while len(log.sealed_segment_bases()) < count:
            log.append(batch, _now_ms())
    finally:
        log.config = config
    log.flush()


async def _append_case(case: StorageCase, root: str, seconds: float) -> StorageResult:
    pool = build_pool(case.record_bytes, case.batch_bytes)
    records_per_batch = _records_in(pool[0])
    _, log = _open_log(root, case.preallocate_bytes)
    if case.sealed_segments:
        _seal_segments(log, case.sealed_segments)
    fsyncs = InlineWhileFast(SyncThread(), time.perf_counter)  # as the broker runs them
    worker = SyncWorker(SyncPolicy.parse(case.sync), fsyncs.run_sync)
    counts = [0, 0]  # batches, bytes

    async def appender(first: int) -> None:
        batches = itertools.cycle(pool[first:] + pool[:first])
        while time.perf_counter() < deadline:
            batch = next(batches)
            info = log.append(batch, _now_ms())
            worker.mark_dirty(log)
            await worker.wait_durable(log, info.last_offset)
            counts[0] += 1
            counts[1] += len(batch)

    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            started = time.perf_counter()
            deadline = started + seconds
            async with trio.open_nursery() as appenders:
                for number in range(case.appenders):
                    appenders.start_soon(appender, number)
            elapsed = time.perf_counter() - started
            await worker.aclose()
    finally:
        log.close()
    stats = worker.statistics()
    batches, size = counts
    records = batches * records_per_batch
    return StorageResult(case, elapsed, size, records, batches, stats.fsyncs, stats.groups)


def _read_case(case: StorageCase, root: str, seconds: float, fill_bytes: int) -> StorageResult:
    pool = build_pool(case.record_bytes, case.batch_bytes)
    records_per_batch = _records_in(pool[0])
    _, log = _open_log(root, 0)
    try:
        for batch in itertools.islice(itertools.cycle(pool), max(fill_bytes // len(pool[0]), 1)):
            log.append(batch, _now_ms())
        log.flush()
        total = batches = 0
        offset = log.log_start_offset
        end_offset = log.log_end_offset
        started = time.perf_counter()
        deadline = started + seconds
        while time.perf_counter() < deadline:
            result = log.read(offset, _READ_BYTES_MAX)
            size = len(result.records)
            total += size
            batches += size // len(pool[0])
            offset = result.next_offset if result.next_offset < end_offset else log.log_start_offset
        elapsed = time.perf_counter() - started
    finally:
        log.close()
    return StorageResult(case, elapsed, total, batches * records_per_batch, batches, 0, 0)


def run_storage_bench(
    cases: Sequence[StorageCase],
    seconds: float,
    directory: str | None = None,
    *,
    read_fill_bytes: int = _READ_FILL_BYTES,
) -> list[StorageResult]:
    """Run ``cases`` in a fresh temporary directory under ``directory``; remove it after.

    Read cases first fill a log with ``read_fill_bytes``. Blocks for about ``seconds`` per case
    (plus the fill of read cases). Raises ``OSError`` if
    the disk fails, and whatever the storage layer raises.
    """
    base = tempfile.mkdtemp(prefix="rivven-bench-", dir=directory)
    results = []
    try:
        for number, case in enumerate(cases):
            root = os.path.join(base, f"case-{number}")
            try:
                if case.kind == "append":
                    results.append(trio.run(_append_case, case, root, seconds))
                else:
                    results.append(_read_case(case, root, seconds, read_fill_bytes))
            finally:
                shutil.rmtree(root, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return results


_M_TRIM_THRESHOLD = -1  # glibc mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3


def tune_malloc(threshold_bytes: int = 64 * _MIB) -> bool:
    """Stop glibc from handing freed 1 MiB read buffers back to the kernel after every read.

    By default glibc serves big allocations with mmap and trims the heap top, so each read's
    fresh ``bytes`` page-faults its memory in again (on this VM, through the host: reads ran
    at 0.6-0.8 GB/s instead of 3-5). Raising both thresholds keeps that memory in the process.
    Returns False where glibc's ``mallopt`` is not available. Never raises.
    """
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = libc.mallopt if libc is not None else None
    except (OSError, AttributeError):
        return False
    if mallopt is None:
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, threshold_bytes) == 1
    return mallopt(_M_TRIM_THRESHOLD, 4 * threshold_bytes) == 1 and ok


def machine_description(directory: str) -> dict[str, Any]:
    """CPU model and count, kernel, Python, and the file system holding ``directory``."""
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "directory": directory,
        "filesystem": _filesystem_of(directory),
        "date": datetime.date.today().isoformat(),
    }


def _filesystem_of(directory: str) -> str:
    path = os.path.realpath(directory)
    best, kind = "", "unknown"
    try:
        with open("/proc/mounts") as mounts:
            for line in mounts:
                fields = line.split()
                mount_point, fs_type = fields[1], fields[2]
                if (path == mount_point or path.startswith(mount_point.rstrip("/") + "/")) and len(
                    mount_point
                ) >= len(best):
                    best, kind = mount_point, f"{fs_type} on {fields[0]} (mounted at {mount_point})"
    except OSError:
        pass
    return kind


def format_table(results: Sequence[StorageResult]) -> str:
    """A plain-text table, one row per case."""
    header = f"{'case':<52} {'MB/s':>9} {'records/s':>12} {'fsyncs/s':>9}"
    rows = [header, "-" * len(header)]
    for result in results:
        fsyncs = f"{result.fsyncs_per_s:9.0f}" if result.case.kind == "append" else f"{'-':>9}"
        rows.append(
            f"{result.case.name:<52} {result.mb_per_s:9.0f} {result.records_per_s:12,.0f} {fsyncs}"
        )
    return "\n".join(rows)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=3.0, help="time per case (default 3)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--dir", default=None, help="parent of the temporary data directory")
    parser.add_argument(
        "--preallocate",
        default="0,67108864",
        help="comma-separated preallocate_bytes values to run every append case with",
    )
    parser.add_argument("--only", default="", help="run only cases whose name contains this")
    parser.add_argument("--sealed-segments", type=int, default=0,
                        help="sealed segments each append case's log holds before it starts "
                             "(default 0)")
    parser.add_argument("--cpu", type=int, default=0, help="CPU to pin to (-1: do not pin)")
    parser.add_argument(
        "--no-malloc-tuning",
        action="store_true",
        help="keep glibc's default malloc thresholds (see tune_malloc)",
    )


def main(args: argparse.Namespace) -> int:
    """Run the suite from parsed arguments; print a table or JSON. Returns the exit code."""
    if args.cpu >= 0 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.cpu})
    malloc_tuned = False if args.no_malloc_tuning else tune_malloc()
    preallocate = [int(value) for value in args.preallocate.split(",") if value.strip()]
    cases = default_storage_cases(preallocate, args.sealed_segments)
    cases = [case for case in cases if args.only in case.name]
    directory = args.dir or tempfile.gettempdir()
    results = run_storage_bench(cases, args.seconds, directory)
    machine = machine_description(directory)
    machine["pinned_cpu"] = args.cpu if args.cpu >= 0 and hasattr(os, "sched_setaffinity") else None
    machine["malloc_tuned"] = malloc_tuned
    if args.json:
        print(json.dumps({"machine": machine, "results": [r.to_json() for r in results]}, indent=1))
    else:
        print(", ".join(f"{key}: {value}" for key, value in machine.items()))
        print(format_table(results))
    return 0
