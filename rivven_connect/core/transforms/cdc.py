"""``ExtractNewRecordState``: Debezium's "unwrap" of the CDC envelope into the row itself.

A CDC source's value is the envelope of CONTRACT.md: ``{before, after, source: {connector, db,
schema, table, lsn, txId, ts_ms, snapshot}, op: c|u|d|r, ts_ms}``, and after each delete the
source emits a tombstone (same key, value ``None``) for compaction. Sinks and plain consumers
want the row. This transform turns

- a create/update/read envelope into its ``after`` row (plus ``add_fields`` metadata);
- a delete envelope, per ``delete_handling``: ``drop`` (gone), ``tombstone`` (value ``None``,
  key kept: the compaction delete marker) or ``rewrite`` (the ``before`` row plus
  ``__deleted: true``; in ``rewrite`` mode other rows carry ``__deleted: false``, as Debezium);
- an incoming tombstone: dropped when ``drop_tombstones`` (default, so the default
  ``tombstone`` mode yields exactly one tombstone per delete), else passed on.

A value that is not an envelope (an object without ``op`` and ``after``: a heartbeat, an
already unwrapped row) passes unchanged, as in Debezium. ``Record.op``/``table``/``schema``
are kept, so later predicates still see the operation. ``add_fields`` copies envelope
metadata into the row under ``add_fields_prefix`` (default ``__``): ``op`` and ``ts_ms`` from
the envelope, ``connector``, ``db``, ``schema``, ``table``, ``lsn``, ``txId``, ``snapshot`` from
``source``, and ``source.ts_ms`` (as ``__source_ts_ms``); a missing one is ``null``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from rivven_connect.core.records import Record
from rivven_connect.core.transforms import options as opt
from rivven_connect.core.transforms.errors import TransformConfigError

__all__ = ["ENVELOPE_FIELDS", "SOURCE_FIELDS", "ExtractNewRecordState", "is_envelope"]

#: Metadata ``add_fields`` can copy from the envelope's top level and from its ``source``.
ENVELOPE_FIELDS = ("op", "ts_ms")
SOURCE_FIELDS = ("connector", "db", "schema", "table", "lsn", "txId", "snapshot", "ts_ms")
DELETED_FIELD = "__deleted"


def is_envelope(value: Any) -> bool:
    """Whether ``value`` looks like a CDC envelope (an object with ``op`` and ``after``)."""
    return isinstance(value, dict) and "op" in value and "after" in value


def _field_names(raw: Any, where: str) -> tuple[str, ...]:
    names = opt.text_list(raw, where)
    known = (*ENVELOPE_FIELDS, *(f"source.{name}" for name in SOURCE_FIELDS),
             *(name for name in SOURCE_FIELDS if name not in ENVELOPE_FIELDS))
    for i, name in enumerate(names):
        if name not in known:
            raise TransformConfigError(f"{where}[{i}]", f"unknown field {name!r}; known: "
                                       f"{', '.join(known)}" + opt.did_you_mean(name, known))
    return names


def _metadata(envelope: dict, name: str) -> Any:
    if name in ENVELOPE_FIELDS:
        return envelope.get(name)
    source = envelope.get("source")
    if not isinstance(source, dict):
        return None
    return source.get(name.removeprefix("source."))


@attrs.frozen
class ExtractNewRecordState:
    """Unwrap CDC envelopes into rows (see the module docstring)."""

    TYPE: ClassVar[str] = "ExtractNewRecordState"
    delete_handling: str = "tombstone"
    drop_tombstones: bool = True
    add_fields: tuple[str, ...] = ()
    add_fields_prefix: str = "__"

    @classmethod
    def from_options(cls, options: opt.Options) -> ExtractNewRecordState:
        """Options ``delete_handling`` (``drop``/``tombstone``/``rewrite``),
        ``drop_tombstones`` (bool), ``add_fields`` (names), ``add_fields_prefix``."""
        return cls(
            delete_handling=options.optional(
                "delete_handling", opt.choice("drop", "tombstone", "rewrite"), "tombstone"),
            drop_tombstones=options.optional("drop_tombstones", opt.boolean, True),
            add_fields=options.optional("add_fields", _field_names, ()),
            add_fields_prefix=options.optional("add_fields_prefix", opt.any_text, "__"),
        )

    def apply(self, record: Record) -> Record | None:
        """The unwrapped record, a tombstone, or ``None`` (dropped).

        Raises ``TypeError`` when the row (``after``, or ``before`` of a rewritten delete) is
        neither an object nor ``null``, ``ValueError`` when a non-delete has no ``after``."""
        value = record.value
        if value is None:
            return None if self.drop_tombstones else record
        if not is_envelope(value):
            return record
        if value["op"] == "d":
            if self.delete_handling == "drop":
                return None
            if self.delete_handling == "tombstone":
                return attrs.evolve(record, value=None)
            row = _row(value.get("before"), "before") or {}
        else:
            row = _row(value["after"], "after")
            if row is None:
                raise ValueError(f"a change with op {value['op']!r} has no after row")
        for name in self.add_fields:
            row[self.add_fields_prefix + name.replace(".", "_")] = _metadata(value, name)
        if self.delete_handling == "rewrite":
            row[DELETED_FIELD] = value["op"] == "d"
        return attrs.evolve(record, value=row)


def _row(raw: Any, name: str) -> dict | None:
    """A fresh copy of the row ``raw`` (``None`` stays ``None``)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise TypeError(f"the envelope's {name} is a {type(raw).__name__}, not an object")
    return dict(raw)
