"""Cluster metadata: the controller's state machine, its commands and its records.

Theory of operation
-------------------
``commands`` are what the Raft log holds (msgpack documents, each a compare-and-set);
``machine.MetadataMachine`` applies them in log order and answers an ``Outcome``;
``records`` are the immutable brokers, topics and partitions, gathered in a ``MetadataImage``
that readers take by reference. The Raft host (``rivven_broker.server.cluster``) orders the
commands; nothing here knows about Raft, time or I/O.
"""

from rivven_cluster.metadata.commands import (
    AllocateProducerIds,
    AlterTopicConfigs,
    Command,
    CommandError,
    CreatePartitions,
    CreateTopic,
    DeleteTopic,
    ElectLeader,
    FenceBroker,
    RegisterBroker,
    UpdateIsr,
    decode_command,
    encode_command,
)
from rivven_cluster.metadata.machine import MetadataMachine, Outcome, Status
from rivven_cluster.metadata.records import (
    EMPTY_IMAGE,
    FIRST_CLUSTER_PRODUCER_ID,
    NO_LEADER,
    BrokerRecord,
    MetadataImage,
    PartitionRecord,
    TopicRecord,
)

__all__ = [
    "AllocateProducerIds",
    "AlterTopicConfigs",
    "Command",
    "CommandError",
    "CreatePartitions",
    "CreateTopic",
    "DeleteTopic",
    "ElectLeader",
    "FenceBroker",
    "RegisterBroker",
    "UpdateIsr",
    "decode_command",
    "encode_command",
    "MetadataMachine",
    "Outcome",
    "Status",
    "EMPTY_IMAGE",
    "FIRST_CLUSTER_PRODUCER_ID",
    "NO_LEADER",
    "BrokerRecord",
    "MetadataImage",
    "PartitionRecord",
    "TopicRecord",
]
