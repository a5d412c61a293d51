"""Admission: which destination topics one source may write to, checked before any send.

Theory of operation
-------------------
Routing (a source's columns, a ``Route`` transform, the ``topic`` template) can name any topic;
a typo or an odd row value must not create thousands of topics, and one broken topic must not
stall the others forever. ``Admission`` is asked once per record, before the record is sent,
and answers ``None`` (admitted) or a ``RejectReason``. The checks, in order:

1. the topic is a legal broker topic name (``invalid_topic``);
2. the mode: ``open`` admits any topic; ``allowlist`` only topics matching a pattern
   (``not_allowed``); ``denylist`` every topic matching none (``denied``). A pattern is
   dot-separated segments, each a literal or ``*`` standing for exactly one segment
   (``commerce.*`` matches ``commerce.orders``, not ``commerce`` nor ``commerce.eu.orders``);
3. the destination's circuit breaker (``circuit_open``, below);
4. an explicit partition is checked against the topic's known partition count
   (``partition_out_of_range``; unknown counts pass, the broker has the last word). This does
   not feed the breaker: it is the record's fault, not the topic's;
5. ``max_destinations``: a hard cap on the number of distinct admitted topics, in every mode
   ("open" means no allowlist, not unbounded). A topic takes a slot when it is first admitted
   and keeps it for the life of the process (no eviction, as in the Iggy proposal).

The breaker (per admitted topic) counts consecutive *permanent* failures reported for the
topic (authorization, record too large, invalid topic). Connection loss and other transient
failures hit every destination at once and are not the topic's fault: they neither count nor
reset. After ``breaker_failure_threshold`` (5) in a row the breaker opens for
``breaker_cool_down_ms`` (30 s); then it is half-open and admits exactly one probe: the next
batch that asks for the topic (a batch is the unit the cycle sends and commits, so all of that
batch's records for the topic are the probe). The probe's outcome decides: delivered closes the
breaker, a permanent failure opens it again for a full cool-down, no verdict (the batch failed
for another reason) frees the probe for the next batch. Time comes in as ``now_ms``.

Counters (``AdmissionCounters``) are low-cardinality metrics: routed records, active
destinations, rejections by reason, unmatched records by action, open breakers.
"""

from __future__ import annotations

import enum
import re
from typing import Iterable

import attrs

from rivven_broker.protocol.names import topic_name_error
from rivven_connect.core.records import Destination

__all__ = [
    "Admission",
    "AdmissionConfig",
    "AdmissionCounters",
    "AdmissionMode",
    "BreakerState",
    "DestinationState",
    "RejectReason",
    "SendOutcome",
    "TopicPattern",
    "breaker_cool_down_ms",
    "breaker_failure_threshold",
    "max_destinations_default",
    "max_destinations_limit",
]

#: Consecutive permanent failures that open a destination's breaker.
breaker_failure_threshold = 5
#: How long an open breaker rejects before it lets one probe through.
breaker_cool_down_ms = 30_000
max_destinations_default = 256
#: The ceiling configuration may not raise ``max_destinations`` above.
max_destinations_limit = 100_000

_SEGMENT = re.compile(r"[A-Za-z0-9_-]+")


class AdmissionMode(enum.Enum):
    OPEN = "open"
    ALLOWLIST = "allowlist"
    DENYLIST = "denylist"


class RejectReason(enum.Enum):
    """Why a record was not admitted (the metric label ``reason``)."""

    INVALID_TOPIC = "invalid_topic"
    NOT_ALLOWED = "not_allowed"
    DENIED = "denied"
    CIRCUIT_OPEN = "circuit_open"
    PARTITION_OUT_OF_RANGE = "partition_out_of_range"
    MAX_DESTINATIONS = "max_destinations"


class SendOutcome(enum.Enum):
    """What happened to a batch's records for one destination (reported by the cycle)."""

    DELIVERED = "delivered"  # committed
    PERMANENT_FAILURE = "permanent_failure"  # authorization, record too large, invalid topic
    TRANSIENT_FAILURE = "transient_failure"  # connection lost, timeouts, not the topic's fault
    NO_VERDICT = "no_verdict"  # the batch failed for another destination or another reason


class BreakerState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@attrs.frozen
class TopicPattern:
    """A topic pattern of dot-separated segments, each a literal or ``*`` (one segment)."""

    segments: tuple[str, ...]

    @classmethod
    def parse(cls, text: object) -> TopicPattern:
        """Raises ``ValueError`` (a message for the operator) for a malformed pattern."""
        if not isinstance(text, str) or not text:
            raise ValueError("a pattern is a non-empty string")
        if text == "*":
            raise ValueError("a bare '*' matches every one-segment topic; use mode: open")
        segments = tuple(text.split("."))
        for segment in segments:
            if segment != "*" and _SEGMENT.fullmatch(segment) is None:
                raise ValueError(
                    f"{text!r}: each dot-separated segment is '*' or letters, digits, '_' "
                    f"and '-' (got {segment!r})")
        if all(segment == "*" for segment in segments):
            raise ValueError(f"{text!r} matches every topic of its depth; use mode: open")
        return cls(segments)

    def matches(self, topic: str) -> bool:
        parts = topic.split(".")
        return len(parts) == len(self.segments) and all(
            want == "*" or want == part for want, part in zip(self.segments, parts))

    def __str__(self) -> str:
        return ".".join(self.segments)


@attrs.frozen
class AdmissionConfig:
    """``routing.admission``: validated by ``config.py``; asserted here."""

    mode: AdmissionMode = AdmissionMode.OPEN
    patterns: tuple[TopicPattern, ...] = ()
    max_destinations: int = max_destinations_default

    def __attrs_post_init__(self) -> None:
        assert 1 <= self.max_destinations <= max_destinations_limit
        assert (self.mode is AdmissionMode.OPEN) == (not self.patterns)


@attrs.define
class DestinationState:
    """One admitted topic: its breaker and its counts (``GET .../destinations``)."""

    topic: str
    breaker: BreakerState = BreakerState.CLOSED
    consecutive_failures: int = 0
    opened_at_ms: int | None = None
    #: The batch that is the half-open probe, if one is out.
    probe_batch_id: int | None = None
    partitions: int | None = None
    routed: int = 0
    failures: int = 0
    last_error: str | None = None


@attrs.define
class AdmissionCounters:
    routed: int = 0
    rejected: dict[RejectReason, int] = attrs.Factory(lambda: {r: 0 for r in RejectReason})
    #: Records with no destination, by the ``on_missing_destination`` action taken.
    unmatched: dict[str, int] = attrs.Factory(lambda: {"default": 0, "drop": 0, "error": 0})


class Admission:
    """The admission table of one source. Pure; never blocks; raises nothing but asserts."""

    def __init__(
        self,
        config: AdmissionConfig,
        *,
        failure_threshold: int = breaker_failure_threshold,
        cool_down_ms: int = breaker_cool_down_ms,
    ) -> None:
        assert failure_threshold >= 1 and cool_down_ms >= 0
        self.config = config
        self.failure_threshold = failure_threshold
        self.cool_down_ms = cool_down_ms
        self.destinations: dict[str, DestinationState] = {}
        #: Partition counts learned from the broker, admitted topics or not (a topic admitted
        #: later starts with its count, so ``partition_out_of_range`` holds from its first
        #: record).
        self.partition_counts: dict[str, int] = {}
        self.counters = AdmissionCounters()

    # --- asking -------------------------------------------------------------------------------
    def admit(self, destination: Destination, batch_id: int, now_ms: int, *,
              records: int = 1) -> RejectReason | None:
        """None if a record for ``destination`` in batch ``batch_id`` may be sent now
        (``records``: the answer is for that many records of one batch, each counted)."""
        assert records >= 1
        reason = self._check(destination, batch_id, now_ms)
        if reason is not None:
            self.counters.rejected[reason] += records
        return reason

    def _check(self, destination: Destination, batch_id: int, now_ms: int) -> RejectReason | None:
        topic = destination.topic
        state = self.destinations.get(topic)
        if state is None and topic_name_error(topic) is not None:  # (known: checked before)
            return RejectReason.INVALID_TOPIC
        mode = self.config.mode
        if mode is not AdmissionMode.OPEN:  # (open: the patterns do not matter)
            matched = any(pattern.matches(topic) for pattern in self.config.patterns)
            if mode is AdmissionMode.ALLOWLIST and not matched:
                return RejectReason.NOT_ALLOWED
            if mode is AdmissionMode.DENYLIST and matched:
                return RejectReason.DENIED
        if state is not None and not self._breaker_admits(state, batch_id, now_ms):
            return RejectReason.CIRCUIT_OPEN
        partition = destination.partition
        if partition is not None:
            known = self.partition_counts.get(topic) if state is None else state.partitions
            if partition < 0 or (known is not None and partition >= known):
                return RejectReason.PARTITION_OUT_OF_RANGE
        if state is None:
            if len(self.destinations) >= self.config.max_destinations:
                return RejectReason.MAX_DESTINATIONS
            self.destinations[topic] = DestinationState(
                topic, partitions=self.partition_counts.get(topic))
        return None

    def _breaker_admits(self, state: DestinationState, batch_id: int, now_ms: int) -> bool:
        if state.breaker is BreakerState.OPEN:
            assert state.opened_at_ms is not None
            if now_ms < state.opened_at_ms + self.cool_down_ms:
                return False
            state.breaker = BreakerState.HALF_OPEN
        if state.breaker is BreakerState.HALF_OPEN:
            if state.probe_batch_id is None:
                state.probe_batch_id = batch_id
            return state.probe_batch_id == batch_id
        return True

    # --- telling ------------------------------------------------------------------------------
    def set_partition_count(self, topic: str, partitions: int) -> None:
        """The topic's partition count, once known (metadata or creation), admitted or not."""
        assert partitions >= 1
        self.partition_counts[topic] = partitions
        state = self.destinations.get(topic)
        if state is not None:
            state.partitions = partitions

    def record_outcome(
        self,
        topic: str,
        outcome: SendOutcome,
        now_ms: int,
        *,
        records: int = 0,
        error: str | None = None,
    ) -> None:
        """What became of batch's records for ``topic`` (every admitted topic of a finished
        batch gets exactly one call)."""
        state = self.destinations[topic]
        if outcome is SendOutcome.DELIVERED:
            state.routed += records
            self.counters.routed += records
            state.consecutive_failures = 0
            state.breaker, state.opened_at_ms, state.probe_batch_id = BreakerState.CLOSED, None, None
        elif outcome is SendOutcome.PERMANENT_FAILURE:
            state.failures += 1
            state.last_error = error
            state.consecutive_failures += 1
            state.probe_batch_id = None
            if (state.breaker is BreakerState.HALF_OPEN
                    or state.consecutive_failures >= self.failure_threshold):
                state.breaker, state.opened_at_ms = BreakerState.OPEN, now_ms
        else:  # transient, or no verdict: the topic is not to blame; a probe is freed
            if outcome is SendOutcome.TRANSIENT_FAILURE:
                state.failures += 1
                state.last_error = error
            state.probe_batch_id = None
        self._check_destination(topic, state)  # only this one changed (all of them: O(N^2))

    def note_unmatched(self, action: str, records: int = 1) -> None:
        self.counters.unmatched[action] += records

    # --- reading ------------------------------------------------------------------------------
    @property
    def destinations_active(self) -> int:
        return len(self.destinations)

    def circuits_open(self, now_ms: int) -> int:
        """Breakers rejecting now (open and still cooling down)."""
        return sum(
            1 for s in self.destinations.values()
            if s.breaker is BreakerState.OPEN and s.opened_at_ms is not None
            and now_ms < s.opened_at_ms + self.cool_down_ms)

    def topics(self) -> Iterable[str]:
        return self.destinations.keys()

    def check_invariants(self) -> None:
        assert len(self.destinations) <= self.config.max_destinations
        for topic, state in self.destinations.items():
            self._check_destination(topic, state)

    def _check_destination(self, topic: str, state: DestinationState) -> None:
        assert state.topic == topic and topic_name_error(topic) is None
        assert state.breaker is not BreakerState.OPEN or state.opened_at_ms is not None
        assert state.probe_batch_id is None or state.breaker is BreakerState.HALF_OPEN
        if state.breaker is BreakerState.CLOSED:
            assert state.opened_at_ms is None
            assert state.consecutive_failures < self.failure_threshold
        assert 0 <= state.consecutive_failures <= state.failures
        assert state.partitions is None or state.partitions >= 1
