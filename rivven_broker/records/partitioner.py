"""Choosing a partition for a record: murmur2 for keys, a sticky partition for keyless records.

Theory of operation
-------------------
Keyed records always go to ``partition_for_key(key, num_partitions)`` (Kafka's murmur2 rule),
so one key keeps its order in one partition. Keyless records go to the topic's *sticky*
partition (Kafka's KIP-480): all of them land in one partition until its batch is sent (full or
lingered out), and only then does the producer call ``on_new_batch``, which moves the topic to a
different, randomly chosen partition. Batches stay large and few while load still spreads
evenly over time.

``on_new_batch(topic, n, previous)`` only moves the sticky partition when it is still
``previous``: if several batches of a topic complete together, the first call moves it and the
others see it already moved and leave it. With one partition the answer is always 0. When the
caller passes ``available`` (partitions that have a leader right now), keyless records pick
among those; keyed records never depend on availability, as in Kafka.

Pure: randomness comes from the injected ``random.Random``; no clocks, no I/O, no threads (the
caller serialises access).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from rivven_broker.records.murmur2 import partition_for_key

if TYPE_CHECKING:  # the generator is injected; this module never draws from the global one
    import random

__all__ = ["StickyPartitioner"]


class StickyPartitioner:
    """Kafka's default partitioning: murmur2 for keys, sticky per topic for keyless records.

    Not thread-safe; never blocks.
    """

    __slots__ = ("_rng", "_sticky")

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._sticky: dict[str, int] = {}

    def partition(
        self,
        topic: str,
        num_partitions: int,
        key: bytes | None = None,
        *,
        available: Sequence[int] | None = None,
    ) -> int:
        """The partition for a record of ``topic``: in ``[0, num_partitions)``."""
        assert num_partitions > 0
        if key is not None:
            return partition_for_key(key, num_partitions)
        sticky = self._sticky.get(topic)
        if sticky is None or sticky >= num_partitions:
            sticky = self._choose(topic, num_partitions, None, available)
        return sticky

    def on_new_batch(
        self,
        topic: str,
        num_partitions: int,
        previous_partition: int,
        *,
        available: Sequence[int] | None = None,
    ) -> int:
        """A batch for ``previous_partition`` was closed: move the topic's sticky partition.

        Moves it only if it is still ``previous_partition`` (or unset or out of range), to a
        different partition when there is one. Returns the topic's sticky partition.
        """
        assert num_partitions > 0
        sticky = self._sticky.get(topic)
        if sticky is None or sticky == previous_partition or sticky >= num_partitions:
            sticky = self._choose(topic, num_partitions, sticky, available)
        return sticky

    def sticky_partition(self, topic: str) -> int | None:
        """The topic's current sticky partition, or ``None`` before its first keyless record."""
        return self._sticky.get(topic)

    def forget(self, topic: str) -> None:
        """Drop the topic's sticky partition (for example after the topic was deleted)."""
        self._sticky.pop(topic, None)

    def _choose(
        self,
        topic: str,
        num_partitions: int,
        current: int | None,
        available: Sequence[int] | None,
    ) -> int:
        """Pick a new sticky partition for ``topic``, other than ``current`` when possible."""
        candidates: Sequence[int]
        if available:
            candidates = [p for p in available if 0 <= p < num_partitions]
        else:
            candidates = range(num_partitions)
        if not candidates:
            candidates = range(num_partitions)
        if len(candidates) > 1 and current is not None and current in candidates:
            if isinstance(candidates, range):  # skip over current without building a list
                choice = self._rng.randrange(num_partitions - 1)
                choice += choice >= current
            else:
                others = [p for p in candidates if p != current]
                choice = others[self._rng.randrange(len(others))]
        else:
            choice = candidates[self._rng.randrange(len(candidates))]
        assert 0 <= choice < num_partitions
        self._sticky[topic] = choice
        return choice
