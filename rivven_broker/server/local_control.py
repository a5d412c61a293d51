"""``LocalControl``: the controller of a broker alone — it decides topics by itself.

Theory of operation
-------------------
The handlers ask whoever decides topics through one interface (``control.Control``): Metadata,
CreateTopic, DeleteTopic, AlterTopicConfig, CreatePartitions and auto-creation. On a broker
without ``--peers`` that is this class, and the local topic registry (``topics.json``) is the
commit point, as it always was: everything happens inside the call (one registry fsync on the
event loop: admin actions are rare), except deletion, which first waits for the sync worker to
let go of the topic's files (a *serial* pending: the reader awaits it before reading on).
``cluster/cluster_control.py`` is the other implementation, where the Raft log decides.

This node leads every partition: Metadata lists one broker (itself, at the address clients
reached), leader = this node, leader epoch 0, replicas = isr = [node id]. A replication factor
other than 1 is ``INVALID_REPLICATION_FACTOR`` (-1 means "the default", 1). A partition count
of -1 means the broker's ``default_partitions``. Names are checked per topic
(``INVALID_TOPIC_NAME``); unknown topics are ``UNKNOWN_TOPIC_OR_PARTITION``. Internal topics
cannot be deleted or grown, and a broker holds at most ``limits.partitions_per_broker_max``
partitions in all.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.messages import (
    AlterTopicConfig,
    AlterTopicConfigResponse,
    BrokerMetadata,
    CreatePartitions,
    CreatePartitionsResponse,
    CreateTopic,
    CreateTopicResponse,
    DeleteTopic,
    DeleteTopicResponse,
    Metadata,
    MetadataResponse,
    PartitionMetadata,
    TopicMetadata,
)
from rivven_broker.protocol.names import topic_name_error
from rivven_broker.server.context import Pending, ServerContext
from rivven_broker.server.produce_answers import error_of
from rivven_broker.server.internal_topics import is_internal_topic
from rivven_broker.server.local_topics import LocalTopics
from rivven_broker.storage.errors import StorageError, TopicExistsError
from rivven_broker.storage.topic_config import TopicConfig

__all__ = ["LocalControl", "Problem", "clip", "failure", "topic_problem"]

log = logging.getLogger(__name__)

Problem = tuple[ErrorCode, str]
#: Leaves room in a topic error message for the name.
_MESSAGE_BYTES_MAX = limits.error_message_bytes_max


def clip(message: str) -> str:
    return message.encode()[:_MESSAGE_BYTES_MAX].decode("utf-8", "ignore")


def failure(exc: Exception) -> Problem:
    """The wire code and message of an operating error of an administrative request (the data
    path's, clipped to leave room for the topic name)."""
    code, message = error_of(exc)
    return code, clip(message)


def topic_problem(topics: Mapping[str, object], name: str) -> Problem | None:
    """INVALID_TOPIC_NAME or UNKNOWN_TOPIC_OR_PARTITION, or None when ``name`` is a topic."""
    if topic_name_error(name) is not None:
        return ErrorCode.INVALID_TOPIC_NAME, "invalid topic name"
    if name not in topics:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}"
    return None


class LocalControl:
    def __init__(self, context: ServerContext, local: LocalTopics) -> None:
        self._context = context
        self._local = local

    # --- metadata --------------------------------------------------------------------------

    def metadata(self, request: Metadata, now_ms: int) -> MetadataResponse:
        context = self._context
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
                    error = self.auto_create(name, now_ms)
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

    def auto_create(self, name: str, now_ms: int) -> Problem | None:
        """Create ``name`` with the default layout; None when it exists afterwards."""
        partitions = self._context.config.default_partitions
        if name not in self._context.logs.topics():
            problem = self._room_problem(partitions)
            if problem is not None:
                return problem
        try:
            self._local.create(name, partitions, 1, {}, now_ms)
        except TopicExistsError:
            return None
        except (StorageError, OSError) as exc:
            return failure(exc)
        log.info("auto-created topic %s (%d partitions)", name, partitions)
        return None

    # --- topics ----------------------------------------------------------------------------

    def _room_problem(self, added: int) -> Problem | None:
        """INVALID_PARTITIONS when ``added`` more partitions would take the broker past
        ``limits.partitions_per_broker_max`` (every topic counts, the broker's own too)."""
        held = sum(info.partitions for info in self._context.logs.topics().values())
        if held + added <= limits.partitions_per_broker_max:
            return None
        return (ErrorCode.INVALID_PARTITIONS,
                f"the broker holds {held} partitions; {added} more would pass its limit of "
                f"{limits.partitions_per_broker_max}")

    def _create_problem(self, request: CreateTopic, partitions: int) -> Problem | None:
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

    def create_topic(self, request: CreateTopic, now_ms: int) -> CreateTopicResponse:
        name = request.name
        partitions = request.partitions
        if partitions == -1:
            partitions = self._context.config.default_partitions
        problem = self._create_problem(request, partitions)
        if problem is not None:
            code, message = problem
            return CreateTopicResponse(
                name, code, clip(message), partitions, request.replication_factor
            )
        try:
            if request.validate_only:
                TopicConfig.parse(request.configs)
            else:
                self._local.create(name, partitions, 1, request.configs, now_ms)
                log.info("created topic %s with %d partitions", name, partitions)
        except (StorageError, OSError) as exc:
            code, message = failure(exc)
            return CreateTopicResponse(name, code, message, partitions, 1)
        return CreateTopicResponse(name, ErrorCode.NONE, None, partitions, 1)

    def topic_problem(self, name: str) -> Problem | None:
        return topic_problem(self._context.logs.topics(), name)

    def delete_topic(self, request: DeleteTopic, now_ms: int) -> DeleteTopicResponse | Pending:
        problem = self.topic_problem(request.name)
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
                return DeleteTopicResponse(name, *failure(exc))
            log.info("deleted topic %s", name)
            return DeleteTopicResponse(name, ErrorCode.NONE)

        return Pending(run, serial=True)

    def alter_topic_config(self, request: AlterTopicConfig,
                           now_ms: int) -> AlterTopicConfigResponse:
        problem = self.topic_problem(request.name)
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
            return AlterTopicConfigResponse(name, *failure(exc))
        if not request.validate_only:
            log.info("altered topic %s: %s", name, dict(request.configs))
        return AlterTopicConfigResponse(name, ErrorCode.NONE)

    def create_partitions(self, request: CreatePartitions,
                          now_ms: int) -> CreatePartitionsResponse:
        name = request.name
        problem = self.topic_problem(name)
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
            self._local.grow(name, request.count, now_ms)
        except (StorageError, OSError) as exc:
            code, message = failure(exc)
            return CreatePartitionsResponse(name, code, message, logs.topics()[name].partitions)
        log.info("grew topic %s from %d to %d partitions", name, current, request.count)
        return CreatePartitionsResponse(name, ErrorCode.NONE, None, request.count)
