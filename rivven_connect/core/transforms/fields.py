"""Field-shaping transforms: ``MaskField``, ``ReplaceField``, ``InsertField``, ``ValueToKey``,
``Flatten``.

Each works on the record's value as a JSON-like object and returns a new record
(``attrs.evolve``); the input is never mutated (``paths`` copies along the path it writes).
Common rules, stated once:

- A tombstone (value ``None``) passes every one of them unchanged. A value that is neither an
  object nor ``None`` is an error (``TypeError``, which the chain wraps in ``TransformError``).
- Fields are dotted paths (``after.customer.email``). What a *missing* field does is in each
  transform's docstring; in short: masking, excluding and renaming skip it, ``include`` leaves
  it out, ``ValueToKey`` raises.
- Only the value changes, except ``ValueToKey`` (the key). ``table``/``schema``/``op``,
  headers, timestamp and destination are kept.
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from rivven_connect.core.records import Record
from rivven_connect.core.transforms import options as opt
from rivven_connect.core.transforms.errors import TransformConfigError
from rivven_connect.core.transforms.paths import (
    MISSING,
    Path,
    delete_path,
    format_path,
    get_path,
    object_value,
    set_path,
)

__all__ = ["Flatten", "InsertField", "MaskField", "ReplaceField", "ValueToKey"]


def empty_like(value: Any) -> Any:
    """The "empty" value of ``value``'s JSON type: ``""``, ``0``, ``0.0``, ``false``, ``[]``,
    ``{}`` (``b""`` for bytes); ``None`` stays ``None``."""
    for kind, empty in ((bool, False), (int, 0), (float, 0.0), (str, ""), (bytes, b""),
                        (list, []), (dict, {})):
        if isinstance(value, kind):
            return empty
    if value is None:
        return None
    raise TypeError(f"cannot mask a {type(value).__name__}")


@attrs.frozen
class MaskField:
    """Replace each listed field's value by ``replacement`` (a string, whatever the field's
    type) or, without one, by the empty value of its type (``empty_like``). ``null`` stays
    ``null``; a missing field is skipped."""

    TYPE: ClassVar[str] = "MaskField"
    fields: tuple[Path, ...]
    replacement: str | None = None

    @classmethod
    def from_options(cls, options: opt.Options) -> MaskField:
        """Options ``fields`` (dotted paths, required), ``replacement`` (a string)."""
        return cls(options.required("fields", opt.path_list),
                   options.optional("replacement", opt.any_text, None))

    def apply(self, record: Record) -> Record:
        """``record`` with the fields masked."""
        value = object_value(record.value, self.TYPE)
        if value is None:
            return record
        for path in self.fields:
            found = get_path(value, path)
            if found is MISSING or found is None:
                continue
            masked = self.replacement if self.replacement is not None else empty_like(found)
            value = set_path(value, path, masked)
        return attrs.evolve(record, value=value)


def _renames(raw: Any, where: str) -> tuple[tuple[Path, Path], ...]:
    if not isinstance(raw, dict) or not raw:
        raise TransformConfigError(where, f"must be a non-empty object {{from: to}}, not {raw!r}")
    pairs = tuple((opt.dotted_path(old, where), opt.dotted_path(new, f"{where}.{old}"))
                  for old, new in raw.items())
    targets = [new for _, new in pairs]
    if len(set(targets)) != len(targets):
        raise TransformConfigError(where, "renames two fields to the same name")
    return pairs


@attrs.frozen
class ReplaceField:
    """Keep only ``include`` fields, or remove ``exclude`` fields, then apply ``rename``
    (``{from: to}``, in order; ``to`` is a dotted path too, so a field can move).

    A missing ``include``/``exclude``/``rename`` field is skipped. A rename onto a field that
    already exists raises ``ValueError`` (it would silently lose that field)."""

    TYPE: ClassVar[str] = "ReplaceField"
    include: tuple[Path, ...] | None = None
    exclude: tuple[Path, ...] | None = None
    rename: tuple[tuple[Path, Path], ...] = ()

    @classmethod
    def from_options(cls, options: opt.Options) -> ReplaceField:
        """Options ``include`` or ``exclude`` (dotted paths), ``rename`` (``{from: to}``)."""
        include = options.optional("include", opt.path_list, None)
        exclude = options.optional("exclude", opt.path_list, None)
        rename = options.optional("rename", _renames, ())
        if include is not None and exclude is not None:
            raise TransformConfigError(options.path, "give include or exclude, not both")
        if include is None and exclude is None and not rename:
            raise TransformConfigError(options.path, "needs include, exclude or rename")
        return cls(include, exclude, rename)

    def apply(self, record: Record) -> Record:
        """``record`` with the value's fields selected and renamed."""
        value = object_value(record.value, self.TYPE)
        if value is None:
            return record
        if self.include is not None:
            kept: dict = {}
            for path in self.include:
                found = get_path(value, path)
                if found is not MISSING:
                    kept = set_path(kept, path, found)
            value = kept
        for path in self.exclude or ():
            value = delete_path(value, path)
        for old, new in self.rename:
            found = get_path(value, old)
            if found is MISSING:
                continue
            if get_path(value, new) is not MISSING:
                raise ValueError(f"cannot rename {format_path(old)!r} to {format_path(new)!r}: "
                                 f"that field exists")
            value = set_path(delete_path(value, old), new, found)
        return attrs.evolve(record, value=value)


#: InsertField's metadata options: option name -> what of the record it writes.
_METADATA = {
    "table": lambda record: record.table,
    "schema": lambda record: record.schema,
    "op": lambda record: record.op,
    "timestamp": lambda record: record.timestamp_ms,
    "topic": lambda record: record.destination.topic if record.destination else None,
    "partition": lambda record: record.destination.partition if record.destination else None,
}


def _static_fields(raw: Any, where: str) -> tuple[tuple[Path, Any], ...]:
    if not isinstance(raw, dict) or not raw:
        raise TransformConfigError(where, f"must be a non-empty object {{field: value}}, "
                                          f"not {raw!r}")
    return tuple((opt.dotted_path(name, where), opt.json_like(value, f"{where}.{name}"))
                 for name, value in raw.items())


@attrs.frozen
class InsertField:
    """Set fields to ``static`` values and/or to the record's metadata.

    ``static: {field: value}`` writes constants; each of ``table``, ``schema``, ``op``,
    ``timestamp`` (``timestamp_ms``), ``topic`` and ``partition`` (of the destination), given
    as a field name, writes that piece of metadata there — ``null`` when the record has none
    (no destination yet, not a CDC record). An existing field is overwritten; missing
    intermediate objects are created."""

    TYPE: ClassVar[str] = "InsertField"
    static: tuple[tuple[Path, Any], ...] = ()
    metadata: tuple[tuple[str, Path], ...] = ()

    @classmethod
    def from_options(cls, options: opt.Options) -> InsertField:
        """Options ``static``, ``table``, ``schema``, ``op``, ``timestamp``, ``topic``,
        ``partition``; at least one."""
        static = options.optional("static", _static_fields, ())
        metadata = tuple((name, path) for name in _METADATA
                         if (path := options.optional(name, opt.dotted_path, None)) is not None)
        if not static and not metadata:
            raise TransformConfigError(
                options.path, f"needs static or one of {', '.join(_METADATA)}")
        return cls(static, metadata)

    def apply(self, record: Record) -> Record:
        """``record`` with the fields set."""
        value = object_value(record.value, self.TYPE)
        if value is None:
            return record
        for path, constant in self.static:
            value = set_path(value, path, constant)
        for name, path in self.metadata:
            value = set_path(value, path, _METADATA[name](record))
        return attrs.evolve(record, value=value)


@attrs.frozen
class ValueToKey:
    """Replace the key by an object of the listed value fields, named by their path as
    written (``{"id": 7}``; ``{"after.id": 7}`` for a nested one). A missing field raises
    ``KeyError`` (a key that silently lacks a part would merge unrelated rows)."""

    TYPE: ClassVar[str] = "ValueToKey"
    fields: tuple[Path, ...]

    @classmethod
    def from_options(cls, options: opt.Options) -> ValueToKey:
        """Option ``fields`` (dotted paths, required)."""
        return cls(options.required("fields", opt.path_list))

    def apply(self, record: Record) -> Record:
        """``record`` with the new key."""
        value = object_value(record.value, self.TYPE)
        if value is None:
            return record
        key = {}
        for path in self.fields:
            found = get_path(value, path)
            if found is MISSING:
                raise KeyError(f"ValueToKey: field {format_path(path)!r} is missing")
            key[format_path(path)] = found
        return attrs.evolve(record, key=key)


def flatten(value: dict, delimiter: str, prefix: str = "") -> dict:
    """Nested objects -> one level, keys joined by ``delimiter``; lists, scalars and empty
    objects are leaves. ``ValueError`` when two paths flatten to the same key."""
    flat: dict = {}
    for name, inner in value.items():
        key = f"{prefix}{delimiter}{name}" if prefix else name
        leaves = flatten(inner, delimiter, key) if isinstance(inner, dict) and inner else {
            key: inner}
        for leaf_key, leaf in leaves.items():
            if leaf_key in flat:
                raise ValueError(f"Flatten: two fields flatten to {leaf_key!r}")
            flat[leaf_key] = leaf
    return flat


@attrs.frozen
class Flatten:
    """Flatten nested objects into one level, joining keys with ``delimiter`` (default
    ``.``): ``{"a": {"b": 1}}`` -> ``{"a.b": 1}``. Lists and empty objects are kept as leaves;
    a key collision (``{"a.b": 1, "a": {"b": 2}}``) raises ``ValueError``."""

    TYPE: ClassVar[str] = "Flatten"
    delimiter: str = "."

    @classmethod
    def from_options(cls, options: opt.Options) -> Flatten:
        """Option ``delimiter`` (a non-empty string, default ``.``)."""
        return cls(options.optional("delimiter", opt.text, "."))

    def apply(self, record: Record) -> Record:
        """``record`` with a flat value."""
        value = object_value(record.value, self.TYPE)
        if value is None:
            return record
        return attrs.evolve(record, value=flatten(value, self.delimiter))
