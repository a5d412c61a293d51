"""The producer's sender decisions: what is sent, retried, failed or timed out.

Method: a ``ProducerCore`` over a metadata cache filled from a real ``MetadataResponse``;
time is a number passed in; answers are real ``ProduceResponse`` messages. Each test appends
records, steps the core, answers the plan and checks the outcomes, the queue and whether
metadata was marked stale.
"""

from __future__ import annotations

import random

from rivven_broker.client.config import ConnectionConfig, ProducerConfig
from rivven_broker.client.errors import (
    ConnectionFailedError,
    DeliveryTimeoutError,
    InvalidTopicNameError,
)
from rivven_broker.client.metadata import MetadataCache, parse_bootstrap
from rivven_broker.client.producer_core import ProducerCore
from rivven_broker.protocol import messages as m
from rivven_broker.protocol.errors import ErrorCode


def make(**overrides):
    # Plain (non-idempotent) producers here; idempotence and transactions are tested in
    # test_transaction_manager.py.
    config = ProducerConfig(**{"linger_ms": 0, "idempotent": False, **overrides})
    connection = ConnectionConfig(retry_backoff_ms=100, retry_backoff_max_ms=1000)
    cache = MetadataCache(parse_bootstrap("h:1"), refresh_backoff_ms=0)
    cache.add_topics(["t"])
    cache.on_update(
        m.MetadataResponse(
            brokers=(m.BrokerMetadata(node_id=1, host="h", port=1),),
            topics=(m.TopicMetadata(name="t", partitions=(
                m.PartitionMetadata(partition=0, leader=1, leader_epoch=0),)),),
        ),
        0,
    )
    return ProducerCore(config, connection, cache, random.Random(5))


def send(core, n=3, now=0):
    for i in range(n):
        core.accumulator.append("t", 0, 1000 + i, None, b"v", (), i, now, 1)


def answer(code=ErrorCode.NONE, base=0):
    return m.ProduceResponse(topics=(m.ProduceTopicResponse(name="t", partitions=(
        m.ProducePartitionResponse(partition=0, error_code=code, base_offset=base),)),))


def step_plan(core, now):
    step = core.step(now, lambda node: True)
    [plan] = step.plans
    for batch in plan.batches:
        batch.seal()
    return plan


def test_a_successful_answer_completes_the_batch():
    core = make()
    send(core)
    plan = step_plan(core, 0)
    request = core.produce_request(plan)
    assert request.acks == -1 and request.topics[0].partitions[0].partition == 0
    [outcome] = core.on_response(plan, answer(base=42), 1)
    assert outcome.error is None and outcome.base_offset == 42
    assert outcome.batch.tokens == [0, 1, 2] and outcome.batch.timestamps == [1000, 1001, 1002]
    assert core.accumulator.buffered_bytes == 0


def test_not_leader_is_retried_after_backoff_and_refreshes_metadata():
    core = make()
    send(core)
    plan = step_plan(core, 0)
    assert not core.metadata.needs_update(0)
    assert core.on_response(plan, answer(ErrorCode.NOT_LEADER), 10) == []
    assert core.metadata.needs_update(10)
    assert core.step(10, lambda node: True).plans == []  # backing off
    step = core.step(10_000, lambda node: True)
    [plan2] = step.plans
    assert plan2.batches == plan.batches and plan2.batches[0].attempts == 2


def test_non_retriable_errors_fail_at_once():
    core = make()
    send(core)
    plan = step_plan(core, 0)
    [outcome] = core.on_response(plan, answer(ErrorCode.INVALID_TOPIC_NAME), 1)
    assert isinstance(outcome.error, InvalidTopicNameError)
    assert core.accumulator.incomplete() == []


def test_a_lost_connection_is_retried_until_the_delivery_timeout():
    core = make(delivery_timeout_ms=1000)
    send(core)
    plan = step_plan(core, 0)
    assert core.on_request_failed(plan, ConnectionFailedError("gone"), 100) == []
    plan = step_plan(core, 400)
    [outcome] = core.on_request_failed(plan, ConnectionFailedError("gone"), 990)
    assert isinstance(outcome.error, DeliveryTimeoutError)
    assert isinstance(outcome.error.__cause__, ConnectionFailedError)


def test_queued_batches_expire_with_delivery_timeout():
    core = make(delivery_timeout_ms=500)
    send(core)
    step = core.step(0, lambda node: False)  # the leader cannot take requests
    assert step.plans == [] and step.wake_at_ms == 500
    step = core.step(500, lambda node: False)
    [outcome] = step.failed
    assert isinstance(outcome.error, DeliveryTimeoutError)


def test_an_error_response_fails_the_request_as_a_whole():
    core = make()
    send(core)
    plan = step_plan(core, 0)
    outcomes = core.on_response(plan, m.ErrorResponse(ErrorCode.INVALID_REQUEST, "bad"), 1)
    assert outcomes[0].error.code == "INVALID_REQUEST"


def test_acks_zero_completes_when_written():
    core = make(acks=0)
    send(core)
    plan = step_plan(core, 0)
    assert not core.produce_request(plan).expects_response()
    [outcome] = core.on_sent_without_ack(plan)
    assert outcome.error is None and outcome.base_offset == -1

