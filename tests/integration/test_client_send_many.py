"""``AsyncProducer.send_many_nowait`` (the connector runtime's encoded path) against a broker
process over loopback: records of one call land as ``send_nowait`` would put them (partition
by key, order per key, headers, timestamps), inside a transaction, with one ``Delivery``
that resolves when the last is acknowledged or with the first error."""

from __future__ import annotations

import anyio
import pytest
import trio

from rivven_broker.client._aio_producer import Delivery, _SharedDelivery
from rivven_broker.client.errors import MessageTooLargeError, RivvenError
from rivven_broker.client.trio import open_admin, open_producer
from rivven_broker.client.types import RecordMetadata
from rivven_broker.records import partition_for_key
from tests.integration.connect.helpers import read_committed

PARTITIONS = 3


def test_records_of_one_call_land_as_single_sends_would(broker_process):
    bootstrap = broker_process().address
    keys = [b'{"id":%d}' % (i % 7) for i in range(300)]
    values = [b"v%d" % i if i % 5 else None for i in range(300)]  # tombstones too
    headers = [(("rivven.cdc.id", b"%d" % i), ("n", None)) for i in range(300)]
    stamps = [1_700_000_000_000 + i for i in range(300)]

    async def main() -> Delivery:
        async with open_admin(bootstrap) as admin:
            await admin.create_topic("many", partitions=PARTITIONS)
        async with open_producer(bootstrap, transactional_id="many", linger_ms=1_000) as producer:
            await producer.init_transactions()
            await producer.begin_transaction()
            delivery = await producer.enqueue_many("many", keys[:100], values[:100],
                                                   headers[:100], stamps[:100])
            second = producer.send_many_nowait("many", keys[100:], values[100:],
                                               headers[100:], stamps[100:])
            assert not second.done()  # lingering: nothing acknowledged yet
            await producer.commit_transaction()
            assert delivery.done() and second.done()
            metadata = await second
            assert isinstance(metadata, RecordMetadata) and metadata.topic == "many"
            return delivery

    trio.run(main)
    records = trio.run(read_committed, bootstrap, "many")
    assert len(records) == 300
    by_key: dict[bytes, list[int]] = {}
    for record in records:
        index = int(dict(record.headers)["rivven.cdc.id"])
        assert record.partition == partition_for_key(record.key, PARTITIONS)
        assert (record.key, record.value, record.timestamp) == (
            keys[index], values[index], stamps[index])
        by_key.setdefault(record.key, []).append(index)
    assert all(indexes == sorted(indexes) for indexes in by_key.values())


def test_a_refused_record_raises_and_nothing_waits_for_it(broker_process):
    bootstrap = broker_process().address

    async def main() -> None:
        async with open_admin(bootstrap) as admin:
            await admin.create_topic("big", partitions=1)
        async with open_producer(bootstrap, transactional_id="big",
                                 max_request_size=10_000) as producer:
            await producer.init_transactions()
            await producer.begin_transaction()
            await producer.enqueue("big", value=b"x")  # the topic's metadata is known now
            with pytest.raises(MessageTooLargeError):
                producer.send_many_nowait("big", [None, None], [b"ok", b"x" * 20_000],
                                          [(), ()], [1, 2])
            await producer.abort_transaction()
        with pytest.raises(anyio.WouldBlock):  # no metadata yet: nothing queued
            async with open_producer(bootstrap) as fresh:
                fresh.send_many_nowait("unknown-yet", [None], [b"v"], [()], [1])

    trio.run(main)


def test_the_shared_token_resolves_once_with_the_first_error():
    delivery = Delivery()
    share = _SharedDelivery(delivery, 3)
    first, second = RivvenError("first"), RivvenError("second")
    share._resolve(None, first)
    share._resolve(RecordMetadata("t", 0, 5, 1), None)
    assert not delivery.done()
    share._resolve(None, second)
    assert delivery.done() and delivery._error is first
