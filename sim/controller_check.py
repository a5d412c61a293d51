"""The controller in the simulator: hear every Raft node, judge Raft's safety and durability.

Theory of operation
-------------------
In a ``[nodes] cluster = true`` scenario every broker runs the real controller (PySyncObj on
the Env's clock, disk and streams). ``ControllerMonitor`` is the ``ControllerObserver`` of
every incarnation of every node: it hears each command applied (node, Raft index, document,
outcome) and each election won (node, term). The workload (``ControllerWorkload``) proposes
commands through random serving nodes — topics created one after another, configs altered
again and again, partitions added and topics deleted (admin calls during the faults; the
brokers create, grow and delete the local logs), each a compare-and-set, proposed again
after a crash or a timeout — and notes which were acknowledged. Four invariants of docs/invariants.md:

- ``controller_one_leader_per_term``: no two nodes win an election in the same term;
- ``controller_logs_agree``: every node that applies index *i* applies the same document with
  the same outcome (state-machine safety: a restarted node replaying its journal included);
- ``controller_nothing_lost``: after the faults heal, every serving node applies up to the
  highest index any node ever applied, and every acknowledged command is in the final
  metadata (a topic acknowledged created exists, unless a deletion of it was proposed; an
  acknowledged config is at least as new; acknowledged partitions exist; a topic
  acknowledged deleted is gone);
- ``controller_applied_once``: no document takes effect (``APPLIED``) at two indexes — a
  command retried after a lost answer finds its change made and answers ``UNCHANGED``.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

import trio

from rivven_broker.server.cluster.controller_host import ControllerUnavailable
from rivven_cluster.metadata import (
    AlterTopicConfigs,
    CreatePartitions,
    CreateTopic,
    DeleteTopic,
    Outcome,
    Status,
)
from sim.checkers import Violation

__all__ = ["ControllerMonitor", "ControllerWorkload", "CONTROLLER_INVARIANTS"]

CONTROLLER_INVARIANTS = (
    "controller_one_leader_per_term",
    "controller_logs_agree",
    "controller_nothing_lost",
    "controller_applied_once",
)
_CATCH_UP_S = 20.0


def _digest(document: bytes) -> str:
    return hashlib.sha256(document).hexdigest()[:16]


class ControllerMonitor:
    """The observer of every controller of one run (see the module docstring)."""

    def __init__(self) -> None:
        self.leaders: dict[int, set[int]] = {}
        self.entries: dict[int, tuple[str, Status]] = {}
        self.applied_at: dict[str, list[int]] = {}
        self.highest = 0
        self.violations: list[Violation] = []

    # -- ControllerObserver ------------------------------------------------------------------

    def elected(self, node_id: int, term: int) -> None:
        leaders = self.leaders.setdefault(term, set())
        leaders.add(node_id)
        if len(leaders) == 2:
            self.violations.append(Violation(
                "controller_one_leader_per_term",
                f"term {term} has leaders {sorted(leaders)}"))

    def applied(self, node_id: int, index: int, document: bytes, outcome: Outcome) -> None:
        entry = (_digest(document), outcome.status)
        known = self.entries.get(index)
        if known is None:
            self.entries[index] = entry
            self.highest = max(self.highest, index)
            if outcome.status is Status.APPLIED:
                self.applied_at.setdefault(entry[0], []).append(index)
        elif known != entry:
            self.violations.append(Violation(
                "controller_logs_agree",
                f"node {node_id} applied {entry} at index {index}, another node {known}"))

    # -- judging -----------------------------------------------------------------------------

    async def catch_up(self, world: Any) -> None:
        """Give the serving nodes ``_CATCH_UP_S`` (virtual) to apply up to ``highest``."""
        with trio.move_on_after(_CATCH_UP_S):
            while any(index < self.highest for index in self._applied(world).values()):
                await trio.sleep(0.1)

    @staticmethod
    def _members(world: Any) -> dict[str, Any]:
        """The serving controllers of the cluster (a node holding another key is not one)."""
        outsiders = set(world.scenario.nodes.wrong_key)
        return {name: host.broker.cluster for name, host in sorted(world.nodes.items())
                if host.up and host.broker is not None and host.broker.cluster is not None
                and name not in outsiders}

    def _applied(self, world: Any) -> dict[str, int]:
        return {name: control.image().applied_index
                for name, control in self._members(world).items()}

    def check(self, world: Any, acknowledged: list[Any],
              proposed: list[Any] = ()) -> list[Violation]:
        violations = list(self.violations)
        behind = {name: index for name, index in self._applied(world).items()
                  if index < self.highest}
        if behind:
            violations.append(Violation(
                "controller_nothing_lost",
                f"after the faults healed, nodes stayed behind index {self.highest}: {behind}"))
        for name, control in self._members(world).items():
            image = control.image()
            deleting = {c.name for c in proposed if isinstance(c, DeleteTopic)}
            for command in acknowledged:
                lost = _lost(image, command, deleting)
                if lost:
                    violations.append(Violation("controller_nothing_lost", f"{name}: {lost}"))
                    break
        for digest, indexes in sorted(self.applied_at.items()):
            if len(indexes) > 1:
                violations.append(Violation(
                    "controller_applied_once",
                    f"one command took effect at indexes {indexes}"))
        return violations


def _lost(image: Any, command: Any, deleting: set[str]) -> str | None:
    if isinstance(command, DeleteTopic):
        topic = image.topic(command.name)
        if topic is not None and topic.topic_id == command.topic_id:
            return f"acknowledged deletion of {command.name} did not happen"
        return None
    if command.name in deleting:  # a deletion was proposed: it may have happened
        return None
    if isinstance(command, CreatePartitions):
        topic = image.topic(command.name)
        wanted = command.expected_count + len(command.assignment)
        if topic is None or len(topic.partitions) < wanted:
            return f"acknowledged partitions of {command.name} (to {wanted}) are gone"
    elif isinstance(command, CreateTopic):
        topic = image.topic(command.name)
        if topic is None or topic.topic_id != command.topic_id:
            return f"acknowledged topic {command.name} is gone"
    elif isinstance(command, AlterTopicConfigs):
        topic = image.topic(command.name)
        if topic is None or topic.config_version < command.expected_version + 1:
            return (f"acknowledged config version {command.expected_version + 1} of "
                    f"{command.name} went back")
    return None


class ControllerWorkload:
    """Proposes commands through random serving nodes and keeps what was acknowledged."""

    def __init__(self, world: Any, rng: random.Random, interval_s: float = 0.2) -> None:
        self._world = world
        self._rng = rng
        self._interval_s = interval_s
        self.acknowledged: list[Any] = []
        #: every command proposed, acknowledged or not
        self.commands: list[Any] = []
        self.proposed = 0
        self.unknown = 0

    def _serving(self) -> list[Any]:
        return [control for control in ControllerMonitor._members(self._world).values()
                if control.running]

    async def run(self) -> None:
        topics = 0
        while True:
            await trio.sleep(self._interval_s)
            serving = self._serving()
            if not serving:
                continue
            control = self._rng.choice(serving)
            image = control.image()
            draw = self._rng.random()
            if topics < 3 or draw < 0.3:
                live = sorted(b for b, r in image.brokers.items() if not r.fenced)
                if not live:
                    continue
                replicas = tuple(self._rng.sample(live, min(len(live), 2)))
                command: Any = CreateTopic(f"ctl-{topics}", self._rng.randbytes(8).hex(),
                                           (replicas,))
                topics += 1
            else:
                name = f"ctl-{self._rng.randrange(topics)}"
                topic = image.topic(name)
                if topic is None:
                    continue
                live = sorted(b for b, r in image.brokers.items() if not r.fenced)
                if draw < 0.45 and live and len(topic.partitions) < 4:
                    command = CreatePartitions(name, topic.topic_id, len(topic.partitions),
                                               (tuple(self._rng.sample(live, min(len(live), 2))),))
                elif draw < 0.55:
                    command = DeleteTopic(name, topic.topic_id)
                else:
                    command = AlterTopicConfigs(
                        name, topic.topic_id, topic.config_version,
                        {"retention.ms": str(60_000 + topic.config_version)})
            await self._propose(control, command)

    async def _propose(self, control: Any, command: Any) -> None:
        """Propose until an outcome (through the same node: retries are the point)."""
        self.proposed += 1
        self.commands.append(command)
        for _ in range(5):
            try:
                outcome = await control.propose(command)
            except ControllerUnavailable:
                self.unknown += 1
                if not control.running:
                    return
                continue
            if outcome.ok:
                self.acknowledged.append(command)
            return
