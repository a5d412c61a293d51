"""``Filter``: keep or drop records by a condition written in the predicate grammar.

Three forms, one meaning each:

- ``{type: Filter, keep: {condition}}`` keeps the records the condition matches, drops the rest;
- ``{type: Filter, drop: {condition}}`` drops the records the condition matches, keeps the rest;
- ``{type: Filter, predicate: {condition}}`` (Kafka Connect's form) drops every record the
  transform is applied to, i.e. the ones the predicate matches.

``keep`` and ``drop`` together are refused; so is a ``Filter`` with neither and no predicate
(it would drop everything). A ``predicate`` alongside ``keep``/``drop`` limits which records
the filter looks at at all; the others pass. Conditions are ``predicates.Predicate`` (tables,
schemas, operations, fields, ``negate``), so missing fields behave as there: a condition on a
missing field does not match.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from rivven_connect.core.records import Record
from rivven_connect.core.transforms.errors import TransformConfigError
from rivven_connect.core.transforms.options import Options
from rivven_connect.core.transforms.predicates import Predicate, parse_predicate

__all__ = ["Filter"]


@attrs.frozen
class Filter:
    """Keep the records ``keep`` matches, or drop those ``drop`` matches, or (neither) drop
    all."""

    TYPE: ClassVar[str] = "Filter"
    keep: Predicate | None = None
    drop: Predicate | None = None

    @classmethod
    def from_options(cls, options: Options) -> Filter:
        """Options ``keep`` or ``drop`` (a predicate spec each), at most one."""
        keep = options.optional("keep", parse_predicate, None)
        drop = options.optional("drop", parse_predicate, None)
        if keep is not None and drop is not None:
            raise TransformConfigError(options.path, "give keep or drop, not both")
        if keep is None and drop is None and not options.gated:
            raise TransformConfigError(
                options.path, "a Filter without keep, drop or predicate drops every record")
        return cls(keep, drop)

    def apply(self, record: Record) -> Record | None:
        """``record`` or ``None`` (filtered out)."""
        if self.keep is not None:
            return record if self.keep.matches(record) else None
        if self.drop is not None:
            return None if self.drop.matches(record) else record
        return None
