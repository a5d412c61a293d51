"""Rivven's async client, for trio *and* asyncio programs: ``open_producer``, ``open_consumer``,
``open_admin``.

Theory of operation
-------------------
One driver, written on AnyIO, runs the sans-I/O client core (``producer_core``,
``consumer_core``, ``group_core``, ``metadata`` ...): the same code path whichever event loop
awaits it, trio (``trio.run``) or asyncio (``asyncio.run``, FastAPI, aiohttp)::

    async with open_producer("127.0.0.1:9092") as producer:
        meta = await producer.send("orders", value=b"...", key=b"k")
    async with open_consumer("127.0.0.1:9092", auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("orders", 0)])
        records = await consumer.poll(timeout_ms=1000)
    async with open_admin("127.0.0.1:9092") as admin:
        await admin.create_topic("orders", partitions=3)

It runs over an ``env`` (``clock`` + ``net``): ``ClientEnv`` (real sockets, the event loop's
clock) by default, the simulator's virtual ones when it passes its own (under trio's
``MockClock``). Options and errors are those of the blocking classes (docs/client.md).
``rivven_broker.client.trio`` is this module under the names trio programs have used.
"""

from __future__ import annotations

from rivven_broker.client._aio_admin import AsyncAdmin, open_admin
from rivven_broker.client._aio_consumer import AsyncConsumer, open_consumer
from rivven_broker.client._aio_net import ClientEnv
from rivven_broker.client._aio_producer import AsyncProducer, Delivery, open_producer

__all__ = [
    "open_producer",
    "open_consumer",
    "open_admin",
    "AsyncProducer",
    "AsyncConsumer",
    "AsyncAdmin",
    "Delivery",
    "ClientEnv",
]
