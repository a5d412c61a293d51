"""Membership in the simulator: sample every node's view, then judge it against the truth.

Theory of operation
-------------------
In a ``[nodes] cluster = true`` scenario every node is a real ``Broker`` running the real
membership driver over the simulated datagram path. ``MembershipMonitor`` samples each
serving node's view (``broker.membership.members()``) every ``sample_ms`` of virtual time and
keeps every change it sees; the truth comes from the run's history (``start``, ``crash`` and
``stopped`` notes of each node) and the fault schedule. Four invariants of docs/invariants.md:

- ``membership_detects_crashes``: a node that crashed and stayed down for ``detect_within``
  is seen dead (or left) within ``detect_within`` by every node that was serving throughout.
- ``membership_no_false_dead``: a node is never seen dead while it is up and no fault touched
  it (crash, pause, partition or stall naming it, or a partition of everyone) in the
  ``detect_within`` before — loss, duplication and reordering alone must never kill anyone.
- ``membership_converges``: when the run ends (after the quiet period), every serving node
  sees every serving node alive under its current boot, and nobody else alive.
- ``membership_wrong_key_excluded``: a node holding another key never appears in any view.
"""

from __future__ import annotations

from typing import Any

import trio

from rivven_cluster.membership import MemberState
from sim.checkers import Violation
from sim.history import History
from sim.scenario import Fault, Scenario

__all__ = ["MembershipMonitor"]

_SAMPLE_MS = 50
_DOWN = ("crash", "stopped")


class MembershipMonitor:
    """Samples the views of a cluster run (see the module docstring)."""

    def __init__(self, world: Any, sample_ms: int = _SAMPLE_MS) -> None:
        self._world = world
        self.sample_ms = sample_ms
        #: observer -> member -> (state, boot id), as last sampled
        self._views: dict[str, dict[int, tuple[MemberState, int]]] = {}
        #: (time ms, observer, member node id, state)
        self.changes: list[tuple[float, str, int, MemberState]] = []
        self.wrong_key_seen: list[tuple[float, str, int]] = []

    async def run(self) -> None:
        while True:
            self.sample()
            await trio.sleep(self.sample_ms / 1000)

    def sample(self) -> None:
        now_ms = trio.current_time() * 1000
        wrong = {self._world.nodes[name].node_id for name in self._world.scenario.nodes.wrong_key}
        for name, host in self._world.nodes.items():
            broker = host.broker
            if not host.up or broker is None or broker.membership is None:
                self._views.pop(name, None)
                continue
            view = {m.node_id: (m.state, m.boot_id) for m in broker.membership.members()}
            before = self._views.get(name, {})
            for node, (state, boot) in view.items():
                if before.get(node, (None, 0))[0] is not state:
                    self.changes.append((now_ms, name, node, state))
                if node in wrong and node != host.node_id:
                    self.wrong_key_seen.append((now_ms, name, node))
            self._views[name] = view

    # --- judging ---------------------------------------------------------------------------

    def check(self, scenario: Scenario, history: History, schedule: list[Fault],
              end_ms: float) -> list[Violation]:
        nodes = self._world.nodes
        id_of = {name: host.node_id for name, host in nodes.items()}
        name_of = {node_id: name for name, node_id in id_of.items()}
        down_spans = _down_spans(history, list(nodes), end_ms)
        within = scenario.checks.detect_within_ms
        found: list[Violation] = []
        wrong = set(scenario.nodes.wrong_key)
        for name, spans in down_spans.items():
            if name in wrong:
                continue
            for start, stop in spans:
                if stop - start < within:
                    continue
                for observer in nodes:
                    if observer in wrong or observer == name or _down_during(
                            down_spans[observer], start, start + within):
                        continue
                    if not any(t for t, o, m, s in self.changes
                               if o == observer and m == id_of[name]
                               and s in (MemberState.DEAD, MemberState.LEFT)
                               and start <= t <= start + within + self.sample_ms):
                        found.append(Violation(
                            "membership_detects_crashes",
                            f"{observer} did not see {name} (down at {start / 1000:.3f}s) dead "
                            f"within {within} ms"))
        touched = _touch_windows(schedule, list(nodes))
        for t, observer, member, state in self.changes:
            name = name_of.get(member)
            if state is not MemberState.DEAD or name is None or name in wrong:
                continue
            if _down_during(down_spans[name], t - within, t):
                continue
            if any(a - within <= t <= b + within for a, b in touched.get(name, [])
                   + touched.get(observer, []) + touched.get("*", [])):
                continue
            found.append(Violation(
                "membership_no_false_dead",
                f"{observer} saw {name} dead at {t / 1000:.3f}s while it was up and untouched"))
        for observer, view in sorted(self._views.items()):
            if observer in wrong:
                continue
            for name, host in sorted(nodes.items()):
                if name in wrong:
                    continue
                seen = view.get(host.node_id)
                if host.up and (seen is None or seen[0] is not MemberState.ALIVE
                                or seen[1] != host.broker.membership.boot_id):
                    found.append(Violation(
                        "membership_converges",
                        f"at the end {observer} sees {name} as "
                        f"{'nothing' if seen is None else seen[0].label} (it is serving)"))
                elif not host.up and seen is not None and seen[0] is MemberState.ALIVE:
                    found.append(Violation("membership_converges",
                                           f"at the end {observer} sees {name} alive (it is down)"))
        for t, observer, member in self.wrong_key_seen[:5]:
            found.append(Violation(
                "membership_wrong_key_excluded",
                f"{observer} saw node {member} (another key) at {t / 1000:.3f}s"))
        return [v for v in found if scenario.checked(v.invariant)][:20]


def _down_spans(history: History, names: list[str], end_ms: float
                ) -> dict[str, list[tuple[float, float]]]:
    """Per node, the (from, to) virtual ms spans it was not serving."""
    spans: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    down_since: dict[str, float] = {}
    for entry in history:
        if entry.process not in spans:
            continue
        if entry.f in _DOWN and entry.process not in down_since:
            down_since[entry.process] = entry.time_ms
        elif entry.f == "start" and entry.process in down_since:
            spans[entry.process].append((down_since.pop(entry.process), entry.time_ms))
    for name, since in down_since.items():
        spans[name].append((since, end_ms))
    return spans


def _down_during(spans: list[tuple[float, float]], start: float, stop: float) -> bool:
    return any(a < stop and start < b for a, b in spans)


def _touch_windows(schedule: list[Fault], names: list[str]
                   ) -> dict[str, list[tuple[float, float]]]:
    """Per node (``*``: everyone), the spans a fault touched it."""
    windows: dict[str, list[tuple[float, float]]] = {}
    for fault in schedule:
        if fault.kind not in ("crash", "pause", "partition", "stall", "reset", "clock"):
            continue
        end = fault.at_ms + int(fault.get("for", 0) or 0) + int(fault.get("restart_after", 0) or 0)
        touched: set[str] = set()
        if fault.get("node") in names:
            touched.add(fault.get("node"))
        for group in fault.get("groups") or []:
            touched.update(group)
        touched.update(fault.get("between") or [])
        if fault.kind == "partition" and not touched:
            touched.add("*")
        for name in touched:
            windows.setdefault(name, []).append((fault.at_ms, end))
    return windows
