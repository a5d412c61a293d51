"""``SinkCycle``: one sink's poll → write → commit loop, as a sans-I/O state machine
(``handle(event) -> list[Instruction]``).

Theory of operation
-------------------
The driver owns a consumer in the sink's group (``enable_auto_commit`` off) and the sink; it
executes the instructions it is given, in order, and reports the outcome as one event. One
batch is in flight at a time:

``POLLING``
    ``Poll`` was issued. ``Polled(records)`` — consumed records, each with ``topic``,
    ``partition`` and ``offset`` (the core looks at nothing else) — starts a batch: ``Write``.
    An empty poll polls again.
``WRITING``
    ``WriteCompleted``: the sink has the records (flushed; for a file, fsynced), so the
    batch's offsets may be committed: ``Commit(offsets)`` with, per partition, the next offset
    to read (the highest offset written + 1). ``WriteFailed(retriable)``: back off and write
    the same batch again; a permanent failure halts in ``error``.
``COMMITTING``
    ``CommitCompleted`` ends the batch: ``Poll``. ``CommitFailed`` — retriable: back off and
    commit again (never re-write: the sink has the data); ``reassigned`` (the group moved on:
    the partitions may have a new owner who reads from the last commit): the batch is
    abandoned and the next ``Poll`` comes (at-least-once: it is written again by whoever owns
    the partitions now); otherwise halt in ``error``.
``BACKING_OFF``
    ``WakeAt`` a backoff of ``backoff_base_ms`` · 2^(failures-1), capped at ``backoff_max_ms``,
    the upper half jittered by the injected ``jitter()`` in [0, 1). ``TimerFired`` retries
    the step that failed.
``DONE``
    ``Halt`` was issued; later events are ignored.

Every failed write or commit counts; ``commit_failure_threshold`` (16) in a row make the
status ``degraded`` (never silently ``running``); one ``CommitCompleted`` makes it ``running``
again and resets the count.

``StopRequested`` (SIGTERM): a write or commit in flight finishes — a written batch is still
committed — then the cycle halts ``stopped``; while polling or backing off it halts at once
(what was not committed is read again after a restart).

At-least-once, as this core enforces it: ``Commit`` for a batch is issued only after
``WriteCompleted`` for that same batch, and commits no offset beyond what it wrote. A crash
anywhere loses nothing; a crash between write and commit repeats the batch.
"""

from __future__ import annotations

import enum
from typing import Any, Callable, Sequence, Union

import attrs

from rivven_connect.core.batch_cycle import (
    Halt,
    Poll,
    Status,
    StopRequested,
    TimerFired,
    WakeAt,
    backoff_delay_ms,
    backoff_max_ms,
    commit_failure_threshold,
)

__all__ = [
    "Commit",
    "CommitCompleted",
    "CommitFailed",
    "Halt",
    "Poll",
    "Polled",
    "SinkCycle",
    "SinkPhase",
    "SinkStatus",
    "Status",
    "StopRequested",
    "TimerFired",
    "WakeAt",
    "Write",
    "WriteCompleted",
    "WriteFailed",
    "commit_failure_threshold",
    "next_offsets",
]


class SinkPhase(enum.Enum):
    NEW = "new"
    POLLING = "polling"
    WRITING = "writing"
    COMMITTING = "committing"
    BACKING_OFF = "backing_off"
    DONE = "done"


# --- events (driver -> core) ------------------------------------------------------------------


@attrs.frozen
class Polled:
    #: Consumed records (``topic``, ``partition``, ``offset`` are read; the rest is opaque).
    records: tuple[Any, ...]
    now_ms: int


@attrs.frozen
class WriteCompleted:
    batch_id: int
    now_ms: int


@attrs.frozen
class WriteFailed:
    batch_id: int
    error: str
    retriable: bool
    now_ms: int


@attrs.frozen
class CommitCompleted:
    batch_id: int
    now_ms: int


@attrs.frozen
class CommitFailed:
    batch_id: int
    error: str
    retriable: bool
    now_ms: int
    #: The member lost its generation: its partitions may be someone else's now.
    reassigned: bool = False


Event = Union[Polled, WriteCompleted, WriteFailed, CommitCompleted, CommitFailed, TimerFired,
              StopRequested]


# --- instructions (core -> driver) ------------------------------------------------------------


@attrs.frozen
class Write:
    """Hand ``records`` to the sink; report when it has them (flushed)."""

    batch_id: int
    records: tuple[Any, ...]


@attrs.frozen
class Commit:
    """Commit ``offsets``: ``((topic, partition), next offset to read)`` pairs."""

    batch_id: int
    offsets: tuple[tuple[tuple[str, int], int], ...]


Instruction = Union[Poll, Write, Commit, WakeAt, Halt]


@attrs.frozen
class SinkStatus:
    """The status snapshot (``GET /connectors/NAME/status``)."""

    state: Status
    phase: SinkPhase
    last_error: str | None
    #: ``{"topic/partition": next offset}`` committed by this cycle.
    position: dict[str, int]
    records: int
    batches: int
    consecutive_failures: int
    abandoned: int


def next_offsets(records: Sequence[Any]) -> tuple[tuple[tuple[str, int], int], ...]:
    """Per partition of ``records``, the highest offset + 1, sorted by partition."""
    highest: dict[tuple[str, int], int] = {}
    for record in records:
        tp = (record.topic, record.partition)
        highest[tp] = max(highest.get(tp, -1), record.offset)
    return tuple(sorted((tp, offset + 1) for tp, offset in highest.items()))


@attrs.define
class _Batch:
    batch_id: int
    records: tuple[Any, ...]
    written: bool = False


class SinkCycle:
    """The cycle of one sink (see the module docstring). Pure; never blocks."""

    def __init__(self, jitter: Callable[[], float]) -> None:
        self.jitter = jitter
        self.phase = SinkPhase.NEW
        self.state = Status.RUNNING
        self.last_error: str | None = None
        self.consecutive_failures = 0
        self.stopping = False
        self.batch: _Batch | None = None
        self.next_batch_id = 1
        #: What this cycle committed, per partition (the next offset to read).
        self.committed: dict[tuple[str, int], int] = {}
        #: Per partition, the highest offset + 1 the sink accepted (for the invariants).
        self.written: dict[tuple[str, int], int] = {}
        self.records_committed = 0
        self.batches_committed = 0
        self.abandoned = 0
        self._resume_phase = SinkPhase.WRITING

    # --- the entry points ---------------------------------------------------------------------
    def start(self) -> list[Instruction]:
        assert self.phase is SinkPhase.NEW
        self.phase = SinkPhase.POLLING
        return [Poll()]

    def handle(self, event: Event) -> list[Instruction]:
        """The instructions that follow ``event``. Asserts the event fits the phase."""
        if self.phase is SinkPhase.DONE:
            return []
        if isinstance(event, StopRequested):
            out = self._on_stop()
        elif isinstance(event, Polled):
            assert self.phase is SinkPhase.POLLING
            out = self._on_polled(event)
        elif isinstance(event, WriteCompleted):
            self._assert_current(event.batch_id, SinkPhase.WRITING)
            out = self._on_written()
        elif isinstance(event, WriteFailed):
            self._assert_current(event.batch_id, SinkPhase.WRITING)
            if not event.retriable:
                out = self._halt_error(f"write failed: {event.error}")
            else:
                out = self._retry_later(f"write failed: {event.error}", event.now_ms)
        elif isinstance(event, CommitCompleted):
            self._assert_current(event.batch_id, SinkPhase.COMMITTING)
            out = self._on_committed()
        elif isinstance(event, CommitFailed):
            self._assert_current(event.batch_id, SinkPhase.COMMITTING)
            out = self._on_commit_failed(event)
        else:
            assert isinstance(event, TimerFired) and self.phase is SinkPhase.BACKING_OFF
            out = self._on_timer()
        self.check_invariants()
        return out

    def status(self) -> SinkStatus:
        return SinkStatus(
            state=self.state, phase=self.phase, last_error=self.last_error,
            position={f"{topic}/{partition}": offset
                      for (topic, partition), offset in sorted(self.committed.items())},
            records=self.records_committed, batches=self.batches_committed,
            consecutive_failures=self.consecutive_failures, abandoned=self.abandoned)

    def _assert_current(self, batch_id: int, phase: SinkPhase) -> None:
        assert self.phase is phase, (self.phase, phase)
        assert self.batch is not None and self.batch.batch_id == batch_id

    # --- the steps ----------------------------------------------------------------------------
    def _on_polled(self, event: Polled) -> list[Instruction]:
        if not event.records:
            return [Poll()]
        self.batch = _Batch(self.next_batch_id, event.records)
        self.next_batch_id += 1
        self.phase = SinkPhase.WRITING
        return [Write(self.batch.batch_id, self.batch.records)]

    def _on_written(self) -> list[Instruction]:
        batch = self.batch
        assert batch is not None
        batch.written = True
        offsets = next_offsets(batch.records)
        for tp, offset in offsets:
            self.written[tp] = max(self.written.get(tp, 0), offset)
        self.phase = SinkPhase.COMMITTING
        return [Commit(batch.batch_id, offsets)]

    def _on_committed(self) -> list[Instruction]:
        batch = self.batch
        assert batch is not None and batch.written
        for tp, offset in next_offsets(batch.records):
            self.committed[tp] = offset
        self.records_committed += len(batch.records)
        self.batches_committed += 1
        self.consecutive_failures = 0
        self.state = Status.RUNNING
        self.last_error = None
        return self._next_batch()

    def _on_commit_failed(self, event: CommitFailed) -> list[Instruction]:
        if event.reassigned:
            # The new owner reads from the last commit: the batch will be written again.
            self._count_failure(f"commit failed (partitions reassigned): {event.error}")
            self.abandoned += 1
            return self._next_batch()
        if not event.retriable:
            return self._halt_error(f"commit failed: {event.error}")
        return self._retry_later(f"commit failed: {event.error}", event.now_ms)

    def _next_batch(self) -> list[Instruction]:
        self.batch = None
        if self.stopping:
            return self._halt(Status.STOPPED)
        self.phase = SinkPhase.POLLING
        return [Poll()]

    # --- failures, stopping -------------------------------------------------------------------
    def _count_failure(self, error: str) -> None:
        self.last_error = error
        self.consecutive_failures += 1
        if self.consecutive_failures >= commit_failure_threshold:
            self.state = Status.DEGRADED

    def _retry_later(self, error: str, now_ms: int) -> list[Instruction]:
        self._count_failure(error)
        if self.stopping:
            return self._halt(Status.STOPPED)
        delay_ms = backoff_delay_ms(self.consecutive_failures, self.jitter())
        self._resume_phase = self.phase  # WRITING or COMMITTING
        self.phase = SinkPhase.BACKING_OFF
        return [WakeAt(now_ms + delay_ms)]

    def _on_timer(self) -> list[Instruction]:
        batch = self.batch
        assert batch is not None
        self.phase = self._resume_phase
        if self.phase is SinkPhase.COMMITTING:
            return [Commit(batch.batch_id, next_offsets(batch.records))]
        return [Write(batch.batch_id, batch.records)]

    def _on_stop(self) -> list[Instruction]:
        self.stopping = True
        if self.phase in (SinkPhase.WRITING, SinkPhase.COMMITTING):
            return []  # the batch in flight finishes first
        return self._halt(Status.STOPPED)

    def _halt_error(self, error: str) -> list[Instruction]:
        self.last_error = error
        return self._halt(Status.ERROR)

    def _halt(self, status: Status) -> list[Instruction]:
        self.state = status
        self.phase = SinkPhase.DONE
        return [Halt(status)]

    # --- invariants ---------------------------------------------------------------------------
    def check_invariants(self) -> None:
        batch = self.batch
        if self.phase is SinkPhase.POLLING:
            assert batch is None
        if self.phase is SinkPhase.WRITING:
            assert batch is not None and not batch.written and batch.records
        if self.phase is SinkPhase.COMMITTING:
            assert batch is not None and batch.written
        for tp, offset in self.committed.items():  # never commit what the sink has not got
            assert offset <= self.written.get(tp, 0), (tp, offset, self.written)
        if self.state in (Status.RUNNING, Status.DEGRADED):
            assert (self.state is Status.DEGRADED) == (
                self.consecutive_failures >= commit_failure_threshold)
            assert self.phase is not SinkPhase.DONE
        else:
            assert self.phase is SinkPhase.DONE
