"""``History``: what every client and the nemesis did, as a Jepsen-style operation log.

Theory of operation
-------------------
Each workload process (``p1``, ``c1`` ...) and the ``nemesis`` append entries. An operation is
an ``invoke`` followed by exactly one completion:

- ``ok``: it happened, with its result (a send's ``offset``, a poll's records);
- ``fail``: it definitely did not happen (the broker rejected it before appending);
- ``info``: unknown (a timeout, a reset connection, ``acks=0``): it may or may not have
  happened, and checkers must allow both.

Operations still open when the run ends are completed as ``info``. Node lifecycle and faults
are single ``info`` entries of process ``nemesis`` or of the node (``f`` = ``crash``,
``restart``, ``partition`` ...), so a failure report can show what happened around the bad
operation.

Values are plain dicts of ints, strings and lists (printable and hashable into the trace in a
stable order). The shapes the checkers read:

- send invoke ``{"topic", "partition", "values": [...], "acks", "idempotent",
  "transactional_id"}``; ok ``{"offset": base}`` (value ``i`` is at ``base + i``).
- poll ok ``{"topic", "partition", "from", "to", "records": [[offset, value], ...],
  "control": [offsets], "isolation"}``: every offset in ``[from, to)`` is a record or a
  control record (``to`` is the next position). Polls that return nothing are not recorded.
- commit_offsets ok ``{"group", "offsets": {"topic/partition": offset}}`` (consumer groups).
- txn ops ``begin`` / ``commit`` / ``abort`` with ``{"transactional_id"}`` (transactions).
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import attrs
import trio

from sim.trace import Trace

__all__ = ["Entry", "History", "INVOKE", "OK", "FAIL", "INFO"]

INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"
_TYPES = (INVOKE, OK, FAIL, INFO)


@attrs.frozen
class Entry:
    """One history line. ``invoke`` is the index of the invocation a completion completes."""

    index: int
    time_ms: float
    process: str
    type: str
    f: str
    value: dict[str, Any]
    invoke: int | None = None

    def __attrs_post_init__(self) -> None:
        assert self.type in _TYPES, self.type

    def describe(self) -> str:
        """One readable line (for failure reports)."""
        link = "" if self.invoke is None else f" (of #{self.invoke})"
        return (
            f"#{self.index:<6d} {self.time_ms / 1000:10.3f}s {self.process:>8} "
            f"{self.type:<6} {self.f:<14} {_short(self.value)}{link}"
        )


class History:
    """The append-only operation log of one run. Never blocks."""

    def __init__(self, trace: Trace) -> None:
        self._trace: Trace | None = trace
        self.entries: list[Entry] = []
        self._open: dict[int, Entry] = {}

    def __getstate__(self) -> dict[str, object]:
        """A finished history travels without its trace (``python -m sim --jobs``)."""
        return {**self.__dict__, "_trace": None}

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.entries)

    def _append(self, process: str, type_: str, f: str, value: dict[str, Any],
                invoke: int | None = None, time_ms: float | None = None) -> Entry:
        now_ms = trio.current_time() * 1000 if time_ms is None else time_ms
        entry = Entry(len(self.entries), now_ms, process, type_, f, value, invoke)
        self.entries.append(entry)
        assert self._trace is not None, "a history is written inside its run only"
        self._trace.event("history", entry.index, process, type_, f, value, invoke)
        return entry

    def invoke(self, process: str, f: str, value: dict[str, Any]) -> Entry:
        entry = self._append(process, INVOKE, f, value)
        self._open[entry.index] = entry
        return entry

    def complete(self, invocation: Entry, type_: str, value: dict[str, Any] | None = None) -> Entry:
        assert type_ in (OK, FAIL, INFO), type_
        assert self._open.pop(invocation.index, None) is invocation, "completed twice"
        return self._append(invocation.process, type_, invocation.f, value or {}, invocation.index)

    def record(self, process: str, f: str, value: dict[str, Any], *,
               invoke_ms: float | None = None) -> tuple[Entry, Entry]:
        """An operation that completed ``ok`` at once (a poll with records): both entries."""
        start = self._append(process, INVOKE, f, {}, time_ms=invoke_ms)
        return start, self._append(process, OK, f, value, start.index)

    def note(self, process: str, f: str, value: dict[str, Any]) -> Entry:
        """A single ``info`` event (a fault, a node start or stop)."""
        return self._append(process, INFO, f, value)

    def close_open(self) -> None:
        """Complete every still-open operation as ``info`` (the run is over)."""
        for entry in list(self._open.values()):
            self.complete(entry, INFO, {"error": "run ended"})

    # --- queries for checkers ---------------------------------------------------------------

    def completions(self, f: str, type_: str | None = None) -> Iterator[tuple[Entry, Entry]]:
        """(invocation, completion) pairs of operations ``f``, optionally of one outcome."""
        for entry in self.entries:
            if entry.f == f and entry.invoke is not None and (type_ is None or entry.type == type_):
                yield self.entries[entry.invoke], entry

    def around(self, indexes: Iterable[int], context: int = 0) -> list[Entry]:
        """The entries at ``indexes`` (and ``context`` neighbours each side), in order."""
        wanted: set[int] = set()
        for index in indexes:
            wanted.update(range(max(index - context, 0), min(index + context + 1, len(self.entries))))
        return [self.entries[i] for i in sorted(wanted)]


def _short(value: dict[str, Any], limit: int = 160) -> str:
    text = ", ".join(f"{k}={v}" for k, v in value.items())
    return text if len(text) <= limit else text[: limit - 3] + "..."
