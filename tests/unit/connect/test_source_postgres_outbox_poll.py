"""``postgres-outbox-poll`` over a fake table: a lost connection is retried with the shared
backoff until the outage's budget is spent; other failures are not retried. (The real thing,
with Postgres' backends terminated and Postgres restarted: tests/integration/connect/pg/
test_postgres_outbox_poll.py.)"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from rivven_connect.pg.outbox_poll import OutboxTableShape
from rivven_connect.pg.outbox_table import OutboxConnectionError, OutboxTableError
from rivven_connect.sources import SourceError
from rivven_connect.sources.postgres_outbox_poll import PostgresOutboxPollSource

SHAPE = OutboxTableShape("public", "outbox", (("id", 20), ("payload", 25)), "id")


class FakeTable:
    """Fails the next ``failures`` calls of ``poll``/``finish`` with ``error``."""

    table = ("public", "outbox")

    def __init__(self, failures: int = 0, error: Exception | None = None) -> None:
        self.shape: OutboxTableShape | None = None
        self.failures = failures
        self.error = error or OutboxConnectionError("server closed the connection")
        self.calls: list[tuple[str, float]] = []
        self.finished: list[tuple[str, ...]] = []

    def describe(self) -> OutboxTableShape:
        self.shape = SHAPE
        return SHAPE

    def _maybe_fail(self, what: str) -> None:
        self.calls.append((what, trio.from_thread.run_sync(trio.current_time)))  # a worker
        if self.failures:
            self.failures -= 1
            raise self.error

    def poll(self, limit, exclude_ids):
        self._maybe_fail("poll")
        return [("1", "a"), ("2", "b")][:limit]

    def finish(self, ids):
        self._maybe_fail("finish")
        self.finished.append(tuple(ids))
        return len(ids)

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


def _run(source, call):
    async def main():
        # trio.to_thread in a MockClock run: the clock jumps only while every task waits.
        return await call(source)
    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def _source(table, **options) -> PostgresOutboxPollSource:
    return PostgresOutboxPollSource(table, jitter=lambda: 0.0, **options)  # type: ignore[arg-type]


def test_a_lost_connection_is_retried_with_backoff_and_the_poll_answers():
    table = FakeTable(failures=3)
    source = _source(table)
    records = _run(source, lambda s: s.poll(10))
    assert [r.key for r in records] == [1, 2]
    times = [at for _what, at in table.calls]
    gaps = [round(b - a, 3) for a, b in zip(times, times[1:])]
    assert gaps == [0.05, 0.1, 0.2]  # the shared backoff, its jitter half at 0
    assert (source.reconnects, source.reconnect_failures) == (1, 2)
    assert {m.name: m.value for m in source.metrics()} == {
        "outbox_poll_reconnects": 1, "outbox_poll_reconnect_failures": 2}


def test_a_side_effect_is_retried_the_same_way():
    table = FakeTable()
    source = _source(table)
    records = _run(source, lambda s: s.poll(10))
    table.failures = 2
    _run(source, lambda s: s.side_effect(records[-1].position))
    assert table.finished == [("1", "2")] and source.deleted_rows == 2
    assert source.reconnects == 1


def test_an_outage_past_the_attempts_stops_the_poll():
    table = FakeTable(failures=100)
    source = _source(table, reconnect_attempts_max=4)
    with pytest.raises(SourceError, match="could not be re-established: 4 attempt"):
        _run(source, lambda s: s.poll(10))
    assert len(table.calls) == 5  # the first call and four attempts


def test_an_outage_past_the_timeout_stops_the_poll():
    table = FakeTable(failures=100)
    source = _source(table, reconnect_attempts_max=1000, reconnect_timeout_ms=2000)
    with pytest.raises(SourceError, match="in 2.0 s"):
        _run(source, lambda s: s.poll(10))
    assert table.calls[-1][1] == pytest.approx(2.0)  # the last attempt at the deadline


def test_zero_attempts_never_reconnect():
    table = FakeTable(failures=1)
    source = _source(table, reconnect_attempts_max=0)
    with pytest.raises(SourceError, match="0 attempt"):
        _run(source, lambda s: s.poll(10))


def test_other_failures_are_not_retried():
    table = FakeTable(failures=1, error=OutboxTableError("relation does not exist"))
    source = _source(table)
    with pytest.raises(SourceError, match="relation does not exist"):
        _run(source, lambda s: s.poll(10))
    assert len(table.calls) == 1 and source.reconnect_failures == 0


def test_the_reconnect_options_are_checked():
    from rivven_connect.core.config import ConnectConfigError

    base = {"host": "h", "database": "d", "user": "u"}
    source = PostgresOutboxPollSource.from_config(
        {**base, "reconnect_attempts_max": 3, "reconnect_timeout_ms": 5000}, "s.config")
    assert (source.reconnect_attempts_max, source.reconnect_timeout_ms) == (3, 5000)
    with pytest.raises(ConnectConfigError, match="reconnect_timeout_ms"):
        PostgresOutboxPollSource.from_config({**base, "reconnect_timeout_ms": 10}, "s.config")
