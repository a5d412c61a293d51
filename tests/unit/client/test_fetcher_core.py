"""The consumer's fetch-side core (``FetcherCore.step``) and the sender's dial and abort rules.

Goal: the decisions both consumer drivers follow: resets go to the partition's leader once
each; Fetches go one per leader with none in flight; leaders not connected are named for
dialling (busy ones are not); an unknown leader or a failed request asks for a metadata
refresh; the step wakes for a partition's backoff and for metadata; nothing is planned twice.
And for the producer core: the leaders to dial, and when an abort is finished. Method: the
pure objects with hand-made answers and times; a Hypothesis run of random steps and answers
checks that no node ever has two Fetches in flight and that what was planned is answered.
"""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from rivven_broker.client.config import ConnectionConfig, ConsumerConfig, ProducerConfig
from rivven_broker.client.consumer_core import IDLE_WAIT_MS, FetcherCore
from rivven_broker.client.errors import ConnectionFailedError, TransactionAbortedError
from rivven_broker.client.fetch_state import FetchState
from rivven_broker.client.metadata import Address, MetadataCache
from rivven_broker.client.producer_core import ProducerCore
from rivven_broker.client.types import TopicPartition
from rivven_broker.protocol import messages as m
from rivven_broker.protocol.errors import ErrorCode

TP0, TP1, TP2 = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("t", 2)


def metadata_answer(leaders=(1, 2, 1)) -> m.MetadataResponse:
    parts = tuple(m.PartitionMetadata(partition=i, leader=leader, leader_epoch=0)
                  for i, leader in enumerate(leaders))
    return m.MetadataResponse(
        brokers=(m.BrokerMetadata(node_id=1, host="h1", port=1),
                 m.BrokerMetadata(node_id=2, host="h2", port=1)),
        controller_id=1, cluster_id="c",
        topics=(m.TopicMetadata(name="t", error_code=ErrorCode.NONE, partitions=parts),))


def fetcher(leaders=(1, 2, 1)) -> FetcherCore:
    metadata = MetadataCache((Address("h1", 1),), refresh_backoff_ms=100)
    metadata.add_topics(["t"])
    metadata.on_update(metadata_answer(leaders), 0)
    state = FetchState(auto_offset_reset="earliest", retry_backoff_ms=100)
    state.assign([TP0, TP1, TP2])
    return FetcherCore(ConsumerConfig(), ConnectionConfig(), metadata, state)


def offsets_answer(entries, offset=10) -> m.ListOffsetsResponse:
    parts = tuple(m.ListOffsetsPartitionResponse(tp.partition, ErrorCode.NONE, offset)
                  for tp, _, _ in entries)
    return m.ListOffsetsResponse(topics=(m.ListOffsetsTopicResponse("t", parts),))


def empty_fetch_answer(plan) -> m.FetchResponse:
    parts = tuple(m.FetchPartitionResponse(tp.partition, ErrorCode.NONE, 10)
                  for tp, _, _ in plan.partitions)
    return m.FetchResponse(topics=(m.FetchTopicResponse("t", parts),))


def test_unconnected_leaders_are_named_for_dialling_and_busy_ones_are_not():
    core = fetcher()
    step = core.step(0, lambda node: None)
    assert step.fetches == [] and step.resets == [] and sorted(step.dial) == [1, 2]
    assert not step.metadata_due and step.wake_at_ms <= IDLE_WAIT_MS
    busy = core.step(0, lambda node: False)
    assert busy.dial == [] and busy.resets == []


def test_resets_go_once_to_each_leader_then_fetches_one_per_leader():
    core = fetcher()
    step = core.step(0, lambda node: True)
    assert step.fetches == []  # no positions yet
    by_node = dict(step.resets)
    assert sorted(by_node) == [1, 2]
    assert [e[0] for e in by_node[1]] == [TP0, TP2] and [e[0] for e in by_node[2]] == [TP1]
    request = core.reset_request(by_node[1])
    assert [p.partition for p in request.topics[0].partitions] == [0, 2]
    assert core.step(1, lambda node: True).resets == []  # not asked twice
    for node, entries in step.resets:
        core.on_reset_answer(entries, offsets_answer(entries), None, 2)
    assert core.resetting == set()
    step = core.step(3, lambda node: True)
    assert sorted(plan.node_id for plan in step.fetches) == [1, 2]
    assert core.fetching == {1, 2}
    assert core.step(4, lambda node: True).fetches == []  # one in flight per leader
    plan = next(p for p in step.fetches if p.node_id == 1)
    fetch = core.fetch_request(plan)
    assert fetch.max_wait_ms == ConsumerConfig().fetch_max_wait_ms
    assert core.fetch_timeout_ms == (ConnectionConfig().request_timeout_ms
                                     + ConsumerConfig().fetch_max_wait_ms)
    core.on_fetch_answer(plan, empty_fetch_answer(plan), None, 5)
    assert core.fetching == {2}
    again = core.step(6, lambda node: True).fetches
    assert [p.node_id for p in again] == [1]
    core.check_invariants()


def test_a_failed_fetch_asks_for_metadata_and_backs_its_partitions_off():
    core = fetcher()
    for node, entries in core.step(0, lambda node: True).resets:
        core.on_reset_answer(entries, offsets_answer(entries), None, 0)
    plans = core.step(0, lambda node: True).fetches
    assert not core.metadata.needs_update(1_000)
    for plan in plans:
        core.on_fetch_answer(plan, None, ConnectionFailedError("lost"), 1_000)
    assert core.metadata.needs_update(1_000) and core.fetching == set()
    step = core.step(1_000, lambda node: True)
    assert step.fetches == [] and step.metadata_due and step.wake_at_ms == 1_001
    core.metadata.on_refresh_started()
    step = core.step(1_000, lambda node: True)
    assert not step.metadata_due  # one refresh at a time; its answer wakes the driver
    assert step.wake_at_ms == 1_100  # the partitions' retry backoff
    assert [p.node_id for p in core.step(1_100, lambda node: True).fetches] != []


def test_a_partition_without_a_leader_asks_for_a_refresh():
    core = fetcher(leaders=(1, -1, 1))
    core.step(0, lambda node: True)
    assert core.metadata.needs_update(core.metadata.refresh_backoff_ms)


@given(st.lists(st.tuples(st.sampled_from(["step", "answer", "fail"]), st.integers(0, 50)),
                max_size=60))
def test_no_leader_ever_has_two_fetches_in_flight(events):
    core = fetcher()
    now = 0
    in_flight: dict[int, object] = {}
    resets: list = []
    for kind, advance in events:
        now += advance
        if kind == "step":
            step = core.step(now, lambda node: True)
            for plan in step.fetches:
                assert plan.node_id not in in_flight
                in_flight[plan.node_id] = plan
            resets += step.resets
        elif in_flight:
            node = sorted(in_flight)[0]
            plan = in_flight.pop(node)
            if kind == "answer":
                core.on_fetch_answer(plan, empty_fetch_answer(plan), None, now)
            else:
                core.on_fetch_answer(plan, None, ConnectionFailedError("lost"), now)
        elif resets:
            _, entries = resets.pop()
            core.on_reset_answer(entries, offsets_answer(entries), None, now)
        assert core.fetching == set(in_flight)
        core.check_invariants()


# --- the producer core: dials and the end of an abort ----------------------------------------

def producer_core(**options) -> ProducerCore:
    metadata = MetadataCache((Address("h1", 1),), refresh_backoff_ms=100)
    metadata.add_topics(["t"])
    metadata.on_update(metadata_answer(), 0)
    config = ProducerConfig(linger_ms=0, **options)
    return ProducerCore(config, ConnectionConfig(), metadata, random.Random(1))


def test_the_sender_names_unconnected_leaders_to_dial():
    core = producer_core(idempotent=False)
    for partition in (0, 1):
        core.accumulator.append("t", partition, 0, None, b"v", (), object(), 0, 3)
    step = core.step(0, lambda node: None)
    assert step.plans == [] and sorted(step.dial) == [1, 2]
    assert core.step(0, lambda node: False).dial == []  # connected but busy
    step = core.step(0, lambda node: True if node == 1 else None)
    assert [p.node_id for p in step.plans] == [1] and step.dial == [2]


def test_an_abort_is_finished_once_nothing_of_the_transaction_is_queued_or_in_flight():
    core = producer_core(transactional_id="tx")
    txn = core.txn
    txn.producer_id, txn.producer_epoch = 7, 0
    error = TransactionAbortedError("aborted")
    core.accumulator.append("t", 0, 0, None, b"v", (), object(), 0, 3)
    outcomes, finished = core.abort_transaction_records(error)
    assert [o.error for o in outcomes] == [error] and finished
    txn.in_flight_batches = 1  # a Produce of the transaction still out
    outcomes, finished = core.abort_transaction_records(error)
    assert outcomes == [] and not finished
    txn.in_flight_batches = 0
    assert core.abort_transaction_records(error) == ([], True)
