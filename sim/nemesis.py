"""The nemesis: turns a scenario's faults into a concrete schedule and applies it.

Theory of operation
-------------------
*Realising* a schedule happens before the run starts: the explicit ``[[faults]]`` of the
scenario get their ``"random"`` node selectors resolved (stream ``sim/faults``), and the seeded
random nemesis (stream ``sim/nemesis``) draws faults at intervals of ``[nemesis] interval``
with kinds chosen by ``weights``, up to the start of the quiet period. The merged list, sorted
by time, is the *realised schedule*: fully explicit, written as TOML on a failure, and what
``--replay`` and ``--shrink`` run again with the nemesis off. Fault generation uses its own
streams only, so replaying the realised schedule reproduces the run exactly.

*Applying* (``Nemesis.run``): at each fault's time, act on the world (crash and restart a node,
pause it, step or skew its clock, break its disk, partition, stall or reset links); faults with a
duration (``for``, ``restart_after``) schedule their own undo. When the quiet period starts,
``heal_all`` undoes everything still active, clears disk faults and starts every node that is
down: from then on only liveness is being tested. ``last_heal_ms`` is when the system was last
made whole, the start of the liveness window.

This module never reads a node's internals; it uses the world's ``NodeHost``, ``SimNetwork``,
``SimDisk`` and ``SimClock`` handles.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, Callable

import attrs
import trio

from sim.history import History
from sim.scenario import Fault, Scenario

if TYPE_CHECKING:
    from sim.world import World

__all__ = ["realise_schedule", "generate", "Nemesis", "is_role"]

_CLOCK_STEP_MS_MAX = 5_000
_CLOCK_RATE_DELTA_MAX = 0.01


def is_role(name: object) -> bool:
    """Whether a fault's node name is a role resolved when the fault happens."""
    return name == "controller" or (isinstance(name, str) and name.startswith("leader:"))


def realise_schedule(scenario: Scenario, seed: int, clients: tuple[str, ...]) -> list[Fault]:
    """The explicit faults (selectors resolved) plus the random nemesis's, sorted by time."""
    resolver = random.Random(f"{seed}/sim/faults")
    explicit = [_resolve(fault, resolver, scenario.nodes.names, clients) for fault in scenario.faults]
    drawn = generate(scenario, random.Random(f"{seed}/sim/nemesis"), clients)
    return sorted(explicit + drawn, key=lambda fault: fault.at_ms)


def _resolve(fault: Fault, rng: random.Random, nodes: tuple[str, ...],
             clients: tuple[str, ...]) -> Fault:
    params = dict(fault.params)
    if params.get("node") == "random":
        params["node"] = rng.choice(nodes)
    if "between" in params:
        params["between"] = [rng.choice(clients) if x == "random-client" else
                             rng.choice(nodes) if x == "random" else x for x in params["between"]]
    return Fault(fault.at_ms, fault.kind, params)


def generate(scenario: Scenario, rng: random.Random, clients: tuple[str, ...]) -> list[Fault]:
    """Random faults from ``[nemesis]``, all starting before the quiet period."""
    spec = scenario.nemesis
    if not spec.enabled:
        return []
    kinds = sorted(spec.weights)
    weights = [spec.weights[k] for k in kinds]
    nodes = scenario.nodes.names
    faults = []
    at = rng.randint(spec.interval_min_ms, spec.interval_max_ms)
    while at < scenario.faults_end_ms:
        kind = rng.choices(kinds, weights)[0]
        duration = min(rng.randint(spec.fault_for_min_ms, spec.fault_for_max_ms),
                       scenario.faults_end_ms - at)
        node = rng.choice(nodes)
        faults.append(Fault(at, kind, _draw_params(kind, node, duration, rng, clients, nodes)))
        at += rng.randint(spec.interval_min_ms, spec.interval_max_ms)
    return faults


def _draw_params(kind: str, node: str, duration: int, rng: random.Random,
                 clients: tuple[str, ...], nodes: tuple[str, ...] = ()) -> dict[str, Any]:
    if kind == "crash":
        return {"node": node, "restart_after": duration}
    if kind == "pause":
        return {"node": node, "for": duration}
    if kind == "clock":
        return {"node": node, "offset": rng.randint(-_CLOCK_STEP_MS_MAX, _CLOCK_STEP_MS_MAX),
                "rate": round(1 + rng.uniform(-_CLOCK_RATE_DELTA_MAX, _CLOCK_RATE_DELTA_MAX), 5)}
    if kind == "disk":
        if rng.random() < 0.5:
            return {"node": node, "error": "eio", "count": 1}
        return {"node": node, "error": "enospc", "for": duration}
    if kind == "partition":  # the node alone on one side (other nodes with the clients)
        if rng.random() < 0.5 or not clients:
            others = sorted([*clients, *(n for n in nodes if n != node)])
            return {"groups": [[node], others], "for": duration}
        return {"between": [node, rng.choice(clients)], "for": duration}
    if kind == "stall":
        return {"between": [node, rng.choice(clients) if clients else node], "for": duration}
    if kind == "reset":
        if rng.random() < 0.5 or not clients:
            return {"node": node}
        return {"between": [node, rng.choice(clients)]}
    if kind == "one_way" and len(nodes) > 1:
        return {"between": [node, rng.choice([n for n in nodes if n != node])], "for": duration}
    raise AssertionError(f"no random fault of kind {kind}")


class Nemesis:
    """Applies a realised schedule to a world. ``run`` in the world's nursery."""

    def __init__(self, world: World, schedule: list[Fault], history: History) -> None:
        self._world = world
        self.schedule = schedule
        self._history = history
        self._undo: dict[int, Callable[[], None]] = {}
        self._next_undo = 0
        self._nursery: trio.Nursery | None = None
        self.last_heal_ms = 0.0
        self.applied = 0

    def healed(self) -> None:
        self.last_heal_ms = max(self.last_heal_ms, trio.current_time() * 1000)

    async def run(self, faults_end_ms: int) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for fault in self.schedule:
                await trio.sleep_until(fault.at_ms / 1000)
                self.apply(fault)
            await trio.sleep_until(faults_end_ms / 1000)
            self.heal_all()
            nursery.cancel_scope.cancel()

    def _later(self, delay_ms: int, undo: Callable[[], None]) -> None:
        """Run ``undo`` after ``delay_ms`` unless ``heal_all`` runs it first."""
        key = self._next_undo
        self._next_undo += 1
        self._undo[key] = undo

        async def wait_and_undo() -> None:
            await trio.sleep(delay_ms / 1000)
            action = self._undo.pop(key, None)
            if action is not None:
                action()
                self.healed()

        assert self._nursery is not None
        self._nursery.start_soon(wait_and_undo)

    def apply(self, fault: Fault) -> None:
        """Do ``fault`` now. Never blocks."""
        world = self._world
        fault = self._resolve_roles(fault)
        self.applied += 1
        self._history.note("nemesis", fault.kind, dict(fault.params))
        kind, node = fault.kind, fault.get("node")
        if kind == "crash":
            world.nodes[node].crash(tear=fault.get("tear"), reason="nemesis")
            if fault.get("restart_after") is not None:
                self._later(fault.get("restart_after"), lambda: world.nodes[node].ensure_up())
        elif kind == "restart":
            world.nodes[node].ensure_up()
            self.healed()
        elif kind == "pause":
            world.network.pause(node)
            self._later(fault.get("for"), lambda: world.network.resume(node))
        elif kind == "clock":
            clock = world.nodes[node].clock
            clock.jump_wall_ms(int(fault.get("offset", 0)))
            clock.set_rate(float(fault.get("rate", clock.rate)))
            self.healed()
        elif kind == "disk":
            self._disk(fault)
        elif kind == "partition":
            groups = fault.get("groups") or [[x] for x in fault.get("between")]
            pairs = world.network.partition(groups)
            duration = fault.get("for")
            if duration is not None:
                self._later(duration, lambda: world.network.heal(pairs))
            else:
                self._undo[self._next_undo] = lambda: world.network.heal(pairs)
                self._next_undo += 1
        elif kind == "stall":
            a, b = fault.get("between")
            world.network.stall(a, b)
            self._later(fault.get("for", 0), lambda: world.network.unstall(a, b))
        elif kind == "one_way":  # the datagram path only: TCP needs both directions anyway
            a, b = fault.get("between")
            world.network.datagrams.block_one_way(a, b)
            self._later(fault.get("for"), lambda: world.network.datagrams.unblock_one_way(a, b))
        elif kind == "reset":
            between = fault.get("between")
            if between:
                world.network.reset(between[0], between[1])
            else:
                world.network.reset(node)
            self.healed()
        else:  # pragma: no cover - the scenario parser rejects unknown kinds
            raise AssertionError(kind)

    def _resolve_roles(self, fault: Fault) -> Fault:
        """A role names the node holding it when the fault happens: ``"controller"`` the node
        leading the Raft controller, ``"leader:TOPIC/P"`` the node leading that partition (the
        first serving node when nobody does). In ``groups`` a role takes its node out of the
        other groups: ``[["controller"], ["n1", "n2", "n3"]]`` isolates the Raft leader."""
        mentions = [fault.get("node")] + [x for group in fault.get("groups") or () for x in group]
        roles = {x: self._world.role_holder(x) for x in mentions if is_role(x)}
        if not roles:
            return fault
        params = dict(fault.params)
        if params.get("node") in roles:
            params["node"] = roles[params["node"]]
        if params.get("groups"):  # the holder joins the group naming it, and leaves the others
            groups = []
            for group in params["groups"]:
                named = [roles[x] for x in group if x in roles]
                rest = [x for x in group if x not in roles and x not in roles.values()]
                groups.append(named + rest if named else rest)
            params["groups"] = groups
        return attrs.evolve(fault, params=params)

    def _disk(self, fault: Fault) -> None:
        disk = self._world.nodes[fault.get("node")].disk
        if fault.get("error") == "eio":
            disk.fail_fsyncs(int(fault.get("count", 1)))
            return
        disk.set_full(True)
        duration = fault.get("for")
        if duration is not None:
            self._later(duration, lambda: disk.set_full(False))
        else:
            self._undo[self._next_undo] = lambda: disk.set_full(False)
            self._next_undo += 1

    def heal_all(self) -> None:
        """Undo every active fault, clear disk faults, start every node that is down."""
        undone = sorted(self._undo.items())
        self._undo.clear()
        for _, action in undone:
            action()
        restarted = 0
        for host in self._world.nodes.values():
            host.disk.clear_faults()
            restarted += host.ensure_up()
        self._history.note("nemesis", "heal_all", {"undone": len(undone), "restarted": restarted})
        if undone or restarted:
            self.healed()
