"""Building requests and reading responses: the client core's side of the wire messages.

Theory of operation
-------------------
Drivers (blocking and trio) never touch message classes themselves; they call these pure
functions to turn producer plans, fetch plans and admin calls into requests, and answers into
results or typed errors. An answer's error code becomes ``error_for(code, message)``; an
``ErrorResponse`` (the broker's frame-level answer: undecodable, unsupported ...) becomes the
error of its code too, through ``check_response``.

Nothing here blocks or reads a clock.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

import attrs

from rivven_broker.client.accumulator import ProducePlan, ProducerBatch
from rivven_broker.client.errors import RivvenError, error_for
from rivven_broker.client.fetch_state import FetchPlan
from rivven_broker.client.types import (
    BrokerInfo,
    ClusterStatus,
    MemberInfo,
    ConfigValue,
    PartitionInfo,
    PartitionOffset,
    RaftInfo,
    RaftVoterInfo,
    TopicDescription,
    TopicListing,
    TopicPartition,
)
from rivven_broker.protocol import messages as m
from rivven_broker.protocol.errors import ErrorCode

__all__ = [
    "version_for",
    "sendable",
    "ISOLATION_LEVELS",
    "check_response",
    "raise_for",
    "produce_request",
    "produce_results",
    "fetch_request",
    "list_offsets_request",
    "list_offsets_results",
    "delete_records_request",
    "delete_records_results",
    "metadata_request",
    "topic_listings",
    "topic_description",
    "cluster_status",
    "members_of",
]

ISOLATION_LEVELS = {"read_uncommitted": m.READ_UNCOMMITTED, "read_committed": m.READ_COMMITTED}


def check_response(response: Any, expected: type) -> Any:
    """Return ``response`` if it is an ``expected``; raise the error an ErrorResponse carries.

    Raises:
        BrokerError: the broker answered with ``ErrorResponse``.
        RivvenError: an answer of the wrong type (a protocol violation).
    """
    if isinstance(response, expected):
        return response
    if isinstance(response, m.ErrorResponse):
        raise error_for(response.error_code, response.message)
    raise RivvenError(
        f"expected {expected.__name__}, got {type(response).__name__}",
        error_code=ErrorCode.INVALID_REQUEST,
        retriable=True,
    )


def raise_for(code: ErrorCode | int, message: str | None, context: str) -> None:
    """Raise ``error_for(code)`` unless ``code`` is NONE."""
    if code != ErrorCode.NONE:
        text = f"{context}: {message}" if message else context
        raise error_for(code, text)


def version_for(api_versions: dict[int, tuple[int, int]], request: Any) -> int | None:
    """The newest version of ``request`` both sides speak (None: ours, the broker's unknown).

    The broker's ranges come from its HandshakeResponse; a request it does not list is sent at
    our newest version and answered with UNSUPPORTED_VERSION if it cannot take it.
    """
    theirs = api_versions.get(int(request.API_KEY))
    if theirs is None:
        return None
    low, high = type(request).VERSIONS
    version = min(high, theirs[1])
    return version if version >= max(low, theirs[0]) else None


def sendable(api_versions: dict[int, tuple[int, int]], request: Any) -> tuple[Any, int | None]:
    """``request`` as it can go to a broker with these ranges, and the version to send it at
    (``version_for``). Advisory fields a broker's version predates are dropped: a Fetch to a
    broker without v1 loses its ``current_leader_epoch`` (that broker cannot check it)."""
    version = version_for(api_versions, request)
    if version == 0 and type(request) is m.Fetch and any(
            p.current_leader_epoch >= 0 for t in request.topics for p in t.partitions):
        request = attrs.evolve(request, topics=tuple(
            attrs.evolve(t, partitions=tuple(
                attrs.evolve(p, current_leader_epoch=-1) for p in t.partitions))
            for t in request.topics))
    return request, version


# --- produce ---------------------------------------------------------------------------------
def produce_request(
    plan: ProducePlan, *, acks: int, timeout_ms: int, transactional_id: str | None = None
) -> m.Produce:
    """One Produce request carrying every batch of ``plan`` (batches must be sealed)."""
    by_topic: dict[str, list[m.ProducePartition]] = {}
    for batch in plan.batches:
        assert batch.data is not None, "seal batches before building the request"
        by_topic.setdefault(batch.topic, []).append(m.ProducePartition(batch.partition, batch.data))
    topics = tuple(m.ProduceTopic(name, tuple(parts)) for name, parts in by_topic.items())
    return m.Produce(
        acks=acks, timeout_ms=timeout_ms, topics=topics, transactional_id=transactional_id
    )


def produce_results(
    plan: ProducePlan, response: Any
) -> list[tuple[ProducerBatch, ErrorCode, int, str | None]]:
    """``(batch, error_code, base_offset, error_message)`` for every batch of ``plan``.

    A batch the response does not mention gets ``NETWORK_EXCEPTION`` (retriable): the broker
    said nothing about it, so it may or may not be stored.

    Raises:
        BrokerError: the whole request was answered with ``ErrorResponse``.
    """
    response = check_response(response, m.ProduceResponse)
    answers: dict[tuple[str, int], Any] = {}
    for topic in response.topics:
        for part in topic.partitions:
            answers[(topic.name, part.partition)] = part
    out = []
    for batch in plan.batches:
        part = answers.get((batch.topic, batch.partition))
        if part is None:
            out.append((batch, ErrorCode.NETWORK_EXCEPTION, -1, "no answer for this partition"))
        else:
            out.append((batch, part.error_code, part.base_offset, part.error_message))
    return out


# --- fetch -----------------------------------------------------------------------------------
def fetch_request(
    plan: FetchPlan,
    *,
    max_wait_ms: int,
    min_bytes: int,
    max_bytes: int,
    partition_max_bytes: int,
    isolation_level: int,
    leader_epoch: Callable[[str, int], int] | None = None,
) -> m.Fetch:
    """``leader_epoch(topic, partition)``: the epoch the metadata names (-1: unknown), sent as
    ``current_leader_epoch`` so a deposed leader cannot answer."""
    by_topic: dict[str, list[m.FetchPartition]] = {}
    for tp, _epoch, offset in plan.partitions:
        epoch = -1 if leader_epoch is None else leader_epoch(tp.topic, tp.partition)
        by_topic.setdefault(tp.topic, []).append(
            m.FetchPartition(tp.partition, offset, partition_max_bytes, epoch)
        )
    return m.Fetch(
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=isolation_level,
        topics=tuple(m.FetchTopic(name, tuple(parts)) for name, parts in by_topic.items()),
    )


# --- offsets ---------------------------------------------------------------------------------
def list_offsets_request(
    entries: Iterable[tuple[TopicPartition, int]], isolation_level: int = m.READ_UNCOMMITTED
) -> m.ListOffsets:
    """ListOffsets for ``(tp, timestamp)`` pairs (-2 earliest, -1 latest, else a time in ms).
    A partition named twice is asked once, for its last timestamp (a request may name each
    partition once)."""
    by_topic: dict[str, dict[int, m.ListOffsetsPartition]] = {}
    for tp, timestamp in entries:
        by_topic.setdefault(tp.topic, {})[tp.partition] = m.ListOffsetsPartition(
            tp.partition, timestamp)
    return m.ListOffsets(
        isolation_level=isolation_level,
        topics=tuple(m.ListOffsetsTopic(name, tuple(parts.values()))
                     for name, parts in by_topic.items()),
    )


def list_offsets_results(
    response: Any,
) -> dict[TopicPartition, tuple[ErrorCode, PartitionOffset]]:
    """Per partition: the error code and the offset found (-1 when none)."""
    response = check_response(response, m.ListOffsetsResponse)
    return {
        TopicPartition(topic.name, part.partition): (
            part.error_code,
            PartitionOffset(part.offset, part.timestamp),
        )
        for topic in response.topics
        for part in topic.partitions
    }


def delete_records_request(
    offsets: Mapping[TopicPartition, int], timeout_ms: int
) -> m.DeleteRecords:
    by_topic: dict[str, list[m.DeleteRecordsPartition]] = {}
    for tp, offset in offsets.items():
        by_topic.setdefault(tp[0], []).append(m.DeleteRecordsPartition(tp[1], offset))
    return m.DeleteRecords(
        timeout_ms=timeout_ms,
        topics=tuple(m.DeleteRecordsTopic(name, tuple(parts)) for name, parts in by_topic.items()),
    )


def delete_records_results(response: Any) -> dict[TopicPartition, int]:
    """The new low watermark per partition.

    Raises:
        BrokerError: the first partition that carried an error.
    """
    response = check_response(response, m.DeleteRecordsResponse)
    out = {}
    for topic in response.topics:
        for part in topic.partitions:
            tp = TopicPartition(topic.name, part.partition)
            raise_for(part.error_code, None, f"delete records of {tp}")
            out[tp] = part.low_watermark
    return out


# --- metadata and topics -----------------------------------------------------------------------
def metadata_request(topics: Iterable[str] | None, allow_auto_topic_creation: bool) -> m.Metadata:
    return m.Metadata(
        topics=None if topics is None else tuple(topics),
        allow_auto_topic_creation=allow_auto_topic_creation,
    )


def topic_listings(response: Any) -> list[TopicListing]:
    response = check_response(response, m.ListTopicsResponse)
    return sorted(
        (TopicListing(t.name, t.partitions, t.is_internal) for t in response.topics),
        key=lambda t: t.name,
    )


def _partition_infos(topic: Any) -> tuple[PartitionInfo, ...]:
    return tuple(
        PartitionInfo(
            p.partition,
            p.leader if p.leader >= 0 else None,
            p.leader_epoch,
            tuple(p.replicas),
            tuple(p.isr),
            None if p.error_code == ErrorCode.NONE else ErrorCode.from_wire(p.error_code).name,
        )
        for p in sorted(topic.partitions, key=lambda p: p.partition)
    )


def topic_description(describe: Any, metadata: Any | None) -> TopicDescription:
    """Merge DescribeTopic (configs) and Metadata (partition leaders) answers.

    Raises:
        BrokerError: the topic's error (unknown topic, bad name ...).
    """
    describe = check_response(describe, m.DescribeTopicResponse)
    raise_for(describe.error_code, describe.error_message, f"describe topic {describe.name!r}")
    infos: tuple[PartitionInfo, ...] = ()
    if metadata is not None:
        metadata = check_response(metadata, m.MetadataResponse)
        for topic in metadata.topics:
            if topic.name == describe.name and topic.error_code == ErrorCode.NONE:
                infos = _partition_infos(topic)
    configs = {
        entry.name: ConfigValue(entry.value, entry.is_default, entry.is_read_only,
                                entry.is_sensitive)
        for entry in describe.configs
    }
    return TopicDescription(
        describe.name, describe.partitions, describe.replication_factor, configs, infos
    )


def members_of(response: Any) -> tuple[tuple[MemberInfo, ...], RaftInfo | None]:
    """The ``DescribeClusterResponse``'s members, by node id, and its Raft view (None from a
    broker without --peers)."""
    response = check_response(response, m.DescribeClusterResponse)
    raise_for(response.error_code, None, "describe cluster")
    members = tuple(sorted(
        (MemberInfo(x.node_id, m.MEMBER_STATES[x.state], x.incarnation, x.client_host,
                    x.client_port, x.cluster_host, x.cluster_port, x.rack)
         for x in response.members),
        key=lambda member: member.node_id,
    ))
    if not response.raft_role:
        return members, None
    raft = RaftInfo(
        m.RAFT_ROLES[response.raft_role],
        response.raft_leader if response.raft_leader >= 0 else None, response.raft_term,
        response.raft_commit_index, response.raft_last_applied,
        tuple(RaftVoterInfo(v.node_id, v.match_index if v.match_index >= 0 else None,
                            v.connected) for v in response.raft_voters),
    )
    return members, raft


def cluster_status(response: Any, members: tuple[MemberInfo, ...] = (),
                   raft: RaftInfo | None = None) -> ClusterStatus:
    response = check_response(response, m.MetadataResponse)
    brokers = tuple(
        sorted(
            (BrokerInfo(b.node_id, b.host, b.port, b.rack) for b in response.brokers),
            key=lambda b: b.node_id,
        )
    )
    partitions = sum(len(t.partitions) for t in response.topics)
    leaderless = sum(1 for t in response.topics for p in t.partitions if p.leader < 0)
    controller = response.controller_id if response.controller_id >= 0 else None
    return ClusterStatus(
        response.cluster_id, controller, brokers, len(response.topics), partitions, leaderless,
        members, raft,
    )
