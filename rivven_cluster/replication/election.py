"""Who leads a partition: the controller's election rules. Pure.

- After a failure (``leader_after_failure``): the first replica, in replica order, that is in
  the ISR and live. None live: no leader (``NO_LEADER``) — the partition stays offline until
  an ISR member returns; an out-of-sync replica is never elected (no unclean election).
- The ISR that comes with it drops the members that are not live (their fetches stopped; they
  rejoin through the new leader once caught up). An offline partition keeps its last ISR: it
  says who may lead again.
- The preferred leader (``preferred_move``) is the first replica; leadership returns to it when
  it is live and in the ISR and another replica leads.
"""

from __future__ import annotations

from typing import Collection

__all__ = ["NO_LEADER", "leader_after_failure", "preferred_move"]

NO_LEADER = -1


def leader_after_failure(replicas: tuple[int, ...], isr: tuple[int, ...],
                         live: Collection[int]) -> tuple[int, tuple[int, ...]]:
    """``(leader, isr)`` for a partition whose leader is gone (or that has none)."""
    survivors = tuple(r for r in replicas if r in isr and r in live)
    if not survivors:
        return NO_LEADER, isr
    return survivors[0], survivors


def preferred_move(replicas: tuple[int, ...], leader: int, isr: tuple[int, ...],
                   live: Collection[int]) -> int | None:
    """The preferred replica, when leadership should move back to it; else None."""
    preferred = replicas[0]
    if leader != preferred and preferred in isr and preferred in live:
        return preferred
    return None
