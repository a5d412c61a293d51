"""Request dispatch: every request to its handler, on a broker alone or in a cluster.

Theory of operation
-------------------
``Handlers.begin(request, call)`` is called by a connection's reader for each request, in
request order, with the request's ``RequestContext`` (when, and which client), and returns one of: a response (ready now), ``None`` (acks=0 produce: no
answer), or a ``Pending`` (see ``context.py``); a *serial* pending is awaited by the reader
before it reads on (topic deletion, and every admin request of a clustered broker).

Topics are decided by ``context.control`` (``control.py``): Metadata, CreateTopic,
DeleteTopic, AlterTopicConfig, CreatePartitions and auto-creation go there — to
``LocalControl`` on a broker alone, to ``ClusterControl`` (the Raft controller) with
``--peers``. ListTopics and DescribeTopic read the local registry (on a clustered broker a
cache of the applied metadata). Produce, Fetch, ListOffsets and DeleteRecords live in
``data_path.py``; DescribeCluster shows the membership view and, with ``--peers``, the
controller's Raft view.

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

from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.message_base import Request, Response
from rivven_broker.protocol.messages import (
    PROTOCOL_VERSION,
    AlterTopicConfig,
    ClusterMember,
    DescribeCluster,
    DescribeClusterResponse,
    ConfigEntry,
    CreatePartitions,
    CreateTopic,
    DeleteRecords,
    DeleteTopic,
    DescribeTopic,
    DescribeTopicResponse,
    ErrorResponse,
    Fetch,
    Handshake,
    HandshakeResponse,
    ListOffsets,
    OffsetsForLeaderEpoch,
    DescribeLogDirs,
    ListTopics,
    ListTopicsResponse,
    Metadata,
    REQUEST_TYPES,
    Ping,
    Pong,
    Produce,
    RAFT_ROLES,
    RaftVoter,
    TopicListing,
    supported_api_versions,
)
from rivven_broker.server.context import Pending, RequestContext, ServerContext
from rivven_broker.server.data_path import DataPath
from rivven_broker.server.control import Control
from rivven_broker.server.internal_topics import is_internal_topic
from rivven_broker.server.local_control import topic_problem

__all__ = ["Handlers"]

log = logging.getLogger(__name__)

_TOPIC_LIST_REQUESTS = (Produce, Fetch, ListOffsets, DeleteRecords)
_NAMED_REQUESTS = (CreateTopic, DeleteTopic, DescribeTopic, AlterTopicConfig, CreatePartitions)
#: A request handler: the request and who sent it when, to a response, a Pending or nothing.
Handler = Callable[[Any, RequestContext], Response | Pending | None]


class Handlers:
    """Every request handler of one broker (see the module docstring)."""

    def __init__(self, context: ServerContext) -> None:
        self._context = context
        self.data = DataPath(context,
                             lambda name, now_ms: self._control.auto_create(name, now_ms))
        self._table: dict[type[Request], Handler] = {
            Handshake: self._handshake,
            Ping: lambda request, call: Pong(),
            Metadata: lambda request, call: self._control.metadata(request, call.now_ms),
            CreateTopic: lambda request, call: self._control.create_topic(request, call.now_ms),
            DeleteTopic: lambda request, call: self._control.delete_topic(request, call.now_ms),
            ListTopics: self._list_topics,
            DescribeTopic: self._describe_topic,
            AlterTopicConfig:
                lambda request, call: self._control.alter_topic_config(request, call.now_ms),
            CreatePartitions:
                lambda request, call: self._control.create_partitions(request, call.now_ms),
            Produce: self.data.begin_produce,
            Fetch: lambda request, call: self.data.fetch(request),
            ListOffsets: lambda request, call: self.data.list_offsets(request),
            OffsetsForLeaderEpoch: lambda request, call: self.data.offsets_for_leader_epoch(
                request),
            DescribeLogDirs: lambda request, call: self.data.describe_log_dirs(request),
            DeleteRecords: lambda request, call: self.data.delete_records(request),
            DescribeCluster: self._describe_cluster,
        }
        if context.txn is not None:  # InitProducerId and the transaction apis (40-44)
            self._table.update(context.txn.handlers())
        if context.groups is not None:  # the group apis (20-29) and FindCoordinator
            self._table.update(context.groups.handlers())

    @property
    def _control(self) -> Control:
        control = self._context.control
        assert control is not None, "the broker sets its control before it serves"
        return control

    @property
    def gates_closed(self) -> bool:
        """Some topic is gated now (``gate`` may then say wait)."""
        return self._context.gates.any_closed

    def gate(self, request: Request) -> trio.Event | None:
        """The event to await before ``begin`` when ``request`` touches a gated topic."""
        gates = self._context.gates
        if not gates.any_closed:
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

    def begin(self, request: Request, call: RequestContext) -> Response | Pending | None:
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
        return handler(request, call)

    def api_versions(self) -> dict[int, tuple[int, int]]:
        """The (min, max) version of every api this broker handles, by api key."""
        return {
            key: versions
            for key, versions in supported_api_versions().items()
            if REQUEST_TYPES[key] in self._table
        }

    # --- core ------------------------------------------------------------------------------

    def _describe_cluster(self, request: DescribeCluster, call: RequestContext) -> DescribeClusterResponse:
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
        if cluster is None or not cluster.running:
            return DescribeClusterResponse(ErrorCode.NONE, config.node_id, members)
        raft = cluster.status()
        voters = tuple(
            RaftVoter(voter, raft.match_index.get(voter, -1) if raft.state == "leader" else -1,
                      voter == config.node_id or voter in raft.connected)
            for voter in cluster.voters
        )
        return DescribeClusterResponse(
            ErrorCode.NONE, config.node_id, members, RAFT_ROLES.index(raft.state),
            -1 if raft.leader is None else raft.leader, raft.term, raft.commit_index,
            raft.last_applied, voters,
        )

    def _handshake(self, request: Handshake, call: RequestContext) -> HandshakeResponse:
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

    # --- topics ----------------------------------------------------------------------------

    def _list_topics(self, request: ListTopics, call: RequestContext) -> ListTopicsResponse:
        topics = self._context.logs.topics()
        return ListTopicsResponse(
            tuple(
                TopicListing(name, topics[name].partitions, is_internal_topic(name))
                for name in sorted(topics)
                if request.include_internal or not is_internal_topic(name)
            )
        )

    def _describe_topic(self, request: DescribeTopic, call: RequestContext) -> DescribeTopicResponse:
        problem = topic_problem(self._context.logs.topics(), request.name)
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
