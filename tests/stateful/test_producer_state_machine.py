"""ProducerStateManager against a brute-force model, through produces, markers, restarts from
the log and snapshot restores.

Method: a Hypothesis ``RuleBasedStateMachine`` sends batches from two producers with
sequences chosen to hit every rule (next, duplicate of any earlier batch, gap, overlap,
restart at 0, new or old epoch), transactional or not, plus plain batches and COMMIT/ABORT
markers (sometimes with a bumped epoch). The model keeps every accepted batch of the current
epoch in a list (sequences never wrap here; wrap-around has unit tests) and decides each
verdict by scanning it. The manager's verdicts, original offsets of duplicates, completed
transactions and LSO must match; replaying the stored headers, or restoring a snapshot, must
give exactly the live state. ``check_invariants`` runs after every step.
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from rivven_broker.storage.producer_state import ProducerStateManager
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.records.control import ControlType
from tests.unit.storage.test_producer_state import header

pytestmark = pytest.mark.slow

PRODUCERS = (1, 2)


class ModelProducer:
    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.batches: list[tuple[int, int, int, int]] = []  # first, last seq; first, last offset
        self.txn_first = -1


class Model:
    def __init__(self) -> None:
        self.producers: dict[int, ModelProducer] = {}
        self.end = 0

    def verdict(self, pid: int, epoch: int, seq: int, count: int, txn: bool):
        """(error code, original offsets of a duplicate or None)."""
        last = seq + count - 1
        entry = self.producers.get(pid)
        if entry is None:
            return (ErrorCode.NONE if seq == 0 else ErrorCode.UNKNOWN_PRODUCER_ID), None
        if epoch < entry.epoch:
            return ErrorCode.PRODUCER_FENCED, None
        if epoch == entry.epoch:
            for first_seq, last_seq, first_offset, last_offset in entry.batches[-5:]:
                if (first_seq, last_seq) == (seq, last):
                    return ErrorCode.NONE, (first_offset, last_offset)
        if entry.txn_first >= 0 and (not txn or epoch != entry.epoch):
            return ErrorCode.INVALID_TXN_STATE, None
        if epoch > entry.epoch or not entry.batches:
            return (ErrorCode.NONE if seq == 0 else ErrorCode.OUT_OF_ORDER_SEQUENCE), None
        current = entry.batches[-1][1]
        if seq == current + 1:
            return ErrorCode.NONE, None
        if 0 <= seq and last <= current:
            return ErrorCode.DUPLICATE_SEQUENCE, None
        return ErrorCode.OUT_OF_ORDER_SEQUENCE, None

    def append(self, pid: int, epoch: int, seq: int, count: int, txn: bool) -> None:
        entry = self.producers.setdefault(pid, ModelProducer(epoch))
        if epoch > entry.epoch:
            entry.epoch, entry.batches = epoch, []
        entry.batches.append((seq, seq + count - 1, self.end, self.end + count - 1))
        if txn and entry.txn_first < 0:
            entry.txn_first = self.end
        self.end += count

    def marker(self, pid: int, epoch: int, committed: bool):
        entry = self.producers.setdefault(pid, ModelProducer(epoch))
        if epoch > entry.epoch:
            entry.epoch, entry.batches = epoch, []
        first, entry.txn_first = entry.txn_first, -1
        offset = self.end
        self.end += 1
        return (first if first >= 0 else offset, offset, committed, first >= 0)

    def open_firsts(self) -> dict[int, int]:
        return {pid: p.txn_first for pid, p in self.producers.items() if p.txn_first >= 0}


class ProducerStateMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = ProducerStateManager()
        self.model = Model()
        self.stored: list = []

    def _next_seq(self, pid: int) -> int:
        entry = self.model.producers.get(pid)
        return entry.batches[-1][1] + 1 if entry and entry.batches else 0

    @rule(
        pid=st.sampled_from(PRODUCERS),
        epoch_move=st.sampled_from([0] * 8 + [1, -1]),
        how=st.sampled_from(["next"] * 4 + ["dup", "dup", "gap", "zero", "overlap"]),
        pick=st.integers(0, 10),
        count=st.integers(1, 3),
        txn=st.booleans(),
    )
    def produce(self, pid, epoch_move, how, pick, count, txn):
        entry = self.model.producers.get(pid)
        epoch = max(0, (entry.epoch if entry else 0) + epoch_move)
        seq = self._next_seq(pid)
        if how == "dup" and entry and entry.batches:
            first_seq, last_seq, _, _ = entry.batches[-1 - pick % len(entry.batches)]
            seq, count = first_seq, last_seq - first_seq + 1
        elif how == "gap":
            seq += 1 + pick
        elif how == "zero":
            seq = 0
        elif how == "overlap" and seq > 0:
            seq -= 1
            count += 1
        h = header(pid=pid, epoch=epoch, seq=seq, count=count, txn=txn)
        code, original = self.model.verdict(pid, epoch, seq, count, txn)
        verdict = self.state.check(h)
        assert verdict.error_code == code, (verdict, code)
        if original is not None:
            assert verdict.duplicate is not None
            assert (verdict.duplicate.first_offset, verdict.duplicate.last_offset) == original
            return
        assert verdict.duplicate is None
        if verdict.should_append:
            base = self.state.end_offset
            assert base == self.model.end
            assert self.state.update(h, base) is None
            self.model.append(pid, epoch, seq, count, txn)
            self.stored.append((h._replace(base_offset=base), None))

    @rule(count=st.integers(1, 3))
    def plain(self, count):
        h = header(pid=-1, epoch=-1, count=count)
        assert self.state.check(h).should_append
        base = self.state.end_offset
        self.state.update(h, base)
        self.model.end += count
        self.stored.append((h._replace(base_offset=base), None))

    @rule(pid=st.sampled_from(PRODUCERS), committed=st.booleans(), bump=st.booleans())
    def marker(self, pid, committed, bump):
        entry = self.model.producers.get(pid)
        epoch = (entry.epoch if entry else 0) + int(bump)
        assert self.state.check_marker(pid, epoch).should_append
        if entry and entry.epoch > 0:
            stale = self.state.check_marker(pid, entry.epoch - 1)
            assert stale.error_code == ErrorCode.PRODUCER_FENCED
        kind = ControlType.COMMIT if committed else ControlType.ABORT
        h = header(pid=pid, epoch=epoch, control=True)._replace(base_sequence=-1)
        base = self.state.end_offset
        completed = self.state.update(h, base, kind)
        expected = self.model.marker(pid, epoch, committed)
        got = (completed.first_offset, completed.last_offset, completed.committed)
        assert got + (completed.had_data,) == expected
        open_firsts = self.model.open_firsts().values()
        assert completed.last_stable_offset == min([*open_firsts, base + 1])
        self.stored.append((h._replace(base_offset=base), kind))

    @rule()
    def restart_from_the_log(self):
        rebuilt = ProducerStateManager()
        for h, kind in self.stored:
            rebuilt.load_batch(h, kind)
        assert rebuilt.producers() == self.state.producers()
        assert rebuilt.snapshot() == self.state.snapshot()
        self.state = rebuilt

    @rule()
    def restore_a_snapshot(self):
        restored = ProducerStateManager.restore(self.state.snapshot())
        assert restored.producers() == self.state.producers()
        self.state = restored

    @invariant()
    def agrees_with_the_model(self):
        self.state.check_invariants()
        assert self.state.end_offset == self.model.end
        assert self.state.ongoing_transactions() == self.model.open_firsts()
        firsts = list(self.model.open_firsts().values())
        assert self.state.last_stable_offset(self.model.end) == min([*firsts, self.model.end])
        producers = self.state.producers()
        assert set(producers) == set(self.model.producers)
        for pid, info in producers.items():
            entry = self.model.producers[pid]
            assert info.epoch == entry.epoch
            assert [b[:4] for b in info.batches] == entry.batches[-5:]


ProducerStateMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestProducerState = ProducerStateMachine.TestCase
