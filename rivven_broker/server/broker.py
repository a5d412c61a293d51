"""``Broker``: one single-node broker's life, from opening its logs to a graceful stop.

Theory of operation
-------------------
``serve`` runs everything of one broker inside one nursery, all through its ``Env`` (clock,
net, disk, run_sync), so the same code runs on real sockets and files and in the simulator:

1. *starting*: the HTTP server comes up first, so ``/health`` answers 503 while the logs
   recover. ``LogManager.open`` recovers every partition (off the event loop through
   ``env.run_sync``; nothing else touches the store yet) and each partition's recovery is
   logged; then every partition's producer state is rebuilt (snapshot + batch headers after
   it, also off the loop). Then the ``SyncWorker`` (group commit), the transaction
   coordinator's driver (which replays ``__transaction_state`` and completes in-doubt
   transactions before it reports started), the group coordinator's driver (which created
   and replayed ``__consumer_offsets`` before the sync worker started), the retention task
   (at start and every ``retention_check_interval_ms``), the log cleaner (compaction, every
   ``log_cleaner_backoff_ms``) and the client listener start.
2. *serving*: ``task_status.started(BrokerAddresses)`` reports the bound ports. Each accepted
   connection is handed to a nursery the broker owns (not the listener's), so the listener can
   stop without cutting connections. Over ``connections_max`` (by default derived from the
   descriptor limit: ``descriptors.py``) a connection is closed at once, as is an HTTP
   connection over ``http_connections_max``. All connections share one ``RequestBudget``
   for the bytes of requests still arriving. A listener on a non-loopback address logs a
   warning at start: nothing authenticates clients yet. With ``--peers`` the membership
   driver (SWIM over UDP on the cluster address) starts once the client port is bound, so
   the address it announces is the real one; at a graceful stop it announces the departure
   before connections drain. Without ``--peers`` nothing of the cluster runs.
3. *stopping* (``request_shutdown``): stop accepting; ask every connection to stop reading and
   let it finish the requests it has, for at most ``shutdown_timeout_ms`` (then cancel them);
   stop retention, the cleaner, the group and transaction drivers; close the sync worker (a
   final group commit);
   write producer-state snapshots; flush and close every log; stop HTTP; return.

A failed fsync (``SyncFailedError`` from the worker or from any waiting request) is fatal: it
propagates out of ``serve``, cancelling everything, and the process exits non-zero. The
broker never serves on after one. Only a graceful stop flushes and closes the logs (writing
their recovery points); when ``serve`` ends any other way (a failed fsync, a bug, a forced
cancel, a simulated crash) every log is *abandoned*: handles closed, nothing written, exactly
what a process death leaves, and the next start recovers.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
from typing import Any, Iterator

import attrs
import trio

from rivven_broker.server.config import BrokerConfig, HostPort, config_as_dict
from rivven_broker.server.connection import (
    ClientConnections,
    ConnectionSettings,
    serve_client_connection,
)
from rivven_broker.server.cluster.cluster_control import ClusterControl
from rivven_broker.server.cluster.controller_host import ControllerObserver, RaftConfig
from rivven_broker.server.cluster.replica_manager import ReplicaConfig, ReplicationFaults
from rivven_broker.server.local_control import LocalControl
from rivven_broker.server.local_topics import LocalTopics
from rivven_broker.server.cluster.membership_driver import MembershipDriver
from rivven_broker.server.cluster.metrics import (
    ControllerCollector,
    MembershipCollector,
    ReplicationCollector,
)
from rivven_broker.server.context import PartitionWaker, ServerContext
from rivven_broker.server.descriptors import (
    connections_max_for,
    descriptor_limit,
    files_max_for,
)
from rivven_broker.server.env import Env
from rivven_broker.server.group_driver import GroupDriver, GroupDriverSettings, GroupLagCollector
from rivven_broker.server.handlers import Handlers
from rivven_broker.server.http import json_body, render_dashboard, serve_http_connection
from rivven_broker.server.log_cleaner import LogCleaner
from rivven_broker.server.metrics import CONTENT_TYPE, BrokerMetrics, PartitionSnapshot
from rivven_broker.server.produce_lane import ProduceLane
from rivven_broker.storage.staged_appends import AppendPass
from rivven_broker.storage.partition import PartitionEvents, Partitions
from rivven_broker.server.request_budget import RequestBudget
from rivven_broker.server.scrubber import Scrubber
from rivven_broker.server.sync_thread import on_this_thread
from rivven_broker.server.txn_driver import TxnDriver
from rivven_broker.storage.errors import StorageError, SyncFailedError, stop_on_io_error
from rivven_broker.storage.handle_cache import BoundedHandles
from rivven_broker.storage.log_manager import LogManager
from rivven_broker.storage.sync_worker import SyncMode, SyncPolicy, SyncWorker
from rivven_cluster.membership import DEVELOPMENT_KEY, Address, KeyRing, Member

__all__ = ["Broker", "BrokerAddresses", "BrokerState"]

log = logging.getLogger(__name__)


class BrokerState:
    """The life stages ``/health`` reports."""

    STARTING = "starting"
    SERVING = "serving"
    STOPPING = "stopping"
    STOPPED = "stopped"


@attrs.frozen
class BrokerAddresses:
    """Where a serving broker listens (ports as bound: useful with port 0)."""

    listen: HostPort
    http: HostPort | None


class Broker:
    """One single-node broker. ``serve`` runs it; ``request_shutdown`` stops it gracefully."""

    def __init__(self, env: Env, config: BrokerConfig, *, key_ring: KeyRing | None = None,
                 controller_observer: ControllerObserver | None = None,
                 replication_faults: ReplicationFaults = ReplicationFaults(),
                 lane_answer_early: bool = False) -> None:
        self.env = env
        #: Deliberate replication bugs: only the simulator's test switches set any.
        self.replication_faults = replication_faults
        #: A deliberate lane bug (answers before durability): only the simulator sets it.
        self.lane_answer_early = lane_answer_early
        #: The produce lane (``produce_lane.py``), while serving with ``produce_lane`` on.
        self.lane: ProduceLane | None = None
        #: Hears the controller's applied commands and elections (the simulator's checkers).
        self.controller_observer = controller_observer
        self.config = config
        #: Authenticates cluster traffic (with --peers); the CLI loads it from
        #: --cluster-key-file, or allows the development key on loopback only.
        self.key_ring = key_ring if key_ring is not None else KeyRing.parse(DEVELOPMENT_KEY)
        #: Checks sealed segments' CRCs in the background (``scrubber.py``).
        self.scrubber: Scrubber | None = None
        #: SWIM membership, with --peers (``cluster/membership_driver.py``).
        self.membership: MembershipDriver | None = None
        #: The controller's metadata and admin, with --peers (``cluster/cluster_control.py``).
        self.cluster: ClusterControl | None = None
        self.metrics = BrokerMetrics(config.node_id)
        self.state = BrokerState.STARTING
        self.addresses: BrokerAddresses | None = None
        self.context: ServerContext | None = None
        self._shutdown = trio.Event()
        self._stopped = trio.Event()
        self._connections = ClientConnections()
        self._http_connections = 0
        self._accept_warned_ms = -1
        self._handlers: Handlers | None = None
        self.connections_max = config.connections_max
        if self.connections_max == -1:
            self.connections_max = connections_max_for(
                descriptor_limit(), config.http_connections_max
            )
        self.request_budget = RequestBudget(config.queued_request_bytes_max)
        self.open_files_max = config.open_files_max
        if self.open_files_max == -1:  # the other half of the descriptors (descriptors.py)
            self.open_files_max = files_max_for(descriptor_limit(), config.http_connections_max)
        self.files: BoundedHandles | None = None
        self.metrics.track_gauge(
            "rivven_request_budget_reserved_bytes",
            "Bytes of partly received requests reserved now (queued_request_bytes_max bounds).",
            lambda: self.request_budget.reserved_bytes,
        )
        #: The background compaction task, once serving (``log_cleaner.py``).
        self.log_cleaner: LogCleaner | None = None
        self.metrics.track_partitions(self._partition_snapshot)

    # --- control -------------------------------------------------------------------------------

    def request_shutdown(self) -> None:
        """Begin a graceful shutdown (idempotent; ``serve`` returns when done). Never blocks."""
        self._shutdown.set()

    async def wait_stopped(self) -> None:
        """Block until ``serve`` has finished (gracefully or not)."""
        await self._stopped.wait()

    # --- serving ---------------------------------------------------------------------------------

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Run the broker until ``request_shutdown`` (see the module docstring). Blocks.

        ``task_status.started(BrokerAddresses)`` once serving.

        Raises:
            SyncFailedError: an fsync failed; the broker stopped.
            CorruptLogError, OSError: the logs could not be opened, or a port not bound.
        """
        try:
            async with trio.open_nursery() as outer:
                http = None
                if self.config.http is not None:
                    port = await outer.start(self._serve_http)
                    http = HostPort(self.config.http.host, port)
                await self._open_and_serve(http, task_status)
                outer.cancel_scope.cancel()
        finally:
            self.state = BrokerState.STOPPED
            self._stopped.set()

    async def _open_and_serve(self, http: HostPort | None, task_status: Any) -> None:
        env, config = self.env, self.config
        logs = await self._open_logs()
        policy = SyncPolicy.parse(config.sync_policy)
        sync_worker = SyncWorker(
            policy, env.run_fsync, getattr(env, "fsync_each", None),
            filesystem_sync_files_min=getattr(env, "filesystem_sync_files_min",
                                              config.sync_filesystem_files),
            commit_in_caller=getattr(env, "commit_in_caller", None))
        self.metrics.track_sync(sync_worker.statistics)
        readiness = getattr(env.net, "readiness", None)  # (a test's Net may have none)
        staging = AppendPass()  # the lane's passes stage appends (storage/staged_appends.py)
        lane = self.lane = ProduceLane(
            readiness(), self.metrics, staging, sync=sync_worker,
            answer_early=self.lane_answer_early,
        ) if config.produce_lane and readiness is not None else None
        if lane is not None:
            self.metrics.track_lane(lane.statistics)
        committed, appended = PartitionWaker(), PartitionWaker()
        states = await self._open_partitions(logs, Partitions(sync_worker, PartitionEvents(
            appended=appended.poke, high_watermark_moved=committed.poke,
            progressed=lane.progressed if lane is not None else _nobody), staging))
        self.context = ServerContext(
            env, config, logs, sync_worker, self.metrics, _advertised_host(config.listen.host), 0,
            waker=committed, appends=appended, partitions=states,
        )
        groups = self.context.groups = GroupDriver(
            self.context, GroupDriverSettings.from_broker_config(config)
        )
        txn = self.context.txn = TxnDriver(
            self.context, states, marker_delay_ms=config.transaction_marker_delay_ms,
            clustered=bool(config.peers), offsets_sink=groups.commit_txn_offsets,
        )
        self.log_cleaner = LogCleaner(self.context, config.log_cleaner_backoff_ms)
        self.metrics.registry.register(GroupLagCollector(groups.lag_rows))
        local_topics = LocalTopics(self.context)
        local_control = LocalControl(self.context, local_topics)
        self.context.control = local_control
        if config.peers:  # the controller decides; it answers "not yet" until it runs
            self.cluster = self._cluster_control(local_topics, local_control, self.context)
            self.metrics.registry.register(ControllerCollector(self.cluster))
            self.metrics.registry.register(ReplicationCollector(self.cluster))
            self.context.control = self.context.cluster = self.cluster
        self._handlers = Handlers(self.context)
        graceful = False
        try:
            groups.open(env.clock.wall_ms())  # __consumer_offsets: created, replayed
            async with trio.open_nursery() as nursery:
                await nursery.start(sync_worker.run)
                lane_scope = trio.CancelScope()
                if lane is not None:
                    await nursery.start(_run_in_scope, lane.run, lane_scope)
                txn_scope = trio.CancelScope()
                await nursery.start(_run_in_scope, txn.run, txn_scope)
                groups_scope = trio.CancelScope()
                await nursery.start(_run_in_scope, groups.run, groups_scope)
                cleaner_scope = trio.CancelScope()
                await nursery.start(_run_in_scope, self.log_cleaner.run, cleaner_scope)
                retention_scope = trio.CancelScope()
                nursery.start_soon(self._retention_loop, logs, retention_scope)
                scrub_scope = trio.CancelScope()
                if config.scrub_bytes_per_second:
                    self.scrubber = Scrubber(self.context, config.scrub_bytes_per_second)
                    await nursery.start(_run_in_scope, self.scrubber.run, scrub_scope)
                async with trio.open_nursery() as connections:
                    listener_scope = trio.CancelScope()
                    port = await connections.start(self._listen, listener_scope, connections)
                    self.context.advertised_port = port
                    self.addresses = BrokerAddresses(HostPort(config.listen.host, port), http)
                    membership_scope = trio.CancelScope()
                    cluster_scope = trio.CancelScope()
                    if config.peers:
                        self.membership = self._membership_driver(port)
                        self.context.members = self.membership.members
                        await nursery.start(_run_in_scope, self.membership.run, membership_scope)
                        assert self.cluster is not None
                        advertised = self.membership.client_address
                        cluster = self.membership.cluster_address  # bound: Raft takes its TCP
                        run = functools.partial(
                            self.cluster.run, boot_id=self.membership.boot_id,
                            advertised=(advertised.host, advertised.port),
                            listen=(cluster.host, cluster.port))
                        await nursery.start(_run_in_scope, run, cluster_scope)
                    self.state = BrokerState.SERVING
                    log.info("node %d serving clients on %s (sync %s, at most %d connections)",
                             config.node_id, self.addresses.listen, policy,
                             self.connections_max)
                    _warn_if_exposed(config)
                    task_status.started(self.addresses)
                    await self._shutdown.wait()
                    self.state = BrokerState.STOPPING
                    log.info("stopping: no new connections; finishing in-flight requests")
                    listener_scope.cancel()
                    if self.membership is not None:
                        await self.membership.leave()
                        membership_scope.cancel()
                    cluster_scope.cancel()
                    await self._drain_connections(connections)
                lane_scope.cancel()
                retention_scope.cancel()
                scrub_scope.cancel()
                cleaner_scope.cancel()
                groups_scope.cancel()
                txn_scope.cancel()
                await sync_worker.aclose()
            graceful = True
        finally:
            self.state = BrokerState.STOPPING
            if graceful:
                states.close_all(snapshot=True)  # producer-state snapshots at the log ends
                logs.close()  # flush, persist recovery points
                log.info("all logs flushed and closed")
            else:  # a crash, a failed fsync or a forced stop: leave the files as a crash would
                states.close_all(snapshot=False)
                for _, plog in logs.logs():
                    plog.abandon()

    async def _open_logs(self) -> LogManager:
        env = self.env
        now_ms = env.clock.wall_ms()
        # Files written and not yet fsynced are the last the cache closes; under `none`
        # nothing is fsynced before close, so none is kept for that (handle_cache.py).
        pin = SyncPolicy.parse(self.config.sync_policy).mode is not SyncMode.NONE
        self.files = BoundedHandles(env.disk, self.open_files_max, pin_unsynced=pin,
                                    on_loop_thread=on_this_thread())
        self.metrics.track_files(self.files.statistics)
        opener = functools.partial(
            LogManager.open,
            self.files,
            now_ms,
            preallocate_bytes=self.config.preallocate_bytes_effective,
            rng=env.rng("topic-ids"),
        )
        logs, reports = await env.run_sync(opener)
        report = logs.open_report
        if report.registry_fallback:
            log.warning("topic registry unusable (%s): recovered topics by directory scan",
                        report.registry_problem)
        for directory in report.removed_dirs:
            log.info("removed leftover directory %s", directory)
        for (topic, partition), recovery in sorted(reports.items()):
            if recovery.clean:
                log.debug("recovered %s-%d cleanly: offsets [%d, %d)", topic, partition,
                          recovery.log_start_offset, recovery.log_end_offset)
                continue
            log.info(
                "recovered %s-%d: offsets [%d, %d), %d segments (%d scanned), %d batches "
                "checked, %d bytes cut, indexes rebuilt: %s",
                topic, partition, recovery.log_start_offset, recovery.log_end_offset,
                recovery.segments, recovery.scanned_segments, recovery.batches_kept,
                recovery.bytes_cut, ", ".join(recovery.rebuilt_indexes) or "none",
            )
            for cut in recovery.cuts:
                log.warning("  cut %s at byte %d: %d bytes (%s)", cut.file, cut.position,
                            cut.bytes_cut, cut.reason)
        return logs

    async def _open_partitions(self, logs: LogManager, states: Partitions) -> Partitions:
        """Open every partition: rebuild its producer state (snapshots + header replay), off
        the event loop."""
        reports = await self.env.run_sync(states.load_all, list(logs.logs()))
        for (topic, partition), report in sorted(reports.items()):
            if report.snapshots_dropped or report.index_problem:
                log.warning("producer state of %s-%d: dropped snapshots %s, index: %s",
                            topic, partition, ", ".join(report.snapshots_dropped) or "none",
                            report.index_problem or "ok")
            if report.batches_replayed:
                log.info("producer state of %s-%d: %d batch headers replayed after %s",
                         topic, partition, report.batches_replayed,
                         "no snapshot" if report.snapshot_offset is None
                         else f"the snapshot at {report.snapshot_offset}")
        return states

    async def _listen(
        self, scope: trio.CancelScope, connections: trio.Nursery, *, task_status: Any
    ) -> None:
        with scope:
            await self.env.net.serve_tcp(
                self._serve_connection, self.config.listen.host, self.config.listen.port,
                handler_nursery=connections, task_status=task_status,
                on_accept_failed=functools.partial(self._accept_failed, "clients"),
            )

    def _membership_driver(self, client_port: int) -> MembershipDriver:
        config = self.config
        advertised = config.advertised
        client = Address(_advertised_host(advertised.host),
                         advertised.port if config.advertise is not None else client_port)
        cluster = config.cluster_address
        driver = MembershipDriver(
            self.env, node_id=config.node_id, cluster_address=Address(cluster.host, cluster.port),
            client_address=client, rack=config.rack,
            seeds=tuple(Address(peer.address.host, peer.address.port) for peer in config.peers),
            key_ring=self.key_ring, config=config.membership_config(),
        )
        self.metrics.registry.register(MembershipCollector(driver))
        return driver

    def _cluster_control(self, local: LocalTopics, internal: LocalControl,
                         context: ServerContext) -> ClusterControl:
        config = self.config
        voters = {peer.node_id: (peer.address.host, peer.address.port) for peer in config.peers}
        return ClusterControl(
            self.env, node_id=config.node_id, rack=config.rack, voters=voters,
            ring=lambda: self.key_ring, local=local, members=self._members,
            internal=internal, auto_create_topics=config.auto_create_topics,
            default_partitions=config.default_partitions,
            default_replication_factor=config.default_replication_factor,
            observer=self.controller_observer, raft=RaftConfig.from_ms(config.controller_timings_ms()), context=context,
            replication=ReplicaConfig(lag_max_ms=config.replica_lag_time_max_ms,
                                      faults=self.replication_faults),
            liveness_grace_ms=config.membership_config().dead_within_ms(len(config.peers) + 1),
        )

    def _members(self) -> list[Member]:
        return [] if self.membership is None else self.membership.members()

    def reload_key_ring(self, ring: KeyRing) -> None:
        """Use ``ring`` for cluster traffic from now on (SIGHUP). Never blocks."""
        self.key_ring = ring
        if self.membership is not None:
            self.membership.reload(ring)

    def _accept_failed(self, listener: str, reason: str) -> None:
        """A listener could not accept (out of descriptors or memory): counted; logged once
        per minute at most, without a traceback (the listener backs off by itself)."""
        self.metrics.accept_failed(listener, reason)
        now_ms = self.env.clock.monotonic_ms()
        if now_ms >= self._accept_warned_ms + 60_000 or self._accept_warned_ms < 0:
            self._accept_warned_ms = now_ms
            log.warning("the %s listener cannot accept connections (%s): backing off; see "
                        "rivven_accept_failures_total", listener, reason)

    async def _serve_connection(self, stream: trio.abc.Stream) -> None:
        """Run by the listener, in the broker's connection nursery, per connection."""
        if self._shutdown.is_set() or len(self._connections) >= self.connections_max:
            self.metrics.connection_rejected()
            await trio.aclose_forcefully(stream)
            return
        self.metrics.connection_opened()
        assert self._handlers is not None
        await serve_client_connection(
            stream,
            self._handlers,
            settings=ConnectionSettings(
                self.config.idle_timeout_ms,
                self.config.in_flight_requests_max,
                self.config.request_timeout_ms,
            ),
            clock=self.env.clock,
            metrics=self.metrics,
            registry=self._connections,
            budget=self.request_budget,
            on_close=self.metrics.connection_closed,
            lane=self.lane,
        )

    async def _drain_connections(self, connections: trio.Nursery) -> None:
        self._connections.stop_reading()
        with trio.move_on_after(self.config.shutdown_timeout_ms / 1000):
            await self._connections.empty.wait()
        if len(self._connections):
            log.warning("cancelling %d connections still busy after %d ms",
                        len(self._connections), self.config.shutdown_timeout_ms)
        connections.cancel_scope.cancel()

    async def _retention_loop(self, logs: LogManager, scope: trio.CancelScope) -> None:
        with scope:
            while True:
                now_ms = self.env.clock.wall_ms()
                for (topic, partition), plog in logs.logs():
                    try:
                        # Decided on the loop; the unlinks and the directory fsync off it.
                        removal = plog.plan_retention(now_ms)
                        deleted = 0
                        if removal is not None:
                            try:
                                await self.env.run_sync(removal.run)
                            finally:
                                plog.finish_removal(removal)
                            deleted = removal.segments
                    except SyncFailedError:
                        raise
                    except (StorageError, OSError) as exc:  # that partition's requests say so
                        stop_on_io_error(exc, f"retention of {topic}-{partition}")
                        log.error("retention of %s-%d failed: %s", topic, partition, exc)
                        continue
                    if deleted:
                        log.info("retention deleted %d segments of %s-%d",
                                 deleted, topic, partition)
                await self.env.clock.sleep_ms(self.config.retention_check_interval_ms)

    # --- HTTP ------------------------------------------------------------------------------------

    async def _serve_http(self, *, task_status: Any) -> None:
        assert self.config.http is not None
        routes = {
            "/health": self._health,
            "/livez": self._live,
            "/readyz": self._health,
            "/metrics": self._metrics_page,
            "/": self._dashboard,
        }

        config = self.config
        http_timed_out = functools.partial(self.metrics.connection_request_timed_out, "http")

        async def handler(stream: trio.abc.Stream) -> None:
            if self._http_connections >= config.http_connections_max:
                self.metrics.http_connection_rejected()
                await trio.aclose_forcefully(stream)
                return
            self._http_connections += 1
            try:
                await serve_http_connection(
                    stream, routes, idle_timeout_ms=config.idle_timeout_ms,
                    request_timeout_ms=config.request_timeout_ms,
                    on_request_timeout=http_timed_out,
                )
            finally:
                self._http_connections -= 1

        await self.env.net.serve_tcp(
            handler, config.http.host, config.http.port, task_status=task_status,
            on_accept_failed=functools.partial(self._accept_failed, "http"),
        )

    def _live(self) -> tuple[int, str, bytes]:
        """``/livez``: 200 whenever the process answers HTTP — also while it recovers its logs
        or stops — so a liveness probe never kills a broker that is slow to start."""
        body = json_body({"status": self.state, "live": True, "node_id": self.config.node_id})
        return 200, "application/json", body

    def _health(self) -> tuple[int, str, bytes]:
        """``/readyz`` and ``/health``: 200 once ready, serving and, in a cluster, caught up
        with the controller's log (its commit index at start applied, local topics made to
        match); 503 before (recovering its logs, say) and while stopping."""
        ready = self.state == BrokerState.SERVING and (self.cluster is None or self.cluster.ready)
        body = json_body({"status": self.state, "ready": ready, "node_id": self.config.node_id})
        return 200 if ready else 503, "application/json", body

    def _metrics_page(self) -> tuple[int, str, bytes]:
        return 200, CONTENT_TYPE, self.metrics.render()

    def _dashboard(self) -> tuple[int, str, bytes]:
        topics: dict[str, list[tuple[int, int, int, int, int]]] = {}
        for row in self._partition_snapshot():
            topics.setdefault(row.topic, []).append(
                (row.partition, row.log_start_offset, row.high_watermark, row.log_end_offset,
                 row.size_bytes)
            )
        page = render_dashboard(
            node_id=self.config.node_id,
            state=self.state,
            connections=len(self._connections),
            topics=sorted(topics.items()),
            settings=config_as_dict(self.config),
        )
        return 200, "text/html; charset=utf-8", page

    def _partition_snapshot(self) -> Iterator[PartitionSnapshot]:
        context = self.context
        if context is None or self.state != BrokerState.SERVING:
            return
        for (topic, partition), plog in context.logs.logs():
            yield PartitionSnapshot(
                topic, partition, plog.log_start_offset, plog.log_end_offset,
                context.partitions.get(topic, partition, plog).high_watermark,
                plog.size_bytes,
            )


def _nobody(key: object) -> None:
    return None


async def _run_in_scope(
    run: Any, scope: trio.CancelScope, *, task_status: Any = trio.TASK_STATUS_IGNORED
) -> None:
    """``await run(task_status=...)`` inside ``scope`` (so the broker can stop it alone)."""
    with scope:
        await run(task_status=task_status)


def _warn_if_exposed(config: BrokerConfig) -> None:
    """Say loudly that a listener off loopback serves anyone: no authentication exists yet."""
    exposed = [str(address) for address in (config.listen, config.http)
               if address is not None and not is_loopback(address.host)]
    if exposed:
        log.warning(
            "listening on %s, which is not loopback, and clients are not authenticated: anyone "
            "who can reach it can produce, read, delete topics, move a group's offsets or fence "
            "a transactional producer. Restrict it with a firewall, or listen on 127.0.0.1.",
            " and ".join(exposed),
        )


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (a host name other than localhost: no)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def _advertised_host(host: str) -> str:
    """The host clients are told: the listen host, or loopback for a wildcard listen."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
