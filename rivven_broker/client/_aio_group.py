"""The async consumer's group membership: the ``GroupCore`` and ``membership.py``, with tasks.

Theory of operation
-------------------
``GroupMember`` drives the pure cores: the
membership is ``GroupCore`` (``group_core.py``), and every other decision is one of the objects
of ``membership.py`` - ``CoordinatorLookup``, ``CommitRetry``, ``HeartbeatSchedule``,
``GroupTimers``, ``AsyncCommits``. ``poll`` awaits ``maintain`` (rebalances with their
callbacks, auto-commit, pattern and partition-count checks); a *heartbeat task* does what the
``HeartbeatSchedule`` says (a Heartbeat every ``heartbeat_interval_ms`` while Stable, or
LeaveGroup once ``poll`` has not been called for ``max_poll_interval_ms``) and fires the
consumer's ``arrived`` signal when the core wants a rejoin; ``commit_async`` queues its commit
(bounded by ``AsyncCommits``) for a task that sends them one at a time, in order, and
calls each callback there.
Group traffic uses a ``Cluster`` of its own, so its connections never queue behind
fetches. State changes happen between awaits (and under the ``Bridge`` lock, shared with a
blocking front); a rebalance is guarded so two tasks never run one at once. User callbacks
(rebalance, ``commit_async``) go through ``run_callback``: called in place by default; the
blocking front runs them on its caller's thread instead (they may call the consumer back).
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any, Awaitable, Callable, Iterable, Mapping

import anyio

from rivven_broker.client._aio_net import Bridge, Cluster, Signal, Spawner
from rivven_broker.client.config import ConnectionConfig, ConsumerConfig
from rivven_broker.client.errors import RivvenError
from rivven_broker.client.group_core import (
    Assign,
    GroupCore,
    GroupSettings,
    PartitionCounts,
    Revoke,
    Send,
    Sleep,
    committed_offsets,
)
from rivven_broker.client.membership import (
    AsyncCommits,
    CommitCallback,
    CommitRetry,
    CoordinatorLookup,
    GroupTimers,
    HeartbeatSchedule,
    RebalanceCallbacks,
    counts_changed,
    matched_topics,
    normalise_offsets,
    partition_counts,
    subscription_topics,
)
from rivven_broker.client.requests import check_response, metadata_request
from rivven_broker.client.types import TopicPartition
from rivven_broker.protocol import messages as m

__all__ = ["GroupMember"]

log = logging.getLogger(__name__)


class GroupMember:
    """Group membership of one async consumer. See the module docstring."""

    def __init__(
        self, bootstrap: str, config: ConsumerConfig, conn_config: ConnectionConfig, env: Any,
        nursery: Spawner, fetch: Any, arrived: Signal, bridge: Bridge | None = None,
    ) -> None:
        """``fetch`` is the consumer: ``_positions(tps)``, ``_set_assignment(owned, seeks)``."""
        assert config.group_id is not None
        self.config = config
        self.conn_config = conn_config
        self.core = GroupCore(GroupSettings.of(config, conn_config.retry_backoff_ms))
        self._clock = env.clock
        self._nursery = nursery
        self._bridge = bridge or Bridge()
        self._cluster = Cluster(bootstrap, conn_config, env, nursery, in_flight_max=8,
                                bridge=self._bridge)
        self._fetch = fetch
        self._arrived = arrived
        self._coordinator = CoordinatorLookup(self.core)
        self._heartbeats = HeartbeatSchedule(
            self.core, interval_ms=config.heartbeat_interval_ms,
            request_timeout_ms=conn_config.request_timeout_ms,
        )
        self._timers = GroupTimers(
            self._clock.monotonic_ms(),
            auto_commit_interval_ms=(
                config.auto_commit_interval_ms if config.enable_auto_commit else None),
            metadata_check_ms=conn_config.metadata_max_age_ms,
        )
        self._async = AsyncCommits()
        self._callbacks = RebalanceCallbacks()
        self._pattern: re.Pattern[str] | None = None
        self._state_changed = Signal(self._bridge)
        #: ``await run_callback(fn, *args)`` calls a user callback (see the module docstring)
        self.run_callback: Callable[..., Awaitable[None]] = _call_in_place
        self._rebalancing = anyio.Lock()
        self._heartbeating = False
        self._committing = False  # a commit task is sending the async commits
        self._closed = False

    # --- subscription and maintenance ------------------------------------------------------

    def subscribe(self, topics: Iterable[str], pattern: re.Pattern[str] | None,
                  callbacks: RebalanceCallbacks) -> None:
        """Start (or change) membership; starts the heartbeat task. Never blocks."""
        self._pattern = pattern
        self._callbacks = callbacks
        self.core.subscribe(subscription_topics(topics, pattern))
        self._timers.check_soon()
        if not self._heartbeating:
            self._heartbeating = True
            self._nursery.start_soon(self._heartbeat_loop)

    def wants_attention(self) -> bool:
        return self.core.needs_attention()

    async def maintain(self, poll_scope: anyio.CancelScope | None = None) -> None:
        """Rebalance if needed, auto-commit when due, re-check metadata when due. Raises the
        membership's fatal error. ``poll_scope``: the caller's timeout, held off while a
        rebalance runs."""
        now = self._clock.monotonic_ms()
        self.core.on_poll(now)
        if self.core.subscribed:
            if self._timers.metadata_check_due(now):
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
        if self._timers.auto_commit_due(self._clock.monotonic_ms()):
            try:
                await self._commit(self._fetch._positions(None), None)
            except RivvenError as error:
                log.warning("group %s: auto-commit failed: %s", self.config.group_id, error)

    def maintenance_due(self) -> bool:
        """Whether ``maintain`` has work now (a rebalance, an auto-commit, a metadata
        re-check). Reads only: a blocking front asks from its own thread, and otherwise only
        reports the poll (``note_poll``) instead of a round trip to the loop per ``poll``."""
        core = self.core
        return core.needs_attention() or self._timers.any_due(
            self._clock.monotonic_ms(), checking=core.subscribed)

    def note_poll(self) -> None:
        """``poll`` was called (``maintain`` does this too): ``max_poll_interval_ms``."""
        self.core.on_poll(self._clock.monotonic_ms())

    def poll_ended(self) -> None:
        """``poll`` returned, raised or was cancelled: the poll interval counts from now."""
        self.core.on_poll_end(self._clock.monotonic_ms())

    async def _check_metadata(self) -> None:
        try:
            if self._pattern is not None:
                self.core.subscribe(matched_topics(await self._metadata(None), self._pattern))
            counts = dict(self.core.assigned_counts) if self.core.is_leader else {}
            found = await self._partition_counts(sorted(counts)) if counts else {}
            if counts_changed(counts, found):
                self.core.request_rejoin()
        except RivvenError as error:
            log.warning("group %s: metadata check failed: %s", self.config.group_id, error)

    async def _metadata(self, topics: list[str] | None) -> Any:
        answer = await self._cluster.call(metadata_request(topics, False))
        answer = check_response(answer, m.MetadataResponse)
        self._cluster.update_metadata(answer)
        return answer

    async def _partition_counts(self, topics: list[str]) -> dict[str, int]:
        return partition_counts(await self._metadata(topics))

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
            # positions are still readable there
            await self.run_callback(self._callbacks.revoked, partitions, action.lost)
            self._fetch._set_assignment(self.core.owned, {})
            return None
        if isinstance(action, Assign):
            seeks = {tp: o for tp, o in action.committed.items() if o is not None}
            self._fetch._set_assignment(self.core.owned, seeks)
            await self.run_callback(self._callbacks.assigned, set(action.added))
            return None
        assert isinstance(action, Sleep)
        await anyio.sleep(action.ms / 1000)
        return None

    # --- coordinator calls -----------------------------------------------------------------

    async def _coordinator_node(self) -> int:
        node = self._coordinator.node()
        if node is None:
            answer = await self._cluster.call(self._coordinator.find_request())
            node = self._coordinator.on_found(answer)
        if self._cluster.metadata.address_of(node) is None:
            await self._metadata([])
        return node

    async def _call(self, request: Any, timeout_ms: int | None) -> tuple[Any, Any]:
        """``(response, None)`` or ``(None, error)``: the core decides what an error means."""
        try:
            node = await self._coordinator_node()
            return await self._cluster.call(request, node_id=node, timeout_ms=timeout_ms), None
        except RivvenError as error:
            self._coordinator.on_call_failed(error)
            return None, error

    # --- commits ---------------------------------------------------------------------------

    async def commit(self, offsets: Mapping[Any, Any] | None, timeout_ms: int | None) -> None:
        wanted = self._fetch._positions(None) if offsets is None else normalise_offsets(offsets)
        await self._commit(wanted, timeout_ms)

    async def _commit(self, wanted: dict, timeout_ms: int | None) -> None:
        """Commit until durable; the retry decisions are the core's ``CommitRetry``."""
        if not wanted:
            return
        timeout_ms = self.conn_config.request_timeout_ms if timeout_ms is None else timeout_ms
        commit = CommitRetry(self.core, wanted, now_ms=self._clock.monotonic_ms(),
                             timeout_ms=timeout_ms,
                             retry_backoff_ms=self.conn_config.retry_backoff_ms)
        while True:
            request, remaining_ms = commit.request(self._clock.monotonic_ms())
            response, error = await self._call(request, remaining_ms)
            wait_ms = commit.on_answer(request, response, error, self._clock.monotonic_ms())
            if wait_ms is None:
                return
            await anyio.sleep(wait_ms / 1000)

    def commit_async(self, offsets: Mapping[Any, Any] | None,
                     callback: CommitCallback | None) -> None:
        """Queue a commit for the commit task (started when idle). Never blocks.

        Raises:
            BufferExhaustedError: ``limits.async_commits_pending_max`` commits are pending.
        """
        wanted = self._fetch._positions(None) if offsets is None else normalise_offsets(offsets)
        self._async.add(wanted, callback)
        if self._async.has_work() and not self._committing:
            self._committing = True  # one commit task at a time sends the queue, in order
            self._nursery.start_soon(self._commit_task)

    async def _commit_task(self) -> None:
        """Send the queued async commits one at a time, in order; call each callback."""
        try:
            await self._send_async_commits()
        finally:
            self._committing = False

    async def _send_async_commits(self) -> None:
        while (job := self._async.take()) is not None:
            wanted, callback = job
            error: RivvenError | None = None
            try:
                await self._commit(wanted, None)
            except RivvenError as exc:
                error = exc
            finally:
                self._async.finished()
            if callback is not None:
                await self.run_callback(
                    callback, {tp: offset for tp, (offset, _) in wanted.items()}, error)
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
        """What the core's ``HeartbeatSchedule`` says, until closed."""
        while not self._closed:
            step = self._heartbeats.step(self._clock.monotonic_ms())
            if step.leaving:
                log.warning("%s", step.warning)
                self._arrived.fire()  # a waiting poll reports the loss and rejoins
            if step.request is None:
                if not step.leaving:
                    await self._state_changed.wait(step.wait_ms)
                continue
            response, error = await self._call(step.request, step.timeout_ms)
            if step.leaving:
                if error is not None:
                    log.warning("group %s: LeaveGroup failed: %s", self.config.group_id, error)
                continue
            if self._heartbeats.on_answer(step.request, response, error):
                self._arrived.fire()  # wake a waiting poll: it must rejoin

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
                await self.run_callback(self._callbacks.revoked, owned, False)
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


async def _call_in_place(callback: Callable[..., Any], *args: Any) -> None:
    callback(*args)
