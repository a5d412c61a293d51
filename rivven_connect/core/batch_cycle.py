"""``BatchCycle``: one source's poll → transform → route → admit → produce → side-effect loop,
as a sans-I/O state machine (``handle(event) -> list[Instruction]``).

Theory of operation
-------------------
The driver owns the source, the transactional producer and a timer; it executes the
instructions it is given, in order, and reports what happened as one event. One batch is in
flight at a time (the phase says where it is):

``POLLING``
    ``Poll`` was issued. ``PollCompleted(records)``: records at or below the committed
    position (``position_key`` orders the source's positions) are replays after a restart
    and are dropped. A ``position_only`` record (a heartbeat) counts as a record for this
    and for the batch's last position, but is never transformed, routed or sent: a batch
    of heartbeats only is a transaction with just the offset record, and its side effect
    runs after that commit like any other. Nothing new: if the poll returned only replays, their side effect is run
    again at the committed position (a crash between commit and side effect left it undone);
    if it returned nothing, ``Poll`` again.
``GATHERING`` (only with ``gather``: ``sources.NAME.transaction`` ``boundary: interval``,
    and a source that has ``poll_ready``)
    One transaction may carry several polls. After the first poll with fresh records the
    cycle asks for what the source has ready now (``Poll(ready_only=True)``: the source's
    ``poll_ready``, which never waits) and adds it to the batch, until a ready poll brings
    nothing fresh, the batch holds ``gather.records_max`` records, or ``gather.interval_ms`` have
    passed since the first poll; then ``PRODUCING`` as for one poll. The batch's last
    position is the last gathered one, so this needs positions whose side effect covers
    every earlier position (a source with ``poll_ready`` promises it). What it buys: the
    per-transaction costs (the transaction's rounds, and per partition a batch, a marker and
    their fsyncs) are paid once per gathered batch, not once per poll; a source that has
    nothing more ready commits at once, so a quiet source's latency is what it was.
    ``StopRequested`` while gathering ends the gathering: the batch so far commits, then
    the cycle halts ``stopped``.
``PRODUCING``
    Each record is routed at the source, transformed (the injected chain; an exception goes
    to the DLQ under ``errors.tolerance: all``, else the source stops in ``error``) and
    dispatched (``routing.Router``: admission, ``on_missing_destination``,
    ``on_admission_failure``). If nothing stops the batch the instructions are
    ``BeginTransaction``, a ``Send`` per record sent or dead-lettered, a ``Send`` of the
    source-offset record (key: the source's name, value: the batch's last position) to
    ``__connect_offsets``, and ``CommitTransaction`` — one list, so the offset record is in
    the batch's own transaction by construction. The driver answers
    ``TransactionCommitted`` or ``TransactionFailed`` (which may name per-topic outcomes for
    the breakers).
``SIDE_EFFECT``
    After, and only after, ``TransactionCommitted``: ``RunSideEffect(position)`` (the slot
    advance, the deferred ``DELETE``). ``SideEffectCompleted`` → the next ``Poll``. A cycle
    started with a stored position begins here, with the side effect of that position.
``BACKING_OFF``
    A retriable failure (the transaction, a side effect, a routing error for an open
    breaker): ``AbortTransaction`` if one was begun, then ``WakeAt`` a backoff of
    ``backoff_base_ms`` · 2^(failures-1), capped at ``backoff_max_ms`` (30 s), of which the
    upper half is jitter from the injected ``jitter()`` in [0, 1). ``TimerFired`` retries the
    same polled batch from routing (or the same side effect). ``commit_failure_threshold``
    (16) failures in a row make the status ``degraded`` (retrying, not progressing); one
    success makes it ``running`` again. A non-retriable error makes it ``error`` (``Halt``).
``AbandonRequested`` (``POST /connectors/NAME/abandon-batch``, the one way to skip data):
    accepted only while the cycle is ``degraded`` and backing off before another attempt of
    a batch (``abandon_refusal()`` says why not otherwise: a failing side effect is never
    skipped, a halted cycle has no batch). The batch is marked abandoned for good: this and
    every later attempt commits a transaction holding only the offset record of its last
    position (no data), then runs that position's side effect as usual (the slot advance),
    so the records are skipped exactly once and never replayed. ``abandoned_batches``,
    ``abandoned_records`` and ``last_abandon_at_ms`` count it; a batch counts in
    ``batches``, its records in neither ``records`` nor ``dropped``.
Blocks (``EncodedRecords``, the encoded path: only when ``routing.encoded_path_allowed``,
asserted): a polled item may stand for many records of one table. The replay filter keeps
or drops it whole (it never straddles the committed position: a source's blocks end where
it may commit); in ``PRODUCING`` it skips the transform chain (there is none) and is
dispatched once — every count (sent, dropped, routed, rejected) counts its records — and
its ``Send`` carries the whole block.
``DONE``
    ``Halt`` was issued (``stopped`` or ``error``); later events are ignored.

``StopRequested`` (SIGTERM): with a transaction or a side effect in flight the cycle lets it
finish (a committed batch still gets its side effect), then halts ``stopped``; while polling
or backing off it halts at once. Nothing uncommitted is lost: the source replays it after a
restart, because its side effect never ran.

Exactly-once, as this core enforces it: records and the offset record commit atomically; the
side effect runs only for committed positions; a restart filters what the offsets topic says
was committed. So a record reaches ``read_committed`` readers once, whatever crashes between
the steps (docs/connect.md).
"""

from __future__ import annotations

import enum
from typing import Any, Callable, Iterable, Union

import attrs

from rivven_connect.core.admission import SendOutcome
from rivven_connect.core.config import OFFSETS_TOPIC, TransactionInterval
from rivven_connect.core.records import Destination, EncodedRecords, Record
from rivven_connect.core.routing import Action, Router, encoded_path_allowed

__all__ = [
    "AbandonRequested",
    "AbortTransaction",
    "BatchCycle",
    "BeginTransaction",
    "CommitTransaction",
    "CycleStatus",
    "Event",
    "Halt",
    "Instruction",
    "Phase",
    "Poll",
    "PollCompleted",
    "RunSideEffect",
    "Send",
    "SideEffectCompleted",
    "SideEffectFailed",
    "Status",
    "StopRequested",
    "TimerFired",
    "TransactionCommitted",
    "TransactionFailed",
    "WakeAt",
    "backoff_base_ms",
    "backoff_delay_ms",
    "backoff_max_ms",
    "batch_records_max",
    "commit_failure_threshold",
]

#: Failed attempts in a row after which the status is ``degraded``.
commit_failure_threshold = 16
backoff_base_ms = 100
backoff_max_ms = 30_000
#: The most records one poll may deliver (the source's batch size must stay below).
batch_records_max = 100_000


def _count(records: Iterable[Record | EncodedRecords]) -> int:
    """Records in ``records`` (a block counts its records)."""
    return sum(record.record_count for record in records)


def backoff_delay_ms(failures: int, jitter: float) -> int:
    """The wait after ``failures`` failures in a row: ``backoff_base_ms`` · 2^(failures-1),
    capped at ``backoff_max_ms``, its upper half scaled by ``jitter`` in [0, 1) (the source
    and sink cycles share it)."""
    assert failures >= 1 and 0.0 <= jitter < 1.0, (failures, jitter)
    ceiling_ms = min(backoff_max_ms, backoff_base_ms << min(failures - 1, 20))
    delay_ms = ceiling_ms // 2 + int(jitter * (ceiling_ms - ceiling_ms // 2))
    assert 0 < delay_ms <= backoff_max_ms
    return delay_ms


class Status(enum.Enum):
    RUNNING = "running"
    DEGRADED = "degraded"
    ERROR = "error"
    STOPPED = "stopped"


class Phase(enum.Enum):
    NEW = "new"
    POLLING = "polling"
    GATHERING = "gathering"
    PRODUCING = "producing"
    SIDE_EFFECT = "side_effect"
    BACKING_OFF = "backing_off"
    DONE = "done"


# --- events (driver -> core) ------------------------------------------------------------------


@attrs.frozen
class PollCompleted:
    records: tuple[Record | EncodedRecords, ...]
    now_ms: int


@attrs.frozen
class TransactionCommitted:
    batch_id: int
    now_ms: int


@attrs.frozen
class TransactionFailed:
    batch_id: int
    error: str
    retriable: bool
    now_ms: int
    #: Per-topic outcomes the driver could attribute (else the topic gets no verdict).
    topic_outcomes: tuple[tuple[str, SendOutcome], ...] = ()


@attrs.frozen
class SideEffectCompleted:
    batch_id: int
    now_ms: int


@attrs.frozen
class SideEffectFailed:
    batch_id: int
    error: str
    now_ms: int


@attrs.frozen
class TimerFired:
    now_ms: int


@attrs.frozen
class StopRequested:
    now_ms: int


@attrs.frozen
class AbandonRequested:
    """Skip the batch being retried (only when ``abandon_refusal()`` is None)."""

    now_ms: int


Event = Union[PollCompleted, TransactionCommitted, TransactionFailed, SideEffectCompleted,
              SideEffectFailed, TimerFired, StopRequested, AbandonRequested]


# --- instructions (core -> driver) ------------------------------------------------------------


@attrs.frozen
class Poll:
    """Ask the source for the next records: at most ``records_max`` (None: the driver's
    bound); it may wait for some unless ``ready_only`` (then ``poll_ready``: what it has
    now, maybe nothing)."""

    ready_only: bool = False
    records_max: int | None = None


@attrs.frozen
class BeginTransaction:
    batch_id: int


@attrs.frozen
class Send:
    batch_id: int
    record: Record | EncodedRecords


@attrs.frozen
class CommitTransaction:
    batch_id: int


@attrs.frozen
class AbortTransaction:
    batch_id: int


@attrs.frozen
class RunSideEffect:
    """The source's post-commit step for everything up to ``position`` (committed)."""

    batch_id: int
    position: Any


@attrs.frozen
class WakeAt:
    at_ms: int


@attrs.frozen
class Halt:
    status: Status


Instruction = Union[Poll, BeginTransaction, Send, CommitTransaction, AbortTransaction,
                    RunSideEffect, WakeAt, Halt]


@attrs.frozen
class CycleStatus:
    """The status snapshot (``GET /connectors/NAME/status``)."""

    state: Status
    phase: Phase
    last_error: str | None
    position: Any
    records: int
    batches: int
    consecutive_failures: int
    dropped: int
    dead_lettered: int
    abandoned_batches: int = 0
    abandoned_records: int = 0
    last_abandon_at_ms: int | None = None


@attrs.define
class _Batch:
    batch_id: int
    records: list[Record | EncodedRecords]  # as polled (one or more polls), replays removed
    last_position: Any
    #: When its first poll completed (``GATHERING`` ends ``gather.interval_ms`` later).
    first_polled_ms: int = 0
    #: The records of ``records``, counted as they were polled (a gathering asks for what
    #: is left under ``gather.records_max`` after every ready poll: no recount per poll).
    polled_records: int = 0
    transaction_open: bool = False
    #: Records sent per admitted topic in the current attempt.
    topics: dict[str, int] = attrs.Factory(dict)
    sent: int = 0
    dropped: int = 0
    dead_lettered: int = 0
    #: Skipped by ``AbandonRequested``: every attempt commits only its offset record.
    abandoned: bool = False


class BatchCycle:
    """The batch cycle of one source (see the module docstring). Pure; never blocks."""

    def __init__(
        self,
        router: Router,
        transform: Callable[[Record], Record | None],
        jitter: Callable[[], float],
        *,
        stored_position: Any = None,
        position_key: Callable[[Any], Any] = lambda position: position,
        offsets_topic: str = OFFSETS_TOPIC,
        gather: TransactionInterval | None = None,
    ) -> None:
        assert gather is None or 0 < gather.records_max <= batch_records_max, gather
        self.router = router
        #: Several polls per transaction (``GATHERING``), or one (None).
        self.gather = gather
        self.source = router.source
        #: Whether polled ``EncodedRecords`` are allowed (the source was told so).
        self.encoded_allowed = encoded_path_allowed(router.source)
        self.transform = transform
        self.jitter = jitter
        self.position_key = position_key
        self.offsets_topic = offsets_topic
        #: The last position committed with a batch (or read from the offsets topic).
        self.committed_position = stored_position
        self.phase = Phase.NEW
        self.state = Status.RUNNING
        self.last_error: str | None = None
        self.consecutive_failures = 0
        self.stopping = False
        self.batch: _Batch | None = None
        self.next_batch_id = 1
        self.records_committed = 0
        self.batches_committed = 0
        self.dropped = 0
        self.dead_lettered = 0
        self.abandoned_batches = 0
        self.abandoned_records = 0
        self.last_abandon_at_ms: int | None = None
        #: Where ``TimerFired`` resumes: a batch attempt (PRODUCING) or its side effect.
        self._resume_phase = Phase.PRODUCING

    # --- the entry points ---------------------------------------------------------------------
    def start(self) -> list[Instruction]:
        """The first instructions: ``Poll``, or first the side effect of the stored position
        (a crash between a commit and its side effect left it undone, and a source resuming
        just after the stored position replays nothing that would redo it)."""
        assert self.phase is Phase.NEW
        if self.committed_position is not None:
            batch_id = self.next_batch_id
            self.next_batch_id += 1
            self.batch = _Batch(batch_id, [], self.committed_position)
            self.phase = Phase.SIDE_EFFECT
            return [RunSideEffect(batch_id, self.committed_position)]
        self.phase = Phase.POLLING
        return [Poll()]

    def handle(self, event: Event) -> list[Instruction]:
        """The instructions that follow ``event``. Asserts the event fits the phase."""
        if self.phase is Phase.DONE:
            return []
        if isinstance(event, StopRequested):
            out = self._on_stop()
        elif isinstance(event, PollCompleted):
            assert self.phase in (Phase.POLLING, Phase.GATHERING), self.phase
            out = (self._on_gathered(event) if self.phase is Phase.GATHERING
                   else self._on_polled(event))
        elif isinstance(event, TransactionCommitted):
            self._assert_current(event.batch_id, Phase.PRODUCING)
            out = self._on_committed(event)
        elif isinstance(event, TransactionFailed):
            self._assert_current(event.batch_id, Phase.PRODUCING)
            out = self._on_transaction_failed(event)
        elif isinstance(event, SideEffectCompleted):
            self._assert_current(event.batch_id, Phase.SIDE_EFFECT)
            out = self._after_side_effect()
        elif isinstance(event, SideEffectFailed):
            self._assert_current(event.batch_id, Phase.SIDE_EFFECT)
            out = self._retry_later(f"side effect failed: {event.error}", event.now_ms)
        elif isinstance(event, AbandonRequested):
            assert self.abandon_refusal() is None, self.abandon_refusal()
            assert self.batch is not None
            self.batch.abandoned = True
            out = self._produce(event.now_ms)
        else:
            assert isinstance(event, TimerFired) and self.phase is Phase.BACKING_OFF
            out = self._on_timer(event.now_ms)
        self.check_invariants()
        return out

    def status(self) -> CycleStatus:
        return CycleStatus(
            state=self.state, phase=self.phase, last_error=self.last_error,
            position=self.committed_position, records=self.records_committed,
            batches=self.batches_committed, consecutive_failures=self.consecutive_failures,
            dropped=self.dropped, dead_lettered=self.dead_lettered,
            abandoned_batches=self.abandoned_batches, abandoned_records=self.abandoned_records,
            last_abandon_at_ms=self.last_abandon_at_ms)

    def abandon_refusal(self) -> str | None:
        """Why ``AbandonRequested`` is not accepted now; None when it is."""
        if self.phase is not Phase.BACKING_OFF or self._resume_phase is not Phase.PRODUCING:
            return (f"no batch to abandon: the cycle is {self.state.value} and "
                    f"{self.phase.value}" + (" (retrying a side effect, which is never "
                                             "skipped)" if self.phase is Phase.BACKING_OFF
                                             else ""))
        if self.state is not Status.DEGRADED:
            return (f"the batch has failed {self.consecutive_failures} time(s); abandon-batch "
                    f"is for a degraded source ({commit_failure_threshold} failures in a row)")
        return None

    def _assert_current(self, batch_id: int, phase: Phase) -> None:
        assert self.phase is phase, (self.phase, phase)
        assert self.batch is not None and self.batch.batch_id == batch_id

    # --- polling ------------------------------------------------------------------------------
    def _on_polled(self, event: PollCompleted) -> list[Instruction]:
        if not event.records:
            return [Poll()]
        fresh = self._fresh(event.records)
        batch_id = self.next_batch_id
        self.next_batch_id += 1
        if not fresh:  # only replays: redo the side effect of what is committed
            self.batch = _Batch(batch_id, [], self.committed_position)
            self.phase = Phase.SIDE_EFFECT
            return [RunSideEffect(batch_id, self.committed_position)]
        self.batch = _Batch(batch_id, list(fresh), fresh[-1].position,
                            first_polled_ms=event.now_ms, polled_records=_count(fresh))
        return self._gather_or_produce(event.now_ms)

    def _on_gathered(self, event: PollCompleted) -> list[Instruction]:
        """A ready poll's records join the batch; nothing fresh ends the gathering."""
        batch = self.batch
        assert batch is not None and self.gather is not None
        fresh = self._fresh(event.records) if event.records else ()
        if not fresh:
            return self._produce(event.now_ms)
        assert self.position_key(fresh[0].position) > self.position_key(
            batch.last_position), "a ready poll goes back before the gathered records"
        batch.records.extend(fresh)
        batch.last_position = fresh[-1].position
        batch.polled_records += _count(fresh)
        return self._gather_or_produce(event.now_ms)

    def _gather_or_produce(self, now_ms: int) -> list[Instruction]:
        """Ask for what is ready, or produce the batch once the gathering is over."""
        batch = self.batch
        assert batch is not None
        gather = self.gather
        if gather is None or self.stopping:
            return self._produce(now_ms)
        gathered = batch.polled_records
        if (gathered >= gather.records_max  # (a first poll may bring more)
                or now_ms - batch.first_polled_ms >= gather.interval_ms):
            return self._produce(now_ms)
        self.phase = Phase.GATHERING
        return [Poll(ready_only=True, records_max=gather.records_max - gathered)]

    def _fresh(self, polled: tuple[Record | EncodedRecords, ...]
               ) -> tuple[Record | EncodedRecords, ...]:
        """``polled`` without the replays (at or below the committed position)."""
        assert _count(polled) <= batch_records_max
        keys = [self.position_key(record.position) for record in polled]
        assert all(record.position is not None for record in polled)
        assert all(a <= b for a, b in zip(keys, keys[1:])), "positions go backwards"
        committed = (None if self.committed_position is None
                     else self.position_key(self.committed_position))
        fresh = tuple(record for record, key in zip(polled, keys)
                      if committed is None or key > committed)
        for record in fresh:
            if isinstance(record, EncodedRecords):  # kept whole: none of it is a replay
                assert self.encoded_allowed, "a block polled with per-record routing on"
                assert committed is None or self.position_key(
                    record.first_position) > committed, "a block straddles the committed position"
        return fresh

    # --- producing ----------------------------------------------------------------------------
    def _produce(self, now_ms: int) -> list[Instruction]:
        batch = self.batch
        assert batch is not None and not batch.transaction_open
        assert batch.polled_records == _count(batch.records), "a miscounted gathering"
        batch.topics, batch.sent, batch.dropped, batch.dead_lettered = {}, 0, 0, 0
        self.phase = Phase.PRODUCING
        if batch.abandoned:  # its records are skipped: commit the position alone
            batch.transaction_open = True
            return [BeginTransaction(batch.batch_id),
                    Send(batch.batch_id, self._offset_record(batch.last_position)),
                    CommitTransaction(batch.batch_id)]
        sends: list[Instruction] = []
        for polled in batch.records:
            if polled.position_only:
                continue  # a heartbeat: only its position is committed (the offset record)
            if isinstance(polled, EncodedRecords):  # no transforms: dispatched as it is
                record: Record | EncodedRecords | None = polled
            else:
                record, dead_letter, problem = self._transformed(polled)
                if problem is not None:
                    self._release_topics(now_ms)
                    return self._halt_error(problem)
                if dead_letter is not None:  # the transform failed: straight to the DLQ
                    batch.dead_lettered += 1
                    sends.append(Send(batch.batch_id, dead_letter))
                    continue
                if record is None:  # filtered out by the chain
                    batch.dropped += 1
                    continue
            stopped = self._dispatch(record, sends, now_ms)
            if stopped is not None:
                return stopped
        batch.transaction_open = True
        return [BeginTransaction(batch.batch_id), *sends,
                Send(batch.batch_id, self._offset_record(batch.last_position)),
                CommitTransaction(batch.batch_id)]

    def _dispatch(self, record: Record | EncodedRecords, sends: list[Instruction],
                  now_ms: int) -> list[Instruction] | None:
        """Route ``record`` (or a block: its records alike) into ``sends`` and the batch's
        counts; the instructions that end the attempt if the verdict stops it."""
        batch = self.batch
        assert batch is not None
        verdict = self.router.dispatch(record, batch.batch_id, now_ms)
        if verdict.action is Action.ERROR:
            assert verdict.error is not None
            self._release_topics(now_ms)
            if verdict.retriable:
                return self._retry_later(verdict.error, now_ms)
            return self._halt_error(verdict.error)
        count = record.record_count
        if verdict.action is Action.DROP:
            batch.dropped += count
            return None
        assert verdict.record is not None and verdict.record.destination is not None
        if verdict.action is Action.SEND:
            topic = verdict.record.destination.topic
            batch.topics[topic] = batch.topics.get(topic, 0) + count
            batch.sent += count
        else:
            batch.dead_lettered += count
        sends.append(Send(batch.batch_id, verdict.record))
        return None

    def _transformed(self, polled: Record) -> tuple[Record | None, Record | None, str | None]:
        """(the record after source routing and the transform chain — None if the chain
        filtered it —, its dead letter if a transform failed under ``errors.tolerance: all``,
        the problem that stops the source if one failed otherwise)."""
        record = self.router.route_at_source(polled)
        try:
            return self.transform(record), None, None
        except Exception as error:  # a transform's failure is data: dead-lettered or fatal
            message = f"{type(error).__name__}: {error}"
            if self.source.errors_tolerance != "all":
                return None, None, f"transform failed at position {polled.position!r}: {message}"
            dead = self.router.dead_letter(
                record, stage="transform", reason="transform_error", error=message,
                original_topic=None if record.destination is None else record.destination.topic)
            return None, dead, None

    def _offset_record(self, position: Any) -> Record:
        name = self.source.name
        return Record(value={"connector": name, "position": position}, key=name,
                      destination=Destination(self.offsets_topic, key=name.encode()),
                      position=position)

    def _on_committed(self, event: TransactionCommitted) -> list[Instruction]:
        batch = self.batch
        assert batch is not None and batch.transaction_open
        batch.transaction_open = False
        self.committed_position = batch.last_position
        self.records_committed += batch.sent
        self.batches_committed += 1
        self.dropped += batch.dropped
        self.dead_lettered += batch.dead_lettered
        if batch.abandoned:
            self.abandoned_batches += 1
            self.abandoned_records += _count(batch.records)
            self.last_abandon_at_ms = event.now_ms
        for topic, count in batch.topics.items():
            self.router.admission.record_outcome(topic, SendOutcome.DELIVERED, event.now_ms,
                                                 records=count)
        self.consecutive_failures = 0
        self.state = Status.RUNNING
        self.last_error = None
        self.phase = Phase.SIDE_EFFECT
        return [RunSideEffect(batch.batch_id, batch.last_position)]

    def _on_transaction_failed(self, event: TransactionFailed) -> list[Instruction]:
        batch = self.batch
        assert batch is not None and batch.transaction_open
        batch.transaction_open = False
        attributed = dict(event.topic_outcomes)
        for topic in batch.topics:
            outcome = attributed.get(topic, SendOutcome.NO_VERDICT)
            assert outcome is not SendOutcome.DELIVERED
            self.router.admission.record_outcome(topic, outcome, event.now_ms, error=event.error)
        abort: list[Instruction] = [AbortTransaction(batch.batch_id)]
        if not event.retriable:
            return abort + self._halt_error(f"transaction failed: {event.error}")
        return abort + self._retry_later(f"transaction failed: {event.error}", event.now_ms)

    def _release_topics(self, now_ms: int) -> None:
        """The attempt stopped before its transaction: no topic gets a verdict."""
        batch = self.batch
        assert batch is not None
        for topic in batch.topics:
            self.router.admission.record_outcome(topic, SendOutcome.NO_VERDICT, now_ms)
        batch.topics = {}

    # --- after the commit ---------------------------------------------------------------------
    def _after_side_effect(self) -> list[Instruction]:
        self.batch = None
        if self.stopping:
            return self._halt(Status.STOPPED)
        self.phase = Phase.POLLING
        return [Poll()]

    # --- failures, stopping -------------------------------------------------------------------
    def _retry_later(self, error: str, now_ms: int) -> list[Instruction]:
        self.last_error = error
        self.consecutive_failures += 1
        if self.consecutive_failures >= commit_failure_threshold:
            self.state = Status.DEGRADED
        if self.stopping:
            return self._halt(Status.STOPPED)
        delay_ms = backoff_delay_ms(self.consecutive_failures, self.jitter())
        self._resume_phase = self.phase  # PRODUCING (a batch attempt) or SIDE_EFFECT
        self.phase = Phase.BACKING_OFF
        return [WakeAt(now_ms + delay_ms)]

    def _on_timer(self, now_ms: int) -> list[Instruction]:
        batch = self.batch
        assert batch is not None
        if self._resume_phase is Phase.SIDE_EFFECT:
            self.phase = Phase.SIDE_EFFECT
            return [RunSideEffect(batch.batch_id, self.committed_position)]
        return self._produce(now_ms)

    def _on_stop(self) -> list[Instruction]:
        self.stopping = True
        if self.phase in (Phase.GATHERING, Phase.PRODUCING, Phase.SIDE_EFFECT):
            return []  # the batch in flight finishes first (a gathered one: as it stands)
        return self._halt(Status.STOPPED)

    def _halt_error(self, error: str) -> list[Instruction]:
        self.last_error = error
        return self._halt(Status.ERROR)

    def _halt(self, status: Status) -> list[Instruction]:
        self.state = status
        self.phase = Phase.DONE
        return [Halt(status)]

    # --- invariants ---------------------------------------------------------------------------
    def check_invariants(self) -> None:
        batch = self.batch
        if self.phase is Phase.POLLING:
            assert batch is None
        if self.phase is Phase.GATHERING:
            assert self.gather is not None
            assert batch is not None and not batch.transaction_open and batch.records
            assert batch.polled_records < self.gather.records_max
        if self.phase is Phase.PRODUCING:
            assert batch is not None and batch.transaction_open and batch.records
        if batch is not None and batch.transaction_open:
            assert self.phase is Phase.PRODUCING
        if self.phase is Phase.SIDE_EFFECT:
            assert batch is not None and batch.last_position == self.committed_position
        if self.state in (Status.RUNNING, Status.DEGRADED):
            assert (self.state is Status.DEGRADED) == (
                self.consecutive_failures >= commit_failure_threshold)
            assert self.phase is not Phase.DONE
        else:
            assert self.phase is Phase.DONE
        self.router.admission.check_invariants()
