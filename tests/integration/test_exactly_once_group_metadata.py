"""TxnOffsetCommit checks group membership (KIP-447), end to end over real sockets.

Goal: a consume-transform-produce application that hands ``consumer.group_metadata()`` to
``send_offsets_to_transaction`` gets its offsets committed while it is a member of the
group's current generation, and a typed ``CommitFailedError`` (the transaction must abort,
the group's committed offsets stay as they were, the transaction's records stay invisible to
read_committed readers) once it is not: a stale generation (ILLEGAL_GENERATION) or a member
that left (UNKNOWN_MEMBER_ID, the zombie whose partitions moved to a new member). A plain
group id keeps working without any check.
Method: an in-process broker on loopback and real files (``threaded_broker``), the async
clients in one task (the group has one member at a time, so no member waits for another's
rebalance), under trio and under asyncio (``on_each_loop``), the committed
offsets read back through the group coordinator, the output topic read back read_committed.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

import anyio
import pytest

from rivven_broker.client import CommitFailedError, Consumer, ConsumerGroupMetadata, RivvenError
from rivven_broker.client.aio import open_admin, open_consumer, open_producer
from rivven_broker.client.types import TopicPartition
from rivven_broker.protocol.errors import ErrorCode
from tests.loops import on_each_loop

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

GROUP = "eos-members"
IN, OUT = TopicPartition("in", 0), TopicPartition("out", 0)
FAST = dict(session_timeout_ms=6000, heartbeat_interval_ms=200, fetch_max_wait_ms=100,
            retry_backoff_ms=20, reconnect_backoff_ms=20, enable_auto_commit=False,
            auto_offset_reset="earliest")


async def _join(address: str, stack, instance_id: str | None = None) -> object:
    """A subscribed async consumer (static when ``instance_id`` is given) that owns ``in``-0
    (its join completed)."""
    consumer = await stack.enter_async_context(
        open_consumer(address, group_id=GROUP, group_instance_id=instance_id, **FAST))
    consumer.subscribe([IN.topic])
    with anyio.fail_after(30):
        while IN not in consumer.assignment():
            await consumer.poll(timeout_ms=100)
    meta = consumer.group_metadata()
    assert meta.group_id == GROUP and meta.generation_id >= 1 and meta.member_id
    return consumer


async def _transaction(producer, offset: int, group, value: bytes) -> None:
    await producer.begin_transaction()
    await producer.send(OUT.topic, value=value, partition=0)
    await producer.send_offsets_to_transaction({IN: offset}, group)
    await producer.commit_transaction()


async def _committed_reaches(consumer, offset: int) -> None:
    """The group's committed offset of ``in``-0 becomes ``offset`` (a committed transaction's
    offsets are applied once its markers are durable, just after commit returns)."""
    with anyio.fail_after(30):
        while (committed := await consumer.committed(IN)) != offset:
            assert committed is None or committed < offset, committed


async def _refused(producer, offset: int, group, value: bytes) -> CommitFailedError:
    await producer.begin_transaction()
    await producer.send(OUT.topic, value=value, partition=0)
    with pytest.raises(CommitFailedError) as refused:
        await producer.send_offsets_to_transaction({IN: offset}, group)
    with pytest.raises(CommitFailedError):  # the transaction cannot commit any more
        await producer.commit_transaction()
    await producer.abort_transaction()
    return refused.value


async def _read_committed(address: str) -> list[bytes]:
    async with open_consumer(address, isolation_level="read_committed",
                             auto_offset_reset="earliest") as reader:
        reader.assign([OUT])
        end = (await reader.end_offsets([OUT]))[OUT]
        values: list[bytes] = []
        with anyio.fail_after(30):
            while await reader.position(OUT) < end:
                values += [r.value for r in await reader.poll(timeout_ms=100)]
        return values

async def _broker_with_topics(threaded_broker) -> str:
    """A broker without a rebalance delay, with the one-partition IN and OUT topics."""
    running = threaded_broker(group_initial_rebalance_delay_ms=0)
    async with open_admin(running.address) as admin:
        await admin.create_topic(IN.topic, partitions=1)
        await admin.create_topic(OUT.topic, partitions=1)
    return running.address


@on_each_loop
async def test_txn_offsets_need_a_current_membership(threaded_broker):
    address = await _broker_with_topics(threaded_broker)
    async with open_producer(address) as plain:
        for i in range(10):
            await plain.send(IN.topic, value=b"%d" % i, partition=0)
    async with open_producer(address, transactional_id="ctp-1") as producer:
        await producer.init_transactions()
        async with AsyncExitStack() as first_stack:
            first = await _join(address, first_stack)
            old = first.group_metadata()
            await _transaction(producer, 3, old, b"ok-3")
            await _committed_reaches(first, 3)
            stale = old._replace(generation_id=old.generation_id - 1)
            error = await _refused(producer, 4, stale, b"stale-4")
            assert error.error_code == ErrorCode.ILLEGAL_GENERATION
            assert await first.committed(IN) == 3
        # the first member left (LeaveGroup on close): a new one owns in-0 now
        async with AsyncExitStack() as second_stack:
            second = await _join(address, second_stack)
            current = second.group_metadata()
            assert current.member_id != old.member_id
            error = await _refused(producer, 5, old, b"zombie-5")
            assert error.error_code == ErrorCode.UNKNOWN_MEMBER_ID and not error.retriable
            assert await second.committed(IN) == 3
            await _transaction(producer, 6, current, b"ok-6")
            await _committed_reaches(second, 6)
            await _transaction(producer, 7, GROUP, b"plain-7")  # a plain group id: no check
            await _committed_reaches(second, 7)
    assert await _read_committed(address) == [b"ok-3", b"ok-6", b"plain-7"]


@on_each_loop
async def test_blocking_consumer_group_metadata(threaded_broker):
    running = threaded_broker(group_initial_rebalance_delay_ms=0)

    def check() -> None:
        with Consumer(running.address, group_id=GROUP, group_instance_id="host-a") as consumer:
            meta = consumer.group_metadata()
            assert meta == ConsumerGroupMetadata(GROUP, -1, "", "host-a")  # not joined yet
        with Consumer(running.address) as groupless:
            with pytest.raises(RivvenError) as no_group:
                groupless.group_metadata()
            assert no_group.value.code == "INVALID_GROUP_ID"

    await anyio.to_thread.run_sync(check)


@on_each_loop
async def test_a_static_member_commits_with_its_metadata(threaded_broker):
    address = await _broker_with_topics(threaded_broker)
    async with AsyncExitStack() as stack:
        consumer = await _join(address, stack, instance_id="host-a")
        meta = consumer.group_metadata()
        assert meta.group_instance_id == "host-a" and meta.member_id
        async with open_producer(address, transactional_id="ctp-static") as producer:
            await producer.init_transactions()
            await _transaction(producer, 2, meta, b"static-2")
        await _committed_reaches(consumer, 2)


@on_each_loop
async def test_a_replaced_static_member_is_fenced(threaded_broker):
    address = await _broker_with_topics(threaded_broker)

    async with open_producer(address, transactional_id="ctp-replaced") as producer:
        await producer.init_transactions()
        first_stack, second_stack = AsyncExitStack(), AsyncExitStack()
        first = await _join(address, first_stack, instance_id="host-a")
        old = first.group_metadata()
        await _transaction(producer, 2, old, b"first-2")
        await _committed_reaches(first, 2)
        second = await _join(address, second_stack, instance_id="host-a")  # replaces the first
        current = second.group_metadata()
        assert current.member_id != old.member_id
        error = await _refused(producer, 3, old, b"zombie-3")
        assert error.error_code == ErrorCode.FENCED_INSTANCE_ID  # v1 carries the instance id
        await _transaction(producer, 4, current, b"second-4")
        await _committed_reaches(second, 4)
        await second_stack.aclose()
        await first_stack.aclose()
