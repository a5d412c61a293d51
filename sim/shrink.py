"""Shrinking: the smallest fault schedule that still breaks the same invariant.

Theory of operation
-------------------
A failing run's realised schedule often holds many faults that have nothing to do with the
failure. ``shrink`` runs delta debugging (Zeller's *ddmin*) over the list: split it into ``n``
chunks, try the schedule without each chunk (same scenario, same seed, nemesis off); when one
still breaks the invariant, keep that smaller schedule and coarsen ``n``, otherwise refine
``n`` until the chunks are single faults. It first tries the empty schedule (a failure that
needs no fault at all is the best report). The result is 1-minimal: removing any single fault
makes the failure disappear (for this seed). Every try is a full deterministic run, so
shrinking costs O(faults * log(faults)) runs; ``runs_max`` bounds it.

Removing a fault changes everything after it (different timing, different random draws
downstream), so a shrunk schedule may fail differently; only the *invariant* is held fixed.
"""

from __future__ import annotations

from typing import Callable, Sequence

from sim.scenario import Fault

__all__ = ["shrink"]

#: Runs a schedule; returns the names of the invariants it broke.
Runner = Callable[[list[Fault]], set[str]]


def shrink(faults: Sequence[Fault], invariant: str, run: Runner, *, runs_max: int = 200,
           progress: Callable[[str], None] | None = None) -> tuple[list[Fault], int]:
    """A 1-minimal sub-schedule of ``faults`` that still breaks ``invariant``, and the number
    of runs it took. Blocks for all those runs."""
    runs = 0

    def fails(candidate: list[Fault]) -> bool:
        nonlocal runs
        runs += 1
        broken = invariant in run(candidate)
        if progress is not None:
            progress(f"try {runs}: {len(candidate)} faults -> {'fails' if broken else 'passes'}")
        return broken

    current = list(faults)
    if current and fails([]):
        return [], runs
    chunks = 2
    while len(current) >= 2 and runs < runs_max:
        size = -(-len(current) // chunks)  # ceiling division
        reduced = False
        for start in range(0, len(current), size):
            candidate = current[:start] + current[start + size:]
            if runs >= runs_max:
                break
            if fails(candidate):
                current = candidate
                chunks = max(chunks - 1, 2)
                reduced = True
                break
        if not reduced:
            if chunks >= len(current):
                break
            chunks = min(chunks * 2, len(current))
    return current, runs
