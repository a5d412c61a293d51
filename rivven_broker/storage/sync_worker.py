"""Group commit: one fsync worker makes every dirty partition log durable and wakes the waiters.

Theory of operation
-------------------
Appends go to the page cache at once (``PartitionLog.append`` is synchronous and never
fsyncs). Durability is a separate, shared step. After an append the producer path calls
``mark_dirty(log)`` (cheap, never blocks) and, under the ``always`` policy, awaits
``wait_durable(log, last_offset)`` before acknowledging.

The worker loop (``run``), under ``always``:

1. sleep until some log is dirty;
2. take the whole dirty set as one *group*: ``ticket = log.begin_sync()`` for each log;
3. make ONE ``run_sync`` call (``Env.run_fsync`` in the broker: on the loop itself while
   fsyncs are fast, on the fsync thread once slow, see ``server/sync_thread.py``) that fsyncs
   every handle of every ticket, then the directory of every ticket that names one (a log
   that rolled a segment or deleted some since its last sync: ``partition_log.py``);
4. ``log.complete_sync(ticket)`` for each, then wake every waiter whose offset is now durable
   (per-log heaps of ``(offset, trio.Event)``: exact wake-ups, no polling);
5. go straight back to 1: whatever was appended while the group's fsync ran is already dirty
   and forms the next group.

A log may also have a *listener* (``listen``): the worker calls it after every group that
synced the log, and after a failure. ``storage/partition.py`` listens so that a partition's
high watermark follows its durable offset and its waits wake (the server waits on partitions;
``wait_durable`` serves the storage bench and tools).

So N appenders that arrive while one fsync runs share the next fsync: the fsync count grows
with the disk's latency, not with the number of appenders. ``interval_ms=N`` runs the same
group step every N ms in the background and lets ``wait_durable`` return at once; ``none``
never fsyncs (the logs still flush on close).

The group in the caller's task (``write_then_commit``): the produce lane
(``server/produce_lane.py``) writes a pass's appends and, when nothing else is committing
and ``commit_in_caller()`` says so, runs that group itself instead of waking the worker:
steps 2-4 above, in its own task (shielded: a group once begun always completes). The
broker's ``commit_in_caller`` is true while the fsyncs run on the loop
(``server/sync_thread.py``), where the worker's task would block the loop just the same and
the hand-off to it (its wake-up, a scheduler round and the task steps) cost ~35 us of CPU
per group, ~2 us per request at sixteen one-record producers; once fsyncs are slow they run
on the thread, the worker commits again and the lane reads on meanwhile. The worker waits
while a group runs in another task (``write_then_commit``'s, or ``detach``'s), so groups
never overlap. The simulator's is always true (its fsync is a sleep of the committing
task), so scenarios run both: the lane's own groups and the worker's for every other
appender.

Failure: an fsync error (``OSError`` from ``run_sync``) is final. On Linux a failed fsync may
drop the dirty pages and clear the error, so retrying could report data durable that is gone.
The worker records a ``SyncFailedError``, wakes every waiter (each raises it), makes every later
``wait_durable``/``mark_dirty`` raise it, and ``run`` raises it so the node's nursery stops the
node. Tickets of a failed group are never completed, so their handles stay open until exit.
A waiter whose offset can no longer become durable for another reason (its log failed on a
write, or was truncated below the offset) is woken and raises ``SyncFailedError`` too.

Few syncs for many files: a group with ``limits.sync_filesystem_files_min`` (32) handles or
more of one store asks the store to ``sync_filesystem`` (``OsFileStore``: one ``syncfs(2)`` of
the data directory's file system, on Linux 5.8 or later where it reports write-back errors):
every file written before the call is durable after it, so the group is. A transaction over
50 topics dirties 51 partition files twice (data, then markers): on this host's ext4, 51
dirty files took ~2 ms and 0.2 ms of CPU by ``syncfs`` against ~4 ms and 1.7 ms by
``fdatasync`` on 8 threads (and ~70 ms one after the other). An error is an fsync error: the
worker fails for good, as below. A store that declines (another OS, an older kernel, a
mount point inside the data directory) gets fsyncs per file. The bound is the worker's
``filesystem_sync_files_min`` (the broker takes its ``Env``'s, if it has one: the simulator's
scenarios may lower it so that their small groups take this path too).

Concurrent fsyncs: a group's handles are fsynced one after the other unless the worker was
given ``fsync_each`` (the broker gives ``server/sync_thread.run_concurrently``): then a group of
``fsync_each_min`` handles or more is fsynced by several threads at once, and the group is
durable when the last of them returned, as before. A transaction over 50 topics dirties 51
partitions (twice: data, then markers); on ext4 their fsyncs share journal commits.

This is a trio driver; the logs it drives are the synchronous ``PartitionLog`` core. Only the
fsync calls (``fsync`` and ``fsync_dir``) leave the trio thread, and they touch only the
handles and directories of their tickets.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import re
from typing import Any, Awaitable, Callable, Protocol, Sequence

import attrs
import trio

from rivven_broker.protocol import limits
from rivven_broker.storage.errors import SyncFailedError
from rivven_broker.storage.file_store import FileStore

__all__ = [
    "SyncMode",
    "SyncPolicy",
    "SyncWorker",
    "SyncWorkerStatistics",
    "RunSync",
    "FsyncEach",
    "inline_run_sync",
]

#: Runs a synchronous function somewhere that may block, and returns its result.
RunSync = Callable[[Callable[[], Any]], Awaitable[Any]]
#: ``fsync_each(function, items)``: ``function(item)`` for every item, possibly on several
#: threads at once; returns once every call finished, raising the first error (blocking).
FsyncEach = Callable[[Callable[[Any], None], Sequence[Any]], None]
#: The fewest handles in a group that ``fsync_each`` is used for.
fsync_each_min = 3

_INTERVAL = re.compile(r"interval_ms=([1-9][0-9]{0,8})")


class SyncMode(enum.StrEnum):
    """How a ``SyncPolicy`` fsyncs (each equal to its name in ``--sync-policy``)."""

    ALWAYS = "always"  # a group commit before every acknowledgement
    INTERVAL = "interval"  # every ``interval_ms``, in the background
    NONE = "none"  # never (the logs still flush on close)


@attrs.frozen
class SyncPolicy:
    """When appended data is fsynced: ``always``, ``interval_ms=N`` or ``none``."""

    mode: SyncMode = attrs.field(converter=SyncMode)  # (a name converts: ``SyncPolicy("none")``)
    interval_ms: int = 0

    def __attrs_post_init__(self) -> None:
        assert (self.interval_ms > 0) == (self.mode is SyncMode.INTERVAL)

    @classmethod
    def parse(cls, text: str) -> SyncPolicy:
        """Parse ``always``, ``none`` or ``interval_ms=N`` (1 <= N < 10**9). Does not block.

        Raises:
            ValueError: anything else.
        """
        if text in (SyncMode.ALWAYS, SyncMode.NONE):
            return cls(SyncMode(text))
        match = _INTERVAL.fullmatch(text)
        if match is None:
            raise ValueError(f"sync policy must be always, none or interval_ms=N, not {text!r}")
        return cls(SyncMode.INTERVAL, int(match.group(1)))

    def __str__(self) -> str:
        return f"interval_ms={self.interval_ms}" if self.mode is SyncMode.INTERVAL \
            else self.mode.value


@attrs.frozen
class SyncWorkerStatistics:
    """Counters of a ``SyncWorker`` (cumulative except ``waiters`` and ``dirty_logs``)."""

    policy: str
    groups: int  # group commits completed
    fsyncs: int  # sync calls made (per group: one per handle and directory, or one syncfs)
    logs_synced: int  # log syncs completed (a group covers one or more logs)
    waits: int  # wait_durable calls that had to wait
    waiters: int  # tasks waiting right now
    dirty_logs: int  # logs waiting for the next group right now
    failed: bool


class SyncableLog(Protocol):
    """What the worker needs of a ``PartitionLog``."""

    @property
    def durable_offset(self) -> int: ...
    @property
    def log_end_offset(self) -> int: ...
    @property
    def store(self) -> FileStore: ...
    @property
    def dirty(self) -> bool: ...
    def begin_sync(self) -> Any: ...
    def complete_sync(self, ticket: Any) -> None: ...


async def inline_run_sync(function: Callable[[], Any]) -> Any:
    """Test/simulator ``RunSync``: a checkpoint, then ``function`` on the trio thread."""
    await trio.lowlevel.checkpoint()
    return function()


class SyncWorker:
    """The group-commit fsync driver for a set of partition logs. See the module docstring."""

    def __init__(self, policy: SyncPolicy, run_sync: RunSync,
                 fsync_each: FsyncEach | None = None, *,
                 filesystem_sync_files_min: int = limits.sync_filesystem_files_min,
                 commit_in_caller: Callable[[], bool] | None = None) -> None:
        assert filesystem_sync_files_min >= 0  # 0: never
        self.policy = policy
        self._run_sync = run_sync
        #: Whether ``write_then_commit`` may run the group in its caller's task now (module
        #: docstring); None: never.
        self._commit_in_caller = commit_in_caller
        self._quiet = False  # ``write_then_commit`` is writing: marks wake nobody yet
        self._fsync_each = fsync_each
        self._filesystem_sync_files_min = filesystem_sync_files_min
        # Logs hash by identity (``SyncableLog`` asks for no equality of its own).
        self._dirty: dict[SyncableLog, None] = {}  # in marking order
        self._waiters: dict[SyncableLog, list[tuple[int, int, trio.Event]]] = {}  # heaps
        self._listeners: dict[SyncableLog, Callable[[], None]] = {}
        self._sequence = itertools.count()
        self._wakeup = trio.Event()
        self._failure: SyncFailedError | None = None
        self._closing = False
        self._running = False
        self._stopped = trio.Event()
        self._in_flight: set[SyncableLog] = set()  # every log in the group being synced
        self._group_done = trio.Event()
        self._groups = self._fsyncs = self._logs_synced = self._waits = 0
        self._waiting = 0

    # --- the producer side -------------------------------------------------------------------

    def mark_dirty(self, log: SyncableLog) -> None:
        """Note that ``log`` has data that is not yet durable. Never blocks.

        Raises:
            SyncFailedError: an earlier fsync failed (the node must stop).
        """
        if self._failure is not None:
            raise self._failure
        if self.policy.mode is SyncMode.NONE:
            return
        self._dirty[log] = None
        if not self._quiet:
            self._wakeup.set()

    def listen(self, log: SyncableLog, listener: Callable[[], None]) -> None:
        """Call ``listener()`` (on the trio thread, never blocking) after every group that
        synced ``log``, and when an fsync failed. Replaces an earlier listener of the log."""
        self._listeners[log] = listener

    def unlisten(self, log: SyncableLog) -> None:
        self._listeners.pop(log, None)

    def check_healthy(self) -> None:
        """Raise the worker's failure, if an fsync failed. Never blocks.

        Raises:
            SyncFailedError: an earlier fsync failed (the node must stop).
        """
        if self._failure is not None:
            raise self._failure

    async def wait_durable(self, log: SyncableLog, offset: int) -> None:
        """Return once ``log.durable_offset > offset`` (``always``), or at once otherwise.

        Always a checkpoint. Blocks (under ``always``) until a group commit covers ``offset``.

        Raises:
            SyncFailedError: an fsync failed, or the worker closed before ``offset`` was durable.
        """
        assert offset < log.log_end_offset, (offset, log.log_end_offset)
        if self._failure is not None:
            raise self._failure
        if self.policy.mode is not SyncMode.ALWAYS or log.durable_offset > offset:
            await trio.lowlevel.checkpoint()
            return
        if self._closing and not self._running:
            raise SyncFailedError("the sync worker is closed")
        if log.dirty:  # not marked by the appender, and not in a group already
            self.mark_dirty(log)
        elif log not in self._in_flight:
            raise _never_durable(log, offset)
        event = trio.Event()
        heapq.heappush(self._waiters.setdefault(log, []), (offset, next(self._sequence), event))
        self._waits += 1
        self._waiting += 1
        try:
            await event.wait()
        finally:
            self._waiting -= 1
        if log.durable_offset <= offset:
            raise self._failure or _never_durable(log, offset)

    # --- the worker ----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The worker loop; run it in the node's nursery. Returns after ``aclose``.

        Raises:
            SyncFailedError: an fsync failed; every waiter has been failed too.
        """
        assert not self._running, "run() twice"
        self._running = True
        task_status.started()
        try:
            if self.policy.mode is SyncMode.ALWAYS:
                await self._run_always()
            elif self.policy.mode is SyncMode.INTERVAL:
                await self._run_interval()
            else:
                await self._until_closing()
        finally:
            self._running = False
            self._stopped.set()
            self._release_waiters()

    async def write_then_commit(self, write: Callable[[], None]) -> None:
        """``write()`` (appends, which mark their logs dirty), then the group commit of every
        dirty log: in this task when no group is running and ``commit_in_caller()`` allows,
        else by the worker, woken as ``mark_dirty`` wakes it (module docstring). Blocks on the
        group's fsyncs when it runs them (on the loop, in production). Once begun, the group
        is not cancelled.

        Raises:
            SyncFailedError: as ``mark_dirty``, or the group's fsync failed (the node must
                stop).
        """
        self._quiet = True
        here = False
        try:
            write()
            commit_in_caller = self._commit_in_caller
            here = self.policy.mode is SyncMode.ALWAYS and not self._in_flight \
                and commit_in_caller is not None and commit_in_caller()
        finally:
            self._quiet = False
            if self._dirty and not here:
                self._wakeup.set()  # the worker commits (also when ``write`` raised)
        if here and self._dirty:
            try:
                with trio.CancelScope(shield=True):  # a group begun must complete its tickets
                    await self._sync_group()
            except SyncFailedError:
                # Cancelled meanwhile (a stop; a crash in the simulator revokes the disk
                # first): the cancellation wins; the failure stays recorded for every waiter.
                await trio.lowlevel.checkpoint_if_cancelled()
                raise

    async def _run_always(self) -> None:
        while True:
            if self._in_flight:  # a group in another task: the logs it took are after it
                await self._group_done.wait()
                continue
            if not self._dirty:
                if self._closing:
                    return
                self._wakeup = trio.Event()
                await self._wakeup.wait()
                continue
            await self._sync_group()

    async def _run_interval(self) -> None:
        interval_s = self.policy.interval_ms / 1000
        while not self._closing:
            with trio.move_on_after(interval_s):
                await self._until_closing()
            if self._dirty:
                await self._sync_group()
        while self._dirty:
            await self._sync_group()

    async def _until_closing(self) -> None:
        while not self._closing:
            self._wakeup = trio.Event()
            await self._wakeup.wait()

    async def _sync_group(self) -> None:
        """One group commit over every dirty log (steps 2-4 of the module docstring)."""
        logs = list(self._dirty)
        self._dirty.clear()
        self._in_flight.update(logs)
        try:
            synced = await self._sync_logs(logs)
        finally:
            self._in_flight.difference_update(logs)
            self._signal_group_done()
        if synced:
            self._groups += 1
            self._logs_synced += synced
        for log in logs:
            self._wake_durable(log)

    async def _sync_logs(self, logs: Sequence[SyncableLog]) -> int:
        """begin_sync, ONE run_sync fsyncing every handle, complete_sync. Returns logs synced."""
        group = [(log, log.begin_sync()) for log in logs]
        pending = [(log, ticket) for log, ticket in group if ticket is not None]
        targets = [(log.store, handle) for log, ticket in pending for handle in ticket.handles]
        directories = list(dict.fromkeys(
            (log.store, ticket.directory) for log, ticket in pending
            if getattr(ticket, "directory", None) is not None))
        if targets or directories:
            try:
                calls = await self._run_sync(lambda: _fsync_all(
                    targets, directories, self._fsync_each, self._filesystem_sync_files_min))
            except OSError as exc:
                self._fail(SyncFailedError(f"fsync failed: {exc}"), exc)
            self._fsyncs += calls
        for log, ticket in pending:
            log.complete_sync(ticket)
        return len(pending)

    async def detach(self, log: SyncableLog) -> None:
        """Make ``log`` durable one last time and stop tracking it. Blocks on that fsync.

        Call before closing or deleting a log (appends to it must have stopped): it waits for
        an in-flight group that holds a ticket of the log, so no handle of it is being synced
        when the caller closes it. Waiters on the log wake (their data is durable now).

        Raises:
            SyncFailedError: an fsync failed (now or earlier).
        """
        while log in self._in_flight:
            await self._group_done.wait()
        self._dirty.pop(log, None)
        if self._failure is not None:
            raise self._failure
        if self.policy.mode is not SyncMode.NONE:
            self._in_flight.add(log)
            try:
                self._logs_synced += await self._sync_logs([log])
            finally:
                self._in_flight.discard(log)
                self._signal_group_done()
        else:
            await trio.lowlevel.checkpoint()
        self._wake_durable(log)
        for _, _, event in self._waiters.pop(log, []):
            event.set()

    def _signal_group_done(self) -> None:
        self._group_done.set()
        self._group_done = trio.Event()

    def _wake_durable(self, log: SyncableLog) -> None:
        listener = self._listeners.get(log)
        if listener is not None:
            listener()
        heap = self._waiters.get(log)
        if not heap:
            return
        durable = log.durable_offset
        while heap and heap[0][0] < durable:
            heapq.heappop(heap)[2].set()
        if heap and not log.dirty and log not in self._in_flight:
            # Nothing left to sync, yet offsets wait: the log failed or was truncated below
            # them. They can never become durable; wake them to raise.
            for _, _, event in heap:
                event.set()
            heap.clear()
        if not heap:
            del self._waiters[log]

    def _fail(self, failure: SyncFailedError, cause: BaseException) -> None:
        failure.__cause__ = cause
        self._failure = failure
        self._release_waiters()
        raise failure

    def _release_waiters(self) -> None:
        """Wake every waiter; each re-checks its offset and raises if it is not durable."""
        for listener in list(self._listeners.values()):
            listener()
        for heap in self._waiters.values():
            for _, _, event in heap:
                event.set()
        self._waiters.clear()

    async def aclose(self) -> None:
        """Sync whatever is dirty, stop the loop and return when it has stopped. Blocks.

        Works whether or not ``run`` was started (without it, the final group runs here).

        Raises:
            SyncFailedError: the final fsync (or an earlier one) failed.
        """
        self._closing = True
        self._wakeup.set()
        if self._running:
            await self._stopped.wait()
        else:
            while self._dirty and self._failure is None:
                await self._sync_group()
            self._release_waiters()
            await trio.lowlevel.checkpoint()
        if self._failure is not None:
            raise self._failure

    def statistics(self) -> SyncWorkerStatistics:
        """Counters for metrics and tests. Never blocks."""
        return SyncWorkerStatistics(
            policy=str(self.policy),
            groups=self._groups,
            fsyncs=self._fsyncs,
            logs_synced=self._logs_synced,
            waits=self._waits,
            waiters=self._waiting,
            dirty_logs=len(self._dirty),
            failed=self._failure is not None,
        )


def _never_durable(log: SyncableLog, offset: int) -> SyncFailedError:
    return SyncFailedError(
        f"offset {offset} cannot become durable: the sync worker stopped, or the log failed "
        f"or was truncated below it (durable up to {log.durable_offset})"
    )


def _fsync_all(targets: Sequence[tuple[FileStore, int]],
               directories: Sequence[tuple[FileStore, str]] = (),
               fsync_each: FsyncEach | None = None,
               filesystem_sync_files_min: int = limits.sync_filesystem_files_min) -> int:
    """Runs on the worker thread: make each handle durable, then fsync each directory, nothing
    else. Returns the sync calls made.

    A store with ``filesystem_sync_files_min`` (0: never) handles or more in the group is asked to
    ``sync_filesystem`` (one ``syncfs(2)``, which makes every file of the store durable, these
    included); a store that declines gets its handles fsynced like the rest. With
    ``fsync_each`` (the broker's: ``server/sync_thread.run_concurrently``) a group of
    ``fsync_each_min`` handles or more is handed to it, which fsyncs them on several threads
    at once and returns only after all of them (raising the first error): the file system
    commits its journal for several files at a time. Without (tests, the simulator, whose
    stores are deterministic) they are fsynced one after the other."""
    calls = 0
    if filesystem_sync_files_min and len(targets) >= filesystem_sync_files_min:
        by_store: dict[int, list[tuple[FileStore, int]]] = {}
        for target in targets:
            by_store.setdefault(id(target[0]), []).append(target)
        remaining: list[tuple[FileStore, int]] = []
        for share in by_store.values():
            if len(share) >= filesystem_sync_files_min and share[0][0].sync_filesystem():
                calls += 1
            else:
                remaining += share
        targets = remaining
    calls += len(targets) + len(directories)
    if fsync_each is not None and len(targets) >= fsync_each_min:
        fsync_each(_fsync_one, targets)
    else:
        for store, handle in targets:
            store.fsync(handle)
    for store, directory in directories:
        store.fsync_dir(directory)
    return calls


def _fsync_one(target: tuple[FileStore, int]) -> None:
    store, handle = target
    store.fsync(handle)
