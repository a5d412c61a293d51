"""The broker's own topics: which names they are, and how ``__consumer_offsets`` is configured.

Theory of operation
-------------------
``__consumer_offsets`` (the group coordinators' log) and ``__transaction_state`` (the
transaction coordinators') are ordinary partitioned topics to storage and replication, but
clients may not produce to them, and listings hide them. The data path, the handlers, the
controller side and the replica manager each ask ``is_internal_topic``; the group driver and
the controller create ``__consumer_offsets`` with ``offsets_topic_config()``. This module is
the one place those names live, so none of those modules imports another's driver for them.
Pure: constants and functions only.
"""

from __future__ import annotations

from rivven_broker.coordinator.offsets_codec import OFFSETS_TOPIC
from rivven_broker.coordinator.txn_log_codec import TRANSACTION_STATE_TOPIC
from rivven_broker.protocol import limits

__all__ = ["INTERNAL_TOPICS", "is_internal_topic", "offsets_topic_config"]

INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC})
_OFFSETS_SEGMENT_BYTES = 100 * 1024 * 1024


def is_internal_topic(name: str) -> bool:
    """True for the broker's own topics (hidden from listings, refused to producers)."""
    return name in INTERNAL_TOPICS


def offsets_topic_config() -> dict[str, str]:
    """The topic configs ``__consumer_offsets`` is created with."""
    return {
        "cleanup.policy": "compact",
        "segment.bytes": str(_OFFSETS_SEGMENT_BYTES),
        "max.message.bytes": str(limits.batch_bytes_max),
    }
