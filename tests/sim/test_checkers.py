"""The checkers on hand-written histories: each invariant passes a clean history and names
the exact breach in a bad one.

Method: build small ``History`` objects and final reads by hand (one consistent baseline,
then one deliberate defect per test: a lost acknowledged write, a value at two offsets, a
skipped offset, a duplicate, a rejected write that appears, a read of data that did not
survive, an aborted transaction seen by a read_committed reader, a group offset past the log
end, a stalled producer) and check that ``check`` reports precisely that invariant. Fast and
pure; no simulation runs here (the end-to-end proof is ``test_checkers_bite.py``).
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from sim.checkers import RunFacts, Violation, check
from sim.history import FAIL, OK, History
from sim.scenario import loads
from sim.trace import Trace
from sim.workload import PartitionLog

SCENARIO = loads(b"""
[run]
duration = "30s"
quiet_period = "10s"
[workload]
topics = [{ name = "t", partitions = 1 }]
producers = [{ count = 1 }]
consumers = [{ count = 1 }]
[checks]
liveness_within = "5s"
""", "unit")


def _send(history: History, values: list[str], outcome: str, result: dict[str, Any], *,
          process: str = "p1", extra: dict[str, Any] | None = None) -> None:
    invoke = history.invoke(process, "send", {"topic": "t", "partition": 0, "values": values,
                                              "acks": -1, "session": 1, **(extra or {})})
    history.complete(invoke, outcome, result)


def _poll(history: History, start: int, records: list[list[Any]], *, control: list[int] = (),
          end: int | None = None, isolation: str = "read_uncommitted") -> None:
    history.record("c1", "poll", {
        "topic": "t", "partition": 0, "from": start,
        "to": end if end is not None else start + len(records) + len(control),
        "records": records, "control": list(control), "isolation": isolation,
    })


def _final(records: dict[int, str], control: set[int] = frozenset()) -> dict[tuple[str, int], PartitionLog]:
    end = max([*records, *control], default=-1) + 1
    return {("t", 0): PartitionLog("t", 0, 0, end, dict(records), set(control))}


def _facts(final: Any, *, heal_ms: float = 0.0, online: tuple[Violation, ...] = ()) -> RunFacts:
    return RunFacts(final, ("p1",), ("c1",), heal_ms, 30_000, online)


def _broken(history: History, final: Any, **kwargs: Any) -> set[str]:
    return {v.invariant for v in check(SCENARIO, history, _facts(final, **kwargs))}


async def _baseline() -> History:
    history = History(Trace())
    _send(history, ["p1-1", "p1-2"], OK, {"offset": 0})
    await trio.sleep(1)
    _send(history, ["p1-3"], OK, {"offset": 2})
    _poll(history, 0, [[0, "p1-1"], [1, "p1-2"], [2, "p1-3"]])
    return history


BASE_LOG = {0: "p1-1", 1: "p1-2", 2: "p1-3"}


async def test_a_clean_history_passes(autojump_clock: trio.testing.MockClock) -> None:
    assert _broken(await _baseline(), _final(BASE_LOG)) == set()


async def test_lost_acknowledged_write(autojump_clock: trio.testing.MockClock) -> None:
    history = await _baseline()
    violations = check(SCENARIO, history, _facts(_final({0: "p1-1", 1: "p1-2"})))
    names = {v.invariant for v in violations}
    assert "no_lost_acked_writes" in names and "reads_durable" in names
    lost = next(v for v in violations if v.invariant == "no_lost_acked_writes")
    assert "'p1-3'" in lost.message and "t/0@2" in lost.message
    assert lost.entries == (2, 3)  # the invocation and its ok


async def test_one_value_per_offset(autojump_clock: trio.testing.MockClock) -> None:
    history = await _baseline()
    _send(history, ["p1-4"], OK, {"offset": 2})  # a second ack at an occupied offset
    assert "offset_agreement" in _broken(history, _final({**BASE_LOG, 3: "p1-4"}))


async def test_values_nobody_sent(autojump_clock: trio.testing.MockClock) -> None:
    history = await _baseline()
    assert _broken(history, _final({**BASE_LOG, 3: "garbage"})) == {"offset_agreement"}


async def test_poll_that_skips_an_offset(autojump_clock: trio.testing.MockClock) -> None:
    history = await _baseline()
    _send(history, ["p1-4", "p1-5"], OK, {"offset": 3})
    _poll(history, 3, [[4, "p1-5"]], end=5)
    final = _final({**BASE_LOG, 3: "p1-4", 4: "p1-5"})
    assert _broken(history, final) == {"monotonic_gapless"}


async def test_control_records_fill_gaps(autojump_clock: trio.testing.MockClock) -> None:
    history = await _baseline()
    _send(history, ["p1-4"], OK, {"offset": 4})
    _poll(history, 3, [[4, "p1-4"]], control=[3])
    assert _broken(history, _final({**BASE_LOG, 4: "p1-4"}, control={3})) == set()


async def test_final_read_holes_and_nonmonotonic_acks(autojump_clock: trio.testing.MockClock) -> None:
    history = await _baseline()
    final = _final(BASE_LOG)
    final[("t", 0)].holes.append((0, 4, [3]))
    assert "monotonic_gapless" in _broken(history, final)
    history = History(Trace())
    _send(history, ["p1-1"], OK, {"offset": 1})
    _send(history, ["p1-2"], OK, {"offset": 0})  # same connection, later send, lower offset
    assert "monotonic_gapless" in _broken(history, _final({0: "p1-2", 1: "p1-1"}))


async def test_duplicates(autojump_clock: trio.testing.MockClock) -> None:
    history = await _baseline()
    assert _broken(history, _final({**BASE_LOG, 3: "p1-3"})) == {"no_duplicates"}


async def test_rejected_write_never_visible(autojump_clock: trio.testing.MockClock) -> None:
    history = await _baseline()
    _send(history, ["p1-4"], FAIL, {"error": "CORRUPT_MESSAGE"})
    assert _broken(history, _final(BASE_LOG)) == set()
    assert _broken(history, _final({**BASE_LOG, 3: "p1-4"})) == {"no_failed_write_visible"}


async def test_uncertain_writes_may_or_may_not_appear(autojump_clock: trio.testing.MockClock) -> None:
    history = await _baseline()
    _send(history, ["p1-4"], "info", {"error": "RequestTimeout"})
    assert _broken(history, _final(BASE_LOG)) == set()
    assert _broken(history, _final({**BASE_LOG, 3: "p1-4"})) == set()


async def test_transactions_hook(autojump_clock: trio.testing.MockClock) -> None:
    history = await _baseline()
    txn = {"transactional_id": "tx"}
    _send(history, ["p1-4"], OK, {"offset": 3}, extra=txn)
    abort = history.invoke("p1", "abort", txn)
    history.complete(abort, OK)
    _poll(history, 3, [[3, "p1-4"]], isolation="read_committed")
    assert _broken(history, _final({**BASE_LOG, 3: "p1-4"})) == {"transactions_atomic"}


async def test_group_offsets_hook(autojump_clock: trio.testing.MockClock) -> None:
    history = await _baseline()
    commit = history.invoke("c1", "commit_offsets", {"group": "g"})
    history.complete(commit, OK, {"group": "g", "offsets": {"t/0": 9}})
    assert _broken(history, _final(BASE_LOG)) == {"group_offsets_within_log"}


async def test_liveness_after_the_last_heal(autojump_clock: trio.testing.MockClock) -> None:
    history = await _baseline()  # all progress happened before 1.1 s
    assert _broken(history, _final(BASE_LOG), heal_ms=500) == set()
    assert _broken(history, _final(BASE_LOG), heal_ms=20_000) == {"liveness"}


async def test_online_violations_pass_through(autojump_clock: trio.testing.MockClock) -> None:
    history = await _baseline()
    online = tuple(Violation("node_stops_after_fsync_failure", f"n1 #{i}") for i in range(9))
    found = check(SCENARIO, history, _facts(_final(BASE_LOG), online=online))
    assert {v.invariant for v in found} == {"node_stops_after_fsync_failure"}
    assert len(found) == 6  # five examples and a count of the rest


async def test_two_members_reading_one_partition_in_one_generation(
        autojump_clock: trio.testing.MockClock) -> None:
    from sim.checkers import _once_per_generation
    history = History(Trace())
    for process, generation in (("c1", 3), ("c1", 4), ("c2", 4), ("c2", 5)):
        history.record(process, "poll", {"topic": "t", "partition": 0, "from": 0, "to": 1,
                                         "records": [[0, "a"]], "control": [], "group": "g",
                                         "generation": generation})
    found = _once_per_generation(history)
    assert [v.invariant for v in found] == ["group_once_per_generation"]
    assert "generation 4" in found[0].message
