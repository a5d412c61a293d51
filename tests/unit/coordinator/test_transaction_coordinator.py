"""The transaction coordinator through its driver contract: every api, fencing, timeouts,
expiry, crashes and failed appends.

Method: ``Driver`` plays the server. It keeps ``__transaction_state`` as a list of durable
records, holds each ``AppendTxnLog`` until the test (or ``settle``) makes it durable, collects
``WriteMarkers`` and replies, and can crash: the coordinator is rebuilt from the durable
records only. Tests check what is answered and WHEN (never before the deciding record is
durable), which markers are asked for with which epoch, and the error codes of
docs/exactly-once.md. ``check_invariants`` runs after every event.
"""

from __future__ import annotations

import itertools

import msgpack
import pytest

from rivven_broker.coordinator.transaction_coordinator import (
    FIRST_PRODUCER_ID,
    TransactionCoordinator,
)
from rivven_broker.coordinator.txn_events import (
    AppendTxnLog,
    MarkersWritten,
    ProducerIdsGranted,
    RequestProducerIds,
    TxnLogAppended,
    TxnLogAppendFailed,
    TxnReply,
    TxnRequestReceived,
    TxnTick,
    WriteMarkers,
)
from rivven_broker.coordinator.txn_log_codec import (
    CorruptTxnRecordError,
    PendingOffset,
    TxnMetadata,
    TxnState,
    decode_txn_record,
    encode_producer_id_block,
    encode_txn_key,
    encode_txn_metadata,
    encode_txn_tombstone,
)
from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.txn_messages import (
    AddOffsetsToTxn,
    AddPartitionsToTxn,
    AddPartitionsToTxnTopic,
    EndTxn,
    InitProducerId,
    TxnOffsetCommit,
    TxnOffsetCommitPartition,
    TxnOffsetCommitTopic,
)

OK = ErrorCode.NONE


class Driver:
    """A fake server around one coordinator: durable log, pending appends, markers, replies."""

    def __init__(self, block_size: int = 1000) -> None:
        self.block_size = block_size
        self.log: list[tuple[bytes, bytes | None]] = []
        self.now = 1_000_000
        self._tokens = itertools.count(1)
        self._start([])

    def _start(self, instructions_from_load: list) -> None:
        self.appends: dict[int, tuple[bytes, bytes | None]] = {}
        self.markers: list[WriteMarkers] = []
        self.replies: dict[int, object] = {}
        self.coordinator = TransactionCoordinator(producer_id_block_size=self.block_size)
        self._take(self.coordinator.load(list(self.log)))
        self.coordinator.check_invariants()

    def restart(self) -> None:
        """A crash: everything not durable is lost; rebuild from the log."""
        self._start([])

    def _take(self, instructions: list) -> None:
        for instruction in instructions:
            if isinstance(instruction, TxnReply):
                assert instruction.token not in self.replies
                self.replies[instruction.token] = instruction.response
            elif isinstance(instruction, AppendTxnLog):
                self.appends[instruction.append_id] = (instruction.key, instruction.value)
            else:
                assert isinstance(instruction, WriteMarkers)
                self.markers.append(instruction)

    def feed(self, event) -> None:
        self._take(self.coordinator.handle(event, self.now))
        self.coordinator.check_invariants()

    def send(self, request) -> int:
        token = next(self._tokens)
        self.feed(TxnRequestReceived(token, request))
        return token

    def ack(self, append_id: int | None = None) -> None:
        """Make the oldest (or the given) pending append durable."""
        append_id = min(self.appends) if append_id is None else append_id
        self.log.append(self.appends.pop(append_id))
        self.feed(TxnLogAppended(append_id))

    def fail(self, append_id: int | None = None) -> None:
        append_id = min(self.appends) if append_id is None else append_id
        del self.appends[append_id]
        self.feed(TxnLogAppendFailed(append_id))

    def write_markers(self) -> list[WriteMarkers]:
        written, self.markers = self.markers, []
        for m in written:
            done = MarkersWritten(m.transactional_id, m.producer_id, m.producer_epoch, m.committed)
            self.feed(done)
        return written

    def settle(self) -> list[WriteMarkers]:
        """Make everything durable and write every marker, until nothing is outstanding."""
        written = []
        while self.appends or self.markers:
            while self.appends:
                self.ack()
            written += self.write_markers()
        return written

    def call(self, request):
        """Send, settle, and return the response."""
        token = self.send(request)
        self.settle()
        return self.replies.pop(token)

    def state(self, transactional_id: str) -> TxnState:
        return self.coordinator.metadata(transactional_id).state


def add(txn: str, pid: int, epoch: int, *partitions: tuple[str, int]) -> AddPartitionsToTxn:
    topics: dict[str, list[int]] = {}
    for topic, partition in partitions:
        topics.setdefault(topic, []).append(partition)
    return AddPartitionsToTxn(
        txn, pid, epoch, tuple(AddPartitionsToTxnTopic(t, tuple(ps)) for t, ps in topics.items())
    )


def offsets_commit(group: str, pid: int, epoch: int, *parts: TxnOffsetCommitPartition):
    return TxnOffsetCommit("t", group, pid, epoch, topics=(TxnOffsetCommitTopic("in", parts),))


def codes(response) -> set[ErrorCode]:
    if hasattr(response, "error_code"):
        return {response.error_code}
    return {p.error_code for t in response.topics for p in t.partitions}


def init(driver: Driver, txn: str | None = "t", timeout_ms: int = 60_000):
    response = driver.call(InitProducerId(txn, timeout_ms))
    assert response.error_code == OK, response
    return response.producer_id, response.producer_epoch


# --- producer ids ----------------------------------------------------------------------------


def test_idempotent_producers_get_unique_ids_across_restarts():
    driver = Driver(block_size=2)
    first = [init(driver, None) for _ in range(3)]
    assert first == [(1, 0), (2, 0), (3, 0)]
    driver.restart()
    after = [init(driver, None) for _ in range(2)]
    assert after == [(5, 0), (6, 0)]  # the rest of the last durable block is skipped
    assert FIRST_PRODUCER_ID == 1


def test_requests_wait_for_a_durable_block_and_fail_with_it():
    driver = Driver(block_size=1)
    tokens = [driver.send(InitProducerId()) for _ in range(3)]
    assert driver.replies == {} and len(driver.appends) == 1
    driver.ack()  # one id: the first waiter is answered, the others park again
    assert driver.replies[tokens[0]].producer_id == 1 and len(driver.appends) == 1
    driver.fail()
    assert {driver.replies[t].error_code for t in tokens[1:]} == {
        ErrorCode.COORDINATOR_NOT_AVAILABLE
    }
    assert init(driver, None) == (2, 0)


def test_parked_requests_are_bounded(monkeypatch):
    monkeypatch.setattr(limits, "producer_id_waiters_max", 2)
    driver = Driver()
    tokens = [driver.send(InitProducerId()) for _ in range(3)]
    assert driver.replies[tokens[2]].error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
    driver.settle()
    assert {driver.replies[t].producer_id for t in tokens[:2]} == {1, 2}


def test_a_clustered_coordinator_takes_its_blocks_from_the_controller():
    """``producer_ids_from_controller``: no block record in the log; ``RequestProducerIds``,
    answered with ids anywhere (the controller's), also after a restart; a refusal fails the
    parked requests."""
    coordinator = TransactionCoordinator(producer_id_block_size=2,
                                         producer_ids_from_controller=True)
    meta = TxnMetadata("old", (1 << 32) + 5, 0, TxnState.EMPTY, 60_000, -1, 0)
    assert coordinator.load([encode_txn_metadata(meta)]) == []  # no block record needed
    out = coordinator.handle(TxnRequestReceived(1, InitProducerId()), 0)
    (ask,) = out
    assert isinstance(ask, RequestProducerIds) and ask.count == 2
    assert coordinator.handle(TxnRequestReceived(2, InitProducerId()), 0) == []  # parked
    granted = coordinator.handle(ProducerIdsGranted(ask.append_id, 7_000, 7_002), 0)
    assert sorted(r.response.producer_id for r in granted) == [7_000, 7_001]
    coordinator.check_invariants()
    (ask,) = coordinator.handle(TxnRequestReceived(3, InitProducerId()), 0)
    assert isinstance(ask, RequestProducerIds)
    (refused,) = coordinator.handle(TxnLogAppendFailed(ask.append_id), 0)
    assert refused.response.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
    coordinator.check_invariants()


# --- InitProducerId with a transactional id --------------------------------------------------


def test_init_maps_the_id_durably_and_bumps_the_epoch():
    driver = Driver()
    token = driver.send(InitProducerId("t"))
    driver.ack()  # the producer-id block
    assert token not in driver.replies  # the mapping is not durable yet
    driver.ack()
    assert (driver.replies[token].producer_id, driver.replies[token].producer_epoch) == (1, 0)
    assert init(driver) == (1, 1)
    driver.restart()
    assert init(driver) == (1, 2)
    assert init(driver, "other") == (1001, 0)  # a new block after the restart


def test_init_refuses_bad_timeouts_and_wrong_ids():
    driver = Driver()
    for timeout in (0, -5, limits.transaction_timeout_ms_max + 1):
        response = driver.call(InitProducerId("t", timeout))
        assert response.error_code == ErrorCode.INVALID_TRANSACTION_TIMEOUT
    pid, epoch = init(driver)
    wrong_id = driver.call(InitProducerId("t", producer_id=pid + 1, producer_epoch=epoch))
    assert wrong_id.error_code == ErrorCode.INVALID_PRODUCER_ID_MAPPING
    stale = driver.call(InitProducerId("t", producer_id=pid, producer_epoch=epoch + 3))
    assert stale.error_code == ErrorCode.PRODUCER_FENCED
    current = driver.call(InitProducerId("t", producer_id=pid, producer_epoch=epoch))
    assert current.producer_epoch == 1


def test_an_exhausted_epoch_moves_to_a_new_producer_id():
    driver = Driver()
    meta = TxnMetadata("t", 1, limits.producer_epoch_max - 2, TxnState.EMPTY, 60_000, -1, 0)
    driver.log = [encode_producer_id_block(1000), encode_txn_metadata(meta)]
    driver.restart()
    assert init(driver) == (1, limits.producer_epoch_max - 1)  # one bump left for an abort
    assert init(driver) == (1000, 0)
    assert driver.coordinator.metadata("t").producer_id == 1000


# --- one transaction -------------------------------------------------------------------------


def test_a_commit_is_answered_when_its_decision_is_durable_then_markers_complete_it():
    driver = Driver()
    pid, epoch = init(driver)
    assert codes(driver.call(add("t", pid, epoch, ("a", 0), ("b", 1)))) == {OK}
    assert driver.state("t") == TxnState.ONGOING
    token = driver.send(EndTxn("t", pid, epoch, True))
    assert token not in driver.replies and driver.markers == []
    driver.ack()
    assert driver.replies.pop(token).error_code == OK
    assert driver.state("t") == TxnState.PREPARE_COMMIT
    (markers,) = driver.markers
    assert (markers.committed, markers.producer_epoch) == (True, epoch)
    assert markers.partitions == (("a", 0), ("b", 1))
    busy = driver.call(add("t", pid, epoch, ("a", 0)))  # settles the markers too
    assert codes(busy) == {ErrorCode.CONCURRENT_TRANSACTIONS}
    assert driver.state("t") == TxnState.COMPLETE_COMMIT
    assert driver.call(EndTxn("t", pid, epoch, True)).error_code == OK  # a retry
    assert driver.call(EndTxn("t", pid, epoch, False)).error_code == ErrorCode.INVALID_TXN_STATE
    assert codes(driver.call(add("t", pid, epoch, ("c", 0)))) == {OK}  # the next transaction
    assert driver.coordinator.metadata("t").partitions == {("c", 0)}


def test_requests_check_the_id_the_producer_and_the_state():
    driver = Driver()
    pid, epoch = init(driver)
    assert codes(driver.call(add("x", pid, epoch, ("a", 0)))) == {
        ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
    }
    assert codes(driver.call(add("t", pid + 1, epoch, ("a", 0)))) == {
        ErrorCode.INVALID_PRODUCER_ID_MAPPING
    }
    assert codes(driver.call(add("t", pid, epoch + 1, ("a", 0)))) == {ErrorCode.PRODUCER_FENCED}
    assert codes(driver.call(add("t", pid, epoch, ("a", -1)))) == {
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    }
    assert driver.call(EndTxn("t", pid, epoch, True)).error_code == ErrorCode.INVALID_TXN_STATE
    assert codes(driver.call(add("t", pid, epoch))) == set()  # nothing asked, nothing begun
    assert driver.state("t") == TxnState.EMPTY


def test_an_abort_writes_abort_markers_and_drops_the_offsets():
    driver = Driver()
    pid, epoch = init(driver)
    driver.call(add("t", pid, epoch, ("out", 0)))
    assert driver.call(AddOffsetsToTxn("t", pid, epoch, "g")).error_code == OK
    commit = offsets_commit("g", pid, epoch, TxnOffsetCommitPartition(0, 42))
    assert codes(driver.call(commit)) == {OK}
    assert driver.coordinator.metadata("t").offsets == (PendingOffset("g", "in", 0, 42, None),)
    token = driver.send(EndTxn("t", pid, epoch, False))
    (markers,) = driver.settle()
    assert driver.replies[token].error_code == OK
    assert (markers.committed, markers.offsets) == (False, ())
    assert driver.state("t") == TxnState.COMPLETE_ABORT


def test_committed_offsets_travel_with_the_commit_markers():
    driver = Driver()
    pid, epoch = init(driver)
    assert driver.call(AddOffsetsToTxn("t", pid, epoch, "g")).error_code == OK
    wrong_group = offsets_commit("h", pid, epoch, TxnOffsetCommitPartition(0, 1))
    assert codes(driver.call(wrong_group)) == {ErrorCode.INVALID_TXN_STATE}
    for offset in (5, 9):
        parts = (TxnOffsetCommitPartition(0, offset, "m"), TxnOffsetCommitPartition(1, 3))
        request = offsets_commit("g", pid, epoch, *parts)
        assert codes(driver.call(request)) == {OK}
    driver.send(EndTxn("t", pid, epoch, True))
    (markers,) = driver.settle()
    assert markers.partitions == () and markers.committed
    assert markers.offsets == (
        PendingOffset("g", "in", 0, 9, "m"),
        PendingOffset("g", "in", 1, 3, None),
    )
    meta = driver.coordinator.metadata("t")
    assert (meta.state, meta.offsets, meta.groups) == (TxnState.COMPLETE_COMMIT, (), frozenset())


def test_txn_offset_commit_needs_an_ongoing_transaction():
    driver = Driver()
    pid, epoch = init(driver)
    request = TxnOffsetCommit("t", "g", pid, epoch)
    assert codes(driver.call(request)) == set()  # no partitions named: nothing to answer
    assert driver.call(AddOffsetsToTxn("t", pid, epoch, "g")).error_code == OK
    assert driver.call(AddOffsetsToTxn("t", pid, epoch, "g")).error_code == OK  # idempotent


def test_check_produce_follows_the_transaction():
    driver = Driver()
    pid, epoch = init(driver)
    check = driver.coordinator.check_produce
    assert check("t", pid, epoch, "a", 0) == ErrorCode.INVALID_TXN_STATE
    assert check("nope", pid, epoch, "a", 0) == ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
    driver.call(add("t", pid, epoch, ("a", 0)))
    assert check("t", pid, epoch, "a", 0) == OK
    assert check("t", pid, epoch, "a", 1) == ErrorCode.INVALID_TXN_STATE
    assert check("t", pid, epoch + 1, "a", 0) == ErrorCode.PRODUCER_FENCED
    driver.send(EndTxn("t", pid, epoch, True))
    assert check("t", pid, epoch, "a", 0) == ErrorCode.INVALID_TXN_STATE  # being decided
    driver.settle()
    assert check("t", pid, epoch, "a", 0) == ErrorCode.INVALID_TXN_STATE


# --- fencing, timeouts, expiry ---------------------------------------------------------------


def test_a_new_instance_fences_the_zombie_and_aborts_its_transaction():
    driver = Driver()
    pid, old_epoch = init(driver)
    driver.call(add("t", pid, old_epoch, ("a", 0)))
    busy = driver.call(InitProducerId("t"))
    assert busy.error_code == ErrorCode.CONCURRENT_TRANSACTIONS
    assert driver.state("t") == TxnState.COMPLETE_ABORT
    new_pid, new_epoch = init(driver)
    assert (new_pid, new_epoch) == (pid, old_epoch + 2)
    assert driver.call(EndTxn("t", pid, old_epoch, True)).error_code == ErrorCode.PRODUCER_FENCED
    fenced = driver.coordinator.check_produce("t", pid, old_epoch, "a", 0)
    assert fenced == ErrorCode.PRODUCER_FENCED


def test_the_fencing_abort_markers_carry_the_bumped_epoch():
    driver = Driver()
    pid, epoch = init(driver)
    driver.call(add("t", pid, epoch, ("a", 0)))
    driver.send(InitProducerId("t"))
    driver.ack()
    (markers,) = driver.markers
    assert (markers.committed, markers.producer_epoch, markers.partitions) == (
        False,
        epoch + 1,
        (("a", 0),),
    )


def test_a_transaction_older_than_its_timeout_is_aborted_on_tick():
    driver = Driver()
    pid, epoch = init(driver, timeout_ms=10_000)
    driver.call(add("t", pid, epoch, ("a", 0)))
    started = driver.coordinator.metadata("t").start_ms
    assert driver.coordinator.next_deadline_ms() == started + 10_001
    driver.now += 10_000
    driver.feed(TxnTick())
    assert driver.appends == {}  # not older than its timeout yet
    driver.now += 1
    driver.feed(TxnTick())
    (markers,) = driver.settle()
    assert (markers.committed, markers.producer_epoch) == (False, epoch + 1)
    assert driver.state("t") == TxnState.COMPLETE_ABORT
    assert driver.call(EndTxn("t", pid, epoch, True)).error_code == ErrorCode.PRODUCER_FENCED
    expiry = driver.coordinator.metadata("t").update_ms + limits.transactional_id_expiration_ms
    assert driver.coordinator.next_deadline_ms() == expiry


def test_idle_ids_expire_with_a_tombstone():
    driver = Driver()
    init(driver, "t")
    init(driver, "u")
    driver.now += limits.transactional_id_expiration_ms - 1
    pid, epoch = init(driver, "u")
    driver.call(add("u", pid, epoch, ("a", 0)))  # open: never expires while open
    driver.now += 1
    driver.feed(TxnTick())
    driver.settle()
    assert driver.coordinator.metadata("t") is None
    assert decode_txn_record(*driver.log[-1]).transactional_id == "t"
    driver.restart()
    assert driver.coordinator.metadata("t") is None
    assert driver.coordinator.metadata("u").state == TxnState.ONGOING


# --- crashes and failures --------------------------------------------------------------------


def test_a_logged_commit_completes_after_a_crash():
    driver = Driver()
    pid, epoch = init(driver)
    driver.call(add("t", pid, epoch, ("a", 0)))
    token = driver.send(EndTxn("t", pid, epoch, True))
    driver.ack()
    assert driver.replies[token].error_code == OK
    driver.restart()  # before any marker was written
    (markers,) = driver.markers
    assert (markers.committed, markers.partitions) == (True, (("a", 0),))
    busy = driver.call(EndTxn("t", pid, epoch, False))  # the markers are still outstanding
    assert busy.error_code == ErrorCode.CONCURRENT_TRANSACTIONS
    assert driver.state("t") == TxnState.COMPLETE_COMMIT


def test_a_crash_before_the_decision_is_durable_leaves_the_transaction_open():
    driver = Driver()
    pid, epoch = init(driver, timeout_ms=5_000)
    driver.call(add("t", pid, epoch, ("a", 0)))
    token = driver.send(EndTxn("t", pid, epoch, True))
    driver.restart()
    assert token not in driver.replies and driver.markers == []
    assert driver.state("t") == TxnState.ONGOING
    driver.now += 5_001  # start times are durable: the timeout holds across the restart
    driver.feed(TxnTick())
    (markers,) = driver.settle()
    assert not markers.committed


def test_a_failed_append_answers_retriably_and_changes_nothing():
    driver = Driver()
    pid, epoch = init(driver)
    driver.call(add("t", pid, epoch, ("a", 0)))
    token = driver.send(EndTxn("t", pid, epoch, True))
    driver.fail()
    assert driver.replies.pop(token).error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert driver.state("t") == TxnState.ONGOING
    assert driver.call(EndTxn("t", pid, epoch, True)).error_code == OK


def test_a_failed_completion_is_retried_on_tick():
    driver = Driver()
    pid, epoch = init(driver)
    driver.call(add("t", pid, epoch, ("a", 0)))
    driver.send(EndTxn("t", pid, epoch, False))
    driver.ack()
    driver.write_markers()
    driver.fail()  # the CompleteAbort record
    assert driver.state("t") == TxnState.PREPARE_ABORT
    driver.feed(TxnTick())
    assert driver.settle() == []  # completes without writing the markers again
    assert driver.state("t") == TxnState.COMPLETE_ABORT


def test_stale_marker_reports_are_ignored():
    driver = Driver()
    pid, epoch = init(driver)
    driver.feed(MarkersWritten("t", pid, epoch, True))
    driver.feed(MarkersWritten("nope", pid, epoch, True))
    driver.call(add("t", pid, epoch, ("a", 0)))
    driver.send(EndTxn("t", pid, epoch, True))
    driver.ack()
    driver.feed(MarkersWritten("t", pid, epoch, False))  # wrong decision
    driver.feed(MarkersWritten("t", pid, epoch + 1, True))  # wrong epoch
    assert driver.state("t") == TxnState.PREPARE_COMMIT and not driver.appends
    driver.feed(TxnLogAppended(12345))
    driver.feed(TxnLogAppendFailed(12345))


# --- the log records -------------------------------------------------------------------------


def test_records_round_trip_and_bad_ones_are_refused():
    meta = TxnMetadata(
        "t", 3, 2, TxnState.ONGOING, 1000, 5, 6, [("a", 1), ("a", 0)], ["g"],
        (PendingOffset("g", "x", 0, 7, None),),
    )
    assert decode_txn_record(*encode_txn_metadata(meta)) == meta
    assert decode_txn_record(*encode_txn_tombstone("t")).transactional_id == "t"
    assert decode_txn_record(*encode_producer_id_block(77)).block_end == 77
    key = encode_txn_key("t")
    good = msgpack.unpackb(encode_txn_metadata(meta)[1])
    bad_values = [
        b"\xc1",
        msgpack.packb({**good, "v": 9}),
        msgpack.packb({**good, "state": 6}),
        msgpack.packb({**good, "state": 0}),  # Empty with partitions
        msgpack.packb({**good, "producer_id": "x"}),
        msgpack.packb({**good, "partitions": [["a"]]}),
        msgpack.packb({**good, "offsets": [["g", "x", 0, "7", None]]}),
        msgpack.packb({**good, "offsets": [["h", "x", 0, 7, None]]}),  # group not added
        msgpack.packb({**good, "timeout_ms": 0}),
    ]
    for value in bad_values:
        with pytest.raises(CorruptTxnRecordError):
            decode_txn_record(key, value)
    for bad_key in (b"\x01", msgpack.packb([5, "t"]), msgpack.packb([1, ""]), msgpack.packb(5)):
        with pytest.raises(CorruptTxnRecordError):
            decode_txn_record(bad_key, None)


def test_load_refuses_inconsistent_producer_ids():
    meta = TxnMetadata("t", 5, 0, TxnState.EMPTY, 1000, -1, 0)
    for log in (
        [encode_txn_metadata(meta)],  # beyond any reserved block
        [
            encode_producer_id_block(10),
            encode_txn_metadata(meta),
            encode_txn_metadata(TxnMetadata("u", 5, 0, TxnState.EMPTY, 1000, -1, 0)),
        ],
    ):
        with pytest.raises(CorruptTxnRecordError):
            TransactionCoordinator().load(log)


def test_statistics_count_states():
    driver = Driver()
    pid, epoch = init(driver)
    driver.call(add("t", pid, epoch, ("a", 0)))
    stats = driver.coordinator.statistics()
    assert stats["state_ongoing"] == 1 and stats["transactional_ids"] == 1
    assert stats["next_producer_id"] == 2 and stats["producer_id_block_end"] == 1001
