"""Topic config parsing: every key's default, valid and invalid values, alter/reset, describe.

Method: table-driven cases over ``TopicConfig.parse`` for each key (in range, at the bounds,
just past them, malformed), checks that errors name the offending key, and a Hypothesis
property that ``parse(to_strings(...))`` round-trips any valid set of overrides.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.records.header import HEADER_BYTES
from rivven_broker.storage.errors import InvalidConfigError
from rivven_broker.storage.log_config import LogConfig
from rivven_broker.storage.topic_config import CONFIG_KEYS, TopicConfig

DEFAULTS = {
    "cleanup.policy": "delete",
    "delete.retention.ms": "86400000",
    "max.message.bytes": str(limits.max_message_bytes_default),
    "min.insync.replicas": "1",
    "retention.bytes": "-1",
    "retention.ms": "604800000",
    "segment.bytes": "1073741824",
    "segment.ms": "604800000",
}

VALID = [
    ("retention.ms", "-1", -1),
    ("retention.ms", "0", 0),
    ("retention.ms", "3600000", 3_600_000),
    ("retention.bytes", "-1", -1),
    ("retention.bytes", "0", 0),
    ("retention.bytes", "1048576", 1_048_576),
    ("segment.bytes", str(limits.segment_bytes_min), limits.segment_bytes_min),
    ("segment.bytes", str(2**31 - 1), 2**31 - 1),
    ("segment.ms", "1", 1),
    ("segment.ms", "60000", 60_000),
    ("cleanup.policy", "delete", "delete"),
    ("cleanup.policy", "compact", "compact"),
    ("cleanup.policy", "compact,delete", "compact,delete"),
    ("cleanup.policy", "delete,compact", "compact,delete"),
    ("cleanup.policy", "delete, compact", "compact,delete"),
    ("max.message.bytes", str(HEADER_BYTES), HEADER_BYTES),
    ("max.message.bytes", str(limits.batch_bytes_max), limits.batch_bytes_max),
    ("min.insync.replicas", "1", 1),
    ("min.insync.replicas", "2", 2),
    ("min.insync.replicas", str(limits.replication_factor_max), limits.replication_factor_max),
    ("delete.retention.ms", "0", 0),
    ("delete.retention.ms", "1000", 1000),
]

INVALID = [
    ("retention.ms", "-2"),
    ("retention.ms", "1.5"),
    ("retention.ms", ""),
    ("retention.ms", " 5"),
    ("retention.ms", "1_000"),
    ("retention.ms", "abc"),
    ("retention.ms", str(2**63)),
    ("retention.bytes", "-2"),
    ("retention.bytes", "1e6"),
    ("segment.bytes", str(limits.segment_bytes_min - 1)),
    ("segment.bytes", str(2**31)),
    ("segment.bytes", "-1"),
    ("segment.ms", "0"),
    ("segment.ms", "-1"),
    ("cleanup.policy", ""),
    ("cleanup.policy", "remove"),
    ("cleanup.policy", "delete,delete"),
    ("cleanup.policy", "compact,"),
    ("max.message.bytes", str(HEADER_BYTES - 1)),
    ("max.message.bytes", str(limits.batch_bytes_max + 1)),
    ("max.message.bytes", "-1"),
    ("min.insync.replicas", "0"),
    ("min.insync.replicas", str(limits.replication_factor_max + 1)),
    ("delete.retention.ms", "-1"),
    ("delete.retention.ms", "x"),
]


def test_defaults() -> None:
    config = TopicConfig.parse({})
    assert config == TopicConfig()
    assert config.to_strings() == DEFAULTS
    assert set(CONFIG_KEYS) == set(DEFAULTS)
    assert config.to_strings(include_defaults=False) == {}
    assert all(entry.is_default for entry in config.describe())
    assert config.deletes and not config.compacts


@pytest.mark.parametrize(("key", "text", "expected"), VALID)
def test_valid_values(key: str, text: str, expected: int | str) -> None:
    config = TopicConfig.parse({key: text})
    assert config.to_strings()[key] == str(expected)
    assert config.to_strings(include_defaults=False) == {key: str(expected)}
    rows = {entry.name: entry for entry in config.describe()}
    assert rows[key].value == str(expected) and not rows[key].is_default
    assert all(row.is_default for name, row in rows.items() if name != key)


@pytest.mark.parametrize(("key", "text"), INVALID)
def test_invalid_values(key: str, text: str) -> None:
    with pytest.raises(InvalidConfigError) as info:
        TopicConfig.parse({key: text})
    assert info.value.key == key
    assert info.value.code == ErrorCode.INVALID_CONFIG


def test_unknown_key_and_non_string_value() -> None:
    with pytest.raises(InvalidConfigError) as info:
        TopicConfig.parse({"retention.hours": "1"})
    assert info.value.key == "retention.hours"
    with pytest.raises(InvalidConfigError):
        TopicConfig.parse({"retention.ms": 5})  # type: ignore[dict-item]
    with pytest.raises(InvalidConfigError):
        TopicConfig.parse({"cleanup.policy": "delete" * 1000})


def test_alter_sets_and_resets() -> None:
    base = TopicConfig.parse({"retention.ms": "1000", "segment.bytes": "4096"})
    altered = base.alter({"retention.ms": None, "cleanup.policy": "compact"})
    assert altered.retention_ms == limits.retention_ms_default
    assert altered.segment_bytes == 4096
    assert altered.cleanup_policy == "compact"
    assert altered.to_strings(include_defaults=False) == {"cleanup.policy": "compact", "segment.bytes": "4096"}
    assert base.retention_ms == 1000  # the original is untouched
    assert altered.alter({"cleanup.policy": None, "segment.bytes": None}) == TopicConfig()
    assert base.alter({"retention.bytes": None}) == base  # resetting an unset key is a no-op


def test_alter_rejects_bad_changes_and_changes_nothing() -> None:
    base = TopicConfig.parse({"retention.ms": "1000"})
    with pytest.raises(InvalidConfigError) as info:
        base.alter({"segment.ms": "0"})
    assert info.value.key == "segment.ms"
    with pytest.raises(InvalidConfigError):
        base.alter({"no.such.key": None})
    assert base.retention_ms == 1000


def test_to_log_config() -> None:
    config = TopicConfig.parse(
        {"segment.bytes": "4096", "segment.ms": "10", "retention.ms": "20", "retention.bytes": "30",
         "max.message.bytes": "5000"}
    )
    assert config.to_log_config(1 << 20) == LogConfig(
        segment_bytes=4096, segment_ms=10, retention_ms=20, retention_bytes=30,
        max_message_bytes=5000, preallocate_bytes=1 << 20,
    )
    assert TopicConfig().to_log_config() == LogConfig()


def test_compact_only_topics_get_no_retention() -> None:
    config = TopicConfig.parse({"cleanup.policy": "compact", "retention.ms": "20", "retention.bytes": "30"})
    log_config = config.to_log_config()
    assert (log_config.retention_ms, log_config.retention_bytes) == (-1, -1)
    both = config.alter({"cleanup.policy": "delete,compact"})
    assert both.compacts and both.deletes
    assert (both.to_log_config().retention_ms, both.to_log_config().retention_bytes) == (20, 30)


def test_equal_configs_hash_equal() -> None:
    a = TopicConfig.parse({"cleanup.policy": "delete,compact"})
    b = TopicConfig.parse({"cleanup.policy": "compact,delete"})
    assert a == b and hash(a) == hash(b)
    assert a != TopicConfig()


_VALUES = st.fixed_dictionaries(
    {},
    optional={
        "retention.ms": st.integers(-1, 2**40).map(str),
        "retention.bytes": st.integers(-1, 2**40).map(str),
        "segment.bytes": st.integers(limits.segment_bytes_min, 2**31 - 1).map(str),
        "segment.ms": st.integers(1, 2**40).map(str),
        "cleanup.policy": st.sampled_from(["delete", "compact", "compact,delete", "delete,compact"]),
        "max.message.bytes": st.integers(HEADER_BYTES, limits.batch_bytes_max).map(str),
        "min.insync.replicas": st.integers(1, limits.replication_factor_max).map(str),
        "delete.retention.ms": st.integers(0, 2**40).map(str),
    },
)


@given(_VALUES)
def test_round_trip(values: dict[str, str]) -> None:
    config = TopicConfig.parse(values)
    assert TopicConfig.parse(config.to_strings(include_defaults=False)) == config
    assert TopicConfig.parse(config.to_strings()).to_strings() == config.to_strings()
    assert set(config.to_strings(include_defaults=False)) == set(values)
