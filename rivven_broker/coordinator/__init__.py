"""Coordinators: consumer groups (and, alongside, producer state and transactions).

Theory of operation
-------------------
Each coordinator is a pure state machine in the dask ``worker_state_machine`` style:
``handle(event, now_ms) -> list[Instruction]``, ``next_deadline_ms()``, ``check_invariants()``
and ``statistics()``; the trio driver in ``rivven_broker.server`` feeds it requests, ticks and
the outcomes of the appends it asked for, and carries out its instructions. State that must
survive a restart lives only in an internal compacted topic (``__consumer_offsets`` for
groups, format in ``offsets_codec``), which the coordinator replays on start (``load``).

Group modules: ``group_events`` (events, instructions, config), ``group_state`` (one group),
``group_coordinator`` (membership and rebalances), ``group_offsets`` (commits, fetches,
deletion, expiry, loading), ``offsets_codec`` (record format). The assignors and the consumer
protocol's bytes live in ``rivven_broker.protocol`` because clients run them.
"""

from rivven_broker.coordinator.group_coordinator import CoordinatorStatistics, GroupCoordinator
from rivven_broker.coordinator.group_events import (
    GROUP_REQUEST_TYPES,
    Event,
    GroupCoordinatorConfig,
    GroupRequest,
    Instruction,
    Persist,
    Persisted,
    PersistFailed,
    Respond,
    Tick,
    TxnOffsetsCommitted,
)
from rivven_broker.coordinator.group_state import GroupState
from rivven_broker.coordinator.offsets_codec import (
    OFFSETS_TOPIC,
    CorruptOffsetsRecordError,
    GroupKey,
    GroupValue,
    MemberValue,
    OffsetKey,
    OffsetValue,
    decode_group_value,
    decode_key,
    decode_offset_value,
    encode_group_value,
    encode_key,
    encode_offset_value,
    offsets_partition_for,
)

__all__ = [
    # consumer groups
    "GroupCoordinator",
    "GroupCoordinatorConfig",
    "CoordinatorStatistics",
    "GroupState",
    "GROUP_REQUEST_TYPES",
    "Event",
    "GroupRequest",
    "Tick",
    "Persisted",
    "PersistFailed",
    "TxnOffsetsCommitted",
    "Instruction",
    "Respond",
    "Persist",
    # __consumer_offsets records
    "OFFSETS_TOPIC",
    "CorruptOffsetsRecordError",
    "OffsetKey",
    "GroupKey",
    "OffsetValue",
    "GroupValue",
    "MemberValue",
    "encode_key",
    "decode_key",
    "encode_offset_value",
    "decode_offset_value",
    "encode_group_value",
    "decode_group_value",
    "offsets_partition_for",
]
