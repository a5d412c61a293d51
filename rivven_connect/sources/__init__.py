"""Sources: where a connector's records come from (docs/connect.md "Sources").

A source is an object the trio driver owns, one per configured source. It knows nothing of
the batch cycle, the producer or the offsets topic; it only

- ``resume(position)`` — start after ``position`` (the committed position the driver read
  from ``__connect_offsets``; ``None``: from the beginning). Called once, before ``poll``;
- ``await poll(max_records)`` — the next records in order, each with its ``position``
  (at most ``max_records``; may wait for some; ``None`` when a finite source is exhausted);
- ``await side_effect(position)`` — the post-commit step for everything up to ``position``
  (a slot advance, a marker file; nothing for most). Run only for committed positions,
  maybe more than once for the same position (it must be idempotent);
- ``position_key(position)`` — orders positions (the cycle drops replays with it);
- ``close()``;
- optionally ``metrics()`` — the source's own ``http_api.Metric``s (postgres-cdc: its slot's
  retained WAL, the replication lag, changes per table and op), read by the HTTP API; never
  blocks, never raises;
- optionally ``await prepare_poll(max_records)`` — called by the driver while a batch's
  transaction commits (never beside ``poll`` or ``side_effect``, never after a stop is
  asked): read and build what the next ``poll`` returns, at most one poll's worth, without
  waiting for new data; nothing it prepares may be visible outside the source before that
  poll returns it. Never raises: an error is kept and raised by the next ``poll``. Not for
  a source whose next poll depends on the side effect (``postgres-outbox-poll``);
- optionally ``await poll_ready(max_records)`` — what ``poll`` would return now without
  waiting for new data, at most ``max_records`` records (maybe none; never ``None``). Its
  presence is a promise that a position's side effect covers every earlier position, so the
  batch cycle may gather several polls into one transaction and commit only the last
  position (``sources.NAME.transaction``; docs/connect.md "One transaction, several
  polls"). ``datagen``, ``file`` and ``postgres-cdc`` have it; ``postgres-outbox-poll``,
  whose positions name the rows of one poll, does not (``build_source`` refuses
  ``boundary: interval`` for it);
- optionally ``use_encoded_records()`` — called once, before the first ``poll``, when nothing
  per-record is configured (``routing.encoded_path_allowed``): ``poll`` may then return
  ``EncodedRecords`` blocks among its records (docs/connect.md "The encoded path").

``build_source(config)`` checks the connector's own ``config`` block and raises
``ConnectConfigError`` naming ``sources.NAME.config.OPTION``; it does no I/O, so a bad file
is reported before the broker is contacted.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol

from rivven_connect.core.batch_cycle import batch_records_max
from rivven_connect.core.config import ConnectConfigError, SourceConfig
from rivven_connect.core.records import Record

__all__ = ["Source", "SourceError", "build_source", "CONNECTORS", "poll_records_default"]

#: Records per poll unless the source's ``batch_size`` says otherwise.
poll_records_default = 500
#: The largest ``batch_size`` a source may ask for (one transaction's records).
poll_records_max = min(10_000, batch_records_max)


class SourceError(Exception):
    """The source cannot go on (unreadable data, a vanished file). Stops the source."""


class Source(Protocol):
    def resume(self, position: Any) -> None: ...

    async def poll(self, max_records: int) -> list[Record] | None: ...

    async def side_effect(self, position: Any) -> None: ...

    def position_key(self, position: Any) -> Any: ...

    def close(self) -> None: ...


class Options:
    """Typed reads of a connector's ``config`` block; unknown keys are refused."""

    def __init__(self, raw: Mapping[str, Any], path: str, known: tuple[str, ...]) -> None:
        self.raw, self.path = raw, path
        for key in raw:
            if key not in known:
                raise ConnectConfigError(f"{path}.{key}",
                                         f"unknown option; known: {', '.join(known)}")

    def int(self, key: str, default: int | None, low: int, high: int) -> int | None:
        """An integer option; decimal text counts (``${ENV}`` substitutes text)."""
        value = self.raw.get(key, default)
        if value is None:
            return None
        if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ConnectConfigError(f"{self.path}.{key}",
                                     f"must be an integer in [{low}, {high}], not {value!r}")
        return value

    def number(self, key: str, low: float, high: float) -> float | None:
        value = self.raw.get(key)
        if value is None:
            return None
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                low <= value <= high):
            raise ConnectConfigError(f"{self.path}.{key}",
                                     f"must be a number in [{low}, {high}], not {value!r}")
        return float(value)

    def bool(self, key: str, default: bool) -> bool:
        value = self.raw.get(key, default)
        if not isinstance(value, bool):
            raise ConnectConfigError(f"{self.path}.{key}", f"must be true or false, not {value!r}")
        return value

    def string(self, key: str) -> str:
        value = self.raw.get(key)
        if not isinstance(value, str) or not value:
            raise ConnectConfigError(f"{self.path}.{key}", "is required (a non-empty string)")
        return value

    def batch_size(self) -> int:
        size = self.int("batch_size", poll_records_default, 1, poll_records_max)
        assert size is not None
        return size


def build_source(config: SourceConfig) -> Source:
    """The source of ``config``. Raises ``ConnectConfigError``; does no I/O."""
    from rivven_connect.sources.datagen import DatagenSource
    from rivven_connect.sources.file import FileSource
    from rivven_connect.sources.postgres_cdc import PostgresCdcSource
    from rivven_connect.sources.postgres_outbox_poll import PostgresOutboxPollSource

    path = f"sources.{config.name}.config"
    source: Source
    if config.connector == "datagen":
        source = DatagenSource.from_config(config.config, path)
    elif config.connector == "file":
        source = FileSource.from_config(config.config, path)
    elif config.connector == "postgres-cdc":
        source = PostgresCdcSource.from_config(config.config, path)
    elif config.connector == "postgres-outbox-poll":
        source = PostgresOutboxPollSource.from_config(config.config, path)
    else:
        raise ConnectConfigError(f"sources.{config.name}.connector",
                                 f"connector {config.connector!r} is not available in this "
                                 f"build; available: {', '.join(CONNECTORS)}")
    if config.transaction is not None and not hasattr(source, "poll_ready"):
        raise ConnectConfigError(
            f"sources.{config.name}.transaction.boundary",
            f"'interval' gathers several polls into one transaction and commits the last "
            f"position, which {config.connector} cannot do (its positions name one poll's "
            f"rows); use boundary: poll")
    return source


CONNECTORS = ("datagen", "file", "postgres-cdc", "postgres-outbox-poll")
