"""The trio driver of the connector runtime: one task per source runs its ``BatchCycle``.

Theory of operation
-------------------
``run_connect(config, bootstrap, stop)`` first makes sure ``__connect_offsets`` exists
(compacted, one partition; ``open_admin``), then starts one ``SourceRunner`` per source in a
nursery and returns their final statuses when all have halted.

A ``SourceRunner`` holds no protocol state of its own — the cycle has it. It

1. opens a transactional producer (``transactional_id = connect-NAME``, ``acks=all``,
   idempotent) and calls ``init_transactions``: this fences any older runtime of the same
   source and aborts its open transaction, so what follows reads a settled offsets topic;
2. reads the committed position: the offsets topic ``read_committed`` from the beginning to
   its end, the last record keyed by the source's name (``{"connector", "position"}``);
3. resumes the source there and builds ``BatchCycle(router, chain, jitter,
   stored_position=...)``;
4. executes the cycle's instructions in order and feeds back one event per list:
   ``Poll`` → ``PollCompleted``; ``BeginTransaction``, ``Send``…, ``CommitTransaction`` →
   ``TransactionCommitted`` or ``TransactionFailed`` (the first client error stops the rest
   of the list); ``RunSideEffect`` → ``SideEffectCompleted`` / ``SideEffectFailed``;
   ``AbortTransaction`` (then ``WakeAt``) → ``TimerFired`` via ``trio.sleep_until``;
   ``Halt`` ends the task. The clock is trio's (``now_ms`` from ``trio.current_time``).

The overlap: while ``commit_transaction`` waits for the broker, a source that has
``prepare_poll`` reads and builds its next poll's records (``_commit_preparing_next``: the
commit is sent first and both end before the cycle hears of the commit, so the side effect
never runs beside a preparation, and nothing prepared is sent before the cycle's ``Poll``:
one transaction in flight per source, as before; docs/connect.md "Preparing the next
poll").

``stop`` (SIGTERM/SIGINT in the CLI) becomes one ``StopRequested``. A poll or a backoff wait
in progress is cancelled for it (the cycle halts at once; the uncommitted batch is replayed
after a restart); a transaction or side effect in flight finishes first, then the cycle
halts ``stopped``.

A batch's records are queued back to back (``send_nowait``; ``enqueue`` only when the
producer must wait for metadata or buffer space; a checkpoint every
``enqueue_checkpoint_records``): the producer's sender then sees all of the batch's partitions
at once and adds them to the transaction in one AddPartitionsToTxn (a next one only to retry
CONCURRENT_TRANSACTIONS), and steps once, not once per record (with 50 destinations: about one
AddPartitionsToTxn round per transaction and ~10 us of runtime CPU per record less).

Admission is fed by the broker: each runner creates the allowlist's literal topics (and the
DLQ) at start and every new destination inside the batch's transaction, before its first
send, with ``routing.topic_defaults`` (``_ensure_topics``), and hands partition counts
(``describe_topic``, then the producer's metadata) to ``Admission.set_partition_count``. A
failed transaction is reported with per-topic outcomes (``_outcome_of``: permanent,
transient, or no verdict) for the breakers. ``run_connect(http=...)`` serves the HTTP API
(``http_api``/``http_server``) from snapshots of the runners.

``POST /connectors/NAME/abandon-batch`` calls ``SourceRunner.request_abandon``: refused
(the reason is answered) unless the cycle accepts it now (``BatchCycle.abandon_refusal``);
else the request is noted for the batch being retried and wakes the backoff sleep, which
hands the cycle ``AbandonRequested`` instead of ``TimerFired`` — only if the same batch
still waits (a request that lost the race to the timer is dropped, and logged). Accepting
and carrying it out are logged at WARNING (logger ``rivven_connect.driver``).

Failures: the cycle decides what is retriable; the driver only classifies client errors
(a fenced producer or an invalid transaction state is fatal, the rest retriable). A failed
``abort_transaction`` leaves the producer unusable, so the source stops in ``error``.

Test-only: ``crash_points`` hooks (``RIVVEN_CONNECT_CRASH_AT``, off unless set) let the
crash tests SIGKILL the process after the sends, before the commit, or between the commit
and the side effect.
"""

from __future__ import annotations

import json
import logging
import random
from typing import Any, Mapping

import anyio
import attrs
import trio

from rivven_broker.client.errors import (
    ConnectionFailedError,
    ClientTimeoutError,
    InvalidTxnStateError,
    ProducerFencedError,
    RivvenError,
    TopicAlreadyExistsError,
)
from rivven_broker.client.trio import open_admin, open_consumer, open_producer
from rivven_broker.client.types import TopicPartition
from rivven_connect.core import batch_cycle as bc
from rivven_connect.core.admission import Admission, AdmissionMode, SendOutcome
from rivven_connect.core.config import OFFSETS_TOPIC, ConnectConfig, SourceConfig
from rivven_connect.core.records import EncodedRecords, Record, encode_payload
from rivven_connect.core.routing import Router
from rivven_connect.core.transforms import build_chain
from rivven_connect.crash_points import CrashPoints
from rivven_connect.http_api import ConnectorView, respond
from rivven_connect.http_server import serve_http
from rivven_connect.sink_runner import SinkRunner, run_sinks, sink_runners
from rivven_connect.sources import Source, SourceError
from rivven_connect.stopping import find_error, interruptible

__all__ = ["BrokerUnreachable", "HttpUnavailable", "SourceResult", "SourceRunner", "find_error",
           "ensure_offsets_topic", "read_position",
           "run_connect"]

#: Records asked of a source per poll (the source's own ``batch_size`` may be lower).
poll_records_max = 10_000
#: How long reading the offsets topic at start may take.
offsets_read_timeout_ms = 30_000
#: Bounded waits of the client calls the driver makes.
producer_max_block_ms = 30_000
#: The producer's linger: a batch's records are queued back to back and ``commit_transaction``
#: flushes them, so a linger only splits what one request could carry. Long enough to never
#: expire while a batch is queued; a full batch, or a full buffer, is sent at once anyway.
producer_linger_ms = 1_000
admin_connect_attempts_max = 3
#: A transaction's records are queued back to back (``send_nowait``), so the producer's sender
#: runs once they are all queued: one AddPartitionsToTxn for every partition of the batch and
#: one sender step, instead of a round per partition arriving while the last is in flight and
#: a step per record. A checkpoint after this many records bounds the time other tasks wait.
enqueue_checkpoint_records = 1_000

_FATAL_ERRORS = (ProducerFencedError, InvalidTxnStateError)
#: Partitions of a topic created on first admission without ``topic_defaults.partitions``
#: (the broker's own default for auto-created topics).
topic_partitions_default = 3

#: Client error codes that are a destination's own fault: its breaker counts them.
_PERMANENT_CODES = frozenset({
    "MESSAGE_TOO_LARGE", "RECORD_LIST_TOO_LARGE", "INVALID_TOPIC_NAME", "INVALID_CONFIG",
    "INVALID_PARTITIONS", "INVALID_REPLICATION_FACTOR", "POLICY_VIOLATION",
    "TOPIC_AUTHORIZATION_FAILED",
})


def _outcome_of(error: BaseException) -> SendOutcome:
    """What a client error says about the destination it came from: permanent (authorization,
    record too large, invalid topic or topic settings: the breaker counts it), transient
    (connection loss, timeouts, anything retriable: not the topic's fault, not counted), or
    no verdict (the transaction's own state, fencing, the rest)."""
    if isinstance(error, RivvenError) and error.code in _PERMANENT_CODES:
        return SendOutcome.PERMANENT_FAILURE
    if isinstance(error, (ConnectionFailedError, ClientTimeoutError, trio.TooSlowError)) or (
            isinstance(error, RivvenError) and error.retriable):
        return SendOutcome.TRANSIENT_FAILURE
    return SendOutcome.NO_VERDICT


async def _delivery_error(delivery: Any) -> RivvenError | None:
    """The error a completed delivery failed with (None: delivered, or still pending)."""
    if not delivery.done():
        return None
    try:
        await delivery.wait()
    except RivvenError as error:
        return error
    return None


def _start_topics(config: SourceConfig) -> set[str]:
    """Topics created before the first batch: the allowlist's literal entries."""
    admission = config.routing.admission
    if admission.mode is not AdmissionMode.ALLOWLIST:
        return set()
    return {str(pattern) for pattern in admission.patterns if "*" not in pattern.segments}


class BrokerUnreachable(Exception):
    """The broker could not be reached at start (the CLI exits 2)."""


class HttpUnavailable(Exception):
    """The HTTP address could not be bound (the CLI exits 1)."""


_UNREACHABLE = (ConnectionFailedError, ClientTimeoutError, OSError)


_log = logging.getLogger("rivven_connect.driver")


def now_ms() -> int:
    return int(trio.current_time() * 1000)


#: A record key or value as bytes (``records.encode_payload``, shared with the encoded path).
encode = encode_payload


async def ensure_offsets_topic(bootstrap: str) -> None:
    """Create ``__connect_offsets`` (compacted, 1 partition) unless it exists.

    Raises ``BrokerUnreachable`` when no broker answers."""
    try:
        async with open_admin(bootstrap, connect_attempts_max=admin_connect_attempts_max) as admin:
            try:
                await admin.create_topic(OFFSETS_TOPIC, partitions=1, replication_factor=1,
                                         config={"cleanup.policy": "compact"})
            except TopicAlreadyExistsError:
                pass
    except (*_UNREACHABLE, BaseExceptionGroup) as error:
        cause = find_error(error, _UNREACHABLE)
        if cause is None:
            raise
        raise BrokerUnreachable(f"no broker reachable at {bootstrap}: {cause}") from error


async def read_position(bootstrap: str, name: str) -> Any:
    """The last committed position of source ``name`` (``None``: never committed), read
    ``read_committed`` from ``__connect_offsets``. Raises ``trio.TooSlowError`` after
    ``offsets_read_timeout_ms``, client errors as they come."""
    key = name.encode()
    position = None
    with trio.fail_after(offsets_read_timeout_ms / 1000):
        async with open_admin(bootstrap) as admin:
            partitions = (await admin.describe_topic(OFFSETS_TOPIC)).partitions
        async with open_consumer(bootstrap, isolation_level="read_committed",
                                 enable_auto_commit=False,
                                 auto_offset_reset="earliest") as consumer:
            tps = [TopicPartition(OFFSETS_TOPIC, p) for p in range(partitions)]
            consumer.assign(tps)
            ends = await consumer.end_offsets(tps)
            for tp in tps:
                consumer.seek(tp, 0)
            remaining = {tp for tp in tps if ends[tp] > 0}
            while remaining:
                for record in await consumer.poll(timeout_ms=200):
                    if record.key == key and record.value is not None:
                        position = json.loads(record.value)["position"]
                for tp in list(remaining):
                    if await consumer.position(tp) >= ends[tp]:
                        remaining.discard(tp)
    return position


@attrs.define
class SourceRunner:
    """Runs one source's batch cycle (see the module docstring)."""

    config: SourceConfig
    source: Source
    bootstrap: str
    stop: trio.Event
    rng: random.Random = attrs.field(factory=lambda: random.Random(0))
    crash: CrashPoints = attrs.field(factory=CrashPoints.from_environ)  # test-only
    cycle: bc.BatchCycle | None = None
    admission: Admission | None = None
    #: Topics known to exist (created or found), their partition counts fed to admission.
    ensured: set[str] = attrs.Factory(set)
    _stop_told: bool = False
    #: An accepted abandon-batch request: set, with the batch id it was accepted for.
    _abandon: trio.Event = attrs.Factory(trio.Event)
    _abandon_batch_id: int | None = None

    def request_abandon(self) -> str | None:
        """Ask that the batch being retried be skipped (``BatchCycle`` "AbandonRequested");
        why not (None: accepted). Never blocks."""
        cycle = self.cycle
        if cycle is None:
            return "no batch to abandon: the source is starting"
        refusal = cycle.abandon_refusal()
        if refusal is not None:
            return refusal
        assert cycle.batch is not None
        self._abandon_batch_id = cycle.batch.batch_id
        self._abandon.set()
        records = cycle.batch.records
        first = records[0]
        _log.warning("%s: abandon-batch accepted: %d records from position %r to %r will be "
                     "skipped (the last error: %s)", self.config.name,
                     sum(record.record_count for record in records),
                     getattr(first, "first_position", first.position), records[-1].position,
                     cycle.last_error)
        return None

    async def run(self) -> bc.CycleStatus:
        """Run until the cycle halts; returns its final status. Raises what the client
        raises while starting (before the first poll)."""
        async with open_producer(self.bootstrap, transactional_id=self.config.transactional_id,
                                 acks="all", idempotent=True, linger_ms=producer_linger_ms,
                                 max_block_ms=producer_max_block_ms) as producer, \
                open_admin(self.bootstrap) as admin:
            await producer.init_transactions()
            stored = await read_position(self.bootstrap, self.config.name)
            self.source.resume(stored)
            routing = self.config.routing
            self.admission = Admission(routing.admission)
            router = Router(self.config, self.admission)
            chain = build_chain(list(self.config.transforms),
                                path=f"sources.{self.config.name}.transforms")
            problems = await self._ensure_topics(admin, _start_topics(self.config))
            if routing.dlq_topic is not None:  # dead letters are never compacted away
                problems.update(await self._ensure_topics(admin, {routing.dlq_topic},
                                                          configs=False))
            if problems:  # the configuration names a topic the broker refuses
                topic, error = next(iter(problems.items()))
                raise _SourceStopped(f"cannot create topic {topic!r}: {error}")
            assert self.config.transaction is None or hasattr(self.source, "poll_ready"), (
                "build_source refuses boundary: interval for a source without poll_ready")
            self.cycle = bc.BatchCycle(router, chain.apply, self.rng.random,
                                       stored_position=stored,
                                       position_key=self.source.position_key,
                                       gather=self.config.transaction)
            use_encoded = getattr(self.source, "use_encoded_records", None)
            if use_encoded is not None and self.cycle.encoded_allowed:
                use_encoded()  # nothing per-record configured: blocks may come
            try:
                await self._drive(producer, admin)
            finally:
                self.source.close()
            return self.cycle.status()

    async def _ensure_topics(self, admin: Any, topics: Any, *, configs: bool = True
                             ) -> dict[str, RivvenError]:
        """Create each of ``topics`` not ensured yet with ``routing.topic_defaults`` (its
        ``configs`` only if ``configs``), or find it, and feed its partition count to
        admission. Returns the topics the broker refused to create, with the error; raises
        what a lost connection raises."""
        defaults = self.config.routing.topic_defaults
        refused: dict[str, RivvenError] = {}
        assert self.admission is not None
        for topic in sorted(set(topics) - self.ensured):
            try:
                await admin.create_topic(
                    topic, partitions=defaults.partitions or topic_partitions_default,
                    replication_factor=defaults.replication_factor or 1,
                    config=dict(defaults.configs) if configs else {})
            except TopicAlreadyExistsError:
                pass
            except RivvenError as error:
                if _outcome_of(error) is not SendOutcome.PERMANENT_FAILURE:
                    raise
                refused[topic] = error
                continue
            partitions = (await admin.describe_topic(topic)).partitions
            self.admission.set_partition_count(topic, partitions)
            self.ensured.add(topic)
        return refused

    async def _drive(self, producer: Any, admin: Any) -> None:
        cycle = self.cycle
        assert cycle is not None
        instructions = cycle.start()
        while True:
            event = await self._execute(instructions, producer, admin)
            if event is None:
                return  # halted
            if self.stop.is_set() and not self._stop_told and not isinstance(
                    event, bc.StopRequested):
                self._stop_told = True
                first = cycle.handle(bc.StopRequested(now_ms()))
                if first:  # halted at once (polling or backing off)
                    assert isinstance(first[-1], bc.Halt)
                    return
            if isinstance(event, bc.StopRequested):
                self._stop_told = True
            instructions = cycle.handle(event)
            if not instructions:
                assert cycle.phase is bc.Phase.DONE
                return

    async def _execute(self, instructions: list[bc.Instruction], producer: Any,
                       admin: Any) -> bc.Event | None:
        """Run one list of instructions; the event it ends with (None after ``Halt``)."""
        for index, instruction in enumerate(instructions):
            if isinstance(instruction, bc.Poll):
                return await self._poll(instruction)
            if isinstance(instruction, bc.BeginTransaction):
                return await self._transact(instructions[index:], producer, admin)
            if isinstance(instruction, bc.AbortTransaction):
                await self._abort(producer)
            elif isinstance(instruction, bc.RunSideEffect):
                return await self._side_effect(instruction)
            elif isinstance(instruction, bc.WakeAt):
                return await self._sleep_until(instruction.at_ms)
            else:
                assert isinstance(instruction, bc.Halt)
                return None
        raise AssertionError(f"an instruction list without an end: {instructions!r}")

    async def _transact(self, instructions: list[bc.Instruction], producer: Any,
                        admin: Any) -> bc.Event:
        """``BeginTransaction``, ``Send``..., ``CommitTransaction``: the batch's transaction.
        Topics not ensured yet are created first; the first client error skips the rest and
        is reported with what it says about each topic (``_outcome_of``)."""
        begin, *sends, commit = instructions
        assert isinstance(begin, bc.BeginTransaction) and isinstance(commit, bc.CommitTransaction)
        assert all(isinstance(send, bc.Send) for send in sends)
        offsets_topic = self.cycle.offsets_topic  # type: ignore[union-attr]
        topics = {send.record.destination.topic for send in sends  # type: ignore[union-attr]
                  } - {offsets_topic}
        if sends and sends[-1].record.destination.topic == offsets_topic:  # type: ignore
            # The position record first: its partition joins the transaction in the first
            # AddPartitionsToTxn and its batch goes in the first request, instead of a round
            # trip of each after the last record (one transaction: the order is invisible).
            sends = [sends[-1], *sends[:-1]]
        outcomes: dict[str, SendOutcome] = {}
        deliveries: list[tuple[str, Any]] = []
        failure = await self._guard(producer.begin_transaction())
        if failure is None:
            try:
                refused = await self._ensure_topics(admin, topics)
            except (RivvenError, trio.TooSlowError) as error:
                failure = error
            else:
                for topic, error in refused.items():
                    outcomes[topic] = SendOutcome.PERMANENT_FAILURE
                    failure = error
        queued = 0  # records queued since the last checkpoint
        for send in sends:
            if failure is not None:
                break
            record = send.record
            topic = record.destination.topic  # type: ignore[union-attr]
            # A block goes in slices: the producer's buffer bound is checked per slice.
            parts = (record.slices(enqueue_checkpoint_records)
                     if isinstance(record, EncodedRecords) else (record,))
            try:
                for part in parts:
                    queued += part.record_count
                    if queued >= enqueue_checkpoint_records:
                        queued = 0
                        await trio.lowlevel.checkpoint()
                    deliveries.append((topic, await self._send(producer, part)))
            except (RivvenError, trio.TooSlowError) as error:
                failure = error
                outcomes.setdefault(topic, _outcome_of(error))
        if failure is None:
            failure = await self._guard(self.crash.before_commit(producer))  # (test-only)
        if failure is None:
            failure = await self._commit_preparing_next(producer)
        self._learn_partition_counts(producer, topics)
        if failure is None:
            self.crash.reach("after_commit_before_side_effect")  # (test-only)
            return bc.TransactionCommitted(commit.batch_id, now_ms())
        for topic, delivery in deliveries:  # which topic's records the broker refused
            error = await _delivery_error(delivery)
            if error is not None:
                outcome = _outcome_of(error)
                if outcome is SendOutcome.PERMANENT_FAILURE or topic not in outcomes:
                    outcomes[topic] = outcome
        attributed = tuple((topic, outcome) for topic, outcome in sorted(outcomes.items())
                           if outcome is not SendOutcome.NO_VERDICT)
        return bc.TransactionFailed(commit.batch_id, str(failure),
                                    not isinstance(failure, _FATAL_ERRORS), now_ms(),
                                    topic_outcomes=attributed)

    async def _commit_preparing_next(self, producer: Any) -> BaseException | None:
        """``commit_transaction`` (its error, or None), with the source's next poll prepared
        meanwhile (``prepare_poll``, when the source has it and no stop is asked): the commit
        is sent first, the preparation runs while the broker works, and both have ended
        when this returns — the cycle's next instruction (the side effect) never runs
        beside a preparation. Nothing prepared is sent before the cycle polls for it."""
        prepare = getattr(self.source, "prepare_poll", None)
        if prepare is None or self.stop.is_set():
            return await self._guard(producer.commit_transaction())
        failure: list[BaseException | None] = []
        async with trio.open_nursery() as nursery:  # (the commit runs first: start_soon)
            nursery.start_soon(prepare, min(poll_records_max, bc.batch_records_max))
            failure.append(await self._guard(producer.commit_transaction()))
        return failure[0]

    def _learn_partition_counts(self, producer: Any, topics: set[str]) -> None:
        """The producer's metadata (refreshed by the client for unknown topics) into
        admission, so ``partition_out_of_range`` is judged against the broker's counts."""
        assert self.admission is not None
        for topic in topics:
            count = producer.partition_count(topic)
            if count is not None and self.admission.partition_counts.get(topic) != count:
                self.admission.set_partition_count(topic, count)

    @staticmethod
    async def _guard(call: Any) -> BaseException | None:
        try:
            await call
        except (RivvenError, trio.TooSlowError) as error:
            return error
        return None

    @staticmethod
    async def _send(producer: Any, record: Record | EncodedRecords) -> Any:
        """Queue ``record`` (or a block's records, in one call: ``send_many_nowait`` checks
        the producer's buffer bound once, so ``_transact`` hands it slices of at most
        ``enqueue_checkpoint_records``); its ``Delivery``. Without a
        checkpoint unless the producer must wait (the topic's metadata or buffer space):
        ``_transact`` queues a batch back to back, so the sender sees every partition of it
        at once."""
        destination = record.destination
        assert destination is not None
        if isinstance(record, EncodedRecords):  # keyed by their own keys, as records are
            assert destination.key is None and destination.partition is None
            block = (destination.topic, record.keys, record.values, record.headers,
                     record.timestamps_ms)
            try:
                return producer.send_many_nowait(*block)
            except anyio.WouldBlock:
                return await producer.enqueue_many(*block)
        key = destination.key if destination.key is not None else encode(record.key)
        arguments = (destination.topic, encode(record.value), key, list(record.headers),
                     destination.partition, record.timestamp_ms)
        try:
            return producer.send_nowait(*arguments)
        except anyio.WouldBlock:
            return await producer.enqueue(*arguments)

    async def _abort(self, producer: Any) -> None:
        try:
            await producer.abort_transaction()
        except (RivvenError, trio.TooSlowError) as error:
            raise _SourceStopped(f"abort_transaction failed: {error}") from error

    async def _interruptible(self, call: Any) -> tuple[bool, Any]:
        """(completed, result) of ``call()``; not completed if ``stop`` came first."""
        return await interruptible(call, self.stop, watch=not self._stop_told)

    async def _poll(self, instruction: bc.Poll) -> bc.Event:
        """The source's ``poll`` (cancelled by a stop), or its ``poll_ready``, which never
        waits and is not interrupted (what it read is in the batch before the stop is
        told)."""
        wanted = min(poll_records_max, bc.batch_records_max, instruction.records_max
                     or bc.batch_records_max)
        try:
            if instruction.ready_only:
                done, records = True, await self.source.poll_ready(wanted)  # type: ignore
            else:
                done, records = await self._interruptible(lambda: self.source.poll(wanted))
        except (SourceError, BaseExceptionGroup) as caught:
            error = find_error(caught, (SourceError,))
            if error is None:
                raise
            raise _SourceStopped(str(error)) from caught
        if not done:
            return bc.StopRequested(now_ms())
        if records is None:  # a finite source is exhausted: stop as if asked
            return bc.StopRequested(now_ms())
        return bc.PollCompleted(tuple(records), now_ms())

    async def _side_effect(self, instruction: bc.RunSideEffect) -> bc.Event:
        try:
            await self.source.side_effect(instruction.position)
        except (OSError, SourceError) as error:
            return bc.SideEffectFailed(instruction.batch_id, str(error), now_ms())
        return bc.SideEffectCompleted(instruction.batch_id, now_ms())

    async def _sleep_until(self, at_ms: int) -> bc.Event:
        """The backoff: ``TimerFired`` at ``at_ms``, ``AbandonRequested`` at once if an
        abandon-batch request was accepted for this batch, ``StopRequested`` on stop."""
        cycle = self.cycle
        assert cycle is not None and cycle.batch is not None
        abandon = self._abandon

        async def sleep() -> bool:
            with trio.move_on_at(at_ms / 1000):
                await abandon.wait()
                return True
            return False

        done, abandoned = await self._interruptible(sleep)
        if not done:
            return bc.StopRequested(now_ms())
        if not abandoned:
            return bc.TimerFired(now_ms())
        self._abandon = trio.Event()
        if self._abandon_batch_id != cycle.batch.batch_id or cycle.abandon_refusal():
            _log.warning("%s: abandon-batch request dropped: the batch it was for is no "
                         "longer waiting", self.config.name)
            return bc.TimerFired(now_ms())
        _log.warning("%s: abandoning batch %d: committing position %r without its %d records",
                     self.config.name, cycle.batch.batch_id, cycle.batch.last_position,
                     len(cycle.batch.records))
        return bc.AbandonRequested(now_ms())


class _SourceStopped(Exception):
    """The driver cannot go on with this source (its message says why)."""


#: What ends one source's task (in ``error``) without ending the others.
_STOPS_SOURCE = (_SourceStopped, RivvenError, trio.TooSlowError)


@attrs.frozen
class SourceResult:
    name: str
    state: str  # running | degraded | error | stopped (a cycle's Status value)
    error: str | None
    position: Any
    records: int


async def run_connect(config: ConnectConfig, bootstrap: str, sources: Mapping[str, Source],
                      stop: trio.Event, *, seed: int | None = None, http: str | None = None,
                      sinks: Mapping[str, Any] | None = None,
                      task_status: trio.TaskStatus[int | None] = trio.TASK_STATUS_IGNORED,
                      ) -> dict[str, SourceResult]:
    """Run every source until it halts (exhausted, ``stop`` set, or an error), and every
    sink of ``sinks`` until ``stop`` or an error (``sink_runner.run_sinks``: their
    ``SinkResult``s are in the answer under ``sinks.NAME``), serving the HTTP API on ``http``
    (HOST:PORT; None: no server) meanwhile.

    ``task_status.started`` gets the bound HTTP port (None without a server) once the offsets
    topic is made sure of and the server listens. Raises ``BrokerUnreachable`` if no broker
    answers at start, ``HttpUnavailable`` if ``http`` cannot be bound."""
    await ensure_offsets_topic(bootstrap)
    results: dict[str, SourceResult] = {}
    rng = random.Random(seed)
    runners = {
        name: SourceRunner(source_config, sources[name], bootstrap, stop,
                           rng=random.Random(rng.random()))
        for name, source_config in config.sources.items()}

    sinking = sink_runners(config, bootstrap, sinks or {}, stop, rng)

    def views() -> list[ConnectorView]:
        return [*(_view(runner, results.get(name)) for name, runner in runners.items()),
                *(_sink_view(runner, results.get(f"sinks.{name}"))
                  for name, runner in sinking.items())]

    def abandon(name: str) -> str | None:
        runner = runners.get(name)
        if runner is None:
            return "a sink has no batch to abandon (abandon-batch is for sources)"
        result = results.get(name)
        if result is not None:
            return (f"no batch to abandon: the source ended ({result.state}); a source in "
                    f"error is restarted, not skipped (its batch is replayed)")
        return runner.request_abandon()

    async def run_one(runner: SourceRunner) -> None:
        name = runner.config.name
        try:
            status = await runner.run()
        except (*_STOPS_SOURCE, BaseExceptionGroup) as caught:
            error = find_error(caught, _STOPS_SOURCE)
            if error is None:
                raise
            cycle = runner.cycle
            results[name] = SourceResult(
                name, "error", str(error), None if cycle is None else cycle.committed_position,
                0 if cycle is None else cycle.records_committed)
            return
        results[name] = SourceResult(name, status.state.value, status.last_error,
                                     status.position, status.records)

    async with trio.open_nursery() as server:
        port = None
        if http is not None:
            host, _, port_text = http.rpartition(":")
            try:
                port = await server.start(
                    serve_http, host, int(port_text),
                    lambda method, target: respond(method, target, views(), now_ms(),
                                                   abandon=abandon))
            except OSError as error:
                raise HttpUnavailable(f"cannot serve HTTP on {http}: {error}") from error
        task_status.started(port)
        async with trio.open_nursery() as nursery:
            for runner in runners.values():
                nursery.start_soon(run_one, runner)
            if sinking:
                nursery.start_soon(run_sinks, sinking, results)
        server.cancel_scope.cancel()
    return results


def _sink_view(runner: SinkRunner, result: Any) -> ConnectorView:
    return ConnectorView(
        runner.config.name, runner.config.connector, status=runner.cycle.status(),
        final_state=None if result is None else result.state,
        final_error=None if result is None else result.error, kind="sink")


def _view(runner: SourceRunner, result: SourceResult | None) -> ConnectorView:
    cycle = runner.cycle
    return ConnectorView(
        runner.config.name, runner.config.connector,
        status=None if cycle is None else cycle.status(), admission=runner.admission,
        final_state=None if result is None else result.state,
        final_error=None if result is None else result.error,
        metrics=tuple(runner.source.metrics()) if hasattr(runner.source, "metrics") else ())
