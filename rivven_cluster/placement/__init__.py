"""Replica placement: which brokers hold each partition, and which of them leads.

Theory of operation
-------------------
``ring.Ring`` is a rack-aware consistent-hash ring of one broker set; ``Ring.assign`` places a
topic's partitions on it with bounded loads and spreads preferred leaders. Pure: the controller
calls it with the registered brokers and stores the result in the metadata log.
"""

from rivven_cluster.placement.ring import PlacementBroker, PlacementError, Ring, assign_topic

__all__ = ["PlacementBroker", "PlacementError", "Ring", "assign_topic"]
