"""commit_async is bounded: past limits.async_commits_pending_max queued commits it raises.

Method: a GroupMember whose heartbeat thread is never started (nothing drains the queue),
pointed at a port where nothing listens; queue commits up to the bound, then one more.
"""

from __future__ import annotations

import threading

import pytest

from rivven_broker.client._group import GroupMember
from rivven_broker.client.config import ConnectionConfig, ConsumerConfig
from rivven_broker.client.errors import BufferExhaustedError
from rivven_broker.client.types import TopicPartition
from rivven_broker.protocol import limits


def test_commit_async_refuses_past_the_bound(monkeypatch):
    member = GroupMember(
        "127.0.0.1:9",
        ConsumerConfig(group_id="g"),
        ConnectionConfig(),
        threading.Condition(),
        fetch=None,
    )
    monkeypatch.setattr(member, "_start_thread", lambda: None)
    offsets = {TopicPartition("t", 0): 5}
    for _ in range(limits.async_commits_pending_max):
        member.commit_async(offsets, None)
    with pytest.raises(BufferExhaustedError):
        member.commit_async(offsets, None)
