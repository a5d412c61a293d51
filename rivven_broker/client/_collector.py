"""Pausing Python's cyclic garbage collector while a consumer decodes and hands out records.

Theory of operation
-------------------
Each record is a tuple the collector tracks (a ``NamedTuple`` is never untracked), so decoding
one fetch of tens of thousands of records ran dozens of generation-0 collections that
re-scanned the records already decoded: a third or more of the decode time. Records hold only
bytes, ints, strings and ``None``, so they cannot form cycles and a pause loses nothing. Both
consumers (blocking and trio) pause it from their first decode until ``poll`` returns, never
across a wait or group work, and restore it in a ``finally`` — but only when the user asked
(``pause_gc_while_decoding=True``): the switch is process-wide, and a library must not touch
the collector of the process it lives in unasked.
"""

from __future__ import annotations

import gc

__all__ = ["CollectorPause"]


class CollectorPause:
    """Python's cyclic garbage collector paused while ``poll`` decodes and hands out records.

    Each record is a tuple the collector tracks (a ``NamedTuple`` is never untracked), so one
    fetch of tens of thousands of records ran dozens of collections that re-scanned the records
    already decoded. Records hold only bytes, ints, strings and ``None``: no cycles. Paused,
    records the caller drops before its next allocation are never scanned, and those it keeps
    are scanned by the first collection after ``poll``. ``end`` restores what ``begin`` found
    (a caller's own ``gc.disable()`` stays). The switch is process-wide: another thread that
    toggles it during a ``poll`` may see its change undone.
    """

    __slots__ = ("_was_enabled", "_enabled")

    def __init__(self, enabled: bool = True) -> None:
        self._was_enabled: bool | None = None  # None: not paused by this object
        self._enabled = enabled  # False: begin and end do nothing

    def begin(self) -> None:
        if self._enabled and self._was_enabled is None:
            self._was_enabled = gc.isenabled()
            gc.disable()

    def end(self) -> None:
        if self._was_enabled:
            gc.enable()
        self._was_enabled = None
