"""Destination-setting transforms: ``RegexRouter``, ``ContentRouter``, ``Route``.

A record's ``destination`` (topic, optional key or partition) is where the batch cycle sends
it, after admission (allowlist, cap). These transforms only *compute* destinations; whether a
topic may be used is admission's decision, never theirs. They differ in what they read:

- ``RegexRouter`` rewrites the topic already set (by the source or an earlier transform);
- ``ContentRouter`` picks a topic from a field's value through a mapping and/or patterns, with
  an optional default, and keeps the existing key/partition;
- ``Route`` (the Iggy proposal's transform) looks a field's value up in a static, non-empty
  mapping and replaces the whole destination atomically (topic, and key or partition from
  fields); no match leaves the record as it was, so ``on_missing_destination`` decides.

Looking a value up: mapping keys are strings (as in YAML/JSON objects), so a field value is
compared by its text — a string as is, an integer in decimal, ``true``/``false``; ``null``, a
missing field, floats, lists and objects never match. Topics written in the config are checked
as topic names when the chain is built; computed ones (``RegexRouter``) when the record passes.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import attrs

from rivven_connect.core.records import Destination, Record
from rivven_connect.core.transforms import options as opt
from rivven_connect.core.transforms.errors import TransformConfigError
from rivven_connect.core.transforms.paths import MISSING, Path, get_path

__all__ = ["ContentRouter", "RegexRouter", "Route", "lookup_text"]

_GROUP_REFERENCE = re.compile(r"\\(\d+)|\\g<([^>]*)>")


def lookup_text(value: Any) -> str | None:
    """The text a field value is looked up by in a mapping, or ``None`` if it has none."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int)):
        return str(value)
    return None


def _topic_mapping(raw: Any, where: str) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise TransformConfigError(where, f"must be an object {{value: topic}}, not {raw!r}")
    if not raw:
        raise TransformConfigError(where, "is empty (an empty mapping is never a fallback)")
    mapping = {}
    for value, topic in raw.items():
        text = lookup_text(value)
        if text is None:
            raise TransformConfigError(where, f"key {value!r} is not a string or an integer")
        mapping[text] = opt.topic(topic, f"{where}.{text}")
    return mapping


def _with_topic(record: Record, topic: str) -> Record:
    """``record`` sent to ``topic``, keeping its destination's key and partition."""
    if record.destination is None:
        return attrs.evolve(record, destination=Destination(topic))
    return attrs.evolve(record, destination=attrs.evolve(record.destination, topic=topic))


def _replacement(pattern: re.Pattern[str], raw: Any, where: str) -> str:
    template = opt.text(raw, where)
    if re.search(r"\$\{?\w", template):
        raise TransformConfigError(where, "uses $-references; write groups as \\1 or \\g<name>")
    for number, name in _GROUP_REFERENCE.findall(template):
        group = number or name
        known = int(group) <= pattern.groups if group.isdigit() else group in pattern.groupindex
        if not known:
            raise TransformConfigError(where, f"refers to group {group!r}, which "
                                              f"{pattern.pattern!r} does not have")
    return template


@attrs.frozen
class RegexRouter:
    """If the destination topic fully matches ``regex``, replace it by ``replacement``
    (Python ``re`` syntax: ``\\1``, ``\\g<name>``); key and partition are kept. A record
    without a destination, or whose topic does not match, passes unchanged. A replacement
    that yields an illegal topic name raises ``ValueError``."""

    TYPE: ClassVar[str] = "RegexRouter"
    regex: re.Pattern[str]
    replacement: str

    @classmethod
    def from_options(cls, options: opt.Options) -> RegexRouter:
        """Options ``regex`` and ``replacement`` (both required)."""
        pattern = options.required("regex", opt.regex)
        return cls(pattern, options.required(
            "replacement", lambda raw, where: _replacement(pattern, raw, where)))

    def apply(self, record: Record) -> Record:
        """``record``, re-destined if its topic matches."""
        if record.destination is None:
            return record
        match = self.regex.fullmatch(record.destination.topic)
        if match is None:
            return record
        topic = match.expand(self.replacement)
        problem = opt.topic_name_problem(topic)
        if problem is not None:
            raise ValueError(f"RegexRouter made an illegal topic: {problem}")
        return _with_topic(record, topic)


def _patterns(raw: Any, where: str) -> tuple[tuple[re.Pattern[str], str], ...]:
    if not isinstance(raw, list) or not raw:
        raise TransformConfigError(where, f"must be a non-empty list of {{matches, topic}}, "
                                          f"not {raw!r}")
    rules = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise TransformConfigError(f"{where}[{i}]", "must be an object {matches, topic}")
        options = opt.Options(item, f"{where}[{i}]")
        rules.append((options.required("matches", opt.regex),
                      options.required("topic", opt.topic)))
        options.refuse_unknown()
    return tuple(rules)


@attrs.frozen
class ContentRouter:
    """Send the record to the topic chosen by the value of ``field``: first ``mapping``
    (exact text), then ``patterns`` in order (``{matches: REGEX, topic}``, full match), then
    ``default``. With no match and no default the record passes unchanged. The destination's
    key and partition are kept."""

    TYPE: ClassVar[str] = "ContentRouter"
    field: Path
    mapping: dict[str, str] = attrs.field(factory=dict)
    patterns: tuple[tuple[re.Pattern[str], str], ...] = ()
    default: str | None = None

    @classmethod
    def from_options(cls, options: opt.Options) -> ContentRouter:
        """Options ``field`` (required), ``mapping`` and/or ``patterns``, ``default``."""
        router = cls(
            field=options.required("field", opt.dotted_path),
            mapping=options.optional("mapping", _topic_mapping, {}),
            patterns=options.optional("patterns", _patterns, ()),
            default=options.optional("default", opt.topic, None),
        )
        if not router.mapping and not router.patterns:
            raise TransformConfigError(options.path, "needs mapping or patterns")
        return router

    def topic_for(self, value: Any) -> str | None:
        """The topic a record with field value ``value`` goes to, or ``None``."""
        text = lookup_text(value)
        if text is not None:
            if text in self.mapping:
                return self.mapping[text]
            for pattern, topic in self.patterns:
                if pattern.fullmatch(text):
                    return topic
        return self.default

    def apply(self, record: Record) -> Record:
        """``record``, re-destined when its field picks a topic."""
        topic = self.topic_for(get_path(record.value, self.field))
        return record if topic is None else _with_topic(record, topic)


def _destination_key(value: Any) -> bytes | None:
    if value is MISSING or value is None:
        return None
    if isinstance(value, bytes):
        return value
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return str(value).encode("utf-8")
    raise TypeError(f"a {type(value).__name__} cannot be a destination key")


def _destination_partition(value: Any) -> int | None:
    if value is MISSING or value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a partition number")
    return value


@attrs.frozen
class Route:
    """Look the value of ``field`` up in ``mapping`` (``{value: topic}``, static, never
    empty) and replace the whole destination: that topic, plus the key from ``key_field``
    (string/integer as UTF-8 text; ``null``/missing = none, the partitioner balances) or the
    partition from ``partition_field`` (a non-negative integer). No match (or a missing
    field) leaves the record unchanged; a bad key or partition value raises."""

    TYPE: ClassVar[str] = "Route"
    field: Path
    mapping: dict[str, str]
    key_field: Path | None = None
    partition_field: Path | None = None

    @classmethod
    def from_options(cls, options: opt.Options) -> Route:
        """Options ``field`` and ``mapping`` (required; the mapping already loaded, fetching
        it is the driver's job), ``key_field`` or ``partition_field``."""
        route = cls(
            field=options.required("field", opt.dotted_path),
            mapping=options.required("mapping", _topic_mapping),
            key_field=options.optional("key_field", opt.dotted_path, None),
            partition_field=options.optional("partition_field", opt.dotted_path, None),
        )
        if route.key_field is not None and route.partition_field is not None:
            raise TransformConfigError(options.path, "give key_field or partition_field, "
                                                     "not both")
        return route

    def apply(self, record: Record) -> Record:
        """``record`` with its destination replaced on a match."""
        text = lookup_text(get_path(record.value, self.field))
        topic = None if text is None else self.mapping.get(text)
        if topic is None:
            return record
        key = partition = None
        if self.key_field is not None:
            key = _destination_key(get_path(record.value, self.key_field))
        if self.partition_field is not None:
            partition = _destination_partition(get_path(record.value, self.partition_field))
        return attrs.evolve(record, destination=Destination(topic, key, partition))
