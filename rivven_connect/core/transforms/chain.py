"""``build_chain`` and ``Chain``: a connector's ``transforms:`` list, checked once, run per record.

Building: ``build_chain(specs, path="sources.orders.transforms")`` reads each raw spec
``{type: NAME, predicate: {...}, ...options}`` in order. ``type`` selects a class from
``TRANSFORM_TYPES`` (an unknown name is refused with the closest known one); ``predicate`` is
parsed by ``predicates.parse_predicate``; the rest goes to the class's ``from_options``, which
reads what it knows and refuses the rest. Every problem is a ``TransformConfigError`` naming
``path[i].option``, raised before any record flows: the connector does not start.

Running: ``Chain.apply(record)`` passes the record through each step in order. A step whose
predicate does not match passes the record on unchanged; otherwise the transform returns a
new record or ``None`` (filtered out: the chain stops and returns ``None``). An exception
raised inside a step (transform or predicate) comes out as ``TransformError`` carrying the
step's index and type, the record as it entered the step, and the cause; the batch cycle
decides between the DLQ and failing the batch. ``AssertionError`` (a bug of ours, not a bad
record) is not wrapped.

Every transform class has a ``TYPE`` name, a ``from_options(Options)`` classmethod and a pure
``apply(record) -> Record | None`` (the ``Transform`` protocol); adding one is adding it to
``TRANSFORM_TYPES``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

import attrs

from rivven_connect.core.records import Record
from rivven_connect.core.transforms.cdc import ExtractNewRecordState
from rivven_connect.core.transforms.conversions import Cast, TimestampConverter
from rivven_connect.core.transforms.errors import TransformConfigError, TransformError
from rivven_connect.core.transforms.fields import (
    Flatten,
    InsertField,
    MaskField,
    ReplaceField,
    ValueToKey,
)
from rivven_connect.core.transforms.filtering import Filter
from rivven_connect.core.transforms.options import Options, did_you_mean
from rivven_connect.core.transforms.outbox import EventRouter
from rivven_connect.core.transforms.predicates import Predicate, parse_predicate
from rivven_connect.core.transforms.routing import ContentRouter, RegexRouter, Route

__all__ = ["TRANSFORM_TYPES", "Chain", "Step", "Transform", "build_chain"]

#: The most transforms one chain may hold (a limit, like every list that comes from config).
TRANSFORMS_MAX = 64


class Transform(Protocol):
    """What a transform class provides (see the module docstring)."""

    TYPE: ClassVar[str]

    @classmethod
    def from_options(cls, options: Options) -> Transform: ...

    def apply(self, record: Record) -> Record | None: ...


TRANSFORM_TYPES: dict[str, type[Any]] = {
    cls.TYPE: cls
    for cls in (
        Filter, MaskField, ReplaceField, InsertField, Cast, Flatten, TimestampConverter,
        ValueToKey, ExtractNewRecordState, RegexRouter, ContentRouter, Route, EventRouter,
    )
}


@attrs.frozen
class Step:
    """One transform of a chain, at ``index`` in the config, gated by ``predicate``."""

    index: int
    transform: Any
    predicate: Predicate | None = None

    def apply(self, record: Record) -> Record | None:
        """The transform's result, or ``record`` itself when the predicate does not match."""
        if self.predicate is not None and not self.predicate.matches(record):
            return record
        return self.transform.apply(record)


@attrs.frozen
class Chain:
    """A checked, ordered list of transforms (build it with ``build_chain``)."""

    steps: tuple[Step, ...] = ()

    def apply(self, record: Record) -> Record | None:
        """``record`` through every step; ``None`` if one filtered it out.

        Raises ``TransformError`` when a step raises (``AssertionError`` excepted)."""
        for step in self.steps:
            try:
                result = step.apply(record)
            except AssertionError:
                raise
            except Exception as cause:
                raise TransformError(step.index, step.transform.TYPE, record, cause) from cause
            if result is None:
                return None
            record = result
        return record


def build_step(spec: Any, index: int, where: str) -> Step:
    """The step of raw spec ``spec`` found at config path ``where``."""
    if not isinstance(spec, dict):
        raise TransformConfigError(where, f"must be an object {{type: ..., ...}}, not {spec!r}")
    if "type" not in spec:
        raise TransformConfigError(f"{where}.type", "is required")
    name = spec["type"]
    if not isinstance(name, str) or name not in TRANSFORM_TYPES:
        hint = did_you_mean(name, TRANSFORM_TYPES) if isinstance(name, str) else ""
        raise TransformConfigError(
            f"{where}.type", f"unknown transform {name!r}{hint}; known: "
                             f"{', '.join(TRANSFORM_TYPES)}")
    predicate = None
    if "predicate" in spec:
        predicate = parse_predicate(spec["predicate"], f"{where}.predicate")
    raw_options = {k: v for k, v in spec.items() if k not in ("type", "predicate")}
    options = Options(raw_options, where, gated=predicate is not None)
    transform = TRANSFORM_TYPES[name].from_options(options)
    options.refuse_unknown()
    return Step(index, transform, predicate)


def build_chain(specs: Any, *, path: str) -> Chain:
    """The chain of the raw transform specs ``specs`` at config path ``path``.

    Raises ``TransformConfigError`` (naming ``path[i].option``) for any invalid spec."""
    if specs is None:
        return Chain()
    if not isinstance(specs, list):
        raise TransformConfigError(path, f"must be a list of transforms, not {specs!r}")
    if len(specs) > TRANSFORMS_MAX:
        raise TransformConfigError(path, f"has {len(specs)} transforms; at most "
                                         f"{TRANSFORMS_MAX}")
    return Chain(tuple(build_step(spec, i, f"{path}[{i}]") for i, spec in enumerate(specs)))
