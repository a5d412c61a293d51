"""Reading one transform's raw spec dict into checked values, once, with errors that say where.

A spec arrives as parsed YAML/JSON: ``{type: "Cast", predicate: {...}, fields: {...}}``.
``Options`` wraps the option part (everything but ``type`` and ``predicate``) with the config
path of the spec (``sources.x.transforms[2]``). A transform's ``from_options`` asks for each
option it knows through ``required``/``optional`` with a *parser*: a function
``(raw, where) -> value`` that returns the checked value or raises ``TransformConfigError``
naming ``where`` (``sources.x.transforms[2].fields``). ``refuse_unknown`` then rejects every
option nobody asked for, with a "did you mean" when one is close, so a typo like ``feilds`` is
an error at startup instead of a silently ignored option.

The parsers here are the shared vocabulary (strings, booleans, dotted paths, regular
expressions, topic names, mappings, JSON-like constants); a transform with an option of its
own shape writes a local parser of the same signature.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import attrs

from rivven_connect.core.transforms.errors import TransformConfigError
from rivven_connect.core.transforms.paths import Path, parse_path

__all__ = [
    "Options",
    "Parser",
    "any_text",
    "boolean",
    "choice",
    "did_you_mean",
    "dotted_path",
    "json_like",
    "path_list",
    "regex",
    "text",
    "text_list",
    "topic",
    "topic_name_problem",
]

T = TypeVar("T")
#: Checks one raw option value; ``where`` is its config path for the error message.
Parser = Callable[[Any, str], T]

_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """``" (did you mean 'fields'?)"`` when a candidate is close to ``name``, else ``""``."""
    by_lower = {candidate.lower(): candidate for candidate in candidates}
    close = difflib.get_close_matches(str(name).lower(), list(by_lower), n=1, cutoff=0.6)
    return f" (did you mean {by_lower[close[0]]!r}?)" if close else ""


@attrs.define
class Options:
    """The options of one spec at config path ``path``; each read once, leftovers refused."""

    raw: dict[str, Any]
    path: str
    #: Whether the spec has a predicate (``Filter`` without conditions needs one).
    gated: bool = False
    _read: set[str] = attrs.field(factory=set, init=False)

    def where(self, name: str) -> str:
        """The config path of option ``name``."""
        return f"{self.path}.{name}"

    def has(self, name: str) -> bool:
        """Whether option ``name`` was given (marks it as known)."""
        self._read.add(name)
        return name in self.raw

    def required(self, name: str, parse: Parser[T]) -> T:
        """Option ``name`` through ``parse``; ``TransformConfigError`` if absent or bad."""
        self._read.add(name)
        if name not in self.raw:
            # A close unread option is likely a typo of this one; but it may also be a real
            # option read later (``key_field`` next to ``field``), so it is only a hint.
            unread = [str(given) for given in self.raw if given not in self._read]
            typo = difflib.get_close_matches(name, unread, n=1, cutoff=0.8)
            hint = f" (is {typo[0]!r} a misspelling of it?)" if typo else ""
            raise TransformConfigError(self.where(name), "is required" + hint)
        return parse(self.raw[name], self.where(name))

    def optional(self, name: str, parse: Parser[T], default: T) -> T:
        """Option ``name`` through ``parse``, or ``default`` when absent."""
        self._read.add(name)
        if name not in self.raw:
            return default
        return parse(self.raw[name], self.where(name))

    def refuse_unknown(self) -> None:
        """Raise ``TransformConfigError`` for the first option no one read."""
        for name in self.raw:
            if name not in self._read:
                raise TransformConfigError(
                    self.where(str(name)),
                    "unknown option" + did_you_mean(name, sorted(self._read)),
                )


def text(raw: Any, where: str) -> str:
    """A non-empty string."""
    if not isinstance(raw, str) or not raw:
        raise TransformConfigError(where, f"must be a non-empty string, not {raw!r}")
    return raw


def any_text(raw: Any, where: str) -> str:
    """A string, possibly empty."""
    if not isinstance(raw, str):
        raise TransformConfigError(where, f"must be a string, not {raw!r}")
    return raw


def text_list(raw: Any, where: str) -> tuple[str, ...]:
    """A non-empty list of non-empty strings (a single string counts as a list of one)."""
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not items:
        raise TransformConfigError(where, f"must be a string or a non-empty list, not {raw!r}")
    return tuple(text(item, f"{where}[{i}]") for i, item in enumerate(items))


def boolean(raw: Any, where: str) -> bool:
    """``true`` or ``false`` (not ``"yes"``, not ``1``)."""
    if not isinstance(raw, bool):
        raise TransformConfigError(where, f"must be true or false, not {raw!r}")
    return raw


def choice(*names: str) -> Parser[str]:
    """A parser accepting exactly one of ``names``."""

    def parse(raw: Any, where: str) -> str:
        if raw not in names:
            hint = did_you_mean(raw, names) if isinstance(raw, str) else ""
            raise TransformConfigError(where, f"must be one of {', '.join(names)}, not {raw!r}"
                                       + hint)
        return raw

    return parse


def dotted_path(raw: Any, where: str) -> Path:
    """A dotted path (``after.customer.id``), see ``paths``."""
    try:
        return parse_path(raw)
    except ValueError as error:
        raise TransformConfigError(where, str(error)) from None


def path_list(raw: Any, where: str) -> tuple[Path, ...]:
    """A non-empty list of dotted paths, without duplicates."""
    names = text_list(raw, where)
    if len(set(names)) != len(names):
        raise TransformConfigError(where, f"lists a field twice: {list(names)}")
    return tuple(dotted_path(name, f"{where}[{i}]") for i, name in enumerate(names))


def regex(raw: Any, where: str) -> re.Pattern[str]:
    """A Python regular expression (compiled)."""
    text(raw, where)
    try:
        return re.compile(raw)
    except re.error as error:
        raise TransformConfigError(where, f"bad regular expression {raw!r}: {error}") from None


def topic_name_problem(name: Any) -> str | None:
    """Why ``name`` is not a legal topic name (Kafka's rule), or ``None`` if it is."""
    if not isinstance(name, str):
        return f"a topic name must be a string, not {type(name).__name__}"
    if name in (".", "..") or not _TOPIC_NAME.fullmatch(name):
        return f"{name!r} is not a topic name (1-249 of A-Z a-z 0-9 . _ -, not . or ..)"
    return None


def topic(raw: Any, where: str) -> str:
    """A legal topic name."""
    problem = topic_name_problem(raw)
    if problem is not None:
        raise TransformConfigError(where, problem)
    return raw


def json_like(raw: Any, where: str) -> Any:
    """A JSON value: null, bool, int, float, str, or lists/objects (string keys) of those."""
    if raw is None or isinstance(raw, (bool, int, float, str)):
        return raw
    if isinstance(raw, list):
        return [json_like(item, f"{where}[{i}]") for i, item in enumerate(raw)]
    if isinstance(raw, dict):
        for key in raw:
            if not isinstance(key, str):
                raise TransformConfigError(where, f"object keys must be strings, not {key!r}")
        return {key: json_like(item, f"{where}.{key}") for key, item in raw.items()}
    raise TransformConfigError(where, f"must be a JSON value, not {type(raw).__name__}")
