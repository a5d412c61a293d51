"""The consumer's fetch state: assignment, positions, prefetch buffer, resets.

Theory of operation
-------------------
For each assigned partition the state keeps two offsets:

- ``position``: the next offset ``poll`` hands to the user;
- ``fetch_offset``: the next offset to ask the broker for. It runs ahead of ``position`` by
  what is buffered, which is what lets the consumer prefetch: as soon as a response for a
  partition arrives, the next Fetch for it can go out while the user still processes the
  previous one (never stop-and-wait).

The buffer is bounded: a partition is fetchable only when it has no fetch in flight and no
completed fetch waiting to be consumed, so at most one response per partition waits (plus the
one being consumed, plus one in flight). Completed fetches keep the raw batch bytes; records are
decoded only by ``decode_completed``, which the driver calls outside its lock.

Every ``seek``, reset or (un)assignment bumps the partition's ``epoch``; a response or a
completed fetch from an older epoch is dropped, so nothing fetched before a ``seek`` is ever
returned after it.

A partition with no position needs a *reset*: the driver asks ``ListOffsets`` for the earliest
(-2) or latest (-1) offset per ``auto_offset_reset`` (or an explicit ``seek_to_beginning`` /
``seek_to_end``) and reports the answer with ``on_reset``. ``OFFSET_OUT_OF_RANGE`` from a Fetch
triggers the same reset, or, with ``auto_offset_reset="none"``, an error that ``poll`` raises.

Isolation: under ``read_committed`` the broker stops at the last stable offset and lists the
aborted transactions overlapping its answer; the completed fetch keeps that list and
``decode_completed`` drops their batches (``aborted_batch_filter``). Control batches (the
transaction markers) never become records under either isolation level.

Pure and single-threaded: drivers serialise access; ``decode_completed`` is a free function.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Iterable, NamedTuple

from rivven_broker.client.errors import (
    CorruptMessageError,
    OffsetOutOfRangeError,
    RivvenError,
    error_for,
)
from rivven_broker.client.types import Record, TopicPartition
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.records.header import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    BatchError,
    BatchHeader,
    iter_batches,
)
from rivven_broker.records.reader import BatchFilter, decode_records

__all__ = [
    "consumer_metrics",
    "EARLIEST",
    "LATEST",
    "CompletedFetch",
    "FetchPlan",
    "FetchState",
    "aborted_batch_filter",
    "decode_completed",
    "Corruption",
]

EARLIEST = -2
LATEST = -1
_RESET_TIMESTAMPS = {"earliest": EARLIEST, "latest": LATEST}


class CompletedFetch(NamedTuple):
    """One partition's data from one Fetch response, not yet handed to the user."""

    tp: TopicPartition
    epoch: int
    fetch_offset: int  # the position this data starts at (records below it are dropped)
    records: bytes
    next_offset: int  # the position after consuming all of it
    high_watermark: int
    #: read_committed: ``(producer_id, first_offset)`` of aborted transactions in the data.
    aborted: tuple[tuple[int, int], ...] = ()


class FetchPlan(NamedTuple):
    """The partitions one Fetch request asks one node for, with their epochs and offsets."""

    node_id: int
    partitions: list[tuple[TopicPartition, int, int]]  # (tp, epoch, fetch_offset)


class _Partition:
    __slots__ = (
        "position", "fetch_offset", "epoch", "reset_to", "paused", "in_flight", "buffered",
        "high_watermark", "error", "retry_at_ms",
    )

    def __init__(self) -> None:
        self.position: int | None = None
        self.fetch_offset: int | None = None
        self.epoch = 0
        self.reset_to: int | None = None  # EARLIEST/LATEST while a reset is wanted
        self.paused = False
        self.in_flight = False
        self.buffered = False
        self.high_watermark = -1
        self.error: RivvenError | None = None
        self.retry_at_ms = 0  # after a retriable partition error: not fetched before this


class FetchState:
    """Assigned partitions and their positions. Not thread-safe; never blocks."""

    def __init__(self, *, auto_offset_reset: str = "latest", retry_backoff_ms: int = 100) -> None:
        if auto_offset_reset not in ("earliest", "latest", "none"):
            raise ValueError("auto_offset_reset must be 'earliest', 'latest' or 'none'")
        assert retry_backoff_ms >= 0
        self.auto_offset_reset = auto_offset_reset
        self.retry_backoff_ms = retry_backoff_ms
        self._partitions: dict[TopicPartition, _Partition] = {}
        self._completed: deque[CompletedFetch] = deque()
        self._epoch = 0  # global counter, so epochs never repeat across reassignments

    # --- assignment and positions (the user's thread) ------------------------------------
    def assign(self, tps: Iterable[TopicPartition]) -> None:
        """Replace the assignment. Kept partitions keep their positions."""
        wanted = list(dict.fromkeys(TopicPartition(tp[0], tp[1]) for tp in tps))
        for tp in list(self._partitions):
            if tp not in wanted:
                del self._partitions[tp]
        for tp in wanted:
            if tp not in self._partitions:
                state = _Partition()
                state.epoch = self._next_epoch()
                self._partitions[tp] = state
        self._completed = deque(c for c in self._completed if c.tp in self._partitions)

    def assign_and_seek(
        self, tps: Iterable[TopicPartition], seeks: dict[TopicPartition, int]
    ) -> list[TopicPartition]:
        """Replace the assignment, then seek the assigned partitions ``seeks`` names (a group
        rebalance: committed offsets). Returns the new assignment, sorted: a group's
        assignment arrives as a set, whose order must not decide the order of fetches and
        dials (it changes with the process' string hashing)."""
        wanted = sorted(tps)
        self.assign(wanted)
        for tp, offset in seeks.items():
            if tp in self._partitions:
                self.seek(tp, offset)
        return wanted

    def positions(self, tps: Iterable[TopicPartition] | None = None) -> dict[TopicPartition, int]:
        """Known positions of the assigned partitions (all, or those of ``tps``)."""
        out = {}
        for tp in self._partitions if tps is None else tps:
            state = self._partitions.get(tp)
            if state is not None and state.position is not None:
                out[tp] = state.position
        return out

    def assignment(self) -> set[TopicPartition]:
        return set(self._partitions)

    def topics(self) -> set[str]:
        return {tp.topic for tp in self._partitions}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Make ``offset`` the next position of ``tp``. Raises ``KeyError`` if not assigned."""
        if offset < 0:
            raise ValueError("offset must be >= 0")
        state = self._require(tp)
        self._restart(tp, state)
        state.position = state.fetch_offset = offset

    def request_reset(self, tp: TopicPartition, timestamp: int) -> None:
        """Reposition ``tp`` to EARLIEST or LATEST (resolved by the driver via ListOffsets)."""
        assert timestamp in (EARLIEST, LATEST)
        state = self._require(tp)
        self._restart(tp, state)
        state.position = state.fetch_offset = None
        state.reset_to = timestamp

    def position(self, tp: TopicPartition) -> int | None:
        """The next offset ``poll`` returns for ``tp``; None until a reset resolves."""
        return self._require(tp).position

    def pause(self, tps: Iterable[TopicPartition]) -> None:
        for tp in tps:
            self._require(tp).paused = True

    def resume(self, tps: Iterable[TopicPartition]) -> None:
        for tp in tps:
            self._require(tp).paused = False

    def paused(self) -> set[TopicPartition]:
        return {tp for tp, s in self._partitions.items() if s.paused}

    def high_watermark(self, tp: TopicPartition) -> int:
        return self._require(tp).high_watermark

    def _require(self, tp: TopicPartition) -> _Partition:
        state = self._partitions.get(tp)
        if state is None:
            raise KeyError(f"{tp} is not assigned to this consumer")
        return state

    def _next_epoch(self) -> int:
        self._epoch += 1
        return self._epoch

    def _restart(self, tp: TopicPartition, state: _Partition) -> None:
        state.epoch = self._next_epoch()
        state.in_flight = False  # a response to the old epoch will be dropped
        state.buffered = False
        state.error = None
        state.reset_to = None
        state.retry_at_ms = 0
        self._completed = deque(c for c in self._completed if c.tp != tp)

    # --- resets (the driver) -------------------------------------------------------------
    def resets_needed(self, now_ms: int) -> list[tuple[TopicPartition, int, int]]:
        """``(tp, epoch, timestamp)`` for partitions without a position (and no error)."""
        out = []
        for tp, state in self._partitions.items():
            if state.position is not None or state.error is not None:
                continue
            if state.retry_at_ms > now_ms:
                continue
            if state.reset_to is None:
                if self.auto_offset_reset == "none":
                    state.error = RivvenError(
                        f"{tp} has no position and auto_offset_reset is 'none'; seek first",
                        code="NO_OFFSET",
                    )
                    continue
                state.reset_to = _RESET_TIMESTAMPS[self.auto_offset_reset]
            out.append((tp, state.epoch, state.reset_to))
        return out

    def on_reset(self, tp: TopicPartition, epoch: int, offset: int) -> None:
        """The driver resolved a reset: ``offset`` is where ``tp`` starts (stale epochs ignored)."""
        state = self._partitions.get(tp)
        if state is None or state.epoch != epoch or state.position is not None:
            return
        state.position = state.fetch_offset = max(offset, 0)
        state.reset_to = None

    def on_reset_failed(
        self, tp: TopicPartition, epoch: int, error: RivvenError, now_ms: int
    ) -> None:
        """A reset's ListOffsets failed: retry after the backoff, or record a fatal error."""
        state = self._partitions.get(tp)
        if state is None or state.epoch != epoch:
            return
        if error.retriable:
            state.retry_at_ms = now_ms + self.retry_backoff_ms
        else:
            state.error = error

    # --- fetching (the driver) -----------------------------------------------------------
    def fetchable(self, now_ms: int) -> list[tuple[TopicPartition, int, int]]:
        """``(tp, epoch, fetch_offset)`` of partitions a Fetch should ask for now."""
        return [
            (tp, s.epoch, s.fetch_offset)
            for tp, s in self._partitions.items()
            if s.fetch_offset is not None
            and not (s.paused or s.in_flight or s.buffered or s.error is not None)
            and s.retry_at_ms <= now_ms
        ]

    def next_retry_ms(self, now_ms: int) -> int | None:
        """When the earliest partition in an error backoff becomes fetchable again."""
        times = [s.retry_at_ms for s in self._partitions.values() if s.retry_at_ms > now_ms]
        return min(times) if times else None

    def plan_fetches(
        self,
        now_ms: int,
        leader_for: Callable[[str, int], int | None],
        node_ready: Callable[[int], bool],
    ) -> tuple[list[FetchPlan], bool]:
        """Group fetchable partitions by leader (ready nodes only); marks them in flight.

        Returns ``(plans, unknown_leader)``: partitions without a known leader are skipped and
        reported so the driver refreshes metadata.
        """
        by_node: dict[int, list[tuple[TopicPartition, int, int]]] = {}
        ready: dict[int, bool] = {}
        unknown_leader = False
        for entry in self.fetchable(now_ms):
            node = leader_for(entry[0].topic, entry[0].partition)
            if node is None:
                unknown_leader = True
                continue
            if node not in ready:
                ready[node] = node_ready(node)
            if not ready[node]:
                continue
            by_node.setdefault(node, []).append(entry)
            self._partitions[entry[0]].in_flight = True
        return [FetchPlan(node, entries) for node, entries in by_node.items()], unknown_leader

    def on_fetch_failed(self, plan: FetchPlan, now_ms: int) -> None:
        """The request failed as a whole (connection lost): its partitions are fetched again
        after the retry backoff."""
        for tp, epoch, _ in plan.partitions:
            self.on_partition_missing(tp, epoch, now_ms)

    def on_partition_missing(self, tp: TopicPartition, epoch: int, now_ms: int) -> None:
        """A response said nothing about ``tp``: fetch it again after the backoff."""
        state = self._partitions.get(tp)
        if state is not None and state.epoch == epoch:
            state.in_flight = False
            state.retry_at_ms = now_ms + self.retry_backoff_ms

    def on_partition_data(
        self,
        tp: TopicPartition,
        epoch: int,
        fetch_offset: int,
        error_code: int,
        high_watermark: int,
        records: bytes,
        now_ms: int,
        aborted: tuple[tuple[int, int], ...] = (),
    ) -> ErrorCode | None:
        """One partition of a Fetch response. Returns the error code when it carried one.

        Data for a stale epoch is dropped. ``OFFSET_OUT_OF_RANGE`` resets the partition (or
        records an error for ``poll`` under ``auto_offset_reset="none"``); other errors leave the
        partition to be fetched again (the driver refreshes metadata if the code asks for it).
        """
        state = self._partitions.get(tp)
        if state is None or state.epoch != epoch:
            return None
        state.in_flight = False
        code = ErrorCode.from_wire(error_code)
        if code != ErrorCode.NONE:
            if code == ErrorCode.OFFSET_OUT_OF_RANGE:
                self._out_of_range(tp, state, fetch_offset)
            elif code == ErrorCode.CORRUPT_MESSAGE:  # retrying reads the same damaged bytes
                state.error = _corrupt_at(tp, fetch_offset, "the broker found it damaged")
            elif not code.retriable:
                state.error = error_for(code, f"fetching {tp} at offset {fetch_offset}")
            else:
                state.retry_at_ms = now_ms + self.retry_backoff_ms
            return code
        state.high_watermark = high_watermark
        next_offset = fetch_offset
        for _, header in iter_batches(records):
            next_offset = max(next_offset, header.base_offset + header.last_offset_delta + 1)
        if next_offset == fetch_offset:
            return None  # nothing whole arrived (an empty long poll): fetch again
        state.fetch_offset = next_offset
        state.buffered = True
        self._completed.append(
            CompletedFetch(tp, epoch, fetch_offset, records, next_offset, high_watermark, aborted)
        )
        return None

    def _out_of_range(self, tp: TopicPartition, state: _Partition, fetch_offset: int) -> None:
        if self.auto_offset_reset == "none":
            state.error = OffsetOutOfRangeError(
                f"offset {fetch_offset} of {tp} is out of range and auto_offset_reset is 'none'"
            )
            return
        self._restart(tp, state)
        state.position = state.fetch_offset = None
        state.reset_to = _RESET_TIMESTAMPS[self.auto_offset_reset]

    # --- consuming (the user's thread) ---------------------------------------------------
    def has_completed(self) -> bool:
        return bool(self._completed)

    def take_completed(self) -> CompletedFetch | None:
        """The next completed fetch of an unpaused partition; that partition becomes fetchable
        again (the prefetch of its next data can start while this one is consumed)."""
        for index, completed in enumerate(self._completed):
            state = self._partitions[completed.tp]
            if not state.paused:
                del self._completed[index]
                state.buffered = False
                return completed
        return None

    def corrupted(self, completed: CompletedFetch, corruption: Corruption) -> CompletedFetch:
        """``completed`` held a damaged batch at ``corruption.offset``: fetching restarts
        there (prefetched data after it is dropped) and the next ``take_error`` is the
        corruption. Returns ``completed`` trimmed to end at the damage, under the partition's
        new epoch, for the driver to hand out what came before it."""
        state = self._partitions.get(completed.tp)
        if state is None or state.epoch != completed.epoch:
            return completed._replace(next_offset=corruption.offset)
        position = state.position
        self._restart(completed.tp, state)
        state.position = position
        state.fetch_offset = corruption.offset
        state.error = corruption.error
        return completed._replace(next_offset=corruption.offset, epoch=state.epoch)

    def advance(self, tp: TopicPartition, epoch: int, position: int) -> bool:
        """Records up to ``position`` were handed out; False when ``tp`` moved meanwhile."""
        state = self._partitions.get(tp)
        if state is None or state.epoch != epoch:
            return False
        assert state.position is None or position >= state.position
        state.position = position
        return True

    def has_error(self) -> bool:
        """Whether ``take_error`` has an error to give. Never blocks."""
        return any(state.error is not None for state in self._partitions.values())

    def take_error(self) -> RivvenError | None:
        """An error ``poll`` should raise. Missing or out-of-range offsets stay until the user
        seeks; other errors are cleared once taken (the partition is fetched again)."""
        for state in self._partitions.values():
            error = state.error
            if error is not None:
                if not (isinstance(error, OffsetOutOfRangeError) or error.code == "NO_OFFSET"):
                    state.error = None
                return error
        return None

    def check_invariants(self) -> None:
        """Assert the invariants (tests and the simulator call this)."""
        for tp, state in self._partitions.items():
            if state.position is None:
                assert state.fetch_offset is None
            else:
                assert state.fetch_offset is not None and state.fetch_offset >= state.position
            assert not (state.in_flight and state.buffered), tp
        seen = set()
        for completed in self._completed:
            state = self._partitions.get(completed.tp)
            assert state is not None and state.epoch == completed.epoch
            assert completed.tp not in seen, "one completed fetch per partition"
            seen.add(completed.tp)
            assert state.buffered


def aborted_batch_filter(aborted: Iterable[tuple[int, int]]) -> BatchFilter:
    """A ``decode_records`` batch filter dropping the batches of aborted transactions.

    ``aborted`` holds ``(producer_id, first_offset)`` from a read_committed Fetch answer. Walking
    the batches in offset order, a producer's transactional batches are dropped from the first
    batch that reaches its ``first_offset`` until that producer's next control batch (its
    ABORT marker); control batches are never records anyway. Constant work per batch.
    """
    pending = sorted(aborted, key=lambda entry: entry[1])
    index = 0
    active: set[int] = set()

    def keep(header: BatchHeader) -> bool:
        nonlocal index
        last_offset = header.base_offset + header.last_offset_delta
        while index < len(pending) and pending[index][1] <= last_offset:
            active.add(pending[index][0])
            index += 1
        if header.attributes & ATTR_CONTROL:
            active.discard(header.producer_id)
            return False
        return not (header.attributes & ATTR_TRANSACTIONAL and header.producer_id in active)

    return keep


def _corrupt_at(tp: TopicPartition, offset: int, why: str) -> CorruptMessageError:
    return CorruptMessageError(
        f"{tp.topic}-{tp.partition}: the record batch at offset {offset} is corrupt ({why}); "
        "every record before it was delivered; seek past it to go on"
    )


def decode_completed(
    completed: CompletedFetch, **decode_options: Any
) -> tuple[list[Record], Corruption | None]:
    """Decode a completed fetch into client ``Record`` tuples (records below its start dropped,
    and, when the answer listed aborted transactions, their batches).

    A batch that fails its CRC or framing check is never skipped: the records before it are
    returned with a ``Corruption`` naming its offset; the driver hands those records out and
    then calls ``FetchState.corrupted`` (the partition stops there and ``poll`` raises
    ``CorruptMessageError``). Never raises for bad data.
    """
    if completed.aborted:
        decode_options["batch_filter"] = aborted_batch_filter(completed.aborted)
    try:
        # Straight into the client's Record: one tuple per record, not two.
        return decode_records(
            completed.records,
            min_offset=completed.fetch_offset,
            record_type=Record,
            prefix=(completed.tp.topic, completed.tp.partition),
            **decode_options,
        ), None
    except BatchError as error:
        offset = getattr(error, "batch_offset", completed.fetch_offset)
        before = getattr(error, "records_before", [])
        return before, Corruption(offset, _corrupt_at(completed.tp, offset, str(error)))


class Corruption(NamedTuple):
    """Where a fetched batch failed its checks, and the error ``poll`` will raise."""

    offset: int
    error: CorruptMessageError


def consumer_metrics(state: FetchState, records_returned: int, polls: int) -> dict[str, dict]:
    """``Consumer.metrics()``: kafka-python's group and metric names for the figures a
    consumer keeps (records handed out, polls, assigned partitions, the largest lag)."""
    lags = []
    for tp in state.assignment():
        position, high = state.position(tp), state.high_watermark(tp)
        if position is not None and high >= 0:
            lags.append(max(high - position, 0))
    return {
        "consumer-fetch-manager-metrics": {
            "records-consumed-total": records_returned,
            "records-lag-max": max(lags, default=0),
        },
        "consumer-metrics": {
            "poll-total": polls,
            "assigned-partitions": len(state.assignment()),
        },
    }

