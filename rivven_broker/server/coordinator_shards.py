"""Which coordinator shards a broker keeps, drops and starts when partition leadership moves.

The group and transaction drivers each keep one shard per partition of their internal topic
(``__consumer_offsets``, ``__transaction_state``) that this broker leads, loaded at the leader
epoch it led it at. After every metadata change both ask the same question; this module
answers it once. Pure.
"""

from __future__ import annotations

from typing import Mapping

__all__ = ["ownership_changes"]


def ownership_changes(held: Mapping[int, int], leading: Mapping[int, int]
                      ) -> tuple[list[int], list[tuple[int, int]]]:
    """``(drop, start)``: the partitions whose shards go (no longer led, or led at another
    epoch: what they held must be loaded again from the replicated log), and the
    ``(partition, epoch)`` shards to start (led now and not held at that epoch), in partition
    order. ``held`` and ``leading``: partition -> leader epoch."""
    drop = sorted(p for p, epoch in held.items() if leading.get(p) != epoch)
    start = [(p, epoch) for p, epoch in sorted(leading.items()) if held.get(p) != epoch]
    return drop, start
