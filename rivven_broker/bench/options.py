"""Options of ``rivven bench produce|consume|e2e``: one frozen, self-checking value.

Theory of operation
-------------------
The command line (``add_arguments`` + ``options_from_args``) and the standard suite
(``suite.py``) both build a ``BenchOptions``; everything downstream (the coordinator, the
worker processes, the peers) reads only that object, which pickles into the spawned workers.
Construction checks every bound and raises ``OptionsError`` with the option's name, so a bad
option fails before any server starts.

Durability is named once, by ``sync`` (Rivven's ``--sync-policy``); a peer's setting is mapped
from it unless ``peer_sync`` names one explicitly:

=============== ========================= ==============================
``sync``        Redis ``appendfsync``     NATS JetStream file store
=============== ========================= ==============================
``always``      ``always``                ``sync_interval: always``
``interval_ms`` ``everysec``              default (fsync every 2 min)
``none``        no AOF                    default (fsync every 2 min)
=============== ========================= ==============================
"""

from __future__ import annotations

import argparse
from typing import Any

import attrs

from rivven_broker.protocol import limits

__all__ = [
    "MODES",
    "PEERS",
    "REDIS_SYNCS",
    "NATS_SYNCS",
    "BenchOptions",
    "OptionsError",
    "add_arguments",
    "options_from_args",
    "peer_sync_for",
]

MODES = ("produce", "consume", "e2e")
PEERS = ("redis", "nats")
REDIS_SYNCS = ("always", "everysec", "no")
NATS_SYNCS = ("always", "default")
_ACKS = {"all": -1, "-1": -1, "1": 1, "0": 0}
#: The most worker processes one run starts (each is a spawned interpreter: ~30 MB).
WORKERS_MAX = 64
CONNECTIONS_PER_WORKER_MAX = 64


class OptionsError(ValueError):
    """A benchmark option is out of range or inconsistent (the message names it)."""


def _sync_ok(value: str) -> bool:
    if value in ("always", "none"):
        return True
    if value.startswith("interval_ms="):
        number = value.partition("=")[2]
        return number.isdigit() and int(number) > 0
    return False


def peer_sync_for(peer: str, sync: str, explicit: str | None = None) -> str:
    """The peer's durability setting for Rivven's ``sync`` (see the module table), or
    ``explicit`` when given. Raises ``OptionsError`` for a setting the peer does not have."""
    if explicit is not None:
        allowed = REDIS_SYNCS if peer == "redis" else NATS_SYNCS
        if explicit not in allowed:
            raise OptionsError(f"--peer-sync for {peer} must be one of {', '.join(allowed)}")
        return explicit
    if peer == "redis":
        return {"always": "always", "none": "no"}.get(sync, "everysec")
    if peer == "nats":
        return "always" if sync == "always" else "default"
    raise OptionsError(f"unknown peer {peer!r}")


@attrs.frozen(kw_only=True)
class BenchOptions:
    """Everything one benchmark run needs. Raises ``OptionsError`` when out of range."""

    mode: str = "produce"
    record_bytes: int = 100
    batch: int = 100  # records per batch (per request for peers)
    linger_ms: int = 0  # the client line's Producer linger
    partitions: int = 1
    producers: int = 1  # producer processes
    connections: int = 1  # connections per producer process
    consumers: int = 1  # consumer processes
    acks: int = -1
    sync: str = "always"
    duration_s: float = 5.0
    warmup_s: float = 1.0
    rounds: int = 1
    window: int = 8  # requests in flight per connection
    rate: float = 0.0  # records/s over all producers; 0 = closed loop
    fetch_bytes: int = 4 * 1024 * 1024  # per partition per fetch
    fill_records: int = 0  # consume: records written before reading (0: ~256 MB)
    peer: str | None = None
    peer_sync: str | None = None
    bootstrap: str | None = None  # use this broker instead of starting one
    client_line: bool = False  # also measure the public Producer / Consumer
    pin: bool = True
    data_dir: str | None = None  # parent of temporary server directories
    broker_flags: tuple[str, ...] = ()
    broker_env: tuple[str, ...] = ()  # KEY=VALUE added to the broker's environment
    topic_config: tuple[str, ...] = ()  # KEY=VALUE topic configs the Rivven lines create with
    topic: str = "bench"
    verify: bool = True
    #: Also run the Rivven line against this many clustered brokers (replication factor =
    #: the count, min.insync.replicas 2), beside the single broker; 0: no cluster line.
    cluster: int = 0

    def __attrs_post_init__(self) -> None:
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise OptionsError(message)

        need(self.mode in MODES, f"mode must be one of {', '.join(MODES)}")
        need(20 <= self.record_bytes <= 1024 * 1024, "--size must be in [20, 1048576] bytes")
        # A record carries (producer u32, sequence u64, send time u64) in its first 20 bytes
        # for the loss/duplicate check and e2e latency (ledger.MARK).
        need(1 <= self.batch <= 100_000, "--batch must be in [1, 100000] records")
        need(
            self.batch * (self.record_bytes + 32) + 61 <= limits.batch_bytes_max,
            f"--batch x --size must fit a record batch of {limits.batch_bytes_max} bytes",
        )
        need(0 <= self.linger_ms <= 10_000, "--linger-ms must be in [0, 10000]")
        need(1 <= self.partitions <= limits.partitions_per_topic_max, "--partitions out of range")
        need(1 <= self.producers <= WORKERS_MAX, f"--producers must be in [1, {WORKERS_MAX}]")
        need(1 <= self.consumers <= WORKERS_MAX, f"--consumers must be in [1, {WORKERS_MAX}]")
        need(
            1 <= self.connections <= CONNECTIONS_PER_WORKER_MAX,
            f"--connections must be in [1, {CONNECTIONS_PER_WORKER_MAX}]",
        )
        need(self.acks in (-1, 0, 1), "--acks must be all, 1 or 0")
        need(_sync_ok(self.sync), "--sync must be always, interval_ms=N or none")
        need(0 < self.duration_s <= 3600, "--duration must be in (0, 3600] seconds")
        need(0 <= self.warmup_s <= 600, "--warmup must be in [0, 600] seconds")
        need(1 <= self.rounds <= 100, "--rounds must be in [1, 100]")
        need(
            1 <= self.window <= limits.in_flight_requests_per_connection_max,
            f"--window must be in [1, {limits.in_flight_requests_per_connection_max}]",
        )
        need(self.rate >= 0, "--rate must be >= 0")
        need(
            1024 <= self.fetch_bytes <= limits.fetch_partition_bytes_max,
            f"--fetch-bytes must be in [1024, {limits.fetch_partition_bytes_max}]",
        )
        need(self.fill_records >= 0, "--fill-records must be >= 0")
        need(self.peer is None or self.peer in PEERS, f"--peer must be one of {', '.join(PEERS)}")
        need(self.peer_sync is None or self.peer is not None, "--peer-sync needs --peer")
        need(self.acks != 0 or self.rate == 0, "--acks 0 cannot measure latency: drop --rate")
        if self.peer is not None:
            peer_sync_for(self.peer, self.sync, self.peer_sync)
            need(self.bootstrap is None, "--peer starts its own servers: drop --bootstrap")
        need(len(self.topic.encode()) <= limits.topic_name_bytes_max, "--topic is too long")
        need(all("=" in item and not item.startswith("=") for item in self.broker_env),
             "--broker-env must be KEY=VALUE")
        need(all("=" in item and not item.startswith("=") for item in self.topic_config),
             "--topic-config must be KEY=VALUE")
        need(not self.topic_config or self.bootstrap is None,
             "--topic-config configures the topics it creates: drop --bootstrap")
        need(self.mode != "e2e" or self.peer is None, "--peer compares produce and consume only")
        need(self.cluster == 0 or (2 <= self.cluster <= 5 and self.mode == "produce"
                                   and self.bootstrap is None),
             "--cluster N: 2..5 brokers, produce, no --bootstrap")
        need(self.cluster == 0 or self.producer_connections % self.partitions == 0,
             "--cluster with --partitions P: producers x connections a multiple of P (each "
             "connection sends to one partition, at its leader)")

    @property
    def batch_bytes(self) -> int:
        """Payload bytes of one request (record values only)."""
        return self.batch * self.record_bytes

    @property
    def effective_fill_records(self) -> int:
        """Records written before a consume run: ``fill_records`` or about 256 MB."""
        if self.fill_records:
            return self.fill_records
        return max(self.batch, (256 * 1024 * 1024) // self.record_bytes)

    @property
    def producer_connections(self) -> int:
        return self.producers * self.connections

    def describe(self) -> str:
        """A one-line description of the workload, as the report prints it."""
        load = f"rate {self.rate:,.0f} rec/s" if self.rate else f"closed loop, window {self.window}"
        return (
            f"{self.mode} {self.record_bytes} B x {self.batch}/batch, "
            f"{self.producers}x{self.connections} producer conns, {self.consumers} consumers, "
            f"{self.partitions} partitions, acks={_acks_name(self.acks)}, sync={self.sync}, {load}"
        )

    def to_json(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        data["broker_flags"] = list(self.broker_flags)
        data["broker_env"] = list(self.broker_env)
        data["topic_config"] = list(self.topic_config)
        return data


def _acks_name(acks: int) -> str:
    return "all" if acks == -1 else str(acks)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``produce``/``consume``/``e2e`` (one per ``BenchOptions`` field)."""
    add = parser.add_argument
    add("--size", type=int, default=100, help="record value bytes (default 100)")
    add("--batch", type=int, default=100, help="records per batch / request (default 100)")
    add("--linger-ms", type=int, default=0, help="the client line's linger_ms (default 0)")
    add("--partitions", type=int, default=1, help="partitions of the topic (default 1)")
    add("--producers", type=int, default=1, help="producer processes (default 1)")
    add("--connections", type=int, default=1, help="connections per producer (default 1)")
    add("--consumers", type=int, default=1, help="consumer processes (default 1)")
    add("--acks", default="all", choices=sorted(_ACKS), help="all (default), 1 or 0")
    add("--sync", default="always", help="broker sync policy: always (default), interval_ms=N, none")
    add("--duration", type=float, default=5.0, help="measured seconds per round (default 5)")
    add("--warmup", type=float, default=1.0, help="unmeasured seconds first (default 1)")
    add("--rounds", type=int, default=1, help="rounds; with --peer they alternate (default 1)")
    add("--window", type=int, default=8, help="requests in flight per connection (default 8)")
    add("--rate", type=float, default=0.0, help="fixed rate in records/s (default: closed loop)")
    add("--fetch-bytes", type=int, default=4 * 1024 * 1024, help="bytes per partition per fetch")
    add("--fill-records", type=int, default=0, help="consume: records written first (~256 MB)")
    add("--peer", choices=PEERS, default=None, help="also run the same workload on this peer")
    add("--peer-sync", default=None, help="peer durability (default: mapped from --sync)")
    add("--bootstrap", default=None, help="use this broker instead of starting one")
    add("--client", action="store_true", help="also measure the public Producer/Consumer")
    add("--no-pin", action="store_true", help="do not pin the server and load to CPUs")
    add("--dir", default=None, help="parent of the temporary server data directories")
    add("--broker-flag", action="append", default=[], help="extra rivven-broker flag (repeat)")
    add("--broker-env", action="append", default=[], help="KEY=VALUE for the broker's environment")
    add("--topic", default="bench", help="topic name (default bench)")
    add("--topic-config", action="append", default=[],
        help="KEY=VALUE config of the topics the Rivven lines create, e.g. segment.bytes=1048576 "
             "(repeat)")
    add("--no-verify", action="store_true", help="skip the final loss/duplicate read")
    add("--cluster", type=int, default=0,
        help="also produce to N clustered brokers (replication factor N, min.insync 2)")
    add("--json", action="store_true", help="print one JSON summary")


def options_from_args(mode: str, args: argparse.Namespace) -> BenchOptions:
    """A ``BenchOptions`` from parsed arguments. Raises ``OptionsError``."""
    return BenchOptions(
        mode=mode,
        record_bytes=args.size,
        batch=args.batch,
        linger_ms=args.linger_ms,
        partitions=args.partitions,
        producers=args.producers,
        connections=args.connections,
        consumers=args.consumers,
        acks=_ACKS[args.acks],
        sync=args.sync,
        duration_s=args.duration,
        warmup_s=args.warmup,
        rounds=args.rounds,
        window=args.window,
        rate=args.rate,
        fetch_bytes=args.fetch_bytes,
        fill_records=args.fill_records,
        peer=args.peer,
        peer_sync=args.peer_sync,
        bootstrap=args.bootstrap,
        client_line=args.client,
        pin=not args.no_pin,
        data_dir=args.dir,
        broker_flags=tuple(args.broker_flag),
        broker_env=tuple(args.broker_env),
        topic_config=tuple(args.topic_config),
        topic=args.topic,
        verify=not args.no_verify,
        cluster=args.cluster,
    )
