"""Scenario files: what to run, for how long, with which faults, and what to check.

Theory of operation
-------------------
A scenario is a TOML file (the format is documented in ``docs/simulation.md``); ``load``
parses and validates it into a frozen ``Scenario`` or raises ``ScenarioError`` naming the
table and key. Durations are strings with a unit (``"250ms"``, ``"30s"``, ``"2m"``) or
integers in milliseconds; everything inside is milliseconds. Unknown keys are errors: a typo
must not silently turn a fault off.

Tables: ``[run]`` (seed, virtual duration, quiet period), ``[nodes]``, ``[network]``,
``[disk]``, ``[workload]`` (topics, ``[[workload.producers]]``, ``[[workload.consumers]]``),
``[[faults]]`` (an explicit timeline), ``[nemesis]`` (seeded random faults with weights),
``[checks]`` and ``[test]`` (test-only bug switches that prove the checkers bite; never in a
shipped scenario). ``Fault`` is also the unit of a *realised schedule*: the file ``--replay``
reads holds the same ``[[faults]]`` list, fully resolved.

This module is pure: it parses bytes and builds values.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from typing import Any, Mapping

import attrs

from rivven_broker.client.config import ConsumerConfig
from rivven_broker.protocol import limits
from sim.datagrams import DatagramConfig
from sim.disk import DiskConfig
from sim.net import NetworkConfig

__all__ = [
    "ScenarioError",
    "Fault",
    "FAULT_KINDS",
    "TopicSpec",
    "ProducerSpec",
    "ConsumerSpec",
    "NodesSpec",
    "NemesisSpec",
    "ChecksSpec",
    "TestSwitches",
    "Scenario",
    "load",
    "loads",
    "parse_duration_ms",
    "parse_faults",
    "format_duration",
]

_DURATION = re.compile(r"\s*([-+]?[0-9]+(?:\.[0-9]+)?)\s*(us|ms|s|m|h)\s*")
_UNIT_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}
#: A producer's values (x records per send) at most: one send's batch stays far below the
#: broker's batch bound and the replica link's 1 MiB per-partition answers hold several.
_VALUE_BYTES_MAX = 256 * 1024
#: Fault kinds and the keys each takes besides ``at`` and ``kind``.
FAULT_KINDS: dict[str, frozenset[str]] = {
    "crash": frozenset({"node", "restart_after", "tear"}),
    "restart": frozenset({"node"}),
    "pause": frozenset({"node", "for"}),
    "clock": frozenset({"node", "offset", "rate"}),
    "disk": frozenset({"node", "error", "count", "for"}),
    "partition": frozenset({"groups", "between", "for"}),
    "stall": frozenset({"between", "for"}),
    "reset": frozenset({"between", "node"}),
    # datagrams from the first to the second of 'between' are dropped (not the other way)
    "one_way": frozenset({"between", "for"}),
}
DISK_ERRORS = ("eio", "enospc")
ISOLATIONS = ("read_uncommitted", "read_committed")
INVARIANTS = (
    "no_lost_acked_writes",
    "offset_agreement",
    "monotonic_gapless",
    "no_duplicates",
    "no_failed_write_visible",
    "reads_durable",
    "batches_intact",
    "group_offsets_within_log",
    "group_commits_durable",
    "group_once_per_generation",
    "transactions_atomic",
    "node_stops_after_fsync_failure",
    "storage_invariants",
    "no_unexpected_node_failure",
    "liveness",
    "membership_detects_crashes",
    "membership_no_false_dead",
    "membership_converges",
    "membership_wrong_key_excluded",
    "controller_one_leader_per_term",
    "controller_logs_agree",
    "controller_nothing_lost",
    "controller_applied_once",
    "replication_replicas_agree",
    "replication_one_leader_per_epoch",
    "replication_epochs_grow",
)


class ScenarioError(ValueError):
    """The scenario file is malformed. The message names the table and key."""


def parse_duration_ms(value: object, where: str) -> int:
    """``"250ms"``, ``"1.5s"``, ``"2m"`` or an int of milliseconds, as integer ms."""
    return round(_duration_ms(value, where))


def _duration_ms(value: object, where: str) -> float:
    if isinstance(value, bool):
        raise ScenarioError(f"{where}: expected a duration, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        match = _DURATION.fullmatch(value)
        if match:
            return float(match.group(1)) * _UNIT_MS[match.group(2)]
    raise ScenarioError(f"{where}: expected a duration like '500ms' or '30s', got {value!r}")


def format_duration(ms: int) -> str:
    """The inverse of ``parse_duration_ms`` (for writing schedules)."""
    return f"{ms}ms" if ms % 1000 else f"{ms // 1000}s"


@attrs.frozen
class Fault:
    """One scheduled fault. ``params`` keeps the TOML keys (durations already in ms)."""

    at_ms: int
    kind: str
    params: Mapping[str, Any] = attrs.field(factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.params.get(key, default)

    def to_toml(self) -> str:
        lines = ["[[faults]]", f'at = "{format_duration(self.at_ms)}"', f'kind = "{self.kind}"']
        for key in sorted(self.params):
            value = self.params[key]
            if key in ("for", "restart_after", "offset"):
                value = format_duration(value)
            lines.append(f"{key} = {_toml_value(value)}")
        return "\n".join(lines)


@attrs.frozen
class TopicSpec:
    name: str
    partitions: int = 3
    #: In a cluster: replicas per partition (1: every partition on the first node, which the
    #: thin clients talk to; more: rotating over the nodes, leaders spread, for clients that
    #: follow leaders).
    replication_factor: int = 1
    min_insync_replicas: int = 1


#: The real client's consumer options, whose defaults the workload's consumers share.
_CLIENT_CONSUMER = attrs.fields(ConsumerConfig)

#: "thin": the protocol-level workload client; the others are the project's own client,
#: through its trio front or its blocking one (``sim/fronts.py``).
CLIENTS = ("thin", "rivven", "rivven-blocking")
REAL_CLIENTS = ("rivven", "rivven-blocking")
REPLICATION_BUGS = ("hw_ignores_followers", "truncate_to_hw", "elect_outside_isr",
                    "coordinator_skips_load", "lead_same_epoch_again", "stamp_first_epoch",
                    "hw_untold")


@attrs.frozen
class ProducerSpec:
    count: int = 1
    client: str = "thin"
    topic: str = ""
    rate_per_s: float = 20.0
    acks: int = -1
    idempotent: bool = False
    in_flight: int = 2
    records_per_send_max: int = 3
    #: Each value padded to this many bytes (0: the bare unique id; ``workload.padded_value``)
    #: - large values make replica fetch answers of 64 KiB and more.
    value_bytes: int = 0
    request_timeout_ms: int = 5_000
    #: The real client only: sends in transactions of 1..``transaction_sends_max`` sends,
    #: each ended by a commit, or by an abort with ``abort_probability``.
    transactional: bool = False
    transaction_sends_max: int = 4
    abort_probability: float = 0.25


@attrs.frozen
class ConsumerSpec:
    count: int = 1
    client: str = "thin"
    topic: str = ""
    partitions: tuple[int, ...] | None = None
    isolation: str = "read_uncommitted"
    max_wait_ms: int = 500
    request_timeout_ms: int = 5_000
    #: The real client only: the consumers subscribe as members of this group and commit
    #: after every poll that returned records.
    group: str | None = None
    #: The real client only: close the consumer and start a new one about this often (0:
    #: never) - a group member leaves and joins again, so partitions move between members.
    restart_every_ms: int = 0
    #: The real client's group session: how long a member that went away (a restart whose
    #: LeaveGroup was lost, or one the new coordinator read back from the log) holds up a
    #: rebalance; and how often members notice one.
    session_timeout_ms: int = _CLIENT_CONSUMER.session_timeout_ms.default
    heartbeat_interval_ms: int = _CLIENT_CONSUMER.heartbeat_interval_ms.default


@attrs.frozen
class NodesSpec:
    names: tuple[str, ...] = ("n1",)
    sync_policy: str = "always"
    restart_after_failure_ms: int = 1_000
    clock_offset_max_ms: int = 0
    clock_drift_max: float = 0.0
    port: int = 9092
    #: Every node runs cluster membership (--peers: the others) on port + 1.
    cluster: bool = False
    #: Racks by node, in order (empty: none).
    racks: tuple[str, ...] = ()
    #: Nodes started with a different cluster key (they must never be admitted).
    wrong_key: tuple[str, ...] = ()


@attrs.frozen
class NemesisSpec:
    enabled: bool = False
    interval_min_ms: int = 5_000
    interval_max_ms: int = 15_000
    weights: Mapping[str, float] = attrs.field(factory=dict)
    fault_for_min_ms: int = 1_000
    fault_for_max_ms: int = 8_000


@attrs.frozen
class ChecksSpec:
    liveness_within_ms: int = 15_000
    disabled: tuple[str, ...] = ()
    final_crash: bool = True
    fsync_stop_within_ms: int = 5_000
    invariants_every_ms: int = 1_000
    #: Membership: a crashed node is seen dead by everyone within this.
    detect_within_ms: int = 5_000
    #: End the run at the first online violation of any of these invariants (a checker's
    #: bite test needs only that one; a planted bug can make the rest of a run slow).
    stop_at: tuple[str, ...] = ()


@attrs.frozen
class TestSwitches:
    """Deliberate bugs, to prove the checkers see them. All off in shipped scenarios."""

    ack_before_fsync: bool = False
    #: The produce lane answers a produce as soon as it is appended (before durability).
    lane_answer_early: bool = False
    lying_fsync_probability: float = 0.0
    fetch_skip_probability: float = 0.0
    #: The disk reports fsyncs of the controller's Raft journal it never did.
    raft_lying_fsync_probability: float = 0.0
    #: A replication bug (``REPLICATION_BUGS``): the high watermark ignores the followers,
    #: followers truncate to the high watermark instead of by epoch, the controller elects
    #: leaders outside the ISR, a new group coordinator does not load its groups, a
    #: restarted broker leads an epoch its log already holds, a leader stamps a stale epoch,
    #: or a leader never tells a quiet partition's high watermark (``hw_untold``).
    replication_bug: str = ""

    @property
    def any(self) -> bool:
        return self.ack_before_fsync or self.lane_answer_early or bool(
            self.lying_fsync_probability or self.fetch_skip_probability
            or self.raft_lying_fsync_probability or self.replication_bug)


@attrs.frozen
class Scenario:
    name: str
    sha256: str
    seed: int
    duration_ms: int
    quiet_period_ms: int
    nodes: NodesSpec
    network: NetworkConfig
    disk: DiskConfig
    topics: tuple[TopicSpec, ...]
    producers: tuple[ProducerSpec, ...]
    consumers: tuple[ConsumerSpec, ...]
    faults: tuple[Fault, ...]
    nemesis: NemesisSpec
    checks: ChecksSpec
    test: TestSwitches

    @property
    def faults_end_ms(self) -> int:
        """When the quiet period starts: every fault is healed then."""
        return self.duration_ms - self.quiet_period_ms

    def checked(self, invariant: str) -> bool:
        return invariant not in self.checks.disabled


# --- parsing ---------------------------------------------------------------------------------


class _Table:
    """A TOML table being consumed key by key; leftovers are errors."""

    def __init__(self, data: object, where: str) -> None:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ScenarioError(f"{where}: expected a table")
        self.data = dict(data)
        self.where = where

    def take(self, key: str, default: Any, kind: Any = None) -> Any:
        value = self.data.pop(key, default)
        if kind is not None and value is not default:
            if isinstance(value, bool) and kind in (int, float, (int, float)):
                raise ScenarioError(f"{self.where}.{key}: expected a number, got {value!r}")
            if not isinstance(value, kind):
                raise ScenarioError(f"{self.where}.{key}: unexpected value {value!r}")
        return value

    def duration(self, key: str, default: int) -> int:
        value = self.data.pop(key, None)
        return default if value is None else parse_duration_ms(value, f"{self.where}.{key}")

    def range_ms(self, key: str, default: tuple[float, float]) -> tuple[float, float]:
        value = self.data.pop(key, None)
        if value is None:
            return default
        table = _Table(value, f"{self.where}.{key}")
        low = _duration_ms(table.take("min", 0), f"{self.where}.{key}.min")
        high = _duration_ms(table.take("max", low), f"{self.where}.{key}.max")
        table.done()
        if not 0 <= low <= high:
            raise ScenarioError(f"{self.where}.{key}: need 0 <= min <= max")
        return float(low), float(high)

    def done(self) -> None:
        if self.data:
            raise ScenarioError(f"{self.where}: unknown key(s) {sorted(self.data)}")


def load(path: str) -> Scenario:
    """Read and validate a scenario file. Raises ``ScenarioError`` or ``OSError``."""
    with open(path, "rb") as file:
        data = file.read()
    name = path.rsplit("/", 1)[-1].removesuffix(".toml")
    return loads(data, name)


def loads(data: bytes, name: str = "scenario") -> Scenario:
    """Validate a scenario from TOML bytes. Raises ``ScenarioError``."""
    try:
        root = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"not valid TOML: {exc}") from None
    top = _Table(root, name)
    run = _Table(top.take("run", None), "run")
    seed = run.take("seed", 1, int)
    duration_ms = run.duration("duration", 60_000)
    quiet_ms = run.duration("quiet_period", 20_000)
    run.done()
    if not 0 < quiet_ms < duration_ms:
        raise ScenarioError("run: need 0 < quiet_period < duration")
    nodes = _nodes(_Table(top.take("nodes", None), "nodes"))
    network = _network(_Table(top.take("network", None), "network"))
    disk = _disk(_Table(top.take("disk", None), "disk"))
    test = _test(_Table(top.take("test", None), "test"))
    if test.lying_fsync_probability:
        disk = attrs.evolve(disk, lying_fsync_probability=test.lying_fsync_probability)
    if test.raft_lying_fsync_probability:
        disk = attrs.evolve(disk,
                            raft_lying_fsync_probability=test.raft_lying_fsync_probability)
    topics, producers, consumers = _workload(_Table(top.take("workload", None), "workload"))
    faults = parse_faults(top.take("faults", []), "faults")
    nemesis = _nemesis(_Table(top.take("nemesis", None), "nemesis"))
    checks = _checks(_Table(top.take("checks", None), "checks"))
    top.done()
    scenario = Scenario(
        name, hashlib.sha256(data).hexdigest()[:16], seed, duration_ms, quiet_ms, nodes,
        network, disk, topics, producers, consumers, faults, nemesis, checks, test,
    )
    _validate(scenario)
    return scenario


def _nodes(table: _Table) -> NodesSpec:
    count = table.take("count", None, int)
    names = table.take("names", None, list)
    if names is None:
        names = [f"n{i}" for i in range(1, (count or 1) + 1)]
    elif count is not None and count != len(names):
        raise ScenarioError("nodes: count and names disagree")
    if not names or len(set(names)) != len(names) or not all(isinstance(n, str) for n in names):
        raise ScenarioError("nodes.names: need distinct strings")
    clock = _Table(table.take("clock", None), "nodes.clock")
    spec = NodesSpec(
        names=tuple(names),
        sync_policy=table.take("sync_policy", "always", str),
        restart_after_failure_ms=table.duration("restart_after_failure", 1_000),
        clock_offset_max_ms=clock.duration("offset_max", 0),
        clock_drift_max=float(clock.take("drift_max", 0.0, (int, float))),
        port=table.take("port", 9092, int),
        cluster=table.take("cluster", False, bool),
        racks=tuple(table.take("racks", [], list)),
        wrong_key=tuple(table.take("wrong_key", [], list)),
    )
    clock.done()
    table.done()
    if spec.sync_policy != "always":
        raise ScenarioError("nodes.sync_policy: the checkers assume 'always' (see [test])")
    if not 0 <= spec.clock_drift_max < 0.5:
        raise ScenarioError("nodes.clock.drift_max: need 0 <= drift_max < 0.5")
    if spec.racks and len(spec.racks) != len(spec.names):
        raise ScenarioError("nodes.racks: one rack per node")
    if not set(spec.wrong_key) <= set(spec.names):
        raise ScenarioError("nodes.wrong_key: names of nodes")
    if (spec.racks or spec.wrong_key) and not spec.cluster:
        raise ScenarioError("nodes: racks and wrong_key need cluster = true")
    return spec


def _network(table: _Table) -> NetworkConfig:
    low, high = table.range_ms("latency", (0.5, 2.0))
    links = []
    for i, raw in enumerate(table.take("links", [], list)):
        link = _Table(raw, f"network.links[{i}]")
        between = link.take("between", None, list)
        if not between or len(between) != 2 or not all(isinstance(x, str) for x in between):
            raise ScenarioError(f"network.links[{i}].between: two endpoint names")
        links.append(((between[0], between[1]), link.range_ms("latency", (low, high))))
        link.done()
    config = NetworkConfig(
        latency_min_ms=low,
        latency_max_ms=high,
        stall_timeout_ms=table.duration("stall_timeout", 5_000),
        connect_timeout_ms=table.duration("connect_timeout", 3_000),
        link_latency=tuple(links),
        datagrams=_datagrams(_Table(table.take("datagrams", None), "network.datagrams")),
    )
    table.done()
    return config


def _datagrams(table: _Table) -> DatagramConfig:
    """``[network.datagrams]``: the UDP path's faults (``sim/datagrams.py``)."""
    low, high = table.range_ms("latency", (0.5, 2.0))
    chances = {key: float(table.take(key, 0.0, (int, float)))
               for key in ("loss", "duplicate", "reorder")}
    for key, chance in chances.items():
        if not 0.0 <= chance <= 1.0:
            raise ScenarioError(f"network.datagrams.{key}: a probability in [0, 1]")
    config = DatagramConfig(latency_min_ms=low, latency_max_ms=high,
                            reorder_delay_ms=table.duration("reorder_delay", 20), **chances)
    table.done()
    return config


def _disk(table: _Table) -> DiskConfig:
    low, high = table.range_ms("fsync_latency", (0.5, 5.0))
    torn = float(table.take("torn_write", 0.5, (int, float)))
    files_min = table.take("sync_filesystem_files", limits.sync_filesystem_files_min, int)
    table.done()
    if not 0.0 <= torn <= 1.0:
        raise ScenarioError("disk.torn_write: a probability in [0, 1]")
    if files_min < 1:
        raise ScenarioError("disk.sync_filesystem_files: at least 1")
    return DiskConfig(fsync_latency_min_ms=low, fsync_latency_max_ms=high,
                      torn_write_probability=torn, sync_filesystem_files_min=files_min)


def _test(table: _Table) -> TestSwitches:
    switches = TestSwitches(
        ack_before_fsync=table.take("ack_before_fsync", False, bool),
        lane_answer_early=table.take("lane_answer_early", False, bool),
        lying_fsync_probability=float(table.take("lying_fsync", 0.0, (int, float))),
        fetch_skip_probability=float(table.take("fetch_skip_offset", 0.0, (int, float))),
        raft_lying_fsync_probability=float(table.take("raft_lying_fsync", 0.0, (int, float))),
        replication_bug=table.take("replication_bug", "", str),
    )
    table.done()
    if switches.replication_bug not in ("", *REPLICATION_BUGS):
        raise ScenarioError(f"test.replication_bug: one of {', '.join(REPLICATION_BUGS)}")
    for value in (switches.lying_fsync_probability, switches.fetch_skip_probability,
                  switches.raft_lying_fsync_probability):
        if not 0.0 <= value <= 1.0:
            raise ScenarioError("test: probabilities must be in [0, 1]")
    return switches


def _workload(table: _Table) -> tuple[tuple[TopicSpec, ...], tuple[ProducerSpec, ...],
                                       tuple[ConsumerSpec, ...]]:
    topics = []
    for i, raw in enumerate(table.take("topics", [{"name": "t", "partitions": 3}], list)):
        t = _Table(raw, f"workload.topics[{i}]")
        topics.append(TopicSpec(t.take("name", "t", str), t.take("partitions", 3, int),
                                t.take("replication_factor", 1, int),
                                t.take("min_insync_replicas", 1, int)))
        t.done()
        if not 1 <= topics[-1].partitions <= 1000:
            raise ScenarioError(f"workload.topics[{i}].partitions: out of range")
        if not 1 <= topics[-1].min_insync_replicas <= topics[-1].replication_factor <= 16:
            raise ScenarioError(f"workload.topics[{i}]: need 1 <= min_insync_replicas <= "
                                "replication_factor <= 16")
    default_topic = topics[0].name
    producers = []
    for i, raw in enumerate(table.take("producers", [], list)):
        p = _Table(raw, f"workload.producers[{i}]")
        acks = p.take("acks", "all", (str, int))
        acks = {"all": -1, -1: -1, 1: 1, "1": 1, 0: 0, "0": 0}.get(acks)
        if acks is None:
            raise ScenarioError(f"workload.producers[{i}].acks: 'all', 1 or 0")
        producers.append(ProducerSpec(
            count=p.take("count", 1, int),
            client=p.take("client", "thin", str),
            topic=p.take("topic", default_topic, str),
            rate_per_s=float(p.take("rate", 20.0, (int, float))),
            acks=acks,
            idempotent=p.take("idempotent", False, bool),
            in_flight=p.take("in_flight", 2, int),
            records_per_send_max=p.take("records_per_send_max", 3, int),
            value_bytes=p.take("value_bytes", 0, int),
            request_timeout_ms=p.duration("request_timeout", 5_000),
            transactional=p.take("transactional", False, bool),
            transaction_sends_max=p.take("transaction_sends_max", 4, int),
            abort_probability=float(p.take("abort_probability", 0.25, (int, float))),
        ))
        p.done()
    consumers = []
    for i, raw in enumerate(table.take("consumers", [], list)):
        c = _Table(raw, f"workload.consumers[{i}]")
        partitions = c.take("partitions", "all", (str, list))
        consumers.append(ConsumerSpec(
            count=c.take("count", 1, int),
            client=c.take("client", "thin", str),
            topic=c.take("topic", default_topic, str),
            partitions=None if partitions == "all" else tuple(partitions),
            isolation=c.take("isolation", "read_uncommitted", str),
            max_wait_ms=c.duration("max_wait", 500),
            request_timeout_ms=c.duration("request_timeout", 5_000),
            group=c.take("group", None, str),
            restart_every_ms=c.duration("restart_every", 0),
            session_timeout_ms=c.duration("session_timeout",
                                          _CLIENT_CONSUMER.session_timeout_ms.default),
            heartbeat_interval_ms=c.duration("heartbeat_interval",
                                             _CLIENT_CONSUMER.heartbeat_interval_ms.default),
        ))
        c.done()
        if consumers[-1].isolation not in ISOLATIONS:
            raise ScenarioError(f"workload.consumers[{i}].isolation: one of {ISOLATIONS}")
    table.done()
    return tuple(topics), tuple(producers), tuple(consumers)


def parse_faults(raw: object, where: str) -> tuple[Fault, ...]:
    """The ``[[faults]]`` array (of a scenario or a realised schedule), sorted by time."""
    if not isinstance(raw, list):
        raise ScenarioError(f"{where}: expected [[faults]] tables")
    faults = []
    for i, item in enumerate(raw):
        table = _Table(item, f"{where}[{i}]")
        at_ms = table.duration("at", 0)
        kind = table.take("kind", None, str)
        if kind not in FAULT_KINDS:
            raise ScenarioError(f"{where}[{i}].kind: one of {sorted(FAULT_KINDS)}, not {kind!r}")
        params: dict[str, Any] = {}
        for key in sorted(table.data):
            if key not in FAULT_KINDS[kind]:
                raise ScenarioError(f"{where}[{i}]: {kind} takes no key {key!r}")
            value = table.data[key]
            if key in ("for", "restart_after", "offset"):
                value = parse_duration_ms(value, f"{where}[{i}].{key}")
            params[key] = value
        _check_fault(kind, params, f"{where}[{i}]")
        faults.append(Fault(at_ms, kind, params))
    return tuple(sorted(faults, key=lambda f: f.at_ms))


def _check_fault(kind: str, params: dict[str, Any], where: str) -> None:
    needs = {"crash": ["node"], "restart": ["node"], "pause": ["node", "for"], "stall": ["for"],
             "clock": ["node"], "disk": ["node", "error"]}.get(kind, [])
    for key in needs:
        if key not in params:
            raise ScenarioError(f"{where}: {kind} needs {key!r}")
    if kind in ("stall", "one_way") and len(params.get("between", ())) != 2:
        raise ScenarioError(f"{where}: {kind} needs 'between' = [a, b]")
    if kind == "one_way" and "for" not in params:
        raise ScenarioError(f"{where}: one_way needs 'for'")
    if kind == "partition" and ("groups" in params) == ("between" in params):
        raise ScenarioError(f"{where}: partition needs exactly one of 'groups' or 'between'")
    if kind == "reset" and ("between" in params) == ("node" in params):
        raise ScenarioError(f"{where}: reset needs exactly one of 'between' or 'node'")
    if kind == "disk" and params["error"] not in DISK_ERRORS:
        raise ScenarioError(f"{where}.error: one of {DISK_ERRORS}")
    if kind == "clock" and float(params.get("rate", 1.0)) <= 0:
        raise ScenarioError(f"{where}.rate: must be positive")


def _nemesis(table: _Table) -> NemesisSpec:
    low, high = table.range_ms("interval", (5_000, 15_000))
    for_low, for_high = table.range_ms("fault_for", (1_000, 8_000))
    weights = _Table(table.take("weights", None), "nemesis.weights")
    parsed = {}
    for kind in sorted(weights.data):
        if kind not in FAULT_KINDS or kind == "restart":
            raise ScenarioError(f"nemesis.weights: no random fault {kind!r}")
        value = weights.take(kind, 0, (int, float))
        if value < 0:
            raise ScenarioError(f"nemesis.weights.{kind}: must be >= 0")
        parsed[kind] = float(value)
    spec = NemesisSpec(
        enabled=table.take("enabled", bool(parsed), bool),
        interval_min_ms=int(low), interval_max_ms=int(high), weights=parsed,
        fault_for_min_ms=int(for_low), fault_for_max_ms=int(for_high),
    )
    table.done()
    if spec.enabled and (not parsed or not sum(parsed.values()) or spec.interval_min_ms <= 0):
        raise ScenarioError("nemesis: enabled needs positive weights and interval")
    return spec


def _checks(table: _Table) -> ChecksSpec:
    disabled = tuple(table.take("disabled", [], list))
    stop_at = tuple(table.take("stop_at", [], list))
    for key, names in (("disabled", disabled), ("stop_at", stop_at)):
        for name in names:
            if name not in INVARIANTS:
                raise ScenarioError(f"checks.{key}: unknown invariant {name!r}")
    spec = ChecksSpec(
        liveness_within_ms=table.duration("liveness_within", 15_000),
        disabled=disabled,
        final_crash=table.take("final_crash", True, bool),
        fsync_stop_within_ms=table.duration("fsync_stop_within", 5_000),
        invariants_every_ms=table.duration("invariants_every", 1_000),
        detect_within_ms=table.duration("detect_within", 5_000),
        stop_at=stop_at,
    )
    table.done()
    return spec


def _validate(scenario: Scenario) -> None:
    names = set(scenario.nodes.names)
    topics = {t.name: t for t in scenario.topics}
    for spec in (*scenario.producers, *scenario.consumers):
        if spec.topic not in topics:
            raise ScenarioError(f"workload: unknown topic {spec.topic!r}")
        if spec.client not in CLIENTS:
            raise ScenarioError(f"workload: client must be one of {CLIENTS}, not {spec.client!r}")
        if spec.count < 0 or (isinstance(spec, ProducerSpec) and (
                spec.rate_per_s <= 0 or spec.in_flight < 1 or spec.records_per_send_max < 1)):
            raise ScenarioError("workload: counts >= 0, rate > 0, in_flight and records >= 1")
        if isinstance(spec, ProducerSpec) and not (
                0 <= spec.value_bytes <= _VALUE_BYTES_MAX
                and spec.records_per_send_max * spec.value_bytes <= _VALUE_BYTES_MAX):
            raise ScenarioError(f"workload.producers: value_bytes x records_per_send_max at "
                                f"most {_VALUE_BYTES_MAX} (one batch of a send)")
    for spec in scenario.producers:
        if spec.transactional and (spec.client not in REAL_CLIENTS or spec.acks != -1
                                   or spec.transaction_sends_max < 1
                                   or not 0 <= spec.abort_probability <= 1):
            raise ScenarioError("workload.producers: a transactional producer needs "
                                "a real client (\"rivven\"...), acks = \"all\", "
                                "transaction_sends_max "
                                ">= 1 and abort_probability in [0, 1]")
    for spec in scenario.consumers:
        if spec.restart_every_ms and spec.client not in REAL_CLIENTS:
            raise ScenarioError("workload.consumers: restart_every needs a real client "
                                f"(one of {REAL_CLIENTS})")
        if spec.group is not None and (spec.client not in REAL_CLIENTS
                                       or spec.partitions is not None):
            raise ScenarioError("workload.consumers: a group consumer needs a real client "
                                f"(one of {REAL_CLIENTS}) and subscribes to every partition")
        for p in spec.partitions or ():
            if not 0 <= p < topics[spec.topic].partitions:
                raise ScenarioError(f"workload.consumers: no partition {p} in {spec.topic}")
    for fault in scenario.faults:
        node = fault.get("node")
        if node is not None and node not in ("random", "controller") and fault.kind != "reset" \
                and node not in names and not _names_a_partition(node, topics):
            raise ScenarioError(f"faults: unknown node {node!r} at {fault.at_ms} ms")
        if fault.at_ms >= scenario.faults_end_ms:
            raise ScenarioError(f"faults: a fault at {fault.at_ms} ms is in the quiet period")
    if scenario.checks.liveness_within_ms > scenario.quiet_period_ms:
        raise ScenarioError("checks.liveness_within: must fit in run.quiet_period")


def _names_a_partition(node: str, topics: dict[str, Any]) -> bool:
    """``leader:TOPIC/P`` of a partition of the workload or of an internal topic
    (``__consumer_offsets``, ``__transaction_state``): the node leading it at the time."""
    if not node.startswith("leader:"):
        return False
    topic, _, partition = node.removeprefix("leader:").rpartition("/")
    if not partition.isdigit():
        return False
    if topic in ("__consumer_offsets", "__transaction_state"):
        return True
    return topic in topics and int(partition) < topics[topic].partitions


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")
