"""The partition log against a plain list of batches, through appends, reads, rolls, retention,
deletes, truncation, group commits, clean restarts and crashes.

Method: a Hypothesis ``RuleBasedStateMachine`` drives a ``PartitionLog`` on a
``MemoryFileStore`` with tiny segments (1 KiB) and a tiny index interval, and mirrors every
change in a model that is just a list of ``(base, next, stored bytes)``. Reads and timestamp
lookups are compared with the model; ``check_invariants(deep=True)`` runs after every step.
A crash (optionally tearing the last write, optionally in the middle of a group commit) must
keep every batch the log had declared durable, byte for byte, and leave a dense log that is a
prefix of the model; a clean close and reopen must need no repair at all.
"""

from __future__ import annotations

import errno
import random

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from rivven_broker.storage.errors import LogFailedError, OffsetOutOfRangeError
from rivven_broker.storage.log_config import LogConfig
from rivven_broker.storage.handle_cache import BoundedHandles
from rivven_broker.storage.memory_store import MemoryFileStore
from rivven_broker.storage.partition_log import PartitionLog, SyncTicket
from tests.unit.storage.log_batches import make_batch, stored

DIRECTORY = "topic-0"
SHAPES = st.lists(  # (record count, records bytes, timestamp skew) of each batch
    st.tuples(st.integers(1, 20), st.integers(0, 400), st.integers(-5000, 5000)),
    min_size=1, max_size=3,
)


class Model:
    """What the log should hold: every batch not truncated, and the readable range."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, int, bytes, int]] = []  # base, next, stored, max_ts
        self.start = 0
        self.end = 0

    def containing(self, offset: int) -> int:
        for i, (base, next_offset, _, _) in enumerate(self.batches):
            if base <= offset < next_offset:
                return i
        raise AssertionError(f"no batch holds {offset}")

    def truncate(self, offset: int) -> None:
        if offset >= self.end:
            return
        if offset < self.start:
            cut = offset
        else:
            cut = self.batches[self.containing(offset)][0]
        if cut <= self.start:
            self.batches, self.start, self.end = [], cut, cut
            return
        self.batches = [b for b in self.batches if b[0] < cut]
        self.end = cut

    def drop_from(self, offset: int) -> None:
        self.batches = [b for b in self.batches if b[0] < offset]


class PartitionLogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.store = MemoryFileStore()
        self.files: object = self.store
        self.model = Model()
        self.now_ms = 1_000_000
        self.tickets: list[tuple[SyncTicket, bool]] = []  # (ticket, fsynced yet)
        self.log: PartitionLog

    def _files(self) -> object:
        """The store the log sees (a fresh view after a crash, as a new process)."""
        self.files = self.store
        return self.files

    @initialize(
        preallocate=st.sampled_from([0, 300, 4096]),
        retention_bytes=st.sampled_from([-1, 2500]),
    )
    def open_log(self, preallocate: int, retention_bytes: int) -> None:
        self.config = LogConfig(
            segment_bytes=1024,
            segment_ms=60_000,
            retention_ms=120_000,
            retention_bytes=retention_bytes,
            index_interval_bytes=128,
            preallocate_bytes=preallocate,
        )
        self.log, report = PartitionLog.open(self._files(), DIRECTORY, self.config, self.now_ms)
        assert report.cuts == () and self.log.log_end_offset == 0

    # --- appends and reads ---------------------------------------------------------------------

    @rule(shapes=SHAPES, epoch=st.integers(0, 3), elapsed_ms=st.integers(0, 20_000))
    def append(self, shapes: list[tuple[int, int, int]], epoch: int, elapsed_ms: int) -> None:
        self.now_ms += elapsed_ms
        batches = [
            make_batch(count, bytes([count]) * size, max_timestamp=self.now_ms + skew)
            for count, size, skew in shapes
        ]
        try:
            info = self.log.append(b"".join(batches), self.now_ms, leader_epoch=epoch)
        finally:  # even a failed append may have written (some of) its batches
            base_offset = offset = self.model.end
            for (count, _, skew), batch in zip(shapes, batches):
                self.model.batches.append(
                    (offset, offset + count, stored(batch, offset, epoch), self.now_ms + skew)
                )
                offset += count
            self.model.end = offset
        assert info.base_offset == base_offset and info.batch_count == len(batches)
        assert info.last_offset == offset - 1

    @rule(data=st.data(), max_bytes=st.integers(0, 2000), bounded=st.booleans())
    def read(self, data: st.DataObject, max_bytes: int, bounded: bool) -> None:
        model = self.model
        offset = data.draw(st.integers(model.start, model.end))
        max_offset = data.draw(st.integers(model.start, model.end + 1)) if bounded else None
        result = self.log.read(offset, max_bytes, max_offset=max_offset)
        if offset == model.end:
            assert result.records == b"" and result.next_offset == offset
            return
        first = model.containing(offset)
        limit = model.end + 1 if max_offset is None else max_offset
        if model.batches[first][0] >= limit:
            assert result.records == b"" and result.batch_count == 0
            return
        count = result.batch_count
        assert count >= 1
        chosen = model.batches[first : first + count]
        assert result.records == b"".join(b[2] for b in chosen)
        assert result.next_offset == chosen[-1][1]
        assert all(b[0] < limit for b in chosen)
        assert len(result.records) <= max(max_bytes, len(chosen[0][2]))
        if first + count < len(model.batches):
            following = model.batches[first + count]
            fits = len(result.records) + len(following[2]) <= max_bytes
            if fits and following[0] < limit:  # only a segment boundary stops the read early
                assert following[0] in self.log.segment_base_offsets

    @rule(data=st.data())
    def read_out_of_range(self, data: st.DataObject) -> None:
        model = self.model
        offset = data.draw(
            st.one_of(st.integers(model.end + 1, model.end + 50), st.integers(0, model.start - 1))
            if model.start > 0 else st.integers(model.end + 1, model.end + 50)
        )
        with pytest.raises(OffsetOutOfRangeError):
            self.log.read(offset, 100)

    @rule(skew=st.integers(-10_000, 25_000))
    def offset_for_timestamp(self, skew: int) -> None:
        target = self.now_ms + skew
        expected = next(
            (
                max(base, self.model.start)
                for base, next_offset, _, max_ts in self.model.batches
                if next_offset > self.model.start and max_ts >= target
            ),
            None,
        )
        assert self.log.offset_for_timestamp(target) == expected

    # --- segments and removal ------------------------------------------------------------------

    @rule()
    def roll(self) -> None:
        self.log.roll(self.now_ms)

    @rule(elapsed_ms=st.integers(0, 100_000))
    def retention(self, elapsed_ms: int) -> None:
        self.now_ms += elapsed_ms
        before = self.log.segment_base_offsets
        deleted = self.log.apply_retention(self.now_ms)
        after = self.log.segment_base_offsets
        assert after == before[deleted:] and after[-1] == before[-1]
        assert self.log.log_start_offset == max(self.model.start, after[0])
        self.model.start = self.log.log_start_offset
        kept = [b for b in self.model.batches if b[0] >= after[0]]
        assert self.log.size_bytes == sum(len(b[2]) for b in kept)

    @rule(data=st.data())
    def delete_records(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.model.start, self.model.end))
        assert self.log.delete_records(offset) == max(offset, self.model.start)
        self.model.start = max(offset, self.model.start)

    @rule(data=st.data())
    def truncate_to(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(0, self.model.end + 2))
        self.log.truncate_to(offset)
        self.model.truncate(offset)
        assert self.log.log_end_offset == self.model.end
        assert self.log.log_start_offset == self.model.start

    # --- durability ----------------------------------------------------------------------------

    @rule()
    def flush(self) -> None:
        self.complete_tickets()
        self.log.flush()
        assert self.log.durable_offset == self.log.log_end_offset

    @rule()
    def begin_sync(self) -> None:
        ticket = self.log.begin_sync()
        if ticket is not None:
            self.tickets.append((ticket, False))

    @precondition(lambda self: any(not done for _, done in self.tickets))
    @rule()
    def worker_fsyncs(self) -> None:
        """The sync worker's thread runs; appends may come before complete_sync."""
        i = next(i for i, (_, done) in enumerate(self.tickets) if not done)
        ticket = self.tickets[i][0]
        for handle in ticket.handles:
            self.files.fsync(handle)
        if ticket.directory is not None:  # a roll or retention changed names since
            self.files.fsync_dir(ticket.directory)
        self.tickets[i] = (ticket, True)

    @precondition(lambda self: any(done for _, done in self.tickets))
    @rule()
    def complete_sync(self) -> None:
        i = next(i for i, (_, done) in enumerate(self.tickets) if done)
        ticket = self.tickets.pop(i)[0]
        durable = self.log.durable_offset
        self.log.complete_sync(ticket)
        assert self.log.durable_offset >= durable

    @rule(shapes=SHAPES)
    def group_commit_racing_an_append(self, shapes: list[tuple[int, int, int]]) -> None:
        """begin_sync, the worker fsyncs, an append lands, then complete_sync."""
        ticket = self.log.begin_sync()
        if ticket is not None:
            for handle in ticket.handles:
                self.files.fsync(handle)
            if ticket.directory is not None:
                self.files.fsync_dir(ticket.directory)
        self.append(shapes, 0, 0)
        if ticket is not None:
            self.log.complete_sync(ticket)
            assert self.log.durable_offset == ticket.end_offset or self.tickets

    def complete_tickets(self) -> None:
        while self.tickets:
            if not self.tickets[0][1]:
                self.worker_fsyncs()
            self.complete_sync()

    @rule()
    def close_and_reopen(self) -> None:
        self.complete_tickets()
        self.log.close()
        assert self.store.open_handles() == 0
        self.log, report = PartitionLog.open(self._files(), DIRECTORY, self.config, self.now_ms)
        assert report.clean, report
        assert self.log.log_end_offset == self.model.end
        assert self.log.log_start_offset == self.model.start

    @rule(tear=st.booleans(), seed=st.integers(0, 2**32), partial_sync=st.booleans())
    def crash_and_reopen(self, tear: bool, seed: int, partial_sync: bool) -> None:
        rng = random.Random(seed)
        if partial_sync and self.tickets:  # the crash hits in the middle of a group commit
            for handle in self.tickets[-1][0].handles:
                if rng.random() < 0.5:
                    self.files.fsync(handle)
        durable = self.log.durable_offset
        self.tickets.clear()
        self.store.crash(rng, tear_last_write=tear)
        self.log, report = PartitionLog.open(self._files(), DIRECTORY, self.config, self.now_ms)
        self.check_after_crash(durable)

    @rule(shapes=SHAPES, seed=st.integers(0, 2**32), flush_first=st.booleans())
    def crash_in_the_middle_of_an_append(
        self, shapes: list[tuple[int, int, int]], seed: int, flush_first: bool
    ) -> None:
        """The process dies after an append's data write, before its index writes; the
        data write is torn (over synced preallocated zeros, if ``flush_first``)."""
        if flush_first:
            self.flush()
        durable = self.log.durable_offset

        def die_at_index_write(op: str, path: str) -> None:
            if op == "pwrite" and not path.endswith(".log"):
                raise OSError(errno.EIO, "simulated death")

        self.store.fault_hook = die_at_index_write
        try:
            self.append(shapes, 0, 0)
        except LogFailedError:
            pass
        finally:
            self.store.fault_hook = None
        self.tickets.clear()
        self.store.crash(random.Random(seed), tear_last_write=True)
        self.log, _ = PartitionLog.open(self._files(), DIRECTORY, self.config, self.now_ms)
        self.check_after_crash(durable)

    def check_after_crash(self, durable: int) -> None:
        log, model = self.log, self.model
        start, end = log.log_start_offset, log.log_end_offset
        assert start <= model.start, "a persisted log start never goes back"
        assert durable <= end <= model.end, (durable, end, model.end)
        kept = [b for b in model.batches if b[0] < end]
        if start == end and (not kept or kept[-1][1] != end):
            # the log ended below its persisted start (the crash took data that
            # delete_records had already given up) and restarted there
            model.batches, model.start, model.end = [], start, end
            return
        assert not kept or kept[-1][1] == end, "the log ends on a model batch boundary"
        for base, next_offset, _, _ in model.batches:
            if base >= start and next_offset <= durable:
                assert next_offset <= end, f"durable batch {base} lost (durable {durable})"
        model.drop_from(end)
        model.end, model.start = end, start
        offset = start
        while offset < end:  # what survived is exactly the model's batches
            result = log.read(offset, 10**6)
            first = model.containing(offset)
            chosen = model.batches[first : first + result.batch_count]
            assert result.records == b"".join(b[2] for b in chosen)
            offset = result.next_offset
        assert log.durable_offset == end

    # --- invariants ----------------------------------------------------------------------------

    @invariant()
    def log_invariants(self) -> None:
        self.log.check_invariants(deep=True)
        assert self.log.log_end_offset == self.model.end
        assert self.log.log_start_offset == self.model.start


PartitionLogMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestPartitionLog = PartitionLogMachine.TestCase


class BoundedHandlesMachine(PartitionLogMachine):
    """The same rules with the log's files behind ``BoundedHandles`` holding at most 4 open:
    every operation crosses evictions and reopenings (issue 16: bounded descriptors)."""

    def _files(self) -> object:
        self.files = BoundedHandles(self.store, 4)
        return self.files

    @invariant()
    def files_stay_bounded(self) -> None:
        if isinstance(self.files, BoundedHandles):
            stats = self.files.statistics()
            assert stats.open_now <= 4, stats  # strict, whatever is being written


class UnpinnedHandlesMachine(BoundedHandlesMachine):
    """As ``BoundedHandlesMachine`` with nothing pinned (``sync_policy=none``): written files
    are evicted too, and every fsync (a ticket's, a crash's half-done group commit) goes
    through a descriptor of its own, opened by path."""

    def _files(self) -> object:
        self.files = BoundedHandles(self.store, 4, pin_unsynced=False)
        return self.files

    @invariant()
    def nothing_pinned(self) -> None:
        if isinstance(self.files, BoundedHandles):
            stats = self.files.statistics()
            assert stats.pinned_now == 0 and stats.open_now <= 4, stats


BoundedHandlesMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestPartitionLogWithBoundedHandles = BoundedHandlesMachine.TestCase
UnpinnedHandlesMachine.TestCase.settings = BoundedHandlesMachine.TestCase.settings
TestPartitionLogWithUnpinnedHandles = UnpinnedHandlesMachine.TestCase
