"""Controller commands: what goes into the Raft log, as msgpack documents.

Every command carries what it expects to find (a boot id, a topic id, an epoch, a count or a
version) and applies only if it finds it. PySyncObj has no client sessions: a command
forwarded to the leader can commit and still be reported ``LEADER_CHANGED`` or
``UNKNOWN_OUTCOME``, and the caller retries it. Because of the expectation, the retry finds
the change already made and applies nothing (it answers ``UNCHANGED``), so no command ever
takes effect twice.

A document is a msgpack map with ``op`` naming the command and the command's fields; unknown
ops and malformed fields raise ``CommandError`` (a log written by a newer version is refused
loudly, never half-applied).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Union

import attrs
import msgpack

__all__ = [
    "CommandError",
    "RegisterBroker",
    "FenceBroker",
    "CreateTopic",
    "DeleteTopic",
    "CreatePartitions",
    "AlterTopicConfigs",
    "ElectLeader",
    "UpdateIsr",
    "AllocateProducerIds",
    "Command",
    "encode_command",
    "decode_command",
]


class CommandError(ValueError):
    """A document that is not a command this version knows."""


def _ints(value: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in value)


def _assignment(value: Any) -> tuple[tuple[int, ...], ...]:
    return tuple(_ints(replicas) for replicas in value)


def _configs(value: Any) -> Mapping[str, str]:
    return {str(k): str(v) for k, v in dict(value).items()}


def _integer() -> Any:
    return attrs.field(validator=attrs.validators.instance_of(int))


def _text() -> Any:
    return attrs.field(validator=attrs.validators.instance_of(str))


@attrs.frozen
class RegisterBroker:
    """A broker process announces itself; a newer ``boot_id`` replaces an older one."""

    op: ClassVar[str] = "register_broker"
    broker_id: int = _integer()
    boot_id: int = _integer()
    host: str = _text()
    port: int = _integer()
    rack: str | None = None
    voter: bool = False


@attrs.frozen
class FenceBroker:
    """The process ``boot_id`` of ``broker_id`` is gone (SWIM saw it die or restart)."""

    op: ClassVar[str] = "fence_broker"
    broker_id: int = _integer()
    boot_id: int = _integer()


@attrs.frozen
class CreateTopic:
    """``topic_id`` is chosen by the proposer: a retry carries the same one."""

    op: ClassVar[str] = "create_topic"
    name: str = _text()
    topic_id: str = _text()
    assignment: tuple[tuple[int, ...], ...] = attrs.field(converter=_assignment)
    configs: Mapping[str, str] = attrs.field(factory=dict, converter=_configs)


@attrs.frozen
class DeleteTopic:
    op: ClassVar[str] = "delete_topic"
    name: str = _text()
    topic_id: str = _text()


@attrs.frozen
class CreatePartitions:
    """Append partitions to a topic that has ``expected_count``."""

    op: ClassVar[str] = "create_partitions"
    name: str = _text()
    topic_id: str = _text()
    expected_count: int = _integer()
    assignment: tuple[tuple[int, ...], ...] = attrs.field(converter=_assignment)


@attrs.frozen
class AlterTopicConfigs:
    """Replace a topic's configs, if they are still at ``expected_version``."""

    op: ClassVar[str] = "alter_topic_configs"
    name: str = _text()
    topic_id: str = _text()
    expected_version: int = _integer()
    configs: Mapping[str, str] = attrs.field(converter=_configs)


@attrs.frozen
class ElectLeader:
    """Make ``leader`` (or nobody: -1) the leader, if the leader epoch is still
    ``expected_leader_epoch``; the new ISR comes with it (the leader is always in it)."""

    op: ClassVar[str] = "elect_leader"
    topic: str = _text()
    partition: int = _integer()
    expected_leader_epoch: int = _integer()
    leader: int = _integer()
    isr: tuple[int, ...] = attrs.field(converter=_ints)


@attrs.frozen
class UpdateIsr:
    """The leader of ``leader_epoch`` changes the ISR of the record at ``expected_partition_epoch``
    (Kafka's AlterPartition)."""

    op: ClassVar[str] = "update_isr"
    topic: str = _text()
    partition: int = _integer()
    leader_epoch: int = _integer()
    expected_partition_epoch: int = _integer()
    isr: tuple[int, ...] = attrs.field(converter=_ints)


@attrs.frozen
class AllocateProducerIds:
    """Give ``broker_id`` the producer ids ``[expected_next, expected_next + count)``, if the
    cluster's next free producer id is still ``expected_next`` (Kafka's AllocateProducerIds,
    KIP-730): idempotent and transactional producers get ids no other broker hands out."""

    op: ClassVar[str] = "allocate_producer_ids"
    broker_id: int = _integer()
    #: Chosen by the proposer, new per allocation (a retry carries the same one): two
    #: allocations of one broker racing at the same ``expected_next`` are told apart.
    request_id: int = _integer()
    expected_next: int = _integer()
    count: int = _integer()


Command = Union[
    RegisterBroker, FenceBroker, CreateTopic, DeleteTopic, CreatePartitions, AlterTopicConfigs,
    ElectLeader, UpdateIsr, AllocateProducerIds,
]
_BY_OP: dict[str, type] = {cls.op: cls for cls in (
    RegisterBroker, FenceBroker, CreateTopic, DeleteTopic, CreatePartitions, AlterTopicConfigs,
    ElectLeader, UpdateIsr, AllocateProducerIds,
)}


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: value[k] for k in sorted(value)}
    return value


def encode_command(command: Command) -> bytes:
    document = {"op": command.op}
    for field in attrs.fields(type(command)):
        document[field.name] = _plain(getattr(command, field.name))
    return msgpack.packb(document)


def decode_command(data: bytes) -> Command:
    try:
        document = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (ValueError, msgpack.UnpackException) as exc:
        raise CommandError(f"not a msgpack document: {exc}") from None
    if not isinstance(document, dict):
        raise CommandError("a command is a map")
    op = document.pop("op", None)
    cls = _BY_OP.get(op) if isinstance(op, str) else None
    if cls is None:
        raise CommandError(f"unknown command {op!r}")
    try:
        return cls(**document)
    except (TypeError, ValueError) as exc:
        raise CommandError(f"malformed {op}: {exc}") from None
