"""What a group member's drivers decide around ``GroupCore``: coordinator, commits, heartbeats.

Theory of operation
-------------------
``GroupCore`` (``group_core.py``) holds the membership; the objects here hold the rest of the
decisions the two mirrored drivers (blocking and trio) used to make each on their own; the one
async driver (``_aio_group.py``) runs them now. A driver asks, performs the I/O, and reports
back:

- ``CoordinatorLookup``: which broker coordinates the group. ``node()`` is None when it must
  be found (never yet, or a call failed with a coordinator code or a retriable error); the
  driver then sends ``find_request()`` to any broker and hands the answer to ``on_found``.
- ``CommitRetry``: one commit until it is durable or its deadline passes. ``request(now_ms)``
  gives the OffsetCommit and its timeout; ``on_answer`` says done (None), wait ``n`` ms and try
  again (a coordinator code or a retriable error, while ``retry_backoff_ms`` still fits before
  the deadline), or raises: a partition refused for another reason (its error), a
  non-retriable error, or ``ClientTimeoutError`` at the deadline.
- ``HeartbeatSchedule``: ``step(now_ms)`` says what the heartbeat side does now: send the
  Heartbeat (every ``heartbeat_interval_ms`` while Stable, timed out after one interval),
  leave the group because ``poll`` was not called within ``max_poll_interval_ms`` (the
  LeaveGroup to send, None for a static member, and the warning to log), or wait.
- ``GroupTimers``: when auto-commit and the metadata re-check (pattern subscriptions, and the
  leader's partition counts) are due.
- ``AsyncCommits``: the ``commit_async`` queue, bounded by
  ``limits.async_commits_pending_max`` commits queued or running (``BufferExhaustedError``
  past it), taken one at a time in order.

Also here, shared by both drivers: ``ConsumerGroupMetadata``, ``normalise_offsets``,
``RebalanceCallbacks`` and the readers of a metadata re-check's answers.

Pure: ``now_ms`` is always an argument; no I/O, no clock, no threads.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from rivven_broker.client.errors import (
    BufferExhaustedError,
    ClientTimeoutError,
    RivvenError,
    error_for,
)
from rivven_broker.client.group_core import COORDINATOR_CODES, GroupCore
from rivven_broker.client.types import TopicPartition
from rivven_broker.protocol import limits
from rivven_broker.protocol.errors import ErrorCode
from rivven_broker.protocol.group_messages import FindCoordinator

__all__ = [
    "ConsumerGroupMetadata",
    "CommitCallback",
    "group_metadata_of",
    "normalise_offsets",
    "RebalanceCallbacks",
    "CoordinatorLookup",
    "CommitRetry",
    "HeartbeatStep",
    "HeartbeatSchedule",
    "GroupTimers",
    "AsyncCommits",
    "matched_topics",
    "partition_counts",
    "counts_changed",
    "subscription_topics",
    "IDLE_WAIT_MS",
]

#: ``callback(offsets, error)`` of ``commit_async`` (error None on success).
CommitCallback = Callable[[dict[TopicPartition, int], "RivvenError | None"], None]
#: The longest a heartbeat side waits without being woken while there is nothing to send.
IDLE_WAIT_MS = 1000


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
    """The membership ``core`` knows now. Never blocks."""
    return ConsumerGroupMetadata(
        core.settings.group_id, core.generation, core.member_id, core.settings.group_instance_id
    )


def normalise_offsets(
    offsets: Mapping[Any, Any]
) -> dict[TopicPartition, tuple[int, str | None]]:
    """``{tp: offset | (offset, metadata)}`` -> ``{TopicPartition: (offset, metadata)}``.

    Raises:
        ValueError: a negative or non-integer offset.
    """
    out = {}
    for tp, value in offsets.items():
        offset, metadata = (value, None) if isinstance(value, int) else (value[0], value[1])
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"bad offset {offset!r} for {tp}")
        out[TopicPartition(tp[0], tp[1])] = (offset, metadata)
    return out


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


# --- the coordinator ------------------------------------------------------------------------


class CoordinatorLookup:
    """Which broker coordinates the group (see the module docstring)."""

    def __init__(self, core: GroupCore) -> None:
        self.core = core
        self.node_id: int | None = None

    def node(self) -> int | None:
        """The coordinator's node id, or None when it must be found first."""
        return None if self.core.coordinator_unknown else self.node_id

    def find_request(self) -> FindCoordinator:
        return FindCoordinator(self.core.settings.group_id, 0)

    def on_found(self, answer: Any) -> int:
        """Take a FindCoordinator answer; returns the node. Raises the answer's error."""
        if answer.error_code != ErrorCode.NONE:
            raise error_for(answer.error_code,
                            f"finding the coordinator of {self.core.settings.group_id!r}")
        self.node_id = answer.node_id
        self.core.coordinator_unknown = False
        return answer.node_id

    def on_call_failed(self, error: RivvenError) -> None:
        """A call to the coordinator failed: find it again unless the error is final."""
        if error.error_code in COORDINATOR_CODES or error.retriable:
            self.core.coordinator_unknown = True


# --- commits --------------------------------------------------------------------------------


class CommitRetry:
    """One commit of ``wanted`` ({tp: (offset, metadata)}) until durable or its deadline."""

    def __init__(self, core: GroupCore, wanted: Mapping[TopicPartition, tuple[int, str | None]],
                 *, now_ms: int, timeout_ms: int, retry_backoff_ms: int) -> None:
        assert timeout_ms >= 0 and retry_backoff_ms >= 0
        self.core = core
        self.wanted = dict(wanted)
        self.timeout_ms = timeout_ms
        self.deadline_ms = now_ms + timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.attempts = 0

    def request(self, now_ms: int) -> tuple[Any, int]:
        """The OffsetCommit to send now (as the member the core is now) and its timeout."""
        self.attempts += 1
        return self.core.commit_request(self.wanted), max(self.deadline_ms - now_ms, 1)

    def on_answer(self, request: Any, response: Any, error: RivvenError | None,
                  now_ms: int) -> int | None:
        """None when the commit is durable, else the ms to wait before sending it again.

        Raises:
            BrokerError: a partition refused (REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION ...:
                the member then rejoins at the next poll), or a non-retriable error.
            ClientTimeoutError: the retry would not start before the deadline.
        """
        if error is None:
            codes = self.core.on_commit_response(request, response)
            failed = {code for code in codes.values() if code != ErrorCode.NONE}
            if not failed:
                return None
            if not failed <= COORDINATOR_CODES:
                code = min(failed - COORDINATOR_CODES, key=int)
                raise error_for(code, f"commit of group {self.core.settings.group_id!r}")
            error = error_for(min(failed, key=int), "commit")
        if not error.retriable:
            raise error
        if now_ms + self.retry_backoff_ms >= self.deadline_ms:
            raise ClientTimeoutError(f"commit not done within {self.timeout_ms} ms") from error
        return self.retry_backoff_ms


class AsyncCommits:
    """The ``commit_async`` queue: bounded, in order, one running at a time."""

    def __init__(self, pending_max: int = limits.async_commits_pending_max) -> None:
        assert pending_max >= 1
        self.pending_max = pending_max
        self._queued: deque[tuple[dict, CommitCallback | None]] = deque()
        self.running = False

    @property
    def pending(self) -> int:
        """Commits queued or running."""
        return len(self._queued) + self.running

    def add(self, wanted: dict, callback: CommitCallback | None) -> None:
        """Queue a commit. Raises ``BufferExhaustedError`` when ``pending_max`` are pending."""
        if self.pending >= self.pending_max:
            raise BufferExhaustedError(f"{self.pending} async commits are already pending")
        self._queued.append((wanted, callback))

    def has_work(self) -> bool:
        """Whether a commit waits and none is running (a worker should ``take``)."""
        return bool(self._queued) and not self.running

    def take(self) -> tuple[dict, CommitCallback | None] | None:
        """The oldest queued commit, now running (None: nothing queued or one running)."""
        if not self.has_work():
            return None
        self.running = True
        return self._queued.popleft()

    def finished(self) -> None:
        """The running commit ended (durable or failed)."""
        assert self.running
        self.running = False


# --- heartbeats and timers ------------------------------------------------------------------


class HeartbeatStep(NamedTuple):
    """What the heartbeat side does now: send ``request`` (a Heartbeat, or a LeaveGroup when
    ``leaving``) within ``timeout_ms``, or, when ``request`` is None, wait up to ``wait_ms``
    (or until woken). ``warning`` is to be logged."""

    request: Any
    timeout_ms: int
    wait_ms: int
    leaving: bool
    warning: str | None


class HeartbeatSchedule:
    """When the member sends heartbeats, and when it leaves for want of a ``poll``."""

    def __init__(self, core: GroupCore, *, interval_ms: int, request_timeout_ms: int) -> None:
        assert interval_ms > 0 and request_timeout_ms > 0
        self.core = core
        self.interval_ms = interval_ms
        self.request_timeout_ms = request_timeout_ms
        self.next_beat_ms = 0

    def step(self, now_ms: int) -> HeartbeatStep:
        core = self.core
        if core.poll_timeout_expired(now_ms):
            idle_ms = core.poll_idle_ms(now_ms)
            warning = (
                f"group {core.settings.group_id}: poll() was not called for {idle_ms} ms, more "
                f"than max_poll_interval_ms ({core.settings.max_poll_interval_ms}); leaving "
                "the group; the next poll rejoins"
            )
            # a whole request's time: a lost LeaveGroup would keep the partitions
            leave = core.leave_for_poll_timeout()
            return HeartbeatStep(leave, self.request_timeout_ms, 0, True, warning)
        beat = core.heartbeat_request()
        if beat is None:
            return HeartbeatStep(None, 0, min(IDLE_WAIT_MS, self.interval_ms), False, None)
        if now_ms < self.next_beat_ms:
            return HeartbeatStep(None, 0, self.next_beat_ms - now_ms, False, None)
        self.next_beat_ms = now_ms + self.interval_ms
        return HeartbeatStep(beat, self.interval_ms, 0, False, None)

    def on_answer(self, request: Any, response: Any, error: RivvenError | None) -> bool:
        """Apply a heartbeat's answer; True when a waiting ``poll`` must wake (to rejoin)."""
        if error is None:
            self.core.on_heartbeat(request, ErrorCode.from_wire(response.error_code))
        return self.core.needs_attention()


class GroupTimers:
    """When auto-commit and the metadata re-check are due (``poll`` asks at each call)."""

    def __init__(self, now_ms: int, *, auto_commit_interval_ms: int | None,
                 metadata_check_ms: int) -> None:
        """``auto_commit_interval_ms`` None: no auto-commit."""
        assert metadata_check_ms > 0
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self.metadata_check_ms = metadata_check_ms
        self.next_check_ms = 0
        self.next_auto_commit_ms = (
            None if auto_commit_interval_ms is None else now_ms + auto_commit_interval_ms
        )

    def check_soon(self) -> None:
        """Re-check at the next poll (a new subscription)."""
        self.next_check_ms = 0

    def any_due(self, now_ms: int, *, checking: bool) -> bool:
        """Whether an auto-commit (or, when ``checking``, the metadata re-check) is due;
        schedules nothing (a front asks before it hands ``poll``'s group work to its loop)."""
        commit_at = self.next_auto_commit_ms
        return (commit_at is not None and now_ms >= commit_at) or (
            checking and now_ms >= self.next_check_ms)

    def metadata_check_due(self, now_ms: int) -> bool:
        """True (and the next one scheduled) when the re-check is due."""
        if now_ms < self.next_check_ms:
            return False
        self.next_check_ms = now_ms + self.metadata_check_ms
        return True

    def auto_commit_due(self, now_ms: int) -> bool:
        """True (and the next one scheduled) when an auto-commit is due."""
        if self.next_auto_commit_ms is None or now_ms < self.next_auto_commit_ms:
            return False
        assert self.auto_commit_interval_ms is not None
        self.next_auto_commit_ms = now_ms + self.auto_commit_interval_ms
        return True


# --- the metadata re-check ------------------------------------------------------------------


def matched_topics(answer: Any, pattern: re.Pattern[str]) -> set[str]:
    """The healthy topics of a Metadata answer whose whole name matches ``pattern``."""
    return {t.name for t in answer.topics
            if t.error_code == ErrorCode.NONE and pattern.fullmatch(t.name)}


def partition_counts(answer: Any) -> dict[str, int]:
    """``{topic: partitions}`` of the healthy topics of a Metadata answer."""
    return {t.name: len(t.partitions) for t in answer.topics
            if t.error_code == ErrorCode.NONE and t.partitions}


def counts_changed(assigned: Mapping[str, int], found: Mapping[str, int]) -> bool:
    """Whether the leader must rejoin: a topic it assigned has another partition count now."""
    return bool(assigned) and {t: found.get(t, 0) for t in assigned} != dict(assigned)


def subscription_topics(names: Iterable[str], pattern: re.Pattern[str] | None) -> Iterable[str]:
    """What ``GroupCore.subscribe`` gets at first: the names, or nothing until a pattern is
    resolved by the first metadata re-check."""
    return () if pattern is not None else names
