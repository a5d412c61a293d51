"""``World``: one deterministic run of a scenario, from a seed to a verdict.

Theory of operation
-------------------
Everything runs in ONE ``trio.run`` on ``trio.testing.MockClock(autojump_threshold=0)``:
virtual time jumps whenever every task is blocked. Trio shuffles its run queue on purpose; the
private switch ``trio._core._run._ALLOW_DETERMINISTIC_SCHEDULING`` plus seeding its private
``_r`` (``seeded_trio_scheduler``) makes that shuffle a function of the seed. trio is pinned
(0.35.0) for this; a test fails if the switch disappears. With no threads, no real I/O and
every random draw from a named ``random.Random`` stream, a seed fixes the whole run, and the
``Trace`` digest proves it.

A run:

1. realise the fault schedule (``nemesis.realise_schedule``) unless a replay supplies one;
2. start the network, every node (``NodeHost``: the REAL ``rivven_broker.server.broker.Broker``
   on a ``SimEnv``) and the nemesis;
3. create the topics, then run producers and consumers until ``duration``;
4. stop the workload (open operations become ``info``); with ``[checks] final_crash``, crash
   every node (dropping unsynced data) and restart it, so the final state is what survives a
   power loss; read every partition; run the checkers.

Online checks while it runs: every ``[checks] invariants_every`` the storage cores'
``check_invariants`` run on each serving node (``storage_invariants``), and every record a
consumer reads must already be below the node's durable offset (``reads_durable``: a broker
that serves data a crash could take back is caught even if no crash follows).

Node lifecycle. ``crash`` is a power loss: the incarnation's disk view and network are revoked
first (its unwinding ``finally`` blocks can make nothing durable), unsynced data is dropped,
then its cancel scope is cancelled. A restart is a new ``Broker`` on the same ``SimDisk`` and
``SimClock``. An incarnation that ends by itself is judged: after an injected fsync failure,
stopping is required (``node_stops_after_fsync_failure`` if it is still serving
``fsync_stop_within`` later); any other exception, or ``serve`` returning unasked, is
``no_unexpected_node_failure``. Either way the node is then treated as crashed and a supervisor
restarts it after ``restart_after_failure``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import random
import traceback
from typing import Any, Callable, Iterator

import attrs
import trio
import trio.testing

from rivven_broker.client.errors import RivvenError
from rivven_broker.process_memory import keep_freed_memory
from rivven_broker.server.broker import Broker, BrokerState
from rivven_broker.server.cluster.replica_manager import ReplicationFaults
from rivven_broker.server.config import BrokerConfig, HostPort, Peer
from rivven_broker.storage.errors import LogFailedError, StorageError, SyncFailedError
from rivven_cluster.membership import KeyRing
from sim.checkers import RunFacts, Violation, check
from sim.clients import ClientConsumerProcess, ClientProducerProcess, read_group_offsets
from sim.clock import SimClock
from sim.disk import SimDisk
from sim.env import SimEnv
from sim.log_context import ACTOR
from sim.history import History
from rivven_broker.server.cluster.controller_host import ControllerUnavailable
from rivven_cluster.metadata import CreateTopic
from sim.controller_check import ControllerMonitor, ControllerWorkload
from sim.membership_check import MembershipMonitor
from sim.replication_check import ReplicationMonitor
from sim.nemesis import Nemesis, realise_schedule
from sim.net import SimNetwork
from sim.scenario import REAL_CLIENTS, Fault, Scenario
from sim.trace import Trace
from sim.workload import (
    ConsumerProcess,
    PartitionLog,
    ProducerProcess,
    ReadFailed,
    Target,
    create_topics,
    read_logs,
)

__all__ = ["World", "RunResult", "seeded_trio_scheduler", "run_scenario", "run_in_worker"]

_FINAL_READ_TIMEOUT_S = 60.0
#: After the final crash of a cluster: time for the controller to elect, the restarted leaders
#: to claim their partitions again and their followers to report what they hold (the high
#: watermark a leader restarts from is its last checkpoint, a few seconds old).
_CLUSTER_SETTLE_S = 10.0
_ACK_BEFORE_FSYNC_POLICY = "interval_ms=1000"  # test switch: acks no longer wait for fsync
_CLUSTER_KEY = "the-simulated-cluster-key-0123456789"
#: Segment files a node keeps open: a handful, far fewer than a world's files, so every run
#: crosses the descriptor cache's evictions and reopenings, crashes included.
_OPEN_FILES_MAX = 8
#: Segments grow in steps of this much preallocated space (the broker's default with
#: ``sync_policy=always`` is 4 MiB): a run crosses many preallocation boundaries, whose zero
#: tails recovery must tell from torn writes, and the in-memory disks copy far fewer zeros.
_PREALLOCATE_BYTES = 64 * 1024
_WRONG_KEY = "somebody-elses-cluster-key-0123456789"


@contextlib.contextmanager
def seeded_trio_scheduler(seed: int | str) -> Iterator[None]:
    """Make trio's scheduler deterministic and seeded for the duration. Never blocks.

    Raises ``RuntimeError`` when trio no longer has the private switch (pin trio==0.35.0).
    """
    run_module = getattr(getattr(trio, "_core", None), "_run", None)
    if (
        run_module is None
        or not hasattr(run_module, "_ALLOW_DETERMINISTIC_SCHEDULING")
        or not isinstance(getattr(run_module, "_r", None), random.Random)
    ):
        raise RuntimeError(
            "trio._core._run._ALLOW_DETERMINISTIC_SCHEDULING/_r are gone: the simulator "
            f"needs trio==0.35.0 (installed: {trio.__version__})"
        )
    previous = run_module._ALLOW_DETERMINISTIC_SCHEDULING
    state = run_module._r.getstate()
    run_module._ALLOW_DETERMINISTIC_SCHEDULING = True
    run_module._r.seed(f"{seed}/trio-scheduler")
    try:
        yield
    finally:
        run_module._ALLOW_DETERMINISTIC_SCHEDULING = previous
        run_module._r.setstate(state)


#: Of the run loop's zero-timeout polls, one in this many reaches the kernel (see below).
_POLL_EVERY = 64


@contextlib.contextmanager
def polling_the_kernel_rarely() -> Iterator[None]:
    """Make trio's run loop skip most of its zero-timeout I/O polls for the duration.

    Under the autojumping clock the run loop polls the kernel (``epoll_wait(0)``) once per
    iteration, a twentieth of a simulation's CPU; a simulated world has no real I/O, and
    only a signal (Ctrl-C) or another thread's wake-up could arrive that way. So only one
    zero-timeout poll in ``_POLL_EVERY`` reaches the kernel, and every poll that may wait
    does. Never blocks.

    Raises ``RuntimeError`` when trio's I/O manager has moved (pin trio==0.35.0).
    """
    manager = getattr(getattr(getattr(trio, "_core", None), "_run", None), "TheIOManager", None)
    original = getattr(manager, "get_events", None)
    if manager is None or original is None:
        raise RuntimeError("trio._core._run.TheIOManager.get_events is gone: the simulator "
                           f"needs trio==0.35.0 (installed: {trio.__version__})")
    skipped = 0

    def get_events(self: Any, timeout: float) -> Any:
        nonlocal skipped
        if timeout <= 0 and skipped < _POLL_EVERY - 1:
            skipped += 1
            return []
        skipped = 0
        return original(self, timeout)

    manager.get_events = get_events
    try:
        yield
    finally:
        manager.get_events = original


class LivelockGuard(trio.abc.Instrument):
    """Stops a run whose virtual time no longer advances while tasks keep running.

    Under autojump a busy loop (a task that waits 0 ms, forever) freezes virtual time, and the
    run would spin for ever in real time. After ``steps_max`` task steps at one instant the
    guard records which tasks were running and cancels the whole run.
    """

    def __init__(self, steps_max: int = 200_000) -> None:
        self.steps_max = steps_max
        self._now = -1.0
        self._steps = 0
        self._busy: dict[str, int] = {}
        self.report: str | None = None
        self.scope: trio.CancelScope | None = None

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        self._steps += 1
        if self._steps & 63 and self._steps < self.steps_max - 1000:
            return  # reading the clock at every step costs ~2 % of a run: every 64th will do
        now = trio.current_time()
        if now != self._now:
            self._now, self._steps = now, 0
            self._busy.clear()
            return
        if self._steps > self.steps_max - 1000:
            self._busy[task.name] = self._busy.get(task.name, 0) + 1
        if self._steps >= self.steps_max and self.report is None:
            busiest = sorted(self._busy.items(), key=lambda item: (-item[1], item[0]))[:3]
            self.report = (f"virtual time stuck at {now:.3f}s for {self._steps} task steps "
                           f"(a busy loop); busiest tasks: "
                           + ", ".join(f"{name} x{count}" for name, count in busiest))
            if self.scope is not None:
                self.scope.cancel()


@attrs.frozen
class RunResult:
    """The verdict of one run."""

    scenario: Scenario
    seed: int
    trace_digest: str
    violations: tuple[Violation, ...]
    history: History
    schedule: tuple[Fault, ...]
    stats: dict[str, Any]

    @property
    def ok(self) -> bool:
        return not self.violations


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


class NodeHost:
    """One simulated machine: its clock and disk persist; broker incarnations come and go."""

    def __init__(self, world: World, name: str, index: int) -> None:
        self.world = world
        self.name = name
        self.node_id = index + 1
        spec = world.scenario.nodes
        rng = random.Random(f"{world.seed}/sim/node/{name}")
        offset = rng.randint(-spec.clock_offset_max_ms, spec.clock_offset_max_ms)
        rate = 1.0 + rng.uniform(-spec.clock_drift_max, spec.clock_drift_max)
        self.clock = SimClock(offset_ms=offset, rate=rate)
        self.disk = SimDisk(name, world.scenario.disk, random.Random(f"{world.seed}/sim/disk/{name}"),
                            world.trace)
        self.disk.on_fsync_failure = self._fsync_failed
        self.incarnation = -1
        self.up = False
        self.broker: Broker | None = None
        self._invariants_reported = False
        self._scope: trio.CancelScope | None = None
        self._killed = False
        self._errors_at_start = 0

    def config(self) -> BrokerConfig:
        spec = self.world.scenario.nodes
        policy = spec.sync_policy
        if self.world.scenario.test.ack_before_fsync:
            policy = _ACK_BEFORE_FSYNC_POLICY
        peers: tuple[Peer, ...] = ()
        if spec.cluster:  # every other node, at its cluster port (the client port + 1)
            peers = tuple(Peer(i + 1, HostPort(name, spec.port + 1))
                          for i, name in enumerate(spec.names) if name != self.name)
        return BrokerConfig(
            node_id=self.node_id, data_dir=".", listen=HostPort(self.name, spec.port),
            http=None, sync_policy=policy, auto_create_topics=False, peers=peers,
            open_files_max=_OPEN_FILES_MAX, preallocate_bytes=_PREALLOCATE_BYTES,
            rack=spec.racks[self.node_id - 1] if spec.racks else None,
        )

    def key_ring(self) -> KeyRing:
        key = _WRONG_KEY if self.name in self.world.scenario.nodes.wrong_key else _CLUSTER_KEY
        return KeyRing.parse(key)

    def ensure_up(self) -> bool:
        """Start a new incarnation if none is running. Returns whether it did."""
        if self.up:
            return False
        self.incarnation += 1
        self.up = True
        self._killed = False
        self._errors_at_start = self.disk.errors_raised
        self.world.nursery.start_soon(self._run, self.incarnation)
        return True

    def crash(self, *, tear: bool | None = None, reason: str) -> None:
        """Power loss now (if up): revoke disk and network, drop unsynced data, cancel."""
        if not self.up:
            return
        self.up = False
        self._killed = True
        self.broker = None  # gone: nothing may reach its revoked disk until the next starts
        torn = self.disk.crash(tear)
        self.world.network.crash(self.name)
        self.world.history.note(self.name, "crash", {"reason": reason, "incarnation": self.incarnation,
                                                     "torn": torn})
        assert self._scope is not None
        self._scope.cancel()

    async def _run(self, incarnation: int) -> None:
        identity = self.name if incarnation == 0 else f"{self.name}@{incarnation}"
        ACTOR.set(identity)
        env = SimEnv(seed=self.world.seed, identity=identity, clock=self.clock,
                     net=self.world.network.endpoint(self.name), disk=self.disk)
        self.world.history.note(self.name, "start", {"incarnation": incarnation})
        failure: BaseException | None = None
        bug = self.world.scenario.test.replication_bug
        faults = ReplicationFaults(high_watermark_ignores_followers=bug == "hw_ignores_followers",
                                   truncate_to_high_watermark=bug == "truncate_to_hw",
                                   elect_outside_isr=bug == "elect_outside_isr",
                                   coordinator_skips_load=bug == "coordinator_skips_load",
                                   lead_same_epoch_again=bug == "lead_same_epoch_again",
                                   stamp_first_epoch=bug == "stamp_first_epoch",
                                   high_watermark_untold=bug == "hw_untold")
        broker = self.broker = Broker(env, self.config(), key_ring=self.key_ring(),
                                      controller_observer=self.world.controller_monitor,
                                      replication_faults=faults,
                                      lane_answer_early=self.world.scenario.test.lane_answer_early)
        with trio.CancelScope() as scope:
            self._scope = scope
            try:
                await broker.serve()
            except Exception as exc:  # judged below: the node died by itself
                failure = exc
        if self._killed or incarnation != self.incarnation:
            return  # we crashed it; whatever its unwinding raised is moot
        self._judge(failure)

    def _judge(self, failure: BaseException | None) -> None:
        world = self.world
        injected = self.disk.errors_raised > self._errors_at_start
        if failure is None:
            world.online(Violation("no_unexpected_node_failure",
                                   f"{self.name}: Broker.serve returned without a shutdown request"))
            why = "returned"
        elif injected and all(_is_disk_failure(leaf) for leaf in _leaves(failure)):
            why = "stopped on an injected disk error"
        else:
            world.online(Violation("no_unexpected_node_failure",
                                   f"{self.name} incarnation {self.incarnation} died: "
                                   f"{_describe_failure(failure)}"))
            why = f"died: {type(failure).__name__}"
        # Treat the dead process as a crash: its unsynced pages are not to be trusted.
        self.up = False
        self.disk.crash(False)
        world.network.crash(self.name)
        world.history.note(self.name, "stopped", {"why": why, "incarnation": self.incarnation})
        world.nursery.start_soon(self._supervise, self.incarnation)

    async def _supervise(self, incarnation: int) -> None:
        await trio.sleep(self.world.scenario.nodes.restart_after_failure_ms / 1000)
        if self.incarnation == incarnation and self.ensure_up():
            self.world.nemesis.healed()

    def _serving_context(self) -> Any:
        broker = self.broker
        if not self.up or broker is None or broker.state != BrokerState.SERVING:
            return None
        return broker.context

    def durable_offset(self, topic: str, partition: int) -> int | None:
        """The serving incarnation's durable offset of a partition (None when not serving)."""
        context = self._serving_context()
        if context is None:
            return None
        try:
            return context.logs.get_log(topic, partition).durable_offset
        except StorageError:
            return None

    def check_storage(self) -> None:
        """Run the storage cores' own ``check_invariants`` (first failure per node reported)."""
        context = self._serving_context()
        if context is None or self._invariants_reported:
            return
        try:
            context.logs.check_invariants()
        except AssertionError as exc:
            self._invariants_reported = True
            self.world.online(Violation("storage_invariants",
                                        f"{self.name}: {_describe_failure(exc)}"))

    def _fsync_failed(self) -> None:
        incarnation = self.incarnation
        self.world.history.note(self.name, "fsync_failed", {"incarnation": incarnation})

        async def watchdog() -> None:
            await trio.sleep(self.world.scenario.checks.fsync_stop_within_ms / 1000)
            if self.up and self.incarnation == incarnation:
                self.world.online(Violation(
                    "node_stops_after_fsync_failure",
                    f"{self.name} still serving {self.world.scenario.checks.fsync_stop_within_ms}"
                    " ms after an fsync failed"))
                self.crash(reason="kept serving after fsync failure")
                self.world.nursery.start_soon(self._supervise, self.incarnation)

        self.world.nursery.start_soon(watchdog)


def _is_disk_failure(exc: BaseException) -> bool:
    """A fail-stop on a disk error: acceptable when the simulator injected one. Any link of
    the cause chain may say so (a ``SyncFailedError`` raised over a ``StorageError`` over the
    injected ``OSError``)."""
    link: BaseException | None = exc
    while link is not None:
        if isinstance(link, (SyncFailedError, LogFailedError)):
            return True
        if isinstance(link, OSError) and link.errno in (errno.EIO, errno.ENOSPC):
            return True
        link = link.__cause__
    return False


def _describe_failure(failure: BaseException, frames: int = 6) -> str:
    """Each leaf exception with the last few frames of its traceback (the full group is long)."""
    parts = []
    for leaf in _leaves(failure):
        lines = traceback.format_exception(leaf)
        parts.append("".join([*lines[-frames - 1:-1], lines[-1]]).rstrip())
    return "\n".join(parts)


class World:
    """Builds and runs one scenario at one seed. ``run()`` is the entry point."""

    def __init__(self, scenario: Scenario, seed: int, *, schedule: list[Fault] | None = None,
                 trace_sink: Callable[[str], None] | None = None) -> None:
        self.scenario = scenario
        self.seed = seed
        self._given_schedule = schedule
        self._trace_sink = trace_sink
        self._online: list[Violation] = []
        self.stopped_at_violation = False
        self.nursery: trio.Nursery | None = None
        self._monitor: MembershipMonitor | None = None
        #: Hears every controller of a cluster run (``controller_check.py``).
        self.controller_monitor = ControllerMonitor() if scenario.nodes.cluster else None
        #: Samples every replica of a cluster run (``replication_check.py``).
        self.replication_monitor = ReplicationMonitor(self) if scenario.nodes.cluster else None
        self.controller_workload: ControllerWorkload | None = None
        self.guard = LivelockGuard()
        producers = [f"p{i + 1}" for i in range(sum(p.count for p in scenario.producers))]
        consumers = [f"c{i + 1}" for i in range(sum(c.count for c in scenario.consumers))]
        self.producer_names = tuple(producers)
        self.consumer_names = tuple(consumers)
        self.clients = (*self.producer_names, *self.consumer_names, "admin")
        if schedule is None:
            self.schedule = realise_schedule(scenario, seed, self.clients)
        else:
            self.schedule = sorted(schedule, key=lambda fault: fault.at_ms)

    def role_holder(self, role: str) -> str:
        """The node holding a fault's role now: ``"controller"`` or ``"leader:TOPIC/P"``."""
        if role == "controller":
            return self.controller_leader()
        topic, _, partition = role.removeprefix("leader:").rpartition("/")
        return self.partition_leader(topic, int(partition))

    def partition_leader(self, topic: str, partition: int) -> str:
        """The serving node leading a partition at the highest epoch (or the first one up)."""
        best: tuple[int, str] | None = None
        for name, host in sorted(self.nodes.items()):
            broker = host.broker
            if host.up and broker is not None and broker.cluster is not None \
                    and broker.cluster.replicas is not None:
                view = broker.cluster.replicas.views().get((topic, partition))
                if view is not None and view.leading and (best is None or view.leader_epoch > best[0]):
                    best = (view.leader_epoch, name)
        if best is not None:
            return best[1]
        up = [name for name, host in sorted(self.nodes.items()) if host.up]
        return up[0] if up else sorted(self.nodes)[0]

    def controller_leader(self) -> str:
        """The serving node that leads the controller in the highest term (or the first one)."""
        best: tuple[int, str] | None = None
        for name, host in sorted(self.nodes.items()):
            broker = host.broker
            if host.up and broker is not None and broker.cluster is not None \
                    and broker.cluster.running:
                status = broker.cluster.status()
                if status.state == "leader" and (best is None or status.term > best[0]):
                    best = (status.term, name)
        if best is not None:
            return best[1]
        up = [name for name, host in sorted(self.nodes.items()) if host.up]
        return up[0] if up else sorted(self.nodes)[0]

    def online(self, violation: Violation) -> None:
        self.history.note("checker", "violation", {"invariant": violation.invariant})
        self._online.append(violation)
        if violation.invariant in self.scenario.checks.stop_at and self.nursery is not None:
            self.stopped_at_violation = True
            self.nursery.cancel_scope.cancel()

    def run(self) -> RunResult:
        """Run the scenario to its verdict. Blocks (in real time) for the run's CPU time."""
        with seeded_trio_scheduler(self.seed), polling_the_kernel_rarely(), \
                _quiet_broker_logs():
            clock = trio.testing.MockClock(autojump_threshold=0)
            return trio.run(self._main, clock=clock, instruments=[self.guard])

    async def _main(self) -> RunResult:
        scenario = self.scenario
        self.trace = Trace(self._trace_sink)
        self.history = History(self.trace)
        self.network = SimNetwork(scenario.network, random.Random(f"{self.seed}/sim/net"),
                                  self.trace, random.Random(f"{self.seed}/sim/udp"))
        self.nemesis = Nemesis(self, list(self.schedule), self.history)
        final: dict[tuple[str, int], PartitionLog] | None = None
        group_offsets: dict[str, dict[str, int]] | None = None
        read_error = None
        end_ms = 0.0
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            self.guard.scope = nursery.cancel_scope
            await nursery.start(self.network.run)
            self.nodes = {name: NodeHost(self, name, i) for i, name in enumerate(scenario.nodes.names)}
            for host in self.nodes.values():
                host.ensure_up()
            nursery.start_soon(self.nemesis.run, scenario.faults_end_ms)
            nursery.start_soon(self._check_storage_loop)
            monitor = self._monitor = None
            if scenario.nodes.cluster:
                monitor = self._monitor = MembershipMonitor(self)
                nursery.start_soon(monitor.run)
            if self.replication_monitor is not None:
                nursery.start_soon(self.replication_monitor.run)
            await self._workload(scenario.duration_ms / 1000)
            self.history.close_open()
            if monitor is not None:  # judged at the end of the quiet period, before healing
                monitor.sample()
                for violation in monitor.check(scenario, self.history, list(self.schedule),
                                               trio.current_time() * 1000):
                    self.online(violation)
            self.nemesis.heal_all()
            if self.controller_monitor is not None and self.controller_workload is not None:
                await self.controller_monitor.catch_up(self)
                for violation in self.controller_monitor.check(
                        self, self.controller_workload.acknowledged,
                        self.controller_workload.commands):
                    self.online(violation)
            if scenario.checks.final_crash:
                for host in self.nodes.values():
                    host.crash(reason="final")
                    host.ensure_up()
                if scenario.nodes.cluster:  # leaders re-elected, high watermarks reported
                    await trio.sleep(_CLUSTER_SETTLE_S)
            try:
                final = await read_logs(self.network.endpoint("audit"), self._target(),
                                        scenario.topics, trio.current_time() + _FINAL_READ_TIMEOUT_S)
            except ReadFailed as exc:
                read_error = str(exc)
            groups = sorted({c.group for c in scenario.consumers if c.group is not None})
            if groups and final is not None:
                try:
                    group_offsets = await read_group_offsets(
                        self.network.endpoint("audit-groups"), self._target(), groups,
                        self.seed, trio.current_time() + _FINAL_READ_TIMEOUT_S)
                except (RivvenError, trio.TooSlowError) as exc:
                    read_error = f"the groups' committed offsets: {type(exc).__name__} {exc}"
                    final = None
            for host in self.nodes.values():
                host.check_storage()
            if self.replication_monitor is not None:
                self.replication_monitor.sample()
                self.replication_monitor.check_led()
                self.replication_monitor.check_told(trio.current_time() * 1000)
            end_ms = trio.current_time() * 1000
            nursery.cancel_scope.cancel()
        if self.guard.report is not None:
            self._online.append(Violation("liveness", self.guard.report))
        if self.guard.report is not None or self.stopped_at_violation:
            end_ms = trio.current_time() * 1000
        facts = RunFacts(final, self.producer_names, self.consumer_names, self.nemesis.last_heal_ms,
                         scenario.duration_ms, tuple(self._online), read_error,
                         stopped=self.guard.report is not None or self.stopped_at_violation,
                         group_offsets=group_offsets)
        violations = check(scenario, self.history, facts)
        return RunResult(scenario, self.seed, self.trace.digest(), tuple(violations), self.history,
                         tuple(self.schedule), self._stats(end_ms))

    async def _check_storage_loop(self) -> None:
        every_s = self.scenario.checks.invariants_every_ms / 1000
        while True:
            await trio.sleep(every_s)
            for host in self.nodes.values():
                host.check_storage()

    def observe_poll(self, process: str, topic: str, partition: int, last_offset: int,
                     entry: int) -> None:
        """Online ``reads_durable``: what a consumer just read must already be durable — on
        the node the thin clients talk to, or (replicated topics, read from any leader) on
        at least one node (the leader's high watermark is durable on every ISR member)."""
        spec = next((t for t in self.scenario.topics if t.name == topic), None)
        if spec is not None and spec.replication_factor > 1:
            found = [host.durable_offset(topic, partition) for host in self.nodes.values()]
            known = [d for d in found if d is not None]
            durable = max(known) if known else None
        else:
            durable = self.nodes[self._target().host].durable_offset(topic, partition)
        if durable is not None and last_offset >= durable:
            self.online(Violation(
                "reads_durable",
                f"{process} read {topic}/{partition}@{last_offset} while the node had made only "
                f"offsets below {durable} durable", (entry,)))

    async def _create_topics_led_by_target(self) -> None:
        """In a cluster: the workload's topics. With replication factor 1 every partition is on
        the node the thin clients talk to (they do not follow leaders); with more, replicas
        rotate over the nodes and the scenario's clients must follow leaders (``rivven``)."""
        target = self.nodes[self._target().host]
        rng = random.Random(f"{self.seed}/sim/admin")
        ids = sorted(node.node_id for node in self.nodes.values())
        for spec in self.scenario.topics:
            factor = spec.replication_factor
            if factor == 1:
                assignment = ((target.node_id,),) * spec.partitions
            else:  # rotating: every node leads some partitions
                assignment = tuple(tuple(ids[(p + i) % len(ids)] for i in range(factor))
                                   for p in range(spec.partitions))
            configs = {"min.insync.replicas": str(spec.min_insync_replicas)}
            command = CreateTopic(spec.name, rng.randbytes(8).hex(), assignment, configs)
            while True:
                control = target.broker.cluster if target.up and target.broker else None
                if control is not None and control.running:
                    try:
                        if (await control.propose(command)).ok:
                            break
                    except ControllerUnavailable:
                        pass
                await trio.sleep(0.2)
            while not (target.up and target.broker is not None and target.broker.context
                       and spec.name in target.broker.context.logs.topics()):
                await trio.sleep(0.05)
            self.history.note("admin", "create_topic", {"topic": spec.name,
                                                        "partitions": spec.partitions})

    def _target(self) -> Target:
        return Target(self.scenario.nodes.names[0], self.scenario.nodes.port)

    async def _workload(self, until_s: float) -> None:
        scenario = self.scenario
        topics = {t.name: t for t in scenario.topics}
        with trio.move_on_at(until_s):
            async with trio.open_nursery() as nursery:
                if self.controller_monitor is not None:
                    self.controller_workload = ControllerWorkload(
                        self, random.Random(f"{self.seed}/sim/controller"))
                    nursery.start_soon(self.controller_workload.run)
                if self.controller_monitor is not None:
                    await self._create_topics_led_by_target()
                else:
                    await create_topics(self.network.endpoint("admin"), self._target(),
                                        scenario.topics, self.history,
                                        random.Random(f"{self.seed}/sim/admin"))
                names = iter(self.producer_names)
                for spec in scenario.producers:
                    for _ in range(spec.count):
                        name = next(names)
                        kind = (ClientProducerProcess if spec.client in REAL_CLIENTS
                                else ProducerProcess)
                        process = kind(name, spec, topics[spec.topic].partitions,
                                       **self._process_kwargs(name, spec.client))
                        nursery.start_soon(process.run)
                names = iter(self.consumer_names)
                for cspec in scenario.consumers:
                    partitions = cspec.partitions or tuple(range(topics[cspec.topic].partitions))
                    for _ in range(cspec.count):
                        name = next(names)
                        reader = (ClientConsumerProcess if cspec.client in REAL_CLIENTS
                                  else ConsumerProcess)
                        consumer = reader(
                            name, cspec, partitions, scenario.test.fetch_skip_probability,
                            observer=self.observe_poll, **self._process_kwargs(name, cspec.client))
                        nursery.start_soon(consumer.run)
                await trio.sleep_forever()

    def _process_kwargs(self, name: str, client: str) -> dict[str, Any]:
        kwargs = {"net": self.network.endpoint(name), "target": self._target(),
                  "history": self.history, "rng": random.Random(f"{self.seed}/{name}/workload"),
                  "trace": self.trace}
        if client in REAL_CLIENTS:
            kwargs["seed"] = self.seed
        return kwargs

    def _controller_stats(self) -> dict[str, int]:
        monitor, workload = self.controller_monitor, self.controller_workload
        if monitor is None or workload is None:
            return {}
        return {"controller_terms": len(monitor.leaders), "controller_index": monitor.highest,
                "controller_acknowledged": len(workload.acknowledged)}

    def _stats(self, end_ms: float) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for entry in self.history:
            if entry.type != "invoke":
                key = f"{entry.f}.{entry.type}"
                counts[key] = counts.get(key, 0) + 1
        return {
            "virtual_s": round(end_ms / 1000, 3),
            "history_entries": len(self.history),
            "trace_events": self.trace.events,
            "faults": len(self.schedule),
            "resets": self.network.resets,
            "fsyncs": sum(h.disk.store.stats.fsyncs for h in self.nodes.values()),
            "datagrams": self.network.datagrams.sent,
            "membership_changes": 0 if self._monitor is None else len(self._monitor.changes),
            **self._controller_stats(),
            **(self.replication_monitor.stats() if self.replication_monitor else {}),
            **dict(sorted(counts.items())),
        }


@contextlib.contextmanager
def _quiet_broker_logs() -> Iterator[None]:
    """Broker logs (recovery reports after every crash) are noise in a simulation."""
    logger = logging.getLogger("rivven_broker")
    previous = logger.level
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(previous)


def run_scenario(scenario: Scenario, seed: int, *, schedule: list[Fault] | None = None,
                 trace_sink: Callable[[str], None] | None = None) -> RunResult:
    """Run one seed of ``scenario`` (or replay ``schedule``). Blocks; never raises for a
    violation (see ``RunResult.violations``)."""
    return World(scenario, seed, schedule=schedule, trace_sink=trace_sink).run()


def run_in_worker(scenario: Scenario, seed: int, schedule: list[Fault] | None) -> RunResult:
    """``run_scenario`` in a worker process of ``python -m sim --jobs`` (silent but for its
    result, which is pickled back). The worker's allocator keeps freed blocks, as
    ``rivven-broker``'s does (``process_memory.py``): the simulated disks copy MiB buffers."""
    logging.basicConfig(level=logging.CRITICAL)
    keep_freed_memory()
    return run_scenario(scenario, seed, schedule=schedule)
