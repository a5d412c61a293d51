"""The async ``Admin`` (AnyIO: trio or asyncio): topics, offsets, records, cluster, groups.

Theory of operation
-------------------
Each method builds one or two requests with ``requests.py``, sends them through the
``Cluster`` (``Cluster.call``: any broker for topic administration, the partition leader for
offsets and record deletion; retries are the core's ``CallRetry``) and turns the answers into
the plain result types of ``types.py`` or a typed ``BrokerError``. Group administration goes to
the group's coordinator, found again while it moves or loads as the core's
``CoordinatorSearch`` decides; ``group_admin.py`` reads the answers. Nothing here decides a
retry or a backoff itself. The blocking ``Admin`` (``_admin.py``) is this class through a
portal.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Mapping

import anyio

from rivven_broker.client._aio_net import Bridge, ClientEnv, Cluster, env_rng, open_task_group
from rivven_broker.client.config import ConnectionConfig, bootstrap_and_topics, build_configs
from rivven_broker.client.errors import RivvenError, UnsupportedVersionError, error_for
from rivven_broker.client.group_admin import (
    CoordinatorSearch,
    GroupDescription,
    GroupListing,
    group_description,
    group_listings,
    group_members,
    merged_listings,
    parse_reset_target,
    plan_reset,
)
from rivven_broker.client.group_core import committed_offsets
from rivven_broker.client.requests import (
    check_response,
    cluster_status,
    delete_records_request,
    delete_records_results,
    list_offsets_request,
    list_offsets_results,
    members_of,
    raise_for,
    topic_description,
    topic_listings,
)
from rivven_broker.client.types import (
    ClusterStatus,
    LogInfo,
    PartitionOffset,
    TopicDescription,
    TopicListing,
    TopicPartition,
)
from rivven_broker.protocol import messages as m
from rivven_broker.protocol.errors import ErrorCode

__all__ = ["AsyncAdmin", "open_admin"]


class AsyncAdmin:
    """Administers a Rivven cluster; use through ``open_admin``. Every method is awaited.

    Options: ``client_id``, ``request_timeout_ms`` (30000), ``connect_attempts_max`` (3) ...
    """

    def __init__(self, bootstrap: str, env: Any, nursery: Any, *,
                 connect_attempts_max: int = 3, bridge: Bridge | None = None,
                 **options: Any) -> None:
        (config,) = build_configs(options, ConnectionConfig)
        self._cluster = Cluster(bootstrap, config, env, nursery, in_flight_max=8,
                                connect_attempts_max=connect_attempts_max, bridge=bridge)
        self._rng = env_rng(env, "admin-retry")  # backoff jitter

    # --- topics --------------------------------------------------------------------------------
    async def create_topic(
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
        response = check_response(await self._cluster.call(request), m.CreateTopicResponse)
        raise_for(response.error_code, response.error_message, f"create topic {name!r}")

    async def list_topics(self, *, include_internal: bool = False) -> list[TopicListing]:
        """Every topic, sorted by name."""
        request = m.ListTopics(include_internal=include_internal)
        return topic_listings(await self._cluster.call(request))

    async def describe_topic(self, name: str) -> TopicDescription:
        """Partitions, replication factor, configs and partition leaders of a topic.

        Raises:
            UnknownTopicOrPartitionError: no such topic. (And the connection errors.)
        """
        describe = await self._cluster.call(m.DescribeTopic(name=name))
        metadata = await self._cluster.call(
            m.Metadata(topics=(name,), allow_auto_topic_creation=False))
        return topic_description(describe, metadata)

    async def alter_topic_config(self, name: str, config: Mapping[str, str | None]) -> None:
        """Set topic configs; a value of None resets that key to its default.

        Raises:
            UnknownTopicOrPartitionError, InvalidConfigError: as the broker answers.
        """
        request = m.AlterTopicConfig(name=name, configs=dict(config))
        response = check_response(await self._cluster.call(request), m.AlterTopicConfigResponse)
        raise_for(response.error_code, response.error_message, f"alter topic {name!r}")

    async def create_partitions(
        self, topic: str, total_count: int, *, validate_only: bool = False
    ) -> None:
        """Grow ``topic`` to ``total_count`` partitions (Kafka's CreatePartitions).

        The count only grows; existing partitions keep their data, new ones start empty.
        Keyed records map to ``murmur2(key) % count``, so after the change a key may go to a
        different partition (as in Kafka). Producers and consumers see the new count at their
        next metadata refresh. ``validate_only``: check everything, change nothing.

        Raises:
            InvalidPartitionsError: ``total_count`` is not above the current count, or is
                above the broker's limit.
            UnknownTopicOrPartitionError: no such topic.
            BrokerError: ``POLICY_VIOLATION`` for internal topics, and other broker answers.
            ConnectionFailedError / ClientTimeoutError: no broker answered.
        """
        request = m.CreatePartitions(name=topic, count=total_count, validate_only=validate_only)
        response = check_response(await self._cluster.call(request), m.CreatePartitionsResponse)
        raise_for(response.error_code, response.error_message, f"create partitions of {topic!r}")

    async def delete_topic(self, name: str) -> None:
        """Delete a topic and its data.

        Raises:
            UnknownTopicOrPartitionError: no such topic.
        """
        answer = await self._cluster.call(m.DeleteTopic(name=name))
        response = check_response(answer, m.DeleteTopicResponse)
        raise_for(response.error_code, response.error_message, f"delete topic {name!r}")

    # --- offsets and records -------------------------------------------------------------------
    async def list_offsets(
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
        for node, entries in (await self._by_leader(specs)).items():
            request = list_offsets_request(entries, level)
            for tp, (code, offset) in list_offsets_results(
                await self._cluster.call(request, node_id=node)
            ).items():
                raise_for(code, None, f"list offsets of {tp}")
                out[tp] = offset
        return out

    async def delete_records(
        self, offsets: Mapping[TopicPartition, int], *, timeout_ms: int = 30_000
    ) -> dict[TopicPartition, int]:
        """Delete records before ``offset`` per partition (-1: up to the high watermark).

        Returns the new low watermark per partition.

        Raises:
            OffsetOutOfRangeError, UnknownTopicOrPartitionError: as the broker answers.
        """
        out: dict[TopicPartition, int] = {}
        for node, entries in (await self._by_leader(offsets)).items():
            request = delete_records_request(dict(entries), timeout_ms)
            out.update(delete_records_results(await self._cluster.call(request, node_id=node)))
        return out

    async def describe_logs(self, topic: str) -> dict[int, LogInfo]:
        """Each partition's bytes on disk and log start and end offsets, from its leader
        (Kafka's DescribeLogDirs).

        Raises:
            UnknownTopicOrPartitionError and other per-partition errors.
        """
        tps = await self._partitions(topic)
        out: dict[int, LogInfo] = {}
        for node, entries in (await self._by_leader({tp: 0 for tp in tps})).items():
            request = m.DescribeLogDirs((m.DescribeLogDirsTopic(
                topic, tuple(tp.partition for tp, _ in entries)),))
            answer = await self._cluster.call(request, node_id=node)
            for entry in answer.topics:
                for part in entry.partitions:
                    raise_for(part.error_code, None, f"log of {topic}-{part.partition}")
                    out[part.partition] = LogInfo(part.size_bytes, part.log_start_offset,
                                                  part.log_end_offset)
        return dict(sorted(out.items()))

    async def _by_leader(
        self, items: Mapping[TopicPartition, int]
    ) -> dict[int, list[tuple[TopicPartition, int]]]:
        by_node: dict[int, list[tuple[TopicPartition, int]]] = {}
        for tp, value in items.items():
            tp = TopicPartition(tp[0], tp[1])
            node = await self._cluster.leader_for(tp.topic, tp.partition)
            by_node.setdefault(node, []).append((tp, value))
        return by_node

    # --- cluster -------------------------------------------------------------------------------
    async def cluster_status(self) -> ClusterStatus:
        """Brokers, controller and partition counts, from a Metadata answer for all topics."""
        try:
            members, raft = members_of(await self._cluster.call(m.DescribeCluster()))
        except UnsupportedVersionError:  # a broker older than membership: no members to show
            members, raft = (), None
        return cluster_status(await self._cluster.fetch_metadata(None), members, raft)

    async def ping(self) -> int:
        """Round trip a Ping; returns the broker's protocol version from the handshake."""
        check_response(await self._cluster.call(m.Ping()), m.Pong)
        return m.PROTOCOL_VERSION

    # --- groups -------------------------------------------------------------------------------
    async def _coordinator_call(self, group_id: str, request: Any) -> Any:
        """``request`` answered by the group's coordinator, found again (with backoff, within
        ``COORDINATOR_WAIT_MS``) while it moves, loads or is not reachable."""
        search = CoordinatorSearch(group_id, self._cluster.now_ms(), self._rng)
        while True:
            try:
                answer = await self._cluster.call(m.FindCoordinator(group_id, 0))
                failure = search.answered(answer, "find")
                if failure is None:
                    if self._cluster.metadata.address_of(answer.node_id) is None:
                        await self._cluster.fetch_metadata([])
                    response = await self._cluster.call(request, node_id=answer.node_id)
                    failure = search.answered(response, "call")
                    if failure is None:
                        return response
            except RivvenError as error:
                failure = error
            await anyio.sleep(search.retry_in_ms(failure, self._cluster.now_ms()) / 1000)

    async def list_groups(self) -> list[GroupListing]:
        """Every consumer group: (group_id, protocol_type, state), sorted. In a cluster every
        broker is asked (each lists the groups it coordinates)."""
        brokers = [b.node_id for b in (await self._cluster.fetch_metadata([])).brokers]
        if len(brokers) <= 1:
            return group_listings(await self._cluster.call(m.ListGroups()))
        return merged_listings([await self._cluster.call(m.ListGroups(), node_id=node)
                                for node in brokers])

    async def describe_group(self, group_id: str) -> GroupDescription:
        """State, protocol, members with their assignments, and per partition the committed
        offset, log end offset (high watermark) and lag.

        Raises:
            BrokerError (GROUP_ID_NOT_FOUND): no such group.
        """
        describe = await self._coordinator_call(group_id, m.DescribeGroup(group_id))
        group_members(describe)  # raises the group's error
        committed = await self._committed(group_id)
        wanted = set(committed) | {tp for mem in group_members(describe) for tp in mem.assignment}
        ends: dict[TopicPartition, int] = {}
        if wanted:
            lenient = await self._list_offsets_lenient({tp: -1 for tp in sorted(wanted)})
            for tp, found in lenient.items():
                ends[tp] = found.offset
        return group_description(describe, committed, ends)

    async def _committed(self, group_id: str) -> dict[TopicPartition, int | None]:
        answer = await self._coordinator_call(group_id, m.OffsetFetch(group_id, all_topics=True))
        return committed_offsets(answer)

    async def _list_offsets_lenient(self, specs: Mapping[TopicPartition, int]) -> dict:
        """``list_offsets`` that leaves out partitions that fail (a deleted topic)."""
        out = {}
        for tp, spec in specs.items():
            try:
                out.update(await self.list_offsets({tp: spec}))
            except RivvenError:
                continue
        return out

    async def _partitions(self, topic: str) -> list[TopicPartition]:
        answer = await self._cluster.fetch_metadata([topic])
        for entry in answer.topics:
            if entry.name == topic:
                raise_for(entry.error_code, None, f"topic {topic!r}")
                return [TopicPartition(topic, p.partition) for p in entry.partitions]
        raise error_for(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic!r}")

    async def delete_group(self, group_id: str) -> None:
        """Delete a group without members, and its committed offsets.

        Raises:
            BrokerError: NON_EMPTY_GROUP (members are connected), GROUP_ID_NOT_FOUND.
        """
        answer = await self._coordinator_call(group_id, m.DeleteGroup(group_id))
        raise_for(answer.error_code, None, f"delete group {group_id!r}")

    async def reset_offsets(self, group_id: str, topic: str, to: Any, *,
                      dry_run: bool = False) -> dict[TopicPartition, int]:
        """Move the committed offsets of ``group_id`` in every partition of ``topic`` to
        ``to``: "earliest", "latest", an offset, "timestamp=MS" (the first offset at or
        after it; the log end when there is none) or "shift=N" (N from the committed offset,
        the earliest when there is none, kept within the log). The group must have no
        members. Returns the new offsets; with ``dry_run`` only computes them.

        Raises:
            BrokerError: NON_EMPTY_GROUP (stop the consumers first), UNKNOWN_TOPIC_OR_PARTITION,
                OFFSET_OUT_OF_RANGE (an offset past a partition's end).
            ValueError: a bad ``to``.
        """
        target = parse_reset_target(to)
        try:
            describe = await self._coordinator_call(group_id, m.DescribeGroup(group_id))
            members = group_members(describe)
        except RivvenError as error:
            if error.error_code != ErrorCode.GROUP_ID_NOT_FOUND:
                raise
            members = ()
        if members:
            raise error_for(ErrorCode.NON_EMPTY_GROUP,
                            f"group {group_id!r} has {len(members)} members; stop them first")
        tps = await self._partitions(topic)
        earliest = {tp: o.offset
                    for tp, o in (await self.list_offsets({tp: -2 for tp in tps})).items()}
        latest = {tp: o.offset
                  for tp, o in (await self.list_offsets({tp: -1 for tp in tps})).items()}
        at_timestamp = {}
        if target.kind == "timestamp":
            at_timestamp = {tp: o.offset for tp, o in
                            (await self.list_offsets({tp: target.value for tp in tps})).items()}
        committed = await self._committed(group_id) if target.kind == "shift" else {}
        offsets = plan_reset(target, tps, committed, earliest, latest, at_timestamp)
        if dry_run:
            return offsets
        commit = m.OffsetCommit(group_id, topics=(m.OffsetCommitTopic(topic, tuple(
            m.OffsetCommitPartition(tp.partition, offset) for tp, offset in sorted(offsets.items())
        )),))
        answer = await self._coordinator_call(group_id, commit)
        for part in answer.topics[0].partitions:
            raise_for(part.error_code, None, f"reset {topic}-{part.partition} of {group_id!r}")
        return offsets


@asynccontextmanager
async def open_admin(
    bootstrap: str | None = None, *, env: Any = None, bridge: Bridge | None = None,
    **options: Any
) -> AsyncIterator[AsyncAdmin]:
    """An async ``Admin`` for the body of an ``async with``."""
    bootstrap, _ = bootstrap_and_topics(() if bootstrap is None else (bootstrap,), None,
                                        options, takes_topics=False)
    async with open_task_group() as nursery:
        admin = AsyncAdmin(bootstrap, env or ClientEnv(), nursery, bridge=bridge, **options)
        try:
            yield admin
        finally:
            admin._cluster.close()
            nursery.cancel_scope.cancel()
