"""The blocking consumer's group membership: rebalances in ``poll``, heartbeats on a thread.

Theory of operation
-------------------
``GroupMember`` drives a ``GroupCore`` (every decision is there) for one blocking
``Consumer``, sharing the consumer's lock (``cond``) that also guards its ``FetchState``:

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
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from rivven_broker.client._network import monotonic_ms
from rivven_broker.client._sync import SyncClient
from rivven_broker.client.config import ConnectionConfig, ConsumerConfig
from rivven_broker.client.errors import (
    BufferExhaustedError,
    ClientTimeoutError,
    ClosedError,
    RivvenError,
    error_for,
)
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
from rivven_broker.client.types import TopicPartition
from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.group_messages import FindCoordinator

__all__ = [
    "ConsumerGroupMetadata",
    "group_metadata_of",
    "GroupMember",
    "RebalanceCallbacks",
    "CommitCallback",
    "normalise_offsets",
    "warn_poll_timeout",
]

log = logging.getLogger(__name__)

#: ``callback(offsets, error)`` of ``commit_async`` (error None on success).
CommitCallback = Callable[[dict[TopicPartition, int], "RivvenError | None"], None]
_IDLE_WAIT_S = 1.0


class ConsumerGroupMetadata(NamedTuple):
    """A consumer's group membership at one moment (``Consumer.group_metadata()``), for
    ``send_offsets_to_transaction``: the broker accepts the offsets only while this member is
    still in ``generation_id`` of the group (KIP-447). Generation -1 with member id "" is the
    membership of a consumer that has not joined (no check)."""

    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None


def group_metadata_of(core: GroupCore) -> ConsumerGroupMetadata:
    """The membership ``core`` knows now (call under the consumer's lock). Never blocks."""
    return ConsumerGroupMetadata(
        core.settings.group_id, core.generation, core.member_id, core.settings.group_instance_id
    )


def normalise_offsets(
    offsets: Mapping[Any, Any]
) -> dict[TopicPartition, tuple[int, str | None]]:
    """``{tp: offset | (offset, metadata)}`` -> ``{TopicPartition: (offset, metadata)}``."""
    out = {}
    for tp, value in offsets.items():
        offset, metadata = (value, None) if isinstance(value, int) else (value[0], value[1])
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"bad offset {offset!r} for {tp}")
        out[TopicPartition(tp[0], tp[1])] = (offset, metadata)
    return out


def warn_poll_timeout(group_id: str | None, idle_ms: int, limit_ms: int) -> None:
    """Log that a member leaves its group because ``poll`` was not called in time."""
    log.warning(
        "group %s: poll() was not called for %d ms, more than max_poll_interval_ms (%d); "
        "leaving the group; the next poll rejoins", group_id, idle_ms, limit_ms,
    )


class RebalanceCallbacks:
    """The user's rebalance callbacks: functions, or a listener object's methods."""

    def __init__(self, listener: Any = None, on_assign: Any = None, on_revoke: Any = None,
                 on_lost: Any = None) -> None:
        self.on_assign = on_assign or getattr(listener, "on_partitions_assigned", None)
        self.on_revoke = on_revoke or getattr(listener, "on_partitions_revoked", None)
        self.on_lost = on_lost or getattr(listener, "on_partitions_lost", None)

    def assigned(self, partitions: set[TopicPartition]) -> None:
        if self.on_assign is not None:
            self.on_assign(partitions)

    def revoked(self, partitions: set[TopicPartition], lost: bool) -> None:
        callback = (self.on_lost or self.on_revoke) if lost else self.on_revoke
        if callback is not None:
            callback(partitions)


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
        self._node: int | None = None
        self._callbacks = RebalanceCallbacks()
        self._pattern: re.Pattern[str] | None = None
        self._next_check_ms = 0
        self._next_auto_commit_ms = monotonic_ms() + config.auto_commit_interval_ms
        self._async_jobs: deque[tuple[dict, CommitCallback | None]] = deque()
        self._async_done: deque[tuple[CommitCallback, dict, RivvenError | None]] = deque()
        self._thread: threading.Thread | None = None
        self._stopping = False

    # --- subscription --------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str], pattern: re.Pattern[str] | None,
                  callbacks: RebalanceCallbacks) -> None:
        """Start (or change) group membership. Call under the lock. Never blocks."""
        self._pattern = pattern
        self._callbacks = callbacks
        self.core.subscribe(() if pattern is not None else topics)
        self._next_check_ms = 0  # resolve a pattern at the next poll
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
        if not self.core.subscribed:
            if self.config.enable_auto_commit:
                self._auto_commit()
            return
        now = monotonic_ms()
        if now >= self._next_check_ms:
            self._next_check_ms = now + self.conn_config.metadata_max_age_ms
            self._check_metadata()
        with self._cond:
            busy = self.core.needs_attention()
        if busy:
            self._rebalance()
        if self.config.enable_auto_commit:
            self._auto_commit()

    def poll_ended(self) -> None:
        """``poll`` returned or raised: the poll interval counts from now. Never blocks."""
        with self._cond:
            self.core.on_poll_end(monotonic_ms())

    def _check_metadata(self) -> None:
        """Re-match a pattern; as the leader, notice new partitions. Rejoin on a change."""
        try:
            if self._pattern is not None:
                answer = self._io.fetch_metadata(None)
                matched = {t.name for t in answer.topics
                           if t.error_code == ErrorCode.NONE and self._pattern.fullmatch(t.name)}
                with self._cond:
                    self.core.subscribe(matched)
            with self._cond:
                counts = dict(self.core.assigned_counts) if self.core.is_leader else {}
            found = self._partition_counts(sorted(counts)) if counts else {}
            if counts and {topic: found.get(topic, 0) for topic in counts} != counts:
                with self._cond:
                    self.core.request_rejoin()
        except RivvenError as error:  # try again at the next check
            log.warning("group %s: metadata check failed: %s", self.config.group_id, error)

    def _partition_counts(self, topics: list[str]) -> dict[str, int]:
        answer = self._io.fetch_metadata(topics)
        return {t.name: len(t.partitions) for t in answer.topics
                if t.error_code == ErrorCode.NONE and t.partitions}

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

    def _coordinator(self, io: SyncClient) -> int:
        with self._cond:
            node = None if self.core.coordinator_unknown else self._node
        if node is None:
            answer = io.call(FindCoordinator(self.config.group_id, 0))
            if answer.error_code != ErrorCode.NONE:
                raise error_for(answer.error_code, f"finding the coordinator of "
                                                   f"{self.config.group_id!r}")
            node = answer.node_id
            with self._cond:
                self._node, self.core.coordinator_unknown = node, False
        if io.metadata.address_of(node) is None:
            io.fetch_metadata([])
        return node

    def _call(self, io: SyncClient, request: Any, timeout_ms: int | None) -> tuple[Any, Any]:
        """``(response, None)`` or ``(None, error)``: the core decides what an error means."""
        try:
            node = self._coordinator(io)
            return io.call(request, node_id=node, timeout_ms=timeout_ms), None
        except RivvenError as error:
            if error.error_code in COORDINATOR_CODES or error.retriable:
                with self._cond:
                    self.core.coordinator_unknown = True
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
        now = monotonic_ms()
        if now < self._next_auto_commit_ms:
            return
        self._next_auto_commit_ms = now + self.config.auto_commit_interval_ms
        try:
            with self._cond:
                wanted = self._fetch._positions(None)
            self._commit(self._io, wanted, None)
        except RivvenError as error:
            log.warning("group %s: auto-commit failed: %s", self.config.group_id, error)

    def _commit(self, io: SyncClient, wanted: dict, timeout_ms: int | None) -> None:
        if not wanted:
            return
        timeout_ms = self.conn_config.request_timeout_ms if timeout_ms is None else timeout_ms
        deadline = monotonic_ms() + timeout_ms
        while True:
            with self._cond:
                request = self.core.commit_request(wanted)
            response, error = self._call(io, request, max(deadline - monotonic_ms(), 1))
            codes: dict[TopicPartition, ErrorCode] = {}
            if error is None:
                with self._cond:
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
            if monotonic_ms() + self.conn_config.retry_backoff_ms >= deadline:
                raise ClientTimeoutError(f"commit not done within {timeout_ms} ms") from error
            with self._cond:
                self._cond.wait(self.conn_config.retry_backoff_ms / 1000)

    def commit_async(self, offsets: Mapping[Any, Any] | None,
                     callback: CommitCallback | None) -> None:
        """Queue a commit for the heartbeat thread. Never blocks. Call under no lock.

        Raises:
            BufferExhaustedError: ``limits.async_commits_pending_max`` commits are queued.
        """
        with self._cond:
            if len(self._async_jobs) >= limits.async_commits_pending_max:
                raise BufferExhaustedError(
                    f"{len(self._async_jobs)} async commits are already queued"
                )
            wanted = (self._fetch._positions(None) if offsets is None
                      else normalise_offsets(offsets))
            self._async_jobs.append((wanted, callback))
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
        interval = self.config.heartbeat_interval_ms
        next_beat = 0
        while True:
            with self._cond:
                while not self._stopping and not self._async_jobs:
                    beat = self.core.heartbeat_request()
                    wait_ms = next_beat - monotonic_ms()
                    if beat is not None and wait_ms <= 0:
                        break
                    idle_s = min(_IDLE_WAIT_S, interval / 1000)
                    self._cond.wait(idle_s if beat is None else wait_ms / 1000)
                if self._stopping:
                    return
                job = self._async_jobs.popleft() if self._async_jobs else None
                expired, leave = (False, None) if job is not None else self._poll_expiry()
                beat = None if job is not None or expired else self.core.heartbeat_request()
            if job is not None:
                self._run_async_commit(*job)
                continue
            if expired:
                if leave is not None:  # a request's time: a lost LeaveGroup keeps the partitions
                    _, error = self._call(
                        self._heartbeat_io, leave, self.conn_config.request_timeout_ms
                    )
                    if error is not None:
                        log.warning("group %s: LeaveGroup failed: %s", self.config.group_id,
                                    error)
                continue
            if beat is None:
                continue
            next_beat = monotonic_ms() + interval
            response, error = self._call(self._heartbeat_io, beat, interval)
            with self._cond:
                if error is None:
                    self.core.on_heartbeat(beat, ErrorCode.from_wire(response.error_code))
                if self.core.needs_attention():
                    self._cond.notify_all()  # wake a waiting poll: it must rejoin

    def _poll_expiry(self) -> tuple[bool, Any]:
        """Under the lock: ``(True, LeaveGroup or None)`` when the member has just left for
        want of a ``poll`` within ``max_poll_interval_ms`` (module docstring), else
        ``(False, None)``."""
        now = monotonic_ms()
        if not self.core.poll_timeout_expired(now):
            return False, None
        warn_poll_timeout(self.config.group_id, self.core.poll_idle_ms(now),
                          self.config.max_poll_interval_ms)
        leave = self.core.leave_for_poll_timeout()
        self._cond.notify_all()
        return True, leave

    def _run_async_commit(self, wanted: dict, callback: CommitCallback | None) -> None:
        error: RivvenError | None = None
        try:
            self._commit(self._heartbeat_io, wanted, None)
        except RivvenError as exc:
            error = exc
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
