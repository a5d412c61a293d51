"""Incremental (DBLog) snapshots, the pure part: signals, progress, chunk windows.

Theory of operation (docs/connect-postgres.md "Incremental snapshots")
---------------------------------------------------------------------
While the source streams, ``IncrementalSnapshot`` reads tables chunk by chunk in primary
key order and decides which chunk rows may be emitted, by **positions in the stream**
(never clocks). For one chunk the driver, asked by ``next_chunk()``:

1. commits a transactional logical message, the *low watermark* ``L``;
2. in a new ``REPEATABLE READ`` transaction takes the snapshot ``S`` (with
   ``pg_current_snapshot()``: its in-progress xids) and reads the chunk ``WHERE (pk) >
   (last) ORDER BY pk LIMIT n``;
3. commits the *high watermark* ``H``, and hands the rows and ``S``'s in-progress xids to
   ``chunk_read``.

The stream then reaches ``L`` and ``H`` in commit order. ``S`` was taken after ``L``
committed and before ``H`` was written, so every transaction that commits before ``L`` is
visible in ``S`` and every one that commits after ``H`` is not — except one race: a
transaction whose commit record precedes ``L`` but which had not yet left the server's
list of running transactions when ``S`` was taken (commit-record order and visibility order
differ in Postgres). Such a transaction is among ``S``'s in-progress xids. So a streamed
change of the chunk's table removes its key from the chunk buffer when it arrives

- between ``L`` and ``H`` (the DBLog window: the stream carries that key's newer state), or
- before ``L`` from a transaction in ``S``'s in-progress xids (the race);

and a race transaction delivered *before the chunk was read* (one of the last
``recent_xids_max`` delivered transactions in ``S``'s in-progress list) removes from the
chunk the keys it changed: the stream already carried their newer state, which ``S`` does
not show. Its keys are known when it changed at most ``race_keys_max`` rows of the tables
being snapshotted while the snapshot ran (and truncated none); otherwise the chunk is
worthless: it is dropped and read again (at most ``chunk_retries_max`` times in a row —
with a busy writer under a loaded machine, every read can meet a race, so dropping is the
exception).
A truncate of the table in those cases empties the buffer. At ``H`` the rows left are
returned, in key order, to be emitted as ``r`` records after everything streamed before
``H``: each row's key has no streamed change between ``S`` and ``H``, so the row is that
key's state at ``H`` and the topic, materialised by key, equals the table.

Progress is an ``IncrementalState`` (the tables still to read, the first being read, the
last key of the last chunk *emitted*, the chunk size and the pause flag) that the source
puts into every position it produces, so the stored offset always says where the snapshot
stands at that point of the stream: a crash re-reads at most the chunk in flight (its rows
were not committed) and replays the signals after the stored position.

Signals (``execute-snapshot`` with ``data-collections`` and an optional ``chunk-size``,
``stop-snapshot`` with optional ``data-collections``, ``pause-snapshot``,
``resume-snapshot``) come from the signal table or a ``rivven.cdc.signal`` logical message;
``parse_signal`` checks them (``SignalError``).
"""

from __future__ import annotations

import collections
import json
from typing import Any, Generic, Iterable, Sequence, TypeVar

import attrs

__all__ = ["IncrementalSnapshot", "IncrementalSnapshotError", "IncrementalState",
           "ChunkRequest", "Signal", "SignalError", "SIGNAL_TYPES", "chunk_retries_max",
           "key_id", "parse_signal", "race_keys_max", "recent_xids_max"]

SIGNAL_TYPES = ("execute-snapshot", "stop-snapshot", "pause-snapshot", "resume-snapshot")
#: Delivered transactions remembered for the race check (module docstring).
recent_xids_max = 4096
#: A chunk dropped this many times in a row (race transactions) stops the source.
chunk_retries_max = 100
#: Keys of the snapshotted tables remembered per delivered transaction for the race check;
#: a transaction that changed more makes a chunk it races be dropped instead.
race_keys_max = 64
#: Bounds of a signal: tables it names, chunk size.
signal_tables_max = 1000
chunk_rows_max = 10_000

Payload = TypeVar("Payload")


class SignalError(ValueError):
    """A signal that cannot be acted on (unknown type, bad data, unknown table)."""


class IncrementalSnapshotError(ValueError):
    """The stream contradicts the window bookkeeping (a high watermark before its low one),
    or chunks keep racing with running transactions."""


def key_id(key: Any) -> str:
    """A record key (dict of column -> typed value) as comparable text."""
    return json.dumps(key, sort_keys=True, separators=(",", ":"))


@attrs.frozen
class Signal:
    type: str
    tables: tuple[str, ...] = ()        # "schema.table"; for stop: () means all
    chunk_rows: int | None = None


def parse_signal(signal_type: Any, data: Any, known_tables: Sequence[str]) -> Signal:
    """A signal row's ``type`` and ``data`` (JSON text or None). Raises ``SignalError``."""
    if signal_type not in SIGNAL_TYPES:
        raise SignalError(f"unknown signal type {signal_type!r} (one of "
                          f"{', '.join(SIGNAL_TYPES)})")
    try:
        body = {} if data in (None, "") else json.loads(data) if isinstance(data, str) else data
    except ValueError:
        raise SignalError(f"{signal_type}: data is not JSON: {data!r}") from None
    if not isinstance(body, dict):
        raise SignalError(f"{signal_type}: data must be a JSON object, not {data!r}")
    tables: list[str] = []
    names = body.get("data-collections", [])
    if not isinstance(names, list) or len(names) > signal_tables_max or not all(
            isinstance(name, str) for name in names):
        raise SignalError(f"{signal_type}: data-collections must be a list of table names")
    for name in names:
        full = name if "." in name else f"public.{name}"
        if full not in known_tables:
            raise SignalError(f"{signal_type}: {name!r} is not one of the source's tables "
                              f"({', '.join(known_tables)})")
        if full not in tables:
            tables.append(full)
    chunk_rows = body.get("chunk-size")
    if chunk_rows is not None and (not isinstance(chunk_rows, int) or isinstance(
            chunk_rows, bool) or not 1 <= chunk_rows <= chunk_rows_max):
        raise SignalError(f"{signal_type}: chunk-size must be an integer 1..{chunk_rows_max}")
    if signal_type == "execute-snapshot" and not tables:
        raise SignalError("execute-snapshot: data-collections must name at least one table")
    return Signal(signal_type, tuple(tables), chunk_rows)


@attrs.frozen
class IncrementalState:
    """Where an incremental snapshot stands (JSON in every position of the source)."""

    tables: tuple[str, ...]              # still to read; tables[0] is being read
    last_key: tuple[str, ...] | None     # of tables[0]: the last key of the last chunk emitted
    chunk_rows: int
    paused: bool = False

    def __attrs_post_init__(self) -> None:
        assert self.tables and 1 <= self.chunk_rows <= chunk_rows_max, self

    def to_json(self) -> dict[str, Any]:
        return {"tables": list(self.tables),
                "last_key": None if self.last_key is None else list(self.last_key),
                "chunk_rows": self.chunk_rows, "paused": self.paused}

    @classmethod
    def from_json(cls, value: Any) -> IncrementalState:
        """Raises ``ValueError`` for anything that is not a state."""
        try:
            tables, last_key = value["tables"], value["last_key"]
            assert isinstance(tables, list) and all(isinstance(t, str) for t in tables)
            assert last_key is None or (isinstance(last_key, list) and all(
                isinstance(part, str) for part in last_key))
            assert isinstance(value["paused"], bool) and isinstance(value["chunk_rows"], int)
            return cls(tuple(tables), None if last_key is None else tuple(last_key),
                       value["chunk_rows"], value["paused"])
        except (KeyError, TypeError, AssertionError) as error:
            raise ValueError(f"not an incremental snapshot state: {value!r}") from error


@attrs.frozen
class ChunkRequest:
    """Read ``limit`` rows of ``table`` after key ``after`` between watermarks of chunk
    ``chunk_id``."""

    chunk_id: int
    table: str
    after: tuple[str, ...] | None
    limit: int


@attrs.define
class _Chunk(Generic[Payload]):
    request: ChunkRequest
    phase: str = "reading"               # reading -> read (rows in) -> open (L seen)
    rows: dict[str, Payload] = attrs.field(factory=dict)
    last_key: tuple[str, ...] | None = None
    exhausted: bool = False              # fewer rows than asked: the table is done
    in_progress: frozenset[int] = frozenset()


class IncrementalSnapshot(Generic[Payload]):
    """The window bookkeeping of one source. Feed it, in stream order, every delivered
    transaction (``on_transaction``), each change of a row (``on_change``) or truncate
    (``on_truncate``), each watermark (``on_watermark``) and signal (``on_signal``); and
    the chunks read (``chunk_read``). Never blocks, does no I/O."""

    def __init__(self, state: IncrementalState | None, chunk_rows_default: int) -> None:
        assert 1 <= chunk_rows_default <= chunk_rows_max
        self.state = state
        self.chunk_rows_default = chunk_rows_default
        self.chunk: _Chunk[Payload] | None = None
        self._next_chunk_id = 1
        self._recent: collections.deque[int] = collections.deque(maxlen=recent_xids_max)
        self._recent_counts: collections.Counter[int] = collections.Counter()
        #: xid -> the keys it changed per snapshotted table, or None: unknown (delivered
        #: while no snapshot ran, more than ``race_keys_max``, or a truncate)
        self._recent_keys: dict[int, dict[str, set[str]] | None] = {}
        self._retries = 0
        self.chunks_emitted = 0
        self.chunks_retried = 0
        self.rows_dropped = 0   # chunk rows a streamed change superseded

    # --- signals ----------------------------------------------------------------------------
    def on_signal(self, signal: Signal) -> None:
        state = self.state
        if signal.type == "execute-snapshot":
            if state is None:
                self.state = IncrementalState(signal.tables, None,
                                              signal.chunk_rows or self.chunk_rows_default)
            else:
                tables = state.tables + tuple(t for t in signal.tables if t not in state.tables)
                self.state = attrs.evolve(state, tables=tables,
                                          chunk_rows=signal.chunk_rows or state.chunk_rows)
        elif state is None:
            return  # pause, resume or stop with nothing running: nothing to do
        elif signal.type == "pause-snapshot":
            self.state = attrs.evolve(state, paused=True)
        elif signal.type == "resume-snapshot":
            self.state = attrs.evolve(state, paused=False)
        else:
            assert signal.type == "stop-snapshot", signal
            stopped = set(signal.tables) if signal.tables else set(state.tables)
            if state.tables[0] in stopped:
                self.chunk = None  # its watermarks will match nothing
            tables = tuple(t for t in state.tables if t not in stopped)
            if not tables:
                self.state = None
            elif tables[0] != state.tables[0]:
                self.state = attrs.evolve(state, tables=tables, last_key=None)
            else:
                self.state = attrs.evolve(state, tables=tables)

    # --- chunks -----------------------------------------------------------------------------
    @property
    def chunk_due(self) -> bool:
        """``next_chunk()`` would return a chunk (a snapshot runs, unpaused, none in flight)."""
        state = self.state
        return state is not None and not state.paused and self.chunk is None

    def next_chunk(self) -> ChunkRequest | None:
        """The chunk to read now (then ``chunk_read``), or None: nothing running, paused,
        or a chunk still in flight."""
        state = self.state
        if not self.chunk_due:
            return None
        assert state is not None
        request = ChunkRequest(self._next_chunk_id, state.tables[0], state.last_key,
                               state.chunk_rows)
        self._next_chunk_id += 1
        self.chunk = _Chunk(request)
        return request

    def chunk_read(self, chunk_id: int, rows: Iterable[tuple[str, Payload]],
                   last_key: tuple[str, ...] | None, in_progress_xids: Iterable[int]) -> bool:
        """The rows of chunk ``chunk_id`` as ``(key_id, payload)`` in key order, the key of
        the last row read (None: no row) and the snapshot's in-progress xids (32 bits).
        False: the chunk is dropped (stopped meanwhile, or a race: read it again). Raises
        ``IncrementalSnapshotError`` after ``chunk_retries_max`` races in a row."""
        chunk = self.chunk
        if chunk is None or chunk.request.chunk_id != chunk_id:
            return False
        assert chunk.phase == "reading", chunk.phase
        in_progress = frozenset(xid & 0xFFFF_FFFF for xid in in_progress_xids)
        races = [xid for xid in in_progress if self._recent_counts[xid]]
        raced = [self._recent_keys.get(xid) for xid in races]
        if any(keys is None for keys in raced):
            self.chunk = None
            self.chunks_retried += 1
            self._retries += 1
            if self._retries > chunk_retries_max:
                raise IncrementalSnapshotError(
                    f"chunk of {chunk.request.table} dropped {self._retries} times in a row: "
                    f"a delivered transaction stays in the snapshot's in-progress list")
            return False
        self._retries = 0
        chunk.rows = dict(rows)
        chunk.exhausted = len(chunk.rows) < chunk.request.limit  # (as read: before the cuts)
        for keys in raced:  # the stream carried these keys' newer state before the read
            assert keys is not None
            for key in keys.get(chunk.request.table, ()):
                if chunk.rows.pop(key, None) is not None:
                    self.rows_dropped += 1
        chunk.last_key, chunk.in_progress, chunk.phase = last_key, in_progress, "read"
        return True

    def chunk_failed(self, chunk_id: int) -> None:
        """The read of chunk ``chunk_id`` failed before ``chunk_read``: forget it."""
        if self.chunk is not None and self.chunk.request.chunk_id == chunk_id:
            self.chunk = None

    # --- the stream -------------------------------------------------------------------------
    def on_transaction(self, xid: int) -> None:
        """A transaction was delivered (call it before its changes)."""
        if len(self._recent) == recent_xids_max:
            old = self._recent[0]
            self._recent_counts[old] -= 1
            if not self._recent_counts[old]:
                del self._recent_counts[old]
                self._recent_keys.pop(old, None)
        self._recent.append(xid)
        seen = self._recent_counts[xid]
        self._recent_counts[xid] += 1
        if self.state is None or seen:  # unknown keys (a repeated xid: the older one's too)
            self._recent_keys[xid] = None
        else:
            self._recent_keys[xid] = {}

    def _remember(self, xid: int, table: str, key: str | None) -> None:
        """Note that delivered transaction ``xid`` changed ``key`` (None: every row) of
        ``table``, when it is a table the snapshot reads (the race check)."""
        state = self.state
        keys = self._recent_keys.get(xid)
        if keys is None or state is None or table not in state.tables:
            return
        changed = keys.setdefault(table, set())
        if key is None or sum(map(len, keys.values())) >= race_keys_max:
            self._recent_keys[xid] = None
        else:
            changed.add(key)

    def _affects(self, xid: int, table: str) -> bool:
        chunk = self.chunk
        return chunk is not None and chunk.request.table == table and (
            chunk.phase == "open" or (chunk.phase == "read" and xid in chunk.in_progress))

    def on_change(self, xid: int, table: str, key: str) -> None:
        """A streamed row change (insert, update, delete; both keys of a key change)."""
        self._remember(xid, table, key)
        if self._affects(xid, table):
            assert self.chunk is not None
            if self.chunk.rows.pop(key, None) is not None:
                self.rows_dropped += 1

    def on_truncate(self, xid: int, table: str) -> None:
        self._remember(xid, table, None)
        if self._affects(xid, table):
            assert self.chunk is not None
            self.rows_dropped += len(self.chunk.rows)
            self.chunk.rows.clear()

    def on_watermark(self, kind: str, chunk_id: int) -> list[Payload] | None:
        """Our watermark ``kind`` (``low``/``high``) of chunk ``chunk_id`` reached the
        stream. At the high one of the chunk in flight: the rows to emit now, in key order
        (the state has moved past the chunk). Else None (an old chunk's: ignored)."""
        assert kind in ("low", "high"), kind
        chunk = self.chunk
        if chunk is None or chunk.request.chunk_id != chunk_id:
            return None  # an earlier process's, or a chunk stopped or dropped meanwhile
        if chunk.phase == "reading":
            raise IncrementalSnapshotError(
                f"{kind} watermark of chunk {chunk_id} before the chunk was read")
        if kind == "low":
            if chunk.phase != "read":
                raise IncrementalSnapshotError(f"second low watermark of chunk {chunk_id}")
            chunk.phase = "open"
            return None
        if chunk.phase != "open":
            raise IncrementalSnapshotError(f"high watermark of chunk {chunk_id} before its low")
        self.chunk = None
        self.chunks_emitted += 1
        state = self.state
        assert state is not None and state.tables[0] == chunk.request.table
        if chunk.exhausted:
            rest = state.tables[1:]
            self.state = attrs.evolve(state, tables=rest, last_key=None) if rest else None
        else:
            self.state = attrs.evolve(state, last_key=chunk.last_key)
        return list(chunk.rows.values())

    def check_invariants(self) -> None:
        assert sum(self._recent_counts.values()) == len(self._recent) <= recent_xids_max
        assert set(self._recent_keys) <= set(self._recent_counts)
        for keys in self._recent_keys.values():
            assert keys is None or sum(map(len, keys.values())) <= race_keys_max
        chunk, state = self.chunk, self.state
        if chunk is not None:
            assert state is not None and chunk.request.table == state.tables[0]
            assert chunk.phase in ("reading", "read", "open")
            assert chunk.phase != "reading" or not chunk.rows
        if state is not None:
            assert len(set(state.tables)) == len(state.tables)
