"""``SimDisk``: a node's disk that outlives its crashes, with fault injection.

Theory of operation
-------------------
The bytes live in one ``MemoryFileStore`` per node (``rivven_broker.storage.memory_store``):
a live layer that reads see and a durable layer that ``fsync`` copies into. ``crash()`` is a
power loss: it drops everything unsynced and, with probability ``torn_write_probability``,
keeps a random prefix of the last unsynced write (a torn write).

Each node incarnation reads and writes through its own ``DiskView`` (the ``FileStore`` the
broker's ``Env`` hands out). A crash *revokes* the view before the node's tasks are cancelled,
so cleanup code that runs while the dead incarnation unwinds (a ``finally`` that closes or
syncs a log) fails with ``EIO`` instead of making data durable that a real crash would have
lost. The next incarnation gets a fresh view of the same store.

Injected faults (through the store's ``fault_hook``, so they act before the call does anything):

- ``fail_fsyncs(n)``: the next ``n`` calls to ``fsync``/``sync_filesystem``/``fsync_dir`` raise
  ``OSError(EIO)``.
  A node must treat that as fatal and stop; the world checks that it does.
- ``set_full(True)``: writes that need space (``pwrite``, ``pwritev``, ``allocate``,
  ``makedirs``, creating a file) raise ``OSError(ENOSPC)`` until ``set_full(False)``.

Test-only (to prove the checkers bite): ``lying_fsync_probability`` makes an ``fsync`` of a
segment file (``*.log``) report success without syncing, i.e. a disk that loses record data it
said was durable (``sync_filesystem``, the model of ``syncfs(2)`` that the group commit uses for
large groups, lies the same way, file by file). (Lying about checkpoints too mostly makes recovery refuse to start, which
hides the lost records behind a dead node.)

fsync latency is modelled in ``SimEnv.run_sync`` (``fsync_latency_s``), which is where the
broker's group commit calls ``fsync``.
"""

from __future__ import annotations

import errno
import random
from typing import Callable, Sequence

import attrs

from rivven_broker.protocol import limits
from rivven_broker.storage.file_store import Buffer
from rivven_broker.storage.memory_store import MemoryFileStore
from sim.trace import Trace

__all__ = ["DiskConfig", "SimDisk", "DiskView"]

_NEEDS_SPACE = frozenset({"pwrite", "pwritev", "allocate", "makedirs"})
_SYNCS = frozenset({"fsync", "sync_filesystem", "fsync_dir"})


@attrs.frozen
class DiskConfig:
    fsync_latency_min_ms: float = 0.5
    fsync_latency_max_ms: float = 5.0
    torn_write_probability: float = 0.5
    #: A group commit of this many files or more uses ``sync_filesystem`` (the broker's bound
    #: by default; a scenario lowers it to run its small groups through that path).
    sync_filesystem_files_min: int = limits.sync_filesystem_files_min
    #: Test-only: probability that an fsync silently does nothing.
    lying_fsync_probability: float = 0.0
    #: Test-only: the same, for the controller's Raft journal and snapshot (``.controller/``;
    #: not its reconciled-floor checkpoint: a damaged one stops the broker at start, which
    #: would hide the lost journal entries behind dead nodes).
    raft_lying_fsync_probability: float = 0.0

    def __attrs_post_init__(self) -> None:
        assert 0 <= self.fsync_latency_min_ms <= self.fsync_latency_max_ms
        assert 0.0 <= self.torn_write_probability <= 1.0
        assert 0.0 <= self.lying_fsync_probability <= 1.0
        assert self.sync_filesystem_files_min >= 1


class SimDisk:
    """One node's disk. Never blocks; every method is synchronous."""

    def __init__(self, node: str, config: DiskConfig, rng: random.Random, trace: Trace) -> None:
        self.node = node
        self.config = config
        self.store = MemoryFileStore()
        self.store.fault_hook = self._fault_hook
        self._rng = rng
        self._trace = trace
        self._view: DiskView | None = None
        self._fsyncs_to_fail = 0
        self._full = False
        #: How many injected fsync failures have fired, and who to tell when one does.
        self.fsync_failures = 0
        #: Every injected error raised so far (EIO and ENOSPC).
        self.errors_raised = 0
        self.on_fsync_failure: Callable[[], None] | None = None

    def view(self) -> DiskView:
        """Revoke the current view (if any) and return a fresh one for a new incarnation."""
        if self._view is not None:
            self._view.alive = False
        self._view = DiskView(self)
        return self._view

    def crash(self, tear: bool | None = None) -> bool:
        """Power loss: revoke the view, drop unsynced data, maybe tear the last write.

        ``tear`` forces the choice; by default it is drawn with ``torn_write_probability``.
        Returns whether the last unsynced write (if any) was torn.
        """
        if self._view is not None:
            self._view.alive = False
            self._view = None
        drawn = self._rng.random() < self.config.torn_write_probability
        tear = drawn if tear is None else tear
        self.store.crash(self._rng, tear_last_write=tear)
        self._trace.event("disk.crash", self.node, tear)
        return tear

    def clear_faults(self) -> None:
        """Heal: no more failing fsyncs, space again."""
        self._fsyncs_to_fail = 0
        self._full = False
        self._trace.event("disk.heal", self.node)

    def fail_fsyncs(self, count: int) -> None:
        """Make the next ``count`` fsyncs fail with EIO."""
        assert count >= 0
        self._fsyncs_to_fail += count
        self._trace.event("disk.fail_fsyncs", self.node, count)

    def set_full(self, full: bool) -> None:
        """Start or stop refusing writes that need space with ENOSPC."""
        self._full = full
        self._trace.event("disk.full", self.node, full)

    def fsync_latency_s(self) -> float:
        low, high = self.config.fsync_latency_min_ms, self.config.fsync_latency_max_ms
        return (low if low == high else self._rng.uniform(low, high)) / 1000.0

    def _fault_hook(self, op: str, path: str) -> None:
        if op in _SYNCS and self._fsyncs_to_fail:
            self._fsyncs_to_fail -= 1
            self.fsync_failures += 1
            self.errors_raised += 1
            self._trace.event("disk.eio", self.node, op, path)
            if self.on_fsync_failure is not None:
                self.on_fsync_failure()
            raise OSError(errno.EIO, "injected fsync failure", path)
        if self._full and (op in _NEEDS_SPACE or (op == "open" and not self.store.exists(path))):
            self._trace.event("disk.enospc", self.node, op, path)
            self.errors_raised += 1
            raise OSError(errno.ENOSPC, "injected: no space left on device", path)

    def _lie(self, path: str) -> bool:
        p = self.config.lying_fsync_probability
        if (path.startswith(".controller/") or path.startswith("./.controller/")) \
                and ".checkpoint" not in path:  # the Raft journal and snapshot, not the floor
            p = self.config.raft_lying_fsync_probability
        elif not path.endswith(".log"):
            p = 0.0
        if p and self._rng.random() < p:
            self._trace.event("disk.lie", self.node, path)
            return True
        return False


class DiskView:
    """An incarnation's ``FileStore``: the node's store until a crash revokes it."""

    def __init__(self, disk: SimDisk) -> None:
        self._disk = disk
        self._store = disk.store
        self._paths: dict[int, str] = {}
        self.alive = True

    def _live(self) -> MemoryFileStore:
        if not self.alive:
            raise OSError(errno.EIO, f"{self._disk.node} has crashed")
        return self._store

    def open(self, path: str, *, create: bool = True) -> int:
        handle = self._live().open(path, create=create)
        self._paths[handle] = path
        return handle

    def close(self, handle: int) -> None:
        self._live().close(handle)
        self._paths.pop(handle, None)

    def size(self, handle: int) -> int:
        return self._live().size(handle)

    def pwrite(self, handle: int, data: Buffer, position: int) -> None:
        self._live().pwrite(handle, data, position)

    def pwritev(self, handle: int, parts: Sequence[Buffer], position: int) -> None:
        self._live().pwritev(handle, parts, position)

    def pread(self, handle: int, size: int, position: int) -> bytes:
        return self._live().pread(handle, size, position)

    def region(self, handle: int, size: int, position: int) -> bytes:
        return self._live().region(handle, size, position)

    def fsync(self, handle: int) -> None:
        store = self._live()
        if self._disk._lie(self._paths.get(handle, "")):
            return
        store.fsync(handle)

    def sync_filesystem(self) -> bool:
        return self._live().sync_filesystem(skip=self._disk._lie)

    def truncate(self, handle: int, size: int) -> None:
        self._live().truncate(handle, size)

    def allocate(self, handle: int, size: int) -> None:
        self._live().allocate(handle, size)

    def exists(self, path: str) -> bool:
        return self._live().exists(path)

    def listdir(self, path: str) -> list[str]:
        return self._live().listdir(path)

    def makedirs(self, path: str) -> None:
        self._live().makedirs(path)

    def rename(self, source: str, target: str) -> None:
        self._live().rename(source, target)

    def remove(self, path: str) -> None:
        self._live().remove(path)

    def remove_dir(self, path: str) -> None:
        self._live().remove_dir(path)

    def fsync_dir(self, path: str) -> None:
        self._live().fsync_dir(path)
