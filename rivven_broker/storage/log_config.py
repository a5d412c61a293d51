"""``LogConfig``: the settings one partition log obeys.

Theory of operation
-------------------
Topic configuration arrives as Kafka-style string pairs (``retention.ms=604800000``); the topic
layer parses and validates those (``topic_config.py``) and hands each partition log this frozen,
typed view. The partition log never parses strings and never reads broker-wide settings.
``-1`` means "no limit" for the retention settings, as in Kafka.
"""

from __future__ import annotations

import attrs

from rivven_broker.protocol import limits

__all__ = ["LogConfig"]


@attrs.frozen
class LogConfig:
    segment_bytes: int = limits.segment_bytes_default
    segment_ms: int = limits.segment_ms_default
    retention_ms: int = limits.retention_ms_default  # -1: keep forever
    retention_bytes: int = -1  # -1: no size limit
    index_interval_bytes: int = limits.index_interval_bytes
    max_message_bytes: int = limits.max_message_bytes_default
    #: Bytes of zero-filled space kept ahead of the writer in the active segment (0: none).
    preallocate_bytes: int = 0

    def __attrs_post_init__(self) -> None:
        assert self.segment_bytes >= limits.segment_bytes_min
        assert self.segment_ms > 0
        assert self.retention_ms >= -1
        assert self.retention_bytes >= -1
        assert self.index_interval_bytes > 0
        assert 0 < self.max_message_bytes <= limits.batch_bytes_max
        assert self.preallocate_bytes >= 0
