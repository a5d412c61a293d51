"""What a leader's answer to a replica fetch names: partitions with news only.

``ReplicaManager._read_for`` reads every partition a follower asks for (each read records
the follower's position) and leaves a quiet one out while its high watermark and log start
are what the same link last told. The per-partition read is replaced here by a table, so
these tests judge only the choice of what is said and when it counts as said.
"""

from __future__ import annotations

from types import SimpleNamespace

import trio
import trio.testing

from rivven_broker.server.cluster.replica_manager import ReplicaConfig, ReplicaManager
from rivven_cluster.replication.messages import (
    FetchedPartition,
    PartitionFetch,
    ReplicaFetch,
)

KEYS = [("t", 0), ("t", 1), ("u", 0)]


class _Leader:
    """A ReplicaManager whose per-partition read answers from ``state``."""

    def __init__(self) -> None:
        manager = object.__new__(ReplicaManager)
        manager.config = ReplicaConfig()
        manager._env = SimpleNamespace(clock=SimpleNamespace(monotonic_ms=lambda: 0))
        manager._read_partition = self._read_partition  # type: ignore[method-assign]
        self.manager = manager
        #: key -> (high watermark, log start, records, error code)
        self.state = {key: (10, 0, b"", 0) for key in KEYS}

    def _read_partition(self, follower, part, budget, now_ms) -> FetchedPartition:
        hw, start, records, code = self.state[(part.topic, part.partition)]
        return FetchedPartition(part.topic, part.partition, code, hw, start, records=records)

    def read(self, told: dict, *, last: bool = False) -> tuple[list, bool]:
        request = ReplicaFetch(2, 500, 1 << 20, tuple(
            PartitionFetch(topic, partition, 1, 10, 1, 10) for topic, partition in KEYS))
        answer, has_data = self.manager._read_for(2, request, told, last=last)
        return [(p.topic, p.partition) for p in answer.partitions], has_data


def test_quiet_partitions_are_said_once_then_left_out() -> None:
    leader, told = _Leader(), {}
    assert leader.read(told, last=True) == (KEYS, False)  # first answer on a link: all of them
    assert leader.read(told, last=True) == ([], False)  # nothing new: nothing named
    leader.state[("t", 1)] = (12, 0, b"", 0)  # the high watermark moved
    leader.state[("u", 0)] = (10, 0, b"batch", 0)  # records
    assert leader.read(told) == ([("t", 1), ("u", 0)], True)
    leader.state[("u", 0)] = (10, 0, b"", 0)
    assert leader.read(told, last=True) == ([("u", 0)], False)  # said after its records
    leader.state[("t", 0)] = (10, 4, b"", 0)  # the log start moved
    assert leader.read(told, last=True) == ([("t", 0)], False)


def test_errors_are_always_said() -> None:
    leader, told = _Leader(), {}
    leader.read(told, last=True)
    leader.state[("t", 0)] = (10, 0, b"", 6)  # NOT_LEADER
    assert leader.read(told) == ([("t", 0)], True)
    assert leader.read(told) == ([("t", 0)], True)
    leader.state[("t", 0)] = (10, 0, b"", 0)  # leading again: said again, though unchanged
    assert leader.read(told, last=True) == ([("t", 0)], False)


def test_a_read_of_a_long_poll_that_is_not_sent_says_nothing() -> None:
    leader, told = _Leader(), {}
    leader.read(told, last=True)
    leader.state[("t", 1)] = (12, 0, b"", 0)
    assert leader.read(told) == ([("t", 1)], False)  # no news: the poll waits, not sent
    assert leader.read(told, last=True) == ([("t", 1)], False)  # so the sent one says it


def test_a_long_poll_that_times_out_tells_the_new_high_watermark() -> None:
    leader, told = _Leader(), {}
    leader.read(told, last=True)
    leader.state[("t", 1)] = (12, 0, b"", 0)
    leader.manager._context = SimpleNamespace(appends=SimpleNamespace(
        register=lambda event, keys: None, unregister=lambda event, keys: None))
    request = ReplicaFetch(2, 500, 1 << 20, tuple(
        PartitionFetch(topic, partition, 1, 10, 1, 10) for topic, partition in KEYS))

    async def main() -> list:
        answer = await leader.manager._answer(2, request, told)
        return [(p.topic, p.partition, p.high_watermark) for p in answer.partitions]

    assert trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0)) == \
        [("t", 1, 12)]
    assert told[("t", 1)] == (12, 0)
