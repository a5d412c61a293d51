"""``Control``: what the handlers ask of whoever decides topics.

Two implementations: ``local_control.LocalControl`` (a broker alone: its topic registry is the
commit point) and ``cluster.cluster_control.ClusterControl`` (``--peers``: the controller's
Raft log decides; the local registry is a cache of it). ``ServerContext.control`` holds the
broker's one. Each method answers a response now or a ``Pending``; ``auto_create`` answers
None when the topic exists afterwards, else why not (a retriable LEADER_NOT_AVAILABLE while a
cluster creates it). ``leadership_error`` says why this broker may not append to a partition
(None: it leads it); the produce path asks it only on a clustered broker.
"""

from __future__ import annotations

from typing import Protocol

from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.messages import (
    AlterTopicConfig,
    AlterTopicConfigResponse,
    CreatePartitions,
    CreatePartitionsResponse,
    CreateTopic,
    CreateTopicResponse,
    DeleteTopic,
    DeleteTopicResponse,
    Metadata,
    MetadataResponse,
)
from rivven_broker.server.context import Pending

__all__ = ["Control"]


class Control(Protocol):
    def metadata(self, request: Metadata, now_ms: int) -> MetadataResponse: ...
    def auto_create(self, name: str, now_ms: int) -> tuple[ErrorCode, str] | None: ...
    def create_topic(self, request: CreateTopic,
                     now_ms: int) -> CreateTopicResponse | Pending: ...
    def delete_topic(self, request: DeleteTopic,
                     now_ms: int) -> DeleteTopicResponse | Pending: ...
    def alter_topic_config(self, request: AlterTopicConfig,
                           now_ms: int) -> AlterTopicConfigResponse | Pending: ...
    def create_partitions(self, request: CreatePartitions,
                          now_ms: int) -> CreatePartitionsResponse | Pending: ...
