"""The producer's exactly-once state: producer id and epoch, sequences, transactions.

Theory of operation
-------------------
One ``TransactionManager`` per idempotent (the default) or transactional producer, owned by
its ``ProducerCore`` and driven by the same sender (blocking thread or trio task). It decides;
the driver sends.

*Producer id.* Nothing is produced before the broker granted a producer id and epoch
(``InitProducerId``): an idempotent producer asks on its own at start, a transactional one
when the user calls ``init_transactions`` (which also fences older instances of the same
``transactional_id``). ``can_drain(tp)`` keeps the accumulator from draining until then.

*Sequences.* When a batch is drained for the first time, ``assign`` stamps it with the
producer id, epoch and the partition's next sequence (``+ record_count``, wrapping at 2^31);
a retry keeps its stamp, so the broker recognises it (a duplicate is answered with the
original offsets). The driver keeps at most five requests in flight per connection and a
request holds at most one batch per partition, so the broker's memory of five batches per
producer always covers every retry. Per partition the manager keeps the batches stamped and
not yet finished, oldest first: ``OUT_OF_ORDER_SEQUENCE`` for a batch that is not the oldest
of them only means an earlier one is being retried, so it is retried too; for the oldest it
means the broker lost the producer's state.

*Broken sequences.* A stamped batch that fails for good leaves a gap no later batch can
cross. An idempotent producer then waits until nothing is in flight, takes a new producer id
(``InitProducerId`` again) and re-stamps everything not yet acknowledged from sequence 0. A
transactional producer enters the *abortable* state instead: ``commit_transaction`` raises the
error, ``abort_transaction`` works, and after every abort the producer bumps its epoch
(``InitProducerId`` with its id and epoch), which restarts every sequence at 0.

A producer that is idempotent only because that is the default (``fallback_allowed``) and
meets a broker without ``InitProducerId`` (UNSUPPORTED_VERSION) produces without idempotence.

*Transactions* (KIP-98): ``begin_transaction`` is local. A partition's first batch in a
transaction is held until ``AddPartitionsToTxn`` for it succeeded (the manager batches the
partitions that wait). ``send_offsets`` queues ``AddOffsetsToTxn`` then ``TxnOffsetCommit``.
Given a consumer's ``group_metadata()`` instead of a group id, the ``TxnOffsetCommit`` carries
its generation and member id and the broker refuses the offsets of a member that left that
generation (KIP-447): UNKNOWN_MEMBER_ID / ILLEGAL_GENERATION / FENCED_INSTANCE_ID become a
``CommitFailedError`` that makes the transaction abortable (not fatal).
The driver calls ``begin_commit`` only after flushing every record of the transaction, and
``begin_abort`` after failing the queued ones and waiting for those in flight; each queues an
``EndTxn`` (none when the coordinator never heard of the transaction).
``CONCURRENT_TRANSACTIONS`` and the other retriable coordinator answers are retried after a
backoff; ``PRODUCER_FENCED`` (a newer instance exists, or the coordinator aborted this one) is
*fatal*: every later operation raises it and queued records fail with it.

Operations the user waits for return a ``TxnResult``; the driver waits until ``done`` and
raises its ``error``. At most one coordinator request is in flight (``next_call`` /
``on_call_done``). A transactional producer sends them to its id's coordinator, found with
``FindCoordinator`` (key type 1) before the first and again after any retriable failure
other than CONCURRENT_TRANSACTIONS (in a cluster the coordinator moves with the leadership
of its ``__transaction_state`` partition); an idempotent producer's InitProducerId goes to any
broker.

Pure: no I/O, no clocks (``now_ms`` is an argument), not thread-safe (drivers lock).
"""

from __future__ import annotations

import enum
from collections import deque
from typing import Any, NamedTuple

from rivven_broker.client.errors import (
    InvalidTxnStateError,
    ProducerFencedError,
    RivvenError,
    error_for,
)
from rivven_broker.client.types import TopicPartition
from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.group_messages import (
    COORDINATOR_KEY_TRANSACTION,
    NO_GENERATION,
    FindCoordinator,
)
from rivven_broker.protocol.txn_messages import (
    AddOffsetsToTxn,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxn,
    AddPartitionsToTxnResponse,
    AddPartitionsToTxnTopic,
    EndTxn,
    EndTxnResponse,
    InitProducerId,
    InitProducerIdResponse,
    TxnOffsetCommit,
    TxnOffsetCommitPartition,
    TxnOffsetCommitResponse,
    TxnOffsetCommitTopic,
)

__all__ = [
    "TxnPhase",
    "TxnResult",
    "CoordinatorCall",
    "TransactionManager",
    "SEQUENCE_SPACE",
    "offsets_of",
]

SEQUENCE_SPACE = 2**31
#: Retry delays after CONCURRENT_TRANSACTIONS (the previous transaction's markers are being
#: written; they take one group commit): the first retry after 2 ms, doubling on each
#: consecutive answer up to 20 ms. A next transaction's first AddPartitionsToTxn usually
#: meets the end of the last one's markers, so the first retry should not wait long.
_CONCURRENT_RETRY_FIRST_MS = 2
_CONCURRENT_RETRY_MAX_MS = 20
_FATAL_CODES = frozenset(
    {
        ErrorCode.PRODUCER_FENCED,
        ErrorCode.INVALID_PRODUCER_EPOCH,
        ErrorCode.INVALID_PRODUCER_ID_MAPPING,
        ErrorCode.TRANSACTIONAL_ID_NOT_FOUND,
    }
)


class TxnPhase(enum.Enum):
    UNINITIALIZED = "uninitialized"
    INITIALIZING = "initializing"
    READY = "ready"
    IN_TRANSACTION = "in_transaction"
    COMMITTING = "committing"
    ABORTING = "aborting"
    ABORTABLE_ERROR = "abortable_error"
    FATAL_ERROR = "fatal_error"


class TxnResult:
    """The outcome of one operation: the driver waits until ``done``, then raises ``error``."""

    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = False
        self.error: RivvenError | None = None

    def finish(self, error: RivvenError | None = None) -> None:
        if not self.done:
            self.done, self.error = True, error


class CoordinatorCall(NamedTuple):
    """A request the driver sends to ``address`` (None: any broker), then reports with
    ``on_call_done``."""

    call_id: int
    request: Any
    address: tuple[str, int] | None = None


class _Op:
    """A queued coordinator operation."""

    __slots__ = ("kind", "result", "group_id", "generation_id", "member_id",
                 "group_instance_id", "offsets", "committed")

    def __init__(self, kind: str, result: TxnResult | None = None, **fields: Any) -> None:
        self.kind = kind  # init | add_offsets | commit_offsets | end | find
        self.result = result
        self.group_id: str = fields.get("group_id", "")
        self.generation_id: int = fields.get("generation_id", NO_GENERATION)
        self.member_id: str = fields.get("member_id", "")
        self.group_instance_id: str | None = fields.get("group_instance_id")
        self.offsets: dict[TopicPartition, int] = fields.get("offsets", {})
        self.committed: bool = fields.get("committed", False)


class TransactionManager:
    """Producer id, sequences and the transaction state of one producer (module docstring)."""

    def __init__(
        self,
        *,
        transactional_id: str | None,
        transaction_timeout_ms: int = limits.transaction_timeout_ms_default,
        retry_backoff_ms: int = 100,
        fallback_allowed: bool = False,
    ) -> None:
        self.transactional_id = transactional_id
        #: Idempotence by default only: a broker without InitProducerId turns it off.
        self.fallback_allowed = fallback_allowed and transactional_id is None
        self.disabled = False
        self.transaction_timeout_ms = transaction_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.producer_id = -1
        self.producer_epoch = -1
        self.phase = TxnPhase.UNINITIALIZED
        self.error: RivvenError | None = None  # the abortable or fatal error
        self.in_flight_batches = 0
        self._next_sequence: dict[tuple[str, int], int] = {}
        self._unfinished: dict[tuple[str, int], list[Any]] = {}  # stamped, oldest first
        self._reset_wanted = False
        self._ops: deque[_Op] = deque()
        self._call: tuple[int, _Op | None, frozenset] | None = None  # in flight
        self._next_call_id = 1
        self.retry_at_ms = 0
        self._concurrent_retry_ms = _CONCURRENT_RETRY_FIRST_MS
        self._wanted: set[tuple[str, int]] = set()
        self._added: set[tuple[str, int]] = set()
        self._started = False  # the coordinator knows the current transaction
        #: Where the transactional id's coordinator is (FindCoordinator; None: find it).
        self.coordinator: tuple[str, int] | None = None
        if transactional_id is None:
            self._queue_init(None)

    @property
    def transactional(self) -> bool:
        return self.transactional_id is not None

    @property
    def fatal_error(self) -> RivvenError | None:
        return self.error if self.phase == TxnPhase.FATAL_ERROR else None

    # --- draining and stamping -------------------------------------------------------------

    def can_drain(self, tp: tuple[str, int]) -> bool:
        """Whether a batch of ``tp`` may be sent now (asks for AddPartitionsToTxn if needed)."""
        if self.disabled:
            return True
        if self.producer_id < 0 or self._reset_wanted or self.phase == TxnPhase.FATAL_ERROR:
            return False
        if not self.transactional:
            return True
        if tp in self._added:
            return True
        if self.phase in (TxnPhase.IN_TRANSACTION, TxnPhase.COMMITTING):
            self._wanted.add(tp)
        return False

    def assign(self, batch: Any) -> None:
        """Stamp a batch being drained (a retry keeps its stamp). Counts it in flight."""
        self.in_flight_batches += 1
        if self.disabled:
            return
        if batch.base_sequence >= 0 and (batch.producer_id, batch.producer_epoch) == (
            self.producer_id, self.producer_epoch
        ):
            return
        tp = (batch.topic, batch.partition)
        sequence = self._next_sequence.get(tp, 0)
        batch.producer_id, batch.producer_epoch = self.producer_id, self.producer_epoch
        batch.base_sequence = sequence
        batch.transactional = self.transactional
        self._next_sequence[tp] = (sequence + batch.record_count) % SEQUENCE_SPACE
        self._unfinished.setdefault(tp, []).append(batch)

    def returned(self, batch: Any) -> None:
        """A drained batch's request finished (answered or failed)."""
        self.in_flight_batches -= 1
        assert self.in_flight_batches >= 0

    def is_oldest(self, batch: Any) -> bool:
        """Whether no earlier stamped batch of its partition is still unfinished."""
        unfinished = self._unfinished.get((batch.topic, batch.partition))
        return not unfinished or unfinished[0] is batch

    def acknowledged(self, batch: Any) -> None:
        """The broker stored the batch (or answered that it had)."""
        self._forget(batch)

    def failed(self, batch: Any, error: RivvenError) -> None:
        """The batch failed for good. A stamped one breaks its partition's sequence."""
        if batch.base_sequence < 0 or not self._forget(batch):
            return
        if error.error_code in _FATAL_CODES:
            self._fatal(error)
        elif self.transactional:
            self._abortable(error)
        else:
            self._reset_wanted = True

    def _forget(self, batch: Any) -> bool:
        unfinished = self._unfinished.get((batch.topic, batch.partition))
        if unfinished is None or batch not in unfinished:
            return False
        unfinished.remove(batch)
        return True

    def unknown_producer(self, batch: Any) -> bool:
        """UNKNOWN_PRODUCER_ID for ``batch``: True when it should be retried (an idempotent
        producer takes a new id first); False when it fails (a transaction must abort)."""
        if self.transactional:
            return False
        self._reset_wanted = True
        return True

    def _restart_sequences(self) -> None:
        for batches in self._unfinished.values():
            for batch in batches:
                batch.base_sequence = -1  # re-stamped when next drained
        self._unfinished.clear()
        self._next_sequence.clear()

    # --- user operations (raise at once, or return a result to wait for) --------------------

    def check_send(self) -> None:
        """Raise unless a record may be sent now (transactional: inside a transaction)."""
        if self.phase == TxnPhase.FATAL_ERROR or self.phase == TxnPhase.ABORTABLE_ERROR:
            assert self.error is not None
            raise self.error
        if self.transactional and self.phase != TxnPhase.IN_TRANSACTION:
            raise InvalidTxnStateError(f"send() outside a transaction (state {self.phase.value})")

    def init_transactions(self) -> TxnResult:
        self._require_transactional()
        self._raise_if_failed()
        if self.phase != TxnPhase.UNINITIALIZED:
            raise InvalidTxnStateError(f"init_transactions() in state {self.phase.value}")
        return self._queue_init(TxnResult())

    def begin_transaction(self) -> None:
        self._require_transactional()
        self._raise_if_failed()
        if self.phase != TxnPhase.READY:
            raise InvalidTxnStateError(f"begin_transaction() in state {self.phase.value}")
        self.phase = TxnPhase.IN_TRANSACTION
        self._wanted.clear()
        self._added.clear()
        self._started = False

    def send_offsets(self, offsets: dict[TopicPartition, int], group: Any) -> TxnResult:
        """Queue ``offsets`` of ``group``: a group id (no membership check) or a consumer's
        ``group_metadata()``.

        Raises:
            TypeError: ``group`` is neither.
            InvalidTxnStateError: no transaction is open.
        """
        group_id, generation_id, member_id, instance_id = membership_of(group)
        self._require_transactional()
        self._raise_if_failed()
        if self.phase != TxnPhase.IN_TRANSACTION:
            raise InvalidTxnStateError(f"send_offsets_to_transaction() in {self.phase.value}")
        result = TxnResult()
        self._ops.append(_Op("add_offsets", result, group_id=group_id, offsets=dict(offsets),
                             generation_id=generation_id, member_id=member_id,
                             group_instance_id=instance_id))
        return result

    def begin_commit(self) -> TxnResult:
        """Call once every record of the transaction is acknowledged."""
        self._require_transactional()
        self._raise_if_failed()
        if self.phase != TxnPhase.IN_TRANSACTION:
            raise InvalidTxnStateError(f"commit_transaction() in state {self.phase.value}")
        return self._end(True)

    def begin_abort(self) -> TxnResult:
        """Call once queued records were failed and none is in flight."""
        self._require_transactional()
        if self.phase == TxnPhase.FATAL_ERROR:
            assert self.error is not None
            raise self.error
        if self.phase not in (TxnPhase.IN_TRANSACTION, TxnPhase.ABORTABLE_ERROR):
            raise InvalidTxnStateError(f"abort_transaction() in state {self.phase.value}")
        assert self.in_flight_batches == 0
        self.error = None
        return self._end(False)

    def _end(self, committed: bool) -> TxnResult:
        self.phase = TxnPhase.COMMITTING if committed else TxnPhase.ABORTING
        self._wanted.clear()
        result = TxnResult()
        if self._started:
            self._ops.append(_Op("end", result, committed=committed))
        else:  # the coordinator never heard of it, and no batch of it was stamped
            self._ended()
            result.finish()
        return result

    def _ended(self) -> None:
        self.phase = TxnPhase.READY
        self._added.clear()
        self._started = False

    def _require_transactional(self) -> None:
        if not self.transactional:
            raise InvalidTxnStateError("this producer has no transactional_id")

    def _raise_if_failed(self) -> None:
        if self.phase in (TxnPhase.FATAL_ERROR, TxnPhase.ABORTABLE_ERROR):
            assert self.error is not None
            raise self.error

    def _queue_init(self, result: TxnResult | None) -> TxnResult | None:
        self.phase = TxnPhase.INITIALIZING if self.producer_id < 0 else self.phase
        self._ops.append(_Op("init", result))
        return result

    def _fatal(self, error: RivvenError) -> None:
        if not isinstance(error, ProducerFencedError) and error.error_code in (
            ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH,
        ):
            error = ProducerFencedError(error.message)
        self.phase, self.error = TxnPhase.FATAL_ERROR, error
        for op in self._ops:
            if op.result is not None:
                op.result.finish(error)
        self._ops.clear()
        self._wanted.clear()

    def _abortable(self, error: RivvenError) -> None:
        if self.phase in (TxnPhase.IN_TRANSACTION, TxnPhase.COMMITTING):
            self.phase, self.error = TxnPhase.ABORTABLE_ERROR, error

    # --- coordinator calls -------------------------------------------------------------------

    def next_call(self, now_ms: int) -> CoordinatorCall | None:
        """The coordinator request to send now, if any (one at a time)."""
        if self._call is not None or now_ms < self.retry_at_ms:
            return None
        if self.phase == TxnPhase.FATAL_ERROR:
            return None
        if self._reset_wanted and self.in_flight_batches == 0:
            self._reset_wanted = False
            self._ops.appendleft(_Op("init"))
        if self.transactional and self.coordinator is None and (self._ops or self._wanted):
            key = COORDINATOR_KEY_TRANSACTION
            return self._send(_Op("find"), FindCoordinator(self.transactional_id, key),
                              frozenset())
        op = self._ops[0] if self._ops else None
        if op is not None and op.kind == "init":
            return self._send(op, self._init_request(), frozenset())
        if self._wanted and self.phase in (TxnPhase.IN_TRANSACTION, TxnPhase.COMMITTING):
            partitions = frozenset(self._wanted)
            self._wanted.clear()
            return self._send(None, self._add_partitions_request(partitions), partitions)
        if op is None:
            return None
        if op.kind == "add_offsets":
            request: Any = AddOffsetsToTxn(self.transactional_id, self.producer_id,
                                           self.producer_epoch, op.group_id)
        elif op.kind == "commit_offsets":
            request = self._commit_offsets_request(op)
        else:
            assert op.kind == "end", op.kind
            request = EndTxn(self.transactional_id, self.producer_id, self.producer_epoch,
                             op.committed)
        return self._send(op, request, frozenset())

    def _send(self, op: _Op | None, request: Any, partitions: frozenset) -> CoordinatorCall:
        call_id = self._next_call_id
        self._next_call_id += 1
        self._call = (call_id, op, partitions)
        routed = self.transactional and (op is None or op.kind != "find")
        return CoordinatorCall(call_id, request, self.coordinator if routed else None)

    def _init_request(self) -> InitProducerId:
        if not self.transactional:
            return InitProducerId()
        return InitProducerId(
            transactional_id=self.transactional_id,
            transaction_timeout_ms=self.transaction_timeout_ms,
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
        )

    def _add_partitions_request(self, partitions: frozenset) -> AddPartitionsToTxn:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(partitions):
            by_topic.setdefault(topic, []).append(partition)
        topics = tuple(AddPartitionsToTxnTopic(t, tuple(p)) for t, p in by_topic.items())
        return AddPartitionsToTxn(
            self.transactional_id, self.producer_id, self.producer_epoch, topics
        )

    def _commit_offsets_request(self, op: _Op) -> TxnOffsetCommit:
        by_topic: dict[str, list[TxnOffsetCommitPartition]] = {}
        for tp, offset in sorted(op.offsets.items()):
            by_topic.setdefault(tp[0], []).append(TxnOffsetCommitPartition(tp[1], offset))
        topics = tuple(TxnOffsetCommitTopic(t, tuple(p)) for t, p in by_topic.items())
        return TxnOffsetCommit(
            self.transactional_id, op.group_id, self.producer_id, self.producer_epoch,
            generation_id=op.generation_id, member_id=op.member_id, topics=topics,
            group_instance_id=op.group_instance_id,
        )

    def on_call_done(
        self, call_id: int, response: Any, error: RivvenError | None, now_ms: int
    ) -> None:
        """The answer (or failure) of the call ``next_call`` returned."""
        assert self._call is not None and self._call[0] == call_id
        _, op, partitions = self._call
        self._call = None
        if op is not None and op.kind == "find":
            if error is None and response.error_code == ErrorCode.NONE:
                self.coordinator = (response.host, response.port)
            else:  # not there yet (or no broker answered): ask again after a backoff
                self.retry_at_ms = now_ms + self.retry_backoff_ms
            return
        if error is None:
            code = _code_of(response)
            if code != ErrorCode.NONE:
                error = error_for(code, f"{type(response).__name__}: {code.description}")
        if error is None:
            self._concurrent_retry_ms = _CONCURRENT_RETRY_FIRST_MS
            self._succeeded(op, partitions, response)
            return
        if error.retriable:
            if partitions:
                self._wanted |= partitions
            if error.error_code != ErrorCode.CONCURRENT_TRANSACTIONS:
                self.coordinator = None  # it may have moved (or died): find it again
            if error.error_code == ErrorCode.CONCURRENT_TRANSACTIONS:
                delay = self._concurrent_retry_ms
                self._concurrent_retry_ms = min(delay * 2, _CONCURRENT_RETRY_MAX_MS)
            else:
                delay = self.retry_backoff_ms
            self.retry_at_ms = now_ms + delay
            return
        if error.error_code in _FATAL_CODES:
            self._fatal(error)
            return
        if op is not None and op.kind == "init" and self.fallback_allowed and (
            error.error_code == ErrorCode.UNSUPPORTED_VERSION
        ):  # an older broker: produce without idempotence
            self._ops.popleft()
            self.disabled, self.phase = True, TxnPhase.READY
            return
        if op is not None:
            self._ops.popleft()
            if op.kind == "init" and self.producer_id < 0:
                self.phase = TxnPhase.UNINITIALIZED
            if op.result is not None:
                op.result.finish(error)
        if op is None or op.kind in ("add_offsets", "commit_offsets"):
            self._abortable(error)

    def _succeeded(self, op: _Op | None, partitions: frozenset, response: Any) -> None:
        if op is None:  # AddPartitionsToTxn
            self._added |= partitions
            self._started = True
            return
        self._ops.popleft()
        if op.kind == "init":
            self.producer_id = response.producer_id
            self.producer_epoch = response.producer_epoch
            self._restart_sequences()
            if self.phase in (TxnPhase.INITIALIZING, TxnPhase.ABORTING):
                self.phase = TxnPhase.READY
                self._added.clear()
                self._started = False
        elif op.kind == "add_offsets":
            self._started = True
            self._ops.appendleft(
                _Op("commit_offsets", op.result, group_id=op.group_id, offsets=op.offsets,
                    generation_id=op.generation_id, member_id=op.member_id,
                    group_instance_id=op.group_instance_id)
            )
            return
        elif op.kind == "end":
            if op.committed:
                self._ended()
            else:  # bump the epoch before the next transaction: sequences restart at 0
                self._ops.appendleft(_Op("init", op.result))
                return
        if op.result is not None:
            op.result.finish()

    def check_invariants(self) -> None:
        """Assert the manager's invariants (tests)."""
        assert self.in_flight_batches >= 0
        assert (self.phase == TxnPhase.FATAL_ERROR) <= (self.error is not None)
        for tp, batches in self._unfinished.items():
            assert all(b.base_sequence >= 0 for b in batches), tp
        assert not (self._added & self._wanted)


def offsets_of(offsets: Any) -> dict[TopicPartition, int]:
    """``{TopicPartition: offset}`` from a mapping whose values are ints or carry ``.offset``.

    Raises:
        ValueError: a negative or non-integer offset.
    """
    out = {}
    for tp, value in dict(offsets).items():
        offset = value if isinstance(value, int) else getattr(value, "offset", None)
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset of {tp} must be an int >= 0, not {offset!r}")
        out[TopicPartition(tp[0], tp[1])] = offset
    return out


def membership_of(group: Any) -> tuple[str, int, str, str | None]:
    """``(group_id, generation_id, member_id, group_instance_id)`` of a group id (``-1, "",
    None``: no membership check) or of a ``ConsumerGroupMetadata`` (anything with those
    attributes; ``group_instance_id`` may be missing).

    Raises:
        TypeError: ``group`` is neither.
    """
    if isinstance(group, str):
        return group, NO_GENERATION, "", None
    try:
        group_id, generation_id, member_id = group.group_id, group.generation_id, group.member_id
    except AttributeError:
        raise TypeError(
            f"group must be a group id or Consumer.group_metadata(), not {group!r}"
        ) from None
    instance_id = getattr(group, "group_instance_id", None)
    if not (isinstance(group_id, str) and isinstance(generation_id, int)
            and isinstance(member_id, str) and (instance_id is None or isinstance(instance_id, str))):
        raise TypeError(f"malformed group metadata {group!r}")
    return group_id, generation_id, member_id, instance_id


def _code_of(response: Any) -> ErrorCode:
    """The first error code in a coordinator response (NONE when all succeeded)."""
    if isinstance(response, (InitProducerIdResponse, AddOffsetsToTxnResponse, EndTxnResponse)):
        return ErrorCode.from_wire(response.error_code)
    if isinstance(response, (AddPartitionsToTxnResponse, TxnOffsetCommitResponse)):
        for topic in response.topics:
            for part in topic.partitions:
                if part.error_code != ErrorCode.NONE:
                    return ErrorCode.from_wire(part.error_code)
        return ErrorCode.NONE
    code = getattr(response, "error_code", ErrorCode.UNKNOWN_SERVER_ERROR)
    return ErrorCode.from_wire(code) if code != ErrorCode.NONE else ErrorCode.UNKNOWN_SERVER_ERROR
