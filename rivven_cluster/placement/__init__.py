"""Replica placement: which brokers hold each partition, and which of them leads.

Theory of operation
-------------------
``ring.Ring`` is a rack-aware consistent-hash ring of one broker set (``Ring.preference``: a
partition's walk; ``Ring.replicas``: its replicas, racks first); ``assign_topic`` places a
topic's partitions on it with bounded loads and bounded leaderships. Pure: the controller calls
it with the live registered brokers and commits the result to the metadata log.
"""

from rivven_cluster.placement.ring import (
    VNODES,
    PlacementBroker,
    PlacementError,
    Ring,
    assign_topic,
)

__all__ = ["VNODES", "PlacementBroker", "PlacementError", "Ring", "assign_topic"]
