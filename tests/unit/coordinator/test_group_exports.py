"""The consumer-group surface of rivven_broker.coordinator is deliberate.

Method: pin the group names the package exports (the package also hosts producer state and
transactions, whose names their own tests pin), check every exported name resolves, and check
each group module says what it owns: a "Theory of operation" docstring, an ``__all__`` whose
names exist, a size under the house limit.
"""

from __future__ import annotations

import importlib
import pathlib

import pytest

import rivven_broker.coordinator as coordinator

GROUP_NAMES = """
GroupCoordinator GroupCoordinatorConfig CoordinatorStatistics GroupState GROUP_REQUEST_TYPES
Event GroupRequest Tick Persisted PersistFailed TxnOffsetsCommitted Instruction Respond Persist
OFFSETS_TOPIC CorruptOffsetsRecordError OffsetKey GroupKey OffsetValue GroupValue MemberValue
encode_key decode_key encode_offset_value decode_offset_value encode_group_value
decode_group_value offsets_partition_for
""".split()
GROUP_MODULES = [
    "rivven_broker.coordinator",
    "rivven_broker.coordinator.group_coordinator",
    "rivven_broker.coordinator.group_membership",
    "rivven_broker.coordinator.group_offsets",
    "rivven_broker.coordinator.group_state",
    "rivven_broker.coordinator.group_events",
    "rivven_broker.coordinator.offsets_codec",
    "rivven_broker.protocol.group_messages",
    "rivven_broker.protocol.consumer_protocol",
    "rivven_broker.protocol.assignors",
    "rivven_broker.storage.compaction",
]


def test_group_names_are_exported():
    assert set(GROUP_NAMES) <= set(coordinator.__all__)
    assert len(coordinator.__all__) == len(set(coordinator.__all__))
    for name in coordinator.__all__:
        assert getattr(coordinator, name, None) is not None, name


@pytest.mark.parametrize("name", GROUP_MODULES)
def test_every_group_module_says_what_it_owns(name):
    module = importlib.import_module(name)
    assert module.__doc__ and "Theory of operation" in module.__doc__, name
    assert module.__all__, name
    for exported in module.__all__:
        assert hasattr(module, exported), (name, exported)
    lines = pathlib.Path(module.__file__).read_text().count("\n")
    assert lines < 650, f"{name} has {lines} lines"
