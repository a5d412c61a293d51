"""Helpers of the connector runtime's integration tests: reading topics back."""

from __future__ import annotations

import json

import trio

from rivven_broker.client.trio import open_admin, open_consumer
from rivven_broker.client.types import TopicPartition


async def read_committed(bootstrap: str, topic: str,
                         isolation_level: str = "read_committed") -> list:
    """Every record of ``topic`` a ``read_committed`` reader (or ``isolation_level``) sees
    now, partition by partition."""
    with trio.fail_after(30):
        async with open_admin(bootstrap) as admin:
            partitions = (await admin.describe_topic(topic)).partitions
        async with open_consumer(bootstrap, isolation_level=isolation_level,
                                 enable_auto_commit=False,
                                 auto_offset_reset="earliest") as consumer:
            tps = [TopicPartition(topic, p) for p in range(partitions)]
            consumer.assign(tps)
            ends = await consumer.end_offsets(tps)
            for tp in tps:
                consumer.seek(tp, 0)
            records = []
            remaining = {tp for tp in tps if ends[tp] > 0}
            while remaining:
                records.extend(await consumer.poll(timeout_ms=100))
                for tp in list(remaining):
                    if await consumer.position(tp) >= ends[tp]:
                        remaining.discard(tp)
    return records


def values(records: list) -> list:
    return [json.loads(record.value) for record in records]
