"""The transaction coordinator against its log, through requests, appends that succeed, fail
or are lost in crashes, marker writes and ticks.

Method: a Hypothesis ``RuleBasedStateMachine`` drives the ``Driver`` of the coordinator unit
tests (a fake server holding ``__transaction_state`` as a list of durable records) for two
transactional ids and idempotent producers, with clients that sometimes use stale epochs, and
interleaves acks, failures, marker completions, time and crashes (rebuild from the durable
records) in any order. The model is the log itself, and these must hold at every step:

- rebuilding from the log at any point gives exactly the coordinator's durable state;
- in the log, a transaction's first decision is final: after PrepareCommit only
  PrepareCommit/CompleteCommit follow until it completes (a logged commit always completes as
  a commit), likewise for aborts, and no new transaction starts before completion;
- every WriteMarkers matches the latest durable decision, producer id and epoch;
- a success is only answered once its record is durable, and only to the current epoch;
- producer ids are unique across transactional ids and idempotent producers, and a
  transactional id's (producer id, epoch) only grows;
- after everything settles, no transaction is left in doubt.
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rivven_broker.coordinator.transaction_coordinator import TransactionCoordinator
from rivven_broker.coordinator.txn_events import TxnTick, WriteMarkers
from rivven_broker.coordinator.txn_log_codec import (
    TxnMetadata,
    TxnState,
    TxnTombstone,
    decode_txn_record,
)
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.txn_messages import (
    AddOffsetsToTxn,
    EndTxn,
    InitProducerId,
    TxnOffsetCommit,
    TxnOffsetCommitPartition,
    TxnOffsetCommitTopic,
)
from tests.unit.coordinator.test_transaction_coordinator import Driver, add

pytestmark = pytest.mark.slow

IDS = ("a", "b")
PARTITIONS = (("x", 0), ("x", 1), ("y", 0))
PREPARE = {TxnState.PREPARE_COMMIT: True, TxnState.PREPARE_ABORT: False}
COMPLETE = {TxnState.COMPLETE_COMMIT: True, TxnState.COMPLETE_ABORT: False}
THEN = st.sampled_from(["ack", "ack", "leave"])  # usually the log keeps up
STALE = st.sampled_from([False, False, False, True])


def latest(log, transactional_id: str) -> TxnMetadata | None:
    """The last durable record of ``transactional_id`` (None: unknown or tombstoned)."""
    found = None
    for key, value in log:
        record = decode_txn_record(key, value)
        if isinstance(record, TxnTombstone) and record.transactional_id == transactional_id:
            found = None
        elif isinstance(record, TxnMetadata) and record.transactional_id == transactional_id:
            found = record
    return found


class CheckingDriver(Driver):
    """A driver that checks every marker request and reply against the durable log."""

    def __init__(self) -> None:
        self.sent: dict[int, object] = {}
        self.answered: list[tuple[object, object]] = []
        super().__init__(block_size=3)

    def send(self, request) -> int:
        token = super().send(request)
        self.sent[token] = request
        return token

    def _take(self, instructions: list) -> None:
        for instruction in instructions:
            if isinstance(instruction, WriteMarkers):
                record = latest(self.log, instruction.transactional_id)
                assert record is not None and record.state in PREPARE, record
                assert PREPARE[record.state] == instruction.committed
                assert (record.producer_id, record.producer_epoch) == (
                    instruction.producer_id,
                    instruction.producer_epoch,
                )
        super()._take(instructions)
        for token in [t for t in self.replies if t in self.sent]:
            request, response = self.sent.pop(token), self.replies.pop(token)
            codes = {getattr(response, "error_code", None)} | {
                p.error_code for t in getattr(response, "topics", ()) for p in t.partitions
            }
            event(f"{type(request).__name__} -> {sorted(c.name for c in codes if c is not None)}")
            self._check_reply(request, response)
            self.answered.append((request, response))

    def _check_reply(self, request, response) -> None:
        ok = getattr(response, "error_code", None) == ErrorCode.NONE or (
            hasattr(response, "topics")
            and response.topics
            and all(p.error_code == ErrorCode.NONE for t in response.topics for p in t.partitions)
        )
        if not ok or (isinstance(request, InitProducerId) and request.transactional_id is None):
            return
        if isinstance(request, InitProducerId):
            record = latest(self.log, request.transactional_id)
            assert (record.producer_id, record.producer_epoch) == (
                response.producer_id,
                response.producer_epoch,
            )
            return
        record = latest(self.log, request.transactional_id)
        assert record is not None
        assert (record.producer_id, record.producer_epoch) == (
            request.producer_id,
            request.producer_epoch,
        ), "a success answered to a stale producer"
        if isinstance(request, EndTxn):
            decided = {**PREPARE, **COMPLETE}.get(record.state)
            assert decided == request.committed, (record, request)
        else:
            assert record.state == TxnState.ONGOING, record


class TransactionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.driver = CheckingDriver()
        self.producers: dict[str, list[tuple[int, int]]] = {t: [] for t in IDS}  # granted
        self.idempotent_ids: list[int] = []

    def _collect(self, then: str = "leave") -> None:
        """Take the answers; ``then`` "ack" makes every pending append durable first."""
        while then == "ack" and self.driver.appends:
            self.driver.ack()
        while self.driver.answered:
            request, response = self.driver.answered.pop(0)
            if not isinstance(request, InitProducerId) or response.error_code != ErrorCode.NONE:
                continue
            granted = (response.producer_id, response.producer_epoch)
            if request.transactional_id is None:
                self.idempotent_ids.append(response.producer_id)
            else:
                history = self.producers[request.transactional_id]
                assert not history or granted > history[-1], (granted, history)
                history.append(granted)
        owners: dict[int, str] = {}
        for transactional_id, history in self.producers.items():
            for producer_id, _ in history:
                assert owners.setdefault(producer_id, transactional_id) == transactional_id
        assert len(set(self.idempotent_ids)) == len(self.idempotent_ids)
        assert not set(self.idempotent_ids) & set(owners)

    def _client(self, transactional_id: str, stale: bool) -> tuple[int, int]:
        history = self.producers[transactional_id]
        if not history:
            return 1, 0
        return history[0] if stale else history[-1]

    @rule(transactional_id=st.sampled_from(IDS + (None,)), short=st.booleans(), then=THEN)
    def init(self, transactional_id, short, then):
        self.driver.send(InitProducerId(transactional_id, 5_000 if short else 60_000))
        self._collect(then)

    @rule(
        transactional_id=st.sampled_from(IDS),
        partitions=st.sets(st.sampled_from(PARTITIONS), min_size=1, max_size=2),
        stale=STALE,
        then=THEN,
    )
    def add_partitions(self, transactional_id, partitions, stale, then):
        pid, epoch = self._client(transactional_id, stale)
        self.driver.send(add(transactional_id, pid, epoch, *sorted(partitions)))
        self._collect(then)

    @rule(
        transactional_id=st.sampled_from(IDS), offset=st.integers(0, 9), stale=STALE, then=THEN
    )
    def commit_offsets(self, transactional_id, offset, stale, then):
        pid, epoch = self._client(transactional_id, stale)
        self.driver.send(AddOffsetsToTxn(transactional_id, pid, epoch, "g"))
        self._collect(then)
        topics = (TxnOffsetCommitTopic("in", (TxnOffsetCommitPartition(0, offset),)),)
        self.driver.send(TxnOffsetCommit(transactional_id, "g", pid, epoch, topics=topics))
        self._collect(then)

    @rule(transactional_id=st.sampled_from(IDS), committed=st.booleans(), stale=STALE, then=THEN)
    def end(self, transactional_id, committed, stale, then):
        pid, epoch = self._client(transactional_id, stale)
        self.driver.send(EndTxn(transactional_id, pid, epoch, committed))
        self._collect(then)

    @precondition(lambda self: self.driver.appends)
    @rule(fail=st.booleans(), newest=st.booleans())
    def append_outcome(self, fail, newest):
        append_id = max(self.driver.appends) if newest else min(self.driver.appends)
        (self.driver.fail if fail else self.driver.ack)(append_id)
        self._collect()

    @precondition(lambda self: self.driver.markers)
    @rule()
    def markers_written(self):
        self.driver.write_markers()
        self._collect()

    @rule(elapsed_ms=st.sampled_from([0, 4_000, 61_000]))
    def tick(self, elapsed_ms):
        self.driver.now += elapsed_ms
        deadline = self.driver.coordinator.next_deadline_ms()
        appends = len(self.driver.appends)
        self.driver.feed(TxnTick())
        if deadline is None or self.driver.now < deadline:
            assert len(self.driver.appends) == appends, "a tick before the deadline acted"
        self._collect()

    @rule(reached_disk=st.integers(0, 3))
    def crash(self, reached_disk):
        """A crash; the first ``reached_disk`` pending appends were durable, unacknowledged."""
        for append_id in sorted(self.driver.appends)[:reached_disk]:
            self.driver.log.append(self.driver.appends[append_id])
        event(f"crash with {len(self.driver.markers)} marker requests outstanding")
        self.driver.sent.clear()  # the connections died with the broker
        self.driver.restart()
        self._collect()

    @invariant()
    def the_log_is_the_truth(self):
        replayed = TransactionCoordinator()
        replayed.load(list(self.driver.log))
        replayed.check_invariants()
        assert replayed.transactions() == self.driver.coordinator.transactions()

    @invariant()
    def a_decision_is_final(self):
        for transactional_id in IDS:
            decided = None
            for key, value in self.driver.log:
                record = decode_txn_record(key, value)
                if getattr(record, "transactional_id", None) != transactional_id:
                    continue
                if isinstance(record, TxnTombstone):
                    assert decided is None
                elif record.state in PREPARE:
                    assert decided in (None, PREPARE[record.state]), record
                    decided = PREPARE[record.state]
                elif record.state in COMPLETE:
                    assert decided == COMPLETE[record.state], record
                    decided = None
                else:
                    assert decided is None, record

    def teardown(self):
        self.driver.settle()
        self.driver.feed(TxnTick())  # retries a completion whose append failed
        self.driver.settle()
        for meta in self.driver.coordinator.transactions().values():
            assert meta.state not in PREPARE, meta
        self.the_log_is_the_truth()
        self.a_decision_is_final()


TransactionMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestTransactionCoordinator = TransactionMachine.TestCase
