"""The simulator's parts on their own: clock, network, disk, env, scenario files, shrinking.

Method: trio tests on pytest-trio's ``autojump_clock`` (virtual time, no sleeps in real time)
drive ``SimNetwork`` with small echo servers and check the promised semantics one by one:
FIFO delivery with latency, flow control, partitions that stall then heal or time out and
reset, refused and timed-out dials, pauses, resets and crashes. ``SimDisk`` is checked for
crash semantics (unsynced data dropped, the view revoked), injected EIO/ENOSPC and the
test-only lying fsync. Scenario parsing is checked on good and bad files, schedule files
round-trip, and ``shrink`` is run on a fake runner whose failure needs exactly two faults.
"""

from __future__ import annotations

import errno
import random

import pytest
import trio
import trio.testing

from sim.clock import WALL_EPOCH_MS, SimClock
from sim.disk import DiskConfig, SimDisk
from sim.env import SimEnv
from sim.net import NetworkConfig, SimNetwork
from sim.scenario import Fault, ScenarioError, loads, parse_duration_ms
from sim.schedule import ScheduleFile, dump_schedule, load_schedule
from sim.shrink import shrink
from sim.trace import Trace


def _network(**config: object) -> SimNetwork:
    return SimNetwork(NetworkConfig(**config), random.Random("net"), Trace())  # type: ignore[arg-type]


async def _echo(stream: trio.abc.Stream) -> None:
    try:
        while data := await stream.receive_some():
            await stream.send_all(data)
    except trio.BrokenResourceError:
        pass


async def _start_echo(nursery: trio.Nursery, network: SimNetwork, host: str = "n1") -> int:
    return await nursery.start(network.endpoint(host).serve_tcp, _echo, host, 9092)


# --- clock -----------------------------------------------------------------------------------


async def test_clock_offset_drift_and_wall_jumps(autojump_clock: trio.testing.MockClock) -> None:
    clock = SimClock(offset_ms=500, rate=1.01)
    assert clock.monotonic_ms() == 500
    await trio.sleep(10)
    assert clock.monotonic_ms() == 500 + 10_100
    before = clock.monotonic_ms()
    clock.jump_wall_ms(-3_000)
    assert clock.monotonic_ms() == before  # a monotonic clock never steps
    assert clock.wall_ms() == WALL_EPOCH_MS - 3_000 + before
    clock.set_rate(1.0)
    await trio.sleep(1)
    assert clock.monotonic_ms() == before + 1_000
    await clock.sleep_until_ms(before + 5_000)
    assert clock.monotonic_ms() == before + 5_000


# --- network ---------------------------------------------------------------------------------


async def test_streams_are_fifo_with_latency(autojump_clock: trio.testing.MockClock) -> None:
    network = _network(latency_min_ms=1, latency_max_ms=50)
    async with trio.open_nursery() as nursery:
        await nursery.start(network.run)
        await _start_echo(nursery, network)
        client = await network.endpoint("p1").open_tcp_stream("n1", 9092)
        sent = b"".join(bytes([i]) * 10 for i in range(100))
        start = trio.current_time()
        for i in range(100):
            await client.send_all(bytes([i]) * 10)
        received = b""
        while len(received) < len(sent):
            received += await client.receive_some()
        assert received == sent  # in order despite per-chunk latencies
        assert trio.current_time() - start >= 0.002  # at least one round trip
        await client.aclose()
        nursery.cancel_scope.cancel()


async def test_flow_control_blocks_a_sender_nobody_reads(autojump_clock: trio.testing.MockClock) -> None:
    network = _network(buffer_bytes_max=1000)

    async def sink(stream: trio.abc.Stream) -> None:
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        await nursery.start(network.run)
        await nursery.start(network.endpoint("n1").serve_tcp, sink, "n1", 1)
        client = await network.endpoint("p1").open_tcp_stream("n1", 1)
        await client.send_all(b"x" * 1000)
        with trio.move_on_after(60) as scope:
            await client.send_all(b"y")
        assert scope.cancelled_caught
        nursery.cancel_scope.cancel()


async def test_partition_holds_data_until_heal(autojump_clock: trio.testing.MockClock) -> None:
    network = _network(stall_timeout_ms=10_000)
    async with trio.open_nursery() as nursery:
        await nursery.start(network.run)
        await _start_echo(nursery, network)
        client = await network.endpoint("p1").open_tcp_stream("n1", 9092)
        pairs = network.partition([["n1"], ["p1"]])
        await client.send_all(b"hello")
        with trio.move_on_after(5):
            await client.receive_some()
            pytest.fail("data crossed a partition")
        network.heal(pairs)
        assert await client.receive_some() == b"hello"
        nursery.cancel_scope.cancel()


async def test_long_partition_resets_the_connection(autojump_clock: trio.testing.MockClock) -> None:
    network = _network(stall_timeout_ms=2_000)
    async with trio.open_nursery() as nursery:
        await nursery.start(network.run)
        await _start_echo(nursery, network)
        client = await network.endpoint("p1").open_tcp_stream("n1", 9092)
        network.partition([["n1"], ["p1"]])
        await client.send_all(b"lost")
        start = trio.current_time()
        with pytest.raises(trio.BrokenResourceError):
            await client.receive_some()
        assert trio.current_time() - start == pytest.approx(2.0, abs=0.01)
        assert network.resets == 1
        nursery.cancel_scope.cancel()


async def test_dials_refused_and_timed_out(autojump_clock: trio.testing.MockClock) -> None:
    network = _network(connect_timeout_ms=1_000)
    async with trio.open_nursery() as nursery:
        await nursery.start(network.run)
        await _start_echo(nursery, network)
        p1 = network.endpoint("p1")
        with pytest.raises(ConnectionRefusedError):
            await p1.open_tcp_stream("n1", 1234)
        with pytest.raises(OSError) as unknown:
            await p1.open_tcp_stream("nowhere", 9092)
        assert unknown.value.errno == errno.EHOSTUNREACH
        network.partition([["n1"], ["p1"]])
        start = trio.current_time()
        with pytest.raises(TimeoutError):
            await p1.open_tcp_stream("n1", 9092)
        assert trio.current_time() - start == pytest.approx(1.0, abs=0.01)
        nursery.cancel_scope.cancel()


async def test_pause_holds_without_reset(autojump_clock: trio.testing.MockClock) -> None:
    network = _network(stall_timeout_ms=1_000)
    async with trio.open_nursery() as nursery:
        await nursery.start(network.run)
        await _start_echo(nursery, network)
        client = await network.endpoint("p1").open_tcp_stream("n1", 9092)
        network.pause("n1")
        await client.send_all(b"wait")
        with trio.move_on_after(30):
            await client.receive_some()
            pytest.fail("a paused endpoint answered")
        network.resume("n1")
        assert await client.receive_some() == b"wait"
        assert network.resets == 0
        nursery.cancel_scope.cancel()


async def test_reset_and_crash(autojump_clock: trio.testing.MockClock) -> None:
    network = _network()
    async with trio.open_nursery() as nursery:
        await nursery.start(network.run)
        await _start_echo(nursery, network)
        p1 = network.endpoint("p1")
        first = await p1.open_tcp_stream("n1", 9092)
        assert network.reset("p1", "n1") == 1
        with pytest.raises(trio.BrokenResourceError):
            await first.send_all(b"x")
        second = await p1.open_tcp_stream("n1", 9092)
        network.crash("n1")
        with pytest.raises(trio.BrokenResourceError):
            await second.receive_some()
        with pytest.raises(ConnectionRefusedError):
            await p1.open_tcp_stream("n1", 9092)  # its listener died with it
        network.crash("p1")
        with pytest.raises(OSError):
            await p1.open_tcp_stream("n1", 9092)  # a dead incarnation cannot dial
        nursery.cancel_scope.cancel()


async def test_close_delivers_eof_after_data(autojump_clock: trio.testing.MockClock) -> None:
    network = _network()
    received: list[bytes] = []

    async def reader(stream: trio.abc.Stream) -> None:
        while data := await stream.receive_some():
            received.append(data)
        received.append(b"<eof>")

    async with trio.open_nursery() as nursery:
        await nursery.start(network.run)
        await nursery.start(network.endpoint("n1").serve_tcp, reader, "n1", 7)
        client = await network.endpoint("p1").open_tcp_stream("n1", 7)
        await client.send_all(b"a")
        await client.send_all(b"b")
        await client.aclose()
        await trio.sleep(1)
        assert b"".join(received) == b"ab<eof>"
        nursery.cancel_scope.cancel()


# --- disk ------------------------------------------------------------------------------------


def _disk(**config: object) -> SimDisk:
    return SimDisk("n1", DiskConfig(**config), random.Random("disk"), Trace())  # type: ignore[arg-type]


async def test_disk_crash_drops_unsynced_and_revokes_the_view() -> None:
    disk = _disk(torn_write_probability=0.0)
    view = disk.view()
    view.makedirs("t-0")
    view.fsync_dir("")
    handle = view.open("t-0/log")
    view.fsync_dir("t-0")
    view.pwrite(handle, b"durable", 0)
    view.fsync(handle)
    view.pwrite(handle, b"-volatile", 7)
    disk.crash()
    with pytest.raises(OSError) as revoked:
        view.pread(handle, 100, 0)
    assert revoked.value.errno == errno.EIO
    fresh = disk.view()
    handle = fresh.open("t-0/log", create=False)
    assert fresh.pread(handle, 100, 0) == b"durable"


async def test_disk_injected_errors() -> None:
    disk = _disk()
    fired: list[int] = []
    disk.on_fsync_failure = lambda: fired.append(1)
    view = disk.view()
    handle = view.open("f")
    disk.fail_fsyncs(1)
    with pytest.raises(OSError) as eio:
        view.fsync(handle)
    assert eio.value.errno == errno.EIO and fired == [1]
    view.fsync(handle)  # only the next one failed
    disk.set_full(True)
    with pytest.raises(OSError) as full:
        view.pwrite(handle, b"x", 0)
    assert full.value.errno == errno.ENOSPC
    assert view.open("f") > 0  # reopening an existing file needs no space
    disk.clear_faults()
    view.pwrite(handle, b"x", 0)
    assert disk.errors_raised == 2


async def test_lying_fsync_loses_synced_data() -> None:
    disk = _disk(lying_fsync_probability=1.0, torn_write_probability=0.0)
    view = disk.view()
    handle = view.open("0.log")
    checkpoint = view.open("checkpoint")
    view.fsync_dir("")
    view.pwrite(handle, b"acknowledged", 0)
    view.fsync(handle)
    view.pwrite(checkpoint, b"12", 0)
    view.fsync(checkpoint)  # only segment files lie
    disk.crash()
    fresh = disk.view()
    assert fresh.pread(fresh.open("0.log"), 100, 0) == b""
    assert fresh.pread(fresh.open("checkpoint"), 100, 0) == b"12"


async def test_env_streams_and_run_sync(autojump_clock: trio.testing.MockClock) -> None:
    network = _network()
    disk = _disk(fsync_latency_min_ms=5, fsync_latency_max_ms=5)
    env = SimEnv(seed=7, identity="n1", clock=SimClock(), net=network.endpoint("n1"), disk=disk)
    again = SimEnv(seed=7, identity="n1", clock=SimClock(), net=network.endpoint("n1"), disk=disk)
    restarted = SimEnv(seed=7, identity="n1@1", clock=SimClock(), net=network.endpoint("n1"), disk=disk)
    assert env.rng("ids") is env.rng("ids")
    assert env.rng("ids").random() == again.rng("ids").random()
    assert env.rng("ids").random() != restarted.rng("ids").random()
    assert env.rng("ids").random() != env.rng("other").random()
    start = trio.current_time()
    assert await env.run_sync(lambda a, b: a + b, 2, 3) == 5
    assert trio.current_time() - start == pytest.approx(0.005)


# --- scenario files, schedules, shrinking ----------------------------------------------------

_GOOD = b"""
[run]
seed = 3
duration = "30s"
quiet_period = "10s"
[workload]
topics = [{ name = "t", partitions = 2 }]
producers = [{ count = 2, rate = 10, acks = 1 }]
consumers = [{ count = 1, partitions = [1] }]
[[faults]]
at = "2s"
kind = "partition"
groups = [["n1"], ["p1"]]
for = "1500ms"
[[faults]]
at = "1s"
kind = "crash"
node = "random"
[nemesis]
weights = { crash = 1, reset = 2 }
[checks]
liveness_within = "5s"
disabled = ["liveness"]
"""


def test_scenario_parses() -> None:
    scenario = loads(_GOOD, "good")
    assert (scenario.seed, scenario.duration_ms, scenario.quiet_period_ms) == (3, 30_000, 10_000)
    assert scenario.producers[0].acks == 1 and scenario.producers[0].count == 2
    assert scenario.consumers[0].partitions == (1,)
    assert [f.kind for f in scenario.faults] == ["crash", "partition"]  # sorted by time
    assert scenario.faults[1].params["for"] == 1_500
    assert scenario.nemesis.enabled and scenario.nemesis.weights == {"crash": 1.0, "reset": 2.0}
    assert not scenario.checked("liveness") and scenario.checked("no_lost_acked_writes")
    assert parse_duration_ms("250us", "x") == 0 and parse_duration_ms("2m", "x") == 120_000


@pytest.mark.parametrize("broken,complaint", [
    (b"[run]\nduration = '10s'\nquiet_period = '20s'", "quiet_period"),
    (b"[run]\ndurashun = '10s'", "unknown key"),
    (b"[[faults]]\nat = '1s'\nkind = 'explode'", "kind"),
    (b"[[faults]]\nat = '1s'\nkind = 'crash'", "needs 'node'"),
    (b"[[faults]]\nat = '1s'\nkind = 'crash'\nnode = 'n9'", "unknown node"),
    (b"[[faults]]\nat = '59s'\nkind = 'reset'\nnode = 'n1'", "quiet period"),
    (b"[nemesis]\nweights = { meteor = 1 }", "meteor"),
    (b"[checks]\ndisabled = ['everything']", "unknown invariant"),
    (b"[nodes]\nsync_policy = 'none'", "always"),
    (b"[workload]\nconsumers = [{ isolation = 'dirty' }]", "isolation"),
    (b"[run\n", "TOML"),
    (b"[disk]\nsync_filesystem_files = 0", "sync_filesystem_files"),
])
def test_scenario_errors_name_the_key(broken: bytes, complaint: str) -> None:
    with pytest.raises(ScenarioError, match=complaint):
        loads(broken, "bad")


def test_a_scenario_may_send_its_group_commits_through_sync_filesystem() -> None:
    from rivven_broker.protocol import limits
    assert loads(b"", "plain").disk.sync_filesystem_files_min == limits.sync_filesystem_files_min
    assert loads(b"[disk]\nsync_filesystem_files = 1", "d").disk.sync_filesystem_files_min == 1


async def test_the_sim_env_hands_the_bound_to_the_group_commit() -> None:
    env = SimEnv(seed=1, identity="n1", clock=SimClock(), net=None,  # type: ignore[arg-type]
                 disk=_disk(sync_filesystem_files_min=2))
    assert env.filesystem_sync_files_min == 2


def test_schedule_files_round_trip() -> None:
    faults = (Fault(1_000, "crash", {"node": "n1", "restart_after": 500, "tear": True}),
              Fault(2_500, "partition", {"groups": [["n1"], ["p1", "c1"]], "for": 1_000}),
              Fault(3_000, "clock", {"node": "n1", "offset": -1_500, "rate": 1.002}))
    original = ScheduleFile("s", "abc", 9, "digest", ("no_lost_acked_writes",), faults)
    assert load_schedule(dump_schedule(original).encode()) == original
    with pytest.raises(ScenarioError):
        load_schedule(b"[[faults]]\nat = 1\nkind = 'crash'\nnode = 'n1'\n")


def test_shrink_finds_the_two_faults_that_matter() -> None:
    faults = [Fault(i * 100, "reset", {"node": "n1"}) for i in range(12)]
    culprits = {300, 900}

    def run(candidate: list[Fault]) -> set[str]:
        return {"no_lost_acked_writes"} if culprits <= {f.at_ms for f in candidate} else set()

    smaller, runs = shrink(faults, "no_lost_acked_writes", run)
    assert {f.at_ms for f in smaller} == culprits
    assert runs < 40
    assert shrink(faults, "no_lost_acked_writes", lambda c: {"no_lost_acked_writes"})[0] == []
