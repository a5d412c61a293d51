"""Exactly-once end to end with the real clients: retries under faults, fencing, isolation.

Goal: the guarantees of docs/exactly-once.md as an application sees them. Method: an
in-process broker on loopback and real files (on a trio thread of its own), the clients
through every front end (``on_each_front``: blocking, trio, asyncio), and, for the retry test,
a fault-injecting proxy (``faulty_proxy.py``, on the broker's thread) between producer and
broker that duplicates requests and cuts connections before and after the broker handled a
request. Every check reads the partitions back with a consumer and compares with what was
sent.
"""

from __future__ import annotations

import anyio
import pytest

from tests.integration.faulty_proxy import FaultyProxy
from rivven_broker.client.config import ProducerConfig
from rivven_broker.client.errors import (
    InvalidTxnStateError,
    ProducerFencedError,
    RivvenError,
)
from rivven_broker.client.types import TopicPartition
from tests.frontends import on_each_front

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


async def read_all(front, bootstrap: str, topic: str, partitions: int, isolation: str) -> dict:
    """Every record of ``topic`` up to its end offsets, per partition, in offset order."""
    out: dict[int, list] = {p: [] for p in range(partitions)}
    async with front.open_consumer(bootstrap, auto_offset_reset="earliest",
                             isolation_level=isolation) as consumer:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        with anyio.fail_after(60):
            for tp in tps:
                while await consumer.position(tp) < ends[tp]:
                    for record in await consumer.poll(timeout_ms=200, max_records=10_000):
                        out[record.partition].append(record)
    return out


@pytest.mark.slow
@on_each_front
async def test_100k_idempotent_records_through_duplicates_and_dropped_connections(
    front, threaded_broker, trio_thread
):
    """No duplicates and per-partition order kept, while the proxy duplicates requests and
    cuts connections before and after the broker handled them."""
    running = threaded_broker()
    proxy = FaultyProxy(running.port, seed=7, duplicate_p=0.02, drop_after_p=0.02,
                        drop_before_p=0.01, faults_max=150)
    trio_thread.start(proxy.serve)
    running.broker.context.advertised_port = proxy.port  # Metadata leads clients to the proxy
    async with front.open_admin(running.address) as admin:
        await admin.create_topic("eos", partitions=4)
    total, keys = 100_000, 64
    async with front.open_producer(proxy.address, linger_ms=2, batch_size_bytes=4096,
                             retry_backoff_ms=5, reconnect_backoff_ms=5,
                             request_timeout_ms=5_000) as producer:
        deliveries = []
        for i in range(total):
            key = b"k%d" % (i % keys)
            deliveries.append(await producer.enqueue("eos", value=b"%d" % i, key=key))
        await producer.flush()
        failures = []
        for delivery in deliveries:
            try:
                await delivery
            except RivvenError as error:
                failures.append(error)
        assert not failures, failures[0]
    counts = (proxy.duplicated, proxy.dropped_after, proxy.dropped_before)
    assert min(counts) >= 1 and sum(counts) >= 20, counts
    records = await read_all(front, running.address, "eos", 4, "read_uncommitted")
    seen = [int(r.value) for rs in records.values() for r in rs]
    assert len(seen) == total and sorted(seen) == list(range(total))  # once each
    for rs in records.values():  # per key (hence per partition), in the order sent
        last: dict[bytes, int] = {}
        for record in rs:
            value = int(record.value)
            assert last.get(record.key, -1) < value
            last[record.key] = value


@on_each_front
async def test_a_zombie_is_fenced_and_its_open_transaction_aborted(front, threaded_broker):
    running = threaded_broker()
    bootstrap = running.address
    async with front.open_admin(bootstrap) as admin:
        await admin.create_topic("out", partitions=2)
    async with front.open_producer(bootstrap, transactional_id="app") as zombie:
        await zombie.init_transactions()
        await zombie.begin_transaction()
        for i in range(20):
            await zombie.enqueue("out", value=b"zombie-%d" % i)
        await zombie.flush()
        async with front.open_producer(bootstrap, transactional_id="app") as successor:
            await successor.init_transactions()  # fences the zombie, aborts its transaction
            # The zombie can neither write nor commit any more; the error is fatal for it.
            with pytest.raises(ProducerFencedError):
                await zombie.send("out", value=b"late", partition=0)
            with pytest.raises(ProducerFencedError):
                await zombie.commit_transaction()
            with pytest.raises(ProducerFencedError):
                await zombie.begin_transaction()
            await successor.begin_transaction()
            for i in range(10):
                await successor.enqueue("out", value=b"good-%d" % i)
            await successor.commit_transaction()
    committed = await read_all(front, bootstrap, "out", 2, "read_committed")
    values = sorted(r.value for rs in committed.values() for r in rs)
    assert values == sorted(b"good-%d" % i for i in range(10))
    everything = await read_all(front, bootstrap, "out", 2, "read_uncommitted")
    assert sum(r.value.startswith(b"zombie") for rs in everything.values() for r in rs) == 20


@on_each_front
async def test_an_open_transaction_is_invisible_to_read_committed_only(front, threaded_broker):
    running = threaded_broker()
    bootstrap = running.address
    async with front.open_admin(bootstrap) as admin:
        await admin.create_topic("iso", partitions=1)
    async with front.open_producer(bootstrap, transactional_id="t1") as producer:
        await producer.init_transactions()
        with pytest.raises(InvalidTxnStateError):
            await producer.send("iso", value=b"outside")  # only inside a transaction
        await producer.begin_transaction()
        for i in range(5):
            await producer.enqueue("iso", value=b"open-%d" % i)
        await producer.flush()
        uncommitted = await read_all(front, bootstrap, "iso", 1, "read_uncommitted")
        committed = await read_all(front, bootstrap, "iso", 1, "read_committed")
        assert [r.value for r in uncommitted[0]] == [b"open-%d" % i for i in range(5)]
        assert committed[0] == []
        await producer.abort_transaction()
        await producer.begin_transaction()
        await producer.enqueue("iso", value=b"kept")
        await producer.commit_transaction()
        committed = await read_all(front, bootstrap, "iso", 1, "read_committed")
        assert [r.value for r in committed[0]] == [b"kept"]
        # Markers never surface as records: 5 + 1 data records, whatever isolation.
        uncommitted = await read_all(front, bootstrap, "iso", 1, "read_uncommitted")
        assert len(uncommitted[0]) == 6


@on_each_front
async def test_the_default_producer_is_idempotent_and_a_plain_one_still_works(
    front, threaded_broker
):
    running = threaded_broker()
    async with front.open_producer(running.address) as producer:
        meta = await producer.send("plain", value=b"x", partition=0)
        assert producer._core.txn is not None and producer._core.txn.producer_id >= 1
    async with front.open_producer(running.address, acks=1) as plain:  # acks=1: not idempotent
        assert plain._core.txn is None
        await plain.send("plain", value=b"y", partition=0)
    with pytest.raises(ValueError):
        ProducerConfig(acks=1, idempotent=True)
    with pytest.raises(ValueError):
        ProducerConfig(transactional_id="t", max_in_flight_requests_per_connection=6)
    records = await read_all(front, running.address, "plain", 1, "read_committed")
    assert [r.value for r in records[0]] == [b"x", b"y"] and meta.offset == 0


async def test_errors_name_their_codes_and_retriability():
    assert ProducerFencedError().code == "PRODUCER_FENCED"
    assert not ProducerFencedError().retriable
    assert issubclass(ProducerFencedError, RivvenError)
