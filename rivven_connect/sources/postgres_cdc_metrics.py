"""``postgres-cdc``'s metrics: what ``PostgresCdcSource.metrics()`` reports, built from the
values the source keeps (pure: no I/O, never blocks).

Theory of operation
-------------------
The source counts as it goes (``count_events``: the changes read per configured table and
op) and keeps a few values (the slot's retained WAL, last read on an ordinary connection;
where the stream started; the end of the last transaction read). ``cdc_metrics`` turns them,
the replication link's counters and, once streaming, the incremental snapshot's counters into
``Metric``s for ``/metrics`` (docs/connect-postgres.md, the metrics table):

- ``cdc_retained_wal_bytes`` (gauge, once read): ``pg_current_wal_lsn() - restart_lsn``;
- ``cdc_replication_lag_bytes`` (gauge): WAL bytes between the end of the last transaction
  read and the last one confirmed to the slot (never below where the stream started);
- the link's ``cdc_reconnects`` and ``cdc_reconnect_failures``;
- ``cdc_incremental_chunks{outcome}``, ``cdc_incremental_rows_superseded`` and
  ``cdc_signals{outcome}`` once streaming;
- ``cdc_events{table, op}``: ``table`` is one of the configured tables, a bounded label;
- ``cdc_records_queued{path}``: records queued for the runtime (heartbeats not counted),
  by ``path``: ``encoded`` (``EncodedRecords`` blocks) or ``record`` (``Record``s).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from rivven_connect.core.records import EncodedRecords, Record
from rivven_connect.http_api import Metric

if TYPE_CHECKING:
    import collections

    from rivven_connect.sources.postgres_cdc_incremental import IncrementalRunner

__all__ = ["cdc_metrics", "count_encoded_events", "count_events"]


def count_events(events: collections.Counter[tuple[str, str]],
                 records: Iterable[Record]) -> None:
    """Count the changes among ``records`` by (``schema.table``, op)."""
    for record in records:
        if record.value is not None and record.table is not None and record.op:
            events[(f"{record.schema}.{record.table}", record.op)] += 1


def count_encoded_events(events: collections.Counter[tuple[str, str]],
                         blocks: Iterable[EncodedRecords]) -> None:
    """``count_events`` for blocks (their ``op_counts``)."""
    for block in blocks:
        if block.table is not None:
            table = f"{block.schema}.{block.table}"
            for op, count in block.op_counts:
                events[(table, op)] += count


def cdc_metrics(*, retained_wal_bytes: int | None, confirmed_lsn: int | None,
                received_end_lsn: int | None, stream_from: int,
                link_metrics: Sequence[Metric], incremental: IncrementalRunner | None,
                events: collections.Counter[tuple[str, str]],
                queued_by_path: Mapping[str, int]) -> list[Metric]:
    """The source's gauges and counters (module docstring)."""
    out = []
    if retained_wal_bytes is not None:
        out.append(Metric("cdc_retained_wal_bytes", "gauge",
                          "WAL Postgres keeps for the slot (pg_current_wal_lsn() - "
                          "restart_lsn), read every few seconds.", retained_wal_bytes))
    confirmed_end = None if confirmed_lsn is None else confirmed_lsn + 1
    lag = 0
    if received_end_lsn is not None:
        lag = max(0, received_end_lsn - max(confirmed_end or 0, stream_from))
    out.append(Metric("cdc_replication_lag_bytes", "gauge",
                      "WAL bytes between the end of the last transaction read and the "
                      "last one confirmed to the slot (committed to the broker).", lag))
    out.extend(link_metrics)
    if incremental is not None:
        core = incremental.core
        for outcome, count in (("emitted", core.chunks_emitted),
                               ("read_again", core.chunks_retried)):
            out.append(Metric("cdc_incremental_chunks", "counter",
                              "Incremental snapshot chunks emitted at their high watermark, "
                              "or dropped and read again (a race with a committing "
                              "transaction).", count, (("outcome", outcome),)))
        out.append(Metric("cdc_incremental_rows_superseded", "counter",
                          "Chunk rows not emitted because a streamed change of the key "
                          "fell in the chunk's window.", core.rows_dropped))
        for outcome in ("accepted", "refused"):
            out.append(Metric("cdc_signals", "counter", "Snapshot signals read from the "
                              "stream (refused ones are logged).",
                              incremental.signals[outcome], (("outcome", outcome),)))
    for (table, op), count in sorted(events.items()):
        out.append(Metric("cdc_events", "counter",
                          "Changes read from Postgres, by table (one of the configured "
                          "tables) and op (c, u, d, t, r).", count,
                          (("table", table), ("op", op))))
    for path in ("encoded", "record"):
        out.append(Metric("cdc_records_queued", "counter",
                          "Records queued for the runtime, by path: encoded (blocks of "
                          "records already in wire form) or record (one object each).",
                          queued_by_path.get(path, 0), (("path", path),)))
    return out
