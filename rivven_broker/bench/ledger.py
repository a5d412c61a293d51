"""The loss and duplicate check: every acknowledged (producer, sequence) is read exactly once.

Theory of operation
-------------------
Every unit a load generator sends carries ``(producer, sequence)`` in the first bytes of a
record value (``MARK``: producer u32, sequence u64, send time u64 in ns of the monotonic
clock, big-endian). A *producer* here is one connection of one worker; its sequences count
0, 1, 2 ... For Rivven's batched load the unit is a batch (its first record carries the mark,
so checking costs one unpack per batch, not per record); for the client line and the peers it
is a record.

Producers report what was acknowledged: ``acked`` (sequences ``0 .. acked-1`` minus the
``failed`` ones answered with an error). Units sent but unanswered when the run stopped are
neither acknowledged nor failed: finding them is fine, missing them is fine. A reader then
``observe``s every mark it finds in the log. The verdict:

- ``lost``: acknowledged units never observed;
- ``duplicated``: observations beyond the first of the same unit (any unit);
- ``unknown``: observed marks of producers or sequences never sent (corruption).

Pure: no I/O. Memory is one byte per sent unit (a saturating counter).
"""

from __future__ import annotations

import struct
from typing import Iterable

import attrs

__all__ = ["MARK", "MARK_BYTES", "Ledger", "Verdict", "mark_value"]

MARK = struct.Struct(">IQQ")
MARK_BYTES = MARK.size
_SATURATED = 255


def mark_value(producer: int, sequence: int, send_ns: int, size: int) -> bytes:
    """A record value of ``size`` bytes that starts with the mark (cut to ``size``)."""
    mark = MARK.pack(producer, sequence, send_ns)
    if size <= MARK_BYTES:
        return mark[:size]
    return mark + b"\x00" * (size - MARK_BYTES)


@attrs.frozen
class Verdict:
    """The outcome of a check. ``ok`` when nothing was lost, duplicated or unknown."""

    acked: int
    observed: int
    lost: int
    duplicated: int
    unknown: int
    lost_examples: tuple[tuple[int, int], ...] = ()

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.unknown)


class Ledger:
    """What producers sent and had acknowledged, against what a reader found."""

    __slots__ = ("_sent", "_acked", "_failed", "_seen", "_unknown", "_observed")

    def __init__(self) -> None:
        self._sent: dict[int, int] = {}
        self._acked: dict[int, int] = {}
        self._failed: dict[int, set[int]] = {}
        self._seen: dict[int, bytearray] = {}
        self._unknown = 0
        self._observed = 0

    def add_producer(self, producer: int, sent: int, acked: int, failed: Iterable[int] = ()) -> None:
        """Register ``producer``: ``sent`` units, the first ``acked`` answered (``failed`` of
        them with an error). A producer is registered once."""
        assert producer not in self._sent, f"producer {producer} registered twice"
        assert 0 <= acked <= sent
        failed_set = set(failed)
        assert all(0 <= seq < acked for seq in failed_set)
        self._sent[producer] = sent
        self._acked[producer] = acked
        self._failed[producer] = failed_set
        self._seen[producer] = bytearray(sent)

    @property
    def acked_units(self) -> int:
        return sum(self._acked[p] - len(self._failed[p]) for p in self._acked)

    def observe(self, producer: int, sequence: int) -> None:
        """Count one unit found in the log."""
        self._observed += 1
        seen = self._seen.get(producer)
        if seen is None or not 0 <= sequence < len(seen):
            self._unknown += 1
            return
        if seen[sequence] < _SATURATED:
            seen[sequence] += 1

    def observe_value(self, value: bytes | memoryview, pos: int = 0) -> None:
        """Count the unit whose mark starts at ``value[pos]``."""
        producer, sequence, _ = MARK.unpack_from(value, pos)
        self.observe(producer, sequence)

    def verdict(self, examples_max: int = 5) -> Verdict:
        """Compare. Never raises; cost is one pass over the counters."""
        lost = duplicated = 0
        examples: list[tuple[int, int]] = []
        for producer, seen in self._seen.items():
            acked = self._acked[producer]
            failed = self._failed[producer]
            head = seen[:acked]
            missing = head.count(0)
            if missing:
                for sequence in _zero_positions(head, missing):
                    if sequence in failed:
                        continue
                    lost += 1
                    if len(examples) < examples_max:
                        examples.append((producer, sequence))
            if seen and max(seen) > 1:
                duplicated += sum(count - 1 for count in seen if count > 1)
        return Verdict(
            self.acked_units, self._observed, lost, duplicated, self._unknown, tuple(examples)
        )


def _zero_positions(data: bytearray, count: int) -> Iterable[int]:
    position = -1
    for _ in range(count):
        position = data.index(0, position + 1)
        yield position
