"""commit_async is bounded: past limits.async_commits_pending_max queued commits it raises.

Method: the async driver's GroupMember over a task group that never runs what it is given
(nothing drains the queue), pointed at a port where nothing listens; queue commits up to the
bound, then one more.
"""

from __future__ import annotations

import pytest

from rivven_broker.client._aio_group import GroupMember
from rivven_broker.client._aio_net import ClientEnv, Signal
from rivven_broker.client.config import ConnectionConfig, ConsumerConfig
from rivven_broker.client.errors import BufferExhaustedError
from rivven_broker.client.types import TopicPartition
from rivven_broker.protocol import limits


class _NeverRuns:
    def __init__(self) -> None:
        self.started = 0

    def start_soon(self, *args: object) -> None:
        self.started += 1


def test_commit_async_refuses_past_the_bound():
    tasks = _NeverRuns()
    member = GroupMember("127.0.0.1:9", ConsumerConfig(group_id="g"), ConnectionConfig(),
                         ClientEnv(), tasks, fetch=None, arrived=Signal())
    offsets = {TopicPartition("t", 0): 5}
    for _ in range(limits.async_commits_pending_max):
        member.commit_async(offsets, None)
    with pytest.raises(BufferExhaustedError):
        member.commit_async(offsets, None)
    assert tasks.started == 1  # one commit task sends the queue, in order
