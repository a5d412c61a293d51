"""Client configuration: every knob with its default, unit and bound, checked once.

Theory of operation
-------------------
``Producer``/``Consumer``/``Admin`` (blocking and trio) take keyword arguments and build one
frozen config object here. Validation happens at construction and raises ``ValueError`` with
the option's name, so a bad option fails before any socket opens. Defaults follow Kafka's
client where the meaning is the same (``linger_ms`` 5, ``delivery_timeout_ms`` 120 s,
``max_in_flight_requests_per_connection`` 5, ``fetch_max_wait_ms`` 500 ...) and CONTRACT.md
where it names one (``batch_size_bytes`` 1 MiB). Bounds come from ``protocol.limits``.
"""

from __future__ import annotations

import difflib
from typing import Any, Callable

import attrs

from rivven_broker.protocol import limits
from rivven_broker.protocol.assignors import ASSIGNOR_NAMES
from rivven_broker.records.builder import COMPRESSIONS

__all__ = [
    "ConnectionConfig",
    "ProducerConfig",
    "ConsumerConfig",
    "ACKS_BY_NAME",
    "build_configs",
    "normalise_acks",
    "translate_options",
    "bootstrap_and_topics",
    "serialize",
    "deserialize",
    "KAFKA_PYTHON_ALIASES",
    "KAFKA_PYTHON_UNSUPPORTED",
]

ACKS_BY_NAME = {"all": -1, "-1": -1, -1: -1, "1": 1, 1: 1, "0": 0, 0: 0}
_MiB = 1024 * 1024


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, not {value!r}")


def _non_negative(name: str, value: int) -> None:
    if not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, not {value!r}")


@attrs.frozen(kw_only=True)
class ConnectionConfig:
    """What every client needs to reach brokers."""

    client_id: str = "rivven-python"
    connect_timeout_ms: int = 10_000
    request_timeout_ms: int = 30_000
    reconnect_backoff_ms: int = 50
    reconnect_backoff_max_ms: int = 1000
    metadata_max_age_ms: int = 300_000
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 1000

    def __attrs_post_init__(self) -> None:
        if len(self.client_id.encode()) > limits.client_id_bytes_max:
            raise ValueError(f"client_id is longer than {limits.client_id_bytes_max} bytes")
        for name in ("connect_timeout_ms", "request_timeout_ms", "metadata_max_age_ms"):
            _positive(name, getattr(self, name))
        for name in ("reconnect_backoff_ms", "retry_backoff_ms"):
            _non_negative(name, getattr(self, name))
        if self.reconnect_backoff_max_ms < self.reconnect_backoff_ms:
            raise ValueError("reconnect_backoff_max_ms must be >= reconnect_backoff_ms")
        if self.retry_backoff_max_ms < self.retry_backoff_ms:
            raise ValueError("retry_backoff_max_ms must be >= retry_backoff_ms")


@attrs.frozen(kw_only=True)
class ProducerConfig:
    """Producer options (see docs/client.md for each)."""

    acks: int = -1
    linger_ms: int = 5
    batch_size_bytes: int = _MiB
    compression: str = "none"
    buffer_memory_bytes: int = 32 * _MiB
    max_block_ms: int = 60_000
    delivery_timeout_ms: int = 120_000
    max_in_flight_requests_per_connection: int = 5
    request_bytes_max: int = 16 * _MiB
    retries: int = 2_147_483_647
    #: None (the default): idempotent when ``acks`` is all and at most 5 requests are in
    #: flight per connection, else not; True or False: as asked (True needs both).
    idempotent: bool | None = None
    transactional_id: str | None = None
    transaction_timeout_ms: int = limits.transaction_timeout_ms_default
    allow_auto_topic_creation: bool = True
    #: Called on every key / value given to ``send`` (not on None); must return bytes.
    key_serializer: Callable[[Any], bytes] | None = None
    value_serializer: Callable[[Any], bytes] | None = None

    def __attrs_post_init__(self) -> None:
        for name in ("key_serializer", "value_serializer"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                raise ValueError(f"{name} must be callable")
        if self.acks not in (-1, 0, 1):
            raise ValueError(f"acks must be 'all', 1 or 0, not {self.acks!r}")
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {', '.join(COMPRESSIONS)}, not "
                             f"{self.compression!r}")
        _non_negative("linger_ms", self.linger_ms)
        _non_negative("max_block_ms", self.max_block_ms)
        _non_negative("retries", self.retries)
        for name in ("buffer_memory_bytes", "delivery_timeout_ms", "request_bytes_max"):
            _positive(name, getattr(self, name))
        if not 1024 <= self.batch_size_bytes <= limits.batch_bytes_max:
            raise ValueError(f"batch_size_bytes must be in [1024, {limits.batch_bytes_max}]")
        if not 0 < self.max_in_flight_requests_per_connection <= (
            limits.in_flight_requests_per_connection_max
        ):
            raise ValueError(
                "max_in_flight_requests_per_connection must be in "
                f"[1, {limits.in_flight_requests_per_connection_max}]"
            )
        if self.request_bytes_max > limits.frame_bytes_max // 2:
            raise ValueError(f"request_bytes_max must be <= {limits.frame_bytes_max // 2}")
        if self.delivery_timeout_ms < self.linger_ms:
            raise ValueError("delivery_timeout_ms must be >= linger_ms")
        if not 1 <= self.transaction_timeout_ms <= limits.transaction_timeout_ms_max:
            raise ValueError(
                f"transaction_timeout_ms must be in [1, {limits.transaction_timeout_ms_max}]"
            )
        if self.transactional_id is not None:
            if not self.transactional_id or len(self.transactional_id.encode()) > (
                limits.wire_name_bytes_max
            ):
                raise ValueError("transactional_id must be a non-empty string of <= 1024 bytes")
            if self.idempotent is False:
                raise ValueError("a transactional producer is idempotent (idempotent=False given)")
        if self.idempotent or self.transactional_id is not None:
            if self.acks != -1:
                raise ValueError("an idempotent or transactional producer needs acks='all'")
            if self.max_in_flight_requests_per_connection > limits.producer_batches_retained:
                raise ValueError(
                    "an idempotent producer keeps at most "
                    f"{limits.producer_batches_retained} requests in flight per connection"
                )

    @property
    def idempotence(self) -> bool:
        """Whether this producer stamps producer ids and sequences (see ``idempotent``)."""
        if self.idempotent is not None or self.transactional_id is not None:
            return bool(self.idempotent) or self.transactional_id is not None
        return (
            self.acks == -1
            and self.max_in_flight_requests_per_connection <= limits.producer_batches_retained
        )


@attrs.frozen(kw_only=True)
class ConsumerConfig:
    """Consumer options (see docs/client.md for each)."""

    group_id: str | None = None
    auto_offset_reset: str = "latest"
    enable_auto_commit: bool = True
    isolation_level: str = "read_uncommitted"
    fetch_max_wait_ms: int = 500
    fetch_min_bytes: int = 1
    fetch_max_bytes: int = 50 * _MiB
    max_partition_fetch_bytes: int = _MiB
    max_poll_records: int = 500
    check_crcs: bool = True
    # --- consumer groups (docs/consumer-groups.md) ---
    #: Static membership: a restart within the session timeout keeps the partitions.
    group_instance_id: str | None = None
    session_timeout_ms: int = limits.session_timeout_ms_default
    heartbeat_interval_ms: int = 3_000
    #: Longest time between two ``poll`` calls before the member leaves the group (KIP-62).
    max_poll_interval_ms: int = 300_000
    #: How long the coordinator waits for every member to rejoin in a rebalance.
    rebalance_timeout_ms: int = 60_000
    auto_commit_interval_ms: int = 5_000
    #: Assignor names, most preferred first (a str or a sequence of them).
    partition_assignment_strategy: tuple[str, ...] = attrs.field(
        default=("cooperative-sticky",),
        converter=lambda v: (v,) if isinstance(v, str) else tuple(v),
    )
    #: Pause Python's (process-wide) cyclic garbage collector while ``poll`` decodes: a
    #: third less decode time on large fetches; off unless asked (client/_collector.py).
    pause_gc_while_decoding: bool = False
    #: Called on every non-None key / value ``poll`` returns.
    key_deserializer: Callable[[bytes], Any] | None = None
    value_deserializer: Callable[[bytes], Any] | None = None

    def __attrs_post_init__(self) -> None:
        for name in ("key_deserializer", "value_deserializer"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                raise ValueError(f"{name} must be callable")
        self._check_group_options()
        if self.auto_offset_reset not in ("earliest", "latest", "none"):
            raise ValueError("auto_offset_reset must be 'earliest', 'latest' or 'none'")
        if self.isolation_level not in ("read_uncommitted", "read_committed"):
            raise ValueError("isolation_level must be 'read_uncommitted' or 'read_committed'")
        if not 0 <= self.fetch_max_wait_ms <= limits.fetch_wait_ms_max:
            raise ValueError(f"fetch_max_wait_ms must be in [0, {limits.fetch_wait_ms_max}]")
        _non_negative("fetch_min_bytes", self.fetch_min_bytes)
        if not 0 < self.fetch_max_bytes <= limits.fetch_bytes_max:
            raise ValueError(f"fetch_max_bytes must be in [1, {limits.fetch_bytes_max}]")
        if not 0 < self.max_partition_fetch_bytes <= limits.fetch_partition_bytes_max:
            raise ValueError(
                f"max_partition_fetch_bytes must be in [1, {limits.fetch_partition_bytes_max}]"
            )
        _positive("max_poll_records", self.max_poll_records)

    def _check_group_options(self) -> None:
        if self.group_id is not None and not 0 < len(self.group_id.encode()) <= (
            limits.group_id_bytes_max
        ):
            raise ValueError(f"group_id must be 1..{limits.group_id_bytes_max} bytes")
        if self.group_instance_id is not None and not 0 < len(
            self.group_instance_id.encode()
        ) <= limits.group_instance_id_bytes_max:
            raise ValueError("group_instance_id must be a non-empty string of <= 256 bytes")
        if not limits.session_timeout_ms_min <= self.session_timeout_ms <= (
            limits.session_timeout_ms_max
        ):
            raise ValueError(
                f"session_timeout_ms must be in [{limits.session_timeout_ms_min}, "
                f"{limits.session_timeout_ms_max}]"
            )
        if not 0 < self.heartbeat_interval_ms < self.session_timeout_ms:
            raise ValueError("heartbeat_interval_ms must be in [1, session_timeout_ms)")
        _positive("max_poll_interval_ms", self.max_poll_interval_ms)
        if self.max_poll_interval_ms < self.heartbeat_interval_ms:
            raise ValueError("max_poll_interval_ms must be >= heartbeat_interval_ms")
        if not 0 < self.rebalance_timeout_ms <= limits.rebalance_timeout_ms_max:
            raise ValueError(
                f"rebalance_timeout_ms must be in [1, {limits.rebalance_timeout_ms_max}]"
            )
        _positive("auto_commit_interval_ms", self.auto_commit_interval_ms)
        strategies = self.partition_assignment_strategy
        unknown = [name for name in strategies if name not in ASSIGNOR_NAMES]
        if not strategies or unknown or len(set(strategies)) != len(strategies):
            raise ValueError(
                "partition_assignment_strategy must name distinct assignors among "
                + ", ".join(ASSIGNOR_NAMES)
            )


#: kafka-python's option names that mean one of ours (docs/client.md has the table).
KAFKA_PYTHON_ALIASES = {
    "batch_size": "batch_size_bytes",
    "compression_type": "compression",
    "enable_idempotence": "idempotent",
    "buffer_memory": "buffer_memory_bytes",
    "max_request_size": "request_bytes_max",
}
#: kafka-python options that have no meaning here and are accepted only with these values
#: (None: any value), so a ported script runs; anything else fails as unknown would.
KAFKA_PYTHON_IGNORED: dict[str, tuple[object, ...] | None] = {
    "api_version": None,  # our client speaks our protocol; there is nothing to negotiate
    "api_version_auto_timeout_ms": None,
    "security_protocol": ("PLAINTEXT",),  # no TLS or SASL yet: anything else must not pass
    "exclude_internal_topics": (True,),  # internal topics are never listed or matched
}
#: kafka-python options this client does not have, with what to do instead: an unknown
#: option fails, but one a kafka-python user will try says why instead of a wrong guess.
KAFKA_PYTHON_UNSUPPORTED: dict[str, str] = {
    "partitioner": "pass partition= to send(), or a key (murmur2, as Kafka's default)",
    "connections_max_idle_ms": "connections stay open while the client lives",
    "receive_buffer_bytes": "sockets keep the operating system's buffer sizes",
    "send_buffer_bytes": "sockets keep the operating system's buffer sizes",
    "socket_options": "sockets keep the operating system's defaults (TCP_NODELAY on)",
    "selector": "the client runs its own threads",
    "metric_reporters": "metrics() returns the figures; there are no reporters",
    "metrics_num_samples": "metrics() returns the figures; there are no reporters",
    "metrics_sample_window_ms": "metrics() returns the figures; there are no reporters",
    "metric_group_prefix": "metrics() returns the figures; there are no reporters",
    "default_offset_commit_callback": "pass callback= to commit_async()",
    "ssl_context": "no TLS yet (security_protocol PLAINTEXT only)",
    "sasl_mechanism": "no SASL yet (security_protocol PLAINTEXT only)",
}


DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


def _looks_like_address(text: object) -> bool:
    return not isinstance(text, str) or any(c in text for c in ":,[")


def bootstrap_and_topics(args: tuple, bootstrap: object, options: dict, *,
                         takes_topics: bool) -> tuple[object, tuple[str, ...]]:
    """The bootstrap address and the topics of a client's arguments, as ours
    (``Consumer("h:9092")``, ``bootstrap=``) and as kafka-python writes them
    (``KafkaConsumer(*topics, bootstrap_servers="h:9092" or ["h:9092", ...])``). Pops
    ``bootstrap_servers`` from ``options``.

    Raises:
        ValueError: the same address given twice differently; a consumer's single argument
            without a port (a topic meant as kafka-python's, or a host?), said at once rather
            than as a failed connection later.
        TypeError: topics given to a client that takes none.
    """
    servers = options.pop("bootstrap_servers", None)
    if isinstance(servers, (list, tuple)):
        servers = ",".join(servers)
    if bootstrap is not None and servers is not None and bootstrap != servers:
        raise ValueError(f"bootstrap={bootstrap!r} and bootstrap_servers={servers!r} differ")
    given = bootstrap if bootstrap is not None else servers
    if given is None and len(args) == 1 and (_looks_like_address(args[0]) or not takes_topics):
        return args[0], ()
    if given is None and args:
        if not takes_topics:
            raise TypeError("one bootstrap address HOST:PORT[,HOST:PORT...] is expected")
        raise ValueError(
            f"{', '.join(map(repr, args))}: the first argument is the bootstrap address "
            "HOST:PORT, and a name without a port could be a host or a topic. Write "
            f"'{args[0]}:9092' for a broker, or name the topics with the brokers as "
            f"kafka-python does: Consumer({args[0]!r}, bootstrap_servers='HOST:PORT')")
    if args and not takes_topics:
        raise TypeError("topics are not an argument of this client")
    return (DEFAULT_BOOTSTRAP if given is None else given), tuple(args)


def serialize(config: ProducerConfig, key: Any, value: Any) -> tuple[Any, Any]:
    """``key_serializer`` / ``value_serializer`` applied (to what is not None)."""
    if key is not None and config.key_serializer is not None:
        key = config.key_serializer(key)
    if value is not None and config.value_serializer is not None:
        value = config.value_serializer(value)
    return key, value


def deserialize(config: ConsumerConfig, records: list) -> list:
    """``key_deserializer`` / ``value_deserializer`` applied to polled records."""
    keys, values = config.key_deserializer, config.value_deserializer
    return [record._replace(
        key=record.key if keys is None or record.key is None else keys(record.key),
        value=record.value if values is None or record.value is None else values(record.value))
        for record in records]


def _compression_name(value: object) -> object:
    """kafka-python's ``compression_type`` (None for none) as our ``compression``."""
    return "none" if value is None else value


def translate_options(options: dict) -> dict:
    """kafka-python's spellings as ours (``KAFKA_PYTHON_ALIASES``), ignorable options dropped.

    Raises:
        ValueError: an option given under both names, or an ignorable one with a value that
            would change behaviour (``security_protocol="SSL"``).
    """
    out = {}
    for key, value in options.items():
        if key in KAFKA_PYTHON_IGNORED:
            allowed = KAFKA_PYTHON_IGNORED[key]
            if allowed is not None and value not in allowed:
                raise ValueError(f"{key}={value!r} is not supported (only "
                                 f"{', '.join(map(repr, allowed))})")
            continue
        name = KAFKA_PYTHON_ALIASES.get(key, key)
        if name in out:
            raise ValueError(f"{name} is given twice ({key} is kafka-python's name for it)")
        out[name] = _compression_name(value) if key == "compression_type" else value
    return out


def build_configs(options: dict, *classes: type) -> tuple:
    """Split keyword ``options`` among config ``classes`` by field name (kafka-python's
    names accepted too: ``translate_options``).

    Raises:
        TypeError: an option no class knows (a typo must not pass silently); the message
            names the closest known option.
        ValueError: a value a config rejects.
    """
    remaining = translate_options(options)
    built = []
    known: set[str] = set()
    for cls in classes:
        names = {field.name for field in attrs.fields(cls)}
        known |= names
        mine = {key: remaining.pop(key) for key in list(remaining) if key in names}
        built.append(cls(**mine))
    if remaining:
        hints = []
        for key in sorted(remaining):
            instead = KAFKA_PYTHON_UNSUPPORTED.get(key) or (
                "no TLS or SASL yet (security_protocol PLAINTEXT only)"
                if key.startswith(("ssl_", "sasl_")) else None)
            if instead is not None:
                hints.append(f"{key} (a kafka-python option this client does not have: "
                             f"{instead})")
                continue
            close = difflib.get_close_matches(
                key, sorted(known | {k for k, v in KAFKA_PYTHON_ALIASES.items() if v in known}),
                n=1, cutoff=0.6)
            hints.append(f"{key} (did you mean {close[0]}?)" if close else key)
        raise TypeError(f"unknown option(s): {', '.join(hints)}")
    return tuple(built)


def normalise_acks(acks: object) -> int:
    """``"all"``/-1, 1, 0 (also as strings) -> the wire value. Raises ValueError."""
    try:
        return ACKS_BY_NAME[acks]  # type: ignore[index]
    except (KeyError, TypeError):
        raise ValueError(f"acks must be 'all', 1 or 0, not {acks!r}") from None
