"""``Record`` and ``Destination``: what flows from a source through transforms and admission
to a topic.

A record is immutable; transforms and routing return new records (``attrs.evolve``). Its
``value`` is structured data (a JSON-able ``dict``; a CDC envelope for database sources) or
``None`` (a tombstone); ``key`` likewise (a CDC key is the row's primary key as a ``dict``).
``table``/``schema``/``op`` are what the source knows of the change (CDC: the row's table
and ``c``/``u``/``d``/``r``; other sources: ``None``) — predicates test them, and they survive
transforms that rewrite the value (``ExtractNewRecordState``). ``destination`` is where the
record goes; ``None`` until a source's routing or a ``Route`` transform sets it (then the
connector's ``topic`` or ``on_missing_destination`` decides). ``position`` is the source's
opaque position of this record (a CDC record's LSN, a file's line offset): the batch cycle
commits the last one with the batch, the core never looks inside. A ``position_only`` record
(a source's heartbeat: "everything up to here is done, nothing to send") carries only a
position: the cycle commits it with the batch's offset record and never transforms, routes or
sends it.
"""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["Destination", "Header", "Record"]

#: A record header: name and value bytes (Kafka's shape; names are not unique).
Header = tuple[str, bytes]


@attrs.frozen
class Destination:
    """Where one record goes: a topic, and optionally its key or partition (else the
    producer's partitioner decides from the record's key)."""

    topic: str
    key: bytes | None = None
    partition: int | None = None


@attrs.frozen
class Record:
    """One record between a source and a topic (see the module docstring)."""

    value: Any
    key: Any = None
    headers: tuple[Header, ...] = ()
    timestamp_ms: int | None = None
    destination: Destination | None = None
    table: str | None = None
    schema: str | None = None
    op: str | None = None
    position: Any = None
    position_only: bool = False

    @classmethod
    def heartbeat(cls, position: Any) -> Record:
        """A position-only record: the batch cycle commits ``position`` and sends nothing."""
        assert position is not None
        return cls(value=None, position=position, position_only=True)

    def with_destination(self, destination: Destination | None) -> Record:
        """This record going to ``destination`` (``attrs.evolve`` without its introspection:
        the runtime does it for every record)."""
        return Record(value=self.value, key=self.key, headers=self.headers,
                      timestamp_ms=self.timestamp_ms, destination=destination,
                      table=self.table, schema=self.schema, op=self.op,
                      position=self.position, position_only=self.position_only)

    def with_header(self, name: str, value: bytes) -> Record:
        """This record with one more header (at the end)."""
        return attrs.evolve(self, headers=(*self.headers, (name, value)))
