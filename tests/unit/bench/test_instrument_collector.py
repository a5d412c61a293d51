"""instrument_collector: load generators pause Python's collector; client lines do not.

Method: the real ``gc`` module. Inside the block of an instrument kind the collector is off
and what existed before is frozen (``gc.get_freeze_count`` > 0); afterwards both are undone,
also when the block raises. A client kind, and a collector the caller had already disabled,
are left exactly as they were.
"""

from __future__ import annotations

import gc

import pytest

from rivven_broker.bench.workers import CLIENT_KINDS, instrument_collector


def test_an_instrument_runs_with_the_collector_paused_and_the_heap_frozen():
    assert gc.isenabled()
    with instrument_collector("rivven-produce"):
        assert not gc.isenabled()
        assert gc.get_freeze_count() > 0
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_the_collector_comes_back_when_the_run_fails():
    with pytest.raises(RuntimeError):
        with instrument_collector("redis-produce"):
            raise RuntimeError("the server went away")
    assert gc.isenabled() and gc.get_freeze_count() == 0


@pytest.mark.parametrize("kind", sorted(CLIENT_KINDS))
def test_a_client_line_keeps_its_collector(kind):
    with instrument_collector(kind):
        assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_collector_already_off_stays_off():
    gc.disable()
    try:
        with instrument_collector("nats-produce"):
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
