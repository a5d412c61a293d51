"""Topic configuration: Kafka-style string pairs parsed into a frozen, validated ``TopicConfig``.

Theory of operation
-------------------
Clients send topic settings as strings (``{"retention.ms": "86400000"}``), exactly as Kafka's
admin API does. ``TopicConfig.parse`` checks every key against one table (``_SPECS``: key,
attribute, default, parser with its bounds) and returns a frozen object with typed fields; an
unknown key or a bad value raises ``InvalidConfigError(key, reason)``, which the server maps to
``INVALID_CONFIG``. The object remembers which keys were given explicitly (``overrides``), so
the registry persists only those, ``describe()`` can say ``is_default``, and a later change of a
default (in ``limits``) reaches every topic that did not pin the value.

Keys (all values are strings on input; ``-1`` means "no limit" where noted):

==================== ============================ =================================================
key                  default                      accepted
==================== ============================ =================================================
retention.ms         604800000 (7 days)           -1 (forever) or >= 0
retention.bytes      -1 (no size limit)           -1 or >= 0
segment.bytes        1073741824 (1 GiB)           limits.segment_bytes_min .. segment_bytes_max
segment.ms           604800000 (7 days)           >= 1
cleanup.policy       delete                       delete, compact, compact,delete (any order)
max.message.bytes    limits.max_message_bytes_def HEADER_BYTES .. limits.batch_bytes_max
min.insync.replicas  1                            1 .. limits.replication_factor_max
delete.retention.ms  86400000 (1 day)             >= 0
==================== ============================ =================================================

``to_log_config`` hands the partition log the subset it obeys. Retention applies only when the
cleanup policy contains ``delete``: a ``compact``-only topic gets unlimited retention in its
``LogConfig`` (the compactor, a later milestone, bounds it instead).

Pure: no I/O, no clocks.
"""

from __future__ import annotations

import re
import types
from typing import Callable, Mapping

import attrs

from rivven_broker.protocol import limits
from rivven_broker.records.header import HEADER_BYTES
from rivven_broker.storage.errors import InvalidConfigError
from rivven_broker.storage.log_config import LogConfig

__all__ = ["TopicConfig", "ConfigEntry", "CONFIG_KEYS", "CLEANUP_POLICIES"]

_INT = re.compile(r"-?[0-9]+")
_I64_MAX = (1 << 63) - 1
#: Largest segment: positions inside a segment are stored as 32-bit values in the indexes.
_SEGMENT_BYTES_MAX = (1 << 31) - 1
#: Canonical spellings of the accepted cleanup policies.
CLEANUP_POLICIES = ("delete", "compact", "compact,delete")


def _int_parser(
    low: int, high: int = _I64_MAX, *, no_limit: bool = False
) -> Callable[[str, str], int]:
    """A parser for a decimal integer in ``[low, high]`` (or exactly -1 when ``no_limit``)."""

    def parse(key: str, text: str) -> int:
        if not _INT.fullmatch(text):
            raise InvalidConfigError(key, f"{text!r} is not a decimal integer")
        value = int(text)
        if no_limit and value == -1:
            return value
        if not low <= value <= high:
            allowed = f"{low}..{high}" + (" or -1" if no_limit else "")
            raise InvalidConfigError(key, f"{value} is outside {allowed}")
        return value

    return parse


def _parse_cleanup_policy(key: str, text: str) -> str:
    parts = [part.strip() for part in text.split(",")]
    if any(part not in ("delete", "compact") for part in parts):
        raise InvalidConfigError(key, f"{text!r} is not delete, compact or compact,delete")
    if len(set(parts)) != len(parts):
        raise InvalidConfigError(key, f"{text!r} repeats a policy")
    return ",".join(sorted(parts))  # "compact" < "delete": canonical "compact,delete"


@attrs.frozen
class _Spec:
    key: str
    attribute: str
    default: int | str
    parse: Callable[[str, str], int | str]


_SPECS: tuple[_Spec, ...] = (
    _Spec("cleanup.policy", "cleanup_policy", "delete", _parse_cleanup_policy),
    _Spec("delete.retention.ms", "delete_retention_ms", 86_400_000, _int_parser(0)),
    _Spec(
        "max.message.bytes",
        "max_message_bytes",
        limits.max_message_bytes_default,
        _int_parser(HEADER_BYTES, limits.batch_bytes_max),
    ),
    _Spec(
        "min.insync.replicas",
        "min_insync_replicas",
        1,
        _int_parser(1, limits.replication_factor_max),
    ),
    _Spec("retention.bytes", "retention_bytes", -1, _int_parser(0, no_limit=True)),
    _Spec(
        "retention.ms",
        "retention_ms",
        limits.retention_ms_default,
        _int_parser(0, no_limit=True),
    ),
    _Spec(
        "segment.bytes",
        "segment_bytes",
        limits.segment_bytes_default,
        _int_parser(limits.segment_bytes_min, _SEGMENT_BYTES_MAX),
    ),
    _Spec("segment.ms", "segment_ms", limits.segment_ms_default, _int_parser(1)),
)
assert [spec.key for spec in _SPECS] == sorted(spec.key for spec in _SPECS)  # describe() order
_BY_KEY: dict[str, _Spec] = {spec.key: spec for spec in _SPECS}
#: Every topic configuration key this broker accepts, sorted.
CONFIG_KEYS: tuple[str, ...] = tuple(sorted(_BY_KEY))


@attrs.frozen
class ConfigEntry:
    """One row of ``TopicConfig.describe()``."""

    name: str
    value: str
    is_default: bool


@attrs.frozen(kw_only=True)
class TopicConfig:
    """A topic's validated settings. Build with ``TopicConfig.parse``; ``TopicConfig()`` is the
    all-defaults config.

    ``overrides`` holds the explicitly given keys in canonical string form; every typed field
    agrees with it (checked in ``__attrs_post_init__``).
    """

    retention_ms: int = limits.retention_ms_default
    retention_bytes: int = -1
    segment_bytes: int = limits.segment_bytes_default
    segment_ms: int = limits.segment_ms_default
    cleanup_policy: str = "delete"
    max_message_bytes: int = limits.max_message_bytes_default
    min_insync_replicas: int = 1
    delete_retention_ms: int = 86_400_000
    overrides: Mapping[str, str] = attrs.field(factory=dict, converter=lambda m: _frozen_mapping(m))

    def __attrs_post_init__(self) -> None:
        for spec in _SPECS:
            value = getattr(self, spec.attribute)
            if spec.key in self.overrides:
                assert str(spec.parse(spec.key, self.overrides[spec.key])) == str(value)
            else:
                assert value == spec.default, (spec.key, value)

    def __hash__(self) -> int:
        return hash(tuple(self.overrides.items()))

    @classmethod
    def parse(cls, configs: Mapping[str, str]) -> TopicConfig:
        """Validate Kafka-style ``configs`` and return the config they describe. Does not block.

        Keys not given take their defaults.

        Raises:
            InvalidConfigError: a key is unknown, a key or value is too long or not a string,
                or a value is malformed or out of range (the first such key found).
        """
        values: dict[str, int | str] = {}
        overrides: dict[str, str] = {}
        for key in sorted(configs):
            spec = _spec_for(key)
            text = configs[key]
            if not isinstance(text, str):
                raise InvalidConfigError(key, f"value must be a string, not {type(text).__name__}")
            if len(text.encode()) > limits.config_value_bytes_max:
                raise InvalidConfigError(key, "value is too long")
            value = spec.parse(key, text)
            values[spec.attribute] = value
            overrides[key] = str(value)
        return cls(**values, overrides=overrides)

    def alter(self, changes: Mapping[str, str | None]) -> TopicConfig:
        """Return a new config with ``changes`` applied on top of this one's overrides.

        A value of ``None`` resets the key to its default. Does not block.

        Raises:
            InvalidConfigError: as ``parse``; nothing is changed then.
        """
        merged = dict(self.overrides)
        for key, text in changes.items():
            _spec_for(key)
            if text is None:
                merged.pop(key, None)
            else:
                merged[key] = text
        return TopicConfig.parse(merged)

    def to_strings(self, *, include_defaults: bool = True) -> dict[str, str]:
        """Every key with its value as a string (or only the overrides), sorted by key."""
        if not include_defaults:
            return dict(self.overrides)
        return {spec.key: str(getattr(self, spec.attribute)) for spec in _SPECS}

    def describe(self) -> list[ConfigEntry]:
        """One entry per key, sorted by key: its value and whether it is the default."""
        return [
            ConfigEntry(spec.key, str(getattr(self, spec.attribute)), spec.key not in self.overrides)
            for spec in _SPECS
        ]

    @property
    def deletes(self) -> bool:
        """True when the cleanup policy includes ``delete`` (time and size retention apply)."""
        return "delete" in self.cleanup_policy.split(",")

    @property
    def compacts(self) -> bool:
        """True when the cleanup policy includes ``compact``."""
        return "compact" in self.cleanup_policy.split(",")

    def to_log_config(self, preallocate_bytes: int = 0) -> LogConfig:
        """The settings a partition log of this topic obeys. See the module docstring."""
        assert preallocate_bytes >= 0
        return LogConfig(
            segment_bytes=self.segment_bytes,
            segment_ms=self.segment_ms,
            retention_ms=self.retention_ms if self.deletes else -1,
            retention_bytes=self.retention_bytes if self.deletes else -1,
            max_message_bytes=self.max_message_bytes,
            preallocate_bytes=preallocate_bytes,
        )


def _spec_for(key: object) -> _Spec:
    if not isinstance(key, str):
        raise InvalidConfigError(repr(key), "key must be a string")
    spec = _BY_KEY.get(key)
    if spec is None:
        shown = key if len(key) <= limits.config_key_bytes_max else key[:64] + "..."
        raise InvalidConfigError(shown, "unknown topic config key")
    return spec


def _frozen_mapping(mapping: Mapping[str, str]) -> Mapping[str, str]:
    return types.MappingProxyType(dict(sorted(mapping.items())))
