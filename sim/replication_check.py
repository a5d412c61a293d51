"""Replication in the simulator: sample every replica, judge what the replicas hold.

Theory of operation
-------------------
In a ``[nodes] cluster = true`` scenario every broker runs the real ``ReplicaManager``.
``ReplicationMonitor`` samples, every ``sample_ms`` of virtual time, each serving node's
replicas (``ReplicaManager.views()``: role, leader epoch, high watermark) and the batch headers
of their logs, and keeps what it learns across crashes. It only reads (headers through the
log's own ``iter_headers``, which draws no randomness and writes nothing), so a run with the
monitor is the run without it. Three invariants of docs/invariants.md are judged throughout:

- ``replication_replicas_agree``: below the high watermark every replica holds the same
  batches. A replica's *committed view* ends at the smaller of the high watermark it knows
  (a leader's own, a follower's from its leader's last answer) and its durable offset; every
  batch below it is compared, by base offset, last offset, leader epoch and CRC, with the
  first committed copy of that batch any replica showed, and no replica may later truncate
  below what it once showed as committed.
- ``replication_one_leader_per_epoch``: each leader epoch of a partition is led by one
  process (node and incarnation) only — another broker, or the same broker after a restart,
  leading an epoch already led is a split brain.
- ``replication_epochs_grow``: the leader epoch a node knows for a partition never goes back
  (within an incarnation; a leader's epoch also never below one that node led before), the
  committed batches of a log carry epochs that never go back with the offset, and a
  leader's high watermark never goes back within its epoch. A *new* leader may start below
  its predecessor's high watermark (it learns the rest from its followers), as in Kafka;
  that the data below stays is ``replication_replicas_agree``'s to judge.

At the end of the run ``check_led`` adds a ``liveness`` judgement: every partition some serving
node replicates has a serving leader; and ``check_told`` a fourth invariant,
``replication_high_watermark_told``: every follower that holds the data below its leader's high
watermark *knows* that high watermark, once it has stood still for longer than a follower's
long poll (``fetch_wait_ms``) plus two samples — a leader that stopped telling quiet
partitions' high watermarks would leave its followers starting low when they lead, which no
safety checker sees. Sampling misses what lasts less than ``sample_ms``; the checkers are as strong as the
samples, and the final sample is taken after the run has settled.
"""

from __future__ import annotations

from typing import Any

import trio

from rivven_broker.server.broker import BrokerState
from rivven_broker.storage.errors import StorageError, UnknownTopicOrPartitionError
from sim.checkers import Violation

__all__ = ["ReplicationMonitor", "REPLICATION_INVARIANTS"]

REPLICATION_INVARIANTS = (
    "replication_replicas_agree",
    "replication_one_leader_per_epoch",
    "replication_epochs_grow",
    "replication_high_watermark_told",
)
_SAMPLE_MS = 100
#: Violations reported per invariant (the first ones say what happened; more are noise).
_REPORT_MAX = 5

Key = tuple[str, int]
#: (last offset, partition leader epoch, CRC) of a batch, by base offset
Batch = tuple[int, int, int]


class ReplicationMonitor:
    """Samples every replica of a cluster run (see the module docstring)."""

    def __init__(self, world: Any, sample_ms: int = _SAMPLE_MS) -> None:
        self._world = world
        self.sample_ms = sample_ms
        #: the first committed copy seen of each batch
        self.committed: dict[Key, dict[int, Batch]] = {}
        #: (node, key) -> the offset below which that node's log was compared, and the epoch
        #: of the last batch compared there
        self._verified: dict[tuple[str, Key], int] = {}
        self._last_epoch: dict[tuple[str, Key], int] = {}
        #: (key, epoch) -> (node, incarnation) seen leading it
        self.leaders: dict[tuple[Key, int], tuple[str, int]] = {}
        #: (node, incarnation, key) -> highest epoch known; (node, key) -> highest epoch led
        self._epochs: dict[tuple[str, int, Key], int] = {}
        self._led: dict[tuple[str, Key], int] = {}
        #: (node, incarnation, key, epoch) -> the leader's high watermark last sampled
        self._high_watermarks: dict[tuple[str, int, Key, int], int] = {}
        #: (node, incarnation, key, epoch) -> (the leader's high watermark, since when, ms)
        self._steady: dict[tuple[str, int, Key, int], tuple[int, float]] = {}
        self.violations: list[Violation] = []
        self.samples = 0
        #: followers judged at the end on whether they know their leader's high watermark
        self.followers_judged = 0

    async def run(self) -> None:
        while True:
            await trio.sleep(self.sample_ms / 1000)
            self.sample()

    def sample(self) -> None:
        self.samples += 1
        for name, host in sorted(self._world.nodes.items()):
            broker = host.broker
            if not host.up or broker is None or broker.state != BrokerState.SERVING \
                    or broker.cluster is None or broker.cluster.replicas is None:
                continue
            views = broker.cluster.replicas.views()
            logs = broker.context.logs
            for key in sorted(views):
                view = views[key]
                self._judge_epochs(name, host.incarnation, key, view)
                try:
                    plog = logs.get_log(*key)
                except UnknownTopicOrPartitionError:
                    continue
                limit = min(view.high_watermark, plog.durable_offset)
                self._compare(name, key, plog, limit)

    def check_led(self) -> None:
        """``liveness``, at the end of the run: every partition some node replicates is led by
        a serving node (after the quiet period nothing may stay offline)."""
        replicated: set[Key] = set()
        led: set[Key] = set()
        for host in self._world.nodes.values():
            broker = host.broker
            if not host.up or broker is None or broker.state != BrokerState.SERVING \
                    or broker.cluster is None or broker.cluster.replicas is None:
                continue
            for key, view in broker.cluster.replicas.views().items():
                replicated.add(key)
                if view.leading:
                    led.add(key)
        for key in sorted(replicated - led):
            self._report("liveness", f"{_name(key)} has no serving leader at the end of the run")

    def check_told(self, now_ms: float) -> None:
        """``replication_high_watermark_told``, at the end of the run (``now_ms``, virtual):
        every follower holding the data below its leader's high watermark knows it, once it
        has stood still for a long poll and two samples."""
        #: (key, leader id, epoch) -> (its steady high watermark, for how long it must stand)
        leaders: dict[tuple[Key, int, int], tuple[int, int]] = {}
        serving = []
        for name, host in sorted(self._world.nodes.items()):
            broker = host.broker
            if not host.up or broker is None or broker.state != BrokerState.SERVING \
                    or broker.cluster is None or broker.cluster.replicas is None:
                continue
            serving.append((name, broker))
            # a high watermark that stood still for a long poll and two samples has been told
            settled_ms = broker.cluster.replicas.config.fetch_wait_ms + 2 * self.sample_ms
            for key, view in broker.cluster.replicas.views().items():
                steady = self._steady.get((name, host.incarnation, key, view.leader_epoch))
                if view.leading and steady is not None and steady[0] == view.high_watermark \
                        and now_ms - steady[1] >= settled_ms:
                    leaders[(key, broker.cluster.node_id, view.leader_epoch)] = \
                        (view.high_watermark, settled_ms)
        for name, broker in serving:
            for key, view in sorted(broker.cluster.replicas.views().items()):
                steady = leaders.get((key, view.leader, view.leader_epoch))
                if view.leading or steady is None:
                    continue
                if view.high_watermark >= steady[0]:
                    self.followers_judged += 1
                    continue
                high_watermark, settled_ms = steady
                try:
                    held = broker.context.logs.get_log(*key).durable_offset
                except UnknownTopicOrPartitionError:
                    continue
                self.followers_judged += held >= high_watermark
                if held >= high_watermark:
                    self._report("replication_high_watermark_told",
                                 f"{name} follows {_name(key)} (epoch {view.leader_epoch}) "
                                 f"holding offsets below {held} but knows high watermark "
                                 f"{view.high_watermark}; its leader's has been "
                                 f"{high_watermark} for over {settled_ms} ms")

    # -- the three invariants ----------------------------------------------------------------

    def _judge_epochs(self, node: str, incarnation: int, key: Key, view: Any) -> None:
        epoch = view.leader_epoch
        known = self._epochs.get((node, incarnation, key), -1)
        if epoch < known:
            self._report("replication_epochs_grow",
                         f"{node}#{incarnation} knew {_name(key)} at epoch {known}, now {epoch}")
        self._epochs[(node, incarnation, key)] = max(known, epoch)
        if not view.leading:
            return
        process = (node, incarnation)
        first = self.leaders.setdefault((key, epoch), process)
        if first != process:
            self._report("replication_one_leader_per_epoch",
                         f"{_name(key)} epoch {epoch} led by {first[0]}#{first[1]} and by "
                         f"{node}#{incarnation}")
        led = self._led.get((node, key), -1)
        if epoch < led:
            self._report("replication_epochs_grow",
                         f"{node} led {_name(key)} at epoch {led}, later at {epoch}")
        self._led[(node, key)] = max(led, epoch)
        hw_key = (node, incarnation, key, epoch)
        before = self._high_watermarks.get(hw_key, -1)
        if view.high_watermark < before:
            self._report("replication_epochs_grow",
                         f"{node}#{incarnation}'s high watermark of {_name(key)} went from "
                         f"{before} to {view.high_watermark} in epoch {epoch}")
        self._high_watermarks[hw_key] = max(before, view.high_watermark)
        steady = self._steady.get(hw_key)
        if steady is None or steady[0] != view.high_watermark:
            self._steady[hw_key] = (view.high_watermark, trio.current_time() * 1000)

    def _compare(self, node: str, key: Key, plog: Any, limit: int) -> None:
        verified = self._verified.get((node, key), 0)
        if plog.log_end_offset < verified:
            self._report("replication_replicas_agree",
                         f"{node} cut {_name(key)} to {plog.log_end_offset}, below offset "
                         f"{verified} it had shown as committed")
            verified = plog.log_end_offset
            self._last_epoch.pop((node, key), None)
        if limit <= verified:
            self._verified[(node, key)] = verified
            return
        committed = self.committed.setdefault(key, {})
        try:
            for header in plog.iter_headers(verified):
                last = header.base_offset + header.last_offset_delta
                if last >= limit:
                    break
                if last < verified:
                    continue
                mine = (last, header.partition_leader_epoch, header.crc)
                before = self._last_epoch.get((node, key), -1)
                if header.partition_leader_epoch < before:
                    self._report("replication_epochs_grow",
                                 f"{node}'s {_name(key)}@{header.base_offset} is of epoch "
                                 f"{header.partition_leader_epoch}, after a batch of {before}")
                self._last_epoch[(node, key)] = header.partition_leader_epoch
                first = committed.setdefault(header.base_offset, mine)
                if first != mine:
                    self._report("replication_replicas_agree",
                                 f"{node} holds {_name(key)}@{header.base_offset} as "
                                 f"(last {mine[0]}, epoch {mine[1]}, crc {mine[2]:#x}); the "
                                 f"committed batch was (last {first[0]}, epoch {first[1]}, "
                                 f"crc {first[2]:#x})")
                verified = last + 1
        except StorageError:
            pass  # a failing disk: the node stops; judged by node_stops_after_fsync_failure
        self._verified[(node, key)] = verified

    def _report(self, invariant: str, message: str) -> None:
        if sum(v.invariant == invariant for v in self.violations) < _REPORT_MAX:
            self.violations.append(Violation(invariant, message))
            self._world.online(self.violations[-1])

    def stats(self) -> dict[str, int]:
        return {"replication_samples": self.samples,
                "replication_epochs": len(self.leaders),
                "replication_batches_compared": sum(len(b) for b in self.committed.values()),
                "replication_followers_judged": self.followers_judged}


def _name(key: Key) -> str:
    return f"{key[0]}/{key[1]}"
