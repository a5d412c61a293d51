"""``Trace``: a rolling hash of everything that happened in a run, to prove determinism.

Theory of operation
-------------------
Every component of the simulator reports its observable events here: bytes delivered on a
link, connections opened and reset, disk crashes and injected faults, node starts and stops,
and every history entry. Each event is folded into one SHA-256 as ``time|kind|fields`` (and
raw bytes for payloads), so two runs have the same ``digest()`` only if they did the same
things in the same order at the same virtual times. ``--check-determinism`` runs a seed twice
and compares digests; a replay compares its digest to the one stored in the schedule file.

Only values that are the same on every run may go in: never ``id()``, never the iteration
order of a ``set`` of objects. An optional line sink (``--trace FILE``) keeps the readable
lines too, to diff two runs and find the first divergence.
"""

from __future__ import annotations

import hashlib
from typing import Callable

import trio

__all__ = ["Trace"]


class Trace:
    """The run's event hash. Never blocks; must be used inside ``trio.run`` (for the time)."""

    def __init__(self, sink: Callable[[str], None] | None = None) -> None:
        self._hash = hashlib.sha256()
        self._sink = sink
        self.events = 0

    def event(self, kind: str, *fields: object, payload: bytes | None = None) -> None:
        """Fold one event (and an optional payload) into the hash."""
        now_us = round(trio.current_time() * 1_000_000)
        line = f"{now_us}|{kind}|{'|'.join(map(str, fields))}"
        self._hash.update(line.encode())
        self._hash.update(b"\n")
        if payload is not None:
            self._hash.update(payload)
        self.events += 1
        if self._sink is not None:
            self._sink(line if payload is None else f"{line}|{len(payload)}B")

    def digest(self) -> str:
        """The hex digest of everything so far."""
        return self._hash.hexdigest()
