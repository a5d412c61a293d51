"""``LeaderState``: the high watermark and the ISR of one partition, as its leader sees them.

Theory of operation
-------------------
The leader of a partition learns two offsets from each follower's fetch: its *fetch offset*
(everything below it is in the follower's log) and its *durable offset* (everything below it
survived an fsync there, under the follower's own sync policy). Its own durable offset comes
from its group commit. From these:

- the **high watermark** is the smallest durable offset over the ISR, the leader included,
  and never moves back: an offset below it is on disk on every ISR member, so ``acks=all``
  waits for it to pass a batch, and consumers read below it only. While an ISR change is
  being committed, the members it adds count too (Kafka's "maximal ISR"): more members only
  make the minimum smaller, so the rule stays safe while the controller decides;
- a follower is **caught up** at a fetch whose offset reaches the leader's log end offset, or
  the log end offset the leader had at the follower's previous fetch (then it was caught up
  at that previous fetch); an ISR member not caught up for longer than ``lag_max_ms`` leaves
  the ISR (``isr_change`` proposes the smaller set);
- a replica outside the ISR rejoins after a recent fetch (within half the lag bound) whose
  offset reached the high watermark and the start of the leader's epoch (it has truncated
  against this leader and holds every committed record) and whose durable offset reached the
  high watermark of its previous fetch (everything committed then is on its disk; the rest
  follows at its next fsync). Under steady load its durable offset never catches the moving
  high watermark itself, so waiting for that would keep it out for good. Its fetch offset
  is judged against the high watermark when the change is *proposed*, not at the fetch: a
  record committed since without it would be missing from an ISR member the controller may
  elect.

A replica taken out of the ISR (by this leader, or by the controller because it is not live)
must fetch again before it can rejoin. ISR changes are proposals: the driver commits them through the controller (``UpdateIsr``,
compare-and-set on the partition epoch) and calls ``isr_committed`` with what the metadata
then says; one change is in flight at a time. Pure: no clock, no I/O; ``now_ms`` is passed in.
"""

from __future__ import annotations

import attrs

__all__ = ["FollowerProgress", "LeaderState"]


@attrs.define
class FollowerProgress:
    fetch_offset: int = 0
    durable_offset: int = 0
    caught_up_ms: int = 0
    #: The leader's log end offset and the time of the follower's previous fetch.
    previous_leader_end: int = -1
    previous_fetch_ms: int = 0
    #: The high watermark when the follower last fetched.
    previous_high_watermark: int = 0
    #: At its last fetch, the follower could rejoin the ISR if it holds the high watermark
    #: when proposed (see ``LeaderState``).
    eligible: bool = False


class LeaderState:
    """What the leader of one partition in ``leader_epoch`` tracks (module docstring)."""

    def __init__(self, *, leader_id: int, leader_epoch: int, replicas: tuple[int, ...],
                 isr: tuple[int, ...], partition_epoch: int, epoch_start_offset: int,
                 high_watermark: int, now_ms: int, lag_max_ms: int) -> None:
        assert leader_id in isr, (leader_id, isr)
        self.leader_id = leader_id
        self.leader_epoch = leader_epoch
        self.replicas = replicas
        self.isr = isr
        self.partition_epoch = partition_epoch
        self.epoch_start_offset = epoch_start_offset
        self.high_watermark = high_watermark
        self.lag_max_ms = lag_max_ms
        self.local_durable = high_watermark
        #: The ISR proposed to the controller and not yet seen committed, if any.
        self.pending_isr: tuple[int, ...] | None = None
        self.followers = {r: FollowerProgress(caught_up_ms=now_ms)
                          for r in replicas if r != leader_id}

    # -- what moves it -----------------------------------------------------------------------

    def on_local_durable(self, durable_offset: int) -> bool:
        """The leader's own durable offset; returns whether the high watermark moved."""
        self.local_durable = max(self.local_durable, durable_offset)
        return self._advance()

    def on_fetch(self, follower: int, fetch_offset: int, durable_offset: int,
                 leader_end: int, now_ms: int) -> bool:
        """A fetch of ``follower`` (offsets below the leader's ``leader_end`` only); returns
        whether the high watermark moved."""
        progress = self.followers[follower]
        assert durable_offset <= fetch_offset <= leader_end, (durable_offset, fetch_offset,
                                                              leader_end)
        if fetch_offset >= leader_end:
            progress.caught_up_ms = now_ms
        elif fetch_offset >= progress.previous_leader_end >= 0:
            progress.caught_up_ms = max(progress.caught_up_ms, progress.previous_fetch_ms)
        progress.eligible = (fetch_offset >= self.epoch_start_offset
                             and durable_offset >= progress.previous_high_watermark)
        progress.previous_leader_end, progress.previous_fetch_ms = leader_end, now_ms
        progress.previous_high_watermark = self.high_watermark
        progress.fetch_offset = fetch_offset
        progress.durable_offset = durable_offset
        return self._advance()

    def _counted(self) -> set[int]:
        return set(self.isr) | set(self.pending_isr or ())

    def _advance(self) -> bool:
        durable = [self.local_durable]
        for member in self._counted():
            if member != self.leader_id:
                durable.append(self.followers[member].durable_offset)
        candidate = min(durable)
        if candidate > self.high_watermark:
            self.high_watermark = candidate
            return True
        return False

    # -- the ISR -----------------------------------------------------------------------------

    def isr_change(self, now_ms: int) -> tuple[int, ...] | None:
        """The ISR to propose now (laggards out, caught-up replicas in), or None."""
        if self.pending_isr is not None:
            return None
        members = set(self.isr)
        for replica, progress in self.followers.items():
            if replica in members:
                if now_ms - progress.caught_up_ms > self.lag_max_ms:
                    members.discard(replica)
            elif (progress.eligible and progress.fetch_offset >= self.high_watermark
                  and now_ms - progress.previous_fetch_ms <= self.lag_max_ms // 2):
                members.add(replica)  # (it holds every record committed now)
        if members == set(self.isr):
            return None
        proposed = tuple(r for r in self.replicas if r in members)
        self.pending_isr = proposed
        return proposed

    def isr_committed(self, isr: tuple[int, ...], partition_epoch: int) -> bool:
        """The metadata's ISR (after a proposal, or any other change); returns whether the
        high watermark moved."""
        self.isr, self.partition_epoch = isr, partition_epoch
        self.pending_isr = None
        for replica, progress in self.followers.items():
            if replica not in isr:  # only a fetch after its removal brings it back
                progress.eligible = False
        return self._advance()

    def isr_refused(self) -> None:
        """The proposal did not commit: propose again later."""
        self.pending_isr = None

    def lagging(self) -> list[int]:
        """ISR members whose durable offset is below the leader's (a metric)."""
        return [r for r in self.isr
                if r != self.leader_id and self.followers[r].durable_offset < self.local_durable]
