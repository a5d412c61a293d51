"""At a fixed rate the load generator's connections take turns: the server sees requests
spaced at the total rate, not every connection's request at once (``workers.first_due``)."""

from __future__ import annotations

import pytest

from rivven_broker.bench.workers import first_due


def test_sixteen_connections_at_3000_per_second_send_one_request_every_third_of_a_ms():
    interval = 16 / 3000  # each connection's own period
    dues = sorted(first_due(10.0, producer, 16, interval) for producer in range(16))
    gaps = [b - a for a, b in zip(dues, dues[1:])]
    assert dues[0] == 10.0 and dues[-1] < 10.0 + interval
    assert gaps == pytest.approx([1 / 3000] * 15)


def test_connections_of_several_load_processes_interleave():
    # four processes of four connections: producer numbers 0-15, one turn each
    dues = {first_due(0.0, 4 * process + n, 16, 1.0) for process in range(4) for n in range(4)}
    assert len(dues) == 16


def test_a_closed_loop_starts_every_connection_at_once():
    assert {first_due(5.0, producer, 8, 0.0) for producer in range(8)} == {5.0}
