"""Dotted paths into JSON-like values: ``after.customer.id`` reaches
``v["after"]["customer"]["id"]``.

Grammar (checked once, at config time, by ``parse_path``): one or more non-empty segments
joined by ``.``; a segment is an object key taken literally. There is no array indexing and no
escaping, so a key that itself contains a dot cannot be reached (the Iggy ``Route`` grammar).

Reading (``get_path``) returns ``MISSING`` when any step is absent or is not an object (a
``None`` ``before`` of an insert, a list, a number): the caller decides what missing means.
Writing (``set_path``, ``delete_path``) never mutates its input: it copies each object along
the path and returns the new root, so a record's value can be shared between records.
``set_path`` creates intermediate objects that are absent and refuses (``TypeError``) to walk
through a value that is present but not an object.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "MISSING",
    "Path",
    "delete_path",
    "format_path",
    "get_path",
    "object_value",
    "parse_path",
    "set_path",
]

#: A parsed dotted path: its segments, outermost first.
Path = tuple[str, ...]


class _Missing:
    """The type of ``MISSING``: a field that is absent (distinct from a JSON ``null``)."""

    _instance: _Missing | None = None

    def __new__(cls) -> _Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Any = _Missing()


def parse_path(text: str) -> Path:
    """``"a.b.c"`` -> ``("a", "b", "c")``; raises ``ValueError`` on an empty segment."""
    if not isinstance(text, str):
        raise ValueError(f"a dotted path must be a string, not {type(text).__name__}")
    segments = tuple(text.split("."))
    if any(segment == "" for segment in segments):
        raise ValueError(f"{text!r} is not a dotted path (empty segment)")
    return segments


def format_path(path: Path) -> str:
    """The inverse of ``parse_path``."""
    return ".".join(path)


def get_path(value: Any, path: Path) -> Any:
    """The value at ``path`` inside ``value``, or ``MISSING``."""
    current = value
    for segment in path:
        if not isinstance(current, dict) or segment not in current:
            return MISSING
        current = current[segment]
    return current


def set_path(value: dict, path: Path, new: Any) -> dict:
    """A copy of ``value`` with ``new`` at ``path`` (intermediate objects created).

    Raises ``TypeError`` if a step on the way exists and is not an object."""
    assert path, "an empty path has no field to set"
    head, rest = path[0], path[1:]
    copy = dict(value)
    if not rest:
        copy[head] = new
        return copy
    inner = copy.get(head)
    if inner is None:
        inner = {}
    if not isinstance(inner, dict):
        raise TypeError(f"cannot set {format_path(path)!r}: {head!r} is a {type(inner).__name__}")
    copy[head] = set_path(inner, rest, new)
    return copy


def delete_path(value: dict, path: Path) -> dict:
    """A copy of ``value`` without the field at ``path``; ``value`` itself if it is absent."""
    assert path, "an empty path has no field to delete"
    if get_path(value, path) is MISSING:
        return value
    head, rest = path[0], path[1:]
    copy = dict(value)
    if rest:
        copy[head] = delete_path(copy[head], rest)
    else:
        del copy[head]
    return copy


def object_value(value: Any, transform_type: str) -> dict | None:
    """``value`` if it is an object, ``None`` for a tombstone; ``TypeError`` otherwise.

    The value-shaping transforms pass tombstones through and refuse scalars and lists."""
    if value is None or isinstance(value, dict):
        return value
    raise TypeError(f"{transform_type} needs an object value, not {type(value).__name__}")
