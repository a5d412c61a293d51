"""Predicates: which records a transform applies to, tested on the record's CDC metadata and value.

A predicate spec is a dict of *conditions*, all of which must hold (logical AND), optionally
inverted by ``negate: true``:

- ``table`` / ``schema``: a regular expression or a list of them, each matched against the
  whole of ``Record.table`` / ``Record.schema`` (``re.fullmatch``; a plain name matches itself).
  A record whose table (schema) is ``None`` — not from a database — never matches.
- ``operation``: ``c``, ``u``, ``d``, ``r`` or a list of them, tested against ``Record.op``.
- ``field_exists``: a dotted path that must be present in the value (a JSON ``null`` counts as
  present; a tombstone has no fields).
- ``field_value``: ``{path, equals: V}`` — the field is present and equal to ``V`` (``true`` is
  not ``1``) — or ``{path, matches: REGEX}`` — the field is a string fully matching ``REGEX``
  (numbers are not converted). A missing field never matches.

Paths reach into the record's value as it is when the predicate runs: before an
``ExtractNewRecordState`` a CDC value is the envelope, so write ``after.status``.

In a chain a predicate gates one transform: a record it does not match passes that transform
unchanged (Kafka Connect's semantics). ``Filter`` also uses the same grammar for its ``keep`` /
``drop`` conditions. Predicates are pure and never raise on a record.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from rivven_connect.core.records import Record
from rivven_connect.core.transforms import options as opt
from rivven_connect.core.transforms.errors import TransformConfigError
from rivven_connect.core.transforms.paths import MISSING, Path, get_path

__all__ = ["OPERATIONS", "FieldValue", "Predicate", "parse_predicate"]

#: The CDC operations: create, update, delete, read (snapshot).
OPERATIONS = ("c", "u", "d", "r")


def json_equal(left: Any, right: Any) -> bool:
    """JSON equality: like ``==`` but a boolean equals only a boolean (``true`` is not ``1``)."""
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left == right
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(map(json_equal, left, right))
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(json_equal(left[k], right[k]) for k in left)
    if isinstance(left, (list, dict)) or isinstance(right, (list, dict)):
        return False
    return left == right


@attrs.frozen
class FieldValue:
    """The ``field_value`` condition: the field at ``path`` equals ``equals`` or fully
    matches ``matches`` (exactly one is set)."""

    path: Path
    equals: Any = MISSING
    matches: re.Pattern[str] | None = None

    def test(self, value: Any) -> bool:
        """Whether the condition holds for the record value ``value``."""
        found = get_path(value, self.path)
        if found is MISSING:
            return False
        if self.matches is not None:
            return isinstance(found, str) and self.matches.fullmatch(found) is not None
        return json_equal(found, self.equals)


@attrs.frozen
class Predicate:
    """A conjunction of conditions (``None`` = not tested), inverted when ``negate``."""

    tables: tuple[re.Pattern[str], ...] | None = None
    schemas: tuple[re.Pattern[str], ...] | None = None
    operations: frozenset[str] | None = None
    field_exists: Path | None = None
    field_value: FieldValue | None = None
    negate: bool = False

    def matches(self, record: Record) -> bool:
        """Whether ``record`` satisfies every condition (then inverted if ``negate``)."""
        return self._all_hold(record) != self.negate

    def _all_hold(self, record: Record) -> bool:
        if self.tables is not None and not _any_fullmatch(self.tables, record.table):
            return False
        if self.schemas is not None and not _any_fullmatch(self.schemas, record.schema):
            return False
        if self.operations is not None and record.op not in self.operations:
            return False
        if self.field_exists is not None and get_path(record.value, self.field_exists) is MISSING:
            return False
        return self.field_value is None or self.field_value.test(record.value)


def _any_fullmatch(patterns: tuple[re.Pattern[str], ...], name: str | None) -> bool:
    return name is not None and any(p.fullmatch(name) for p in patterns)


def _patterns(raw: Any, where: str) -> tuple[re.Pattern[str], ...]:
    names = opt.text_list(raw, where)
    return tuple(opt.regex(name, f"{where}[{i}]") for i, name in enumerate(names))


def _operations(raw: Any, where: str) -> frozenset[str]:
    names = opt.text_list(raw, where)
    for i, name in enumerate(names):
        opt.choice(*OPERATIONS)(name, f"{where}[{i}]")
    return frozenset(names)


def _field_value(raw: Any, where: str) -> FieldValue:
    if not isinstance(raw, dict):
        raise TransformConfigError(where, f"must be an object {{path, equals | matches}}, "
                                          f"not {raw!r}")
    options = opt.Options(raw, where)
    path = options.required("path", opt.dotted_path)
    if options.has("equals") == options.has("matches"):
        raise TransformConfigError(where, "needs exactly one of equals, matches")
    equals = options.optional("equals", opt.json_like, MISSING)
    matches = options.optional("matches", opt.regex, None)
    options.refuse_unknown()
    return FieldValue(path, equals, matches)


def parse_predicate(raw: Any, where: str) -> Predicate:
    """The predicate spec ``raw`` at config path ``where``; ``TransformConfigError`` if bad."""
    if not isinstance(raw, dict):
        raise TransformConfigError(where, f"must be an object of conditions, not {raw!r}")
    options = opt.Options(raw, where)
    predicate = Predicate(
        tables=options.optional("table", _patterns, None),
        schemas=options.optional("schema", _patterns, None),
        operations=options.optional("operation", _operations, None),
        field_exists=options.optional("field_exists", opt.dotted_path, None),
        field_value=options.optional("field_value", _field_value, None),
        negate=options.optional("negate", opt.boolean, False),
    )
    options.refuse_unknown()
    tested = (predicate.tables, predicate.schemas, predicate.operations,
              predicate.field_exists, predicate.field_value)
    if all(condition is None for condition in tested):
        raise TransformConfigError(
            where, "tests nothing; give at least one of table, schema, operation, "
                   "field_exists, field_value")
    return predicate

