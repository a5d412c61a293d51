"""The project's own client inside the simulator, from both fronts, and the livelock guard.

Method: (1) a toy trio program with a task that waits 0 ms for ever is run under the same
``LivelockGuard`` the world installs: virtual time stops advancing, and the guard must stop the
run and name the busy task (without it, autojump would spin for ever in real time). (2) A
short crash-and-reset scenario runs with real consumers next to thin producers and must pass
every invariant. (3) The same with real producers: every invariant must hold too. (2) and (3)
are one body each, run once per front the simulator has: ``client = "rivven"`` (the trio
client over ``SimNet``; its sender once spun while a metadata refresh was due, which the
guard caught) and ``client = "rivven-blocking"`` (the blocking ``Producer`` and ``Consumer``
on program threads; its ``send`` once woke itself for ever while a topic's metadata was
unknown, which the program thread's spin check caught).
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from sim.scenario import REAL_CLIENTS, loads
from sim.world import LivelockGuard, run_scenario

SCENARIO = """
[run]
duration = "16s"
quiet_period = "7s"
[workload]
topics = [{{ name = "t", partitions = 2 }}]
producers = [{{ count = 1, rate = 20, in_flight = 2, client = "{producer}" }}]
consumers = [{{ count = 1, client = "{consumer}" }}, {{ count = 1 }}]
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


@pytest.mark.parametrize("client", REAL_CLIENTS)
def test_real_consumer_under_faults(client: str) -> None:
    scenario = SCENARIO.format(producer="thin", consumer=client)
    result = run_scenario(loads(scenario.encode(), "real-consumer"), 1)
    assert result.ok, [v.message for v in result.violations]
    polls_by = {e.process for e in result.history if e.f == "poll" and e.type == "ok"}
    assert {"c1", "c2"} <= polls_by
    assert result.stats["faults"] >= 3


@pytest.mark.parametrize("client", REAL_CLIENTS)
def test_real_producer_under_faults(client: str) -> None:
    scenario = SCENARIO.format(producer=client, consumer=client)
    result = run_scenario(loads(scenario.encode(), "real-producer"), 1)
    assert result.ok, [v.message for v in result.violations]
    sends_by = {e.process for e in result.history if e.f == "send" and e.type == "ok"}
    assert "p1" in sends_by
