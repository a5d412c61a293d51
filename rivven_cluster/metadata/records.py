"""The records of cluster metadata: brokers, topics, partitions, and the image that holds them.

Everything here is immutable. The controller's state machine replaces a record when a command
changes it and publishes a new ``MetadataImage`` (one reference swap), so readers on any task
see one consistent applied state and never a half-applied command.

Epochs, as Kafka names them (KIP-101, KIP-631, KIP-497):

- ``broker_epoch`` is the Raft index of the broker's registration: a new process of the same
  broker registers again and gets a higher one, so a request stamped with an older epoch
  comes from a process that no longer exists;
- ``leader_epoch`` grows by one at every change of a partition's leader (fencing produce,
  fetch and truncation);
- ``partition_epoch`` grows at every change of the partition's record (leader, ISR,
  replicas): the version an ISR update compares against.

Producer ids are the cluster's too: ``next_producer_id`` is the first id no broker has been
given, and ``producer_id_blocks`` the last block each broker got, ``(request id, start,
end)`` (so a retried allocation finds its own block). They start at ``FIRST_CLUSTER_PRODUCER_ID``, 2**32, above every id a
broker could have handed out on its own before it joined a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import attrs

__all__ = [
    "NO_LEADER",
    "FIRST_CLUSTER_PRODUCER_ID",
    "BrokerRecord",
    "PartitionRecord",
    "TopicRecord",
    "MetadataImage",
    "EMPTY_IMAGE",
]

NO_LEADER = -1
FIRST_CLUSTER_PRODUCER_ID = 1 << 32


@attrs.frozen
class BrokerRecord:
    """A registered broker: who it is, where clients reach it, whether it votes."""

    broker_id: int
    boot_id: int
    broker_epoch: int
    host: str
    port: int
    rack: str | None = None
    voter: bool = False
    fenced: bool = False


@attrs.frozen
class PartitionRecord:
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int = 0
    partition_epoch: int = 0

    def problems(self) -> list[str]:
        """What is wrong with this record (empty when it is sound)."""
        found = []
        if not self.replicas:
            found.append("no replicas")
        if len(set(self.replicas)) != len(self.replicas):
            found.append(f"replicas repeat a broker: {list(self.replicas)}")
        if not set(self.isr) <= set(self.replicas):
            found.append(f"ISR {list(self.isr)} is not within replicas {list(self.replicas)}")
        if len(set(self.isr)) != len(self.isr):
            found.append(f"ISR repeats a broker: {list(self.isr)}")
        if self.leader != NO_LEADER and self.leader not in self.isr:
            found.append(f"leader {self.leader} is not in the ISR {list(self.isr)}")
        if self.leader_epoch < 0 or self.partition_epoch < self.leader_epoch:
            found.append(f"epochs out of order: leader {self.leader_epoch}, "
                         f"partition {self.partition_epoch}")
        return found


@attrs.frozen
class TopicRecord:
    name: str
    topic_id: str
    partitions: tuple[PartitionRecord, ...]
    configs: Mapping[str, str] = attrs.field(factory=dict, converter=lambda c: MappingProxyType(dict(c)))
    config_version: int = 0

    @property
    def replication_factor(self) -> int:
        return len(self.partitions[0].replicas) if self.partitions else 0


@attrs.frozen
class MetadataImage:
    """The applied metadata at one Raft index: what every broker answers Metadata from."""

    applied_index: int
    brokers: Mapping[int, BrokerRecord]
    topics: Mapping[str, TopicRecord]
    next_producer_id: int = FIRST_CLUSTER_PRODUCER_ID
    producer_id_blocks: Mapping[int, tuple[int, int, int]] = MappingProxyType({})

    def broker(self, broker_id: int) -> BrokerRecord | None:
        return self.brokers.get(broker_id)

    def topic(self, name: str) -> TopicRecord | None:
        return self.topics.get(name)

    def partition(self, topic: str, partition: int) -> PartitionRecord | None:
        record = self.topics.get(topic)
        if record is None or not 0 <= partition < len(record.partitions):
            return None
        return record.partitions[partition]

    def replicas_of(self, broker_id: int) -> list[tuple[str, int]]:
        """The partitions with a replica on ``broker_id``, in name order."""
        return [(name, index)
                for name in sorted(self.topics)
                for index, part in enumerate(self.topics[name].partitions)
                if broker_id in part.replicas]


EMPTY_IMAGE = MetadataImage(applied_index=0, brokers=MappingProxyType({}),
                            topics=MappingProxyType({}))
