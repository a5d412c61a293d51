"""The simulated datagram path (``sim/datagrams.py``) and the real UDP socket of ``RealNet``.

Method: trio tests on pytest-trio's ``autojump_clock`` (virtual time) send datagrams between
endpoints of a ``SimNetwork`` and check each promised fault: loss, duplication and reordering
at about their configured rates (counted over a few thousand datagrams from a fixed seed),
drops across two-way and one-way partitions, stalls and pauses, datagrams to a crashed
incarnation, full receive queues and oversized datagrams; and that a fixed seed gives the same
deliveries twice. The real socket is checked over loopback.
"""

from __future__ import annotations

import errno
import random

import pytest
import trio
import trio.testing

from rivven_broker.server.env import RealNet
from sim.datagrams import DatagramConfig
from sim.net import NetworkConfig, SimNetwork
from sim.trace import Trace


def _network(seed: str = "udp", **datagrams: object) -> SimNetwork:
    config = NetworkConfig(datagrams=DatagramConfig(**datagrams))  # type: ignore[arg-type]
    return SimNetwork(config, random.Random("net"), Trace(), random.Random(seed))


async def _pair(nursery: trio.Nursery, network: SimNetwork):
    await nursery.start(network.run)
    a = await network.endpoint("a").bind_udp("a", 7)
    b = await network.endpoint("b").bind_udp("b", 7)
    return a, b


async def _drain(sock, quiet_s: float = 1.0) -> list[bytes]:
    got = []
    while True:
        with trio.move_on_after(quiet_s) as scope:
            data, host, port = await sock.receive_from()
            got.append(data)
            assert (host, port) == ("a", 7)
        if scope.cancelled_caught:
            return got


async def test_a_clean_path_delivers_each_datagram_once(nursery, autojump_clock) -> None:
    network = _network()
    a, b = await _pair(nursery, network)
    for i in range(100):
        await a.send_to(b"%d" % i, "b", 7)
    got = await _drain(b)
    assert sorted(got, key=int) == [b"%d" % i for i in range(100)]


async def test_loss_duplication_and_reordering_happen_at_their_rates(nursery, autojump_clock) -> None:
    network = _network(loss=0.1, duplicate=0.05, reorder=0.1, reorder_delay_ms=30,
                       queue_datagrams_max=10_000)
    a, b = await _pair(nursery, network)
    sent = 4000
    for i in range(sent):
        await a.send_to(b"%d" % i, "b", 7)
        await trio.sleep(0.005)  # spacing below the reorder delay: reordered ones overtake
    got = [int(d) for d in await _drain(b)]
    distinct = set(got)
    assert 0.07 < 1 - len(distinct) / sent < 0.13  # lost
    assert 0.03 < (len(got) - len(distinct)) / len(distinct) < 0.07  # duplicated
    inversions = sum(1 for x, y in zip(got, got[1:]) if y < x)
    assert inversions > 100  # reordered


async def test_partitions_one_way_blocks_stalls_and_pauses_drop(nursery, autojump_clock) -> None:
    network = _network()
    a, b = await _pair(nursery, network)
    pairs = network.partition([["a"], ["b"]])
    await a.send_to(b"cut", "b", 7)
    network.heal(pairs)
    network.datagrams.block_one_way("a", "b")
    await a.send_to(b"one-way", "b", 7)
    await b.send_to(b"back", "a", 7)  # the other direction still flows
    data, host, _ = await a.receive_from()
    assert (data, host) == (b"back", "b")
    network.datagrams.unblock_one_way("a", "b")
    network.pause("b")
    await a.send_to(b"paused", "b", 7)
    network.resume("b")
    network.stall("a", "b")
    await a.send_to(b"stalled", "b", 7)
    network.unstall("a", "b")
    await a.send_to(b"through", "b", 7)
    assert await _drain(b) == [b"through"]


async def test_a_crashed_incarnation_receives_nothing_and_its_port_is_free(nursery, autojump_clock) -> None:
    network = _network()
    a, b = await _pair(nursery, network)
    network.crash("b")
    with pytest.raises(trio.ClosedResourceError):
        await b.receive_from()
    await a.send_to(b"to the dead", "b", 7)
    await trio.sleep(1)  # lost: nothing is bound there meanwhile
    reborn = await network.endpoint("b").bind_udp("b", 7)
    await a.send_to(b"to the living", "b", 7)
    assert await _drain(reborn) == [b"to the living"]
    c = network.endpoint("c")
    await c.bind_udp("c", 1)
    with pytest.raises(OSError) as taken:
        await c.bind_udp("c", 1)
    assert taken.value.errno == errno.EADDRINUSE


async def test_full_queues_and_oversized_datagrams(nursery, autojump_clock) -> None:
    network = _network(queue_datagrams_max=3, datagram_bytes_max=100)
    a, b = await _pair(nursery, network)
    for i in range(5):
        await a.send_to(b"%d" % i, "b", 7)
    await trio.sleep(1)
    assert len(await _drain(b)) == 3
    with pytest.raises(OSError) as too_long:
        await a.send_to(b"x" * 101, "b", 7)
    assert too_long.value.errno == errno.EMSGSIZE


def test_a_seed_fixes_every_fate() -> None:
    async def run() -> list[bytes]:
        network = _network("fixed", loss=0.2, duplicate=0.2, reorder=0.3)
        async with trio.open_nursery() as nursery:
            a, b = await _pair(nursery, network)
            for i in range(300):
                await a.send_to(b"%d" % i, "b", 7)
            got = await _drain(b)
            nursery.cancel_scope.cancel()
        return got

    first = trio.run(run, clock=trio.testing.MockClock(autojump_threshold=0))
    second = trio.run(run, clock=trio.testing.MockClock(autojump_threshold=0))
    assert first == second and len(first) > 200


async def test_real_udp_sockets_over_loopback() -> None:
    net = RealNet()
    a = await net.bind_udp("127.0.0.1", 0)
    b = await net.bind_udp("127.0.0.1", 0)
    with trio.fail_after(10):
        await a.send_to(b"hello", "127.0.0.1", b.local_port)
        data, host, port = await b.receive_from()
        assert (data, host, port) == (b"hello", "127.0.0.1", a.local_port)
        await a.send_to(b"nobody", "127.0.0.1", 9)  # nobody listens: lost, not an error
        async with trio.open_nursery() as nursery:
            async def closed_under_receive() -> None:
                with pytest.raises(trio.ClosedResourceError):
                    await b.receive_from()
            nursery.start_soon(closed_under_receive)
            await trio.testing.wait_all_tasks_blocked()
            b.close()
    a.close()


def test_scenario_files_configure_the_datagram_path() -> None:
    from sim.scenario import ScenarioError, loads

    text = """
[run]
duration = "10s"
quiet_period = "1s"
[checks]
liveness_within = "1s"
[network.datagrams]
latency = { min = "1ms", max = "10ms" }
loss = 0.01
duplicate = 0.02
reorder = 0.05
reorder_delay = "30ms"
"""
    config = loads(text.encode()).network.datagrams
    assert (config.latency_min_ms, config.latency_max_ms) == (1, 10)
    assert (config.loss, config.duplicate, config.reorder, config.reorder_delay_ms) == (0.01, 0.02, 0.05, 30)
    with pytest.raises(ScenarioError):
        loads(text.replace("loss = 0.01", "loss = 2").encode())
    with pytest.raises(ScenarioError):
        loads(text.replace("loss = 0.01", "lost = 0.01").encode())
