"""Staged appends: the produce lane's requests of one pass, written with one ``pwritev`` per
partition at the end of the pass instead of one per request.

Theory of operation
-------------------
A one-record append costs a system call and the bookkeeping around it (about 10 us here);
sixteen of them written together cost about 3 us each. The produce lane
(``server/produce_lane.py``) begins many produces in one pass with no checkpoint in between,
so it opens an ``AppendPass`` for the pass and closes it before it answers anything:

- while the pass is open, ``Partition.append_as_leader`` *stages* instead of writing:
  ``PartitionLog.stage`` validates the batches exactly as ``append`` does (a bad batch is
  refused at once, alone), assigns their offsets after what is staged already, and keeps
  their stamps and buffers in the log's ``StagedBatches``; the partition records the headers
  in its producer state (held: ``ProducerStateManager.hold``), so a later batch of the same
  producer in the pass is checked against the staged one (a retry in the same pass is a
  duplicate of it) and enrols itself in the pass;
- ``AppendPass.close`` has every enrolled partition write what it staged
  (``Partition.write_staged``: one ``PartitionLog.write_staged``, one ``pwritev``), in the
  order the partitions were first staged, then mark the log dirty and tell the events once.

Nothing staged is visible before it is written: the log end offset, the high watermark, the
group commit's dirty mark and the replica fetches' wake-up all move only at the write. A
write that fails fails every request staged in that partition in the pass, with the error
one append would have raised (``StagedWrite.error``; the producer state returns to where the
pass found it: ``ProducerStateManager.undo``). A roll due while batches are staged writes
them first (a segment is written by one ``pwritev`` at a time), then rolls and stages on.

The pass is synchronous: the lane opens it, begins requests and closes it with no
checkpoint in between, so no other task ever sees a staged batch (every other appender —
the connection reader, markers, followers — writes at once; ``PartitionLog.append`` asserts
that nothing is staged). Pure bookkeeping; the I/O is the log's.
"""

from __future__ import annotations

from typing import Callable, Protocol

import attrs

__all__ = ["AppendPass", "StagedBatches", "StagedWrite"]


@attrs.define(eq=False)
class StagedWrite:
    """The fate of every request staged in one partition in one pass: ``done`` once the
    pass wrote them, ``error`` set when the write failed (nothing of them was written).
    ``on_written``: called once the write succeeded; ``records`` and ``size``: what the
    broker counts in then (its requests' records and bytes, added as it stages them), never
    for a write that failed."""

    done: bool = False
    error: Exception | None = None
    on_written: list[Callable[[], None]] = attrs.field(factory=list)
    records: int = 0
    size: int = 0

    def written(self) -> None:
        """The write succeeded: mark it done and run ``on_written``."""
        self.done = True
        callbacks, self.on_written = self.on_written, []
        for callback in callbacks:
            callback()


@attrs.define(eq=False, slots=True)
class StagedBatches:
    """Batches staged in a log's active segment: what ``Segment.append`` takes, gathered."""

    next_offset: int  # the offset after the last staged batch
    first_now_ms: int  # the time of the first staging (the segment's first append, if so)
    parts: list[bytes | memoryview] = attrs.field(factory=list)  # stamp, rest, stamp, ...
    placed: list[tuple[int, int, int]] = attrs.field(factory=list)  # base, size, max ts
    total: int = 0  # bytes
    span: int = 0  # offsets


class _Stager(Protocol):
    def write_staged(self) -> None:
        """Write what is staged; record a failure in its ``StagedWrite``. Never raises an
        operating error."""


class AppendPass:
    """The window in which partitions stage their appends (module docstring)."""

    def __init__(self) -> None:
        self._open = False
        self._enrolled: dict[_Stager, None] = {}  # insertion-ordered: deterministic

    @property
    def is_open(self) -> bool:
        return self._open

    def open(self) -> None:
        assert not self._open and not self._enrolled
        self._open = True

    def enrol(self, partition: _Stager) -> None:
        """``partition`` staged something in this pass. Idempotent."""
        assert self._open
        self._enrolled[partition] = None

    def close(self) -> None:
        """Write what every enrolled partition staged; end the pass. Blocks on the writes."""
        self._open = False
        enrolled, self._enrolled = self._enrolled, {}
        for partition in enrolled:
            partition.write_staged()
