"""The coordinator: servers, worker processes, rounds, the loss check and the summary.

Theory of operation
-------------------
``run_bench(options)`` runs ``rounds`` rounds; in each, Rivven and then the peer (if any) get
the same workload, so both see the same phase of a noisy host (A, B, A, B ...). One *line* is
one target in one round (``run_line``):

1. start the server (``servers.py``) pinned to the server CPU, in a fresh directory (or use
   ``--bootstrap``); create the topic / stream (a fresh name per line);
2. consume mode: fill the log first (``workers.fill``, not timed);
3. spawn the worker processes (pinned to the load CPU), wait until every one is connected,
   hand them a common start time, read the server's CPU time when the measured window opens
   and closes, collect the ``WorkerResult``s;
4. read the whole log back and check every acknowledged unit is there exactly once
   (``ledger.py``);
5. stop the server by PID and remove its directory (in a ``finally``).

The *client* line (``--client``) runs the same topic shape through the public Producer /
Consumer on the same broker after the raw line. ``summarize`` merges rounds: median and best
records/s, the merged latency histogram, lost/duplicated totals, per-round ratios to the
peer and their median; a spread between rounds above 25 % is flagged.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any

import attrs

from rivven_broker.bench import peer_load, rivven_load, servers, storage
from rivven_broker.bench.cluster_processes import LocalCluster, wait_for
from rivven_broker.bench.ledger import Ledger
from rivven_broker.bench.options import BenchOptions, peer_sync_for
from rivven_broker.bench.stats import Buckets, Latency
from rivven_broker.bench.workers import (
    DRAIN_S,
    Channel,
    WorkerResult,
    WorkerSpec,
    connect,
    worker_main,
)
from rivven_broker.client import Admin

__all__ = ["LineResult", "run_bench", "run_line", "fill"]

_START_DELAY_S = 0.5


@attrs.define
class LineResult:
    """One target's figures in one round."""

    target: str  # rivven | client | redis | nats
    setting: str  # sync policy / appendfsync / nats sync
    records: int = 0
    seconds: float = 0.0
    payload_bytes: int = 0
    wire_bytes: int = 0
    requests: int = 0
    latency: bytes = b""
    buckets: list[int] = attrs.Factory(list)
    server_cpu_s: float = 0.0
    load_cpu_s: float = 0.0  # the producer processes' own CPU in the window, together
    lost: int = 0
    duplicated: int = 0
    unknown: int = 0
    acked_units: int = 0
    errors: list[str] = attrs.Factory(list)
    extra: dict[str, Any] = attrs.Factory(dict)

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.payload_bytes / self.seconds / 1e6 if self.seconds else 0.0

    @property
    def wire_mb_per_s(self) -> float:
        return self.wire_bytes / self.seconds / 1e6 if self.seconds else 0.0

    @property
    def cpu_s_per_million(self) -> float | None:
        if not self.records or not self.server_cpu_s:
            return None
        return self.server_cpu_s / (self.records / 1e6)

    @property
    def load_cpu_s_per_million(self) -> float | None:
        if not self.records or not self.load_cpu_s:
            return None
        return self.load_cpu_s / (self.records / 1e6)


def _spawn_workers(specs: list[WorkerSpec], server: servers.ServerProcess | LocalCluster | None
                   ) -> tuple[list[WorkerResult], float]:
    """Run ``specs`` as processes from a common start; (results, server CPU s in the window:
    the broker's, or every broker's of a cluster together)."""
    context = multiprocessing.get_context("spawn")
    running = []
    try:
        for spec in specs:
            parent, child = context.Pipe()
            process = context.Process(target=worker_main, args=(spec, child), daemon=True)
            process.start()
            child.close()
            running.append((process, parent))
        for process, pipe in running:
            if not pipe.poll(120.0) or _receive(pipe) != "ready":
                raise RuntimeError(f"worker {process.pid} did not get ready")
        options = specs[0].options
        t0 = time.monotonic() + _START_DELAY_S
        for _, pipe in running:
            pipe.send(t0)
        cpu = 0.0
        if server is not None:
            _sleep_until(t0 + options.warmup_s)
            before = server.cpu_seconds()
            _sleep_until(t0 + options.warmup_s + options.duration_s)
            cpu = server.cpu_seconds() - before
        results = []
        timeout = options.warmup_s + options.duration_s + DRAIN_S + 180.0
        for process, pipe in running:
            if not pipe.poll(timeout):
                raise RuntimeError(f"worker {process.pid} sent no result")
            result = _receive(pipe)
            if not isinstance(result, WorkerResult):
                raise RuntimeError(f"worker {process.pid} sent {result!r} instead of a result")
            results.append(result)
        return results, cpu
    finally:
        for process, pipe in running:
            pipe.close()
            process.join(10.0)
            if process.is_alive():
                process.kill()
                process.join(5.0)


def _receive(pipe: Any) -> object:
    try:
        return pipe.recv()
    except EOFError:
        raise RuntimeError("a worker process died (see its traceback above)") from None


def _sleep_until(at: float) -> None:
    delay = at - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def fill(channel: Channel, requests: int, window: int) -> None:
    """Send ``requests`` requests on ``channel`` with ``window`` in flight; wait for all of
    them. Blocks. Raises ``ConnectionError`` if the server closes the connection."""
    sent = 0
    while sent < requests or channel.in_flight:
        while sent < requests and len(channel.in_flight) < window:
            channel.send(time.monotonic())
            sent += 1
        if channel.fire_and_forget:
            channel.acked += sum(units for _, units, _ in channel.in_flight)
            channel.in_flight.clear()
            continue
        data = channel.sock.recv(4 * 1024 * 1024)
        if not data:
            raise ConnectionError("the server closed the connection during the fill")
        for _ in range(channel.feed(data)):
            channel.acked += channel.in_flight.popleft()[1]


def _merge(line: LineResult, results: list[WorkerResult], ledger: Ledger) -> None:
    histograms = []
    for result in results:
        line.records += result.records
        line.payload_bytes += result.payload_bytes
        line.wire_bytes += result.wire_bytes
        line.requests += result.requests
        line.load_cpu_s += result.load_cpu_s
        line.seconds = max(line.seconds, result.seconds)
        line.errors += [f"{result.kind}[{result.index}]: {error}" for error in result.errors]
        if result.latency:
            histograms.append(result.latency)
        for producer, sent, acked, failed in result.producers:
            ledger.add_producer(producer, sent, acked, failed)
        for key, value in result.extra.items():
            line.extra[key] = line.extra.get(key, 0) + value if isinstance(value, (int, float)) else value
    line.latency = Latency.merged(histograms).encode()
    line.buckets = Buckets.merged([r.buckets for r in results if r.buckets])


def _judge(line: LineResult, ledger: Ledger, read: int) -> None:
    verdict = ledger.verdict()
    line.lost, line.duplicated, line.unknown = verdict.lost, verdict.duplicated, verdict.unknown
    line.acked_units = verdict.acked
    line.extra["verified_records"] = read
    if verdict.lost_examples:
        line.extra["lost_examples"] = [list(item) for item in verdict.lost_examples]


def _producer_specs(kind: str, options: BenchOptions, address: tuple[str, int], topic: str,
                    load_cpu: int | None, leaders: tuple[tuple[str, int], ...] = ()
                    ) -> list[WorkerSpec]:
    requests_per_s = options.rate / options.batch if options.rate else 0.0
    per_channel = requests_per_s / options.producer_connections if requests_per_s else 0.0
    return [
        WorkerSpec(kind, index, options, address, topic, load_cpu,
                   producer_base=index * options.connections,
                   partitions=tuple(range(options.partitions)), rate_per_channel=per_channel,
                   leaders=leaders)
        for index in range(options.producers)
    ]


def _consumer_specs(kind: str, options: BenchOptions, address: tuple[str, int], topic: str,
                    load_cpu: int | None, expected: int, count: int) -> list[WorkerSpec]:
    specs = []
    for index in range(count):
        mine = tuple(p for p in range(options.partitions) if p % count == index)
        if mine:
            specs.append(WorkerSpec(kind, index, options, address, topic, load_cpu,
                                    partitions=mine, expected_units=expected))
    return specs


# --- one line ---------------------------------------------------------------------------------


def _topic(options: BenchOptions, target: str, round_index: int) -> str:
    return f"{options.topic}-{options.mode}-{target}-{round_index}-{os.getpid()}"


def _admin_create(bootstrap: str, topic: str, partitions: int,
                  config: dict[str, str] | None = None) -> None:
    admin = Admin(bootstrap)
    try:
        admin.create_topic(topic, partitions=partitions, replication_factor=1, config=config)
    finally:
        admin.close()


def _fill_rivven(address: tuple[str, int], topic: str, options: BenchOptions, ledger: Ledger) -> int:
    """Write ``effective_fill_records`` as raw batches (producer id 1_000_000+); records."""
    requests = max(1, options.effective_fill_records // options.batch)
    template = rivven_load.batch_template(options.record_bytes, options.batch)
    spec = WorkerSpec("rivven-produce", 0, attrs.evolve(options, acks=-1), address, topic,
                      partitions=tuple(range(options.partitions)))
    producer = 1_000_000
    channel = rivven_load.RivvenProduceChannel(connect(address), producer, spec, template)
    try:
        fill(channel, requests, 8)
    finally:
        channel.close()
    if channel.first_error:
        raise RuntimeError(f"fill failed: {channel.first_error}")
    ledger.add_producer(producer, channel.next_sequence, channel.acked, channel.failed)
    return requests * options.batch


def _start_cluster(options: BenchOptions, cpus: frozenset[int] | None
                   ) -> tuple[LocalCluster, str]:
    """``options.cluster`` brokers on loopback, free to run on ``cpus`` (the machine's:
    three brokers share its cores, while ``run_line`` pins this process, and what it starts,
    to the load's CPU); returns them and a bootstrap address."""
    cluster = LocalCluster(options.cluster, "rivven-bench-cluster-", sync_policy=options.sync,
                           cpus=cpus)
    try:
        for node in range(1, options.cluster + 1):
            cluster.start(node)
        with Admin(cluster.address(1)) as admin:
            wait_for(lambda: len(admin.cluster_status().brokers) == options.cluster,
                     "every broker live")
    except BaseException:
        cluster.close()
        raise
    return cluster, cluster.address(1)


def _replicated_topic(bootstrap: str, topic: str, brokers: int, partitions: int,
                      config: dict[str, str]) -> tuple[tuple[str, int], ...]:
    """Create ``topic`` (every broker a replica of every partition); each partition's
    leader's address, by partition, once every ISR is full."""
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=partitions, replication_factor=brokers,
                           config={"min.insync.replicas": str(min(2, brokers)), **config})

        def led() -> Any:
            infos = admin.describe_topic(topic).partition_info
            full = len(infos) == partitions and all(
                info.leader is not None and len(info.isr) == brokers for info in infos)
            return sorted(infos, key=lambda info: info.partition) if full else None
        leaders = [info.leader for info in wait_for(led, "a full ISR")]
        brokers_by_id = {b.node_id: (b.host, b.port) for b in admin.cluster_status().brokers}
    return tuple(brokers_by_id[leader] for leader in leaders)


def _rivven_line(options: BenchOptions, round_index: int, cpus: tuple[int | None, int | None],
                 client: bool, clustered: bool = False,
                 machine_cpus: frozenset[int] | None = None) -> LineResult:
    server_cpu, load_cpu = cpus
    server = None
    cluster = None
    if clustered:
        cluster, bootstrap = _start_cluster(options, machine_cpus)
        address = ("", 0)  # the topic's leader, below
    elif options.bootstrap is None:
        env = dict(item.split("=", 1) for item in options.broker_env)
        server = servers.start_rivven(options.sync, server_cpu, options.data_dir,
                                      options.broker_flags, env)
        address = server.address
    else:
        host, _, port = options.bootstrap.partition(",")[0].rpartition(":")
        address = (host or "127.0.0.1", int(port))
    target = "client" if client else "cluster" if clustered else "rivven"
    line = LineResult(target, options.sync)
    ledger = Ledger()
    try:
        topic = _topic(options, target, round_index)
        topic_config = dict(item.split("=", 1) for item in options.topic_config)
        # A --cluster line sends each connection to one partition, at its leader; with several
        # partitions the single broker's line does too (all leaders are the one broker), so
        # the two lines carry the same load.
        leaders: tuple[tuple[str, int], ...] = ()
        if cluster is not None:
            leaders = _replicated_topic(bootstrap, topic, options.cluster, options.partitions,
                                        topic_config)
            address = leaders[0]
        else:
            _admin_create(f"{address[0]}:{address[1]}", topic, options.partitions, topic_config)
            if options.cluster and options.partitions > 1:
                leaders = (address,) * options.partitions
        if leaders:
            line.extra["leaders"] = [f"{host}:{port}" for host, port in leaders]
        mark_at = None if client and options.mode == "produce" else rivven_load.batch_template(
            options.record_bytes, options.batch).mark_at
        specs: list[WorkerSpec] = []
        if options.mode in ("produce", "e2e"):
            kind = "client-produce" if client else "rivven-produce"
            specs += _producer_specs(kind, options, address, topic, load_cpu, leaders)
        if options.mode == "consume":
            filled = _fill_rivven(address, topic, options, ledger)
            kind = "client-consume" if client else "rivven-consume"
            count = 1 if client else options.consumers
            specs += _consumer_specs(kind, options, address, topic, load_cpu, filled, count)
        elif options.mode == "e2e":
            specs += _consumer_specs("rivven-consume", options, address, topic, load_cpu, 0,
                                     options.consumers)
        results, line.server_cpu_s = _spawn_workers(specs, server or cluster)
        consumers = [r for r in results if r.kind.endswith("consume")]
        if options.mode == "e2e":
            producers = [r for r in results if r.kind.endswith("produce")]
            _merge(line, consumers, ledger)
            line.extra["produce_latency"] = Latency.merged(
                [r.latency for r in producers if r.latency]).summary_ms()
            for result in producers:
                line.errors += result.errors
                for producer, sent, acked, failed in result.producers:
                    ledger.add_producer(producer, sent, acked, failed)
        else:
            _merge(line, results, ledger)
        if options.verify and options.acks != 0:
            read = rivven_load.verify_log(address, topic, options.partitions, ledger,
                                          mark_at=mark_at, leaders=leaders)
            _judge(line, ledger, read)
    finally:
        if server is not None:
            code = server.stop()
            if code not in (0, None):
                line.errors.append(f"rivven-broker exited with {code}")
        if cluster is not None:
            cluster.close()
    return line


def _peer_line(options: BenchOptions, round_index: int, cpus: tuple[int | None, int | None]) -> LineResult:
    server_cpu, load_cpu = cpus
    peer = options.peer
    assert peer is not None
    setting = peer_sync_for(peer, options.sync, options.peer_sync)
    if options.mode == "consume":  # reads are measured; fill without waiting for fsyncs
        setting = "no" if peer == "redis" else "default"
    start = servers.start_redis if peer == "redis" else servers.start_nats
    server = start(setting, server_cpu, options.data_dir)
    line = LineResult(peer, setting)
    ledger = Ledger()
    try:
        topic = _topic(options, peer, round_index)
        if peer == "nats":
            peer_load.create_jetstream_stream(server.address, topic)
        specs: list[WorkerSpec] = []
        if options.mode == "produce":
            specs = _producer_specs(f"{peer}-produce", options, server.address, topic, load_cpu)
        else:
            filled = _fill_peer(peer, server.address, topic, options, ledger)
            specs = _consumer_specs(f"{peer}-consume", options, server.address, topic, load_cpu,
                                    filled, options.consumers)
        results, line.server_cpu_s = _spawn_workers(specs, server)
        _merge(line, results, ledger)
        if options.verify:
            read = peer_load.verify_stream(peer, server.address, topic, ledger)
            _judge(line, ledger, read)
    finally:
        server.stop()
    return line


def _fill_peer(peer: str, address: tuple[str, int], topic: str, options: BenchOptions,
               ledger: Ledger) -> int:
    requests = max(1, options.effective_fill_records // options.batch)
    spec = WorkerSpec(f"{peer}-produce", 0, options, address, topic)
    producer = 1_000_000
    if peer == "redis":
        channel: Channel = peer_load.RedisProduceChannel(connect(address), producer, spec)
    else:
        inbox = "_INBOX.fill"
        sock = peer_load.nats_open(address, {inbox: 1})
        channel = peer_load.NatsProduceChannel(sock, producer, spec, inbox)
    try:
        fill(channel, requests, 8)
    finally:
        channel.close()
    ledger.add_producer(producer, channel.next_sequence, channel.acked, channel.failed)
    return requests * options.batch


def run_line(target: str, options: BenchOptions, round_index: int = 0) -> LineResult:
    """One target (``rivven``, ``client``, ``redis`` or ``nats``) for one round. Blocks.

    Raises ``servers.ServerError`` when a server cannot start, ``OSError``/``ConnectionError``
    on socket failures and ``RuntimeError`` when a worker fails to start or report.
    """
    cpus = servers.cpu_plan(options.pin)
    original = os.sched_getaffinity(0) if cpus[1] is not None else None
    if cpus[1] is not None:
        os.sched_setaffinity(0, {cpus[1]})
    try:
        if target in ("rivven", "client", "cluster"):
            return _rivven_line(options, round_index, cpus, client=target == "client",
                                clustered=target == "cluster",
                                machine_cpus=None if original is None else frozenset(original))
        return _peer_line(attrs.evolve(options, peer=target), round_index, cpus)
    finally:
        if original is not None:
            os.sched_setaffinity(0, original)


def run_bench(options: BenchOptions) -> list[dict[str, LineResult]]:
    """Every round: Rivven, then the client line (``--client``), then the peer. Blocks."""
    storage.tune_malloc()  # the verification read allocates MiB buffers (see storage.py)
    rounds = []
    for round_index in range(options.rounds):
        lines = {"rivven": run_line("rivven", options, round_index)}
        if options.client_line and options.mode != "e2e":
            lines["client"] = run_line("client", options, round_index)
        if options.cluster:
            lines["cluster"] = run_line("cluster", options, round_index)
        if options.peer is not None:
            lines[options.peer] = run_line(options.peer, options, round_index)
        rounds.append(lines)
    return rounds
