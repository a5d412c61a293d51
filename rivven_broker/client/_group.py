"""The blocking consumer's group membership: rebalances in ``poll``, heartbeats on a thread.

Theory of operation
-------------------
``GroupMember`` drives a ``GroupCore`` for one blocking ``Consumer``, sharing the consumer's
lock (``cond``) that also guards its ``FetchState``; every decision is the core's (the
membership in ``group_core.py``; coordinator lookup, commit retry, heartbeat schedule, timers
and the ``commit_async`` bound in ``membership.py``, the same objects the trio driver follows):

- The *user's thread* does everything that changes the assignment, inside ``poll`` (through
  ``maintain``): it pumps ``GroupCore.rebalance()`` - sending JoinGroup/SyncGroup/OffsetFetch,
  looking up partition counts for the leader, and carrying out ``Revoke``/``Assign`` by
  committing (auto-commit), moving the fetch state and calling the rebalance callbacks
  (``on_assign``, ``on_revoke``, ``on_lost``, or a listener object's
  ``on_partitions_assigned``/``_revoked``/``_lost``), so user callbacks run on the user's
  thread, between two polls, never while records of a revoked partition are being handed out.
  It also auto-commits every ``auto_commit_interval_ms`` and re-resolves a pattern
  subscription (and, for the leader, partition counts) every ``metadata_max_age_ms``.
- A *heartbeat thread* sends a Heartbeat every ``heartbeat_interval_ms`` while the member is
  Stable, so a slow ``poll`` loop keeps its session; a fencing answer only flags the core
  and wakes ``poll`` (which rejoins). It also sends ``commit_async`` commits; their callbacks
  are queued and run on the user's thread at the next ``poll``, ``commit`` or ``close``.
- ``max_poll_interval_ms`` (KIP-62): ``poll`` tells the core when it starts (``maintain``)
  and returns (``poll_ended``). When a beat is due and the application has been out of
  ``poll`` for longer than that, the heartbeat thread sends LeaveGroup instead (dynamic
  members; a static member just goes silent), logs a warning and stops heartbeating; the
  next ``poll`` reports the partitions lost (no commit) and rejoins.

The two threads talk to the coordinator over separate connections (one ``SyncClient``
each), so a JoinGroup the coordinator holds for a whole rebalance never delays a heartbeat.
The coordinator is found with FindCoordinator and found again after a coordinator error.
``close`` commits (auto-commit), revokes, sends LeaveGroup (dynamic members only; a static
member keeps its place for a restart) and stops the thread; ``abandon`` stops everything
without a word to the coordinator (what a crashed process does; for tests).
"""

from __future__ import annotations

import logging
import re
import threading
from collections import deque
from typing import Any, Iterable, Mapping

from rivven_broker.client._network import monotonic_ms
from rivven_broker.client._sync import SyncClient
from rivven_broker.client.config import ConnectionConfig, ConsumerConfig
from rivven_broker.client.errors import ClosedError, RivvenError
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
    ConsumerGroupMetadata,
    CoordinatorLookup,
    GroupTimers,
    HeartbeatSchedule,
    RebalanceCallbacks,
    counts_changed,
    group_metadata_of,
    matched_topics,
    normalise_offsets,
    partition_counts,
    subscription_topics,
)
from rivven_broker.client.types import TopicPartition

#: ``ConsumerGroupMetadata``, ``CommitCallback``, ``RebalanceCallbacks`` and the helpers are the
#: core's (``membership.py``), named here too for the blocking ``Consumer``.
__all__ = [
    "ConsumerGroupMetadata",
    "group_metadata_of",
    "GroupMember",
    "RebalanceCallbacks",
    "CommitCallback",
    "normalise_offsets",
]

log = logging.getLogger(__name__)


class GroupMember:
    """Group membership of one blocking consumer. See the module docstring."""

    def __init__(
        self,
        bootstrap: str,
        config: ConsumerConfig,
        conn_config: ConnectionConfig,
        cond: threading.Condition,
        fetch: Any,
    ) -> None:
        """``fetch`` is the consumer: ``_positions(tps)``, ``_set_assignment(owned, seeks)``."""
        assert config.group_id is not None
        self.config = config
        self.conn_config = conn_config
        self.core = GroupCore(GroupSettings.of(config, conn_config.retry_backoff_ms))
        self._cond = cond
        self._fetch = fetch
        self._io = SyncClient(bootstrap, conn_config)  # the user's thread
        self._heartbeat_io = SyncClient(bootstrap, conn_config)  # the heartbeat thread
        self._coordinator = CoordinatorLookup(self.core)
        self._heartbeats = HeartbeatSchedule(
            self.core, interval_ms=config.heartbeat_interval_ms,
            request_timeout_ms=conn_config.request_timeout_ms,
        )
        self._timers = GroupTimers(
            monotonic_ms(),
            auto_commit_interval_ms=(
                config.auto_commit_interval_ms if config.enable_auto_commit else None),
            metadata_check_ms=conn_config.metadata_max_age_ms,
        )
        self._callbacks = RebalanceCallbacks()
        self._pattern: re.Pattern[str] | None = None
        self._async = AsyncCommits()
        self._async_done: deque[tuple[CommitCallback, dict, RivvenError | None]] = deque()
        self._thread: threading.Thread | None = None
        self._stopping = False

    # --- subscription --------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str], pattern: re.Pattern[str] | None,
                  callbacks: RebalanceCallbacks) -> None:
        """Start (or change) group membership. Call under the lock. Never blocks."""
        self._pattern = pattern
        self._callbacks = callbacks
        self.core.subscribe(subscription_topics(topics, pattern))
        self._timers.check_soon()  # resolve a pattern at the next poll
        self._start_thread()

    def wants_attention(self) -> bool:
        """Whether ``poll`` should stop waiting and call ``maintain``. Call under the lock."""
        return self.core.needs_attention() or bool(self._async_done)

    def maintain(self) -> None:
        """The user thread's group work at the top of ``poll`` (module docstring). Blocks.

        Raises:
            The membership's fatal error (FENCED_INSTANCE_ID ...), or a commit callback's.
        """
        with self._cond:
            self.core.on_poll(monotonic_ms())
        self._run_async_callbacks()
        if self.core.subscribed:
            if self._timers.metadata_check_due(monotonic_ms()):
                self._check_metadata()
            with self._cond:
                busy = self.core.needs_attention()
            if busy:
                self._rebalance()
        self._auto_commit()

    def poll_ended(self) -> None:
        """``poll`` returned or raised: the poll interval counts from now. Never blocks."""
        with self._cond:
            self.core.on_poll_end(monotonic_ms())

    def _check_metadata(self) -> None:
        """Re-match a pattern; as the leader, notice new partitions. Rejoin on a change."""
        try:
            if self._pattern is not None:
                matched = matched_topics(self._io.fetch_metadata(None), self._pattern)
                with self._cond:
                    self.core.subscribe(matched)
            with self._cond:
                counts = dict(self.core.assigned_counts) if self.core.is_leader else {}
            found = self._partition_counts(sorted(counts)) if counts else {}
            if counts_changed(counts, found):
                with self._cond:
                    self.core.request_rejoin()
        except RivvenError as error:  # try again at the next check
            log.warning("group %s: metadata check failed: %s", self.config.group_id, error)

    def _partition_counts(self, topics: list[str]) -> dict[str, int]:
        return partition_counts(self._io.fetch_metadata(topics))

    # --- the rebalance -----------------------------------------------------------------

    def _rebalance(self) -> None:
        with self._cond:
            steps = self.core.rebalance()
        reply: Any = None
        while True:
            with self._cond:
                try:
                    action = steps.send(reply)
                except StopIteration:
                    return
                finally:
                    self._cond.notify_all()  # the heartbeat thread: the state may have changed
            reply = self._perform(action)

    def _perform(self, action: Any) -> Any:
        if isinstance(action, Send):
            return self._call(self._io, action.request, action.timeout_ms)
        if isinstance(action, PartitionCounts):
            try:
                return self._partition_counts(list(action.topics))
            except RivvenError as error:
                log.warning("group %s: no partition counts: %s", self.config.group_id, error)
                return {}
        if isinstance(action, Revoke):
            return self._revoke(action)
        if isinstance(action, Assign):
            return self._assign(action)
        assert isinstance(action, Sleep)
        with self._cond:
            if not self._stopping:
                self._cond.wait(action.ms / 1000)
            if self._stopping:
                raise ClosedError("the consumer is closed")
        return None

    def _revoke(self, action: Revoke) -> None:
        partitions = set(action.partitions)
        if not action.lost and self.config.enable_auto_commit:
            try:
                self._commit_positions(partitions)
            except RivvenError as error:
                log.warning("group %s: commit before revoking %s failed: %s",
                            self.config.group_id, sorted(partitions), error)
        self._callbacks.revoked(partitions, action.lost)  # positions still readable there
        with self._cond:
            self._fetch._set_assignment(self.core.owned, {})

    def _assign(self, action: Assign) -> None:
        seeks = {tp: offset for tp, offset in action.committed.items() if offset is not None}
        with self._cond:
            self._fetch._set_assignment(self.core.owned, seeks)
        self._callbacks.assigned(set(action.added))

    # --- coordinator calls ---------------------------------------------------------------

    def _coordinator_node(self, io: SyncClient) -> int:
        with self._cond:
            node = self._coordinator.node()
        if node is None:
            answer = io.call(self._coordinator.find_request())
            with self._cond:
                node = self._coordinator.on_found(answer)
        if io.metadata.address_of(node) is None:
            io.fetch_metadata([])
        return node

    def _call(self, io: SyncClient, request: Any, timeout_ms: int | None) -> tuple[Any, Any]:
        """``(response, None)`` or ``(None, error)``: the core decides what an error means."""
        try:
            node = self._coordinator_node(io)
            return io.call(request, node_id=node, timeout_ms=timeout_ms), None
        except RivvenError as error:
            with self._cond:
                self._coordinator.on_call_failed(error)
            return None, error

    # --- commits -------------------------------------------------------------------------

    def commit(self, offsets: Mapping[Any, Any] | None, timeout_ms: int | None) -> None:
        """Commit ``offsets`` (None: the positions of every assigned partition). Blocks until
        durable or the timeout.

        Raises:
            BrokerError: a partition's commit was refused (REBALANCE_IN_PROGRESS,
                ILLEGAL_GENERATION ... : the member then rejoins at the next poll).
            ClientTimeoutError: the coordinator did not answer in time.
        """
        self._run_async_callbacks()
        if offsets is None:
            with self._cond:
                wanted = self._fetch._positions(None)
        else:
            wanted = normalise_offsets(offsets)
        self._commit(self._io, wanted, timeout_ms)

    def _commit_positions(self, partitions: Iterable[TopicPartition]) -> None:
        with self._cond:
            wanted = self._fetch._positions(set(partitions))
        self._commit(self._io, wanted, None)

    def _auto_commit(self) -> None:
        if not self._timers.auto_commit_due(monotonic_ms()):
            return
        try:
            with self._cond:
                wanted = self._fetch._positions(None)
            self._commit(self._io, wanted, None)
        except RivvenError as error:
            log.warning("group %s: auto-commit failed: %s", self.config.group_id, error)

    def _commit(self, io: SyncClient, wanted: dict, timeout_ms: int | None) -> None:
        """Commit until durable; the retry decisions are the core's ``CommitRetry``."""
        if not wanted:
            return
        timeout_ms = self.conn_config.request_timeout_ms if timeout_ms is None else timeout_ms
        with self._cond:
            commit = CommitRetry(self.core, wanted, now_ms=monotonic_ms(), timeout_ms=timeout_ms,
                                 retry_backoff_ms=self.conn_config.retry_backoff_ms)
        while True:
            with self._cond:
                request, remaining_ms = commit.request(monotonic_ms())
            response, error = self._call(io, request, remaining_ms)
            with self._cond:
                wait_ms = commit.on_answer(request, response, error, monotonic_ms())
                if wait_ms is None:
                    return
                self._cond.wait(wait_ms / 1000)

    def commit_async(self, offsets: Mapping[Any, Any] | None,
                     callback: CommitCallback | None) -> None:
        """Queue a commit for the heartbeat thread. Never blocks. Call under no lock.

        Raises:
            BufferExhaustedError: ``limits.async_commits_pending_max`` commits are pending.
        """
        with self._cond:
            wanted = (self._fetch._positions(None) if offsets is None
                      else normalise_offsets(offsets))
            self._async.add(wanted, callback)
            self._start_thread()
            self._cond.notify_all()

    def _run_async_callbacks(self) -> None:
        while True:
            with self._cond:
                if not self._async_done:
                    return
                callback, offsets, error = self._async_done.popleft()
            callback(offsets, error)

    def committed(self, partitions: Iterable[TopicPartition],
                  timeout_ms: int | None) -> dict[TopicPartition, int | None]:
        """The committed offsets of ``partitions`` (None: nothing committed). Blocks."""
        tps = [TopicPartition(tp[0], tp[1]) for tp in partitions]
        with self._cond:
            request = self.core.offset_fetch_request(tps)
        response, error = self._call(self._io, request, timeout_ms)
        if error is not None:
            raise error
        found = committed_offsets(response)
        return {tp: found.get(tp) for tp in tps}

    # --- the heartbeat thread ------------------------------------------------------------

    def _start_thread(self) -> None:
        if self._thread is None and not self._stopping:
            self._thread = threading.Thread(
                target=self._heartbeat_loop, name="rivven-heartbeat", daemon=True
            )
            self._thread.start()

    def _heartbeat_loop(self) -> None:
        """Async commits first, else what the core's ``HeartbeatSchedule`` says."""
        while True:
            job, step = None, None
            with self._cond:
                while not self._stopping:
                    job = self._async.take()
                    if job is not None:
                        break
                    step = self._heartbeats.step(monotonic_ms())
                    if step.request is not None or step.leaving:
                        break
                    self._cond.wait(step.wait_ms / 1000)
                if self._stopping:
                    return
                if step is not None and step.leaving:
                    self._cond.notify_all()  # a waiting poll reports the loss and rejoins
            if job is not None:
                self._run_async_commit(*job)
                continue
            assert step is not None
            if step.warning is not None:
                log.warning("%s", step.warning)
            if step.request is None:
                continue  # a static member leaves by going silent
            response, error = self._call(self._heartbeat_io, step.request, step.timeout_ms)
            if step.leaving:
                if error is not None:
                    log.warning("group %s: LeaveGroup failed: %s", self.config.group_id, error)
                continue
            with self._cond:
                if self._heartbeats.on_answer(step.request, response, error):
                    self._cond.notify_all()  # wake a waiting poll: it must rejoin

    def _run_async_commit(self, wanted: dict, callback: CommitCallback | None) -> None:
        error: RivvenError | None = None
        try:
            self._commit(self._heartbeat_io, wanted, None)
        except RivvenError as exc:
            error = exc
        finally:
            with self._cond:
                self._async.finished()
        if callback is None:
            if error is not None:
                log.warning("group %s: async commit failed: %s", self.config.group_id, error)
            return
        offsets = {tp: offset for tp, (offset, _) in wanted.items()}
        with self._cond:
            self._async_done.append((callback, offsets, error))
            self._cond.notify_all()

    # --- closing -------------------------------------------------------------------------

    def close(self, autocommit: bool = True) -> None:
        """Commit (auto-commit, unless ``autocommit`` is False), revoke, leave (dynamic
        members), stop. Blocks. Never raises for the coordinator's sake: failures are logged."""
        try:
            self._run_async_callbacks()
            with self._cond:
                owned = set(self.core.owned)
                member = self.core.subscribed
            if self.config.enable_auto_commit and autocommit:
                with self._cond:
                    wanted = self._fetch._positions(None)
                self._commit(self._io, wanted, None)
            if member and owned:
                self._callbacks.revoked(owned, lost=False)
            with self._cond:
                leave = self.core.leave_request()
            if leave is not None:
                self._call(self._io, leave, None)
        except RivvenError as error:
            log.warning("group %s: leaving cleanly failed: %s", self.config.group_id, error)
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Stop the heartbeat thread and close connections, telling the coordinator nothing
        (a crash, as far as the group can tell). Idempotent; blocks until the thread ends."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        thread = self._thread
        self._io.close()
        self._heartbeat_io.close()
        if thread is not None and thread is not threading.current_thread():
            thread.join()
