"""The one module that touches PySyncObj's internals: hooks, the controller SyncObj, its status.

Theory of operation
-------------------
PySyncObj (pinned to 0.3.17) is a Raft library that owns its thread, sockets, files, clock
and randomness. The controller needs all of those to come from ``Env`` instead, so production
and the simulator run the same code, deterministically in the simulator. PySyncObj reads them
through module globals of ``pysyncobj.syncobj``, looked up at call time; ``install()`` replaces
them once per process:

- ``monotonicTime`` -> the clock of the node whose task is running (a context variable set by
  the Raft host; trio tasks inherit it), so several nodes in one simulated process each keep
  their own (skewed) clock;
- ``createJournal`` -> the ``RaftJournal`` on the Env disk that the host prepared for the
  SyncObj being constructed (PySyncObj's own journal never fsyncs);
- ``Serializer`` -> ``_SnapshotSerializer``: snapshots go through the ``SnapshotStore`` on the
  Env disk (PySyncObj's writes files with ``open()`` and, with ``useFork``, forks);
- ``createPoller`` -> a poller that never waits and ``PIPE_NOTIFIER_ENABLED`` -> False: the
  host ticks from a trio task (``autoTick=False``) and wakes the tick itself, so PySyncObj
  needs neither its select loop nor its wake-up pipe.

Election timeouts come from a seeded ``random.Random`` of the Env (``_SyncObj__generateRaftTimeout``
is overridden), and the transport is the host's ``RaftTransport`` (``transportClass``). What
PySyncObj keeps private (leader, term, match indexes) is read here and nowhere else.
"""

from __future__ import annotations

import contextvars
import logging
import random
from typing import Any, Callable

import attrs
import msgpack
import pysyncobj.syncobj as _syncobj
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.config import FAIL_REASON, SERIALIZER_STATE
from pysyncobj.node import Node

from rivven_broker.server.cluster.raft_journal import RaftJournal, SnapshotStore

log = logging.getLogger(__name__)

__all__ = [
    "FAIL_REASON",
    "CLOCK",
    "ControllerSyncObj",
    "RaftStatus",
    "SnapshotHooks",
    "install",
]

#: The running node's clock, in seconds (set by the Raft host before it ticks or delivers).
CLOCK: contextvars.ContextVar[Callable[[], float]] = contextvars.ContextVar("raft_clock")

_constructing: dict[str, Any] = {}
_installed = False


def _monotonic() -> float:
    return CLOCK.get()()


def _create_journal(journal_file: Any = None) -> RaftJournal:
    journal = _constructing.get("journal")
    assert journal is not None, "a ControllerSyncObj is built only through ControllerSyncObj()"
    return journal


class _NullPoller:
    def subscribe(self, descr: Any, callback: Any, events: Any) -> None:
        pass

    def unsubscribe(self, descr: Any) -> None:
        pass

    def poll(self, timeout: float) -> None:
        pass


@attrs.frozen
class SnapshotHooks:
    """How the state machine is saved into a snapshot and restored from one."""

    save: Callable[[], bytes]
    restore: Callable[[bytes], None]


class _SnapshotSerializer:
    """PySyncObj's ``Serializer`` interface on a ``SnapshotStore``: a snapshot is written whole
    and synchronously (the controller's state is small), and sent to a lagging follower from
    memory in chunks."""

    def __init__(self, fileName: Any, transmissionBatchSize: int, *_: Any) -> None:  # noqa: N803
        self._store: SnapshotStore = _constructing["snapshots"]
        self._hooks: SnapshotHooks = _constructing["hooks"]
        self._batch = transmissionBatchSize
        self._state = SERIALIZER_STATE.NOT_SERIALIZING
        self._id: Any = None
        self._sending: dict[Any, tuple[bytes, int]] = {}  # transmission: (snapshot, sent)
        self._receiving: bytearray | None = None

    def checkSerializing(self) -> tuple[int, Any]:  # noqa: N802
        state, self._state = self._state, SERIALIZER_STATE.NOT_SERIALIZING
        return state, (self._id if state != SERIALIZER_STATE.NOT_SERIALIZING else None)

    def serialize(self, data: Any, id: Any) -> None:  # noqa: A002
        _, last, previous, cluster = data
        document = msgpack.packb({
            "state": self._hooks.save(),
            "last": list(last), "previous": list(previous),
            "cluster": sorted(node.id for node in cluster if node is not None),
        })
        self._id = id
        try:
            self._store.write(document)
        except OSError:
            self._state = SERIALIZER_STATE.FAILED
            return
        self._sending.clear()
        self._state = SERIALIZER_STATE.SUCCESS

    def deserialize(self) -> tuple[Any, ...]:
        document = msgpack.unpackb(self._store.read())
        self._hooks.restore(document["state"])
        return (None, tuple(document["last"]), tuple(document["previous"]),
                [Node(node_id) for node_id in document["cluster"]])

    def getTransmissionData(self, transmissionID: Any) -> Any:  # noqa: N802,N803
        """The next chunk of the snapshot for one follower; the snapshot is read once per
        transmission, not once per chunk."""
        sending = self._sending.get(transmissionID)
        if sending is None:
            if not self._store.exists():
                return None
            sending = self._sending[transmissionID] = (self._store.read(), 0)
        data, sent = sending
        chunk = data[sent:sent + self._batch]
        is_last = not chunk
        if is_last:
            self._sending.pop(transmissionID, None)
        else:
            self._sending[transmissionID] = (data, sent + len(chunk))
        return chunk, sent == 0, is_last

    def setTransmissionData(self, data: Any) -> bool:  # noqa: N802
        if data is None:
            return False
        chunk, is_first, is_last = data
        if is_first:
            self._receiving = bytearray()
        elif self._receiving is None:
            return False
        self._receiving += chunk
        if not is_last:
            return False
        received, self._receiving = bytes(self._receiving), None
        try:
            self._store.write(received)
        except OSError:
            return False
        return True

    def cancelTransmisstion(self, id: Any) -> None:  # noqa: N802,A002 (PySyncObj's spelling)
        self._sending.pop(id, None)


class _RewindNotice(logging.Filter):
    """PySyncObj logs CRITICAL "truncating already-applied log entries" whenever a late answer
    rewinds a leader's next index and the follower receives entries it already has. With our
    journal those entries stay on disk and are taken back as they are (raft_journal.py), so the
    notice is not an operator's concern: it is logged at DEBUG instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "truncating already-applied log entries" not in record.getMessage():
            return True
        log.debug("PySyncObj re-received applied entries (%s)", record.getMessage())
        return False


def install() -> None:
    """Point PySyncObj's clock, journal, snapshots and poller at ours (once per process)."""
    global _installed
    if _installed:
        return
    logging.getLogger(_syncobj.__name__).addFilter(_RewindNotice())
    _syncobj.monotonicTime = _monotonic
    _syncobj.createJournal = _create_journal
    _syncobj.Serializer = _SnapshotSerializer
    _syncobj.createPoller = lambda poller_type: _NullPoller()
    _syncobj.PIPE_NOTIFIER_ENABLED = False
    _installed = True


@attrs.frozen
class RaftStatus:
    node_id: int | None
    state: str
    leader: int | None
    term: int
    commit_index: int
    last_applied: int
    match_index: dict[int, int]
    connected: tuple[int, ...]


_STATES = {0: "follower", 1: "candidate", 2: "leader"}


class ControllerSyncObj(SyncObj):  # type: ignore[misc]
    """PySyncObj's SyncObj with one replicated method: apply a command document."""

    def __init__(self, self_id: int | None, voter_ids: list[int], conf: SyncObjConf, *,
                 transport_class: Callable[..., Any], journal: RaftJournal,
                 snapshots: SnapshotStore, hooks: SnapshotHooks, rng: random.Random,
                 apply: Callable[[bytes, int], Any]) -> None:
        install()
        assert not conf.autoTick and not conf.useFork
        self._rng = rng
        self._apply = apply
        self_node = None if self_id is None else Node(self_id)
        others = [Node(v) for v in sorted(voter_ids) if v != self_id]
        _constructing.update(journal=journal, snapshots=snapshots, hooks=hooks)
        try:
            super().__init__(self_node, others, conf, transportClass=transport_class)
        finally:
            _constructing.clear()
        self._snapshots = snapshots

    def _SyncObj__generateRaftTimeout(self) -> float:  # noqa: N802 (PySyncObj's hook)
        conf = self.conf
        return conf.raftMinTimeout + (conf.raftMaxTimeout - conf.raftMinTimeout) * self._rng.random()

    @replicated
    def apply_command(self, document: bytes) -> Any:
        # Applied on every node in log order; this entry's index is the one after the last.
        return self._apply(document, self.raftLastApplied + 1)

    def load_snapshot(self) -> None:
        """At start: restore the last snapshot (PySyncObj looks for it with os.path, not Env)."""
        if self._snapshots.exists():
            self._SyncObj__loadDumpFile(clearJournal=False)

    def status(self) -> RaftStatus:
        leader = self._SyncObj__raftLeader
        return RaftStatus(
            node_id=None if self.selfNode is None else self.selfNode.id,
            state=_STATES.get(self._SyncObj__raftState, "unknown"),
            leader=None if leader is None else leader.id,
            term=self.raftCurrentTerm,
            commit_index=self.raftCommitIndex,
            last_applied=self.raftLastApplied,
            match_index={n.id: i for n, i in self._SyncObj__raftMatchIndex.items()},
            connected=tuple(sorted(n.id for n in self._SyncObj__connectedNodes)),
        )
