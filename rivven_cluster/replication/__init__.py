"""Replication rules (pure): the leader's ISR and high watermark, the controller's elections."""

from rivven_cluster.replication.election import NO_LEADER, leader_after_failure, preferred_move
from rivven_cluster.replication.isr import FollowerProgress, LeaderState

__all__ = ["NO_LEADER", "leader_after_failure", "preferred_move", "FollowerProgress",
           "LeaderState"]
