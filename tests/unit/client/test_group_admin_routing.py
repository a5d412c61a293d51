"""Admin's group calls in a cluster: which answers mean "find the coordinator again", and how
every broker's ListGroups answer is merged."""

from __future__ import annotations

from rivven_broker.client.group_admin import GroupListing, coordinator_code, merged_listings
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.group_messages import (
    DescribeGroupResponse,
    FindCoordinatorResponse,
    GroupListing as Listed,
    ListGroupsResponse,
    OffsetCommitPartitionResponse,
    OffsetCommitResponse,
    OffsetCommitTopicResponse,
    OffsetFetchResponse,
)


def test_coordinator_codes_ask_for_the_coordinator_again():
    for code in (ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                 ErrorCode.COORDINATOR_NOT_AVAILABLE):
        assert coordinator_code(FindCoordinatorResponse(code)) == code
        assert coordinator_code(DescribeGroupResponse("g", code)) == code
        assert coordinator_code(OffsetFetchResponse(code)) == code
        commit = OffsetCommitResponse((OffsetCommitTopicResponse(
            "t", (OffsetCommitPartitionResponse(0, code),)),))
        assert coordinator_code(commit) == code


def test_other_answers_are_final():
    assert coordinator_code(DescribeGroupResponse("g", ErrorCode.NONE)) is None
    assert coordinator_code(DescribeGroupResponse("g", ErrorCode.GROUP_ID_NOT_FOUND)) is None
    assert coordinator_code(OffsetCommitResponse(())) is None
    assert coordinator_code(FindCoordinatorResponse(ErrorCode.NONE, 1, "h", 1)) is None


def test_listings_of_every_broker_merge_once_each_sorted():
    first = ListGroupsResponse(ErrorCode.NONE, (Listed("b", "consumer", "Stable"),))
    second = ListGroupsResponse(ErrorCode.NONE, (Listed("a", "", "Empty"),
                                                 Listed("b", "consumer", "Stable")))
    assert merged_listings([first, second]) == [GroupListing("a", "", "Empty"),
                                                GroupListing("b", "consumer", "Stable")]


def test_the_search_retries_moves_with_backoff_until_its_deadline():
    import random

    import pytest

    from rivven_broker.client.errors import RivvenError
    from rivven_broker.client.group_admin import COORDINATOR_WAIT_MS, CoordinatorSearch

    search = CoordinatorSearch("g", 0, random.Random(1))
    moved = search.answered(DescribeGroupResponse("g", ErrorCode.NOT_COORDINATOR), "call")
    assert moved is not None and moved.retriable
    assert search.answered(DescribeGroupResponse("g", ErrorCode.NONE), "call") is None
    with pytest.raises(RivvenError):  # a final FindCoordinator error is raised at once
        search.answered(FindCoordinatorResponse(ErrorCode.INVALID_GROUP_ID), "find")
    waits, now = [], 0
    with pytest.raises(RivvenError):
        while True:
            waits.append(search.retry_in_ms(moved, now))
            now += waits[-1]
    assert waits and waits[-1] >= waits[0] and now < COORDINATOR_WAIT_MS
