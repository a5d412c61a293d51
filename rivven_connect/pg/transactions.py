"""Begin..Commit assembly: decoded pgoutput messages -> whole ``Transaction``s.

Theory of operation: pgoutput sends a transaction only after it committed, as ``Begin``,
the Relation/Type messages it needs, its changes, ``Commit``; never two at once. The
``TransactionAssembler`` is a pure state machine fed one message at a time (with the
``XLogData`` start LSN of the frame when the driver has it) that returns a finished
``Transaction`` at each Commit, or a non-transactional ``LogicalMessage`` at once.

- Relation cache: every change names its table by oid; the Relation message for it comes
  before the first change after a (re)connect and again after DDL. Each ``Change`` keeps the
  ``Relation`` that was current when it was decoded, so a mid-transaction ALTER is seen.
  A change for an oid never described is a ``ReplicationStateError``.
- Replay filter: a restart resumes at the stored ``end_lsn`` but Postgres may resend
  transactions already delivered (the slot's ``confirmed_flush_lsn`` lags the stored
  offset). A transaction whose ``end_lsn <= resume_end_lsn`` is dropped; its changes are
  not even buffered (``Begin.final_lsn`` is its commit LSN, below its end LSN). The
  resume point then moves to each delivered transaction's ``end_lsn``.
- Bounds: a transaction holds at most ``changes_max`` changes (``TransactionTooLarge``);
  streaming large transactions into the broker without buffering is a later step.
"""

from __future__ import annotations

import attrs

from .pgoutput import (
    Begin, Commit, Delete, Insert, LogicalMessage, Message, Origin, Relation, Truncate, Type,
    Update,
)

__all__ = [
    "CHANGES_PER_TRANSACTION_MAX",
    "Change",
    "ReplicationStateError",
    "Transaction",
    "TransactionAssembler",
    "TransactionTooLarge",
]

#: The default bound on one buffered transaction's changes.
CHANGES_PER_TRANSACTION_MAX = 100_000


class ReplicationStateError(ValueError):
    """Messages in an order pgoutput never sends (Commit without Begin, a change for an
    unknown relation, a Commit that does not match its Begin, a resume point inside a
    transaction's commit record)."""


class TransactionTooLarge(ValueError):
    """A transaction has more changes than the assembler's ``changes_max``."""


@attrs.frozen
class Change:
    """One change of a transaction: an Insert/Update/Delete of ``relations[0]``, a Truncate
    of ``relations`` (in the message's order) or a transactional LogicalMessage (no
    relation). ``lsn`` is the WAL position of the change (the frame's start LSN), or the
    transaction's commit LSN when the driver did not say."""

    message: Insert | Update | Delete | Truncate | LogicalMessage
    relations: tuple[Relation, ...]
    lsn: int

    @property
    def relation(self) -> Relation:
        assert len(self.relations) == 1, self
        return self.relations[0]


@attrs.frozen
class Transaction:
    xid: int
    commit_lsn: int
    end_lsn: int
    commit_ts_us: int         # microseconds since 2000-01-01 UTC
    changes: tuple[Change, ...]
    origin: str | None = None


@attrs.define
class _Open:
    begin: Begin
    skipped: bool
    changes: list[Change] = attrs.field(factory=list)
    origin: str | None = None


class TransactionAssembler:
    """Feeds decoded messages, returns transactions. Not thread-safe; never blocks."""

    def __init__(self, *, resume_end_lsn: int = 0,
                 changes_max: int = CHANGES_PER_TRANSACTION_MAX) -> None:
        assert resume_end_lsn >= 0 and changes_max > 0
        self.resume_end_lsn = resume_end_lsn
        self.changes_max = changes_max
        self.relations: dict[int, Relation] = {}
        self.types: dict[int, Type] = {}
        self._open: _Open | None = None
        self._delivered = 0
        self._dropped = 0

    def feed(self, message: Message, wal_lsn: int | None = None
             ) -> Transaction | LogicalMessage | None:
        """One message in stream order. Returns a finished transaction (at its Commit,
        unless the replay filter drops it), a non-transactional logical message, or None.
        Raises ``ReplicationStateError`` or ``TransactionTooLarge``."""
        if isinstance(message, Relation):
            self.relations[message.oid] = message
            return None
        if isinstance(message, Type):
            self.types[message.oid] = message
            return None
        if isinstance(message, Begin):
            if self._open is not None:
                raise ReplicationStateError(
                    f"Begin of xid {message.xid} inside xid {self._open.begin.xid}")
            self._open = _Open(message, skipped=message.final_lsn < self.resume_end_lsn)
            return None
        if isinstance(message, LogicalMessage) and not message.transactional:
            return message
        open_ = self._open
        if open_ is None:
            raise ReplicationStateError(f"{type(message).__name__} outside a transaction")
        if isinstance(message, Commit):
            return self._commit(open_, message)
        if isinstance(message, Origin):
            open_.origin = message.name
            return None
        if open_.skipped:
            return None
        if len(open_.changes) >= self.changes_max:
            raise TransactionTooLarge(
                f"xid {open_.begin.xid} has more than {self.changes_max} changes")
        lsn = open_.begin.final_lsn if wal_lsn is None else wal_lsn
        open_.changes.append(Change(message, self._relations_of(message), lsn))
        return None

    def _relations_of(self, message: Message) -> tuple[Relation, ...]:
        if isinstance(message, LogicalMessage):
            return ()
        if not isinstance(message, Truncate):  # a row change (the common case): one oid
            relation = self.relations.get(message.relation_oid)
            if relation is not None:
                return (relation,)
        oids = (message.relation_oids if isinstance(message, Truncate)
                else (message.relation_oid,))
        missing = [oid for oid in oids if oid not in self.relations]
        if missing:
            raise ReplicationStateError(
                f"{type(message).__name__} for relation oid {missing[0]} before its "
                f"Relation message")
        return tuple(self.relations[oid] for oid in oids)

    def _commit(self, open_: _Open, commit: Commit) -> Transaction | None:
        self._open = None
        begin = open_.begin
        if commit.commit_lsn != begin.final_lsn or commit.end_lsn <= commit.commit_lsn:
            raise ReplicationStateError(
                f"Commit {commit} does not match Begin {begin}")
        if commit.end_lsn <= self.resume_end_lsn:
            self._dropped += 1
            return None
        if open_.skipped:
            raise ReplicationStateError(
                f"resume point {self.resume_end_lsn:#x} lies inside the commit record of "
                f"xid {begin.xid} ({commit.commit_lsn:#x}..{commit.end_lsn:#x})")
        self.resume_end_lsn = commit.end_lsn
        self._delivered += 1
        return Transaction(begin.xid, commit.commit_lsn, commit.end_lsn, begin.commit_ts_us,
                           tuple(open_.changes), open_.origin)

    def on_reconnect(self) -> None:
        """The replication connection was lost: a half-received transaction is dropped
        (Postgres resends it whole) and the relation cache is emptied (it resends the
        Relation messages)."""
        self._open = None
        self.relations.clear()
        self.types.clear()

    @property
    def in_transaction(self) -> bool:
        return self._open is not None

    def statistics(self) -> dict[str, int]:
        return {"transactions_delivered": self._delivered,
                "transactions_dropped_as_replayed": self._dropped,
                "relations_cached": len(self.relations),
                "resume_end_lsn": self.resume_end_lsn}

    def check_invariants(self) -> None:
        open_ = self._open
        if open_ is not None:
            assert len(open_.changes) <= self.changes_max
            assert not (open_.skipped and open_.changes)
        for oid, relation in self.relations.items():
            assert relation.oid == oid
