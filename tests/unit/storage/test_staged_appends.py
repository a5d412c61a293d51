"""Staged appends (``storage/staged_appends.py``): a pass's appends written with one ``pwritev``
per partition give exactly what appending them one by one gives.

Goal: staging changes when bytes reach the file, never what is answered or stored: the same
offsets, duplicates and refusals, the same log bytes and segment boundaries, the same
producer state; nothing is visible (log end, reads, the group commit's dirty mark) before the
pass closes; a failed write fails every request staged in the partition and leaves the log
and the producer state as the pass found them.
Method: Hypothesis draws passes of plain, multi-batch, idempotent (in and out of sequence,
retried) and damaged requests and runs them through a ``Partition`` with an ``AppendPass``
and through one without (the reference), over ``MemoryFileStore``s with small segments (rolls
inside a pass); examples for visibility and for a failing write (the store's fault hook).
"""

from __future__ import annotations

import errno

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.records import BatchBuilder
from rivven_broker.storage.errors import StorageError
from rivven_broker.storage.log_config import LogConfig
from rivven_broker.storage.memory_store import MemoryFileStore
from rivven_broker.storage.partition import Partition, PartitionEvents, ProduceOutcome
from rivven_broker.storage.partition_log import PartitionLog
from rivven_broker.storage.staged_appends import AppendPass
from rivven_broker.records.header import BatchError

DIRECTORY = "t-0"
CONFIG = LogConfig(segment_bytes=1024)


def allow(header):
    return ErrorCode.NONE


def open_partition(staging: AppendPass | None, events: PartitionEvents = PartitionEvents()
                   ) -> tuple[Partition, MemoryFileStore]:
    store = MemoryFileStore()
    store.makedirs(DIRECTORY)
    store.fsync_dir("")
    plog, _ = PartitionLog.open(store, DIRECTORY, CONFIG, 0)
    partition, _ = Partition.open(plog, events=events, staging=staging)
    return partition, store


def batch(pid: int = -1, seq: int = -1, n: int = 1) -> bytes:
    builder = BatchBuilder(batch_bytes_max=4096, producer_id=pid,
                           producer_epoch=0 if pid >= 0 else -1, base_sequence=seq)
    for i in range(n):
        builder.append(1_000 + i, None, b"value-%d" % i)
    return builder.build()


def damaged(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 0xFF])


requests = st.one_of(
    st.builds(batch, n=st.integers(1, 3)),
    st.builds(lambda a, b: batch(n=a) + batch(n=b), st.integers(1, 2), st.integers(1, 2)),
    st.builds(batch, pid=st.sampled_from([1, 2]), seq=st.integers(0, 5), n=st.integers(1, 2)),
    st.builds(lambda n: damaged(batch(n=n)), st.integers(1, 2)),
)


def summary(outcome: ProduceOutcome | str) -> object:
    """What a request is answered: offsets, the original's offsets, a refusal or an error."""
    if isinstance(outcome, str):
        return outcome
    assert outcome.staged is None or (outcome.staged.done and outcome.staged.error is None)
    if outcome.info is not None:
        return ("appended", outcome.info.base_offset, outcome.info.last_offset)
    if outcome.duplicate is not None:
        return ("duplicate", outcome.duplicate.first_offset, outcome.duplicate.last_offset)
    return ("refused", outcome.error_code, outcome.message)


def attempt(partition: Partition, records: bytes, now_ms: int) -> ProduceOutcome | str:
    try:
        return partition.append_as_leader(records, now_ms, allow)
    except (StorageError, BatchError) as exc:
        return type(exc).__name__


def contents(partition: Partition) -> list[bytes]:
    plog, chunks, offset = partition.log, [], partition.log.log_start_offset
    while offset < plog.log_end_offset:
        read = plog.read(offset, 1 << 20)
        chunks.append(bytes(read.records))
        offset = read.next_offset
    return chunks


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(requests, min_size=1, max_size=12), min_size=1, max_size=6))
def test_a_pass_of_staged_appends_equals_appending_one_by_one(passes) -> None:
    staging = AppendPass()
    staged, _ = open_partition(staging)
    reference, _ = open_partition(None)
    for number, pass_requests in enumerate(passes):
        now_ms = 10 * number
        expected = [summary(attempt(reference, records, now_ms)) for records in pass_requests]
        staging.open()
        outcomes = [attempt(staged, records, now_ms) for records in pass_requests]
        staging.close()
        assert [summary(outcome) for outcome in outcomes] == expected
        staged.check_invariants()
    assert staged.log.segment_base_offsets == reference.log.segment_base_offsets
    assert contents(staged) == contents(reference)
    assert staged.state.producers() == reference.state.producers()
    assert staged.log.statistics().appends <= reference.log.statistics().appends


def test_nothing_staged_is_visible_before_the_pass_closes() -> None:
    staging = AppendPass()
    partition, store = open_partition(staging)
    partition.append_as_leader(batch(), 0, allow)  # written at once: no pass open
    plog = partition.log
    end, writes = plog.log_end_offset, store.stats.writes
    staging.open()
    first = partition.append_as_leader(batch(n=2), 0, allow)
    second = partition.append_as_leader(batch(pid=5, seq=0), 0, allow)
    retried = partition.append_as_leader(batch(pid=5, seq=0), 0, allow)
    follower = partition.append_as_leader(batch(pid=5, seq=1), 0, allow)
    assert first.info is not None and first.info.base_offset == end
    assert second.info is not None and second.info.base_offset == end + 2
    assert retried.duplicate is not None and retried.duplicate.first_offset == end + 2
    assert follower.info is not None and follower.info.base_offset == end + 3
    assert first.staged is second.staged is retried.staged is follower.staged
    assert plog.log_end_offset == end and partition.high_watermark == end
    assert plog.read(end, 1 << 20).records == b""
    assert store.stats.writes == writes and not first.staged.done
    staging.close()
    assert first.staged.done and first.staged.error is None
    assert store.stats.writes == writes + 1  # one write for the four requests
    assert plog.log_end_offset == end + 4 and partition.high_watermark == end + 4
    partition.check_invariants()


def test_a_failed_write_fails_every_staged_request_and_undoes_the_state() -> None:
    staging, progressed = AppendPass(), []
    partition, store = open_partition(staging, PartitionEvents(progressed=progressed.append))
    partition.append_as_leader(batch(pid=5, seq=0), 0, allow)
    before, end = partition.state.producers(), partition.log.log_end_offset

    def full_disk(op: str, path: str) -> None:
        if op == "pwritev":
            raise OSError(errno.ENOSPC, "No space left on device")

    staging.open()
    outcomes = [partition.append_as_leader(records, 0, allow) for records in (
        batch(), batch(pid=5, seq=1), batch(pid=5, seq=1), batch(pid=6, seq=0))]
    store.fault_hook = full_disk
    progressed.clear()
    staging.close()
    store.fault_hook = None
    written = outcomes[0].staged
    assert written is not None and written.done and isinstance(written.error, StorageError)
    assert all(outcome.staged is written for outcome in outcomes)
    assert outcomes[2].duplicate is not None  # a retry within the pass shares the fate
    assert progressed  # a failure is progress: the produce lane asks the waits again
    assert partition.state.producers() == before
    assert partition.log.log_end_offset == end and not partition.log.failed
    partition.check_invariants()
    again = partition.append_as_leader(batch(pid=5, seq=1), 0, allow)  # as if never sent
    assert again.info is not None and again.info.base_offset == end and again.staged is None


def test_what_is_counted_once_written_is_counted_only_for_a_write_that_succeeded() -> None:
    staging = AppendPass()
    partition, store = open_partition(staging)
    counted: list[str] = []
    staging.open()
    failing = partition.append_as_leader(batch(), 0, allow)
    failing.staged.on_written.append(lambda: counted.append("failed pass"))
    store.fault_hook = _full_disk
    staging.close()
    store.fault_hook = None
    staging.open()
    good = partition.append_as_leader(batch(), 0, allow)
    good.staged.on_written.append(lambda: counted.append("written pass"))
    assert counted == []  # nothing before the write
    staging.close()
    assert counted == ["written pass"] and good.staged.on_written == []


def _full_disk(op: str, path: str) -> None:
    if op == "pwritev":
        raise OSError(errno.ENOSPC, "No space left on device")
