"""Value conversions per field: ``Cast`` (JSON types) and ``TimestampConverter`` (time formats).

Both take a set of dotted-path fields and rewrite each field's value in place (in a copy),
leaving the rest of the record alone. Shared rules: a tombstone passes unchanged; a missing
field is skipped; a ``null`` field stays ``null``; a value that cannot be converted raises
``ValueError``/``TypeError`` (the chain wraps it in ``TransformError`` so the record can go to
the DLQ) — nothing is guessed or silently truncated.

Time has no clock here: ``TimestampConverter`` converts the instants it is given. Instants are
UTC: an ISO-8601 string without an offset, or a ``input_format`` without ``%z``, is read as
UTC; one with an offset is converted to UTC. Output precision is the millisecond.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Callable
from typing import Any, ClassVar

import attrs

from rivven_connect.core.records import Record
from rivven_connect.core.transforms import options as opt
from rivven_connect.core.transforms.errors import TransformConfigError
from rivven_connect.core.transforms.paths import MISSING, Path, get_path, object_value, set_path

__all__ = ["CAST_TYPES", "Cast", "TimestampConverter"]


def _to_int(value: Any) -> int:
    if isinstance(value, (bool, int)):
        return int(value)
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"cannot cast {value!r} to int without losing its fraction")
        return int(value)
    if isinstance(value, str):
        return int(value.strip())
    raise TypeError(f"cannot cast a {type(value).__name__} to int")


def _to_float(value: Any) -> float:
    if isinstance(value, (bool, int, float)):
        return float(value)
    if isinstance(value, str):
        result = float(value.strip())
        if not math.isfinite(result):
            raise ValueError(f"cannot cast {value!r} to a finite float")
        return result
    raise TypeError(f"cannot cast a {type(value).__name__} to float")


def _to_str(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    raise TypeError(f"cannot cast a {type(value).__name__} to str")


def _to_bool(value: Any) -> bool:
    if isinstance(value, (bool, int, float)):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "false", "0"):
        return value.strip().lower() in ("true", "1")
    raise ValueError(f"cannot cast {value!r} to bool (true, false, 1, 0, or a number)")


def _to_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(f"cannot cast a {type(value).__name__} to bytes")


#: Cast's target types and their conversions (see ``Cast``).
CAST_TYPES: dict[str, Callable[[Any], Any]] = {
    "int": _to_int, "float": _to_float, "str": _to_str, "bool": _to_bool, "bytes": _to_bytes,
}


def _cast_fields(raw: Any, where: str) -> tuple[tuple[Path, str], ...]:
    if not isinstance(raw, dict) or not raw:
        raise TransformConfigError(where, f"must be a non-empty object {{field: type}}, "
                                          f"not {raw!r}")
    return tuple((opt.dotted_path(name, where), opt.choice(*CAST_TYPES)(kind, f"{where}.{name}"))
                 for name, kind in raw.items())


@attrs.frozen
class Cast:
    """Cast each field to ``int``, ``float``, ``str``, ``bool`` or ``bytes``.

    ``int``: from booleans (1/0), integral floats, decimal strings — ``2.5`` is refused, not
    truncated. ``float``: from numbers and numeric strings (finite only). ``str``: numbers as
    Python writes them, booleans as ``true``/``false``, bytes as UTF-8, lists and objects as
    compact JSON. ``bool``: from numbers (non-zero) and ``true``/``false``/``1``/``0`` in any
    case. ``bytes``: strings as UTF-8."""

    TYPE: ClassVar[str] = "Cast"
    fields: tuple[tuple[Path, str], ...]

    @classmethod
    def from_options(cls, options: opt.Options) -> Cast:
        """Option ``fields``: ``{dotted.path: int|float|str|bool|bytes}`` (required)."""
        return cls(options.required("fields", _cast_fields))

    def apply(self, record: Record) -> Record:
        """``record`` with the fields cast."""
        value = object_value(record.value, self.TYPE)
        if value is None:
            return record
        for path, kind in self.fields:
            found = get_path(value, path)
            if found is not MISSING and found is not None:
                value = set_path(value, path, CAST_TYPES[kind](found))
        return attrs.evolve(record, value=value)


EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_EPOCH_UNITS = {"s": dt.timedelta(seconds=1), "ms": dt.timedelta(milliseconds=1),
                "us": dt.timedelta(microseconds=1)}
TARGETS = ("epoch_ms", "iso8601", "date", "string")


def _as_utc(instant: dt.datetime) -> dt.datetime:
    if instant.tzinfo is None:
        return instant.replace(tzinfo=dt.timezone.utc)
    return instant.astimezone(dt.timezone.utc)


@attrs.frozen
class TimestampConverter:
    """Convert each field between instant representations.

    Input, recognised by type: a number is an epoch count in ``epoch_unit`` (``s``, ``ms``
    default, ``us``); a string is parsed with ``input_format`` (``strptime``) if given, else as
    ISO-8601 (a date alone is midnight UTC). Output by ``to``: ``epoch_ms`` (int, floored),
    ``iso8601`` (``2024-05-01T12:00:00.000Z``), ``date`` (``2024-05-01``), or ``string``
    (``strftime`` with ``output_format``, required then). An unparseable string raises
    ``ValueError``; a boolean, list or object raises ``TypeError``."""

    TYPE: ClassVar[str] = "TimestampConverter"
    fields: tuple[Path, ...]
    to: str
    epoch_unit: str = "ms"
    input_format: str | None = None
    output_format: str | None = None

    @classmethod
    def from_options(cls, options: opt.Options) -> TimestampConverter:
        """Options ``fields`` (required), ``to`` (required), ``epoch_unit``,
        ``input_format``, ``output_format`` (required iff ``to: string``)."""
        converter = cls(
            fields=options.required("fields", opt.path_list),
            to=options.required("to", opt.choice(*TARGETS)),
            epoch_unit=options.optional("epoch_unit", opt.choice(*_EPOCH_UNITS), "ms"),
            input_format=options.optional("input_format", opt.text, None),
            output_format=options.optional("output_format", opt.text, None),
        )
        if (converter.to == "string") != (converter.output_format is not None):
            raise TransformConfigError(options.where("output_format"),
                                       "is required with to: string, and only then")
        return converter

    def parse(self, raw: Any) -> dt.datetime:
        """The UTC instant that ``raw`` (a field value) denotes."""
        if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
            raise TypeError(f"a {type(raw).__name__} is not a timestamp")
        if isinstance(raw, str):
            text = raw.strip()
            if self.input_format is not None:
                return _as_utc(dt.datetime.strptime(text, self.input_format))
            return _as_utc(dt.datetime.fromisoformat(text))
        if isinstance(raw, int):
            return EPOCH + raw * _EPOCH_UNITS[self.epoch_unit]
        return EPOCH + dt.timedelta(seconds=raw * _EPOCH_UNITS[self.epoch_unit].total_seconds())

    def render(self, instant: dt.datetime) -> Any:
        """``instant`` in the ``to`` representation."""
        if self.to == "epoch_ms":
            return (instant - EPOCH) // dt.timedelta(milliseconds=1)
        if self.to == "iso8601":
            return instant.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        if self.to == "date":
            return instant.date().isoformat()
        assert self.output_format is not None
        return instant.strftime(self.output_format)

    def apply(self, record: Record) -> Record:
        """``record`` with the fields converted."""
        value = object_value(record.value, self.TYPE)
        if value is None:
            return record
        for path in self.fields:
            found = get_path(value, path)
            if found is not MISSING and found is not None:
                value = set_path(value, path, self.render(self.parse(found)))
        return attrs.evolve(record, value=value)
