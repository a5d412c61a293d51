"""A second runtime of the same source fences the first (``transactional_id = connect-NAME``):
the first stops in ``error``, the second resumes at the committed position, and readers see
every generated record once."""

from __future__ import annotations

import trio

from rivven_broker.client.trio import open_admin
from rivven_connect.core.config import load_config
from rivven_connect.driver import ensure_offsets_topic, run_connect
from rivven_connect.sources import build_source
from tests.integration.connect.helpers import read_committed, values


async def test_a_second_runtime_fences_the_first_and_nothing_repeats(broker):
    config = load_config({"http": "off", "sources": {"gen": {
        "connector": "datagen", "topic": "fence.out",
        "config": {"rate": 2000, "batch_size": 50, "record_size_bytes": 8}}}}, env={})
    async with open_admin(broker.address) as admin:
        await admin.create_topic("fence.out", partitions=2)
    await ensure_offsets_topic(broker.address)
    results = {}

    async def runtime(label, stop):
        sources = {"gen": build_source(config.sources["gen"])}
        results[label] = (await run_connect(config, broker.address, sources, stop))["gen"]

    first_stop, second_stop = trio.Event(), trio.Event()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(runtime, "first", first_stop)
            while not await read_committed(broker.address, "fence.out"):
                await trio.sleep(0.05)  # until the first has committed a batch
            nursery.start_soon(runtime, "second", second_stop)
            while "first" not in results:
                await trio.sleep(0.05)  # the first is fenced on its next transaction
            committed = len(await read_committed(broker.address, "fence.out"))
            while len(await read_committed(broker.address, "fence.out")) <= committed:
                await trio.sleep(0.05)  # the second makes progress
            second_stop.set()
    assert results["first"].state == "error", results["first"]
    assert "FENCED" in results["first"].error.upper(), results["first"].error
    assert results["second"].state == "stopped", results["second"]
    seqs = sorted(row["seq"] for row in values(await read_committed(broker.address,
                                                                     "fence.out")))
    assert seqs == list(range(len(seqs))) and seqs[-1] == results["second"].position
