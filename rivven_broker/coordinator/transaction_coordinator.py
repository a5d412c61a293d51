"""The transaction coordinator: a pure state machine over transactional ids (KIP-98).

Theory of operation
-------------------
``TransactionCoordinator.handle(event, now_ms) -> list[instruction]``, in the style of a
dask worker state machine. The driver (server side) feeds it client requests, log-append
outcomes, marker completions and ticks, and carries out what it returns: replies, appends to
``__transaction_state`` and marker writes (the contract is in ``txn_events``). Its whole
state is that topic's records (format in ``txn_log_codec``).

Requests whose outcome must survive a crash are answered only after their record is durable:
the reply travels with the pending append and is released by ``TxnLogAppended``. While an
append or the markers of a transactional id are outstanding, further requests for that id get
CONCURRENT_TRANSACTIONS (retriable).

States per transactional id: Empty -> Ongoing (AddPartitionsToTxn / AddOffsetsToTxn) ->
PrepareCommit | PrepareAbort (EndTxn; durable before the reply: a logged commit is
irrevocable) -> CompleteCommit | CompleteAbort (after the markers) -> Ongoing (next
transaction) ...; Dead while an expired id's tombstone is written. ``load(records)`` rebuilds
everything from the log and completes in-doubt (Prepare*) transactions from the durable
decision by re-issuing their markers.

Fencing. InitProducerId on a known id bumps the epoch (a new producer id at epoch 0 once the
epoch nears its i16 limit); every other request must carry the current epoch exactly, else
PRODUCER_FENCED. A transaction still open at re-init, or older than its timeout at a tick, is
aborted with the epoch bumped in the PrepareAbort record, so its markers carry the new epoch
and every partition then refuses the old one: a zombie can neither commit nor write. The
re-init itself answers CONCURRENT_TRANSACTIONS until the abort is complete.

Pending transactions: "pending" means begun and not complete (Ongoing or Prepare*). Each
producer (one producer id per transactional id) has at most one, as in KIP-98; this is within
the issue's bound of five (``limits.transactions_open_per_producer_max``).

Producer ids come from durable blocks: requests that need an id while no block is held are
parked (bounded) until the next block is. A single node reserves its blocks itself, as records
of ``__transaction_state`` (``txn_log_codec``); a clustered broker's coordinator
(``producer_ids_from_controller``) asks the controller (``RequestProducerIds``), whose Raft log
hands every broker ids no other broker holds.

``now_ms`` must be wall-clock milliseconds: transaction start times are persisted and compared
after a restart. Pure: no I/O, no clocks, no randomness.
"""

from __future__ import annotations

from collections import deque
from typing import Hashable, Iterable

import attrs

from rivven_broker.coordinator.txn_events import (
    AppendTxnLog,
    MarkersWritten,
    ProducerIdsGranted,
    RequestProducerIds,
    TxnEvent,
    TxnInstruction,
    TxnLogAppended,
    TxnLogAppendFailed,
    TxnReply,
    TxnRequest,
    TxnRequestReceived,
    TxnTick,
    WriteMarkers,
)
from rivven_broker.coordinator.txn_log_codec import (
    CorruptTxnRecordError,
    ProducerIdBlock,
    TxnMetadata,
    TxnState,
    TxnTombstone,
    decode_txn_record,
    encode_producer_id_block,
    encode_txn_metadata,
    encode_txn_tombstone,
)
from rivven_broker.coordinator.txn_requests import (
    add_group,
    add_partitions,
    commit_offsets,
    error_response,
)
from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.txn_messages import (
    AddOffsetsToTxn,
    AddPartitionsToTxn,
    EndTxn,
    InitProducerId,
    InitProducerIdResponse,
    TxnOffsetCommit,
)

__all__ = ["FIRST_PRODUCER_ID", "TransactionCoordinator"]

FIRST_PRODUCER_ID = 1
_PREPARE = (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)
_CLOSED = (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)
_NO_REPLIES: tuple[()] = ()


@attrs.frozen
class _Pending:
    """An outstanding append: what it makes true, and what to answer either way."""

    target: TxnMetadata | None  # None: a producer-id block
    replies: tuple[TxnReply, ...]
    failure_replies: tuple[TxnReply, ...]


def _reply(token: Hashable, request: TxnRequest, code: ErrorCode) -> TxnReply:
    """A reply to ``request`` carrying ``code`` only."""
    return TxnReply(token, error_response(request, code))


class TransactionCoordinator:
    """Transactional ids -> their durable state. See the module docstring."""

    def __init__(self, *, producer_id_block_size: int = limits.producer_id_block_size,
                 producer_ids_from_controller: bool = False) -> None:
        assert producer_id_block_size >= 1
        self._block_size = producer_id_block_size
        self._controller_ids = producer_ids_from_controller
        self._txns: dict[str, TxnMetadata] = {}
        self._pending: dict[int, _Pending] = {}  # append id -> outstanding append
        self._pending_ids: dict[str, int] = {}  # transactional id -> its outstanding append
        self._markers_outstanding: set[str] = set()
        self._markers_written: set[str] = set()  # Prepare*, markers done, Complete* not durable
        self._next_producer_id = FIRST_PRODUCER_ID
        self._block_end = FIRST_PRODUCER_ID
        self._block_append: int | None = None
        self._parked: deque[tuple[Hashable, InitProducerId]] = deque()
        self._next_append_id = 1
        self._loaded = False

    # --- loading ---------------------------------------------------------------------------

    def load(self, records: Iterable[tuple[bytes, bytes | None]]) -> list[TxnInstruction]:
        """Rebuild from ``__transaction_state`` records in log order; return the markers of
        in-doubt transactions to (re)write. Call once, before ``handle``.

        Raises:
            CorruptTxnRecordError: a record is malformed, or producer ids are inconsistent.
        """
        assert not self._loaded and not self._txns
        self._loaded = True
        block_end = FIRST_PRODUCER_ID
        for key, value in records:
            record = decode_txn_record(key, value)
            if isinstance(record, ProducerIdBlock):
                block_end = max(block_end, record.block_end)
            elif isinstance(record, TxnTombstone):
                self._txns.pop(record.transactional_id, None)
            else:
                self._txns[record.transactional_id] = record
        if self._controller_ids:  # blocks come from the controller; none is held yet
            block_end = 1 << 62
        owners: dict[int, str] = {}
        for meta in self._txns.values():
            if meta.producer_id >= block_end or meta.producer_id in owners:
                raise CorruptTxnRecordError(
                    f"producer id {meta.producer_id} of {meta.transactional_id!r} is repeated "
                    f"or beyond the reserved block end {block_end}"
                )
            owners[meta.producer_id] = meta.transactional_id
        self._next_producer_id = self._block_end = 0 if self._controller_ids else block_end
        instructions: list[TxnInstruction] = []
        for meta in self._txns.values():
            if meta.state in _PREPARE:
                instructions.append(self._write_markers(meta))
        return instructions

    # --- queries ---------------------------------------------------------------------------

    def metadata(self, transactional_id: str) -> TxnMetadata | None:
        """The durable state of ``transactional_id`` (None when unknown)."""
        return self._txns.get(transactional_id)

    def transactions(self) -> dict[str, TxnMetadata]:
        """Every transactional id's durable state."""
        return dict(self._txns)

    def check_produce(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        topic: str,
        partition: int,
    ) -> ErrorCode:
        """May this producer write transactional batches to this partition now? NONE when the
        transaction is durably Ongoing with the partition added and not being ended; else
        TRANSACTIONAL_ID_NOT_FOUND, INVALID_PRODUCER_ID_MAPPING, PRODUCER_FENCED or
        INVALID_TXN_STATE. The broker must append right after (no checkpoint in between).
        Pure; never blocks."""
        code, meta = self._lookup(transactional_id, producer_id, producer_epoch)
        if meta is None:
            return code
        if meta.state != TxnState.ONGOING or (topic, partition) not in meta.partitions:
            return ErrorCode.INVALID_TXN_STATE
        append_id = self._pending_ids.get(transactional_id)
        if append_id is not None:
            target = self._pending[append_id].target
            if target is None or target.state != TxnState.ONGOING:
                return ErrorCode.INVALID_TXN_STATE  # its end is being decided
        return ErrorCode.NONE

    def _lookup(
        self, transactional_id: str, producer_id: int, producer_epoch: int
    ) -> tuple[ErrorCode, TxnMetadata | None]:
        meta = self._txns.get(transactional_id)
        if meta is None:
            return ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, None
        if producer_id != meta.producer_id:
            return ErrorCode.INVALID_PRODUCER_ID_MAPPING, None
        if producer_epoch != meta.producer_epoch:
            return ErrorCode.PRODUCER_FENCED, None
        return ErrorCode.NONE, meta

    def next_deadline_ms(self) -> int | None:
        """When the next ``TxnTick`` has work (a timeout, an expiry, a completion to retry);
        None when nothing is due. Pure."""
        deadlines = []
        for transactional_id, meta in self._txns.items():
            if transactional_id in self._markers_written:
                deadlines.append(meta.update_ms)
            elif meta.state == TxnState.ONGOING:
                deadlines.append(meta.start_ms + meta.timeout_ms + 1)
            elif meta.state in _CLOSED:
                deadlines.append(meta.update_ms + limits.transactional_id_expiration_ms)
        return min(deadlines, default=None)

    def _busy(self, transactional_id: str) -> bool:
        return (
            transactional_id in self._pending_ids
            or transactional_id in self._markers_outstanding
            or transactional_id in self._markers_written
            or any(req.transactional_id == transactional_id for _, req in self._parked)
        )

    # --- events ----------------------------------------------------------------------------

    def handle(self, event: TxnEvent, now_ms: int) -> list[TxnInstruction]:
        """Apply one event; return what the driver must do, in order. Never blocks; raises
        nothing (refusals are error codes in the replies)."""
        self._loaded = True
        if isinstance(event, TxnRequestReceived):
            return self._request(event.token, event.request, now_ms)
        if isinstance(event, TxnLogAppended):
            return self._appended(event.append_id, now_ms)
        if isinstance(event, TxnLogAppendFailed):
            return self._append_failed(event.append_id)
        if isinstance(event, ProducerIdsGranted):
            if self._pending.pop(event.append_id, None) is None:
                return []
            return self._block_granted(event.block_start, event.block_end, now_ms)
        if isinstance(event, MarkersWritten):
            return self._markers_done(event, now_ms)
        assert isinstance(event, TxnTick), event
        return self._tick(now_ms)

    def _request(self, token: Hashable, request: TxnRequest, now_ms: int) -> list[TxnInstruction]:
        if isinstance(request, InitProducerId):
            return self._init_producer_id(token, request, now_ms)
        code, meta = self._lookup(
            request.transactional_id, request.producer_id, request.producer_epoch
        )
        if meta is None:
            return [_reply(token, request, code)]
        if self._busy(request.transactional_id) or meta.state in _PREPARE:
            return [_reply(token, request, ErrorCode.CONCURRENT_TRANSACTIONS)]
        if isinstance(request, EndTxn):
            return self._end_txn(token, request, meta, now_ms)
        if isinstance(request, TxnOffsetCommit):
            target, code = commit_offsets(meta, request, now_ms)
        elif isinstance(request, AddOffsetsToTxn):
            target, code = add_group(meta, request.group_id, now_ms)
        else:
            assert isinstance(request, AddPartitionsToTxn), request
            target, code = add_partitions(meta, request, now_ms)
        if code != ErrorCode.NONE or target == meta:
            return [_reply(token, request, code)]
        return self._append(
            target,
            (_reply(token, request, ErrorCode.NONE),),
            (_reply(token, request, ErrorCode.COORDINATOR_NOT_AVAILABLE),),
        )

    # --- InitProducerId --------------------------------------------------------------------

    def _init_producer_id(
        self, token: Hashable, request: InitProducerId, now_ms: int
    ) -> list[TxnInstruction]:
        def answer(code: ErrorCode) -> list[TxnInstruction]:
            return [_reply(token, request, code)]

        transactional_id = request.transactional_id
        if transactional_id is None:
            producer_id = self._allocate_producer_id()
            if producer_id is None:
                return self._park(token, request)
            ok = InitProducerIdResponse(producer_id=producer_id, producer_epoch=0)
            return [TxnReply(token, ok)]
        if not 1 <= request.transaction_timeout_ms <= limits.transaction_timeout_ms_max:
            return answer(ErrorCode.INVALID_TRANSACTION_TIMEOUT)
        if self._busy(transactional_id):
            return answer(ErrorCode.CONCURRENT_TRANSACTIONS)
        meta = self._txns.get(transactional_id)
        if meta is None:
            if len(self._txns) >= limits.transactional_ids_max:
                return answer(ErrorCode.POLICY_VIOLATION)
            return self._init_new(token, request, now_ms)
        if request.producer_id != -1 and request.producer_id != meta.producer_id:
            return answer(ErrorCode.INVALID_PRODUCER_ID_MAPPING)
        if request.producer_epoch != -1 and request.producer_epoch != meta.producer_epoch:
            return answer(ErrorCode.PRODUCER_FENCED)
        if meta.state == TxnState.ONGOING:  # fence the old instance: abort first, then retry
            abort = self._begin_abort(meta, now_ms)
            return abort + answer(ErrorCode.CONCURRENT_TRANSACTIONS)
        assert meta.state in _CLOSED, meta.state
        producer_id, epoch = meta.producer_id, meta.producer_epoch + 1
        if epoch >= limits.producer_epoch_max:  # keep room for one abort bump
            new_id = self._allocate_producer_id()
            if new_id is None:
                return self._park(token, request)
            producer_id, epoch = new_id, 0
        target = attrs.evolve(
            meta,
            producer_id=producer_id,
            producer_epoch=epoch,
            state=TxnState.EMPTY,
            timeout_ms=request.transaction_timeout_ms,
            update_ms=now_ms,
        )
        return self._append_init(token, request, target)

    def _init_new(
        self, token: Hashable, request: InitProducerId, now_ms: int
    ) -> list[TxnInstruction]:
        assert request.transactional_id is not None
        producer_id = self._allocate_producer_id()
        if producer_id is None:
            return self._park(token, request)
        target = TxnMetadata(
            transactional_id=request.transactional_id,
            producer_id=producer_id,
            producer_epoch=0,
            state=TxnState.EMPTY,
            timeout_ms=request.transaction_timeout_ms,
            update_ms=now_ms,
        )
        return self._append_init(token, request, target)

    def _append_init(
        self, token: Hashable, request: InitProducerId, target: TxnMetadata
    ) -> list[TxnInstruction]:
        ok = InitProducerIdResponse(
            producer_id=target.producer_id, producer_epoch=target.producer_epoch
        )
        failed = _reply(token, request, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return self._append(target, (TxnReply(token, ok),), (failed,))

    def _allocate_producer_id(self) -> int | None:
        if self._next_producer_id >= self._block_end:
            return None
        producer_id = self._next_producer_id
        self._next_producer_id += 1
        return producer_id

    def _park(self, token: Hashable, request: InitProducerId) -> list[TxnInstruction]:
        if len(self._parked) >= limits.producer_id_waiters_max:
            return [_reply(token, request, ErrorCode.COORDINATOR_NOT_AVAILABLE)]
        self._parked.append((token, request))
        if self._block_append is not None:
            return []
        self._block_append = append_id = self._new_append_id()
        self._pending[append_id] = _Pending(None, _NO_REPLIES, _NO_REPLIES)
        if self._controller_ids:
            return [RequestProducerIds(append_id, self._block_size)]
        key, value = encode_producer_id_block(self._block_end + self._block_size)
        return [AppendTxnLog(append_id, key, value)]

    # --- EndTxn and markers ----------------------------------------------------------------

    def _end_txn(
        self, token: Hashable, request: EndTxn, meta: TxnMetadata, now_ms: int
    ) -> list[TxnInstruction]:
        if meta.state != TxnState.ONGOING:
            done = TxnState.COMPLETE_COMMIT if request.committed else TxnState.COMPLETE_ABORT
            code = ErrorCode.NONE if meta.state == done else ErrorCode.INVALID_TXN_STATE
            return [_reply(token, request, code)]
        state = TxnState.PREPARE_COMMIT if request.committed else TxnState.PREPARE_ABORT
        offsets = meta.offsets if request.committed else ()
        target = attrs.evolve(meta, state=state, update_ms=now_ms, offsets=offsets)
        return self._append(
            target,
            (_reply(token, request, ErrorCode.NONE),),
            (_reply(token, request, ErrorCode.COORDINATOR_NOT_AVAILABLE),),
        )

    def _begin_abort(self, meta: TxnMetadata, now_ms: int) -> list[TxnInstruction]:
        """Abort an Ongoing transaction on the coordinator's own initiative, bumping the epoch
        so the old producer is fenced everywhere."""
        assert meta.state == TxnState.ONGOING and not self._busy(meta.transactional_id)
        assert meta.producer_epoch < limits.producer_epoch_max
        target = attrs.evolve(
            meta,
            state=TxnState.PREPARE_ABORT,
            producer_epoch=meta.producer_epoch + 1,
            offsets=(),
            update_ms=now_ms,
        )
        return self._append(target, _NO_REPLIES, _NO_REPLIES)

    def _write_markers(self, meta: TxnMetadata) -> WriteMarkers:
        assert meta.state in _PREPARE
        self._markers_outstanding.add(meta.transactional_id)
        return WriteMarkers(
            transactional_id=meta.transactional_id,
            producer_id=meta.producer_id,
            producer_epoch=meta.producer_epoch,
            committed=meta.state == TxnState.PREPARE_COMMIT,
            partitions=tuple(sorted(meta.partitions)),
            offsets=meta.offsets,
        )

    def _markers_done(self, event: MarkersWritten, now_ms: int) -> list[TxnInstruction]:
        meta = self._txns.get(event.transactional_id)
        if meta is None or event.transactional_id not in self._markers_outstanding:
            return []  # stale: not what we asked for
        expected = TxnState.PREPARE_COMMIT if event.committed else TxnState.PREPARE_ABORT
        if (meta.state, meta.producer_id, meta.producer_epoch) != (
            expected,
            event.producer_id,
            event.producer_epoch,
        ):
            return []
        self._markers_outstanding.discard(event.transactional_id)
        self._markers_written.add(event.transactional_id)
        return self._complete(meta, now_ms)

    def _complete(self, meta: TxnMetadata, now_ms: int) -> list[TxnInstruction]:
        state = (
            TxnState.COMPLETE_COMMIT
            if meta.state == TxnState.PREPARE_COMMIT
            else TxnState.COMPLETE_ABORT
        )
        target = attrs.evolve(
            meta,
            state=state,
            start_ms=-1,
            update_ms=now_ms,
            partitions=frozenset(),
            groups=frozenset(),
            offsets=(),
        )
        return self._append(target, _NO_REPLIES, _NO_REPLIES)

    # --- appends ---------------------------------------------------------------------------

    def _new_append_id(self) -> int:
        append_id = self._next_append_id
        self._next_append_id += 1
        return append_id

    def _append(
        self,
        target: TxnMetadata,
        replies: tuple[TxnReply, ...],
        failure_replies: tuple[TxnReply, ...],
    ) -> list[TxnInstruction]:
        transactional_id = target.transactional_id
        assert transactional_id not in self._pending_ids
        append_id = self._new_append_id()
        self._pending[append_id] = _Pending(target, replies, failure_replies)
        self._pending_ids[transactional_id] = append_id
        if target.state == TxnState.DEAD:
            key, value = encode_txn_tombstone(transactional_id)
            return [AppendTxnLog(append_id, key, value)]
        key, data = encode_txn_metadata(target)
        return [AppendTxnLog(append_id, key, data)]

    def _appended(self, append_id: int, now_ms: int) -> list[TxnInstruction]:
        pending = self._pending.pop(append_id, None)
        if pending is None:
            return []
        target = pending.target
        if target is None:
            return self._block_durable(now_ms)
        transactional_id = target.transactional_id
        del self._pending_ids[transactional_id]
        instructions: list[TxnInstruction] = list(pending.replies)
        if target.state == TxnState.DEAD:
            del self._txns[transactional_id]
            return instructions
        self._txns[transactional_id] = target
        if target.state in _PREPARE:
            instructions.append(self._write_markers(target))
        elif target.state in (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT):
            self._markers_written.discard(transactional_id)
        return instructions

    def _block_durable(self, now_ms: int) -> list[TxnInstruction]:
        return self._block_granted(self._block_end, self._block_end + self._block_size, now_ms)

    def _block_granted(self, start: int, end: int, now_ms: int) -> list[TxnInstruction]:
        """The ids ``[start, end)`` are this coordinator's: answer the parked requests."""
        assert self._next_producer_id >= self._block_end, "a block granted while one lasts"
        self._block_append = None
        self._next_producer_id, self._block_end = start, end
        parked = list(self._parked)
        self._parked.clear()
        instructions: list[TxnInstruction] = []
        for token, request in parked:
            instructions += self._init_producer_id(token, request, now_ms)
        return instructions

    def _append_failed(self, append_id: int) -> list[TxnInstruction]:
        pending = self._pending.pop(append_id, None)
        if pending is None:
            return []
        if pending.target is None:
            self._block_append = None
            parked = list(self._parked)
            self._parked.clear()
            code = ErrorCode.COORDINATOR_NOT_AVAILABLE
            return [_reply(waiting, request, code) for waiting, request in parked]
        del self._pending_ids[pending.target.transactional_id]
        return list(pending.failure_replies)

    # --- time ------------------------------------------------------------------------------

    def _tick(self, now_ms: int) -> list[TxnInstruction]:
        instructions: list[TxnInstruction] = []
        for transactional_id, meta in list(self._txns.items()):
            if transactional_id in self._pending_ids:
                continue
            if transactional_id in self._markers_written:
                instructions += self._complete(meta, now_ms)  # an earlier append failed
            elif self._busy(transactional_id):
                continue
            elif meta.state == TxnState.ONGOING and now_ms - meta.start_ms > meta.timeout_ms:
                instructions += self._begin_abort(meta, now_ms)
            elif (
                meta.state in _CLOSED
                and now_ms - meta.update_ms >= limits.transactional_id_expiration_ms
            ):
                dead = attrs.evolve(meta, state=TxnState.DEAD, update_ms=now_ms)
                instructions += self._append(dead, _NO_REPLIES, _NO_REPLIES)
        return instructions

    # --- invariants and statistics ---------------------------------------------------------

    def check_invariants(self) -> None:
        """Assert every invariant of the coordinator's state (tests and the simulator)."""
        owners: dict[int, str] = {}
        for transactional_id, meta in self._txns.items():
            assert meta.transactional_id == transactional_id
            assert meta.problem() is None, meta.problem()
            assert meta.state != TxnState.DEAD
            assert FIRST_PRODUCER_ID <= meta.producer_id
            if not self._controller_ids:  # (the controller's blocks come in any order)
                assert meta.producer_id < self._next_producer_id
            assert meta.producer_id not in owners, (meta.producer_id, owners)
            owners[meta.producer_id] = transactional_id
            in_doubt = transactional_id in self._markers_outstanding
            done = transactional_id in self._markers_written
            assert not (in_doubt and done)
            assert (meta.state in _PREPARE) == (in_doubt or done), (meta.state, in_doubt, done)
        assert self._next_producer_id <= self._block_end
        for transactional_id, append_id in self._pending_ids.items():
            target = self._pending[append_id].target
            assert target is not None and target.transactional_id == transactional_id
        assert len(self._pending) == len(self._pending_ids) + (self._block_append is not None)
        assert (self._block_append is not None) == bool(self._parked)
        assert len(self._parked) <= limits.producer_id_waiters_max
        assert len(self._txns) <= limits.transactional_ids_max

    def statistics(self) -> dict[str, int]:
        """Counts for metrics: transactional ids per state, outstanding work, producer ids."""
        stats = {f"state_{state.name.lower()}": 0 for state in TxnState}
        for meta in self._txns.values():
            stats[f"state_{meta.state.name.lower()}"] += 1
        stats.update(
            transactional_ids=len(self._txns),
            appends_pending=len(self._pending),
            markers_outstanding=len(self._markers_outstanding),
            init_producer_id_parked=len(self._parked),
            next_producer_id=self._next_producer_id,
            producer_id_block_end=self._block_end,
        )
        return stats
