"""The consumer's answer handling, shared by the blocking and the trio driver.

Theory of operation
-------------------
Drivers send Fetch and ListOffsets requests planned by ``FetchState`` and hand the answers (or
the failure) to these two functions, which apply them to the state and say whether metadata
must be refreshed (a moved leader, an unknown topic, a lost connection). A whole-request
failure leaves the partitions to be fetched again after the retry backoff; per-partition errors
are ``FetchState``'s business. Pure: ``now_ms`` is an argument.
"""

from __future__ import annotations

from typing import Any

from rivven_broker.client.errors import RivvenError, error_for
from rivven_broker.client.fetch_state import FetchPlan, FetchState
from rivven_broker.client.requests import check_response, list_offsets_results
from rivven_broker.client.retry import needs_metadata_refresh
from rivven_broker.client.types import TopicPartition
from rivven_broker.protocol import messages as m
from rivven_broker.protocol.errors import ErrorCode

__all__ = ["apply_fetch_answer", "apply_reset_answer"]


def apply_fetch_answer(
    state: FetchState, plan: FetchPlan, response: Any, error: RivvenError | None, now_ms: int
) -> bool:
    """Apply a Fetch answer (or ``error``); returns True when metadata should be refreshed."""
    if error is None:
        try:
            response = check_response(response, m.FetchResponse)
            if response.error_code != ErrorCode.NONE:
                error = error_for(response.error_code, "fetch")
        except RivvenError as exc:
            error = exc
    if error is not None:
        state.on_fetch_failed(plan, now_ms)
        return needs_metadata_refresh(error.error_code)
    answers = {
        (topic.name, part.partition): part for topic in response.topics for part in topic.partitions
    }
    refresh = False
    for tp, epoch, offset in plan.partitions:
        part = answers.get((tp.topic, tp.partition))
        if part is None:
            state.on_partition_missing(tp, epoch, now_ms)
            continue
        aborted = tuple((a.producer_id, a.first_offset) for a in part.aborted_transactions)
        code = state.on_partition_data(
            tp, epoch, offset, part.error_code, part.high_watermark, part.records, now_ms,
            aborted,
        )
        refresh |= code is not None and needs_metadata_refresh(code)
    return refresh


def apply_reset_answer(
    state: FetchState,
    entries: list[tuple[TopicPartition, int, int]],
    response: Any,
    error: RivvenError | None,
    now_ms: int,
) -> bool:
    """Apply a ListOffsets answer to the resets ``entries`` ((tp, epoch, timestamp));
    returns True when metadata should be refreshed."""
    results = {}
    if error is None:
        try:
            results = list_offsets_results(response)
        except RivvenError as exc:
            error = exc
    refresh = False
    for tp, epoch, _ in entries:
        code, offset = results.get(tp, (ErrorCode.NETWORK_EXCEPTION, None))
        if error is None and code == ErrorCode.NONE:
            state.on_reset(tp, epoch, offset.offset)
            continue
        failure = error or error_for(code, f"list offsets of {tp}")
        refresh |= needs_metadata_refresh(failure.error_code)
        state.on_reset_failed(tp, epoch, failure, now_ms)
    return refresh
