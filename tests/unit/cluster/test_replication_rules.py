"""The leader's ISR and high-watermark rules, and the controller's elections (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from rivven_cluster.replication import (
    NO_LEADER,
    LeaderState,
    leader_after_failure,
    preferred_move,
)
from rivven_cluster.replication.messages import (
    FetchedPartition,
    PartitionFetch,
    ReplicaFetch,
    ReplicaFetchAnswer,
    ReplicaMessageError,
    answer_parts,
    decode_answer,
    decode_fetch,
    encode,
)

LAG_MS = 10_000


def _leader(isr=(1, 2, 3), hw=0, now_ms=0, epoch_start=0) -> LeaderState:
    return LeaderState(leader_id=1, leader_epoch=4, replicas=(1, 2, 3), isr=isr,
                       partition_epoch=7, epoch_start_offset=epoch_start, high_watermark=hw,
                       now_ms=now_ms, lag_max_ms=LAG_MS)


def test_the_high_watermark_is_the_smallest_durable_offset_over_the_isr() -> None:
    state = _leader()
    assert not state.on_local_durable(10)  # the followers have nothing yet
    assert not state.on_fetch(2, 10, 10, 10, 1)
    assert state.on_fetch(3, 10, 6, 10, 1)  # fetched 10, durable 6
    assert state.high_watermark == 6
    state.on_fetch(3, 10, 10, 10, 2)
    assert state.high_watermark == 10


def test_a_follower_out_of_the_isr_does_not_hold_the_high_watermark_back() -> None:
    state = _leader(isr=(1, 2))
    state.on_local_durable(5)
    assert state.on_fetch(2, 5, 5, 5, 1)
    assert state.high_watermark == 5  # 3 never fetched and is not in the ISR


def test_a_laggard_leaves_the_isr_after_the_lag_bound_and_rejoins_when_caught_up() -> None:
    state = _leader(now_ms=0)
    state.on_local_durable(100)
    state.on_fetch(2, 100, 100, 100, 1_000)
    state.on_fetch(3, 40, 40, 100, 1_000)  # behind
    assert state.isr_change(LAG_MS) is None  # 3 still within its bound
    assert state.isr_change(LAG_MS + 1) == (1, 2)
    assert state.isr_change(LAG_MS + 2) is None  # one change in flight at a time
    state.isr_committed((1, 2), 8)
    assert state.high_watermark == 100
    state.on_fetch(3, 100, 50, 100, LAG_MS + 3)  # has everything; the high watermark is 100
    state.on_fetch(3, 100, 90, 100, LAG_MS + 4)
    assert state.isr_change(LAG_MS + 5) is None  # 100 was committed at its last fetch: not durable
    state.on_fetch(3, 100, 100, 100, LAG_MS + 6)
    assert state.isr_change(LAG_MS + 7) == (1, 2, 3)


def test_a_silent_replica_never_rejoins_even_with_nothing_to_copy() -> None:
    state = _leader(isr=(1, 2), now_ms=0)
    state.on_fetch(3, 0, 0, 0, 0)  # caught up once, then silent
    state.isr_committed((1, 2), 8)
    assert state.isr_change(LAG_MS) is None


def test_a_follower_caught_up_at_its_previous_fetch_counts_from_then() -> None:
    state = _leader(now_ms=0)
    state.on_fetch(2, 50, 50, 50, 1_000)  # caught up
    state.on_fetch(2, 50, 50, 80, 9_000)  # the leader grew meanwhile: caught up at 1 s
    state.on_fetch(2, 80, 80, 120, 12_000)  # reached what the leader had at 9 s
    progress = state.followers[2]
    assert progress.caught_up_ms == 9_000


def test_a_replica_taken_out_must_fetch_again_to_rejoin() -> None:
    state = _leader()
    state.on_fetch(3, 0, 0, 0, 100)  # eligible, then dies
    state.isr_committed((1, 2), 8)  # the controller: 3 is not live
    assert state.isr_change(200) is None
    state.on_fetch(3, 0, 0, 0, 300)
    assert state.isr_change(400) == (1, 2, 3)


def test_a_refused_proposal_is_proposed_again() -> None:
    state = _leader()
    state.on_fetch(2, 0, 0, 0, LAG_MS + 5)
    assert state.isr_change(LAG_MS + 10) == (1, 2)
    state.isr_refused()
    assert state.isr_change(LAG_MS + 11) == (1, 2)


def test_a_replica_the_high_watermark_passed_since_its_fetch_is_not_proposed() -> None:
    """Found by the simulator (cluster-groups-txn seed 163: an acknowledged record lost).
    Broker 3 caught up (eligible) and died; the high watermark then passed a record it never
    had; the next ISR pass proposed it from that stale fetch, the controller added it, and
    after the leader's crash elected it: the record was gone. Eligibility must hold against
    the high watermark of the proposal, not of the fetch."""
    state = _leader(isr=(1, 2))
    state.on_local_durable(36)
    state.on_fetch(2, 36, 36, 36, 10)
    state.on_fetch(3, 36, 36, 36, 11)  # caught up at high watermark 36, then dies
    state.on_local_durable(37)
    state.on_fetch(2, 37, 37, 37, 12)
    assert state.high_watermark == 37  # offset 36 committed without broker 3
    assert state.isr_change(13) is None
    state.on_fetch(3, 37, 36, 37, 14)  # it has offset 36 now (its fsync follows)
    assert state.isr_change(15) == (1, 2, 3)


@given(st.lists(st.tuples(st.sampled_from([0, 2, 3, 4]), st.integers(0, 50),
                          st.integers(0, 50)), max_size=60))
def test_a_replica_joins_the_isr_only_holding_every_committed_record(steps) -> None:
    """Any order of fetches, syncs and ISR passes (4: propose, and the controller commits):
    a replica added to the ISR holds every record below the high watermark then."""
    state = _leader(isr=(1, 2))
    fetched = {2: 0, 3: 0}
    durable = {1: 0, 2: 0, 3: 0}
    end = 0
    for now_ms, (who, grow, lag) in enumerate(steps):
        end += grow
        if who == 0:
            durable[1] = max(durable[1], end - lag)
            state.on_local_durable(durable[1])
        elif who == 4:
            proposed = state.isr_change(now_ms)
            if proposed is not None:
                for joined in set(proposed) - set(state.isr):
                    assert fetched[joined] >= state.high_watermark, (joined, fetched)
                state.isr_committed(proposed, state.partition_epoch + 1)
        else:
            fetched[who] = max(fetched[who], end - lag)
            durable[who] = max(durable[who], fetched[who] - lag)
            state.on_fetch(who, fetched[who], durable[who], end, now_ms)


@given(st.lists(st.tuples(st.sampled_from([0, 2, 3]), st.integers(0, 50),
                          st.integers(0, 50)), max_size=40))
def test_the_high_watermark_only_grows_and_stays_under_every_isr_durable(steps) -> None:
    state = _leader()
    durable = {1: 0, 2: 0, 3: 0}
    fetched = {2: 0, 3: 0}
    end = 0
    for now_ms, (who, grow, lag) in enumerate(steps):
        end += grow
        before = state.high_watermark
        if who == 0:
            durable[1] = max(durable[1], end - lag)
            state.on_local_durable(durable[1])
        else:  # a follower's offsets only grow (no truncation below the high watermark)
            fetched[who] = max(fetched[who], end - lag)
            durable[who] = max(durable[who], fetched[who] - lag)
            state.on_fetch(who, fetched[who], durable[who], end, now_ms)
        assert state.high_watermark >= before
        assert state.high_watermark <= min(durable.values())


def test_failover_takes_the_first_live_isr_member_in_replica_order() -> None:
    assert leader_after_failure((3, 1, 2), (1, 2, 3), live={1, 2}) == (1, (1, 2))
    assert leader_after_failure((3, 1, 2), (2, 3), live={1, 2}) == (2, (2,))


def test_no_live_isr_member_means_no_leader_and_the_isr_is_kept() -> None:
    assert leader_after_failure((1, 2, 3), (1,), live={2, 3}) == (NO_LEADER, (1,))


def test_leadership_returns_to_a_live_in_sync_preferred_replica() -> None:
    assert preferred_move((1, 2, 3), 2, (1, 2, 3), live={1, 2, 3}) == 1
    assert preferred_move((1, 2, 3), 2, (2, 3), live={1, 2, 3}) is None  # not in sync
    assert preferred_move((1, 2, 3), 2, (1, 2, 3), live={2, 3}) is None  # not live
    assert preferred_move((1, 2, 3), 1, (1, 2, 3), live={1, 2, 3}) is None


def test_replica_messages_round_trip_and_refuse_garbage() -> None:
    fetch = ReplicaFetch(2, 500, 1 << 20, (PartitionFetch("t", 0, 3, 10, 2, 9),))
    assert decode_fetch(encode(fetch)) == fetch
    answer = ReplicaFetchAnswer((FetchedPartition("t", 0, 0, 5, 0, -1, -1, b"abc"),))
    assert decode_answer(encode(answer)) == answer
    for garbage in (b"", b"\x91\x01", encode(answer)):
        try:
            decode_fetch(garbage)
        except ReplicaMessageError:
            continue
        raise AssertionError(f"{garbage!r} decoded as a fetch")


def test_an_answer_s_records_travel_beside_its_document_and_come_back_as_views() -> None:
    answer = ReplicaFetchAnswer((
        FetchedPartition("a", 0, 0, 5, 0, -2, -1, memoryview(b"first batches")),
        FetchedPartition("b", 1, 6),  # an error: no records
        FetchedPartition("c", 2, 0, 7, 3, 4, 9),  # a divergence
        FetchedPartition("d", 3, 0, 8, 0, -2, -1, b"second"),
    ))
    parts = answer_parts(answer)
    assert parts[-2:] == [b"first batches", b"second"]  # as given: not copied into msgpack
    decoded = decode_answer(b"".join(parts))
    assert decoded == answer
    assert isinstance(decoded.partitions[0].records, memoryview)
    assert decoded.partitions[1].records == b""


@pytest.mark.parametrize("damage", ["cut", "extra", "document_cut", "short"])
def test_an_answer_whose_records_do_not_add_up_is_refused(damage: str) -> None:
    data = encode(ReplicaFetchAnswer((FetchedPartition("t", 0, 0, 5, 0, -2, -1, b"abc"),)))
    garbage = {"cut": data[:-1], "extra": data + b"x",
               "document_cut": data[:6], "short": data[:3]}[damage]
    with pytest.raises(ReplicaMessageError):
        decode_answer(garbage)
