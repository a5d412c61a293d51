"""Parsing the ``format("rivven")`` options into frozen, validated settings.

Theory of operation
-------------------
Spark hands a data source its options as a case-insensitive mapping of strings. This module
turns them, once, into ``ReaderOptions`` or ``WriterOptions``: frozen dataclasses of typed
values, checked up front so a misspelt option or a bad value fails when the query starts (on
the driver) with a message naming the option, never later inside an executor. Option names
follow Spark's Kafka source and sink where the meaning is the same (``subscribe``,
``startingOffsets``, ``maxOffsetsPerTrigger``, ``failOnDataLoss`` ...); docs/spark.md lists
them all.

The settings are plain data (strings, ints, tuples), so readers, partitions and writers that
carry them pickle in microseconds and hold no live resource.

Pure: no I/O, no clocks. Every parse function raises ``OptionError`` (a ``ValueError``) for a
bad option.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Mapping

from rivven_broker.protocol import limits
from rivven_broker.protocol.names import topic_name_error

__all__ = [
    "OptionError",
    "Subscription",
    "ReaderOptions",
    "WriterOptions",
    "parse_reader_options",
    "parse_writer_options",
    "EARLIEST",
    "LATEST",
    "ISOLATION_LEVELS",
]

#: Offset specs in ``startingOffsets``/``endingOffsets`` JSON (Kafka's convention).
EARLIEST = -2
LATEST = -1
ISOLATION_LEVELS = ("read_uncommitted", "read_committed")

_DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
#: Bytes asked of one partition per Fetch: big enough to amortise the per-request cost, small
#: enough that a fetch's buffers stay in the CPU caches and are reused by the allocator
#: (measured in a Spark read of 100 B records: 8 MiB cost the Python worker about a third more
#: CPU than 2 MiB, mostly page faults and cache misses while copying).
_FETCH_BYTES_DEFAULT = 2 * 1024 * 1024
#: Distinct destination topics one writer task may produce to, unless the option says.
MAX_TOPICS_DEFAULT = 100

_READER_KEYS = frozenset(
    {
        "bootstrap", "bootstrap.servers", "subscribe", "subscribepattern", "assign",
        "startingoffsets", "endingoffsets", "maxoffsetspertrigger", "minpartitions",
        "maxrecordsperpartition", "failondataloss", "isolation.level", "isolationlevel",
        "fetchmaxbytes", "requesttimeoutms", "path", "startingtimestamp",
        "startingoffsetsbytimestamp", "endingoffsetsbytimestamp", "endingtimestamp",
        "startingoffsetsbytimestampstrategy", "includeheaders", "minoffsetspertrigger",
        "maxtriggerdelay",
    }
)
#: ``{topic: {partition: timestamp ms}}`` as sorted tuples (picklable, hashable).
Timestamps = tuple[tuple[str, tuple[tuple[int, int], ...]], ...]
_WRITER_KEYS = frozenset(
    {
        "bootstrap", "bootstrap.servers", "topic", "topicallowlist", "maxtopics", "acks",
        "compression", "lingerms", "requesttimeoutms", "exactlyonce", "ledgertopic",
        "checkpointlocation", "path", "queryname",
    }
)


class OptionError(ValueError):
    """An option of ``format("rivven")`` is missing, unknown or malformed."""


@dataclasses.dataclass(frozen=True)
class Subscription:
    """Which partitions a reader follows: exactly one of the three is set.

    ``topics``: fixed topics, every partition (``subscribe``); ``pattern``: every topic whose
    whole name matches the regular expression (``subscribePattern``); ``assign``: fixed
    ``(topic, partition)`` pairs.
    """

    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assign: tuple[tuple[str, int], ...] = ()

    def matches(self, topic: str) -> bool:
        """Whether partitions of ``topic`` belong to the subscription (any partition for
        ``assign`` checks the topic only; see ``wants``)."""
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        if self.assign:
            return any(t == topic for t, _ in self.assign)
        return topic in self.topics

    def wants(self, topic: str, partition: int) -> bool:
        """Whether partition ``partition`` of ``topic`` belongs to the subscription."""
        if self.assign:
            return (topic, partition) in self.assign
        return self.matches(topic)

    def fixed_topics(self) -> tuple[str, ...] | None:
        """The topics to ask metadata for, or None when every topic must be listed."""
        if self.pattern is not None:
            return None
        if self.assign:
            return tuple(sorted({t for t, _ in self.assign}))
        return self.topics


@dataclasses.dataclass(frozen=True)
class ReaderOptions:
    """Everything a reader needs, validated. Offsets specs are ``"earliest"``, ``"latest"``
    or a mapping ``{topic: {partition: offset}}`` with -2/-1 for earliest/latest."""

    bootstrap: str
    subscription: Subscription
    starting: str | tuple[tuple[str, tuple[tuple[int, int], ...]], ...]
    ending: str | tuple[tuple[str, tuple[tuple[int, int], ...]], ...]
    max_offsets_per_trigger: int | None
    min_partitions: int | None
    max_records_per_partition: int | None
    fail_on_data_loss: bool
    isolation_level: str
    fetch_bytes_max: int
    request_timeout_ms: int
    #: ``startingTimestamp`` (every partition) or ``startingOffsetsByTimestamp``; they win
    #: over ``startingOffsets`` for the partitions they cover, as in Spark's Kafka source.
    starting_timestamp: int | None = None
    starting_timestamps: Timestamps = ()
    ending_timestamps: Timestamps = ()
    #: ``endingTimestamp``: one end time for every partition (batch reads).
    ending_timestamp: int | None = None
    #: No record at or after a starting timestamp: "error" (Spark's default) or "latest".
    timestamp_strategy: str = "error"
    #: The ``headers`` column, only when asked (Spark's Kafka source: ``includeHeaders``).
    include_headers: bool = False
    #: Streaming: no micro-batch with fewer new offsets than this, until ``max_trigger_delay_ms``
    #: passed since the last one (Spark Kafka's minOffsetsPerTrigger / maxTriggerDelay).
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60 * 1000

    def starting_spec(self) -> str | dict[str, dict[int, int]]:
        return _spec_dict(self.starting)

    def ending_spec(self) -> str | dict[str, dict[int, int]]:
        return _spec_dict(self.ending)


@dataclasses.dataclass(frozen=True)
class WriterOptions:
    """Everything a writer needs, validated."""

    bootstrap: str
    topic: str | None
    topic_allowlist: tuple[str, ...] | None
    topics_max: int
    acks: str
    compression: str
    linger_ms: int
    request_timeout_ms: int
    exactly_once: bool
    ledger_topic: str | None


#: Spark's Kafka source/sink spellings, so a job ports by changing only ``format("kafka")``
#: (its ``kafka.*`` options are the Kafka client's settings; these mean ours).
_KAFKA_ALIASES = {
    "kafka.bootstrap.servers": "bootstrap",
    "kafka.isolation.level": "isolation.level",
    "kafka.max.partition.fetch.bytes": "fetchmaxbytes",
    "kafka.request.timeout.ms": "requesttimeoutms",
    "kafka.acks": "acks",
    "kafka.compression.type": "compression",
    "kafka.linger.ms": "lingerms",
}
#: Spark Kafka options that change nothing here, accepted so a ported job runs: the source
#: reads without a consumer group, so the group's name has no use.
_KAFKA_IGNORED = frozenset({"kafka.group.id", "groupidprefix"})


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    """Lower-cased keys, Spark Kafka aliases under our names (given twice: refused), the
    Kafka options that change nothing dropped.

    Raises:
        OptionError: an option given twice, or a ``kafka.*`` client setting with no
            counterpart here (named, with the ones that have one).
    """
    out: dict[str, str] = {}
    for key, value in options.items():
        name = str(key).lower()
        if name in _KAFKA_IGNORED:
            continue
        if name.startswith("kafka.") and name not in _KAFKA_ALIASES:
            raise OptionError(
                f"option {key}: this source has no counterpart of that Kafka client setting; "
                f"the kafka.* options it takes are {sorted(_KAFKA_ALIASES)} (docs/spark.md)")
        name = _KAFKA_ALIASES.get(name, name)
        if name in out:
            raise OptionError(f"option {name} is given twice (under {key!r} too)")
        out[name] = str(value)
    return out


def _check_known(options: dict[str, str], known: frozenset[str], kind: str) -> None:
    unknown = sorted(key for key in options if key not in known)
    if unknown:
        raise OptionError(f"unknown {kind} option(s) {unknown}; see docs/spark.md")


def _int(options: dict[str, str], key: str, default: int | None, lo: int = 1) -> int | None:
    text = options.get(key)
    if text is None:
        return default
    try:
        value = int(text.strip())
    except ValueError:
        raise OptionError(f"option {key} must be an integer, not {text!r}") from None
    if value < lo:
        raise OptionError(f"option {key} must be >= {lo}, not {value}")
    return value


def _bool(options: dict[str, str], key: str, default: bool) -> bool:
    text = options.get(key)
    if text is None:
        return default
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise OptionError(f"option {key} must be true or false, not {text!r}")
    return lowered == "true"


def _bootstrap(options: dict[str, str]) -> str:
    value = options.get("bootstrap", options.get("bootstrap.servers", _DEFAULT_BOOTSTRAP))
    if not value.strip():
        raise OptionError("option bootstrap must name at least one HOST:PORT")
    return value.strip()


def _topic(name: str, option: str) -> str:
    if topic_name_error(name) is not None:
        raise OptionError(f"option {option}: {name!r} is not a legal topic name")
    return name


def _subscription(options: dict[str, str]) -> Subscription:
    given = [key for key in ("subscribe", "subscribepattern", "assign") if key in options]
    if len(given) != 1:
        raise OptionError(
            "exactly one of the options subscribe, subscribePattern, assign is required"
            f" (got {given or 'none'})"
        )
    key = given[0]
    text = options[key]
    if key == "subscribe":
        topics = tuple(sorted({_topic(t.strip(), key) for t in text.split(",") if t.strip()}))
        if not topics:
            raise OptionError("option subscribe names no topic")
        return Subscription(topics=topics)
    if key == "subscribepattern":
        try:
            re.compile(text)
        except re.error as error:
            raise OptionError(f"option subscribePattern is not a regex: {error}") from None
        return Subscription(pattern=text)
    parsed = _json(text, key)
    pairs = set()
    for topic, partitions in parsed.items():
        if not isinstance(partitions, list) or not all(type(p) is int for p in partitions):
            raise OptionError(f'option assign: want {{"topic": [0, 1]}}, got {text!r}')
        for partition in partitions:
            if not 0 <= partition < limits.partitions_per_topic_max:
                raise OptionError(f"option assign: bad partition {partition} of {topic!r}")
            pairs.add((_topic(topic, key), partition))
    if not pairs:
        raise OptionError("option assign names no partition")
    return Subscription(assign=tuple(sorted(pairs)))


def _json(text: str, key: str) -> dict:
    try:
        parsed = json.loads(text)
    except ValueError:
        raise OptionError(f"option {key} is not valid JSON: {text!r}") from None
    if not isinstance(parsed, dict):
        raise OptionError(f"option {key} must be a JSON object, got {text!r}")
    return parsed


def _offsets_spec(
    options: dict[str, str], key: str, default: str, allowed: tuple[str, ...]
) -> str | tuple[tuple[str, tuple[tuple[int, int], ...]], ...]:
    text = options.get(key, default).strip()
    if text.lower() in allowed:
        return text.lower()
    if not text.startswith("{"):
        raise OptionError(f"option {key} must be one of {allowed} or JSON, not {text!r}")

    def check(topic: str, partition: str, offset: object) -> None:
        if type(offset) is not int or offset < EARLIEST:
            raise OptionError(f"option {key}: bad offset {offset!r} for {topic}/{partition}")
        if offset == EARLIEST and "earliest" not in allowed:
            raise OptionError(f"option {key}: -2 (earliest) is not allowed here")

    return _per_partition(text, key, '{"topic": {"0": 42}}', check)


def _per_partition(text: str, key: str, example: str, check: Any) -> Timestamps:
    """A ``{"topic": {"partition": int}}`` option as sorted tuples; ``check(topic,
    partition, value)`` refuses a bad value."""
    topics = []
    for topic, partitions in sorted(_json(text, key).items()):
        if not isinstance(partitions, dict):
            raise OptionError(f"option {key}: want {example}, got {text!r}")
        entries = []
        for partition, value in partitions.items():
            try:
                number = int(partition)
            except ValueError:
                raise OptionError(f"option {key}: bad partition {partition!r}") from None
            check(topic, partition, value)
            entries.append((number, value))
        topics.append((_topic(topic, key), tuple(sorted(entries))))
    return tuple(topics)


def _timestamps(options: dict[str, str], key: str) -> Timestamps:
    """``{"topic": {"0": ms, ...}}`` of a ``...ByTimestamp`` option, as sorted tuples."""
    text = options.get(key)
    if text is None:
        return ()

    def check(topic: str, partition: str, ms: object) -> None:
        if type(ms) is not int or ms < 0:
            raise OptionError(f"option {key}: bad timestamp {ms!r} for {topic}/{partition}")

    return _per_partition(text, key, '{"topic": {"0": 1700000000000}}', check)


_DURATION_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000}


def _duration_ms(options: dict[str, str], key: str, default: int) -> int:
    """A Spark duration: ``500ms``, ``30s``, ``15m``, ``1h`` (a bare number is ms)."""
    text = options.get(key)
    if text is None:
        return default
    match = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", text.lower())
    if match is None or match.group(2) not in ("", *_DURATION_UNITS):
        raise OptionError(f"option {key} must be a duration such as 30s or 15m, not {text!r}")
    return int(match.group(1)) * _DURATION_UNITS.get(match.group(2), 1)


def _spec_dict(spec: str | tuple) -> str | dict[str, dict[int, int]]:
    if isinstance(spec, str):
        return spec
    return {topic: dict(partitions) for topic, partitions in spec}


def parse_reader_options(options: Mapping[str, str], *, streaming: bool) -> ReaderOptions:
    """Validate reader options. ``streaming`` picks defaults: a stream starts at ``latest``
    and has no end; a batch read defaults to ``earliest`` .. ``latest``.

    Raises:
        OptionError: a missing, unknown or malformed option.
    """
    lowered = _lower(options)
    _check_known(lowered, _READER_KEYS, "reader")
    if streaming and "endingoffsets" in lowered:
        raise OptionError("option endingOffsets applies to batch reads (spark.read) only")
    for key, name in (("maxoffsetspertrigger", "maxOffsetsPerTrigger"),
                      ("minoffsetspertrigger", "minOffsetsPerTrigger"),
                      ("maxtriggerdelay", "maxTriggerDelay")):
        if not streaming and key in lowered:
            raise OptionError(f"option {name} applies to streaming reads only")
    for key, name in (("endingoffsetsbytimestamp", "endingOffsetsByTimestamp"),
                      ("endingtimestamp", "endingTimestamp")):
        if streaming and key in lowered:
            raise OptionError(f"option {name} applies to batch reads only")
    strategy = lowered.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise OptionError("option startingOffsetsByTimestampStrategy must be error or latest")
    isolation = lowered.get("isolation.level", lowered.get("isolationlevel", ISOLATION_LEVELS[0]))
    if isolation not in ISOLATION_LEVELS:
        raise OptionError(f"option isolation.level must be one of {ISOLATION_LEVELS}")
    fetch_bytes = _int(lowered, "fetchmaxbytes", _FETCH_BYTES_DEFAULT)
    assert fetch_bytes is not None
    if fetch_bytes > limits.fetch_partition_bytes_max:
        raise OptionError(f"option fetchMaxBytes must be <= {limits.fetch_partition_bytes_max}")
    timeout_ms = _int(lowered, "requesttimeoutms", 30_000)
    assert timeout_ms is not None
    lowest = _int(lowered, "minoffsetspertrigger", None)
    highest = _int(lowered, "maxoffsetspertrigger", None)
    if lowest is not None and highest is not None and lowest > highest:
        raise OptionError(f"option minOffsetsPerTrigger ({lowest}) is greater than "
                          f"maxOffsetsPerTrigger ({highest})")
    return ReaderOptions(
        bootstrap=_bootstrap(lowered),
        subscription=_subscription(lowered),
        starting=_offsets_spec(
            lowered, "startingoffsets", "latest" if streaming else "earliest",
            ("earliest", "latest"),
        ),
        ending=_offsets_spec(lowered, "endingoffsets", "latest", ("latest",)),
        max_offsets_per_trigger=highest,
        min_partitions=_int(lowered, "minpartitions", None),
        max_records_per_partition=_int(lowered, "maxrecordsperpartition", None),
        fail_on_data_loss=_bool(lowered, "failondataloss", True),
        isolation_level=isolation,
        fetch_bytes_max=fetch_bytes,
        request_timeout_ms=timeout_ms,
        starting_timestamp=_int(lowered, "startingtimestamp", None, lo=0),
        starting_timestamps=_timestamps(lowered, "startingoffsetsbytimestamp"),
        ending_timestamps=_timestamps(lowered, "endingoffsetsbytimestamp"),
        ending_timestamp=_int(lowered, "endingtimestamp", None, lo=0),
        timestamp_strategy=strategy,
        include_headers=_bool(lowered, "includeheaders", False),
        min_offsets_per_trigger=lowest,
        max_trigger_delay_ms=_duration_ms(lowered, "maxtriggerdelay", 15 * 60 * 1000),
    )


def parse_writer_options(options: Mapping[str, str]) -> WriterOptions:
    """Validate writer options (the input schema is checked separately).

    Raises:
        OptionError: a missing, unknown or malformed option.
    """
    lowered = _lower(options)
    _check_known(lowered, _WRITER_KEYS, "writer")
    topic = lowered.get("topic")
    if topic is not None:
        topic = _topic(topic.strip(), "topic")
    allowlist = None
    if "topicallowlist" in lowered:
        names = {t.strip() for t in lowered["topicallowlist"].split(",") if t.strip()}
        allowlist = tuple(sorted(_topic(t, "topicAllowlist") for t in names))
        if topic is not None and topic not in allowlist:
            raise OptionError(f"option topic {topic!r} is not in topicAllowlist")
    acks = lowered.get("acks", "all")
    if acks not in ("all", "-1", "1", "0"):
        raise OptionError(f"option acks must be all, 1 or 0, not {acks!r}")
    compression = lowered.get("compression", "none")
    if compression not in ("none", "gzip", "snappy", "lz4", "zstd"):
        raise OptionError("option compression must be none, gzip, snappy, lz4 or zstd, not "
                          f"{compression!r}")
    ledger = lowered.get("ledgertopic")
    if ledger is not None:
        ledger = _topic(ledger.strip(), "ledgerTopic")
    exactly_once = _bool(lowered, "exactlyonce", True)
    if exactly_once and acks not in ("all", "-1"):
        raise OptionError("option exactlyOnce=true needs acks=all (or set exactlyOnce=false)")
    topics_max = _int(lowered, "maxtopics", MAX_TOPICS_DEFAULT)
    linger_ms = _int(lowered, "lingerms", 5, lo=0)
    timeout_ms = _int(lowered, "requesttimeoutms", 30_000)
    assert topics_max is not None and linger_ms is not None and timeout_ms is not None
    return WriterOptions(
        bootstrap=_bootstrap(lowered),
        topic=topic,
        topic_allowlist=allowlist,
        topics_max=topics_max,
        acks=acks,
        compression=compression,
        linger_ms=linger_ms,
        request_timeout_ms=timeout_ms,
        exactly_once=exactly_once,
        ledger_topic=ledger,
    )
