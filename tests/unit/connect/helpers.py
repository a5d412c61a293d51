"""Shared builders for the transform tests: CDC envelopes and one-transform runs."""

from __future__ import annotations

from typing import Any

from rivven_connect.core.records import Record
from rivven_connect.core.transforms import build_chain

PATH = "sources.shop.transforms"


def envelope(op: str, *, before: Any = None, after: Any = None, table: str = "orders",
             schema: str = "public") -> dict:
    """A CONTRACT.md CDC envelope."""
    return {
        "before": before,
        "after": after,
        "source": {"connector": "postgres-cdc", "db": "shop", "schema": schema,
                   "table": table, "lsn": "0/16B3748", "txId": 771, "ts_ms": 1_700_000_000_000,
                   "snapshot": "false"},
        "op": op,
        "ts_ms": 1_700_000_000_123,
    }


def cdc_record(op: str, *, before: Any = None, after: Any = None, table: str = "orders",
               schema: str = "public", **fields: Any) -> Record:
    """A record as a CDC source makes it."""
    return Record(envelope(op, before=before, after=after, table=table, schema=schema),
                  table=table, schema=schema, op=op, **fields)


def run(spec: dict, record: Record) -> Record | None:
    """``record`` through a chain of the one transform ``spec``."""
    return build_chain([spec], path=PATH).apply(record)
