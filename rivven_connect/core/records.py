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

``EncodedRecords`` is the batch-level form (docs/connect.md "The encoded path"): records of
one table already as the bytes the producer takes (key, value, headers, timestamp), with
no ``Record`` per row. A source may return them only when the runtime asked it to
(``use_encoded_records``: nothing per-record is configured, ``routing.encoded_path_allowed``):
then every record of a block goes where its table goes, so the cycle routes and admits a
block once and the driver queues it with one producer call. ``position`` is the last
record's (a block ends on the boundary a source may commit at), ``first_position`` the
first's (the replay filter keeps or drops a block whole). ``encode_payload`` is the one
way a key or value becomes bytes on either path, so the two agree byte for byte.
"""

from __future__ import annotations

import json
import json.encoder
from typing import Any

import attrs

__all__ = ["Destination", "EncodedRecords", "Header", "Record", "encode_payload"]

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

    #: Records this stands for (``EncodedRecords``: its rows).
    record_count = 1

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


@attrs.frozen
class EncodedRecords:
    """Records of one table in their wire form (see the module docstring). The lists are
    parallel, one entry per record, never empty; not copied, never changed after."""

    schema: str | None
    table: str | None
    keys: list[bytes | None]
    values: list[bytes | None]
    headers: list[tuple[Header, ...]]
    timestamps_ms: list[int]
    position: Any
    first_position: Any
    #: Changes per op among them (tombstones not counted), for the source's metrics.
    op_counts: tuple[tuple[str, int], ...] = ()
    destination: Destination | None = None
    #: (Never a heartbeat: the cycle reads this of every polled item.)
    position_only = False

    def __attrs_post_init__(self) -> None:
        count = len(self.keys)
        assert count > 0 and len(self.values) == len(self.headers) == count
        assert len(self.timestamps_ms) == count and self.position is not None

    @property
    def record_count(self) -> int:
        return len(self.keys)

    def with_destination(self, destination: Destination | None) -> EncodedRecords:
        return attrs.evolve(self, destination=destination)

    def slices(self, records_max: int) -> list[EncodedRecords]:
        """This block as blocks of at most ``records_max`` records, in order (itself when it
        is no larger; the slices keep its positions: they are for sending, not committing)."""
        assert records_max > 0
        count = len(self.keys)
        if count <= records_max:
            return [self]
        return [attrs.evolve(self, keys=self.keys[at:at + records_max],
                             values=self.values[at:at + records_max],
                             headers=self.headers[at:at + records_max],
                             timestamps_ms=self.timestamps_ms[at:at + records_max])
                for at in range(0, count, records_max)]


#: ``json.dumps`` with these options builds an encoder per call (~1 us; twice a record).
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
#: ``JSONEncoder.encode`` still makes its C encoder per call (~0.7 us): made once here,
#: exactly as ``iterencode`` makes it for ``_JSON`` (no circular check: records are trees).
_C_ENCODER = None if json.encoder.c_make_encoder is None else json.encoder.c_make_encoder(
    None, _JSON.default, json.encoder.encode_basestring, None, ":", ",", False, False, True)


def encode_json(value: Any) -> str:
    """``value`` as compact JSON text, non-ASCII kept (``_JSON.encode``). Raises
    ``TypeError`` for what JSON cannot hold."""
    if _C_ENCODER is None or isinstance(value, str):
        return _JSON.encode(value)
    return "".join(_C_ENCODER(value, 0))


def encode_payload(value: Any) -> bytes | None:
    """A record key or value as bytes: bytes as is, text as UTF-8, the rest as compact JSON
    (non-ASCII kept as UTF-8). Raises ``TypeError`` for what JSON cannot hold."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return encode_json(value).encode()
