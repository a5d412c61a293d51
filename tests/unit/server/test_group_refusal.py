"""``group_driver.refusal``: a group request for a group this broker does not coordinate is
answered with its own response type, carrying the code where the client looks for it."""

from __future__ import annotations

import pytest

from rivven_broker.coordinator.group_events import GROUP_REQUEST_TYPES
from rivven_broker.client.group_admin import coordinator_code
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.group_messages import (
    DeleteGroup,
    DescribeGroup,
    Heartbeat,
    JoinGroup,
    JoinGroupProtocol,
    LeaveGroup,
    ListGroups,
    OffsetCommit,
    OffsetCommitPartition,
    OffsetCommitTopic,
    OffsetFetch,
    SyncGroup,
)
from rivven_broker.server.group_driver import refusal

REQUESTS = [
    JoinGroup("g", "m-1", protocols=(JoinGroupProtocol("range", b""),)),
    SyncGroup("g", 3, "m-1"),
    Heartbeat("g", 3, "m-1"),
    LeaveGroup("g"),
    OffsetCommit("g", topics=(OffsetCommitTopic("t", (OffsetCommitPartition(0, 5),
                                                      OffsetCommitPartition(1, 7))),)),
    OffsetFetch("g", all_topics=True),
    DescribeGroup("g"),
    DeleteGroup("g"),
]


def test_every_group_request_but_listgroups_is_covered():
    assert {type(r) for r in REQUESTS} == set(GROUP_REQUEST_TYPES) - {ListGroups}


@pytest.mark.parametrize("request_", REQUESTS, ids=lambda r: type(r).__name__)
@pytest.mark.parametrize("code", [ErrorCode.NOT_COORDINATOR,
                                  ErrorCode.COORDINATOR_LOAD_IN_PROGRESS])
def test_refusal_is_the_requests_own_answer_with_the_code(request_, code):
    answer = refusal(request_, code)
    assert answer.API_KEY == request_.API_KEY
    assert coordinator_code(answer) == code
    if isinstance(request_, OffsetCommit):  # every partition named gets the code
        assert [p.partition for p in answer.topics[0].partitions] == [0, 1]
        assert {p.error_code for p in answer.topics[0].partitions} == {code}
    if isinstance(request_, JoinGroup):
        assert answer.member_id == "m-1"
