"""What goes into the group coordinator (events) and what comes out (instructions).

Theory of operation
-------------------
The coordinator is a pure state machine: ``GroupCoordinator.handle(event, now_ms)`` returns a
list of instructions and does nothing else. The driver (a trio task in the server, or a test,
or the simulator) owns sockets, timers and the log, and obeys:

Events in

- ``GroupRequest(token, request, client_id, client_host)``: a decoded group request. The
  ``token`` is anything hashable the driver uses to find the connection and correlation id
  when the answer comes, possibly much later (a JoinGroup is held until its round closes).
- ``Tick()``: time passed. Feed one whenever ``next_deadline_ms()`` is reached (feeding more
  is harmless).
- ``Persisted(persist_id)`` / ``PersistFailed(persist_id, error_code)``: the outcome of a
  ``Persist`` instruction.
- ``TxnOffsetsCommitted(group_id, offsets, commit_timestamp_ms)``: the transaction
  coordinator made transactional offset commits visible (their records are already in the
  log, committed by a marker); the coordinator only updates its view.

Instructions out

- ``Respond(token, response)``: send ``response`` for the request behind ``token``.
- ``Persist(persist_id, group_id, records)``: append ``records`` ((key, value or None for a
  tombstone) pairs, ``offsets_codec`` format) as **one** batch to the ``__consumer_offsets``
  partition of ``group_id``; when it is durable (acks=all, fsynced as the topic's policy
  says) feed back ``Persisted(persist_id)``, or ``PersistFailed`` if it cannot be written.
  Persists must be appended in the order they were emitted. Answers that depend on a
  persist (commits, the end of a rebalance, deletions) are only emitted after ``Persisted``,
  so nothing is acknowledged that a restart could forget.

``GroupCoordinatorConfig`` holds the knobs, with defaults and bounds from ``limits``.
"""

from __future__ import annotations

from typing import Hashable

import attrs

from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.group_messages import (
    DeleteGroup,
    DescribeGroup,
    Heartbeat,
    JoinGroup,
    LeaveGroup,
    ListGroups,
    OffsetCommit,
    OffsetFetch,
    SyncGroup,
)
from rivven_broker.protocol.message_base import Response

__all__ = [
    "GroupCoordinatorConfig",
    "GroupRequest",
    "Tick",
    "Persisted",
    "PersistFailed",
    "TxnOffsetsCommitted",
    "Event",
    "Respond",
    "Persist",
    "Instruction",
    "GROUP_REQUEST_TYPES",
]

#: The request classes ``GroupRequest`` may carry (FindCoordinator is the server's).
GROUP_REQUEST_TYPES = (
    JoinGroup,
    SyncGroup,
    Heartbeat,
    LeaveGroup,
    OffsetCommit,
    OffsetFetch,
    ListGroups,
    DescribeGroup,
    DeleteGroup,
)


def _positive(instance: object, attribute: attrs.Attribute, value: int) -> None:
    if type(value) is not int or value < 0:
        raise ValueError(f"{attribute.name} must be a non-negative int, got {value!r}")


@attrs.frozen
class GroupCoordinatorConfig:
    """The coordinator's knobs (broker configuration may lower the ``limits``, not raise)."""

    session_timeout_ms_min: int = attrs.field(
        default=limits.session_timeout_ms_min, validator=_positive
    )
    session_timeout_ms_max: int = attrs.field(
        default=limits.session_timeout_ms_max, validator=_positive
    )
    rebalance_timeout_ms_default: int = attrs.field(
        default=limits.rebalance_timeout_ms_default, validator=_positive
    )
    rebalance_timeout_ms_max: int = attrs.field(
        default=limits.rebalance_timeout_ms_max, validator=_positive
    )
    initial_rebalance_delay_ms: int = attrs.field(
        default=limits.initial_rebalance_delay_ms_default, validator=_positive
    )
    group_members_max: int = attrs.field(default=limits.group_members_max, validator=_positive)
    offset_metadata_bytes_max: int = attrs.field(
        default=limits.offset_metadata_bytes_max, validator=_positive
    )
    offsets_retention_ms: int = attrs.field(
        default=limits.offsets_retention_ms_default, validator=_positive
    )
    offsets_retention_check_interval_ms: int = attrs.field(
        default=limits.offsets_retention_check_interval_ms, validator=_positive
    )

    def __attrs_post_init__(self) -> None:
        if not 0 < self.session_timeout_ms_min <= self.session_timeout_ms_max:
            raise ValueError("session timeout bounds are inverted or zero")
        if self.session_timeout_ms_max > limits.session_timeout_ms_max:
            raise ValueError("session_timeout_ms_max is above limits.session_timeout_ms_max")
        if self.rebalance_timeout_ms_max > limits.rebalance_timeout_ms_max:
            raise ValueError("rebalance_timeout_ms_max is above its limit")
        if self.group_members_max > limits.group_members_max:
            raise ValueError("group_members_max is above limits.group_members_max")
        if self.offset_metadata_bytes_max > limits.offset_metadata_bytes_max:
            raise ValueError("offset_metadata_bytes_max is above its limit")
        if self.offsets_retention_check_interval_ms == 0:
            raise ValueError("offsets_retention_check_interval_ms must be positive")


@attrs.frozen
class GroupRequest:
    """A group request to handle; the answer will name ``token``."""

    token: Hashable
    request: (
        JoinGroup
        | SyncGroup
        | Heartbeat
        | LeaveGroup
        | OffsetCommit
        | OffsetFetch
        | ListGroups
        | DescribeGroup
        | DeleteGroup
    )
    client_id: str = ""
    client_host: str = ""

    def __attrs_post_init__(self) -> None:
        assert isinstance(self.request, GROUP_REQUEST_TYPES), type(self.request)


@attrs.frozen
class Tick:
    """Time has passed; expire what is due."""


@attrs.frozen
class Persisted:
    """The records of ``Persist(persist_id, ...)`` are durable."""

    persist_id: int


@attrs.frozen
class PersistFailed:
    """The records of ``Persist(persist_id, ...)`` could not be made durable."""

    persist_id: int
    error_code: ErrorCode = ErrorCode.COORDINATOR_NOT_AVAILABLE


@attrs.frozen
class TxnOffsetsCommitted:
    """Transactional offsets became visible: (topic, partition, offset, metadata) each."""

    group_id: str
    offsets: tuple[tuple[str, int, int, str | None], ...]
    commit_timestamp_ms: int


Event = GroupRequest | Tick | Persisted | PersistFailed | TxnOffsetsCommitted


@attrs.frozen
class Respond:
    """Send ``response`` for the request behind ``token``."""

    token: Hashable
    response: Response


@attrs.frozen
class Persist:
    """Append ``records`` to ``__consumer_offsets`` as one batch, then report back."""

    persist_id: int
    group_id: str
    records: tuple[tuple[bytes, bytes | None], ...]

    def __attrs_post_init__(self) -> None:
        assert self.records, "a Persist carries at least one record (a batch is never empty)"


Instruction = Respond | Persist
