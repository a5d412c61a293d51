"""Rivven's client for trio programs: ``open_producer``, ``open_consumer``, ``open_admin``.

Theory of operation
-------------------
The async driver of ``rivven_broker.client.aio`` (AnyIO, so it runs under trio as well as
asyncio) under the names trio programs have imported since before it served asyncio too:
``TrioProducer`` is ``AsyncProducer``, and so on. Nothing here is code of its own::

    async with open_producer("127.0.0.1:9092") as producer:
        meta = await producer.send("orders", value=b"...", key=b"k")

Options and errors are those of the blocking classes (docs/client.md). This module's name
shadows nothing: inside the package, ``import trio`` is the real trio (absolute imports).
"""

from __future__ import annotations

from rivven_broker.client.aio import (
    AsyncAdmin as TrioAdmin,
    AsyncConsumer as TrioConsumer,
    AsyncProducer as TrioProducer,
    ClientEnv,
    Delivery,
    open_admin,
    open_consumer,
    open_producer,
)

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
