"""Who leads a partition: the controller's election rules. Pure.

- After a failure (``leader_after_failure``): the first replica, in replica order, that is in
  the ISR and live. None live: no leader (``NO_LEADER``) — the partition stays offline until
  an ISR member returns; an out-of-sync replica is never elected (no unclean election).
- The ISR that comes with it drops the members that are not live (their fetches stopped; they
  rejoin through the new leader once caught up), but keeps the *spared* ones: brokers the
  controller has no word on yet and gives a grace (``liveness``) — they are never chosen to
  lead, and never taken out on a silence. An offline partition keeps its last ISR: it says who
  may lead again.
- The preferred leader (``preferred_move``) is the first replica; leadership returns to it when
  it is live and in the ISR and another replica leads.
"""

from __future__ import annotations

from typing import Collection

__all__ = ["NO_LEADER", "leader_after_failure", "preferred_move"]

NO_LEADER = -1


def leader_after_failure(replicas: tuple[int, ...], isr: tuple[int, ...],
                         live: Collection[int], spared: Collection[int] = ()
                         ) -> tuple[int, tuple[int, ...]]:
    """``(leader, isr)`` for a partition whose leader is gone (or that has none)."""
    candidates = [r for r in replicas if r in isr and r in live]
    if not candidates:
        return NO_LEADER, isr
    return candidates[0], tuple(r for r in replicas if r in isr and (r in live or r in spared))


def preferred_move(replicas: tuple[int, ...], leader: int, isr: tuple[int, ...],
                   live: Collection[int]) -> int | None:
    """The preferred replica, when leadership should move back to it; else None."""
    preferred = replicas[0]
    if leader != preferred and preferred in isr and preferred in live:
        return preferred
    return None
