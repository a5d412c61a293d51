"""A partition's producer state survives restarts and crashes exactly as the log does.

Goal: ``Partition`` (snapshots + header replay + the aborted-transaction index) always
reopens to the state a full replay of the surviving log gives, whatever happened before:
graceful restarts, power losses at any point (unsynced writes dropped), segment rolls (which
write snapshots), plain, idempotent and transactional appends and COMMIT/ABORT markers.
Method: Hypothesis draws a sequence of such operations over a ``MemoryFileStore`` (which
models the durable and volatile layers of a disk); after every reopen the state is compared
with a model rebuilt from scratch from the log's batch headers, and invariants are checked.
Plus example tests for the produce path's verdicts and for damaged snapshots.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rivven_broker.storage.producer_state import ProducerStateManager
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.records import BatchBuilder
from rivven_broker.records.control import ControlType, read_control_batch
from rivven_broker.storage.partition import (
    Partition,
    snapshot_file_name,
)
from rivven_broker.storage.log_config import LogConfig
from rivven_broker.storage.memory_store import MemoryFileStore
from rivven_broker.storage.partition_log import PartitionLog
from rivven_broker.storage.txn_index import AbortedTxnIndex

DIRECTORY = "t-0"
CONFIG = LogConfig(segment_bytes=1024)


def allow(header):
    return ErrorCode.NONE


def open_state(store: MemoryFileStore) -> Partition:
    plog, _ = PartitionLog.open(store, DIRECTORY, CONFIG, 0)
    state, _ = Partition.open(plog)
    state.check_invariants()
    return state


def fresh_store() -> MemoryFileStore:
    store = MemoryFileStore()
    store.makedirs(DIRECTORY)
    store.fsync_dir("")
    return store


def batch(pid: int = -1, seq: int = -1, *, txn: bool = False, n: int = 2) -> bytes:
    builder = BatchBuilder(batch_bytes_max=4096, producer_id=pid,
                           producer_epoch=0 if pid >= 0 else -1, base_sequence=seq,
                           transactional=txn)
    for i in range(n):
        builder.append(1_000 + i, None, b"value-%d" % i)
    return builder.build()


def model(plog: PartitionLog) -> tuple[ProducerStateManager, AbortedTxnIndex]:
    """The state a full replay of the log gives (what every reopen must equal)."""
    state, index = ProducerStateManager(plog.log_start_offset), AbortedTxnIndex()
    for header in plog.iter_headers(0):
        control = None
        if header.is_control:
            data = plog.read(header.base_offset, 512).records
            control = read_control_batch(data)[1].kind
        completed = state.load_batch(header, control)
        entry = None if completed is None else completed.aborted_entry()
        if entry is not None:
            index.append(entry)
    return state, index


def same(tested: Partition) -> None:
    expected, index = model(tested.log)
    assert tested.state.end_offset == expected.end_offset == tested.log.log_end_offset
    assert tested.state.producers() == expected.producers()
    assert tested.state.ongoing_transactions() == expected.ongoing_transactions()
    assert tested.index.index.entries() == index.entries()


def next_sequence(state: Partition, pid: int) -> int:
    info = state.state.producers().get(pid)
    return info.batches[-1].last_seq + 1 if info is not None and info.batches else 0


OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("plain")),
        st.tuples(st.just("idempotent"), st.integers(1, 3)),
        st.tuples(st.just("transactional"), st.integers(1, 3)),
        st.tuples(st.just("marker"), st.integers(1, 3), st.booleans()),
        st.tuples(st.just("flush")),
        st.tuples(st.just("roll")),
        st.tuples(st.just("crash")),
        st.tuples(st.just("restart")),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPERATIONS)
def test_reopening_always_equals_a_full_replay_of_the_surviving_log(operations):
    store = fresh_store()
    state = open_state(store)
    for operation in operations:
        kind = operation[0]
        if kind == "plain":
            assert state.append_as_leader(batch(), 0, allow).info is not None
        elif kind in ("idempotent", "transactional"):
            pid = operation[1]
            records = batch(pid, next_sequence(state, pid), txn=kind == "transactional")
            state.append_as_leader(records, 0, allow)  # may be refused (a transaction is open ...)
        elif kind == "marker":
            kind_ = ControlType.COMMIT if operation[2] else ControlType.ABORT
            state.append_marker(kind_, operation[1], 0, 0)
        elif kind == "flush":
            state.log.flush()
        elif kind == "roll":
            state.log.roll(0)
        elif kind == "crash":
            store.crash()
            state = open_state(store)
            same(state)
        else:
            state.close(snapshot=True)
            state.log.close()
            state = open_state(store)
            same(state)
        state.check_invariants()
    same(state)


def test_the_produce_path_answers_duplicates_and_refusals_without_writing():
    state = open_state(fresh_store())
    first = state.append_as_leader(batch(5, 0), 0, allow)
    assert first.info is not None and first.info.base_offset == 0
    again = state.append_as_leader(batch(5, 0), 0, allow)
    assert again.info is None and again.duplicate.first_offset == 0
    gap = state.append_as_leader(batch(5, 9), 0, allow)
    assert gap.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE
    refused = state.append_as_leader(batch(6, 0, txn=True), 0, lambda h: ErrorCode.INVALID_TXN_STATE)
    assert refused.error_code == ErrorCode.INVALID_TXN_STATE
    two = state.append_as_leader(batch(5, 2) + batch(5, 4), 0, allow)
    assert two.error_code == ErrorCode.INVALID_REQUEST
    assert state.log.log_end_offset == 2  # nothing but the first batch was written
    assert state.append_as_leader(batch() + batch(), 0, allow).info.batch_count == 2  # plain: any count
    assert state.state.end_offset == state.log.log_end_offset == 6


def test_snapshots_past_the_log_end_and_damaged_ones_are_dropped():
    store = fresh_store()
    state = open_state(store)
    for seq in range(0, 10, 2):
        state.append_as_leader(batch(1, seq), 0, allow)
    state.log.flush()
    assert state.write_snapshot()
    good = snapshot_file_name(10)
    state.append_as_leader(batch(1, 10), 0, allow)
    assert state.write_snapshot()  # a snapshot at 12 whose data is not synced
    store.crash()
    reopened, report = Partition.open(PartitionLog.open(store, DIRECTORY, CONFIG, 0)[0])
    assert report.snapshot_offset == 10 and report.snapshots_dropped == (snapshot_file_name(12),)
    same(reopened)
    # A damaged snapshot is ignored: the log is replayed from its start instead.
    reopened.close(snapshot=False)
    reopened.log.close()
    store.corrupt(f"{DIRECTORY}/{good}", 12, b"\xff\xff")
    again, report = Partition.open(PartitionLog.open(store, DIRECTORY, CONFIG, 0)[0])
    assert report.snapshot_offset is None and good in report.snapshots_dropped
    assert report.batches_replayed == 5
    same(again)


TRANSACTIONS = st.lists(
    st.one_of(
        st.tuples(st.just("plain")),
        st.tuples(st.just("write"), st.integers(1, 3)),
        st.tuples(st.just("end"), st.integers(1, 3), st.booleans()),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(TRANSACTIONS, st.integers(0, 40))
def test_read_committed_sees_exactly_the_committed_and_plain_records(operations, start_at):
    """The aborted-transaction index (broker) and ``aborted_batch_filter`` (client) together
    drop exactly the records of aborted transactions, from any fetch start below the LSO."""
    from rivven_broker.client.fetch_state import CompletedFetch, decode_completed
    from rivven_broker.client.types import TopicPartition

    state = open_state(fresh_store())
    open_values: dict[int, list[tuple[int, bytes]]] = {}
    visible: list[tuple[int, bytes]] = []  # (offset, value) a read_committed reader must see
    counter = 0
    for operation in operations:
        if operation[0] == "end":
            pid, commit = operation[1], operation[2]
            kind = ControlType.COMMIT if commit else ControlType.ABORT
            if state.append_marker(kind, pid, 0, 0) is not None and commit:
                visible += open_values.get(pid, [])
            open_values.pop(pid, None)
            continue
        counter += 1
        value = b"v%d" % counter
        builder_pid = -1 if operation[0] == "plain" else operation[1]
        seq = -1 if builder_pid < 0 else next_sequence(state, builder_pid)
        builder = BatchBuilder(batch_bytes_max=4096, producer_id=builder_pid,
                               producer_epoch=0 if builder_pid >= 0 else -1, base_sequence=seq,
                               transactional=builder_pid >= 0)
        builder.append(1_000, None, value)
        appended = state.append_as_leader(builder.build(), 0, allow)
        if appended.info is None:
            continue
        if builder_pid < 0:
            visible.append((appended.info.base_offset, value))
        else:
            open_values.setdefault(builder_pid, []).append((appended.info.base_offset, value))
    stable = state.last_stable_offset(state.log.log_end_offset)
    bases = [h.base_offset for h in state.log.iter_headers(0) if h.base_offset < stable]
    start = bases[start_at % len(bases)] if bases else 0
    data = b""
    offset = start
    while offset < stable:
        read = state.log.read(offset, 1 << 20, max_offset=stable)
        data += read.records
        offset = read.next_offset
    aborted = tuple(state.aborted_in(start, stable))
    completed = CompletedFetch(TopicPartition("t", 0), 0, start, data, stable, stable, aborted)
    got = [record.value for record in decode_completed(completed)[0]]
    assert got == [value for offset, value in sorted(visible) if start <= offset < stable]


def test_one_marker_batch_serves_every_partition_of_a_transaction():
    """The transaction driver builds a marker's control batch once and appends the same bytes
    to each partition: each log gives it its own base offset (outside the CRC) and ends the
    producer's transaction there, exactly as a batch built per partition would."""
    from rivven_broker.records.control import build_control_batch
    from rivven_broker.records.header import parse_header

    states = []
    for leading in (0, 3):  # the marker lands at different offsets in the two partitions
        state = open_state(fresh_store())
        for _ in range(leading):
            assert state.append_as_leader(batch(), 0, allow).info is not None
        assert state.append_as_leader(batch(7, 0, txn=True), 0, allow).info is not None
        states.append(state)
    shared = build_control_batch(ControlType.COMMIT, 7, 0, 5_000)
    offsets = [state.append_marker(ControlType.COMMIT, 7, 0, 5_000, shared) for state in states]
    assert offsets == [2, 8]  # two records a batch
    for state, offset in zip(states, offsets):
        assert state.state.ongoing_transactions() == {}
        stored = state.log.read(offset, 512).records
        assert parse_header(stored).base_offset == offset
        assert read_control_batch(stored)[1].kind is ControlType.COMMIT  # its CRC checks out
        # The same bytes apart from what the log writes: base offset and leader epoch.
        assert stored[8:12] == shared[8:12] and stored[16:] == shared[16:]
        assert state.last_stable_offset(state.log.log_end_offset) == state.log.log_end_offset
        same(state)
