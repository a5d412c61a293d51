"""Which coordinator shards a broker drops and starts as leadership moves."""

from __future__ import annotations

from rivven_broker.server.coordinator_shards import ownership_changes


def test_lost_moved_and_gained_partitions() -> None:
    held = {0: 3, 1: 5, 2: 1}
    leading = {0: 3, 1: 6, 3: 2}  # 0 kept, 1 led again at a new epoch, 2 lost, 3 gained
    assert ownership_changes(held, leading) == ([1, 2], [(1, 6), (3, 2)])
    assert ownership_changes({}, {}) == ([], [])
    assert ownership_changes(held, held) == ([], [])
    assert ownership_changes(held, {}) == ([0, 1, 2], [])
