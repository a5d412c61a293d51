"""The blocking ``Admin``: topics, offsets, record deletion and cluster status.

Theory of operation
-------------------
Each method builds one or two requests with ``requests.py``, sends them through a
``SyncClient`` (any broker for topic administration, the partition leader for offsets and
record deletion) and turns the answers into the plain result types of ``types.py`` or a typed
``BrokerError``. Every method blocks until the answer (bounded by ``request_timeout_ms``, with
retries of retriable failures inside it). Group administration raises
``FeatureNotAvailableError`` until consumer groups exist.
"""

from __future__ import annotations

from typing import Any, Mapping

from rivven_broker.client._sync import SyncClient
from rivven_broker.client.config import ConnectionConfig, build_configs
from rivven_broker.client.errors import FeatureNotAvailableError
from rivven_broker.client.requests import (
    check_response,
    cluster_status,
    delete_records_request,
    delete_records_results,
    list_offsets_request,
    list_offsets_results,
    raise_for,
    topic_description,
    topic_listings,
)
from rivven_broker.client.types import (
    ClusterStatus,
    PartitionOffset,
    TopicDescription,
    TopicListing,
    TopicPartition,
)
from rivven_broker.protocol import messages as m

__all__ = ["Admin", "GROUPS_PENDING"]

GROUPS_PENDING = "consumer groups arrive with the consumer-groups milestone"


class Admin:
    """Administers a Rivven cluster. Thread-safe; every method blocks on the network.

    ``Admin(bootstrap, client_id=..., request_timeout_ms=30000, connect_attempts_max=3, ...)``.
    Construction does not touch the network.
    """

    def __init__(
        self, bootstrap: str = "127.0.0.1:9092", *, connect_attempts_max: int = 3, **options: Any
    ) -> None:
        (config,) = build_configs(options, ConnectionConfig)
        self._client = SyncClient(bootstrap, config, connect_attempts_max=connect_attempts_max)

    # --- topics --------------------------------------------------------------------------------
    def create_topic(
        self,
        name: str,
        partitions: int = 3,
        replication_factor: int = 1,
        config: Mapping[str, str] | None = None,
        *,
        validate_only: bool = False,
    ) -> None:
        """Create a topic.

        Raises:
            TopicAlreadyExistsError, InvalidTopicNameError, InvalidPartitionsError,
            InvalidReplicationFactorError, InvalidConfigError: as the broker answers.
            ConnectionFailedError / ClientTimeoutError: no broker answered.
        """
        request = m.CreateTopic(
            name=name,
            partitions=partitions,
            replication_factor=replication_factor,
            configs=dict(config or {}),
            validate_only=validate_only,
        )
        response = check_response(self._client.call(request), m.CreateTopicResponse)
        raise_for(response.error_code, response.error_message, f"create topic {name!r}")

    def list_topics(self, *, include_internal: bool = False) -> list[TopicListing]:
        """Every topic, sorted by name."""
        return topic_listings(self._client.call(m.ListTopics(include_internal=include_internal)))

    def describe_topic(self, name: str) -> TopicDescription:
        """Partitions, replication factor, configs and partition leaders of a topic.

        Raises:
            UnknownTopicOrPartitionError: no such topic. (And the connection errors.)
        """
        describe = self._client.call(m.DescribeTopic(name=name))
        metadata = self._client.call(m.Metadata(topics=(name,), allow_auto_topic_creation=False))
        return topic_description(describe, metadata)

    def alter_topic_config(self, name: str, config: Mapping[str, str | None]) -> None:
        """Set topic configs; a value of None resets that key to its default.

        Raises:
            UnknownTopicOrPartitionError, InvalidConfigError: as the broker answers.
        """
        request = m.AlterTopicConfig(name=name, configs=dict(config))
        response = check_response(self._client.call(request), m.AlterTopicConfigResponse)
        raise_for(response.error_code, response.error_message, f"alter topic {name!r}")

    def delete_topic(self, name: str) -> None:
        """Delete a topic and its data.

        Raises:
            UnknownTopicOrPartitionError: no such topic.
        """
        answer = self._client.call(m.DeleteTopic(name=name))
        response = check_response(answer, m.DeleteTopicResponse)
        raise_for(response.error_code, response.error_message, f"delete topic {name!r}")

    # --- offsets and records -------------------------------------------------------------------
    def list_offsets(
        self,
        specs: Mapping[TopicPartition, int],
        *,
        isolation_level: str = "read_uncommitted",
    ) -> dict[TopicPartition, PartitionOffset]:
        """Offsets by spec per partition: ``OffsetSpec.EARLIEST`` (-2), ``LATEST`` (-1, the
        high watermark) or a timestamp in ms (the first offset at or after it; -1 if none).

        Raises:
            UnknownTopicOrPartitionError and other per-partition errors.
        """
        level = m.READ_COMMITTED if isolation_level == "read_committed" else m.READ_UNCOMMITTED
        out: dict[TopicPartition, PartitionOffset] = {}
        for node, entries in self._by_leader(specs).items():
            request = list_offsets_request(entries, level)
            for tp, (code, offset) in list_offsets_results(
                self._client.call(request, node_id=node)
            ).items():
                raise_for(code, None, f"list offsets of {tp}")
                out[tp] = offset
        return out

    def delete_records(
        self, offsets: Mapping[TopicPartition, int], *, timeout_ms: int = 30_000
    ) -> dict[TopicPartition, int]:
        """Delete records before ``offset`` per partition (-1: up to the high watermark).

        Returns the new low watermark per partition.

        Raises:
            OffsetOutOfRangeError, UnknownTopicOrPartitionError: as the broker answers.
        """
        out: dict[TopicPartition, int] = {}
        for node, entries in self._by_leader(offsets).items():
            request = delete_records_request(dict(entries), timeout_ms)
            out.update(delete_records_results(self._client.call(request, node_id=node)))
        return out

    def _by_leader(
        self, items: Mapping[TopicPartition, int]
    ) -> dict[int, list[tuple[TopicPartition, int]]]:
        by_node: dict[int, list[tuple[TopicPartition, int]]] = {}
        for tp, value in items.items():
            tp = TopicPartition(tp[0], tp[1])
            node = self._client.leader_for(tp.topic, tp.partition)
            by_node.setdefault(node, []).append((tp, value))
        return by_node

    # --- cluster -------------------------------------------------------------------------------
    def cluster_status(self) -> ClusterStatus:
        """Brokers, controller and partition counts, from a Metadata answer for all topics."""
        return cluster_status(self._client.fetch_metadata(None))

    def ping(self) -> int:
        """Round trip a Ping; returns the broker's protocol version from the handshake."""
        check_response(self._client.call(m.Ping()), m.Pong)
        return m.PROTOCOL_VERSION

    # --- groups (later milestone) --------------------------------------------------------------
    def list_groups(self) -> list[Any]:
        """Raises ``FeatureNotAvailableError`` until consumer groups exist."""
        raise FeatureNotAvailableError(GROUPS_PENDING)

    def describe_group(self, group_id: str) -> Any:
        """Raises ``FeatureNotAvailableError`` until consumer groups exist."""
        raise FeatureNotAvailableError(GROUPS_PENDING)

    def delete_group(self, group_id: str) -> None:
        """Raises ``FeatureNotAvailableError`` until consumer groups exist."""
        raise FeatureNotAvailableError(GROUPS_PENDING)

    # --- lifecycle -----------------------------------------------------------------------------
    def close(self) -> None:
        """Close connections. Idempotent; later calls raise ``ClosedError``."""
        self._client.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

