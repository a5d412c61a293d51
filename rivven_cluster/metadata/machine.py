"""The controller's state machine: applies committed commands to the cluster metadata.

Theory of operation
-------------------
Raft orders the commands; every node applies the same commands in the same order to a
``MetadataMachine`` and so holds the same metadata. ``apply(command, index)`` is pure and
deterministic: no clock, no randomness, no I/O; everything a decision needs is in the command
(the proposer chose topic ids and assignments before proposing). It answers an ``Outcome``:

- ``APPLIED``: the command changed the metadata;
- ``UNCHANGED``: the metadata already is what the command asks for (a retried command);
- ``CONFLICT``: what the command expects is no longer true (an epoch or version moved on, the
  name is taken by another topic id): the proposer re-reads and decides again;
- ``NOT_FOUND``: no such broker, topic or partition;
- ``INVALID``: the command can never apply (a replica that is not a registered broker ...).

Only ``APPLIED`` changes anything. After every change the touched records are checked (leader
in the ISR, ISR within the replicas, epochs never go back); ``check_invariants`` checks
everything, for tests and the simulator. A violated invariant is a bug in the proposer or
here, so it raises ``AssertionError`` rather than becoming an outcome.

``snapshot()``/``restore()`` serialise the whole state (msgpack) for Raft log compaction.
``image()`` is the immutable view published to readers.
"""

from __future__ import annotations

import enum
from types import MappingProxyType
from typing import Any

import attrs
import msgpack

from rivven_cluster.metadata.commands import (
    AllocateProducerIds,
    AlterTopicConfigs,
    Command,
    CreatePartitions,
    CreateTopic,
    DeleteTopic,
    ElectLeader,
    FenceBroker,
    RegisterBroker,
    UpdateIsr,
)
from rivven_cluster.metadata.records import (
    FIRST_CLUSTER_PRODUCER_ID,
    NO_LEADER,
    BrokerRecord,
    MetadataImage,
    PartitionRecord,
    TopicRecord,
)

__all__ = ["Status", "Outcome", "MetadataMachine", "SNAPSHOT_VERSION", "PRODUCER_ID_BLOCK_MAX"]

SNAPSHOT_VERSION = 1
#: The largest producer id block one allocation may take.
PRODUCER_ID_BLOCK_MAX = 1_000_000


class Status(enum.Enum):
    APPLIED = "applied"
    UNCHANGED = "unchanged"
    CONFLICT = "conflict"
    NOT_FOUND = "not_found"
    INVALID = "invalid"

    @property
    def ok(self) -> bool:
        return self in (Status.APPLIED, Status.UNCHANGED)


@attrs.frozen
class Outcome:
    status: Status
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status.ok


_APPLIED = Outcome(Status.APPLIED)


def _unchanged(why: str) -> Outcome:
    return Outcome(Status.UNCHANGED, why)


def _conflict(why: str) -> Outcome:
    return Outcome(Status.CONFLICT, why)


def _not_found(why: str) -> Outcome:
    return Outcome(Status.NOT_FOUND, why)


def _invalid(why: str) -> Outcome:
    return Outcome(Status.INVALID, why)


class MetadataMachine:
    def __init__(self) -> None:
        self.applied_index = 0
        self._brokers: dict[int, BrokerRecord] = {}
        self._topics: dict[str, TopicRecord] = {}
        self._next_producer_id = FIRST_CLUSTER_PRODUCER_ID
        self._producer_id_blocks: dict[int, tuple[int, int, int]] = {}
        self._image: MetadataImage | None = None

    # -- reading -----------------------------------------------------------------------------

    def image(self) -> MetadataImage:
        if self._image is None:
            self._image = MetadataImage(
                applied_index=self.applied_index,
                brokers=MappingProxyType(dict(self._brokers)),
                topics=MappingProxyType(dict(self._topics)),
                next_producer_id=self._next_producer_id,
                producer_id_blocks=MappingProxyType(dict(self._producer_id_blocks)),
            )
        return self._image

    # -- applying ----------------------------------------------------------------------------

    def apply(self, command: Command, index: int) -> Outcome:
        """Apply the command committed at Raft ``index`` (indexes only grow)."""
        assert index > self.applied_index, f"index {index} applied after {self.applied_index}"
        self.applied_index = index
        self._image = None
        handler = getattr(self, f"_{command.op}")
        return handler(command, index)

    def _register_broker(self, command: RegisterBroker, index: int) -> Outcome:
        known = self._brokers.get(command.broker_id)
        if known is not None:
            if command.boot_id < known.boot_id:
                return _conflict(f"broker {command.broker_id} has registered a newer process")
            if command.boot_id == known.boot_id:
                same = (known.host, known.port, known.rack, known.voter) == (
                    command.host, command.port, command.rack, command.voter)
                if known.fenced or not same:
                    return _conflict(f"broker {command.broker_id} boot {command.boot_id} is "
                                     f"{'fenced' if known.fenced else 'registered otherwise'}")
                return _unchanged("registered")
        if not command.host or not 0 < command.port < 65536:
            return _invalid(f"broker {command.broker_id} advertises no usable address")
        self._brokers[command.broker_id] = BrokerRecord(
            broker_id=command.broker_id, boot_id=command.boot_id, broker_epoch=index,
            host=command.host, port=command.port, rack=command.rack, voter=command.voter)
        return _APPLIED

    def _fence_broker(self, command: FenceBroker, index: int) -> Outcome:
        known = self._brokers.get(command.broker_id)
        if known is None:
            return _not_found(f"broker {command.broker_id} is not registered")
        if known.boot_id != command.boot_id:
            return _conflict(f"broker {command.broker_id} runs another process")
        if known.fenced:
            return _unchanged("fenced")
        self._brokers[command.broker_id] = attrs.evolve(known, fenced=True)
        return _APPLIED

    def _check_assignment(self, assignment: tuple[tuple[int, ...], ...],
                          width: int | None = None) -> str | None:
        if not assignment:
            return "a topic has at least one partition"
        width = len(assignment[0]) if width is None else width
        for replicas in assignment:
            if len(replicas) != width:
                return "every partition of a topic has the same number of replicas"
            if not replicas or len(set(replicas)) != len(replicas):
                return f"replicas {list(replicas)} must be distinct and at least one"
            unknown = [b for b in replicas if b not in self._brokers]
            if unknown:
                return f"replicas {unknown} are not registered brokers"
        return None

    @staticmethod
    def _new_partitions(assignment: tuple[tuple[int, ...], ...]) -> tuple[PartitionRecord, ...]:
        # A new replica is empty, so every replica starts in sync; the first one leads.
        return tuple(PartitionRecord(replicas=r, isr=r, leader=r[0]) for r in assignment)

    def _create_topic(self, command: CreateTopic, index: int) -> Outcome:
        known = self._topics.get(command.name)
        if known is not None:
            if known.topic_id == command.topic_id:
                return _unchanged("created")
            return _conflict(f"topic {command.name!r} already exists")
        if any(t.topic_id == command.topic_id for t in self._topics.values()):
            return _invalid(f"topic id {command.topic_id} is taken")
        problem = self._check_assignment(command.assignment)
        if problem:
            return _invalid(problem)
        record = TopicRecord(name=command.name, topic_id=command.topic_id,
                             partitions=self._new_partitions(command.assignment),
                             configs=command.configs)
        self._check_topic(record)
        self._topics[command.name] = record
        return _APPLIED

    def _named(self, name: str, topic_id: str) -> TopicRecord | Outcome:
        known = self._topics.get(name)
        if known is None or known.topic_id != topic_id:
            return _not_found(f"no topic {name!r} with id {topic_id}")
        return known

    def _delete_topic(self, command: DeleteTopic, index: int) -> Outcome:
        known = self._named(command.name, command.topic_id)
        if isinstance(known, Outcome):
            return known
        del self._topics[command.name]
        return _APPLIED

    def _create_partitions(self, command: CreatePartitions, index: int) -> Outcome:
        known = self._named(command.name, command.topic_id)
        if isinstance(known, Outcome):
            return known
        have = len(known.partitions)
        wanted = command.expected_count + len(command.assignment)
        if have == wanted and have > command.expected_count and tuple(
                p.replicas for p in known.partitions[command.expected_count:]) == command.assignment:
            return _unchanged("created")
        if have != command.expected_count:
            return _conflict(f"topic {command.name!r} has {have} partitions, "
                             f"not {command.expected_count}")
        problem = self._check_assignment(command.assignment, known.replication_factor)
        if problem:
            return _invalid(problem)
        record = attrs.evolve(known, partitions=known.partitions
                              + self._new_partitions(command.assignment))
        self._check_topic(record)
        self._topics[command.name] = record
        return _APPLIED

    def _alter_topic_configs(self, command: AlterTopicConfigs, index: int) -> Outcome:
        known = self._named(command.name, command.topic_id)
        if isinstance(known, Outcome):
            return known
        if known.config_version != command.expected_version:
            if (known.config_version == command.expected_version + 1
                    and dict(known.configs) == dict(command.configs)):
                return _unchanged("altered")
            return _conflict(f"configs of {command.name!r} are at version "
                             f"{known.config_version}, not {command.expected_version}")
        self._topics[command.name] = attrs.evolve(
            known, configs=command.configs, config_version=known.config_version + 1)
        return _APPLIED

    def _partition(self, topic: str, partition: int) -> tuple[TopicRecord, PartitionRecord] | Outcome:
        known = self._topics.get(topic)
        if known is None or not 0 <= partition < len(known.partitions):
            return _not_found(f"no partition {topic}/{partition}")
        return known, known.partitions[partition]

    def _replace(self, known: TopicRecord, partition: int, record: PartitionRecord) -> None:
        before = known.partitions[partition]
        assert record.leader_epoch >= before.leader_epoch, "leader epoch went back"
        assert record.partition_epoch > before.partition_epoch, "partition epoch did not grow"
        problems = record.problems()
        assert not problems, f"{known.name}/{partition}: {problems}"
        parts = list(known.partitions)
        parts[partition] = record
        self._topics[known.name] = attrs.evolve(known, partitions=tuple(parts))

    def _elect_leader(self, command: ElectLeader, index: int) -> Outcome:
        found = self._partition(command.topic, command.partition)
        if isinstance(found, Outcome):
            return found
        known, part = found
        if part.leader_epoch != command.expected_leader_epoch:
            if (part.leader_epoch == command.expected_leader_epoch + 1
                    and (part.leader, part.isr) == (command.leader, command.isr)):
                return _unchanged("elected")
            return _conflict(f"{command.topic}/{command.partition} is at leader epoch "
                             f"{part.leader_epoch}, not {command.expected_leader_epoch}")
        isr = command.isr
        if command.leader != NO_LEADER and command.leader not in isr:
            return _invalid(f"leader {command.leader} must be in the ISR {list(isr)}")
        if _strays(isr, part):
            return _invalid(f"ISR {list(isr)} must be distinct replicas of {list(part.replicas)}")
        if command.leader == NO_LEADER and not isr:
            isr = part.isr  # offline: the last ISR is kept, it says who may lead again
        self._replace(known, command.partition, attrs.evolve(
            part, leader=command.leader, isr=isr, leader_epoch=part.leader_epoch + 1,
            partition_epoch=part.partition_epoch + 1))
        return _APPLIED

    def _update_isr(self, command: UpdateIsr, index: int) -> Outcome:
        found = self._partition(command.topic, command.partition)
        if isinstance(found, Outcome):
            return found
        known, part = found
        if part.leader_epoch != command.leader_epoch:
            return _conflict(f"{command.topic}/{command.partition} is at leader epoch "
                             f"{part.leader_epoch}, not {command.leader_epoch}")
        if part.partition_epoch != command.expected_partition_epoch:
            if (part.partition_epoch == command.expected_partition_epoch + 1
                    and part.isr == command.isr):
                return _unchanged("updated")
            return _conflict(f"{command.topic}/{command.partition} is at partition epoch "
                             f"{part.partition_epoch}, not {command.expected_partition_epoch}")
        if part.leader not in command.isr:
            return _invalid(f"the ISR {list(command.isr)} must keep the leader {part.leader}")
        if _strays(command.isr, part):
            return _invalid(f"ISR {list(command.isr)} must be distinct replicas of "
                            f"{list(part.replicas)}")
        self._replace(known, command.partition, attrs.evolve(
            part, isr=command.isr, partition_epoch=part.partition_epoch + 1))
        return _APPLIED

    # -- invariants --------------------------------------------------------------------------

    def _allocate_producer_ids(self, command: AllocateProducerIds, index: int) -> Outcome:
        block = (command.request_id, command.expected_next,
                 command.expected_next + command.count)
        if self._producer_id_blocks.get(command.broker_id) == block:
            return _unchanged("allocated")  # a retry of the allocation that applied
        if command.broker_id not in self._brokers:
            return _not_found(f"broker {command.broker_id} is not registered")
        if not 1 <= command.count <= PRODUCER_ID_BLOCK_MAX:
            return _invalid(f"a producer id block holds 1..{PRODUCER_ID_BLOCK_MAX} ids")
        if command.expected_next != self._next_producer_id:
            return _conflict(f"the next producer id is {self._next_producer_id}")
        self._producer_id_blocks[command.broker_id] = block
        self._next_producer_id = block[2]
        return _APPLIED

    @staticmethod
    def _check_topic(record: TopicRecord) -> None:
        for index, part in enumerate(record.partitions):
            problems = part.problems()
            assert not problems, f"{record.name}/{index}: {problems}"

    def check_invariants(self) -> None:
        """Every record sound, topic ids unique, replicas on registered brokers."""
        ids = [t.topic_id for t in self._topics.values()]
        assert len(ids) == len(set(ids)), "a topic id is used twice"
        for name, record in self._topics.items():
            assert record.name == name
            self._check_topic(record)
            for part in record.partitions:
                assert set(part.replicas) <= set(self._brokers), "replica on an unknown broker"
        for broker_id, broker in self._brokers.items():
            assert broker.broker_id == broker_id
            assert broker.broker_epoch <= self.applied_index
        blocks = sorted((start, end) for _, start, end in self._producer_id_blocks.values())
        for (_, end), (start, _) in zip(blocks, blocks[1:]):
            assert end <= start, "two brokers hold overlapping producer ids"
        assert all(FIRST_CLUSTER_PRODUCER_ID <= start < end <= self._next_producer_id
                   for start, end in blocks), "a producer id block beyond the next free id"

    # -- snapshots ---------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        brokers = [attrs.astuple(self._brokers[b]) for b in sorted(self._brokers)]
        topics = [[t.name, t.topic_id, {k: t.configs[k] for k in sorted(t.configs)},
                   t.config_version, [attrs.astuple(p) for p in t.partitions]]
                  for t in (self._topics[n] for n in sorted(self._topics))]
        blocks = [[b, *self._producer_id_blocks[b]] for b in sorted(self._producer_id_blocks)]
        return msgpack.packb([SNAPSHOT_VERSION, self.applied_index, brokers, topics,
                              self._next_producer_id, blocks])

    @classmethod
    def restore(cls, data: bytes) -> MetadataMachine:
        """From ``snapshot()`` (a snapshot written before producer ids were the cluster's has
        four fields: its cluster never allocated any)."""
        version, applied, brokers, topics, *producer_ids = msgpack.unpackb(data, raw=False)
        if version != SNAPSHOT_VERSION:
            raise ValueError(f"metadata snapshot version {version} is not {SNAPSHOT_VERSION}")
        machine = cls()
        machine.applied_index = applied
        for fields in brokers:
            record = BrokerRecord(*fields)
            machine._brokers[record.broker_id] = record
        for name, topic_id, configs, config_version, parts in topics:
            machine._topics[name] = TopicRecord(
                name=name, topic_id=topic_id, configs=configs, config_version=config_version,
                partitions=tuple(_partition_record(p) for p in parts))
        if producer_ids:
            machine._next_producer_id, blocks = producer_ids
            machine._producer_id_blocks = {b: (r, start, end) for b, r, start, end in blocks}
        machine.check_invariants()
        return machine


def _strays(isr: tuple[int, ...], part: PartitionRecord) -> bool:
    """Whether ``isr`` repeats a broker or names one that is not a replica."""
    return len(set(isr)) != len(isr) or not set(isr) <= set(part.replicas)


def _partition_record(fields: list[Any]) -> PartitionRecord:
    replicas, isr, leader, leader_epoch, partition_epoch = fields
    return PartitionRecord(replicas=tuple(replicas), isr=tuple(isr), leader=leader,
                           leader_epoch=leader_epoch, partition_epoch=partition_epoch)
