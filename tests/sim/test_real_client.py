"""The project's own trio client inside the simulator, and the livelock guard.

Method: (1) a toy trio program with a task that waits 0 ms for ever is run under the same
``LivelockGuard`` the world installs: virtual time stops advancing, and the guard must stop the
run and name the busy task (without it, autojump would spin for ever in real time). (2) A
short crash-and-reset scenario runs with ``client = "rivven"`` consumers (the real
``TrioConsumer`` over ``SimNet``) next to thin producers and must pass every invariant. (3)
The same with ``client = "rivven"`` producers (the real ``TrioProducer``): every invariant
must hold too (its sender once spun while a metadata refresh was due, which the guard caught).
"""

from __future__ import annotations

import trio
import trio.testing

from sim.scenario import loads
from sim.world import LivelockGuard, run_scenario

SCENARIO = """
[run]
duration = "16s"
quiet_period = "7s"
[workload]
topics = [{{ name = "t", partitions = 2 }}]
producers = [{{ count = 1, rate = 20, in_flight = 2, client = "{producer}" }}]
consumers = [{{ count = 1, client = "rivven" }}, {{ count = 1 }}]
[nemesis]
interval = {{ min = "1s", max = "2500ms" }}
fault_for = {{ min = "100ms", max = "1500ms" }}
weights = {{ crash = 2, reset = 1, partition = 1 }}
[checks]
liveness_within = "6s"
"""


def test_the_guard_stops_a_busy_loop() -> None:
    guard = LivelockGuard(steps_max=5_000)
    ticks = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            guard.scope = nursery.cancel_scope

            async def honest() -> None:
                while True:
                    await trio.sleep(1)
                    ticks.append(trio.current_time())

            async def spinner() -> None:
                await trio.sleep(3.5)
                while True:
                    await trio.sleep(0)

            nursery.start_soon(honest)
            nursery.start_soon(spinner)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0), instruments=[guard])
    assert guard.report is not None and "spinner" in guard.report
    assert "stuck at 3.500s" in guard.report
    assert ticks == [1.0, 2.0, 3.0]


def test_real_trio_consumer_under_faults() -> None:
    result = run_scenario(loads(SCENARIO.format(producer="thin").encode(), "real-consumer"), 1)
    assert result.ok, [v.message for v in result.violations]
    polls_by = {e.process for e in result.history if e.f == "poll" and e.type == "ok"}
    assert {"c1", "c2"} <= polls_by
    assert result.stats["faults"] >= 3


def test_real_trio_producer_under_faults() -> None:
    result = run_scenario(loads(SCENARIO.format(producer="rivven").encode(), "real-producer"), 1)
    assert result.ok, [v.message for v in result.violations]
