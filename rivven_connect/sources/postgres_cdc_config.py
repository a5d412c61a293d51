"""``postgres-cdc``: the source's ``config`` block, checked (docs/connect-postgres.md "The
source"; docs/connect.md lists the options).

Theory of operation
-------------------
``parse_config(raw, path)`` checks every option before anything touches Postgres — names
are plain identifiers, the tables ``schema.table`` and listed once, the signal table
outside them, numbers within the limits below, the ``snapshot`` block a known mode with
its chunk size and ``on_interrupted`` — and raises ``ConnectConfigError`` naming the
option. It returns the ``ReplicationSlot`` and the keyword arguments of
``PostgresCdcSource``. No I/O.
"""

from __future__ import annotations

from typing import Any, Mapping

from rivven_connect.pg.reconnect import (
    reconnect_attempts_max_default, reconnect_timeout_ms_default,
)
from rivven_connect.pg.slot import PgConnectConfig, ReplicationSlot, parse_table_name
from rivven_connect.pg.snapshot import (
    ON_INTERRUPTED, SNAPSHOT_MODES, snapshot_chunk_rows_default, snapshot_chunk_rows_max,
)

__all__ = ["heartbeat_interval_ms_default", "heartbeat_interval_ms_max", "parse_config",
           "reconnect_attempts_max_max", "reconnect_timeout_ms_max"]

#: Heartbeats: the default interval, and the largest one accepted (0 = off). Half a second:
#: the slot keeps about one interval of WAL plus a heartbeat's way back while only
#: unpublished tables change (pg/slot.py "Restart points"; 52-53 MB at 45 MB/s of such WAL,
#: docs/performance.md), and a heartbeat is written only when the WAL moved.
heartbeat_interval_ms_default = 500
heartbeat_interval_ms_max = 3_600_000
#: The largest ``reconnect_attempts_max`` and ``reconnect_timeout_ms`` accepted.
reconnect_attempts_max_max = 1000
reconnect_timeout_ms_max = 86_400_000

_OPTIONS = ("host", "port", "database", "user", "password", "slot_name", "publication_name",
            "tables", "snapshot", "batch_size", "status_interval_ms", "heartbeat_interval_ms",
            "reconnect_attempts_max", "reconnect_timeout_ms", "signal_table", "restart_points")


def parse_config(raw: Mapping[str, Any], path: str
                 ) -> tuple[ReplicationSlot, dict[str, Any]]:
    """The slot and the source's keyword arguments. Raises ``ConnectConfigError``."""
    from rivven_connect.core.config import ConnectConfigError
    from rivven_connect.sources import Options

    options = Options(raw, path, _OPTIONS)
    port = options.int("port", 5432, 1, 65535)
    password = raw.get("password")
    if password is not None and not isinstance(password, str):
        raise ConnectConfigError(f"{path}.password", "must be a string")
    names = {}
    for key in ("slot_name", "publication_name"):
        names[key] = options.string(key)
        if parse_table_name(names[key]) != ("public", names[key]) or (
                key == "slot_name" and not names[key].islower()):
            raise ConnectConfigError(
                f"{path}.{key}", f"{names[key]!r} must be an identifier of at most 63 "
                f"letters, digits and _ (a slot name: lower case)")
    tables = _tables(raw.get("tables"), path)
    signal_table = None
    if raw.get("signal_table") is not None:
        text = raw["signal_table"]
        signal_table = parse_table_name(text) if isinstance(text, str) else None
        if signal_table is None or signal_table in tables:
            raise ConnectConfigError(f"{path}.signal_table", f"{text!r} is not schema.table "
                                     f"(plain identifiers) outside tables")
    mode, chunk_rows, on_interrupted = _check_snapshot(raw.get("snapshot"),
                                                       f"{path}.snapshot")
    interval = options.int("status_interval_ms", 10_000, 1000, 60_000)
    heartbeat = options.int("heartbeat_interval_ms", heartbeat_interval_ms_default, 0,
                            heartbeat_interval_ms_max)
    attempts = options.int("reconnect_attempts_max", reconnect_attempts_max_default, 0,
                           reconnect_attempts_max_max)
    outage_ms = options.int("reconnect_timeout_ms", reconnect_timeout_ms_default, 1000,
                            reconnect_timeout_ms_max)
    assert port is not None and interval is not None and heartbeat is not None
    assert attempts is not None and outage_ms is not None
    config = PgConnectConfig(options.string("host"), port, options.string("database"),
                             options.string("user"), password)
    slot = ReplicationSlot(config, names["slot_name"], names["publication_name"], tables,
                           status_interval_s=interval / 1000, signal_table=signal_table,
                           restart_points=options.bool("restart_points", True))
    return slot, {"batch_size": options.batch_size(), "snapshot_mode": mode,
                  "snapshot_chunk_rows": chunk_rows, "snapshot_on_interrupted": on_interrupted,
                  "heartbeat_interval_ms": heartbeat, "reconnect_attempts_max": attempts,
                  "reconnect_timeout_ms": outage_ms}


def _tables(tables: Any, path: str) -> list[tuple[str, str]]:
    from rivven_connect.core.config import ConnectConfigError

    if not isinstance(tables, list) or not tables:
        raise ConnectConfigError(f"{path}.tables", "is required: a non-empty list of "
                                                    "schema.table names")
    parsed: list[tuple[str, str]] = []
    for index, table in enumerate(tables):
        name = parse_table_name(table) if isinstance(table, str) else None
        if name is None:
            raise ConnectConfigError(f"{path}.tables[{index}]",
                                     f"{table!r} is not schema.table (plain identifiers)")
        if name in parsed:
            raise ConnectConfigError(f"{path}.tables[{index}]", f"{table!r} is listed twice")
        parsed.append(name)
    return parsed


def _check_snapshot(snapshot: Any, path: str) -> tuple[str, int, str]:
    from rivven_connect.core.config import ConnectConfigError
    from rivven_connect.sources import Options

    if not isinstance(snapshot, dict) or "mode" not in snapshot:
        raise ConnectConfigError(path, f"is required: {{ mode: M }} with M one of "
                                       f"{', '.join(SNAPSHOT_MODES)}")
    options = Options(snapshot, path, ("mode", "chunk_size", "on_interrupted"))
    mode = snapshot["mode"]
    if mode not in SNAPSHOT_MODES:
        raise ConnectConfigError(f"{path}.mode", f"{mode!r} is not one of "
                                                 f"{', '.join(SNAPSHOT_MODES)}")
    chunk_rows = options.int("chunk_size", snapshot_chunk_rows_default, 1,
                             snapshot_chunk_rows_max)
    assert chunk_rows is not None
    on_interrupted = snapshot.get("on_interrupted", "resume")
    if on_interrupted not in ON_INTERRUPTED:
        raise ConnectConfigError(f"{path}.on_interrupted", f"{on_interrupted!r} is not one "
                                                           f"of {', '.join(ON_INTERRUPTED)}")
    return mode, chunk_rows, on_interrupted
