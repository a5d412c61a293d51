"""The trio consumer's group membership: the blocking ``GroupMember`` with tasks for threads.

Theory of operation
-------------------
``TrioGroupMember`` drives the same ``GroupCore`` as the blocking driver (``_group.py``; the
rules are there and in ``group_core.py``): ``poll`` awaits ``maintain`` (rebalances with their
callbacks, auto-commit, pattern and partition-count checks), a *heartbeat task* sends a
Heartbeat every ``heartbeat_interval_ms`` while the member is Stable and fires the
consumer's ``arrived`` signal when the core wants a rejoin, and ``commit_async`` runs its
commit in a task of its own (its callback is called there). ``max_poll_interval_ms`` works
as in the blocking driver: the heartbeat task sends LeaveGroup (dynamic members) instead of a
heartbeat once ``poll`` has not been called for that long, and the next ``poll`` rejoins.
Group traffic uses a ``TrioCluster`` of its own, so its connections never queue behind
fetches. No locks: state changes happen between awaits; a rebalance is guarded so two tasks
never run one at once.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any, Iterable, Mapping

import trio

from rivven_broker.client._group import (
    CommitCallback,
    RebalanceCallbacks,
    normalise_offsets,
    warn_poll_timeout,
)
from rivven_broker.client._trio_net import Signal, Spawner, TrioCluster
from rivven_broker.client.config import ConnectionConfig, ConsumerConfig
from rivven_broker.client.errors import ClientTimeoutError, RivvenError, error_for
from rivven_broker.client.group_core import (
    COORDINATOR_CODES,
    Assign,
    GroupCore,
    GroupSettings,
    PartitionCounts,
    Revoke,
    Send,
    Sleep,
    committed_offsets,
)
from rivven_broker.client.requests import check_response, metadata_request
from rivven_broker.client.types import TopicPartition
from rivven_broker.protocol import messages as m
from rivven_broker.protocol.errors import ErrorCode

__all__ = ["TrioGroupMember"]

log = logging.getLogger(__name__)


class TrioGroupMember:
    """Group membership of one trio consumer. See the module docstring."""

    def __init__(
        self, bootstrap: str, config: ConsumerConfig, conn_config: ConnectionConfig, env: Any,
        nursery: Spawner, fetch: Any, arrived: Signal,
    ) -> None:
        """``fetch`` is the consumer: ``_positions(tps)``, ``_set_assignment(owned, seeks)``."""
        assert config.group_id is not None
        self.config = config
        self.conn_config = conn_config
        self.core = GroupCore(GroupSettings.of(config, conn_config.retry_backoff_ms))
        self._clock = env.clock
        self._nursery = nursery
        self._cluster = TrioCluster(bootstrap, conn_config, env, nursery, in_flight_max=8)
        self._fetch = fetch
        self._arrived = arrived
        self._node: int | None = None
        self._callbacks = RebalanceCallbacks()
        self._pattern: re.Pattern[str] | None = None
        self._next_check_ms = 0
        self._next_auto_commit_ms = self._clock.monotonic_ms() + config.auto_commit_interval_ms
        self._state_changed = Signal()
        self._rebalancing = trio.Lock()
        self._heartbeating = False
        self._closed = False

    # --- subscription and maintenance ------------------------------------------------------

    def subscribe(self, topics: Iterable[str], pattern: re.Pattern[str] | None,
                  callbacks: RebalanceCallbacks) -> None:
        """Start (or change) membership; starts the heartbeat task. Never blocks."""
        self._pattern = pattern
        self._callbacks = callbacks
        self.core.subscribe(() if pattern is not None else topics)
        self._next_check_ms = 0
        if not self._heartbeating:
            self._heartbeating = True
            self._nursery.start_soon(self._heartbeat_loop)

    def wants_attention(self) -> bool:
        return self.core.needs_attention()

    async def maintain(self, poll_scope: trio.CancelScope | None = None) -> None:
        """Rebalance if needed, auto-commit when due, re-check metadata when due. Raises the
        membership's fatal error. ``poll_scope``: the caller's timeout, held off while a
        rebalance runs."""
        now = self._clock.monotonic_ms()
        self.core.on_poll(now)
        if self.core.subscribed:
            if now >= self._next_check_ms:
                self._next_check_ms = now + self.conn_config.metadata_max_age_ms
                await self._check_metadata()
            if self.core.needs_attention():
                # Not cut by the caller's deadline (poll's timeout_ms), as the blocking
                # consumer's rebalance is not: cut short, a rebalance starts over at the next
                # poll, and when its JoinGroup waits longer than one poll (the coordinator
                # holds it until every member rejoined) it never finishes. Each step is
                # bounded by its own request timeout. Only the poll's deadline is held off (not
                # a shield): closing the consumer still cancels a rebalance at once.
                held = None if poll_scope is None else poll_scope.deadline
                if poll_scope is not None:
                    poll_scope.deadline = math.inf
                try:
                    async with self._rebalancing:
                        await self._rebalance()
                finally:
                    if poll_scope is not None and held is not None:
                        poll_scope.deadline = held
        if self.config.enable_auto_commit and now >= self._next_auto_commit_ms:
            self._next_auto_commit_ms = now + self.config.auto_commit_interval_ms
            try:
                await self._commit(self._fetch._positions(None), None)
            except RivvenError as error:
                log.warning("group %s: auto-commit failed: %s", self.config.group_id, error)

    def poll_ended(self) -> None:
        """``poll`` returned, raised or was cancelled: the poll interval counts from now."""
        self.core.on_poll_end(self._clock.monotonic_ms())

    async def _check_metadata(self) -> None:
        try:
            if self._pattern is not None:
                answer = await self._metadata(None)
                self.core.subscribe(
                    t.name for t in answer.topics
                    if t.error_code == ErrorCode.NONE and self._pattern.fullmatch(t.name)
                )
            counts = dict(self.core.assigned_counts) if self.core.is_leader else {}
            found = await self._partition_counts(sorted(counts)) if counts else {}
            if counts and {topic: found.get(topic, 0) for topic in counts} != counts:
                self.core.request_rejoin()
        except RivvenError as error:
            log.warning("group %s: metadata check failed: %s", self.config.group_id, error)

    async def _metadata(self, topics: list[str] | None) -> Any:
        answer = await self._cluster.call(metadata_request(topics, False))
        answer = check_response(answer, m.MetadataResponse)
        self._cluster.metadata.on_update(answer, self._cluster.now_ms())
        return answer

    async def _partition_counts(self, topics: list[str]) -> dict[str, int]:
        answer = await self._metadata(topics)
        return {t.name: len(t.partitions) for t in answer.topics
                if t.error_code == ErrorCode.NONE and t.partitions}

    async def _rebalance(self) -> None:
        steps = self.core.rebalance()
        reply: Any = None
        while True:
            try:
                action = steps.send(reply)
            except StopIteration:
                return
            finally:
                self._state_changed.fire()
            reply = await self._perform(action)

    async def _perform(self, action: Any) -> Any:
        if isinstance(action, Send):
            return await self._call(action.request, action.timeout_ms)
        if isinstance(action, PartitionCounts):
            try:
                return await self._partition_counts(list(action.topics))
            except RivvenError as error:
                log.warning("group %s: no partition counts: %s", self.config.group_id, error)
                return {}
        if isinstance(action, Revoke):
            partitions = set(action.partitions)
            if not action.lost and self.config.enable_auto_commit:
                try:
                    await self._commit(self._fetch._positions(partitions), None)
                except RivvenError as error:
                    log.warning("group %s: commit before revoking failed: %s",
                                self.config.group_id, error)
            self._callbacks.revoked(partitions, action.lost)  # positions still readable there
            self._fetch._set_assignment(self.core.owned, {})
            return None
        if isinstance(action, Assign):
            seeks = {tp: o for tp, o in action.committed.items() if o is not None}
            self._fetch._set_assignment(self.core.owned, seeks)
            self._callbacks.assigned(set(action.added))
            return None
        assert isinstance(action, Sleep)
        await trio.sleep(action.ms / 1000)
        return None

    # --- coordinator calls -----------------------------------------------------------------

    async def _coordinator(self) -> int:
        node = None if self.core.coordinator_unknown else self._node
        if node is None:
            answer = await self._cluster.call(m.FindCoordinator(self.config.group_id, 0))
            if answer.error_code != ErrorCode.NONE:
                raise error_for(answer.error_code, "finding the group coordinator")
            node = self._node = answer.node_id
            self.core.coordinator_unknown = False
        if self._cluster.metadata.address_of(node) is None:
            await self._metadata([])
        return node

    async def _call(self, request: Any, timeout_ms: int | None) -> tuple[Any, Any]:
        try:
            node = await self._coordinator()
            return await self._cluster.call(request, node_id=node, timeout_ms=timeout_ms), None
        except RivvenError as error:
            if error.error_code in COORDINATOR_CODES or error.retriable:
                self.core.coordinator_unknown = True
            return None, error

    # --- commits ---------------------------------------------------------------------------

    async def commit(self, offsets: Mapping[Any, Any] | None, timeout_ms: int | None) -> None:
        wanted = self._fetch._positions(None) if offsets is None else normalise_offsets(offsets)
        await self._commit(wanted, timeout_ms)

    async def _commit(self, wanted: dict, timeout_ms: int | None) -> None:
        if not wanted:
            return
        timeout_ms = self.conn_config.request_timeout_ms if timeout_ms is None else timeout_ms
        deadline = self._clock.monotonic_ms() + timeout_ms
        while True:
            request = self.core.commit_request(wanted)
            remaining = max(deadline - self._clock.monotonic_ms(), 1)
            response, error = await self._call(request, remaining)
            if error is None:
                codes = self.core.on_commit_response(request, response)
                failed = {c for c in codes.values() if c != ErrorCode.NONE}
                if not failed:
                    return
                if not failed <= COORDINATOR_CODES:
                    code = min(failed - COORDINATOR_CODES, key=int)
                    raise error_for(code, f"commit of group {self.config.group_id!r}")
                error = error_for(min(failed, key=int), "commit")
            if not error.retriable:
                raise error
            if self._clock.monotonic_ms() + self.conn_config.retry_backoff_ms >= deadline:
                raise ClientTimeoutError(f"commit not done within {timeout_ms} ms") from error
            await trio.sleep(self.conn_config.retry_backoff_ms / 1000)

    def commit_async(self, offsets: Mapping[Any, Any] | None,
                     callback: CommitCallback | None) -> None:
        wanted = self._fetch._positions(None) if offsets is None else normalise_offsets(offsets)
        self._nursery.start_soon(self._commit_task, wanted, callback)

    async def _commit_task(self, wanted: dict, callback: CommitCallback | None) -> None:
        error: RivvenError | None = None
        try:
            await self._commit(wanted, None)
        except RivvenError as exc:
            error = exc
        if callback is not None:
            callback({tp: offset for tp, (offset, _) in wanted.items()}, error)
        elif error is not None:
            log.warning("group %s: async commit failed: %s", self.config.group_id, error)

    async def committed(self, partitions: Iterable[Any],
                        timeout_ms: int | None) -> dict[TopicPartition, int | None]:
        tps = [TopicPartition(tp[0], tp[1]) for tp in partitions]
        response, error = await self._call(self.core.offset_fetch_request(tps), timeout_ms)
        if error is not None:
            raise error
        found = committed_offsets(response)
        return {tp: found.get(tp) for tp in tps}

    # --- the heartbeat task ----------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        interval_ms = self.config.heartbeat_interval_ms
        while not self._closed:
            now = self._clock.monotonic_ms()
            if self.core.poll_timeout_expired(now):
                await self._leave_for_poll_timeout(now)
                continue
            beat = self.core.heartbeat_request()
            if beat is None:
                await self._state_changed.wait(interval_ms)
                continue
            started = self._clock.monotonic_ms()
            response, error = await self._call(beat, interval_ms)
            if error is None:
                self.core.on_heartbeat(beat, ErrorCode.from_wire(response.error_code))
            if self.core.needs_attention():
                self._arrived.fire()  # wake a waiting poll: it must rejoin
            await trio.sleep(max(interval_ms - (self._clock.monotonic_ms() - started), 0) / 1000)

    async def _leave_for_poll_timeout(self, now: int) -> None:
        warn_poll_timeout(self.config.group_id, self.core.poll_idle_ms(now),
                          self.config.max_poll_interval_ms)
        leave = self.core.leave_for_poll_timeout()
        self._arrived.fire()
        if leave is not None:  # a whole request's time: a lost LeaveGroup keeps the partitions
            _, error = await self._call(leave, self.conn_config.request_timeout_ms)
            if error is not None:
                log.warning("group %s: LeaveGroup failed: %s", self.config.group_id, error)

    # --- closing ---------------------------------------------------------------------------

    async def close(self, autocommit: bool = True) -> None:
        """Commit (auto-commit, unless ``autocommit`` is False), revoke, leave (dynamic
        members), stop. Failures are logged."""
        try:
            owned = set(self.core.owned)
            member = self.core.subscribed
            if self.config.enable_auto_commit and autocommit:
                await self._commit(self._fetch._positions(None), None)
            if member and owned:
                self._callbacks.revoked(owned, lost=False)
            leave = self.core.leave_request()
            if leave is not None:
                await self._call(leave, None)
        except RivvenError as error:
            log.warning("group %s: leaving cleanly failed: %s", self.config.group_id, error)
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Stop heartbeating and close connections without telling the coordinator."""
        self._closed = True
        self._cluster.close()
        self._state_changed.fire()
