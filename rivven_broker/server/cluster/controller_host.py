"""``ControllerHost``: the controller's Raft, driven from trio, on the Env's clock, disk and net.

Theory of operation
-------------------
The metadata state machine (``rivven_cluster.metadata.MetadataMachine``) is replicated by
PySyncObj (``pysyncobj_host``), which this host runs with ``autoTick=False``:

- the *ticker* task calls ``doTick`` every ``tick_s`` and whenever woken (a command proposed, a
  message queued by a delivery, a link lost); after each tick it takes the links' outbox, runs
  the journal's sync off the loop (``env.run_fsync``) and only then releases the outbox — the
  durable point every Raft message waits for (see ``raft_journal``);
- the *links* (``raft_links``) carry PySyncObj's messages over authenticated TCP and deliver
  received ones straight into PySyncObj, on the loop, between ticks (as PySyncObj's own poller
  would, at the end of a tick);
- ``propose(command)`` submits a command document and waits for it to be applied locally. A
  command lost to a leader change (``NOT_LEADER``, ``LEADER_CHANGED``, ``DISCARDED``,
  ``UNKNOWN_OUTCOME``, no leader yet) is proposed again until ``propose_timeout_s``: every
  command is a compare-and-set, so a retry of one that did commit answers ``UNCHANGED``.

Every applied command publishes a new ``MetadataImage`` (``image``) and wakes ``changed()``
waiters. ``ready`` is set once this node has applied the log up to the commit index the leader
announced after it started (PySyncObj's ``onReady``).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Protocol

import attrs
import trio
from pysyncobj import SyncObjConf

from rivven_broker.server.cluster.pysyncobj_host import (
    CLOCK,
    FAIL_REASON,
    ControllerSyncObj,
    RaftStatus,
    SnapshotHooks,
)
from rivven_broker.server.cluster.raft_journal import RaftJournal, SnapshotStore
from rivven_broker.server.cluster.raft_links import LinkConfig, RaftLinks
from rivven_broker.server.env import Env
from rivven_cluster.membership import KeyRing
from rivven_cluster.metadata import (
    Command,
    MetadataImage,
    MetadataMachine,
    Outcome,
    decode_command,
    encode_command,
)

__all__ = ["RaftConfig", "ControllerHost", "ControllerObserver", "ControllerUnavailable"]

log = logging.getLogger(__name__)

_RETRYABLE = {FAIL_REASON.MISSING_LEADER, FAIL_REASON.NOT_LEADER, FAIL_REASON.LEADER_CHANGED,
              FAIL_REASON.DISCARDED, getattr(FAIL_REASON, "UNKNOWN_OUTCOME", 7)}


_LEADER = 2  # PySyncObj's state number


class ControllerUnavailable(Exception):
    """No outcome within the time allowed (no quorum, or the queue is full): the command may
    or may not have been applied; proposing it again is safe."""


@attrs.frozen
class RaftConfig:
    """The controller's timings (``[controller]`` in ms; ``from_ms``)."""

    tick_s: float = 0.05
    append_entries_period_s: float = 0.1
    election_timeout_min_s: float = 0.4
    election_timeout_max_s: float = 1.4
    leader_fallback_timeout_s: float = 2.0
    propose_timeout_s: float = 10.0
    retry_backoff_s: float = 0.05
    log_compaction_min_entries: int = 5000
    log_compaction_min_time_s: float = 300.0
    links: LinkConfig = LinkConfig()

    @classmethod
    def from_ms(cls, timings: dict[str, int]) -> RaftConfig:
        return cls(
            tick_s=timings["tick_ms"] / 1000,
            append_entries_period_s=timings["append_entries_period_ms"] / 1000,
            election_timeout_min_s=timings["election_timeout_min_ms"] / 1000,
            election_timeout_max_s=timings["election_timeout_max_ms"] / 1000,
            leader_fallback_timeout_s=timings["leader_fallback_timeout_ms"] / 1000,
            propose_timeout_s=timings["propose_timeout_ms"] / 1000,
        )

    def syncobj_conf(self, on_ready: Callable[[], None],
                     on_state_changed: Callable[[int, int], None]) -> SyncObjConf:
        return SyncObjConf(
            autoTick=False, useFork=False, appendEntriesUseBatch=False,
            appendEntriesPeriod=self.append_entries_period_s,
            raftMinTimeout=self.election_timeout_min_s,
            raftMaxTimeout=self.election_timeout_max_s,
            leaderFallbackTimeout=self.leader_fallback_timeout_s,
            connectionTimeout=max(3.5, self.election_timeout_max_s),
            logCompactionMinEntries=self.log_compaction_min_entries,
            logCompactionMinTime=self.log_compaction_min_time_s,
            commandsWaitLeader=True, onReady=on_ready, onStateChanged=on_state_changed,
        )


class ControllerObserver(Protocol):
    """What the simulator's checkers hear from every controller (None in production)."""

    def applied(self, node_id: int, index: int, document: bytes, outcome: Outcome) -> None: ...
    def elected(self, node_id: int, term: int) -> None: ...


class ControllerHost:
    def __init__(self, env: Env, *, node_id: int, boot_id: int,
                 voters: dict[int, tuple[str, int]], ring: Callable[[], KeyRing],
                 directory: str, listen: tuple[str, int] | None = None,
                 config: RaftConfig = RaftConfig()) -> None:
        self._env = env
        self.node_id = node_id
        #: Whether this node votes; one that does not follows the log (PySyncObj's read-only
        #: node): it applies every command, proposes through the leader, never counts.
        self.voting = node_id in voters
        assert self.voting or listen is not None
        self._config = config
        self._voters = dict(voters)
        self.machine = MetadataMachine()
        self.ready = trio.Event()
        self._changed = trio.Event()
        self._wake_event = trio.Event()
        self._ticking = False
        peers = {v: a for v, a in voters.items() if v != node_id}
        self.links = RaftLinks(env, node_id, boot_id, peers, ring, self._wake, config.links,
                               voting=self.voting)
        self._journal: RaftJournal | None = None
        self._syncobj: ControllerSyncObj | None = None
        self._directory = directory
        #: Told of every applied command and every election won (the simulator's checkers).
        self.observer: ControllerObserver | None = None
        self._listen = listen if listen is not None else voters[node_id]

    # -- reading -----------------------------------------------------------------------------

    def image(self) -> MetadataImage:
        return self.machine.image()

    async def changed(self) -> None:
        """Return after the next applied command."""
        await self._changed.wait()

    def next_change(self) -> trio.Event:
        """The event set by the next applied command, taken now: a caller that takes it,
        then reads the image, misses no command applied in between."""
        return self._changed

    @property
    def voters(self) -> list[int]:
        return sorted(self._voters)  # (a node that does not vote is not among them)

    def status(self) -> RaftStatus:
        assert self._syncobj is not None
        status = self._syncobj.status()
        return status if self.voting else attrs.evolve(status, node_id=self.node_id,
                                                       state="observer")

    @property
    def running(self) -> bool:
        return self._syncobj is not None

    # -- running -----------------------------------------------------------------------------

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Start (journal recovery, snapshot, links) and tick until cancelled."""
        env = self._env
        CLOCK.set(lambda: env.clock.monotonic_ms() / 1000.0)
        self._journal = RaftJournal(env.disk, f"{self._directory}/journal")
        if self._journal.torn_bytes:
            log.warning("raft journal: dropped a torn tail of %d bytes", self._journal.torn_bytes)
        snapshots = SnapshotStore(env.disk, f"{self._directory}/snapshot")
        hooks = SnapshotHooks(save=lambda: self.machine.snapshot(), restore=self._restore)
        self._syncobj = ControllerSyncObj(
            self.node_id if self.voting else None, sorted(self._voters),
            self._config.syncobj_conf(self._on_ready, self._on_state_changed),
            transport_class=self.links.transport_class, journal=self._journal,
            snapshots=snapshots, hooks=hooks, rng=env.rng("raft"), apply=self._apply)
        self._syncobj.load_snapshot()
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(env.net.serve_tcp, self.links.handle, *self._listen)
                nursery.start_soon(self.links.run)
                nursery.start_soon(self._tick_loop)
                task_status.started()
        finally:
            self._syncobj = None

    def _wake(self) -> None:
        if not self._ticking:
            self._wake_event.set()

    async def _tick_loop(self) -> None:
        assert self._syncobj is not None and self._journal is not None
        syncobj, journal = self._syncobj, self._journal
        while True:
            with trio.move_on_after(self._config.tick_s):
                await self._wake_event.wait()
            self._wake_event = trio.Event()
            self._ticking = True
            try:
                syncobj.doTick(0.0)
            finally:
                self._ticking = False
            batch = self.links.take_outbox()
            plan = journal.sync_plan()
            if plan is not None:
                await self._env.run_fsync(plan)
            self.links.release(batch)

    def _on_ready(self) -> None:
        self.ready.set()

    def _on_state_changed(self, old: int, new: int) -> None:
        if new == _LEADER and self.observer is not None and self._syncobj is not None:
            self.observer.elected(self.node_id, self._syncobj.raftCurrentTerm)

    def _restore(self, snapshot: bytes) -> None:
        self.machine = MetadataMachine.restore(snapshot)
        self._publish()

    def _apply(self, document: bytes, index: int) -> Outcome:
        outcome = self.machine.apply(decode_command(document), index)
        self._publish()
        if self.observer is not None:
            self.observer.applied(self.node_id, index, document, outcome)
        return outcome

    def _publish(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # -- proposing ---------------------------------------------------------------------------

    async def propose(self, command: Command) -> Outcome:
        """Commit ``command`` and answer its outcome, as applied on this node.
        Raises ``ControllerUnavailable`` when no outcome came in time."""
        document = encode_command(command)
        with trio.move_on_after(self._config.propose_timeout_s):
            while True:
                syncobj = self._syncobj
                if syncobj is None:
                    raise ControllerUnavailable("the controller is not running")
                done = trio.Event()
                answer: list[Any] = []

                def callback(result: Any, error: int, done: trio.Event = done,
                             answer: list[Any] = answer) -> None:
                    answer[:] = [result, error]
                    done.set()

                syncobj.apply_command(document, callback=callback)
                self._wake()
                await done.wait()
                result, error = answer
                if error == FAIL_REASON.SUCCESS:
                    return result
                if error not in _RETRYABLE:
                    raise ControllerUnavailable(f"the controller refused the command ({error})")
                await trio.sleep(self._config.retry_backoff_s)
        raise ControllerUnavailable(
            f"no controller outcome within {self._config.propose_timeout_s:g} s")
