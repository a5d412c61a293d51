"""The consumer's fetch side as a pure core: what to fetch from which broker, and when.

Theory of operation
-------------------
A driver owns sockets, a clock and a thread or task; ``FetcherCore`` owns every decision of
the fetch side, as ``ProducerCore`` does for the sender:

- ``step(now_ms, node_ready)`` is called whenever the fetch thread or task wakes. It plans the
  position resets (one ListOffsets per leader) and the Fetches (one per leader with none in
  flight) for the partitions ``FetchState`` calls fetchable, to the leaders the driver says
  are ready (``node_ready``: True ready, False busy, None not connected, as for
  ``ProducerCore.step``); leaders not connected come back in ``dial`` (the driver connects,
  after its reconnect backoff); a partition without a known
  leader asks for a metadata refresh. It says whether a Metadata request is due
  (``metadata_due``) and when to step again at the latest (``wake_at_ms``: a partition's error
  backoff ending, metadata becoming due, or ``IDLE_WAIT_MS``).
- ``fetch_request(plan)`` / ``reset_request(entries)`` build the requests (and the Fetch's
  timeout: the request timeout plus the long-poll wait).
- ``on_fetch_answer`` / ``on_reset_answer`` take the answer (or the failure): the node may be
  fetched from again, the answer goes to ``FetchState`` (``apply_fetch_answer`` /
  ``apply_reset_answer``), and a moved leader, an unknown topic or a lost connection marks
  the metadata stale. A whole-request failure leaves the partitions to be fetched again after
  the retry backoff; per-partition errors are ``FetchState``'s business.

Pure: ``now_ms`` is an argument; nothing blocks.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from rivven_broker.client.config import ConnectionConfig, ConsumerConfig
from rivven_broker.client.errors import RivvenError, error_for
from rivven_broker.client.fetch_state import FetchPlan, FetchState
from rivven_broker.client.metadata import MetadataCache
from rivven_broker.client.producer_core import NodeReady
from rivven_broker.client.requests import (
    ISOLATION_LEVELS,
    check_response,
    fetch_request,
    list_offsets_request,
    list_offsets_results,
)
from rivven_broker.client.retry import needs_metadata_refresh
from rivven_broker.client.types import TopicPartition
from rivven_broker.protocol import messages as m
from rivven_broker.protocol.errors import ErrorCode

__all__ = ["FetchStep", "FetcherCore", "IDLE_WAIT_MS", "apply_fetch_answer", "apply_reset_answer"]

#: The longest the fetch side sleeps without being woken.
IDLE_WAIT_MS = 1000

#: A position reset to resolve: (partition, its epoch, the timestamp to look up).
ResetEntry = tuple[TopicPartition, int, int]


class FetchStep(NamedTuple):
    fetches: list[FetchPlan]  # send now (counted in flight until their answer)
    resets: list[tuple[int, list[ResetEntry]]]  # ListOffsets to send now, by leader
    dial: list[int]  # leaders to connect to (fetches or resets wait for them)
    metadata_due: bool  # start a Metadata request
    wake_at_ms: int  # step again at the latest


class FetcherCore:
    """The fetch side's decisions for one consumer. Not thread-safe (drivers lock)."""

    def __init__(self, config: ConsumerConfig, connection: ConnectionConfig,
                 metadata: MetadataCache, state: FetchState) -> None:
        self.config = config
        self.metadata = metadata
        self.state = state
        self.isolation_level = ISOLATION_LEVELS[config.isolation_level]
        self.fetch_timeout_ms = connection.request_timeout_ms + config.fetch_max_wait_ms
        self.fetching: set[int] = set()  # nodes with a Fetch in flight
        self.resetting: set[tuple[TopicPartition, int]] = set()  # (tp, epoch) being reset

    def step(self, now_ms: int, node_ready: NodeReady) -> FetchStep:
        """Decide what the fetch side does now (see the module docstring)."""
        metadata = self.metadata
        dial: dict[int, None] = {}
        ready: dict[int, bool] = {}

        def usable(node_id: int) -> bool:
            if node_id not in ready:
                known = metadata.address_of(node_id) is not None
                answer = node_ready(node_id) if known else False
                if answer is None:
                    dial[node_id] = None
                ready[node_id] = bool(answer)
            return ready[node_id]

        resets: dict[int, list[ResetEntry]] = {}
        for entry in self.state.resets_needed(now_ms):
            if entry[:2] in self.resetting:
                continue
            node = metadata.leader_for(entry[0].topic, entry[0].partition)
            if node is None:
                metadata.request_update()
            elif usable(node):
                resets.setdefault(node, []).append(entry)
                self.resetting.add(entry[:2])
        plans, unknown = self.state.plan_fetches(
            now_ms, metadata.leader_for, lambda node: node not in self.fetching and usable(node)
        )
        if unknown:
            metadata.request_update()
        for plan in plans:
            self.fetching.add(plan.node_id)
        wake_at = now_ms + IDLE_WAIT_MS
        retry = self.state.next_retry_ms(now_ms)
        if retry is not None:
            wake_at = min(wake_at, retry)
        metadata_due = metadata.refresh_due(now_ms)
        if metadata.wanted and not metadata.refresh_in_flight:
            wake_at = min(wake_at, max(metadata.update_due_ms(now_ms), now_ms + 1))
        return FetchStep(plans, list(resets.items()), list(dial), metadata_due, wake_at)

    def fetch_request(self, plan: FetchPlan) -> Any:
        """The Fetch for ``plan`` (send it with ``fetch_timeout_ms``)."""
        config = self.config
        return fetch_request(
            plan,
            max_wait_ms=config.fetch_max_wait_ms,
            min_bytes=config.fetch_min_bytes,
            max_bytes=config.fetch_max_bytes,
            partition_max_bytes=config.max_partition_fetch_bytes,
            isolation_level=self.isolation_level,
            leader_epoch=self.metadata.leader_epoch_for,
        )

    def reset_request(self, entries: list[ResetEntry]) -> Any:
        """The ListOffsets resolving ``entries``."""
        return list_offsets_request([(tp, ts) for tp, _, ts in entries], self.isolation_level)

    def on_fetch_answer(self, plan: FetchPlan, response: Any, error: RivvenError | None,
                        now_ms: int) -> None:
        """A Fetch's answer (or failure): the node may be fetched from again."""
        self.fetching.discard(plan.node_id)
        if apply_fetch_answer(self.state, plan, response, error, now_ms):
            self.metadata.request_update()

    def on_reset_answer(self, entries: list[ResetEntry], response: Any,
                        error: RivvenError | None, now_ms: int) -> None:
        """A ListOffsets answer (or failure) for ``entries``."""
        for tp, epoch, _ in entries:
            self.resetting.discard((tp, epoch))
        if apply_reset_answer(self.state, entries, response, error, now_ms):
            self.metadata.request_update()

    def on_dial_failed(self) -> None:
        """A leader could not be reached: maybe it moved."""
        self.metadata.request_update()

    def check_invariants(self) -> None:
        self.state.check_invariants()
        assert all(isinstance(node, int) for node in self.fetching)


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
