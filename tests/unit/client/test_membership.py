"""The group member's decisions around ``GroupCore`` (``membership.py``), without I/O.

Goal: what both drivers follow is right once: a commit retries coordinator moves and
retriable failures only while ``retry_backoff_ms`` still fits before its deadline, and raises
a refusal at once; ``commit_async`` is bounded and runs in order, one at a time; heartbeats go
every interval while Stable and the member leaves (once) when ``poll`` was not called in time;
auto-commit and the metadata re-check come due on their intervals; the coordinator is found
again after a coordinator code or a retriable error. Method: a real ``GroupCore`` made Stable
by the pure coordinator of test_group_core, hand-made answers, hand-made times, and a
Hypothesis comparison of ``AsyncCommits`` with a list.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rivven_broker.client.errors import (
    BufferExhaustedError,
    ClientTimeoutError,
    ConnectionFailedError,
    RivvenError,
    TopicAlreadyExistsError,
    error_for,
)
from rivven_broker.client.group_core import GroupCore, GroupSettings
from rivven_broker.client.membership import (
    IDLE_WAIT_MS,
    AsyncCommits,
    CommitRetry,
    CoordinatorLookup,
    GroupTimers,
    HeartbeatSchedule,
    counts_changed,
    matched_topics,
    normalise_offsets,
    partition_counts,
)
from rivven_broker.client.types import TopicPartition
from rivven_broker.protocol import messages as m
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.group_messages import Heartbeat, LeaveGroup
from tests.unit.client.test_group_core import Broker, Member, settle

TP = TopicPartition("t", 0)


def stable_core(max_poll_interval_ms: int = 300_000) -> GroupCore:
    broker = Broker()
    member = Member("a", broker)
    member.core = GroupCore(GroupSettings("g", None, 10_000, 30_000, 3_000,
                                          ("cooperative-sticky",), 100, max_poll_interval_ms))
    member.core.subscribe(["t"])
    settle(broker, [member])
    assert member.core.heartbeat_request() is not None
    return member.core


def commit_answer(code: ErrorCode) -> m.OffsetCommitResponse:
    part = m.OffsetCommitPartitionResponse(0, code)
    return m.OffsetCommitResponse(topics=(m.OffsetCommitTopicResponse("t", (part,)),))


# --- commits ---------------------------------------------------------------------------------

def test_a_commit_is_done_when_every_partition_is_stored():
    commit = CommitRetry(GroupCore(GroupSettings("g")), {TP: (5, None)}, now_ms=0,
                         timeout_ms=1_000, retry_backoff_ms=100)
    request, timeout_ms = commit.request(0)
    assert timeout_ms == 1_000 and request.generation_id == -1  # a simple commit
    assert commit.on_answer(request, commit_answer(ErrorCode.NONE), None, 5) is None


def test_a_commit_retries_a_moved_coordinator_and_lost_connections_until_its_deadline():
    core = GroupCore(GroupSettings("g"))
    commit = CommitRetry(core, {TP: (5, None)}, now_ms=0, timeout_ms=1_000,
                         retry_backoff_ms=100)
    request, _ = commit.request(0)
    assert commit.on_answer(request, commit_answer(ErrorCode.NOT_COORDINATOR), None, 10) == 100
    assert core.coordinator_unknown
    request, timeout_ms = commit.request(110)
    assert timeout_ms == 890
    assert commit.on_answer(request, None, ConnectionFailedError("lost"), 500) == 100
    with pytest.raises(ClientTimeoutError) as late:
        commit.on_answer(request, None, ConnectionFailedError("lost"), 900)
    assert isinstance(late.value.__cause__, ConnectionFailedError)
    assert commit.attempts == 2


def test_a_refused_commit_raises_at_once_and_a_fenced_member_rejoins():
    core = stable_core()
    commit = CommitRetry(core, {TP: (5, None)}, now_ms=0, timeout_ms=10_000,
                         retry_backoff_ms=100)
    request, _ = commit.request(0)
    assert request.generation_id == core.generation >= 0
    with pytest.raises(RivvenError) as refused:
        commit.on_answer(request, commit_answer(ErrorCode.ILLEGAL_GENERATION), None, 1)
    assert refused.value.error_code == ErrorCode.ILLEGAL_GENERATION
    assert core.needs_attention()  # the member rejoins at the next poll
    other = CommitRetry(core, {TP: (5, None)}, now_ms=0, timeout_ms=10_000,
                        retry_backoff_ms=100)
    request, _ = other.request(0)
    with pytest.raises(TopicAlreadyExistsError):
        other.on_answer(request, None, TopicAlreadyExistsError("not retriable"), 1)


def test_async_commits_are_bounded_in_order_and_one_at_a_time():
    commits = AsyncCommits(pending_max=3)
    for offset in range(3):
        commits.add({TP: (offset, None)}, None)
    with pytest.raises(BufferExhaustedError):
        commits.add({TP: (9, None)}, None)
    first = commits.take()
    assert first[0] == {TP: (0, None)} and commits.running
    assert commits.take() is None and not commits.has_work()  # one at a time
    with pytest.raises(BufferExhaustedError):  # the running one still counts
        commits.add({TP: (9, None)}, None)
    commits.finished()
    commits.add({TP: (3, None)}, None)
    taken = []
    while (job := commits.take()) is not None:
        taken.append(job[0][TP][0])
        commits.finished()
    assert taken == [1, 2, 3] and commits.pending == 0


@given(st.lists(st.sampled_from(["add", "take", "finish"]), max_size=60), st.integers(1, 4))
def test_async_commits_against_a_list(operations, bound):
    commits = AsyncCommits(pending_max=bound)
    queued: list[int] = []
    running: int | None = None
    done: list[int] = []
    counter = 0
    for operation in operations:
        if operation == "add":
            counter += 1
            if len(queued) + (running is not None) >= bound:
                with pytest.raises(BufferExhaustedError):
                    commits.add({TP: (counter, None)}, None)
            else:
                commits.add({TP: (counter, None)}, None)
                queued.append(counter)
        elif operation == "take":
            job = commits.take()
            if running is None and queued:
                running = queued.pop(0)
                assert job[0][TP][0] == running
            else:
                assert job is None
        elif running is not None:
            commits.finished()
            done.append(running)
            running = None
        assert commits.pending == len(queued) + (running is not None) <= bound
    assert done == sorted(done)


# --- the coordinator -------------------------------------------------------------------------

def test_the_coordinator_is_found_and_found_again_after_a_move_or_a_lost_connection():
    core = GroupCore(GroupSettings("g"))
    lookup = CoordinatorLookup(core)
    assert lookup.node() is None and lookup.find_request().key == "g"
    assert lookup.on_found(m.FindCoordinatorResponse(ErrorCode.NONE, 2, "h", 1)) == 2
    assert lookup.node() == 2
    lookup.on_call_failed(TopicAlreadyExistsError("final"))  # not about the coordinator
    assert lookup.node() == 2
    lookup.on_call_failed(error_for(ErrorCode.NOT_COORDINATOR, "moved"))
    assert lookup.node() is None
    lookup.on_found(m.FindCoordinatorResponse(ErrorCode.NONE, 3, "h", 1))
    lookup.on_call_failed(ConnectionFailedError("lost"))
    assert lookup.node() is None
    with pytest.raises(RivvenError) as failed:
        lookup.on_found(m.FindCoordinatorResponse(ErrorCode.COORDINATOR_NOT_AVAILABLE, -1, "",
                                                  0))
    assert failed.value.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE


# --- heartbeats and timers -------------------------------------------------------------------

def test_heartbeats_go_every_interval_while_stable_and_wait_otherwise():
    schedule = HeartbeatSchedule(GroupCore(GroupSettings("g")), interval_ms=3_000,
                                 request_timeout_ms=30_000)
    idle = schedule.step(0)
    assert idle.request is None and idle.wait_ms == IDLE_WAIT_MS and not idle.leaving
    core = stable_core()
    schedule = HeartbeatSchedule(core, interval_ms=3_000, request_timeout_ms=30_000)
    beat = schedule.step(1_000)
    assert isinstance(beat.request, Heartbeat) and beat.timeout_ms == 3_000
    wait = schedule.step(1_500)
    assert wait.request is None and wait.wait_ms == 2_500
    assert isinstance(schedule.step(4_000).request, Heartbeat)
    answer = m.HeartbeatResponse(ErrorCode.NONE)
    assert not schedule.on_answer(beat.request, answer, None)
    assert not schedule.on_answer(beat.request, None, ConnectionFailedError("lost"))
    fenced = m.HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS)
    assert schedule.on_answer(beat.request, fenced, None)  # wake poll: rejoin


def test_a_member_out_of_poll_too_long_leaves_once_with_a_warning():
    core = stable_core(max_poll_interval_ms=5_000)
    schedule = HeartbeatSchedule(core, interval_ms=1_000, request_timeout_ms=30_000)
    core.on_poll(0)
    core.on_poll_end(0)
    assert isinstance(schedule.step(5_000).request, Heartbeat)
    leave = schedule.step(5_001)
    assert leave.leaving and isinstance(leave.request, LeaveGroup)
    assert leave.timeout_ms == 30_000 and "max_poll_interval_ms (5000)" in leave.warning
    after = schedule.step(5_002)
    assert not after.leaving and after.request is None  # left: nothing more to send


def test_auto_commit_and_the_metadata_recheck_come_due_on_their_intervals():
    timers = GroupTimers(1_000, auto_commit_interval_ms=5_000, metadata_check_ms=60_000)
    assert timers.metadata_check_due(1_000) and not timers.metadata_check_due(60_999)
    assert timers.metadata_check_due(61_000)
    timers.check_soon()
    assert timers.metadata_check_due(61_001)
    assert not timers.auto_commit_due(5_999) and timers.auto_commit_due(6_000)
    assert not timers.auto_commit_due(10_999) and timers.auto_commit_due(11_000)
    off = GroupTimers(0, auto_commit_interval_ms=None, metadata_check_ms=1)
    assert not off.auto_commit_due(10**12)


def test_the_metadata_recheck_readers():
    def topic(name, count, code=ErrorCode.NONE):
        parts = tuple(m.PartitionMetadata(partition=i, leader=1, leader_epoch=0)
                      for i in range(count))
        return m.TopicMetadata(name=name, error_code=code, partitions=parts)

    answer = m.MetadataResponse(brokers=(), controller_id=1, cluster_id="c", topics=(
        topic("orders-1", 2), topic("orders-2", 3), topic("orders-x", 1, ErrorCode.NOT_LEADER),
        topic("other", 1)))
    assert matched_topics(answer, re.compile(r"orders-\d")) == {"orders-1", "orders-2"}
    assert partition_counts(answer) == {"orders-1": 2, "orders-2": 3, "other": 1}
    assert not counts_changed({}, {"a": 1})
    assert not counts_changed({"orders-1": 2}, partition_counts(answer))
    assert counts_changed({"orders-1": 1}, partition_counts(answer))
    assert counts_changed({"gone": 1}, partition_counts(answer))


def test_normalise_offsets_takes_both_spellings_and_refuses_negative_ones():
    assert normalise_offsets({("t", 0): 5, TopicPartition("t", 1): (7, "m")}) == {
        TP: (5, None), TopicPartition("t", 1): (7, "m")}
    with pytest.raises(ValueError):
        normalise_offsets({TP: -1})


def test_any_due_reports_without_scheduling():
    """A front asks whether poll's group work is due before a round trip to its loop: the
    answer schedules nothing, so the loop's own ``*_due`` still sees the same due work."""
    from rivven_broker.client.membership import GroupTimers

    timers = GroupTimers(0, auto_commit_interval_ms=100, metadata_check_ms=1_000)
    assert timers.any_due(0, checking=True)  # the first re-check: at once
    assert not timers.any_due(0, checking=False)  # the auto-commit: not yet
    assert timers.metadata_check_due(0) and not timers.any_due(50, checking=True)
    assert timers.any_due(100, checking=False) and timers.any_due(100, checking=False)
    assert timers.auto_commit_due(100) and not timers.any_due(150, checking=True)
    assert timers.any_due(1_000, checking=True) and not timers.any_due(199, checking=False)
