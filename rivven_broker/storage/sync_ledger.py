"""``SyncLedger``: the group-commit bookkeeping of one partition log (a pure core).

Theory of operation
-------------------
``PartitionLog.begin_sync`` hands out ``SyncTicket``s, a worker fsyncs their handles off the
loop and ``complete_sync`` settles them (``partition_log.py`` says what is synced when). This
ledger keeps what has to be remembered between the two, and nothing else:

* *Tickets out*: each ticket's id, the end offset it may still claim (a truncation lowers it:
  ``clamp``) and the base offsets of the sealed segments it names (retention must not close
  their handles under the worker: ``held_bases``).
* *Directory changes* not yet covered by a directory fsync: a numbered generation each, with
  an optional *floor*. Until a directory fsync that began after a change completes
  (``directory_synced``), no offset at or above its floor may be reported durable
  (``durable_floor``); a change without a floor only has to become durable some time.
* *Staged recovery points*: after a roll (``recovery_point_due``) one ticket at a time carries
  a recovery-point checkpoint written ahead to a file of its own (``StagedCheckpoint``);
  settling the ticket hands it back for the log to rename in, unless a truncation came
  first (``cancel_staged``).
* *Doomed segments*: removed from the log while a ticket was out; their handles close when
  the last ticket settles (``release_doomed``), since a closed descriptor could be reused
  under the worker.

It does no I/O and holds no handles of its own: it only names them for the log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from rivven_broker.storage.segment import Segment

__all__ = ["SyncLedger", "StagedCheckpoint", "NO_FLOOR"]

NO_FLOOR = 2**63  # no directory change caps the durable offset


@attrs.define(eq=False)
class StagedCheckpoint:
    """A recovery-point checkpoint written ahead, riding a sync ticket."""

    handle: int
    tmp_path: str
    value: int
    cancelled: bool = False  # a truncation came first: never rename it in


class SyncLedger:
    """Tickets out, directory changes, staged recovery points and doomed segments of one log.
    See the module docstring. Never blocks; never raises but by ``assert``."""

    def __init__(self) -> None:
        self._tickets: dict[int, int] = {}  # ticket id -> end offset it may still claim
        self._ticket_bases: dict[int, frozenset[int]] = {}  # ticket id -> sealed bases in it
        self._next_ticket_id = 1
        #: (generation, floor) of each change no directory fsync has covered yet.
        self._directory_changes: list[tuple[int, int | None]] = []
        #: The number of the latest directory change (a ticket or removal covers up to it).
        self.directory_generation = 0
        self._staged: dict[int, StagedCheckpoint] = {}  # ticket id -> recovery point in it
        #: A roll happened: the next ticket records the recovery point.
        self.recovery_point_due = False
        self._doomed: list[Segment] = []  # removed while a ticket was out; close later

    # --- tickets ---------------------------------------------------------------------------------

    @property
    def outstanding(self) -> int:
        """How many tickets are out."""
        return len(self._tickets)

    def next_ticket_id(self) -> int:
        """A fresh ticket id (never handed out before)."""
        ticket_id = self._next_ticket_id
        self._next_ticket_id += 1
        return ticket_id

    def issue(self, ticket_id: int, end_offset: int, bases: frozenset[int]) -> None:
        """Ticket ``ticket_id`` is out, claiming offsets below ``end_offset`` and naming the
        handles of the segments based at ``bases``."""
        assert ticket_id not in self._tickets and ticket_id < self._next_ticket_id
        self._tickets[ticket_id] = end_offset
        self._ticket_bases[ticket_id] = bases

    def settle(self, ticket_id: int) -> tuple[int, StagedCheckpoint | None]:
        """Ticket ``ticket_id`` completed: the end offset it may still claim, and the
        recovery point that rode it (if any)."""
        end = self._tickets.pop(ticket_id)
        del self._ticket_bases[ticket_id]
        return end, self._staged.pop(ticket_id, None)

    def clamp(self, cut: int) -> None:
        """A truncation cut the log at ``cut``: no ticket out may claim past it."""
        for ticket_id, end in self._tickets.items():
            self._tickets[ticket_id] = min(end, cut)

    def held_bases(self) -> frozenset[int]:
        """The base offsets of the segments some ticket out names."""
        return frozenset().union(*self._ticket_bases.values())

    # --- directory changes -----------------------------------------------------------------------

    @property
    def directory_dirty(self) -> bool:
        """Some directory change is not covered by a directory fsync yet."""
        return bool(self._directory_changes)

    def directory_changed(self, floor: int | None) -> None:
        """Names in the directory changed; until a directory fsync covers that, no offset at
        or above ``floor`` may be reported durable."""
        self.directory_generation += 1
        self._directory_changes.append((self.directory_generation, floor))

    def directory_synced(self, generation: int) -> None:
        """A directory fsync that started after change ``generation`` completed."""
        self._directory_changes = [
            change for change in self._directory_changes if change[0] > generation]

    def durable_floor(self) -> int:
        """The least floor of the changes not yet covered (``NO_FLOOR`` if none)."""
        floors = [floor for _, floor in self._directory_changes if floor is not None]
        return min(floors, default=NO_FLOOR)

    # --- staged recovery points ------------------------------------------------------------------

    @property
    def staging(self) -> bool:
        """A staged recovery point rides a ticket out (one at a time)."""
        return bool(self._staged)

    def stage(self, ticket_id: int, staged: StagedCheckpoint) -> None:
        """``staged`` rides ticket ``ticket_id`` (issued next); the roll it records is done."""
        assert not self._staged
        self._staged[ticket_id] = staged
        self.recovery_point_due = False

    def cancel_staged(self) -> None:
        """A truncation is about to rewrite the recovery point: no staged value goes in."""
        for staged in self._staged.values():
            staged.cancelled = True

    # --- doomed segments -------------------------------------------------------------------------

    def defer_close(self, segment: Segment) -> None:
        """Close ``segment`` once no ticket is out (``release_doomed``)."""
        self._doomed.append(segment)

    @property
    def doomed(self) -> int:
        """How many segments wait for ``release_doomed``."""
        return len(self._doomed)

    def release_doomed(self) -> list[Segment]:
        """The segments whose handles may close now (all of them once no ticket is out)."""
        if self._tickets:
            return []
        doomed, self._doomed = self._doomed, []
        return doomed

    def abandon(self) -> tuple[list[Segment], list[StagedCheckpoint]]:
        """The log is closing with tickets that will never complete: every doomed segment and
        staged checkpoint, for the log to close their handles; the ledger forgets them."""
        doomed, staged = self._doomed, list(self._staged.values())
        self._doomed, self._staged = [], {}
        return doomed, staged

    def check_invariants(self, log_end_offset: int) -> None:
        """Assert the ledger's invariants (docs/invariants.md). Never blocks. (Between
        ``settle`` and ``release_doomed`` doomed segments may wait with no ticket out; the log
        checks that none are left once it has settled a ticket.)"""
        assert all(end <= log_end_offset for end in self._tickets.values())
        assert set(self._tickets) == set(self._ticket_bases)
        assert all(ticket_id < self._next_ticket_id for ticket_id in self._tickets)
        assert set(self._staged) <= set(self._tickets), "a staged recovery point rides a ticket"
        assert len(self._staged) <= 1
        generations = [generation for generation, _ in self._directory_changes]
        assert generations == sorted(set(generations))
        assert all(generation <= self.directory_generation for generation in generations)
