"""BatchCycle under random driver behaviour (a fake source and a fake transactional broker,
crashes and restarts), and the status rules one by one."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rivven_connect.core import batch_cycle as bc
from rivven_connect.core.admission import Admission, RejectReason
from rivven_connect.core.config import OFFSETS_TOPIC, TransactionInterval, load_config
from rivven_connect.core.records import EncodedRecords, Record
from rivven_connect.core.routing import DLQ_HEADERS, Router, encoded_path_allowed


def _cycle(routing=None, transform=lambda r: r, stored=None, errors=None, gather=None):
    source = {"connector": "postgres-cdc", "topic": "t", "routing": routing or {}}
    if errors:
        source["errors"] = errors
    config = load_config({"sources": {"db": source}}, {}).sources["db"]
    router = Router(config, Admission(config.routing.admission))
    return bc.BatchCycle(router, transform, jitter=lambda: 0.5, stored_position=stored,
                         gather=gather)


def _records(*positions):
    return tuple(Record(value={"n": p}, position=p) for p in positions)


class World:
    """The fake driver: a source with a replay point (moved by side effects), a broker whose
    transactions either commit whole or vanish, and the checks of every instruction."""

    def __init__(self, total: int, gather: TransactionInterval | None = None) -> None:
        self.gather = gather
        self.source = list(range(1, total + 1))
        self.acked = 0  # the source's durable side-effect point (the slot)
        self.cursor = 0  # next index the source delivers
        self.committed_records: list[int] = []  # data positions, in commit order
        self.durable_offset: int | None = None  # last offset record committed
        self.open: list[Record] | None = None
        self.in_flight_batch: int | None = None
        self.now_ms = 0
        self.halted: bc.Status | None = None
        self.stop_requested = False
        self.committed_after_stop: int | None = None  # batch committed after the stop
        self.side_effects_after_stop: list[int] = []
        self.stats: dict[str, int] = {}

    def restart(self) -> bc.BatchCycle:
        self.open, self.in_flight_batch, self.halted = None, None, None
        self.stop_requested, self.committed_after_stop = False, None
        self.cursor = self.acked  # the source replays from its durable point
        return _cycle(stored=self.durable_offset, gather=self.gather)

    def run(self, cycle: bc.BatchCycle, instructions, events: list) -> None:
        """Execute instructions; events answering them are appended (the driver's queue)."""
        for ins in instructions:
            self.stats[type(ins).__name__] = self.stats.get(type(ins).__name__, 0) + 1
            if isinstance(ins, bc.Poll):
                assert self.in_flight_batch is None, "a poll while a batch is in flight"
                assert not self.stop_requested, "a poll after the stop"
                assert ins.ready_only == (self.gather is not None and ins.records_max is not None)
                if ins.ready_only:
                    self.stats["ready poll"] = self.stats.get("ready poll", 0) + 1
                events.append(("poll", ins))
            elif isinstance(ins, bc.BeginTransaction):
                assert self.open is None, "two transactions open"
                self.open, self.in_flight_batch = [], ins.batch_id
            elif isinstance(ins, bc.Send):
                assert self.open is not None and ins.batch_id == self.in_flight_batch
                self.open.append(ins.record)
            elif isinstance(ins, bc.CommitTransaction):
                assert self.open is not None and ins.batch_id == self.in_flight_batch
                *data, offset = self.open
                assert offset.destination.topic == OFFSETS_TOPIC, "no offset record last"
                assert all(r.destination.topic != OFFSETS_TOPIC for r in data)
                assert offset.value["position"] == max(r.position for r in data)
                events.append(("commit", ins.batch_id))
            elif isinstance(ins, bc.AbortTransaction):
                self.open = None
            elif isinstance(ins, bc.RunSideEffect):
                assert self.open is None
                assert self.durable_offset is not None and ins.position <= self.durable_offset, (
                    "a side effect before its commit")
                self.in_flight_batch = ins.batch_id
                if self.stop_requested:
                    self.side_effects_after_stop.append(ins.batch_id)
                events.append(("side_effect", ins.batch_id, ins.position))
            elif isinstance(ins, bc.WakeAt):
                assert self.now_ms < ins.at_ms <= self.now_ms + bc.backoff_max_ms
                events.append(("timer", ins.at_ms))
            else:
                assert isinstance(ins, bc.Halt)
                assert ins.status is not bc.Status.STOPPED or not any(
                    event[0] == "side_effect" for event in events if isinstance(event, tuple)), (
                    "stopped with a side effect in flight")
                if self.committed_after_stop is not None and ins.status is bc.Status.STOPPED:
                    assert self.committed_after_stop in self.side_effects_after_stop, (
                        "stopped before the committed batch's side effect")
                self.halted = ins.status
                events.clear()

    def commit(self) -> None:
        *data, offset = self.open
        self.committed_records += [r.position for r in data]
        self.durable_offset = offset.value["position"]
        self.open = None


TOTALS: dict[str, int] = {}


@settings(max_examples=200, deadline=None, derandomize=True)  # (the coverage test below)
@given(st.data(), st.integers(1, 40),
       st.sampled_from([None, None, TransactionInterval(5, 4), TransactionInterval(1000, 12)]))
def test_random_runs_keep_the_cycle_exactly_once(data, total, gather):
    """Also with several polls per transaction (``gather``: a short interval, or a records
    bound that ends most gatherings)."""
    world = World(total, gather)
    cycle = world.restart()
    events: list = []
    world.run(cycle, cycle.start(), events)
    failures_in_row = 0
    outage = 0  # commits still to fail in a row (a broker outage)
    stop_during_batch = False
    for _ in range(400):
        if world.halted is not None or not events:
            break
        if data.draw(st.integers(0, 30), label="crash?") == 0:  # crash and restart anywhere
            cycle = world.restart()
            events = []
            failures_in_row = 0
            world.run(cycle, cycle.start(), events)
            continue
        if not stop_during_batch and data.draw(st.integers(0, 40), label="stop?") == 0:
            stop_during_batch = cycle.phase in (bc.Phase.GATHERING, bc.Phase.PRODUCING,
                                                bc.Phase.SIDE_EFFECT)
            stopped_in = cycle.phase
            world.stop_requested = True
            world.run(cycle, cycle.handle(bc.StopRequested(world.now_ms)), events)
            if not stop_during_batch:
                assert world.halted is bc.Status.STOPPED and stopped_in in (
                    bc.Phase.POLLING, bc.Phase.BACKING_OFF)
            continue
        event = events.pop(0)
        world.now_ms += 1
        if event[0] == "poll":
            poll = event[1]
            if poll.ready_only:  # what is ready now: maybe nothing, never more than asked
                assert cycle.phase is bc.Phase.GATHERING and 0 < poll.records_max
                count = min(poll.records_max, data.draw(st.integers(0, 6), label="ready"))
            else:
                if world.cursor >= total:
                    break  # the source is drained; the run ends here
                count = data.draw(st.integers(1, 6), label="poll size")
            chunk = world.source[world.cursor:world.cursor + count]
            world.cursor += len(chunk)
            out = cycle.handle(bc.PollCompleted(_records(*chunk), world.now_ms))
        elif event[0] == "commit":
            if outage == 0 and data.draw(st.integers(0, 8), label="outage?") == 0:
                outage = data.draw(st.integers(10, 20), label="outage length")
            if outage:
                outage -= 1
                verdict = "retriable"
            else:
                verdict = data.draw(st.sampled_from(["ok", "ok", "ok", "retriable", "fatal"]),
                                    label="commit")
            if verdict == "fatal" and data.draw(st.integers(0, 5)) != 0:
                verdict = "retriable"
            if verdict == "ok":
                world.commit()
                if world.stop_requested:
                    world.committed_after_stop = event[1]
                failures_in_row = 0
                out = cycle.handle(bc.TransactionCommitted(event[1], world.now_ms))
            else:
                world.open = None
                failures_in_row += 1
                out = cycle.handle(bc.TransactionFailed(event[1], "boom", verdict == "retriable",
                                                        world.now_ms))
        elif event[0] == "side_effect":
            if data.draw(st.integers(0, 4), label="side effect fails?") == 0:
                failures_in_row += 1
                out = cycle.handle(bc.SideEffectFailed(event[1], "slot busy", world.now_ms))
            else:
                world.acked = max(world.acked, event[2])
                world.in_flight_batch = None
                out = cycle.handle(bc.SideEffectCompleted(event[1], world.now_ms))
        else:
            world.now_ms = event[1]
            out = cycle.handle(bc.TimerFired(world.now_ms))
        world.run(cycle, out, events)
        status = cycle.status()
        if status.state in (bc.Status.RUNNING, bc.Status.DEGRADED):
            assert (status.state is bc.Status.DEGRADED) == (
                failures_in_row >= bc.commit_failure_threshold)
        if status.state is bc.Status.DEGRADED:
            world.stats["degraded"] = 1
        cycle.check_invariants()
    for name, count in world.stats.items():
        TOTALS[name] = TOTALS.get(name, 0) + count
    # exactly once: what was committed is a prefix of the source, in order, without repeats
    assert world.committed_records == world.source[:len(world.committed_records)]
    assert world.durable_offset == (world.committed_records[-1] if world.committed_records
                                    else None)


def test_the_random_runs_reached_every_instruction_and_degraded():
    """Runs after the property above (file order): the runs were not all trivial."""
    assert TOTALS, "run test_random_runs_keep_the_cycle_exactly_once first"
    for name in ("Poll", "Send", "CommitTransaction", "AbortTransaction", "RunSideEffect",
                 "WakeAt", "Halt", "degraded", "ready poll"):
        assert TOTALS.get(name, 0) > 0, (name, TOTALS)


def _drive_to_commit(cycle, positions=(1, 2)):
    assert cycle.start() == [bc.Poll()]
    return cycle.handle(bc.PollCompleted(_records(*positions), 0))


def test_degraded_after_exactly_16_failures_and_running_after_one_success():
    cycle = _cycle()
    out = _drive_to_commit(cycle)
    batch_id = out[0].batch_id
    for failure in range(1, bc.commit_failure_threshold + 1):
        out = cycle.handle(bc.TransactionFailed(batch_id, "broker down", True, 0))
        assert out[0] == bc.AbortTransaction(batch_id) and isinstance(out[1], bc.WakeAt)
        assert out[1].at_ms <= bc.backoff_max_ms
        expected = bc.Status.DEGRADED if failure >= bc.commit_failure_threshold else (
            bc.Status.RUNNING)
        assert cycle.status().state is expected, failure
        assert cycle.status().last_error == "transaction failed: broker down"
        out = cycle.handle(bc.TimerFired(out[1].at_ms))
        assert isinstance(out[0], bc.BeginTransaction)  # the same batch, again
    out = cycle.handle(bc.TransactionCommitted(batch_id, 0))
    assert out == [bc.RunSideEffect(batch_id, 2)]
    status = cycle.status()
    assert status.state is bc.Status.RUNNING and status.consecutive_failures == 0
    assert (status.records, status.batches, status.position) == (2, 1, 2)


def test_backoff_grows_with_jitter_and_stays_under_30_s():
    delays = []
    for jitter in (0.0, 0.999):
        cycle = _cycle()
        cycle.jitter = lambda: jitter
        batch_id = _drive_to_commit(cycle)[0].batch_id
        now_ms = 0
        for _ in range(20):
            wake = cycle.handle(bc.TransactionFailed(batch_id, "x", True, now_ms))[1]
            delays.append(wake.at_ms - now_ms)
            now_ms = wake.at_ms
            cycle.handle(bc.TimerFired(now_ms))
    low, high = delays[:20], delays[20:]
    assert low[0] == 50 and high[0] == 99 and low[1] == 100
    assert max(high) <= bc.backoff_max_ms and high[-1] > 29_000 and low[-1] == 15_000


def test_stop_finishes_the_batch_in_flight():
    cycle = _cycle()
    batch_id = _drive_to_commit(cycle)[0].batch_id
    assert cycle.handle(bc.StopRequested(0)) == []
    assert cycle.handle(bc.TransactionCommitted(batch_id, 0)) == [bc.RunSideEffect(batch_id, 2)]
    assert cycle.handle(bc.SideEffectCompleted(batch_id, 0)) == [bc.Halt(bc.Status.STOPPED)]
    assert cycle.status().position == 2


def test_stop_during_the_side_effect_waits_for_it():
    cycle = _cycle()
    batch_id = _drive_to_commit(cycle)[0].batch_id
    cycle.handle(bc.TransactionCommitted(batch_id, 0))
    assert cycle.handle(bc.StopRequested(0)) == []
    assert cycle.handle(bc.SideEffectCompleted(batch_id, 0)) == [bc.Halt(bc.Status.STOPPED)]


def test_stop_while_backing_off_halts_without_the_side_effect():
    cycle = _cycle()
    batch_id = _drive_to_commit(cycle)[0].batch_id
    cycle.handle(bc.TransactionFailed(batch_id, "x", True, 0))
    assert cycle.handle(bc.StopRequested(0)) == [bc.Halt(bc.Status.STOPPED)]
    assert cycle.status().position is None


def test_replays_below_the_stored_position_are_dropped_and_their_side_effect_redone():
    cycle = _cycle(stored=5)
    assert cycle.start() == [bc.RunSideEffect(1, 5)]  # a restart redoes the stored one first
    assert cycle.handle(bc.SideEffectCompleted(1, 0)) == [bc.Poll()]
    out = cycle.handle(bc.PollCompleted(_records(4, 5), 0))
    assert out == [bc.RunSideEffect(2, 5)]
    assert cycle.handle(bc.SideEffectCompleted(2, 0)) == [bc.Poll()]
    out = cycle.handle(bc.PollCompleted(_records(5, 6, 7), 0))
    sent = [i.record.position for i in out if isinstance(i, bc.Send)]
    assert sent == [6, 7, 7]  # two records and the offset record at 7


def test_a_non_retriable_failure_is_error():
    cycle = _cycle()
    batch_id = _drive_to_commit(cycle)[0].batch_id
    out = cycle.handle(bc.TransactionFailed(batch_id, "fenced", False, 0))
    assert out == [bc.AbortTransaction(batch_id), bc.Halt(bc.Status.ERROR)]
    assert cycle.status().state is bc.Status.ERROR
    assert cycle.handle(bc.StopRequested(0)) == []


def _explode(record):
    if record.position == 2:
        raise ValueError("bad row")
    return record


def test_a_transform_exception_stops_the_source_without_tolerance():
    cycle = _cycle(transform=_explode)
    out = _drive_to_commit(cycle, (1, 2, 3))
    assert out == [bc.Halt(bc.Status.ERROR)]
    assert "transform failed at position 2: ValueError: bad row" in cycle.status().last_error


def test_a_transform_exception_goes_to_the_dlq_in_the_same_transaction_with_tolerance_all():
    cycle = _cycle(transform=_explode, routing={"dlq_topic": "dlq"}, errors={"tolerance": "all"})
    out = _drive_to_commit(cycle, (1, 2, 3))
    sends = [i.record for i in out if isinstance(i, bc.Send)]
    assert [r.destination.topic for r in sends] == ["t", "dlq", "t", OFFSETS_TOPIC]
    headers = dict(sends[1].headers)
    assert list(headers) == list(DLQ_HEADERS)
    assert headers["rivven.dlq.stage"] == b"transform"
    assert headers["rivven.dlq.connector"] == b"db"
    assert headers["rivven.dlq.source_position"] == b"2"
    assert isinstance(out[0], bc.BeginTransaction) and isinstance(out[-1], bc.CommitTransaction)
    cycle.handle(bc.TransactionCommitted(out[0].batch_id, 0))
    assert (cycle.status().records, cycle.status().dead_lettered) == (2, 1)


def test_a_filtered_record_is_dropped_but_its_position_commits():
    cycle = _cycle(transform=lambda r: None if r.position == 2 else r)
    out = _drive_to_commit(cycle, (1, 2))
    sends = [i.record for i in out if isinstance(i, bc.Send)]
    assert [r.position for r in sends] == [1, 2] and sends[-1].destination.topic == OFFSETS_TOPIC


def _never_called(record):
    raise AssertionError(f"a heartbeat went through the transform: {record!r}")


def test_a_heartbeat_commits_only_its_position_then_runs_its_side_effect():
    cycle = _cycle(transform=_never_called, stored=3)
    cycle.start()
    cycle.handle(bc.SideEffectCompleted(1, 0))
    out = cycle.handle(bc.PollCompleted((Record.heartbeat(4),), 0))
    assert out == [bc.BeginTransaction(2), bc.Send(2, cycle._offset_record(4)),
                   bc.CommitTransaction(2)]
    assert cycle.handle(bc.TransactionCommitted(2, 0)) == [bc.RunSideEffect(2, 4)]
    status = cycle.status()
    assert (status.position, status.records, status.dropped) == (4, 0, 0)
    # A heartbeat at or below the committed position is a replay: the side effect again.
    cycle.handle(bc.SideEffectCompleted(2, 0))
    assert cycle.handle(bc.PollCompleted((Record.heartbeat(4),), 0)) == [bc.RunSideEffect(3, 4)]


def test_a_heartbeat_after_records_moves_the_batch_position_past_them():
    cycle = _cycle()
    assert cycle.start() == [bc.Poll()]
    out = cycle.handle(bc.PollCompleted((*_records(1, 2), Record.heartbeat(3)), 0))
    sends = [i.record for i in out if isinstance(i, bc.Send)]
    assert [r.position for r in sends] == [1, 2, 3] and sends[-1].destination.topic == OFFSETS_TOPIC
    assert sends[-1].value == {"connector": "db", "position": 3}


@pytest.mark.parametrize("policy,expected", [
    ("drop", ["t.ok", OFFSETS_TOPIC]),
    ("dlq", ["t.ok", "dlq", OFFSETS_TOPIC]),
    ("error", None),
])
def test_admission_failure_policies(policy, expected):
    routing = {"topic_column": "to", "default_topic": "t.ok", "dlq_topic": "dlq",
               "on_admission_failure": policy,
               "admission": {"mode": "allowlist", "topics": ["t.ok"]}}
    cycle = _cycle(routing=routing)
    cycle.start()
    records = (Record(value={"to": "t.ok"}, position=1), Record(value={"to": "t.nope"}, position=2))
    out = cycle.handle(bc.PollCompleted(records, 0))
    if expected is None:
        assert out == [bc.Halt(bc.Status.ERROR)]
        assert "not_allowed" in cycle.status().last_error
        return
    assert [i.record.destination.topic for i in out if isinstance(i, bc.Send)] == expected


def test_an_open_breaker_under_error_policy_retries_instead_of_stopping():
    cycle = _cycle(routing={"admission": {"max_destinations": 4}})
    admission = cycle.router.admission
    out = _drive_to_commit(cycle, (1,))
    for _ in range(5):
        batch_id = out[0].batch_id
        failure = bc.TransactionFailed(batch_id, "not authorized", True, 0,
                                       topic_outcomes=(("t", bc.SendOutcome.PERMANENT_FAILURE),))
        out = cycle.handle(failure)
        out = cycle.handle(bc.TimerFired(out[-1].at_ms))
    # the breaker opened on the fifth failure: the retry is refused before any send
    assert isinstance(out[0], bc.WakeAt)
    assert "circuit_open" in cycle.status().last_error
    assert admission.circuits_open(out[0].at_ms) == 1


def test_the_offset_record_names_the_source():
    cycle = _cycle()
    out = _drive_to_commit(cycle, (9,))
    offset = out[-2].record
    assert offset.destination.topic == OFFSETS_TOPIC and offset.destination.key == b"db"
    assert offset.value == {"connector": "db", "position": 9}


def test_events_out_of_turn_are_programmer_errors():
    cycle = _cycle()
    cycle.start()
    with pytest.raises(AssertionError):
        cycle.handle(bc.TransactionCommitted(1, 0))
    assert attrs.has(bc.PollCompleted)


def _degrade(cycle, batch_id):
    """Fail ``batch_id``'s transaction until the cycle is degraded; the last WakeAt."""
    for _ in range(bc.commit_failure_threshold):
        out = cycle.handle(bc.TransactionFailed(batch_id, "record too large", True, 0))
        if cycle.state is bc.Status.DEGRADED:
            return out[-1]
        cycle.handle(bc.TimerFired(out[-1].at_ms))
    raise AssertionError("never degraded")


def test_abandon_commits_only_the_batch_position_then_its_side_effect():
    cycle = _cycle()
    batch_id = _drive_to_commit(cycle, (1, 2, 3))[0].batch_id
    assert "no batch to abandon: the cycle is running and producing" == cycle.abandon_refusal()
    cycle.handle(bc.TransactionFailed(batch_id, "record too large", True, 0))
    assert "failed 1 time(s)" in cycle.abandon_refusal()
    cycle.handle(bc.TimerFired(10_000))
    _degrade(cycle, batch_id)
    assert cycle.abandon_refusal() is None
    out = cycle.handle(bc.AbandonRequested(77))
    assert [type(i) for i in out] == [bc.BeginTransaction, bc.Send, bc.CommitTransaction]
    offset = out[1].record
    assert offset.destination.topic == OFFSETS_TOPIC and offset.value["position"] == 3
    # the commit of the abandonment fails too: the retry still carries no data
    out = cycle.handle(bc.TransactionFailed(batch_id, "broker down", True, 0))
    out = cycle.handle(bc.TimerFired(out[-1].at_ms))
    assert [type(i) for i in out] == [bc.BeginTransaction, bc.Send, bc.CommitTransaction]
    assert cycle.handle(bc.TransactionCommitted(batch_id, 99)) == [bc.RunSideEffect(batch_id, 3)]
    status = cycle.status()
    assert (status.state, status.position, status.records, status.batches) == (
        bc.Status.RUNNING, 3, 0, 1)
    assert (status.abandoned_batches, status.abandoned_records, status.last_abandon_at_ms) == (
        1, 3, 99)
    assert cycle.handle(bc.SideEffectCompleted(batch_id, 100)) == [bc.Poll()]
    out = cycle.handle(bc.PollCompleted(_records(3, 4), 101))  # 3 is a replay now
    assert [i.record.position for i in out if isinstance(i, bc.Send)] == [4, 4]


def test_abandon_is_refused_for_a_failing_side_effect_and_a_halted_cycle():
    cycle = _cycle()
    batch_id = _drive_to_commit(cycle)[0].batch_id
    cycle.handle(bc.TransactionCommitted(batch_id, 0))
    for _ in range(bc.commit_failure_threshold):
        out = cycle.handle(bc.SideEffectFailed(batch_id, "slot gone", 0))
        assert "never skipped" in cycle.abandon_refusal()
        cycle.handle(bc.TimerFired(out[-1].at_ms))
    assert cycle.state is bc.Status.DEGRADED
    with pytest.raises(AssertionError):
        cycle.handle(bc.AbandonRequested(0))
    halted = _cycle()
    batch_id = _drive_to_commit(halted)[0].batch_id
    halted.handle(bc.TransactionFailed(batch_id, "fenced", False, 0))
    assert halted.abandon_refusal() == "no batch to abandon: the cycle is error and done"


# --- the encoded path (EncodedRecords blocks) ---------------------------------------------------
def _block(first, last, table="orders", rows=None):
    rows = rows if rows is not None else last - first + 1
    return EncodedRecords("public", table, [b"k"] * rows, [b"v"] * rows, [()] * rows,
                          [0] * rows, position=last, first_position=first,
                          op_counts=(("c", rows),))


def test_a_block_is_routed_admitted_and_sent_whole_and_counted_per_record():
    cycle = _cycle(routing={"admission": {"max_destinations": 4}})
    assert cycle.encoded_allowed
    cycle.start()
    blocks = (_block(1, 3), Record.heartbeat(4), _block(5, 9, table="items"))
    out = cycle.handle(bc.PollCompleted(blocks, 0))
    sends = [i.record for i in out if isinstance(i, bc.Send)]
    assert [(s.destination.topic, s.record_count) for s in sends] == [
        ("t", 3), ("t", 5), (OFFSETS_TOPIC, 1)]
    assert sends[0].keys is blocks[0].keys  # the block itself, not a copy per record
    assert sends[-1].value == {"connector": "db", "position": 9}
    out = cycle.handle(bc.TransactionCommitted(out[0].batch_id, 0))
    status = cycle.status()
    assert (status.records, status.batches) == (8, 1)
    assert cycle.router.admission.counters.routed == 8
    assert cycle.router.admission.counters.unmatched["default"] == 8  # the topic template


def test_a_block_takes_the_verdict_of_its_destination_for_each_record():
    cycle = _cycle(routing={"on_missing_destination": "drop"})
    cycle.start()
    out = cycle.handle(bc.PollCompleted((_block(1, 4),), 0))
    assert [i.record.destination.topic for i in out if isinstance(i, bc.Send)] == [
        OFFSETS_TOPIC]
    cycle.handle(bc.TransactionCommitted(out[0].batch_id, 0))
    assert cycle.status().dropped == 4
    refused = _cycle(routing={"admission": {"mode": "allowlist", "topics": ["other"]},
                              "on_admission_failure": "error"})
    refused.start()
    assert refused.handle(bc.PollCompleted((_block(1, 4),), 0)) == [bc.Halt(bc.Status.ERROR)]
    assert refused.router.admission.counters.rejected[RejectReason.NOT_ALLOWED] == 4


def test_replayed_blocks_are_dropped_whole():
    cycle = _cycle(stored=5)
    cycle.start()
    cycle.handle(bc.SideEffectCompleted(1, 0))
    out = cycle.handle(bc.PollCompleted((_block(1, 5), _block(6, 7)), 0))
    assert [i.record.record_count for i in out if isinstance(i, bc.Send)] == [2, 1]
    straddling = _cycle(stored=5)
    straddling.start()
    straddling.handle(bc.SideEffectCompleted(1, 0))
    with pytest.raises(AssertionError, match="straddles"):
        straddling.handle(bc.PollCompleted((_block(4, 7),), 0))


@pytest.mark.parametrize("source", [
    {"transforms": [{"type": "Filter", "keep": {"table": "a"}}]},
    {"routing": {"topic_column": "to", "default_topic": "t"}},
    {"routing": {"key_column": "id"}},
    {"routing": {"on_admission_failure": "dlq", "dlq_topic": "dlq"}},
])
def test_per_record_configuration_keeps_blocks_out(source):
    config = load_config({"sources": {"db": {"connector": "postgres-cdc", "topic": "t",
                                             **source}}}, {}).sources["db"]
    assert not encoded_path_allowed(config)
    cycle = bc.BatchCycle(Router(config, Admission(config.routing.admission)), lambda r: r,
                          jitter=lambda: 0.5)
    cycle.start()
    with pytest.raises(AssertionError, match="per-record routing"):
        cycle.handle(bc.PollCompleted((_block(1, 2),), 0))


def test_a_block_is_sent_in_slices_of_bounded_size_in_order():
    block = EncodedRecords("public", "orders", [b"%d" % i for i in range(7)],
                           [b"v%d" % i for i in range(7)], [()] * 7, list(range(7)),
                           position=7, first_position=1)
    assert block.slices(10) == [block]
    parts = block.slices(3)
    assert [part.record_count for part in parts] == [3, 3, 1]
    assert [key for part in parts for key in part.keys] == block.keys
    assert [t for part in parts for t in part.timestamps_ms] == block.timestamps_ms


# --- one transaction, several polls (``transaction: {boundary: interval}``) ------------------


def _sent_positions(instructions):
    """The data positions of a transaction's sends, and its offset record's position."""
    assert isinstance(instructions[0], bc.BeginTransaction)
    assert isinstance(instructions[-1], bc.CommitTransaction)
    *data, offset = [ins.record for ins in instructions[1:-1]]
    assert offset.destination.topic == OFFSETS_TOPIC
    return [record.position for record in data], offset.value["position"]


def test_an_interval_boundary_gathers_ready_polls_until_nothing_is_ready():
    cycle = _cycle(gather=TransactionInterval(interval_ms=100, records_max=10))
    assert cycle.start() == [bc.Poll()]
    assert cycle.handle(bc.PollCompleted(_records(1, 2), 0)) == [
        bc.Poll(ready_only=True, records_max=8)]
    assert cycle.phase is bc.Phase.GATHERING
    assert cycle.handle(bc.PollCompleted(_records(3, 4, 5), 1)) == [
        bc.Poll(ready_only=True, records_max=5)]
    out = cycle.handle(bc.PollCompleted((), 2))  # nothing more ready: commit now
    assert _sent_positions(out) == ([1, 2, 3, 4, 5], 5)
    assert cycle.handle(bc.TransactionCommitted(out[0].batch_id, 3)) == [
        bc.RunSideEffect(out[0].batch_id, 5)]
    assert cycle.status().records == 5 and cycle.status().batches == 1


def test_an_interval_boundary_ends_at_its_records_bound_and_at_its_interval():
    by_records = _cycle(gather=TransactionInterval(interval_ms=1_000, records_max=4))
    by_records.start()
    assert by_records.handle(bc.PollCompleted(_records(1, 2), 0)) == [
        bc.Poll(ready_only=True, records_max=2)]
    assert _sent_positions(by_records.handle(bc.PollCompleted(_records(3, 4), 1))) == (
        [1, 2, 3, 4], 4)
    big_first = _cycle(gather=TransactionInterval(interval_ms=1_000, records_max=2))
    big_first.start()  # a first poll past the bound is a transaction on its own
    assert _sent_positions(big_first.handle(bc.PollCompleted(_records(1, 2, 3), 0))) == (
        [1, 2, 3], 3)
    by_time = _cycle(gather=TransactionInterval(interval_ms=10, records_max=100))
    by_time.start()
    by_time.handle(bc.PollCompleted(_records(1), 0))
    assert by_time.handle(bc.PollCompleted(_records(2), 9)) == [
        bc.Poll(ready_only=True, records_max=98)]
    assert _sent_positions(by_time.handle(bc.PollCompleted(_records(3), 10))) == ([1, 2, 3], 3)


def test_a_stop_while_gathering_commits_what_was_gathered_then_halts():
    cycle = _cycle(gather=TransactionInterval(interval_ms=100, records_max=10))
    cycle.start()
    cycle.handle(bc.PollCompleted(_records(1, 2), 0))
    assert cycle.handle(bc.StopRequested(1)) == []  # the ready poll in flight answers first
    out = cycle.handle(bc.PollCompleted(_records(3), 2))
    assert _sent_positions(out) == ([1, 2, 3], 3)
    batch_id = out[0].batch_id
    assert cycle.handle(bc.TransactionCommitted(batch_id, 3)) == [bc.RunSideEffect(batch_id, 3)]
    assert cycle.handle(bc.SideEffectCompleted(batch_id, 4)) == [bc.Halt(bc.Status.STOPPED)]


def test_a_failed_gathered_transaction_is_retried_whole():
    cycle = _cycle(gather=TransactionInterval(interval_ms=100, records_max=10))
    cycle.start()
    cycle.handle(bc.PollCompleted(_records(1, 2), 0))
    cycle.handle(bc.PollCompleted(_records(3), 1))
    first = cycle.handle(bc.PollCompleted((), 2))
    batch_id = first[0].batch_id
    out = cycle.handle(bc.TransactionFailed(batch_id, "broker gone", True, 3))
    assert out[0] == bc.AbortTransaction(batch_id) and isinstance(out[1], bc.WakeAt)
    again = cycle.handle(bc.TimerFired(out[1].at_ms))
    assert again[0] == bc.BeginTransaction(batch_id)
    assert _sent_positions(again) == ([1, 2, 3], 3)


def test_without_an_interval_boundary_every_poll_is_its_own_transaction():
    cycle = _cycle()
    cycle.start()
    assert _sent_positions(cycle.handle(bc.PollCompleted(_records(1, 2), 0))) == ([1, 2], 2)
