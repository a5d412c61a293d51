"""Rivven's client for trio programs: ``open_producer``, ``open_consumer``, ``open_admin``.

Theory of operation
-------------------
The same sans-I/O core as the blocking client (``rivven_broker.client.core``), driven by trio
tasks instead of threads, over an ``env`` (``clock`` + ``net``; trio's clock and sockets by
default, the simulator's virtual ones when it passes its ``SimEnv``)::

    async with open_producer("127.0.0.1:9092") as producer:
        meta = await producer.send("orders", value=b"...", key=b"k")
    async with open_consumer("127.0.0.1:9092", auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("orders", 0)])
        records = await consumer.poll(timeout_ms=1000)
    async with open_admin("127.0.0.1:9092") as admin:
        await admin.create_topic("orders", partitions=3)

Options and errors are those of the blocking classes (docs/client.md). This module's name
shadows nothing: inside the package, ``import trio`` is the real trio (absolute imports).
"""

from __future__ import annotations

from rivven_broker.client._trio_admin import TrioAdmin, open_admin
from rivven_broker.client._trio_consumer import TrioConsumer, open_consumer
from rivven_broker.client._trio_net import ClientEnv
from rivven_broker.client._trio_producer import Delivery, TrioProducer, open_producer

__all__ = [
    "open_producer",
    "open_consumer",
    "open_admin",
    "TrioProducer",
    "TrioConsumer",
    "TrioAdmin",
    "Delivery",
    "ClientEnv",
]
