"""Producer state of one partition: sequence checks for idempotence, open transactions, the LSO.

Theory of operation
-------------------
One ``ProducerStateManager`` per partition log (so the state is keyed by topic *and*
partition, unlike Rivven's). For every producer id that wrote to the partition it keeps the
epoch, the last five batches' ``(first_seq, last_seq, first_offset, last_offset,
timestamp_ms)`` and the first offset of the producer's open transaction, if any. The log is the
source of truth: the manager is rebuilt on restart by feeding it every batch header in log
order (``load_batch``), starting from a snapshot (``snapshot``/``restore``) when one exists.

The broker's produce path per batch, with no checkpoint in between (a partition's appends are
serialised, and another batch of the same producer must not slip between check and update)::

    verdict = state.check(header)            # BEFORE the append, pure
    if verdict.duplicate:   answer verdict.duplicate's offsets with duplicate=true, write nothing
    elif verdict.error_code: answer the code, write nothing
    else: base = log.append(batch); state.update(header, base)

``check`` follows KIP-98 and the issue, in this order:

- no producer id (-1): nothing to check (a transactional batch without one is INVALID_REQUEST);
  a control batch from a client is INVALID_REQUEST (markers come from the coordinator only);
- unknown producer: ``base_sequence`` must be 0, else UNKNOWN_PRODUCER_ID (the partition lost
  or never had its state; the producer must re-initialise);
- epoch older than the partition's: PRODUCER_FENCED (the issue's choice; Kafka 2.7+ answers
  produce with INVALID_PRODUCER_EPOCH instead, keeping PRODUCER_FENCED for the coordinator);
- same epoch and ``(first_seq, last_seq)`` equal to one of the last five batches: a duplicate,
  answered with that batch's original offsets;
- a write while the producer has a transaction open that is not a transactional write of the
  same epoch: INVALID_TXN_STATE (the open transaction must end with a marker first);
- newer epoch: must start at sequence 0, else OUT_OF_ORDER_SEQUENCE;
- same epoch: ``base_sequence`` must be last_seq + 1 (0 when the epoch has no batch here yet);
  a batch lying wholly behind the last sequence but not among the remembered five is
  DUPLICATE_SEQUENCE (it was written, its offsets are forgotten; Kafka's clients treat this as
  success without offsets), anything else OUT_OF_ORDER_SEQUENCE.

Held updates: the produce lane stages a pass's appends before writing them
(``storage/staged_appends.py``), recording each batch here at once so the next batch of the
same producer is checked against it; ``hold`` remembers the state first, ``undo`` returns to
it when the write fails, ``release`` keeps the updates.

Sequences are i32 and wrap from 2^31-1 to 0 as in Kafka: the sequence of record ``i`` of a
batch is ``(base_sequence + i) mod 2^31``.

Transactions. A transactional batch opens the producer's transaction at its base offset if none
is open; a COMMIT or ABORT control batch (appended by the coordinator's driver after
``check_marker``) closes it, moves the producer to the marker's epoch when that is newer (the
coordinator bumps the epoch when it aborts on timeout or fences a zombie, so late writes of
the old epoch are refused here too) and returns a ``CompletedTxn``; an aborted one with data
becomes an entry of the partition's aborted-transaction index (``storage/txn_index.py``). The
last stable offset is the first offset of the oldest open transaction, capped by the high
watermark: ``read_committed`` readers never read at or past it.

Snapshot format (``snapshot()``), all integers big-endian::

    offset size field
         0    4 magic    b"RVPS"
         4    2 version  u16, 1
         6    4 crc      u32, CRC32C of the body
        10    - body     msgpack [end_offset, [[producer_id, epoch, txn_first_offset,
                         last_offset, last_timestamp_ms, [[first_seq, last_seq, first_offset,
                         last_offset, timestamp_ms], ...]], ...]]

``txn_first_offset`` is -1 when no transaction is open; ``end_offset`` is the log offset the
snapshot covers up to (exclusive): replay starts there. A damaged snapshot raises
``CorruptSnapshotError``; the remedy is to ignore it and replay from the log start.

Pure: no I/O, no clocks (``now_ms`` is an argument).
"""

from __future__ import annotations

import struct
from collections import deque
from typing import NamedTuple

import crc32c as _crc32c
import msgpack

from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.records.control import ControlType
from rivven_broker.records.header import ATTR_CONTROL, BatchHeader
from rivven_broker.storage.txn_index import AbortedTxn

__all__ = [
    "SEQUENCE_MAX",
    "NO_OFFSET",
    "increment_sequence",
    "BatchMetadata",
    "ProducerInfo",
    "Verdict",
    "CompletedTxn",
    "CorruptSnapshotError",
    "ProducerStateManager",
]

SEQUENCE_MAX = 2**31 - 1
_SEQUENCE_SPACE = 2**31
_HALF_SPACE = 2**30
NO_OFFSET = -1
_SNAPSHOT_MAGIC = b"RVPS"
_SNAPSHOT_VERSION = 1
_SNAPSHOT_HEADER = struct.Struct(">4sHI")


def increment_sequence(sequence: int, delta: int) -> int:
    """``sequence + delta`` in the i32 sequence space, wrapping from 2^31-1 to 0."""
    assert 0 <= sequence <= SEQUENCE_MAX and delta >= 0
    return (sequence + delta) % _SEQUENCE_SPACE


def _behind(sequence: int, last: int) -> int:
    """How far ``sequence`` lies at or behind ``last`` (mod 2^31)."""
    return (last - sequence) % _SEQUENCE_SPACE


class BatchMetadata(NamedTuple):
    """One remembered batch of a producer in this partition."""

    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp_ms: int


class ProducerInfo(NamedTuple):
    """A read-only view of one producer's state (for tests, tools and statistics)."""

    epoch: int
    batches: tuple[BatchMetadata, ...]
    txn_first_offset: int
    last_offset: int
    last_timestamp_ms: int


class Verdict(NamedTuple):
    """What ``check`` decided. Append only when ``should_append``."""

    error_code: ErrorCode = ErrorCode.NONE
    #: Set for a duplicate: the original batch, whose offsets are the answer.
    duplicate: BatchMetadata | None = None
    message: str = ""

    @property
    def should_append(self) -> bool:
        return self.error_code == ErrorCode.NONE and self.duplicate is None


_APPEND = Verdict()


class CompletedTxn(NamedTuple):
    """A transaction a control batch ended in this partition."""

    producer_id: int
    producer_epoch: int
    first_offset: int  # first data offset, or the marker's offset when it wrote no data here
    last_offset: int  # the marker's offset
    committed: bool
    #: min(first offset of the transactions still open, marker offset + 1) after this one.
    last_stable_offset: int
    had_data: bool

    def aborted_entry(self) -> AbortedTxn | None:
        """The aborted-transaction index entry this completion needs, if any."""
        if self.committed or not self.had_data:
            return None
        return AbortedTxn(
            self.producer_id, self.first_offset, self.last_offset, self.last_stable_offset
        )


class CorruptSnapshotError(Exception):
    """A producer-state snapshot is damaged or of an unknown version; replay the log instead."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"producer state snapshot: {reason}")
        self.reason = reason


class _Producer:
    """Mutable state of one producer id in this partition."""

    __slots__ = ("epoch", "batches", "txn_first_offset", "last_offset", "last_timestamp_ms")

    def __init__(self, epoch: int, batches_retained: int) -> None:
        self.epoch = epoch
        self.batches: deque[BatchMetadata] = deque(maxlen=batches_retained)
        self.txn_first_offset = NO_OFFSET
        self.last_offset = NO_OFFSET
        self.last_timestamp_ms = -1

    def find_duplicate(self, first_seq: int, last_seq: int) -> BatchMetadata | None:
        for batch in self.batches:
            if batch.first_seq == first_seq and batch.last_seq == last_seq:
                return batch
        return None

    def copy(self) -> _Producer:
        twin = _Producer(self.epoch, self.batches.maxlen or 1)
        twin.batches.extend(self.batches)
        twin.txn_first_offset = self.txn_first_offset
        twin.last_offset = self.last_offset
        twin.last_timestamp_ms = self.last_timestamp_ms
        return twin

    def info(self) -> ProducerInfo:
        return ProducerInfo(
            self.epoch,
            tuple(self.batches),
            self.txn_first_offset,
            self.last_offset,
            self.last_timestamp_ms,
        )


class _Held(NamedTuple):
    end_offset: int
    #: producer id -> (its entry before the first held update, or None when it was new;
    #: the first offset of its open transaction then, or None)
    producers: dict[int, tuple[_Producer | None, int | None]]


def _require_ints(*values: object) -> None:
    if any(type(value) is not int for value in values):
        raise TypeError("expected integers")


def _refuse(code: ErrorCode, message: str) -> Verdict:
    return Verdict(code, None, message)


class ProducerStateManager:
    """Idempotence and transaction state of one partition. See the module docstring."""

    def __init__(
        self,
        end_offset: int = 0,
        *,
        batches_retained: int = limits.producer_batches_retained,
    ) -> None:
        assert end_offset >= 0 and batches_retained >= 1
        self._batches_retained = batches_retained
        self._producers: dict[int, _Producer] = {}
        self._ongoing: dict[int, int] = {}  # producer id -> first offset of its open txn
        self._end_offset = end_offset
        self._held: _Held | None = None  # how to undo the updates since ``hold``

    # --- queries -------------------------------------------------------------------------

    @property
    def end_offset(self) -> int:
        """The log offset the state covers up to (exclusive): the next batch's base offset."""
        return self._end_offset

    def producers(self) -> dict[int, ProducerInfo]:
        """Every known producer's state, by producer id."""
        return {pid: entry.info() for pid, entry in self._producers.items()}

    def producer_epoch(self, producer_id: int) -> int | None:
        """The partition's current epoch of ``producer_id``, or None when unknown."""
        entry = self._producers.get(producer_id)
        return None if entry is None else entry.epoch

    def ongoing_transactions(self) -> dict[int, int]:
        """Producer id -> first offset of its open transaction."""
        return dict(self._ongoing)

    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest open transaction, or None when none is open."""
        return min(self._ongoing.values()) if self._ongoing else None

    def last_stable_offset(self, high_watermark: int) -> int:
        """min(first offset of the open transactions, ``high_watermark``): read_committed
        readers see only offsets below it."""
        first = self.first_unstable_offset()
        return high_watermark if first is None else min(first, high_watermark)

    # --- checks (pure) -------------------------------------------------------------------

    def check(self, header: BatchHeader) -> Verdict:
        """Decide what to do with a client's batch BEFORE appending it. Pure, never blocks,
        never raises: refusals are ``Verdict.error_code`` (see the module docstring)."""
        if header.attributes & ATTR_CONTROL:  # (``is_control``, without its call)
            return _refuse(ErrorCode.INVALID_REQUEST, "clients may not write control batches")
        producer_id = header.producer_id
        if producer_id < 0:
            if header.is_transactional:
                return _refuse(ErrorCode.INVALID_REQUEST, "transactional batch without producer id")
            return _APPEND
        epoch, first_seq = header.producer_epoch, header.base_sequence
        if epoch < 0 or not 0 <= first_seq <= SEQUENCE_MAX:
            return _refuse(ErrorCode.INVALID_REQUEST, "idempotent batch without epoch or sequence")
        entry = self._producers.get(producer_id)
        if entry is None:
            if first_seq != 0:
                return _refuse(
                    ErrorCode.UNKNOWN_PRODUCER_ID,
                    f"no state for producer {producer_id}; its first sequence was {first_seq}",
                )
            return _APPEND
        if epoch < entry.epoch:
            return _refuse(
                ErrorCode.PRODUCER_FENCED,
                f"producer {producer_id} epoch {epoch} is older than {entry.epoch}",
            )
        last_seq = increment_sequence(first_seq, header.last_offset_delta)
        if epoch == entry.epoch:
            original = entry.find_duplicate(first_seq, last_seq)
            if original is not None:
                return Verdict(ErrorCode.NONE, original, "duplicate of an earlier batch")
        if entry.txn_first_offset != NO_OFFSET and (
            not header.is_transactional or epoch != entry.epoch
        ):
            return _refuse(
                ErrorCode.INVALID_TXN_STATE,
                f"producer {producer_id} has a transaction open since {entry.txn_first_offset}",
            )
        if epoch > entry.epoch or not entry.batches:
            if first_seq != 0:
                return _refuse(
                    ErrorCode.OUT_OF_ORDER_SEQUENCE,
                    f"epoch {epoch} of producer {producer_id} must start at sequence 0, "
                    f"not {first_seq}",
                )
            return _APPEND
        return self._check_sequence(producer_id, entry, first_seq, last_seq)

    def _check_sequence(
        self, producer_id: int, entry: _Producer, first_seq: int, last_seq: int
    ) -> Verdict:
        current = entry.batches[-1].last_seq
        expected = increment_sequence(current, 1)
        if first_seq == expected:
            return _APPEND
        behind_first, behind_last = _behind(first_seq, current), _behind(last_seq, current)
        if behind_first < _HALF_SPACE and behind_last <= behind_first:
            return _refuse(
                ErrorCode.DUPLICATE_SEQUENCE,
                f"sequences {first_seq}..{last_seq} of producer {producer_id} were written "
                f"before the last {len(entry.batches)} batches; their offsets are not known",
            )
        return _refuse(
            ErrorCode.OUT_OF_ORDER_SEQUENCE,
            f"producer {producer_id}: expected sequence {expected}, got {first_seq}",
        )

    def check_marker(self, producer_id: int, producer_epoch: int) -> Verdict:
        """Decide whether a coordinator's COMMIT/ABORT marker may be appended. Pure.
        PRODUCER_FENCED when the partition already knows a newer epoch."""
        assert producer_id >= 0 and producer_epoch >= 0
        entry = self._producers.get(producer_id)
        if entry is not None and producer_epoch < entry.epoch:
            return _refuse(
                ErrorCode.PRODUCER_FENCED,
                f"marker epoch {producer_epoch} is older than {entry.epoch}",
            )
        return _APPEND

    # --- changes -------------------------------------------------------------------------

    def update(
        self, header: BatchHeader, base_offset: int, control: ControlType | None = None
    ) -> CompletedTxn | None:
        """Record a batch just appended at ``base_offset`` (after ``check``/``check_marker``
        allowed it). ``control`` is the marker type of a control batch. Returns the
        transaction a marker completed. Never blocks."""
        if header.attributes & ATTR_CONTROL:
            assert self.check_marker(header.producer_id, header.producer_epoch).should_append
        else:
            assert self.check(header).should_append, self.check(header)
        return self._apply(header, base_offset, control)

    def load_batch(
        self, header: BatchHeader, control: ControlType | None = None
    ) -> CompletedTxn | None:
        """Replay one batch read from the log (in log order, from ``end_offset`` on).
        ``control`` is the marker type of a control batch. Never blocks."""
        return self._apply(header, header.base_offset, control)

    def _apply(
        self, header: BatchHeader, base_offset: int, control: ControlType | None
    ) -> CompletedTxn | None:
        assert bool(header.attributes & ATTR_CONTROL) == (control is not None)
        assert base_offset >= self._end_offset, (base_offset, self._end_offset)
        last_offset = base_offset + header.last_offset_delta
        self._end_offset = last_offset + 1
        producer_id = header.producer_id
        if producer_id < 0:
            return None
        entry = self._producers.get(producer_id)
        held = self._held
        if held is not None and producer_id not in held.producers:
            held.producers[producer_id] = (
                None if entry is None else entry.copy(), self._ongoing.get(producer_id))
        if entry is None:
            entry = self._producers[producer_id] = _Producer(
                header.producer_epoch, self._batches_retained
            )
        if header.producer_epoch > entry.epoch:
            entry.epoch = header.producer_epoch
            entry.batches.clear()
        entry.last_offset = last_offset
        entry.last_timestamp_ms = max(entry.last_timestamp_ms, header.max_timestamp)
        if control is not None:
            return self._complete(producer_id, entry, last_offset, control)
        first_seq = header.base_sequence
        last_seq = increment_sequence(first_seq, header.last_offset_delta)
        entry.batches.append(
            BatchMetadata(first_seq, last_seq, base_offset, last_offset, header.max_timestamp)
        )
        if header.is_transactional and entry.txn_first_offset == NO_OFFSET:
            entry.txn_first_offset = base_offset
            self._ongoing[producer_id] = base_offset
        return None

    def _complete(
        self, producer_id: int, entry: _Producer, marker_offset: int, control: ControlType
    ) -> CompletedTxn:
        first = entry.txn_first_offset
        entry.txn_first_offset = NO_OFFSET
        self._ongoing.pop(producer_id, None)
        still_open = self.first_unstable_offset()
        stable = marker_offset + 1 if still_open is None else min(still_open, marker_offset + 1)
        return CompletedTxn(
            producer_id=producer_id,
            producer_epoch=entry.epoch,
            first_offset=marker_offset if first == NO_OFFSET else first,
            last_offset=marker_offset,
            committed=control == ControlType.COMMIT,
            last_stable_offset=stable,
            had_data=first != NO_OFFSET,
        )

    # --- held updates (staged appends: storage/staged_appends.py) ------------------------

    def hold(self) -> None:
        """Remember the state as it is, so that ``undo`` can return to it (the updates that
        follow are of batches not written yet); ``release`` forgets it. Costs a copy of each
        producer the held updates touch. Never blocks."""
        assert self._held is None
        self._held = _Held(self._end_offset, {})

    def release(self) -> None:
        """The held updates stand (their batches were written)."""
        assert self._held is not None
        self._held = None

    def undo(self) -> None:
        """Return to the state ``hold`` remembered (the batches were not written)."""
        held, self._held = self._held, None
        assert held is not None
        for producer_id, (entry, txn_first_offset) in held.producers.items():
            if entry is None:
                del self._producers[producer_id]
            else:
                self._producers[producer_id] = entry
            if txn_first_offset is None:
                self._ongoing.pop(producer_id, None)
            else:
                self._ongoing[producer_id] = txn_first_offset
        self._end_offset = held.end_offset

    def advance_end_offset(self, end_offset: int) -> None:
        """The log goes on at ``end_offset`` with no batch in between (the log's own end when
        its last batches were removed, e.g. by compaction). Never blocks."""
        assert end_offset >= self._end_offset, (end_offset, self._end_offset)
        self._end_offset = end_offset

    def remove_expired(
        self, now_ms: int, expiration_ms: int = limits.producer_id_expiration_ms
    ) -> list[int]:
        """Forget producers with no open transaction whose last write is older than
        ``expiration_ms``; return their ids. Never blocks."""
        expired = [
            pid
            for pid, entry in self._producers.items()
            if entry.txn_first_offset == NO_OFFSET
            and entry.last_timestamp_ms + expiration_ms <= now_ms
        ]
        for pid in expired:
            del self._producers[pid]
        return expired

    def truncate_head(self, log_start_offset: int) -> list[int]:
        """Forget producers whose every write lies below ``log_start_offset`` (retention or
        DeleteRecords removed them) and that have no open transaction. Never blocks."""
        gone = [
            pid
            for pid, entry in self._producers.items()
            if entry.txn_first_offset == NO_OFFSET and entry.last_offset < log_start_offset
        ]
        for pid in gone:
            del self._producers[pid]
        self._end_offset = max(self._end_offset, log_start_offset)
        return gone

    # --- snapshots -----------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """The snapshot bytes of the current state (format in the module docstring). Pure."""
        producers = [
            [
                pid,
                entry.epoch,
                entry.txn_first_offset,
                entry.last_offset,
                entry.last_timestamp_ms,
                [list(batch) for batch in entry.batches],
            ]
            for pid, entry in sorted(self._producers.items())
        ]
        body = msgpack.packb([self._end_offset, producers])
        header = _SNAPSHOT_HEADER.pack(_SNAPSHOT_MAGIC, _SNAPSHOT_VERSION, _crc32c.crc32c(body))
        return header + body

    @classmethod
    def restore(
        cls, data: bytes, *, batches_retained: int = limits.producer_batches_retained
    ) -> ProducerStateManager:
        """A manager holding the state ``snapshot()`` wrote; replay the log from its
        ``end_offset`` next. Pure.

        Raises:
            CorruptSnapshotError: wrong magic, version or CRC, or a malformed body.
        """
        if len(data) < _SNAPSHOT_HEADER.size:
            raise CorruptSnapshotError(f"{len(data)} bytes is shorter than the header")
        magic, version, crc = _SNAPSHOT_HEADER.unpack_from(data)
        if magic != _SNAPSHOT_MAGIC:
            raise CorruptSnapshotError(f"bad magic {magic!r}")
        if version != _SNAPSHOT_VERSION:
            raise CorruptSnapshotError(f"unknown version {version}")
        body = memoryview(data)[_SNAPSHOT_HEADER.size :]
        if _crc32c.crc32c(body) != crc:
            raise CorruptSnapshotError("CRC mismatch")
        try:
            end_offset, producers = msgpack.unpackb(body, use_list=True)
            _require_ints(end_offset)
            if end_offset < 0:
                raise ValueError("negative end offset")
            manager = cls(end_offset, batches_retained=batches_retained)
            for pid, epoch, txn_first, last_offset, last_ts, batches in producers:
                _require_ints(pid, epoch, txn_first, last_offset, last_ts)
                for batch in batches:
                    _require_ints(*batch)
                manager._restore_producer(pid, epoch, txn_first, last_offset, last_ts, batches)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise CorruptSnapshotError(f"malformed body: {exc!r:.200}") from None
        problem = manager._problem()
        if problem is not None:
            raise CorruptSnapshotError(problem)
        return manager

    def _restore_producer(
        self,
        pid: int,
        epoch: int,
        txn_first: int,
        last_offset: int,
        last_ts: int,
        batches: list[list[int]],
    ) -> None:
        if pid in self._producers or len(batches) > self._batches_retained:
            raise ValueError(f"producer {pid} repeated or holds too many batches")
        entry = _Producer(epoch, self._batches_retained)
        entry.txn_first_offset = txn_first
        entry.last_offset = last_offset
        entry.last_timestamp_ms = last_ts
        entry.batches.extend(BatchMetadata(*batch) for batch in batches)
        self._producers[pid] = entry
        if txn_first != NO_OFFSET:
            self._ongoing[pid] = txn_first

    # --- invariants and statistics -------------------------------------------------------

    def _problem(self) -> str | None:
        """What breaks an invariant, or None."""
        for pid, entry in self._producers.items():
            if pid < 0 or not 0 <= entry.epoch <= limits.producer_epoch_max:
                return f"producer {pid}: bad id or epoch {entry.epoch}"
            offsets = [o for b in entry.batches for o in (b.first_offset, b.last_offset)]
            if offsets != sorted(offsets) or any(o < 0 for o in offsets):
                return f"producer {pid}: batch offsets out of order"
            if any(not 0 <= s <= SEQUENCE_MAX for b in entry.batches for s in b[:2]):
                return f"producer {pid}: sequence out of range"
            if offsets and offsets[-1] > entry.last_offset:
                return f"producer {pid}: a batch lies past its last offset"
            if entry.last_offset >= self._end_offset:
                return f"producer {pid}: last offset {entry.last_offset} >= end offset"
            open_first = self._ongoing.get(pid, NO_OFFSET)
            if entry.txn_first_offset != open_first:
                return f"producer {pid}: open transaction bookkeeping disagrees"
            if open_first != NO_OFFSET and not 0 <= open_first <= entry.last_offset:
                return f"producer {pid}: open transaction starts at {open_first}"
        if not set(self._ongoing) <= set(self._producers):
            return "an open transaction belongs to no producer"
        return None

    def check_invariants(self) -> None:
        """Assert every invariant of the state (for tests and the simulator)."""
        problem = self._problem()
        assert problem is None, problem

    def statistics(self) -> dict[str, int]:
        """Counts for metrics: producers, open transactions, end offset."""
        first = self.first_unstable_offset()
        return {
            "producers": len(self._producers),
            "ongoing_transactions": len(self._ongoing),
            "end_offset": self._end_offset,
            "first_unstable_offset": -1 if first is None else first,
        }
