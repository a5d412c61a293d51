"""A decoded ``Transaction`` -> ``Record``s in the CDC envelope of CONTRACT.md.

Theory of operation: pure. ``EnvelopeBuilder.records(transaction, now_ms)`` walks the
changes in order and makes, per change:

- Insert -> ``c``; Update -> ``u``; Delete -> ``d`` and then a tombstone (value ``None``,
  same key), so a compacted topic forgets the row;
- an Update whose primary key changed -> ``d`` (old key) + tombstone + ``c`` (new key); the
  ``d`` and the tombstone carry header ``rivven.cdc.pk_change.new_key``, the ``c`` carries
  ``rivven.cdc.pk_change.old_key`` (the other key as JSON);
- Truncate -> one ``t`` record per table (no key, no images); a transactional logical
  message -> one ``m`` record (``message: {prefix, content}`` with base64 content). Both can
  be switched off.

Value: ``{before, after, source: {connector, db, schema, table, lsn, txId, ts_ms, snapshot},
op, ts_ms}``; ``source.lsn`` is the change's WAL position as ``"X/X"`` text, ``source.ts_ms``
the commit time, the outer ``ts_ms`` the ``now_ms`` the driver passes in; ``snapshot`` is
``"false"`` (streamed changes). Images are dicts of column -> value typed by ``values.py``.

Images and replica identity: under DEFAULT (or INDEX) Postgres sends no old row for an
update (``before`` is null) and only the key columns for a delete (``before`` holds just
those). Under FULL it sends the whole old row. Its key flags then mark *every* column, so
the primary key of a FULL table must be given (``key_columns``; the driver reads it from
the catalog) or the table is refused with ``EnvelopeError``.

Unchanged TOAST (kind ``u``: a large value the update did not touch, not sent): never
null. The value is copied from the old row when Postgres sent one (FULL), else it is
``UNAVAILABLE_VALUE`` and header ``rivven.cdc.unavailable_columns`` lists the columns
(JSON array).

Identity and position: each record of a transaction gets ``seq`` 0, 1, 2, ... (tombstones
and primary-key-change parts count), header ``rivven.cdc.id = "{commit_lsn}:{seq}"`` (stable
across replays) and ``position = CdcPosition(end_lsn, commit_lsn, seq, last)``; only a
``last`` position is a whole transaction, the point where a source may commit and resume.

Schema changes: every record of a table (snapshot rows, changes, tombstones, truncates)
carries header ``rivven.cdc.schema_version``, ``schema_version(relation)``: 16 hex digits
of a SHA-256 over the table's columns in order (name, type oid, type modifier — not the
replica-identity flags, so a snapshot row and a streamed change of the same table agree).
Postgres sends a new Relation message before the first change after DDL; the changes after
it carry the new column set and a new version, so a consumer sees the switch as the
header changing between two records of one table (docs/connect-postgres.md "Schema
changes"). A pure function of the columns: stable across restarts and replays.
"""

from __future__ import annotations

import base64
import collections
import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from rivven_broker.records.batch import I32, EncodedHeaders, encode_headers
from rivven_connect.core.records import (
    EncodedRecords, Header, Record, encode_json, encode_payload,
)

from .pgoutput import (
    ColumnValue, Delete, Insert, LogicalMessage, Relation, Truncate, Update, format_lsn,
    pg_timestamp_to_unix_ms,
)
from .transactions import Change, Transaction
from .values import decode_value, text_decoder

__all__ = [
    "HEADER_ID",
    "HEADER_PK_CHANGE_NEW_KEY",
    "HEADER_PK_CHANGE_OLD_KEY",
    "HEADER_SCHEMA_VERSION",
    "HEADER_UNAVAILABLE_COLUMNS",
    "UNAVAILABLE_VALUE",
    "CdcPosition",
    "EnvelopeBuilder",
    "EnvelopeError",
    "schema_version",
]

UNAVAILABLE_VALUE = "__rivven_unavailable_value"
HEADER_ID = "rivven.cdc.id"
HEADER_PK_CHANGE_OLD_KEY = "rivven.cdc.pk_change.old_key"
HEADER_PK_CHANGE_NEW_KEY = "rivven.cdc.pk_change.new_key"
HEADER_UNAVAILABLE_COLUMNS = "rivven.cdc.unavailable_columns"
HEADER_SCHEMA_VERSION = "rivven.cdc.schema_version"
#: Relations whose schema version the builder keeps (a Relation per table and DDL).
relation_versions_cached_max = 1024


def schema_version(relation: Relation) -> str:
    """The version of ``relation``'s column set: 16 hex digits, equal for equal columns
    (names, type oids, type modifiers, in order)."""
    text = json.dumps([[column.name, column.type_oid, column.type_modifier]
                       for column in relation.columns], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class EnvelopeError(ValueError):
    """A change that cannot become a record: a tuple that does not fit its Relation, a
    value that is not its type's text, a FULL-identity table without given key columns."""


@attrs.frozen(order=True)
class CdcPosition:
    """Where a record sits in the WAL stream; orders as the stream does."""

    end_lsn: int
    commit_lsn: int
    seq: int
    last: bool  # the transaction's last record: committing here resumes after it


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


@attrs.frozen
class _Image:
    values: dict[str, Any]
    unavailable: tuple[str, ...] = ()


@attrs.frozen
class EnvelopeBuilder:
    """Settings of one source; ``records`` does the work."""

    db: str
    connector: str = "postgres-cdc"
    # (schema, table) -> primary key column names; () means "no key" (key None).
    key_columns: Mapping[tuple[str, str], tuple[str, ...]] = attrs.field(factory=dict)
    emit_truncates: bool = True
    emit_messages: bool = True
    #: ``schema_version`` per Relation object (by identity; the object is kept, so its id
    #: is not reused while cached). Bounded: cleared when full.
    _versions: dict[int, tuple[Relation, bytes, bytes]] = attrs.field(
        factory=dict, init=False, eq=False, repr=False)
    #: ``_key_names`` per Relation object, kept the same way.
    _keys: dict[int, tuple[Relation, tuple[str, ...]]] = attrs.field(
        factory=dict, init=False, eq=False, repr=False)
    #: ``_typers`` per Relation object, kept the same way.
    _typed: dict[int, tuple[Relation, tuple[str, ...], tuple[Any, ...]]] = attrs.field(
        factory=dict, init=False, eq=False, repr=False)

    def records(self, transaction: Transaction, now_ms: int,
                position: Callable[[CdcPosition], Any] | None = None) -> list[Record]:
        """The records of one transaction, in order; each record's position is its
        ``CdcPosition``, or ``position(it)`` when given (the driver's JSON form). Raises
        ``EnvelopeError``."""
        drafts = self._drafts(transaction)
        records = []
        commit_text = format_lsn(transaction.commit_lsn)
        commit_ms = pg_timestamp_to_unix_ms(transaction.commit_ts_us)
        last = len(drafts) - 1
        for seq, (value, key, change, op, relation, headers) in enumerate(drafts):
            at = CdcPosition(transaction.end_lsn, transaction.commit_lsn, seq, seq == last)
            if value is not None:
                value = {**value, "source": self._source(
                    transaction, relation, commit_ms, format_lsn(change.lsn)), "ts_ms": now_ms}
            records.append(Record(
                value, key=key, headers=self._headers(commit_text, seq, relation, headers),
                timestamp_ms=commit_ms, table=relation.name if relation else None,
                schema=relation.schema if relation else None, op=op,
                position=at if position is None else position(at)))
        return records

    def encoded(self, transaction: Transaction, now_ms: int,
                position: Callable[[CdcPosition], Any]) -> list[EncodedRecords]:
        """The records of one transaction as ``records`` makes them, already encoded
        (``encode_payload`` of each key and value, byte for byte), one block per run of
        records of one table, in order (the encoded path: docs/connect.md). Raises
        ``EnvelopeError``."""
        drafts = self._drafts(transaction)
        commit_text = format_lsn(transaction.commit_lsn)
        commit_ms = pg_timestamp_to_unix_ms(transaction.commit_ts_us)
        now_text = str(now_ms)
        last = len(drafts) - 1
        blocks: list[EncodedRecords] = []
        run: _Run | None = None
        for seq, (value, key, change, op, relation, headers) in enumerate(drafts):
            if run is None or relation is not run.relation:
                if run is not None:
                    blocks.append(run.block(transaction, seq - 1, last, position))
                run = _Run(relation, self._source_json(transaction, relation, commit_ms),
                           seq)
            if value is not None:  # {**value, "source": ..., "ts_ms": ...} as JSON
                head, tail = run.source_json
                run.values.append(f"{encode_json(value)[:-1]},\"source\":{head}"
                                  f"{format_lsn(change.lsn)}{tail},\"ts_ms\":{now_text}}}"
                                  .encode())
                if relation is not None:  # (as ``count_events`` counts records)
                    run.ops[op] += 1
            else:
                run.values.append(None)
            run.keys.append(encode_payload(key))
            run.headers.append(self._encoded_headers(commit_text, seq, relation, headers))
            run.timestamps_ms.append(commit_ms)
        if run is not None:
            blocks.append(run.block(transaction, last, last, position))
        return blocks

    def _drafts(self, transaction: Transaction) -> list[tuple[Any, Any, Change, str | None,
                                                               Relation | None, list[Header]]]:
        """Per record of ``transaction``: (value without ``source``/``ts_ms`` or None for a
        tombstone, key, change, op, relation, headers after the id and schema version)."""
        drafts: list[tuple[Any, Any, Change, str | None, Relation | None, list[Header]]] = []
        for change in transaction.changes:
            drafts.extend(self._change(change))
        return drafts

    def _headers(self, commit_text: str, seq: int, relation: Relation | None,
                 headers: list[Header]) -> tuple[Header, ...]:
        cdc_id = f"{commit_text}:{seq}".encode()
        if relation is None:
            return ((HEADER_ID, cdc_id), *headers)
        return ((HEADER_ID, cdc_id), (HEADER_SCHEMA_VERSION, self._version(relation)),
                *headers)

    def _encoded_headers(self, commit_text: str, seq: int, relation: Relation | None,
                         headers: list[Header]) -> EncodedHeaders:
        """``_headers`` in their wire form (``EncodedHeaders``): the id's bytes and the
        schema version's field (kept per Relation) joined, with no pairs per record."""
        if headers:  # a primary-key change or unavailable columns: rare, encoded as pairs
            return EncodedHeaders(*encode_headers(self._headers(commit_text, seq, relation,
                                                                headers)))
        cdc_id = f"{commit_text}:{seq}".encode()
        if relation is None:
            return EncodedHeaders(b"".join((_ID_FIELD_HEAD, I32.pack(len(cdc_id)), cdc_id)), 1)
        return EncodedHeaders(b"".join((_ID_FIELD_HEAD, I32.pack(len(cdc_id)), cdc_id,
                                        self._version_field(relation))), 2)

    def _source_json(self, transaction: Transaction, relation: Relation | None,
                     commit_ms: int) -> tuple[str, str]:
        """``_source`` of a change of ``relation`` in ``transaction`` as JSON, split where
        the change's LSN text goes: the same object as the records' (one ``_source``), so the
        encoded values cannot drift from them."""
        text = encode_json(self._source(transaction, relation, commit_ms, _LSN_PLACEHOLDER))
        head, tail = text.split(encode_json(_LSN_PLACEHOLDER))  # (one: no name holds a NUL)
        return head + '"', '"' + tail  # an LSN's text needs no escaping

    def _version(self, relation: Relation) -> bytes:
        """``schema_version(relation)`` as bytes, computed once per Relation object (it is
        a SHA-256 over the columns: the same for every record of the table)."""
        return self._versions_of(relation)[1]

    def _version_field(self, relation: Relation) -> bytes:
        """The schema version header as ``encode_headers`` writes it (name and value with
        their lengths), once per Relation object."""
        return self._versions_of(relation)[2]

    def _versions_of(self, relation: Relation) -> tuple[Relation, bytes, bytes]:
        cached = self._versions.get(id(relation))
        if cached is None or cached[0] is not relation:
            if len(self._versions) >= relation_versions_cached_max:
                self._versions.clear()
            version = schema_version(relation).encode()
            cached = (relation, version,
                      encode_headers(((HEADER_SCHEMA_VERSION, version),))[0])
            self._versions[id(relation)] = cached
        return cached

    def snapshot_record(self, relation: Relation, row: tuple[ColumnValue, ...],
                        consistent_lsn: int, seq: int, snapshot: str, position: Any,
                        now_ms: int) -> Record:
        """One row read by a snapshot -> an ``r`` record (``before`` null, ``after`` the
        row typed as streamed rows are; ``source.snapshot`` is ``"true"`` or ``"last"``
        (``"incremental"`` for a chunk of an incremental snapshot), ``source.lsn`` the
        snapshot's consistent LSN (the chunk's low watermark), ``txId`` null; header
        ``rivven.cdc.id = "{consistent_lsn}:r:{seq}"``). Raises ``EnvelopeError``."""
        assert snapshot in ("true", "last", "incremental"), snapshot
        after = self._image(relation, row)
        key = _key(after.values, self._key_names(relation))
        value = self._snapshot_value(relation, after.values, consistent_lsn, snapshot, now_ms)
        return Record(value, key=key, headers=self._snapshot_headers(
            relation, format_lsn(consistent_lsn), seq), timestamp_ms=now_ms,
            table=relation.name, schema=relation.schema, op="r", position=position)

    def encoded_snapshot(self, relation: Relation, afters: list[str], keys: list[str],
                         consistent_lsn: int, first_seq: int, done: bool,
                         first_position: Any, position: Any, now_ms: int) -> EncodedRecords:
        """``snapshot_record``'s records of consecutive rows of ``relation``, encoded, from
        their ``after`` images and keys as JSON texts Postgres wrote (``values_sql``: the
        same bytes as the typed values' JSON); ``source.snapshot`` is ``"true"``, and
        ``"last"`` for the final row when ``done``. The snapshot's encoded path."""
        count = len(afters)
        assert count and len(keys) == count
        head, tail = self._snapshot_value_json(relation, consistent_lsn, "true", now_ms)
        values = [f"{head}{after}{tail}".encode() for after in afters]
        if done:
            head, tail = self._snapshot_value_json(relation, consistent_lsn, "last", now_ms)
            values[-1] = f"{head}{afters[-1]}{tail}".encode()
        # The headers in their wire form: the id's bytes between two fields kept as bytes.
        head, version, pack = _ID_FIELD_HEAD, self._version_field(relation), I32.pack
        lsn_text = format_lsn(consistent_lsn)
        ids = [f"{lsn_text}:r:{seq}".encode() for seq in range(first_seq, first_seq + count)]
        headers = [EncodedHeaders(b"".join((head, pack(len(cdc_id)), cdc_id, version)), 2)
                   for cdc_id in ids]
        return EncodedRecords(relation.schema, relation.name, [key.encode() for key in keys],
                              values, headers, [now_ms] * count, position, first_position,
                              (("r", count),))

    def _snapshot_value(self, relation: Relation, after: Any, consistent_lsn: int,
                        snapshot: str, now_ms: int) -> dict[str, Any]:
        source = {"connector": self.connector, "db": self.db, "schema": relation.schema,
                  "table": relation.name, "lsn": format_lsn(consistent_lsn), "txId": None,
                  "ts_ms": now_ms, "snapshot": snapshot}
        return {"before": None, "after": after, "op": "r", "source": source, "ts_ms": now_ms}

    def _snapshot_value_json(self, relation: Relation, consistent_lsn: int, snapshot: str,
                             now_ms: int) -> tuple[str, str]:
        """``_snapshot_value`` as JSON, split where the ``after`` image goes (one
        ``_snapshot_value`` for both paths)."""
        text = encode_json(self._snapshot_value(relation, _AFTER_PLACEHOLDER, consistent_lsn,
                                                snapshot, now_ms))
        head, tail = text.split(encode_json(_AFTER_PLACEHOLDER))  # (no name holds a NUL)
        return head, tail

    def _snapshot_headers(self, relation: Relation, lsn_text: str, seq: int
                          ) -> tuple[Header, ...]:
        return ((HEADER_ID, f"{lsn_text}:r:{seq}".encode()),
                (HEADER_SCHEMA_VERSION, self._version(relation)))

    def _source(self, transaction: Transaction, relation: Relation | None, commit_ms: int,
                lsn_text: str) -> dict[str, Any]:
        return {"connector": self.connector, "db": self.db,
                "schema": relation.schema if relation else None,
                "table": relation.name if relation else None,
                "lsn": lsn_text, "txId": transaction.xid, "ts_ms": commit_ms,
                "snapshot": "false"}

    def _change(self, change: Change) -> list:
        message = change.message
        if isinstance(message, Truncate):
            if not self.emit_truncates:
                return []
            return [({"before": None, "after": None, "op": "t"}, None, change, "t", relation, [])
                    for relation in change.relations]
        if isinstance(message, LogicalMessage):
            if not self.emit_messages:
                return []
            body = {"prefix": message.prefix,
                    "content": base64.b64encode(message.content).decode("ascii")}
            return [({"before": None, "after": None, "op": "m", "message": body},
                     {"prefix": message.prefix}, change, "m", None, [])]
        relation = change.relation
        names = self._key_names(relation)
        if isinstance(message, Insert):
            after = self._image(relation, message.new)
            return [self._draft("c", None, after, names, change, [])]
        if isinstance(message, Delete):
            before = self._old_image(relation, message.key, message.old, names)
            return self._delete(before, names, change, [])
        assert isinstance(message, Update), message
        before = self._old_image(relation, message.key, message.old, names)
        after = self._image(relation, message.new, before if message.old else None)
        new_key = _key(after.values, names)
        old_key = _key(before.values, names) if before is not None else new_key
        if old_key == new_key:
            return [self._draft("u", before if message.old else None, after, names, change, [])]
        deleted = self._delete(before, names, change,
                               [(HEADER_PK_CHANGE_NEW_KEY, _json_bytes(new_key))])
        created = self._draft("c", None, after, names, change,
                              [(HEADER_PK_CHANGE_OLD_KEY, _json_bytes(old_key))])
        return [*deleted, created]

    def _delete(self, before: _Image | None, names: tuple[str, ...], change: Change,
                headers: list[Header]) -> list:
        assert before is not None  # pgoutput always sends a key or old tuple for a delete
        draft = self._draft("d", before, None, names, change, headers)
        key = draft[1]
        if key is None:
            return [draft]
        return [draft, (None, key, change, "d", change.relation, list(headers))]

    def _draft(self, op: str, before: _Image | None, after: _Image | None,
               names: tuple[str, ...], change: Change, headers: list[Header]) -> tuple:
        keyed = after if after is not None else before
        assert keyed is not None
        unavailable = sorted({*(before.unavailable if before else ()),
                              *(after.unavailable if after else ())}) if (
            (before is not None and before.unavailable)
            or (after is not None and after.unavailable)) else None
        if unavailable:
            headers = [*headers, (HEADER_UNAVAILABLE_COLUMNS, _json_bytes(unavailable))]
        value = {"before": before.values if before else None,
                 "after": after.values if after else None, "op": op}
        return (value, _key(keyed.values, names), change, op, change.relation, headers)

    def _key_names(self, relation: Relation) -> tuple[str, ...]:
        """The key columns of ``relation`` (``_key_names_checked``), once per Relation
        object."""
        cached = self._keys.get(id(relation))
        if cached is None or cached[0] is not relation:
            if len(self._keys) >= relation_versions_cached_max:
                self._keys.clear()
            cached = (relation, self._key_names_checked(relation))  # (raises: not cached)
            self._keys[id(relation)] = cached
        return cached[1]

    def _key_names_checked(self, relation: Relation) -> tuple[str, ...]:
        given = self.key_columns.get((relation.schema, relation.name))
        if given is None:
            if relation.replica_identity == "f":
                raise EnvelopeError(
                    f"{relation.schema}.{relation.name} has REPLICA IDENTITY FULL: its "
                    f"primary key columns must be given (key_columns)")
            return tuple(column.name for column in relation.columns if column.key)
        known = {column.name for column in relation.columns}
        missing = [name for name in given if name not in known]
        if missing:
            raise EnvelopeError(f"{relation.schema}.{relation.name} has no key column "
                                f"{missing[0]!r}")
        return tuple(given)

    def _old_image(self, relation: Relation, key: tuple[ColumnValue, ...] | None,
                   old: tuple[ColumnValue, ...] | None, names: tuple[str, ...]
                   ) -> _Image | None:
        if old is not None:
            return self._image(relation, old)
        if key is None:
            return None
        image = self._image(relation, key)
        flagged = {column.name for column in relation.columns if column.key}
        return _Image({name: value for name, value in image.values.items()
                       if name in flagged or name in names})

    def _image(self, relation: Relation, tuple_: tuple[ColumnValue, ...],
               previous: _Image | None = None) -> _Image:
        names, decoders = self._typers(relation)
        if len(tuple_) != len(names):
            raise EnvelopeError(
                f"{relation.schema}.{relation.name}: tuple has {len(tuple_)} columns, the "
                f"Relation {len(relation.columns)}")
        values: dict[str, Any] = {}
        unavailable = None
        for name, decode, value in zip(names, decoders, tuple_):
            kind = value.kind
            if kind == "t":  # (the common case first: one typed call, no other test)
                try:
                    values[name] = decode(value.data)
                except ValueError as error:
                    raise self._value_error(relation, name, error) from None
            elif kind == "n":
                values[name] = None
            elif kind == "u":
                old = previous.values.get(name, UNAVAILABLE_VALUE) if previous else \
                    UNAVAILABLE_VALUE
                if old == UNAVAILABLE_VALUE:
                    unavailable = [*(unavailable or ()), name]
                values[name] = old
            else:
                assert value.data is not None
                try:
                    values[name] = decode_value(0, kind, value.data)  # (binary: any type)
                except ValueError as error:
                    raise self._value_error(relation, name, error) from None
        return _Image(values, tuple(unavailable) if unavailable else ())

    def _typers(self, relation: Relation) -> tuple[tuple[str, ...], tuple[Any, ...]]:
        """``relation``'s column names and, per column, the function that types its text
        (``values.text_decoder``), once per Relation object."""
        cached = self._typed.get(id(relation))
        if cached is None or cached[0] is not relation:
            if len(self._typed) >= relation_versions_cached_max:
                self._typed.clear()
            cached = (relation, tuple(column.name for column in relation.columns),
                      tuple(text_decoder(column.type_oid) for column in relation.columns))
            self._typed[id(relation)] = cached
        return cached[1], cached[2]

    @staticmethod
    def _value_error(relation: Relation, name: str, error: ValueError) -> EnvelopeError:
        type_oid = next(column.type_oid for column in relation.columns if column.name == name)
        return EnvelopeError(f"{relation.schema}.{relation.name}.{name} (type oid "
                             f"{type_oid}): {error}")


#: The id header's name as ``encode_headers`` writes it (its value's length and bytes follow).
_ID_FIELD_HEAD = I32.pack(len(HEADER_ID.encode())) + HEADER_ID.encode()

#: Stand for a change's LSN text in ``_source_json`` and a snapshot row's ``after`` image in
#: ``_snapshot_value_json`` (no name or LSN text holds a NUL).
_LSN_PLACEHOLDER = "\x00lsn\x00"
_AFTER_PLACEHOLDER = "\x00after\x00"


@attrs.define
class _Run:
    """The records of one table being collected into a block (``EnvelopeBuilder.encoded``)."""

    relation: Relation | None
    source_json: tuple[str, str]
    first_seq: int
    keys: list[bytes | None] = attrs.Factory(list)
    values: list[bytes | None] = attrs.Factory(list)
    headers: list[tuple[Header, ...]] = attrs.Factory(list)
    timestamps_ms: list[int] = attrs.Factory(list)
    ops: collections.Counter[str] = attrs.Factory(collections.Counter)

    def block(self, transaction: Transaction, last_seq: int, transaction_last: int,
              position: Callable[[CdcPosition], Any]) -> EncodedRecords:
        relation = self.relation
        end, commit = transaction.end_lsn, transaction.commit_lsn
        return EncodedRecords(
            relation.schema if relation else None, relation.name if relation else None,
            self.keys, self.values, self.headers, self.timestamps_ms,
            position(CdcPosition(end, commit, last_seq, last_seq == transaction_last)),
            position(CdcPosition(end, commit, self.first_seq,
                                 self.first_seq == transaction_last)),
            tuple(sorted(self.ops.items())))


def _key(values: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any] | None:
    if len(names) == 1:  # the common case, without a comprehension's frame
        name = names[0]
        return {name: values.get(name)}
    return {name: values.get(name) for name in names} if names else None
