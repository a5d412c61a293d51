"""``BrokerConfig``: every setting of one broker, from flags and a TOML file, validated once.

Theory of operation
-------------------
Settings come from three layers, later ones winning: built-in defaults, the ``[broker]`` table
of the file named by ``--config``, and the command-line flags. Every flag has a key of the
same name in the file (``--node-id`` is ``node-id`` or ``node_id``); the file may not name a
key that has no flag (a typo must not pass silently). Each layer is turned into a plain dict
of ``field -> raw value`` (strings from the command line, native TOML values from the file),
the dicts are merged, and each value goes through one converter that checks type and range.
The first bad value raises ``ConfigError`` with a message that names the flag and says what
is accepted; the CLI prints it and exits 1. The result is a frozen ``BrokerConfig``.

Limits from ``protocol.limits`` are ceilings: configuration may lower them, never raise them.
This module is pure apart from reading the ``--config`` file through the injected reader.
"""

from __future__ import annotations

import argparse
import re
import tomllib
from typing import Any, Callable, Mapping, NoReturn, Sequence

import attrs

from rivven_broker.protocol import limits
from rivven_cluster.membership import MembershipConfig

__all__ = [
    "BrokerConfig",
    "ConfigError",
    "HostPort",
    "Peer",
    "config_as_dict",
    "load_config",
    "parser",
]

_I32_MAX = (1 << 31) - 1
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_SYNC_POLICY = re.compile(r"always|none|interval_ms=([0-9]{1,9})")
_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


class ConfigError(ValueError):
    """A setting is malformed or out of range. The message is meant for the operator."""


@attrs.frozen
class HostPort:
    """A TCP endpoint. ``port`` 0 asks the OS for a free port (tests)."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@attrs.frozen
class Peer:
    """Another member of the cluster: its node id and cluster address."""

    node_id: int
    address: HostPort


@attrs.frozen(kw_only=True)
class BrokerConfig:
    """The validated settings of one broker. ``BrokerConfig()`` is the no-argument broker."""

    node_id: int = 1
    data_dir: str = "./data"
    listen: HostPort = HostPort("127.0.0.1", 9092)
    #: ``None``: no HTTP server (``--http off``).
    http: HostPort | None = HostPort("127.0.0.1", 9094)
    peers: tuple[Peer, ...] = ()
    rack: str | None = None
    #: SWIM (UDP) and, later, Raft and replication (TCP). None: the listen host, port + 1.
    cluster_listen: HostPort | None = None
    #: One secret a line; the first signs, all verify (``rivven_cluster.membership.key_ring``).
    cluster_key_file: str | None = None
    #: The client address put in metadata and announced to the cluster (None: ``listen``).
    advertise: HostPort | None = None
    #: ``[cluster]`` table: MembershipConfig fields overridden, as (name, value) pairs.
    cluster: tuple[tuple[str, int | bool], ...] = ()
    #: ``[controller]`` table: the Raft controller's timings overridden (``CONTROLLER_KEYS``).
    controller: tuple[tuple[str, int], ...] = ()
    #: ``always`` | ``interval_ms=N`` | ``none`` (see storage.sync_worker.SyncPolicy).
    sync_policy: str = "always"
    log_level: str = "INFO"
    log_format: str = "text"
    auto_create_topics: bool = True
    default_partitions: int = 3
    #: Replicas of auto-created topics (a clustered broker; capped by the live brokers).
    default_replication_factor: int = 1
    #: A follower not caught up with its leader for this long leaves the ISR.
    replica_lag_time_max_ms: int = 10_000
    idle_timeout_ms: int = limits.idle_timeout_ms
    #: A frame, or an HTTP request head, must be complete this long after its first byte.
    request_timeout_ms: int = limits.request_timeout_ms_default
    #: -1: derived at start from the process's descriptor limit (``descriptors.py``).
    connections_max: int = -1
    http_connections_max: int = limits.http_connections_max_default
    #: Segment and index files kept open at most (-1: derived from the descriptor limit).
    open_files_max: int = -1
    #: Broker-wide bound on unfinished request frames' bytes (0: unbounded).
    queued_request_bytes_max: int = limits.queued_request_bytes_max_default
    in_flight_requests_max: int = limits.in_flight_requests_per_connection_max
    #: Zero-filled bytes kept ahead of the writer in each active segment (0: off; -1: auto,
    #: which is 4 MiB under ``sync_policy=always`` — measured here to cut the fdatasync of
    #: an append by a quarter or more — and off otherwise, where it only costs writes).
    preallocate_bytes: int = -1
    #: A group commit of this many files or more makes them durable with one ``syncfs(2)``
    #: of the data directory's file system (``storage/sync_worker.py``); 0: never, an fsync
    #: per file always (a data directory on a file system shared with heavy writers).
    sync_filesystem_files: int = limits.sync_filesystem_files_min

    @property
    def cluster_address(self) -> HostPort:
        """Where this broker's cluster traffic is received: ``cluster_listen``, or the listen
        host at the client port + 1."""
        if self.cluster_listen is not None:
            return self.cluster_listen
        return HostPort(self.listen.host, self.listen.port + 1 if self.listen.port else 0)

    @property
    def advertised(self) -> HostPort:
        return self.advertise if self.advertise is not None else self.listen

    def membership_config(self) -> MembershipConfig:
        """SWIM's settings: the defaults with the ``[cluster]`` table's overrides."""
        return MembershipConfig(**dict(self.cluster))

    def controller_timings_ms(self) -> dict[str, int]:
        """The Raft controller's timings in ms: the defaults with ``[controller]``'s overrides."""
        return {**CONTROLLER_DEFAULTS_MS, **dict(self.controller)}

    @property
    def preallocate_bytes_effective(self) -> int:
        if self.preallocate_bytes >= 0:
            return self.preallocate_bytes
        return 4 * 1024 * 1024 if self.sync_policy == "always" else 0
    retention_check_interval_ms: int = 300_000
    #: How long a graceful shutdown waits for in-flight requests before cancelling them.
    shutdown_timeout_ms: int = 10_000
    #: Fault injection for tests: delay every transaction's markers this long after its
    #: decision is durable (0: write them at once).
    transaction_marker_delay_ms: int = 0
    #: Partitions of ``__consumer_offsets`` when the broker creates it.
    offsets_topic_partitions: int = 4
    #: Partitions of a cluster's ``__transaction_state`` (a single node keeps one).
    transaction_state_partitions: int = 4
    #: How long a rebalance that starts from an empty group waits for more members.
    group_initial_rebalance_delay_ms: int = limits.initial_rebalance_delay_ms_default
    #: Committed offsets of an empty group expire this long after its last commit.
    offsets_retention_minutes: int = limits.offsets_retention_ms_default // 60_000
    #: How often the log cleaner looks for compacted partitions to clean.
    log_cleaner_backoff_ms: int = 15_000
    #: The background scrubber's rate over sealed segments (0: off).
    scrub_bytes_per_second: int = limits.scrub_bytes_per_second_default
    #: Serve small produce requests of idle connections from one task
    #: (``server/produce_lane.py``); off: every connection reads in its own task.
    produce_lane: bool = True

    def __attrs_post_init__(self) -> None:
        assert 0 <= self.node_id <= _I32_MAX
        assert 1 <= self.default_partitions <= limits.partitions_per_topic_max
        assert 0 < self.idle_timeout_ms <= limits.idle_timeout_ms
        assert self.connections_max == -1 or 0 < self.connections_max <= limits.connections_max
        assert 0 < self.request_timeout_ms <= limits.request_timeout_ms_max
        assert 0 < self.http_connections_max <= limits.http_connections_max
        assert self.open_files_max == -1 or (
            limits.open_files_min <= self.open_files_max <= limits.open_files_max)
        assert 0 <= self.queued_request_bytes_max <= limits.queued_request_bytes_max
        assert 0 < self.in_flight_requests_max <= limits.in_flight_requests_per_connection_max
        assert self.log_level in LOG_LEVELS
        assert _SYNC_POLICY.fullmatch(self.sync_policy)


# --- converters: raw value (str from a flag, native from TOML) -> typed value ---------------


def _fail(flag: str, value: object, accepted: str) -> NoReturn:
    name = flag if flag.startswith("$") else f"--{flag}"  # a flag, or $RIVVEN_... variable
    raise ConfigError(f"{name}: {value!r} is not valid; expected {accepted}")


def _int_in(low: int, high: int) -> Callable[[str, object], int]:
    def convert(flag: str, value: object) -> int:
        if isinstance(value, bool):
            _fail(flag, value, f"an integer in {low}..{high}")
        if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,19}", value.strip()):
            value = int(value.strip())
        if not isinstance(value, int) or not low <= value <= high:
            _fail(flag, value, f"an integer in {low}..{high}")
        return value

    return convert


def _bool(flag: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
        return value.lower() in _TRUE
    _fail(flag, value, "true or false")


def _host_port(flag: str, value: object) -> HostPort:
    if not isinstance(value, str):
        _fail(flag, value, "HOST:PORT")
    text = value.strip()
    match = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:([0-9]{1,5})|([A-Za-z0-9._-]+):([0-9]{1,5})", text)
    if match is None:
        _fail(flag, value, "HOST:PORT (an IPv6 host in brackets)")
    host = match.group(1) or match.group(3)
    port = int(match.group(2) or match.group(4))
    if port > 65535:
        _fail(flag, value, "a port in 0..65535")
    return HostPort(host, port)


def _optional_host_port(flag: str, value: object) -> HostPort | None:
    if isinstance(value, str) and value.strip().lower() in ("off", "none", ""):
        return None
    return _host_port(flag, value)


def _peers(flag: str, value: object) -> tuple[Peer, ...]:
    if isinstance(value, str):
        items: list[object] = [part for part in value.split(",") if part.strip()]
    elif isinstance(value, list):
        items = list(value)
    else:
        _fail(flag, value, "ID@HOST:PORT,... (or a TOML array of such strings)")
    peers = []
    for item in items:
        if not isinstance(item, str) or "@" not in item:
            _fail(flag, item, "ID@HOST:PORT")
        node, _, address = item.strip().partition("@")
        peers.append(Peer(_int_in(0, _I32_MAX)(flag, node), _host_port(flag, address)))
    ids = [peer.node_id for peer in peers]
    if len(set(ids)) != len(ids):
        _fail(flag, value, "distinct node ids")
    return tuple(peers)


def _files_max(flag: str, value: object) -> int:
    number = _int_in(-1, limits.open_files_max)(flag, value)
    if number != -1 and number < limits.open_files_min:
        _fail(flag, value, f"-1 or an integer in {limits.open_files_min}..{limits.open_files_max}")
    return number


def _advertise(flag: str, value: object) -> HostPort:
    address = _host_port(flag, value)
    if address.host in _WILDCARDS or address.port == 0:
        _fail(flag, value, "a concrete HOST:PORT clients can dial (not a wildcard, not port 0)")
    return address


_WILDCARDS = ("0.0.0.0", "::", "")


def _cluster_table(table: object, where: str) -> tuple[tuple[str, int | bool], ...]:
    """The ``[cluster]`` table: MembershipConfig fields with values of their type, > 0."""
    if not isinstance(table, dict):
        raise ConfigError(f"--config: {where}: [cluster] must be a table")
    fields = {field.name: field for field in attrs.fields(MembershipConfig)}
    values: dict[str, int | bool] = {}
    for raw_key, value in table.items():
        key = raw_key.replace("-", "_")
        field = fields.get(key)
        if field is None:
            raise ConfigError(f"--config: {where}: unknown key {raw_key!r} in [cluster] "
                              f"(known: {', '.join(sorted(fields))})")
        if field.type in (bool, "bool"):
            if not isinstance(value, bool):
                raise ConfigError(f"--config: {where}: [cluster] {raw_key} must be true or false")
        elif isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _I32_MAX:
            raise ConfigError(f"--config: {where}: [cluster] {raw_key} must be an integer "
                              f"in 0..{_I32_MAX}")
        values[key] = value
    merged = {**attrs.asdict(MembershipConfig()), **values}
    problems = []
    if not 0 < merged["probe_timeout_ms"] < merged["probe_interval_ms"]:
        problems.append("0 < probe_timeout_ms < probe_interval_ms")
    for key in ("suspicion_multiplier", "suspicion_max_multiplier", "gossip_fanout",
                "gossip_interval_ms", "retransmit_multiplier", "push_pull_interval_ms",
                "join_retry_ms", "reconnect_interval_ms", "awareness_max"):
        if merged[key] < 1:
            problems.append(f"{key} >= 1")
    if merged["indirect_probes"] > 16:
        problems.append("indirect_probes <= 16")
    if merged["members_max"] < 2:
        problems.append("members_max >= 2")
    if not 200 <= merged["payload_bytes_max"] <= 1_300:
        problems.append("200 <= payload_bytes_max <= 1300")
    if problems:
        raise ConfigError(f"--config: {where}: [cluster] needs " + ", ".join(problems))
    return tuple(sorted(values.items()))


#: The ``[controller]`` table's keys and defaults (ms): the Raft controller's timings.
CONTROLLER_DEFAULTS_MS = {
    "tick_ms": 50,
    "append_entries_period_ms": 100,
    "election_timeout_min_ms": 400,
    "election_timeout_max_ms": 1400,
    "leader_fallback_timeout_ms": 2000,
    "propose_timeout_ms": 10_000,
}


def _controller_table(table: object, where: str) -> tuple[tuple[str, int], ...]:
    """The ``[controller]`` table: positive integers of ms, consistent with each other."""
    if not isinstance(table, dict):
        raise ConfigError(f"--config: {where}: [controller] must be a table")
    values: dict[str, int] = {}
    for raw_key, value in table.items():
        key = raw_key.replace("-", "_")
        if key not in CONTROLLER_DEFAULTS_MS:
            raise ConfigError(f"--config: {where}: unknown key {raw_key!r} in [controller] "
                              f"(known: {', '.join(sorted(CONTROLLER_DEFAULTS_MS))})")
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _I32_MAX:
            raise ConfigError(f"--config: {where}: [controller] {raw_key} must be an integer "
                              f"in 1..{_I32_MAX} (ms)")
        values[key] = value
    merged = {**CONTROLLER_DEFAULTS_MS, **values}
    problems = []
    if merged["tick_ms"] > merged["append_entries_period_ms"]:
        problems.append("tick_ms <= append_entries_period_ms")
    if merged["election_timeout_min_ms"] <= 3 * merged["append_entries_period_ms"]:
        problems.append("election_timeout_min_ms > 3 x append_entries_period_ms")
    if merged["election_timeout_max_ms"] <= merged["election_timeout_min_ms"]:
        problems.append("election_timeout_max_ms > election_timeout_min_ms")
    if merged["leader_fallback_timeout_ms"] <= merged["election_timeout_max_ms"]:
        problems.append("leader_fallback_timeout_ms > election_timeout_max_ms")
    if problems:
        raise ConfigError(f"--config: {where}: [controller] needs " + ", ".join(problems))
    return tuple(sorted(values.items()))


def _name(flag: str, value: object) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        _fail(flag, value, "1..64 characters of [A-Za-z0-9._-]")
    return value


def _text(flag: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        _fail(flag, value, "a non-empty string")
    return value


def _sync_policy(flag: str, value: object) -> str:
    text = value.strip().lower() if isinstance(value, str) else value
    if not isinstance(text, str) or (match := _SYNC_POLICY.fullmatch(text)) is None:
        _fail(flag, value, "always, interval_ms=N or none")
    if match.group(1) is not None and int(match.group(1)) <= 0:
        _fail(flag, value, "interval_ms=N with N > 0")
    return text


def _log_level(flag: str, value: object) -> str:
    if not isinstance(value, str) or value.upper() not in LOG_LEVELS:
        _fail(flag, value, "one of " + ", ".join(LOG_LEVELS))
    return value.upper()


LOG_FORMATS = ("text", "json")


def _log_format(flag: str, value: object) -> str:
    if not isinstance(value, str) or value.lower() not in LOG_FORMATS:
        _fail(flag, value, "text or json")
    return value.lower()


@attrs.frozen
class _Option:
    field: str
    metavar: str
    convert: Callable[[str, object], Any]
    help: str

    @property
    def flag(self) -> str:
        return self.field.replace("_", "-")


_OPTIONS: tuple[_Option, ...] = (
    _Option("node_id", "N", _int_in(0, _I32_MAX), "this broker's node id (default 1)"),
    _Option("data_dir", "DIR", _text, "directory of the partition logs (default ./data)"),
    _Option("listen", "HOST:PORT", _host_port, "client listener (default 127.0.0.1:9092)"),
    _Option("http", "HOST:PORT", _optional_host_port, "HTTP /health, /metrics, dashboard "
            "(default 127.0.0.1:9094; 'off' disables)"),
    _Option("peers", "ID@HOST:PORT,...", _peers, "the cluster addresses of the other members "
            "(their --cluster-listen; see docs/operations.md)"),
    _Option("rack", "NAME", _name, "rack of this broker, for replica placement"),
    _Option("cluster_listen", "HOST:PORT", _host_port, "cluster traffic (SWIM over UDP, Raft over TCP) "
            "(default: the listen host, client port + 1)"),
    _Option("cluster_key_file", "FILE", _text, "the cluster's shared secrets, one a line, not "
            "readable by group or others (make one with `rivven cluster keygen`)"),
    _Option("advertise", "HOST:PORT", _advertise, "the client address given to clients and "
            "the cluster (default: --listen; required with a wildcard --listen)"),
    _Option("sync_policy", "POLICY", _sync_policy, "always (default: fsync before ack), "
            "interval_ms=N, or none"),
    _Option("log_level", "LEVEL", _log_level, "DEBUG, INFO (default), WARNING, ERROR"),
    _Option("log_format", "FORMAT", _log_format, "text (default) or json: one JSON object "
            "per line (time, level, logger, message, exception)"),
    _Option("auto_create_topics", "BOOL", _bool, "create unknown topics on produce (default true)"),
    _Option("default_partitions", "N", _int_in(1, limits.partitions_per_topic_max),
            "partitions of auto-created topics (default 3)"),
    _Option("default_replication_factor", "N", _int_in(1, limits.replication_factor_max),
            "replicas of auto-created topics in a cluster (default 1)"),
    _Option("replica_lag_time_max_ms", "MS", _int_in(100, 3_600_000),
            "a follower not caught up with its leader for this long leaves the ISR "
            "(default 10000)"),
    _Option("idle_timeout_ms", "MS", _int_in(1, limits.idle_timeout_ms),
            f"close a silent or stalled client after this (default {limits.idle_timeout_ms})"),
    _Option("request_timeout_ms", "MS", _int_in(1, limits.request_timeout_ms_max),
            "close a connection whose frame (or HTTP request head) is not complete this long "
            f"after its first byte (default {limits.request_timeout_ms_default})"),
    _Option("connections_max", "N", _int_in(-1, limits.connections_max),
            "client connections at most (default -1: half of the descriptors the process may "
            f"open, at most {limits.connections_max})"),
    _Option("open_files_max", "N", _files_max,
            "segment and index files kept open at most, whatever the partitions (default -1: "
            "half of the descriptors the process may open)"),
    _Option("http_connections_max", "N", _int_in(1, limits.http_connections_max),
            f"HTTP connections at most (default {limits.http_connections_max_default})"),
    _Option("queued_request_bytes_max", "BYTES", _int_in(0, limits.queued_request_bytes_max),
            "bytes of partly received requests buffered at once, all connections together; "
            "when spent the broker stops reading until some complete (default "
            f"{limits.queued_request_bytes_max_default}; 0: unbounded)"),
    _Option("in_flight_requests_max", "N",
            _int_in(1, limits.in_flight_requests_per_connection_max),
            "requests in flight per connection before the broker stops reading "
            f"(default {limits.in_flight_requests_per_connection_max})"),
    _Option("preallocate_bytes", "BYTES", _int_in(-1, limits.segment_bytes_default),
            "zero-filled space kept ahead of each active segment (default -1: auto, "
            "4 MiB under sync_policy=always, else off; 0: off)"),
    _Option("sync_filesystem_files", "N", _int_in(0, _I32_MAX),
            "a group commit of N files or more syncs the data directory's file system once "
            f"(syncfs) instead of each file (default {limits.sync_filesystem_files_min}; "
            "0: never)"),
    _Option("retention_check_interval_ms", "MS", _int_in(1, _I32_MAX),
            "how often retention runs (default 300000)"),
    _Option("shutdown_timeout_ms", "MS", _int_in(0, _I32_MAX),
            "graceful shutdown waits this long for in-flight requests (default 10000)"),
    _Option("transaction_marker_delay_ms", "MS", _int_in(0, _I32_MAX),
            "fault injection for tests: write transaction markers this long after the "
            "commit/abort decision (default 0)"),
    _Option("offsets_topic_partitions", "N", _int_in(1, limits.partitions_per_topic_max),
            "partitions of __consumer_offsets when the broker creates it (default 4)"),
    _Option("transaction_state_partitions", "N", _int_in(1, limits.partitions_per_topic_max),
            "partitions of __transaction_state when a cluster creates it (default 4; a "
            "single broker keeps one)"),
    _Option("group_initial_rebalance_delay_ms", "MS",
            _int_in(0, limits.rebalance_timeout_ms_max),
            "a rebalance of an empty group waits this long for more members "
            f"(default {limits.initial_rebalance_delay_ms_default})"),
    _Option("offsets_retention_minutes", "MINUTES", _int_in(1, _I32_MAX // 60_000),
            "committed offsets of an empty group expire after this (default 10080)"),
    _Option("log_cleaner_backoff_ms", "MS", _int_in(1, _I32_MAX),
            "how often the log cleaner compacts compacted topics (default 15000)"),
    _Option("scrub_bytes_per_second", "BYTES", _int_in(0, 1 << 40),
            "the background scrubber checks sealed segments' CRCs at most this fast "
            f"(default {limits.scrub_bytes_per_second_default}; 0: off)"),
    _Option("produce_lane", "BOOL", _bool,
            "serve idle connections' produce requests from one task (default true)"),
)
_BY_KEY: dict[str, _Option] = {}
for _option in _OPTIONS:
    _BY_KEY[_option.field] = _option
    _BY_KEY[_option.flag] = _option


class _Parser(argparse.ArgumentParser):
    """argparse that raises ``ConfigError`` instead of exiting with status 2."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def parser(version: str = "") -> argparse.ArgumentParser:
    """The ``rivven-broker`` argument parser (every value is kept raw; ``load_config`` checks).
    ``version``: what ``--version`` prints (the entry point knows it; empty: no flag)."""
    result = _Parser(
        prog="rivven-broker",
        description="Run a Rivven broker. No arguments: a single-node broker, node id 1, data "
        "in ./data, clients on 127.0.0.1:9092, HTTP on 127.0.0.1:9094.",
        argument_default=argparse.SUPPRESS,
        allow_abbrev=False,
    )
    if version:
        result.add_argument("--version", action="version", version=f"rivven-broker {version}")
    result.add_argument("--config", metavar="FILE.toml", help="read the [broker] table of this "
                        "TOML file; flags and RIVVEN_ environment variables win over it "
                        "(also $RIVVEN_CONFIG)")
    for option in _OPTIONS:
        result.add_argument(f"--{option.flag}", dest=option.field, metavar=option.metavar,
                            help=option.help)
    return result


def _read_file(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def _file_layer(path: str, read_file: Callable[[str], bytes]) -> dict[str, object]:
    try:
        document = tomllib.loads(read_file(path).decode("utf-8"))
    except OSError as exc:
        raise ConfigError(f"--config: cannot read {path}: {exc.strerror or exc}") from exc
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"--config: {path} is not valid TOML: {exc}") from exc
    table = document.get("broker", {})
    if not isinstance(table, dict):
        raise ConfigError(f"--config: {path}: [broker] must be a table")
    unknown = sorted(set(document) - {"broker", "cluster", "controller"})
    if unknown:
        raise ConfigError(f"--config: {path}: unknown table or key {unknown[0]!r} "
                          "(only [broker], [cluster] and [controller])")
    layer: dict[str, object] = {}
    if "cluster" in document:
        layer["cluster"] = _cluster_table(document["cluster"], path)
    if "controller" in document:
        layer["controller"] = _controller_table(document["controller"], path)
    for key, value in table.items():
        option = _BY_KEY.get(key)
        if option is None:
            raise ConfigError(f"--config: {path}: unknown key {key!r} in [broker]")
        if option.field in layer:
            raise ConfigError(f"--config: {path}: {key!r} is given twice")
        layer[option.field] = value
    return layer


def environment_variable(field: str) -> str:
    """The environment variable of a broker option: ``--node-id`` is ``RIVVEN_NODE_ID``."""
    return "RIVVEN_" + field.upper()


def _environment_layer(environ: Mapping[str, str]) -> dict[str, tuple[str, object]]:
    """``field -> (name to report, raw value)`` of every ``RIVVEN_`` option variable set."""
    return {option.field: (f"${environment_variable(option.field)}",
                           environ[environment_variable(option.field)])
            for option in _OPTIONS if environment_variable(option.field) in environ}


def load_config(
    argv: Sequence[str], *, read_file: Callable[[str], bytes] = _read_file,
    environ: Mapping[str, str] | None = None, version: str = "",
) -> BrokerConfig:
    """Build the config from ``argv`` (without the program name), the ``RIVVEN_`` environment
    variables (``environ``; default none) and the ``--config`` file.

    Flags win over the environment, the environment over the file, the file over defaults.
    Blocks only to read the file.

    Raises:
        ConfigError: an unknown flag or key, a malformed or out-of-range value, an unreadable
            or invalid TOML file. The message names the flag (or variable) and what it
            accepts.
    """
    environ = {} if environ is None else environ
    namespace = vars(parser(version).parse_args(list(argv)))
    path = namespace.pop("config", None) or environ.get("RIVVEN_CONFIG") or None
    layers: dict[str, tuple[str, object]] = {}
    if path is not None:
        for field, raw in _file_layer(path, read_file).items():
            layers[field] = ("" if field in ("cluster", "controller") else
                             _BY_KEY[field].flag, raw)
    layers.update(_environment_layer(environ))
    layers.update({field: (f"--{_BY_KEY[field].flag}", raw) for field, raw in namespace.items()})
    values = {}
    for field, (name, raw) in layers.items():
        if field in ("cluster", "controller"):  # the tables, already checked
            values[field] = raw
            continue
        values[field] = _BY_KEY[field].convert(name.removeprefix("--"), raw)
    return BrokerConfig(**values)


def config_as_dict(config: BrokerConfig) -> Mapping[str, object]:
    """The config as plain values (for the startup log line and the dashboard)."""
    result: dict[str, object] = {}
    for field in attrs.fields(BrokerConfig):
        value = getattr(config, field.name)
        if isinstance(value, HostPort):
            value = str(value)
        elif field.name == "peers":
            value = ",".join(f"{peer.node_id}@{peer.address}" for peer in value)
        elif field.name in ("cluster", "controller"):
            value = ", ".join(f"{key}={item}" for key, item in value)
        result[field.name] = value
    return result
