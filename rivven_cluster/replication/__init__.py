"""Replication rules (pure): the leader's ISR and high watermark, the controller's elections
and what it may treat as a failed broker."""

from rivven_cluster.replication.election import NO_LEADER, leader_after_failure, preferred_move
from rivven_cluster.replication.isr import FollowerProgress, LeaderState
from rivven_cluster.replication.liveness import (
    ControllerLiveness,
    Judgement,
    Liveness,
    Registration,
    Sighting,
    judge,
)

__all__ = ["NO_LEADER", "leader_after_failure", "preferred_move", "FollowerProgress",
           "LeaderState", "ControllerLiveness", "Judgement", "Liveness", "Registration",
           "Sighting", "judge"]
