"""The async ``Admin`` (AnyIO: trio or asyncio): requests and answers, awaited.

Theory of operation
-------------------
Each method is one or two ``Cluster.call``s (whose retries are the core's ``CallRetry``) and
the shared answer readers of ``requests.py`` and ``group_admin.py``. Group calls go to the group's coordinator, found again while it moves or
loads as the core's ``CoordinatorSearch`` decides (the blocking ``Admin`` follows it too).
Nothing here decides a retry or a backoff itself.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Mapping

import anyio

from rivven_broker.client._aio_net import ClientEnv, Cluster, env_rng, open_task_group
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
    metadata_request,
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
from rivven_broker.protocol.errors import ErrorCode

__all__ = ["AsyncAdmin", "open_admin"]


def _tp(item: Any) -> TopicPartition:
    return TopicPartition(item[0], item[1])


class AsyncAdmin:
    """Use through ``open_admin``; methods as the blocking ``Admin``, awaited."""

    def __init__(self, bootstrap: str, env: Any, nursery: Any,
                 *, connect_attempts_max: int = 3, **options: Any) -> None:
        (config,) = build_configs(options, ConnectionConfig)
        self._cluster = Cluster(bootstrap, config, env, nursery, in_flight_max=8,
                                    connect_attempts_max=connect_attempts_max)
        self._rng = env_rng(env, "admin-retry")

    async def create_topic(self, name: str, partitions: int = 3, replication_factor: int = 1,
                           config: Mapping[str, str] | None = None, *,
                           validate_only: bool = False) -> None:
        request = m.CreateTopic(name=name, partitions=partitions,
                                replication_factor=replication_factor,
                                configs=dict(config or {}), validate_only=validate_only)
        response = check_response(await self._cluster.call(request), m.CreateTopicResponse)
        raise_for(response.error_code, response.error_message, f"create topic {name!r}")

    async def list_topics(self, *, include_internal: bool = False) -> list[TopicListing]:
        request = m.ListTopics(include_internal=include_internal)
        return topic_listings(await self._cluster.call(request))

    async def describe_topic(self, name: str) -> TopicDescription:
        describe = await self._cluster.call(m.DescribeTopic(name=name))
        metadata = await self._cluster.call(metadata_request([name], False))
        return topic_description(describe, metadata)

    async def alter_topic_config(self, name: str, config: Mapping[str, str | None]) -> None:
        request = m.AlterTopicConfig(name=name, configs=dict(config))
        response = check_response(await self._cluster.call(request), m.AlterTopicConfigResponse)
        raise_for(response.error_code, response.error_message, f"alter topic {name!r}")

    async def create_partitions(self, topic: str, total_count: int, *,
                                validate_only: bool = False) -> None:
        request = m.CreatePartitions(name=topic, count=total_count, validate_only=validate_only)
        response = check_response(await self._cluster.call(request), m.CreatePartitionsResponse)
        raise_for(response.error_code, response.error_message, f"create partitions of {topic!r}")

    async def delete_topic(self, name: str) -> None:
        response = check_response(
            await self._cluster.call(m.DeleteTopic(name=name)), m.DeleteTopicResponse
        )
        raise_for(response.error_code, response.error_message, f"delete topic {name!r}")

    async def list_offsets(
        self, specs: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, PartitionOffset]:
        out = {}
        for node, entries in (await self._by_leader(specs)).items():
            answer = await self._cluster.call(list_offsets_request(entries), node_id=node)
            for tp, (code, offset) in list_offsets_results(answer).items():
                raise_for(code, None, f"list offsets of {tp}")
                out[tp] = offset
        return out

    async def delete_records(self, offsets: Mapping[TopicPartition, int], *,
                             timeout_ms: int = 30_000) -> dict[TopicPartition, int]:
        out: dict[TopicPartition, int] = {}
        for node, entries in (await self._by_leader(offsets)).items():
            request = delete_records_request(dict(entries), timeout_ms)
            out.update(delete_records_results(await self._cluster.call(request, node_id=node)))
        return out

    async def _by_leader(self, items: Mapping[TopicPartition, int]) -> dict[int, list]:
        by_node: dict[int, list] = {}
        for item, value in items.items():
            tp = _tp(item)
            node = await self._cluster.leader_for(tp.topic, tp.partition)
            by_node.setdefault(node, []).append((tp, value))
        return by_node

    async def cluster_status(self) -> ClusterStatus:
        try:
            members, raft = members_of(await self._cluster.call(m.DescribeCluster()))
        except UnsupportedVersionError:  # a broker older than membership: no members to show
            members, raft = (), None
        return cluster_status(await self._cluster.call(metadata_request(None, False)), members,
                              raft)

    async def ping(self) -> None:
        check_response(await self._cluster.call(m.Ping()), m.Pong)

    async def _coordinator_call(self, group_id: str, request: Any) -> Any:
        """As the blocking ``Admin``'s: found again while the coordinator moves or loads."""
        search = CoordinatorSearch(group_id, self._cluster.now_ms(), self._rng)
        while True:
            try:
                answer = await self._cluster.call(m.FindCoordinator(group_id, 0))
                failure = search.answered(answer, "find")
                if failure is None:
                    if self._cluster.metadata.address_of(answer.node_id) is None:
                        metadata = await self._cluster.call(metadata_request([], False))
                        self._cluster.update_metadata(metadata)
                    response = await self._cluster.call(request, node_id=answer.node_id)
                    failure = search.answered(response, "call")
                    if failure is None:
                        return response
            except RivvenError as error:
                failure = error
            await anyio.sleep(search.retry_in_ms(failure, self._cluster.now_ms()) / 1000)

    async def list_groups(self) -> list[GroupListing]:
        metadata = await self._cluster.call(metadata_request([], False))
        brokers = [b.node_id for b in metadata.brokers]
        if len(brokers) <= 1:
            return group_listings(await self._cluster.call(m.ListGroups()))
        return merged_listings([await self._cluster.call(m.ListGroups(), node_id=node)
                                for node in brokers])

    async def describe_group(self, group_id: str) -> GroupDescription:
        describe = await self._coordinator_call(group_id, m.DescribeGroup(group_id))
        members = group_members(describe)
        answer = await self._coordinator_call(group_id, m.OffsetFetch(group_id, all_topics=True))
        committed = committed_offsets(answer)
        wanted = set(committed) | {tp for member in members for tp in member.assignment}
        ends = {}
        for tp in sorted(wanted):
            try:
                ends[tp] = (await self.list_offsets({tp: -1}))[tp].offset
            except RivvenError:
                continue
        return group_description(describe, committed, ends)

    async def delete_group(self, group_id: str) -> None:
        answer = await self._coordinator_call(group_id, m.DeleteGroup(group_id))
        raise_for(answer.error_code, None, f"delete group {group_id!r}")

    async def reset_offsets(self, group_id: str, topic: str, to: Any, *,
                            dry_run: bool = False) -> dict[TopicPartition, int]:
        """As the blocking ``Admin.reset_offsets``."""
        target = parse_reset_target(to)
        describe = await self._coordinator_call(group_id, m.DescribeGroup(group_id))
        if describe.error_code == ErrorCode.NONE and describe.members:
            raise error_for(ErrorCode.NON_EMPTY_GROUP, f"group {group_id!r} has members")
        metadata = check_response(
            await self._cluster.call(metadata_request([topic], False)), m.MetadataResponse
        )
        (entry,) = [t for t in metadata.topics if t.name == topic]
        raise_for(entry.error_code, None, f"topic {topic!r}")
        tps = [TopicPartition(topic, p.partition) for p in entry.partitions]

        async def offsets_at(spec: int) -> dict[TopicPartition, int]:
            found = await self.list_offsets({tp: spec for tp in tps})
            return {tp: o.offset for tp, o in found.items()}

        earliest, latest = await offsets_at(-2), await offsets_at(-1)
        at_timestamp = await offsets_at(target.value) if target.kind == "timestamp" else {}
        committed = {}
        if target.kind == "shift":
            answer = await self._coordinator_call(
                group_id, m.OffsetFetch(group_id, all_topics=True))
            committed = committed_offsets(answer)
        offsets = plan_reset(target, tps, committed, earliest, latest, at_timestamp)
        if dry_run:
            return offsets
        parts = tuple(m.OffsetCommitPartition(tp.partition, o) for tp, o in sorted(offsets.items()))
        answer = await self._coordinator_call(
            group_id, m.OffsetCommit(group_id, topics=(m.OffsetCommitTopic(topic, parts),))
        )
        for part in answer.topics[0].partitions:
            raise_for(part.error_code, None, f"reset {topic}-{part.partition} of {group_id!r}")
        return offsets




@asynccontextmanager
async def open_admin(
    bootstrap: str | None = None, *, env: Any = None, **options: Any
) -> AsyncIterator[AsyncAdmin]:
    """An async ``Admin`` for the body of an ``async with``."""
    bootstrap, _ = bootstrap_and_topics(() if bootstrap is None else (bootstrap,), None,
                                        options, takes_topics=False)
    async with open_task_group() as nursery:
        admin = AsyncAdmin(bootstrap, env or ClientEnv(), nursery, **options)
        try:
            yield admin
        finally:
            admin._cluster.close()
            nursery.cancel_scope.cancel()
