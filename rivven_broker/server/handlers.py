"""Request dispatch and the administrative handlers of a single-node broker.

Theory of operation
-------------------
``Handlers.begin(request, now_ms)`` is called by a connection's reader for each request, in
request order, and returns one of: a response (ready now), ``None`` (acks=0 produce: no
answer), or a ``Pending`` (see ``context.py``). Everything that changes state happens inside
``begin`` itself or, for the one change that must first wait for the sync worker to let go of
a topic's files (DeleteTopic), inside a *serial* pending that the reader awaits before it reads
on. AlterTopicConfig changes the logs' settings in place (they apply from the next append,
roll or retention pass). CreatePartitions grows a topic inside ``begin`` (new empty logs, then
the registry: see ``LogManager.add_partitions``), then pokes fetches waiting on the topic so
they re-plan; the next Metadata answer lists the new count. Produce, Fetch, ListOffsets and
DeleteRecords live in ``data_path.py``; the rest is here.

This node leads every partition: Metadata lists one broker (itself, at the address clients
reached), leader = this node, leader epoch 0, replicas = isr = [node id]. A replication factor
other than 1 is ``INVALID_REPLICATION_FACTOR`` (-1 means "the default", 1). A partition count
of -1 means the broker's ``default_partitions``. Names are checked per topic
(``INVALID_TOPIC_NAME``); unknown topics and partitions are ``UNKNOWN_TOPIC_OR_PARTITION``.
Topic creation and deletion fsync the registry on the event loop: they are rare, and the
``LogManager`` is not shared with threads.

Requests of apis this broker does not handle yet are answered with ``UNSUPPORTED_VERSION``,
and the handshake advertises only the apis handled. InitProducerId and the transaction apis
(40-44) are served by the transaction coordinator's driver (``txn_driver.py``); the group apis
(20-29) and FindCoordinator by the group coordinator's driver (``group_driver.py``). Internal
topics (``__consumer_offsets``, ``__transaction_state``) are left out of ListTopics (unless
``include_internal``) and of an all-topics Metadata answer, and cannot be deleted or grown.

``gate(request)`` names the event a request must wait for when it touches a topic that is in
the middle of being deleted (see ``TopicGates``).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import trio

from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.message_base import Request, Response
from rivven_broker.protocol.messages import (
    PROTOCOL_VERSION,
    AlterTopicConfig,
    AlterTopicConfigResponse,
    BrokerMetadata,
    ClusterMember,
    DescribeCluster,
    DescribeClusterResponse,
    ConfigEntry,
    CreatePartitions,
    CreatePartitionsResponse,
    CreateTopic,
    CreateTopicResponse,
    DeleteRecords,
    DeleteTopic,
    DeleteTopicResponse,
    DescribeTopic,
    DescribeTopicResponse,
    ErrorResponse,
    Fetch,
    Handshake,
    HandshakeResponse,
    ListOffsets,
    ListTopics,
    ListTopicsResponse,
    Metadata,
    MetadataResponse,
    REQUEST_TYPES,
    PartitionMetadata,
    Ping,
    Pong,
    Produce,
    RAFT_ROLES,
    RaftVoter,
    TopicListing,
    TopicMetadata,
    supported_api_versions,
)
from rivven_broker.protocol.names import topic_name_error
from rivven_broker.server.context import Pending, ServerContext
from rivven_broker.server.data_path import DataPath
from rivven_broker.server.group_driver import is_internal_topic
from rivven_broker.server.local_topics import LocalTopics
from rivven_broker.storage.errors import StorageError, SyncFailedError, TopicExistsError
from rivven_broker.storage.topic_config import TopicConfig

__all__ = ["Handlers"]

log = logging.getLogger(__name__)

_TOPIC_LIST_REQUESTS = (Produce, Fetch, ListOffsets, DeleteRecords)
_NAMED_REQUESTS = (CreateTopic, DeleteTopic, DescribeTopic, AlterTopicConfig, CreatePartitions)
#: Leaves room in a topic error message for the name.
_MESSAGE_BYTES_MAX = limits.error_message_bytes_max


def _clip(message: str) -> str:
    return message.encode()[:_MESSAGE_BYTES_MAX].decode("utf-8", "ignore")


def _failure(exc: Exception) -> tuple[ErrorCode, str]:
    """The wire code and message of an operating error of an administrative request."""
    if isinstance(exc, SyncFailedError):
        raise exc  # the broker must stop
    if isinstance(exc, StorageError):
        return exc.code, _clip(str(exc))
    if isinstance(exc, OSError):
        log.error("storage I/O failed: %s", exc)
        return ErrorCode.KAFKA_STORAGE_ERROR, _clip(f"storage I/O failed: {exc.strerror or exc}")
    raise exc


class Handlers:
    """Every request handler of one broker (see the module docstring)."""

    def __init__(self, context: ServerContext) -> None:
        self._context = context
        self._local = LocalTopics(context)
        self.data = DataPath(context, self._auto_create)
        self._table: dict[type[Request], Callable[[Any, int], Response | Pending | None]] = {
            Handshake: self._handshake,
            Ping: lambda request, now_ms: Pong(),
            Metadata: self._metadata,
            CreateTopic: self._create_topic,
            DeleteTopic: self._delete_topic,
            ListTopics: self._list_topics,
            DescribeTopic: self._describe_topic,
            AlterTopicConfig: self._alter_topic_config,
            CreatePartitions: self._create_partitions,
            Produce: self.data.produce,
            Fetch: lambda request, now_ms: self.data.fetch(request),
            ListOffsets: lambda request, now_ms: self.data.list_offsets(request),
            DeleteRecords: lambda request, now_ms: self.data.delete_records(request),
            DescribeCluster: self._describe_cluster,
        }
        if context.txn is not None:  # InitProducerId and the transaction apis (40-44)
            self._table.update(context.txn.handlers())
        if context.groups is not None:  # the group apis (20-29) and FindCoordinator
            self._table.update(context.groups.handlers())

    def gate(self, request: Request) -> trio.Event | None:
        """The event to await before ``begin`` when ``request`` touches a gated topic."""
        gates = self._context.gates
        if not gates:
            return None
        if isinstance(request, _TOPIC_LIST_REQUESTS):
            names = [topic.name for topic in request.topics]
        elif isinstance(request, _NAMED_REQUESTS):
            names = [request.name]
        elif isinstance(request, Metadata) and request.topics is not None:
            names = list(request.topics)
        else:
            return None
        for name in names:
            event = gates.get(name)
            if event is not None:
                return event
        return None

    def begin(self, request: Request, now_ms: int) -> Response | Pending | None:
        """Handle ``request`` up to its first wait (see the module docstring). Never blocks.

        Raises:
            SyncFailedError: an fsync failed; the broker must stop.
        """
        handler = self._table.get(type(request))
        if handler is None:  # an api of a later milestone (groups, transactions ...)
            return ErrorResponse(
                ErrorCode.UNSUPPORTED_VERSION,
                f"{type(request).__name__} is not supported by this broker yet",
            )
        return handler(request, now_ms)

    def api_versions(self) -> dict[int, tuple[int, int]]:
        """The (min, max) version of every api this broker handles, by api key."""
        return {
            key: versions
            for key, versions in supported_api_versions().items()
            if REQUEST_TYPES[key] in self._table
        }

    # --- core ------------------------------------------------------------------------------

    def _describe_cluster(self, request: DescribeCluster, now_ms: int) -> DescribeClusterResponse:
        context = self._context
        config = context.config
        if context.members is None:  # a single node: itself
            rack = config.rack
            me = ClusterMember(config.node_id, context.advertised_host, context.advertised_port,
                               rack=rack)
            return DescribeClusterResponse(ErrorCode.NONE, config.node_id, (me,))
        members = tuple(
            ClusterMember(
                member.node_id, member.client_address.host, member.client_address.port,
                int(member.state), member.incarnation, member.boot_id,
                member.cluster_address.host, member.cluster_address.port, member.rack,
            )
            for member in context.members()
        )
        cluster = context.cluster
        if cluster is None or not cluster.host.running:
            return DescribeClusterResponse(ErrorCode.NONE, config.node_id, members)
        raft = cluster.host.status()
        voters = tuple(
            RaftVoter(voter, raft.match_index.get(voter, -1) if raft.state == "leader" else -1,
                      voter == config.node_id or voter in raft.connected)
            for voter in cluster.host.voters
        )
        return DescribeClusterResponse(
            ErrorCode.NONE, config.node_id, members, RAFT_ROLES.index(raft.state),
            -1 if raft.leader is None else raft.leader, raft.term, raft.commit_index,
            raft.last_applied, voters,
        )

    def _handshake(self, request: Handshake, now_ms: int) -> HandshakeResponse:
        if request.protocol_version < 1:
            return HandshakeResponse(
                ErrorCode.UNSUPPORTED_VERSION,
                compatible=False,
                message=f"protocol version {request.protocol_version} is not supported",
                api_versions=self.api_versions(),
            )
        return HandshakeResponse(
            ErrorCode.NONE,
            PROTOCOL_VERSION,
            True,
            f"rivven-broker node {self._context.config.node_id}",
            self.api_versions(),
        )

    def _metadata(self, request: Metadata, now_ms: int) -> MetadataResponse:
        context = self._context
        if context.cluster is not None:
            return self._cluster_metadata(request, now_ms)
        node_id = context.config.node_id
        broker = BrokerMetadata(
            node_id, context.advertised_host, context.advertised_port, context.config.rack
        )
        topics = context.logs.topics()
        if request.topics is None:  # internal topics only when asked for by name
            names = sorted(name for name in topics if not is_internal_topic(name))
        else:
            names = request.topics
        described = []
        for name in names:
            code: ErrorCode | None = topic_name_error(name)
            if code is None and name not in topics:
                if request.allow_auto_topic_creation and context.config.auto_create_topics:
                    error = self._auto_create(name, now_ms)
                    code = None if error is None else error[0]
                else:
                    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            if code is not None:
                described.append(TopicMetadata(name, code))
                continue
            partitions = tuple(
                PartitionMetadata(p, ErrorCode.NONE, node_id, 0, (node_id,), (node_id,))
                for p in range(topics[name].partitions)
            )
            described.append(
                TopicMetadata(name, ErrorCode.NONE, is_internal_topic(name), partitions)
            )
        return MetadataResponse((broker,), node_id, f"rivven-node-{node_id}", tuple(described))

    def _cluster_metadata(self, request: Metadata, now_ms: int) -> MetadataResponse:
        cluster = self._context.cluster
        assert cluster is not None
        response = cluster.metadata(request.topics)
        if not (request.allow_auto_topic_creation and self._context.config.auto_create_topics):
            return response
        for topic in response.topics:
            if topic.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and not is_internal_topic(
                    topic.name):
                cluster.auto_create(topic.name)
        return response

    def _auto_create(self, name: str, now_ms: int) -> tuple[ErrorCode, str] | None:
        """Create ``name`` with the default layout; None when it exists afterwards.
        (Clustered: the controller creates it in the background; LEADER_NOT_AVAILABLE.)"""
        if self._context.cluster is not None:
            return self._context.cluster.auto_create(name)
        if name not in self._context.logs.topics():
            problem = self._room_problem(self._context.config.default_partitions)
            if problem is not None:
                return problem
        try:
            self._context.logs.create_topic(
                name, self._context.config.default_partitions, 1, {}, now_ms
            )
        except TopicExistsError:
            return None
        except (StorageError, OSError) as exc:
            return _failure(exc)
        log.info("auto-created topic %s (%d partitions)", name,
                 self._context.config.default_partitions)
        return None

    # --- topics ----------------------------------------------------------------------------

    def _create_problem(
        self, request: CreateTopic, partitions: int
    ) -> tuple[ErrorCode, str] | None:
        if topic_name_error(request.name) is not None:
            return ErrorCode.INVALID_TOPIC_NAME, "invalid topic name"
        if not 1 <= partitions <= limits.partitions_per_topic_max:
            return (ErrorCode.INVALID_PARTITIONS,
                    f"partitions must be 1..{limits.partitions_per_topic_max}")
        if request.replication_factor not in (1, -1):
            return (ErrorCode.INVALID_REPLICATION_FACTOR,
                    "a single-node broker keeps exactly one replica (replication factor 1)")
        if request.name in self._context.logs.topics():
            return ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {request.name!r} already exists"
        return self._room_problem(partitions)

    def _room_problem(self, added: int) -> tuple[ErrorCode, str] | None:
        """INVALID_PARTITIONS when ``added`` more partitions would take the broker past
        ``limits.partitions_per_broker_max`` (every topic counts, the broker's own too)."""
        held = sum(info.partitions for info in self._context.logs.topics().values())
        if held + added <= limits.partitions_per_broker_max:
            return None
        return (ErrorCode.INVALID_PARTITIONS,
                f"the broker holds {held} partitions; {added} more would pass its limit of "
                f"{limits.partitions_per_broker_max}")

    def _create_topic(self, request: CreateTopic, now_ms: int) -> CreateTopicResponse | Pending:
        name = request.name
        partitions = request.partitions
        if partitions == -1:
            partitions = self._context.config.default_partitions
        cluster = self._context.cluster
        if cluster is not None:
            factor = 1 if request.replication_factor == -1 else request.replication_factor

            async def create() -> CreateTopicResponse:
                code, message = await cluster.create_topic(
                    name, partitions, factor, dict(request.configs), request.validate_only)
                return CreateTopicResponse(name, code, message and _clip(message), partitions,
                                           factor)
            return Pending(create, serial=True)
        problem = self._create_problem(request, partitions)
        if problem is not None:
            code, message = problem
            return CreateTopicResponse(
                name, code, _clip(message), partitions, request.replication_factor
            )
        try:
            if request.validate_only:
                TopicConfig.parse(request.configs)
            else:
                self._context.logs.create_topic(name, partitions, 1, request.configs, now_ms)
                log.info("created topic %s with %d partitions", name, partitions)
        except (StorageError, OSError) as exc:
            code, message = _failure(exc)
            return CreateTopicResponse(name, code, message, partitions, 1)
        return CreateTopicResponse(name, ErrorCode.NONE, None, partitions, 1)

    def _topic_problem(self, name: str) -> tuple[ErrorCode, str] | None:
        if topic_name_error(name) is not None:
            return ErrorCode.INVALID_TOPIC_NAME, "invalid topic name"
        if name not in self._context.logs.topics():
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}"
        return None

    def _delete_topic(self, request: DeleteTopic, now_ms: int) -> DeleteTopicResponse | Pending:
        cluster = self._context.cluster
        if cluster is not None and not is_internal_topic(request.name):

            async def delete() -> DeleteTopicResponse:
                code, message = await cluster.delete_topic(request.name)
                return DeleteTopicResponse(request.name, code, message and _clip(message))
            return Pending(delete, serial=True)
        problem = self._topic_problem(request.name)
        if problem is None and is_internal_topic(request.name):
            problem = ErrorCode.POLICY_VIOLATION, "internal topics cannot be deleted"
        if problem is not None:
            return DeleteTopicResponse(request.name, *problem)
        name = request.name
        deleting = self._local.delete(name)  # the gate closes now

        async def run() -> DeleteTopicResponse:
            try:
                await deleting
            except (StorageError, OSError) as exc:
                return DeleteTopicResponse(name, *_failure(exc))
            log.info("deleted topic %s", name)
            return DeleteTopicResponse(name, ErrorCode.NONE)

        return Pending(run, serial=True)

    def _list_topics(self, request: ListTopics, now_ms: int) -> ListTopicsResponse:
        topics = self._context.logs.topics()
        return ListTopicsResponse(
            tuple(
                TopicListing(name, topics[name].partitions, is_internal_topic(name))
                for name in sorted(topics)
                if request.include_internal or not is_internal_topic(name)
            )
        )

    def _describe_topic(self, request: DescribeTopic, now_ms: int) -> DescribeTopicResponse:
        problem = self._topic_problem(request.name)
        if problem is not None:
            return DescribeTopicResponse(request.name, *problem)
        info = self._context.logs.topics()[request.name]
        configs = tuple(
            ConfigEntry(entry.name, entry.value, entry.is_default)
            for entry in info.config.describe()
        )
        return DescribeTopicResponse(
            request.name, ErrorCode.NONE, None, info.partitions, info.replication_factor, configs
        )

    def _alter_topic_config(
        self, request: AlterTopicConfig, now_ms: int
    ) -> AlterTopicConfigResponse | Pending:
        cluster = self._context.cluster
        if cluster is not None and not is_internal_topic(request.name):

            async def alter() -> AlterTopicConfigResponse:
                code, message = await cluster.alter_configs(
                    request.name, dict(request.configs), request.validate_only)
                return AlterTopicConfigResponse(request.name, code, message and _clip(message))
            return Pending(alter, serial=True)
        problem = self._topic_problem(request.name)
        if problem is not None:
            return AlterTopicConfigResponse(request.name, *problem)
        name = request.name
        logs = self._context.logs
        try:
            if request.validate_only:
                logs.topics()[name].config.alter(request.configs)
            else:
                logs.alter_topic_config(name, request.configs)
        except (StorageError, OSError) as exc:
            return AlterTopicConfigResponse(name, *_failure(exc))
        if not request.validate_only:
            log.info("altered topic %s: %s", name, dict(request.configs))
        return AlterTopicConfigResponse(name, ErrorCode.NONE)

    def _create_partitions(
        self, request: CreatePartitions, now_ms: int
    ) -> CreatePartitionsResponse | Pending:
        name = request.name
        cluster = self._context.cluster
        if cluster is not None and not is_internal_topic(name):

            async def grow() -> CreatePartitionsResponse:
                code, message = await cluster.create_partitions(
                    name, request.count, request.validate_only)
                record = cluster.image().topic(name)
                count = len(record.partitions) if record is not None else -1
                return CreatePartitionsResponse(name, code, message and _clip(message), count)
            return Pending(grow, serial=True)
        problem = self._topic_problem(name)
        if is_internal_topic(name):  # whether or not it exists yet
            problem = ErrorCode.POLICY_VIOLATION, "internal topics cannot be given partitions"
        if problem is not None:
            return CreatePartitionsResponse(name, *problem)
        logs = self._context.logs
        current = logs.topics()[name].partitions
        if request.count <= current:
            problem = (ErrorCode.INVALID_PARTITIONS,
                       f"topic {name!r} has {current} partitions; the count can only grow")
        elif request.count > limits.partitions_per_topic_max:
            problem = (ErrorCode.INVALID_PARTITIONS,
                       f"partitions must be at most {limits.partitions_per_topic_max}")
        else:
            problem = self._room_problem(request.count - current)
        if problem is not None:
            return CreatePartitionsResponse(name, *problem, current)
        if request.validate_only:
            return CreatePartitionsResponse(name, ErrorCode.NONE, None, request.count)
        try:
            logs.add_partitions(name, request.count, now_ms)
        except (StorageError, OSError) as exc:
            code, message = _failure(exc)
            return CreatePartitionsResponse(name, code, message, logs.topics()[name].partitions)
        self._context.waker.poke_topic(name)
        log.info("grew topic %s from %d to %d partitions", name, current, request.count)
        return CreatePartitionsResponse(name, ErrorCode.NONE, None, request.count)
